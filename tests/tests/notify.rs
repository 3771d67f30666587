//! `credwatch notify` for real (issue 26 point 1): a private session bus (`dbus-daemon`), a
//! display (`Xvfb`) and a real notification server (Debian's `dunst`), `dbus-monitor` capturing
//! the Notify calls, `credwatch watch` serving its socket and `credwatch notify` following it
//! while package code reads fake credentials.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use credwatch_e2e::{slow, write_executable, OtherUser, Sandbox, Watch, FAKE_CREDENTIALS, FAKE_MANAGER};
use serde_json::Value;
use time::{format_description::well_known::Rfc3339, OffsetDateTime};

/// A desktop session of the test's own: its bus, and with [`Session::with_server`] a display
/// and dunst. Every daemon it started is killed when it is dropped.
struct Session {
    dir: PathBuf,
    address: String,
    bus_pid: u32,
    display: Option<u32>,
    children: Vec<Child>,
    monitor: PathBuf,
}

impl Session {
    /// A session bus that knows no service (nothing is activated: no notification server
    /// unless the test starts one), and `dbus-monitor` writing the Notify calls to a file.
    /// Its files in `dir`: a directory other users can enter when they are to connect.
    fn start(dir: &Path) -> Session {
        let dir = dir.to_owned();
        fs::create_dir_all(&dir).unwrap();
        let config = dir.join("bus.conf");
        fs::write(
            &config,
            format!(
                r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"#,
                dir.join("bus").display()
            ),
        )
        .unwrap();
        let out = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", config.display()))
            .args(["--fork", "--print-address=1", "--print-pid=1"])
            .stdin(Stdio::null())
            .output()
            .expect("running dbus-daemon");
        assert!(out.status.success(), "dbus-daemon: {}: {}", out.status, String::from_utf8_lossy(&out.stderr));
        let out = String::from_utf8_lossy(&out.stdout);
        let mut lines = out.lines();
        let address = lines.next().expect("dbus-daemon printed its address").trim().to_owned();
        let bus_pid = lines.next().and_then(|pid| pid.trim().parse().ok()).expect("dbus-daemon printed its pid");
        let mut session = Session {
            dir: dir.clone(),
            address,
            bus_pid,
            display: None,
            children: Vec::new(),
            monitor: dir.join("monitor.txt"),
        };
        let monitor = fs::File::create(&session.monitor).unwrap();
        let child = session
            .command("dbus-monitor")
            .args(["--session", "interface='org.freedesktop.Notifications',member='Notify'"])
            .stdout(monitor)
            .stderr(Stdio::null())
            .spawn()
            .expect("starting dbus-monitor");
        session.children.push(child);
        // It prints its own NameAcquired once it listens.
        session.wait_until("dbus-monitor listens", || {
            fs::read_to_string(&session.monitor).unwrap_or_default().contains("NameAcquired")
        });
        session
    }

    /// [`Session::start`] with `Xvfb` on a free display and `dunst` on it.
    fn with_server(dir: &Path) -> Session {
        let mut session = Session::start(dir);
        session.start_server();
        session
    }

    fn start_server(&mut self) {
        let display = (90..200)
            .find(|n| {
                !Path::new(&format!("/tmp/.X11-unix/X{n}")).exists() && !Path::new(&format!("/tmp/.X{n}-lock")).exists()
            })
            .expect("a free X display");
        let xvfb = Command::new("Xvfb")
            .arg(format!(":{display}"))
            .args(["-screen", "0", "1024x768x24", "-nolisten", "tcp"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(self.dir.join("xvfb.log")).unwrap())
            .spawn()
            .expect("starting Xvfb");
        self.children.push(xvfb);
        self.wait_until("Xvfb serves its display", || {
            Command::new("xdpyinfo")
                .arg("-display")
                .arg(format!(":{display}"))
                .output()
                .is_ok_and(|o| o.status.success())
        });
        self.display = Some(display);
        let dunstrc = self.dir.join("dunstrc");
        fs::write(
            &dunstrc,
            "[global]\n    font = DejaVu Sans Mono 10\n    width = 520\n    origin = top-right\n    offset = 10x10\n    \
             markup = full\n    format = \"<b>%s</b>\\n%b\"\n    frame_width = 2\n    padding = 10\n    horizontal_padding = 12\n",
        )
        .unwrap();
        let dunst = self
            .command("dunst")
            .arg("-config")
            .arg(&dunstrc)
            .env("DISPLAY", format!(":{display}"))
            .stdout(Stdio::null())
            .stderr(fs::File::create(self.dir.join("dunst.log")).unwrap())
            .spawn()
            .expect("starting dunst");
        self.children.push(dunst);
        self.wait_until("dunst owns org.freedesktop.Notifications", || self.dunst_count("displayed").is_some());
    }

    /// A command in the session: its bus, nothing else of the test's environment.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default());
        command.env("DBUS_SESSION_BUS_ADDRESS", &self.address).stdin(Stdio::null());
        command
    }

    /// `dunstctl count WHAT` (waiting, displayed, history), when dunst answers.
    fn dunst_count(&self, what: &str) -> Option<u64> {
        let out = self.command("dunstctl").args(["count", what]).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().parse().ok()).flatten()
    }

    /// Every notification dunst has had: waiting, displayed and in its history, in one answer
    /// (three would count one moving from waiting to displayed twice).
    fn dunst_total(&self) -> u64 {
        let out = self.command("dunstctl").arg("count").output().expect("running dunstctl count");
        assert!(out.status.success(), "dunstctl count: {}", out.status);
        // "Waiting: 0\n  Currently displayed: 1\n  History: 0"
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| line.rsplit_once(':').and_then(|(_, n)| n.trim().parse::<u64>().ok()))
            .sum()
    }

    fn calls(&self) -> Vec<NotifyCall> {
        notify_calls(&fs::read_to_string(&self.monitor).unwrap_or_default())
    }

    /// Waits (at most 30 s, times [`slow`]) for the first Notify call `wanted` accepts.
    fn wait_for_call(&self, wanted: impl Fn(&NotifyCall) -> bool) -> Option<NotifyCall> {
        let start = Instant::now();
        while start.elapsed() < slow(Duration::from_secs(30)) {
            if let Some(call) = self.calls().into_iter().find(&wanted) {
                return Some(call);
            }
            thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn wait_until(&self, what: &str, done: impl Fn() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < slow(Duration::from_secs(20)), "{what}: not within 20 s");
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// `credwatch notify` in the session, as root in the sandbox's home (its state and cache),
    /// with a fake `xdg-open` that writes down what it was asked to open.
    fn notify(&self, sandbox: &Sandbox, socket: &Path) -> Notify {
        self.follow(self.notify_command(sandbox.credwatch("notify"), socket))
    }

    fn notify_stderr(&self) -> PathBuf {
        self.dir.join(format!("notify-{}.stderr", fs::read_dir(&self.dir).unwrap().count()))
    }

    /// Starts `command` (`credwatch notify ...`) and waits until it follows the agent.
    fn follow(&self, mut command: Command) -> Notify {
        let stderr = self.notify_stderr();
        command.stderr(fs::File::create(&stderr).unwrap());
        let child = command.spawn().expect("starting credwatch notify");
        let notify = Notify { child: Some(child), stderr };
        let start = Instant::now();
        while !notify.stderr().contains("following the agent's alerts") {
            assert!(
                start.elapsed() < slow(Duration::from_secs(20)),
                "notify never followed the agent:\n{}",
                notify.stderr()
            );
            thread::sleep(Duration::from_millis(20));
        }
        notify
    }

    /// `command` (`credwatch notify`) for this session: the agent's socket, the bus, a fake
    /// `xdg-open` first on PATH.
    fn notify_command(&self, mut command: Command, socket: &Path) -> Command {
        let bin = self.dir.join("bin");
        if !bin.exists() {
            write_executable(
                &bin.join("xdg-open"),
                &format!("#!/bin/sh\necho \"$1\" >> {}\n", self.opened().display()),
            );
        }
        let path = std::env::join_paths(
            std::iter::once(bin).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
        )
        .unwrap();
        command
            .arg("--alerts-socket")
            .arg(socket)
            .env("DBUS_SESSION_BUS_ADDRESS", &self.address)
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        command
    }

    /// What the fake `xdg-open` was asked to open, one a line.
    fn opened(&self) -> PathBuf {
        self.dir.join("xdg-open.log")
    }

    /// A screenshot of the popups' corner of the display.
    fn screenshot(&self, to: &Path) {
        let display = self.display.expect("a display");
        let status = Command::new("import")
            .args(["-display", &format!(":{display}"), "-window", "root", "-crop", "560x190+464+0", "+repage"])
            .arg(to)
            .status()
            .expect("running import");
        assert!(status.success(), "import failed: {status}");
    }
}

impl Drop for Session {
    /// SIGTERM first: Xvfb then removes its socket and lock file, which would otherwise use the
    /// displays up run after run.
    fn drop(&mut self) {
        for child in self.children.iter_mut().rev() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let start = Instant::now();
            while child.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(5) {
                thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("kill").arg(self.bus_pid.to_string()).status();
        if let Some(display) = self.display {
            let _ = fs::remove_file(format!("/tmp/.X11-unix/X{display}"));
            let _ = fs::remove_file(format!("/tmp/.X{display}-lock"));
        }
    }
}

/// A running `credwatch notify`; stopped with SIGTERM when dropped.
struct Notify {
    child: Option<Child>,
    stderr: PathBuf,
}

impl Notify {
    fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGTERM; it exits cleanly (0).
    fn stop(mut self) -> String {
        let mut child = self.child.take().unwrap();
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(start.elapsed() < slow(Duration::from_secs(10)), "notify did not exit on SIGTERM");
            thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "notify exited with {status} on SIGTERM:\n{}", self.stderr());
        self.stderr()
    }
}

impl Drop for Notify {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One Notify call as dbus-monitor printed it.
#[derive(Debug)]
struct NotifyCall {
    /// Seconds since the epoch.
    time: f64,
    replaces: u32,
    summary: String,
    body: String,
    actions: Vec<String>,
    urgency: Option<u8>,
}

/// The Notify calls of dbus-monitor's output: `method call time=T ... member=Notify` then its
/// arguments, one a line (a string holding newlines spans lines).
fn notify_calls(text: &str) -> Vec<NotifyCall> {
    let mut calls = Vec::new();
    for block in format!("\n{text}").split("\nmethod call ").skip(1) {
        let (head, args) = block.split_once('\n').unwrap_or((block, ""));
        if !head.contains("member=Notify") {
            continue;
        }
        let time = head.split_once("time=").and_then(|(_, rest)| rest.split(' ').next()).and_then(|t| t.parse().ok());
        // The arguments: app, replaces, icon, summary, body, actions, hints, timeout.
        let strings = quoted_strings(args);
        let replaces = args.lines().find_map(|line| line.trim().strip_prefix("uint32 ")).and_then(|n| n.parse().ok());
        let (Some(time), Some(replaces)) = (time, replaces) else { continue };
        let (Some(summary), Some(body)) = (strings.get(2), strings.get(3)) else { continue };
        let urgency = args
            .split("string \"urgency\"")
            .nth(1)
            .and_then(|rest| rest.split("byte ").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok());
        let actions = strings
            .iter()
            .skip(4)
            .take_while(|s| *s != "urgency" && *s != "desktop-entry" && *s != "category")
            .cloned()
            .collect();
        calls.push(NotifyCall { time, replaces, summary: summary.clone(), body: body.clone(), actions, urgency });
    }
    calls
}

/// The `string "..."` values of a block, in order; a value may span lines.
fn quoted_strings(args: &str) -> Vec<String> {
    let mut strings = Vec::new();
    let mut rest = args;
    while let Some(at) = rest.find("string \"") {
        rest = &rest[at + "string \"".len()..];
        // The value ends at a quote that ends its line.
        let end = rest.find("\"\n").unwrap_or(rest.len());
        strings.push(rest[..end].to_owned());
        rest = &rest[end.min(rest.len())..];
    }
    strings
}

/// `watch` serving its socket in `dir` (a directory others can enter when they are to connect)
/// and its log in the sandbox.
fn watch<'a>(sandbox: &'a Sandbox, dir: &Path) -> (Watch<'a>, PathBuf) {
    let socket = dir.join("run/alerts.sock");
    let log = sandbox.top().join("lib/alerts.jsonl");
    let watch =
        sandbox.watch_with(&["--alerts-socket", socket.to_str().unwrap(), "--alert-log", log.to_str().unwrap()]);
    (watch, socket)
}

/// The fake npm (a tree root under watch) running `script` as package `package`'s postinstall.
fn package_code(sandbox: &Sandbox, package: &str, script: &str) {
    sandbox.setup(&format!("{package}'s postinstall"), sandbox.command(sandbox.fake_manager()).args([package, script]));
}

/// A user of the machine with fake credentials in its home and package code of its own: its
/// `notify` sees only its own alerts (the agent gives each uid its own), whatever else runs on
/// the machine meanwhile, so that the tests can count notifications.
const NOBODY: u32 = 65_534;

struct Tenant {
    user: OtherUser,
    manager: PathBuf,
}

impl Tenant {
    /// `nobody`: dbus-daemon lets in only users it finds in passwd.
    fn new() -> Tenant {
        let user = OtherUser::new(NOBODY);
        for (relative, text) in FAKE_CREDENTIALS {
            let path = user.home.join(relative);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, text).unwrap();
        }
        user.own(&user.home);
        let manager = user.top().join("fake-manager/npm");
        write_executable(&manager, FAKE_MANAGER);
        Tenant { user, manager }
    }

    /// [`package_code`] as the user.
    fn package_code(&self, sandbox: &Sandbox, package: &str, script: &str) {
        sandbox.setup(&format!("{package}'s postinstall"), self.user.command(&self.manager).args([package, script]));
    }

    /// `credwatch notify` in the session as the user (its home: its state and cache).
    fn notify(&self, session: &Session, socket: &Path) -> Notify {
        let mut command = self.user.command(&self.user.binary);
        command.arg("notify");
        session.follow(session.notify_command(command, socket))
    }

    /// A session whose bus the user may reach.
    fn session(&self) -> Session {
        Session::with_server(&self.user.top().join("session"))
    }
}

/// The alert of `package` in the watch's alerts file, within 30 s.
fn alert_of(sandbox: &Sandbox, package: &str) -> Value {
    sandbox
        .wait_for(|a| a["package"]["name"] == package, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no alert of {package} in {}", sandbox.alerts_file().display()))
}

fn describe(session: &Session, notify: &str) -> String {
    format!("Notify calls: {:#?}\nnotify's stderr:\n{notify}", session.calls())
}

#[test]
fn an_npm_postinstall_reading_a_key_pops_up_a_critical_notification_naming_the_package() {
    let sandbox = Sandbox::new();
    let session = Session::with_server(&sandbox.top().join("session"));
    let (watch, socket) = watch(&sandbox, sandbox.top());
    let notify = session.notify(&sandbox, &socket);
    assert_eq!(session.dunst_total(), 0, "dunst had notifications before the attack");

    // A real npm package whose postinstall reads the fake SSH key.
    let package = sandbox.work().join("notify-stealer");
    fs::create_dir_all(&package).unwrap();
    fs::write(
        package.join("package.json"),
        r#"{ "name": "notify-stealer", "version": "2.0.1", "license": "MIT",
  "scripts": { "postinstall": "node -e \"require('fs').readFileSync(require('os').homedir() + '/.ssh/id_ed25519')\"" } }"#,
    )
    .unwrap();
    let name = sandbox.setup("npm pack", sandbox.command("npm").args(["pack", "--silent"]).current_dir(&package));
    let tarball = package.join(name.trim());
    let project = sandbox.npm_project();
    sandbox.setup("npm install", sandbox.command("npm").arg("install").arg(&tarball).current_dir(&project));

    let call = session.wait_for_call(|call| call.summary.contains("notify-stealer@2.0.1"));
    let alert = alert_of(&sandbox, "notify-stealer");
    let call =
        call.unwrap_or_else(|| panic!("no notification naming the package\n{}", describe(&session, &notify.stderr())));
    assert_eq!(call.summary, "CRITICAL notify-stealer@2.0.1 read SSH private keys", "{call:#?}");
    assert_eq!(call.urgency, Some(2), "not critical: {call:#?}");
    let key = sandbox.credential(".ssh/id_ed25519");
    assert!(call.body.starts_with(&format!("file: {key}\nrotate: ")), "{call:#?}");
    assert_eq!(call.actions, ["default", "Details", "details", "Details", "dismiss", "Dismiss"], "{call:#?}");
    session.wait_until("dunst counts the notification", || session.dunst_total() >= 1);

    // From the read (the alert's event time) to the Notify call on the bus: printed, not asserted.
    let read = OffsetDateTime::parse(alert["@timestamp"].as_str().unwrap(), &Rfc3339).unwrap();
    let latency = call.time - read.unix_timestamp_nanos() as f64 / 1e9;
    println!("from the read of the key to the Notify call on the bus: {:.0} ms", latency * 1000.0);

    // The popup as dunst drew it; CREDWATCH_E2E_NOTIFICATION_PNG keeps a copy (docs/src/notification.png).
    let shot = sandbox.top().join("notification.png");
    session.screenshot(&shot);
    assert!(fs::metadata(&shot).unwrap().len() > 0);
    if let Some(keep) = std::env::var_os("CREDWATCH_E2E_NOTIFICATION_PNG") {
        fs::copy(&shot, keep).unwrap();
    }

    // "Details" (dunst's default action, a click): the incident page of the alert's tree, written
    // to the cache and handed to xdg-open.
    let clicked = session.command("dunstctl").args(["action", "0"]).status().unwrap();
    assert!(clicked.success(), "dunstctl action 0: {clicked}");
    session.wait_until("xdg-open is asked to open the page", || session.opened().exists());
    let page = PathBuf::from(fs::read_to_string(session.opened()).unwrap().trim());
    assert_eq!(page.parent(), Some(sandbox.home().join(".cache/credwatch").as_path()), "{}", page.display());
    let html = fs::read_to_string(&page).unwrap();
    assert!(html.contains("notify-stealer") && html.contains("id_ed25519"), "{}", page.display());
    let stderr = notify.stop();
    assert!(stderr.contains("CRITICAL notify-stealer@2.0.1 read SSH private keys"), "not logged:\n{stderr}");
    drop(watch);
}

#[test]
fn a_sweep_is_one_notification_and_its_summary_replaces_it() {
    let sandbox = Sandbox::new();
    let tenant = Tenant::new();
    let session = tenant.session();
    let (_watch, socket) = watch(&sandbox, tenant.user.top());
    let notify = tenant.notify(&session, &socket);
    // Six kinds of credentials, then more of them folded into the sweep.
    let files = [
        ".ssh/id_ed25519",
        ".npmrc",
        ".aws/credentials",
        ".cargo/credentials.toml",
        ".pypirc",
        ".ssh/id_rsa",
        ".gem/credentials",
        ".s3cfg",
    ];
    let script: String = files.iter().map(|f| format!("cat \"$HOME/{f}\" > /dev/null; ")).collect();
    tenant.package_code(&sandbox, "notify-sweeper", &script);
    // The tree ended: the sweep's final summary comes (it folded files) and replaces the popup.
    let sweep_final = sandbox.wait_for(
        |a| a["package"]["name"] == "notify-sweeper" && a["credwatch"]["sweep"]["final"] == true,
        Duration::from_secs(30),
    );
    assert!(sweep_final.is_some(), "no final sweep summary in the alerts");
    let summary =
        session.wait_for_call(|call| call.summary.contains("notify-sweeper") && call.body.contains("folded in"));
    assert!(summary.is_some(), "the sweep's summary was not shown\n{}", describe(&session, &notify.stderr()));
    let calls = session.calls();
    assert!(calls.iter().all(|call| call.summary.contains("notify-sweeper")), "{calls:#?}");
    assert_eq!(calls.iter().filter(|call| call.replaces == 0).count(), 1, "one popup for the tree: {calls:#?}");
    let id = calls[1..].first().map(|call| call.replaces).unwrap_or_default();
    assert!(id != 0 && calls[1..].iter().all(|call| call.replaces == id), "{calls:#?}");
    let last = calls.last().unwrap();
    assert!(last.summary.contains("swept") && last.urgency == Some(2), "{last:#?}");
    session.wait_until("dunst shows it", || session.dunst_total() >= 1);
    assert_eq!(session.dunst_total(), 1, "dunst has more than one notification: {calls:#?}");
    notify.stop();
}

#[test]
fn a_burst_shows_three_and_one_notification_counts_the_rest() {
    let sandbox = Sandbox::new();
    let tenant = Tenant::new();
    let session = tenant.session();
    let (_watch, socket) = watch(&sandbox, tenant.user.top());
    let notify = tenant.notify(&session, &socket);
    for i in 0..7 {
        tenant.package_code(&sandbox, &format!("notify-burst-{i}"), "cat \"$HOME/.ssh/id_ed25519\" > /dev/null");
    }
    for i in 0..7 {
        alert_of(&sandbox, &format!("notify-burst-{i}"));
    }
    let held = session.wait_for_call(|call| call.summary == "credwatch: 4 more alerts held back");
    let calls = session.calls();
    assert!(held.is_some(), "no count of the 4 held back\n{}", describe(&session, &notify.stderr()));
    let popups: Vec<&str> = calls.iter().filter(|call| call.replaces == 0).map(|call| call.summary.as_str()).collect();
    assert_eq!(
        popups,
        [
            "CRITICAL notify-burst-0@1.0.0 read SSH private keys",
            "CRITICAL notify-burst-1@1.0.0 read SSH private keys",
            "CRITICAL notify-burst-2@1.0.0 read SSH private keys",
            "credwatch: 1 more alert held back",
        ],
        "{calls:#?}"
    );
    let held = held.unwrap();
    assert!(held.body.contains("`credwatch alerts`") && held.urgency == Some(2), "{held:#?}");
    // The count is one popup, updated in place as the burst went on.
    let counts: Vec<&NotifyCall> = calls.iter().filter(|call| call.summary.contains("held back")).collect();
    assert!(counts[1..].iter().all(|call| call.replaces != 0), "{counts:#?}");
    session.wait_until("dunst shows them", || session.dunst_total() >= 4);
    assert_eq!(session.dunst_total(), 4, "{calls:#?}");
    let stderr = notify.stop();
    for i in 0..7 {
        assert!(stderr.contains(&format!("notify-burst-{i}@1.0.0")), "alert {i} not logged:\n{stderr}");
    }
}

#[test]
fn alerts_raised_while_notify_was_stopped_are_shown_at_its_next_start() {
    let sandbox = Sandbox::new();
    let tenant = Tenant::new();
    let session = tenant.session();
    let (_watch, socket) = watch(&sandbox, tenant.user.top());
    // The first start ever shows no history: it only remembers where the agent is.
    tenant.package_code(&sandbox, "notify-before", "cat \"$HOME/.ssh/id_ed25519\" > /dev/null");
    alert_of(&sandbox, "notify-before");
    let first = tenant.notify(&session, &socket);
    let state = tenant.user.home.join(".local/state/credwatch/notify.seq");
    session.wait_until("notify stores where it is", || state.exists());
    first.stop();
    let shown: u64 = fs::read_to_string(&state).unwrap().trim().parse().unwrap();
    assert!(shown >= 1, "notify.seq: {shown}");
    assert!(session.calls().is_empty(), "{:#?}", session.calls());

    // Raised while it is stopped: one tree, shown as itself at the next start.
    tenant.package_code(
        &sandbox,
        "notify-missed",
        "cat \"$HOME/.ssh/id_ed25519\" > /dev/null; cat \"$HOME/.npmrc\" > /dev/null",
    );
    alert_of(&sandbox, "notify-missed");
    let second = tenant.notify(&session, &socket);
    let call = session.wait_for_call(|call| call.summary.contains("notify-missed@1.0.0"));
    assert!(call.is_some(), "the missed alert was not shown\n{}", describe(&session, &second.stderr()));
    assert!(call.unwrap().body.contains("+1 more alert"), "{:#?}", session.calls());
    second.stop();

    // Many trees while it is stopped: one notification counts them.
    for i in 0..5 {
        tenant.package_code(&sandbox, &format!("notify-away-{i}"), "cat \"$HOME/.aws/credentials\" > /dev/null");
    }
    for i in 0..5 {
        alert_of(&sandbox, &format!("notify-away-{i}"));
    }
    // With --once: what was missed, then it exits by itself.
    let mut once = tenant.user.command(&tenant.user.binary);
    once.args(["notify", "--once"]);
    let once = session.notify_command(once, &socket).output().expect("running credwatch notify --once");
    let stderr = String::from_utf8_lossy(&once.stderr).into_owned();
    assert!(once.status.success(), "notify --once: {}\n{stderr}", once.status);
    let count = session.wait_for_call(|call| call.summary.ends_with("alerts while notify was not running"));
    let calls = session.calls();
    assert!(count.is_some(), "no count of the missed alerts\n{}", describe(&session, &stderr));
    let count = count.unwrap();
    assert_eq!(count.summary, "credwatch: 5 alerts while notify was not running", "{calls:#?}");
    assert!(count.body.contains("notify-away-4@1.0.0") && count.body.contains("and 2 more"), "{count:#?}");
    assert!(calls.iter().all(|call| !call.summary.contains("notify-away-")), "shown one by one: {calls:#?}");
}

#[test]
fn hostile_names_and_paths_reach_the_notification_escaped() {
    let sandbox = Sandbox::new();
    let tenant = Tenant::new();
    let session = tenant.session();
    let (_watch, socket) = watch(&sandbox, tenant.user.top());
    let notify = tenant.notify(&session, &socket);
    // Markup, an entity, ANSI, a right-to-left override and a newline in the key's name; ANSI,
    // markup and an override in the package's.
    let key = "id_<b onclick=x>bold&amp;\x1b[31m\u{202e}gpj.exe\nnext";
    let path = tenant.user.home.join(".ssh").join(key);
    fs::write(&path, "FAKE-credwatch-e2e-not-a-key\n").unwrap();
    tenant.user.own(&path);
    let package = "evil\x1b[2J<i>pkg\u{202e}";
    sandbox.setup(
        "the hostile package's postinstall",
        tenant.user.command(&tenant.manager).args([package, "cat \"$HOME/.ssh/$1\" > /dev/null", key]),
    );
    let call = session.wait_for_call(|call| call.summary.contains("evil"));
    let call = call.unwrap_or_else(|| panic!("no notification\n{}", describe(&session, &notify.stderr())));
    assert_eq!(call.summary, "CRITICAL evil\\u{1b}[2J<i>pkg\\u{202e}@1.0.0 read SSH private keys", "{call:#?}");
    let first = call.body.lines().next().unwrap();
    assert_eq!(
        first,
        format!(
            "file: {}/.ssh/id_&lt;b onclick=x&gt;bold&amp;amp;\\u{{1b}}[31m\\u{{202e}}gpj.exe\\nnext",
            tenant.user.home.display()
        ),
        "{call:#?}"
    );
    let stderr = notify.stop();
    assert!(!stderr.contains('\x1b') && !stderr.contains('\u{202e}'), "{stderr}");
}

#[test]
fn without_a_notification_server_it_says_so_once_logs_the_alerts_and_finds_one_started_later() {
    let sandbox = Sandbox::new();
    // A bus, and nothing owning org.freedesktop.Notifications on it.
    let mut session = Session::start(&sandbox.top().join("session"));
    let (_watch, socket) = watch(&sandbox, sandbox.top());
    let notify = session.notify(&sandbox, &socket);
    for package in ["notify-unseen-1", "notify-unseen-2"] {
        package_code(&sandbox, package, "cat \"$HOME/.ssh/id_ed25519\" > /dev/null");
        alert_of(&sandbox, package);
    }
    session.wait_until("notify logs the second alert", || notify.stderr().contains("notify-unseen-2@1.0.0"));
    let stderr = notify.stderr();
    assert_eq!(stderr.matches("no notification server").count(), 1, "{stderr}");
    assert!(stderr.contains("CRITICAL notify-unseen-1@1.0.0 read SSH private keys"), "{stderr}");
    assert!(stderr.contains("CRITICAL notify-unseen-2@1.0.0 read SSH private keys"), "{stderr}");

    // A server started later gets the next alert.
    session.start_server();
    package_code(&sandbox, "notify-seen", "cat \"$HOME/.ssh/id_ed25519\" > /dev/null");
    let call = session.wait_for_call(|call| call.summary.contains("notify-seen@1.0.0"));
    assert!(call.is_some(), "not shown once a server runs\n{}", describe(&session, &notify.stderr()));
    session.wait_until("dunst counts it", || session.dunst_total() >= 1);
    let stderr = notify.stop();
    assert_eq!(stderr.matches("no notification server").count(), 1, "{stderr}");
}

#[test]
fn without_an_agent_it_says_so_once_and_follows_the_agent_once_it_starts() {
    let sandbox = Sandbox::new();
    let session = Session::with_server(&sandbox.top().join("session"));
    let socket = sandbox.top().join("run/alerts.sock");
    // --once does not wait: no agent is an error.
    let mut once = sandbox.credwatch("notify");
    once.arg("--once");
    let once = session.notify_command(once, &socket).output().expect("running credwatch notify --once");
    let said = String::from_utf8_lossy(&once.stderr);
    assert_eq!(once.status.code(), Some(1), "{said}");
    assert!(said.contains("no credwatch agent at"), "{said}");
    let stderr = session.notify_stderr();
    let mut command = session.notify_command(sandbox.credwatch("notify"), &socket);
    command.stderr(fs::File::create(&stderr).unwrap());
    let notify = Notify { child: Some(command.spawn().expect("starting credwatch notify")), stderr };
    session.wait_until("notify says there is no agent", || notify.stderr().contains("no credwatch agent at"));
    // Tried again every 3 s, said once.
    thread::sleep(slow(Duration::from_secs(4)));
    assert_eq!(notify.stderr().matches("no credwatch agent at").count(), 1, "{}", notify.stderr());
    let _watch = watch(&sandbox, sandbox.top());
    session.wait_until("notify follows the agent", || notify.stderr().contains("following the agent's alerts"));
    package_code(&sandbox, "notify-late", "cat \"$HOME/.ssh/id_ed25519\" > /dev/null");
    let call = session.wait_for_call(|call| call.summary.contains("notify-late@1.0.0"));
    assert!(call.is_some(), "{}", describe(&session, &notify.stderr()));
    notify.stop();
}

/// dbus-monitor's lines, as this file reads them (a body over two lines; hints after actions).
#[test]
fn dbus_monitor_output_is_read() {
    let text = "signal time=1.0 sender=org.freedesktop.DBus -> destination=:1.1 serial=2 member=NameAcquired\n   string \":1.1\"\n\
method call time=1796494188.451991 sender=:1.2 -> destination=:1.0 serial=9 path=/org/freedesktop/Notifications; interface=org.freedesktop.Notifications; member=Notify\n\
   string \"credwatch\"\n   uint32 7\n   string \"dialog-error\"\n   string \"CRITICAL p@1.0.0 read SSH private keys\"\n\
   string \"file: /h/.ssh/id_rsa\nrotate: the key\"\n   array [\n      string \"default\"\n      string \"Details\"\n   ]\n\
   array [\n      dict entry(\n         string \"urgency\"\n         variant             byte 2\n      )\n   ]\n   int32 -1\n";
    let calls = notify_calls(text);
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!((call.replaces, call.urgency), (7, Some(2)));
    assert_eq!(call.summary, "CRITICAL p@1.0.0 read SSH private keys");
    assert_eq!(call.body, "file: /h/.ssh/id_rsa\nrotate: the key");
    assert_eq!(call.actions, ["default", "Details"]);
    assert!((call.time - 1796494188.451991).abs() < 1e-6);
}
