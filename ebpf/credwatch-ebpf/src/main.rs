//! credwatch's kernel programs: process lineage (exec, fork, exit) and file opens of the
//! processes inside package trees.
//!
//! Maps (the agent finds them by these names):
//! - `MARKS`: tgid -> [`Mark`] of every process in a package tree. Every program starts with a
//!   lookup here and returns on a miss, so an unmarked process costs one lookup.
//! - `MANAGERS`: NUL-padded exec basename -> [`ManagerValue`] (filled from the rules).
//! - `MANAGER_MODULES`: NUL-separated, NUL-padded argv words after argv[0] -> manager index
//!   (`-m\0pip\0`), for interpreters flagged `NEEDS_MODULE`.
//! - `MANAGER_SCRIPTS`: NUL-padded script stem (`yarn` of `.yarn/releases/yarn-4.5.3.cjs`) ->
//!   manager index, for interpreters flagged `NEEDS_SCRIPT`. The kernel marks every script of
//!   that stem; the engine keeps only the files the rules name.
//! - `CONFIG`: the single [`Config`] (kernel offsets from BTF, flags, the agent's tgid).
//! - `EVENTS`: the bulk ring buffer of records for userspace.
//! - `PRIORITY`: a small ring buffer for the records that must not share the bulk's fate:
//!   opens of credential inodes, blocked actions and tamper syscalls. The agent reads it first.
//! - `LOST`: per-CPU counters indexed by [`lost_index`] (one per ring buffer, and a full MARKS).
//! - `CRED_INODES`: (dev, ino) -> [`CredInode`] of every credential file the agent found.
//! - `SPARED_EXES`: (dev, ino) -> [`SparedExe`]: executables of `kill` rules' actors (ssh and
//!   git started by the manager), which `--enforce` does not kill.
//! - `OPEN_SLOTS`: what an open's entry saw, in the slot of `tid % OPEN_SLOT_COUNT` (tagged with
//!   the tid); when another thread holds the slot, in `PENDING_OPENS`.
//! - `PENDING_OPENS`, `PENDING_RENAMES`, `PENDING_SYSCALLS`: tid -> what a syscall's entry saw,
//!   until its exit.
//! - `SCRATCH`, `RENAME_SCRATCH`, `OPEN_SCRATCH`, `EXEC_SCRATCH`: per-CPU buffers too large for
//!   the 512-byte stack (open and exec records are built in theirs, then copied to a ring buffer
//!   at their real length).
//! - `DNS_SOCKETS`: `tgid << 32 | fd` -> [`DnsSocket`]: sockets a marked process connected to
//!   port 53 (glibc's resolver connects a UDP socket, then sends without an address), so that
//!   what it sends on them is reported as a DNS query. LRU: a closed socket only ages out.
//! - `TAINTED`: root tgid of a tree one of whose processes opened a credential inode (under
//!   `--enforce` only): its processes' connects are held for the agent's verdict.
//! - `SYSCALLS`: syscall number (the index) -> [`HookedSyscall`]. One program serves all the entry (or all
//!   the exit) tracepoints of a family and reads `__syscall_nr` to know which syscall it is:
//!   the kernel verifies each program once, and start-up is mostly verification.
//!
//! Notes:
//! - A process is gone when the last thread of its group exits: `sched_process_exit` passes
//!   `group_dead` since Linux 6.16; before, `do_exit()` has already decremented `signal->live`
//!   when the tracepoint fires, so `live == 0` says the same (two last threads racing may both
//!   see 0; only the one whose delete of the mark succeeds reports).
//! - Bulk records are submitted with the kernel's adaptive wakeup: only the first record after
//!   the agent has read everything wakes it (the kernel compares the record's position with the
//!   consumer's), so an idle agent sleeps until something happens, and while records flow it
//!   reads them every 10 ms without a wakeup per record. It is also woken when more than
//!   [`WAKEUP_WATERMARK`] bytes wait (looked at every [`WAKEUP_CHECK_EVERY`] records of a CPU).
//!   Priority records wake it the same way.
//! - The hot path avoids helper calls where it can: each costs more than its work here (calls
//!   and returns go through the CPU's speculation mitigations). Hence one probe read for
//!   neighbouring fields, short dentry names taken from the dentry's own read, ids and cgroups
//!   only in exec records, and zeros stored one by one rather than through `memset`.
//! - Blocking (`--enforce`) is `bpf_send_signal(SIGKILL)`: the signal is delivered when the
//!   syscall returns to user space, so the syscall itself completes. For an open that is
//!   enough (the fd exists but the process never runs again to read it); for a tamper syscall
//!   (bpf, a module load, a signal to the agent) its effect happens anyway: only LSM or
//!   `bpf_override_return`, neither loadable here, could refuse it.
//! - Credential inodes: at the exit of every open of a marked process, the opened file's
//!   (s_dev, i_ino) is looked up in `CRED_INODES` (one more lookup, marked processes only).
//!   A hit goes to `PRIORITY`, and under `--enforce` a `KILL` inode kills the process. The
//!   open has completed by then (an `O_TRUNC` has truncated), but nothing was read.
//! - Renames and links: the directory a relative path starts from (its dirfd's file or the
//!   cwd) is resolved at entry; `..` and symlinks inside the relative part are not resolved.
//! - Signals count as tamper only when aimed at the agent: kill(agent tgid) or kill(-1),
//!   tkill/tgkill of its main thread, pidfd_send_signal on a pidfd of it (a /proc/<pid> dirfd
//!   used as a pidfd is not resolved). A process-group kill that includes the agent is not.
//! - Egress: `connect` of a marked process is reported at entry with the socket address as
//!   given (a failed attempt is an attempt). Sends (`sendto`, `sendmsg`, `sendmmsg`) are
//!   reported only when they go to port 53, by address or on a socket connected there: their
//!   payload is a DNS query, parsed in userspace. `write` on such a socket is not hooked (every
//!   process's writes would pay the lookup); glibc's resolver and c-ares use the send calls.
//! - Holding a connect (`--enforce`): when the tree has opened a credential inode, a connect to
//!   an IP address (not port 53) by package code (depth > 0) sends SIGSTOP to the process at
//!   the connect's entry. The handshake may complete, but the process stops before it returns
//!   to user space, so nothing is sent until the agent, having judged the destination, sends
//!   SIGKILL or SIGCONT.
//! - Cgroups: an exec record carries the process's cgroup paths, walked up kernfs nodes from
//!   `task->cgroups`: in the v1 hierarchy of the controller `Config::cgroup_subsys` names (its
//!   `css_set->subsys[]` state's cgroup) and in the unified one (`dfl_cgrp`). The cgroup v2 id
//!   alone names no v1 cgroup, and a process that exits within a millisecond is gone before
//!   userspace could read `/proc/<pid>/cgroup`. A process that moves to another cgroup without
//!   exec'ing keeps, for the agent, the paths of its last exec.
//! - Verifier cost: values that would otherwise be followed one by one (a path's length, where
//!   a basename starts, map keys built byte by byte) go through memory, where the verifier
//!   keeps no per-value state, and are bounded again after.
#![no_std]
#![no_main]

use core::{
    ffi::c_void,
    mem::size_of,
    ptr::{addr_of_mut, read_volatile, write_volatile},
};

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_get_current_uid_gid,
        bpf_ktime_get_boot_ns,
        generated::{bpf_probe_read_kernel, bpf_probe_read_kernel_str, bpf_probe_read_user, bpf_probe_read_user_str},
    },
    macros::{map, raw_tracepoint, tracepoint},
    maps::{ring_buf::RingBufEntry, Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::{RawTracePointContext, TracePointContext},
    EbpfContext,
};
use credwatch_common::{
    config_flag, cred_flag, kind, lost_index, manager_flag, mark_flag, net_syscall, open_syscall, path_flag,
    record_flag, rename_syscall, spare_flag, syscall_family, tamper_syscall, Config, ConnectEvent, CredInode,
    DnsQueryEvent, DnsSocket, EventHeader, ExecEvent, ExitEvent, ForkEvent, HookedSyscall, InodeKey, KernelOffsets,
    ManagerValue, Mark, OpenEvent, RenameEvent, ResolvedPath, SparedExe, SyscallEvent, DNS_SOCKADDR, FILE_WINDOW,
    MANAGER_NAME_LEN, MAX_ARGS, MAX_CGROUP_DEPTH, MAX_CGROUP_NAME, MAX_CGROUP_PATH, MAX_DNS_PAYLOAD, MAX_ENV,
    MAX_EXEC_RECORD, MAX_GIVEN_PATH, MAX_OPEN_RECORD, MAX_PATH_COMPONENTS, MAX_RESOLVED_PATH, MAX_SOCKADDR,
    MODULE_KEY_LEN, NO_CGROUP_SUBSYS, NO_MANAGER,
};

/// Processes that can be marked at once; a full map is counted in `LOST[MARKS_FULL]`.
const MAX_MARKS: u32 = 65536;
const MAX_MANAGERS: u32 = 256;
/// Syscall numbers of the hooked tracepoints (about 25 on x86_64).
/// Entries of `SYSCALLS`, indexed by syscall number: above every number of x86_64 and arm64.
const SYSCALL_TABLE: u32 = 1024;
/// Slots of `OPEN_SLOTS`, indexed by the low bits of the thread id (a power of two).
const OPEN_SLOT_COUNT: u32 = 16384;
/// Threads with an open syscall in flight whose slot another thread holds (LRU: a lost exit
/// only ages out).
const MAX_PENDING_OPENS: u32 = 16384;
/// Open records are variable-length (about 160 bytes for a short path): 4 MiB holds some 25,000,
/// a poll interval's worth at 400k opens/s, and the agent is woken at a quarter full. A larger
/// buffer costs the agent resident memory (it maps the data twice).
const EVENTS_BYTES: u32 = 4 << 20;
/// Room for about 2,500 open records: enough for a burst of credential hits between two polls.
const PRIORITY_BYTES: u32 = 512 << 10;
/// Credential files the agent can register (its table has the same limit).
const MAX_CRED_INODES: u32 = 16384;
const MAX_SPARED_EXES: u32 = 256;
/// Threads with a rename-family syscall in flight (each entry is a whole record, ~9 KiB).
const MAX_PENDING_RENAMES: u32 = 256;
const MAX_PENDING_SYSCALLS: u32 = 4096;
const SIGKILL: u32 = 9;
const SIGSTOP: u32 = 19;
/// Sockets connected to port 53 remembered at once (LRU).
const MAX_DNS_SOCKETS: u32 = 4096;
/// Trees remembered as having opened a credential inode (LRU).
const MAX_TAINTED: u32 = 4096;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const DNS_PORT: u16 = 53;
/// `IORING_OP_OPENAT` and `IORING_OP_OPENAT2`: submissions that open files go to `PRIORITY`.
const IORING_OP_OPENAT: u8 = 18;
const IORING_OP_OPENAT2: u8 = 28;
/// Wake the reader when this much is waiting, although it has not caught up (while records flow
/// it reads them on a short timer).
const WAKEUP_WATERMARK: u64 = 1 << 20;
/// Records per CPU between two looks at the bulk ring's fill level: 2 CPUs x 32 records of at
/// most `MAX_EXEC_RECORD` bytes past the watermark still fit in the ring.
const WAKEUP_CHECK_EVERY: u32 = 32;

/// Controllers a `css_set` has room for (`CGROUP_SUBSYS_COUNT` is 14 to 16 on the supported
/// kernels): a bound on the index the agent passes.
const MAX_CGROUP_SUBSYS: u32 = 64;

/// Per-CPU LRU lists: no lock shared by all CPUs on the open path (uapi/linux/bpf.h).
const BPF_F_NO_COMMON_LRU: u32 = 2;
/// `bpf_ringbuf_submit` flags and `bpf_ringbuf_query` selector (uapi/linux/bpf.h). No flag
/// (adaptive): wake the reader only when it had caught up (the record is the first unread one).
const BPF_RB_ADAPTIVE_WAKEUP: u64 = 0;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;

/// A dentry name is at most NAME_MAX (255) bytes plus its NUL.
const NAME_SPACE: usize = 256;
/// Words of a dentry read per path component, from `d_parent`: parent, `d_name` (2), `d_inode`,
/// then the inline name's first [`INLINE_NAME`] bytes.
const DENTRY_WINDOW: usize = 8;
/// Names shorter than this (a power of two) are copied from the component's read (see
/// [`DENTRY_WINDOW`]).
const INLINE_NAME: usize = 32;
/// Bytes of argv examined to find the words after argv[0] for `MANAGER_MODULES`.
const MODULE_SCAN: usize = 256;
/// argv words after argv[0] looked at for an interpreter's script (options come first).
const SCRIPT_WORDS: usize = 8;
/// Longest basename of a script that is looked up in `MANAGER_SCRIPTS`.
const SCRIPT_BASE_MAX: usize = 48;
/// Power-of-two sizes of the scratch buffers, so that masked indexes stay inside them.
const SCRATCH_NAME: usize = 1024;
const SCRATCH_ARGS: usize = 512;
const AT_FDCWD: i32 = -100;
/// `creat(path, mode)` is `open(path, O_CREAT | O_WRONLY | O_TRUNC, mode)`.
const CREAT_FLAGS: u64 = 0o100 | 0o1 | 0o1000;

/// Syscall tracepoint records: `__syscall_nr` is at offset 8, arguments start at 16, 8 bytes
/// each; the result of a `sys_exit_*` is at 16.
const TP_SYSCALL_NR: usize = 8;
const TP_ARG0: usize = 16;
const TP_ARG1: usize = 24;
const TP_ARG2: usize = 32;
const TP_ARG3: usize = 40;
const TP_ARG4: usize = 48;
const TP_ARG5: usize = 56;
const TP_RET: usize = 16;

/// What an open's entry saw, for its exit. The path itself is read at exit: by then the
/// syscall has faulted its page in (BPF cannot), and a small entry keeps the entry cheap.
#[repr(C)]
#[derive(Clone, Copy)]
struct PendingOpen {
    syscall: u32,
    dirfd: i32,
    flags: u64,
    mode: u64,
    given_ptr: u64,
}

/// Where an exec record is built before it is copied into the ring buffer at its real length.
#[repr(C)]
struct ExecScratch {
    event: ExecEvent,
    /// Filename, argv, environment, executable, cwd, the two cgroups, each right after the one
    /// before.
    tail: [u8; MAX_GIVEN_PATH + MAX_ARGS + MAX_ENV + 2 * MAX_RESOLVED_PATH + 2 * MAX_CGROUP_PATH],
    /// See [`launder`].
    slot: u64,
}

/// A slot of `OPEN_SLOTS`: the pending open of thread `tid` (0: free).
#[repr(C)]
#[derive(Clone, Copy)]
struct OpenSlot {
    tid: u32,
    _pad: u32,
    open: PendingOpen,
}

/// Where an open record is built before it is copied into a ring buffer at its real length.
#[repr(C)]
struct OpenScratch {
    event: OpenEvent,
    /// The given path, then the resolved path.
    tail: [u8; MAX_GIVEN_PATH + MAX_RESOLVED_PATH],
    /// See [`launder`].
    slot: u64,
}

/// What a tamper syscall's entry saw, for its exit.
#[repr(C)]
#[derive(Clone, Copy)]
struct PendingSyscall {
    syscall: u32,
    record_flags: u32,
    target_pid: u32,
    _pad: u32,
    operation: u64,
}

#[repr(C)]
struct Scratch {
    /// See [`launder`].
    slot: u64,
    name_key: [u8; MANAGER_NAME_LEN],
    module_key: [u8; MODULE_KEY_LEN],
    // Masked indexes plus a key's length: the compiler may add the key offset after masking.
    name: [u8; SCRATCH_NAME + MANAGER_NAME_LEN],
    args: [u8; SCRATCH_ARGS + MODULE_KEY_LEN],
}

#[map]
static MARKS: HashMap<u32, Mark> = HashMap::with_max_entries(MAX_MARKS, 0);
#[map]
static MANAGERS: HashMap<[u8; MANAGER_NAME_LEN], ManagerValue> = HashMap::with_max_entries(MAX_MANAGERS, 0);
#[map]
static MANAGER_MODULES: HashMap<[u8; MODULE_KEY_LEN], u32> = HashMap::with_max_entries(MAX_MANAGERS, 0);
#[map]
static MANAGER_SCRIPTS: HashMap<[u8; MANAGER_NAME_LEN], u32> = HashMap::with_max_entries(MAX_MANAGERS, 0);
#[map]
static CONFIG: Array<Config> = Array::with_max_entries(1, 0);
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);
#[map]
static PRIORITY: RingBuf = RingBuf::with_byte_size(PRIORITY_BYTES, 0);
#[map]
static CRED_INODES: HashMap<InodeKey, CredInode> = HashMap::with_max_entries(MAX_CRED_INODES, 0);
#[map]
static SPARED_EXES: HashMap<InodeKey, SparedExe> = HashMap::with_max_entries(MAX_SPARED_EXES, 0);
#[map]
static PENDING_RENAMES: LruHashMap<u32, RenameEvent> = LruHashMap::with_max_entries(MAX_PENDING_RENAMES, 0);
#[map]
static RENAME_SCRATCH: PerCpuArray<RenameEvent> = PerCpuArray::with_max_entries(1, 0);
#[map]
static PENDING_SYSCALLS: LruHashMap<u32, PendingSyscall> = LruHashMap::with_max_entries(MAX_PENDING_SYSCALLS, 0);
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(lost_index::COUNT, 0);
#[map]
static OPEN_SLOTS: Array<OpenSlot> = Array::with_max_entries(OPEN_SLOT_COUNT, 0);
#[map]
static PENDING_OPENS: LruHashMap<u32, PendingOpen> =
    LruHashMap::with_max_entries(MAX_PENDING_OPENS, BPF_F_NO_COMMON_LRU);
#[map]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);
#[map]
static EXEC_SCRATCH: PerCpuArray<ExecScratch> = PerCpuArray::with_max_entries(1, 0);
#[map]
static OPEN_SCRATCH: PerCpuArray<OpenScratch> = PerCpuArray::with_max_entries(1, 0);
#[map]
static SYSCALLS: Array<HookedSyscall> = Array::with_max_entries(SYSCALL_TABLE, 0);
#[map]
static DNS_SOCKETS: LruHashMap<u64, DnsSocket> = LruHashMap::with_max_entries(MAX_DNS_SOCKETS, 0);
#[map]
static TAINTED: LruHashMap<u32, u32> = LruHashMap::with_max_entries(MAX_TAINTED, 0);
#[map]
static WAKEUP_COUNTDOWN: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

type Res<T> = Result<T, i64>;

/// Reads a `T` at `base + offset` in kernel memory.
#[inline(always)]
fn read<T>(base: u64, offset: u32) -> Res<T> {
    // SAFETY: bpf_probe_read_kernel checks the address; a bad pointer is an error, not a fault.
    unsafe { aya_ebpf::helpers::bpf_probe_read_kernel((base + offset as u64) as *const T).map_err(|e| e as i64) }
}

#[inline(always)]
fn current_mark(tgid: u32) -> Option<Mark> {
    // SAFETY: the value is copied out at once.
    unsafe { MARKS.get(&tgid).copied() }
}

#[inline(always)]
fn config() -> Option<&'static Config> {
    CONFIG.get(0)
}

#[inline(always)]
fn count_lost(index: u32) {
    if let Some(counter) = LOST.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, and programs do not migrate while they run.
        unsafe { *counter += 1 };
    }
}

/// Reserves a record in `PRIORITY` or in the bulk `EVENTS`, counting a failure per buffer.
#[inline(always)]
fn reserve<T: 'static>(priority: bool) -> Option<RingBufEntry<T>> {
    if priority {
        let entry = PRIORITY.reserve::<T>(0);
        if entry.is_none() {
            count_lost(lost_index::PRIORITY);
        }
        return entry;
    }
    let entry = EVENTS.reserve::<T>(0);
    if entry.is_none() {
        count_lost(lost_index::EVENTS);
    }
    entry
}

#[inline(always)]
fn submit<T>(entry: RingBufEntry<T>, priority: bool) {
    if priority {
        // Rare and urgent: the default (adaptive) wakeup.
        entry.submit(0);
        return;
    }
    entry.submit(events_wakeup());
}

/// Copies a variable-length record built in scratch memory into `PRIORITY` or `EVENTS`, with
/// the same wakeup policy as [`submit`].
#[inline(always)]
fn output(record: &[u8], priority: bool) {
    if priority {
        if PRIORITY.output::<[u8]>(record, 0).is_err() {
            count_lost(lost_index::PRIORITY);
        }
    } else if EVENTS.output::<[u8]>(record, events_wakeup()).is_err() {
        count_lost(lost_index::EVENTS);
    }
}

/// No wakeup per record: the adaptive one (flags 0) wakes the reader only for the first record
/// after it caught up, which is what lets an idle agent sleep without a timer; userspace then
/// batches on a 10 ms timer while records flow, and is woken early when the bulk buffer fills
/// past the watermark. The fill level is looked at once every [`WAKEUP_CHECK_EVERY`] records
/// of a CPU (the query is a helper call on every open).
#[inline(always)]
fn events_wakeup() -> u64 {
    let Some(countdown) = WAKEUP_COUNTDOWN.get_ptr_mut(0) else { return BPF_RB_ADAPTIVE_WAKEUP };
    // SAFETY: per-CPU slot, and programs do not migrate while they run.
    unsafe {
        if *countdown > 0 {
            *countdown -= 1;
            return BPF_RB_ADAPTIVE_WAKEUP;
        }
        *countdown = WAKEUP_CHECK_EVERY - 1;
    }
    if EVENTS.query(BPF_RB_AVAIL_DATA) > WAKEUP_WATERMARK {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_ADAPTIVE_WAKEUP
    }
}

/// Sends SIGKILL to the current process; true when the signal was queued.
#[inline(always)]
fn kill_current() -> bool {
    // SAFETY: signals the current process; allowed from tracepoint programs.
    unsafe { aya_ebpf::helpers::generated::bpf_send_signal(SIGKILL) == 0 }
}

/// The header of every record; its ids and cgroup are left zero (see [`fill_identity`]).
#[inline(always)]
unsafe fn fill_header(header: *mut EventHeader, kind: u32, size: usize, pid_tgid: u64, mark: Mark) {
    // SAFETY: header points into a record.
    unsafe {
        (*header).kind = kind;
        (*header).size = size as u32;
        (*header).boot_ns = bpf_ktime_get_boot_ns();
        (*header).pid = (pid_tgid >> 32) as u32;
        (*header).tid = pid_tgid as u32;
        zero(addr_of_mut!((*header).uid));
        zero(addr_of_mut!((*header).gid));
        zero(addr_of_mut!((*header).cgroup_id));
        (*header).mark = mark;
    }
}

/// Stores a zero that LLVM cannot merge with its neighbours into a `memset` call: for BPF that
/// is a subprogram copying byte by byte, dearer than the stores.
#[inline(always)]
unsafe fn zero<T: Default>(place: *mut T) {
    // SAFETY: the caller's place is valid for writes.
    unsafe { write_volatile(place, T::default()) }
}

/// The user, group and cgroup of an exec record. The agent keeps them per process; other
/// records skip these helper calls, which would cost every open of a marked process ~60 ns.
#[inline(always)]
unsafe fn fill_identity(header: *mut EventHeader) {
    let uid_gid = bpf_get_current_uid_gid();
    // SAFETY: header points into a record.
    unsafe {
        (*header).uid = uid_gid as u32;
        (*header).gid = (uid_gid >> 32) as u32;
        (*header).cgroup_id = bpf_get_current_cgroup_id();
    }
}

/// What a `struct path` holds: the mount and the dentry (`path_mnt`, then `path_dentry`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Location {
    vfsmount: u64,
    dentry: u64,
}

/// The location in the kernel `struct path` at `path`: one read (the agent checks the layout).
#[inline(always)]
fn location(off: &KernelOffsets, path: u64) -> Res<Location> {
    // A NULL fs_struct or file plus a small member offset: nothing to read.
    if path < 0x1000 {
        return Err(-1);
    }
    let [vfsmount, dentry]: [u64; 2] = read(path, off.path_mnt)?;
    Ok(Location { vfsmount, dentry })
}

/// Writes the path of the kernel `struct path` at `path` into `out`, leaf first (see
/// [`ResolvedPath`]).
#[inline(always)]
unsafe fn resolve_path(off: &KernelOffsets, path: u64, out: *mut ResolvedPath) {
    // SAFETY: out points into a record.
    unsafe {
        resolve_at(
            off,
            path,
            addr_of_mut!((*out).data) as *mut u8,
            addr_of_mut!((*out).len),
            addr_of_mut!((*out).flags),
        )
    }
}

/// [`resolve_into`] from the kernel `struct path` at `path`.
#[inline(always)]
unsafe fn resolve_at(off: &KernelOffsets, path: u64, data: *mut u8, len: *mut u32, flags: *mut u32) {
    // SAFETY: the pointers point into a record with that much room.
    unsafe {
        match location(off, path) {
            Ok(at) => resolve_into(off, &at, data, len, flags),
            Err(_) => {
                write_volatile(len, 0);
                write_volatile(flags, path_flag::UNRESOLVED);
            }
        }
    }
}

/// Writes the path of `at` into `data` (room for [`MAX_RESOLVED_PATH`] bytes), leaf first,
/// walking dentries up to each mount's root and crossing to the parent mount, up to the root of
/// the mount tree; its length into `len` and its [`path_flag`] bits into `flags`.
#[inline(never)]
unsafe fn resolve_into(off: &KernelOffsets, at: &Location, data: *mut u8, len: *mut u32, flags: *mut u32) {
    // SAFETY: the pointers point into a record with that much room.
    unsafe {
        write_volatile(len, 0);
        let result = match walk(off, *at, data, len) {
            Ok(result) => result,
            Err(_) => {
                write_volatile(len, 0);
                path_flag::UNRESOLVED
            }
        };
        write_volatile(flags, result);
    }
}

/// A mount's parent, the dentry it is mounted on, and its root dentry: `struct mount` has
/// `mnt_parent`, `mnt_mountpoint`, then the embedded `vfsmount` whose first member is
/// `mnt_root` (the agent checks): one read.
#[inline(always)]
fn mount_links(off: &KernelOffsets, mount: u64) -> Res<[u64; 3]> {
    read(mount, off.mount_mnt_parent)
}

/// The length so far lives in the record (`len_slot`), not in a register: read back from
/// memory it is an unknown scalar, so the verifier sees every iteration alike and prunes,
/// instead of following each possible length separately.
#[inline(always)]
unsafe fn walk(off: &KernelOffsets, at: Location, data: *mut u8, len_slot: *mut u32) -> Res<u32> {
    let mut dentry = at.dentry;
    if dentry == 0 || at.vfsmount == 0 {
        return Err(-1);
    }
    // struct mount embeds struct vfsmount: container_of.
    let mut mount = at.vfsmount - off.mount_mnt as u64;
    let [mut parent_mount, mut mountpoint, mut mount_root] = mount_links(off, mount)?;
    for _ in 0..MAX_PATH_COMPONENTS {
        if dentry == mount_root {
            if parent_mount == mount || parent_mount == 0 {
                return Ok(0);
            }
            dentry = mountpoint;
            mount = parent_mount;
            [parent_mount, mountpoint, mount_root] = mount_links(off, mount)?;
            continue;
        }
        // d_parent; d_name: hash and len (one u64), name; d_inode; the first words of the inline
        // name (the agent checks this layout).
        let link: [u64; DENTRY_WINDOW] = read(dentry, off.dentry_d_parent)?;
        let (parent, name_len, name) = (link[0], (link[1] >> 32) as usize, link[2]);
        if parent == dentry || parent == 0 {
            return Ok(0);
        }
        // SAFETY: len_slot points into the record.
        let len = unsafe { read_volatile(len_slot) } as usize;
        if len > MAX_RESOLVED_PATH - NAME_SPACE {
            return Ok(path_flag::TRUNCATED);
        }
        if name_len == 0 || name_len >= NAME_SPACE {
            return Err(-1);
        }
        // One test on a value derived from both conditions: a branch on `name_len` itself would
        // give the verifier two ranges of it to follow through the rest of the walk.
        let inline =
            (name ^ (dentry + off.dentry_d_shortname as u64)) | (name_len as u64 >> INLINE_NAME.trailing_zeros());
        if inline == 0 {
            // A short name lives in the dentry, and the read above has it: stored as words,
            // without a helper call. Bytes past its length are overwritten by the separator and
            // the next component, or lie past the end of the record.
            // SAFETY: len <= MAX_RESOLVED_PATH - NAME_SPACE and INLINE_NAME < NAME_SPACE.
            unsafe {
                let to = data.add(len) as *mut u64;
                to.write_unaligned(link[4]);
                to.add(1).write_unaligned(link[5]);
                to.add(2).write_unaligned(link[6]);
                to.add(3).write_unaligned(link[7]);
            }
        } else {
            // A plain copy of the length the dentry gives, rather than a string read byte by
            // byte.
            // SAFETY: len <= MAX_RESOLVED_PATH - NAME_SPACE and name_len < NAME_SPACE, so the
            // name and its separator fit.
            let copied = unsafe {
                bpf_probe_read_kernel(
                    data.add(len) as *mut c_void,
                    (name_len & (NAME_SPACE - 1)) as u32,
                    name as *const c_void,
                )
            };
            if copied != 0 {
                return Err(-1);
            }
        }
        let end = len + (name_len & (NAME_SPACE - 1));
        // SAFETY: end < MAX_RESOLVED_PATH; len_slot as above.
        unsafe {
            *data.add(end) = b'/';
            write_volatile(len_slot, (end + 1) as u32);
        }
        dentry = parent;
    }
    Ok(path_flag::TRUNCATED)
}

/// A field of a syscall tracepoint's record, at a constant offset: tracepoint programs may
/// load from their record directly, which is cheaper than a probe-read helper call.
#[inline(always)]
fn field<T: Copy>(ctx: &TracePointContext, offset: usize) -> T {
    // SAFETY: callers pass the offsets of the syscall tracepoint format (TP_*), inside the
    // record and aligned for T.
    unsafe { (ctx.as_ptr().add(offset) as *const T).read() }
}

/// Arguments 0 and 1 of a syscall tracepoint record, loaded up front: picking one per syscall
/// afterwards keeps each load at a constant offset from the context, which the verifier
/// requires (LLVM would otherwise select a pointer per branch and load through it). Every
/// hooked syscall has at least two arguments, and the kernel refuses to attach a program that
/// loads past a tracepoint's record, so later arguments go through [`later_arg`].
#[inline(always)]
fn first_args(ctx: &TracePointContext) -> [u64; 2] {
    [field::<u64>(ctx, TP_ARG0), field::<u64>(ctx, TP_ARG1)]
}

/// An argument after the first two, read with a helper (see [`first_args`]).
#[inline(always)]
fn later_arg(ctx: &TracePointContext, offset: usize) -> Res<u64> {
    // SAFETY: the helper checks the address; the offset is inside this syscall's record.
    unsafe { ctx.read_at::<u64>(offset) }.map_err(|e| e as i64)
}

/// Passes `value` through memory so that the verifier forgets which constant it was (see
/// [`walk`]); callers bound it again before use.
#[inline(always)]
fn launder(slot: &mut u64, value: u64) -> u64 {
    // SAFETY: slot is a valid, exclusive reference.
    unsafe {
        write_volatile(slot, value);
        read_volatile(slot)
    }
}

// ---------------------------------------------------------------------------------------------
// exec

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn sched_process_exec(ctx: RawTracePointContext) -> i32 {
    match try_sched_process_exec(&ctx) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

fn try_sched_process_exec(ctx: &RawTracePointContext) -> Res<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let mark = current_mark(tgid);
    let Some(config) = config() else { return Ok(()) };
    if tgid == config.agent_tgid {
        return Ok(());
    }
    let off = &config.offsets;
    let bprm: u64 = ctx.arg(2);
    let mark = match mark {
        Some(mark) => mark,
        None if config.flags & config_flag::AUTO_ROOTS != 0 => match manager_root(off, bprm)? {
            Some(manager) => {
                let mark = Mark { root_pid: tgid, depth: 0, manager, flags: 0 };
                if MARKS.insert(&tgid, &mark, 0).is_err() {
                    count_lost(lost_index::MARKS_FULL);
                    return Ok(());
                }
                mark
            }
            None => return Ok(()),
        },
        None => return Ok(()),
    };
    let mark = actor_chain(off, tgid, mark);
    let scratch = EXEC_SCRATCH.get_ptr_mut(0).ok_or(-1i64)?;
    // SAFETY: per-CPU scratch owned by this program run. The header goes first (its size is set
    // last), so that the mark is not held across the path walks (see report_open).
    unsafe {
        fill_header(addr_of_mut!((*scratch).event.header), kind::EXEC, 0, pid_tgid, mark);
        fill_identity(addr_of_mut!((*scratch).event.header));
        let size = fill_exec(config, bprm, scratch)?;
        (*scratch).event.header.size = size as u32;
        output(core::slice::from_raw_parts(scratch as *const u8, size), false);
    }
    Ok(())
}

/// The (dev, ino) of the current process's executable.
#[inline(always)]
fn exe_key(off: &KernelOffsets) -> Res<InodeKey> {
    let task = unsafe { bpf_get_current_task() };
    let mm: u64 = read(task, off.task_struct_mm)?;
    let exe: u64 = read(mm, off.mm_struct_exe_file)?;
    file_key(off, exe)
}

/// Sets or clears [`mark_flag::ACTOR_CHAIN`] after an exec: the new program is a
/// `VIA_MANAGER` actor and the parent was the manager root or in the chain.
#[inline(never)]
fn actor_chain(off: &KernelOffsets, tgid: u32, mark: Mark) -> Mark {
    let in_chain = mark.flags & mark_flag::PARENT_IN_CHAIN != 0
        && exe_key(off)
            .ok()
            // SAFETY: copied out at once.
            .and_then(|key| unsafe { SPARED_EXES.get(&key).copied() })
            .is_some_and(|spared| spared.flags & spare_flag::VIA_MANAGER != 0);
    let flags = if in_chain { mark.flags | mark_flag::ACTOR_CHAIN } else { mark.flags & !mark_flag::ACTOR_CHAIN };
    if flags == mark.flags {
        return mark;
    }
    let mark = Mark { flags, ..mark };
    // An update of an existing key cannot fail for want of room.
    let _ = MARKS.insert(&tgid, &mark, 0);
    mark
}

/// Whether `--enforce` spares the current process: the agent itself (marked when started
/// inside a package tree, e.g. by `cargo run`), a manager root, or an executable that a `kill`
/// rule's actor names (see [`SparedExe`]).
#[inline(never)]
fn spared(config: &Config, mark: Mark) -> bool {
    if (bpf_get_current_pid_tgid() >> 32) as u32 == config.agent_tgid {
        return true;
    }
    let manager_bit = if mark.manager < 32 { 1u32 << mark.manager } else { 0 };
    if mark.depth == 0 && mark.manager != NO_MANAGER && config.spare_root_managers & manager_bit != 0 {
        return true;
    }
    let Ok(key) = exe_key(&config.offsets) else { return false };
    // SAFETY: copied out at once.
    let Some(exe) = (unsafe { SPARED_EXES.get(&key).copied() }) else { return false };
    let manager_ok = exe.managers == u32::MAX || exe.managers & manager_bit != 0;
    manager_ok
        && (exe.flags & spare_flag::ANYWHERE != 0
            || (exe.flags & spare_flag::VIA_MANAGER != 0 && mark.flags & mark_flag::ACTOR_CHAIN != 0))
}

/// Where the basename of the `len`-byte path in `name` starts: after its last '/', scanning back
/// at most `MAX + 1` bytes (None: the basename is longer than `MAX`). One path through the loop
/// per iteration keeps the verifier's work linear.
#[inline(always)]
fn basename_start<const MAX: usize>(name: &[u8; SCRATCH_NAME + MANAGER_NAME_LEN], len: usize) -> Option<usize> {
    for i in 1..=MAX + 1 {
        if i > len {
            return Some(0);
        }
        if name[(len - i) & (SCRATCH_NAME - 1)] == b'/' {
            return Some(len - i + 1);
        }
    }
    None
}

/// Index of the manager whose exec this is, per `MANAGERS` and `MANAGER_MODULES`.
#[inline(never)]
fn manager_root(off: &KernelOffsets, bprm: u64) -> Res<Option<u32>> {
    let scratch = SCRATCH.get_ptr_mut(0).ok_or(-1i64)?;
    // SAFETY: per-CPU scratch owned by this program run.
    let scratch = unsafe { &mut *scratch };
    let filename: u64 = read(bprm, off.linux_binprm_filename)?;
    // SAFETY: the destination is MAX_GIVEN_PATH bytes of the scratch buffer.
    let n = unsafe {
        bpf_probe_read_kernel_str(
            scratch.name.as_mut_ptr() as *mut c_void,
            MAX_GIVEN_PATH as u32,
            filename as *const c_void,
        )
    };
    if n <= 1 {
        return Ok(None);
    }
    let len = (n as usize - 1) & (SCRATCH_NAME - 1);
    // A longer basename than a key is no manager's.
    let Some(start) = basename_start::<MANAGER_NAME_LEN>(&scratch.name, len) else { return Ok(None) };
    let start = launder(&mut scratch.slot, start as u64) as usize & (SCRATCH_NAME - 1);
    if start >= len || len - start > MANAGER_NAME_LEN {
        return Ok(None);
    }
    // Keys are built in the scratch map, not on the stack: the verifier tracks stack bytes one
    // by one (zero or not) and would follow every combination separately.
    for j in 0..MANAGER_NAME_LEN {
        let byte = if start + j < len { scratch.name[(start + j) & (SCRATCH_NAME - 1)] } else { 0 };
        scratch.name_key[j] = byte;
    }
    // SAFETY: copied out at once.
    let Some(value) = (unsafe { MANAGERS.get(&scratch.name_key).copied() }) else { return Ok(None) };
    if value.flags & (manager_flag::NEEDS_MODULE | manager_flag::NEEDS_SCRIPT) == 0 {
        return Ok(Some(value.manager));
    }
    interpreter_root(off, scratch, value.flags)
}

/// For an interpreter: the manager whose argv words after argv[0] (`-m pip`) start this argv
/// (`NEEDS_MODULE`), or whose script it runs (`NEEDS_SCRIPT`).
#[inline(always)]
fn interpreter_root(off: &KernelOffsets, scratch: &mut Scratch, flags: u32) -> Res<Option<u32>> {
    let task = unsafe { bpf_get_current_task() };
    let mm: u64 = read(task, off.task_struct_mm)?;
    let arg_start: u64 = read(mm, off.mm_struct_arg_start)?;
    let arg_end: u64 = read(mm, off.mm_struct_arg_end)?;
    let argv_len = arg_end.saturating_sub(arg_start) as usize;
    let mut len = argv_len;
    if len > MODULE_SCAN {
        len = MODULE_SCAN;
    }
    // Whatever lies past argv reads as zeros. Volatile, so that it stays a loop of stores and
    // does not become a call to memset.
    for i in 0..(MODULE_SCAN + MODULE_KEY_LEN) / 8 {
        // SAFETY: in bounds of args (MODULE_SCAN + MODULE_KEY_LEN <= its size), 8-byte chunks.
        unsafe { write_volatile(scratch.args.as_mut_ptr().add(i * 8) as *mut [u8; 8], [0; 8]) };
    }
    // SAFETY: len <= MODULE_SCAN <= SCRATCH_ARGS.
    if unsafe { bpf_probe_read_user(scratch.args.as_mut_ptr() as *mut c_void, len as u32, arg_start as *const c_void) }
        != 0
    {
        return Ok(None);
    }
    // argv[0] ends at its NUL; the string read says where without a loop over the bytes.
    // SAFETY: the destination is the first MODULE_SCAN bytes of the name buffer, free by now.
    let n = unsafe {
        bpf_probe_read_user_str(
            scratch.name.as_mut_ptr() as *mut c_void,
            MODULE_SCAN as u32,
            arg_start as *const c_void,
        )
    };
    let first = if n > 0 && n as usize <= len { n as usize } else { MODULE_SCAN };
    let first = launder(&mut scratch.slot, first as u64) as usize & (SCRATCH_ARGS - 1);
    // Try the key after each word: `-m\0`, `-m\0pip\0`, ...
    for j in 0..MODULE_KEY_LEN / 8 {
        // SAFETY: in bounds of module_key, 8-byte chunks; volatile as above.
        unsafe { write_volatile(scratch.module_key.as_mut_ptr().add(j * 8) as *mut [u8; 8], [0; 8]) };
    }
    if flags & manager_flag::NEEDS_MODULE != 0 {
        let mut previous = 1u8;
        for j in 0..MODULE_KEY_LEN {
            let byte = scratch.args[(first + j) & (SCRATCH_ARGS - 1)];
            scratch.module_key[j] = byte;
            if byte == 0 {
                if previous == 0 {
                    break;
                }
                // SAFETY: copied out at once.
                if let Some(manager) = unsafe { MANAGER_MODULES.get(&scratch.module_key).copied() } {
                    return Ok(Some(manager));
                }
            }
            previous = byte;
        }
    }
    if flags & manager_flag::NEEDS_SCRIPT == 0 {
        return Ok(None);
    }
    script_root(scratch, arg_start, argv_len, first)
}

/// The manager whose script stem is that of the first argv word after argv[0] (it starts at
/// `first`, argv is `len` bytes from `arg_start`) that does not start with `-`: its basename
/// up to the first `-` or `.` (see `MANAGER_SCRIPTS`). Each word is read with one string read
/// rather than scanned byte by byte: the verifier follows a byte loop per byte.
#[inline(never)]
fn script_root(scratch: &mut Scratch, arg_start: u64, len: usize, first: usize) -> Res<Option<u32>> {
    let mut offset = first;
    let mut word_len = 0usize;
    for _ in 0..SCRIPT_WORDS {
        // Only an address in user memory: no bound needed but argv's length.
        let at = launder(&mut scratch.slot, offset as u64) as usize;
        if at >= len {
            return Ok(None);
        }
        // SAFETY: the destination is MAX_GIVEN_PATH bytes of the name buffer.
        let n = unsafe {
            bpf_probe_read_user_str(
                scratch.name.as_mut_ptr() as *mut c_void,
                MAX_GIVEN_PATH as u32,
                (arg_start + at as u64) as *const c_void,
            )
        };
        // An empty word, or one too long to hold its basename, ends the search.
        if n <= 1 || n as usize >= MAX_GIVEN_PATH {
            return Ok(None);
        }
        if scratch.name[0] != b'-' {
            word_len = n as usize - 1;
            break;
        }
        offset = at + n as usize;
    }
    if word_len == 0 {
        return Ok(None);
    }
    let len = launder(&mut scratch.slot, word_len as u64) as usize & (SCRATCH_NAME - 1);
    // Only as far back as a script's basename that is looked up can reach.
    let Some(start) = basename_start::<SCRIPT_BASE_MAX>(&scratch.name, len) else { return Ok(None) };
    let start = launder(&mut scratch.slot, start as u64) as usize & (SCRATCH_NAME - 1);
    // The stem, NUL-padded (the word's NUL ends it too); one longer than a key is no manager's.
    let mut ended = false;
    for k in 0..MANAGER_NAME_LEN {
        let byte = scratch.name[(start + k) & (SCRATCH_NAME - 1)];
        if byte == 0 || byte == b'-' || byte == b'.' {
            ended = true;
        }
        scratch.name_key[k] = if ended { 0 } else { byte };
    }
    let next = scratch.name[(start + MANAGER_NAME_LEN) & (SCRATCH_NAME - 1)];
    if !ended && next != 0 && next != b'-' && next != b'.' {
        return Ok(None);
    }
    // SAFETY: copied out at once.
    let Some(manager) = (unsafe { MANAGER_SCRIPTS.get(&scratch.name_key).copied() }) else { return Ok(None) };
    Ok(Some(manager))
}

/// `value` laundered (see [`launder`]) and checked against `max`, for the verifier: offsets
/// into a record stay provably inside it.
#[inline(always)]
fn bounded(slot: &mut u64, value: usize, max: usize) -> Res<usize> {
    let value = launder(slot, value as u64) as usize;
    if value > max {
        return Err(-1);
    }
    Ok(value)
}

/// Fills the exec record in `scratch` (see [`ExecEvent`]), each part right after the one
/// before, and returns its size.
#[inline(always)]
unsafe fn fill_exec(config: &Config, bprm: u64, scratch: *mut ExecScratch) -> Res<usize> {
    let off = &config.offsets;
    let task = unsafe { bpf_get_current_task() };
    // SAFETY: scratch is this run's; every write into `tail` is at an offset bounded so that the
    // part fits (filename < MAX_GIVEN_PATH, then MAX_ARGS, MAX_ENV, 2 x MAX_RESOLVED_PATH,
    // 2 x MAX_CGROUP_PATH); kernel and user memory are read through probe helpers only.
    unsafe {
        let event = addr_of_mut!((*scratch).event);
        let tail = addr_of_mut!((*scratch).tail) as *mut u8;
        let slot = &mut (*scratch).slot;
        let parent: u64 = read(task, off.task_struct_real_parent).unwrap_or(0);
        (*event).ppid = read(parent, off.task_struct_tgid).unwrap_or(0);

        let filename: u64 = read(bprm, off.linux_binprm_filename).unwrap_or(0);
        let n = bpf_probe_read_kernel_str(tail as *mut c_void, MAX_GIVEN_PATH as u32, filename as *const c_void);
        let mut at = if n > 0 { (n - 1) as usize & (MAX_GIVEN_PATH - 1) } else { 0 };
        (*event).filename_len = at as u32;
        (*event).args_len = 0;
        (*event).env_len = 0;
        (*event).executable_len = 0;
        (*event).executable_flags = path_flag::UNRESOLVED;
        let mm: u64 = read(task, off.task_struct_mm).unwrap_or(0);
        if mm != 0 {
            let start: u64 = read(mm, off.mm_struct_arg_start).unwrap_or(0);
            let end: u64 = read(mm, off.mm_struct_arg_end).unwrap_or(0);
            let mut len = end.saturating_sub(start);
            if len > MAX_ARGS as u64 {
                len = MAX_ARGS as u64;
            }
            if bpf_probe_read_user(tail.add(at) as *mut c_void, len as u32, start as *const c_void) == 0 {
                (*event).args_len = len as u32;
            }
            at = bounded(slot, at + (*event).args_len as usize, MAX_GIVEN_PATH + MAX_ARGS)?;
            let start: u64 = read(mm, off.mm_struct_env_start).unwrap_or(0);
            let end: u64 = read(mm, off.mm_struct_env_end).unwrap_or(0);
            let mut len = end.saturating_sub(start);
            if len > MAX_ENV as u64 {
                len = MAX_ENV as u64;
            }
            if bpf_probe_read_user(tail.add(at) as *mut c_void, len as u32, start as *const c_void) == 0 {
                (*event).env_len = len as u32;
            }
            at = bounded(slot, at + (*event).env_len as usize, MAX_GIVEN_PATH + MAX_ARGS + MAX_ENV)?;
            let exe: u64 = read(mm, off.mm_struct_exe_file).unwrap_or(0);
            if exe != 0 {
                resolve_at(
                    off,
                    exe + off.file_f_path as u64,
                    tail.add(at),
                    addr_of_mut!((*event).executable_len),
                    addr_of_mut!((*event).executable_flags),
                );
            }
            at = bounded(
                slot,
                at + read_volatile(addr_of_mut!((*event).executable_len)) as usize,
                MAX_GIVEN_PATH + MAX_ARGS + MAX_ENV + MAX_RESOLVED_PATH,
            )?;
        }
        // The same bound whether or not there was an mm, so that the verifier checks the cwd
        // walk once, not once per way of getting here.
        let at = bounded(slot, at, MAX_GIVEN_PATH + MAX_ARGS + MAX_ENV + MAX_RESOLVED_PATH)?;
        let cwd_len = addr_of_mut!((*event).cwd_len);
        let cwd_flags = addr_of_mut!((*event).cwd_flags);
        let fs: u64 = read(task, off.task_struct_fs).unwrap_or(0);
        resolve_at(off, fs + off.fs_struct_pwd as u64, tail.add(at), cwd_len, cwd_flags);
        let paths = MAX_GIVEN_PATH + MAX_ARGS + MAX_ENV + 2 * MAX_RESOLVED_PATH;
        let at = bounded(slot, at + read_volatile(cwd_len) as usize, paths)?;
        let css_set: u64 = read(task, off.task_struct_cgroups).unwrap_or(0);
        let (v1_len, v1_flags) = (addr_of_mut!((*event).cgroup_v1_len), addr_of_mut!((*event).cgroup_v1_flags));
        let subsys = config.cgroup_subsys;
        let v1 = if subsys != NO_CGROUP_SUBSYS { cgroup_node(off, css_set, subsys) } else { 0 };
        cgroup_path(off, v1, tail.add(at), v1_len, v1_flags);
        let at = bounded(slot, at + read_volatile(v1_len) as usize, paths + MAX_CGROUP_PATH)?;
        let (v2_len, v2_flags) = (addr_of_mut!((*event).cgroup_v2_len), addr_of_mut!((*event).cgroup_v2_flags));
        let v2 = if config.cgroup_v2 != 0 { cgroup_node(off, css_set, NO_CGROUP_SUBSYS) } else { 0 };
        cgroup_path(off, v2, tail.add(at), v2_len, v2_flags);
        bounded(slot, size_of::<ExecEvent>() + at + read_volatile(v2_len) as usize, MAX_EXEC_RECORD)
    }
}

/// The kernfs node of a process's cgroup (0: none to read), from its `css_set`: in the v1
/// hierarchy of controller `subsys` (its state's cgroup), or with [`NO_CGROUP_SUBSYS`] in the
/// unified hierarchy (`dfl_cgrp`).
#[inline(always)]
fn cgroup_node(off: &KernelOffsets, css_set: u64, subsys: u32) -> u64 {
    if css_set == 0 {
        return 0;
    }
    let cgroup: Res<u64> = if subsys == NO_CGROUP_SUBSYS {
        read(css_set, off.css_set_dfl_cgrp)
    } else if subsys < MAX_CGROUP_SUBSYS {
        read::<u64>(css_set, off.css_set_subsys + 8 * subsys).and_then(|css| read(css, off.cgroup_subsys_state_cgroup))
    } else {
        Err(-1)
    };
    match cgroup {
        Ok(cgroup) if cgroup != 0 => read(cgroup, off.cgroup_kn).unwrap_or(0),
        _ => 0,
    }
}

/// Writes the path of the cgroup whose kernfs node is `node` into `data` (room for
/// [`MAX_CGROUP_PATH`] bytes), leaf first like a [`ResolvedPath`] (the root is the empty path);
/// its length into `len` and its [`path_flag`] bits into `flags` (`UNRESOLVED` for no node).
#[inline(never)]
unsafe fn cgroup_path(off: &KernelOffsets, node: u64, data: *mut u8, len: *mut u32, flags: *mut u32) {
    // SAFETY: the pointers point into a record with that much room.
    unsafe {
        write_volatile(len, 0);
        let result = match walk_cgroup(off, node, data, len) {
            Ok(result) => result,
            Err(_) => {
                write_volatile(len, 0);
                path_flag::UNRESOLVED
            }
        };
        write_volatile(flags, result);
    }
}

/// Walks kernfs nodes from `node` up to the hierarchy's root (the node without a parent, whose
/// name is not part of the path). The length lives in the record, as in [`walk`].
#[inline(always)]
unsafe fn walk_cgroup(off: &KernelOffsets, mut node: u64, data: *mut u8, len_slot: *mut u32) -> Res<u32> {
    if node == 0 {
        return Err(-1);
    }
    for _ in 0..MAX_CGROUP_DEPTH {
        // parent, then name (the agent checks the layout): one read.
        let [parent, name]: [u64; 2] = read(node, off.kernfs_node_parent)?;
        if parent == 0 {
            return Ok(0);
        }
        // SAFETY: len_slot points into the record.
        let len = unsafe { read_volatile(len_slot) } as usize;
        if len > MAX_CGROUP_PATH - MAX_CGROUP_NAME {
            return Ok(path_flag::TRUNCATED);
        }
        // Names carry no length: a string read, at most MAX_CGROUP_NAME bytes with its NUL.
        // SAFETY: len <= MAX_CGROUP_PATH - MAX_CGROUP_NAME, so the name fits.
        let n = unsafe {
            bpf_probe_read_kernel_str(data.add(len) as *mut c_void, MAX_CGROUP_NAME as u32, name as *const c_void)
        };
        // Only the root has an empty name.
        if n <= 1 {
            return Err(-1);
        }
        let end = len + ((n as usize - 1) & (MAX_CGROUP_NAME - 1));
        // SAFETY: end < MAX_CGROUP_PATH; len_slot as above.
        unsafe {
            *data.add(end) = b'/';
            write_volatile(len_slot, (end + 1) as u32);
        }
        node = parent;
    }
    // As deep as the walk goes: complete only if this is the root.
    let parent: u64 = read(node, off.kernfs_node_parent)?;
    Ok(if parent == 0 { 0 } else { path_flag::TRUNCATED })
}

// ---------------------------------------------------------------------------------------------
// fork and exit

#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn sched_process_fork(ctx: RawTracePointContext) -> i32 {
    match try_sched_process_fork(&ctx) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

fn try_sched_process_fork(ctx: &RawTracePointContext) -> Res<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let Some(mark) = current_mark(tgid) else { return Ok(()) };
    let Some(config) = config() else { return Ok(()) };
    let child: u64 = ctx.arg(1);
    let child_tgid: u32 = read(child, config.offsets.task_struct_tgid)?;
    if child_tgid == tgid {
        // A new thread, not a new process.
        return Ok(());
    }
    let manager_root = mark.depth == 0 && mark.manager != NO_MANAGER;
    let parent_in_chain =
        if manager_root || mark.flags & mark_flag::ACTOR_CHAIN != 0 { mark_flag::PARENT_IN_CHAIN } else { 0 };
    let flags = (mark.flags & !mark_flag::PARENT_IN_CHAIN) | parent_in_chain;
    let child_mark = Mark { root_pid: mark.root_pid, depth: mark.depth + 1, manager: mark.manager, flags };
    if MARKS.insert(&child_tgid, &child_mark, 0).is_err() {
        count_lost(lost_index::MARKS_FULL);
    }
    let Some(mut entry) = reserve::<ForkEvent>(false) else { return Ok(()) };
    let event = entry.as_mut_ptr();
    // SAFETY: event points to a reserved record of the right size.
    unsafe {
        fill_header(addr_of_mut!((*event).header), kind::FORK, size_of::<ForkEvent>(), pid_tgid, mark);
        (*event).child_pid = child_tgid;
        (*event).child_depth = child_mark.depth;
    }
    submit(entry, false);
    Ok(())
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(ctx: RawTracePointContext) -> i32 {
    match try_sched_process_exit(&ctx) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

fn try_sched_process_exit(ctx: &RawTracePointContext) -> Res<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let Some(mark) = current_mark(tgid) else { return Ok(()) };
    let Some(config) = config() else { return Ok(()) };
    let off = &config.offsets;
    let task: u64 = ctx.arg(0);
    // The process is gone when its last thread exits: the tracepoint says so since 6.16;
    // before, signal->live was already decremented by do_exit() when the tracepoint fires.
    let group_dead = if off.exit_has_group_dead != 0 {
        ctx.arg::<u64>(1) & 0xff != 0
    } else {
        let signal: u64 = read(task, off.task_struct_signal)?;
        read::<i32>(signal, off.signal_struct_live)? == 0
    };
    // Only the exit that removes the mark reports, so racing last threads report once.
    if !group_dead || MARKS.remove(&tgid).is_err() {
        return Ok(());
    }
    let exit_code: u32 = read(task, off.task_struct_exit_code)?;
    let Some(mut entry) = reserve::<ExitEvent>(false) else { return Ok(()) };
    let event = entry.as_mut_ptr();
    // SAFETY: event points to a reserved record of the right size.
    unsafe {
        fill_header(addr_of_mut!((*event).header), kind::EXIT, size_of::<ExitEvent>(), pid_tgid, mark);
        (*event).exit_code = exit_code;
        (*event)._pad = 0;
    }
    submit(entry, false);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// opens

/// Which syscall of `family` the tracepoint record `ctx` is about (per `SYSCALLS`).
#[inline(always)]
fn hooked_syscall(ctx: &TracePointContext, family: u32) -> Option<u32> {
    // SAFETY: offset of `__syscall_nr` in every syscall tracepoint record.
    let nr = field::<i32>(ctx, TP_SYSCALL_NR);
    // An array the verifier inlines the lookup of; family 0 is an unhooked number.
    let hooked = SYSCALLS.get(nr as u32).copied()?;
    (hooked.family == family).then_some(hooked.syscall)
}

/// `sys_enter_openat` and `sys_enter_openat2`, the opens nearly everything makes: their records
/// have four arguments, all loaded directly (see [`first_args`]).
#[tracepoint]
pub fn openat_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if current_mark((pid_tgid >> 32) as u32).is_none() {
        return 0;
    }
    let Some(syscall) = hooked_syscall(&ctx, syscall_family::OPEN) else { return 0 };
    let arg = [field::<u64>(&ctx, TP_ARG0), field(&ctx, TP_ARG1), field(&ctx, TP_ARG2), field(&ctx, TP_ARG3)];
    let (flags, mode) = if syscall == open_syscall::OPENAT2 {
        // openat2(dfd, filename, struct open_how *how, usize): how = {flags, mode, resolve}.
        // SAFETY: user memory through the probe helper.
        unsafe {
            (
                aya_ebpf::helpers::bpf_probe_read_user(arg[2] as *const u64).unwrap_or(0),
                aya_ebpf::helpers::bpf_probe_read_user((arg[2] + 8) as *const u64).unwrap_or(0),
            )
        }
    } else {
        (arg[2], arg[3])
    };
    let pending = PendingOpen { syscall, dirfd: arg[0] as i32, flags, mode, given_ptr: arg[1] };
    let _ = save_open(pid_tgid as u32, &pending);
    0
}

/// The other `sys_enter_*` of the open family (`open`, `creat`, `open_by_handle_at`).
#[tracepoint]
pub fn open_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if current_mark((pid_tgid >> 32) as u32).is_none() {
        return 0;
    }
    if let Some(syscall) = hooked_syscall(&ctx, syscall_family::OPEN) {
        if let Ok(pending) = legacy_open_args(&ctx, syscall) {
            let _ = save_open(pid_tgid as u32, &pending);
        }
    }
    0
}

#[inline(always)]
fn legacy_open_args(ctx: &TracePointContext, syscall: u32) -> Res<PendingOpen> {
    let arg = first_args(ctx);
    let (dirfd, given_ptr, flags, mode) = match syscall {
        open_syscall::OPEN => (AT_FDCWD, arg[0], arg[1], later_arg(ctx, TP_ARG2)?),
        // open_by_handle_at(mount_fd, struct file_handle *, flags): no path at all.
        open_syscall::OPEN_BY_HANDLE_AT => (arg[0] as i32, 0, later_arg(ctx, TP_ARG2)?, 0),
        _ => (AT_FDCWD, arg[0], CREAT_FLAGS, arg[1]),
    };
    Ok(PendingOpen { syscall, dirfd, flags, mode, given_ptr })
}

/// Keeps what an open's entry saw for its exit: in the thread's slot, or in `PENDING_OPENS`
/// when another thread holds the slot.
#[inline(always)]
fn save_open(tid: u32, pending: &PendingOpen) -> Res<()> {
    if let Some(slot) = OPEN_SLOTS.get_ptr_mut(tid & (OPEN_SLOT_COUNT - 1)) {
        // SAFETY: a map value. Two threads whose ids share a slot entering at the same instant
        // can both find it free; the one overwritten is then reported by its file at exit
        // (NO_ENTRY), like any open whose entry was missed.
        unsafe {
            if (*slot).tid == 0 || (*slot).tid == tid {
                (*slot).open = *pending;
                (*slot).tid = tid;
                return Ok(());
            }
        }
    }
    PENDING_OPENS.insert(&tid, pending, 0).map_err(|e| e as i64)
}

/// What the open's entry saved, from the thread's slot or else `PENDING_OPENS`; both are
/// freed.
#[inline(always)]
fn take_pending_open(tid: u32) -> Option<PendingOpen> {
    if let Some(slot) = OPEN_SLOTS.get_ptr_mut(tid & (OPEN_SLOT_COUNT - 1)) {
        // SAFETY: a map value; see save_open.
        unsafe {
            if (*slot).tid == tid {
                (*slot).tid = 0;
                return Some((*slot).open);
            }
        }
    }
    // SAFETY: copied out at once.
    let pending = unsafe { PENDING_OPENS.get(&tid).copied() }?;
    let _ = PENDING_OPENS.remove(&tid);
    Some(pending)
}

/// Every `sys_exit_*` of the open family.
#[tracepoint]
pub fn open_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    let pending = take_pending_open(pid_tgid as u32);
    let _ = report_open(&ctx, pid_tgid, mark, pending);
    0
}

#[inline(always)]
fn report_open(ctx: &TracePointContext, pid_tgid: u64, mark: Mark, pending: Option<PendingOpen>) -> Res<()> {
    let config = config().ok_or(-1i64)?;
    let off = &config.offsets;
    let ret = field::<i64>(ctx, TP_RET);
    // SAFETY: kernel reads through probe helpers only.
    let file = if ret >= 0 { unsafe { fd_file(off, ret as u64) }.unwrap_or(0) } else { 0 };
    // Without its entry, an open is still reported when it opened something: by its file.
    let (pending, no_entry) = match pending {
        Some(pending) => (pending, 0),
        None if file != 0 => {
            let syscall = hooked_syscall(ctx, syscall_family::OPEN).ok_or(-1i64)?;
            let flags: u32 = read(file, off.file_f_flags)?;
            let pending = PendingOpen { syscall, dirfd: AT_FDCWD, flags: flags as u64, mode: 0, given_ptr: 0 };
            (pending, record_flag::NO_ENTRY)
        }
        None => return Ok(()),
    };
    let scratch = OPEN_SCRATCH.get_ptr_mut(0).ok_or(-1i64)?;
    let event = unsafe { addr_of_mut!((*scratch).event) };
    let mut record_flags = no_entry;
    let mut at = Location { vfsmount: 0, dentry: 0 };
    // SAFETY: a local (see zero).
    unsafe {
        zero(addr_of_mut!(at.vfsmount));
        zero(addr_of_mut!(at.dentry));
    }
    // SAFETY: per-CPU scratch owned by this program run; kernel memory read through probe
    // helpers only. Everything known before the path walk goes into the record now and is read
    // back after it: values left in registers across the walk would make the verifier check it
    // once per combination of them.
    unsafe {
        (*event).syscall = pending.syscall;
        (*event).dirfd = pending.dirfd;
        (*event).flags = pending.flags;
        (*event).mode = pending.mode;
        (*event).ret = ret;
        zero(addr_of_mut!((*event).dev));
        zero(addr_of_mut!((*event).ino));
        zero(addr_of_mut!((*event).cred_index));
        zero(addr_of_mut!((*event)._pad));
        if let Ok(opened) = opened_file(off, file) {
            at = opened.at;
            if let Ok(key) = inode_key(off, opened.inode) {
                (*event).dev = key.dev;
                (*event).ino = key.ino;
                // SAFETY: copied out at once.
                if let Some(cred) = CRED_INODES.get(&key).copied() {
                    record_flags |= record_flag::CRED_INODE;
                    (*event).cred_index = cred.index;
                    // The tree's later connects are held for the agent's verdict.
                    if config.flags & config_flag::ENFORCE != 0 {
                        let _ = TAINTED.insert(&mark.root_pid, &1, 0);
                    }
                    // Killed before the syscall returns to user space: the fd exists, but the
                    // process never runs again to read it.
                    if config.flags & config_flag::ENFORCE != 0
                        && cred.flags & cred_flag::KILL != 0
                        && !spared(config, mark)
                        && kill_current()
                    {
                        record_flags |= record_flag::BLOCKED;
                    }
                }
            }
        }
        write_volatile(addr_of_mut!((*event).record_flags), record_flags);
    }
    // SAFETY: as above; user memory through probe helpers only; every write stays inside
    // `tail` (given <= MAX_GIVEN_PATH - 1 bytes, then at most MAX_RESOLVED_PATH).
    unsafe {
        let tail = addr_of_mut!((*scratch).tail) as *mut u8;
        // Read now rather than at entry: the syscall has faulted the string's page in. A
        // thread racing to rewrite it can change what is reported as given, not the resolved
        // path of what was opened.
        let n = bpf_probe_read_user_str(tail as *mut c_void, MAX_GIVEN_PATH as u32, pending.given_ptr as *const c_void);
        let given_len = if n > 0 { (n - 1) as usize & (MAX_GIVEN_PATH - 1) } else { 0 };
        write_volatile(addr_of_mut!((*event).given_len), given_len as u32);
        let path_len = addr_of_mut!((*event).path_len);
        let path_flags = addr_of_mut!((*event).path_flags);
        if at.dentry != 0 {
            resolve_into(off, &at, tail.add(given_len), path_len, path_flags);
        } else {
            write_volatile(path_len, 0);
            write_volatile(path_flags, path_flag::UNRESOLVED);
        }
        let given_len = read_volatile(addr_of_mut!((*event).given_len)) as usize;
        let size = size_of::<OpenEvent>() + given_len + read_volatile(path_len) as usize;
        let size = launder(&mut (*scratch).slot, size as u64) as usize;
        if size > MAX_OPEN_RECORD {
            return Err(-1);
        }
        fill_header(addr_of_mut!((*event).header), kind::OPEN, size, pid_tgid, mark);
        let record_flags = read_volatile(addr_of_mut!((*event).record_flags));
        let priority = record_flags & (record_flag::CRED_INODE | record_flag::BLOCKED) != 0;
        output(core::slice::from_raw_parts(scratch as *const u8, size), priority);
    }
    Ok(())
}

/// The `struct file` behind `fd` of the current task: task->files->fdt->fd[fd].
#[inline(always)]
unsafe fn fd_file(off: &KernelOffsets, fd: u64) -> Res<u64> {
    let task = unsafe { bpf_get_current_task() };
    let files: u64 = read(task, off.task_struct_files)?;
    let fdt: u64 = read(files, off.files_struct_fdt)?;
    // max_fds, then the fd array (the agent checks this layout): one read.
    let [max_fds, fd_array]: [u64; 2] = read(fdt, off.fdtable_max_fds)?;
    if fd >= max_fds & 0xffff_ffff {
        return Err(-1);
    }
    let file: u64 = read(fd_array + fd * 8, 0)?;
    if file == 0 {
        return Err(-1);
    }
    Ok(file)
}

/// An open file's inode and where it is.
struct OpenedFile {
    inode: u64,
    at: Location,
}

/// `f_inode` and `f_path` of the `struct file` at `file`: they lie within [`FILE_WINDOW`] words
/// of each other (the agent checks), so one read.
#[inline(always)]
fn opened_file(off: &KernelOffsets, file: u64) -> Res<OpenedFile> {
    if file == 0 {
        return Err(-1);
    }
    let start = off.file_f_inode.min(off.file_f_path);
    let words: [u64; FILE_WINDOW] = read(file, start)?;
    let path = (off.file_f_path - start) / 8;
    Ok(OpenedFile {
        inode: window_word(&words, (off.file_f_inode - start) / 8),
        at: Location { vfsmount: window_word(&words, path), dentry: window_word(&words, path + 1) },
    })
}

/// `words[index]`, by constant indexes that the verifier checks once each.
#[inline(always)]
fn window_word(words: &[u64; FILE_WINDOW], index: u32) -> u64 {
    match index {
        0 => words[0],
        1 => words[1],
        2 => words[2],
        3 => words[3],
        4 => words[4],
        _ => words[5],
    }
}

/// The (s_dev, i_ino) of an open file.
#[inline(always)]
fn file_key(off: &KernelOffsets, file: u64) -> Res<InodeKey> {
    inode_key(off, read(file, off.file_f_inode)?)
}

/// The (s_dev, i_ino) of the `struct inode` at `inode`.
#[inline(always)]
fn inode_key(off: &KernelOffsets, inode: u64) -> Res<InodeKey> {
    if inode == 0 {
        return Err(-1);
    }
    // i_sb and i_ino lie within four words of each other (the agent checks): one read.
    let words: [u64; 4] = read(inode, off.inode_i_sb)?;
    let ino = match (off.inode_i_ino - off.inode_i_sb) / 8 {
        1 => words[1],
        2 => words[2],
        _ => words[3],
    };
    Ok(InodeKey { dev: read::<u32>(words[0], off.super_block_s_dev)? as u64, ino })
}

// ---------------------------------------------------------------------------------------------
// renames and links

/// Every `sys_enter_*` of the rename family (renames, links, symlinks).
#[tracepoint]
pub fn rename_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if current_mark((pid_tgid >> 32) as u32).is_none() {
        return 0;
    }
    if let Some(syscall) = hooked_syscall(&ctx, syscall_family::RENAME) {
        let _ = save_rename(&ctx, syscall, pid_tgid as u32);
    }
    0
}

/// Saves both paths as given and, for a relative one, the directory it starts from, resolved
/// now: at exit a dirfd may be closed or the cwd changed by another thread.
#[inline(always)]
fn save_rename(ctx: &TracePointContext, syscall: u32, tid: u32) -> Res<()> {
    let config = config().ok_or(-1i64)?;
    let off = &config.offsets;
    let scratch = RENAME_SCRATCH.get_ptr_mut(0).ok_or(-1i64)?;
    let arg = first_args(ctx);
    let (old_dirfd, old, new_dirfd, new, flags) = match syscall {
        rename_syscall::RENAME | rename_syscall::LINK | rename_syscall::SYMLINK => {
            (AT_FDCWD, arg[0], AT_FDCWD, arg[1], 0)
        }
        // symlinkat(target, newdfd, linkpath)
        rename_syscall::SYMLINKAT => (AT_FDCWD, arg[0], arg[1] as i32, later_arg(ctx, TP_ARG2)?, 0),
        rename_syscall::RENAMEAT => {
            (arg[0] as i32, arg[1], later_arg(ctx, TP_ARG2)? as i32, later_arg(ctx, TP_ARG3)?, 0)
        }
        // renameat2 and linkat: (olddfd, oldname, newdfd, newname, flags)
        _ => (
            arg[0] as i32,
            arg[1],
            later_arg(ctx, TP_ARG2)? as i32,
            later_arg(ctx, TP_ARG3)?,
            later_arg(ctx, TP_ARG4)? as u32,
        ),
    };
    let symlink = syscall == rename_syscall::SYMLINK || syscall == rename_syscall::SYMLINKAT;
    // SAFETY: per-CPU scratch owned by this program run; user strings through probe helpers.
    unsafe {
        (*scratch).syscall = syscall;
        (*scratch).flags = flags;
        (*scratch).old_dirfd = old_dirfd;
        (*scratch).new_dirfd = new_dirfd;
        let n = bpf_probe_read_user_str(
            addr_of_mut!((*scratch).old) as *mut c_void,
            MAX_GIVEN_PATH as u32,
            old as *const c_void,
        );
        (*scratch).old_len = if n > 0 { (n - 1) as u32 } else { 0 };
        let n = bpf_probe_read_user_str(
            addr_of_mut!((*scratch).new) as *mut c_void,
            MAX_GIVEN_PATH as u32,
            new as *const c_void,
        );
        (*scratch).new_len = if n > 0 { (n - 1) as u32 } else { 0 };
        // A symlink's target text is not resolved against anything at creation.
        if symlink || (*scratch).old_len == 0 || (*scratch).old[0] == b'/' {
            unresolved(addr_of_mut!((*scratch).old_dir));
        } else {
            resolve_dir(off, old_dirfd, addr_of_mut!((*scratch).old_dir));
        }
        if (*scratch).new_len == 0 || (*scratch).new[0] == b'/' {
            unresolved(addr_of_mut!((*scratch).new_dir));
        } else {
            resolve_dir(off, new_dirfd, addr_of_mut!((*scratch).new_dir));
        }
        PENDING_RENAMES.insert(&tid, &*scratch, 0).map_err(|e| e as i64)
    }
}

#[inline(always)]
unsafe fn unresolved(out: *mut ResolvedPath) {
    // SAFETY: out points into a record.
    unsafe {
        (*out).len = 0;
        (*out).flags = path_flag::UNRESOLVED;
    }
}

/// The directory a relative path given with `dirfd` starts from: the dirfd's file, or the cwd.
#[inline(always)]
unsafe fn resolve_dir(off: &KernelOffsets, dirfd: i32, out: *mut ResolvedPath) {
    let path = if dirfd == AT_FDCWD {
        let task = unsafe { bpf_get_current_task() };
        read::<u64>(task, off.task_struct_fs).map(|fs| fs + off.fs_struct_pwd as u64)
    } else if dirfd >= 0 {
        // SAFETY: kernel reads through probe helpers only.
        unsafe { fd_file(off, dirfd as u64) }.map(|file| file + off.file_f_path as u64)
    } else {
        Err(-1)
    };
    // SAFETY: out points into a record.
    unsafe {
        match path {
            Ok(path) => resolve_path(off, path, out),
            Err(_) => unresolved(out),
        }
    }
}

/// Every `sys_exit_*` of the rename family.
#[tracepoint]
pub fn rename_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    let tid = pid_tgid as u32;
    let _ = report_rename(&ctx, pid_tgid, mark, tid);
    let _ = PENDING_RENAMES.remove(&tid);
    0
}

#[inline(always)]
fn report_rename(ctx: &TracePointContext, pid_tgid: u64, mark: Mark, tid: u32) -> Res<()> {
    let Some(pending) = PENDING_RENAMES.get_ptr(&tid) else { return Ok(()) };
    // SAFETY: offset of the result in the sys_exit record.
    let ret = field::<i64>(ctx, TP_RET);
    let Some(mut entry) = reserve::<RenameEvent>(false) else { return Ok(()) };
    let event = entry.as_mut_ptr();
    // SAFETY: event points to a reserved record of the right size; pending to a map value of
    // the same type.
    let copied = unsafe {
        bpf_probe_read_kernel(event as *mut c_void, size_of::<RenameEvent>() as u32, pending as *const c_void)
    };
    if copied != 0 {
        entry.discard(0);
        return Ok(());
    }
    // SAFETY: as above.
    unsafe {
        fill_header(addr_of_mut!((*event).header), kind::RENAME, size_of::<RenameEvent>(), pid_tgid, mark);
        (*event).ret = ret;
    }
    submit(entry, false);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// tamper and evasion syscalls

/// Every `sys_enter_*` of the tamper family.
#[tracepoint]
pub fn tamper_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    if let Some(syscall) = hooked_syscall(&ctx, syscall_family::TAMPER) {
        let _ = save_tamper(&ctx, syscall, pid_tgid, mark);
    }
    0
}

/// Decides whether the call is reported (signals: only those aimed at the agent), kills it
/// under `--enforce` when a `kill` rule names it (`Config::block_syscalls`), else keeps it for the exit to report with its
/// result.
#[inline(always)]
fn save_tamper(ctx: &TracePointContext, syscall: u32, pid_tgid: u64, mark: Mark) -> Res<()> {
    let config = config().ok_or(-1i64)?;
    let agent = config.agent_tgid;
    // SAFETY: offsets within the syscall tracepoint record (checked against its format).
    let arg = first_args(ctx);
    // (target pid, has a target, operation)
    let (target, has_target, operation) = match syscall {
        // ptrace(request, pid, addr, data)
        tamper_syscall::PTRACE => (arg[1] as u32, true, arg[0]),
        tamper_syscall::PROCESS_VM_READV | tamper_syscall::PROCESS_VM_WRITEV => (arg[0] as u32, true, 0),
        tamper_syscall::BPF => (0, false, arg[0]),
        // kill(pid, sig): the agent itself, or every process (-1).
        tamper_syscall::KILL => {
            let pid = arg[0] as i32;
            if pid == -1 {
                (0, false, arg[1])
            } else if pid as u32 == agent {
                (agent, true, arg[1])
            } else {
                return Ok(());
            }
        }
        // tkill(tid, sig): the agent's main thread (tid == tgid).
        tamper_syscall::TKILL => {
            if arg[0] as u32 != agent {
                return Ok(());
            }
            (agent, true, arg[1])
        }
        // tgkill(tgid, tid, sig)
        tamper_syscall::TGKILL => {
            if arg[0] as u32 != agent {
                return Ok(());
            }
            (agent, true, later_arg(ctx, TP_ARG2)?)
        }
        // pidfd_send_signal(pidfd, sig, info, flags)
        tamper_syscall::PIDFD_SEND_SIGNAL => {
            // SAFETY: kernel reads through probe helpers only.
            let pid = unsafe { pidfd_pid(&config.offsets, arg[0]) }?;
            if pid != agent {
                return Ok(());
            }
            (agent, true, arg[1])
        }
        // init_module, finit_module, io_uring_setup
        _ => (0, false, 0),
    };
    let mut record_flags = if has_target { record_flag::HAS_TARGET } else { 0 };
    let blockable = syscall < 32 && config.block_syscalls & (1 << syscall) != 0;
    if blockable && config.flags & config_flag::ENFORCE != 0 && !spared(config, mark) && kill_current() {
        record_flags |= record_flag::BLOCKED;
        emit_syscall(pid_tgid, mark, syscall, record_flags, target, operation, 0, true);
        return Ok(());
    }
    let pending = PendingSyscall { syscall, record_flags, target_pid: target, _pad: 0, operation };
    PENDING_SYSCALLS.insert(&(pid_tgid as u32), &pending, 0).map_err(|e| e as i64)
}

/// The pid (in the initial namespace) of a pidfd: file->private_data is its `struct pid`.
#[inline(always)]
unsafe fn pidfd_pid(off: &KernelOffsets, pidfd: u64) -> Res<u32> {
    // SAFETY: kernel reads through probe helpers only.
    let file = unsafe { fd_file(off, pidfd & 0xffff_ffff) }?;
    let pid: u64 = read(file, off.file_private_data)?;
    read(pid, off.pid_numbers + off.upid_nr)
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn emit_syscall(
    pid_tgid: u64,
    mark: Mark,
    syscall: u32,
    record_flags: u32,
    target_pid: u32,
    operation: u64,
    ret: i64,
    priority: bool,
) {
    let Some(mut entry) = reserve::<SyscallEvent>(priority) else { return };
    let event = entry.as_mut_ptr();
    // SAFETY: event points to a reserved record of the right size.
    unsafe {
        fill_header(addr_of_mut!((*event).header), kind::SYSCALL, size_of::<SyscallEvent>(), pid_tgid, mark);
        (*event).syscall = syscall;
        (*event).record_flags = record_flags;
        (*event).target_pid = target_pid;
        (*event)._pad = 0;
        (*event).operation = operation;
        (*event).ret = ret;
    }
    submit(entry, priority);
}

/// Every `sys_exit_*` of the tamper family.
#[tracepoint]
pub fn tamper_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    let tid = pid_tgid as u32;
    // SAFETY: copied out at once.
    let Some(pending) = (unsafe { PENDING_SYSCALLS.get(&tid).copied() }) else { return 0 };
    let _ = PENDING_SYSCALLS.remove(&tid);
    // SAFETY: offset of the result in the sys_exit record.
    let ret = field::<i64>(&ctx, TP_RET);
    emit_syscall(
        pid_tgid,
        mark,
        pending.syscall,
        pending.record_flags | record_flag::HAS_RET,
        pending.target_pid,
        pending.operation,
        ret,
        true,
    );
    0
}

/// io_uring requests never pass the syscall tracepoints (an `IORING_OP_OPENAT` opens a file
/// without `openat`): each request a marked process submits is reported with its opcode.
#[tracepoint(category = "io_uring", name = "io_uring_submit_req")]
pub fn io_uring_submit_req(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    let Some(config) = config() else { return 0 };
    // SAFETY: the offset comes from this tracepoint's format.
    let Ok(opcode) = (unsafe { ctx.read_at::<u8>(config.uring_opcode_offset as usize) }) else { return 0 };
    let priority = opcode == IORING_OP_OPENAT || opcode == IORING_OP_OPENAT2;
    emit_syscall(pid_tgid, mark, tamper_syscall::IO_URING_SUBMIT_REQ, 0, 0, opcode as u64, 0, priority);
    0
}

// ---------------------------------------------------------------------------------------------
// network egress

/// Every `sys_enter_*` of the net family (connect, sendto, sendmsg, sendmmsg).
#[tracepoint]
pub fn net_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    if let Some(syscall) = hooked_syscall(&ctx, syscall_family::NET) {
        let _ = try_net_enter(&ctx, syscall, pid_tgid, mark);
    }
    0
}

#[inline(always)]
fn try_net_enter(ctx: &TracePointContext, syscall: u32, pid_tgid: u64, mark: Mark) -> Res<()> {
    let arg = first_args(ctx);
    let fd = arg[0] as i32;
    match syscall {
        // connect(fd, addr, addrlen)
        net_syscall::CONNECT => report_connect(pid_tgid, mark, fd, arg[1], later_arg(ctx, TP_ARG2)?),
        // sendto(fd, buf, len, flags, addr, addrlen)
        net_syscall::SENDTO => {
            let len = later_arg(ctx, TP_ARG2)?;
            let addr = later_arg(ctx, TP_ARG4)?;
            let addr_len = later_arg(ctx, TP_ARG5)?;
            report_dns(pid_tgid, mark, syscall, fd, (arg[1], len), (addr, addr_len))
        }
        // sendmsg(fd, msghdr, flags), sendmmsg(fd, mmsghdr, vlen, flags): an mmsghdr starts with
        // its msghdr, and only the first message is looked at (glibc sends its A and AAAA
        // queries for one name together).
        _ => {
            // msg_name, msg_namelen, msg_iov, msg_iovlen
            let header: [u64; 4] = read_user(arg[1])?;
            if header[3] == 0 {
                return Ok(());
            }
            let [base, len]: [u64; 2] = read_user(header[2])?;
            report_dns(pid_tgid, mark, syscall, fd, (base, len), (header[0], header[1] & 0xffff_ffff))
        }
    }
}

#[inline(always)]
fn read_user<T>(at: u64) -> Res<T> {
    // SAFETY: bpf_probe_read_user checks the address; a bad pointer is an error, not a fault.
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(at as *const T).map_err(|e| e as i64) }
}

/// The family and port (host order) at the start of a socket address.
#[inline(always)]
fn family_port(head: [u8; 4]) -> (u16, u16) {
    (u16::from_ne_bytes([head[0], head[1]]), u16::from_be_bytes([head[2], head[3]]))
}

#[inline(always)]
fn report_connect(pid_tgid: u64, mark: Mark, fd: i32, addr: u64, addr_len: u64) -> Res<()> {
    let config = config().ok_or(-1i64)?;
    // Connects are rare next to opens, and the agent must see a held one at once.
    let Some(mut entry) = reserve::<ConnectEvent>(true) else { return Ok(()) };
    let event = entry.as_mut_ptr();
    let want = if addr == 0 { 0 } else { addr_len.min(MAX_SOCKADDR as u64) as u32 };
    // SAFETY: event points to a reserved record of the right size; user memory through probe
    // helpers only, at most MAX_SOCKADDR bytes into `addr`.
    let copied = unsafe {
        if want > 0
            && want <= MAX_SOCKADDR as u32
            && bpf_probe_read_user(addr_of_mut!((*event).addr) as *mut c_void, want, addr as *const c_void) == 0
        {
            want
        } else {
            0
        }
    };
    let (family, port) = if copied >= 4 {
        // SAFETY: as above; the first 4 bytes were copied.
        family_port(unsafe { [(*event).addr[0], (*event).addr[1], (*event).addr[2], (*event).addr[3]] })
    } else {
        (0, 0)
    };
    // SAFETY: kernel reads through probe helpers only.
    let sock_type = unsafe { socket_type(&config.offsets, fd) }.unwrap_or(0);
    let key = (pid_tgid & 0xffff_ffff_0000_0000) | (fd as u32 as u64);
    let inet = family == AF_INET || family == AF_INET6;
    let mut record_flags = 0;
    if inet && port == DNS_PORT {
        let mut socket = DnsSocket { addr_len: copied.min(DNS_SOCKADDR as u32), addr: [0; DNS_SOCKADDR] };
        // SAFETY: both buffers hold at least DNS_SOCKADDR bytes.
        unsafe {
            bpf_probe_read_kernel(
                socket.addr.as_mut_ptr() as *mut c_void,
                DNS_SOCKADDR as u32,
                addr_of_mut!((*event).addr) as *const c_void,
            );
        }
        let _ = DNS_SOCKETS.insert(&key, &socket, 0);
    } else {
        // The fd number may have been a DNS socket once (closes are not hooked).
        let _ = DNS_SOCKETS.remove(&key);
        if inet
            && mark.depth > 0
            && config.flags & config_flag::ENFORCE != 0
            // SAFETY: copied out at once.
            && unsafe { TAINTED.get(&mark.root_pid) }.is_some()
            && !spared(config, mark)
            // SAFETY: signals the current process; allowed from tracepoint programs.
            && unsafe { aya_ebpf::helpers::generated::bpf_send_signal(SIGSTOP) } == 0
        {
            record_flags = record_flag::HELD;
        }
    }
    // SAFETY: event points to a reserved record of the right size.
    unsafe {
        fill_header(addr_of_mut!((*event).header), kind::CONNECT, size_of::<ConnectEvent>(), pid_tgid, mark);
        (*event).syscall = net_syscall::CONNECT;
        (*event).fd = fd;
        (*event).record_flags = record_flags;
        (*event).addr_len = addr_len as u32;
        (*event).copied = copied;
        (*event).sock_type = sock_type;
    }
    submit(entry, true);
    Ok(())
}

/// The type of the socket behind `fd` (`file->private_data` is its `struct socket`).
#[inline(always)]
unsafe fn socket_type(off: &KernelOffsets, fd: i32) -> Res<u32> {
    if fd < 0 {
        return Err(-1);
    }
    // SAFETY: kernel reads through probe helpers only.
    let file = unsafe { fd_file(off, fd as u64) }?;
    let socket: u64 = read(file, off.file_private_data)?;
    if socket == 0 {
        return Err(-1);
    }
    Ok(read::<u16>(socket, off.socket_type)? as u32)
}

/// Reports a send as a DNS query when it goes to port 53: by the address given, or on a
/// socket connected there.
#[inline(always)]
fn report_dns(
    pid_tgid: u64,
    mark: Mark,
    syscall: u32,
    fd: i32,
    (buf, len): (u64, u64),
    (addr, addr_len): (u64, u64),
) -> Res<()> {
    let mut socket = DnsSocket { addr_len: 0, addr: [0; DNS_SOCKADDR] };
    let mut record_flags = 0;
    if addr != 0 && addr_len >= 4 {
        let (family, port) = family_port(read_user(addr)?);
        if !(family == AF_INET || family == AF_INET6) || port != DNS_PORT {
            return Ok(());
        }
        let want = addr_len.min(DNS_SOCKADDR as u64) as u32;
        // SAFETY: at most DNS_SOCKADDR bytes into the local buffer.
        if want <= DNS_SOCKADDR as u32
            && unsafe { bpf_probe_read_user(socket.addr.as_mut_ptr() as *mut c_void, want, addr as *const c_void) } == 0
        {
            socket.addr_len = want;
        }
    } else {
        let key = (pid_tgid & 0xffff_ffff_0000_0000) | (fd as u32 as u64);
        // SAFETY: copied out at once.
        socket = unsafe { DNS_SOCKETS.get(&key).copied() }.ok_or(-1i64)?;
        record_flags = record_flag::DNS_SOCKET;
    }
    let Some(mut entry) = reserve::<DnsQueryEvent>(false) else { return Ok(()) };
    let event = entry.as_mut_ptr();
    let want = len.min(MAX_DNS_PAYLOAD as u64) as u32;
    // SAFETY: event points to a reserved record of the right size; at most MAX_DNS_PAYLOAD
    // bytes of user memory into `payload`.
    unsafe {
        let copied = if want > 0
            && want <= MAX_DNS_PAYLOAD as u32
            && bpf_probe_read_user(addr_of_mut!((*event).payload) as *mut c_void, want, buf as *const c_void) == 0
        {
            want
        } else {
            0
        };
        fill_header(addr_of_mut!((*event).header), kind::DNS_QUERY, size_of::<DnsQueryEvent>(), pid_tgid, mark);
        (*event).syscall = syscall;
        (*event).fd = fd;
        (*event).record_flags = record_flags;
        (*event).addr_len = socket.addr_len;
        (*event).sent_len = len as u32;
        (*event).copied = copied;
        (*event).addr = socket.addr;
        (*event)._pad = 0;
    }
    submit(entry, false);
    Ok(())
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // A panic path that survives optimisation becomes an infinite loop, which the verifier
    // rejects at load time instead of it ever running.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
