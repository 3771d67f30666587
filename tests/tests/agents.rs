//! Coding agents as roots: `credwatch watch` marks a process that executes `claude` (here a
//! stand-in shell script of that name) as the root of an agent tree by itself, and judges the
//! tree by the agent policy. Privileged: run as root with `cargo xtask test`.

use std::fs;

use credwatch_e2e::{assert_field, write_executable, Sandbox};
use serde_json::Value;

#[test]
fn watch_names_the_agent_and_its_command_and_leaves_its_own_token_alone() {
    let sandbox = Sandbox::new();
    let own = sandbox.credential(".claude/.credentials.json");
    fs::create_dir_all(sandbox.home().join(".claude")).unwrap();
    fs::write(&own, r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-FAKE-credwatch-e2e"}}"#).unwrap();
    let key = sandbox.credential(".ssh/id_ed25519");
    let project = sandbox.work().join("app");
    fs::create_dir_all(&project).unwrap();
    fs::write(project.join(".env"), "API_KEY=fake-credwatch-e2e\n").unwrap();
    // The stand-in agent: reads its own token, the project's .env, then runs a tool that
    // reads an SSH key (what a prompt-injected agent does).
    let claude = sandbox.work().join("bin/claude");
    write_executable(
        &claude,
        "#!/bin/sh\ncat \"$HOME/.claude/.credentials.json\" .env >/dev/null\nsh -c 'cat \"$HOME/.ssh/id_ed25519\"' >/dev/null\n",
    );

    let mut watch = sandbox.credwatch("watch");
    watch.args(["--json", "--output"]).arg(sandbox.alerts_file());
    watch.arg("--pin-dir").arg(sandbox.pin_dir());
    let watcher = sandbox.spawn(watch);
    // Attaching takes a moment: the agent runs again until its alert shows.
    let (alert, run) = sandbox.repeat_under_watch(
        watcher,
        "the stand-in claude",
        || {
            let mut claude = sandbox.command(&claude);
            claude.current_dir(&project);
            claude
        },
        |a| a["file"]["path"] == key,
    );
    assert_field(&alert, "/rule/id", "ssh-private-keys", &run);
    assert_field(&alert, "/coding_agent/name", "claude", &run);
    assert_eq!(
        alert["coding_agent"]["command"],
        Value::from(vec!["sh", "-c", "cat \"$HOME/.ssh/id_ed25519\""]),
        "{alert:#}\n{}",
        run.describe()
    );
    assert!(alert["process"]["executable"].as_str().is_some_and(|e| e.ends_with("/cat")), "{alert:#}");
    // Its own token and the project's .env are its work: every run of it read them.
    assert!(run.alerts_for(&own).is_empty(), "the agent's own token alerted\n{}", run.describe());
    let env = project.join(".env").to_string_lossy().into_owned();
    assert!(run.alerts_for(&env).is_empty(), "the project's .env alerted\n{}", run.describe());
}
