//! Tamper and evasion syscalls: ptrace, process_vm_readv/writev, bpf, module loads, signals
//! and io_uring_setup. Signals count as tamper only when aimed at the agent: kill(agent tgid)
//! or kill(-1), tkill/tgkill of its main thread, pidfd_send_signal on a pidfd of it (a
//! /proc/<pid> dirfd used as a pidfd is not resolved). A process-group kill that includes the
//! agent is not. Under `--enforce`, a syscall a `kill` rule names kills the process at entry
//! (see [`crate::enforce`]: its effect still happens).

use core::{mem::size_of, ptr::addr_of_mut};

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext};
use aya_log_ebpf::warn;
use credwatch_common::{
    config_flag, kind, lost_kind, record_flag, syscall_family, tamper_syscall, KernelOffsets, Mark, SyscallEvent,
};

use crate::{
    enforce::{kill_current, spared},
    file::fd_file,
    helpers::{config, current_mark, fill_header, may_be_marked, read, reserve, submit, Res},
    maps::{MAX_PENDING_SYSCALLS, PENDING_SYSCALLS},
    repeats::{check, unsend},
    syscall::{enter_args, exit_result, hooked_syscall},
    values::{PendingSyscall, RepeatKey},
};

/// A [`PendingSyscall`] flag, never in a record: the entry left the refusal of this call to a
/// BPF LSM hook ([`deny_syscall`]), which turns it into [`record_flag::DENIED`].
const LSM_DENY: u32 = 1 << 31;

/// Every `sys_enter_*` of the tamper family.
#[tracepoint]
pub fn tamper_enter(ctx: TracePointContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    let (nr, args) = enter_args(&ctx);
    handle_tamper_enter(pid_tgid, mark, nr, &args);
    0
}

/// The entry of tamper-family syscall `nr` with arguments `args`, by a marked process.
#[inline(always)]
pub(crate) fn handle_tamper_enter(pid_tgid: u64, mark: Mark, nr: u32, args: &[u64; 6]) {
    if let Some(syscall) = hooked_syscall(nr, syscall_family::TAMPER) {
        let _ = save_tamper(args, syscall, pid_tgid, mark);
    }
}

/// Decides whether the call is reported (signals: only those aimed at the agent), kills it
/// under `--enforce` when a `kill` rule names it (`Config::block_syscalls`), else keeps it for the exit to report with its
/// result.
#[inline(always)]
fn save_tamper(arg: &[u64; 6], syscall: u32, pid_tgid: u64, mark: Mark) -> Res<()> {
    let config = config().ok_or(-1i64)?;
    let agent = config.agent_tgid;
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
            (agent, true, arg[2])
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
    if blockable && config.flags & config_flag::ENFORCE != 0 && !spared(config, mark) {
        // A BPF LSM hook refuses it (see `crate::lsm`), and the process lives; kill(-1)
        // signals every process, of which the hook would refuse only the agent.
        let signal = matches!(
            syscall,
            tamper_syscall::KILL | tamper_syscall::TKILL | tamper_syscall::TGKILL | tamper_syscall::PIDFD_SEND_SIGNAL
        );
        if config.lsm_syscalls & (1 << syscall) != 0 && (has_target || !signal) {
            record_flags |= LSM_DENY;
        } else if kill_current() {
            record_flags |= record_flag::BLOCKED;
            emit_syscall(pid_tgid, mark, syscall, record_flags, target, operation, 0, true);
            return Ok(());
        }
    }
    let pending = PendingSyscall { syscall, record_flags, target_pid: target, _pad: 0, operation };
    PENDING_SYSCALLS.insert(&(pid_tgid as u32), &pending, 0).map_err(|e| {
        warn!(
            &(),
            "PENDING_SYSCALLS full ({} entries): syscall {} by tid {} is lost",
            MAX_PENDING_SYSCALLS,
            syscall,
            pid_tgid as u32
        );
        e as i64
    })
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
pub(crate) fn emit_syscall(
    pid_tgid: u64,
    mark: Mark,
    syscall: u32,
    record_flags: u32,
    target_pid: u32,
    operation: u64,
    ret: i64,
    priority: bool,
) {
    // Enforced before: the same call (on the same target) as one reported less than a second
    // ago is only counted (see crate::repeats).
    let kept = record_flag::HAS_TARGET | record_flag::BLOCKED | record_flag::DENIED | record_flag::FAIL_CLOSED;
    let repeat = RepeatKey::syscall((pid_tgid >> 32) as u32, syscall, record_flags & kept, operation, target_pid);
    let Some(carried) = check(&repeat, 0) else { return };
    let Some(mut entry) = reserve::<SyscallEvent>(priority, mark.root_pid, lost_kind::SYSCALL) else {
        unsend(&repeat, carried);
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: event points to a reserved record of the right size.
    unsafe {
        fill_header(addr_of_mut!((*event).header), kind::SYSCALL, size_of::<SyscallEvent>(), pid_tgid, mark);
        (*event).syscall = syscall;
        (*event).record_flags = record_flags;
        (*event).target_pid = target_pid;
        (*event).repeats = carried;
        (*event).operation = operation;
        (*event).ret = ret;
    }
    submit(entry, priority);
}

/// Every `sys_exit_*` of the tamper family.
#[tracepoint]
pub fn tamper_exit(ctx: TracePointContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    let (_, ret) = exit_result(&ctx);
    handle_tamper_exit(pid_tgid, mark, ret);
    0
}

/// The exit of a tamper-family syscall with result `ret`, by a marked process: reports what its
/// entry kept.
#[inline(always)]
pub(crate) fn handle_tamper_exit(pid_tgid: u64, mark: Mark, ret: i64) {
    let tid = pid_tgid as u32;
    // SAFETY: copied out at once.
    let Some(pending) = (unsafe { PENDING_SYSCALLS.get(&tid).copied() }) else { return };
    let _ = PENDING_SYSCALLS.remove(&tid);
    let mut record_flags = pending.record_flags | record_flag::HAS_RET;
    if record_flags & LSM_DENY != 0 {
        // The hook that was to refuse it did not run (the call failed before, or took a path
        // without it): killed, as without the LSM, though its effect happened.
        record_flags &= !LSM_DENY;
        if kill_current() {
            record_flags |= record_flag::BLOCKED;
        }
    }
    emit_syscall(pid_tgid, mark, pending.syscall, record_flags, pending.target_pid, pending.operation, ret, true);
}

/// A BPF LSM hook's decision (see [`crate::lsm`]) for the current thread, inside a tamper
/// syscall: refused (true) when its entry left the refusal to the hook, which the exit then
/// reports as [`record_flag::DENIED`].
#[inline(always)]
pub(crate) fn deny_syscall(pid_tgid: u64) -> bool {
    let Some(pending) = PENDING_SYSCALLS.get_ptr_mut(&(pid_tgid as u32)) else { return false };
    // SAFETY: a map value, of this thread's syscall.
    unsafe {
        if (*pending).record_flags & LSM_DENY == 0 {
            return false;
        }
        (*pending).record_flags = ((*pending).record_flags & !LSM_DENY) | record_flag::DENIED;
    }
    true
}
