//! A coding agent's own tools run through its shell (issue 24, point 3): `agent > bash > git >
//! ssh` reading the user's key is the agent's git, spared like `npm > git > ssh`; what the
//! shell runs that is no actor, the shell's own read and package code's shells still alert.

use super::*;

const KEY: &str = "/home/alice/.ssh/id_ed25519";

/// `git ls-remote` over ssh as pid `git` under `parent`, its ssh (pid `git + 1`) reading the
/// user's key.
fn git_over_ssh(run: &mut Run, parent: u32, git: u32) {
    run.spawn(git, parent, &["git", "ls-remote", "ssh://git@example.com/app.git"], &[])
        .spawn(
            git + 1,
            git,
            &["ssh", "-o", "SendEnv=GIT_PROTOCOL", "git@example.com", "git-upload-pack '/app.git'"],
            &[],
        )
        .open(git + 1, KEY);
}

/// The one alert `run` gave, by rule and severity.
fn judged(run: &mut Run) -> (String, Severity) {
    let alert = run.one();
    (alert.rule.id, alert.rule.severity)
}

#[test]
fn the_agents_git_over_ssh_through_its_shell_is_its_own_work() {
    let mut run = claude();
    run.spawn(101, 100, &["bash", "-c", "git ls-remote ssh://git@example.com/app.git"], &[]);
    git_over_ssh(&mut run, 101, 102);
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("ssh-private-keys", Severity::Low));
    assert_eq!(alert.coding_agent.unwrap().command.unwrap()[0], "bash");

    // Shells in shells (`bash -lc` running `sh -c`) pass the chain on too.
    let mut run = claude();
    run.spawn(101, 100, &["bash", "-lc", "sh -c 'git fetch'"], &[]).spawn(102, 101, &["sh", "-c", "git fetch"], &[]);
    git_over_ssh(&mut run, 102, 103);
    assert_eq!(judged(&mut run), ("ssh-private-keys".into(), Severity::Low));
}

#[test]
fn codex_runs_its_shell_from_its_native_binary() {
    // @openai/codex: `node codex.js` runs the native `codex`, which runs the shell.
    let npm = "/usr/lib/node_modules/@openai";
    let mut run = Run::new();
    run.exec_full(
        100,
        1,
        "/usr/bin/node",
        &["node", &format!("{npm}/codex/bin/codex.js"), "exec", "push it"],
        "/home/alice/app",
        &[("HOME", "/home/alice")],
    );
    let native = format!("{npm}/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex");
    run.fork(100, 101).exec_full(101, 100, &native, &[&native, "exec", "push it"], "/home/alice/app", &[]);
    run.spawn(102, 101, &["bash", "-lc", "git push"], &[]);
    git_over_ssh(&mut run, 102, 103);
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("ssh-private-keys", Severity::Low));
    assert_eq!(alert.coding_agent.unwrap().name, "codex");
}

#[test]
fn what_the_shell_runs_that_is_no_actor_still_alerts() {
    let mut run = claude();
    run.spawn(101, 100, &["bash", "-c", "cat ~/.ssh/id_ed25519"], &[])
        .spawn(102, 101, &["cat", KEY], &[])
        .open(102, KEY);
    assert_eq!(judged(&mut run), ("ssh-private-keys".into(), Severity::Critical));

    // A program between the shell and ssh breaks the chain: ssh is that program's doing.
    let mut run = claude();
    run.spawn(101, 100, &["bash", "-c", "python3 fetch.py"], &[])
        .spawn(102, 101, &["python3", "fetch.py"], &[])
        .spawn(103, 102, &["ssh", "git@example.com"], &[])
        .open(103, KEY);
    assert_eq!(judged(&mut run), ("ssh-private-keys".into(), Severity::Critical));
}

#[test]
fn the_shells_own_read_still_alerts() {
    let mut run = claude();
    run.spawn(101, 100, &["bash", "-c", "read -r key < ~/.ssh/id_ed25519"], &[]).open(101, KEY);
    assert_eq!(judged(&mut run), ("ssh-private-keys".into(), Severity::Critical));
}

#[test]
fn a_package_trees_shell_passes_no_chain() {
    // A postinstall's `sh -c 'git ls-remote ...'`: package code.
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[]).spawn(
        101,
        100,
        &["sh", "-c", "git ls-remote ssh://git@example.com/app.git"],
        POSTINSTALL,
    );
    git_over_ssh(&mut run, 101, 102);
    assert_eq!(judged(&mut run), ("ssh-private-keys".into(), Severity::Critical));

    // The same under the agent's `npm install`: the package's shell, not the agent's.
    let mut run = claude();
    run.spawn(101, 100, &["bash", "-c", "npm install"], &[]).spawn(102, 101, &["npm", "install"], &[]).spawn(
        103,
        102,
        &["sh", "-c", "git ls-remote ssh://git@example.com/app.git"],
        POSTINSTALL,
    );
    git_over_ssh(&mut run, 103, 104);
    assert_eq!(judged(&mut run), ("ssh-private-keys".into(), Severity::Critical));

    // While npm's own git for a git dependency stays spared there.
    let mut run = claude();
    run.spawn(101, 100, &["bash", "-c", "npm install"], &[]).spawn(102, 101, &["npm", "install"], &[]);
    git_over_ssh(&mut run, 102, 103);
    assert_eq!(judged(&mut run), ("ssh-private-keys".into(), Severity::Low));
}
