//! The one event stream: what the live sensor, the trace reader and the importers all produce,
//! and the only input of the engine. Serialised, it is the body of a trace file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Environment variables that carry attribution. Only these are kept from an exec's
/// environment: the rest may hold secrets (`NPM_TOKEN`, ...) that must not reach a trace.
pub const ATTRIBUTION_ENV: &[&str] = &[
    // Where `~/` is for this process: throwaway and per-user homes are not under /home.
    "HOME",
    "npm_package_name",
    "npm_package_version",
    "npm_lifecycle_event",
    "npm_lifecycle_script",
    "npm_command",
    "CARGO_PKG_NAME",
    "CARGO_PKG_VERSION",
    "CARGO_CRATE_NAME",
    "CARGO_MANIFEST_DIR",
    "CARGO_PRIMARY_PACKAGE",
    // The SSH agent's socket, a path: a connect to it is the agent being used.
    "SSH_AUTH_SOCK",
    // The CI job (`ci.*` of alerts, from the tree root's): what `AlertCi::from_env` reads.
    "GITHUB_ACTIONS",
    "GITHUB_SERVER_URL",
    "GITHUB_REPOSITORY",
    "GITHUB_WORKFLOW",
    "GITHUB_RUN_ID",
    "GITHUB_RUN_ATTEMPT",
    "GITHUB_JOB",
    "RUNNER_NAME",
    "GITLAB_CI",
    "CI_SERVER_URL",
    "CI_PROJECT_PATH",
    "CI_PIPELINE_ID",
    "CI_JOB_NAME",
    "CI_JOB_ID",
    "CI_RUNNER_DESCRIPTION",
];

/// Keeps the `KEY=VALUE` entries of a NUL-separated environment block whose key is in
/// [`ATTRIBUTION_ENV`].
pub fn attribution_env(block: &[u8]) -> BTreeMap<String, String> {
    block
        .split(|&b| b == 0)
        .filter_map(|entry| {
            let entry = String::from_utf8_lossy(entry);
            let (key, value) = entry.split_once('=')?;
            ATTRIBUTION_ENV.contains(&key).then(|| (key.to_owned(), value.to_owned()))
        })
        .collect()
}

/// One thing that happened to a process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Wall-clock time, nanoseconds since the Unix epoch.
    pub time_ns: u64,
    /// Process id (tgid) the event is about.
    pub pid: u32,
    #[serde(flatten)]
    pub data: EventData,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventData {
    /// The process executed a program, or (with `seeded`) was already running when the
    /// source started.
    Exec(Exec),
    /// The process created a child process (threads are not events).
    Fork(Fork),
    /// The process exited.
    Exit(Exit),
    /// The process opened (or tried to open) a file.
    Open(Open),
    /// The process renamed or linked a file (persistence and tamper writes land this way too).
    Rename(Rename),
    /// The process made a syscall that matters on its own (ptrace, process_vm_readv, bpf,
    /// module loading, signals to the agent, io_uring set-up, ...).
    Syscall(Syscall),
    /// The process is the root of a watched tree because the user asked (`credwatch run`).
    Root(Root),
    /// A source lost events it could not deliver.
    Lost(Lost),
    /// The process connected a socket (or tried to: reported at the call).
    Connect(Connect),
    /// The process sent a DNS query (a datagram or stream write to port 53).
    DnsQuery(DnsQuery),
    /// The source was down (the agent dead or stopped) from `since_ns` to the event's time,
    /// while the kernel side kept recording: the events that follow may be from that time.
    AgentGap(AgentGap),
    /// The kernel could not record or mark some of a tree's acts: what was missed, and when.
    BlindSpot(BlindSpot),
}

impl EventData {
    /// Every kind, as the trace's `kind` tag spells it, in the order of [`EventData::kind_index`]:
    /// for tables indexed by kind (the metrics' counters).
    pub const KINDS: [&'static str; 12] = [
        "exec",
        "fork",
        "exit",
        "open",
        "rename",
        "syscall",
        "root",
        "lost",
        "connect",
        "dns_query",
        "agent_gap",
        "blind_spot",
    ];

    /// This event's kind, as an index into [`EventData::KINDS`].
    pub fn kind_index(&self) -> usize {
        match self {
            EventData::Exec(_) => 0,
            EventData::Fork(_) => 1,
            EventData::Exit(_) => 2,
            EventData::Open(_) => 3,
            EventData::Rename(_) => 4,
            EventData::Syscall(_) => 5,
            EventData::Root(_) => 6,
            EventData::Lost(_) => 7,
            EventData::Connect(_) => 8,
            EventData::DnsQuery(_) => 9,
            EventData::AgentGap(_) => 10,
            EventData::BlindSpot(_) => 11,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Exec {
    pub ppid: u32,
    /// The path given to execve.
    pub filename: String,
    /// The absolute path of the executable, as the kernel resolved it.
    pub executable: String,
    pub args: Vec<String>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    #[serde(default)]
    pub cgroup_id: u64,
    /// The process's cgroups, each a path from its hierarchy's root (`/docker/<id>`,
    /// `/kubepods.slice/.../cri-containerd-<id>.scope`): the v1 hierarchy of one controller, then
    /// the unified (v2) one, each only where mounted. Read by the kernel at exec, so a process
    /// gone within a millisecond still names its container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cgroups: Vec<String>,
    /// The container (and pod) a foreign trace states for the process (Tetragon's `pod`, Tracee's
    /// `container` and `kubernetes`): used instead of what `cgroups` say. The sensor never fills it.
    /// Boxed: rare, and five strings would make every event larger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stated_container: Option<Box<StatedContainer>>,
    /// Attribution variables only ([`ATTRIBUTION_ENV`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Not an exec seen live: the process was already running (seeded from `/proc`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub seeded: bool,
    /// For a Python interpreter: the project in its working directory, as the project's own
    /// metadata names it (build backends run there; the engine reads no files, so the sensor
    /// attaches it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<Project>,
    /// For a script run through its `#!` line: its real path, links resolved, as the sensor
    /// found it at the exec (`npx` runs a bin through a link in its cache). Neither the kernel
    /// (the script's file is closed by then) nor the engine (it reads no files) can tell it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
}

/// A container as a foreign trace names it; built by [`StatedContainer::new`], which keeps only
/// well-formed values (the trace is untrusted input).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatedContainer {
    /// Lowercase hex digits: the full 64, or the prefix the trace gives (Tetragon's `docker`).
    pub id: String,
    /// `docker`, `containerd` or `cri-o` (as the cgroup-derived ones are named).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// The Kubernetes pod's uid (a UUID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// The pod's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A project named by its metadata (`PKG-INFO`, `pyproject.toml`'s `[project]`, `setup.cfg`'s
/// `[metadata]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Project {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The file it came from, relative to the working directory.
    pub source: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fork {
    pub child_pid: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    /// Wait status (`exit_code` of the task).
    pub code: u32,
    /// The process's acts the sensor counted, not sent, that no record of them carried.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub repeats: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Open {
    pub tid: u32,
    /// `open`, `openat`, `openat2` or `creat`.
    pub syscall: String,
    /// dirfd as given; -100 (`AT_FDCWD`) for the current directory.
    pub dirfd: i32,
    /// `O_*` flags as given.
    pub flags: u64,
    pub mode: u64,
    /// The path as the process gave it.
    pub path: String,
    /// The absolute path of the file opened, when the open succeeded and it could be resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abs_path: Option<String>,
    /// `abs_path` lacks leading components (walk limit reached).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The new fd, or `-errno`.
    pub ret: i64,
    /// Device (userspace `st_dev` encoding) and inode of the opened file; 0 when unknown.
    #[serde(default)]
    pub dev: u64,
    #[serde(default)]
    pub ino: u64,
    /// The sensor's inode table says the opened file is this credential file (same device and
    /// inode): a hardlink, a renamed copy or a bind mount of it still names the original.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_file_as: Option<String>,
    /// The kernel killed the process before the open returned (`--enforce`): nothing was read.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub blocked: bool,
    /// The kernel refused the open with EPERM (`--enforce` with the BPF LSM): the process lives,
    /// the file was not opened (trace schema 6).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub denied: bool,
    /// With `blocked` or `denied`: the kernel acted because no agent had read its records for a
    /// while (`--enforce` fails closed), whatever the rules say of the file (trace schema 7).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fail_closed: bool,
    /// Identical acts of the process counted by the sensor, not sent, since the previous
    /// record of this one (same file and access, same destination, same call); 0 when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub repeats: u64,
}

/// Serde's `skip_serializing_if` for counts that are mostly 0.
fn is_zero(count: &u64) -> bool {
    *count == 0
}

impl Open {
    /// The kernel stopped it (killed the process, or refused the open).
    pub fn stopped(&self) -> bool {
        self.blocked || self.denied || self.fail_closed
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rename {
    pub tid: u32,
    /// `rename`, `renameat`, `renameat2`, `link`, `linkat`, `symlink` or `symlinkat`.
    pub syscall: String,
    /// The source (for `symlink`, the link's target text) and destination, as given.
    pub old_path: String,
    pub new_path: String,
    /// Both made absolute by the sensor where it could (dirfd and cwd resolved in the kernel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_abs: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_abs: Option<String>,
    /// 0, or `-errno`.
    pub ret: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Syscall {
    pub tid: u32,
    /// The syscall's name (`ptrace`, `process_vm_readv`, `bpf`, `init_module`, `kill`, ...).
    pub name: String,
    /// The process it acts on, for those that act on one (ptrace, process_vm_*, kill, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_pid: Option<u32>,
    /// The operation, where the syscall has one (`PTRACE_ATTACH`, `BPF_PROG_LOAD`, a signal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// The result, or `-errno`; absent when the process was killed before it returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ret: Option<i64>,
    /// The kernel killed the process at syscall entry (`--enforce`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub blocked: bool,
    /// The kernel refused the call with EPERM (`--enforce` with the BPF LSM): the process lives
    /// (trace schema 6).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub denied: bool,
    /// Identical acts of the process counted by the sensor, not sent, since the previous
    /// record of this one (same file and access, same destination, same call); 0 when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub repeats: u64,
}

impl Syscall {
    /// The kernel stopped it (killed the process, or refused the call).
    pub fn stopped(&self) -> bool {
        self.blocked || self.denied
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Root {
    /// Why the process is a root (`run`).
    pub reason: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentGap {
    /// Wall-clock ns of the last sign of life of the agent before (its last heartbeat, or its
    /// clean stop).
    pub since_ns: u64,
    /// Whether the agent before stopped cleanly (SIGTERM, Ctrl-C) rather than died.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clean_stop: bool,
    /// The same agent was stopped (SIGSTOP, a freezer, a hung disk), not restarted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
}

/// Why the kernel missed acts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlindCause {
    /// Records the kernel could not send (a ring was full).
    #[default]
    Lost,
    /// A ring overflowed as userspace read it.
    Overflow,
    /// A process was left unmarked: the kernel's table of watched processes was full.
    MarksFull,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlindSpot {
    pub cause: BlindCause,
    /// The tree's root pid; None when the kernel could not tell which tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_pid: Option<u32>,
    /// Wall-clock ns of the first and last loss in this report.
    pub since_ns: u64,
    pub until_ns: u64,
    /// Lost by record kind: "exec", "fork", "exit", "open", "credential_open", "rename",
    /// "syscall", "connect", "dns_query", "mark".
    #[serde(default)]
    pub counts: BTreeMap<String, u64>,
    /// A lost record was a credential-inode open.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub credential: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lost {
    /// Which buffer or map lost them (`events`, `marks`).
    pub source: String,
    /// Events lost since the previous `Lost` event of this source.
    pub count: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connect {
    pub tid: u32,
    /// `inet`, `inet6`, `unix`, or the `AF_*` number for others.
    pub family: String,
    /// `stream` (TCP for inet), `dgram` (UDP), `seqpacket`, `raw`, ... when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_type: Option<String>,
    /// The IP address (inet, inet6), as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// A unix socket's path; an abstract one starts with `@`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The result, or `-errno`, when the source knows it (the live sensor reports at the call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ret: Option<i64>,
    /// The kernel stopped the process at the call (`--enforce`, a tree that opened a credential
    /// file): the agent kills it or lets it go on after the engine's verdict.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// With `held`: held because no agent had read the kernel's records for a while
    /// (`--enforce` fails closed), not for the tree's credential reads (trace schema 7).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fail_closed: bool,
    /// The host (a name or an address) the process asked of credwatch's `--contain-net` proxy,
    /// which refused it: the process's own connect went to the proxy, and nothing further.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_refused: Option<String>,
    /// Identical acts of the process counted by the sensor, not sent, since the previous
    /// record of this one (same file and access, same destination, same call); 0 when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub repeats: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsQuery {
    pub tid: u32,
    /// The name asked for, lowercase, without the final dot; escaped (`\ddd`) where a label
    /// holds bytes other than letters, digits, `-` and `_`.
    pub name: String,
    /// `A`, `AAAA`, ... or `TYPE<n>`.
    pub qtype: String,
    /// The resolver it was sent to (`address:port`, `[v6]:port`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

/// `path` with `.`, `..` and doubled `/` resolved lexically, as an absolute path. Only for
/// paths no kernel resolved: it cannot know about symlinks.
pub fn normalize_path(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}

impl Open {
    /// The path a rule should match: the kernel's absolute path when known, else the path as
    /// given.
    pub fn target_path(&self) -> &str {
        self.abs_path.as_deref().unwrap_or(&self.path)
    }
}

/// For tests: an exec of `/usr/bin/<args[0]>` in `/home/alice/app`, the project of the reports'
/// and the incident page's tests.
#[cfg(test)]
pub(crate) fn test_exec(time_ns: u64, pid: u32, ppid: u32, args: &[&str], env: &[(&str, &str)]) -> Event {
    Event {
        time_ns,
        pid,
        data: EventData::Exec(Exec {
            ppid,
            filename: format!("/usr/bin/{}", args[0]),
            executable: format!("/usr/bin/{}", args[0]),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            cwd: "/home/alice/app".into(),
            env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            ..Exec::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_are_the_trace_tags() {
        let every_kind = [
            EventData::Exec(Exec::default()),
            EventData::Fork(Fork::default()),
            EventData::Exit(Exit::default()),
            EventData::Open(Open::default()),
            EventData::Rename(Rename::default()),
            EventData::Syscall(Syscall::default()),
            EventData::Root(Root::default()),
            EventData::Lost(Lost::default()),
            EventData::Connect(Connect::default()),
            EventData::DnsQuery(DnsQuery::default()),
            EventData::AgentGap(AgentGap::default()),
            EventData::BlindSpot(BlindSpot::default()),
        ];
        assert_eq!(every_kind.len(), EventData::KINDS.len());
        for (index, data) in every_kind.into_iter().enumerate() {
            assert_eq!(data.kind_index(), index);
            let tag = serde_json::to_value(Event { time_ns: 1, pid: 1, data }).unwrap()["kind"].clone();
            assert_eq!(tag, EventData::KINDS[index]);
        }
    }

    #[test]
    fn keeps_only_attribution_variables() {
        let block = b"HOME=/home/a\0NPM_TOKEN=secret\0npm_package_name=evil\0npm_lifecycle_event=postinstall\0";
        let env = attribution_env(block);
        assert_eq!(env.len(), 3);
        assert_eq!(env["HOME"], "/home/a");
        assert!(!env.contains_key("NPM_TOKEN"));
        assert_eq!(env["npm_package_name"], "evil");
        assert_eq!(env["npm_lifecycle_event"], "postinstall");
    }

    #[test]
    fn an_exec_keeps_its_project_through_json_and_old_ones_read_without() {
        let exec = Exec {
            filename: "/usr/bin/python3".into(),
            project: Some(Project { name: "local-dir".into(), version: None, source: "setup.cfg".into() }),
            ..Exec::default()
        };
        let event = Event { time_ns: 1, pid: 7, data: EventData::Exec(exec) };
        let line = serde_json::to_string(&event).unwrap();
        assert!(line.contains(r#""project":{"name":"local-dir","source":"setup.cfg"}"#), "{line}");
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), event);
        let old = r#"{"time_ns":1,"pid":7,"kind":"exec","ppid":1,"filename":"x","executable":"x","args":[],"cwd":"/","uid":0,"gid":0}"#;
        let EventData::Exec(exec) = serde_json::from_str::<Event>(old).unwrap().data else { panic!() };
        assert_eq!(exec.project, None);
    }

    #[test]
    fn egress_events_round_trip_through_json() {
        let connect = Event {
            time_ns: 2,
            pid: 7,
            data: EventData::Connect(Connect {
                tid: 7,
                family: "inet".into(),
                address: Some("127.0.0.9".into()),
                port: Some(8080),
                ..Connect::default()
            }),
        };
        let line = serde_json::to_string(&connect).unwrap();
        assert!(line.contains(r#""kind":"connect""#) && !line.contains("held"), "{line}");
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), connect);
        let query = Event {
            time_ns: 3,
            pid: 7,
            data: EventData::DnsQuery(DnsQuery {
                tid: 8,
                name: "collector.exfil.invalid".into(),
                qtype: "A".into(),
                server: Some("127.0.0.53:53".into()),
            }),
        };
        let line = serde_json::to_string(&query).unwrap();
        assert!(line.contains(r#""kind":"dns_query""#), "{line}");
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), query);
    }

    #[test]
    fn round_trips_through_json() {
        let event = Event {
            time_ns: 1,
            pid: 42,
            data: EventData::Open(Open {
                tid: 42,
                syscall: "openat".into(),
                dirfd: -100,
                path: ".npmrc".into(),
                abs_path: Some("/home/a/.npmrc".into()),
                ret: 3,
                ..Open::default()
            }),
        };
        let line = serde_json::to_string(&event).unwrap();
        assert!(line.contains(r#""kind":"open""#), "{line}");
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), event);
    }
}
