//! What the kernel-only maps hold (see [`crate::maps`]): per-CPU scratch room where records
//! are built, what a syscall's entry saw for its exit, and the keys and counts of repeated acts.
//! Its own module, below the maps and the hook families that use them, so that `maps` names
//! no hook family.

use credwatch_common::{
    ExecEvent, OpenEvent, MANAGER_NAME_LEN, MAX_ARGS, MAX_CGROUP_PATH, MAX_ENV, MAX_GIVEN_PATH, MAX_RESOLVED_PATH,
    MODULE_KEY_LEN,
};

/// What a `struct path` holds: the mount and the dentry (`path_mnt`, then `path_dentry`).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Location {
    pub(crate) vfsmount: u64,
    pub(crate) dentry: u64,
}

/// Power-of-two sizes of [`Scratch`]'s buffers, so that masked indexes stay inside them.
pub(crate) const SCRATCH_NAME: usize = 1024;
pub(crate) const SCRATCH_ARGS: usize = 512;

/// Where an exec record is built before it is copied into the ring buffer at its real length.
#[repr(C)]
pub(crate) struct ExecScratch {
    pub(crate) event: ExecEvent,
    /// Filename, argv, environment, executable, cwd, the two cgroups, each right after the one
    /// before.
    pub(crate) tail: [u8; MAX_GIVEN_PATH + MAX_ARGS + MAX_ENV + 2 * MAX_RESOLVED_PATH + 2 * MAX_CGROUP_PATH],
    /// See [`crate::helpers::launder`].
    pub(crate) slot: u64,
}

/// What an open's entry saw, for its exit. The path itself is read at exit: by then the
/// syscall has faulted its page in (BPF cannot), and a small entry keeps the entry cheap.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct PendingOpen {
    pub(crate) syscall: u32,
    pub(crate) dirfd: i32,
    pub(crate) flags: u64,
    pub(crate) mode: u64,
    pub(crate) given_ptr: u64,
}

/// A slot of `OPEN_SLOTS`: the pending open of thread `tid` (0: free).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct OpenSlot {
    pub(crate) tid: u32,
    pub(crate) _pad: u32,
    pub(crate) open: PendingOpen,
}

/// Where an open record is built before it is copied into a ring buffer at its real length.
#[repr(C)]
pub(crate) struct OpenScratch {
    pub(crate) event: OpenEvent,
    /// The given path, then the resolved path.
    pub(crate) tail: [u8; MAX_GIVEN_PATH + MAX_RESOLVED_PATH],
    /// See [`crate::helpers::launder`].
    pub(crate) slot: u64,
    /// Where the opened file is, for its path walk and its repeat key (see `open::repeat_key`);
    /// zeros without a file. Here rather than on the stack: read back from a map value it is
    /// unknown to the verifier, which then walks the path once per call site, not once more
    /// for each thing it knew of it (zero, checked non-zero).
    pub(crate) at: Location,
}

/// Per-CPU room to find the manager of an exec (see `SCRATCH`).
#[repr(C)]
pub(crate) struct Scratch {
    /// See [`crate::helpers::launder`].
    pub(crate) slot: u64,
    pub(crate) name_key: [u8; MANAGER_NAME_LEN],
    pub(crate) module_key: [u8; MODULE_KEY_LEN],
    // Masked indexes plus a key's length: the compiler may add the key offset after masking.
    pub(crate) name: [u8; SCRATCH_NAME + MANAGER_NAME_LEN],
    pub(crate) args: [u8; SCRATCH_ARGS + MODULE_KEY_LEN],
}

/// What a tamper syscall's entry saw, for its exit.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct PendingSyscall {
    pub(crate) syscall: u32,
    pub(crate) record_flags: u32,
    pub(crate) target_pid: u32,
    pub(crate) _pad: u32,
    pub(crate) operation: u64,
}

/// What makes two acts of a process the same act: the process, the record kind, and what the
/// kind's act was done to (see the constructors).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RepeatKey {
    pub(crate) tgid: u32,
    pub(crate) kind: u32,
    pub(crate) detail: u64,
    pub(crate) a: u64,
    pub(crate) b: u64,
    pub(crate) c: u64,
}

impl RepeatKey {
    /// An open of the file (dev, ino) through the mount at `mount` (a `struct vfsmount`), with
    /// access mode `accmode` (`O_ACCMODE` bits) and the record's enforcement flags (blocked,
    /// denied, failed closed). The mount is part of it because one file bound at several places
    /// is as many paths, each of which the rules judge (`run --contain` binds one empty file
    /// over every credential it hides). A failed open has no file and is never a repeat: two of
    /// them may have been given different paths.
    #[inline(always)]
    pub(crate) fn open(tgid: u32, dev: u64, ino: u64, mount: u64, accmode: u64, enforced: u32) -> RepeatKey {
        RepeatKey {
            tgid,
            kind: credwatch_common::kind::OPEN,
            detail: accmode | (enforced as u64) << 32,
            a: dev,
            b: ino,
            c: mount,
        }
    }

    /// A connect to an IPv4 or IPv6 address: the family, the port and the address (`scope`:
    /// an IPv6 address's scope id; the high half of `addr` holds an IPv4 address's 4 bytes).
    #[inline(always)]
    pub(crate) fn connect(tgid: u32, family: u16, port: u16, scope: u32, addr: [u64; 2]) -> RepeatKey {
        RepeatKey {
            tgid,
            kind: credwatch_common::kind::CONNECT,
            detail: family as u64 | (port as u64) << 16 | (scope as u64) << 32,
            a: addr[0],
            b: addr[1],
            c: 0,
        }
    }

    /// A tamper call: the syscall, the record's flags (target, enforcement), the operation and
    /// the target.
    #[inline(always)]
    pub(crate) fn syscall(tgid: u32, syscall: u32, flags: u32, operation: u64, target: u32) -> RepeatKey {
        RepeatKey {
            tgid,
            kind: credwatch_common::kind::SYSCALL,
            detail: syscall as u64 | (flags as u64) << 32,
            a: operation,
            b: target as u64,
            c: 0,
        }
    }
}

/// Value of `REPEATS`: when the key's last record was sent, and what was counted since.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Repeat {
    pub(crate) boot_ns: u64,
    /// The `PROCESS_REPEATS` epoch of the process that made it.
    pub(crate) epoch: u64,
    pub(crate) count: u32,
    /// The tree's `TAINTED` count at the record (connects; 0 for the others).
    pub(crate) tainted: u32,
}

/// Value of `PROCESS_REPEATS`, keyed by tgid.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ProcessRepeats {
    /// Boot time of the process's first act: tells its keys from a dead process's of the same
    /// pid.
    pub(crate) epoch: u64,
    /// Acts counted that no record has carried yet.
    pub(crate) uncarried: u64,
}
