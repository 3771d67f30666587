//! Renames and links: `rename`, `renameat`, `renameat2`, `link`, `linkat`, `symlink` and
//! `symlinkat`. The directory a relative path starts from (its dirfd's file or the cwd) is
//! resolved at entry; `..` and symlinks inside the relative part are not resolved.

use core::{ffi::c_void, mem::size_of, ptr::addr_of_mut};

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid,
        generated::{bpf_probe_read_kernel, bpf_probe_read_user_str},
    },
    macros::tracepoint,
    programs::TracePointContext,
};
use aya_log_ebpf::warn;
use credwatch_common::{kind, lost_kind, rename_syscall, syscall_family, Mark, RenameEvent, MAX_GIVEN_PATH};

use crate::{
    helpers::{config, current_mark, fill_header, may_be_marked, reserve, submit, Res},
    maps::{MAX_PENDING_RENAMES, PENDING_RENAMES, RENAME_SCRATCH},
    path::{resolve_dir, unresolved},
    syscall::{enter_args, exit_result, hooked_syscall, AT_FDCWD},
};

/// Every `sys_enter_*` of the rename family (renames, links, symlinks).
#[tracepoint]
pub fn rename_enter(ctx: TracePointContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    if current_mark((pid_tgid >> 32) as u32).is_none() {
        return 0;
    }
    let (nr, args) = enter_args(&ctx);
    handle_rename_enter(pid_tgid, nr, &args);
    0
}

/// The entry of rename-family syscall `nr` with arguments `args`, by a marked process.
#[inline(always)]
pub(crate) fn handle_rename_enter(pid_tgid: u64, nr: u32, args: &[u64; 6]) {
    if let Some(syscall) = hooked_syscall(nr, syscall_family::RENAME) {
        let _ = save_rename(args, syscall, pid_tgid as u32);
    }
}

/// Saves both paths as given and, for a relative one, the directory it starts from, resolved
/// now: at exit a dirfd may be closed or the cwd changed by another thread.
#[inline(always)]
fn save_rename(arg: &[u64; 6], syscall: u32, tid: u32) -> Res<()> {
    let config = config().ok_or(-1i64)?;
    let off = &config.offsets;
    let scratch = RENAME_SCRATCH.get_ptr_mut(0).ok_or(-1i64)?;
    let (old_dirfd, old, new_dirfd, new, flags) = match syscall {
        rename_syscall::RENAME | rename_syscall::LINK | rename_syscall::SYMLINK => {
            (AT_FDCWD, arg[0], AT_FDCWD, arg[1], 0)
        }
        // symlinkat(target, newdfd, linkpath)
        rename_syscall::SYMLINKAT => (AT_FDCWD, arg[0], arg[1] as i32, arg[2], 0),
        rename_syscall::RENAMEAT => (arg[0] as i32, arg[1], arg[2] as i32, arg[3], 0),
        // renameat2 and linkat: (olddfd, oldname, newdfd, newname, flags)
        _ => (arg[0] as i32, arg[1], arg[2] as i32, arg[3], arg[4] as u32),
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
        PENDING_RENAMES.insert(&tid, &*scratch, 0).map_err(|e| {
            warn!(&(), "PENDING_RENAMES full ({} entries): a rename by tid {} is lost", MAX_PENDING_RENAMES, tid);
            e as i64
        })
    }
}

/// Every `sys_exit_*` of the rename family.
#[tracepoint]
pub fn rename_exit(ctx: TracePointContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    let (_, ret) = exit_result(&ctx);
    handle_rename_exit(pid_tgid, mark, ret);
    0
}

/// The exit of a rename-family syscall with result `ret`, by a marked process: reports what its
/// entry saw.
#[inline(always)]
pub(crate) fn handle_rename_exit(pid_tgid: u64, mark: Mark, ret: i64) {
    let tid = pid_tgid as u32;
    let _ = report_rename(pid_tgid, mark, tid, ret);
    let _ = PENDING_RENAMES.remove(&tid);
}

#[inline(always)]
fn report_rename(pid_tgid: u64, mark: Mark, tid: u32, ret: i64) -> Res<()> {
    let Some(pending) = PENDING_RENAMES.get_ptr(&tid) else { return Ok(()) };
    let Some(mut entry) = reserve::<RenameEvent>(false, mark.root_pid, lost_kind::RENAME) else { return Ok(()) };
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
