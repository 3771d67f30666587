use std::collections::BTreeMap;

use super::*;
use crate::event::{Exit, Fork, Root};

/// Drives an engine over the default rules with hand-written events.
struct Run {
    engine: Engine,
    time_ns: u64,
    alerts: Vec<Alert>,
}

impl Run {
    fn new() -> Run {
        let rules = RuleSet::defaults().unwrap();
        Run {
            engine: Engine::new(rules, EngineOptions { host_name: "box".into() }),
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
        self.send(pid, EventData::Exit(Exit { code: 0 }))
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

    fn take(&mut self) -> Vec<Alert> {
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
    .open(302, "/home/alice/.aws/credentials");
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
    assert_eq!(alert.rule.id, "ssh-keys");
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
    let paths: Vec<String> = run.take().into_iter().map(|a| a.file.unwrap().path).collect();
    assert_eq!(paths, ["/root/.npmrc", "/home/alice/.npmrc", "/tmp/xyz/home/.ssh/id_ed25519"]);
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

#[test]
fn same_rule_pid_and_file_alert_once() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["node", "x.js"], POSTINSTALL);
    run.open(101, "/home/alice/.aws/credentials").open(101, "/home/alice/.aws/credentials");
    run.open(101, "/home/alice/.aws/config");
    run.spawn(102, 101, &["cat", "/home/alice/.aws/credentials"], &[]).open(102, "/home/alice/.aws/credentials");
    let alerts = run.take();
    let seen: Vec<(u32, &str)> =
        alerts.iter().map(|a| (a.process.pid, a.file.as_ref().unwrap().path.as_str())).collect();
    assert_eq!(
        seen,
        [
            (101, "/home/alice/.aws/credentials"),
            (101, "/home/alice/.aws/config"),
            (102, "/home/alice/.aws/credentials")
        ]
    );
    assert_eq!(run.engine.stats().alerts, 3);
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
    assert_eq!((alert.rule.id.as_str(), alert.rule.severity), ("ssh-keys", Severity::Low));

    // The same ssh run by package code is not git under the manager.
    run.spawn(120, 100, &["sh", "-c", "ssh x"], POSTINSTALL)
        .fork(120, 121)
        .exec_full(121, 120, "/usr/bin/ssh", &["ssh", "x"], "/tmp", &[])
        .open(121, "/home/alice/.ssh/id_ed25519");
    assert_eq!(run.one().rule.severity, Severity::Critical);

    // `npm whoami` from a postinstall is a nested manager: reported, low.
    run.spawn(130, 120, &["npm", "whoami"], POSTINSTALL).open(130, "/home/alice/.npmrc");
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
        .open(503, "/home/alice/.vault-token");
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
fn live_tree_describes_members_escaped() {
    let mut run = Run::new();
    run.exec(100, 1, &["npm", "install"], &[]).spawn(101, 100, &["node", "-e", "a\x1b[2Jb"], &[]);
    assert_eq!(run.engine.live_tree(100), [(100, "npm install".to_owned()), (101, "node -e a\\u{1b}[2Jb".to_owned())]);
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
