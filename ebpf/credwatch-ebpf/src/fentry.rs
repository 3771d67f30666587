//! The fentry backend's syscall hooks: fentry (entry) and fexit (exit) programs on the x86_64
//! syscall functions `__x64_sys_<name>`, which run the same family logic as the tracepoint
//! programs and so send the same records.
//!
//! - Why: a syscall tracepoint (any `syscalls:sys_enter_*`) puts every task of the machine on
//!   the slow syscall path; an fentry program costs only the hooked functions.
//! - A tracing program has one attach target: the agent loads each of these once per syscall
//!   of its family (`__x64_sys_openat`, `__x64_sys_openat2`, ...), keeping the links.
//! - `__x64_sys_*` take the `struct pt_regs` saved at syscall entry (its address is read with
//!   a probe read, see `regs_arg`): the arguments are in di, si, dx, r10, r8, r9 and the
//!   syscall number in `orig_ax`, read with one probe read (the
//!   offsets come from BTF, see `KernelOffsets::pt_regs_r10`). The syscall number then picks
//!   the family's syscall in `SYSCALLS`, as `__syscall_nr` does for the tracepoints.
//! - An fexit program gets the function's arguments, then its result. The open family, the
//!   syscalls every process makes most, runs from its fexit alone (the arguments are still in
//!   the saved registers at exit, and each program on the path is a trampoline run that
//!   unmarked opens pay for), but for the LSM deny, whose record needs what the entry saw.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{fentry, fexit},
    programs::{FEntryContext, FExitContext},
    EbpfContext,
};
use credwatch_common::{KernelOffsets, PT_REGS_WINDOW};

use crate::{
    helpers::{config, current_mark, may_be_marked, read, Res},
    net::handle_net_enter,
    open::{handle_open, handle_open_enter},
    rename::{handle_rename_enter, handle_rename_exit},
    tamper::{handle_tamper_enter, handle_tamper_exit},
};

/// `words[index]`, by constant indexes that the verifier checks once each.
#[inline(always)]
fn word(words: &[u64; PT_REGS_WINDOW], index: u32) -> u64 {
    match index {
        0 => words[0],
        1 => words[1],
        2 => words[2],
        3 => words[3],
        4 => words[4],
        5 => words[5],
        6 => words[6],
        7 => words[7],
        _ => words[8],
    }
}

/// The function's first argument, the `struct pt_regs *`, read from the trampoline's argument
/// array with a probe read rather than loaded from the context: the verifier checks a context
/// load against the argument's BTF type, and 5.10's BTF gives some syscall functions (`bpf`,
/// `connect`, `open_by_handle_at`, ...) a `struct pt_regs` it only declares, which it refuses
/// ("arg0 type FWD is not a struct"). One helper call, for marked processes only.
#[inline(always)]
fn regs_arg(ctx: &impl EbpfContext) -> Res<u64> {
    read::<u64>(ctx.as_ptr() as u64, 0)
}

/// The syscall number and the six arguments in the `struct pt_regs` at `regs`.
#[inline(always)]
fn syscall_args(regs: u64) -> Res<(u32, [u64; 6])> {
    let off: &KernelOffsets = &config().ok_or(-1i64)?.offsets;
    let words: [u64; PT_REGS_WINDOW] = read(regs, off.pt_regs_r10)?;
    let at = |member: u32| word(&words, (member - off.pt_regs_r10) / 8);
    let args = [
        at(off.pt_regs_di),
        at(off.pt_regs_si),
        at(off.pt_regs_dx),
        at(off.pt_regs_r10),
        at(off.pt_regs_r8),
        at(off.pt_regs_r9),
    ];
    Ok((at(off.pt_regs_orig_ax) as u32, args))
}

/// Entry of every `__x64_sys_*` of the open family, attached only with the LSM hooks: what it
/// saves gives a refused open its given path (see [`crate::open::deny_open`]).
#[fentry]
pub fn fentry_open(ctx: FEntryContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    if current_mark((pid_tgid >> 32) as u32).is_none() {
        return 0;
    }
    if let Ok((nr, args)) = regs_arg(&ctx).and_then(syscall_args) {
        handle_open_enter(pid_tgid, nr, &args);
    }
    0
}

/// Exit of every `__x64_sys_*` of the open family (see [`handle_open`]).
#[fexit]
pub fn fexit_open(ctx: FExitContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    if let Ok((nr, args)) = regs_arg(&ctx).and_then(syscall_args) {
        handle_open(pid_tgid, mark, nr, &args, ctx.arg(1));
    }
    0
}

/// Entry of every `__x64_sys_*` of the rename family.
#[fentry]
pub fn fentry_rename(ctx: FEntryContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    if current_mark((pid_tgid >> 32) as u32).is_none() {
        return 0;
    }
    if let Ok((nr, args)) = regs_arg(&ctx).and_then(syscall_args) {
        handle_rename_enter(pid_tgid, nr, &args);
    }
    0
}

/// Exit of every `__x64_sys_*` of the rename family.
#[fexit]
pub fn fexit_rename(ctx: FExitContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    handle_rename_exit(pid_tgid, mark, ctx.arg(1));
    0
}

/// Entry of every `__x64_sys_*` of the tamper family.
#[fentry]
pub fn fentry_tamper(ctx: FEntryContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    if let Ok((nr, args)) = regs_arg(&ctx).and_then(syscall_args) {
        handle_tamper_enter(pid_tgid, mark, nr, &args);
    }
    0
}

/// Exit of every `__x64_sys_*` of the tamper family.
#[fexit]
pub fn fexit_tamper(ctx: FExitContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    handle_tamper_exit(pid_tgid, mark, ctx.arg(1));
    0
}

/// Entry of every `__x64_sys_*` of the net family (reported at entry only).
#[fentry]
pub fn fentry_net(ctx: FEntryContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    if let Ok((nr, args)) = regs_arg(&ctx).and_then(syscall_args) {
        handle_net_enter(pid_tgid, mark, nr, &args);
    }
    0
}
