//! Issue 27, point 6: the `.deb` under a real systemd. A debootstrapped Debian (made once by
//! `cargo xtask test`: target/nspawn/root) boots with systemd as PID 1 under `systemd-nspawn -b`,
//! on an overlay of the test's own (the cached root is never written), with a bpffs of its own
//! and the host's tracefs. The package is installed, enabled, reloaded, hung, upgraded and purged
//! there by the real dpkg and systemctl. Run as root with `cargo xtask test`.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use credwatch_e2e::{
    credwatch_binary, parse_alerts, servers::HttpsReceiver, slow, succeeding, Sandbox, FAKE_CREDENTIALS, FAKE_MANAGER,
};
use serde_json::Value;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The watchdog of the test's drop-in: the shipped unit's 60 s would cost CI a minute of waiting
/// for the same mechanism (measured by hand with it: the kill came 60.0 s after SIGSTOP).
const WATCHDOG: Duration = Duration::from_secs(10);

/// The unit's `RestartSec=`.
const RESTART_SEC: Duration = Duration::from_secs(5);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ lives in the workspace").to_path_buf()
}

/// A container's systemd mounts no tracefs (it lacks CAP_SYS_RAWIO), and systemd-nspawn's own
/// sysfs mounts cover a `--bind` under `/sys/kernel`: the host's tracefs is bound elsewhere and
/// this unit (the one the service `Wants=`) mounts it in place.
const TRACING_MOUNT: &str = "[Unit]
Description=Kernel Trace File System (the host's, bound in by systemd-nspawn)
DefaultDependencies=no
Before=sysinit.target

[Mount]
What=/run/host-tracefs
Where=/sys/kernel/tracing
Type=none
Options=bind,ro
";

fn write(path: &Path, text: &str, mode: u32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A booted container: systemd-nspawn, and what it runs on. Dropping it powers it off (SIGTERM to
/// systemd-nspawn, SIGKILL past 30 s) and unmounts the overlay and the bpffs, whatever the test
/// did: the bpffs going takes the pinned programs with it.
struct Container {
    nspawn: Child,
    /// The container's PID 1, as the host sees it.
    leader: u32,
    name: String,
    /// The container's `/`, seen from the host.
    root: PathBuf,
    bpffs: PathBuf,
    console: PathBuf,
}

impl Container {
    /// Mounts an overlay of the cached root and a bpffs in `dir`, lets `prepare` write into the
    /// root, boots it and waits until systemd says the system is up.
    fn boot(dir: &Path, prepare: impl FnOnce(&Path)) -> Container {
        let lower = workspace().join("target/nspawn/root");
        assert!(
            lower.join("sbin/init").exists(),
            "{} is missing: `cargo xtask test` (or `cargo xtask nspawn-root`) debootstraps it",
            lower.display()
        );
        let [upper, work, root, bpffs] = ["upper", "work", "root", "bpffs"].map(|name| dir.join(name));
        for folder in [&upper, &work, &root, &bpffs] {
            fs::create_dir_all(folder).unwrap();
        }
        let options = format!("lowerdir={},upperdir={},workdir={}", lower.display(), upper.display(), work.display());
        succeeding(
            "mounting the overlay",
            Command::new("mount").args(["-t", "overlay", "overlay", "-o", &options]).arg(&root),
        );
        if !Command::new("mount").args(["-t", "bpf", "bpf"]).arg(&bpffs).status().unwrap().success() {
            let _ = Command::new("umount").arg(&root).status();
            panic!("mounting a bpffs on {}", bpffs.display());
        }
        let name = format!("credwatch-e2e-{}", std::process::id());
        let console = dir.join("console.log");
        let mut command = Command::new("systemd-nspawn");
        command
            .args(["--boot", "--directory"])
            .arg(&root)
            .args(["--machine", &name])
            // No systemd on the host to register with or to make a scope: the container stays in
            // the test's cgroup.
            .args(["--register=no", "--keep-unit"])
            // bpf(2) and perf_event_open(2) are outside nspawn's seccomp allow-list; CAP_BPF and
            // CAP_PERFMON outside its capability set (the unit's bounding set asks for them).
            .args(["--system-call-filter=bpf perf_event_open", "--capability=CAP_BPF,CAP_PERFMON"])
            .arg(format!("--bind={}:/sys/fs/bpf", bpffs.display()))
            .arg("--bind-ro=/sys/kernel/tracing:/run/host-tracefs")
            .arg("--console=read-only")
            .stdin(Stdio::null())
            .stdout(fs::File::create(&console).unwrap())
            .stderr(fs::File::create(dir.join("nspawn.log")).unwrap());
        prepare(&root);
        let nspawn = command.spawn().expect("starting systemd-nspawn");
        let mut container = Container { nspawn, leader: 0, name, root, bpffs, console };
        let start = Instant::now();
        container.leader = loop {
            let id = container.nspawn.id();
            let children = fs::read_to_string(format!("/proc/{id}/task/{id}/children")).unwrap_or_default();
            let init = children
                .split_whitespace()
                .filter_map(|pid| pid.parse::<u32>().ok())
                .find(|pid| fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "systemd"));
            if let Some(init) = init {
                break init;
            }
            assert!(container.nspawn.try_wait().unwrap().is_none(), "systemd-nspawn exited\n{}", container.said());
            assert!(
                start.elapsed() < slow(Duration::from_secs(60)),
                "no systemd in the container\n{}",
                container.said()
            );
            thread::sleep(Duration::from_millis(20));
        };
        loop {
            let state = container.sh("systemctl is-system-running");
            let state = String::from_utf8_lossy(&state.stdout).trim().to_owned();
            // degraded: a unit of the minimal system failed; not ours to judge.
            if state == "running" || state == "degraded" {
                break;
            }
            assert!(container.nspawn.try_wait().unwrap().is_none(), "systemd-nspawn exited\n{}", container.said());
            assert!(
                start.elapsed() < slow(Duration::from_secs(120)),
                "the container's systemd is still {state:?}\n{}",
                container.said()
            );
            thread::sleep(Duration::from_millis(100));
        }
        container
    }

    /// `sh -c SCRIPT` in the container: all its namespaces, root, a clean environment.
    fn sh(&self, script: &str) -> Output {
        Command::new("nsenter")
            .args(["--target", &self.leader.to_string(), "--all"])
            .args(["env", "-i", "PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"])
            .args(["sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .expect("running nsenter")
    }

    /// [`Container::sh`] that must succeed; its standard output.
    #[track_caller]
    fn run(&self, script: &str) -> String {
        let output = self.sh(script);
        assert!(
            output.status.success(),
            "`{script}` in the container failed ({}):\n{}{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            self.said()
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `systemctl show -p PROPERTY --value credwatch`.
    fn property(&self, property: &str) -> String {
        self.run(&format!("systemctl show -p {property} --value credwatch.service")).trim().to_owned()
    }

    fn journal(&self) -> String {
        self.run("journalctl -u credwatch.service --no-pager -o short-precise")
    }

    /// The unit's state and journal, for a failure's message.
    fn said(&self) -> String {
        let show = self.sh("systemctl status --no-pager credwatch.service; journalctl -u credwatch.service --no-pager");
        format!(
            "--- credwatch.service ---\n{}{}\n--- systemd-nspawn ---\n{}\n--- console (tail) ---\n{}",
            String::from_utf8_lossy(&show.stdout),
            String::from_utf8_lossy(&show.stderr),
            fs::read_to_string(self.console.with_file_name("nspawn.log")).unwrap_or_default(),
            {
                let console = fs::read_to_string(&self.console).unwrap_or_default();
                let lines: Vec<&str> = console.lines().collect();
                lines[lines.len().saturating_sub(30)..].join("\n")
            }
        )
    }

    /// The alerts in a file of the container.
    fn alerts(&self, file: &str) -> Vec<Value> {
        parse_alerts(&fs::read_to_string(self.root.join(file.trim_start_matches('/'))).unwrap_or_default())
    }

    /// Polls until `file` holds an alert that `wanted` accepts.
    #[track_caller]
    fn wait_for_alert(&self, file: &str, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            if let Some(alert) = self.alerts(file).into_iter().find(&wanted) {
                return alert;
            }
            assert!(start.elapsed() < slow(Duration::from_secs(30)), "no alert {what} in {file}\n{}", self.said());
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls until `done` holds of the unit's `MainPID`, `ActiveState` and `NRestarts`.
    #[track_caller]
    fn wait_for_unit(&self, what: &str, timeout: Duration, done: impl Fn(u32, &str, u32) -> bool) {
        let start = Instant::now();
        loop {
            let shown = self.run("systemctl show -p MainPID,ActiveState,NRestarts credwatch.service");
            let value = |key: &str| {
                shown.lines().find_map(|line| line.strip_prefix(key)?.strip_prefix('=')).unwrap_or_default().to_owned()
            };
            let (pid, state, restarts) =
                (value("MainPID").parse().unwrap_or(0), value("ActiveState"), value("NRestarts").parse().unwrap_or(0));
            if done(pid, &state, restarts) {
                return;
            }
            assert!(start.elapsed() < slow(timeout), "{what}: not within {timeout:?}\n{shown}\n{}", self.said());
            thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.nspawn.id().to_string()]).status();
        let start = Instant::now();
        while self.nspawn.try_wait().ok().flatten().is_none() {
            if start.elapsed() > Duration::from_secs(30) {
                let _ = self.nspawn.kill();
                let _ = self.nspawn.wait();
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
        for mount in [&self.root, &self.bpffs] {
            if !Command::new("umount").arg(mount).status().is_ok_and(|s| s.success()) {
                let _ = Command::new("umount").arg("--lazy").arg(mount).status();
            }
        }
        // systemd-nspawn leaves its propagation folder when no systemd runs on the host.
        let _ = fs::remove_dir(Path::new("/run/systemd/nspawn/propagate").join(&self.name));
    }
}

/// How long each step took, printed at the end (CI's budget).
struct Steps(Vec<(&'static str, Duration)>, Instant);

impl Steps {
    fn done(&mut self, step: &'static str) {
        self.0.push((step, self.1.elapsed()));
        self.1 = Instant::now();
    }
}

/// The built `.deb` repacked as a later version: the same files and scripts, so that the
/// upgrade's mechanics (conffiles, scripts, the restart) are what is tested, without a second
/// build of the agent (which a build from an older tag would cost CI: several minutes).
fn repack_as_upgrade(deb: &Path, dir: &Path) -> (PathBuf, String) {
    let version = format!("{VERSION}+upgrade1");
    let tree = dir.join("upgrade");
    succeeding("dpkg-deb -R", Command::new("dpkg-deb").arg("-R").arg(deb).arg(&tree));
    let control = tree.join("DEBIAN/control");
    let text = fs::read_to_string(&control).unwrap();
    let bumped = text.replace(&format!("\nVersion: {VERSION}\n"), &format!("\nVersion: {version}\n"));
    assert_ne!(bumped, text, "no `Version: {VERSION}` in the package's control file:\n{text}");
    fs::write(&control, bumped).unwrap();
    let upgrade = dir.join(format!("credwatch_{version}_amd64.deb"));
    succeeding(
        "dpkg-deb --build",
        Command::new("dpkg-deb").args(["--root-owner-group", "-Zgzip", "-z1", "--build"]).arg(&tree).arg(&upgrade),
    );
    (upgrade, version)
}

/// The seconds of the adoption's gap that the agent `pid` logged ("... (1.2 s; the agent
/// before, ...").
fn adopted_gap(journal: &str, pid: u32) -> Option<f64> {
    let line = journal.lines().find(|line| {
        line.contains(&format!("credwatch[{pid}]:")) && line.contains("adopted the kernel programs pinned in")
    })?;
    let (_, after) = line.split_once(" to ")?;
    let (_, seconds) = after.split_once(" (")?;
    seconds.split_once(" s;")?.0.parse().ok()
}

#[test]
fn the_deb_under_a_booted_systemd_installs_alerts_reloads_survives_a_hang_upgrades_and_purges() {
    let sandbox = Sandbox::new();
    let mut steps = Steps(Vec::new(), Instant::now());

    // The package of the binary under test, made as `cargo xtask package` makes it.
    let built = Command::new(workspace().join("target/debug/xtask"))
        .args(["package", "--no-build"])
        .output()
        .expect("running target/debug/xtask (cargo xtask builds it)");
    assert!(built.status.success(), "xtask package --no-build: {}", String::from_utf8_lossy(&built.stderr));
    let deb = workspace().join(format!("target/credwatch_{VERSION}_amd64.deb"));
    let unpacked = sandbox.top().join("unpacked");
    succeeding("dpkg-deb -x", Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked));
    assert!(
        fs::read(unpacked.join("usr/bin/credwatch")).unwrap() == fs::read(credwatch_binary()).unwrap(),
        "the package's /usr/bin/credwatch is not the binary under test ({})",
        credwatch_binary().display()
    );
    let (upgrade, upgrade_version) = repack_as_upgrade(&deb, sandbox.top());
    steps.done("package, and its upgrade repacked");

    // The test's webhook receiver, down for now: alerts wait in the spool.
    let mut receiver = HttpsReceiver::start(&sandbox.top().join("receiver"));
    receiver.kill();

    let container = Container::boot(&sandbox.top().join("container"), |root| {
        write(&root.join("etc/systemd/system/sys-kernel-tracing.mount"), TRACING_MOUNT, 0o644);
        write(
            &root.join("etc/systemd/system/credwatch.service.d/watchdog.conf"),
            &format!("[Service]\nWatchdogSec={}s\n", WATCHDOG.as_secs()),
            0o644,
        );
        write(&root.join("usr/local/bin/npm"), FAKE_MANAGER, 0o755);
        for (relative, text) in FAKE_CREDENTIALS {
            write(&root.join("root").join(relative), text, 0o600);
        }
        for package in [&deb, &upgrade] {
            fs::copy(package, root.join("root").join(package.file_name().unwrap())).unwrap();
        }
        fs::copy(&receiver.ca_file, root.join("root/e2e-ca.pem")).unwrap();
    });
    steps.done("boot (systemd-nspawn -b to is-system-running)");

    // Installed: nothing enabled or started.
    container.run(&format!("dpkg -i /root/credwatch_{VERSION}_amd64.deb"));
    assert_eq!(container.sh("systemctl is-enabled credwatch.service").stdout, b"disabled\n");
    assert_eq!(container.property("ActiveState"), "inactive");
    assert!(container.run("getent group credwatch").starts_with("credwatch:"));
    steps.done("dpkg -i");

    // `enable --now`: Type=notify, so systemctl returns once the agent said READY=1.
    container.run("systemctl enable --now credwatch.service");
    assert_eq!(container.property("ActiveState"), "active", "{}", container.said());
    assert_eq!(container.property("SubState"), "running");
    let first_pid: u32 = container.property("MainPID").parse().unwrap();
    let journal = container.journal();
    let watching = journal.find("watching package trees").unwrap_or_else(|| panic!("{}", container.said()));
    let started = journal.find("Started credwatch.service").unwrap_or_else(|| panic!("{}", container.said()));
    assert!(watching < started, "systemd called it started before the agent was watching\n{journal}");
    assert!(container.bpffs.join("credwatch/EVENTS").exists(), "nothing pinned in the container's bpffs");
    steps.done("systemctl enable --now (to READY=1)");

    // A package tree alerts into the configured outputs: the alerts file, the local alert log,
    // and the journal (`json: true`: standard output).
    container.run("npm boot-pkg 'cat \"$HOME/.ssh/id_ed25519\" > /dev/null'");
    let key = "/root/.ssh/id_ed25519";
    let is_boot_read = |a: &Value| a["package"]["name"] == "boot-pkg" && a["file"]["path"] == key;
    let alert = container.wait_for_alert("/var/log/credwatch/alerts.jsonl", "for boot-pkg's read", is_boot_read);
    assert_eq!(alert["rule"]["id"], "ssh-private-keys", "{alert:#}");
    assert_eq!(alert["package"]["lifecycle"], "postinstall", "{alert:#}");
    // The local alert log's lines are `{seq, alert}`.
    container
        .wait_for_alert("/var/lib/credwatch/alerts.jsonl", "for boot-pkg's read", |line| is_boot_read(&line["alert"]));
    let id = alert["event"]["id"].as_str().unwrap().to_owned();
    let journal = container.run("journalctl -u credwatch.service --no-pager -o cat");
    assert!(journal.contains(&id), "the alert {id} is not in the journal\n{journal}");
    assert!(journal.contains("sensor: "), "{journal}");
    // nspawn gives the container a PID namespace of its own, which the kernel programs do not
    // speak: the agent says so (docs/src/deployment.md, "Containers: what the agent needs").
    assert!(journal.contains("runs in a PID namespace of its own"), "{journal}");
    steps.done("a package tree's alert in both files and the journal");

    // `systemctl reload`: SIGHUP, the configuration and rules read again, the same process.
    // systemctl returns when `kill -HUP` did; the agent's RELOADING=1 and READY=1 come after.
    container.run("systemctl reload credwatch.service");
    let start = Instant::now();
    while !container.journal().contains("reloaded the configuration") {
        assert!(start.elapsed() < slow(Duration::from_secs(30)), "no reload in the journal\n{}", container.said());
        thread::sleep(Duration::from_millis(50));
    }
    container.wait_for_unit("active again after the reload", Duration::from_secs(30), |pid, state, restarts| {
        pid == first_pid && state == "active" && restarts == 0
    });
    steps.done("systemctl reload");

    // The changed conffile: a webhook output (its receiver down). Outputs change only at a
    // start (a reload refuses them, and says so): `systemctl restart`, which adopts the pins.
    let config = container.root.join("etc/credwatch/credwatch.yaml");
    let changed = fs::read_to_string(&config).unwrap()
        + &format!(
            "# Changed by the test: the upgrade keeps it.\noutputs:\n  - to: webhook:https://127.0.0.1:{}/alerts\n    ca_file: /root/e2e-ca.pem\n",
            receiver.port
        );
    fs::write(&config, &changed).unwrap();
    container.run("credwatch config check /etc/credwatch/credwatch.yaml");
    container.run("systemctl restart credwatch.service");
    assert_eq!(container.property("ActiveState"), "active", "{}", container.said());
    let restarted_pid: u32 = container.property("MainPID").parse().unwrap();
    assert_ne!(restarted_pid, first_pid, "systemctl restart kept the process");
    let journal = container.journal();
    assert!(adopted_gap(&journal, restarted_pid).is_some(), "the restart adopted no pins\n{journal}");
    steps.done("a changed configuration, systemctl restart");

    // Hung (SIGSTOP) while a package tree lives and reads a key: the watchdog kills the agent,
    // systemd restarts it, the new agent adopts the pins and reports what happened meanwhile.
    container.run(
        "setsid npm gap-pkg 'touch /root/gap-started; while [ ! -e /root/go-gap ]; do sleep 0.05; done; \
         cat \"$HOME/.aws/credentials\" > /dev/null; while [ ! -e /root/end-gap ]; do sleep 0.05; done' \
         </dev/null >/dev/null 2>&1 &",
    );
    let start = Instant::now();
    while !container.root.join("root/gap-started").exists() {
        assert!(start.elapsed() < slow(Duration::from_secs(30)), "gap-pkg never started");
        thread::sleep(Duration::from_millis(20));
    }
    container.run(&format!("kill -STOP {restarted_pid}"));
    let stopped = Instant::now();
    fs::write(container.root.join("root/go-gap"), "").unwrap();
    container.wait_for_unit("the watchdog's kill", WATCHDOG * 3, |pid, _, _| pid != restarted_pid);
    let killed = stopped.elapsed();
    container.wait_for_unit("the restart", WATCHDOG * 3, |pid, state, restarts| {
        pid != 0 && pid != restarted_pid && state == "active" && restarts == 1
    });
    let restarted = stopped.elapsed();
    let second_pid: u32 = container.property("MainPID").parse().unwrap();
    let journal = container.journal();
    assert!(journal.contains("Watchdog timeout"), "not the watchdog's kill\n{journal}");
    let gap = adopted_gap(&journal, second_pid).unwrap_or_else(|| panic!("the restart adopted no pins\n{journal}"));
    // The gap runs from the last drain before the SIGSTOP to the adoption, RestartSec= after the kill.
    assert!(gap >= RESTART_SEC.as_secs_f64(), "a gap of {gap} s, shorter than RestartSec=\n{journal}");
    let read = container.wait_for_alert("/var/log/credwatch/alerts.jsonl", "for gap-pkg's read", |a| {
        a["package"]["name"] == "gap-pkg" && a["file"]["path"] == "/root/.aws/credentials"
    });
    assert!(read["credwatch"]["gap"]["seconds"].as_f64().is_some(), "no gap on the read made meanwhile: {read:#}");
    // The gap itself is an alert (blind-spot-gap), naming the tree that lived through it.
    let blind = container.wait_for_alert("/var/log/credwatch/alerts.jsonl", "blind-spot-gap for gap-pkg", |a| {
        a["rule"]["id"] == "blind-spot-gap" && a["package"]["name"] == "gap-pkg"
    });
    assert_eq!(blind["rule"]["severity"], "high", "{blind:#}");
    let window = &blind["credwatch"]["blind_spot"];
    assert_eq!(window["cause"], "gap", "{blind:#}");
    assert_eq!(window["stopped"], false, "the agent was killed and restarted, not resumed: {blind:#}");
    assert!(window["seconds"].as_f64().is_some_and(|seconds| seconds >= RESTART_SEC.as_secs_f64()), "{blind:#}");
    fs::write(container.root.join("root/end-gap"), "").unwrap();
    steps.done("SIGSTOP: watchdog kill, restart, adoption, alerts");

    // A package's alert while the receiver is down waits in the spool.
    container.run("npm spool-pkg 'cat \"$HOME/.pypirc\" > /dev/null'");
    let spooled = container.wait_for_alert("/var/log/credwatch/alerts.jsonl", "for spool-pkg's read", |a| {
        a["package"]["name"] == "spool-pkg"
    });
    let spool = container.root.join("var/lib/credwatch/spool");
    let segments = || -> Vec<PathBuf> {
        let outputs = fs::read_dir(&spool).into_iter().flatten().flatten().map(|entry| entry.path());
        outputs
            .flat_map(|output| fs::read_dir(output).into_iter().flatten().flatten().map(|entry| entry.path()))
            .filter(|path| path.extension().is_some_and(|extension| extension == "seg"))
            .collect()
    };
    let start = Instant::now();
    while segments().is_empty() {
        assert!(start.elapsed() < slow(Duration::from_secs(30)), "nothing spooled in {}", spool.display());
        thread::sleep(Duration::from_millis(50));
    }
    steps.done("an alert spooled");

    // The upgrade: the changed conffile is kept, the new agent adopts the pins (a gap no longer
    // than the restart) and delivers what the old one spooled.
    let upgrading = Instant::now();
    container.run(&format!("dpkg -i /root/credwatch_{upgrade_version}_amd64.deb"));
    let upgrade_took = upgrading.elapsed();
    assert_eq!(container.run("dpkg-query -W -f '${Version}' credwatch"), upgrade_version);
    assert_eq!(fs::read_to_string(&config).unwrap(), changed, "the upgrade changed the configuration");
    assert!(!container.root.join("etc/credwatch/credwatch.yaml.dpkg-new").exists());
    assert_eq!(container.property("ActiveState"), "active", "{}", container.said());
    let third_pid: u32 = container.property("MainPID").parse().unwrap();
    assert_ne!(third_pid, second_pid, "the upgrade did not restart the agent");
    let journal = container.journal();
    let gap = adopted_gap(&journal, third_pid).unwrap_or_else(|| panic!("the upgrade adopted no pins\n{journal}"));
    assert!(gap <= upgrade_took.as_secs_f64(), "a gap of {gap} s in an upgrade of {upgrade_took:?}\n{journal}");
    receiver.run();
    let start = Instant::now();
    let spooled_id = spooled["event"]["id"].as_str().unwrap().to_owned();
    while !receiver
        .requests()
        .iter()
        .any(|request| request["body"].as_str().is_some_and(|body| body.contains(&spooled_id)))
    {
        assert!(
            start.elapsed() < slow(Duration::from_secs(60)),
            "the spooled alert never reached the receiver\n{}",
            container.said()
        );
        thread::sleep(Duration::from_millis(100));
    }
    while !segments().is_empty() {
        assert!(start.elapsed() < slow(Duration::from_secs(60)), "the spool kept {:?}", segments());
        thread::sleep(Duration::from_millis(50));
    }
    steps.done("upgrade, spool drained");

    // The purge leaves nothing: the test's drop-in is the administrator's, removed first.
    fs::remove_dir_all(container.root.join("etc/systemd/system/credwatch.service.d")).unwrap();
    container.run("dpkg --purge credwatch");
    let status = container.sh("dpkg-query -W -f '${Status}' credwatch");
    assert!(
        !status.status.success() || String::from_utf8_lossy(&status.stdout).contains("not-installed"),
        "still installed: {}",
        String::from_utf8_lossy(&status.stdout)
    );
    for path in [
        "usr/bin/credwatch",
        "lib/systemd/system/credwatch.service",
        "etc/systemd/system/multi-user.target.wants/credwatch.service",
        "etc/xdg/autostart/credwatch-notify.desktop",
        "usr/lib/systemd/user/credwatch-notify.service",
        "etc/credwatch",
        "usr/share/doc/credwatch",
        "var/lib/credwatch",
        "var/log/credwatch",
        "run/credwatch",
    ] {
        assert!(!container.root.join(path).exists(), "the purge left /{path}");
    }
    // The kernel's own files of every bpffs aside (with CONFIG_BPF_PRELOAD).
    let pins: Vec<_> = fs::read_dir(&container.bpffs)
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name())
        .filter(|name| name != "maps.debug" && name != "progs.debug")
        .collect();
    assert!(pins.is_empty(), "the purge left pins on the bpffs: {pins:?}");
    assert!(!container.sh("getent group credwatch").status.success(), "the purge left the group credwatch");
    assert!(!container.sh("getent passwd credwatch").status.success(), "a user credwatch exists");
    // (list-unit-files fails when it finds none.)
    let units = container
        .sh("systemctl list-units --all --no-legend 'credwatch*'; systemctl list-unit-files --no-legend 'credwatch*'");
    let units = String::from_utf8_lossy(&units.stdout);
    assert!(units.trim().is_empty(), "systemd still knows {units}");
    let agents = container.run("for comm in /proc/[0-9]*/comm; do cat \"$comm\"; done 2>/dev/null");
    assert!(!agents.lines().any(|comm| comm == "credwatch"), "a credwatch process runs after the purge");
    steps.done("dpkg --purge");

    let total: Duration = steps.0.iter().map(|(_, took)| *took).sum();
    println!("systemd under nspawn: watchdog kill {killed:.1?} after SIGSTOP ({WATCHDOG:?} watchdog), restarted after {restarted:.1?}; upgrade {upgrade_took:.1?}");
    for (step, took) in &steps.0 {
        println!("  {step:<60} {took:>8.1?}");
    }
    println!("  {:<60} {total:>8.1?}", "total");
}
