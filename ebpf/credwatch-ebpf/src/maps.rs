//! Every map of the programs, with its limits. The agent finds them by these names.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    Global,
};
use credwatch_common::{
    lost_index, Config, CredInode, DnsSocket, HookedSyscall, InodeKey, LostTree, ManagerValue, Mark, RenameEvent,
    SparedExe, MANAGER_NAME_LEN, MODULE_KEY_LEN,
};

use crate::{
    task_storage::TaskStorage,
    values::{
        ExecScratch, OpenScratch, OpenSlot, PendingOpen, PendingSyscall, ProcessRepeats, Repeat, RepeatKey, Scratch,
    },
};

/// Processes that can be marked at once; a full map is counted in `LOST[MARKS_FULL]` and in the
/// tree's `LOST_TREES` entry, and taints the tree. (The agent can set this and the other map
/// sizes at load: `--map-size`.)
pub(crate) const MAX_MARKS: u32 = 65536;
const MAX_MANAGERS: u32 = 256;
/// Entries of `SYSCALLS`, indexed by syscall number: above every number of x86_64 and arm64.
const SYSCALL_TABLE: u32 = 1024;
/// Slots of `OPEN_SLOTS`, indexed by the low bits of the thread id (a power of two).
pub(crate) const OPEN_SLOT_COUNT: u32 = 16384;
/// Threads with an open syscall in flight whose slot another thread holds (LRU: a lost exit
/// only ages out).
pub(crate) const MAX_PENDING_OPENS: u32 = 16384;
/// Open records are variable-length (about 160 bytes for a short path): 4 MiB holds some 25,000,
/// a poll interval's worth at 400k opens/s, and the agent is woken at a quarter full. A larger
/// buffer costs the agent resident memory (it maps the data twice).
const EVENTS_BYTES: u32 = 4 << 20;
/// Room for about 2,500 open records: enough for a burst of credential hits between two polls.
/// Only records that make alerts come here (credential-inode opens, blocked, denied and
/// failed-closed acts, tamper syscalls, execs of tree roots, a tainted tree's connects), and
/// the kernel counts a repeated act instead of sending it again, so a flood of one file's
/// opens costs a record a second, not a record per open. A root's exec takes a few KiB (at most
/// `MAX_EXEC_RECORD`, 31 KiB), one per tree: dozens of trees starting between two polls fit.
const PRIORITY_BYTES: u32 = 512 << 10;
/// Credential files the agent can register (its table has the same limit).
const MAX_CRED_INODES: u32 = 16384;
const MAX_SPARED_EXES: u32 = 256;
/// Threads with a rename-family syscall in flight (each entry is a whole record, ~9 KiB).
pub(crate) const MAX_PENDING_RENAMES: u32 = 256;
pub(crate) const MAX_PENDING_SYSCALLS: u32 = 4096;
/// Sockets connected to port 53 remembered at once (LRU).
const MAX_DNS_SOCKETS: u32 = 4096;
/// Trees remembered as having opened a credential inode or lost a mark (LRU).
const MAX_TAINTED: u32 = 4096;
/// Trees whose losses wait for the agent (LRU: the agent reads them whenever `LOST` moves).
const MAX_LOST_TREES: u32 = 4096;
/// Keys of acts (see [`crate::repeats`]) whose last record was less than a second ago, and
/// more: LRU, an evicted key's next act is sent again (its count waits in its process's entry).
/// A build opens a few thousand distinct files a second.
pub(crate) const MAX_REPEATS: u32 = 16384;
/// Per-CPU LRU lists: no lock shared by all CPUs on the open path (uapi/linux/bpf.h).
const BPF_F_NO_COMMON_LRU: u32 = 2;

/// tgid -> [`Mark`] of every process in a package tree. Every program starts with a lookup
/// here (the syscall programs after `TASK_MARKS`, where it is on) and returns on a miss, so an
/// unmarked process costs one lookup.
#[map]
pub(crate) static MARKS: HashMap<u32, Mark> = HashMap::with_max_entries(MAX_MARKS, 0);
/// Where the kernel allows it (`TASK_MARKS_ON`), every marked process's group leader also holds
/// a value here, kept in its `struct task_struct`: the syscall programs look here first, and an
/// unmarked process returns without hashing its tgid (see [`crate::helpers::may_be_marked`]).
/// Set wherever a process gets a mark (exec, fork, the agent through a pidfd); never removed
/// (it goes with the task), so a hit only says "look in `MARKS`".
#[unsafe(link_section = ".maps")]
#[unsafe(export_name = "TASK_MARKS")]
pub(crate) static TASK_MARKS: TaskStorage<u32> = TaskStorage::new();
/// 1 where `TASK_MARKS` is used (5.12 and later): a read-only global the agent sets before
/// load, so that the verifier drops the task storage code as dead where it is 0 (5.10 has
/// neither the map type nor the helpers).
#[unsafe(no_mangle)]
pub(crate) static TASK_MARKS_ON: Global<u8> = Global::new(0);
/// Offsets of `task_struct.group_leader` and `task_struct.bpf_storage` (from BTF), read-only
/// globals as well: a load from a BTF pointer must be at an offset the verifier knows.
#[unsafe(no_mangle)]
pub(crate) static TASK_GROUP_LEADER: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static TASK_BPF_STORAGE: Global<u32> = Global::new(0);
/// NUL-padded exec basename -> [`ManagerValue`] (filled from the rules).
#[map]
pub(crate) static MANAGERS: HashMap<[u8; MANAGER_NAME_LEN], ManagerValue> = HashMap::with_max_entries(MAX_MANAGERS, 0);
/// NUL-separated, NUL-padded argv words after argv[0] -> manager index (`-m\0pip\0`), for
/// interpreters flagged `NEEDS_MODULE`.
#[map]
pub(crate) static MANAGER_MODULES: HashMap<[u8; MODULE_KEY_LEN], u32> = HashMap::with_max_entries(MAX_MANAGERS, 0);
/// NUL-padded script stem (`yarn` of `.yarn/releases/yarn-4.5.3.cjs`) -> manager index, for
/// interpreters flagged `NEEDS_SCRIPT`. The kernel marks every script of that stem; the engine
/// keeps only the files the rules name.
#[map]
pub(crate) static MANAGER_SCRIPTS: HashMap<[u8; MANAGER_NAME_LEN], u32> = HashMap::with_max_entries(MAX_MANAGERS, 0);
/// The single [`Config`] (kernel offsets from BTF, flags, the agent's tgid).
#[map]
pub(crate) static CONFIG: Array<Config> = Array::with_max_entries(1, 0);
/// The bulk ring buffer of records for userspace.
#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);
/// A small ring buffer for the records that must not share the bulk's fate: opens of
/// credential inodes, blocked actions and tamper syscalls. The agent reads it first.
#[map]
pub(crate) static PRIORITY: RingBuf = RingBuf::with_byte_size(PRIORITY_BYTES, 0);
/// (dev, ino) -> [`CredInode`] of every credential file the agent found.
#[map]
pub(crate) static CRED_INODES: HashMap<InodeKey, CredInode> = HashMap::with_max_entries(MAX_CRED_INODES, 0);
/// (dev, ino) -> [`SparedExe`]: executables of `kill` rules' actors (ssh and git started by the
/// manager), which `--enforce` does not kill.
#[map]
pub(crate) static SPARED_EXES: HashMap<InodeKey, SparedExe> = HashMap::with_max_entries(MAX_SPARED_EXES, 0);
/// tid -> what a rename-family syscall's entry saw, until its exit.
#[map]
pub(crate) static PENDING_RENAMES: LruHashMap<u32, RenameEvent> = LruHashMap::with_max_entries(MAX_PENDING_RENAMES, 0);
/// Per-CPU: a rename record is too large for the 512-byte stack.
#[map]
pub(crate) static RENAME_SCRATCH: PerCpuArray<RenameEvent> = PerCpuArray::with_max_entries(1, 0);
/// tid -> what a tamper syscall's entry saw, until its exit.
#[map]
pub(crate) static PENDING_SYSCALLS: LruHashMap<u32, PendingSyscall> =
    LruHashMap::with_max_entries(MAX_PENDING_SYSCALLS, 0);
/// Per-CPU counters indexed by [`lost_index`] (one per ring buffer, and a full MARKS).
#[map]
pub(crate) static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(lost_index::COUNT, 0);
/// What an open's entry saw, in the slot of `tid % OPEN_SLOT_COUNT` (tagged with the tid); when
/// another thread holds the slot, in `PENDING_OPENS`.
#[map]
pub(crate) static OPEN_SLOTS: Array<OpenSlot> = Array::with_max_entries(OPEN_SLOT_COUNT, 0);
/// tid -> what an open's entry saw, until its exit, when its slot of `OPEN_SLOTS` was taken.
#[map]
pub(crate) static PENDING_OPENS: LruHashMap<u32, PendingOpen> =
    LruHashMap::with_max_entries(MAX_PENDING_OPENS, BPF_F_NO_COMMON_LRU);
/// Per-CPU room to find a manager at exec (names, argv words, map keys).
#[map]
pub(crate) static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);
/// Per-CPU: exec records are built here, then copied to a ring buffer at their real length.
#[map]
pub(crate) static EXEC_SCRATCH: PerCpuArray<ExecScratch> = PerCpuArray::with_max_entries(1, 0);
/// Per-CPU: open records are built here, then copied to a ring buffer at their real length.
#[map]
pub(crate) static OPEN_SCRATCH: PerCpuArray<OpenScratch> = PerCpuArray::with_max_entries(1, 0);
/// Syscall number (the index) -> [`HookedSyscall`]. One program serves all the entry (or all
/// the exit) tracepoints of a family and looks the number up to know which syscall it is: the
/// kernel verifies each program once, and start-up is mostly verification.
#[map]
pub(crate) static SYSCALLS: Array<HookedSyscall> = Array::with_max_entries(SYSCALL_TABLE, 0);
/// `tgid << 32 | fd` -> [`DnsSocket`]: sockets a marked process connected to port 53 (glibc's
/// resolver connects a UDP socket, then sends without an address), so that what it sends on
/// them is reported as a DNS query. LRU: a closed socket only ages out.
#[map]
pub(crate) static DNS_SOCKETS: LruHashMap<u64, DnsSocket> = LruHashMap::with_max_entries(MAX_DNS_SOCKETS, 0);
/// Root tgid -> how many credential-inode opens the tree made plus how many of its processes
/// went unmarked (MARKS full). Under `--enforce`, its processes' connects are held for the
/// agent's verdict.
#[map]
pub(crate) static TAINTED: LruHashMap<u32, u32> = LruHashMap::with_max_entries(MAX_TAINTED, 0);
/// Root tgid -> [`LostTree`]: the records the rings refused and the marks not made, per tree,
/// which the agent reports as blind spots naming the tree.
#[map]
pub(crate) static LOST_TREES: LruHashMap<u32, LostTree> = LruHashMap::with_max_entries(MAX_LOST_TREES, 0);
/// `bpf_ktime_get_boot_ns()` of the agent's last drain of the rings (0: no agent read yet).
/// Under `--enforce`, package code fails closed when it is older than
/// [`credwatch_common::FAIL_CLOSED_AFTER_NS`] (see [`crate::enforce::failing_closed`]).
#[map]
pub(crate) static HEARTBEAT: Array<u64> = Array::with_max_entries(1, 0);
/// Per-CPU: records left before the next look at the bulk ring's fill level (see
/// [`crate::helpers::events_wakeup`]).
#[map]
pub(crate) static WAKEUP_COUNTDOWN: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);
/// [`RepeatKey`] -> [`Repeat`]: when each act of a marked process was last sent, and how many
/// identical ones were counted since (see [`crate::repeats`]).
#[map]
pub(crate) static REPEATS: LruHashMap<RepeatKey, Repeat> =
    LruHashMap::with_max_entries(MAX_REPEATS, BPF_F_NO_COMMON_LRU);
/// tgid -> [`ProcessRepeats`]: a marked process's counted acts no record carried yet, for its
/// exit record (freed there). As large as `MARKS`: one entry per marked process.
#[map]
pub(crate) static PROCESS_REPEATS: LruHashMap<u32, ProcessRepeats> =
    LruHashMap::with_max_entries(MAX_MARKS, BPF_F_NO_COMMON_LRU);
