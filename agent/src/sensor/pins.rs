//! The kernel side outliving the agent (`watch`, and `record` without CMD): programs stay
//! attached through links pinned in bpffs, and the maps the agent reads are pinned beside them,
//! so marks persist and records wait in the ring buffers while no agent runs. The next agent
//! adopts the set instead of starting blank. Only `credwatch stop` detaches (removes the pins).
//!
//! A pinned set is one directory:
//! - the object's maps that the agent reads or fills, by their names (`EVENTS`, `MARKS`, ...);
//! - `link_<tracepoint>`: one link per attached program;
//! - `agent`: the [`AgentState`], which says which eBPF object the set was loaded from (a set
//!   of another build is replaced, not adopted), which agent runs it and when it last showed
//!   life (the start of a gap);
//! - `execs` and `forks`: the raw exec and fork records of the processes of live package trees,
//!   so that a new agent knows the trees that the one before saw start (attribution of what they
//!   do during and after the gap); removed at their exits;
//! - `cred_paths`: the credential table's index -> path, so that records made before the new
//!   agent's first scan still name the right file;
//! - `lost_reported`: per tree root, the `LOST_TREES` figures already reported as blind spots.
//!
//! A set is built in a sibling directory (`<dir>-new-<pid>`) and renamed into place once whole,
//! so a half-built set is never adopted. (bpffs refuses names with a `.`.)

use std::{
    fs, io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use aya::maps::{Array, HashMap, Map, MapData, MapError};
use credwatch_common::{ForkEvent, LostTree, MAX_EXEC_RECORD, MAX_RESOLVED_PATH};
use sha2::{Digest as _, Sha256};

use super::{boot_ns, SensorError, OBJECT};

/// Where `watch` pins its kernel side by default.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/credwatch";
const BPFFS: &str = "/sys/fs/bpf";
/// `statfs(2)`'s `f_type` of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The object's maps that an adopting agent opens.
pub(super) const PINNED_MAPS: &[&str] = &[
    "EVENTS",
    "PRIORITY",
    "LOST",
    "CONFIG",
    "CRED_INODES",
    "SPARED_EXES",
    "MARKS",
    "MANAGERS",
    "MANAGER_MODULES",
    "MANAGER_SCRIPTS",
    "LOST_TREES",
    "HEARTBEAT",
];
const STATE: &str = "agent";
const EXECS: &str = "execs";
const FORKS: &str = "forks";
const CRED_PATHS: &str = "cred_paths";
/// The `LOST_TREES` figures the agent reported (see `blind`).
pub(super) const LOST_REPORTED: &str = "lost_reported";
/// How often the agent says it is alive: the precision of a gap's start when it dies. One map
/// update and a wake-up a second, a few µs; kept at 1 s while idle, since a killed agent's gap
/// is dated by it whether or not anything ran.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// Live processes whose exec (and fork) records are kept. An exec record takes up to 31 KiB of
/// kernel memory: 4096 bound that to 122 MiB should exits go unseen (a full ring), and are far
/// more processes than a package tree runs at once.
const MAX_KEPT: u32 = 4096;
/// Credential paths kept (the table's own limit).
const MAX_CRED_PATHS: u32 = 65536;
/// Trees whose reported losses are kept: `LOST_TREES`' own size.
const MAX_LOST_REPORTED: u32 = 4096;
/// Entries allocated as they are used: most of these maps hold a few entries of a large value.
const BPF_F_NO_PREALLOC: u32 = 1;
/// How long `credwatch stop` waits for a running agent to exit after SIGTERM.
const STOP_WAIT: Duration = Duration::from_secs(10);

pub(super) const FORK_RECORD: usize = std::mem::size_of::<ForkEvent>();
pub(super) type ExecRecord = [u8; MAX_EXEC_RECORD];
pub(super) type ForkRecord = [u8; FORK_RECORD];
type PathValue = [u8; MAX_RESOLVED_PATH];

/// The value of the pinned `agent` map. Its layout never changes: a set whose record has another
/// size is from another build, and is replaced.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentState {
    /// SHA-256 of the eBPF object the set was loaded from.
    pub object_id: [u8; 32],
    /// The agent running the set (0: none yet).
    pub agent_tgid: u32,
    /// 1 when the agent stopped cleanly (SIGTERM, Ctrl-C) rather than died.
    pub clean_stop: u32,
    /// The agent's start time (`/proc/<pid>/stat` field 22, clock ticks since boot): a reused
    /// pid is not the agent.
    pub agent_start_ticks: u64,
    /// `CLOCK_BOOTTIME` ns of the agent's last sign of life.
    pub heartbeat_ns: u64,
    /// The `LOST` counters the agent had reported (events, priority, marks full): a new agent
    /// reports only what was lost since.
    pub lost_seen: [u64; 3],
}

// SAFETY: repr(C), integers only, no padding (32 + 4 + 4 + 8 + 8 + 24 bytes).
unsafe impl aya::Pod for AgentState {}
const _: () = assert!(std::mem::size_of::<AgentState>() == 80);

/// How [`super::Sensor::start_pinned`] got its kernel side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Started {
    /// Nothing was pinned: loaded, attached and pinned now.
    Fresh,
    /// A set of this build was pinned: adopted, programs never detached.
    Adopted(Gap),
    /// A set was pinned that could not be adopted (why): detached once the new one was attached.
    Replaced(String),
    /// Nothing can be pinned on this kernel (why): loaded and attached for this agent only.
    Unpinned(String),
}

/// Why a kernel without tracepoint links gets no pinned set: pinning promises that the
/// programs keep recording while no agent runs, which the kernel cannot keep there.
pub(super) const NO_TRACEPOINT_LINKS: &str = "this kernel (before 5.15) attaches tracepoint programs through perf \
     events, which have no BPF link to pin: they detach when this agent exits, so nothing is watched from then until \
     the next agent starts";

/// The time no agent read the pinned set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gap {
    /// Wall-clock ns of the previous agent's last sign of life.
    pub since_ns: u64,
    /// Wall-clock ns of the adoption.
    pub until_ns: u64,
    pub clean_stop: bool,
    /// The previous agent's pid.
    pub previous_pid: u32,
}

/// The agent's handles on the maps of its own in a pinned set.
pub(super) struct Pins {
    pub dir: PathBuf,
    state_map: Array<MapData, AgentState>,
    pub state: AgentState,
    pub execs: HashMap<MapData, u32, ExecRecord>,
    pub forks: HashMap<MapData, u32, ForkRecord>,
    cred_paths: HashMap<MapData, u32, PathValue>,
    /// Credential paths written to `cred_paths` so far (the table's first N).
    pub cred_paths_kept: usize,
    next_heartbeat: Instant,
}

/// SHA-256 of the embedded eBPF object.
pub fn object_id() -> [u8; 32] {
    Sha256::digest(OBJECT).into()
}

/// Mounts bpffs at /sys/fs/bpf when it is not there (some machines boot without it).
pub(super) fn ensure_bpffs() -> Result<(), SensorError> {
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: NUL-terminated path, valid out pointer.
    if unsafe { libc::statfs(c"/sys/fs/bpf".as_ptr(), &mut stat) } == 0 && stat.f_type as i64 == BPF_FS_MAGIC {
        return Ok(());
    }
    // SAFETY: NUL-terminated literals; no data argument.
    let rc = unsafe { libc::mount(c"bpf".as_ptr(), c"/sys/fs/bpf".as_ptr(), c"bpf".as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        return Err(SensorError::Bpffs(io::Error::last_os_error()));
    }
    Ok(())
}

fn dir_err(path: &Path) -> impl Fn(io::Error) -> SensorError + '_ {
    move |source| SensorError::PinDir { path: path.to_path_buf(), source }
}

/// Where a new set for `dir` is built.
pub(super) fn building_dir(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(format!("-new-{}", std::process::id()));
    dir.with_file_name(name)
}

/// Removes sets that agents left half-built when they died (their links are attached).
pub(super) fn remove_abandoned(dir: &Path) -> Result<(), SensorError> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else { return Ok(()) };
    let prefix = format!("{}-new-", name.to_string_lossy());
    let Ok(entries) = fs::read_dir(parent) else { return Ok(()) };
    for entry in entries.filter_map(Result::ok) {
        let entry_name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = entry_name.strip_prefix(&prefix).and_then(|pid| pid.parse::<u32>().ok()) else { continue };
        if pid == std::process::id() || !Path::new(&format!("/proc/{pid}")).exists() {
            fs::remove_dir_all(entry.path()).map_err(dir_err(&entry.path()))?;
        }
    }
    Ok(())
}

/// The pinned set's state, or why it cannot be adopted.
pub(super) fn read_state(dir: &Path) -> Result<AgentState, String> {
    let data = MapData::from_pin(dir.join(STATE)).map_err(|e| format!("no readable agent record ({e})"))?;
    let map: Array<MapData, AgentState> =
        Array::try_from(Map::Array(data)).map_err(|e| format!("an agent record of another layout ({e})"))?;
    map.get(&0, 0).map_err(|e| format!("an unreadable agent record ({e})"))
}

/// Clock ticks since boot at which `pid` started; none once it has exited (a zombie too: an
/// agent killed under a parent that does not reap).
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = procfs::process::Process::new(pid as i32).ok()?.stat().ok()?;
    (!matches!(stat.state, 'Z' | 'X')).then_some(stat.starttime)
}

/// The agent that runs the set, if it is still running.
pub(super) fn running_agent(state: &AgentState) -> Option<u32> {
    let pid = state.agent_tgid;
    (pid != 0 && pid != std::process::id() && start_ticks(pid) == Some(state.agent_start_ticks)).then_some(pid)
}

/// A map of the pinned set, typed.
pub(super) fn open_map<T>(dir: &Path, name: &'static str, variant: fn(MapData) -> Map) -> Result<T, SensorError>
where
    T: TryFrom<Map, Error = MapError>,
{
    let path = dir.join(name);
    let data = MapData::from_pin(&path).map_err(|source| SensorError::PinnedMap { path: path.clone(), source })?;
    T::try_from(variant(data)).map_err(|source| SensorError::PinnedMap { path, source })
}

/// The links pinned in the set in `dir`: the programs attached.
pub(super) fn link_count(dir: &Path) -> Result<u64, SensorError> {
    let entries = fs::read_dir(dir).map_err(|source| SensorError::PinDir { path: dir.to_path_buf(), source })?;
    Ok(entries.flatten().filter(|entry| entry.file_name().to_string_lossy().starts_with("link_")).count() as u64)
}

impl Pins {
    /// Creates the agent's own maps in the set being built in `dir`, and claims it.
    pub fn create(dir: &Path) -> Result<Pins, SensorError> {
        let err = |name: &'static str| move |source| SensorError::Map { name, source };
        let pin_err = |name: &str| {
            let path = dir.join(name);
            move |source| SensorError::Pin { path, source }
        };
        // Pinning consumes a typed map: each is opened again from its pin below.
        Array::<MapData, AgentState>::create(1, 0)
            .map_err(err("agent"))?
            .pin(dir.join(STATE))
            .map_err(pin_err(STATE))?;
        HashMap::<MapData, u32, ExecRecord>::create(MAX_KEPT, BPF_F_NO_PREALLOC)
            .map_err(err("execs"))?
            .pin(dir.join(EXECS))
            .map_err(pin_err(EXECS))?;
        HashMap::<MapData, u32, ForkRecord>::create(MAX_KEPT, BPF_F_NO_PREALLOC)
            .map_err(err("forks"))?
            .pin(dir.join(FORKS))
            .map_err(pin_err(FORKS))?;
        HashMap::<MapData, u32, PathValue>::create(MAX_CRED_PATHS, BPF_F_NO_PREALLOC)
            .map_err(err("cred_paths"))?
            .pin(dir.join(CRED_PATHS))
            .map_err(pin_err(CRED_PATHS))?;
        HashMap::<MapData, u32, LostTree>::create(MAX_LOST_REPORTED, BPF_F_NO_PREALLOC)
            .map_err(err("lost_reported"))?
            .pin(dir.join(LOST_REPORTED))
            .map_err(pin_err(LOST_REPORTED))?;
        let mut pins = Pins::open(dir)?;
        pins.state = AgentState { object_id: object_id(), ..AgentState::default() };
        pins.claim()?;
        Ok(pins)
    }

    /// Opens the agent's own maps of the pinned set in `dir`.
    pub fn open(dir: &Path) -> Result<Pins, SensorError> {
        let state_map: Array<MapData, AgentState> = open_map(dir, STATE, Map::Array)?;
        let state = state_map.get(&0, 0).map_err(|source| SensorError::Map { name: "agent", source })?;
        Ok(Pins {
            dir: dir.to_path_buf(),
            state_map,
            state,
            execs: open_map(dir, EXECS, Map::HashMap)?,
            forks: open_map(dir, FORKS, Map::HashMap)?,
            cred_paths: open_map(dir, CRED_PATHS, Map::HashMap)?,
            cred_paths_kept: 0,
            next_heartbeat: Instant::now(),
        })
    }

    /// Makes this process the set's agent.
    pub fn claim(&mut self) -> Result<(), SensorError> {
        self.state.agent_tgid = std::process::id();
        self.state.agent_start_ticks = start_ticks(std::process::id()).unwrap_or(0);
        self.state.clean_stop = 0;
        self.beat()
    }

    /// Writes the state with a fresh heartbeat.
    pub fn beat(&mut self) -> Result<(), SensorError> {
        self.state.heartbeat_ns = boot_ns();
        self.next_heartbeat = Instant::now() + HEARTBEAT;
        self.state_map.set(0, self.state, 0).map_err(|source| SensorError::Map { name: "agent", source })
    }

    /// When [`Pins::tick`] next says the agent is alive.
    pub fn next_heartbeat(&self) -> Instant {
        self.next_heartbeat
    }

    /// A heartbeat when one is due.
    pub fn tick(&mut self, lost_seen: [u64; 3]) -> Result<(), SensorError> {
        if Instant::now() >= self.next_heartbeat || lost_seen != self.state.lost_seen {
            self.state.lost_seen = lost_seen;
            self.beat()?;
        }
        Ok(())
    }

    /// Drops the records of processes that are gone (their exit record was lost).
    pub fn prune(&mut self) {
        let gone = |pid: &u32| !Path::new(&format!("/proc/{pid}")).exists();
        let execs: Vec<u32> = self.execs.keys().filter_map(Result::ok).filter(gone).collect();
        for pid in execs {
            let _ = self.execs.remove(&pid);
        }
        let forks: Vec<u32> = self.forks.keys().filter_map(Result::ok).filter(gone).collect();
        for pid in forks {
            let _ = self.forks.remove(&pid);
        }
    }

    /// The previous agent's credential paths, by index.
    pub fn cred_paths(&self) -> Vec<String> {
        let mut paths: Vec<(u32, String)> = self
            .cred_paths
            .iter()
            .filter_map(Result::ok)
            .map(|(index, value)| {
                let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
                (index, String::from_utf8_lossy(&value[..end]).into_owned())
            })
            .collect();
        paths.sort();
        // Indexes are dense (the table appends); a gap would shift every later path.
        paths
            .iter()
            .enumerate()
            .take_while(|(i, (index, _))| *i as u32 == *index)
            .map(|(_, (_, p))| p.clone())
            .collect()
    }

    /// Keeps the table's paths from `cred_paths_kept` on.
    pub fn keep_cred_paths<'a>(&mut self, paths: impl Iterator<Item = &'a str>) -> Result<(), SensorError> {
        for path in paths.skip(self.cred_paths_kept) {
            let mut value = [0u8; MAX_RESOLVED_PATH];
            let bytes = &path.as_bytes()[..path.len().min(MAX_RESOLVED_PATH - 1)];
            value[..bytes.len()].copy_from_slice(bytes);
            self.cred_paths
                .insert(self.cred_paths_kept as u32, value, 0)
                .map_err(|source| SensorError::Map { name: "cred_paths", source })?;
            self.cred_paths_kept += 1;
        }
        Ok(())
    }

    /// The agent stops and leaves the set pinned: the next one knows it was a clean stop.
    pub fn leave(mut self) -> Result<(), SensorError> {
        self.state.clean_stop = 1;
        self.beat()
    }
}

/// What `credwatch stop` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Stopped {
    NothingPinned,
    /// The pins were removed; the agent that was running them (if any) was stopped first.
    Detached {
        agent: Option<u32>,
    },
}

/// `credwatch stop`: stops the agent running the set in `dir` (SIGTERM, then waits for it) and
/// removes the pins, which detaches the programs.
pub fn stop(dir: &Path) -> Result<Stopped, SensorError> {
    remove_abandoned(dir)?;
    if !dir.exists() {
        return Ok(Stopped::NothingPinned);
    }
    check_is_set(dir)?;
    let agent = read_state(dir).ok().as_ref().and_then(running_agent);
    if let Some(pid) = agent {
        // SAFETY: kill(2) on the agent, checked by its start time to be that process.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_WAIT;
        while start_ticks(pid).is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    fs::remove_dir_all(dir).map_err(dir_err(dir))?;
    Ok(Stopped::Detached { agent })
}

/// Refuses a directory that holds something but not a credwatch set (no `agent` pin): a
/// mistyped `--pin-dir /sys/fs/bpf` must not unpin other tools' programs.
pub(super) fn check_is_set(dir: &Path) -> Result<(), SensorError> {
    let mut entries = fs::read_dir(dir).map_err(dir_err(dir))?;
    if entries.next().is_none() || dir.join(STATE).exists() {
        return Ok(());
    }
    Err(SensorError::PinDir {
        path: dir.to_path_buf(),
        source: io::Error::other("holds pins that are not a credwatch set (no `agent` pin): left alone"),
    })
}

/// Removes a set, or one being built (its programs detach once nothing else holds their links).
pub(super) fn remove(dir: &Path) -> Result<(), SensorError> {
    match fs::remove_dir_all(dir) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(dir_err(dir)(error)),
        _ => Ok(()),
    }
}

/// Moves a whole set into place.
pub(super) fn publish(building: &Path, dir: &Path) -> Result<(), SensorError> {
    fs::rename(building, dir).map_err(dir_err(dir))
}

/// Creates the directory a set is built in (and its parents, on bpffs).
pub(super) fn create_dir(dir: &Path) -> Result<(), SensorError> {
    if !dir.starts_with(BPFFS) || dir.to_string_lossy().contains('.') {
        return Err(SensorError::PinDir {
            path: dir.to_path_buf(),
            source: io::Error::other(format!(
                "not under {BPFFS} or has a `.` (pins live on bpffs, which refuses dots)"
            )),
        });
    }
    fs::create_dir_all(dir).map_err(dir_err(dir))
}
