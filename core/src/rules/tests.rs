use std::{fs, path::Path};

use super::{
    fixtures::{EXEC_RULE, EXEC_RULE_SCHEMA_1, MINIMAL_RULE, MINIMAL_RULE_SCHEMA_1},
    *,
};

fn write(dir: &Path, name: &str, text: &str) {
    fs::write(dir.join(name), text).unwrap();
}

/// The error of loading a directory holding only `text`, and that file's path.
fn error_for(text: &str) -> (RulesError, String) {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "bad.yaml", text);
    let file = dir.path().join("bad.yaml").display().to_string();
    (RuleSet::load_dir(dir.path()).unwrap_err(), file)
}

/// `error` is about `file` at (line, column), and says `needle`.
fn assert_invalid_at(error: &RulesError, file: &str, (line, column): (usize, usize), needle: &str) {
    match error {
        RulesError::Invalid { origin, message } => {
            assert_eq!(origin.file, file, "{error}");
            assert_eq!((origin.line, origin.column), (Some(line), Some(column)), "{error}");
            assert!(message.contains(needle), "{needle:?} not in {error}");
        }
        other => panic!("expected an Invalid error, got {other}"),
    }
    assert!(error.to_string().starts_with(&format!("{file}:{line}:{column}: ")), "{error}");
}

#[test]
fn default_managers_come_from_the_rules() {
    let set = RuleSet::defaults().unwrap();
    let names: Vec<&str> = set.managers().iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["npm", "yarn", "pnpm", "bun", "cargo", "pip", "uv", "poetry", "pdm", "gem", "bundler"]);
    let args = |words: &[&str]| words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
    let find = |file: &str, argv: &[&str]| {
        manager::root_manager(set.managers(), file, &args(argv)).map(|i| set.managers()[i].name.as_str())
    };
    assert_eq!(find("/usr/bin/npx", &["npx", "nx@latest"]), Some("npm"));
    assert_eq!(find("/usr/bin/python3.12", &["python3.12", "-m", "pip", "install", "x"]), Some("pip"));
    assert_eq!(find("/usr/bin/python3.7", &["python3.7", "-m", "pip", "install", "x"]), None);
    assert_eq!(find("/root/.cargo/bin/cargo", &["cargo", "build"]), Some("cargo"));
    // Started through the interpreter and a release file.
    assert_eq!(find("/usr/bin/node", &["node", ".yarn/releases/yarn-4.5.3.cjs", "install"]), Some("yarn"));
    assert_eq!(find("/usr/bin/node", &["node", "/usr/lib/node_modules/npm/bin/npm-cli.js", "ci"]), Some("npm"));
    assert_eq!(find("/usr/bin/node", &["node", "node_modules/pnpm/bin/pnpm.cjs", "install"]), Some("pnpm"));
    assert_eq!(find("/usr/bin/node", &["node", "server.js"]), None);
    assert_eq!(find("/usr/bin/node", &["node", "/opt/yarn-1.22.22.js", "install"]), Some("yarn"));
    assert_eq!(find("/usr/bin/node", &["node", "scripts/yarn-helper.js"]), None);
    assert_eq!(find("/usr/bin/node", &["node", "/usr/bin/npm", "install"]), Some("npm"));
    assert_eq!(find("/usr/bin/python3", &["python3", "/tmp/venv/bin/pip", "install", "x"]), Some("pip"));
    assert_eq!(find("/usr/bin/python3", &["python3", "pipeline.py"]), None);
    assert_eq!(find("/usr/bin/node", &["node", "/usr/bin/corepack", "pnpm", "install"]), Some("pnpm"));
    assert_eq!(find("/usr/bin/node", &["node", "/usr/bin/corepack", "yarn", "install"]), Some("yarn"));
    assert_eq!(find("/usr/bin/node", &["node", "/usr/bin/corepack", "enable"]), None);
    assert_eq!(find("/usr/bin/python3", &["python3", "-m", "uv", "pip", "install", "x"]), Some("uv"));
    assert_eq!(find("/usr/bin/python3.11", &["python3.11", "-m", "poetry", "install"]), Some("poetry"));
    assert_eq!(find("/usr/bin/python", &["python", "-m", "pdm", "install"]), Some("pdm"));
    assert_eq!(
        find("/usr/bin/python3", &["python3", "/usr/lib/python3/dist-packages/pip/__pip-runner__.py", "install"]),
        Some("pip")
    );
    // RubyGems and Bundler: the scripts, and the interpreter running them (`#!/usr/bin/env ruby`).
    assert_eq!(find("/usr/bin/gem", &["gem", "install", "x"]), Some("gem"));
    assert_eq!(find("/usr/bin/ruby", &["ruby", "/usr/bin/gem", "install", "x"]), Some("gem"));
    assert_eq!(find("/usr/bin/ruby3.1", &["/usr/bin/ruby3.1", "/usr/bin/gem3.1", "install"]), Some("gem"));
    assert_eq!(find("/usr/bin/bundle", &["/usr/bin/ruby", "/usr/bin/bundle", "install"]), Some("bundler"));
    assert_eq!(find("/usr/bin/ruby", &["ruby", "/usr/bin/bundler", "install"]), Some("bundler"));
    assert_eq!(find("/usr/bin/bundle3.3", &["/usr/bin/ruby3.3", "/usr/bin/bundle3.3", "install"]), Some("bundler"));
    // What RubyGems runs to build an extension is package code, not a manager.
    assert_eq!(
        find(
            "/usr/bin/ruby3.1",
            &["/usr/bin/ruby3.1", "-I", "/usr/lib/ruby/vendor_ruby", "-r", "./siteconf.rb", "extconf.rb"]
        ),
        None
    );
    assert_eq!(find("/usr/bin/ruby", &["ruby", "gemspec.rb"]), None);
}

#[test]
fn script_patterns_need_a_stem_the_kernel_can_look_up() {
    let yaml = "schema: 2\nmanagers:\n  - name: yarn\n    scripts:\n      - interpreters: [node]\n        files: [yarn.js, \"*.cjs\"]\n";
    let (error, file) = error_for(yaml);
    assert_invalid_at(&error, &file, (6, 26), "script pattern \"*.cjs\" must start with a literal name");
}

#[test]
fn default_targets_cover_the_credential_paths() {
    let set = RuleSet::defaults().unwrap();
    // Credential (read) rules only: persistence rules are about writes.
    let hits = |path: &str| -> Vec<&str> {
        let hits: Vec<&str> = set
            .rules()
            .iter()
            .filter(|r| r.is_credential() && r.matches_path(path, None))
            .map(|r| r.id.as_str())
            .collect();
        // The merged index finds the same rules, exclusions applied.
        let indexed: Vec<&str> = set
            .matching_targets(path, None)
            .into_iter()
            .map(|i| &set.rules()[i])
            .filter(|r| r.is_credential())
            .map(|r| r.id.as_str())
            .collect();
        assert_eq!(hits, indexed, "{path}");
        hits
    };
    for path in [
        "/home/a/.ssh/id_rsa",
        "/home/a/.ssh/config",
        "/home/a/.npmrc",
        "/home/a/project/.npmrc",
        "/home/a/.yarnrc.yml",
        "/home/a/.pypirc",
        "/home/a/.cargo/credentials.toml",
        "/home/a/.cargo/credentials",
        "/home/a/.git-credentials",
        "/home/a/.config/gh/hosts.yml",
        "/home/a/.aws/credentials",
        "/home/a/.aws/config",
        "/home/a/.config/gcloud/credentials.db",
        "/home/a/.azure/azureProfile.json",
        "/home/a/.kube/config",
        "/home/a/.docker/config.json",
        "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "/srv/app/.env",
        "/srv/app/.env.local",
        "/home/a/.claude/.credentials.json",
        "/home/a/.codex/auth.json",
        "/home/a/.gemini/oauth_creds.json",
        "/home/a/.netrc",
        "/home/a/.pgpass",
        "/home/a/.vault-token",
        "/home/a/.bash_history",
        "/home/a/.zsh_history",
        "/home/a/.ethereum/keystore/UTC--2025-01-01T00-00-00.0Z--abcd",
        "/home/a/.electrum/wallets/default_wallet",
        "/home/a/.config/google-chrome/Default/Login Data",
        "/home/a/.config/chromium/Default/Cookies",
        "/home/a/.mozilla/firefox/x.default/logins.json",
        "/etc/shadow",
        "/proc/1/environ",
        "/proc/1/mem",
        "/home/a/.gnupg/private-keys-v1.d/0C5A33B8A1C8D09F9B8E1E4D2E3F4A5B6C7D8E9F.key",
        "/home/a/.gnupg/secring.gpg",
        "/home/a/.terraform.d/credentials.tfrc.json",
        "/home/a/.terraformrc",
        "/srv/infra/terraform.tfstate",
        "/srv/infra/prod.auto.tfvars",
        "/home/a/.gem/credentials",
        "/home/a/.local/share/gem/credentials",
        "/home/a/.m2/settings.xml",
        "/home/a/.m2/settings-security.xml",
        "/home/a/.gradle/gradle.properties",
        "/home/a/.config/github-copilot/hosts.json",
        "/home/a/.config/github-copilot/apps.json",
        "/home/a/.config/op/config",
        "/home/a/.op/config",
        "/home/a/.config/rclone/rclone.conf",
        "/home/a/.s3cfg",
        "/home/a/.local/share/keyrings/login.keyring",
        "/home/a/.password-store/email/work.gpg",
        "/home/a/.config/glab-cli/config.yml",
        "/home/a/.config/containers/auth.json",
        "/run/user/1000/containers/auth.json",
        "/home/a/.config/Code/User/globalStorage/state.vscdb",
        "/home/a/.claude.json",
        "/home/a/.cache/huggingface/token",
        "/home/a/.kaggle/kaggle.json",
        "/home/a/.config/netlify/config.json",
        "/home/a/.config/configstore/firebase-tools.json",
        "/etc/wireguard/wg0.conf",
        "/etc/letsencrypt/live/example.org/privkey.pem",
    ] {
        assert!(!hits(path).is_empty(), "no rule covers {path}");
    }
    // One rule per file: overlapping rules would alert twice for one open.
    for path in [
        "/home/a/.gnupg/private-keys-v1.d/0C5A33B8A1C8D09F9B8E1E4D2E3F4A5B6C7D8E9F.key",
        "/home/a/.ssh/server.key",
        "/etc/ssl/private/ssl-cert-snakeoil.key",
        "/etc/letsencrypt/archive/example.org/privkey1.pem",
        "/home/a/.claude.json",
    ] {
        assert_eq!(hits(path).len(), 1, "{path} hit {:?}", hits(path));
    }
    for path in [
        "/home/a/app/index.js",
        "/home/a/.bashrc",
        "/srv/app/.env.example",
        "/srv/app/node_modules/x/.env",
        "/etc/passwd",
        "/home/a/.gnupg/pubring.kbx",
        "/home/a/.gnupg/trustdb.gpg",
        "/home/a/.m2/repository/org/x/1.0/x-1.0.pom",
        "/home/a/.terraform.d/plugin-cache/registry.terraform.io/x",
        "/home/a/app/test/fixtures/server.key",
        "/home/a/app/.mcp.json",
    ] {
        assert!(hits(path).is_empty(), "{path} hit {:?}", hits(path));
    }
}

#[test]
fn a_directory_overrides_and_adds_rules() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "mine.yaml", MINIMAL_RULE);
    let overriding = MINIMAL_RULE
        .replace("id: demo", "id: vault-token")
        .replace("severity: high", "severity: low\n    action: kill");
    write(dir.path(), "override.yml", &overriding);
    write(dir.path(), "notes.txt", "not a rule file");
    let defaults = RuleSet::defaults().unwrap();
    let set = RuleSet::load(Some(dir.path())).unwrap();
    assert_eq!(set.rules().len(), defaults.rules().len() + 1);
    let vault = set.rules().iter().find(|r| r.id == "vault-token").unwrap();
    assert_eq!((vault.severity, vault.action), (Severity::Low, Action::Kill));
    assert!(vault.origin.file.ends_with("override.yml"));
    assert!(set.rules().iter().any(|r| r.id == "demo"));
    assert_eq!(RuleSet::load_dir(dir.path()).unwrap().rules().len(), 2);
}

#[test]
fn unknown_key_names_file_and_line() {
    let (error, file) =
        error_for(&MINIMAL_RULE.replace("    category: demo\n", "    category: demo\n    colour: red\n"));
    assert_invalid_at(&error, &file, (7, 5), "unknown field `colour`");
}

#[test]
fn bad_glob_names_file_and_line() {
    let (error, file) = error_for(&MINIMAL_RULE.replace(r#"["~/.demo-token"]"#, r#"["~/.demo-[token"]"#));
    assert_invalid_at(&error, &file, (10, 15), "bad glob");
    let (error, file) = error_for(&MINIMAL_RULE.replace(r#"["~/.demo-token"]"#, r#"["demo-token"]"#));
    assert_invalid_at(&error, &file, (10, 15), "must start with");
}

#[test]
fn bad_severity_names_file_and_line() {
    let (error, file) = error_for(&MINIMAL_RULE.replace("severity: high", "severity: severe"));
    assert_invalid_at(&error, &file, (7, 15), "unknown variant `severe`");
}

#[test]
fn unsupported_schema_names_file_and_line() {
    let (error, file) = error_for(&MINIMAL_RULE.replace("schema: 2", "schema: 3"));
    assert_invalid_at(&error, &file, (1, 9), "unsupported schema version 3");
}

#[test]
fn missing_samples_name_file_and_line() {
    let without = MINIMAL_RULE.split("    samples:").next().unwrap();
    let (error, file) = error_for(without);
    // (The parser puts a missing field at the mapping's last key.)
    assert_invalid_at(&error, &file, (10, 5), "missing field `samples`");
    let empty = MINIMAL_RULE.replace(
        "      negative:\n        - exec: {pid: 1, args: [npm, install]}\n        - open: {pid: 1, path: /home/alice/.demo-token.pub}\n",
        "      negative: []\n",
    );
    let (error, file) = error_for(&empty);
    assert_invalid_at(&error, &file, (12, 7), "the negative sample has no steps");
}

#[test]
fn duplicate_ids_name_the_second_definition() {
    let rule = MINIMAL_RULE.split_once("rules:\n").unwrap().1;
    let (error, file) = error_for(&format!("{MINIMAL_RULE}{rule}"));
    assert_invalid_at(&error, &file, (18, 9), "duplicate rule id \"demo\"");

    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", MINIMAL_RULE);
    write(dir.path(), "b.yaml", MINIMAL_RULE);
    let error = RuleSet::load_dir(dir.path()).unwrap_err();
    let first = dir.path().join("a.yaml").display().to_string();
    assert_invalid_at(
        &error,
        &dir.path().join("b.yaml").display().to_string(),
        (3, 9),
        &format!("first at {first}:3:5"),
    );
}

#[test]
fn unknown_manager_references_and_bad_actors_are_errors() {
    let (error, file) = error_for(
        &MINIMAL_RULE.replace("    severity: high\n", "    severity: high\n    conditions: {managers: [maven]}\n"),
    );
    assert_invalid_at(&error, &file, (8, 29), "rule demo: unknown manager \"maven\"");
    let (error, file) = error_for(&MINIMAL_RULE.replace(
        "    severity: high\n",
        "    severity: high\n    actors:\n      - {execs: [git], managers: [run, mvn], verdict: low}\n",
    ));
    assert_invalid_at(&error, &file, (9, 40), "rule demo: unknown manager \"mvn\"");
    let (error, file) = error_for(&MINIMAL_RULE.replace(
        "    severity: high\n",
        "    severity: high\n    actors:\n      - {manager: true, execs: [git], verdict: low}\n",
    ));
    assert_invalid_at(&error, &file, (9, 9), "exactly one of");
    // `installed` and `unless_command` qualify an `execs` actor; the kernel, which spares by
    // executable alone, cannot judge argv: not on a `kill` rule.
    let (error, file) = error_for(&MINIMAL_RULE.replace(
        "    severity: high\n",
        "    severity: high\n    actors:\n      - {under: [make], installed: true, verdict: low}\n",
    ));
    assert_invalid_at(&error, &file, (9, 9), "`installed` and `unless_command` go with `execs`");
    let (error, file) = error_for(&MINIMAL_RULE.replace(
        "    severity: high\n",
        "    severity: high\n    actors:\n      - {execs: [ps], unless_command: '(e', verdict: low}\n",
    ));
    assert_invalid_at(&error, &file, (9, 39), "bad command regex \"(e\"");
    let (error, file) = error_for(&MINIMAL_RULE.replace(
        "    severity: high\n",
        "    severity: high\n    action: kill\n    actors:\n      - {execs: [ps], installed: true, unless_command: e, verdict: low}\n",
    ));
    assert_invalid_at(&error, &file, (10, 9), "`unless_command` actors are judged in userspace only");
    // The kernel spares the installed file's inode alone: `installed` holds there too.
    let dir = tempfile::tempdir().unwrap();
    let kill =
        "    severity: high\n    action: kill\n    actors:\n      - {execs: [ps], installed: true, verdict: low}\n";
    write(dir.path(), "ok.yaml", &MINIMAL_RULE.replace("    severity: high\n", kill));
    RuleSet::load_dir(dir.path()).unwrap();
}

#[test]
fn syntax_errors_and_missing_dirs_do_not_panic() {
    let (error, file) = error_for("schema: 2\nrules: [\n");
    assert!(matches!(&error, RulesError::Invalid { origin, .. } if origin.file == file), "{error}");
    let missing = RuleSet::load_dir(Path::new("/nonexistent/credwatch-rules")).unwrap_err();
    assert!(matches!(missing, RulesError::Io { .. }), "{missing}");
}

#[test]
fn the_default_kill_set() {
    let set = RuleSet::defaults().unwrap();
    let mut kill: Vec<&str> = set.kill_rules().map(|r| r.id.as_str()).collect();
    kill.sort();
    assert_eq!(
        kill,
        [
            "aws-credentials",
            "azure-credentials",
            "bpf-by-package",
            "desktop-keyrings",
            "exfiltration",
            "gcloud-credentials",
            "gnupg-private-keys",
            "kernel-module-load",
            "ptrace-attach",
            "pypi-token",
            "signal-to-agent",
            "ssh-host-keys",
            "ssh-private-keys",
            "vault-token",
        ]
    );
    let sweep = set.sweep().unwrap();
    assert_eq!((sweep.id.0.as_str(), sweep.min_categories.0, sweep.window_s.0), ("credential-sweep", 3, 30));
}

#[test]
fn bad_exec_and_syscall_parts_name_file_and_line() {
    // Unknown key inside exec.
    let (error, file) =
        error_for(&EXEC_RULE.replace("      any_args: [--go]\n", "      any_args: [--go]\n      argv: [x]\n"));
    assert_invalid_at(&error, &file, (12, 7), "unknown field `argv`");
    // Bad regex, bad word glob, bad access value: at the value.
    let (error, file) = error_for(&EXEC_RULE.replace("      any_args: [--go]\n", "      command: \"(curl\"\n"));
    assert_invalid_at(&error, &file, (11, 16), "bad command regex \"(curl\": regex parse error");
    let (error, file) = error_for(&EXEC_RULE.replace("any_args: [--go]", "any_args: [\"--[go\"]"));
    assert_invalid_at(&error, &file, (11, 18), "bad argument pattern");
    let (error, file) = error_for(&MINIMAL_RULE.replace("access: read", "access: append"));
    assert_invalid_at(&error, &file, (9, 13), "unknown variant `append`");
    // An exec match with neither names nor written_by_tree: at the match.
    let (error, file) = error_for(&EXEC_RULE.replace("      names: [demo]\n", ""));
    assert_invalid_at(&error, &file, (10, 7), "needs `names` or `written_by_tree: true`");
    // A syscall rule without names, or with an exclude.
    let exec_match = "    kind: exec\n    exec:\n      names: [demo]\n      any_args: [--go]\n";
    let syscall = EXEC_RULE.replace(exec_match, "    kind: syscall\n    syscalls:\n      names: []\n");
    let (error, file) = error_for(&syscall);
    assert_invalid_at(&error, &file, (10, 14), "must not be empty");
    let syscall =
        EXEC_RULE.replace(exec_match, "    kind: syscall\n    syscalls: {names: [bpf]}\n    exclude: [\"/x\"]\n");
    let (error, file) = error_for(&syscall);
    assert_invalid_at(&error, &file, (10, 14), "`exclude` goes with `targets` or `exec`");
    // Sample steps of the new kinds are checked too.
    let (error, file) = error_for(&MINIMAL_RULE.replace(
        "- open: {pid: 1, path: /home/alice/.demo-token}",
        "- open: {pid: 1, path: /home/alice/.demo-token, flags: O_SHRED}",
    ));
    assert_invalid_at(&error, &file, (14, 64), "unknown open flag \"O_SHRED\"");
    let (error, file) =
        error_for(&MINIMAL_RULE.replace(
            "- open: {pid: 1, path: /home/alice/.demo-token}",
            "- syscall: {pid: 1, name: bpf, target_pid: 3}",
        ));
    assert_invalid_at(&error, &file, (14, 40), "unknown field `target_pid`");
}

#[test]
fn schema_2_kinds_and_their_keys_name_file_line_and_column() {
    // A key of another kind: at that key's value.
    let (error, file) = error_for(&EXEC_RULE.replace("    exec:\n", "    targets: [\"~/.x\"]\n    exec:\n"));
    assert_invalid_at(&error, &file, (9, 14), "rule demo-exec: `targets` does not go with `kind: exec`");
    let (error, file) =
        error_for(&MINIMAL_RULE.replace("    samples:\n", "    syscalls: {names: [bpf]}\n    samples:\n"));
    assert_invalid_at(&error, &file, (11, 15), "rule demo: `syscalls` does not go with `kind: target`");
    // `access` on a rule that is not a target rule.
    let (error, file) = error_for(&EXEC_RULE.replace("    exec:\n", "    access: write\n    exec:\n"));
    assert_invalid_at(&error, &file, (9, 13), "rule demo-exec: `access` goes with `targets`");
    // `contain` on a rule that is not about reads.
    let (error, file) = error_for(&EXEC_RULE.replace("    exec:\n", "    contain: keep-settings\n    exec:\n"));
    assert_invalid_at(&error, &file, (9, 14), "rule demo-exec: `contain` goes with `targets` and `access: read`");
    // A kind without its key, a target rule without `access`: at `kind`.
    let (error, file) = error_for(
        &EXEC_RULE
            .replace("kind: exec", "kind: connect")
            .replace("    exec:\n      names: [demo]\n      any_args: [--go]\n", ""),
    );
    assert_invalid_at(&error, &file, (8, 11), "rule demo-exec: `kind: connect` needs `connect`");
    let (error, file) = error_for(&MINIMAL_RULE.replace("    access: read\n", ""));
    assert_invalid_at(
        &error,
        &file,
        (8, 11),
        "rule demo: `kind: target` needs `access`: `read` (credentials) or `write`",
    );
    // A kind that does not exist; the sweep is the file's `sweep`, not a rule.
    let (error, file) = error_for(&MINIMAL_RULE.replace("kind: target", "kind: read"));
    assert_invalid_at(
        &error,
        &file,
        (8, 11),
        "unknown kind \"read\" (kinds: target, exec, syscall, connect, blind_spot)",
    );
    let (error, file) = error_for(&MINIMAL_RULE.replace("kind: target", "kind: sweep"));
    assert_invalid_at(&error, &file, (8, 11), "`kind: sweep`: the sweep is the file's `sweep` section, not a rule");
}

#[test]
fn schema_2_without_kind_says_what_to_add() {
    // A schema 1 file whose `schema` was bumped: each rule says the key and value to add.
    let (error, file) = error_for(&MINIMAL_RULE_SCHEMA_1.replace("schema: 1", "schema: 2"));
    assert_invalid_at(
        &error,
        &file,
        (3, 5),
        "rule demo: schema 2 names the rule's kind: add `kind: target` and `access: read`",
    );
    let (error, file) = error_for(&EXEC_RULE_SCHEMA_1.replace("schema: 1", "schema: 2"));
    assert_invalid_at(&error, &file, (3, 5), "rule demo-exec: schema 2 names the rule's kind: add `kind: exec`");
    let write_rule = MINIMAL_RULE.replace("    kind: target\n", "").replace("access: read", "access: write");
    let (error, file) = error_for(&write_rule);
    assert_invalid_at(&error, &file, (3, 5), "rule demo: schema 2 names the rule's kind: add `kind: target`");
    assert!(!error.to_string().contains("access: read"), "{error}");
    let syscall = EXEC_RULE_SCHEMA_1
        .replace("schema: 1", "schema: 2")
        .replace("    exec:\n      names: [demo]\n      any_args: [--go]\n", "    syscalls: {names: [bpf]}\n");
    let (error, file) = error_for(&syscall);
    assert_invalid_at(&error, &file, (3, 5), "add `kind: syscall`");
    // Neither key, or two: which kinds there are and which key goes with each.
    let (error, file) = error_for(
        &EXEC_RULE_SCHEMA_1
            .replace("schema: 1", "schema: 2")
            .replace("    exec:\n      names: [demo]\n      any_args: [--go]\n", ""),
    );
    assert_invalid_at(&error, &file, (3, 5), "add `kind:` (target, exec, syscall, connect, blind_spot) and the one key that goes with it (`targets`, `exec`, `syscalls`, `connect`, `blind_spot`)");
}

#[test]
fn schema_1_infers_the_kind_and_rejects_what_schema_2_added() {
    // Two kinds in one rule: at the second.
    let (error, file) = error_for(&EXEC_RULE_SCHEMA_1.replace("    exec:\n", "    targets: [\"~/.x\"]\n    exec:\n"));
    assert_invalid_at(
        &error,
        &file,
        (10, 7),
        "rule demo-exec: needs only one of `targets`, `exec`, `syscalls`, `connect` and `blind_spot`",
    );
    // None: at the rule.
    let (error, file) =
        error_for(&EXEC_RULE_SCHEMA_1.replace("    exec:\n      names: [demo]\n      any_args: [--go]\n", ""));
    assert_invalid_at(
        &error,
        &file,
        (3, 5),
        "rule demo-exec: needs one of `targets`, `exec`, `syscalls`, `connect` and `blind_spot`",
    );
    // `access` without targets.
    let (error, file) = error_for(&EXEC_RULE_SCHEMA_1.replace("    exec:\n", "    access: write\n    exec:\n"));
    assert_invalid_at(&error, &file, (8, 13), "rule demo-exec: `access` goes with `targets`");
    // `kind` is schema 2's.
    let (error, file) = error_for(&EXEC_RULE_SCHEMA_1.replace("    exec:\n", "    kind: exec\n    exec:\n"));
    assert_invalid_at(&error, &file, (8, 11), "rule demo-exec: `kind` is schema 2: write `schema: 2`");
}

/// What a rule is, without where it was written.
fn comparable(rule: &Rule) -> String {
    let mut rule = rule.clone();
    rule.origin = Origin { file: String::new(), line: None, column: None };
    for (_, origin) in &mut rule.references {
        *origin = rule.origin.clone();
    }
    format!("{rule:?}")
}

#[test]
fn schema_1_files_load_the_same_rules_as_schema_2() {
    let load = |text: &str| RuleSet::from_sources([("r.yaml".to_owned(), text.to_owned())]).unwrap();
    for (one, two) in [(MINIMAL_RULE_SCHEMA_1, MINIMAL_RULE), (EXEC_RULE_SCHEMA_1, EXEC_RULE)] {
        let (one, two) = (load(one), load(two));
        assert_eq!(one.rules().len(), 1);
        assert_eq!(comparable(&one.rules()[0]), comparable(&two.rules()[0]));
    }
    // The default rules written in schema 1: no `kind`, no `access: read` (its default).
    let schema_1 = DEFAULT_RULES.iter().map(|(file, text)| {
        let text: String = text
            .lines()
            .filter(|line| !matches!(line.trim(), "access: read") && !line.trim().starts_with("kind: "))
            .map(|line| format!("{line}\n"))
            .collect();
        assert!(text.starts_with("schema: 2\n") || text.contains("\nschema: 2\n"), "{file}");
        ((*file).to_owned(), text.replacen("schema: 2\n", "schema: 1\n", 1))
    });
    let (one, two) = (RuleSet::from_sources(schema_1).unwrap(), RuleSet::defaults().unwrap());
    assert_eq!(one.rules().len(), two.rules().len());
    for (one, two) in one.rules().iter().zip(two.rules()) {
        assert_eq!(comparable(one), comparable(two));
    }
    assert_eq!(format!("{:?}", one.managers()), format!("{:?}", two.managers()));
    assert_eq!(format!("{:?}", one.sweep()), format!("{:?}", two.sweep()));
}

#[test]
fn runs_code_names_a_known_manager() {
    let set = RuleSet::defaults().unwrap();
    let bun = set.managers().iter().position(|m| m.name == "bun").unwrap();
    let args = |words: &[&str]| words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
    assert!(set.runs_code(bun, "/usr/bin/bun", &args(&["bun", "bun_environment.js"])));
    assert!(set.runs_code(bun, "/usr/bin/bun", &args(&["bun", "run", "build"])));
    assert!(set.runs_code(bun, "/usr/bin/bunx", &args(&["bunx", "cowsay"])));
    assert!(!set.runs_code(bun, "/usr/bin/bun", &args(&["bun", "install"])));
    assert!(!set.runs_code(bun, "/usr/bin/bun", &args(&["bun"])));

    let (error, file) = error_for("schema: 2\nruns_code:\n  - manager: maven\n    execs: [mvnw]\n");
    assert_invalid_at(&error, &file, (3, 5), "runs_code: unknown manager \"maven\"");
    let (error, file) = error_for("schema: 2\nruns_code:\n  - manager: bun\n    first_args: [\"[x\"]\n");
    assert_invalid_at(&error, &file, (4, 18), "bad argument pattern");
}

#[test]
fn project_code_and_home_files_are_data_with_checked_references() {
    let set = RuleSet::defaults().unwrap();
    let m = |name: &str| set.managers().iter().position(|m| m.name == name).unwrap();
    let args = |words: &[&str]| words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
    assert!(set.project_command(m("npm"), "/usr/bin/npm", &args(&["npm", "--silent", "run", "dev"])).is_some());
    // npx runs a package's bin: none of what it starts is the project's, but a bin of the
    // project's own package that its shell runs.
    let npx = set.project_command(m("npm"), "/usr/bin/npx", &args(&["npx", "run"])).expect("npx runs a bin");
    let program = |executable, script| Program { executable, script, cwd: "/home/alice/app" };
    assert!(!set.project_program(npx, &program("/bin/sh", None)));
    let shell = set.project_tool(npx, "/bin/sh").expect("npx's shell");
    for own in ["/home/alice/app/cli.js", "/home/alice/app/node_modules/vite/bin/vite.js"] {
        assert!(set.project_tool_program(npx, shell, &program("/usr/bin/node", Some(own))), "{own}");
    }
    for other in [Some("/home/alice/.npm/_npx/0a/node_modules/x/cli.js"), Some("/usr/lib/node_modules/x/cli.js"), None]
    {
        assert!(!set.project_tool_program(npx, shell, &program("/usr/bin/node", other)), "{other:?}");
    }
    // Run in the home, npx's cache lies in the directory but is no project's.
    let home = Program {
        cwd: "/home/alice",
        ..program("/usr/bin/node", Some("/home/alice/.npm/_npx/0a/node_modules/x/cli.js"))
    };
    assert!(!set.project_tool_program(npx, shell, &home));
    // pnpm runs the bin's shim itself.
    let pnpm_exec = set.project_command(m("pnpm"), "/usr/bin/pnpm", &args(&["pnpm", "exec", "vitest"])).unwrap();
    assert!(set.project_program(pnpm_exec, &program("/usr/bin/dash", Some("/home/alice/app/node_modules/.bin/vitest"))));
    assert!(!set.project_program(pnpm_exec, &program("/usr/bin/dash", Some("/tmp/dlx/node_modules/.bin/x"))));
    let shebang = args(&["/usr/bin/env", "node", "/usr/bin/npm", "run", "dev"]);
    assert!(set.project_command(m("npm"), "/usr/bin/npm", &shebang).is_some());
    let shebang = args(&["/usr/bin/env", "node", "/usr/bin/npm", "install"]);
    assert!(set.project_command(m("npm"), "/usr/bin/npm", &shebang).is_none());
    assert!(set.project_command(m("npm"), "npm", &args(&["npm run dev"])).is_some(), "retitled, seen in /proc");
    assert!(set.project_command(m("npm"), "npm", &args(&["npm install"])).is_none());
    assert!(set.project_command(m("yarn"), "/usr/bin/yarn", &args(&["yarn", "dev"])).is_some());
    assert!(set.project_command(m("yarn"), "/usr/bin/yarn", &args(&["yarn", "add", "x"])).is_none());
    assert!(set.project_command(m("yarn"), "/usr/bin/yarn", &args(&["yarn"])).is_none());
    let cargo = set.project_command(m("cargo"), "/usr/bin/cargo", &args(&["cargo", "+nightly", "test"])).unwrap();
    let program = |executable| Program { executable, script: None, cwd: "/w" };
    assert!(set.project_program(cargo, &program("/w/target/debug/deps/app-0a1b2c")));
    assert!(!set.project_program(cargo, &program("/w/target/debug/build/dep-0a1b2c/build-script-build")));
    assert!(!set.project_program(cargo, &program("/root/.rustup/toolchains/stable/bin/rustc")));
    let npm = m("npm");
    let home = |path: &str| set.home_of_manager_file(npm, path, "/srv/ci/job");
    assert_eq!(home("/srv/ci/.npmrc").as_deref(), Some("/srv/ci"));
    assert_eq!(home("/h/.npm/_logs/x-debug-0.log").as_deref(), Some("/h"));
    assert_eq!(home("/srv/ci/job/.npmrc"), None, "the project's own");
    assert_eq!(home("/srv/ci/job/sub/.npmrc"), None, "the project's own");
    assert_eq!(home("/usr/lib/node_modules/x/.npmrc"), None, "a package's");
    assert_eq!(home("/h/.npmrc.bak"), None);
    assert_eq!(home("/h/.npm/_logs/deeper/x.log"), None, "`*` stops at /");

    let (error, file) =
        error_for("schema: 2\nproject_code:\n  - manager: maven\n    execs: [mvn]\n    commands: [test]\n");
    assert_invalid_at(&error, &file, (3, 5), "project_code: unknown manager \"maven\"");
    let (error, file) = error_for(
        "schema: 2\nproject_code:\n  - manager: npm\n    execs: [npm]\n    commands: [run]\n    quiet: true\n",
    );
    assert_invalid_at(&error, &file, (6, 5), "unknown field `quiet`");
    let (error, file) = error_for("schema: 2\nhome_files:\n  - manager: npm\n    files: [\"*/.npmrc\"]\n");
    assert_invalid_at(&error, &file, (4, 13), "first component is a plain name");
}

#[test]
fn bad_sweeps_name_file_and_line() {
    let sweep = "schema: 2\nsweep:\n  id: s\n  name: S\n  description: S.\n  category: sweep\n  severity: critical\n  min_categories: 3\n  window_s: 30\n  min_severity: medium\n";
    let (error, file) = error_for(&sweep.replace("window_s: 30", "window_s: 0"));
    assert_invalid_at(&error, &file, (9, 13), "must be at least 1");
    let (error, file) = error_for(&sweep.replace("  category: sweep\n", ""));
    // (The parser puts a missing field at the mapping's last key.)
    assert_invalid_at(&error, &file, (9, 3), "missing field `category`");
    let (error, file) = error_for(&format!("{sweep}  colour: red\n"));
    assert_invalid_at(&error, &file, (11, 3), "unknown field `colour`");
    // One sweep per set of files; a directory's replaces the default one.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", sweep);
    write(dir.path(), "b.yaml", sweep);
    let error = RuleSet::load_dir(dir.path()).unwrap_err();
    assert_invalid_at(&error, &dir.path().join("b.yaml").display().to_string(), (3, 3), "duplicate `sweep`");
    std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
    let set = RuleSet::load(Some(dir.path())).unwrap();
    assert_eq!(set.sweep().unwrap().id.0, "s");
}

#[test]
fn hostile_yaml_is_an_error_not_a_panic_a_hang_or_an_allocation() {
    let load = |text: &str| RuleSet::from_sources([("h.yaml".to_owned(), text.to_owned())]);
    // An alias bomb ("billion laughs") where serde buffers whatever it is given: the unknown
    // keys of a sample's full `event`. 10^9 strings if expanded; stopped by the replay bound.
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]");
    for level in 1..10 {
        let below = format!("*a{}", level - 1);
        bomb.push_str(&format!(", a{level}: &a{level} [{}]", vec![below; 10].join(", ")));
    }
    let rule = MINIMAL_RULE.replace(
        "- open: {pid: 1, path: /home/alice/.demo-token}",
        &format!("- event: {{time_ns: 5, pid: 1, kind: exit, code: 0, {bomb}}}"),
    );
    let error = load(&rule).unwrap_err().to_string();
    assert!(error.starts_with("h.yaml:14:") && error.contains("too large or too complex"), "{error}");
    // Nesting deeper than any rule file: block and flow.
    let deep_flow = format!("schema: 2\nrules: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    let error = load(&deep_flow).unwrap_err().to_string();
    assert!(error.starts_with("h.yaml:2:"), "{error}");
    // (In a full `event` again, where serde takes any shape.)
    let deep_block: String = (0..200).map(|depth| format!("{}k{depth}:\n", " ".repeat(14 + 2 * depth))).collect();
    let rule = MINIMAL_RULE.replace(
        "        - open: {pid: 1, path: /home/alice/.demo-token}\n",
        &format!("        - event:\n            time_ns: 5\n            pid: 1\n            kind: exit\n            code: 0\n            x:\n{deep_block}"),
    );
    let error = load(&rule).unwrap_err().to_string();
    assert!(error.starts_with("h.yaml:") && error.contains("too large or too complex"), "{error}");
    // Numbers out of range, several documents, nothing at all, not YAML.
    let huge = MINIMAL_RULE.replace("{pid: 1, path: /home/alice/.demo-token}", "{pid: 1e400, path: /x}");
    assert!(load(&huge).unwrap_err().to_string().starts_with("h.yaml:14:"));
    let huge = MINIMAL_RULE
        .replace("{pid: 1, path: /home/alice/.demo-token}", &format!("{{pid: {}, path: /x}}", "9".repeat(500)));
    assert!(load(&huge).unwrap_err().to_string().starts_with("h.yaml:14:"));
    let error = load(&format!("{MINIMAL_RULE}---\n{MINIMAL_RULE}")).unwrap_err().to_string();
    assert!(error.starts_with("h.yaml"), "{error}");
    for text in ["", "---\n", "\u{0}", "schema: 2\n\trules: []\n", "\u{feff}schema: [", "!!binary x", "? [a]\n: b\n"] {
        let error = load(text).unwrap_err().to_string();
        assert!(error.starts_with("h.yaml"), "{text:?}: {error}");
    }
}

#[test]
fn agents_are_data_rooted_like_managers_with_checked_keys() {
    let set = RuleSet::defaults().unwrap();
    let names: Vec<&str> = set.agents().iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["claude", "codex", "gemini", "cursor-agent", "copilot"]);
    let args = |words: &[&str]| words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
    let root = |file: &str, words: &[&str]| {
        manager::root_manager(set.agent_roots(), file, &args(words)).map(|i| set.agents()[i].name.as_str())
    };
    assert_eq!(root("/home/a/.local/bin/claude", &["claude", "-p", "fix"]), Some("claude"));
    assert_eq!(root("/usr/lib/node_modules/@openai/codex/bin/codex.js", &["node", "codex.js"]), None);
    assert_eq!(root("/usr/bin/node", &["node", "/usr/lib/node_modules/@openai/codex/bin/codex.js"]), Some("codex"));
    assert_eq!(root("/usr/bin/node", &["node", "cli.js"]), None);
    assert_eq!(root("/usr/bin/npm", &["npm", "install"]), None);
    // The kernel gets the managers first (their indexes are the spare masks'), then the agents.
    let kernel = set.kernel_roots();
    assert_eq!(kernel[..set.managers().len()], *set.managers());
    assert_eq!(kernel.len(), set.managers().len() + set.agents().len());
    let claude = set.agents().iter().position(|a| a.name == "claude").unwrap();
    assert!(set.agent_owns(claude, "/home/a/.claude/.credentials.json", Some("/home/a")));
    assert!(set.agent_owns(claude, "/w/app/.mcp.json", None));
    assert!(!set.agent_owns(claude, "/home/a/.codex/auth.json", Some("/home/a")));
    let write = set.rules().iter().position(|r| r.id == "ai-agent-config-write").unwrap();
    let other_write = set.rules().iter().position(|r| r.id == "shell-rc-write").unwrap();
    let read = set.rules().iter().position(|r| r.id == "ssh-private-keys").unwrap();
    assert!(set.applies_to_agents(write) && set.applies_to_agents(read) && !set.applies_to_agents(other_write));

    let (error, file) = error_for("schema: 2\nagents:\n  - name: aider\n    execs: [aider]\n    hooks: [x]\n");
    assert_invalid_at(&error, &file, (5, 5), "unknown field `hooks`");
    let (error, file) = error_for("schema: 2\nagents:\n  - name: aider\n    own: [\"~/.aider/**\"]\n");
    assert_invalid_at(&error, &file, (3, 5), "agent \"aider\" has neither `execs` nor `scripts`");
    let (error, file) = error_for("schema: 2\nagents:\n  - name: aider\n    execs: [aider]\n    own: [\".aider\"]\n");
    assert_invalid_at(&error, &file, (5, 11), "must start with");
    let (error, file) = error_for("schema: 2\nagent_policy:\n  writes: [no-such-rule]\n");
    assert_invalid_at(&error, &file, (3, 3), "agent_policy: unknown rule \"no-such-rule\"");
    let (error, file) = error_for("schema: 2\nagents:\n  - name: a\n    execs: [a]\n  - name: a\n    execs: [b]\n");
    assert_invalid_at(&error, &file, (5, 5), "duplicate agent \"a\"");
}

#[test]
fn managers_are_declared_once_and_an_overlay_replaces_or_adds_them_by_name() {
    let (error, file) = error_for("schema: 2\nmanagers:\n  - name: m\n    execs: [m]\n  - name: m\n    execs: [n]\n");
    assert_invalid_at(&error, &file, (5, 5), "duplicate manager \"m\"");

    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "own.yaml",
        "schema: 2\nmanagers:\n  - name: npm\n    execs: [my-npm]\n  - name: tool\n    execs: [tool]\n",
    );
    let set = RuleSet::load(Some(dir.path())).unwrap();
    let defaults = RuleSet::defaults().unwrap();
    let npm = set.managers().iter().position(|m| m.name == "npm").unwrap();
    assert_eq!(npm, defaults.managers().iter().position(|m| m.name == "npm").unwrap(), "replaced in place");
    assert_eq!(set.managers()[npm].execs, ["my-npm"]);
    assert_eq!(set.managers().len(), defaults.managers().len() + 1);
    assert_eq!(set.managers().last().unwrap().name, "tool");
}

#[test]
fn rules_loaded_without_samples_are_the_same_rules_with_their_samples_unread() {
    let dir = tempfile::tempdir().unwrap();
    // Steps no sample parser takes: read, this file is an error; skipped, it loads.
    let unreadable = MINIMAL_RULE.replace("- exec: {pid: 1, args: [npm, install]}", "- nonsense: {pid: 1}");
    write(dir.path(), "demo.yaml", &unreadable);
    assert!(RuleSet::load(Some(dir.path())).is_err());
    let without = RuleSet::load_without_samples(Some(dir.path())).unwrap();
    let ids = |set: &RuleSet| set.rules().iter().map(|r| r.id.clone()).collect::<Vec<_>>();
    assert_eq!(
        ids(&without),
        ids(&RuleSet::defaults().unwrap()).into_iter().chain(["demo".into()]).collect::<Vec<_>>()
    );
    assert!(without.rules().iter().all(|r| r.samples.positive.is_empty() && r.samples.negative.is_empty()));
    let demo = without.rules().iter().find(|r| r.id == "demo").unwrap();
    assert!(demo.matches_path("/home/alice/.demo-token", None));
    // Unread, `samples` is still required.
    let (start, end) = (MINIMAL_RULE.find("    samples:").unwrap(), MINIMAL_RULE.len());
    write(dir.path(), "demo.yaml", &MINIMAL_RULE.replace(&MINIMAL_RULE[start..end], ""));
    assert!(RuleSet::load_without_samples(Some(dir.path())).is_err());
}

#[test]
fn a_plain_glob_matches_without_its_regex_as_the_regex_does() {
    use schema::Matcher;
    let texts = ["npm", "npM", "NPM", "np", "npmx", "", "registry.npmjs.org", "Registry.NPMJS.org", ".npmrc", "a/b"];
    for (pattern, fold) in
        [("npm", false), ("npm", true), ("registry.npmjs.org", true), (".npmrc", false), ("a/b", false)]
    {
        let glob = globset::GlobBuilder::new(pattern).case_insensitive(fold).build().unwrap();
        let matcher = Matcher::new(glob.clone(), fold);
        assert!(matches!(matcher, Matcher::Literal { .. }), "{pattern}");
        let regex = glob.compile_matcher();
        for text in texts {
            assert_eq!(matcher.is_match(text), regex.is_match(text), "{pattern:?} (fold {fold}) on {text:?}");
        }
    }
    for pattern in ["np*", "{npm,yarn}", "[n]pm", "n\\pm", "np?"] {
        let matcher = Matcher::new(globset::Glob::new(pattern).unwrap(), false);
        assert!(matches!(matcher, Matcher::Glob(_)), "{pattern}");
    }
}
