//! The configuration file, `CREDWATCH_*` variables, `config check` / `config show`, and
//! `SIGHUP` reloading the rules of a running `watch` (the kernel programs stay attached and the
//! trees already running stay attributed), with the real binary.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Output},
    thread,
    time::{Duration, Instant},
};

use credwatch_e2e::{credwatch_binary, in_tree, Run, Sandbox};
use serde_json::Value;

/// A site rule over the defaults: `~/.acme/config` (and, in the second version, the token).
fn site_rules(with_token_rule: bool) -> String {
    let rule = |id: &str, targets: &str| {
        format!(
            "  - id: {id}
    name: Acme file {id}
    description: Package code opened an Acme CLI file.
    category: platform
    severity: high
    targets: {targets}
    samples:
      positive:
        - exec: {{pid: 100, args: [npm, install], cwd: /home/alice/app}}
        - exec: {{pid: 101, ppid: 100, args: [node, x.js]}}
        - open: {{pid: 101, path: /home/alice/.acme/config}}
      negative:
        - exec: {{pid: 100, args: [npm, install], cwd: /home/alice/app}}
        - open: {{pid: 100, path: /home/alice/.acme/unrelated}}
"
        )
    };
    let mut text = format!("schema: 1\nrules:\n{}", rule("acme-config", "[\"~/.acme/config\"]"));
    if with_token_rule {
        text += &rule("acme-token", "[\"~/.acme/token\", \"~/.acme/token2\"]")
            .replace("/home/alice/.acme/config}", "/home/alice/.acme/token}");
    }
    text
}

/// A package tree started before `watch` and waiting: once `go` exists it executes a
/// manager (a copy of sh named npm, as npm's node is), whose lifecycle script writes its pid,
/// then for each stage N waits for `stageN` and reads the files of that stage, then touches
/// `doneN`.
fn detached_tree(sandbox: &Sandbox, stages: &[&[&str]]) -> PathBuf {
    let dir = sandbox.work().join("tree");
    let manager = dir.join("bin/npm");
    fs::create_dir_all(manager.parent().unwrap()).unwrap();
    fs::copy(fs::canonicalize("/bin/sh").unwrap(), &manager).unwrap();
    let mut script = String::from("echo $$ > pid; ");
    for (n, files) in stages.iter().enumerate() {
        let n = n + 1;
        // A minute at most per stage, so that a failed test leaves nothing running.
        script += &format!("i=0; while [ ! -e stage{n} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; ");
        for file in *files {
            script += &format!("cat \"$HOME/{file}\" > /dev/null; ");
        }
        script += &format!("touch done{n}; ");
    }
    let wait_go = "while [ ! -e go ]; do sleep 0.05; done";
    let outer = format!(
        "setsid sh -c '{wait_go}; exec \"$0\" -c \"$1\"' {} '{}' < /dev/null > tree.log 2>&1 &",
        manager.display(),
        script.replace('\'', r"'\''")
    );
    sandbox.setup(
        "starting the waiting tree",
        sandbox
            .command("sh")
            .args(["-c", &outer])
            .envs([("npm_package_name", "early-tree"), ("npm_lifecycle_event", "postinstall")])
            .current_dir(&dir),
    );
    dir
}

fn wait_for_file(path: &Path, what: &str) {
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "{what}: {} never appeared", path.display());
        thread::sleep(Duration::from_millis(20));
    }
}

/// The JSON log records written so far.
fn log_records(sandbox: &Sandbox) -> Vec<Value> {
    let stderr = sandbox.collect(None, Duration::ZERO).stderr;
    stderr.lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
}

/// Waits for a log record whose message contains `text`; returns it.
fn wait_for_record(sandbox: &Sandbox, child: &mut Child, text: &str) -> Value {
    let start = Instant::now();
    loop {
        let found = log_records(sandbox).into_iter().find(|r| r["message"].as_str().is_some_and(|m| m.contains(text)));
        if let Some(record) = found {
            return record;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "credwatch exited before logging {text:?}\n{}",
                sandbox.collect(Some(status), start.elapsed()).describe()
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no log record {text:?}\n{}",
            sandbox.collect(None, start.elapsed()).describe()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

fn hang_up(child: &Child) {
    let status = Command::new("kill").args(["-HUP", &child.id().to_string()]).status().unwrap();
    assert!(status.success(), "kill -HUP");
}

fn stop(sandbox: &Sandbox, child: Child) -> Run {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    sandbox.wait(child)
}

/// `watch --config FILE` takes its rules folder, alerts file and log format from the file.
/// `SIGHUP` after a rule file gained a rule: the rule fires on the next read of a tree that
/// started before the reload, still attributed to its package. `SIGHUP` with a broken rule
/// file: refused, said in a JSON log record at level WARN naming the file and line, and the
/// rules in force keep firing.
#[test]
fn sighup_reloads_rules_keeps_running_trees_and_refuses_a_broken_rule_file() {
    let sandbox = Sandbox::new();
    for file in [".acme/config", ".acme/token", ".acme/token2"] {
        let path = sandbox.home().join(file);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, "FAKE-credwatch-e2e\n").unwrap();
    }
    let rules = sandbox.work().join("rules");
    fs::create_dir_all(&rules).unwrap();
    fs::write(rules.join("site.yaml"), site_rules(false)).unwrap();
    let config = sandbox.work().join("credwatch.yaml");
    fs::write(
        &config,
        format!(
            "# The site's configuration.\njson: true\nrules: {}\nalerts: {}\nlog_format: json\n",
            rules.display(),
            sandbox.alerts_file().display()
        ),
    )
    .unwrap();
    let tree = detached_tree(&sandbox, &[&[".acme/token", ".acme/config"], &[".acme/token"], &[".acme/token2"]]);

    let mut command = sandbox.command(credwatch_binary());
    command.arg("watch").arg("--config").arg(&config);
    let mut watch = sandbox.spawn(command);
    let watching = wait_for_record(&sandbox, &mut watch, "watching package trees");
    assert_eq!(watching["level"], "INFO", "{watching}");
    fs::write(tree.join("go"), "").unwrap();
    wait_for_file(&tree.join("pid"), "the tree's manager");
    let root: u32 = fs::read_to_string(tree.join("pid")).unwrap().trim().parse().unwrap();
    let (token, token2, acme_config) =
        (sandbox.credential(".acme/token"), sandbox.credential(".acme/token2"), sandbox.credential(".acme/config"));

    // Before the reload: the site's one rule fires, the token has none.
    fs::write(tree.join("stage1"), "").unwrap();
    let first =
        sandbox.wait_for(|a| in_tree(a, root) && a["file"]["path"] == acme_config.as_str(), Duration::from_secs(30));
    let token_before: Vec<Value> =
        sandbox.alerts_now().into_iter().filter(|a| a["file"]["path"] == token.as_str()).collect();

    // The rule file gains a rule; SIGHUP.
    fs::write(rules.join("site.yaml"), site_rules(true)).unwrap();
    hang_up(&watch);
    let reloaded = wait_for_record(&sandbox, &mut watch, "reloaded the configuration (");
    fs::write(tree.join("stage2"), "").unwrap();
    let after = sandbox.wait_for(|a| in_tree(a, root) && a["file"]["path"] == token.as_str(), Duration::from_secs(30));

    // A broken rule file; SIGHUP: refused, the rules in force stay.
    fs::write(rules.join("site.yaml"), "schema: 1\nrules:\n  - id: broken\n    name: [unclosed\n").unwrap();
    hang_up(&watch);
    let refused = wait_for_record(&sandbox, &mut watch, "reload refused");
    fs::write(tree.join("stage3"), "").unwrap();
    let still = sandbox.wait_for(|a| in_tree(a, root) && a["file"]["path"] == token2.as_str(), Duration::from_secs(30));
    wait_for_file(&tree.join("done3"), "the tree's last stage");

    let run = stop(&sandbox, watch);
    run.assert_exit(0);
    let first = first.unwrap_or_else(|| panic!("no alert for {acme_config} before the reload\n{}", run.describe()));
    assert_eq!(first["rule"]["id"], "acme-config", "{first:#}");
    assert!(token_before.is_empty(), "the token alerted before its rule existed: {token_before:#?}");
    assert_eq!(reloaded["level"], "INFO", "{reloaded}");
    let after = after.unwrap_or_else(|| panic!("the rule added by the reload did not fire\n{}", run.describe()));
    assert_eq!(after["rule"]["id"], "acme-token", "{after:#}");
    assert_eq!(after["package"]["name"], "early-tree", "the tree started before the reload: {after:#}");
    assert_eq!(after["package"]["lifecycle"], "postinstall", "{after:#}");
    assert_eq!(after["credwatch"]["root_pid"], root, "{after:#}");
    assert_eq!(refused["level"], "WARN", "{refused}");
    let message = refused["message"].as_str().unwrap();
    let named = message.split("site.yaml:").nth(1).is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
    assert!(named, "the refusal does not name site.yaml:LINE: {message}");
    let still =
        still.unwrap_or_else(|| panic!("the rules in force stopped firing after a refused reload\n{}", run.describe()));
    assert_eq!(still["rule"]["id"], "acme-token", "{still:#}");
    assert_eq!(still["package"]["name"], "early-tree", "{still:#}");
    // The alerts went to the file the configuration named, as JSON on stdout too (`json: true`).
    assert!(run.stdout.lines().any(|l| l.contains("\"acme-token\"")), "{}", run.describe());
    // The summary is a JSON record too, at the end.
    let summary = log_records(&sandbox).pop().unwrap();
    assert!(summary["message"].as_str().unwrap().contains(" events, "), "{summary}");
    assert!(summary["alerts"].as_u64().unwrap() >= 3, "{summary}");
}

fn credwatch(sandbox: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Output {
    sandbox.command(credwatch_binary()).args(args).envs(env.iter().copied()).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `config check` names every error with file, line, column and key; `config show` prints
/// the file, the environment and the defaults as a file that checks and shows the same; a
/// live mode with a bad configuration stops with one clear error and starts nothing.
#[test]
fn config_check_and_show_and_bad_configurations() {
    let sandbox = Sandbox::new();
    let bad = sandbox.work().join("bad.yaml");
    fs::write(&bad, "json: true\nwatch_projct: true\nlinger: soon\nrules: /nonexistent/rules\n").unwrap();
    let out = credwatch(&sandbox, &["config", "check", bad.to_str().unwrap()], &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let at = |line_column: &str| format!("{}:{line_column}: key", bad.display());
    assert!(stderr.contains(&format!("{} `watch_projct`: unknown key", at("2:1"))), "{stderr}");
    assert!(stderr.contains(&format!("{} `linger`: invalid type", at("3:9"))), "{stderr}");
    assert!(stderr.contains(&format!("{} `rules`: /nonexistent/rules is not a folder", at("4:8"))), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // The same file as the configuration of `run`: nothing runs.
    let marker = sandbox.work().join("ran");
    let out =
        credwatch(&sandbox, &["run", "--config", bad.to_str().unwrap(), "--", "touch", marker.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("3 errors in the configuration"), "{}", text(&out.stderr));
    assert!(!marker.exists(), "the command ran under a bad configuration");
    // A wrong type from the environment is named by its variable.
    let out = credwatch(&sandbox, &["watch"], &[("CREDWATCH_ENFORCE", "maybe")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("environment variable CREDWATCH_ENFORCE: key `enforce`"),
        "{}",
        text(&out.stderr)
    );

    let good = sandbox.work().join("good.yaml");
    fs::write(&good, format!("json: true\nlinger: 2\nalerts: {}\n", sandbox.alerts_file().display())).unwrap();
    let out = credwatch(&sandbox, &["config", "check", good.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).lines().count(), 1, "one line: {}", text(&out.stdout));
    assert!(text(&out.stdout).contains("valid; set: json, alerts, linger"), "{}", text(&out.stdout));

    // Environment over the file; an unknown variable is a warning naming the key meant.
    let env = [("CREDWATCH_LINGER", "5"), ("CREDWATCH_WATCH_PROJECT", "true"), ("CREDWATCH_ENFORCED", "true")];
    let out = credwatch(&sandbox, &["config", "show", "--config", good.to_str().unwrap()], &env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("CREDWATCH_ENFORCED is not a configuration key"), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("did you mean CREDWATCH_ENFORCE?"), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    for line in ["json: true", "linger: 5.0", "watch_project: true", "enforce: false", "log_format: text"] {
        assert!(shown.lines().any(|l| l == line), "{line:?} not in\n{shown}");
    }
    // What show prints is a configuration that checks, and shows the same again.
    let saved = sandbox.work().join("saved.yaml");
    fs::write(&saved, &shown).unwrap();
    let out = credwatch(&sandbox, &["config", "check", saved.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let again = credwatch(&sandbox, &["config", "show", "--config", saved.to_str().unwrap()], &[]);
    let body = |text: &str| text.lines().skip(1).map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(body(&text(&again.stdout)), body(&shown));
}
