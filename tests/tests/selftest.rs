//! Issue 26 point 4: `credwatch selftest`, with the real binary, the real npm and the real kernel.
//! Each attack (Nx "s1ngularity", Shai-Hulud 2.0) runs as package code of a real `npm install` in
//! a throwaway home inside the sandbox: it passes under `watch` (its alerts marked as a self-test
//! in watch's outputs and local log), fails in bounded time when the agent is stopped, fails with
//! `--agent` when none runs, passes with its own sensor when none runs, and its expected list is
//! exactly what the rules raise. Run as root with `cargo xtask test`.

use std::{
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use credwatch_e2e::{credwatch_binary, detached, slow, Sandbox};
use serde_json::Value;

/// Two installs of one local package each take about 2 s; the agent gets 10 s to answer and 20 s
/// to report.
const SELFTEST_TIMEOUT: Duration = Duration::from_secs(180);

/// The exit statuses `credwatch selftest --help` documents.
const EXIT_MISSING: i32 = 3;
const EXIT_NO_ANSWER: i32 = 4;

struct Selftest {
    status: Option<ExitStatus>,
    /// The exit code a detached run wrote.
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Selftest {
    fn code(&self) -> Option<i32> {
        self.code.or_else(|| self.status.and_then(|status| status.code()))
    }

    fn describe(&self) -> String {
        format!("status: {:?}\n--- stdout\n{}\n--- stderr\n{}", self.status, self.stdout, self.stderr)
    }

    fn report(&self) -> Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("the --json report is no JSON ({e})\n{}", self.describe()))
    }
}

/// The socket a sandbox's `watch` serves (see `Sandbox::command`).
fn socket(sandbox: &Sandbox) -> PathBuf {
    sandbox.top().join("alerts.sock")
}

/// `credwatch selftest ARGS` in the sandbox's environment (its HOME, TMPDIR: the throwaway labs
/// are made inside the sandbox), killed past [`SELFTEST_TIMEOUT`].
fn selftest(sandbox: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Selftest {
    let (out, err) = (sandbox.top().join("selftest.stdout"), sandbox.top().join("selftest.stderr"));
    let mut command = sandbox.credwatch("selftest");
    command.args(args).envs(env.iter().copied());
    // The self-test's own `credwatch run` takes the sensor the sandbox's commands use.
    if let Some(sensor) = sandbox.sensor() {
        command.env("CREDWATCH_SENSOR", sensor);
    }
    command
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out).unwrap())
        .stderr(fs::File::create(&err).unwrap())
        .process_group(0);
    let mut child = command.spawn().expect("starting credwatch selftest");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > slow(SELFTEST_TIMEOUT) {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", child.id())]).status();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(50));
    };
    Selftest { status, code: None, stdout: fs::read_to_string(out).unwrap(), stderr: fs::read_to_string(err).unwrap() }
}

/// `credwatch selftest ARGS` started before `watch` (see [`detached`]): outside the tree of the
/// `cargo` running the tests, so that its npm is a tree of its own, as from a shell. It waits for
/// `go`, then the returned closure waits for its end.
fn detached_selftest(sandbox: &Sandbox, args: &[&str]) -> (impl Fn(), impl Fn() -> Selftest) {
    let dir = sandbox.work();
    let quoted: Vec<String> = args.iter().map(|arg| format!("'{arg}'")).collect();
    let script = format!(
        "'{}' selftest {} >selftest.stdout 2>selftest.stderr; echo $? >selftest.status",
        credwatch_binary().display(),
        quoted.join(" ")
    );
    let go = detached(sandbox, &dir, "selftest", &[], &script);
    let done = move || {
        let start = Instant::now();
        let code = loop {
            if let Ok(text) = fs::read_to_string(dir.join("selftest.status")) {
                if text.ends_with('\n') {
                    break text.trim().parse::<i32>().ok();
                }
            }
            assert!(start.elapsed() < slow(SELFTEST_TIMEOUT), "credwatch selftest did not end");
            thread::sleep(Duration::from_millis(50));
        };
        Selftest {
            status: None,
            code,
            stdout: fs::read_to_string(dir.join("selftest.stdout")).unwrap_or_default(),
            stderr: fs::read_to_string(dir.join("selftest.stderr")).unwrap_or_default(),
        }
    };
    (go, done)
}

/// Each attack's report: every expected alert found (and marked as a self-test), and no alert of
/// a rule it does not expect: the expected lists are what the rules really raise.
fn assert_every_expected_alert_and_nothing_else(report: &Value, sensor: &str, run: &Selftest) {
    assert_eq!(report["passed"], true, "{}", run.describe());
    assert_eq!(report["sensor"], sensor, "{}", run.describe());
    let attacks = report["attacks"].as_array().unwrap();
    let names: Vec<&str> = attacks.iter().map(|a| a["attack"].as_str().unwrap()).collect();
    assert_eq!(names, ["nx", "shai-hulud-2"], "{}", run.describe());
    for attack in attacks {
        let checks = attack["checks"].as_array().unwrap();
        assert!(checks.len() >= 12, "{attack:#}");
        for check in checks {
            let found = &check["found"];
            assert!(found.is_object(), "{} missing: {check:#}\n{}", attack["attack"], run.describe());
            assert_eq!(found["selftest"], true, "not marked as a self-test: {check:#}");
        }
        assert_eq!(
            attack["unexpected"],
            Value::Array(Vec::new()),
            "{} raised more than it expects: {attack:#}",
            attack["attack"]
        );
        // The network steps reached the stub (the exfiltration repository and its files).
        let stub = attack["stub"].as_array().unwrap();
        assert!(stub.iter().any(|r| r["method"] == "POST" && r["path"] == "/user/repos"), "{attack:#}");
        assert!(stub.iter().any(|r| r["method"] == "PUT" && r["bytes"].as_u64().unwrap() > 0), "{attack:#}");
        assert!(attack.get("npm_failed").is_none(), "{attack:#}");
    }
    // Shai-Hulud 2.0's downloads and its worm's publish went to the stub too.
    let stub = &attacks[1]["stub"];
    for wanted in ["/bun-v1.3.2/bun-linux-x64", "/credwatch-selftest-shai-hulud-2"] {
        assert!(stub.as_array().unwrap().iter().any(|r| r["path"] == wanted), "{wanted}: {stub:#}");
    }
}

fn root_pids(report: &Value) -> Vec<u64> {
    report["attacks"].as_array().unwrap().iter().map(|a| a["root_pid"].as_u64().unwrap()).collect()
}

/// The alerts of the trees rooted at `roots`.
fn of_trees(alerts: &[Value], roots: &[u64]) -> Vec<Value> {
    alerts
        .iter()
        .filter(|a| a["credwatch"]["root_pid"].as_u64().is_some_and(|root| roots.contains(&root)))
        .cloned()
        .collect()
}

/// Every file the alerts name is in the sandbox: the throwaway homes were there, never the real
/// HOME.
fn assert_inside(alerts: &[Value], top: &Path) {
    let top = fs::canonicalize(top).unwrap();
    for alert in alerts {
        if let Some(path) = alert["file"]["path"].as_str() {
            assert!(Path::new(path).starts_with(&top), "outside the sandbox: {alert:#}");
        }
    }
}

#[test]
fn selftest_passes_under_watch_and_its_alerts_are_marked_in_the_outputs_and_the_log() {
    let sandbox = Sandbox::new();
    let sock = socket(&sandbox);
    let (go, done) = detached_selftest(&sandbox, &["--json", "--alerts-socket", sock.to_str().unwrap()]);
    let watch = sandbox.watch();
    go();
    let run = done();
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    let report = run.report();
    assert_every_expected_alert_and_nothing_else(&report, "agent", &run);
    let roots = root_pids(&report);

    // watch's alert file (its `--output`) has each alert the self-test found, and every alert of
    // the self-test's trees there is marked; every file they name is in the sandbox.
    let alerts = of_trees(&sandbox.alerts_now(), &roots);
    for attack in report["attacks"].as_array().unwrap() {
        for check in attack["checks"].as_array().unwrap() {
            let id = &check["found"]["event_id"];
            assert!(alerts.iter().any(|a| &a["event"]["id"] == id), "not in watch's output: {check:#}");
        }
    }
    for alert in &alerts {
        assert_eq!(alert["credwatch"]["selftest"], true, "{alert:#}");
    }
    assert_inside(&alerts, sandbox.top());
    // And the local log the self-test read them through.
    let logged: Vec<Value> = fs::read_to_string(sandbox.alert_log())
        .unwrap()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .map(|line| line["alert"].clone())
        .collect();
    let logged = of_trees(&logged, &roots);
    assert_eq!(logged.len(), alerts.len());
    assert!(logged.iter().all(|a| a["credwatch"]["selftest"] == true));
    watch.stop().assert_exit(0);
}

#[test]
fn selftest_fails_in_bounded_time_when_the_agent_is_stopped() {
    let sandbox = Sandbox::new();
    let watch = sandbox.watch();
    let pid = watch.pid().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let sock = socket(&sandbox);
    let run = selftest(&sandbox, &["--attack", "nx", "--alerts-socket", sock.to_str().unwrap()], &[]);
    // Let it go before asserting: a stopped agent ignores the SIGTERM that stops it.
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    assert_eq!(run.code(), Some(EXIT_NO_ANSWER), "{}", run.describe());
    let said = format!("the agent at {} did not report the self-test within 10 s: is it stopped?", sock.display());
    assert!(run.stderr.contains(&said), "{}", run.describe());
    assert!(!run.stdout.contains("passed"), "{}", run.describe());
    watch.stop().assert_exit(0);
}

#[test]
fn selftest_with_agent_fails_when_no_agent_runs() {
    let sandbox = Sandbox::new();
    let sock = sandbox.top().join("no-agent.sock");
    let run = selftest(&sandbox, &["--agent", "--alerts-socket", sock.to_str().unwrap()], &[]);
    assert_eq!(run.code(), Some(EXIT_NO_ANSWER), "{}", run.describe());
    assert!(
        run.stderr.contains(&format!("no agent answers at {} (--agent needs the running agent)", sock.display())),
        "{}",
        run.describe()
    );
    // Nothing ran: no lab was made.
    assert!(!fs::read_dir(sandbox.top())
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("credwatch-selftest-")));
}

#[test]
fn selftest_without_an_agent_passes_with_its_own_sensor() {
    let sandbox = Sandbox::new();
    let sock = sandbox.top().join("no-agent.sock");
    let run = selftest(&sandbox, &["--json", "--alerts-socket", sock.to_str().unwrap()], &[]);
    assert_eq!(run.code(), Some(0), "{}", run.describe());
    assert_every_expected_alert_and_nothing_else(&run.report(), "own", &run);
    // The labs are gone.
    assert!(!fs::read_dir(sandbox.top())
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("credwatch-selftest-")));
}

/// With rules under which Nx's rc-file writes raise nothing (`shell-rc-write` overridden to
/// watch ~/.bash_logout only), the self-test says which alerts are missing and exits 3.
#[test]
fn selftest_names_each_missing_alert_and_fails() {
    let sandbox = Sandbox::new();
    let rules = sandbox.work().join("rules");
    fs::create_dir_all(&rules).unwrap();
    fs::write(
        rules.join("narrow.yaml"),
        r#"schema: 2
rules:
  - id: shell-rc-write
    name: Shell logout file written
    description: The e2e test's narrowed rule, which Nx's writes to ~/.bashrc and ~/.zshrc do not meet.
    category: persistence
    severity: high
    kind: target
    access: write
    targets: ["~/.bash_logout"]
    rotate: ["Remove what was added"]
    samples:
      positive:
        - exec: {pid: 100, args: [npm, install], cwd: /home/alice/app}
        - exec: {pid: 101, ppid: 100, args: [node, x.js], env: {npm_package_name: x, npm_lifecycle_event: postinstall}}
        - open: {pid: 101, path: /home/alice/.bash_logout, flags: "O_WRONLY|O_APPEND"}
      negative:
        - exec: {pid: 100, args: [npm, install], cwd: /home/alice/app}
        - exec: {pid: 101, ppid: 100, args: [node, x.js], env: {npm_package_name: x, npm_lifecycle_event: postinstall}}
        - open: {pid: 101, path: /home/alice/.zshrc, flags: "O_WRONLY|O_APPEND"}
"#,
    )
    .unwrap();
    let sock = sandbox.top().join("no-agent.sock");
    let run = selftest(
        &sandbox,
        &["--attack", "nx", "--alerts-socket", sock.to_str().unwrap()],
        &[("CREDWATCH_RULES", rules.to_str().unwrap())],
    );
    assert_eq!(run.code(), Some(EXIT_MISSING), "{}", run.describe());
    let missing: Vec<&str> = run.stdout.lines().filter(|line| line.trim_start().starts_with("MISSING")).collect();
    assert_eq!(missing.len(), 2, "{}", run.describe());
    assert!(missing.iter().all(|line| line.contains("shell-rc-write")), "{}", run.describe());
    assert!(missing[0].ends_with("~/.bashrc") && missing[1].ends_with("~/.zshrc"), "{}", run.describe());
    assert!(
        run.stdout.contains("nx: 11 of 13 expected alerts") && run.stdout.contains("FAILED: 2 expected alerts missing"),
        "{}",
        run.describe()
    );
}
