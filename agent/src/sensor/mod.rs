//! The live sensor: loads the kernel programs (tracepoints), fills their maps and turns their
//! ring buffer records into [`Event`]s. It holds no detection logic.

pub mod btf;
pub mod decode;
mod doctor;
pub mod offsets;
mod seed;

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
    path::Path,
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, HashMap, MapData, MapError, PerCpuArray, RingBuf},
    programs::{ProgramError, RawTracePoint, TracePoint},
    Ebpf, EbpfError, EbpfLoader,
};
use credwatch_common::{
    config_flag, lost_index, manager_flag, mark_flag, Config, ManagerValue, Mark, MANAGER_NAME_LEN, MODULE_KEY_LEN,
};
use thiserror::Error;

pub use self::doctor::{doctor, DoctorReport};
use self::{btf::BtfError, decode::Decoder};
use crate::{
    event::{Event, EventData, Lost},
    rules::manager::Manager,
};

/// The kernel programs, built by `cargo xtask build` and embedded by build.rs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/credwatch.bpf.o"));

/// `Mark::manager` of a root made by [`Sensor::mark_root`]: no manager exec made it.
pub const NO_MANAGER: u32 = u32::MAX;

/// Longest wait between two reads of the ring buffer: the programs do not wake the agent per
/// record.
const POLL_SLICE: Duration = Duration::from_millis(50);
const TRACEFS: &str = "/sys/kernel/tracing";

/// The raw tracepoints: program (function) name = tracepoint name.
const RAW_TRACEPOINTS: &[&str] = &["sched_process_exec", "sched_process_fork", "sched_process_exit"];
/// Syscall tracepoints; `open` and `creat` exist only on some architectures (not arm64).
const SYSCALL_TRACEPOINTS: &[(&str, bool)] = &[
    ("sys_enter_openat", true),
    ("sys_exit_openat", true),
    ("sys_enter_openat2", true),
    ("sys_exit_openat2", true),
    ("sys_enter_open", false),
    ("sys_exit_open", false),
    ("sys_enter_creat", false),
    ("sys_exit_creat", false),
];

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
    #[error("map `{name}`: {source}")]
    Map { name: &'static str, source: MapError },
    /// Load errors carry the verifier log in their message.
    #[error("program `{name}`: {source}")]
    Program { name: &'static str, source: ProgramError },
    #[error("manager `{manager}`: {what} `{value}` is longer than the kernel key ({max} bytes)")]
    KeyTooLong { manager: String, what: &'static str, value: String, max: usize },
    #[error("reading /proc: {0}")]
    Proc(io::Error),
    #[error("waiting for the ring buffer: {0}")]
    Poll(io::Error),
}

/// Counters since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SensorStats {
    /// Records decoded into events.
    pub events: u64,
    /// Records the kernel could not put in the ring buffer (full).
    pub lost: u64,
    /// Processes of a package tree that could not be marked (`MARKS` full).
    pub marks_full: u64,
    /// Records that were short, mis-sized or of an unknown kind (skipped).
    pub malformed: u64,
}

pub struct Sensor {
    ebpf: Ebpf,
    events: RingBuf<MapData>,
    lost: PerCpuArray<MapData, u64>,
    decoder: Decoder,
    stats: SensorStats,
}

fn map_err(name: &'static str) -> impl Fn(MapError) -> SensorError {
    move |source| SensorError::Map { name, source }
}

fn program_err(name: &'static str) -> impl Fn(ProgramError) -> SensorError {
    move |source| SensorError::Program { name, source }
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

/// The kernel keys for `managers`: exec basenames and module words (`-m\0pip\0`).
#[allow(clippy::type_complexity)]
pub fn manager_keys(
    managers: &[Manager],
) -> Result<(Vec<([u8; MANAGER_NAME_LEN], ManagerValue)>, Vec<([u8; MODULE_KEY_LEN], u32)>), SensorError> {
    let mut names = Vec::new();
    let mut modules = Vec::new();
    let too_long = |manager: &Manager, what, value: &str, max| SensorError::KeyTooLong {
        manager: manager.name.clone(),
        what,
        value: value.to_owned(),
        max,
    };
    for (index, manager) in managers.iter().enumerate() {
        let index = index as u32;
        for exec in &manager.execs {
            let key = padded_key(exec.as_bytes()).ok_or_else(|| too_long(manager, "exec", exec, MANAGER_NAME_LEN))?;
            names.push((key, ManagerValue { manager: index, flags: 0 }));
        }
        for module in &manager.modules {
            let joined: Vec<u8> = module.args.iter().flat_map(|w| w.bytes().chain([0])).collect();
            let key = padded_key(&joined)
                .ok_or_else(|| too_long(manager, "module args", &module.args.join(" "), MODULE_KEY_LEN))?;
            modules.push((key, index));
            for interpreter in &module.interpreters {
                let key = padded_key(interpreter.as_bytes())
                    .ok_or_else(|| too_long(manager, "interpreter", interpreter, MANAGER_NAME_LEN))?;
                // A plain exec of the same basename wins: it is a root whatever its argv.
                if !names.iter().any(|(name, _)| *name == key) {
                    names.push((key, ManagerValue { manager: index, flags: manager_flag::NEEDS_MODULE }));
                }
            }
        }
    }
    Ok((names, modules))
}

impl Sensor {
    /// Loads and attaches the kernel programs. With `auto_roots`, an exec of one of `managers`
    /// makes a package root (`watch`); without, only [`Sensor::mark_root`] and [`Sensor::seed`]
    /// do (`run`).
    pub fn start(managers: &[Manager], auto_roots: bool) -> Result<Sensor, SensorError> {
        ensure_tracefs()?;
        raise_memlock()?;
        let offsets = offsets::kernel_offsets(&btf::Btf::from_sys_fs()?)?;
        let (names, modules) = manager_keys(managers)?;
        let decoder = Decoder::new();
        // The programs carry no CO-RE relocations (offsets come through CONFIG), so aya need not
        // parse the kernel BTF a second time.
        let mut ebpf = EbpfLoader::new().btf(None).load(OBJECT)?;

        let config = Config {
            offsets,
            flags: if auto_roots { config_flag::AUTO_ROOTS } else { 0 },
            agent_tgid: std::process::id(),
        };
        let mut config_map: Array<_, Config> = take_typed(&mut ebpf, "CONFIG")?;
        config_map.set(0, config, 0).map_err(map_err("CONFIG"))?;
        let mut manager_map: HashMap<_, [u8; MANAGER_NAME_LEN], ManagerValue> = take_typed(&mut ebpf, "MANAGERS")?;
        for (key, value) in &names {
            manager_map.insert(key, value, 0).map_err(map_err("MANAGERS"))?;
        }
        let mut module_map: HashMap<_, [u8; MODULE_KEY_LEN], u32> = take_typed(&mut ebpf, "MANAGER_MODULES")?;
        for (key, value) in &modules {
            module_map.insert(key, value, 0).map_err(map_err("MANAGER_MODULES"))?;
        }
        let events: RingBuf<MapData> = take_typed(&mut ebpf, "EVENTS")?;
        let lost: PerCpuArray<MapData, u64> = take_typed(&mut ebpf, "LOST")?;

        for &name in RAW_TRACEPOINTS {
            let program: &mut RawTracePoint = ebpf
                .program_mut(name)
                .ok_or(SensorError::Missing { what: "program", name })?
                .try_into()
                .map_err(program_err(name))?;
            program.load().map_err(program_err(name))?;
            program.attach(name).map_err(program_err(name))?;
        }
        for &(name, required) in SYSCALL_TRACEPOINTS {
            if !required && !Path::new(TRACEFS).join("events/syscalls").join(name).is_dir() {
                continue;
            }
            let program: &mut TracePoint = ebpf
                .program_mut(name)
                .ok_or(SensorError::Missing { what: "program", name })?
                .try_into()
                .map_err(program_err(name))?;
            program.load().map_err(program_err(name))?;
            program.attach("syscalls", name).map_err(program_err(name))?;
        }
        Ok(Sensor { ebpf, events, lost, decoder, stats: SensorStats::default() })
    }

    fn marks(&mut self) -> Result<HashMap<&mut MapData, u32, Mark>, SensorError> {
        let map = self.ebpf.map_mut("MARKS").ok_or(SensorError::Missing { what: "map", name: "MARKS" })?;
        HashMap::try_from(map).map_err(map_err("MARKS"))
    }

    /// Makes `pid` a package root (`credwatch run`: call it before CMD execs).
    pub fn mark_root(&mut self, pid: u32) -> Result<(), SensorError> {
        let mark = Mark { root_pid: pid, depth: 0, manager: NO_MANAGER, flags: mark_flag::BY_AGENT };
        self.marks()?.insert(pid, mark, 0).map_err(map_err("MARKS"))
    }

    /// Finds the package trees already running (processes under a manager, per
    /// [`crate::rules::manager::root_manager`]), marks them in the kernel and returns an
    /// `Exec { seeded: true }` event for each, parents first. A process that the kernel
    /// already marked keeps its mark.
    pub fn seed(&mut self, managers: &[Manager]) -> Result<Vec<Event>, SensorError> {
        let decoder = self.decoder;
        let found =
            seed::scan(Path::new("/proc"), managers, std::process::id(), &decoder).map_err(SensorError::Proc)?;
        let mut marks = self.marks()?;
        let mut events = Vec::with_capacity(found.len());
        for (event, mark) in found {
            if marks.get(&event.pid, 0).is_err() {
                let mark = Mark { flags: mark.flags | mark_flag::BY_AGENT, ..mark };
                marks.insert(event.pid, mark, 0).map_err(map_err("MARKS"))?;
            }
            events.push(event);
        }
        Ok(events)
    }

    /// Waits up to `timeout` for records and appends their events to `out`, returning as soon
    /// as some arrived; appends a `Lost` event when a loss counter grew.
    pub fn poll(&mut self, timeout: Duration, out: &mut Vec<Event>) -> Result<(), SensorError> {
        let deadline = Instant::now() + timeout;
        loop {
            let before = out.len();
            self.drain(out);
            self.check_lost(out)?;
            let now = Instant::now();
            if out.len() > before || now >= deadline {
                return Ok(());
            }
            self.wait(POLL_SLICE.min(deadline - now))?;
        }
    }

    fn drain(&mut self, out: &mut Vec<Event>) {
        while let Some(item) = self.events.next() {
            match self.decoder.decode(&item) {
                Ok(event) => {
                    self.stats.events += 1;
                    out.push(event);
                }
                Err(_) => self.stats.malformed += 1,
            }
        }
    }

    /// Sleeps until the programs wake the reader (past their watermark) or `slice` passes.
    fn wait(&self, slice: Duration) -> Result<(), SensorError> {
        let mut fd = libc::pollfd { fd: self.events.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: fd is a valid pollfd for the duration of the call.
        let rc = unsafe { libc::poll(&mut fd, 1, slice.as_millis() as libc::c_int) };
        if rc < 0 {
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(SensorError::Poll(error));
            }
        }
        Ok(())
    }

    fn lost_total(&self, index: u32) -> Result<u64, SensorError> {
        let values = self.lost.get(&index, 0).map_err(map_err("LOST"))?;
        Ok(values.iter().sum())
    }

    fn check_lost(&mut self, out: &mut Vec<Event>) -> Result<(), SensorError> {
        for (index, source) in [(lost_index::EVENTS, "events"), (lost_index::MARKS_FULL, "marks")] {
            let total = self.lost_total(index)?;
            let seen = if index == lost_index::EVENTS { &mut self.stats.lost } else { &mut self.stats.marks_full };
            if total > *seen {
                out.push(Event {
                    time_ns: self.decoder.wall_ns(boot_ns()),
                    pid: 0,
                    data: EventData::Lost(Lost { source: source.to_owned(), count: total - *seen }),
                });
                *seen = total;
            }
        }
        Ok(())
    }

    pub fn stats(&self) -> SensorStats {
        self.stats
    }
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
    use crate::rules::manager::ModuleRoot;

    #[test]
    fn builds_kernel_keys_for_execs_and_modules() {
        let managers = vec![
            Manager { name: "npm".into(), execs: vec!["npm".into()], modules: vec![] },
            Manager {
                name: "pip".into(),
                execs: vec!["pip3".into()],
                modules: vec![ModuleRoot {
                    interpreters: vec!["python3".into()],
                    args: vec!["-m".into(), "pip".into()],
                }],
            },
        ];
        let (names, modules) = manager_keys(&managers).unwrap();
        assert_eq!(names.len(), 3);
        assert_eq!(&names[0].0[..4], b"npm\0");
        assert_eq!(names[0].1, ManagerValue { manager: 0, flags: 0 });
        assert_eq!(&names[2].0[..8], b"python3\0");
        assert_eq!(names[2].1, ManagerValue { manager: 1, flags: manager_flag::NEEDS_MODULE });
        assert_eq!(&modules[0].0[..8], b"-m\0pip\0\0");
        assert_eq!(modules[0].1, 1);

        let long = vec![Manager { name: "x".into(), execs: vec!["a-very-long-exec-name".into()], modules: vec![] }];
        let error = manager_keys(&long).unwrap_err().to_string();
        assert!(error.contains("a-very-long-exec-name"), "{error}");
    }
}
