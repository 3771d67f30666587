//! Issue 24: process listers are not stealers. procps's `ps` (4.0.2, Debian 12) opens every
//! process's `/proc/<pid>/environ` on each run, `ps aux` included; a postinstall running the
//! installed `ps aux` is one low alert that says why (the walk's other reads are its counted
//! repeats), while package code reading another process's environment itself, a `ps` it
//! copied, the installed one made to preload a library or asked to print environments
//! (`ps eww`) stay critical. Each runs as package code under the fake `npm`, with a process
//! outside the tree to read. Run as root with `cargo xtask test`.

use credwatch_e2e::{Run, Sandbox, Sleeper, EXIT_ALERT};
use serde_json::Value;

/// `credwatch run -- npm PACKAGE SCRIPT VICTIM_PID` under the fake manager: SCRIPT is the
/// package's postinstall, `$1` the pid of a process outside the tree.
fn postinstall(sandbox: &Sandbox, package: &str, script: &str, victim: &Sleeper) -> Run {
    let manager = sandbox.fake_manager();
    let cmd = [manager.to_str().unwrap(), package, script, &victim.pid()];
    sandbox.run_with(&sandbox.work(), &[], &cmd, &[])
}

/// The run's `proc-environ-mem` alerts.
fn environ_alerts(run: &Run) -> Vec<Value> {
    run.alerts().into_iter().filter(|a| a["rule"]["id"] == "proc-environ-mem").collect()
}

#[test]
fn a_postinstall_running_the_real_ps_aux_is_one_low_alert_that_says_why() {
    let sandbox = Sandbox::new();
    let victim = Sleeper::start(&sandbox);
    let run = postinstall(&sandbox, "lister", "ps aux > /dev/null; ps -ef > /dev/null", &victim);

    run.assert_exit(EXIT_ALERT);
    let loud: Vec<Value> = run.alerts().into_iter().filter(|a| a["rule"]["severity"] != "low").collect();
    assert!(loud.is_empty(), "nothing at medium or above\n{}", run.describe());
    // One alert for both walks: the other reads are its repeats, told again only at the 10th,
    // 100th, ... time, with the count.
    let alerts = environ_alerts(&run);
    let first = alerts.first().unwrap_or_else(|| panic!("no proc-environ-mem alert\n{}", run.describe()));
    assert_eq!(first["credwatch"]["count"], Value::Null, "{first:#}");
    for repeat in &alerts[1..] {
        assert_eq!(repeat["file"]["path"].as_str().map(|p| p.ends_with("/environ")), Some(true), "{repeat:#}");
        let count = repeat["credwatch"]["count"].as_u64().unwrap_or_default();
        assert!([10, 100, 1000].contains(&count), "{repeat:#}");
    }
    let alert = first;
    assert_eq!(alert["process"]["executable"], "/usr/bin/ps", "{alert:#}");
    assert_eq!(alert["package"]["name"], "lister", "{alert:#}");
    let why = alert["credwatch"]["why"].as_str().unwrap_or_default();
    assert!(why.starts_with("ps listing processes"), "{alert:#}");
}

#[test]
fn a_postinstall_reading_one_other_process_environ_stays_critical() {
    let cases = [
        ("reader", r#"cat "/proc/$1/environ" > /dev/null"#),
        ("printer", "ps eww > /dev/null"),
        ("copier", "cp /usr/bin/ps ./ps && ./ps aux > /dev/null"),
        // A library of the system's, from a directory the loader does not take it from.
        (
            "preloader",
            "cp /usr/lib/x86_64-linux-gnu/libcap.so.2 ./preload.so && LD_PRELOAD=$PWD/preload.so ps aux > /dev/null",
        ),
    ];
    for (package, script) in cases {
        // One sandbox each: its alerts file is the run's alone.
        let sandbox = Sandbox::new();
        let victim = Sleeper::start(&sandbox);
        let environ = format!("/proc/{}/environ", victim.pid());
        let run = postinstall(&sandbox, package, script, &victim);
        run.assert_exit(EXIT_ALERT);
        let alerts = environ_alerts(&run);
        let alert = alerts
            .iter()
            .find(|a| a["file"]["path"] == environ.as_str())
            .unwrap_or_else(|| panic!("{package}: no alert for {environ}\n{}", run.describe()));
        assert_eq!(alert["rule"]["severity"], "critical", "{package}: {alert:#}");
        assert_eq!(alert["credwatch"]["why"], Value::Null, "{package}: {alert:#}");
        assert_eq!(alert["package"]["name"], package, "{alert:#}");
        let executable = match package {
            "reader" => "/usr/bin/cat".to_owned(),
            "copier" => sandbox.work().join("ps").display().to_string(),
            _ => "/usr/bin/ps".to_owned(),
        };
        assert_eq!(alert["process"]["executable"], executable.as_str(), "{package}: {alert:#}");
        assert!(alerts.iter().all(|a| a["rule"]["severity"] == "critical"), "{package}\n{}", run.describe());
    }
}
