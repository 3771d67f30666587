//! Package trees that were already running when the sensor started, found in `/proc`.

use std::{
    collections::{BTreeMap, VecDeque},
    fs, io,
    os::unix::fs::MetadataExt,
    path::Path,
};

use credwatch_common::Mark;

use credwatch_core::{
    event::{attribution_env, Event, EventData, Exec},
    record::{words, Decoder},
    rules::manager::{root_manager, Manager},
};

struct Proc {
    ppid: u32,
    start_ticks: u64,
    exec: Exec,
}

/// `ppid` and `starttime` (fields 4 and 22) of `/proc/<pid>/stat`; the command name (field 2)
/// may hold spaces and parentheses, so fields are counted after its last `)`.
fn parse_stat(stat: &str) -> Option<(u32, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

/// The first (real) id of a `Uid:` or `Gid:` line of `/proc/<pid>/status`.
fn status_id(status: &str, key: &str) -> u32 {
    status
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|id| id.parse().ok())
        .unwrap_or(0)
}

/// The cgroup v2 id of a process: the inode of its cgroup directory.
fn cgroup_id(dir: &Path) -> u64 {
    let Ok(cgroups) = fs::read_to_string(dir.join("cgroup")) else { return 0 };
    cgroups
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .and_then(|path| fs::metadata(format!("/sys/fs/cgroup{path}")).ok())
        .map_or(0, |meta| meta.ino())
}

fn link(dir: &Path, name: &str) -> String {
    fs::read_link(dir.join(name)).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Reads one process; `None` when it vanished or is a kernel thread (no command line).
fn read_proc(dir: &Path) -> Option<Proc> {
    let (ppid, start_ticks) = parse_stat(&fs::read_to_string(dir.join("stat")).ok()?)?;
    let args = words(&fs::read(dir.join("cmdline")).ok()?);
    if args.is_empty() {
        return None;
    }
    let status = fs::read_to_string(dir.join("status")).unwrap_or_default();
    let executable = link(dir, "exe");
    Some(Proc {
        ppid,
        start_ticks,
        exec: Exec {
            ppid,
            filename: args[0].clone(),
            executable,
            cwd: link(dir, "cwd"),
            uid: status_id(&status, "Uid:"),
            gid: status_id(&status, "Gid:"),
            cgroup_id: cgroup_id(dir),
            env: attribution_env(&fs::read(dir.join("environ")).unwrap_or_default()),
            seeded: true,
            project: None,
            args,
        },
    })
}

/// Whether a running process is a manager, and the file name that says so (the name the
/// engine then sees as the exec's, as the kernel would have given it): its executable, argv[0],
/// the first word of argv[0] (npm retitles itself: argv[0] becomes the one string
/// `npm run x`), or a script an interpreter runs (`node /usr/bin/npm`: argv[1], when it is an
/// absolute path to a `#!` file).
fn manager_of(managers: &[Manager], exec: &Exec) -> Option<(usize, String)> {
    let retitled = exec.filename.split(' ').next().unwrap_or_default();
    let script = exec.args.get(1).filter(|path| path.starts_with('/') && is_script(Path::new(path.as_str())));
    [Some(exec.executable.as_str()), Some(exec.filename.as_str()), Some(retitled), script.map(String::as_str)]
        .into_iter()
        .flatten()
        .filter(|name| !name.is_empty())
        .find_map(|name| root_manager(managers, name, &exec.args).map(|manager| (manager, name.to_owned())))
}

fn is_script(path: &Path) -> bool {
    let mut start = [0u8; 2];
    fs::File::open(path).and_then(|mut file| io::Read::read_exact(&mut file, &mut start)).is_ok() && start == *b"#!"
}

/// Every process in a package tree under `proc_root`, with its mark, parents first. The
/// outermost manager is the root of a tree (npm under cargo belongs to cargo's tree).
pub fn scan(
    proc_root: &Path,
    managers: &[Manager],
    agent_pid: u32,
    decoder: &Decoder,
) -> io::Result<Vec<(Event, Mark)>> {
    let mut procs = BTreeMap::new();
    for entry in fs::read_dir(proc_root)? {
        let entry = entry?;
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        if pid == agent_pid {
            continue;
        }
        if let Some(proc) = read_proc(&entry.path()) {
            procs.insert(pid, proc);
        }
    }
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (&pid, proc) in &procs {
        children.entry(proc.ppid).or_default().push(pid);
    }
    // Breadth first from the processes whose parent is not listed: parents come first.
    let mut queue: VecDeque<(u32, Option<Mark>)> =
        procs.iter().filter(|(_, p)| !procs.contains_key(&p.ppid)).map(|(&pid, _)| (pid, None)).collect();
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100).max(1);
    let mut found = Vec::new();
    while let Some((pid, parent_mark)) = queue.pop_front() {
        let Some(proc) = procs.get(&pid) else { continue };
        let mut exec = proc.exec.clone();
        // A manager nested in a tree (npm under cargo) is named too, so that its scripts'
        // alerts name it rather than the root.
        let manager = manager_of(managers, &proc.exec);
        if let Some((_, filename)) = &manager {
            exec.filename.clone_from(filename);
        }
        let mark = match parent_mark {
            Some(parent) => Some(Mark { depth: parent.depth + 1, ..parent }),
            None => manager.map(|(manager, _)| Mark { root_pid: pid, depth: 0, manager: manager as u32, flags: 0 }),
        };
        if let Some(mark) = mark {
            exec.project = super::project::for_exec(&exec.executable, &exec.args, &exec.cwd);
            let boot_ns = proc.start_ticks.saturating_mul(1_000_000_000) / ticks_per_second;
            found.push((Event { time_ns: decoder.wall_ns(boot_ns), pid, data: EventData::Exec(exec) }, mark));
        }
        for &child in children.get(&pid).into_iter().flatten() {
            queue.push_back((child, mark));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;
    use credwatch_core::rules::manager::ScriptRoot;

    #[test]
    fn finds_retitled_and_script_managers() {
        let managers = vec![
            Manager { name: "npm".into(), execs: vec!["npm".into()], ..Manager::default() },
            Manager {
                name: "yarn".into(),
                scripts: vec![ScriptRoot {
                    interpreters: vec!["node".into()],
                    files: vec!["yarn-*.cjs".into()],
                    args: vec![],
                }],
                ..Manager::default()
            },
        ];
        let exec = |executable: &str, args: &[&str]| Exec {
            executable: executable.into(),
            filename: args[0].into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            ..Exec::default()
        };
        let retitled = exec("/usr/bin/node", &["npm run payload"]);
        assert_eq!(manager_of(&managers, &retitled), Some((0, "npm".to_owned())));
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("npm");
        fs::write(&script, "#!/bin/sh\n").unwrap();
        let script = script.to_str().unwrap();
        assert_eq!(
            manager_of(&managers, &exec("/usr/bin/dash", &["/bin/sh", script, "ci"])),
            Some((0, script.to_owned()))
        );
        // A release file run by its interpreter: the engine sees the interpreter's exec.
        let berry = exec("/usr/bin/node", &["node", ".yarn/releases/yarn-4.5.3.cjs", "install"]);
        assert_eq!(manager_of(&managers, &berry), Some((1, "/usr/bin/node".to_owned())));
        assert_eq!(manager_of(&managers, &exec("/usr/bin/node", &["node", "server.js"])), None);
        // An argument that merely names a manager is not one.
        assert_eq!(manager_of(&managers, &exec("/usr/bin/vim", &["vim", "npm"])), None);
        let data = dir.path().join("npm.txt");
        fs::write(&data, "npm").unwrap();
        assert_eq!(manager_of(&managers, &exec("/usr/bin/cat", &["cat", data.to_str().unwrap()])), None);
    }

    #[test]
    fn parses_stat_with_awkward_names() {
        let stat = "1234 (we ird) (name)) S 77 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 0 0";
        assert_eq!(parse_stat(stat), Some((77, 98765)));
        assert_eq!(parse_stat("1 (x) S"), None);
    }

    #[test]
    fn reads_real_ids() {
        assert_eq!(status_id("Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t5\t5\t5\t5\n", "Uid:"), 1000);
        assert_eq!(status_id("Name:\tx\n", "Gid:"), 0);
    }

    #[test]
    fn finds_this_test_as_a_tree_when_its_name_is_a_manager() {
        // The test binary's own argv[0] basename stands in for a manager: its process and
        // nothing unrelated is found, and it is a root.
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_str().unwrap().to_owned();
        let managers = vec![Manager { name: "self".into(), execs: vec![name], ..Manager::default() }];
        let found = scan(Path::new("/proc"), &managers, 0, &Decoder::new()).unwrap();
        let me = std::process::id();
        let (event, mark) = found.iter().find(|(event, _)| event.pid == me).expect("this process is found");
        assert_eq!((mark.root_pid, mark.depth), (me, 0));
        let EventData::Exec(exec) = &event.data else { panic!() };
        assert!(exec.seeded);
        assert_eq!(exec.executable, exe.to_string_lossy());
        assert!(found.iter().all(|(event, _)| event.pid != 1), "init is in no package tree");
    }

    #[test]
    fn names_a_retitled_manager_nested_in_a_tree() {
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_str().unwrap().to_owned();
        let managers = vec![
            Manager { name: "self".into(), execs: vec![name], ..Manager::default() },
            Manager { name: "npm".into(), execs: vec!["npm".into()], ..Manager::default() },
        ];
        // npm retitles itself (argv[0] becomes `npm run x`) before the scan sees it.
        let mut child = std::process::Command::new("sleep").arg0("npm run payload").arg("30").spawn().unwrap();
        let found = scan(Path::new("/proc"), &managers, 0, &Decoder::new());
        child.kill().unwrap();
        child.wait().unwrap();
        let found = found.unwrap();
        let (event, mark) = found.iter().find(|(event, _)| event.pid == child.id()).expect("the child is found");
        assert_eq!((mark.root_pid, mark.depth), (std::process::id(), 1));
        let EventData::Exec(exec) = &event.data else { panic!() };
        assert_eq!(exec.filename, "npm", "the engine sees the nested manager by this name");
        assert_eq!(root_manager(&managers, &exec.filename, &exec.args), Some(1));
    }
}
