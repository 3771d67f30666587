//! Issue 13: the end-to-end subset the kernel matrix runs in its guests (`--features guest`),
//! with real npm and cargo, on the backend `CREDWATCH_E2E_SENSOR` names (the matrix runs it
//! once per backend that loads on the guest's kernel).

use credwatch_e2e::{
    assert_field,
    scenarios::{self, refusal, Stolen, SECRET},
    sensor_from_env, Sandbox, EXIT_ALERT,
};

/// The backend under test: the matrix always says which.
fn sensor() -> String {
    sensor_from_env().expect("guest_e2e needs CREDWATCH_E2E_SENSOR=tracepoint|fentry (the kernel matrix sets it)")
}

fn new_sandbox() -> Sandbox {
    Sandbox::with_sensor(Some(sensor()))
}

#[test]
fn npm_postinstall_reading_npmrc_is_reported() {
    let sandbox = new_sandbox();
    let run = scenarios::npm_postinstall_reads_npmrc(&sandbox, &[]);

    run.assert_exit(EXIT_ALERT);
    let alert = run.expect_alert(&sandbox.credential(".npmrc"));
    assert_field(&alert, "/rule/category", "registry", &run);
    assert_field(&alert, "/event/action", "open", &run);
    assert_field(&alert, "/event/outcome", "alerted", &run);
    assert_field(&alert, "/package/manager", "npm", &run);
    assert_field(&alert, "/package/name", "evil-postinstall", &run);
    assert_field(&alert, "/package/version", "1.2.3", &run);
    assert_field(&alert, "/package/lifecycle", "postinstall", &run);
    assert!(alert["process"]["executable"].as_str().is_some_and(|e| e.ends_with("/node")), "{alert:#}");
}

#[test]
fn a_daemonised_preinstall_reading_the_key_after_npm_exits_is_reported() {
    let sandbox = new_sandbox();
    let (run, payload) = scenarios::npm_daemon_reads_key_after_npm_exits(&sandbox, &[]);

    assert_eq!(payload["npm_gone_before_read"], true, "the payload read before npm exited: {payload}");
    assert_eq!(payload["new_session"], true, "the payload did not leave npm's session: {payload}");
    run.assert_exit(EXIT_ALERT);
    let alert = run.expect_alert(&sandbox.credential(".ssh/id_ed25519"));
    assert_eq!(alert["process"]["pid"], payload["pid"], "the alert names another process: {alert:#}");
    assert_field(&alert, "/rule/id", "ssh-private-keys", &run);
    assert_field(&alert, "/package/manager", "npm", &run);
    assert_field(&alert, "/package/name", "evil-preinstall", &run);
    assert_field(&alert, "/package/lifecycle", "preinstall", &run);
}

#[test]
fn cargo_build_script_reading_cargo_credentials_is_reported() {
    let sandbox = new_sandbox();
    let run = scenarios::cargo_build_script_reads_credentials(&sandbox, &[]);

    run.assert_exit(EXIT_ALERT);
    let alert = run.expect_alert(&sandbox.credential(".cargo/credentials.toml"));
    assert_field(&alert, "/rule/category", "registry", &run);
    assert_field(&alert, "/package/manager", "cargo", &run);
    assert_field(&alert, "/package/name", "evil-build", &run);
    assert_field(&alert, "/package/version", "0.3.1", &run);
    assert_field(&alert, "/package/lifecycle", "build-script", &run);
    assert!(alert["process"]["executable"].as_str().is_some_and(|e| e.ends_with("/build-script-build")), "{alert:#}");
}

/// `--enforce`: the postinstall's `cat` of the key gets nothing. With the BPF LSM the open
/// fails (EPERM, cat exits 1, the alert says `denied`); without it cat is killed at the open
/// (137, `blocked`).
#[test]
fn enforce_keeps_the_key_from_an_npm_postinstall() {
    let sandbox = new_sandbox();
    let Stolen { run, copy, status } = scenarios::npm_postinstall_copies_key(&sandbox, &["--enforce"]);

    run.assert_exit(EXIT_ALERT);
    assert!(!copy.contains(SECRET), "the key reached the payload under --enforce\n{}", run.describe());
    let alert = run.expect_alert(&sandbox.credential(".ssh/id_ed25519"));
    let outcome = refusal(&sensor());
    assert_field(&alert, "/event/outcome", outcome, &run);
    assert_field(&alert, "/rule/id", "ssh-private-keys", &run);
    assert_field(&alert, "/package/name", "key-thief", &run);
    assert_field(&alert, "/package/lifecycle", "postinstall", &run);
    let expected = if outcome == "denied" { "1" } else { "137" };
    assert_eq!(status, expected, "cat's exit status ({outcome})\n{}", run.describe());
    // Without --enforce the same payload gets the key: the test above can fail.
    let free = scenarios::npm_postinstall_copies_key(&new_sandbox(), &[]);
    assert!(free.copy.contains(SECRET), "without --enforce the payload should get the key\n{}", free.run.describe());
}
