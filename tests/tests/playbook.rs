//! Issue 4: the Nx / Shai-Hulud playbook end to end. Package code runs the tools the real
//! payloads ran (local stand-ins, nothing leaves the machine), writes persistence, sweeps
//! credentials, calls bpf() and signals the agent, floods the sensor; `--enforce` stops the
//! read of a key before the payload sees a byte. Run as root with `cargo xtask test`.

use std::fs;

use credwatch_e2e::{credwatch_binary, fake_tools, fixtures, write_executable, Run, Sandbox, Sleeper, EXIT_ALERT};
use serde_json::Value;

/// The fake key's secret line (see `FAKE_CREDENTIALS`).
const SECRET: &str = "FAKE-credwatch-e2e-not-a-key";

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// argv of the alert's process, joined by spaces.
fn command_line(alert: &Value) -> String {
    alert["process"]["args"]
        .as_array()
        .map(|args| args.iter().map(text).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn rule(alert: &Value) -> &str {
    text(&alert["rule"]["id"])
}

/// The one-line summaries of a run's alerts, for failure messages.
fn summary(alerts: &[Value]) -> String {
    alerts
        .iter()
        .map(|a| {
            format!("  {} {} {} [{}]", rule(a), text(&a["event"]["outcome"]), text(&a["file"]["path"]), command_line(a))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each (rule, command line) an exec alert must name; the look-alikes that must raise nothing.
const EXEC_POSITIVES: &[(&str, &str)] = &[
    ("ai-cli-claude-unsafe", "claude --dangerously-skip-permissions"),
    ("ai-cli-gemini-yolo", "gemini --yolo"),
    ("ai-cli-gemini-yolo", "gemini --approval-mode yolo"),
    ("ai-cli-q-trust-all-tools", "q chat --trust-all-tools"),
    ("ai-cli-codex-unsafe", "codex --dangerously-bypass-approvals-and-sandbox"),
    ("ai-cli-codex-unsafe", "codex exec --full-auto"),
    ("gh-auth-token", "gh auth token"),
    ("gh-repo-create", "gh repo create s1ngularity-repository"),
    ("npm-token-use", "npm whoami"),
    ("npm-publish-from-package", "npm publish"),
    ("trufflehog", "trufflehog filesystem"),
    ("curl-pipe-shell", "stage2.sh | sh"),
    ("sudo-non-interactive", "sudo -n true"),
    ("docker-privileged-host-root", "docker run --rm --privileged -v /:/host"),
    ("downloaded-bun", ".bun/bin/bun bun_environment.js"),
    ("git-push-from-package", "git push -q"),
    ("kubectl-get-secrets", "kubectl get secrets"),
];
const EXEC_NEGATIVES: &[&str] = &[
    "claude --help",
    "gemini --approval-mode default",
    "q chat hello",
    "codex --version",
    "gh --version",
    "gh repo view",
    "| grep -c stage2",
    "sudo --version",
    "docker run --rm -v",
    "kubectl get pods",
    "bun --version",
    "git stash list",
];

/// One real `npm install` of a package whose postinstall runs the whole playbook: every exec
/// rule fires once for its move, with the package named, and none for the look-alikes. npm
/// unpacking the package's own `.github/workflows/ci.yml` is not a workflow write.
#[test]
fn postinstall_running_the_playbook_fires_every_exec_rule_and_nothing_for_look_alikes() {
    let sandbox = Sandbox::new();
    let work = sandbox.work();
    let tools = work.join("tools");
    fake_tools(&tools, &["gemini", "q", "codex", "gh", "trufflehog", "docker", "kubectl", "sudo", "bun"]);
    // Claude Code is a script (`#!/usr/bin/env node`): its exec shows the interpreter first.
    write_executable(&tools.join("claude"), "#!/bin/sh\nexit 0\n");
    fs::write(work.join("stage2.sh"), "echo stage2 >/dev/null\n").unwrap();
    fs::create_dir_all(work.join("publish-me")).unwrap();
    fs::write(work.join("publish-me/package.json"), r#"{ "name": "publish-me", "version": "1.0.1" }"#).unwrap();
    sandbox.setup("git init --bare", sandbox.command("git").args(["init", "-q", "--bare", "remote.git"]));
    let tarball = sandbox.npm_pack("npm/playbook");
    let project = sandbox.npm_project();

    let path = sandbox.path_with(&tools);
    let run = sandbox.run_with(
        &project,
        &[],
        &["npm", "install", tarball.to_str().unwrap()],
        &[("PATH", &path), ("CREDWATCH_E2E_WORK", work.to_str().unwrap())],
    );

    run.assert_exit(EXIT_ALERT);
    let alerts = run.alerts();
    let mut missing = Vec::new();
    for (id, needle) in EXEC_POSITIVES {
        let alert = alerts.iter().find(|a| rule(a) == *id && command_line(a).contains(needle));
        match alert {
            None => missing.push(format!("{id} for `{needle}`")),
            Some(alert) => {
                assert_eq!(alert["event"]["action"], "exec", "{id}: {alert:#}");
                assert_eq!(alert["package"]["name"], "playbook", "{id}: {alert:#}");
                assert_eq!(alert["package"]["lifecycle"], "postinstall", "{id}: {alert:#}");
                // The nearest manager: the downloaded bun is one itself.
                let manager = if *id == "downloaded-bun" { "bun" } else { "npm" };
                assert_eq!(alert["package"]["manager"], manager, "{id}: {alert:#}");
            }
        }
    }
    let look_alikes: Vec<String> = EXEC_NEGATIVES
        .iter()
        .flat_map(|needle| alerts.iter().filter(move |a| command_line(a).contains(needle)))
        .map(|a| format!("{} [{}]", rule(a), command_line(a)))
        .collect();
    assert!(
        missing.is_empty() && look_alikes.is_empty(),
        "missing: {missing:#?}\nlook-alikes that alerted: {look_alikes:#?}\nalerts:\n{}\n{}",
        summary(&alerts),
        run.describe()
    );
    // The moves really happened: the push reached the bare repository, the bun it wrote ran.
    let bun = alerts.iter().find(|a| rule(a) == "downloaded-bun").unwrap();
    assert_eq!(text(&bun["credwatch"]["written_file"]), work.join(".bun/bin/bun").to_str().unwrap(), "{bun:#}");
    sandbox.setup(
        "the pushed branch",
        sandbox.command("git").args(["--git-dir", "remote.git", "rev-parse", "--verify", "refs/heads/shai-hulud"]),
    );
    // npm unpacked the package's own workflow, and that is not a workflow write.
    assert!(project.join("node_modules/playbook/.github/workflows/ci.yml").is_file(), "{}", run.describe());
    assert!(
        !alerts.iter().any(|a| rule(a) == "github-workflow-write"),
        "npm unpacking a package's workflow alerted:\n{}",
        summary(&alerts)
    );
}

/// Package code writing each persistence target, by open, rename, link and symlink. Root's
/// places (/etc/sudoers.d, /var/spool/cron) are stand-in directories bind-mounted in a private
/// mount namespace: the kernel names the files /etc/sudoers.d/x and /var/spool/cron/crontabs/root
/// while the real /etc and /var stay untouched.
#[test]
fn package_code_writing_persistence_targets_is_reported_for_each() {
    let sandbox = Sandbox::new();
    let work = sandbox.work();
    let home = sandbox.home();
    fs::create_dir_all(work.join("fake-etc/sudoers.d")).unwrap();
    fs::create_dir_all(work.join("fake-spool/cron/crontabs")).unwrap();
    fs::write(home.join(".bashrc"), "# the user's own\n").unwrap();
    let script = r#"
        w=$1
        echo 'sudo shutdown -h 0' >> "$HOME/.bashrc"
        mkdir -p "$HOME/.config/systemd/user" "$HOME/.claude" "$w/repo/.github/workflows" "$w/venv/lib/python3.12/site-packages"
        echo '[Service]' > "$HOME/.config/systemd/user/x.service"
        echo 'ssh-ed25519 AAAAC3attacker' >> "$HOME/.ssh/authorized_keys"
        echo 'on: push' > "$w/repo/.github/workflows/x.yml"
        echo 'import os' > "$w/venv/lib/python3.12/site-packages/x.pth"
        echo 'sudo shutdown -h 0' > "$TMPDIR/zshrc.new" && mv "$TMPDIR/zshrc.new" "$HOME/.zshrc"
        echo 'sudo shutdown -h 0' > "$TMPDIR/profile.new" && ln "$TMPDIR/profile.new" "$HOME/.profile"
        echo '{"hooks":{}}' > "$HOME/.claude/settings.json.tmp" && mv "$HOME/.claude/settings.json.tmp" "$HOME/.claude/settings.json"
        ln -s "$TMPDIR/unit" "$HOME/.config/systemd/user/y.service"
        unshare -m --propagation private sh -c 'mount --bind "$1" /etc && echo "runner ALL=(ALL) NOPASSWD: ALL" > /etc/sudoers.d/x' sh "$w/fake-etc"
        unshare -m --propagation private sh -c 'mount --bind "$1" /var/spool && echo "* * * * * true" > /var/spool/cron/crontabs/root' sh "$w/fake-spool"
        cat "$HOME/.bashrc" > /dev/null
    "#;
    let manager = sandbox.fake_manager();
    let run =
        sandbox.run_with(&work, &[], &[manager.to_str().unwrap(), "persist", script, work.to_str().unwrap()], &[]);

    run.assert_exit(EXIT_ALERT);
    // The stand-ins got the writes: the namespaces really wrote there, not to /etc or /var.
    assert!(work.join("fake-etc/sudoers.d/x").is_file() && work.join("fake-spool/cron/crontabs/root").is_file());
    let h = |relative: &str| sandbox.credential(relative);
    let w = |relative: &str| work.join(relative).to_string_lossy().into_owned();
    let expected: Vec<(&str, &str, String)> = vec![
        ("shell-rc-write", "open", h(".bashrc")),
        ("shell-rc-write", "rename", h(".zshrc")),
        ("shell-rc-write", "link", h(".profile")),
        ("systemd-user-unit-write", "open", h(".config/systemd/user/x.service")),
        ("systemd-user-unit-write", "symlink", h(".config/systemd/user/y.service")),
        ("ssh-authorized-keys-write", "open", h(".ssh/authorized_keys")),
        ("github-workflow-write", "open", w("repo/.github/workflows/x.yml")),
        ("python-pth-write", "open", w("venv/lib/python3.12/site-packages/x.pth")),
        ("ai-agent-config-write", "rename", h(".claude/settings.json")),
        ("sudoers-write", "open", "/etc/sudoers.d/x".to_owned()),
        ("crontab-write", "open", "/var/spool/cron/crontabs/root".to_owned()),
    ];
    let alerts = run.alerts();
    let missing: Vec<String> = expected
        .iter()
        .filter(|(id, action, path)| {
            !alerts
                .iter()
                .any(|a| rule(a) == *id && a["event"]["action"] == *action && a["file"]["path"] == path.as_str())
        })
        .map(|(id, action, path)| format!("{id} ({action} {path})"))
        .collect();
    assert!(missing.is_empty(), "missing: {missing:#?}\nalerts:\n{}\n{}", summary(&alerts), run.describe());
    for alert in &alerts {
        assert_eq!(alert["package"]["name"], "persist", "{alert:#}");
        assert_eq!(alert["rule"]["category"], "persistence", "only persistence was touched: {alert:#}");
    }
    let renamed = alerts.iter().find(|a| a["file"]["path"] == h(".zshrc").as_str()).unwrap();
    assert_eq!(
        text(&renamed["file"]["renamed_from"]),
        sandbox.top().join("zshrc.new").to_str().unwrap(),
        "{renamed:#}"
    );
    // Reading a start-up file is what every shell does.
    assert!(
        !alerts
            .iter()
            .any(|a| a["file"]["path"] == h(".bashrc").as_str() && text(&a["file"]["flags"]).starts_with("O_RDONLY")),
        "reading ~/.bashrc alerted:\n{}",
        summary(&alerts)
    );
}

/// One process reading every fake credential: the first two categories alert on their own,
/// the third turns into one sweep alert listing them, the rest is folded into it and counted
/// in the final summary when the tree ends.
#[test]
fn a_credential_sweep_is_one_alert_listing_the_categories_and_folds_the_rest() {
    let sandbox = Sandbox::new();
    let files = [".npmrc", ".aws/credentials", ".ssh/id_ed25519", ".ssh/id_rsa", ".pypirc", ".cargo/credentials.toml"];
    let paths: Vec<String> = files.iter().map(|f| sandbox.credential(f)).collect();
    let manager = sandbox.fake_manager();
    let mut cmd = vec![manager.to_str().unwrap(), "sweeper", r#"cat "$@" > /dev/null"#];
    cmd.extend(paths.iter().map(String::as_str));
    let run = sandbox.run_with(&sandbox.work(), &[], &cmd, &[]);

    run.assert_exit(EXIT_ALERT);
    let alerts = run.alerts();
    let described = || format!("alerts:\n{}\n{}", summary(&alerts), run.describe());
    assert_eq!(alerts.len(), 4, "npmrc, aws, the sweep and its final summary; {}", described());
    assert_eq!(alerts[0]["file"]["path"], paths[0].as_str(), "{}", described());
    assert_eq!(alerts[1]["file"]["path"], paths[1].as_str(), "{}", described());
    let (sweep, last) = (&alerts[2], &alerts[3]);
    for alert in [sweep, last] {
        assert_eq!(rule(alert), "credential-sweep", "{}", described());
        assert_eq!(alert["rule"]["category"], "sweep");
        assert_eq!(alert["rule"]["severity"], "critical");
        assert_eq!(alert["package"]["name"], "sweeper");
        let categories = &alert["credwatch"]["sweep"]["categories"];
        assert_eq!(categories, &serde_json::json!(["cloud", "registry", "ssh"]), "{alert:#}");
    }
    assert_eq!(sweep["credwatch"]["sweep"]["final"], false, "{sweep:#}");
    assert_eq!(sweep["file"]["path"], paths[2].as_str(), "the key made it a sweep: {sweep:#}");
    assert_eq!(last["credwatch"]["sweep"]["final"], true, "{last:#}");
    assert_eq!(last["credwatch"]["sweep"]["folded"], 3, "id_rsa, .pypirc, credentials.toml: {last:#}");
    let listed: Vec<&str> = last["credwatch"]["sweep"]["files"].as_array().unwrap().iter().map(text).collect();
    assert_eq!(listed, paths.iter().map(String::as_str).collect::<Vec<_>>(), "{last:#}");
    assert!(run.stderr.contains(" 4 alerts "), "the summary line counts 4 alerts\n{}", run.describe());
}

/// The payload: read the key (its path under HOME is `$3`) into a copy, then record its own
/// exit status.
const STEAL_KEY: &str = r#"cat "$HOME/$3" > "$1"; echo $? > "$2""#;

fn steal_key(sandbox: &Sandbox, key: &str, options: &[&str]) -> (Run, String, String) {
    let (copy, status) = (sandbox.work().join("copy"), sandbox.work().join("status"));
    let manager = sandbox.fake_manager();
    let run = sandbox.run_with(
        &sandbox.work(),
        options,
        &[manager.to_str().unwrap(), "stealer", STEAL_KEY, copy.to_str().unwrap(), status.to_str().unwrap(), key],
        &[],
    );
    let read = |path| fs::read_to_string(path).unwrap_or_default();
    (run, read(&copy), read(&status).trim().to_owned())
}

/// `--enforce` kills the reader at the open, before it reads: the copy holds nothing of the
/// key, `cat` died of SIGKILL, and the alert says `blocked`.
#[test]
fn enforce_kills_the_key_reader_before_the_secret_reaches_it() {
    let sandbox = Sandbox::new();
    let (run, copy, status) = steal_key(&sandbox, ".ssh/id_ed25519", &["--enforce"]);

    run.assert_exit(EXIT_ALERT);
    assert!(!copy.contains(SECRET), "the secret reached the payload under --enforce\n{}", run.describe());
    assert_eq!(status, "137", "cat was not killed (128 + SIGKILL)\n{}", run.describe());
    let alert = run.expect_alert(&sandbox.credential(".ssh/id_ed25519"));
    assert_eq!(alert["rule"]["id"], "ssh-private-keys", "{alert:#}");
    assert_eq!(alert["event"]["outcome"], "blocked", "{alert:#}");
    assert_eq!(alert["credwatch"]["enforcement"], "kernel", "{alert:#}");
    assert_eq!(alert["package"]["name"], "stealer", "{alert:#}");
}

/// The same payload without `--enforce` does get the secret: the test above can fail.
#[test]
fn without_enforce_the_same_payload_copies_the_key_and_is_reported() {
    let sandbox = Sandbox::new();
    let (run, copy, status) = steal_key(&sandbox, ".ssh/id_ed25519", &[]);

    run.assert_exit(EXIT_ALERT);
    assert!(copy.contains(SECRET), "the payload did not copy the key\n{}", run.describe());
    assert_eq!(status, "0", "{}", run.describe());
    let alert = run.expect_alert(&sandbox.credential(".ssh/id_ed25519"));
    assert_eq!(alert["rule"]["id"], "ssh-private-keys", "{alert:#}");
    assert_eq!(alert["event"]["outcome"], "alerted", "{alert:#}");
}

/// The fake GnuPG secret key (see `FAKE_CREDENTIALS`).
const GPG_KEY: &str = ".gnupg/private-keys-v1.d/0C5A33B8A1C8D09F9B8E1E4D2E3F4A5B6C7D8E9F.key";

/// A GnuPG secret key is blocked like an SSH key: the kill set follows the rule's directory
/// (`~/.gnupg/private-keys-v1.d/**`) to the files in it.
#[test]
fn enforce_kills_a_gnupg_secret_key_reader() {
    let sandbox = Sandbox::new();
    let (run, copy, status) = steal_key(&sandbox, GPG_KEY, &["--enforce"]);

    run.assert_exit(EXIT_ALERT);
    assert!(!copy.contains(SECRET), "the secret reached the payload under --enforce\n{}", run.describe());
    assert_eq!(status, "137", "cat was not killed (128 + SIGKILL)\n{}", run.describe());
    let alert = run.expect_alert(&sandbox.credential(GPG_KEY));
    assert_eq!(alert["rule"]["id"], "gnupg-private-keys", "{alert:#}");
    assert_eq!(alert["event"]["outcome"], "blocked", "{alert:#}");
}

/// Each credential file of the catalogue (GnuPG, Terraform, Maven, Gradle, RubyGems, Copilot,
/// 1Password, rclone, s3cmd, the GNOME keyring, pass, glab) and the rule it must raise.
const CATALOGUE: &[(&str, &str)] = &[
    (GPG_KEY, "gnupg-private-keys"),
    (".terraform.d/credentials.tfrc.json", "terraform-credentials"),
    (".terraformrc", "terraform-credentials"),
    (".m2/settings.xml", "maven-settings"),
    (".m2/settings-security.xml", "maven-settings"),
    (".gradle/gradle.properties", "gradle-properties"),
    (".gem/credentials", "rubygems-credentials"),
    (".config/github-copilot/hosts.json", "copilot-tokens"),
    (".config/op/config", "onepassword"),
    (".config/rclone/rclone.conf", "rclone-config"),
    (".s3cfg", "s3cmd-config"),
    (".local/share/keyrings/login.keyring", "desktop-keyrings"),
    (".password-store/email/work.gpg", "pass-store"),
    (".config/glab-cli/config.yml", "glab-config"),
];
/// Session stores the test writes itself (the sandbox's home has none): a terminal agent's
/// token, a messenger's session and a browser flavour's cookies, and their rules.
const SESSION_STORES: &[(&str, &str)] = &[
    (".local/share/opencode/auth.json", "ai-agent-credentials"),
    (".config/discord/Local Storage/leveldb/000005.ldb", "discord-tokens"),
    (".local/share/TelegramDesktop/tdata/key_datas", "telegram-desktop-session"),
    (".config/BraveSoftware/Brave-Browser/Default/Cookies", "browser-profiles"),
];
/// Their neighbours, which are not secret.
const CATALOGUE_LOOK_ALIKES: &[&str] = &[
    ".gnupg/pubring.kbx",
    ".gnupg/trustdb.gpg",
    ".terraform.d/plugin-cache/README",
    ".m2/repository/org/example/x/1.0/x-1.0.pom",
    ".gem/specs/index.rubygems.org/specs.4.8",
    ".config/rclone/README",
    ".config/opencode/opencode.json",
    ".config/discord/settings.json",
    ".local/share/TelegramDesktop/tdata/user_data/media_cache/0/binlog",
    ".config/BraveSoftware/Brave-Browser/Default/History",
    ".config/BraveSoftware/Brave-Browser/Default/Extensions/nkbihfbeogaeaoehlefnkodbefgpgknn/12.1.0/manifest.json",
];

/// Sweep settings that no tree reaches (for `--rules`).
const NO_SWEEP: &str = "schema: 1
sweep:
  id: credential-sweep
  name: Credential sweep
  description: Out of reach in this test.
  category: sweep
  severity: critical
  min_categories: 100
  window_s: 30
  min_severity: medium
";

/// A real `npm install` whose postinstall reads the look-alikes, then every catalogue file and
/// session store: one alert per file, with its rule, naming the package; none for the
/// look-alikes (the rest of the browser profile and the messenger's cache among them). The
/// sweep is put out of reach (`--rules` with a sweep of its own) so that every read stays its
/// own alert instead of being folded.
#[test]
fn postinstall_reading_the_catalogue_credentials_raises_each_files_rule() {
    let sandbox = Sandbox::new();
    let (home, work) = (sandbox.home(), sandbox.work());
    for relative in CATALOGUE_LOOK_ALIKES {
        let path = home.join(relative);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, "not a secret\n").unwrap();
    }
    for (relative, _) in SESSION_STORES {
        let path = home.join(relative);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, "FAKE-credwatch-e2e-session\n").unwrap();
    }
    let package = work.join("catalogue-thief");
    fs::create_dir_all(&package).unwrap();
    fs::write(
        package.join("package.json"),
        r#"{ "name": "catalogue-thief", "version": "1.0.0", "scripts": { "postinstall": "sh steal.sh" } }"#,
    )
    .unwrap();
    let reads: Vec<String> = CATALOGUE_LOOK_ALIKES
        .iter()
        .chain(CATALOGUE.iter().chain(SESSION_STORES).map(|(relative, _)| relative))
        .map(|relative| format!("cat \"$HOME/{relative}\" > /dev/null\n"))
        .collect();
    fs::write(package.join("steal.sh"), reads.concat()).unwrap();
    let tarball = sandbox.setup("npm pack", sandbox.command("npm").args(["pack", "--silent"]).current_dir(&package));
    let tarball = package.join(tarball.trim());
    let rules = work.join("rules");
    fs::create_dir_all(&rules).unwrap();
    fs::write(rules.join("sweep.yaml"), NO_SWEEP).unwrap();
    let project = sandbox.npm_project();

    let run = sandbox.run_with(
        &project,
        &["--rules", rules.to_str().unwrap()],
        &["npm", "install", tarball.to_str().unwrap()],
        &[],
    );

    run.assert_exit(EXIT_ALERT);
    let alerts = run.alerts();
    let described = || format!("alerts:\n{}\n{}", summary(&alerts), run.describe());
    for (relative, id) in CATALOGUE.iter().chain(SESSION_STORES) {
        let path = sandbox.credential(relative);
        let hits: Vec<&Value> = alerts.iter().filter(|a| a["file"]["path"] == path.as_str()).collect();
        assert_eq!(hits.len(), 1, "one alert for {relative}; {}", described());
        let alert = hits[0];
        assert_eq!(rule(alert), *id, "{relative}: {alert:#}");
        assert_eq!(alert["event"]["action"], "open", "{alert:#}");
        assert_eq!(alert["package"]["name"], "catalogue-thief", "{alert:#}");
        assert_eq!(alert["package"]["lifecycle"], "postinstall", "{alert:#}");
        assert_eq!(alert["package"]["manager"], "npm", "{alert:#}");
    }
    assert_eq!(
        alerts.len(),
        CATALOGUE.len() + SESSION_STORES.len(),
        "nothing for the look-alikes, nothing else; {}",
        described()
    );
}

/// Package code calling bpf() (a harmless BPF_PROG_GET_NEXT_ID), sending SIGCONT to the agent
/// and attaching to another process with ptrace: each alerts; under `--enforce` each caller
/// is killed at the syscall. The payload finds the agent as its manager's parent
/// (`credwatch run` starts CMD itself).
fn tamper(enforce: bool) {
    let sandbox = Sandbox::new();
    let syscalls = fixtures().join("evasion/syscalls.py");
    let status = sandbox.work().join("status");
    let victim = Sleeper::start(&sandbox);
    let (outcome, exit) = if enforce { ("blocked", "137") } else { ("alerted", "0") };
    let cases = [
        ("bpf-caller", "bpf-by-package", "bpf", r#"python3 "$1" bpf; echo $? > "$2""#),
        (
            "agent-signaller",
            "signal-to-agent",
            "kill",
            r#"read -r _ _ _ agent _ < /proc/$PPID/stat; sh -c 'kill -CONT "$1"' sh "$agent"; echo $? > "$2""#,
        ),
        ("tracer", "ptrace-attach", "ptrace", r#"python3 "$1" ptrace "$3"; echo $? > "$2""#),
    ];
    for (package, id, syscall, script) in cases {
        let manager = sandbox.fake_manager();
        let mut command = sandbox.command(credwatch_binary());
        command.args(["run", "--json", "--alerts"]).arg(sandbox.alerts_file());
        if enforce {
            command.arg("--enforce");
        }
        command.args(["--", manager.to_str().unwrap(), package, script]).arg(&syscalls).arg(&status).arg(victim.pid());
        let credwatch = sandbox.spawn(command);
        let agent = credwatch.id();
        let run = sandbox.wait(credwatch);

        run.assert_exit(EXIT_ALERT);
        let alert = run
            .alerts()
            .into_iter()
            .find(|a| rule(a) == id && a["package"]["name"] == package)
            .unwrap_or_else(|| panic!("{package}: no {id} alert\n{}", run.describe()));
        assert_eq!(alert["event"]["action"], "syscall", "{alert:#}");
        assert_eq!(alert["event"]["outcome"], outcome, "{alert:#}");
        assert_eq!(alert["credwatch"]["syscall"]["name"], syscall, "{alert:#}");
        let status = fs::read_to_string(&status).unwrap_or_default();
        assert_eq!(status.trim(), exit, "{package}: the caller's exit status\n{}", run.describe());
        let (target, operation) = match id {
            "signal-to-agent" => (agent.to_string(), "SIGCONT"),
            "ptrace-attach" => (victim.pid(), "PTRACE_ATTACH"),
            _ => continue,
        };
        assert_eq!(alert["credwatch"]["syscall"]["target_pid"].to_string(), target, "{alert:#}");
        assert_eq!(alert["credwatch"]["syscall"]["operation"], operation, "{alert:#}");
    }
}

#[test]
fn bpf_signals_to_the_agent_and_ptrace_by_package_code_are_reported() {
    tamper(false);
}

#[test]
fn bpf_signals_to_the_agent_and_ptrace_by_package_code_are_killed_under_enforce() {
    tamper(true);
}

/// A tree that makes a million harmless opens and reads one key half way through still gets
/// the key alert; losses, if any, are in the summary line. The opens are of missing files: the
/// kernel counts an open of a file the process opened less than a second ago rather than send
/// it (docs/src/blind-spots.md), and always sends a failed one, so these are a million
/// records.
#[test]
fn a_key_read_in_a_flood_of_a_million_opens_is_still_reported() {
    let sandbox = Sandbox::new();
    let script = r#"
import os, sys
d = os.path.join(os.environ["TMPDIR"], "flood")
os.makedirs(d)
names = [os.path.join(d, str(i)) for i in range(1000)]
for round in range(1000):
    if round == 500:
        with open(os.path.expanduser("~/.ssh/id_ed25519")) as f:
            f.read()
    for n in names:
        try:
            os.open(n, os.O_RDONLY)
        except FileNotFoundError:
            pass
"#;
    let manager = sandbox.fake_manager();
    let run =
        sandbox.run_with(&sandbox.work(), &[], &[manager.to_str().unwrap(), "flood", "python3 -c \"$1\"", script], &[]);

    run.assert_exit(EXIT_ALERT);
    let alert = run.expect_alert(&sandbox.credential(".ssh/id_ed25519"));
    assert_eq!(alert["package"]["name"], "flood", "{alert:#}");
    // "credwatch: N events, M lost, ...": the flood really went through the sensor, and
    // whatever it cost is counted there.
    let summary_line =
        run.stderr.lines().find(|l| l.contains(" events, ")).unwrap_or_else(|| panic!("{}", run.describe()));
    let numbers: Vec<u64> = summary_line.split([' ', ',']).filter_map(|word| word.parse().ok()).collect();
    let (events, lost) = (numbers[0], numbers[1]);
    assert!(events + lost >= 1_000_000, "fewer than a million opens seen: {summary_line}");
    println!("flood: {summary_line}");
}
