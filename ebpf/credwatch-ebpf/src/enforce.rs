//! `--enforce`: which processes are spared, and the signals that block.
//!
//! Blocking is `bpf_send_signal(SIGKILL)`: the signal is delivered when the syscall returns to
//! user space, so the syscall itself completes. For an open that is enough (the fd exists but
//! the process never runs again to read it); for a tamper syscall (bpf, a module load, a signal
//! to the agent) its effect happens anyway. Where the BPF LSM is active, the fentry backend
//! refuses instead (see [`crate::lsm`]), with the same decision ([`spared`]).

use aya_ebpf::helpers::{bpf_get_current_pid_tgid, generated::bpf_send_signal};
use credwatch_common::{mark_flag, spare_flag, Config, Mark, NO_MANAGER};

use crate::{file::exe_key, maps::SPARED_EXES};

const SIGKILL: u32 = 9;
const SIGSTOP: u32 = 19;

/// Sends SIGKILL to the current process; true when the signal was queued.
#[inline(always)]
pub(crate) fn kill_current() -> bool {
    // SAFETY: signals the current process; allowed from tracepoint programs.
    unsafe { bpf_send_signal(SIGKILL) == 0 }
}

/// Sends SIGSTOP to the current process (see `net`: a held connect); true when the signal was
/// queued.
#[inline(always)]
pub(crate) fn stop_current() -> bool {
    // SAFETY: signals the current process; allowed from tracepoint programs.
    unsafe { bpf_send_signal(SIGSTOP) == 0 }
}

/// Whether `--enforce` spares the current process: the agent itself (marked when started
/// inside a package tree, e.g. by `cargo run`), a manager root, or an executable that a `kill`
/// rule's actor names (see [`credwatch_common::SparedExe`]).
#[inline(never)]
pub(crate) fn spared(config: &Config, mark: Mark) -> bool {
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
