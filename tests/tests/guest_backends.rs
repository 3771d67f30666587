//! Issue 13, run in the kernel matrix's guests where the fentry backend loads (`--features
//! guest`): the end-to-end subset with real npm and cargo, and the other scenarios, each run
//! once with `--sensor tracepoint`, the reference, and once with `--sensor fentry`, each in a
//! sandbox of its own. Each run must report what the scenario did (its fields checked on both
//! backends), and the alerts must be the same once the fields that differ from run to run (ids,
//! pids, times, the sandbox's directory) are dropped.

use credwatch_e2e::{
    assert_field,
    scenarios::{self, comparable, refusal, Stolen, SECRET},
    Run, Sandbox, EXIT_ALERT,
};
use serde_json::Value;

/// One scenario's run under each backend.
struct Both<T> {
    tracepoint: (Sandbox, T),
    fentry: (Sandbox, T),
}

fn both<T>(scenario: impl Fn(&Sandbox) -> T) -> Both<T> {
    let run = |sensor: &str| {
        let sandbox = Sandbox::with_sensor(Some(sensor.to_owned()));
        let result = scenario(&sandbox);
        (sandbox, result)
    };
    Both { tracepoint: run("tracepoint"), fentry: run("fentry") }
}

/// The two runs alerted the same, apart from the fields each run has its own of and the
/// `extra` keys; both exited with `EXIT_ALERT`. The reference must hold an alert that
/// `expected` accepts, so that two empty runs do not pass.
#[track_caller]
fn assert_same(
    (tracepoint, reference): (&Sandbox, &Run),
    (fentry, candidate): (&Sandbox, &Run),
    extra: &[&str],
    expected: impl Fn(&Value) -> bool,
) {
    let both = || format!("--- tracepoint ---\n{}\n--- fentry ---\n{}", reference.describe(), candidate.describe());
    assert!(reference.alerts().iter().any(&expected), "the reference run lacks the scenario's alert\n{}", both());
    reference.assert_exit(EXIT_ALERT);
    candidate.assert_exit(EXIT_ALERT);
    let (want, got) = (comparable(reference, tracepoint, extra), comparable(candidate, fentry, extra));
    if want != got {
        let only =
            |a: &[String], b: &[String]| a.iter().filter(|x| !b.contains(x)).cloned().collect::<Vec<_>>().join("\n");
        panic!(
            "the backends alerted differently\n--- only from tracepoint ---\n{}\n--- only from fentry ---\n{}\n{}",
            only(&want, &got),
            only(&got, &want),
            both()
        );
    }
}

#[track_caller]
fn compare(scenario: impl Fn(&Sandbox) -> Run, expected: impl Fn(&Value) -> bool) {
    let runs = both(scenario);
    let ((t, tr), (f, fr)) = (&runs.tracepoint, &runs.fentry);
    assert_same((t, tr), (f, fr), &[], expected);
}

fn rule_and_path(rule: &'static str, path: String) -> impl Fn(&Value) -> bool {
    move |a| a["rule"]["id"] == rule && a["file"]["path"] == path.as_str()
}

#[test]
fn npm_postinstall_reading_npmrc_alerts_the_same_on_both_backends() {
    let runs = both(|sandbox| scenarios::npm_postinstall_reads_npmrc(sandbox, &[]));
    for (sandbox, run) in [&runs.tracepoint, &runs.fentry] {
        let alert = run.expect_alert(&sandbox.credential(".npmrc"));
        assert_field(&alert, "/rule/category", "registry", run);
        assert_field(&alert, "/event/action", "open", run);
        assert_field(&alert, "/event/outcome", "alerted", run);
        assert_field(&alert, "/package/manager", "npm", run);
        assert_field(&alert, "/package/name", "evil-postinstall", run);
        assert_field(&alert, "/package/version", "1.2.3", run);
        assert_field(&alert, "/package/lifecycle", "postinstall", run);
        assert!(alert["process"]["executable"].as_str().is_some_and(|e| e.ends_with("/node")), "{alert:#}");
    }
    let ((t, tr), (f, fr)) = (&runs.tracepoint, &runs.fentry);
    assert_same((t, tr), (f, fr), &[], |a| a["package"]["name"] == "evil-postinstall");
}

/// The preinstall daemonises (fork, setsid) and reads the key after npm has exited.
#[test]
fn a_daemonised_late_read_alerts_the_same_on_both_backends() {
    let runs = both(|sandbox| scenarios::npm_daemon_reads_key_after_npm_exits(sandbox, &[]));
    for (sandbox, (run, payload)) in [&runs.tracepoint, &runs.fentry] {
        assert_eq!(payload["npm_gone_before_read"], true, "the payload read before npm exited: {payload}");
        assert_eq!(payload["new_session"], true, "the payload did not leave npm's session: {payload}");
        let alert = run.expect_alert(&sandbox.credential(".ssh/id_ed25519"));
        assert_eq!(alert["process"]["pid"], payload["pid"], "the alert names another process: {alert:#}");
        assert_field(&alert, "/rule/id", "ssh-private-keys", run);
        assert_field(&alert, "/package/manager", "npm", run);
        assert_field(&alert, "/package/name", "evil-preinstall", run);
        assert_field(&alert, "/package/lifecycle", "preinstall", run);
    }
    let ((t, (tr, _)), (f, (fr, _))) = (&runs.tracepoint, &runs.fentry);
    assert_same((t, tr), (f, fr), &[], |a| a["package"]["name"] == "evil-preinstall");
}

#[test]
fn a_cargo_build_script_reading_credentials_alerts_the_same_on_both_backends() {
    let runs = both(|sandbox| scenarios::cargo_build_script_reads_credentials(sandbox, &[]));
    for (sandbox, run) in [&runs.tracepoint, &runs.fentry] {
        let alert = run.expect_alert(&sandbox.credential(".cargo/credentials.toml"));
        assert_field(&alert, "/rule/category", "registry", run);
        assert_field(&alert, "/package/manager", "cargo", run);
        assert_field(&alert, "/package/name", "evil-build", run);
        assert_field(&alert, "/package/version", "0.3.1", run);
        assert_field(&alert, "/package/lifecycle", "build-script", run);
        let executable = alert["process"]["executable"].as_str();
        assert!(executable.is_some_and(|e| e.ends_with("/build-script-build")), "{alert:#}");
    }
    let ((t, tr), (f, fr)) = (&runs.tracepoint, &runs.fentry);
    assert_same((t, tr), (f, fr), &[], |a| a["package"]["lifecycle"] == "build-script");
}

#[test]
fn a_key_linked_and_renamed_alerts_the_same_on_both_backends() {
    let runs = both(|sandbox| scenarios::key_linked_and_renamed(sandbox, &[]));
    let key = runs.tracepoint.0.credential(".ssh/id_ed25519");
    let ((t, tr), (f, fr)) = (&runs.tracepoint, &runs.fentry);
    assert_same((t, tr), (f, fr), &[], move |a| a["event"]["action"] == "link" && a["file"]["path"] == key.as_str());
}

#[test]
fn a_connect_after_a_dns_lookup_alerts_the_same_on_both_backends() {
    let runs = both(|sandbox| scenarios::npm_postinstall_exfiltrates(sandbox, &[]));
    let ((t, (tr, _)), (f, (fr, _))) = (&runs.tracepoint, &runs.fentry);
    assert_same((t, tr), (f, fr), &[], |a| {
        a["rule"]["id"] == "exfiltration"
            && a["event"]["action"] == "connect"
            && a["destination"]["domain"] == scenarios::COLLECTOR.0
    });
}

#[test]
fn tamper_syscalls_alert_the_same_on_both_backends() {
    compare(
        |sandbox| scenarios::tamper_syscalls(sandbox, &[]),
        |a| a["rule"]["id"] == "bpf-by-package" && a["credwatch"]["syscall"]["name"] == "bpf",
    );
}

/// `--enforce` on both, the postinstall's `cat` of the key: the tracepoint backend kills cat at
/// the open (`blocked`, 137), the fentry backend refuses the open where the BPF LSM is active
/// (`denied`, cat lives and exits 1 on EPERM); the rest of the alerts is the same, and neither
/// payload got the key, which the same payload gets without `--enforce`.
#[test]
fn enforce_refuses_the_key_on_both_backends_and_alerts_the_same_otherwise() {
    let runs = both(|sandbox| scenarios::npm_postinstall_copies_key(sandbox, &["--enforce"]));
    let key = runs.tracepoint.0.credential(".ssh/id_ed25519");
    for (sensor, (sandbox, stolen)) in [("tracepoint", &runs.tracepoint), ("fentry", &runs.fentry)] {
        let Stolen { run, copy, status } = stolen;
        assert!(!copy.contains(SECRET), "{sensor}: the key reached the payload under --enforce\n{}", run.describe());
        let alert = run.expect_alert(&sandbox.credential(".ssh/id_ed25519"));
        let outcome = refusal(sensor);
        assert_field(&alert, "/event/outcome", outcome, run);
        assert_field(&alert, "/rule/id", "ssh-private-keys", run);
        assert_field(&alert, "/package/name", "key-thief", run);
        assert_field(&alert, "/package/lifecycle", "postinstall", run);
        let expected_status = if outcome == "denied" { "1" } else { "137" };
        assert_eq!(status, expected_status, "{sensor}: cat's exit status ({outcome})\n{}", run.describe());
    }
    let ((t, tstolen), (f, fstolen)) = (&runs.tracepoint, &runs.fentry);
    assert_same(
        (t, &tstolen.run),
        (f, &fstolen.run),
        &["outcome", "enforcement"],
        rule_and_path("ssh-private-keys", key),
    );
    // The same payload without --enforce gets the key: the assertions above can fail.
    let free = scenarios::npm_postinstall_copies_key(&Sandbox::with_sensor(Some("fentry".into())), &[]);
    assert!(free.copy.contains(SECRET), "without --enforce the payload should get the key\n{}", free.run.describe());
}
