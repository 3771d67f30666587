//! The live sensor: loads the kernel programs, fills their maps and turns their ring buffer
//! records into [`Event`]s. It holds no detection logic.
//!
//! - `load`: opening the eBPF object (or adopting a pinned set), BTF offsets, map sizes, attaching;
//! - `hooks`: which programs serve which syscalls, for each backend;
//! - `reader`: the ring reader, decoding records into events, and its timers;
//! - `ring`: a ring buffer's consumer that maps its data once;
//! - `backend`: the tracepoint and fentry backends, and the fentry one's loading;
//! - `blind`: map sizes, and the blind spots of trees whose records were lost;
//! - `btf`, `offsets`: the kernel's BTF, and the struct offsets the programs read by;
//! - `canary`: a periodic self-check that the programs are still attached;
//! - `cgroups`: the cgroup hierarchies exec records name;
//! - `credentials`: the table of credential inodes the kernel watches, and its rescans;
//! - `doctor`: `credwatch doctor`, what this kernel offers;
//! - `kernel_log`: the programs' own log;
//! - `pins`: a kernel side that outlives the agent (`watch`);
//! - `project`, `script`: what an exec runs (its project, its script);
//! - `seed`: the package trees already running at start;
//! - `task_marks`: marks also kept in task storage (5.12 and later), for the early exit.
//!
//! This module keeps the public types, the credential table's upkeep and seeding.

mod backend;
mod blind;
pub mod btf;
mod canary;
pub mod cgroups;
pub mod credentials;
mod doctor;
mod hooks;
pub mod kernel_log;
mod load;
pub mod offsets;
pub mod pins;
mod project;
mod reader;
mod ring;
mod script;
mod seed;
mod task_marks;

use std::{
    io,
    os::{fd::AsFd, unix::net::UnixStream},
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use aya::{
    maps::{Array, HashMap, IterableMap, Map, MapData, MapError, PerCpuArray},
    programs::{links::FdLink, ProgramError},
    Ebpf, EbpfError,
};
use credwatch_common::{config_flag, mark_flag, tamper_syscall, Config, CredInode, InodeKey, Mark, SparedExe};
use thiserror::Error;

pub use self::{
    backend::{bpf_lsm_active, syscall_function, Backend, SensorOptions},
    blind::{MapSizeError, MapSizes, SIZABLE_MAPS},
    doctor::{doctor, DoctorReport},
    load::{manager_keys, ManagerKeys},
};
use self::{
    blind::TreeLosses,
    btf::BtfError,
    canary::Canary,
    credentials::{CredentialTable, DirWatch, FULL_RESCAN_INTERVAL, RESCAN_AFTER_CHANGE},
    pins::{Gap, Pins},
};
use credwatch_core::{
    event::{AgentGap, Event, EventData},
    record::{self, Decoder},
    rules::{manager::Manager, schema::Action, Rule, RuleSet},
};

/// The kernel programs, built by `cargo xtask build` and embedded by build.rs; empty when the
/// binary was built without them (see [`kernel_object`]).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/credwatch.bpf.o"));

/// The embedded kernel programs, or [`SensorError::NoKernelPrograms`] where build.rs found no
/// object and embedded an empty stand-in (a clone checked with stable Rust alone).
fn kernel_object() -> Result<&'static [u8], SensorError> {
    embedded_object(OBJECT)
}

fn embedded_object(object: &'static [u8]) -> Result<&'static [u8], SensorError> {
    if object.is_empty() {
        return Err(SensorError::NoKernelPrograms);
    }
    Ok(object)
}

/// `Mark::manager` of a root made by [`Sensor::mark_root`]: no manager exec made it.
pub use credwatch_common::NO_MANAGER;

const TRACEFS: &str = "/sys/kernel/tracing";

/// A syscall the running backend does not watch on this kernel, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unwatched {
    pub syscall: &'static str,
    pub why: String,
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
    #[error("giving pid {pid} its value in task storage (TASK_MARKS): {source}")]
    TaskMark { pid: u32, source: io::Error },
    #[error("fork's BTF-typed program (marks in task storage) needs the kernel BTF as aya parses it: {0}")]
    ForkBtf(String),
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
    #[error(
        "this credwatch was built without its kernel programs (the eBPF object was missing at build time); \
         build it with `cargo xtask build`, which sets up the eBPF toolchain"
    )]
    NoKernelPrograms,
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
    /// actors spared), shared with the engine.
    pub rules: Arc<RuleSet>,
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
    task_marks: task_marks::TaskMarks,
    events: ring::Ring,
    priority: ring::Ring,
    lost: PerCpuArray<MapData, u64>,
    config_map: Array<MapData, Config>,
    config: Config,
    cred_map: HashMap<MapData, InodeKey, CredInode>,
    spared_map: HashMap<MapData, InodeKey, SparedExe>,
    /// The rules of [`Sensor::protect`], for the spared executables at each rescan.
    protected: Option<Arc<RuleSet>>,
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
    /// Adopted: the end of the gap since the agent before, until the first drain, which reads
    /// the records that waited up to it uncut (see `drain`).
    adopted_gap_end_ns: u64,
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

impl Drop for Sensor {
    fn drop(&mut self) {
        if let Some(canary) = self.canary.take() {
            canary.finish();
        }
    }
}

fn map_err(name: &'static str) -> impl Fn(MapError) -> SensorError {
    move |source| SensorError::Map { name, source }
}

fn program_err(name: &'static str) -> impl Fn(ProgramError) -> SensorError {
    move |source| SensorError::Program { name, source }
}

/// Now on `CLOCK_BOOTTIME`, the kernel programs' clock.
pub(crate) fn boot_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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

    /// Registers the inodes of the files `protection.rules` target (rescanned from
    /// [`Sensor::poll`] when their directories change, and every [`FULL_RESCAN_INTERVAL`]) and,
    /// with `enforce`, turns blocking on.
    pub fn protect(&mut self, protection: Protection) -> Result<(), SensorError> {
        self.config.block_syscalls = block_syscalls(protection.rules.rules());
        let mut table = CredentialTable::new(Arc::clone(&protection.rules), protection.homes);
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
        self.marks.insert(pid, mark, 0).map_err(map_err("MARKS"))?;
        self.task_marks.mark(pid)
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
                self.task_marks.mark(event.pid)?;
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
        self.adopted_gap_end_ns = gap.until_ns;
        let mut events = vec![Event { time_ns: gap.until_ns, pid: 0, data }];
        events.append(&mut kept);
        events
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_stand_in_object_is_refused_naming_how_to_build_the_real_one() {
        let error = embedded_object(&[]).unwrap_err().to_string();
        assert!(error.contains("built without its kernel programs") && error.contains("cargo xtask build"), "{error}");
        assert_eq!(embedded_object(b"\x7fELF").unwrap(), b"\x7fELF");
    }

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
}
