//! Issue 12: credwatch as a systemd service (deploy/credwatch.service, `Type=notify` with a
//! watchdog). The real binary talks to a notification socket the test makes, as systemd would
//! hand it over (`NOTIFY_SOCKET`, `WATCHDOG_USEC`); systemd's own checker reads the unit. Run as
//! root with `cargo xtask test`.

use std::{
    fs,
    os::unix::net::UnixDatagram,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use credwatch_e2e::{credwatch_binary, Sandbox};

/// The watchdog's timeout handed to the agent: it must ping at least this often, even idle
/// (its loop otherwise sleeps up to 60 s).
const WATCHDOG: Duration = Duration::from_secs(2);

/// The notifications received, each with when it came.
struct Notifications {
    socket: UnixDatagram,
    received: Vec<(Instant, String)>,
}

impl Notifications {
    /// Waits up to `timeout` for a message holding `line`, keeping every message received.
    fn wait_for(&mut self, line: &str, timeout: Duration) -> Option<Instant> {
        let deadline = Instant::now() + timeout;
        let mut buffer = [0u8; 4096];
        while let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|left| !left.is_zero()) {
            self.socket.set_read_timeout(Some(left)).unwrap();
            let Ok(length) = self.socket.recv(&mut buffer) else { break };
            let message = String::from_utf8_lossy(&buffer[..length]).into_owned();
            let now = Instant::now();
            let found = message.lines().any(|l| l == line);
            self.received.push((now, message));
            if found {
                return Some(now);
            }
        }
        None
    }

    fn describe(&self) -> String {
        self.received.iter().map(|(_, message)| format!("{message:?}\n")).collect()
    }
}

#[test]
fn watch_tells_systemd_it_is_ready_pings_the_watchdog_while_idle_and_says_reloading_and_stopping() {
    let sandbox = Sandbox::new();
    let path = sandbox.top().join("notify.socket");
    let mut notes = Notifications { socket: UnixDatagram::bind(&path).unwrap(), received: Vec::new() };
    let mut command = sandbox.command(credwatch_binary());
    command
        .args(["watch", "--json", "--output"])
        .arg(sandbox.alerts_file())
        .arg("--pin-dir")
        .arg(sandbox.pin_dir())
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", WATCHDOG.as_micros().to_string());
    let child = sandbox.spawn(command);
    let pid = child.id().to_string();

    let ready = notes.wait_for("READY=1", Duration::from_secs(60));
    let run = sandbox.collect(None, Duration::ZERO);
    assert!(ready.is_some(), "no READY=1\n{}{}", notes.describe(), run.describe());
    assert!(run.stderr.contains("watching package trees"), "READY=1 before the agent watches\n{}", run.describe());
    assert!(notes.received.len() == 1, "READY=1 is the first message:\n{}", notes.describe());

    // Idle: nothing runs, and the pings still come, each within the timeout of the one before.
    let idle = Instant::now();
    let mut pings = vec![ready.unwrap()];
    while idle.elapsed() < 3 * WATCHDOG {
        let ping = notes.wait_for("WATCHDOG=1", WATCHDOG * 2);
        pings.push(ping.unwrap_or_else(|| panic!("no WATCHDOG=1 within {:?}\n{}", WATCHDOG * 2, notes.describe())));
    }
    let longest = pings.windows(2).map(|pair| pair[1] - pair[0]).max().unwrap();
    assert!(
        longest < WATCHDOG,
        "{longest:?} between two pings, past the watchdog's {WATCHDOG:?}\n{}",
        notes.describe()
    );
    assert!(pings.len() >= 6, "{} pings in {:?}\n{}", pings.len() - 1, 3 * WATCHDOG, notes.describe());

    // `systemctl reload` (ExecReload= kill -HUP): reloading, then ready again.
    let hup = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(hup.success());
    let reloading = notes.wait_for("RELOADING=1", Duration::from_secs(20));
    assert!(reloading.is_some(), "no RELOADING=1 after SIGHUP\n{}", notes.describe());
    let reloading_message = &notes.received.last().unwrap().1;
    assert!(reloading_message.contains("MONOTONIC_USEC="), "{reloading_message:?}");
    assert!(
        notes.wait_for("READY=1", Duration::from_secs(20)).is_some(),
        "no READY=1 after the reload\n{}",
        notes.describe()
    );

    // `systemctl stop` (SIGTERM): stopping, and a clean exit.
    let term = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(term.success());
    assert!(notes.wait_for("STOPPING=1", Duration::from_secs(20)).is_some(), "no STOPPING=1\n{}", notes.describe());
    let run = sandbox.wait(child);
    assert!(run.status.is_some_and(|status| status.success()), "{}", run.describe());
    assert!(run.stderr.contains("reloaded"), "{}", run.describe());
}

#[test]
fn the_unit_passes_systemd_analyze_verify() {
    // The unit as the package installs it, with the binary under test as /usr/bin/credwatch.
    let unit = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/credwatch.service")).unwrap();
    assert!(unit.contains("\nExecStart=/usr/bin/credwatch watch "), "{unit}");
    let sandbox = Sandbox::new();
    let path = sandbox.top().join("credwatch.service");
    let installed = unit.replace("/usr/bin/credwatch", &credwatch_binary().to_string_lossy());
    fs::write(&path, &installed).unwrap();
    let verified = Command::new("systemd-analyze").arg("verify").arg(&path).output().expect("running systemd-analyze");
    let stderr = String::from_utf8_lossy(&verified.stderr);
    // Unknown keys and bad values are only warnings, with status 0: any word on the unit fails.
    let about_it: Vec<&str> = stderr.lines().filter(|line| line.contains("credwatch.service")).collect();
    assert!(verified.status.success() && about_it.is_empty(), "{}\n{stderr}", verified.status);

    // And the check can fail: a misspelt key is named.
    fs::write(&path, installed.replace("NoNewPrivileges=", "NoNewPrivilege=")).unwrap();
    let verified = Command::new("systemd-analyze").arg("verify").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&verified.stderr);
    assert!(stderr.contains("Unknown key 'NoNewPrivilege'"), "{stderr}");
}
