//! Issue 11: nothing is lost when the agent itself is killed. `credwatch watch` pins its kernel
//! side, so the programs keep recording while no agent runs, and the next `credwatch watch`
//! adopts them and reports what happened meanwhile, saying how long it was down. Run as root
//! with `cargo xtask test`.

use std::{os::unix::process::ExitStatusExt as _, time::Duration};

use credwatch_e2e::Sandbox;
use serde_json::Value;

const SIGKILL: i32 = 9;

fn time_of(value: &Value) -> time::OffsetDateTime {
    let text = value.as_str().unwrap_or_else(|| panic!("not a time: {value}"));
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// A package whose postinstall SIGKILLs the agent (its pid is the script's `$1`: `pidof
/// credwatch` would also hit agents other tests run on this machine), then reads the key.
const KILL_THEN_READ: &str = r#"kill -9 "$1"; sleep 0.3; cat "$HOME/.ssh/id_ed25519" > /dev/null"#;

#[test]
fn a_package_that_kills_the_agent_then_reads_a_key_is_reported_by_the_restarted_agent() {
    let sandbox = Sandbox::new();
    let key = sandbox.credential(".ssh/id_ed25519");
    let manager = sandbox.fake_manager();
    let watch = sandbox.watch();
    let agent = watch.pid().to_string();

    sandbox.setup(
        "the fake npm's postinstall",
        sandbox.command(&manager).args(["agent-killer", KILL_THEN_READ, agent.as_str()]),
    );
    let killed = watch.wait();
    assert_eq!(killed.status.and_then(|s| s.signal()), Some(SIGKILL), "{}", killed.describe());
    assert!(killed.alerts_for(&key).is_empty(), "the dead agent cannot have reported the read\n{}", killed.describe());

    let watch = sandbox.watch();
    let wanted = |id: &'static str| move |a: &Value| a["rule"]["id"] == id;
    let kill = sandbox.wait_for(wanted("signal-to-agent"), Duration::from_secs(20));
    let read = sandbox
        .wait_for(|a| a["rule"]["id"] == "ssh-private-keys" && a["file"]["path"] == key, Duration::from_secs(20));
    let run = watch.stop();
    let kill = kill.unwrap_or_else(|| panic!("no signal-to-agent alert after the restart\n{}", run.describe()));
    let read = read.unwrap_or_else(|| panic!("no alert for the key read after the restart\n{}", run.describe()));
    assert!(run.stderr.contains("adopted the kernel programs pinned in"), "{}", run.describe());
    assert!(run.stderr.contains("stay attached"), "{}", run.describe());

    for alert in [&kill, &read] {
        assert_eq!(alert["package"]["name"], "agent-killer", "{alert:#}");
        assert_eq!(alert["package"]["lifecycle"], "postinstall", "{alert:#}");
        let gap = &alert["credwatch"]["gap"];
        let seconds = gap["seconds"].as_f64().unwrap_or_else(|| panic!("no gap on the alert: {alert:#}"));
        assert!(seconds > 0.0 && seconds < 60.0, "{alert:#}");
        let (from, at, to) = (time_of(&gap["down_from"]), time_of(&alert["@timestamp"]), time_of(&gap["down_to"]));
        assert!(from <= at && at <= to, "the alert's event is inside the gap: {alert:#}");
        assert_eq!(gap["clean_stop"], Value::Null, "the agent was killed, not stopped: {alert:#}");
    }
    assert_eq!(kill["credwatch"]["syscall"]["target_pid"], agent.parse::<u32>().unwrap(), "{kill:#}");

    // SIGTERM left the pins; `credwatch stop` removes them, and says when there is nothing.
    assert!(sandbox.pin_dir().exists());
    let stopped = sandbox.stop_pinned();
    let said = String::from_utf8_lossy(&stopped.stderr).into_owned();
    assert!(stopped.status.success() && said.contains("detached the kernel programs"), "{said}");
    assert!(!sandbox.pin_dir().exists());
    let again = sandbox.stop_pinned();
    let said = String::from_utf8_lossy(&again.stderr).into_owned();
    assert!(again.status.success() && said.contains("nothing is pinned"), "{said}");
}

#[test]
fn credwatch_stop_stops_a_running_watch_and_detaches_its_programs() {
    let sandbox = Sandbox::new();
    let watch = sandbox.watch();
    assert!(sandbox.pin_dir().join("EVENTS").exists());
    let agent = watch.pid();
    // A second agent on the same pins would steal half of each ring's records: refused.
    let second = sandbox
        .command(credwatch_e2e::credwatch_binary())
        .args(["watch", "--json", "--pin-dir"])
        .arg(sandbox.pin_dir())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&second.stderr).into_owned();
    assert_eq!(second.status.code(), Some(1), "{said}");
    assert!(said.contains(&format!("credwatch (pid {agent}) is already running")), "{said}");

    let stopped = sandbox.stop_pinned();
    let said = String::from_utf8_lossy(&stopped.stderr).into_owned();
    assert!(stopped.status.success(), "{said}");
    assert!(said.contains(&format!("stopped the agent (pid {agent})")), "{said}");
    assert!(said.contains("detached the kernel programs"), "{said}");
    let run = watch.wait();
    run.assert_exit(0);
    assert!(!sandbox.pin_dir().exists(), "{}", run.describe());
}
