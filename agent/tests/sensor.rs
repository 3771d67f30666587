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

use credwatch::{
    event::{Event, EventData, Open},
    rules::manager::{Manager, ModuleRoot},
    sensor::{doctor, Sensor},
};

/// The tests share kernel tracepoints; one sensor at a time keeps their event streams apart.
static SERIAL: Mutex<()> = Mutex::new(());

const PYTHON: &str = "/usr/bin/python3";

/// What the helper does once released: opens in every way the sensor must resolve, then
/// double-forks a setsid'd grandchild that opens a file after its parent and the root exit.
const HELPER: &str = r#"
import ctypes, os, struct, sys, time
d = sys.argv[1]
os.chdir(d)
os.close(os.open("secret.txt", os.O_RDONLY))
sub = os.open("sub", os.O_RDONLY | os.O_DIRECTORY)
os.close(os.open("inner.txt", os.O_RDONLY, dir_fd=sub))
os.close(os.open("link.txt", os.O_RDONLY))
os.close(os.open("/proc/self/cwd/../" + os.path.basename(d) + "/secret.txt", os.O_RDONLY))
try:
    os.open("missing.txt", os.O_RDONLY)
except FileNotFoundError:
    pass
libc = ctypes.CDLL(None, use_errno=True)
how = ctypes.create_string_buffer(struct.pack("QQQ", os.O_RDONLY, 0, 0), 24)
fd = libc.syscall(437, -100, b"sub/../secret.txt", how, 24)
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

/// A temp dir with `secret.txt`, `late.txt`, `sub/inner.txt` and `link.txt -> sub/inner.txt`.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = fs::canonicalize(dir.path()).unwrap();
    fs::write(root.join("secret.txt"), "fake secret\n").unwrap();
    fs::write(root.join("late.txt"), "late\n").unwrap();
    fs::create_dir(root.join("sub")).unwrap();
    fs::write(root.join("sub/inner.txt"), "inner\n").unwrap();
    symlink("sub/inner.txt", root.join("link.txt")).unwrap();
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
    let mut sensor = Sensor::start(&[], false).expect("sensor starts (run as root)");

    // The child waits on its stdin until it is marked, then becomes python.
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg("read go && exec \"$0\" -c \"$1\" \"$2\"")
        .args([PYTHON, HELPER, fx.root.to_str().unwrap()])
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
    assert_eq!(through_link.abs_path.as_deref(), Some(inner.as_str()));

    let name = fx.root.file_name().unwrap().to_str().unwrap();
    let via_proc = open_of(&events, root, &format!("/proc/self/cwd/../{name}/secret.txt"));
    assert_eq!(via_proc.abs_path.as_deref(), Some(secret.as_str()));

    let openat2 = open_of(&events, root, "sub/../secret.txt");
    assert_eq!(openat2.syscall, "openat2");
    assert_eq!(openat2.abs_path.as_deref(), Some(secret.as_str()));

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
fn exec_of_a_manager_or_interpreter_module_makes_a_root() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fx = fixture();
    let module_dir = fx.root.join("py");
    fs::create_dir(&module_dir).unwrap();
    fs::write(module_dir.join("fakepip.py"), "open('secret.txt').close()\n").unwrap();
    let managers = vec![
        Manager { name: "fake".into(), execs: vec!["fakemgr".into()], modules: vec![] },
        Manager {
            name: "fakepip".into(),
            execs: vec![],
            modules: vec![ModuleRoot {
                interpreters: vec!["python3".into()],
                args: vec!["-m".into(), "fakepip".into()],
            }],
        },
    ];
    let mut sensor = Sensor::start(&managers, true).unwrap();

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

    let secret = fx.root.join("secret.txt").to_str().unwrap().to_owned();
    let mut events = Vec::new();
    collect(&mut sensor, &mut events, |events| exited(events, module_pid).is_some());

    let manager_exec = events
        .iter()
        .find(|e| matches!(&e.data, EventData::Exec(exec) if exec.filename == manager.to_str().unwrap()))
        .expect("the manager's own exec is reported");
    let cat = forks_of(&events, manager_exec.pid);
    assert_eq!(cat.len(), 1, "{events:#?}");
    assert_eq!(open_of(&events, cat[0], "secret.txt").abs_path.as_deref(), Some(secret.as_str()));
    assert_eq!(open_of(&events, module_pid, "secret.txt").abs_path.as_deref(), Some(secret.as_str()));
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
    let managers = vec![Manager { name: "seed".into(), execs: vec!["seedmgr".into()], modules: vec![] }];
    let mut sensor = Sensor::start(&managers, false).unwrap();
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
    drop(Sensor::start(&[], false).unwrap());
    let report = doctor();
    assert!(report.btf);
    assert_eq!(report.offsets, Ok(()));
    assert!(report.tracefs);
    let loads = |name: &str| report.programs.iter().any(|(n, probe)| *n == name && *probe == Ok(true));
    assert!(loads("tracepoint") && loads("raw_tracepoint"), "{report}");
    assert_eq!(report.ring_buffer, Ok(true));
    assert_eq!(report.sensor, Some("tracepoints"), "{report}");
    let text = report.to_string();
    assert!(text.contains(&report.kernel_release) && text.contains("sensor:           tracepoints"), "{text}");
}
