//! Privileged end-to-end tests: real kernel programs, real npm, cargo and pip on local fixtures,
//! a throwaway HOME of fake credentials, offline. Run as root with `cargo xtask test`.

use std::{fs, time::Duration};

use credwatch_e2e::{assert_field, scenarios, Run, Sandbox, EXIT_ALERT};
use serde_json::Value;

fn report(sandbox: &Sandbox, name: &str, run: &Run) -> Value {
    let path = sandbox.work().join(name);
    let text = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("the fixture wrote no report {} ({e})\n{}", path.display(), run.describe()));
    serde_json::from_str(&text).unwrap()
}

/// The alert's ancestry runs from the tree's root down; the root here is CMD itself.
#[track_caller]
fn assert_ancestry_starts_at(alert: &Value, program: &str, run: &Run) {
    let ancestors = alert["process"]["ancestors"].as_array().cloned().unwrap_or_default();
    let root = ancestors.first().unwrap_or_else(|| panic!("no process.ancestors in {alert:#}\n{}", run.describe()));
    let named = |v: &Value| v.as_str().is_some_and(|s| s.contains(program));
    assert!(
        named(&root["executable"]) || root["args"].as_array().is_some_and(|args| args.iter().any(named)),
        "the first ancestor should be {program}: {alert:#}"
    );
}

#[test]
fn npm_postinstall_reading_npmrc_is_reported_within_a_second() {
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack("npm/evil-postinstall");
    let project = sandbox.npm_project();
    let alerts = sandbox.alerts_file();
    let report_path = sandbox.work().join("postinstall-report.json");
    let run = sandbox.run_with_env(
        &project,
        &["npm", "install", tarball.to_str().unwrap()],
        &[("CREDWATCH_E2E_ALERTS", alerts.to_str().unwrap()), ("CREDWATCH_E2E_REPORT", report_path.to_str().unwrap())],
    );

    run.assert_exit(EXIT_ALERT);
    let alert = run.expect_alert(&sandbox.credential(".npmrc"));
    assert_field(&alert, "/event/kind", "alert", &run);
    assert_field(&alert, "/rule/category", "registry", &run);
    assert_field(&alert, "/package/manager", "npm", &run);
    assert_field(&alert, "/package/name", "evil-postinstall", &run);
    assert_field(&alert, "/package/version", "1.2.3", &run);
    assert_field(&alert, "/package/lifecycle", "postinstall", &run);
    assert!(alert["rule"]["id"].as_str().is_some_and(|id| !id.is_empty()), "rule.id: {alert:#}");
    assert_ancestry_starts_at(&alert, "npm", &run);

    // The payload read the file and then watched the alerts file grow while it was still running:
    // the alert is live, not written at the end. The latency is printed, not asserted (timings
    // on shared CI cores are noise; `cargo xtask bench` measures).
    let latency = report(&sandbox, "postinstall-report.json", &run);
    let read_at = latency["readAt"].as_u64().unwrap();
    let seen_at =
        latency["seenAt"].as_u64().unwrap_or_else(|| panic!("no alert within 5 s of the read\n{}", run.describe()));
    let millis = seen_at - read_at;
    println!("latency from the read of ~/.npmrc to the alert in the alerts file: {millis} ms");
}

#[test]
fn daemonised_preinstall_reading_ssh_key_after_npm_exits_is_reported() {
    let sandbox = Sandbox::new();
    let (run, payload) = scenarios::npm_daemon_reads_key_after_npm_exits(&sandbox, &[]);
    assert_eq!(payload["npm_gone_before_read"], true, "the payload read before npm exited: {payload}");
    assert_eq!(payload["new_session"], true, "the payload did not leave npm's session: {payload}");
    run.assert_exit(EXIT_ALERT);
    let alert = run.expect_alert(&sandbox.credential(".ssh/id_ed25519"));
    assert_eq!(alert["process"]["pid"], payload["pid"], "the alert names another process: {alert:#}");
    assert_field(&alert, "/rule/category", "ssh", &run);
    assert_field(&alert, "/package/manager", "npm", &run);
    assert_field(&alert, "/package/name", "evil-preinstall", &run);
    assert_field(&alert, "/package/lifecycle", "preinstall", &run);
}

#[test]
fn benign_postinstall_and_npm_reading_its_own_npmrc_raise_nothing() {
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack("npm/benign");
    let project = sandbox.npm_project();
    let run = sandbox.run(&project, &["npm", "install", tarball.to_str().unwrap()]);

    run.assert_exit(0);
    assert!(run.alerts().is_empty(), "expected no alert\n{}", run.describe());
    // Not vacuous: the postinstall ran (its output is there), and npm read the fake ~/.npmrc
    // (its `package-lock=false` took effect).
    let built = fs::read_to_string(project.join("node_modules/benign-build/built.txt"));
    assert_eq!(built.ok().as_deref(), Some("built by benign-build 2.0.0\n"), "{}", run.describe());
    assert!(!project.join("package-lock.json").exists(), "npm did not read the fake ~/.npmrc");
}

#[test]
fn cargo_build_script_reading_cargo_credentials_is_reported() {
    let sandbox = Sandbox::new();
    let krate = sandbox.copy_fixture("cargo/build-script");
    let run = sandbox.run(&krate, &["cargo", "build", "--offline"]);

    run.assert_exit(EXIT_ALERT);
    let alert = run.expect_alert(&sandbox.credential(".cargo/credentials.toml"));
    assert_field(&alert, "/rule/category", "registry", &run);
    assert_field(&alert, "/package/manager", "cargo", &run);
    assert_field(&alert, "/package/name", "evil-build", &run);
    assert_field(&alert, "/package/version", "0.3.1", &run);
    assert_field(&alert, "/package/lifecycle", "build-script", &run);
    assert_ancestry_starts_at(&alert, "cargo", &run);
}

#[test]
fn proc_macro_reading_aws_credentials_inside_rustc_is_reported() {
    let sandbox = Sandbox::new();
    sandbox.copy_fixture("cargo/proc-macro");
    let app = sandbox.work().join("proc-macro/app");
    let run = sandbox.run(&app, &["cargo", "build", "--offline"]);

    run.assert_exit(EXIT_ALERT);
    let alert = run.expect_alert(&sandbox.credential(".aws/credentials"));
    assert_field(&alert, "/rule/category", "cloud", &run);
    assert_field(&alert, "/package/manager", "cargo", &run);
    assert!(
        alert["process"]["executable"].as_str().is_some_and(|e| e.ends_with("/rustc")),
        "the read happens inside rustc: {alert:#}"
    );
    assert_field(&alert, "/package/lifecycle", "proc-macro", &run);
    // Named as published (not the crate identifier `evil_macro`): the tree built the macro,
    // and cargo named its package to the rustc that built it.
    assert_field(&alert, "/package/name", "evil-macro", &run);
    assert_field(&alert, "/package/version", "0.2.0", &run);
}

#[test]
fn pip_sdist_setup_py_reading_pypirc_is_reported() {
    let sandbox = Sandbox::new();
    let source = sandbox.copy_fixture("pip/evil-sdist");
    let sdist_dir = sandbox.work().join("evil_sdist-4.5.6");
    fs::rename(&source, &sdist_dir).unwrap();
    sandbox.setup(
        "tar (building the sdist)",
        sandbox.command("tar").args(["czf", "evil_sdist-4.5.6.tar.gz", "evil_sdist-4.5.6"]),
    );
    let target = sandbox.work().join("site");
    let run = sandbox.run(
        &sandbox.work(),
        &[
            "python3",
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-build-isolation",
            "--no-deps",
            "--target",
            target.to_str().unwrap(),
            "evil_sdist-4.5.6.tar.gz",
        ],
    );

    run.assert_exit(EXIT_ALERT);
    assert!(target.join("evil_sdist.py").exists(), "pip did not install the sdist\n{}", run.describe());
    let alert = run.expect_alert(&sandbox.credential(".pypirc"));
    assert_field(&alert, "/rule/category", "registry", &run);
    assert_field(&alert, "/package/manager", "pip", &run);
    // Named by the sdist's own metadata (PKG-INFO), as published; the read happened in setup.py.
    assert_field(&alert, "/package/name", "evil-sdist", &run);
    assert_field(&alert, "/package/version", "4.5.6", &run);
    assert_field(&alert, "/package/lifecycle", "setup.py", &run);
}

#[test]
fn relative_and_dirfd_opens_are_reported_with_absolute_paths() {
    let sandbox = Sandbox::new();
    let script = credwatch_e2e::fixtures().join("paths/relative_opens.py");
    let run = sandbox.run(&sandbox.work(), &["python3", script.to_str().unwrap()]);

    run.assert_exit(EXIT_ALERT);
    let rsa = run.expect_alert(&sandbox.credential(".ssh/id_rsa"));
    assert_field(&rsa, "/file/given_path", "id_rsa", &run);
    assert_field(&rsa, "/rule/category", "ssh", &run);
    let aws = run.expect_alert(&sandbox.credential(".aws/credentials"));
    assert_field(&aws, "/file/given_path", "credentials", &run);
    assert_field(&aws, "/rule/category", "cloud", &run);
}

/// A process outside the watched tree reads the same files while credwatch is live: nothing.
/// The tree reads ~/.aws/credentials before and ~/.cargo/credentials.toml after it, and both
/// must alert, so the watcher provably ran across the unrelated reads.
#[test]
fn an_unrelated_process_reading_credentials_raises_nothing() {
    let sandbox = Sandbox::new();
    let go = sandbox.work().join("go");
    let before = sandbox.credential(".aws/credentials");
    let after = sandbox.credential(".cargo/credentials.toml");
    let tree = sandbox.spawn_run(
        &sandbox.work(),
        &[
            "sh",
            "-c",
            r#"cat "$1" >/dev/null; i=0; while [ ! -e "$2" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; cat "$3" >/dev/null"#,
            "sh",
            &before,
            go.to_str().unwrap(),
            &after,
        ],
    );
    let live = sandbox.wait_for_alert(&before, Duration::from_secs(60));
    if live.is_none() {
        fs::write(&go, "").unwrap();
        panic!("the watched tree's first read raised no alert\n{}", sandbox.wait(tree).describe());
    }

    let unrelated_only = [".ssh/id_ed25519", ".npmrc", ".pypirc"].map(|f| sandbox.credential(f));
    let mut unrelated = sandbox.command("cat");
    unrelated.args(&unrelated_only).arg(&before).arg(&after).stdout(std::process::Stdio::null());
    let mut unrelated = unrelated.spawn().unwrap();
    let unrelated_pid = unrelated.id();
    assert!(unrelated.wait().unwrap().success());
    fs::write(&go, "").unwrap();

    let run = sandbox.wait(tree);
    run.assert_exit(EXIT_ALERT);
    run.expect_alert(&after);
    for alert in run.alerts() {
        assert_ne!(alert["process"]["pid"], unrelated_pid, "the unrelated cat was reported: {alert:#}");
    }
    for path in &unrelated_only {
        assert!(run.alerts_for(path).is_empty(), "{path} was read only by the unrelated cat\n{}", run.describe());
    }
}

/// `credwatch watch` (the main job) catches a package manager started after it, by itself.
#[test]
fn watch_reports_an_npm_script_started_after_it() {
    let sandbox = Sandbox::new();
    let project = sandbox.npm_project();
    let npmrc = sandbox.credential(".npmrc");
    fs::write(
        project.join("package.json"),
        r#"{ "name": "e2e-app", "version": "1.0.0", "private": true, "scripts": { "steal": "cat \"$HOME/.npmrc\" >/dev/null" } }"#,
    )
    .unwrap();
    let mut watch = sandbox.command(credwatch_e2e::credwatch_binary());
    // The project's own script is quiet by default: `--watch-project` watches it.
    watch.args(["watch", "--watch-project", "--json", "--output"]).arg(sandbox.alerts_file());
    watch.arg("--pin-dir").arg(sandbox.pin_dir());
    let watcher = sandbox.spawn(watch);
    // Attaching takes a moment: the script runs again until its alert shows.
    let (alert, run) = sandbox.repeat_under_watch(
        watcher,
        "npm run steal",
        || {
            let mut npm = sandbox.command("npm");
            npm.args(["run", "--silent", "steal"]).current_dir(&project);
            npm
        },
        |a| a["file"]["path"] == npmrc && is_cat(a),
    );
    assert_field(&alert, "/package/manager", "npm", &run);
    assert_field(&alert, "/package/name", "e2e-app", &run);
    assert_field(&alert, "/package/lifecycle", "steal", &run);
}

/// The alert is about the script's `cat`, not npm reading its own configuration.
fn is_cat(alert: &Value) -> bool {
    alert["process"]["executable"].as_str().is_some_and(|e| e.ends_with("/cat"))
}
