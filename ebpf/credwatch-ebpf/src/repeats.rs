//! Repeated acts are counts, not records.
//!
//! An open, connect or tamper call of a marked process whose key (see
//! [`credwatch_common::REPEAT_WINDOW_NS`]) was reported less than the window ago is counted in
//! `REPEATS`, not sent: a loop of 60,000 opens of one file costs a record a second, not 60,000
//! records that would fill the rings and push out what makes alerts. The next record of the key
//! carries the count; what no record carried reaches userspace in the process's exit record, so
//! every act is accounted for. Callers decide kill, deny and hold before they ask: a counted act
//! was enforced like a sent one.
//!
//! Cost: a marked act now pays two hash lookups more (its process's `PROCESS_REPEATS` entry
//! and its key's `REPEATS` entry), and a first act two updates; a counted one skips the path
//! walk and the ring. Unmarked processes never get here (their programs return after the
//! `MARKS` lookup).
//!
//! A key's entry outlives its process (the map cannot be searched by tgid at exit): each entry
//! keeps the `epoch` of its process's `PROCESS_REPEATS` entry, made at the process's first
//! act and freed at its exit, so a process that reuses the pid starts afresh. Threads of one
//! process racing on one key can both send at the window's end, or lose a count (see [`add32`]).

use aya_ebpf::helpers::bpf_ktime_get_boot_ns;
use credwatch_common::REPEAT_WINDOW_NS;

use crate::{
    maps::{PROCESS_REPEATS, REPEATS},
    values::{ProcessRepeats, Repeat, RepeatKey},
};

/// Whether the act of `key` is sent (`Some`, with the count it carries) or counted (`None`).
/// `tainted` is the tree's `TAINTED` count for a connect (a tree that opened a credential since
/// the key's record makes the same connect news again), else 0. A sent act whose record the
/// ring then refuses is given back with [`unsend`].
#[inline(always)]
pub(crate) fn check(key: &RepeatKey, tainted: u32) -> Option<u32> {
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_boot_ns() };
    let process = match PROCESS_REPEATS.get_ptr_mut(&key.tgid) {
        Some(process) => process,
        None => {
            let first = ProcessRepeats { epoch: now, uncarried: 0 };
            let _ = PROCESS_REPEATS.insert(&key.tgid, &first, 0);
            // Not there (an insert failed): sent, as without the dedup.
            let Some(process) = PROCESS_REPEATS.get_ptr_mut(&key.tgid) else { return Some(0) };
            process
        }
    };
    // SAFETY: map values, shared with the process's other threads: counts change atomically.
    unsafe {
        let epoch = (*process).epoch;
        if let Some(seen) = REPEATS.get_ptr_mut(key) {
            if (*seen).epoch == epoch {
                if now.wrapping_sub((*seen).boot_ns) < REPEAT_WINDOW_NS && (*seen).tainted == tainted {
                    add32(&mut (*seen).count, 1);
                    add64(&mut (*process).uncarried, 1);
                    return None;
                }
                // The window is over: this one is sent and carries what was counted.
                (*seen).boot_ns = now;
                (*seen).tainted = tainted;
                let carried = (*seen).count;
                add32(&mut (*seen).count, carried.wrapping_neg());
                add64(&mut (*process).uncarried, (carried as u64).wrapping_neg());
                return Some(carried);
            }
        }
    }
    let first = Repeat { boot_ns: now, epoch: unsafe { (*process).epoch }, count: 0, tainted };
    // Full: LRU, the oldest key goes (its count is still in the process's, for its exit).
    let _ = REPEATS.insert(key, &first, 0);
    Some(0)
}

/// The record of `key`, which [`check`] let through carrying `carried`, was not sent (a ring was
/// full, counted as lost there): the count goes back, and the next act is sent.
#[inline(always)]
pub(crate) fn unsend(key: &RepeatKey, carried: u32) {
    if let Some(seen) = REPEATS.get_ptr_mut(key) {
        // SAFETY: map values; see check.
        unsafe {
            (*seen).boot_ns = 0;
            add32(&mut (*seen).count, carried);
        }
    }
    if let Some(process) = PROCESS_REPEATS.get_ptr_mut(&key.tgid) {
        // SAFETY: as above.
        unsafe { add64(&mut (*process).uncarried, carried as u64) };
    }
}

/// The process `tgid` exited: what no record carried, for its exit record. Its entry is freed.
#[inline(always)]
pub(crate) fn take_uncarried(tgid: u32) -> u32 {
    // SAFETY: copied out at once.
    let Some(process) = (unsafe { PROCESS_REPEATS.get(&tgid).copied() }) else { return 0 };
    let _ = PROCESS_REPEATS.remove(&tgid);
    process.uncarried.min(u32::MAX as u64) as u32
}

/// Adds to a map value's count. Not atomic (the BPF target's `core` has no atomic add): two
/// threads of one process counting the same key at the same instant on two CPUs can lose one.
#[inline(always)]
unsafe fn add32(place: *mut u32, value: u32) {
    // SAFETY: the caller's place is a map value's aligned u32.
    unsafe { *place = (*place).wrapping_add(value) };
}

#[inline(always)]
unsafe fn add64(place: *mut u64, value: u64) {
    // SAFETY: the caller's place is a map value's aligned u64.
    unsafe { *place = (*place).wrapping_add(value) };
}
