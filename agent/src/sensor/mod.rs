//! The live sensor: loads the kernel programs (tracepoints), fills their maps and turns their
//! ring buffer records into [`Event`]s. It holds no detection logic.

mod backend;
mod blind;
pub mod btf;
mod canary;
pub mod cgroups;
pub mod credentials;
mod doctor;
pub mod kernel_log;
pub mod offsets;
pub mod pins;
mod project;
mod script;
mod seed;

use std::{
    io::{self, Read as _},
    os::{
        fd::{AsFd, AsRawFd},
        unix::net::UnixStream,
    },
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, HashMap, IterableMap, Map, MapData, MapError, PerCpuArray, RingBuf},
    programs::{links::FdLink, Program, ProgramError, RawTracePoint, TracePoint},
    Btf as AyaBtf, Ebpf, EbpfError, EbpfLoader,
};
use credwatch_common::{
    config_flag, lost_index, manager_flag, mark_flag, net_syscall, open_syscall, rename_syscall, syscall_family,
    tamper_syscall, Config, CredInode, HookedSyscall, InodeKey, LostTree, ManagerValue, Mark, SparedExe,
    FAIL_CLOSED_AFTER_NS, MANAGER_NAME_LEN, MAX_EXEC_RECORD, MODULE_KEY_LEN, NO_CGROUP_SUBSYS,
};
use thiserror::Error;

pub use self::{
    backend::{bpf_lsm_active, syscall_function, Backend, SensorOptions},
    blind::{MapSizeError, MapSizes, SIZABLE_MAPS},
    doctor::{doctor, DoctorReport},
};
use self::{
    blind::TreeLosses,
    btf::BtfError,
    canary::{Canary, Verdict, CANARY_INTERVAL},
    credentials::{CredentialTable, DirWatch, FULL_RESCAN_INTERVAL, MIN_RESCAN_GAP, RESCAN_AFTER_CHANGE},
    pins::{Gap, Pins, Started, FORK_RECORD},
};
use credwatch_core::{
    event::{AgentGap, Event, EventData, Lost},
    record::{self, Decoder},
    rules::{manager::Manager, schema::Action, Rule, RuleSet},
};

/// The kernel programs, built by `cargo xtask build` and embedded by build.rs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/credwatch.bpf.o"));

/// `Mark::manager` of a root made by [`Sensor::mark_root`]: no manager exec made it.
pub use credwatch_common::NO_MANAGER;

/// Shortest time between two reads of the bulk ring buffer while records flow. Its fd polls
/// readable whenever it holds a record, so reading it as soon as it is would take the records a
/// few at a time, at a few syscalls each; meanwhile only the priority ring is waited on. At
/// 600k opens/s, 10 ms of records fill a quarter of the 4 MiB ring. Once a read finds the bulk
/// ring empty, both rings are waited on until the next timer: the kernel wakes the agent on
/// the first record after it caught up, so an idle agent sleeps.
const BATCH_INTERVAL: Duration = Duration::from_millis(10);
/// How often the agent writes `HEARTBEAT` (after a drain, and so at least this often while
/// idle): the kernel fails closed under `--enforce` when it is older than
/// `FAIL_CLOSED_AFTER_NS`, 5 of these.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// Two drains further apart than this on the monotonic clock (a suspend is not a gap): the
/// agent was stopped (SIGSTOP, a freezer, a hung disk, a long swap-in), and says so with an
/// `AgentGap { stopped }` before what waited. The same as the kernel's fail-closed delay, so
/// that every act the kernel refused for want of an agent falls in a reported gap.
const STOPPED_GAP: Duration = Duration::from_nanos(FAIL_CLOSED_AFTER_NS);
const TRACEFS: &str = "/sys/kernel/tracing";

/// The raw tracepoints: program (function) name = tracepoint name.
const RAW_TRACEPOINTS: &[&str] = &["sched_process_exec", "sched_process_fork", "sched_process_exit"];
/// A hooked syscall: its `syscalls:sys_enter_NAME` and `sys_exit_NAME` tracepoints run the
/// entry and exit programs of its family, which learn which syscall it is from `SYSCALLS`.
struct SyscallHook {
    name: &'static str,
    /// The architecture's number (`__syscall_nr` in the tracepoint records).
    number: i64,
    /// One of [`syscall_family`], and the family's own number for it.
    family: u32,
    syscall: u32,
    /// Fail to start without it. The others exist only on some kernels: the module syscalls
    /// only with modules, io_uring only with io_uring.
    required: bool,
}

/// The programs (entry, exit) that serve a hooked syscall: one pair per [`syscall_family`],
/// but for `openat` and `openat2`, whose entries have a program of their own (their records
/// have four arguments, which it loads directly). The net family reports at entry only.
fn hook_programs(hook: &SyscallHook) -> (&'static str, Option<&'static str>) {
    match hook.family {
        syscall_family::OPEN if matches!(hook.syscall, open_syscall::OPENAT | open_syscall::OPENAT2) => {
            ("openat_enter", Some("open_exit"))
        }
        syscall_family::OPEN => ("open_enter", Some("open_exit")),
        syscall_family::RENAME => ("rename_enter", Some("rename_exit")),
        syscall_family::NET => ("net_enter", None),
        _ => ("tamper_enter", Some("tamper_exit")),
    }
}

/// Fills `SYSCALLS`: which family and syscall each hooked syscall number is.
fn fill_syscalls(ebpf: &mut Ebpf, hooks: &[SyscallHook]) -> Result<(), SensorError> {
    // Borrowed, not taken: a taken map is closed when dropped, and programs loaded after would
    // refer to a closed fd.
    let name = "SYSCALLS";
    let map = ebpf.map_mut(name).ok_or(SensorError::Missing { what: "map", name })?;
    let mut syscall_map: Array<_, HookedSyscall> = Array::try_from(map).map_err(map_err(name))?;
    for hook in hooks {
        let value = HookedSyscall { family: hook.family, syscall: hook.syscall };
        syscall_map.set(hook.number as u32, value, 0).map_err(map_err("SYSCALLS"))?;
    }
    Ok(())
}

/// The fentry backend's programs, each with its targets, the costliest to verify first (the
/// open exit walks a path); with `lsm`, the BPF LSM hooks too. Also the `Config::lsm_syscalls`
/// they refuse.
fn fentry_work(hooks: &[SyscallHook], lsm: bool) -> (Vec<backend::Work>, u32) {
    let mut work: Vec<backend::Work> = Vec::new();
    let mut add = |program: &'static str, target: String| match work.iter_mut().find(|w| w.program == program) {
        Some(item) => item.targets.push(target),
        None => work.push(backend::Work { program, targets: vec![target] }),
    };
    for hook in hooks {
        for &program in backend::family_programs(hook.family, lsm) {
            add(program, syscall_function(hook.name));
        }
    }
    let mut lsm_syscalls = 0;
    if lsm {
        for &(program, hook, refuses) in backend::LSM_HOOKS {
            add(program, hook.to_owned());
            lsm_syscalls |= refuses;
        }
    }
    work.sort_by_key(|item| {
        std::cmp::Reverse(if item.program == "fexit_open" { usize::MAX } else { item.targets.len() })
    });
    (work, lsm_syscalls)
}

/// A syscall the running backend does not watch on this kernel, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unwatched {
    pub syscall: &'static str,
    pub why: String,
}

/// The syscalls the fentry backend hooks on this kernel (decided from its BTF, so that start-up
/// and `doctor` agree), and those it leaves out: a function the kernel lacks (a module syscall
/// without modules).
fn fentry_hooks(btf: &btf::Btf) -> (Vec<SyscallHook>, Vec<Unwatched>) {
    let (hooks, missing): (Vec<SyscallHook>, _) =
        syscall_hooks().into_iter().partition(|hook| btf.has_function(&syscall_function(hook.name)));
    let unwatched = missing
        .into_iter()
        .map(|hook| Unwatched { syscall: hook.name, why: format!("the kernel has no {}", syscall_function(hook.name)) })
        .collect();
    (hooks, unwatched)
}

fn syscall_hooks() -> Vec<SyscallHook> {
    use syscall_family::{NET, OPEN, RENAME, TAMPER};
    let hook = |name, number, family, syscall, required| SyscallHook { name, number, family, syscall, required };
    #[allow(unused_mut)]
    let mut hooks = vec![
        hook("openat", libc::SYS_openat, OPEN, open_syscall::OPENAT, true),
        hook("openat2", libc::SYS_openat2, OPEN, open_syscall::OPENAT2, true),
        hook("open_by_handle_at", libc::SYS_open_by_handle_at, OPEN, open_syscall::OPEN_BY_HANDLE_AT, true),
        hook("renameat2", libc::SYS_renameat2, RENAME, rename_syscall::RENAMEAT2, true),
        hook("linkat", libc::SYS_linkat, RENAME, rename_syscall::LINKAT, true),
        hook("symlinkat", libc::SYS_symlinkat, RENAME, rename_syscall::SYMLINKAT, true),
        hook("ptrace", libc::SYS_ptrace, TAMPER, tamper_syscall::PTRACE, true),
        hook("process_vm_readv", libc::SYS_process_vm_readv, TAMPER, tamper_syscall::PROCESS_VM_READV, true),
        hook("process_vm_writev", libc::SYS_process_vm_writev, TAMPER, tamper_syscall::PROCESS_VM_WRITEV, true),
        hook("bpf", libc::SYS_bpf, TAMPER, tamper_syscall::BPF, true),
        hook("init_module", libc::SYS_init_module, TAMPER, tamper_syscall::INIT_MODULE, false),
        hook("finit_module", libc::SYS_finit_module, TAMPER, tamper_syscall::FINIT_MODULE, false),
        hook("kill", libc::SYS_kill, TAMPER, tamper_syscall::KILL, true),
        hook("tkill", libc::SYS_tkill, TAMPER, tamper_syscall::TKILL, true),
        hook("tgkill", libc::SYS_tgkill, TAMPER, tamper_syscall::TGKILL, true),
        hook("pidfd_send_signal", libc::SYS_pidfd_send_signal, TAMPER, tamper_syscall::PIDFD_SEND_SIGNAL, true),
        hook("io_uring_setup", libc::SYS_io_uring_setup, TAMPER, tamper_syscall::IO_URING_SETUP, false),
        hook("connect", libc::SYS_connect, NET, net_syscall::CONNECT, true),
        hook("sendto", libc::SYS_sendto, NET, net_syscall::SENDTO, true),
        hook("sendmsg", libc::SYS_sendmsg, NET, net_syscall::SENDMSG, true),
        hook("sendmmsg", libc::SYS_sendmmsg, NET, net_syscall::SENDMMSG, true),
    ];
    // The legacy syscalls exist only on some architectures (not arm64).
    #[cfg(target_arch = "x86_64")]
    hooks.extend([
        hook("open", libc::SYS_open, OPEN, open_syscall::OPEN, true),
        hook("creat", libc::SYS_creat, OPEN, open_syscall::CREAT, true),
        hook("rename", libc::SYS_rename, RENAME, rename_syscall::RENAME, true),
        hook("renameat", libc::SYS_renameat, RENAME, rename_syscall::RENAMEAT, true),
        hook("link", libc::SYS_link, RENAME, rename_syscall::LINK, true),
        hook("symlink", libc::SYS_symlink, RENAME, rename_syscall::SYMLINK, true),
    ]);
    hooks
}

/// The programs the kernel takes longest to verify, costliest first (`verified_insns`): exec
/// walks two paths, the open exit one, the rename entry one or two.
const COSTLIEST_TO_VERIFY: &[&str] = &["sched_process_exec", "open_exit", "rename_enter"];

/// io_uring requests pass no syscall tracepoint; present only on kernels with io_uring.
const URING_PROGRAM: &str = "io_uring_submit_req";
/// The tracepoints the program attaches to, the first the kernel has: `io_uring_submit_sqe`
/// (5.5 to 6.1 at least: Debian's 6.1.176 has only it) was renamed `io_uring_submit_req` later;
/// both fire in the submitting task and carry the opcode, which the program reads at the format's offset.
const URING_TRACEPOINTS: &[&str] = &["io_uring_submit_req", "io_uring_submit_sqe"];

/// The io_uring submission tracepoint of this kernel, if it has io_uring.
fn uring_tracepoint() -> Option<&'static str> {
    URING_TRACEPOINTS.iter().copied().find(|name| Path::new(TRACEFS).join("events/io_uring").join(name).is_dir())
}

/// The `Config::block_syscalls` mask: the syscalls named by `kill` rules. A rule that names
/// operations (`PTRACE_ATTACH`) is left to userspace: the kernel checks names only, and
/// killing every operation would block more than the rule says.
fn block_syscalls(rules: &[Rule]) -> u32 {
    rules
        .iter()
        .filter(|rule| rule.action == Action::Kill)
        .filter_map(|rule| rule.syscalls.as_ref())
        .filter(|syscalls| syscalls.operations.is_empty())
        .flat_map(|syscalls| syscalls.names.0.iter())
        .filter_map(|name| record::tamper_number(name))
        .filter(|&number| number != tamper_syscall::IO_URING_SUBMIT_REQ)
        .fold(0, |mask, number| mask | 1 << number)
}

/// Where the record of io_uring's submission `tracepoint` keeps its opcode, per its tracefs format.
fn uring_opcode_offset(tracepoint: &str) -> u32 {
    let format = std::fs::read_to_string(Path::new(TRACEFS).join("events/io_uring").join(tracepoint).join("format"))
        .unwrap_or_default();
    format
        .lines()
        .find(|line| line.contains(" opcode;"))
        .and_then(|line| line.split("offset:").nth(1))
        .and_then(|rest| rest.split(';').next())
        .and_then(|offset| offset.trim().parse().ok())
        .unwrap_or(0)
}

#[derive(Debug, Error)]
pub enum SensorError {
    #[error("kernel BTF: {0}")]
    Btf(#[from] BtfError),
    #[error("mounting tracefs at {TRACEFS}: {0}")]
    Tracefs(io::Error),
    #[error("raising RLIMIT_MEMLOCK: {0}")]
    Memlock(io::Error),
    #[error("loading the eBPF object: {0}")]
    Load(#[from] EbpfError),
    #[error("the eBPF object has no {what} `{name}`")]
    Missing { what: &'static str, name: &'static str },
    #[error("program `{name}` of the eBPF object is not a tracepoint program")]
    NotTracepoint { name: &'static str },
    #[error("a thread loading the eBPF programs panicked")]
    LoaderPanicked,
    #[error("map `{name}`: {source}")]
    Map { name: &'static str, source: MapError },
    /// Load errors carry the verifier log in their message.
    #[error("program `{name}`: {source}")]
    Program { name: &'static str, source: ProgramError },
    /// Load errors carry the verifier log in their message.
    #[error("program `{name}` on {target}: {source}")]
    Tracing { name: &'static str, target: String, source: ProgramError },
    #[error("the fentry backend cannot run here: {0}")]
    Fentry(String),
    #[error("attaching program `{name}` to tracepoint {category}:{tracepoint}: {source}")]
    Attach { name: &'static str, category: &'static str, tracepoint: String, source: Box<ProgramError> },
    #[error("manager `{manager}`: {what} `{value}` is longer than the kernel key ({max} bytes)")]
    KeyTooLong { manager: String, what: &'static str, value: String, max: usize },
    #[error("duplicating the fd of map `{name}`: {source}")]
    Dup { name: &'static str, source: io::Error },
    #[error("reading /proc: {0}")]
    Proc(io::Error),
    #[error("waiting for the ring buffer: {0}")]
    Poll(io::Error),
    #[error("mounting bpffs at /sys/fs/bpf: {0}")]
    Bpffs(io::Error),
    #[error("{path}: {source}")]
    PinDir { path: PathBuf, source: io::Error },
    #[error("pinning {path}: {source}")]
    Pin { path: PathBuf, source: aya::pin::PinError },
    #[error("pinned map {path}: {source}")]
    PinnedMap { path: PathBuf, source: MapError },
    #[error("the link of program `{name}` cannot be pinned: {source}")]
    Link { name: &'static str, source: aya::programs::links::LinkError },
    #[error(
        "credwatch (pid {pid}) is already running the kernel programs pinned in {dir}; `credwatch stop --pin-dir {dir}` stops it"
    )]
    AlreadyRunning { pid: u32, dir: String },
}

/// The `Lost` event sources (`Lost::source`) of the sensor.
pub mod lost_source {
    /// The bulk ring buffer was full: opens, execs, forks, exits or renames were dropped.
    pub const EVENTS: &str = "events";
    /// The priority ring buffer was full: credential-inode opens, blocks or tamper syscalls
    /// were dropped.
    pub const PRIORITY: &str = "priority";
    /// The `MARKS` map was full: processes of a package tree went unwatched.
    pub const MARKS: &str = "marks";
    /// The canary's records did not come back: programs were detached, so events are being
    /// missed from then on (`count` is the number of failed canaries).
    pub const DETACHED: &str = "detached";
}

/// Which ring buffers [`Sensor::wait`] waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rings {
    PriorityOnly,
    Both,
}

/// Why [`Sensor::wait`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wake {
    /// Records are waiting, or the slice passed.
    Ready,
    /// A signal handler ran (on this thread, or wrote to the waker on another).
    Signal,
}

/// Counters since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SensorStats {
    /// Records decoded into events.
    pub events: u64,
    /// Records the kernel could not put in the bulk ring buffer (full).
    pub lost: u64,
    /// Records the kernel could not put in the priority ring buffer (full).
    pub priority_lost: u64,
    /// Credential files in the kernel's inode table after the last scan.
    pub credential_files: u64,
    /// Canaries whose records did not come back (programs detached).
    pub detached: u64,
    /// Processes of a package tree that could not be marked (`MARKS` full).
    pub marks_full: u64,
    /// Records that were short, mis-sized or of an unknown kind (skipped).
    pub malformed: u64,
}

/// What [`Sensor::protect`] watches for by inode, and whether it blocks.
pub struct Protection {
    /// The rules whose targets are looked for (all of them: `kill` ones are blocked, their
    /// actors spared).
    pub rules: RuleSet,
    /// Homes to scan; `HOME`s of watched processes are added as execs show them.
    pub homes: Vec<std::path::PathBuf>,
    /// Kill on opens of `kill` targets and on the syscalls `kill` rules name.
    pub enforce: bool,
}

pub struct Sensor {
    /// The loaded object, held for its programs: without pins they own their links, and
    /// dropping it detaches them. None when the kernel side was adopted from pins.
    _ebpf: Option<Ebpf>,
    marks: HashMap<MapData, u32, Mark>,
    events: RingBuf<MapData>,
    priority: RingBuf<MapData>,
    lost: PerCpuArray<MapData, u64>,
    config_map: Array<MapData, Config>,
    config: Config,
    cred_map: HashMap<MapData, InodeKey, CredInode>,
    spared_map: HashMap<MapData, InodeKey, SparedExe>,
    /// The rules of [`Sensor::protect`], for the spared executables at each rescan.
    protected: Option<RuleSet>,
    /// With [`Sensor::protect`]: the table and when to scan it next.
    credentials: Option<(CredentialTable, Instant)>,
    /// inotify on the directories of the table's targets (none if inotify could not start:
    /// then only the periodic rescans keep the table current).
    dir_watch: Option<DirWatch>,
    last_scan: Instant,
    /// See [`Sensor::wake_on`].
    waker: Option<UnixStream>,
    /// Adopted: the credential paths of the agent before, for the table (its indexes are in
    /// `CRED_INODES` and in the records that waited).
    restored_paths: Vec<String>,
    canary: Option<Canary>,
    next_canary: Instant,
    /// When the bulk ring last gave records, while they flow (see [`BATCH_INTERVAL`]).
    last_drain: Option<Instant>,
    /// When the rings were last drained, on the monotonic clock and on `CLOCK_BOOTTIME` (see
    /// [`STOPPED_GAP`]).
    last_read: Option<(Instant, u64)>,
    /// `HEARTBEAT`, and when it is next written.
    heartbeat: Array<MapData, u64>,
    next_beat: Instant,
    tree_losses: TreeLosses,
    decoder: Decoder,
    stats: SensorStats,
    /// The pinned set this agent runs (`watch`), or none (`run`: detached at exit).
    pins: Option<Pins>,
    /// Adopted from pins: the gap, until [`Sensor::seed`] reports it.
    gap: Option<Gap>,
    /// Programs attached, one per tracepoint, syscall function or LSM hook (the links).
    programs_attached: u64,
    /// The links of the fentry backend's tracing programs (without pins), held: dropping them
    /// detaches the programs.
    _links: Vec<FdLink>,
    backend: Backend,
    /// BPF LSM hooks are attached: `--enforce` refuses rather than kills.
    lsm: bool,
    /// With `--sensor auto`: why the fentry backend did not load.
    fallback: Option<String>,
    /// The syscalls the backend does not watch on this kernel.
    unwatched: Vec<Unwatched>,
    /// The cgroup hierarchies the exec records name (seeded processes get the same from
    /// `/proc`).
    hierarchies: cgroups::Hierarchies,
}

/// The sensor's kernel figures for the metrics, read on another thread (the metrics endpoint's,
/// at a scrape) through handles on the maps of its own: counting a hash map's entries takes a
/// syscall per entry, which the sensor's loop does not pay.
pub struct KernelGauges {
    /// Each with its capacity.
    marks: (HashMap<MapData, u32, Mark>, u32),
    cred_inodes: (HashMap<MapData, InodeKey, CredInode>, u32),
    spared_exes: (HashMap<MapData, InodeKey, SparedExe>, u32),
    programs_attached: u64,
}

/// What [`KernelGauges::read`] found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelCounts {
    /// Processes marked as package code (`MARKS` entries).
    pub marked_processes: u64,
    /// Per map (`marks`, `credential_inodes`, `spared_exes`): entries in use over capacity.
    pub map_fill: Vec<(&'static str, f64)>,
    pub programs_attached: u64,
}

impl KernelGauges {
    pub fn read(&self) -> KernelCounts {
        fn fill<K: aya::Pod, V: aya::Pod>((map, capacity): &(HashMap<MapData, K, V>, u32)) -> (u64, f64) {
            // The kernel restarts a walk whose key was just deleted: bounded, a map that changes
            // meanwhile is counted approximately, never for ever.
            let used = map.keys().take(*capacity as usize).filter(Result::is_ok).count() as u64;
            (used, if *capacity == 0 { 0.0 } else { used as f64 / f64::from(*capacity) })
        }
        let (marked_processes, marks) = fill(&self.marks);
        KernelCounts {
            marked_processes,
            map_fill: vec![
                ("marks", marks),
                ("credential_inodes", fill(&self.cred_inodes).1),
                ("spared_exes", fill(&self.spared_exes).1),
            ],
            programs_attached: self.programs_attached,
        }
    }
}

/// A second handle on the map of `map` (its fd duplicated), and its capacity.
fn second_handle<K: aya::Pod, V: aya::Pod>(
    map: &HashMap<MapData, K, V>,
    name: &'static str,
) -> Result<(HashMap<MapData, K, V>, u32), SensorError> {
    let data = IterableMap::map(map);
    let capacity = data.info().map_err(map_err(name))?.max_entries();
    let fd = data.fd().as_fd().try_clone_to_owned().map_err(|source| SensorError::Dup { name, source })?;
    let data = MapData::from_fd(fd).map_err(map_err(name))?;
    Ok((HashMap::try_from(Map::HashMap(data)).map_err(map_err(name))?, capacity))
}

impl Sensor {
    /// Stops the sensor. A pinned kernel side stays attached and recording for the next agent,
    /// which is told this one stopped cleanly; its directory is returned. Otherwise the programs
    /// are detached (see [`Sensor::detach_in_background`]).
    pub fn finish(mut self) -> Result<Option<PathBuf>, SensorError> {
        match self.pins.take() {
            Some(pins) => {
                let dir = pins.dir.clone();
                pins.leave()?;
                Ok(Some(dir))
            }
            None => {
                self.detach_in_background();
                Ok(None)
            }
        }
    }

    /// Stops the sensor without making the caller wait for the kernel: closing each program's
    /// link waits for an RCU grace period (tens of ms apiece here, seconds for all of them), so
    /// a child process inherits the links and closes them once this process has exited. The
    /// programs are made inert first: no new roots, no kills.
    pub fn detach_in_background(mut self) {
        self.config.flags = 0;
        // Best effort: if this fails the programs simply keep their settings a few seconds more.
        let _ = self.config_map.set(0, self.config, 0);
        // SAFETY: getpid(2) and fork(2) have no preconditions.
        let parent = unsafe { libc::getpid() };
        if unsafe { libc::fork() } == 0 {
            // SAFETY: the child of a multi-threaded process calls only async-signal-safe
            // functions (close, prctl, getppid, pause, _exit). It lets go of the terminal and
            // pipes at once, and dies (closing the links) when its parent has gone, which is
            // after the parent closed its own copies.
            unsafe {
                for fd in 0..=2 {
                    libc::close(fd);
                }
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    libc::_exit(0);
                }
                loop {
                    libc::pause();
                }
            }
        }
    }
}

impl Drop for Sensor {
    fn drop(&mut self) {
        if let Some(canary) = self.canary.take() {
            canary.finish();
        }
    }
}

/// The initial PID namespace's inode number (`PROC_PID_INIT_INO`, include/linux/proc_ns.h).
const INITIAL_PID_NAMESPACE: u64 = 0xEFFF_FFFC;

/// Says so when the agent runs in a PID namespace of its own (a container without the host's):
/// the kernel programs know processes by the host's pids and the agent hands them its own
/// namespace's, so they protect another process than the agent, and its canary (marked by its
/// pid here) never reports back.
fn warn_in_a_pid_namespace() {
    let Ok(namespace) = std::fs::metadata("/proc/self/ns/pid") else { return };
    if std::os::unix::fs::MetadataExt::ino(&namespace) != INITIAL_PID_NAMESPACE {
        tracing::warn!(
            "credwatch runs in a PID namespace of its own, and the kernel programs know processes by the host's \
             pids: its protection of itself (signal-to-agent, --enforce) guards another pid and its self-check \
             reports the programs detached; run it in the host's PID namespace (docker --pid=host, Kubernetes \
             hostPID: true, systemd-nspawn cannot)"
        );
    }
}

fn map_err(name: &'static str) -> impl Fn(MapError) -> SensorError {
    move |source| SensorError::Map { name, source }
}

fn program_err(name: &'static str) -> impl Fn(ProgramError) -> SensorError {
    move |source| SensorError::Program { name, source }
}

/// Loads the `wanted` programs. The kernel verifies each on the loading thread, and that is
/// most of start-up, so one thread per core takes the next program from a queue: `wanted`
/// lists the costliest to verify first (the path walks), and the cheap ones fill in behind.
fn load_programs(ebpf: &mut Ebpf, wanted: &[&'static str]) -> Result<(), SensorError> {
    let mut by_name: std::collections::HashMap<&str, &mut Program> = ebpf.programs_mut().collect();
    let mut queue = Vec::with_capacity(wanted.len());
    for &name in wanted {
        let program = by_name.remove(name).ok_or(SensorError::Missing { what: "program", name })?;
        // Loaded already, beside the fentry backend's programs.
        if program.fd().is_err() {
            queue.push((name, program));
        }
    }
    let queue = std::sync::Mutex::new(queue.into_iter());
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    std::thread::scope(|scope| {
        let loaders: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| loop {
                    let Some((name, program)) = queue.lock().unwrap_or_else(|e| e.into_inner()).next() else {
                        return Ok(());
                    };
                    match program {
                        Program::TracePoint(program) => program.load(),
                        Program::RawTracePoint(program) => program.load(),
                        _ => return Err(SensorError::NotTracepoint { name }),
                    }
                    .map_err(program_err(name))?;
                })
            })
            .collect();
        loaders.into_iter().try_for_each(|loader| loader.join().unwrap_or(Err(SensorError::LoaderPanicked)))
    })
}

/// Mounts tracefs when it is not there (some machines boot without it).
fn ensure_tracefs() -> Result<(), SensorError> {
    if Path::new(TRACEFS).join("events").is_dir() {
        return Ok(());
    }
    // SAFETY: NUL-terminated literals; no data argument.
    let rc = unsafe {
        libc::mount(c"tracefs".as_ptr(), c"/sys/kernel/tracing".as_ptr(), c"tracefs".as_ptr(), 0, std::ptr::null())
    };
    if rc != 0 {
        return Err(SensorError::Tracefs(io::Error::last_os_error()));
    }
    Ok(())
}

/// Maps and program memory are charged to RLIMIT_MEMLOCK on kernels before 5.11 (memcg since).
/// Unlimited when allowed, else as far as the hard limit goes (containers often cap it).
fn raise_memlock() -> Result<(), SensorError> {
    let unlimited = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: valid rlimit pointers for the duration of each call.
    unsafe {
        if libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) == 0 {
            return Ok(());
        }
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) != 0 {
            return Err(SensorError::Memlock(io::Error::last_os_error()));
        }
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) != 0 {
            return Err(SensorError::Memlock(io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// NUL-padded fixed-size key; `None` when `words` do not fit.
fn padded_key<const N: usize>(bytes: &[u8]) -> Option<[u8; N]> {
    let mut key = [0u8; N];
    key.get_mut(..bytes.len())?.copy_from_slice(bytes);
    Some(key)
}

/// The kernel's tables of managers (the eBPF program's `MANAGERS`, `MANAGER_MODULES` and
/// `MANAGER_SCRIPTS` maps).
#[derive(Debug, Default)]
pub struct ManagerKeys {
    /// Exec basenames, and interpreters that need a module or a script to be a root.
    pub names: Vec<([u8; MANAGER_NAME_LEN], ManagerValue)>,
    /// Module words (`-m\0pip\0`) -> manager index.
    pub modules: Vec<([u8; MODULE_KEY_LEN], u32)>,
    /// Script stems (`yarn` of `yarn-*.cjs`) -> manager index.
    pub scripts: Vec<([u8; MANAGER_NAME_LEN], u32)>,
}

/// The kernel keys for `managers`: exec basenames, module words (`-m\0pip\0`) and script stems.
pub fn manager_keys(managers: &[Manager]) -> Result<ManagerKeys, SensorError> {
    let mut keys = ManagerKeys::default();
    let too_long = |manager: &Manager, what, value: &str| SensorError::KeyTooLong {
        manager: manager.name.clone(),
        what,
        value: value.to_owned(),
        max: if what == "module args" { MODULE_KEY_LEN } else { MANAGER_NAME_LEN },
    };
    for (index, manager) in managers.iter().enumerate() {
        let index = index as u32;
        for exec in &manager.execs {
            let key = padded_key(exec.as_bytes()).ok_or_else(|| too_long(manager, "exec", exec))?;
            // A plain exec is a root whatever its argv, even if another manager's interpreter.
            keys.names.retain(|(name, _)| *name != key);
            keys.names.push((key, ManagerValue { manager: index, flags: 0 }));
        }
        let mut interpreters = Vec::new();
        for module in &manager.modules {
            let joined: Vec<u8> = module.args.iter().flat_map(|w| w.bytes().chain([0])).collect();
            let key = padded_key(&joined).ok_or_else(|| too_long(manager, "module args", &module.args.join(" ")))?;
            keys.modules.push((key, index));
            interpreters.extend(module.interpreters.iter().map(|name| (name, manager_flag::NEEDS_MODULE)));
        }
        for scripts in &manager.scripts {
            for pattern in &scripts.files {
                let stem = credwatch_core::rules::manager::pattern_stem(pattern).unwrap_or(pattern);
                let key = padded_key(stem.as_bytes()).ok_or_else(|| too_long(manager, "script stem", stem))?;
                if !keys.scripts.contains(&(key, index)) {
                    keys.scripts.push((key, index));
                }
            }
            interpreters.extend(scripts.interpreters.iter().map(|name| (name, manager_flag::NEEDS_SCRIPT)));
        }
        for (name, flag) in interpreters {
            let key = padded_key(name.as_bytes()).ok_or_else(|| too_long(manager, "interpreter", name))?;
            match keys.names.iter_mut().find(|(existing, _)| *existing == key) {
                // A plain exec of the same basename wins.
                Some((_, value)) if value.flags == 0 => {}
                Some((_, value)) => value.flags |= flag,
                None => keys.names.push((key, ManagerValue { manager: index, flags: flag })),
            }
        }
    }
    Ok(keys)
}

impl Sensor {
    /// Loads and attaches the kernel programs. With `auto_roots`, an exec of one of `managers`
    /// makes a package root (`watch`); without, only [`Sensor::mark_root`] and [`Sensor::seed`]
    /// do (`run`). They are detached when the sensor stops.
    pub fn start(managers: &[Manager], auto_roots: bool, options: SensorOptions) -> Result<Sensor, SensorError> {
        warn_in_a_pid_namespace();
        Sensor::load(managers, auto_roots, None, options)
    }

    /// The backend running (never `Auto`).
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether BPF LSM hooks refuse under `--enforce` (else it kills).
    pub fn lsm(&self) -> bool {
        self.lsm
    }

    /// With `--sensor auto` on a kernel where fentry did not load: why.
    pub fn fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// The syscalls the running backend does not watch on this kernel, and why.
    pub fn unwatched(&self) -> &[Unwatched] {
        &self.unwatched
    }

    /// Like [`Sensor::start`] with `auto_roots` (`watch`), with a kernel side that outlives
    /// the agent, pinned in `dir` (see [`pins`]): a set of this build pinned there is adopted
    /// (programs never detached, what waited in the ring buffers read next), any other set is
    /// replaced. [`Sensor::finish`] leaves the set pinned; [`pins::stop`] detaches it.
    pub fn start_pinned(
        managers: &[Manager],
        dir: &Path,
        options: SensorOptions,
    ) -> Result<(Sensor, Started), SensorError> {
        warn_in_a_pid_namespace();
        pins::ensure_bpffs()?;
        pins::remove_abandoned(dir)?;
        // The syscall tracepoints (the tracepoint backend) and io_uring's (both) attach through
        // a perf event where the kernel has no perf links (aya falls back to the perf ioctl).
        if !aya::features().bpf_perf_link() {
            if dir.exists() {
                pins::check_is_set(dir)?;
            }
            let sensor = Sensor::load(managers, true, None, options)?;
            return Ok((sensor, Started::Unpinned(pins::NO_TRACEPOINT_LINKS.to_owned())));
        }
        let mut replaced = None;
        if dir.exists() {
            pins::check_is_set(dir)?;
            match pins::read_state(dir) {
                Ok(state) => {
                    if let Some(pid) = pins::running_agent(&state) {
                        return Err(SensorError::AlreadyRunning { pid, dir: dir.display().to_string() });
                    }
                    let (pinned, _) = backend::pinned_backend(dir);
                    if state.object_id != pins::object_id() {
                        replaced = Some("it was loaded from another build of the eBPF programs".to_owned());
                    } else if options.backend != Backend::Auto && options.backend != pinned {
                        replaced =
                            Some(format!("it runs the {pinned} backend, not the {} one asked for", options.backend));
                    } else {
                        match Sensor::adopt(managers, dir, state) {
                            Ok(sensor) => {
                                if !options.map_sizes.is_empty() {
                                    tracing::warn!(
                                        "the kernel side pinned in {} keeps its map sizes: {} applies at the next \
                                         load (after `credwatch stop`)",
                                        dir.display(),
                                        options.map_sizes
                                    );
                                }
                                let started = sensor.gap.map_or(Started::Fresh, Started::Adopted);
                                return Ok((sensor, started));
                            }
                            Err(error) => replaced = Some(format!("adopting it failed: {error}")),
                        }
                    }
                }
                Err(why) => replaced = Some(why),
            }
        }
        // Built aside and moved into place whole; the set it replaces runs until then.
        let building = pins::building_dir(dir);
        pins::create_dir(&building)?;
        let result = Sensor::load(managers, true, Some(&building), options).and_then(|mut sensor| {
            if replaced.is_some() {
                pins::remove(dir)?;
            }
            pins::publish(&building, dir)?;
            if let Some(pins) = &mut sensor.pins {
                pins.dir = dir.to_path_buf();
            }
            Ok(sensor)
        });
        match result {
            Ok(sensor) => Ok((sensor, replaced.map_or(Started::Fresh, Started::Replaced))),
            Err(error) => {
                let _ = pins::remove(&building);
                Err(error)
            }
        }
    }

    /// Takes over the set pinned in `dir` by an agent of this build that is gone: the maps are
    /// opened, the agent's pid in `CONFIG` (spared from reports, protected by `--enforce`)
    /// becomes this one, and the managers come from the rules of now.
    fn adopt(managers: &[Manager], dir: &Path, previous: pins::AgentState) -> Result<Sensor, SensorError> {
        raise_memlock()?;
        let keys = manager_keys(managers)?;
        let until_boot_ns = boot_ns();
        let mut pins = Pins::open(dir)?;
        let mut config_map: Array<MapData, Config> = pins::open_map(dir, "CONFIG", Map::Array)?;
        let mut config = config_map.get(&0, 0).map_err(map_err("CONFIG"))?;
        config.agent_tgid = std::process::id();
        // `--enforce` stays as it was until [`Sensor::protect`] says.
        config.flags = config_flag::AUTO_ROOTS | (config.flags & config_flag::ENFORCE);
        config_map.set(0, config, 0).map_err(map_err("CONFIG"))?;
        // Seeded processes name the hierarchies the kernel reads, which the agent that loaded
        // the set chose (the v1 controller's index needs the BTF, which adopting skips).
        let mut hierarchies = cgroups::Hierarchies::of_this_namespace().map_err(SensorError::Proc)?;
        if config.cgroup_subsys == NO_CGROUP_SUBSYS {
            hierarchies.v1 = None;
        }
        if config.cgroup_v2 == 0 {
            hierarchies.v2 = None;
        }
        let mut manager_map: HashMap<MapData, [u8; MANAGER_NAME_LEN], ManagerValue> =
            pins::open_map(dir, "MANAGERS", Map::HashMap)?;
        let mut module_map: HashMap<MapData, [u8; MODULE_KEY_LEN], u32> =
            pins::open_map(dir, "MANAGER_MODULES", Map::HashMap)?;
        let mut script_map: HashMap<MapData, [u8; MANAGER_NAME_LEN], u32> =
            pins::open_map(dir, "MANAGER_SCRIPTS", Map::HashMap)?;
        replace_entries(&mut manager_map, &keys.names).map_err(map_err("MANAGERS"))?;
        replace_entries(&mut module_map, &keys.modules).map_err(map_err("MANAGER_MODULES"))?;
        replace_entries(&mut script_map, &keys.scripts).map_err(map_err("MANAGER_SCRIPTS"))?;
        pins.claim()?;
        let restored_paths = pins.cred_paths();
        pins.cred_paths_kept = restored_paths.len();
        let [lost, priority_lost, marks_full] = previous.lost_seen;
        let decoder = Decoder::new();
        let programs_attached = pins::link_count(dir)?;
        let (backend, lsm) = backend::pinned_backend(dir);
        let tree_losses = TreeLosses::new(
            pins::open_map(dir, "LOST_TREES", Map::LruHashMap)?,
            Some(pins::open_map(dir, pins::LOST_REPORTED, Map::HashMap)?),
        );
        Ok(Sensor {
            _ebpf: None,
            marks: pins::open_map(dir, "MARKS", Map::HashMap)?,
            events: pins::open_map(dir, "EVENTS", Map::RingBuf)?,
            priority: pins::open_map(dir, "PRIORITY", Map::RingBuf)?,
            lost: pins::open_map(dir, "LOST", Map::PerCpuArray)?,
            config_map,
            config,
            cred_map: pins::open_map(dir, "CRED_INODES", Map::HashMap)?,
            spared_map: pins::open_map(dir, "SPARED_EXES", Map::HashMap)?,
            protected: None,
            credentials: None,
            dir_watch: None,
            last_scan: Instant::now(),
            waker: None,
            restored_paths,
            canary: None,
            next_canary: Instant::now() + CANARY_INTERVAL,
            last_drain: None,
            last_read: None,
            heartbeat: pins::open_map(dir, "HEARTBEAT", Map::Array)?,
            next_beat: Instant::now(),
            tree_losses,
            decoder,
            stats: SensorStats { lost, priority_lost, marks_full, ..SensorStats::default() },
            pins: Some(pins),
            gap: Some(Gap {
                since_ns: decoder.wall_ns(previous.heartbeat_ns),
                until_ns: decoder.wall_ns(until_boot_ns),
                clean_stop: previous.clean_stop == 1,
                previous_pid: previous.agent_tgid,
            }),
            programs_attached,
            _links: Vec::new(),
            backend,
            lsm,
            fallback: None,
            // Those the loading agent left out: decided from BTF alone, the same now.
            unwatched: match backend {
                Backend::Fentry => btf::Btf::from_sys_fs().map(|btf| fentry_hooks(&btf).1).unwrap_or_default(),
                _ => Vec::new(),
            },
            hierarchies,
        })
    }

    /// Loads and attaches the programs; with `pin_to`, pins the maps the agent reads and the
    /// links there (a set being built), so that the programs stay attached without the agent.
    fn load(
        managers: &[Manager],
        auto_roots: bool,
        pin_to: Option<&Path>,
        options: SensorOptions,
    ) -> Result<Sensor, SensorError> {
        ensure_tracefs()?;
        raise_memlock()?;
        let keys = manager_keys(managers)?;
        let decoder = Decoder::new();
        let hierarchies = cgroups::Hierarchies::of_this_namespace().map_err(SensorError::Proc)?;
        // aya's loader parses the kernel BTF whatever it is told (the programs carry no CO-RE
        // relocations: offsets come through CONFIG), and so does the offset resolver: both at
        // once, on two threads, since start-up time is what `credwatch run` adds to a command.
        // The fentry backend's loads need aya's own parse of the BTF (their attach targets).
        let want_fentry = options.backend != Backend::Tracepoint;
        let ((mut offsets, cgroup_subsys, btf), mut ebpf, aya_btf) = std::thread::scope(|scope| {
            let loader = scope.spawn(|| {
                // The verifier takes the level as a constant and drops the log calls above it.
                let level = kernel_log::level_byte();
                let mut loader = EbpfLoader::new();
                loader.btf(None).override_global(aya_log::LEVEL, &level, true);
                for (name, size) in options.map_sizes.iter() {
                    loader.map_max_entries(name, size);
                    // One entry per marked process, as MARKS (the kernel's repeats.rs).
                    if name == "MARKS" {
                        loader.map_max_entries("PROCESS_REPEATS", size);
                    }
                }
                loader.load(OBJECT)
            });
            let aya_btf = want_fentry.then(|| scope.spawn(AyaBtf::from_sys_fs));
            let offsets = btf::Btf::from_sys_fs()
                .and_then(|btf| Ok((offsets::kernel_offsets(&btf)?, hierarchies.subsys_index(&btf)?, btf)));
            let ebpf = loader.join().map_err(|_| SensorError::LoaderPanicked)?;
            let aya_btf = aya_btf
                .map(|thread| thread.join().map_err(|_| SensorError::LoaderPanicked))
                .transpose()?
                .map(|parsed| parsed.map_err(|e| e.to_string()));
            Ok::<_, SensorError>((offsets?, ebpf?, aya_btf))
        })?;
        // Without the registers' layout the fentry programs cannot read a syscall's arguments.
        let regs = want_fentry.then(|| offsets::syscall_regs(&btf, &mut offsets).map_err(|e| e.to_string()));
        if let Some(dir) = pin_to {
            for &name in pins::PINNED_MAPS {
                let map = ebpf.map(name).ok_or(SensorError::Missing { what: "map", name })?;
                let path = dir.join(name);
                map.pin(&path).map_err(|source| SensorError::Pin { path, source })?;
            }
        }

        let uring = uring_tracepoint();
        let mut config = Config {
            offsets,
            flags: if auto_roots { config_flag::AUTO_ROOTS } else { 0 },
            agent_tgid: std::process::id(),
            uring_opcode_offset: uring.map_or(0, uring_opcode_offset),
            block_syscalls: 0,
            spare_root_managers: 0,
            cgroup_subsys,
            cgroup_v2: u32::from(hierarchies.v2.is_some()),
            lsm_syscalls: 0,
            agent_roots: 0,
        };
        let mut config_map: Array<MapData, Config> = take_typed(&mut ebpf, "CONFIG")?;
        config_map.set(0, config, 0).map_err(map_err("CONFIG"))?;
        let mut manager_map: HashMap<_, [u8; MANAGER_NAME_LEN], ManagerValue> = take_typed(&mut ebpf, "MANAGERS")?;
        for (key, value) in &keys.names {
            manager_map.insert(key, value, 0).map_err(map_err("MANAGERS"))?;
        }
        let mut module_map: HashMap<_, [u8; MODULE_KEY_LEN], u32> = take_typed(&mut ebpf, "MANAGER_MODULES")?;
        for (key, value) in &keys.modules {
            module_map.insert(key, value, 0).map_err(map_err("MANAGER_MODULES"))?;
        }
        let mut script_map: HashMap<_, [u8; MANAGER_NAME_LEN], u32> = take_typed(&mut ebpf, "MANAGER_SCRIPTS")?;
        for (key, value) in &keys.scripts {
            script_map.insert(key, value, 0).map_err(map_err("MANAGER_SCRIPTS"))?;
        }
        let events: RingBuf<MapData> = take_typed(&mut ebpf, "EVENTS")?;
        let priority: RingBuf<MapData> = take_typed(&mut ebpf, "PRIORITY")?;
        let lost: PerCpuArray<MapData, u64> = take_typed(&mut ebpf, "LOST")?;
        let cred_map: HashMap<MapData, InodeKey, CredInode> = take_typed(&mut ebpf, "CRED_INODES")?;
        let spared_map: HashMap<MapData, InodeKey, SparedExe> = take_typed(&mut ebpf, "SPARED_EXES")?;
        let marks: HashMap<MapData, u32, Mark> = take_typed(&mut ebpf, "MARKS")?;
        let lost_trees: HashMap<MapData, u32, LostTree> = take_typed(&mut ebpf, "LOST_TREES")?;
        let heartbeat: Array<MapData, u64> = take_typed(&mut ebpf, "HEARTBEAT")?;

        let has_tracepoint =
            |category: &str, name: &str| Path::new(TRACEFS).join("events").join(category).join(name).is_dir();
        // fentry first: where it does not load, `auto` falls back to the tracepoints.
        let mut fallback = None;
        let mut unwatched = Vec::new();
        let mut tracing_links = Vec::new();
        let mut lsm = false;
        let mut backend = Backend::Tracepoint;
        if options.backend != Backend::Tracepoint {
            let attempt = regs
                .unwrap_or(Err(String::new()))
                .map_err(|e| format!("struct pt_regs: {e}"))
                .and_then(|()| aya_btf.unwrap_or(Err(String::new())).map_err(|e| format!("kernel BTF: {e}")))
                .and_then(|aya_btf| {
                    let (hooks, unwatched) = fentry_hooks(&btf);
                    let lsm_active = options.enforce && backend::bpf_lsm_active().unwrap_or(false);
                    let (mut work, lsm_syscalls) = fentry_work(&hooks, lsm_active);
                    // The raw tracepoints (and io_uring's) both backends run load meanwhile,
                    // on the same threads: exec's (two path walks) right after the open exit.
                    let plain = RAW_TRACEPOINTS.iter().chain(uring.map(|_| &URING_PROGRAM));
                    for (at, &program) in plain.enumerate() {
                        work.insert((at + 1).min(work.len()), backend::Work { program, targets: Vec::new() });
                    }
                    backend::load_tracing(&mut ebpf, work, &aya_btf)
                        .map(|links| (hooks, unwatched, links, lsm_syscalls))
                        .map_err(|e| e.to_string())
                });
            match attempt {
                Ok((hooks, left_out, links, lsm_syscalls)) => {
                    fill_syscalls(&mut ebpf, &hooks)?;
                    unwatched = left_out;
                    tracing_links = links;
                    lsm = lsm_syscalls != 0;
                    config.lsm_syscalls = lsm_syscalls;
                    config_map.set(0, config, 0).map_err(map_err("CONFIG"))?;
                    backend = Backend::Fentry;
                }
                Err(why) if options.backend == Backend::Auto => fallback = Some(why),
                Err(why) => return Err(SensorError::Fentry(why)),
            }
        }
        let hooks: Vec<SyscallHook> = if backend == Backend::Tracepoint {
            let hooks: Vec<SyscallHook> = syscall_hooks()
                .into_iter()
                .filter(|hook| hook.required || has_tracepoint("syscalls", &format!("sys_enter_{}", hook.name)))
                .collect();
            fill_syscalls(&mut ebpf, &hooks)?;
            hooks
        } else {
            Vec::new()
        };
        let mut wanted: Vec<&'static str> = RAW_TRACEPOINTS.to_vec();
        for hook in &hooks {
            let (enter, exit) = hook_programs(hook);
            for program in std::iter::once(enter).chain(exit) {
                if !wanted.contains(&program) {
                    wanted.push(program);
                }
            }
        }
        if uring.is_some() {
            wanted.push(URING_PROGRAM);
        }
        // Costliest to verify first (see load_programs); the sort is stable.
        wanted.sort_by_key(|name| {
            COSTLIEST_TO_VERIFY.iter().position(|costly| costly == name).unwrap_or(COSTLIEST_TO_VERIFY.len())
        });
        load_programs(&mut ebpf, &wanted)?;
        kernel_log::start_reader(&mut ebpf);
        let mut programs_attached = tracing_links.len() as u64;
        // A pinned link keeps its program attached once this process has closed it.
        let pin_link = |name: &'static str, tracepoint: &str, link: Result<FdLink, _>| -> Result<(), SensorError> {
            let Some(dir) = pin_to else { return Ok(()) };
            let path = dir.join(format!("link_{tracepoint}"));
            let link = link.map_err(|source| SensorError::Link { name, source })?;
            link.pin(&path).map_err(|source| SensorError::Pin { path, source })?;
            Ok(())
        };
        let mut links = Vec::new();
        for (name, link) in tracing_links {
            match pin_to {
                Some(dir) => {
                    let path = dir.join(format!("link_{name}"));
                    link.pin(&path).map_err(|source| SensorError::Pin { path, source })?;
                }
                None => links.push(link),
            }
        }
        for &name in RAW_TRACEPOINTS {
            let program: &mut RawTracePoint = ebpf
                .program_mut(name)
                .ok_or(SensorError::Missing { what: "program", name })?
                .try_into()
                .map_err(program_err(name))?;
            let link = program.attach(name).map_err(program_err(name))?;
            programs_attached += 1;
            if pin_to.is_some() {
                pin_link(name, name, Ok(FdLink::from(program.take_link(link).map_err(program_err(name))?)))?;
            }
        }
        let mut attach = |name: &'static str, category: &'static str, tracepoint: String| -> Result<(), SensorError> {
            programs_attached += 1;
            let loaded: &mut TracePoint = ebpf
                .program_mut(name)
                .ok_or(SensorError::Missing { what: "program", name })?
                .try_into()
                .map_err(program_err(name))?;
            match loaded.attach(category, &tracepoint) {
                Ok(link) if pin_to.is_some() => {
                    let link = loaded.take_link(link).map_err(program_err(name))?;
                    pin_link(name, &tracepoint, FdLink::try_from(link))
                }
                Ok(_) => Ok(()),
                Err(source) => Err(SensorError::Attach { name, category, tracepoint, source: Box::new(source) }),
            }
        };
        for hook in &hooks {
            let (enter, exit) = hook_programs(hook);
            attach(enter, "syscalls", format!("sys_enter_{}", hook.name))?;
            if let Some(exit) = exit {
                attach(exit, "syscalls", format!("sys_exit_{}", hook.name))?;
            }
        }
        if let Some(tracepoint) = uring {
            attach(URING_PROGRAM, "io_uring", tracepoint.to_owned())?;
        }
        let pins = pin_to.map(Pins::create).transpose()?;
        let kept = pin_to.map(|dir| pins::open_map(dir, pins::LOST_REPORTED, Map::HashMap)).transpose()?;
        Ok(Sensor {
            _ebpf: Some(ebpf),
            marks,
            events,
            priority,
            lost,
            config_map,
            config,
            cred_map,
            spared_map,
            protected: None,
            credentials: None,
            dir_watch: None,
            last_scan: Instant::now(),
            waker: None,
            restored_paths: Vec::new(),
            canary: None,
            next_canary: Instant::now() + CANARY_INTERVAL,
            last_drain: None,
            last_read: None,
            heartbeat,
            next_beat: Instant::now(),
            tree_losses: TreeLosses::new(lost_trees, kept),
            decoder,
            stats: SensorStats::default(),
            pins,
            gap: None,
            programs_attached,
            _links: links,
            backend,
            lsm,
            fallback,
            unwatched,
            hierarchies,
        })
    }

    /// Registers the inodes of the files `protection.rules` target (rescanned from
    /// [`Sensor::poll`] when their directories change, and every [`FULL_RESCAN_INTERVAL`]) and,
    /// with `enforce`, turns blocking on.
    pub fn protect(&mut self, protection: Protection) -> Result<(), SensorError> {
        self.config.block_syscalls = block_syscalls(protection.rules.rules());
        let mut table = CredentialTable::new(protection.rules.rules().to_vec(), protection.homes);
        // The indexes in flight (records not yet read, and the pinned set's) stay valid: the
        // table before this one (a reload), or the one of the agent before (an adoption).
        let before = match self.credentials.take() {
            Some((before, _)) => before.paths().map(str::to_owned).collect(),
            None => std::mem::take(&mut self.restored_paths),
        };
        table.restore(before);
        self.credentials = Some((table, Instant::now()));
        self.protected = Some(protection.rules);
        self.rescan()?;
        if protection.enforce {
            self.config.flags |= config_flag::ENFORCE;
        } else {
            self.config.flags &= !config_flag::ENFORCE;
        }
        self.config_map.set(0, self.config, 0).map_err(map_err("CONFIG"))
    }

    /// Rebuilds the credential table and brings the kernel map in line with it.
    fn rescan(&mut self) -> Result<(), SensorError> {
        let Some((table, next)) = &mut self.credentials else { return Ok(()) };
        let scan = table.scan();
        self.last_scan = Instant::now();
        *next = self.last_scan + FULL_RESCAN_INTERVAL;
        if self.dir_watch.is_none() {
            // Without inotify (no instance left for this user), the periodic rescans alone.
            self.dir_watch = DirWatch::new().ok();
        }
        if self.dir_watch.as_mut().is_some_and(|watch| watch.update(&scan.dirs)) {
            // Changes between the walk and the new watches were not seen: once more, soon.
            *next = self.last_scan + RESCAN_AFTER_CHANGE;
        }
        let stale: Vec<InodeKey> =
            self.cred_map.keys().filter_map(Result::ok).filter(|key| !scan.inodes.contains_key(key)).collect();
        for key in stale {
            // Gone already is fine: only its absence matters.
            let _ = self.cred_map.remove(&key);
        }
        for (key, value) in &scan.inodes {
            if self.cred_map.get(key, 0).ok() != Some(*value) {
                self.cred_map.insert(key, value, 0).map_err(map_err("CRED_INODES"))?;
            }
        }
        self.stats.credential_files = scan.inodes.len() as u64;
        if let Some(pins) = &mut self.pins {
            pins.keep_cred_paths(table.paths())?;
            // Not before the kept records of the gap are read: processes that exited while no
            // agent ran are gone, and still needed.
            if self.gap.is_none() {
                pins.prune();
            }
        }
        // Executables change on upgrades: their inodes too.
        if let Some(rules) = &self.protected {
            let (exes, root_managers) = credentials::spared(rules);
            let stale: Vec<InodeKey> =
                self.spared_map.keys().filter_map(Result::ok).filter(|key| !exes.contains_key(key)).collect();
            for key in stale {
                let _ = self.spared_map.remove(&key);
            }
            for (key, value) in &exes {
                self.spared_map.insert(key, value, 0).map_err(map_err("SPARED_EXES"))?;
            }
            let agent_roots = credentials::agent_roots(rules);
            if (root_managers, agent_roots) != (self.config.spare_root_managers, self.config.agent_roots) {
                (self.config.spare_root_managers, self.config.agent_roots) = (root_managers, agent_roots);
                self.config_map.set(0, self.config, 0).map_err(map_err("CONFIG"))?;
            }
        }
        Ok(())
    }

    /// Makes `pid` a package root (`credwatch run`: call it before CMD execs).
    pub fn mark_root(&mut self, pid: u32) -> Result<(), SensorError> {
        let mark = Mark { root_pid: pid, depth: 0, manager: NO_MANAGER, flags: mark_flag::BY_AGENT };
        self.marks.insert(pid, mark, 0).map_err(map_err("MARKS"))
    }

    /// Finds the package trees already running (processes under a manager, per
    /// [`credwatch_core::rules::manager::root_manager`]), marks them in the kernel and returns an
    /// `Exec { seeded: true }` event for each, parents first. A process that the kernel
    /// already marked keeps its mark.
    ///
    /// After an adoption ([`Started::Adopted`]) they come after an `AgentGap` event and the
    /// trees the agent before saw start (see [`pins`]), so that what their processes did while
    /// no agent ran, read next from the ring buffers, is attributed.
    pub fn seed(&mut self, managers: &[Manager]) -> Result<Vec<Event>, SensorError> {
        let decoder = self.decoder;
        let mut events = self.gap_events();
        let found = seed::scan(Path::new("/proc"), managers, std::process::id(), &decoder, &self.hierarchies)
            .map_err(SensorError::Proc)?;
        let marks = &mut self.marks;
        for (event, mark) in found {
            if marks.get(&event.pid, 0).is_err() {
                let mark = Mark { flags: mark.flags | mark_flag::BY_AGENT, ..mark };
                marks.insert(event.pid, mark, 0).map_err(map_err("MARKS"))?;
                // Exited between the scan and the mark: no exit will remove it, and a stale
                // mark would land on whatever process reuses the pid.
                if !Path::new(&format!("/proc/{}", event.pid)).exists() {
                    let _ = marks.remove(&event.pid);
                    continue;
                }
            }
            events.push(event);
        }
        Ok(events)
    }

    /// The gap since the agent before (once), then the execs and forks it kept of the
    /// processes still in a tree when it went, as `seeded` execs and forks in time order.
    fn gap_events(&mut self) -> Vec<Event> {
        let (Some(gap), Some(pins)) = (self.gap.take(), &self.pins) else { return Vec::new() };
        let mut kept = Vec::new();
        let no_cred_path = |_: u32| None;
        let records = pins.execs.iter().filter_map(Result::ok).map(|(_, record)| record.to_vec());
        let forks = pins.forks.iter().filter_map(Result::ok).map(|(_, record)| record.to_vec());
        for record in records.chain(forks) {
            // The header's `size` (after `kind`) says how much of the zero-padded value is the record.
            let size = record.get(4..8).map_or(0, |b| u32::from_ne_bytes(b.try_into().unwrap_or_default()) as usize);
            let Ok(mut event) = self.decoder.decode(&record[..size.min(record.len())], &no_cred_path) else {
                self.stats.malformed += 1;
                continue;
            };
            if let EventData::Exec(exec) = &mut event.data {
                exec.seeded = true;
                exec.project = project::for_exec(&exec.executable, &exec.args, &exec.cwd);
                exec.script = script::for_exec(event.pid, &exec.filename, &exec.executable, &exec.cwd);
                if let (Some(home), Some((table, next))) = (exec.env.get("HOME"), &mut self.credentials) {
                    if table.add_home(Path::new(home)) {
                        *next = Instant::now();
                    }
                }
            }
            kept.push(event);
        }
        kept.sort_by_key(|event| event.time_ns);
        let data = EventData::AgentGap(AgentGap { since_ns: gap.since_ns, clean_stop: gap.clean_stop, stopped: false });
        let mut events = vec![Event { time_ns: gap.until_ns, pid: 0, data }];
        events.append(&mut kept);
        events
    }

    /// Makes [`Sensor::poll`] return when `waker` becomes readable, as it does when a signal
    /// handler runs on its own thread: a signal of the process may run its handler on another
    /// thread (the outputs' runtime), which would leave the poll asleep. The signal handlers
    /// write to the other end (`signal_hook::low_level::pipe`); what they wrote is read here.
    pub fn wake_on(&mut self, waker: UnixStream) -> io::Result<()> {
        waker.set_nonblocking(true)?;
        self.waker = Some(waker);
        Ok(())
    }

    /// Waits up to `timeout` for records and appends their events to `out`, returning as soon
    /// as some arrived or a signal handler ran; appends a `Lost` event when a loss counter grew.
    /// Between records it sleeps until its next timer (a rescan, the canary, the heartbeat) or
    /// `timeout`, whichever comes first.
    /// Now in the events' clock (their `time_ns`: boot time as wall-clock time).
    pub fn now_ns(&self) -> u64 {
        self.decoder.wall_ns(boot_ns())
    }

    pub fn poll(&mut self, timeout: Duration, out: &mut Vec<Event>) -> Result<(), SensorError> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.credentials.as_ref().is_some_and(|(_, next)| Instant::now() >= *next) {
                self.rescan()?;
            }
            let now = Instant::now();
            let mut signalled = false;
            if now < deadline {
                // While bulk records flow, only the priority ring is waited on until the bulk
                // one is due (see BATCH_INTERVAL); after, both, and the bulk ring's fd is
                // readable as soon as a record is in, or wakes us at the first one.
                let (until, rings) = match self.last_drain.map(|last| last + BATCH_INTERVAL) {
                    Some(due) if now < due => (due, Rings::PriorityOnly),
                    _ => (self.next_timer().unwrap_or(deadline), Rings::Both),
                };
                // The caller may be waiting for the signal (SIGCHLD from `run`'s command).
                signalled = self.wait(until.min(deadline).saturating_duration_since(now), rings)? == Wake::Signal;
            }
            let before = out.len();
            self.report_stop(out);
            self.drain(out);
            self.beat()?;
            self.check_lost(out)?;
            self.tend_canary(out)?;
            if let Some(pins) = &mut self.pins {
                pins.tick([self.stats.lost, self.stats.priority_lost, self.stats.marks_full])?;
            }
            if signalled || out.len() > before || Instant::now() >= deadline {
                return Ok(());
            }
        }
    }

    /// When the sensor has something to do without a record: a rescan, the canary's start or
    /// verdict, the heartbeat.
    fn next_timer(&self) -> Option<Instant> {
        let rescan = self.credentials.as_ref().map(|(_, next)| *next);
        let canary = Some(self.canary.as_ref().map_or(self.next_canary, Canary::timeout_at));
        let heartbeat = self.pins.as_ref().map(Pins::next_heartbeat);
        [rescan, canary, heartbeat, Some(self.next_beat)].into_iter().flatten().min()
    }

    /// An `AgentGap { stopped }` when the last drain is more than [`STOPPED_GAP`] ago on the
    /// monotonic clock (this agent did not run, or did not read): before the records that
    /// waited. Its ends are `CLOCK_BOOTTIME` readings converted now, so a wall clock stepped
    /// meanwhile changes neither its length nor where it lies among the records.
    fn report_stop(&mut self, out: &mut Vec<Event>) {
        let Some((drained, drained_ns)) = self.last_read else { return };
        if drained.elapsed() > STOPPED_GAP {
            let (since_ns, until_ns) = blind::window(&self.decoder, drained_ns, boot_ns());
            let data = EventData::AgentGap(AgentGap { since_ns, clean_stop: false, stopped: true });
            out.push(Event { time_ns: until_ns, pid: 0, data });
        }
    }

    /// After a drain: `HEARTBEAT` when one is due (one map write), and the drain's time.
    fn beat(&mut self) -> Result<(), SensorError> {
        let now = Instant::now();
        let now_ns = boot_ns();
        self.last_read = Some((now, now_ns));
        if now >= self.next_beat {
            self.heartbeat.set(0, now_ns, 0).map_err(map_err("HEARTBEAT"))?;
            self.next_beat = now + HEARTBEAT_EVERY;
        }
        Ok(())
    }

    /// Reads the priority ring buffer first, then the bulk one, then the priority one again,
    /// and puts what it read in time order: a priority record made before a bulk record just
    /// read (an open before its process's exit) is then in the same batch, before it.
    fn drain(&mut self, out: &mut Vec<Event>) {
        let before = out.len();
        let mut bulk = 0;
        let Sensor { events, priority, decoder, stats, credentials, canary, pins, last_scan, .. } = self;
        let mut homes = Vec::new();
        let mut unconfirmed = false;
        {
            let table = credentials.as_ref().map(|(table, _)| table);
            let cred_path = |index: u32| table.and_then(|t| t.path(index)).map(str::to_owned);
            for ring in [0, 1, 0] {
                let is_bulk = ring == 1;
                let ring = if is_bulk { &mut *events } else { &mut *priority };
                while let Some(item) = ring.next() {
                    bulk += usize::from(is_bulk);
                    match decoder.decode(&item, &cred_path) {
                        Ok(mut event) => {
                            if let Some(canary) = canary.as_mut().filter(|c| c.pid == event.pid) {
                                canary.saw(&event.data);
                                continue;
                            }
                            if let Some(pins) = pins.as_mut() {
                                keep(pins, &item, &event);
                            }
                            if let EventData::Exec(exec) = &mut event.data {
                                homes.extend(exec.env.get("HOME").cloned());
                                exec.project = project::for_exec(&exec.executable, &exec.args, &exec.cwd);
                                exec.script = script::for_exec(event.pid, &exec.filename, &exec.executable, &exec.cwd);
                            }
                            // A hit on an inode the table no longer describes is not that file,
                            // and the table is out of date.
                            if let (EventData::Open(open), Some(table)) = (&mut event.data, table) {
                                unconfirmed |= !table.confirm(open);
                            }
                            stats.events += 1;
                            out.push(event);
                        }
                        Err(_) => stats.malformed += 1,
                    }
                }
            }
        }
        out[before..].sort_by_key(|event| event.time_ns);
        // A home first seen now is scanned at the next poll.
        if let Some((table, next)) = credentials {
            if unconfirmed {
                *next = (*next).min((Instant::now() + RESCAN_AFTER_CHANGE).max(*last_scan + MIN_RESCAN_GAP));
            }
            for home in homes {
                if table.add_home(Path::new(&home)) {
                    *next = Instant::now();
                }
            }
        }
        self.last_drain = (bulk > 0).then(Instant::now);
    }

    /// Sleeps until the programs wake the reader (a record after it caught up, the bulk
    /// watermark), a signal, a change in a watched credential directory, or `slice` passes.
    fn wait(&mut self, slice: Duration, rings: Rings) -> Result<Wake, SensorError> {
        let no_fd = |fd: Option<std::os::fd::BorrowedFd>| fd.map_or(-1, |fd| fd.as_raw_fd());
        // A negative fd is skipped by poll(2).
        let mut fds = [
            libc::pollfd { fd: self.priority.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: no_fd(self.waker.as_ref().map(AsFd::as_fd)), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: no_fd(self.dir_watch.as_ref().map(AsFd::as_fd)), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: self.events.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        let count = if rings == Rings::Both { 4 } else { 3 };
        let timeout = slice.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: fds holds `count` valid pollfds for the duration of the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), count, timeout) };
        if rc < 0 {
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(SensorError::Poll(error));
            }
            self.empty_waker();
            return Ok(Wake::Signal);
        }
        if fds[2].revents != 0 && self.dir_watch.as_mut().is_some_and(DirWatch::changed) {
            if let Some((_, next)) = &mut self.credentials {
                let soon = (Instant::now() + RESCAN_AFTER_CHANGE).max(self.last_scan + MIN_RESCAN_GAP);
                *next = (*next).min(soon);
            }
        }
        if fds[1].revents != 0 {
            self.empty_waker();
            return Ok(Wake::Signal);
        }
        Ok(Wake::Ready)
    }

    /// Reads what the signal handlers wrote: the signal is answered now.
    fn empty_waker(&mut self) {
        let Some(waker) = &mut self.waker else { return };
        let mut bytes = [0u8; 64];
        loop {
            match waker.read(&mut bytes) {
                Ok(0) => {
                    // Its other end closed: it would poll readable for ever.
                    self.waker = None;
                    return;
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    }

    /// Judges the canary in flight, or starts one when it is time.
    fn tend_canary(&mut self, out: &mut Vec<Event>) -> Result<(), SensorError> {
        if let Some(verdict) = self.canary.as_ref().and_then(|canary| canary.verdict(self.stats.lost)) {
            if let Some(canary) = self.canary.take() {
                // The exit program removes the mark, unless it is the one detached. Before the
                // child is reaped: then its pid may be reused, and must not carry the mark.
                let _ = self.marks.remove(&canary.pid);
                canary.finish();
            }
            if let Verdict::Missing(_) = verdict {
                self.stats.detached += 1;
                out.push(Event {
                    time_ns: self.decoder.wall_ns(boot_ns()),
                    pid: 0,
                    data: EventData::Lost(Lost { source: lost_source::DETACHED.to_owned(), count: 1 }),
                });
            }
            self.next_canary = Instant::now() + CANARY_INTERVAL;
            return Ok(());
        }
        if self.canary.is_some() || Instant::now() < self.next_canary {
            return Ok(());
        }
        let Ok(mut canary) = Canary::spawn(self.stats.lost) else {
            // fork fails only transiently (EAGAIN, ENOMEM): the next interval tries again.
            self.next_canary = Instant::now() + CANARY_INTERVAL;
            return Ok(());
        };
        let mark = Mark { root_pid: canary.pid, depth: 0, manager: NO_MANAGER, flags: mark_flag::BY_AGENT };
        if self.marks.insert(canary.pid, mark, 0).is_err() {
            // MARKS full (package code can fill it: that is a blind spot of its own, reported
            // with its tree): the next interval tries again.
            canary.finish();
            self.next_canary = Instant::now() + CANARY_INTERVAL;
            return Ok(());
        }
        canary.release();
        self.canary = Some(canary);
        Ok(())
    }

    fn lost_total(&self, index: u32) -> Result<u64, SensorError> {
        let values = self.lost.get(&index, 0).map_err(map_err("LOST"))?;
        Ok(values.iter().sum())
    }

    /// A `Lost` event per counter of `LOST` that grew, then the blind spots of the trees they
    /// were lost from (see [`blind`]).
    fn check_lost(&mut self, out: &mut Vec<Event>) -> Result<(), SensorError> {
        let mut moved = [0u64; 3];
        for (index, source) in [
            (lost_index::PRIORITY, lost_source::PRIORITY),
            (lost_index::EVENTS, lost_source::EVENTS),
            (lost_index::MARKS_FULL, lost_source::MARKS),
        ] {
            let total = self.lost_total(index)?;
            let seen = match index {
                lost_index::EVENTS => &mut self.stats.lost,
                lost_index::PRIORITY => &mut self.stats.priority_lost,
                _ => &mut self.stats.marks_full,
            };
            if total > *seen {
                out.push(Event {
                    time_ns: self.decoder.wall_ns(boot_ns()),
                    pid: 0,
                    data: EventData::Lost(Lost { source: source.to_owned(), count: total - *seen }),
                });
                moved[index as usize] = total - *seen;
                *seen = total;
            }
        }
        if moved.iter().any(|&count| count > 0) {
            let [events, marks, priority] =
                [lost_index::EVENTS, lost_index::MARKS_FULL, lost_index::PRIORITY].map(|index| moved[index as usize]);
            self.tree_losses.report([priority, events, marks], &self.decoder, out);
        }
        Ok(())
    }

    pub fn stats(&self) -> SensorStats {
        self.stats
    }

    /// Handles for the metrics' kernel figures (see [`KernelGauges`]).
    pub fn gauges(&self) -> Result<KernelGauges, SensorError> {
        Ok(KernelGauges {
            marks: second_handle(&self.marks, "MARKS")?,
            cred_inodes: second_handle(&self.cred_map, "CRED_INODES")?,
            spared_exes: second_handle(&self.spared_map, "SPARED_EXES")?,
            programs_attached: self.programs_attached,
        })
    }
}

/// Keeps the exec and fork records of live tree members in the pinned set, for the agent after
/// this one (see [`pins`]); drops them at the exit. Best effort: a full map costs only the
/// attribution of that process's actions after a restart.
fn keep(pins: &mut Pins, record: &[u8], event: &Event) {
    match &event.data {
        EventData::Exec(_) => {
            let mut value = Box::new([0u8; MAX_EXEC_RECORD]);
            let size = record.len().min(MAX_EXEC_RECORD);
            value[..size].copy_from_slice(&record[..size]);
            let _ = pins.execs.insert(event.pid, value, 0);
        }
        EventData::Fork(fork) => {
            let mut value = [0u8; FORK_RECORD];
            let size = record.len().min(FORK_RECORD);
            value[..size].copy_from_slice(&record[..size]);
            let _ = pins.forks.insert(fork.child_pid, value, 0);
        }
        EventData::Exit(_) => {
            let _ = pins.execs.remove(&event.pid);
            let _ = pins.forks.remove(&event.pid);
        }
        _ => {}
    }
}

/// Makes `map` hold exactly `entries`.
fn replace_entries<K: aya::Pod + Eq, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    entries: &[(K, V)],
) -> Result<(), MapError> {
    let stale: Vec<K> =
        map.keys().filter_map(Result::ok).filter(|key| !entries.iter().any(|(k, _)| k == key)).collect();
    for key in stale {
        map.remove(&key)?;
    }
    for (key, value) in entries {
        map.insert(key, value, 0)?;
    }
    Ok(())
}

fn take_typed<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, SensorError>
where
    T: TryFrom<aya::maps::Map, Error = MapError>,
{
    let map = ebpf.take_map(name).ok_or(SensorError::Missing { what: "map", name })?;
    T::try_from(map).map_err(map_err(name))
}

/// Now on `CLOCK_BOOTTIME`, the kernel programs' clock.
pub(crate) fn boot_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use credwatch_core::rules::manager::{ModuleRoot, ScriptRoot};

    #[test]
    fn blocks_the_syscalls_that_kill_rules_name_without_operations() {
        let rule = |id: &str, action: &str, syscalls: &str| {
            format!(
                "  - id: {id}\n    name: n\n    description: d\n    category: tamper\n    severity: high\n    action: {action}\n    syscalls: {syscalls}\n    samples:\n      positive:\n        - exec: {{pid: 100, args: [npm, install]}}\n        - syscall: {{pid: 100, name: bpf, operation: BPF_PROG_LOAD}}\n      negative:\n        - exec: {{pid: 100, args: [npm, install]}}\n"
            )
        };
        let yaml = format!(
            "schema: 1\nrules:\n{}{}{}",
            rule("a", "kill", "{names: [bpf, finit_module, kill]}"),
            rule("b", "kill", "{names: [ptrace], operations: [PTRACE_ATTACH]}"),
            rule("c", "alert", "{names: [process_vm_readv]}"),
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("t.yaml"), yaml).unwrap();
        let rules = credwatch_core::rules::RuleSet::load_dir(dir.path()).unwrap();
        let expected = 1 << tamper_syscall::BPF | 1 << tamper_syscall::FINIT_MODULE | 1 << tamper_syscall::KILL;
        assert_eq!(block_syscalls(rules.rules()), expected);
    }

    #[test]
    fn builds_kernel_keys_for_execs_modules_and_scripts() {
        let managers = vec![
            Manager { name: "npm".into(), execs: vec!["npm".into()], ..Manager::default() },
            Manager {
                name: "pip".into(),
                execs: vec!["pip3".into()],
                modules: vec![ModuleRoot {
                    interpreters: vec!["python3".into()],
                    args: vec!["-m".into(), "pip".into()],
                }],
                scripts: vec![ScriptRoot {
                    interpreters: vec!["python3".into()],
                    files: vec!["__pip-runner__.py".into()],
                    args: vec![],
                }],
                ..Manager::default()
            },
            Manager {
                name: "yarn".into(),
                scripts: vec![ScriptRoot {
                    interpreters: vec!["node".into(), "npm".into()],
                    files: vec!["yarn-*.cjs".into(), "yarn.js".into()],
                    args: vec![],
                }],
                ..Manager::default()
            },
        ];
        let keys = manager_keys(&managers).unwrap();
        assert_eq!(keys.names.len(), 4);
        assert_eq!(&keys.names[0].0[..4], b"npm\0");
        // npm is a plain exec: a yarn script run by "npm" does not make it an interpreter.
        assert_eq!(keys.names[0].1, ManagerValue { manager: 0, flags: 0 });
        assert_eq!(&keys.names[2].0[..8], b"python3\0");
        let both = manager_flag::NEEDS_MODULE | manager_flag::NEEDS_SCRIPT;
        assert_eq!(keys.names[2].1, ManagerValue { manager: 1, flags: both });
        assert_eq!(&keys.names[3].0[..5], b"node\0");
        assert_eq!(keys.names[3].1, ManagerValue { manager: 2, flags: manager_flag::NEEDS_SCRIPT });
        assert_eq!(&keys.modules[0].0[..8], b"-m\0pip\0\0");
        assert_eq!(keys.modules[0].1, 1);
        let scripts: Vec<(&[u8], u32)> = keys.scripts.iter().map(|(key, m)| (&key[..6], *m)).collect();
        assert_eq!(scripts, [(&b"__pip\0"[..], 1), (&b"yarn\0\0"[..], 2)]);

        let long =
            vec![Manager { name: "x".into(), execs: vec!["a-very-long-exec-name".into()], ..Manager::default() }];
        let error = manager_keys(&long).unwrap_err().to_string();
        assert!(error.contains("a-very-long-exec-name"), "{error}");
    }
    #[test]
    fn the_kernel_marks_coding_agents_by_the_managers_keys() {
        let rules = credwatch_core::rules::RuleSet::defaults().unwrap();
        let keys = manager_keys(&rules.kernel_roots()).unwrap();
        let index = |name: &str| {
            let key: [u8; MANAGER_NAME_LEN] = padded_key(name.as_bytes()).unwrap();
            keys.names.iter().find(|(k, _)| *k == key).map(|(_, value)| (value.manager, value.flags))
        };
        let managers = rules.managers().len() as u32;
        for (i, agent) in rules.agents().iter().enumerate() {
            for exec in &agent.execs {
                // After the managers: their indexes (the spare masks') stay what they were.
                assert_eq!(index(exec), Some((managers + i as u32, 0)), "{exec}");
            }
        }
        assert_eq!(
            index("npm").map(|(m, _)| m),
            rules.managers().iter().position(|m| m.name == "npm").map(|i| i as u32)
        );
        let codex = rules.agents().iter().position(|a| a.name == "codex").unwrap() as u32;
        let stem: [u8; MANAGER_NAME_LEN] = padded_key(b"codex").unwrap();
        assert!(keys.scripts.contains(&(stem, managers + codex)));
    }
}
