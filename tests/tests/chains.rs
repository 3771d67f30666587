//! Configuration chains judged whole (issue 24, point 4): a package's install step that loads
//! npm's configuration with the loader npm itself ships (`@npmcli/config`) reads the project's
//! `.npmrc`, then `~/.npmrc`, then the global npmrc, in one process within a few ms. Both reads
//! are low, the project's too although it came first: its alert waits for the chain's window.
//! A postinstall that reads the project's `.npmrc` alone is high, and under `watch` its alert
//! goes out while it still runs. Real npm, offline, a throwaway HOME of fake credentials. Run
//! as root with `cargo xtask test`.

use std::{fs, os::unix::process::CommandExt as _, path::PathBuf, process::Command, time::Duration};

use credwatch_e2e::{assert_field, Run, Sandbox, EXIT_ALERT};
use serde_json::Value;
use time::{format_description::well_known::Rfc3339, OffsetDateTime};

/// An npm project with its own `.npmrc` holding only a registry, as many have.
fn project_with_npmrc(sandbox: &Sandbox) -> (PathBuf, String) {
    let project = sandbox.npm_project();
    let npmrc = project.join(".npmrc");
    fs::write(&npmrc, "registry=http://127.0.0.1:4873/\n").unwrap();
    (project, npmrc.to_string_lossy().into_owned())
}

/// An alert's `@timestamp`, as a time.
#[track_caller]
fn read_at(alert: &Value) -> OffsetDateTime {
    OffsetDateTime::parse(alert["@timestamp"].as_str().unwrap_or_default(), &Rfc3339).expect("an RFC 3339 @timestamp")
}

/// The one alert about `path`, from `package`'s postinstall.
#[track_caller]
fn one_alert(run: &Run, path: &str, package: &str) -> Value {
    let alerts = run.alerts_for(path);
    assert_eq!(alerts.len(), 1, "one alert for {path}\n{}", run.describe());
    let alert = alerts.into_iter().next().unwrap();
    assert_field(&alert, "/rule/id", "npm-registry-token", run);
    assert_field(&alert, "/package/name", package, run);
    assert_field(&alert, "/package/lifecycle", "postinstall", run);
    alert
}

#[test]
fn npms_own_config_loader_in_a_postinstall_reads_the_chain_at_low_the_projects_file_first() {
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack("npm/config-loader");
    let (project, project_npmrc) = project_with_npmrc(&sandbox);
    let run = sandbox.run(&project, &["npm", "install", tarball.to_str().unwrap()]);

    // The loader ran and took the registry from the project's file: it read it.
    let found = fs::read_to_string(project.join("config-loader.txt")).unwrap_or_default();
    assert_eq!(found, "registry http://127.0.0.1:4873/\n", "{}", run.describe());
    run.assert_exit(EXIT_ALERT);
    // npm reading both files itself is no alert; the loader's reads are one each, both low.
    let first = one_alert(&run, &project_npmrc, "config-loader");
    let then = one_alert(&run, &sandbox.credential(".npmrc"), "config-loader");
    for alert in [&first, &then] {
        assert_field(alert, "/rule/severity", "low", &run);
        let why = alert["credwatch"]["why"].as_str().unwrap_or_default();
        assert!(why.contains("configuration chain"), "{alert:#}");
    }
    assert_eq!(first["process"]["pid"], then["process"]["pid"], "one loader read both");
    let apart = read_at(&then) - read_at(&first);
    assert!(apart.is_positive(), "the project's file was read first: {first:#}\n{then:#}");
    println!("@npmcli/config in a postinstall: ~/.npmrc read {apart} after the project's .npmrc; both low");
}

#[test]
fn a_postinstall_reading_the_projects_npmrc_alone_is_high() {
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack("npm/project-npmrc-grab");
    let (project, project_npmrc) = project_with_npmrc(&sandbox);
    let run = sandbox.run(&project, &["npm", "install", tarball.to_str().unwrap()]);

    run.assert_exit(EXIT_ALERT);
    let alert = one_alert(&run, &project_npmrc, "project-npmrc-grab");
    assert_field(&alert, "/rule/severity", "high", &run);
    assert_eq!(alert["credwatch"]["why"], Value::Null, "{alert:#}");
    assert!(run.alerts_for(&sandbox.credential(".npmrc")).is_empty(), "{}", run.describe());
}

/// With no record after the read (`run` sees its own tree alone), the clock releases the alert
/// held for the chain's window while the reader lives on, not its exit nor the end of the run.
#[test]
fn a_lone_reads_alert_goes_out_on_the_clock_while_the_reader_sleeps() {
    let sandbox = Sandbox::new();
    let (project, project_npmrc) = project_with_npmrc(&sandbox);
    let mut credwatch = sandbox.spawn_run(&project, &["sh", "-c", "exec 3< .npmrc; exec sleep 60"]);
    let alert = sandbox.wait_for_alert(&project_npmrc, Duration::from_secs(30));
    let seen = OffsetDateTime::now_utc();
    let running = credwatch.try_wait().unwrap().is_none();
    // The reader (sleep, in the shell's place) ends; so do its tree and the run.
    if let Some(pid) = alert.as_ref().and_then(|alert| alert["process"]["pid"].as_u64()) {
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    }
    let run = sandbox.wait(credwatch);
    let alert = alert.unwrap_or_else(|| panic!("no alert while the reader slept\n{}", run.describe()));
    assert!(running, "the alert came only at the end of the run\n{}", run.describe());
    assert_field(&alert, "/rule/severity", "high", &run);
    assert_eq!(run.alerts_for(&project_npmrc).len(), 1, "{}", run.describe());
    // Printed, not asserted: the chain's window (50 ms), the late records' margin (100 ms), a
    // poll (50 ms), the alerts file polled every 20 ms.
    println!("on the clock: the lone read's alert in the alerts file {} after the read", seen - read_at(&alert));
}

/// `watch` sleeps up to a minute between records on an idle machine: the alert held for the
/// chain's window must still go out, while the reader lives on, not at its exit.
#[test]
fn under_watch_a_lone_reads_alert_goes_out_while_the_reader_still_runs() {
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack("npm/project-npmrc-grab");
    let (project, project_npmrc) = project_with_npmrc(&sandbox);
    let watch = sandbox.watch();
    let mut install = sandbox.command("npm");
    install.args(["install", tarball.to_str().unwrap()]).current_dir(&project).env("GRAB_LINGER_S", "60");
    let mut install = install.process_group(0).spawn().expect("starting npm install");
    let alert = sandbox.wait_for_alert(&project_npmrc, Duration::from_secs(30));
    let seen = OffsetDateTime::now_utc();
    let lingering = install.try_wait().unwrap().is_none();
    // The install and its lingering postinstall, as a group.
    let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", install.id())]).status();
    let _ = install.wait();
    let run = watch.stop();
    let alert = alert.unwrap_or_else(|| panic!("no alert while the postinstall lingered\n{}", run.describe()));
    assert!(lingering, "the alert came only once the install ended\n{}", run.describe());
    assert_field(&alert, "/rule/severity", "high", &run);
    assert_field(&alert, "/package/name", "project-npmrc-grab", &run);
    // Printed, not asserted: other trees' records may release it before the clock does.
    println!("under watch: the lone read's alert in the alerts file {} after the read", seen - read_at(&alert));
}
