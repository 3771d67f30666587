//! Issue 13: deny under `--enforce` with the fentry backend and the BPF LSM, run in the kernel
//! matrix's guests booted with `lsm=...,bpf` (`--features guest`). The payload's open, bpf()
//! call or signal fails with EPERM before anything happens, the payload lives and sees the
//! error, and the alert says `denied`; the manager and the git and ssh it runs for a git
//! dependency are spared as with the tracepoint backend.

use std::{fs, net::TcpListener, thread, time::Duration};

use credwatch_e2e::{
    fixtures,
    scenarios::{bpf_lsm_active, fake_npm, SECRET},
    Run, Sandbox, Sleeper, EXIT_ALERT, FAKE_CREDENTIALS,
};
use serde_json::Value;

/// A sandbox whose credwatch uses the fentry backend, on a kernel where the BPF LSM is active.
fn deny_sandbox() -> Sandbox {
    assert!(bpf_lsm_active(), "guest_deny needs a kernel booted with bpf among its LSMs (lsm=...,bpf)");
    Sandbox::with_sensor(Some("fentry".to_owned()))
}

fn key(sandbox: &Sandbox) -> String {
    sandbox.credential(".ssh/id_ed25519")
}

fn original_key() -> &'static str {
    FAKE_CREDENTIALS.iter().find(|(path, _)| *path == ".ssh/id_ed25519").expect("the fake key").1
}

/// The one alert that `wanted` accepts, or a failure that shows the whole run.
#[track_caller]
fn expect(run: &Run, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
    run.alerts().into_iter().find(|a| wanted(a)).unwrap_or_else(|| panic!("no alert for {what}\n{}", run.describe()))
}

/// A file the payload wrote, trimmed; empty when it wrote none.
fn written(sandbox: &Sandbox, name: &str) -> String {
    fs::read_to_string(sandbox.work().join(name)).unwrap_or_default().trim().to_owned()
}

fn work_file(sandbox: &Sandbox, name: &str) -> String {
    sandbox.work().join(name).to_string_lossy().into_owned()
}

/// `open(key, O_WRONLY|O_TRUNC)` by package code: with the tracepoint backend's kill the
/// truncation has already happened; here the open fails with EPERM, the key keeps its bytes
/// and the payload goes on (it prints the errno and exits 0).
#[test]
fn an_o_trunc_open_of_a_key_fails_with_eperm_and_the_key_keeps_its_bytes() {
    let sandbox = deny_sandbox();
    let script = r#"python3 -c '
import errno, os, sys
try:
    os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
    print("opened")
except OSError as e:
    print(errno.errorcode[e.errno])
' "$HOME/.ssh/id_ed25519" > "$1"; echo $? > "$2""#;
    let run = fake_npm(
        &sandbox,
        &["--enforce"],
        "truncator",
        script,
        &[&work_file(&sandbox, "errno"), &work_file(&sandbox, "status")],
    );

    run.assert_exit(EXIT_ALERT);
    assert_eq!(written(&sandbox, "errno"), "EPERM", "{}", run.describe());
    assert_eq!(written(&sandbox, "status"), "0", "the payload did not live on\n{}", run.describe());
    assert_eq!(fs::read_to_string(key(&sandbox)).unwrap(), original_key(), "the key lost its bytes");
    let alert = run.expect_alert(&key(&sandbox));
    assert_eq!(alert["event"]["outcome"], "denied", "{alert:#}");
    assert_eq!(alert["credwatch"]["enforcement"], "lsm", "{alert:#}");
    assert_eq!(alert["rule"]["id"], "ssh-private-keys", "{alert:#}");
    assert_eq!(alert["package"]["name"], "truncator", "{alert:#}");
}

/// An io_uring IORING_OP_OPENAT of the key, which no syscall hook sees: the LSM refuses it,
/// the completion carries EPERM, and the alert names the file by the kernel's own path.
#[test]
fn an_io_uring_open_of_a_key_is_refused_and_alerted_with_its_path() {
    let sandbox = deny_sandbox();
    let syscalls = fixtures().join("evasion/syscalls.py");
    let loot = work_file(&sandbox, "loot");
    let script = r#"python3 "$1" io_uring "$HOME/.ssh/id_ed25519" "$2" 2> "$3"; echo $? > "$4""#;
    let args = [syscalls.to_str().unwrap(), &loot, &work_file(&sandbox, "stderr"), &work_file(&sandbox, "status")];
    let run = fake_npm(&sandbox, &["--enforce"], "uring", script, &args);

    run.assert_exit(EXIT_ALERT);
    assert_eq!(written(&sandbox, "stderr"), "IORING_OP_OPENAT: Operation not permitted", "{}", run.describe());
    assert_eq!(written(&sandbox, "status"), "1", "{}", run.describe());
    assert!(!fs::read_to_string(&loot).unwrap_or_default().contains(SECRET), "the payload got the key");
    let alert = run.expect_alert(&key(&sandbox));
    assert_eq!(alert["event"]["outcome"], "denied", "{alert:#}");
    assert_eq!(alert["credwatch"]["enforcement"], "lsm", "{alert:#}");
    assert_eq!(alert["rule"]["id"], "ssh-private-keys", "{alert:#}");
    assert_eq!(alert["package"]["name"], "uring", "{alert:#}");
}

/// bpf() from package code fails with EPERM (the payload prints it and exits 0); the alert
/// says denied.
#[test]
fn a_bpf_call_from_package_code_is_refused() {
    let sandbox = deny_sandbox();
    let syscalls = fixtures().join("evasion/syscalls.py");
    let script = r#"python3 "$1" bpf > "$2" 2>&1; echo $? > "$3""#;
    let args = [syscalls.to_str().unwrap(), &work_file(&sandbox, "output"), &work_file(&sandbox, "status")];
    let run = fake_npm(&sandbox, &["--enforce"], "bpf-caller", script, &args);

    run.assert_exit(EXIT_ALERT);
    let output = written(&sandbox, "output");
    assert!(output.contains("bpf: Operation not permitted"), "{output}\n{}", run.describe());
    assert_eq!(written(&sandbox, "status"), "0", "the caller did not live on\n{}", run.describe());
    let alert = expect(&run, "bpf()", |a| a["rule"]["id"] == "bpf-by-package");
    assert_eq!(alert["event"]["outcome"], "denied", "{alert:#}");
    assert_eq!(alert["credwatch"]["enforcement"], "lsm", "{alert:#}");
    assert_eq!(alert["credwatch"]["syscall"]["name"], "bpf", "{alert:#}");
    assert_eq!(alert["package"]["name"], "bpf-caller", "{alert:#}");
}

/// PTRACE_ATTACH from package code to a process outside the tree fails with EPERM; the
/// tracer lives (it prints the error and exits 1) and the victim was never stopped.
#[test]
fn a_ptrace_attach_from_package_code_is_refused() {
    let sandbox = deny_sandbox();
    let victim = Sleeper::start(&sandbox);
    let syscalls = fixtures().join("evasion/syscalls.py");
    let script = r#"python3 "$1" ptrace "$2" 2> "$3"; echo $? > "$4""#;
    let args =
        [syscalls.to_str().unwrap(), &victim.pid(), &work_file(&sandbox, "stderr"), &work_file(&sandbox, "status")];
    let run = fake_npm(&sandbox, &["--enforce"], "tracer", script, &args);

    run.assert_exit(EXIT_ALERT);
    assert_eq!(written(&sandbox, "stderr"), "ptrace: Operation not permitted", "{}", run.describe());
    assert_eq!(written(&sandbox, "status"), "1", "the tracer did not live on\n{}", run.describe());
    let alert = expect(&run, "ptrace", |a| a["rule"]["id"] == "ptrace-attach");
    assert_eq!(alert["event"]["outcome"], "denied", "{alert:#}");
    assert_eq!(alert["credwatch"]["enforcement"], "lsm", "{alert:#}");
    assert_eq!(alert["credwatch"]["syscall"]["operation"], "PTRACE_ATTACH", "{alert:#}");
    assert_eq!(alert["credwatch"]["syscall"]["target_pid"].to_string(), victim.pid(), "{alert:#}");
    assert_eq!(alert["package"]["name"], "tracer", "{alert:#}");
}

/// SIGKILL to the agent from package code fails with EPERM: the agent lives to the end of
/// the run and reports it; the sender lives too.
#[test]
fn a_signal_to_the_agent_from_package_code_is_refused_and_the_agent_lives() {
    let sandbox = deny_sandbox();
    // The agent is the manager's parent: `credwatch run` starts CMD itself.
    let script = r#"read -r _ _ _ agent _ < /proc/$PPID/stat; kill -KILL "$agent" 2> "$1"; echo $? > "$2""#;
    let mut command = sandbox.credwatch("run");
    command.args(["--json", "--enforce", "--alerts"]).arg(sandbox.alerts_file()).arg("--");
    command.arg(sandbox.fake_manager()).args([
        "signaller",
        script,
        &work_file(&sandbox, "stderr"),
        &work_file(&sandbox, "status"),
    ]);
    let credwatch = sandbox.spawn(command);
    let agent = credwatch.id();
    let run = sandbox.wait(credwatch);

    // An agent killed by the signal has no exit status of its own.
    run.assert_exit(EXIT_ALERT);
    assert_ne!(written(&sandbox, "status"), "0", "kill succeeded\n{}", run.describe());
    assert!(written(&sandbox, "stderr").contains("not permitted"), "{}", run.describe());
    let alert = expect(&run, "the signal", |a| a["rule"]["id"] == "signal-to-agent");
    assert_eq!(alert["event"]["outcome"], "denied", "{alert:#}");
    assert_eq!(alert["credwatch"]["enforcement"], "lsm", "{alert:#}");
    assert_eq!(alert["credwatch"]["syscall"]["target_pid"], agent, "{alert:#}");
    assert_eq!(alert["credwatch"]["syscall"]["operation"], "SIGKILL", "{alert:#}");
    assert_eq!(alert["package"]["name"], "signaller", "{alert:#}");
}

/// A manager fetching a git dependency over ssh, as npm does: the manager runs git, git its
/// remote helper (`git remote-ext`, git itself) and that one ssh with the key, no shell between
/// them; then git reads the key itself (`git hash-object`); then package code runs the same ssh.
/// ssh reads its identity right after the TCP connect, so a listener that accepts and hangs up
/// is server enough. The final `true` keeps the shell from exec'ing package code in the
/// manager's own process.
const GIT_DEPENDENCY: &str = r#"
key=$HOME/.ssh/id_ed25519
ssh_cmd="ssh -F /dev/null -o BatchMode=yes -i $key -p $PORT 127.0.0.1"
git -c protocol.ext.allow=always ls-remote "ext::$ssh_cmd %S /dep" > /dev/null 2>&1
git hash-object "$key" > "$WORK/hash"
npm_package_name=gitdep npm_package_version=1.0.0 npm_lifecycle_event=postinstall \
    sh -c "$ssh_cmd true > /dev/null 2>&1; true"
true
"#;

/// The manager and the git and ssh it runs are spared exactly as with the tracepoint backend:
/// their reads of the key go through (reported, not denied) while package code running the
/// same ssh is refused. `watch`, where the exec of a manager makes the root (`run` marks CMD
/// before it is anyone; that root spares nothing, with either backend): the manager is a copy
/// of sh named npm, started by the test, which must not itself run under a package manager
/// (the matrix runs the test binaries directly).
#[test]
fn the_manager_and_its_git_and_ssh_for_a_git_dependency_are_spared() {
    let sandbox = deny_sandbox();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    thread::spawn(move || listener.incoming().for_each(drop));
    let manager = sandbox.top().join("bin/npm");
    fs::create_dir_all(manager.parent().unwrap()).unwrap();
    fs::copy(fs::canonicalize("/bin/sh").unwrap(), &manager).unwrap();
    let work = sandbox.work();
    let key = key(&sandbox);

    let watch = sandbox.watch_with(&["--enforce"]);
    sandbox.setup(
        "the install",
        sandbox
            .command(&manager)
            .args(["-c", GIT_DEPENDENCY])
            .envs([("PORT", port.as_str()), ("WORK", work.to_str().unwrap())]),
    );
    let package_code = |a: &Value| a["file"]["path"] == key.as_str() && a["package"]["name"] == "gitdep";
    let seen = sandbox.wait_for(package_code, Duration::from_secs(20));
    let run = watch.stop();
    assert!(seen.is_some(), "no alert for package code's ssh\n{}", run.describe());

    let expected_hash = sandbox.setup("git hash-object", sandbox.command("git").arg("hash-object").arg(&key));
    assert_eq!(written(&sandbox, "hash"), expected_hash.trim(), "git did not read the key\n{}", run.describe());
    let by = |a: &Value, exe: &str| {
        a["file"]["path"] == key.as_str() && a["process"]["executable"].as_str().is_some_and(|e| e.ends_with(exe))
    };
    let alerts = run.alerts();
    let (package, spared): (Vec<&Value>, Vec<&Value>) =
        alerts.iter().filter(|a| by(a, "/ssh")).partition(|a| a["package"]["name"] == "gitdep");
    assert!(!spared.is_empty(), "no alert for the read by git's ssh\n{}", run.describe());
    for alert in spared {
        assert_ne!(alert["event"]["outcome"], "denied", "git's ssh was refused: {alert:#}");
        assert_eq!(alert["package"]["manager"], "npm", "{alert:#}");
    }
    let refused = package.first().unwrap_or_else(|| panic!("no alert for package code's ssh\n{}", run.describe()));
    assert_eq!(refused["event"]["outcome"], "denied", "{refused:#}");
    // git's own read is the hash above; an alert for it, if any, is not a refusal either (it
    // is usually a repeat of the ssh's, counted and not printed).
    assert!(!alerts.iter().any(|a| by(a, "/git") && a["event"]["outcome"] == "denied"), "{}", run.describe());
}
