//! Privileged tests of the live sensor: the real kernel programs, loaded and attached (run as
//! root). Each test works in its own temp dir and never touches the real HOME.

use std::{
    fs,
    io::Write as _,
    os::unix::fs::{symlink, MetadataExt as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, Map, MapData},
    programs::links::PinnedLink,
    util::KernelVersion,
};
use credwatch::sensor::{
    doctor, lost_source,
    pins::{self, AgentState, Started, Stopped},
    Backend, MapSizes, Protection, Sensor, SensorError, SensorOptions,
};
use credwatch_common::{CredInode, InodeKey};
use credwatch_core::{
    event::{AgentGap, BlindCause, BlindSpot, Connect, Event, EventData, Lost, Open, Rename, Syscall},
    rules::{
        manager::{Manager, ModuleRoot, ScriptRoot},
        RuleSet,
    },
};

/// The tests share kernel tracepoints; one sensor at a time keeps their event streams apart.
static SERIAL: Mutex<()> = Mutex::new(());

/// The running kernel's version.
fn kernel() -> KernelVersion {
    KernelVersion::current().unwrap()
}

/// The backend under test: `CREDWATCH_E2E_SENSOR` (`tracepoint` or `fentry`; the kernel
/// matrix runs these tests once per backend that loads), else `auto`.
fn backend() -> Backend {
    match std::env::var("CREDWATCH_E2E_SENSOR").as_deref() {
        Ok("tracepoint") => Backend::Tracepoint,
        Ok("fentry") => Backend::Fentry,
        Ok("") | Err(_) => Backend::Auto,
        Ok(other) => panic!("CREDWATCH_E2E_SENSOR={other}: not tracepoint or fentry"),
    }
}

/// How much slower than this machine the tests run (`CREDWATCH_E2E_SLOW`, set by the kernel
/// matrix for its emulated guests): the factor of the waits that must outlast something.
fn slow() -> u32 {
    std::env::var("CREDWATCH_E2E_SLOW").ok().and_then(|factor| factor.parse().ok()).unwrap_or(1).max(1)
}

/// [`Sensor::start`] with the backend under test.
fn start(managers: &[Manager], auto_roots: bool) -> Result<Sensor, SensorError> {
    Sensor::start(
        managers,
        auto_roots,
        SensorOptions { backend: backend(), enforce: false, ..SensorOptions::default() },
    )
}

/// [`Sensor::start_pinned`] with the backend under test.
fn start_pinned(managers: &[Manager], dir: &Path) -> Result<(Sensor, Started), SensorError> {
    Sensor::start_pinned(
        managers,
        dir,
        SensorOptions { backend: backend(), enforce: false, ..SensorOptions::default() },
    )
}

const PYTHON: &str = "/usr/bin/python3";

/// What the helper does once released: opens in every way the sensor must resolve, then
/// double-forks a setsid'd grandchild that opens a file after its parent and the root exit.
/// Each way opens a file of its own: the kernel counts a second open of a file by the same
/// process within a second, whatever the path it was given, instead of reporting it.
const HELPER: &str = r#"
import ctypes, os, struct, sys, time
d = sys.argv[1]
os.chdir(d)
os.close(os.open("secret.txt", os.O_RDONLY))
sub = os.open("sub", os.O_RDONLY | os.O_DIRECTORY)
os.close(os.open("inner.txt", os.O_RDONLY, dir_fd=sub))
os.close(os.open("link.txt", os.O_RDONLY))
os.close(os.open(sys.argv[2], os.O_RDONLY))
os.close(os.open("/proc/version", os.O_RDONLY))
os.close(os.open("/proc/self/cwd/../" + os.path.basename(d) + "/via-proc.txt", os.O_RDONLY))
try:
    os.open("missing.txt", os.O_RDONLY)
except FileNotFoundError:
    pass
libc = ctypes.CDLL(None, use_errno=True)
how = ctypes.create_string_buffer(struct.pack("QQQ", os.O_RDONLY, 0, 0), 24)
fd = libc.syscall(437, -100, b"sub/../openat2.txt", how, 24)
assert fd >= 0, ctypes.get_errno()
os.close(fd)
child = os.fork()
if child == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(1)
        os.close(os.open(d + "/late.txt", os.O_RDONLY))
        os._exit(0)
    os._exit(0)
os.waitpid(child, 0)
"#;

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

/// Names on either side of what the kernel walk copies from a dentry's own read (shorter than
/// 32 bytes) and one that needs a read of its own.
const NAMED: [&str; 3] = [
    "thirty-one-bytes-aaaaaaaaaaaaaa",
    "thirty-two-bytes-aaaaaaaaaaaaaaa",
    "a-name-of-well-over-a-hundred-bytes-to-be-read-on-its-own-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.txt",
];

/// A temp dir with `secret.txt`, `late.txt`, `via-proc.txt`, `openat2.txt`, `sub/inner.txt`,
/// `link.txt -> sub/linked.txt` and `NAMED[0]/NAMED[1]/NAMED[2]`.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = fs::canonicalize(dir.path()).unwrap();
    fs::write(root.join("secret.txt"), "fake secret\n").unwrap();
    fs::write(root.join("late.txt"), "late\n").unwrap();
    fs::create_dir(root.join("sub")).unwrap();
    fs::write(root.join("sub/inner.txt"), "inner\n").unwrap();
    for other in ["via-proc.txt", "openat2.txt", "sub/linked.txt"] {
        fs::write(root.join(other), "other\n").unwrap();
    }
    symlink("sub/linked.txt", root.join("link.txt")).unwrap();
    fs::create_dir_all(root.join(NAMED[0]).join(NAMED[1])).unwrap();
    fs::write(root.join(NAMED.iter().collect::<PathBuf>()), "named\n").unwrap();
    Fixture { _dir: dir, root }
}

/// Polls until `done` holds for the events so far, or panics after a while.
fn collect(sensor: &mut Sensor, events: &mut Vec<Event>, done: impl Fn(&[Event]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done(events) {
        assert!(Instant::now() < deadline, "timed out; events so far: {events:#?}");
        sensor.poll(Duration::from_millis(100), events).unwrap();
    }
}

fn opens(events: &[Event]) -> impl Iterator<Item = (&Event, &Open)> {
    events.iter().filter_map(|e| match &e.data {
        EventData::Open(open) => Some((e, open)),
        _ => None,
    })
}

fn open_of<'a>(events: &'a [Event], pid: u32, given: &str) -> &'a Open {
    opens(events)
        .find(|(e, open)| e.pid == pid && open.path == given)
        .map(|(_, open)| open)
        .unwrap_or_else(|| panic!("no open of {given:?} by {pid} in {events:#?}"))
}

fn exited(events: &[Event], pid: u32) -> Option<&Event> {
    events.iter().find(|e| e.pid == pid && matches!(e.data, EventData::Exit(_)))
}

fn forks_of(events: &[Event], pid: u32) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::Fork(fork) if e.pid == pid => Some(fork.child_pid),
            _ => None,
        })
        .collect()
}

#[test]
fn marked_tree_opens_resolve_to_absolute_paths_and_lineage_survives_setsid() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fx = fixture();
    let mut sensor = start(&[], false).expect("sensor starts (run as root)");

    // The child waits on its stdin until it is marked, then becomes python.
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg("read go && exec \"$0\" -c \"$1\" \"$2\" \"$3\"")
        .args([PYTHON, HELPER, fx.root.to_str().unwrap()])
        .arg(fx.root.join(NAMED.iter().collect::<PathBuf>()))
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let root = child.id();
    sensor.mark_root(root).unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();

    // An unmarked process opening the same file: it must not show up.
    let unmarked = Command::new("/bin/cat").arg(fx.root.join("secret.txt")).stdout(Stdio::null()).spawn().unwrap();
    let unmarked_pid = unmarked.id();
    assert!(unmarked.wait_with_output().unwrap().status.success());

    let mut events = Vec::new();
    collect(&mut sensor, &mut events, |events| {
        let Some(&middle) = forks_of(events, root).first() else { return false };
        let Some(&grandchild) = forks_of(events, middle).first() else { return false };
        exited(events, root).is_some() && exited(events, grandchild).is_some()
    });
    assert!(child.wait().unwrap().success());

    let secret = fx.root.join("secret.txt").to_str().unwrap().to_owned();
    let inner = fx.root.join("sub/inner.txt").to_str().unwrap().to_owned();

    let exec = events
        .iter()
        .find_map(|e| match &e.data {
            // The shell's own exec may be reported too: spawn returns once the child's exec is
            // past the point of no return, possibly before its tracepoint ran.
            EventData::Exec(exec) if e.pid == root && exec.filename == PYTHON => Some(exec),
            _ => None,
        })
        .expect("the root's exec of python is reported");
    assert_eq!(exec.args[0], PYTHON);
    assert_eq!(exec.args[1], "-c");
    assert_eq!(exec.ppid, std::process::id());
    assert!(exec.executable.starts_with("/usr/bin/python3"), "{exec:?}");
    assert!(!exec.cwd.is_empty());

    let relative = open_of(&events, root, "secret.txt");
    assert_eq!(relative.syscall, "openat");
    assert_eq!(relative.dirfd, -100);
    assert_eq!(relative.abs_path.as_deref(), Some(secret.as_str()));
    let meta = fs::metadata(&secret).unwrap();
    assert_eq!((relative.dev, relative.ino), (meta.dev(), meta.ino()));

    let with_dirfd = open_of(&events, root, "inner.txt");
    assert!(with_dirfd.dirfd >= 0, "{with_dirfd:?}");
    assert_eq!(with_dirfd.abs_path.as_deref(), Some(inner.as_str()));

    let through_link = open_of(&events, root, "link.txt");
    assert_eq!(through_link.abs_path, Some(path(&fx.root.join("sub/linked.txt"))));

    let named = fx.root.join(NAMED.iter().collect::<PathBuf>()).to_str().unwrap().to_owned();
    assert_eq!(open_of(&events, root, &named).abs_path.as_deref(), Some(named.as_str()));
    // procfs is a mount of its own, on the root file system: the walk crosses it.
    assert_eq!(open_of(&events, root, "/proc/version").abs_path.as_deref(), Some("/proc/version"));

    let name = fx.root.file_name().unwrap().to_str().unwrap();
    let via_proc = open_of(&events, root, &format!("/proc/self/cwd/../{name}/via-proc.txt"));
    assert_eq!(via_proc.abs_path, Some(path(&fx.root.join("via-proc.txt"))));

    let openat2 = open_of(&events, root, "sub/../openat2.txt");
    assert_eq!(openat2.syscall, "openat2");
    assert_eq!(openat2.abs_path, Some(path(&fx.root.join("openat2.txt"))));

    let missing = open_of(&events, root, "missing.txt");
    assert_eq!((missing.ret, missing.abs_path.as_deref()), (-2, None));

    // Lineage: root -> middle (exits at once) -> setsid'd grandchild, still marked and
    // reporting after both its parent and the root are gone.
    let middle = forks_of(&events, root)[0];
    let grandchild = forks_of(&events, middle)[0];
    let late = opens(&events)
        .find(|(e, open)| e.pid == grandchild && open.path.ends_with("/late.txt"))
        .map(|(e, _)| e)
        .expect("the grandchild's late open is reported");
    assert!(late.time_ns > exited(&events, middle).unwrap().time_ns);
    assert!(late.time_ns > exited(&events, root).unwrap().time_ns);

    assert!(events.iter().all(|e| e.pid != unmarked_pid), "an unmarked process was reported");
    assert!(
        opens(&events).all(|(e, _)| [root, middle, grandchild].contains(&e.pid)),
        "only the marked tree is reported"
    );
    let stats = sensor.stats();
    assert_eq!((stats.lost, stats.marks_full, stats.malformed), (0, 0, 0));
    assert!(stats.events >= events.len() as u64);
}

/// A copy of /bin/sh under a manager's name, so that exec makes a root.
fn fake_manager(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    fs::copy("/bin/sh", &path).unwrap();
    path
}

#[test]
fn exec_of_a_manager_or_interpreter_module_or_script_makes_a_root() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fx = fixture();
    let module_dir = fx.root.join("py");
    fs::create_dir(&module_dir).unwrap();
    fs::write(module_dir.join("fakepip.py"), "open('secret.txt').close()\n").unwrap();
    // A release file run by its interpreter, after an option (`node --flag yarn-4.5.3.cjs`).
    let script = module_dir.join("fakeyarn-4.5.3.py");
    fs::write(&script, "open('secret.txt').close()\n").unwrap();
    let managers = vec![
        Manager { name: "fake".into(), execs: vec!["fakemgr".into()], ..Manager::default() },
        Manager {
            name: "fakepip".into(),
            execs: vec![],
            modules: vec![ModuleRoot {
                interpreters: vec!["python3".into()],
                args: vec!["-m".into(), "fakepip".into()],
            }],
            ..Manager::default()
        },
        Manager {
            name: "fakeyarn".into(),
            scripts: vec![ScriptRoot {
                interpreters: vec!["python3".into()],
                files: vec!["fakeyarn-*.py".into()],
                args: vec![],
            }],
            ..Manager::default()
        },
    ];
    let mut sensor = start(&managers, true).unwrap();

    let manager = fake_manager(&fx.root, "fakemgr");
    let status =
        Command::new(&manager).args(["-c", "cat secret.txt >/dev/null"]).current_dir(&fx.root).status().unwrap();
    assert!(status.success());
    // The same interpreter without the module is not a root.
    let plain = Command::new(PYTHON).args(["-c", "open('secret.txt').close()"]).current_dir(&fx.root).spawn().unwrap();
    let plain_pid = plain.id();
    assert!(plain.wait_with_output().unwrap().status.success());
    let module = Command::new(PYTHON)
        .args(["-m", "fakepip"])
        .env("PYTHONPATH", &module_dir)
        .current_dir(&fx.root)
        .spawn()
        .unwrap();
    let module_pid = module.id();
    assert!(module.wait_with_output().unwrap().status.success());
    let release = Command::new(PYTHON).arg("-B").arg(&script).current_dir(&fx.root).spawn().unwrap();
    let release_pid = release.id();
    assert!(release.wait_with_output().unwrap().status.success());

    let secret = fx.root.join("secret.txt").to_str().unwrap().to_owned();
    let mut events = Vec::new();
    collect(&mut sensor, &mut events, |events| exited(events, release_pid).is_some());

    let manager_exec = events
        .iter()
        .find(|e| matches!(&e.data, EventData::Exec(exec) if exec.filename == manager.to_str().unwrap()))
        .expect("the manager's own exec is reported");
    let cat = forks_of(&events, manager_exec.pid);
    assert_eq!(cat.len(), 1, "{events:#?}");
    assert_eq!(open_of(&events, cat[0], "secret.txt").abs_path.as_deref(), Some(secret.as_str()));
    assert_eq!(open_of(&events, module_pid, "secret.txt").abs_path.as_deref(), Some(secret.as_str()));
    assert_eq!(open_of(&events, release_pid, "secret.txt").abs_path.as_deref(), Some(secret.as_str()));
    assert!(events.iter().all(|e| e.pid != plain_pid), "python without -m fakepip was reported");
}

#[test]
fn seed_marks_trees_that_were_already_running() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fx = fixture();
    let manager = fake_manager(&fx.root, "seedmgr");
    // Already running before the sensor starts: the manager and its child, both waiting.
    let mut running = Command::new(&manager)
        .args(["-c", "sh -c 'read go; cat secret.txt >/dev/null'"])
        .current_dir(&fx.root)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let root = running.id();
    let deadline = Instant::now() + Duration::from_secs(5);
    // Wait until the child shell exists.
    let child = loop {
        let children = fs::read_to_string(format!("/proc/{root}/task/{root}/children")).unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next() {
            break pid.parse::<u32>().unwrap();
        }
        assert!(Instant::now() < deadline, "the manager's child did not start");
        std::thread::sleep(Duration::from_millis(10));
    };
    let managers = vec![Manager { name: "seed".into(), execs: vec!["seedmgr".into()], ..Manager::default() }];
    let mut sensor = start(&managers, false).unwrap();
    let seeded = sensor.seed(&managers).unwrap();
    let pids: Vec<u32> = seeded.iter().map(|e| e.pid).collect();
    assert_eq!(pids, [root, child], "parents first, nothing else: {seeded:#?}");
    assert!(seeded.iter().all(|e| matches!(&e.data, EventData::Exec(exec) if exec.seeded)));

    running.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(running.wait().unwrap().success());
    let secret = fx.root.join("secret.txt").to_str().unwrap().to_owned();
    let mut events = Vec::new();
    collect(&mut sensor, &mut events, |events| exited(events, root).is_some());
    let cat = forks_of(&events, child);
    assert_eq!(cat.len(), 1, "{events:#?}");
    assert_eq!(open_of(&events, cat[0], "secret.txt").abs_path.as_deref(), Some(secret.as_str()));
}

#[test]
fn doctor_finds_what_this_kernel_offers() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Starting a sensor mounts tracefs when the machine booted without it.
    drop(start(&[], false).unwrap());
    let auto =
        Sensor::start(&[], false, SensorOptions { backend: Backend::Auto, enforce: false, ..SensorOptions::default() })
            .unwrap();
    let (auto_backend, auto_unwatched) = (auto.backend(), auto.unwatched().to_vec());
    drop(auto);
    let report = doctor();
    assert!(report.btf);
    assert_eq!(report.offsets, Ok(()));
    assert!(report.tracefs);
    let loads = |name: &str| report.programs.iter().any(|(n, probe)| *n == name && *probe == Ok(true));
    assert!(loads("tracepoint") && loads("raw_tracepoint"), "{report}");
    assert_eq!(report.ring_buffer, Ok(true));
    // What `auto` picks is what really loads: fentry where its program verifies.
    let picked = if report.fentry.is_ok() { "fentry" } else { "tracepoints" };
    assert_eq!(report.sensor, Some(picked), "{report}");
    // ... and what `auto` runs.
    assert_eq!(report.fentry.is_ok(), auto_backend == Backend::Fentry, "{report}");
    if backend() == Backend::Fentry {
        assert_eq!(report.fentry, Ok(()), "{report}");
        assert_eq!(report.unwatched, auto_unwatched, "{report}");
        for unwatched in &report.unwatched {
            assert!(report.to_string().contains(&format!("fentry: not watched: {}: ", unwatched.syscall)), "{report}");
        }
    }
    let text = report.to_string();
    assert!(text.contains(&report.kernel_release) && text.contains(&format!("sensor:           {picked}")), "{text}");
    assert!(text.contains("fentry backend:") && text.contains("BPF LSM active:"), "{text}");
}

/// `--sensor fentry` where fentry programs do not load (this CI host: EPERM) is an error that
/// says why, and `auto` then runs the tracepoints, saying why; where they load, both run fentry.
#[test]
fn auto_picks_fentry_where_it_loads_and_falls_back_to_tracepoints() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let options = |backend| SensorOptions { backend, enforce: false, ..SensorOptions::default() };
    let auto = Sensor::start(&[], false, options(Backend::Auto)).unwrap();
    let (auto_backend, fallback) = (auto.backend(), auto.fallback().map(str::to_owned));
    drop(auto);
    let forced = Sensor::start(&[], false, options(Backend::Fentry));
    match forced {
        Ok(sensor) => {
            assert_eq!(sensor.backend(), Backend::Fentry);
            assert_eq!((auto_backend, fallback), (Backend::Fentry, None));
        }
        Err(error) => {
            // The first program loaded alone is the probe: the same error each time.
            let error = error.to_string();
            assert!(
                error.starts_with("the fentry backend cannot run here: program `fexit_tamper` on __x64_sys_"),
                "{error}"
            );
            assert_eq!(auto_backend, Backend::Tracepoint);
            let why = fallback.expect("auto says why it fell back");
            assert!(error.ends_with(&why), "{error} / {why}");
        }
    }
    let tracepoint = Sensor::start(&[], false, options(Backend::Tracepoint)).unwrap();
    assert_eq!((tracepoint.backend(), tracepoint.lsm(), tracepoint.fallback()), (Backend::Tracepoint, false, None));
}

/// Rules for a throwaway home: `~/.ssh/**` is a `kill` rule, `~/.npmrc` an alert rule.
const RULES: &str = r#"schema: 1
rules:
  - id: test-ssh
    name: ssh
    description: ssh keys
    category: ssh
    severity: critical
    action: kill
    targets: ["~/.ssh/**"]
    samples:
      positive:
        - exec: {pid: 100, args: [npm, install], cwd: /home/alice/app}
        - open: {pid: 100, path: /home/alice/.ssh/id_rsa}
      negative:
        - exec: {pid: 100, args: [npm, install], cwd: /home/alice/app}
        - open: {pid: 100, path: /home/alice/app/x}
  - id: test-bpf
    name: bpf
    description: bpf by package code
    category: tamper
    severity: critical
    action: kill
    syscalls:
      names: [bpf]
    samples:
      positive:
        - exec: {pid: 100, args: [npm, install], cwd: /home/alice/app}
        - syscall: {pid: 100, name: bpf, operation: BPF_PROG_LOAD, ret: -1}
      negative:
        - exec: {pid: 100, args: [npm, install], cwd: /home/alice/app}
        - syscall: {pid: 100, name: ptrace, operation: PTRACE_TRACEME, ret: 0}
  - id: test-npmrc
    name: npmrc
    description: npm token
    category: registry
    severity: high
    targets: ["~/.npmrc"]
    samples:
      positive:
        - exec: {pid: 100, args: [npm, install], cwd: /home/alice/app}
        - open: {pid: 100, path: /home/alice/.npmrc}
      negative:
        - exec: {pid: 100, args: [npm, install], cwd: /home/alice/app}
        - open: {pid: 100, path: /home/alice/app/x}
"#;

const SECRET: &str = "FAKE-PRIVATE-KEY-do-not-use";

/// A throwaway home with fake keys, a work dir beside it, and the test rules.
struct Home {
    _dir: tempfile::TempDir,
    home: PathBuf,
    work: PathBuf,
    rules: RuleSet,
}

fn home() -> Home {
    home_in(tempfile::tempdir().unwrap())
}

fn home_in(dir: tempfile::TempDir) -> Home {
    let root = fs::canonicalize(dir.path()).unwrap();
    let home = root.join("home");
    let work = root.join("work");
    fs::create_dir_all(home.join(".ssh")).unwrap();
    fs::create_dir_all(&work).unwrap();
    fs::write(home.join(".ssh/id_rsa"), format!("{SECRET}\n")).unwrap();
    fs::write(home.join(".ssh/id_ed25519"), format!("{SECRET}-2\n")).unwrap();
    fs::write(home.join(".npmrc"), "//registry.npmjs.org/:_authToken=fake\n").unwrap();
    let rules_dir = root.join("rules");
    fs::create_dir(&rules_dir).unwrap();
    fs::write(rules_dir.join("test.yaml"), RULES).unwrap();
    let rules = RuleSet::load_dir(&rules_dir).unwrap();
    Home { _dir: dir, home, work, rules }
}

fn protected_sensor(h: &Home, enforce: bool) -> Sensor {
    sized_sensor(h, enforce, &[])
}

/// [`protected_sensor`] with kernel maps of the `sizes` given (`NAME=ENTRIES`).
fn sized_sensor(h: &Home, enforce: bool, sizes: &[&str]) -> Sensor {
    let mut map_sizes = MapSizes::default();
    for size in sizes {
        map_sizes.merge(size.parse().unwrap());
    }
    let options = SensorOptions { backend: backend(), enforce, map_sizes };
    let mut sensor = Sensor::start(&[], false, options).expect("sensor starts (run as root)");
    sensor.protect(Protection { rules: h.rules.clone().into(), homes: vec![h.home.clone()], enforce }).unwrap();
    assert_eq!(sensor.stats().credential_files, 3, "id_rsa, id_ed25519, .npmrc");
    sensor
}

/// `program args...`, marked as a root before it execs.
fn spawn_marked(sensor: &mut Sensor, program: &str, args: &[&str]) -> std::process::Child {
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg("read go && exec \"$@\"")
        .arg("sh")
        .arg(program)
        .args(args)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    sensor.mark_root(child.id()).unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    child
}

fn python_marked(sensor: &mut Sensor, script: &str, args: &[&str]) -> std::process::Child {
    let mut all = vec!["-c", script];
    all.extend_from_slice(args);
    spawn_marked(sensor, PYTHON, &all)
}

fn renames(events: &[Event]) -> Vec<&Rename> {
    events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::Rename(rename) => Some(rename),
            _ => None,
        })
        .collect()
}

fn syscalls(events: &[Event]) -> Vec<(u32, &Syscall)> {
    events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::Syscall(syscall) => Some((e.pid, syscall)),
            _ => None,
        })
        .collect()
}

fn lost(events: &[Event], source: &str) -> u64 {
    events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::Lost(Lost { source: s, count }) if s == source => Some(*count),
            _ => None,
        })
        .sum()
}

fn path(p: &Path) -> String {
    p.to_str().unwrap().to_owned()
}

const INODE_HELPER: &str = r#"
import ctypes, os, sys
home, work = sys.argv[1], sys.argv[2]
key = home + "/.ssh/id_rsa"
os.link(key, work + "/hard")
os.close(os.open(work + "/hard", os.O_RDONLY))
os.rename(home + "/.ssh/id_ed25519", work + "/moved")
os.close(os.open(work + "/moved", os.O_RDONLY))
libc = ctypes.CDLL(None, use_errno=True)
class Handle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int), ("f_handle", ctypes.c_ubyte * 128)]
handle = Handle()
handle.handle_bytes = 128
mount_id = ctypes.c_int()
# id_rsa now has two names and a handle opens either: use a file with one.
npmrc = home + "/.npmrc"
assert libc.name_to_handle_at(-100, npmrc.encode(), ctypes.byref(handle), ctypes.byref(mount_id), 0) == 0, ctypes.get_errno()
mount_fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
fd = libc.open_by_handle_at(mount_fd, ctypes.byref(handle), os.O_RDONLY)
assert fd >= 0, ctypes.get_errno()
os.close(fd)
os.chdir(work)
with open("planted", "w") as f:
    f.write("ssh-ed25519 AAAA attacker\n")
ssh = os.open(home + "/.ssh", os.O_RDONLY | os.O_DIRECTORY)
os.rename("planted", "authorized_keys", dst_dir_fd=ssh)
"#;

#[test]
fn credential_inodes_catch_hardlinks_renamed_keys_and_handles_and_renames_are_absolute() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = home();
    let mut sensor = protected_sensor(&h, false);
    let key = path(&h.home.join(".ssh/id_rsa"));
    let ed25519 = path(&h.home.join(".ssh/id_ed25519"));
    let mut child = python_marked(&mut sensor, INODE_HELPER, &[&path(&h.home), &path(&h.work)]);
    let root = child.id();
    let mut events = Vec::new();
    collect(&mut sensor, &mut events, |events| exited(events, root).is_some());
    assert!(child.wait().unwrap().success());

    let hard = open_of(&events, root, &path(&h.work.join("hard")));
    assert_eq!(hard.same_file_as.as_deref(), Some(key.as_str()), "hardlink");
    assert_eq!(hard.abs_path.as_deref(), Some(path(&h.work.join("hard")).as_str()));
    assert!(!hard.blocked, "no --enforce, no block");
    let moved = open_of(&events, root, &path(&h.work.join("moved")));
    assert_eq!(moved.same_file_as.as_deref(), Some(ed25519.as_str()), "renamed key");

    let by_handle = opens(&events)
        .map(|(_, open)| open)
        .find(|open| open.syscall == "open_by_handle_at")
        .expect("open_by_handle_at is reported");
    let npmrc = path(&h.home.join(".npmrc"));
    assert_eq!(by_handle.abs_path.as_deref(), Some(npmrc.as_str()));
    assert_eq!(by_handle.same_file_as.as_deref(), Some(npmrc.as_str()));
    assert!(by_handle.ret >= 0);

    let renames = renames(&events);
    let link = renames.iter().find(|r| r.syscall.starts_with("link")).expect("link reported");
    assert_eq!(link.old_abs.as_deref(), Some(key.as_str()));
    assert_eq!(link.new_abs.as_deref(), Some(path(&h.work.join("hard")).as_str()));
    assert_eq!(link.ret, 0);
    let away = renames.iter().find(|r| r.old_path == ed25519).expect("rename of the key reported");
    assert_eq!(away.new_abs.as_deref(), Some(path(&h.work.join("moved")).as_str()));
    let planted = renames.iter().find(|r| r.old_path == "planted").expect("relative rename reported");
    assert_eq!(planted.syscall, "renameat");
    assert_eq!(planted.new_path, "authorized_keys");
    assert_eq!(planted.old_abs.as_deref(), Some(path(&h.work.join("planted")).as_str()));
    assert_eq!(planted.new_abs.as_deref(), Some(path(&h.home.join(".ssh/authorized_keys")).as_str()));
    assert_eq!(sensor.stats().priority_lost, 0);
}

const TAMPER_HELPER: &str = r#"
import ctypes, os, subprocess, sys
sys_bpf, sys_io_uring_setup, agent = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
target = subprocess.Popen(["sleep", "30"])
assert libc.ptrace(16, target.pid, None, None) == 0, ctypes.get_errno()
os.waitpid(target.pid, 0)
libc.ptrace(17, target.pid, None, None)
libc.process_vm_readv(target.pid, None, 0, None, 0, 0)
assert libc.syscall(sys_bpf, 5, None, 0) < 0
params = ctypes.create_string_buffer(120)
fd = libc.syscall(sys_io_uring_setup, 4, params)
assert fd >= 0, ctypes.get_errno()
os.close(fd)
os.kill(agent, 0)
target.kill()
target.wait()
"#;

#[test]
fn tamper_syscalls_of_marked_processes_are_reported() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut sensor = start(&[], false).unwrap();
    let agent = std::process::id();
    let args = [libc::SYS_bpf.to_string(), libc::SYS_io_uring_setup.to_string(), agent.to_string()];
    let mut child = python_marked(&mut sensor, TAMPER_HELPER, &[&args[0], &args[1], &args[2]]);
    let root = child.id();
    let mut events = Vec::new();
    collect(&mut sensor, &mut events, |events| exited(events, root).is_some());
    assert!(child.wait().unwrap().success());
    let target = forks_of(&events, root);
    let calls = syscalls(&events);
    let find = |name: &str, operation: Option<&str>| {
        calls
            .iter()
            .find(|(pid, s)| *pid == root && s.name == name && s.operation.as_deref() == operation)
            .map(|(_, s)| *s)
            .unwrap_or_else(|| panic!("no {name} {operation:?} in {calls:#?}"))
    };
    let attach = find("ptrace", Some("PTRACE_ATTACH"));
    assert_eq!(attach.ret, Some(0));
    assert!(target.contains(&attach.target_pid.unwrap()), "{attach:?} not one of {target:?}");
    find("ptrace", Some("PTRACE_DETACH"));
    let readv = find("process_vm_readv", None);
    assert_eq!(readv.target_pid, attach.target_pid);
    let bpf = find("bpf", Some("BPF_PROG_LOAD"));
    assert!(bpf.ret.unwrap() < 0 && !bpf.blocked);
    assert!(find("io_uring_setup", None).ret.unwrap() >= 0);
    let signal = find("kill", Some("0"));
    assert_eq!((signal.target_pid, signal.ret), (Some(agent), Some(0)));
    // kill(sleep, SIGKILL) is not aimed at the agent: not reported.
    assert!(calls.iter().all(|(_, s)| s.name != "kill" || s.target_pid == Some(agent)), "{calls:#?}");
}

const COPY_PAYLOAD: &str = r#"
import sys
key, out = sys.argv[1], sys.argv[2]
with open(out, "w") as copy:
    copy.write("started\n")
    copy.flush()
    with open(key) as f:
        copy.write(f.read())
"#;

const BPF_PAYLOAD: &str = r#"
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall(int(sys.argv[1]), 5, None, 0)
open(sys.argv[2], "w").write("survived\n")
"#;

/// Runs the copy payload and the bpf payload, with or without `--enforce`.
fn run_payloads(enforce: bool) -> (Home, Vec<Event>, [std::process::ExitStatus; 2], bool) {
    let h = home();
    let mut sensor = protected_sensor(&h, enforce);
    let lsm = sensor.lsm();
    let key = path(&h.home.join(".ssh/id_rsa"));
    let copy = path(&h.work.join("copy"));
    let survived = path(&h.work.join("survived"));
    let mut copier = python_marked(&mut sensor, COPY_PAYLOAD, &[&key, &copy]);
    let mut bpf = python_marked(&mut sensor, BPF_PAYLOAD, &[&libc::SYS_bpf.to_string(), &survived]);
    let (copier_pid, bpf_pid) = (copier.id(), bpf.id());
    let mut events = Vec::new();
    collect(&mut sensor, &mut events, |events| {
        exited(events, copier_pid).is_some() && exited(events, bpf_pid).is_some()
    });
    let statuses = [copier.wait().unwrap(), bpf.wait().unwrap()];
    (h, events, statuses, lsm)
}

#[test]
fn enforce_kills_before_the_secret_is_read_and_blocks_tamper_syscalls() {
    use std::os::unix::process::ExitStatusExt as _;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (h, events, [copier, bpf], lsm) = run_payloads(true);
    let key = path(&h.home.join(".ssh/id_rsa"));
    if lsm {
        return refused_by_the_lsm(&h, &events, [copier, bpf]);
    }
    assert_eq!(copier.signal(), Some(libc::SIGKILL), "the copier is killed");
    let copied = fs::read_to_string(h.work.join("copy")).unwrap();
    assert_eq!(copied, "started\n", "the payload ran, but the secret never reached it");
    let open = opens(&events).map(|(_, o)| o).find(|o| o.path == key).expect("the blocked open is reported");
    assert!(open.blocked && open.ret >= 0, "{open:?}");
    assert_eq!(open.same_file_as.as_deref(), Some(key.as_str()));

    assert_eq!(bpf.signal(), Some(libc::SIGKILL), "the bpf() caller is killed");
    assert!(!h.work.join("survived").exists());
    let calls = syscalls(&events);
    let (_, blocked) = calls.iter().find(|(_, s)| s.name == "bpf").expect("bpf reported");
    assert!(blocked.blocked && blocked.ret.is_none(), "{blocked:?}");
}

/// `--enforce` with the BPF LSM hooks (the fentry backend where `bpf` is an active LSM): the
/// open of the key and the bpf() call fail with EPERM, and both payloads live.
fn refused_by_the_lsm(h: &Home, events: &[Event], [copier, bpf]: [std::process::ExitStatus; 2]) {
    use std::os::unix::process::ExitStatusExt as _;
    let key = path(&h.home.join(".ssh/id_rsa"));
    // Python's PermissionError ends the copier with status 1, not a signal.
    assert_eq!((copier.signal(), copier.code()), (None, Some(1)), "the copier lives");
    assert_eq!(fs::read_to_string(h.work.join("copy")).unwrap(), "started\n");
    let open = opens(events).map(|(_, o)| o).find(|o| o.path == key).expect("the refused open is reported");
    assert!(open.denied && !open.blocked && open.ret == -i64::from(libc::EPERM), "{open:?}");
    assert_eq!((open.abs_path.as_deref(), open.same_file_as.as_deref()), (Some(key.as_str()), Some(key.as_str())));

    assert!(bpf.success(), "the bpf() caller lives");
    assert!(h.work.join("survived").exists());
    let calls = syscalls(events);
    let (_, denied) = calls.iter().find(|(_, s)| s.name == "bpf").expect("bpf reported");
    assert!(denied.denied && !denied.blocked && denied.ret == Some(-i64::from(libc::EPERM)), "{denied:?}");
}

#[test]
fn without_enforce_the_same_payloads_survive() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (h, events, [copier, bpf], _) = run_payloads(false);
    let key = path(&h.home.join(".ssh/id_rsa"));
    assert!(copier.success() && bpf.success());
    assert!(fs::read_to_string(h.work.join("copy")).unwrap().contains(SECRET));
    assert!(h.work.join("survived").exists());
    let open = opens(&events).map(|(_, o)| o).find(|o| o.path == key).unwrap();
    assert!(!open.blocked);
    assert_eq!(open.same_file_as.as_deref(), Some(key.as_str()));
    assert!(syscalls(&events).iter().all(|(_, s)| !s.blocked));
}

/// Compiles a C helper into `dir`.
fn compile(dir: &Path, name: &str, source: &str) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    fs::write(&c, source).unwrap();
    let binary = dir.join(name);
    let status = Command::new("cc").arg("-O2").arg("-o").arg(&binary).arg(&c).status().unwrap();
    assert!(status.success(), "compiling {name}");
    binary
}

/// Opens argv[1] with an io_uring IORING_OP_OPENAT and reads it: no open syscall at all.
const URING_OPEN: &str = r#"
#include <fcntl.h>
#include <linux/io_uring.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(int argc, char **argv) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    int ring = syscall(__NR_io_uring_setup, 4, &p);
    if (ring < 0) return 2;
    char *sq = mmap(0, p.sq_off.array + p.sq_entries * sizeof(unsigned), PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_SQ_RING);
    char *cq = mmap(0, p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe), PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_CQ_RING);
    struct io_uring_sqe *sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                                     MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_SQES);
    if (sq == MAP_FAILED || cq == MAP_FAILED || sqes == MAP_FAILED) return 3;
    unsigned *tail = (unsigned *)(sq + p.sq_off.tail);
    unsigned index = *tail & *(unsigned *)(sq + p.sq_off.ring_mask);
    memset(&sqes[index], 0, sizeof sqes[index]);
    sqes[index].opcode = IORING_OP_OPENAT;
    sqes[index].fd = AT_FDCWD;
    sqes[index].addr = (unsigned long)argv[1];
    sqes[index].open_flags = O_RDONLY;
    ((unsigned *)(sq + p.sq_off.array))[index] = index;
    __atomic_store_n(tail, *tail + 1, __ATOMIC_RELEASE);
    if (syscall(__NR_io_uring_enter, ring, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) != 1) return 4;
    unsigned head = *(unsigned *)(cq + p.cq_off.head) & *(unsigned *)(cq + p.cq_off.ring_mask);
    int fd = ((struct io_uring_cqe *)(cq + p.cq_off.cqes))[head].res;
    char buf[64];
    if (fd < 0 || read(fd, buf, sizeof buf) <= 0) return 5;
    return 0;
}
"#;

#[test]
fn io_uring_openat_is_reported_by_its_opcode() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = home();
    let binary = compile(&h.work, "uring", URING_OPEN);
    let mut sensor = start(&[], false).unwrap();
    let key = path(&h.home.join(".ssh/id_rsa"));
    let mut child = spawn_marked(&mut sensor, binary.to_str().unwrap(), &[&key]);
    let root = child.id();
    let mut events = Vec::new();
    collect(&mut sensor, &mut events, |events| exited(events, root).is_some());
    assert!(child.wait().unwrap().success(), "the io_uring open worked");
    let calls = syscalls(&events);
    assert!(calls.iter().any(|(pid, s)| *pid == root && s.name == "io_uring_setup"), "{calls:#?}");
    assert!(
        calls.iter().any(|(pid, s)| *pid == root
            && s.name == "io_uring_submit_req"
            && s.operation.as_deref() == Some("IORING_OP_OPENAT")),
        "{calls:#?}"
    );
    // Why the submission matters: the open itself passes no syscall tracepoint.
    assert!(opens(&events).all(|(_, open)| open.path != key));
}

const FLOOD: &str = r#"
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long n = atol(argv[1]);
    char buf[64];
    for (long i = 0; i < n; i++) {
        // A failed open has no file to be counted by as a repeat: each one is a record.
        int fd = open("/nonexistent/flood", O_RDONLY);
        if (fd >= 0) close(fd);
        if (i == n / 2) {
            int key = open(argv[2], O_RDONLY);
            if (key < 0 || read(key, buf, sizeof buf) <= 0) return 1;
            close(key);
        }
    }
    return 0;
}
"#;

#[test]
fn a_flood_of_bulk_opens_does_not_push_out_the_key_record() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = home();
    let binary = compile(&h.work, "flood", FLOOD);
    let mut sensor = protected_sensor(&h, false);
    let key = path(&h.home.join(".ssh/id_rsa"));
    // The agent does not read while the flood runs: the bulk buffer overflows for sure.
    let mut child = spawn_marked(&mut sensor, binary.to_str().unwrap(), &["1000000", &key]);
    assert!(child.wait().unwrap().success());
    let root = child.id();
    let mut events = Vec::new();
    collect(&mut sensor, &mut events, |events| {
        opens(events).any(|(_, o)| o.path == key) && lost(events, lost_source::EVENTS) > 0
    });
    let open = open_of(&events, root, &key);
    assert_eq!(open.same_file_as.as_deref(), Some(key.as_str()));
    let stats = sensor.stats();
    // Every one of the million opens was either received or counted lost.
    assert!(stats.lost > 0 && stats.events + stats.lost >= 1_000_000, "bulk losses are counted: {stats:?}");
    assert_eq!(stats.priority_lost, 0);
    assert_eq!(lost(&events, lost_source::PRIORITY), 0);
}

/// Repeats of one act, in a child that does nothing else (so that its exit's count is theirs
/// alone: the loader's opens in the parent may repeat): `opens PATH N KEY` opens PATH N times
/// (half, a pause longer than the kernel's repeat window, half) then reads KEY; `connects N`
/// connects a UDP socket to 127.0.0.1:9 N times (no packet is sent); `tainted KEY` connects
/// there, reads KEY, and connects there twice more.
const REPEATER: &str = r#"
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static void opens(const char *path, long n) {
    for (long i = 0; i < n; i++) {
        int fd = open(path, O_RDONLY);
        if (fd < 0) exit(2);
        close(fd);
    }
}
static void read_key(const char *path) {
    char buf[64];
    int fd = open(path, O_RDONLY);
    if (fd < 0 || read(fd, buf, sizeof buf) <= 0) exit(3);
    close(fd);
}
static void connect_to_discard(int s) {
    struct sockaddr_in to;
    memset(&to, 0, sizeof to);
    to.sin_family = AF_INET;
    to.sin_port = htons(9);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(s, (struct sockaddr *)&to, sizeof to) != 0) exit(4);
}
static int act(char **argv) {
    if (!strcmp(argv[1], "opens")) {
        long n = atol(argv[3]);
        struct timespec pause = {1, 300000000};
        opens(argv[2], n / 2);
        nanosleep(&pause, NULL);
        opens(argv[2], n - n / 2);
        read_key(argv[4]);
        return 0;
    }
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0) return 5;
    if (!strcmp(argv[1], "connects")) {
        for (long i = atol(argv[2]); i > 0; i--) connect_to_discard(s);
        return 0;
    }
    connect_to_discard(s);
    read_key(argv[2]);
    connect_to_discard(s);
    connect_to_discard(s);
    return 0;
}
int main(int argc, char **argv) {
    int status;
    pid_t child = fork();
    if (child == 0) _exit(act(argv));
    if (child < 0 || waitpid(child, &status, 0) != child) return 6;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 7;
}
"#;

/// The one child of `root` (the repeater's), once it has exited.
fn repeater_child(events: &[Event], root: u32) -> Option<u32> {
    let child = *forks_of(events, root).first()?;
    exited(events, child).map(|_| child)
}

/// The `repeats` of the exit record of `pid`.
fn exit_repeats(events: &[Event], pid: u32) -> u64 {
    match exited(events, pid).map(|e| &e.data) {
        Some(EventData::Exit(exit)) => exit.repeats,
        other => panic!("no exit of {pid}: {other:?}"),
    }
}

fn connects_of(events: &[Event], pid: u32) -> Vec<&Connect> {
    events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::Connect(connect) if e.pid == pid => Some(connect),
            _ => None,
        })
        .collect()
}

/// Issue 27: 60,000 opens of `.npmrc` filled the priority ring while the agent did not read,
/// and the key read after them was lost. Counted in the kernel, they cost a record per second
/// of the loop, every open is accounted for, and the key's record arrives.
#[test]
fn repeated_opens_of_one_file_are_counted_and_the_key_read_after_them_arrives() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = home();
    let binary = compile(&h.work, "repeater", REPEATER);
    let mut sensor = protected_sensor(&h, false);
    let npmrc = path(&h.home.join(".npmrc"));
    let key = path(&h.home.join(".ssh/id_ed25519"));
    let started = Instant::now();
    // The agent does not read while the loop runs: 60,000 records would overflow the priority
    // ring (about 2,500 of them).
    let mut child = spawn_marked(&mut sensor, binary.to_str().unwrap(), &["opens", &npmrc, "60000", &key]);
    assert!(child.wait().unwrap().success());
    let seconds = started.elapsed().as_secs();
    let mut events = Vec::new();
    collect(&mut sensor, &mut events, |events| repeater_child(events, child.id()).is_some());
    let root = repeater_child(&events, child.id()).unwrap();

    let mut records: Vec<(&Event, &Open)> = opens(&events).filter(|(e, o)| e.pid == root && o.path == npmrc).collect();
    records.sort_by_key(|(e, _)| e.time_ns);
    let records: Vec<&Open> = records.into_iter().map(|(_, o)| o).collect();
    let counted: u64 = records.iter().map(|o| o.repeats).sum::<u64>() + exit_repeats(&events, root);
    assert_eq!(records.len() as u64 + counted, 60_000, "every open is a record or counted: {records:#?}");
    // One record per window at most, and the one after the pause carries the first half's.
    assert!(records.len() >= 2 && records.len() as u64 <= seconds + 3, "{} records in {seconds} s", records.len());
    assert_eq!(records[0].repeats, 0, "the first open is sent as it is");
    assert!(records[1..].iter().any(|o| o.repeats > 0), "{records:#?}");
    assert!(records.iter().all(|o| o.same_file_as.as_deref() == Some(npmrc.as_str())));
    let read = open_of(&events, root, &key);
    assert_eq!(read.same_file_as.as_deref(), Some(key.as_str()));
    let stats = sensor.stats();
    assert_eq!((stats.lost, stats.priority_lost), (0, 0), "nothing lost: {stats:?}");
    assert!(!events.iter().any(|e| matches!(e.data, EventData::Lost(_) | EventData::BlindSpot(_))), "{events:#?}");
}

#[test]
fn repeated_connects_to_one_address_are_counted() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = home();
    let binary = compile(&h.work, "repeater", REPEATER);
    let mut sensor = protected_sensor(&h, false);
    let mut child = spawn_marked(&mut sensor, binary.to_str().unwrap(), &["connects", "10000"]);
    assert!(child.wait().unwrap().success());
    let mut events = Vec::new();
    collect(&mut sensor, &mut events, |events| repeater_child(events, child.id()).is_some());
    let root = repeater_child(&events, child.id()).unwrap();
    let records = connects_of(&events, root);
    assert!(!records.is_empty() && records.len() < 100, "{} records of 10,000 connects", records.len());
    assert!(records.iter().all(|c| (c.address.as_deref(), c.port) == (Some("127.0.0.1"), Some(9))), "{records:#?}");
    let counted: u64 = records.iter().map(|c| c.repeats).sum::<u64>() + exit_repeats(&events, root);
    assert_eq!(records.len() as u64 + counted, 10_000, "every connect is a record or counted");
    let stats = sensor.stats();
    assert_eq!((stats.lost, stats.priority_lost), (0, 0), "nothing lost: {stats:?}");
}

/// "Connect to X, read a key, connect to X again": the second connect is news (the tree has
/// touched a credential since), the third is not.
#[test]
fn a_connect_after_a_credential_read_is_not_a_repeat() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = home();
    let binary = compile(&h.work, "repeater", REPEATER);
    let mut sensor = protected_sensor(&h, false);
    let key = path(&h.home.join(".ssh/id_rsa"));
    let mut child = spawn_marked(&mut sensor, binary.to_str().unwrap(), &["tainted", &key]);
    assert!(child.wait().unwrap().success());
    let mut events = Vec::new();
    collect(&mut sensor, &mut events, |events| repeater_child(events, child.id()).is_some());
    let root = repeater_child(&events, child.id()).unwrap();
    let records = connects_of(&events, root);
    assert_eq!(records.len(), 2, "{records:#?}");
    assert_eq!((records[0].repeats, records[1].repeats), (0, 0));
    // The rings are read priority first: the times tell the order.
    let mut connected: Vec<u64> =
        events.iter().filter(|e| e.pid == root && matches!(e.data, EventData::Connect(_))).map(|e| e.time_ns).collect();
    connected.sort();
    let read = events.iter().find(|e| matches!(&e.data, EventData::Open(o) if o.path == key)).unwrap().time_ns;
    assert!(connected[0] < read && read < connected[1], "the key's read comes between the two connects");
    assert_eq!(exit_repeats(&events, root), 1, "the third connect is counted");
}

/// A rules directory of [`RULES`] whose kill rule spares `cat` in a chain from the manager.
fn kill_rules_sparing_cat(dir: &Path) -> PathBuf {
    fs::create_dir(dir).unwrap();
    let spared = RULES.replacen(
        "    action: kill\n",
        "    action: kill\n    actors:\n      - execs: [cat]\n        via_manager: true\n        verdict: low\n",
        1,
    );
    fs::write(dir.join("test.yaml"), spared).unwrap();
    dir.to_path_buf()
}

#[test]
fn enforce_spares_a_kill_rules_actor_only_in_a_chain_from_the_manager() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = home();
    // `cat` is the actor, spared when the manager itself started it.
    let rules_dir = kill_rules_sparing_cat(&h.work.join("spare-rules"));
    let rules = RuleSet::load_dir(&rules_dir).unwrap();
    let managers = vec![Manager { name: "fake".into(), execs: vec!["sparemgr".into()], ..Manager::default() }];
    let mut sensor = start(&managers, true).unwrap();
    sensor.protect(Protection { rules: rules.into(), homes: vec![h.home.clone()], enforce: true }).unwrap();

    let manager = fake_manager(&h.work, "sparemgr");
    let key = path(&h.home.join(".ssh/id_rsa"));
    let (direct, nested) = (h.work.join("direct"), h.work.join("nested"));
    // The manager runs cat itself (spared), then a shell that runs cat (package code: killed).
    let script = format!("cat {key} > {}; sh -c 'cat {key} > {}; true'; true", path(&direct), path(&nested));
    // The shell reports the killed cat on stderr: expected.
    let status = Command::new(&manager).args(["-c", &script]).stderr(Stdio::null()).status().unwrap();
    assert!(status.success());
    let mut events = Vec::new();
    let root = |events: &[Event]| {
        events.iter().find_map(|e| match &e.data {
            EventData::Exec(exec) if exec.filename == manager.to_str().unwrap() => Some(e.pid),
            _ => None,
        })
    };
    collect(&mut sensor, &mut events, |events| root(events).is_some_and(|pid| exited(events, pid).is_some()));
    assert!(fs::read_to_string(&direct).unwrap().contains(SECRET), "the manager's own cat is spared");
    assert_eq!(fs::read_to_string(&nested).unwrap(), "", "cat under package code is killed");
    let key_opens: Vec<&Open> = opens(&events).map(|(_, o)| o).filter(|o| o.path == key).collect();
    assert_eq!(key_opens.len(), 2, "{events:#?}");
    assert_eq!(key_opens.iter().filter(|o| o.blocked).count(), 1, "{key_opens:#?}");
}

/// Replaces every BPF link and perf event fd of this process with /dev/null: the programs
/// are detached, as if someone had closed them.
fn detach_all_programs() -> usize {
    let null = fs::File::open("/dev/null").unwrap();
    let mut detached = 0;
    for entry in fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(target) = fs::read_link(entry.path()) else { continue };
        let target = target.to_string_lossy();
        if target == "anon_inode:bpf_link" || target == "anon_inode:[perf_event]" {
            let fd: i32 = entry.file_name().to_str().unwrap().parse().unwrap();
            // SAFETY: dup2 onto an fd the sensor owns; it closes the /dev/null copy later.
            assert!(unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), fd) } >= 0);
            detached += 1;
        }
    }
    detached
}

#[test]
fn detached_programs_are_noticed() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut sensor = start(&[], false).unwrap();
    // A first canary comes back: nothing is reported.
    let mut events = Vec::new();
    let quiet_until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < quiet_until {
        sensor.poll(Duration::from_millis(200), &mut events).unwrap();
    }
    assert_eq!(lost(&events, lost_source::DETACHED), 0, "{events:#?}");
    assert!(detach_all_programs() > 0);
    collect(&mut sensor, &mut events, |events| lost(events, lost_source::DETACHED) > 0);
    assert_eq!(sensor.stats().detached, 1);
}

/// An idle sensor sleeps in one poll for as long as it is told, and the first record after it
/// caught up wakes it at once (the kernel's adaptive wakeup), as does its waker (the signals'
/// socket of `watch` and `run`).
#[test]
fn an_idle_poll_sleeps_until_a_record_or_the_waker() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut sensor = start(&[], false).unwrap();
    let (waker, signals) = std::os::unix::net::UnixStream::pair().unwrap();
    sensor.wake_on(waker).unwrap();
    // The shell execs at once; `sleep` exits half a second later, when the sensor is asleep.
    let script = format!("sleep {}; exit 0", 0.5 * f64::from(slow()));
    let mut child = spawn_marked(&mut sensor, "/bin/sh", &["-c", &script]);
    let root = child.id();
    let mut events = Vec::new();
    let settle = Instant::now() + Duration::from_millis(200) * slow();
    while Instant::now() < settle {
        sensor.poll(Duration::from_millis(50), &mut events).unwrap();
    }
    let sleeper = *forks_of(&events, root).first().expect("the shell forked sleep");
    assert!(exited(&events, sleeper).is_none(), "sleep has not exited yet");
    let asleep = Instant::now();
    while exited(&events, sleeper).is_none() {
        sensor.poll(Duration::from_secs(30), &mut events).unwrap();
        assert!(asleep.elapsed() < Duration::from_secs(5) * slow(), "the record did not wake the poll: {events:#?}");
    }
    assert!(child.wait().unwrap().success());
    collect(&mut sensor, &mut events, |events| exited(events, root).is_some());

    // Nothing left to read: only the waker ends the wait.
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        (&signals).write_all(&[1]).unwrap();
        signals
    });
    let asleep = Instant::now();
    let mut more = Vec::new();
    sensor.poll(Duration::from_secs(30), &mut more).unwrap();
    let slept = asleep.elapsed();
    assert!(
        slept >= Duration::from_millis(250) && slept < Duration::from_secs(5) * slow(),
        "woken after {slept:?}: {more:#?}"
    );
    assert!(more.is_empty(), "{more:#?}");
    drop(writer.join().unwrap());
}

/// The credential table follows the directories of its targets by inotify: a key made in a
/// new directory under a recursive target, and a file removed, change it within seconds, not
/// at the next full rescan (a minute).
#[test]
fn the_credential_table_follows_its_directories_by_inotify() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = home();
    let mut sensor = protected_sensor(&h, false);
    let mut events = Vec::new();
    let mut until_files = |sensor: &mut Sensor, expected: u64| {
        let start = Instant::now();
        while sensor.stats().credential_files != expected {
            let files = sensor.stats().credential_files;
            assert!(start.elapsed() < Duration::from_secs(5), "{files} credential files, not {expected}");
            sensor.poll(Duration::from_millis(100), &mut events).unwrap();
        }
    };
    fs::create_dir(h.home.join(".ssh/deploy")).unwrap();
    fs::write(h.home.join(".ssh/deploy/id_deploy"), format!("{SECRET}-3\n")).unwrap();
    // The directory and the key in it.
    until_files(&mut sensor, 5);
    fs::remove_file(h.home.join(".npmrc")).unwrap();
    until_files(&mut sensor, 4);
    fs::write(h.home.join(".ssh/deploy/id_other"), format!("{SECRET}-4\n")).unwrap();
    until_files(&mut sensor, 5);
}

/// A small ext4 file system of the test's own, loop-mounted: like the ext4, xfs and btrfs of
/// real homes, it gives a deleted file's inode number to the next file made (tmpfs, the kernel
/// matrix's /tmp, never reuses one).
struct Ext4 {
    dir: tempfile::TempDir,
}

impl Ext4 {
    fn mount() -> Ext4 {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.ext4");
        fs::File::create(&image).unwrap().set_len(32 << 20).unwrap();
        fs::create_dir(dir.path().join("mnt")).unwrap();
        // orphan_file: 5.10 mounts such a file system read-only.
        let mkfs = Command::new("mkfs.ext4").args(["-q", "-F", "-O", "^orphan_file"]).arg(&image).status().unwrap();
        assert!(mkfs.success(), "mkfs.ext4: {mkfs}");
        let mount =
            Command::new("mount").args(["-o", "loop"]).arg(&image).arg(dir.path().join("mnt")).status().unwrap();
        assert!(mount.success(), "mount -o loop: {mount}");
        Ext4 { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.root()).status();
    }
}

/// A file that gets the inode number of a deleted credential file before the table's next
/// scan is not that file: the kernel compares the inode's generation with the one the agent
/// read, so under `--enforce` its opener is neither killed nor refused, and no `same_file_as`
/// names the deleted key.
#[test]
fn a_file_reusing_a_deleted_credential_files_inode_number_is_not_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ext4 = Ext4::mount();
    let h = home_in(tempfile::tempdir_in(ext4.root()).unwrap());
    let mut sensor = protected_sensor(&h, true);
    let key = h.home.join(".ssh/id_rsa");
    let ino = fs::metadata(&key).unwrap().ino();
    fs::remove_file(&key).unwrap();
    // No poll until the opener has exited: no rescan, so the kernel's map still holds the
    // key's (dev, ino), with its `kill` rule.
    let reused = (0..4000)
        .map(|n| h.work.join(format!("file-{n}")))
        .find(|file| {
            fs::write(file, "not a key\n").unwrap();
            fs::metadata(file).unwrap().ino() == ino
        })
        .expect("ext4 gives the deleted key's inode number to a new file");
    let mut child = python_marked(&mut sensor, "import sys; open(sys.argv[1]).read()", &[&path(&reused)]);
    let status = child.wait().unwrap();
    let pid = child.id();
    let mut events = Vec::new();
    collect(&mut sensor, &mut events, |events| exited(events, pid).is_some());
    assert!(status.success(), "the opener lives: {status:?}");
    let open = open_of(&events, pid, &path(&reused));
    assert_eq!((open.ino, open.ret >= 0), (ino, true), "{open:?}");
    assert!(!open.blocked && !open.denied && open.same_file_as.is_none(), "{open:?}");
}

/// A credential file rewritten by a rename over it (a temp file, then `rename`: how editors and
/// agents save) is a new inode: the table follows it, so that a hardlink of the new file names
/// it, and forgets the old inode, so that a name the old one kept no longer does.
#[test]
fn a_credential_file_replaced_by_a_rename_over_it_is_followed_to_its_new_inode() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = home();
    let mut sensor = protected_sensor(&h, false);
    let npmrc = h.home.join(".npmrc");
    let (old, new) = (h.work.join("old"), h.work.join("new"));
    fs::hard_link(&npmrc, &old).unwrap();
    fs::write(h.home.join(".npmrc.tmp"), "//registry.npmjs.org/:_authToken=rotated\n").unwrap();
    fs::rename(h.home.join(".npmrc.tmp"), &npmrc).unwrap();
    fs::hard_link(&npmrc, &new).unwrap();
    // The new inode first: once it is matched, the rescan that dropped the old one came before
    // the old one's open. Each name is opened by a process of its own: `new` and `.npmrc` are
    // one file, which one process opening twice within a second is reported opening once.
    let opener = "import os, sys\nfor name in sys.argv[1:]:\n    if os.fork() == 0:\n        open(name).read()\n        os._exit(0)\n    os.wait()";
    let deadline = Instant::now() + Duration::from_secs(10) * slow();
    loop {
        let mut child = python_marked(&mut sensor, opener, &[&path(&new), &path(&npmrc), &path(&old)]);
        let pid = child.id();
        let mut events = Vec::new();
        collect(&mut sensor, &mut events, |events| exited(events, pid).is_some());
        assert!(child.wait().unwrap().success());
        let same_file_as = |file: &Path| {
            let given = path(file);
            let opened = opens(&events).find(|(e, o)| e.pid != pid && o.path == given);
            opened.unwrap_or_else(|| panic!("no open of {given}: {events:#?}")).1.same_file_as.clone()
        };
        if same_file_as(&new).is_some() {
            assert_eq!(same_file_as(&new), Some(path(&npmrc)), "the new inode");
            assert_eq!(same_file_as(&npmrc), Some(path(&npmrc)));
            assert_eq!(same_file_as(&old), None, "the old inode, by a name it kept");
            break;
        }
        assert!(Instant::now() < deadline, "the table never followed .npmrc to its new inode");
    }
}

/// An open already inside the kernel when its process is marked had no entry program run for
/// it: it is still reported. The tracepoint backend knows it by the file it opened (no given
/// path; flags from the file); the fentry backend's exit program reads the syscall's arguments
/// itself (without `--enforce`, it has no entry program), so the open is whole.
#[test]
fn an_open_in_flight_when_the_process_is_marked_is_reported() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let f = fixture();
    let fifo = f.root.join("fifo");
    let fifo_c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo_c.as_ptr(), 0o600) }, 0);
    let mut sensor = start(&[], false).expect("sensor starts (run as root)");
    // A reader's open of a FIFO blocks in the kernel until a writer comes.
    let mut child = Command::new("cat").arg(&fifo).stdout(Stdio::null()).spawn().unwrap();
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fs::read_to_string(format!("/proc/{pid}/syscall"))
        .unwrap_or_default()
        .starts_with(&format!("{} ", libc::SYS_openat))
    {
        assert!(Instant::now() < deadline, "cat never blocked in openat");
        std::thread::sleep(Duration::from_millis(10));
    }
    sensor.mark_root(pid).unwrap();
    drop(fs::OpenOptions::new().write(true).open(&fifo).unwrap());
    assert!(child.wait().unwrap().success());
    let fifo_path = path(&fifo);
    let mut events = Vec::new();
    collect(&mut sensor, &mut events, |events| {
        opens(events).any(|(e, o)| e.pid == pid && o.abs_path.as_deref() == Some(fifo_path.as_str()))
    });
    let (_, open) = opens(&events).find(|(e, o)| e.pid == pid && o.abs_path.is_some()).unwrap();
    let given = match sensor.backend() {
        Backend::Fentry => fifo_path.as_str(),
        _ => "",
    };
    assert_eq!(open.path, given, "given path, {} backend: {open:?}", sensor.backend());
    assert_eq!(open.flags & libc::O_ACCMODE as u64, libc::O_RDONLY as u64, "{open:?}");
    assert!(open.ret >= 0 && open.ino == fs::metadata(&fifo).unwrap().ino(), "{open:?}");
}

/// A pin directory of a test, stopped (detached, removed) however the test ends.
struct PinDir(PathBuf);

impl PinDir {
    fn new(name: &str) -> PinDir {
        PinDir(PathBuf::from(format!("/sys/fs/bpf/credwatch-sensor-{name}-{}", std::process::id())))
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = pins::stop(&self.0);
    }
}

/// The link ids of the programs attached through the set pinned in `dir`.
fn pinned_link_ids(dir: &Path) -> Vec<u32> {
    let mut ids: Vec<u32> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.file_name().unwrap().to_string_lossy().starts_with("link_"))
        .map(|path| aya::programs::links::FdLink::from(PinnedLink::from_pin(&path).unwrap()).info().unwrap().id())
        .collect();
    ids.sort();
    ids
}

fn attached_link_ids() -> Vec<u32> {
    aya::programs::loaded_links().filter_map(Result::ok).map(|link| link.id()).collect()
}

/// Before 5.15 tracepoint programs attach through perf events, which have no BPF link to pin.
fn tracepoint_links() -> bool {
    kernel() >= KernelVersion::new(5, 15, 0)
}

/// Where nothing can be pinned: `start_pinned` runs the sensor for this agent alone, says why,
/// and leaves no set to adopt.
fn assert_unpinned(managers: &[Manager], dir: &Path) {
    for _ in 0..2 {
        let (sensor, started) = start_pinned(managers, dir).unwrap();
        let Started::Unpinned(why) = started else { panic!("pinned before 5.15: {started:?}") };
        assert!(why.contains("before 5.15") && why.contains("detach when this agent exits"), "{why}");
        assert!(sensor.gauges().unwrap().read().programs_attached >= 3);
        assert!(!dir.exists());
        assert_eq!(sensor.finish().unwrap(), None);
    }
    assert_eq!(pins::stop(dir).unwrap(), Stopped::NothingPinned);
}

#[test]
fn a_pinned_set_is_adopted_by_the_same_build_and_replaced_when_from_another() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pin_dir = PinDir::new("replace");
    let dir = pin_dir.0.clone();
    let managers = RuleSet::defaults().unwrap().managers().to_vec();
    if tracepoint_links() {
        adopt_and_replace(&managers, &dir);
    } else {
        assert_unpinned(&managers, &dir);
    }

    // A directory of other pins (a mistyped --pin-dir) is neither replaced nor removed.
    let foreign = PathBuf::from(format!("/sys/fs/bpf/credwatch-sensor-test-{}-foreign", std::process::id()));
    fs::create_dir(&foreign).unwrap();
    Array::<MapData, u64>::create(1, 0).unwrap().pin(foreign.join("someone_elses")).unwrap();
    let refused = pins::stop(&foreign).unwrap_err().to_string();
    assert!(refused.contains("not a credwatch set"), "{refused}");
    let refused = start_pinned(&managers, &foreign).err().expect("refused").to_string();
    assert!(refused.contains("not a credwatch set"), "{refused}");
    assert!(foreign.join("someone_elses").exists());
    fs::remove_dir_all(&foreign).unwrap();
}

/// Pinned, adopted by the same build, replaced when from another, detached by `stop`.
fn adopt_and_replace(managers: &[Manager], dir: &Path) {
    let dir = dir.to_path_buf();
    let (sensor, started) = start_pinned(managers, &dir).unwrap();
    assert_eq!(started, Started::Fresh);
    let first = pinned_link_ids(&dir);
    assert!(first.len() >= 3, "{first:?}");
    assert_eq!(sensor.finish().unwrap(), Some(dir.clone()));
    // Left attached: the links outlive the agent.
    assert!(first.iter().all(|id| attached_link_ids().contains(id)));

    let (sensor, started) = start_pinned(managers, &dir).unwrap();
    let Started::Adopted(gap) = started else { panic!("not adopted: {started:?}") };
    assert!(gap.clean_stop && gap.until_ns >= gap.since_ns, "{gap:?}");
    assert_eq!(pinned_link_ids(&dir), first, "adopting must not re-attach");
    sensor.finish().unwrap();

    // The set now says it was loaded from another object.
    let agent_map = || -> Array<MapData, AgentState> {
        Array::try_from(Map::Array(MapData::from_pin(dir.join("agent")).unwrap())).unwrap()
    };
    let mut map = agent_map();
    let state = map.get(&0, 0).unwrap();
    assert_eq!(state.object_id, pins::object_id());
    map.set(0, AgentState { object_id: [0xab; 32], ..state }, 0).unwrap();
    drop(map);

    let (sensor, started) = start_pinned(managers, &dir).unwrap();
    let Started::Replaced(why) = started else { panic!("not replaced: {started:?}") };
    assert!(why.contains("another build"), "{why}");
    let second = pinned_link_ids(&dir);
    let attached = attached_link_ids();
    assert!(first.iter().all(|id| !second.contains(id) && !attached.contains(id)), "the old links are detached");
    assert_eq!(agent_map().get(&0, 0).unwrap().object_id, pins::object_id());
    sensor.finish().unwrap();

    assert_eq!(pins::stop(&dir).unwrap(), Stopped::Detached { agent: None });
    assert!(!dir.exists());
    let attached = attached_link_ids();
    assert!(second.iter().all(|id| !attached.contains(id)), "stop detaches");
    assert_eq!(pins::stop(&dir).unwrap(), Stopped::NothingPinned);
}

/// The credential indexes of the kernel's map of the set pinned in `dir`, by path.
fn pinned_cred_index(dir: &Path, path: &Path) -> u32 {
    let map: aya::maps::HashMap<MapData, InodeKey, CredInode> =
        aya::maps::HashMap::try_from(Map::HashMap(MapData::from_pin(dir.join("CRED_INODES")).unwrap())).unwrap();
    let meta = fs::metadata(path).unwrap();
    let key = InodeKey { dev: credwatch::sensor::credentials::kernel_dev(meta.dev()), ino: meta.ino() };
    map.get(&key, 0).unwrap().index
}

/// A reload (a second `protect`) and an adoption keep each file's index: records in flight
/// and the pinned set carry them.
#[test]
fn credential_indexes_survive_a_reload_and_an_adoption() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pin_dir = PinDir::new("index");
    let dir = pin_dir.0.clone();
    let h = home();
    // A home whose files sort before `h`'s: a table built afresh would number them first.
    let earlier = h.home.parent().unwrap().join("a-earlier-home");
    fs::create_dir_all(&earlier).unwrap();
    fs::write(earlier.join(".npmrc"), "//registry.npmjs.org/:_authToken=fake\n").unwrap();
    let npmrc = h.home.join(".npmrc");
    if !tracepoint_links() {
        // No set, so no index outlives the agent (see `assert_unpinned`).
        return assert_unpinned(&[], &dir);
    }

    let (mut sensor, _) = start_pinned(&[], &dir).unwrap();
    sensor.protect(Protection { rules: h.rules.clone().into(), homes: vec![h.home.clone()], enforce: false }).unwrap();
    let first = pinned_cred_index(&dir, &npmrc);
    let both = vec![earlier.clone(), h.home.clone()];
    sensor.protect(Protection { rules: h.rules.clone().into(), homes: both.clone(), enforce: false }).unwrap();
    assert_eq!(pinned_cred_index(&dir, &npmrc), first, "after a reload");
    let earlier_index = pinned_cred_index(&dir, &earlier.join(".npmrc"));
    assert_ne!(earlier_index, first);
    sensor.finish().unwrap();

    let (mut sensor, started) = start_pinned(&[], &dir).unwrap();
    assert!(matches!(started, Started::Adopted(_)), "{started:?}");
    sensor
        .protect(Protection { rules: h.rules.clone().into(), homes: both.into_iter().rev().collect(), enforce: false })
        .unwrap();
    assert_eq!(pinned_cred_index(&dir, &npmrc), first, "after an adoption");
    assert_eq!(pinned_cred_index(&dir, &earlier.join(".npmrc")), earlier_index);
    sensor.finish().unwrap();
    assert_eq!(pins::stop(&dir).unwrap(), Stopped::Detached { agent: None });
}

#[test]
fn enforce_passes_an_agents_chain_through_its_tool_shells_and_own_program_only() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = home();
    // `cat` is the actor, as in the test above; `sparebot` an agent whose tools run in `sh`.
    let rules_dir = kill_rules_sparing_cat(&h.work.join("agent-rules"));
    fs::write(rules_dir.join("managers.yaml"), "schema: 1\nmanagers:\n  - name: fake\n    execs: [sparemgr]\n")
        .unwrap();
    let agents =
        "schema: 2\nagents:\n  - name: bot\n    execs: [sparebot]\nagent_policy:\n  tool_shells: [sh, dash, bash]\n";
    fs::write(rules_dir.join("agents.yaml"), agents).unwrap();
    let rules = RuleSet::load_dir(&rules_dir).unwrap();
    let mut sensor = start(&rules.kernel_roots(), true).unwrap();
    sensor.protect(Protection { rules: rules.into(), homes: vec![h.home.clone()], enforce: true }).unwrap();

    let (agent, manager) = (fake_manager(&h.work, "sparebot"), fake_manager(&h.work, "sparemgr"));
    let key = path(&h.home.join(".ssh/id_rsa"));
    let out = |name: &str| path(&h.work.join(name));
    // The agent's shell running cat (spared), the agent's own program again running a shell
    // running cat (spared), a program that is neither between (killed), the shell's own read
    // (killed). Each `; true` makes the shell fork rather than exec the command in its place.
    let script = format!(
        "sh -c 'cat {key} > {shell}; true'; sparebot -c \"sh -c 'cat {key} > {own}; true'; true\"; \
         sh -c 'timeout 10 cat {key} > {other}; true'; sh -c 'read -r line < {key}; echo \"$line\" > {read}'; true",
        shell = out("shell"),
        own = out("own"),
        other = out("other"),
        read = out("read"),
    );
    let path_with_agent = format!("{}:{}", path(&h.work), std::env::var("PATH").unwrap());
    // The shells report the killed processes on stderr: expected.
    let status = Command::new(&agent)
        .args(["-c", &script])
        .env("PATH", &path_with_agent)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    // The same shell under a manager's root runs package code: cat is killed.
    let package = format!("sh -c 'cat {key} > {}; true'; true", out("package"));
    let status = Command::new(&manager).args(["-c", &package]).stderr(Stdio::null()).status().unwrap();
    assert!(status.success());
    let mut events = Vec::new();
    let root = |events: &[Event]| {
        events.iter().find_map(|e| match &e.data {
            EventData::Exec(exec) if exec.filename == manager.to_str().unwrap() => Some(e.pid),
            _ => None,
        })
    };
    collect(&mut sensor, &mut events, |events| root(events).is_some_and(|pid| exited(events, pid).is_some()));
    let read = |name: &str| fs::read_to_string(h.work.join(name)).unwrap_or_default();
    assert!(read("shell").contains(SECRET), "cat in the agent's shell is spared");
    assert!(read("own").contains(SECRET), "cat under the agent's own program's shell is spared");
    assert_eq!(read("other"), "", "cat under timeout is killed");
    assert_eq!(read("read"), "", "the shell reading the key itself is killed");
    assert_eq!(read("package"), "", "cat in a package tree's shell is killed");
    let key_opens: Vec<&Open> = opens(&events).map(|(_, o)| o).filter(|o| o.path == key).collect();
    assert_eq!(key_opens.len(), 5, "{events:#?}");
    assert_eq!(key_opens.iter().filter(|o| o.blocked).count(), 3, "{key_opens:#?}");
}

fn blind_spots(events: &[Event]) -> Vec<&BlindSpot> {
    events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::BlindSpot(spot) => Some(spot),
            _ => None,
        })
        .collect()
}

fn connects(events: &[Event]) -> Vec<(u32, &Connect)> {
    events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::Connect(connect) => Some((e.pid, connect)),
            _ => None,
        })
        .collect()
}

/// A child that waits, then connects to 127.0.0.1:argv[1]; then 100 children alive at once,
/// which fill a small MARKS; then the first child is let go.
const FORK_PAST_MARKS: &str = r#"
import os, socket, sys, time
port = int(sys.argv[1])
go_r, go_w = os.pipe()
if os.fork() == 0:
    os.close(go_w)
    os.read(go_r, 1)
    s = socket.socket()
    s.connect(("127.0.0.1", port))
    s.close()
    os._exit(0)
os.close(go_r)
sleepers = []
for _ in range(100):
    pid = os.fork()
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    sleepers.append(pid)
os.write(go_w, b"g")
for pid in sleepers:
    os.waitpid(pid, 0)
"#;

#[test]
fn a_full_marks_map_is_a_blind_spot_of_the_tree_which_is_tainted() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = home();
    let mut sensor = sized_sensor(&h, true, &["MARKS=16"]);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let mut child = python_marked(&mut sensor, FORK_PAST_MARKS, &[&port]);
    let root = child.id();
    let mut events = Vec::new();
    let full = |events: &[Event]| {
        blind_spots(events).iter().any(|s| s.cause == BlindCause::MarksFull && s.root_pid == Some(root))
    };
    let held = |events: &[Event]| connects(events).into_iter().find(|(_, c)| c.held).map(|(pid, _)| pid);
    collect(&mut sensor, &mut events, |events| full(events) && held(events).is_some());
    // The tree lost marks, so its connects are held under --enforce as if it had read a key.
    let connector = held(&events).unwrap();
    // SAFETY: kill(2) of the child the kernel stopped.
    unsafe { libc::kill(connector as i32, libc::SIGKILL) };
    assert!(child.wait().unwrap().success());
    let spots: Vec<&BlindSpot> =
        blind_spots(&events).into_iter().filter(|s| s.cause == BlindCause::MarksFull).collect();
    let unmarked: u64 = spots.iter().filter(|s| s.root_pid == Some(root)).map(|s| s.counts["mark"]).sum();
    // 100 children, at most 16 entries (the root, the connector and the sleepers that fit).
    assert!((85..=100).contains(&unmarked), "{spots:#?}");
    assert!(spots.iter().all(|s| s.root_pid == Some(root) && !s.credential && s.since_ns <= s.until_ns), "{spots:#?}");
    assert_eq!(lost(&events, lost_source::MARKS), unmarked, "the tree's count is the whole count");
    // The agent's canary found MARKS full meanwhile: skipped, not an error (the polls above).
}

/// 100 children that each open the key once (distinct processes: no repeat is counted instead).
const KEY_FLOOD: &str = r#"
import os, sys
kids = []
for _ in range(100):
    pid = os.fork()
    if pid == 0:
        os.close(os.open(sys.argv[1], os.O_RDONLY))
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
"#;

#[test]
fn a_flooded_priority_ring_is_a_blind_spot_naming_the_tree_and_the_lost_key_reads() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = home();
    // One page: a few dozen credential opens fill it.
    let mut sensor = sized_sensor(&h, false, &["PRIORITY=4096"]);
    let key = path(&h.home.join(".ssh/id_rsa"));
    // Not read while the tree runs.
    let mut child = python_marked(&mut sensor, KEY_FLOOD, &[&key]);
    assert!(child.wait().unwrap().success());
    let root = child.id();
    let mut events = Vec::new();
    let spot = |events: &[Event]| {
        blind_spots(events).into_iter().find(|s| s.cause == BlindCause::Lost && s.root_pid == Some(root)).cloned()
    };
    collect(&mut sensor, &mut events, |events| spot(events).is_some() && exited(events, root).is_some());
    let spot = spot(&events).unwrap();
    assert!(spot.credential, "{spot:#?}");
    let lost_reads = spot.counts["credential_open"];
    let seen = opens(&events).filter(|(_, o)| o.path == key).count() as u64;
    assert!(lost_reads > 0 && seen + lost_reads == 100, "{seen} seen + {lost_reads} lost: {spot:#?}");
    assert_eq!(lost(&events, lost_source::PRIORITY), spot.counts.values().sum::<u64>());
    assert!(spot.since_ns <= spot.until_ns && spot.until_ns <= sensor.now_ns());
    assert!(blind_spots(&events).iter().all(|s| s.root_pid.is_some()), "every loss has its tree");
}

/// Forks a child that reads `~/.npmrc` (alert-only: no kill rule), waits, and exits with what
/// ended the child: 0 read it, 1 refused (EPERM), 9 killed.
const READ_IN_CHILD: &str = r#"
import os, sys
pid = os.fork()
if pid == 0:
    try:
        with open(sys.argv[1]) as f:
            f.read()
    except PermissionError:
        os._exit(1)
    os._exit(0)
_, status = os.waitpid(pid, 0)
sys.exit(os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
"#;

#[test]
fn without_a_reading_agent_enforce_fails_closed_for_package_code_only() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = home();
    let mut sensor = protected_sensor(&h, true);
    let npmrc = path(&h.home.join(".npmrc"));
    let mut events = Vec::new();
    // A first drain writes the heartbeat; then the agent reads nothing for longer than
    // FAIL_CLOSED_AFTER_NS.
    sensor.poll(Duration::from_millis(10), &mut events).unwrap();
    std::thread::sleep(Duration::from_nanos(credwatch_common::FAIL_CLOSED_AFTER_NS) + Duration::from_secs(1));
    let mut package = python_marked(&mut sensor, READ_IN_CHILD, &[&npmrc]);
    let closed = package.wait().unwrap().code();
    let unmarked = Command::new(PYTHON).args(["-c", READ_IN_CHILD, &npmrc]).status().unwrap().code();
    let root = package.id();
    let expected = if sensor.lsm() { 1 } else { libc::SIGKILL };
    assert_eq!(closed, Some(expected), "the package code's read fails closed");
    assert_eq!(unmarked, Some(0), "an unmarked process reads as ever");
    collect(&mut sensor, &mut events, |events| exited(events, root).is_some());
    let gap = events.iter().position(|e| matches!(&e.data, EventData::AgentGap(AgentGap { stopped: true, .. })));
    let gap = gap.expect("the stop is reported as a gap");
    let refused = events.iter().position(|e| matches!(&e.data, EventData::Open(o) if o.path == npmrc && e.pid != root));
    let refused = refused.expect("the refused read is reported");
    assert!(gap < refused, "the gap comes before what waited");
    let EventData::Open(open) = &events[refused].data else { unreachable!() };
    assert!(open.fail_closed && (open.blocked || open.denied), "{open:#?}");

    // Read again: the next child reads as before.
    let mut after = python_marked(&mut sensor, READ_IN_CHILD, &[&npmrc]);
    let after_root = after.id();
    collect(&mut sensor, &mut events, |events| exited(events, after_root).is_some());
    assert_eq!(after.wait().unwrap().code(), Some(0), "a reading agent: no fail-closed");
}
