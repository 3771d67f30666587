//! Shared by the programs: kernel and user reads, the mark lookup, ring buffer records, and
//! values laundered for the verifier.
//!
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

use core::{
    mem::size_of,
    ptr::{addr_of_mut, read_volatile, write_volatile},
};

use aya_ebpf::{
    bindings::task_struct,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_uid_gid, bpf_ktime_get_boot_ns, generated::bpf_get_current_task_btf,
    },
    maps::ring_buf::RingBufEntry,
};
use aya_log_ebpf::warn;
use credwatch_common::{lost_index, lost_kind, Config, EventHeader, LostTree, Mark};

use crate::maps::{
    CONFIG, EVENTS, LOST, LOST_TREES, MARKS, PRIORITY, TAINTED, TASK_BPF_STORAGE, TASK_GROUP_LEADER, TASK_MARKS,
    TASK_MARKS_ON, WAKEUP_COUNTDOWN,
};

/// Wake the reader when this much is waiting, although it has not caught up (while records flow
/// it reads them on a short timer).
const WAKEUP_WATERMARK: u64 = 1 << 20;
/// Records per CPU between two looks at the bulk ring's fill level: 2 CPUs x 32 records of at
/// most `MAX_EXEC_RECORD` bytes past the watermark still fit in the ring.
const WAKEUP_CHECK_EVERY: u32 = 32;
/// `bpf_ringbuf_submit` flags and `bpf_ringbuf_query` selector (uapi/linux/bpf.h). No flag
/// (adaptive): wake the reader only when it had caught up (the record is the first unread one).
const BPF_RB_ADAPTIVE_WAKEUP: u64 = 0;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;

/// Every fallible step returns the helper's error code (or -1), which the programs ignore.
pub(crate) type Res<T> = Result<T, i64>;

/// Reads a `T` at `base + offset` in kernel memory.
#[inline(always)]
pub(crate) fn read<T>(base: u64, offset: u32) -> Res<T> {
    // SAFETY: bpf_probe_read_kernel checks the address; a bad pointer is an error, not a fault.
    unsafe { aya_ebpf::helpers::bpf_probe_read_kernel((base + offset as u64) as *const T).map_err(|e| e as i64) }
}

#[inline(always)]
pub(crate) fn current_mark(tgid: u32) -> Option<Mark> {
    // SAFETY: the value is copied out at once.
    unsafe { MARKS.get(&tgid).copied() }
}

/// Whether the current process may be marked: false only when it certainly is not, so that the
/// syscall programs of an unmarked process return without hashing its tgid for `MARKS`. Where
/// `TASK_MARKS` is off, true (the `MARKS` lookup decides).
#[inline(always)]
pub(crate) fn may_be_marked() -> bool {
    if TASK_MARKS_ON.load() == 0 {
        return true;
    }
    let leader = current_leader();
    // A task without any task storage (of any map, whoever's) holds no mark: one load, where
    // the helper call would cost more than the rest of the early exit.
    // SAFETY: a load at task_struct.bpf_storage of a task, which the verifier checks against BTF.
    let storage = unsafe { *((leader as *const u8).add(TASK_BPF_STORAGE.load() as usize) as *const u64) };
    if storage == 0 {
        return false;
    }
    // SAFETY: leader is a BTF pointer to a task.
    unsafe { TASK_MARKS.get(leader) }.is_some()
}

/// Gives `task` (the group leader of a process of tree `root` that was just marked) its
/// `TASK_MARKS` value; nothing where `TASK_MARKS` is off. A task the kernel cannot give storage
/// to (no memory) goes unseen by the syscall programs: counted as a mark not made, as when
/// `MARKS` is full.
///
/// # Safety
///
/// `task` is a BTF pointer to a task (the verifier checks it).
#[inline(always)]
pub(crate) unsafe fn mark_task(task: *mut task_struct, root: u32) {
    if TASK_MARKS_ON.load() == 0 {
        return;
    }
    let mut marked = 1u32;
    // SAFETY: the caller's task. A creation that lost the race with another (the agent's, through
    // a pidfd) fails, but the storage is there: only a task still without one goes unseen.
    if !unsafe { TASK_MARKS.get_or_insert(task, &mut marked) } && unsafe { TASK_MARKS.get(task) }.is_none() {
        count_unmarked(root);
    }
}

/// [`mark_task`] for the current process (its group leader).
#[inline(always)]
pub(crate) fn mark_current_task(root: u32) {
    if TASK_MARKS_ON.load() == 0 {
        return;
    }
    // SAFETY: current_leader is a BTF pointer to a task.
    unsafe { mark_task(current_leader(), root) }
}

/// The current process's group leader, a BTF pointer: a process's threads share its mark, kept
/// in their leader's task storage.
#[inline(always)]
fn current_leader() -> *mut task_struct {
    // SAFETY: a helper without arguments, then a load at task_struct.group_leader, at an offset
    // the verifier knows (a read-only global) and checks against BTF.
    unsafe {
        let task = bpf_get_current_task_btf() as *const u8;
        *(task.add(TASK_GROUP_LEADER.load() as usize) as *const *mut task_struct)
    }
}

#[inline(always)]
pub(crate) fn config() -> Option<&'static Config> {
    CONFIG.get(0)
}

#[inline(always)]
pub(crate) fn count_lost(index: u32) {
    if let Some(counter) = LOST.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, and programs do not migrate while they run.
        unsafe { *counter += 1 };
    }
}

/// Counts a loss of tree `root` in `LOST_TREES`: a record of [`lost_kind`] `kind` that a ring
/// refused (`priority`: the priority ring), or a process left unmarked ([`lost_kind::MARK`]).
/// Before `LOST`, which the agent reads first: a loss it sees there is in the tree's entry.
/// Concurrent losses of one tree may race on the counts: a count may come out short, never a
/// tree unnamed.
#[inline(never)]
pub(crate) fn count_lost_tree(root: u32, kind: usize, priority: bool) {
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_boot_ns() };
    if let Some(tree) = LOST_TREES.get_ptr_mut(&root) {
        // SAFETY: a map value; `get_mut` checks the index.
        unsafe {
            if let Some(count) = (*tree).counts.get_mut(kind) {
                *count = count.wrapping_add(1);
            }
            if priority {
                if let Some(count) = (*tree).priority.get_mut(kind) {
                    *count = count.wrapping_add(1);
                }
            }
            (*tree).last_boot_ns = now;
        }
        return;
    }
    let mut tree = LostTree { first_boot_ns: now, last_boot_ns: now, ..LostTree::default() };
    if let Some(count) = tree.counts.get_mut(kind) {
        *count = 1;
    }
    if priority {
        if let Some(count) = tree.priority.get_mut(kind) {
            *count = 1;
        }
    }
    let _ = LOST_TREES.insert(&root, &tree, 0);
}

/// Adds one to the tree's `TAINTED` count: it opened a credential inode, or one of its
/// processes went unmarked.
#[inline(always)]
pub(crate) fn taint(root: u32) {
    if let Some(count) = TAINTED.get_ptr_mut(&root) {
        // SAFETY: a map value.
        unsafe { *count = (*count).wrapping_add(1) };
    } else {
        let _ = TAINTED.insert(&root, &1, 0);
    }
}

/// Reserves a record of [`lost_kind`] `kind` of the tree `root` in `PRIORITY` or in the bulk
/// `EVENTS`, counting a failure per buffer and per tree.
#[inline(always)]
pub(crate) fn reserve<T: 'static>(priority: bool, root: u32, kind: usize) -> Option<RingBufEntry<T>> {
    if priority {
        let entry = PRIORITY.reserve::<T>(0);
        if entry.is_none() {
            count_lost_tree(root, kind, true);
            count_lost(lost_index::PRIORITY);
            warn!(&(), "ring buffer PRIORITY full: a {}-byte record dropped", size_of::<T>());
        }
        return entry;
    }
    let entry = EVENTS.reserve::<T>(0);
    if entry.is_none() {
        count_lost_tree(root, kind, false);
        count_lost(lost_index::EVENTS);
        warn!(&(), "ring buffer EVENTS full: a {}-byte record dropped", size_of::<T>());
    }
    entry
}

#[inline(always)]
pub(crate) fn submit<T>(entry: RingBufEntry<T>, priority: bool) {
    if priority {
        // Rare and urgent: the default (adaptive) wakeup.
        entry.submit(0);
        return;
    }
    entry.submit(events_wakeup());
}

/// Copies a variable-length record of [`lost_kind`] `kind` of the tree `root`, built in scratch
/// memory, into `PRIORITY` or `EVENTS`, with the same wakeup policy as [`submit`] and the same
/// counting of failures as [`reserve`]. Returns whether it was sent.
#[inline(always)]
pub(crate) fn output(record: &[u8], priority: bool, root: u32, kind: usize) -> bool {
    if priority {
        if PRIORITY.output::<[u8]>(record, 0).is_err() {
            count_lost_tree(root, kind, true);
            count_lost(lost_index::PRIORITY);
            warn!(&(), "ring buffer PRIORITY full: a {}-byte record dropped", record.len());
            return false;
        }
    } else if EVENTS.output::<[u8]>(record, events_wakeup()).is_err() {
        count_lost_tree(root, kind, false);
        count_lost(lost_index::EVENTS);
        warn!(&(), "ring buffer EVENTS full: a {}-byte record dropped", record.len());
        return false;
    }
    true
}

/// Counts a process of tree `root` left unmarked because `MARKS` was full, and taints the tree:
/// what it does is unseen.
#[inline(always)]
pub(crate) fn count_unmarked(root: u32) {
    count_lost_tree(root, lost_kind::MARK, false);
    count_lost(lost_index::MARKS_FULL);
    taint(root);
}

/// No wakeup per record: the adaptive one (flags 0) wakes the reader only for the first record
/// after it caught up, which is what lets an idle agent sleep without a timer; userspace then
/// batches on a 10 ms timer while records flow, and is woken early when the bulk buffer fills
/// past the watermark. The fill level is looked at once every [`WAKEUP_CHECK_EVERY`] records
/// of a CPU (the query is a helper call on every open).
#[inline(always)]
pub(crate) fn events_wakeup() -> u64 {
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

/// The header of every record; its ids and cgroup are left zero (see [`fill_identity`]).
#[inline(always)]
pub(crate) unsafe fn fill_header(header: *mut EventHeader, kind: u32, size: usize, pid_tgid: u64, mark: Mark) {
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
pub(crate) unsafe fn zero<T: Default>(place: *mut T) {
    // SAFETY: the caller's place is valid for writes.
    unsafe { write_volatile(place, T::default()) }
}

/// The user, group and cgroup of an exec record. The agent keeps them per process; other
/// records skip these helper calls, which would cost every open of a marked process ~60 ns.
#[inline(always)]
pub(crate) unsafe fn fill_identity(header: *mut EventHeader) {
    let uid_gid = bpf_get_current_uid_gid();
    // SAFETY: header points into a record.
    unsafe {
        (*header).uid = uid_gid as u32;
        (*header).gid = (uid_gid >> 32) as u32;
        (*header).cgroup_id = bpf_get_current_cgroup_id();
    }
}

#[inline(always)]
pub(crate) fn read_user<T>(at: u64) -> Res<T> {
    // SAFETY: bpf_probe_read_user checks the address; a bad pointer is an error, not a fault.
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(at as *const T).map_err(|e| e as i64) }
}

/// Passes `value` through memory so that the verifier forgets which constant it was (see
/// [`crate::path`]); callers bound it again before use.
#[inline(always)]
pub(crate) fn launder(slot: &mut u64, value: u64) -> u64 {
    // SAFETY: slot is a valid, exclusive reference.
    unsafe {
        write_volatile(slot, value);
        read_volatile(slot)
    }
}

/// `value` laundered (see [`launder`]) and checked against `max`, for the verifier: offsets
/// into a record stay provably inside it.
#[inline(always)]
pub(crate) fn bounded(slot: &mut u64, value: usize, max: usize) -> Res<usize> {
    let value = launder(slot, value as u64) as usize;
    if value > max {
        return Err(-1);
    }
    Ok(checked(value))
}

/// `value`, just checked by the caller, passed through a stack slot, so that what is used after
/// the check is a copy made after it. LLVM spills a value where it is loaded when it needs the
/// register, then reloads that unchecked copy for the access; the 6.12+ verifiers carry the
/// check over to the copy, the 5.10 and 6.1 ones do not and refuse the access ("unbounded
/// memory access"). Every verifier keeps a register's bounds through a store to the stack and
/// the load back.
#[inline(always)]
pub(crate) fn checked(value: usize) -> usize {
    let mut slot = 0;
    // SAFETY: a local.
    unsafe {
        write_volatile(&mut slot, value);
        read_volatile(&slot)
    }
}
