//! Process lineage: exec, fork and exit.
//!
//! - The exec tracepoint marks a root when [`crate::roots`] finds a package manager, and
//!   reports every exec of a marked process (filename, argv, environment, executable, cwd,
//!   cgroups: see [`crate::cgroup`]). The fork tracepoint copies the parent's mark to the child;
//!   the exit tracepoint removes it. Lineage is fixed at fork time, so reparenting to init,
//!   `setsid` and double forks change nothing.
//! - A process is gone when the last thread of its group exits: `sched_process_exit` passes
//!   `group_dead` since Linux 6.16; before, `do_exit()` has already decremented `signal->live`
//!   when the tracepoint fires, so `live == 0` says the same (two last threads racing may both
//!   see 0; only the one whose delete of the mark succeeds reports).

use core::{
    ffi::c_void,
    mem::size_of,
    ptr::{addr_of_mut, read_volatile},
};

use aya_ebpf::{
    bindings::task_struct,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task,
        generated::{bpf_probe_read_kernel_str, bpf_probe_read_user},
    },
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
    EbpfContext,
};
use aya_log_ebpf::{debug, warn};
use credwatch_common::{
    config_flag, kind, lost_kind, mark_flag, path_flag, spare_flag, Config, ExecEvent, ExitEvent, ForkEvent, Mark,
    MAX_ARGS, MAX_CGROUP_PATH, MAX_ENV, MAX_EXEC_RECORD, MAX_GIVEN_PATH, MAX_RESOLVED_PATH, NO_CGROUP_SUBSYS,
    NO_MANAGER,
};

use crate::{
    cgroup::{cgroup_node, cgroup_path},
    file::exe_key,
    helpers::{
        bounded, config, count_unmarked, current_mark, fill_header, fill_identity, mark_current_task, mark_task,
        output, read, reserve, submit, Res,
    },
    maps::{EXEC_SCRATCH, MARKS, MAX_MARKS, SPARED_EXES},
    path::resolve_at,
    repeats::take_uncarried,
    roots::manager_root,
    values::ExecScratch,
};

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn sched_process_exec(ctx: RawTracePointContext) -> i32 {
    // sched_process_exec(task, old_pid, bprm)
    match try_sched_process_exec(ctx.arg(2)) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// Marks a manager's exec as a root, and reports the exec of a marked process; `bprm` is the
/// exec's `struct linux_binprm`.
pub(crate) fn try_sched_process_exec(bprm: u64) -> Res<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let mark = current_mark(tgid);
    let Some(config) = config() else { return Ok(()) };
    if tgid == config.agent_tgid {
        return Ok(());
    }
    let off = &config.offsets;
    // The root this exec's program is: for an unmarked process, whether it starts a tree; for
    // one whose parent is in an actor chain, whether it is the tree's agent again (one call
    // site, so that the verifier checks the look-up once).
    let look_up = match mark {
        Some(mark) => mark.flags & mark_flag::PARENT_IN_CHAIN != 0,
        None => config.flags & config_flag::AUTO_ROOTS != 0,
    };
    let exec_root = if look_up { manager_root(off, bprm).unwrap_or(None) } else { None };
    let mark = match mark {
        Some(mark) => mark,
        None => match exec_root {
            Some(manager) => {
                let mark = Mark { root_pid: tgid, depth: 0, manager, flags: 0 };
                if MARKS.insert(&tgid, &mark, 0).is_err() {
                    count_unmarked(tgid);
                    warn!(
                        &(),
                        "MARKS full ({} entries): root pid {} of manager {} not marked", MAX_MARKS, tgid, manager
                    );
                    return Ok(());
                }
                debug!(&(), "pid {} marked as a root of manager {}", tgid, manager);
                mark
            }
            None => return Ok(()),
        },
    };
    let root_bit = if mark.manager < 32 { 1u32 << mark.manager } else { 0 };
    let agents_own = exec_root == Some(mark.manager) && config.agent_roots & root_bit != 0;
    let mark = actor_chain(config, tgid, mark, agents_own);
    // Every exec of a marked process, not only a root's: an exec from a thread other than the
    // leader makes that thread the leader, whose task storage is new. After `exec_root` is
    // used: LLVM reads an Option's payload even where it is None, and 5.10's verifier refuses a
    // read of stack no path wrote, which a join after this call's branch exposed.
    mark_current_task(mark.root_pid);
    let scratch = EXEC_SCRATCH.get_ptr_mut(0).ok_or(-1i64)?;
    // SAFETY: per-CPU scratch owned by this program run. The header goes first (its size is set
    // last), so that the mark is not held across the path walks (see report_open).
    unsafe {
        fill_header(addr_of_mut!((*scratch).event.header), kind::EXEC, 0, pid_tgid, mark);
        fill_identity(addr_of_mut!((*scratch).event.header));
        let size = fill_exec(config, bprm, scratch)?;
        (*scratch).event.header.size = size as u32;
        // A root's exec names the tree for every alert of it: reserved room. The mark is read
        // back from the record, not held across the walks.
        let mark = read_volatile(addr_of_mut!((*scratch).event.header.mark));
        let record = core::slice::from_raw_parts(scratch as *const u8, size);
        output(record, mark.depth == 0, mark.root_pid, lost_kind::EXEC);
    }
    Ok(())
}

/// Sets or clears [`mark_flag::ACTOR_CHAIN`] after an exec: the parent was the root or in the
/// chain, and the new program is a `VIA_MANAGER` actor, or under an agent root one of the
/// shells it runs its tools through (`TOOL_SHELL`) or the agent's own program again
/// (`agents_own`: codex.js runs its native `codex`). Those two pass the chain on, but only an
/// actor is spared (see [`crate::enforce::spared`]).
#[inline(never)]
fn actor_chain(config: &Config, tgid: u32, mark: Mark, agents_own: bool) -> Mark {
    let root_bit = if mark.manager < 32 { 1u32 << mark.manager } else { 0 };
    let in_chain = mark.flags & mark_flag::PARENT_IN_CHAIN != 0
        && (agents_own
            || exe_key(&config.offsets)
                .ok()
                // SAFETY: copied out at once.
                .and_then(|key| unsafe { SPARED_EXES.get(&key).copied() })
                .is_some_and(|spared| {
                    spared.flags & spare_flag::VIA_MANAGER != 0
                        || (spared.flags & spare_flag::TOOL_SHELL != 0 && spared.managers & root_bit != 0)
                }));
    let flags = if in_chain { mark.flags | mark_flag::ACTOR_CHAIN } else { mark.flags & !mark_flag::ACTOR_CHAIN };
    if flags == mark.flags {
        return mark;
    }
    let mark = Mark { flags, ..mark };
    // An update of an existing key cannot fail for want of room.
    let _ = MARKS.insert(&tgid, &mark, 0);
    mark
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

/// Where `TASK_MARKS` is off (5.10): the child is only an address.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn sched_process_fork(ctx: RawTracePointContext) -> i32 {
    // sched_process_fork(parent, child)
    match try_sched_process_fork(ctx.arg(1)) {
        Ok(_) => 0,
        Err(_) => 1,
    }
}

/// Where `TASK_MARKS` is on: the BTF-typed tracepoint gives the child as a task the verifier
/// knows, which its task storage needs.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork_btf(ctx: BtfTracePointContext) -> i32 {
    // sched_process_fork(parent, child)
    let child: *mut task_struct = ctx.arg(1);
    match try_sched_process_fork(child as u64) {
        Ok(Some(root)) => {
            // SAFETY: the tracepoint's child, a BTF pointer; a new process is its own leader.
            unsafe { mark_task(child, root) };
            0
        }
        Ok(None) => 0,
        Err(_) => 1,
    }
}

/// Marks the child (the `struct task_struct` at `child`) of a marked process; returns the root
/// of its tree when the child is a new process.
pub(crate) fn try_sched_process_fork(child: u64) -> Res<Option<u32>> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let Some(mark) = current_mark(tgid) else { return Ok(None) };
    let Some(config) = config() else { return Ok(None) };
    let Ok(child_tgid) = read::<u32>(child, config.offsets.task_struct_tgid) else {
        warn!(
            &(),
            "fork: reading the child's tgid failed (task_struct.tgid at offset {})", config.offsets.task_struct_tgid
        );
        return Err(-1);
    };
    if child_tgid == tgid {
        // A new thread, not a new process.
        return Ok(None);
    }
    let manager_root = mark.depth == 0 && mark.manager != NO_MANAGER;
    let parent_in_chain =
        if manager_root || mark.flags & mark_flag::ACTOR_CHAIN != 0 { mark_flag::PARENT_IN_CHAIN } else { 0 };
    let flags = (mark.flags & !mark_flag::PARENT_IN_CHAIN) | parent_in_chain;
    let child_mark = Mark { root_pid: mark.root_pid, depth: mark.depth + 1, manager: mark.manager, flags };
    if MARKS.insert(&child_tgid, &child_mark, 0).is_err() {
        count_unmarked(mark.root_pid);
        warn!(&(), "MARKS full ({} entries): child pid {} of pid {} not marked", MAX_MARKS, child_tgid, tgid);
    }
    let Some(mut entry) = reserve::<ForkEvent>(false, mark.root_pid, lost_kind::FORK) else {
        return Ok(Some(mark.root_pid));
    };
    let event = entry.as_mut_ptr();
    // SAFETY: event points to a reserved record of the right size.
    unsafe {
        fill_header(addr_of_mut!((*event).header), kind::FORK, size_of::<ForkEvent>(), pid_tgid, mark);
        (*event).child_pid = child_tgid;
        (*event).child_depth = child_mark.depth;
    }
    submit(entry, false);
    Ok(Some(mark.root_pid))
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(ctx: RawTracePointContext) -> i32 {
    match try_sched_process_exit(&ctx) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// Unmarks a marked process when its last thread exits, and reports its exit.
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
        // Read with a helper, not loaded: a raw tracepoint program that loads past its
        // tracepoint's arguments (one before 6.16) is refused at attach, whatever the branch.
        read::<u64>(ctx.as_ptr() as u64, 8)? & 0xff != 0
    } else {
        let live =
            read::<u64>(task, off.task_struct_signal).and_then(|signal| read::<i32>(signal, off.signal_struct_live));
        let Ok(live) = live else {
            warn!(
                &(),
                "exit: reading signal->live failed (task_struct.signal at {}, signal_struct.live at {})",
                off.task_struct_signal,
                off.signal_struct_live
            );
            return Err(-1);
        };
        live == 0
    };
    // Only the exit that removes the mark reports, so racing last threads report once.
    if !group_dead || MARKS.remove(&tgid).is_err() {
        return Ok(());
    }
    // What the process's records did not carry of its counted acts (see crate::repeats).
    let repeats = take_uncarried(tgid);
    let exit_code: u32 = read(task, off.task_struct_exit_code)?;
    let Some(mut entry) = reserve::<ExitEvent>(false, mark.root_pid, lost_kind::EXIT) else { return Ok(()) };
    let event = entry.as_mut_ptr();
    // SAFETY: event points to a reserved record of the right size.
    unsafe {
        fill_header(addr_of_mut!((*event).header), kind::EXIT, size_of::<ExitEvent>(), pid_tgid, mark);
        (*event).exit_code = exit_code;
        (*event).repeats = repeats;
    }
    submit(entry, false);
    Ok(())
}
