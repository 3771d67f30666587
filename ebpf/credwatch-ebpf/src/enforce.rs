//! `--enforce`: which processes are spared, and the signals that block.
//!
//! Blocking is `bpf_send_signal(SIGKILL)`: the signal is delivered when the syscall returns to
//! user space, so the syscall itself completes. For an open that is enough (the fd exists but
//! the process never runs again to read it); for a tamper syscall (bpf, a module load, a signal
//! to the agent) its effect happens anyway. Where the BPF LSM is active, the fentry backend
//! refuses instead (see [`crate::lsm`]), with the same decision ([`spared`]).
//!
//! Failing closed: when no agent has drained the rings for [`FAIL_CLOSED_AFTER_NS`] (the
//! `HEARTBEAT` it writes), nothing reads what package code does, so its credential-inode opens
//! are killed or refused whatever the rules said of the file, and its connects held, until an
//! agent is back to judge them (see [`failing_closed`]).

use aya_ebpf::helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_boot_ns, generated::bpf_send_signal};
use credwatch_common::{config_flag, mark_flag, spare_flag, Config, Mark, FAIL_CLOSED_AFTER_NS, NO_MANAGER};

use crate::{
    file::exe_key,
    maps::{HEARTBEAT, SPARED_EXES},
};

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

/// Whether the current process fails closed: `--enforce`, an agent drained the rings once but
/// not for [`FAIL_CLOSED_AFTER_NS`], and the process is package code (depth > 0). A tree's root
/// is the manager or coding agent the user ran, not package code: it reads its own credentials
/// to do its job (npm `.npmrc`, cargo `credentials.toml`, an agent its login), and killing it
/// would break every install while the agent is away, without stopping a payload (that runs
/// below it). [`spared`] processes are spared as under the rules. Before a first agent read
/// (`HEARTBEAT` 0) nothing fails closed: the programs are loaded before anything reads. After a
/// suspend the heartbeat is old until the agent's next drain, a few ms.
#[inline(always)]
pub(crate) fn failing_closed(config: &Config, mark: Mark) -> bool {
    if config.flags & config_flag::ENFORCE == 0 || mark.depth == 0 {
        return false;
    }
    let Some(&beat) = HEARTBEAT.get(0) else { return false };
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_boot_ns() };
    beat != 0 && now.saturating_sub(beat) > FAIL_CLOSED_AFTER_NS && !spared(config, mark)
}
