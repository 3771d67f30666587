//! Marks in task storage: where the kernel allows it (5.12 and later), every marked process's
//! group leader also holds a value in the kernel's `TASK_MARKS`, a task storage map, and the
//! syscall programs look there before `MARKS`: an unmarked process then returns after a load
//! or two from its `struct task_struct` instead of hashing its tgid (the fentry backend's early
//! exit on every open of the machine). The kernel sets it where it marks (exec, fork); the
//! agent, for the processes it marks itself (`run`'s command, seeded trees, the canary),
//! through a pidfd of the process.
//!
//! Where it is off (5.10 has neither the map type nor the helpers from tracing programs), the
//! programs' task storage code is dead to the verifier (a read-only global), but the object
//! still defines the map and aya creates every map it defines: a small array stands in for it,
//! handed to aya through a pin.

use std::{
    ffi::c_int,
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
};

use aya::{
    maps::{Array, Map, MapData},
    util::KernelVersion,
    Ebpf, EbpfLoader,
};

use super::{btf::Btf, pins, SensorError};

/// The map's name in the object (and its pin's in a pinned set).
pub const MAP: &str = "TASK_MARKS";
/// Tries of an update that lost the race to create a task's storage (EAGAIN).
const MAX_TRIES: u32 = 8;
/// The first kernel whose tracing programs can use task storage (5.11 had it for BPF LSM only).
const FIRST_KERNEL: KernelVersion = KernelVersion::new(5, 12, 0);

/// What the programs are told before load: the read-only globals of the kernel's maps.rs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Globals {
    on: u8,
    group_leader: u32,
    bpf_storage: u32,
}

impl Globals {
    /// Whether `kernel` is recent enough (the BTF decides the rest, see [`Globals::resolve`]).
    pub fn kernel_allows(kernel: Option<KernelVersion>) -> bool {
        kernel.is_some_and(|v| v >= FIRST_KERNEL)
    }

    /// On where the kernel is recent enough and its BTF has the two members the programs load.
    pub fn resolve(kernel: Option<KernelVersion>, btf: Option<&Btf>) -> Globals {
        let recent = Globals::kernel_allows(kernel);
        let offsets = btf.and_then(|btf| {
            Some((
                btf.member_offset("task_struct", "group_leader").ok()?,
                btf.member_offset("task_struct", "bpf_storage").ok()?,
            ))
        });
        match (recent, offsets) {
            (true, Some((group_leader, bpf_storage))) => Globals { on: 1, group_leader, bpf_storage },
            _ => Globals::default(),
        }
    }

    pub fn on(&self) -> bool {
        self.on != 0
    }

    /// Sets the globals on `loader`, and where off, makes it take a stand-in for the map
    /// (kept until the returned value is dropped, after the load).
    pub fn prepare<'a>(&'a self, loader: &mut EbpfLoader<'a>) -> Result<Option<StandIn>, SensorError> {
        loader
            .override_global("TASK_MARKS_ON", &self.on, true)
            .override_global("TASK_GROUP_LEADER", &self.group_leader, true)
            .override_global("TASK_BPF_STORAGE", &self.bpf_storage, true)
            // aya 0.14 has no type for task storage: the map comes out as `Map::Unsupported`.
            .allow_unsupported_maps();
        if self.on() {
            return Ok(None);
        }
        let stand_in = StandIn::create()?;
        // aya reuses a map pinned at a map's pin path instead of creating it.
        loader.map_pin_path(MAP, stand_in.path.clone());
        Ok(Some(stand_in))
    }
}

/// A pinned array that stands in for `TASK_MARKS` at load where the kernel has no task storage;
/// its pin is removed when dropped, after the load (the loaded object holds the map from then).
pub struct StandIn {
    path: PathBuf,
}

impl StandIn {
    fn create() -> Result<StandIn, SensorError> {
        pins::ensure_bpffs()?;
        let path = PathBuf::from(format!("/sys/fs/bpf/credwatch_task_marks_{}", std::process::id()));
        let map = Array::<MapData, u32>::create(1, 0).map_err(|source| SensorError::Map { name: MAP, source })?;
        // A pin left by an earlier run of this pid (a crash between pin and load).
        let _ = std::fs::remove_file(&path);
        map.pin(&path).map_err(|source| SensorError::Pin { path: path.clone(), source })?;
        Ok(StandIn { path })
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The agent's handle on `TASK_MARKS` (none where it is off).
#[derive(Debug)]
pub struct TaskMarks {
    map: Option<MapData>,
}

impl TaskMarks {
    /// Takes the map out of a loaded object, where `globals` turned it on (elsewhere the object
    /// keeps its stand-in, which its programs name).
    pub fn take(ebpf: &mut Ebpf, globals: &Globals) -> Result<TaskMarks, SensorError> {
        if !globals.on() {
            return Ok(TaskMarks { map: None });
        }
        match ebpf.take_map(MAP) {
            Some(Map::Unsupported(map)) => Ok(TaskMarks { map: Some(map) }),
            _ => Err(SensorError::Missing { what: "map", name: MAP }),
        }
    }

    /// The pinned set's map, if the agent that built it used one.
    pub fn open_pinned(dir: &Path) -> Result<TaskMarks, SensorError> {
        let path = dir.join(MAP);
        if !path.exists() {
            return Ok(TaskMarks { map: None });
        }
        let map = MapData::from_pin(&path).map_err(|source| SensorError::PinnedMap { path, source })?;
        Ok(TaskMarks { map: Some(map) })
    }

    /// Pins the map in `dir` (a set being built), where it is on.
    pub fn pin(&self, dir: &Path) -> Result<(), SensorError> {
        let Some(map) = &self.map else { return Ok(()) };
        let path = dir.join(MAP);
        map.pin(&path).map_err(|source| SensorError::Pin { path, source })
    }

    /// Gives process `pid` (just marked in `MARKS`) its value. A process already gone is left
    /// alone: whoever marked it removes its mark.
    pub fn mark(&self, pid: u32) -> Result<(), SensorError> {
        let Some(map) = &self.map else { return Ok(()) };
        let mut tries = 0;
        loop {
            match update_by_pid(map.fd().as_fd(), pid, 1) {
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(()),
                // The kernel gave the task its first storage meanwhile (its exec, marked in
                // MARKS just before, sets it too): the next try finds that storage.
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && tries < MAX_TRIES => tries += 1,
                result => return result.map_err(|source| SensorError::TaskMark { pid, source }),
            }
        }
    }
}

/// `bpf(BPF_MAP_UPDATE_ELEM)` of a task storage map, whose key is a pidfd of the process.
fn update_by_pid(map: BorrowedFd<'_>, pid: u32, value: u32) -> io::Result<()> {
    // SAFETY: pidfd_open takes a pid and flags; the result is checked.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as c_int, 0) };
    if pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd of ours.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as c_int) };
    let key: c_int = pidfd.as_raw_fd();
    /// `union bpf_attr` for the map element commands.
    #[repr(C)]
    struct ElemAttr {
        map_fd: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    let attr = ElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: &key as *const c_int as u64,
        value: &value as *const u32 as u64,
        flags: 0,
    };
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    // SAFETY: attr points to a valid attribute block of its size, key and value to live locals.
    let rc = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_MAP_UPDATE_ELEM, &attr as *const ElemAttr, std::mem::size_of::<ElemAttr>())
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_from_5_12_with_both_members_off_before_or_without_them() {
        let btf = Btf::from_sys_fs().ok();
        let has_members = btf.as_ref().is_some_and(|btf| {
            btf.member_offset("task_struct", "group_leader").is_ok()
                && btf.member_offset("task_struct", "bpf_storage").is_ok()
        });
        assert!(!Globals::resolve(Some(KernelVersion::new(5, 10, 223)), btf.as_ref()).on());
        assert!(!Globals::resolve(Some(KernelVersion::new(5, 11, 0)), btf.as_ref()).on());
        assert!(!Globals::resolve(Some(KernelVersion::new(6, 12, 0)), None).on());
        assert!(!Globals::resolve(None, btf.as_ref()).on());
        assert_eq!(Globals::resolve(Some(KernelVersion::new(6, 12, 0)), btf.as_ref()).on(), has_members);
    }
}
