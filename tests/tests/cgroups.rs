//! Issue 12: every exec event carries the process's cgroups (the v1 hierarchy of one controller,
//! then the unified one), read by the kernel at exec: right for a process that is gone within a
//! millisecond, long before the agent could look in `/proc`.

use std::{
    fs,
    io::Read,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use credwatch_e2e::{credwatch_binary, parse_alerts, require_root, Run, Sandbox, EXIT_ALERT};
use serde_json::Value;

/// The hierarchies `credwatch doctor` says exec events name: (`v1` or `v2`, mount point).
fn hierarchies_read(sandbox: &Sandbox) -> Vec<(String, PathBuf)> {
    let output = sandbox.setup("credwatch doctor", sandbox.command(credwatch_binary()).arg("doctor"));
    let line = output
        .lines()
        .find_map(|line| line.strip_prefix("cgroups read:"))
        .unwrap_or_else(|| panic!("doctor names no cgroup hierarchy:\n{output}"))
        .trim();
    // `v1 memory (/sys/fs/cgroup/memory), v2 (/sys/fs/cgroup/unified)`
    line.split("), ")
        .map(|part| {
            let (what, point) = part.trim_end_matches(')').split_once(" (").unwrap_or_else(|| panic!("{line}"));
            (what.split(' ').next().unwrap().to_owned(), PathBuf::from(point))
        })
        .collect()
}

/// Cgroups made by the test, removed when it ends however it ends: any process left in one is
/// moved to its hierarchy's root first.
struct Cgroups {
    /// (mount point, directory made), in the order made.
    made: Vec<(PathBuf, PathBuf)>,
}

impl Cgroups {
    /// `relative` under `mount`, making each missing level; returns its directory.
    fn make(&mut self, mount: &Path, relative: &str) -> PathBuf {
        let mut dir = mount.to_path_buf();
        for level in relative.split('/') {
            dir.push(level);
            if !dir.exists() {
                fs::create_dir(&dir).unwrap_or_else(|e| panic!("making cgroup {}: {e}", dir.display()));
                self.made.push((mount.to_path_buf(), dir.clone()));
            }
        }
        dir
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for (mount, dir) in self.made.iter().rev() {
            let start = Instant::now();
            // A cgroup whose last process just exited can stay busy for a moment.
            while fs::remove_dir(dir).is_err() && start.elapsed() < Duration::from_secs(5) {
                for pid in fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default().lines() {
                    let _ = fs::write(mount.join("cgroup.procs"), pid);
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn random_hex(bytes: usize) -> String {
    let mut random = vec![0u8; bytes];
    fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut random)).expect("reading /dev/urandom");
    random.iter().map(|b| format!("{b:02x}")).collect()
}

/// The exec events of the trace whose argv is `args`.
fn execs_of(trace: &Path, args: &[&str]) -> Vec<Value> {
    parse_alerts(&fs::read_to_string(trace).unwrap_or_default())
        .into_iter()
        .filter(|event| event["kind"] == "exec" && event["args"] == serde_json::json!(args))
        .collect()
}

#[test]
fn exec_events_name_the_cgroups_of_a_process_that_exits_at_once() {
    require_root();
    let sandbox = Sandbox::new();
    let hierarchies = hierarchies_read(&sandbox);
    assert!(!hierarchies.is_empty(), "no cgroup hierarchy to test");
    let container = random_hex(32);
    let pod = random_hex(16);
    let pod = format!("{}_{}_{}_{}_{}", &pod[..8], &pod[8..12], &pod[12..16], &pod[16..20], &pod[20..]);
    let mut cgroups = Cgroups { made: Vec::new() };
    // As docker's cgroupfs driver makes them on v1, and kubelet's systemd driver on v2.
    let mut expected = Vec::new();
    let mut moves = Vec::new();
    let mut to_roots = Vec::new();
    for (version, mount) in &hierarchies {
        let relative = match version.as_str() {
            "v1" => format!("docker/{container}"),
            "v2" => format!(
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{pod}.slice/cri-containerd-{container}.scope"
            ),
            other => panic!("doctor names an unknown hierarchy {other}"),
        };
        let dir = cgroups.make(mount, &relative);
        expected.push(format!("/{relative}"));
        moves.push(format!("echo $$ > {}/cgroup.procs", dir.display()));
        to_roots.push(format!("echo $$ > {}/cgroup.procs", mount.display()));
    }
    let (npmrc, aws) = (sandbox.credential(".npmrc"), sandbox.credential(".aws/credentials"));
    // The lifecycle shell moves itself into the container's cgroups and runs a `cat` (a few
    // milliseconds from exec to exit), then back to the roots and another.
    let script = format!("{} && cat {npmrc} && {} && cat {aws}", moves.join(" && "), to_roots.join(" && "));
    let trace = sandbox.work().join("cgroups.jsonl");
    let mut command = sandbox.command(credwatch_binary());
    command
        .args(["record", "--json", "--alerts"])
        .arg(sandbox.alerts_file())
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(sandbox.fake_manager())
        .args(["cgroup-test", &script]);
    let run: Run = sandbox.wait(sandbox.spawn(command));
    run.assert_exit(EXIT_ALERT);

    let in_container = execs_of(&trace, &["cat", &npmrc]);
    assert_eq!(in_container.len(), 1, "{in_container:?}\n{}", run.describe());
    assert_eq!(in_container[0]["cgroups"], serde_json::json!(expected), "{:#}", in_container[0]);
    let at_roots = execs_of(&trace, &["cat", &aws]);
    assert_eq!(at_roots.len(), 1, "{at_roots:?}\n{}", run.describe());
    assert_eq!(at_roots[0]["cgroups"], serde_json::json!(vec!["/"; hierarchies.len()]), "{:#}", at_roots[0]);
    // Both cats were watched, as package code reading credentials, and the alerts name the
    // container (and, from the kubelet path, the pod) from those paths.
    let in_container = run.expect_alert(&npmrc);
    assert_eq!(in_container["container"]["id"], container.as_str(), "{in_container:#}");
    if hierarchies.iter().any(|(version, _)| version == "v2") {
        assert_eq!(in_container["orchestrator"]["resource"]["id"], pod.replace('_', "-"), "{in_container:#}");
    }
    let at_roots = run.expect_alert(&aws);
    assert_eq!((&at_roots["container"], &at_roots["orchestrator"]), (&Value::Null, &Value::Null), "{at_roots:#}");
}
