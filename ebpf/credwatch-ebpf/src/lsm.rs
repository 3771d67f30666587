//! BPF LSM hooks, the fentry backend's deny under `--enforce` where the BPF LSM is active
//! (`bpf` in /sys/kernel/security/lsm): a refused open or call fails with EPERM before it does
//! anything, and the process lives (no SIGKILL).
//!
//! - `file_open` sees every open, io_uring's `IORING_OP_OPENAT` included, which no syscall hook
//!   sees: the decision is the kill path's (a marked process, a `KILL` credential inode, an
//!   actor not spared), see [`crate::open::deny_open`].
//! - `bpf`, `task_kill`, `ptrace_access_check`, `kernel_read_file` (finit_module) and
//!   `kernel_load_data` (init_module) refuse the tamper syscall whose entry decided it is to be
//!   blocked and left the refusal to them (`Config::lsm_syscalls`), see
//!   [`crate::tamper::deny_syscall`]: their own arguments, which differ between kernels (`bpf`
//!   gained one in 6.x), are not read.
//! - Each returns 0 (no objection) otherwise: the other LSMs and BPF programs decide.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::lsm, programs::LsmContext};

use crate::{
    helpers::{current_mark, may_be_marked},
    open::deny_open,
    tamper::deny_syscall,
};

/// What a hook returns to refuse: `-EPERM`.
const DENY: i32 = -1;

#[lsm(hook = "file_open")]
pub fn lsm_file_open(ctx: LsmContext) -> i32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    if deny_open(pid_tgid, mark, ctx.arg(0)) {
        DENY
    } else {
        0
    }
}

/// The tamper syscall in flight on this thread, when its entry left the refusal to a hook.
#[inline(always)]
fn tamper() -> i32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    if current_mark((pid_tgid >> 32) as u32).is_none() {
        return 0;
    }
    if deny_syscall(pid_tgid) {
        DENY
    } else {
        0
    }
}

#[lsm(hook = "bpf")]
pub fn lsm_bpf(_ctx: LsmContext) -> i32 {
    tamper()
}

#[lsm(hook = "task_kill")]
pub fn lsm_task_kill(_ctx: LsmContext) -> i32 {
    tamper()
}

#[lsm(hook = "ptrace_access_check")]
pub fn lsm_ptrace_access_check(_ctx: LsmContext) -> i32 {
    tamper()
}

#[lsm(hook = "kernel_read_file")]
pub fn lsm_kernel_read_file(_ctx: LsmContext) -> i32 {
    tamper()
}

#[lsm(hook = "kernel_load_data")]
pub fn lsm_kernel_load_data(_ctx: LsmContext) -> i32 {
    tamper()
}
