//! A coding agent's own tools run through its shell (issue 24, point 3): a stand-in `claude`
//! (a script of that name on PATH) runs each command the way Claude Code's Bash tool does,
//! `bash -c` with more after the command, so that bash forks it. Its git over ssh reading the
//! user's key is the agent's work, spared like a manager's git, under `watch --enforce` too
//! (the real git and /usr/bin/ssh, offline: git's `ext::` transport runs ssh against a
//! loopback listener that hangs up, and ssh reads its identity right after the connect). Its
//! `cat` of the key still alerts critical (killed under `--enforce`), and so does package code
//! (`npm install` of a package whose postinstall runs the same git). Privileged: run as root
//! with `cargo xtask test`.

use std::{
    fs,
    net::TcpListener,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use credwatch_e2e::{credwatch_binary, detached, slow, write_executable, Run, Sandbox};
use serde_json::Value;

/// The key every tool call reads, in the sandbox's home.
const KEY: &str = ".ssh/id_ed25519";

/// The stand-in agent: its one tool call, `bash -c` with the command and then the directory it
/// left (Claude Code's Bash tool adds `pwd -P >| FILE`), exiting with the command's status.
/// The final `exit` keeps sh from exec'ing bash in the agent's own process.
const CLAUDE: &str = "#!/bin/sh\nbash -c \"$1\nstatus=\\$?; pwd -P >/dev/null; exit \\$status\"\nexit $?\n";

/// The tool calls, by step name: git over ssh, ssh itself, and `cat` of the key. ssh is given
/// the sandbox's key, so that it looks for no other identity (in the real home: ssh takes it
/// from the passwd file, not `HOME`).
fn tool_calls(sandbox: &Sandbox, port: u16) -> [(&'static str, String); 3] {
    let key = sandbox.credential(KEY);
    let ssh = format!("ssh -F /dev/null -o BatchMode=yes -i {key} -p {port} 127.0.0.1");
    [
        ("git", format!("git -c protocol.ext.allow=always ls-remote 'ext::{ssh} %S /dep' >/dev/null 2>&1")),
        ("ssh", format!("{ssh} true >/dev/null 2>&1")),
        ("cat", format!("cat {key} >/dev/null")),
    ]
}

/// A package whose postinstall runs the same git over ssh (`sh -c` by npm: package code).
fn git_over_ssh_package(sandbox: &Sandbox, port: u16) -> String {
    let package = sandbox.work().join("gitdep");
    fs::create_dir_all(&package).unwrap();
    let (_, git) = &tool_calls(sandbox, port)[0];
    let postinstall = format!("{git}; echo $? > {}; true", sandbox.top().join("rc-postinstall-git").display());
    let manifest = serde_json::json!({"name": "gitdep", "version": "1.0.0", "scripts": {"postinstall": postinstall}});
    fs::write(package.join("package.json"), manifest.to_string()).unwrap();
    let name = sandbox.setup("npm pack", sandbox.command("npm").args(["pack", "--silent"]).current_dir(&package));
    package.join(name.trim()).to_string_lossy().into_owned()
}

fn status(dir: &Path, step: &str) -> Option<i32> {
    fs::read_to_string(dir.join(format!("rc-{step}"))).ok()?.trim().parse().ok()
}

/// The exit status of each tool call run by the stand-in without credwatch.
fn without_credwatch(sandbox: &Sandbox, claude: &Path, project: &Path, port: u16) -> Vec<(&'static str, i32)> {
    tool_calls(sandbox, port)
        .into_iter()
        .map(|(step, call)| {
            let status = sandbox.command(claude).arg(&call).current_dir(project).status().unwrap();
            (step, status.code().unwrap_or_else(|| panic!("{step} without credwatch: {status}")))
        })
        .collect()
}

/// Runs the tool calls and the package's install from a shell started before `watch` with
/// `options` (outside every watched tree, as a developer's shell is: the stand-in roots its
/// own tree), then stops watch; under `--enforce` that shell detaches the kernel side (a
/// process of the test's own tree touching the pinned programs would be killed).
fn run_tools(sandbox: &Sandbox, options: &[&str]) -> Tools {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || listener.incoming().for_each(drop));
    let bin = sandbox.work().join("bin");
    let claude = bin.join("claude");
    write_executable(&claude, CLAUDE);
    let project = sandbox.npm_project();
    let tarball = git_over_ssh_package(sandbox, port);
    let baseline = without_credwatch(sandbox, &claude, &project, port);

    let top = sandbox.top().display();
    let mut script =
        format!("step() {{ s=$1; shift; timeout 120 \"$@\" >{top}/out-$s 2>&1 </dev/null; echo $? >{top}/rc-$s; }}\n");
    for (step, call) in tool_calls(sandbox, port) {
        script.push_str(&format!("step {step} claude {}\n", quote(&call)));
    }
    script.push_str(&format!(
        "step package npm install --no-audit --no-fund --offline {}\n\
         touch {top}/steps-done\n\
         i=0; while [ ! -e {top}/stop-watch ] && [ $i -lt 12000 ]; do sleep 0.05; i=$((i+1)); done\n\
         {} stop --pin-dir {} >{top}/out-stop 2>&1; echo $? >{top}/rc-stop\n",
        quote(&tarball),
        quote(&credwatch_binary().to_string_lossy()),
        quote(&sandbox.pin_dir().to_string_lossy()),
    ));
    let go = detached(sandbox, &project, "tools", &[("PATH", sandbox.path_with(&bin))], &script);
    let watch = sandbox.watch_with(options);
    go();
    let done = sandbox.top().join("steps-done");
    let start = Instant::now();
    while !done.exists() && start.elapsed() < slow(Duration::from_secs(300)) {
        thread::sleep(Duration::from_millis(100));
    }
    // The package's alert is the last one due.
    sandbox.wait_for(|a| a["package"]["name"] == "gitdep", slow(Duration::from_secs(10)));
    let run = watch.stop();
    fs::write(sandbox.top().join("stop-watch"), "").unwrap();
    let start = Instant::now();
    while status(sandbox.top(), "stop").is_none() && start.elapsed() < slow(Duration::from_secs(60)) {
        thread::sleep(Duration::from_millis(100));
    }
    let steps = ["git", "ssh", "cat", "package", "postinstall-git", "stop"];
    let statuses: Vec<(&str, Option<i32>)> = steps.iter().map(|step| (*step, status(sandbox.top(), step))).collect();
    assert!(done.exists(), "the steps did not finish: {statuses:?}\n{}", run.describe());
    assert_eq!(status(sandbox.top(), "stop"), Some(0), "credwatch stop: {statuses:?}\n{}", run.describe());
    assert!(!sandbox.pin_dir().exists(), "credwatch stop left {}", sandbox.pin_dir().display());
    Tools { run, baseline, statuses }
}

/// A run of the tool calls: watch's run, each call's exit status without credwatch, and each
/// step's exit status under watch (None: it did not finish).
struct Tools {
    run: Run,
    baseline: Vec<(&'static str, i32)>,
    statuses: Vec<(&'static str, Option<i32>)>,
}

fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

fn executable_is(alert: &Value, name: &str) -> bool {
    alert["process"]["executable"].as_str().is_some_and(|e| e.ends_with(&format!("/{name}")))
}

/// The checks of both runs; `enforce`: watch had `--enforce`.
fn check(sandbox: &Sandbox, Tools { run, baseline, statuses }: &Tools, enforce: bool) {
    let key = sandbox.credential(KEY);
    let context = || format!("statuses {statuses:?}, without credwatch {baseline:?}\n{}", run.describe());
    let of = |step: &str| statuses.iter().find(|(s, _)| *s == step).and_then(|(_, status)| *status);
    // git and ssh exit as without credwatch: nothing of them was killed.
    for (step, expected) in baseline.iter().filter(|(step, _)| *step != "cat") {
        assert_eq!(of(step), Some(*expected), "{step} under the agent\n{}", context());
    }
    let alerts = run.alerts_for(&key);
    let outcome = |alert: &Value| alert["event"]["outcome"].as_str().unwrap_or_default().to_owned();
    let agents: Vec<&Value> = alerts.iter().filter(|a| a["coding_agent"]["name"] == "claude").collect();
    // The agent's git and ssh: reported low, for the agent, never blocked.
    let spared: Vec<&&Value> = agents.iter().filter(|a| executable_is(a, "ssh") || executable_is(a, "git")).collect();
    for step in ["git", "ssh"] {
        let command = |a: &&&Value| a["coding_agent"]["command"][2].as_str().is_some_and(|c| c.starts_with(step));
        assert!(spared.iter().any(command), "no alert for the ssh of the {step} call\n{}", context());
    }
    for alert in &spared {
        assert_eq!(alert["rule"]["severity"], "low", "{alert:#}\n{}", context());
        assert_eq!(outcome(alert), "alerted", "{alert:#}\n{}", context());
    }
    // Its cat: critical, and killed under --enforce (bash reports 128 + SIGKILL).
    let cat = agents.iter().find(|a| executable_is(a, "cat")).unwrap_or_else(|| panic!("no cat alert\n{}", context()));
    assert_eq!(cat["rule"]["severity"], "critical", "{cat:#}");
    assert_eq!(of("cat"), Some(if enforce { 137 } else { 0 }), "{}", context());
    // Package code's git over ssh: critical, killed under --enforce.
    let package = alerts
        .iter()
        .find(|a| a["package"]["name"] == "gitdep" && executable_is(a, "ssh"))
        .unwrap_or_else(|| panic!("no alert for the postinstall's ssh\n{}", context()));
    assert_eq!(package["rule"]["severity"], "critical", "{package:#}");
    assert!(package["coding_agent"].is_null(), "{package:#}");
    let expected = if enforce { ["blocked", "denied"].as_slice() } else { ["alerted"].as_slice() };
    for alert in [*cat, package] {
        assert!(expected.contains(&outcome(alert).as_str()), "{alert:#}\n{}", context());
    }
    // Nothing else about the agent at medium or above.
    let loud: Vec<Value> = run
        .alerts()
        .into_iter()
        .filter(|a| a["coding_agent"]["name"] == "claude" && !executable_is(a, "cat"))
        .filter(|a| !matches!(a["rule"]["severity"].as_str(), Some("low" | "info")))
        .collect();
    assert!(loud.is_empty(), "{loud:#?}\n{}", context());
}

#[test]
fn under_enforce_the_agents_git_over_ssh_lives_and_its_cat_of_the_key_and_package_code_die() {
    let sandbox = Sandbox::new();
    check(&sandbox, &run_tools(&sandbox, &["--enforce"]), true);
}

#[test]
fn without_enforce_the_agents_git_over_ssh_is_low_and_the_rest_critical() {
    let sandbox = Sandbox::new();
    check(&sandbox, &run_tools(&sandbox, &[]), false);
}
