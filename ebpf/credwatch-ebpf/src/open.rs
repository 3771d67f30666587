//! File opens: `open`, `openat`, `openat2`, `creat` and `open_by_handle_at`.
//!
//! - At entry, what the process gave (dirfd, flags, mode, where the path string is) is kept in
//!   the thread's slot of `OPEN_SLOTS` (the fentry backend has an entry program only for the
//!   LSM deny, and reads the arguments at exit, see [`handle_open`]). At exit, for a successful
//!   open, the opened `struct file` is taken from the returned fd and its path walked (see
//!   [`crate::path`]): that path already accounts for symlinks, `..`, dirfds,
//!   `/proc/self/root` and bind mounts.
//! - Credential inodes: at the exit of every open of a marked process, the opened file's
//!   (s_dev, i_ino) is looked up in `CRED_INODES` (one more lookup, marked processes only), and
//!   on a hit its `i_generation` compared with the entry's (one more read, hits only), so that a
//!   file reusing a deleted credential file's inode number is not taken for it. A hit goes to
//!   `PRIORITY`, and under `--enforce` a `KILL` inode kills the process, as does any credential
//!   inode while the agent is away (see [`crate::enforce::failing_closed`]). The open has
//!   completed by then (an `O_TRUNC` has truncated), but nothing was read.

use core::{
    ffi::c_void,
    mem::size_of,
    ptr::{addr_of_mut, read_volatile, write_volatile},
};

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user, generated::bpf_probe_read_user_str},
    macros::tracepoint,
    programs::TracePointContext,
};
use aya_log_ebpf::warn;
use credwatch_common::{
    config_flag, cred_flag, kind, lost_kind, open_syscall, path_flag, record_flag, syscall_family, Config, CredInode,
    InodeKey, KernelOffsets, Mark, OpenEvent, MAX_GIVEN_PATH, MAX_OPEN_RECORD,
};

use crate::{
    enforce::{failing_closed, kill_current, spared},
    file::{fd_file, inode_key, opened_file},
    helpers::{config, current_mark, fill_header, launder, may_be_marked, output, read, taint, zero, Res},
    maps::{CRED_INODES, MAX_PENDING_OPENS, OPEN_SCRATCH, OPEN_SLOTS, OPEN_SLOT_COUNT, PENDING_OPENS},
    path::resolve_into,
    repeats::{check, unsend},
    syscall::{enter_args, exit_result, hooked_syscall, openat_args, AT_FDCWD},
    values::{OpenScratch, PendingOpen, RepeatKey},
};

/// `creat(path, mode)` is `open(path, O_CREAT | O_WRONLY | O_TRUNC, mode)`.
const CREAT_FLAGS: u64 = 0o100 | 0o1 | 0o1000;
/// The access-mode bits of open flags (read, write, both).
const O_ACCMODE: u64 = 3;
/// The result of a refused open: `-EPERM`.
const EPERM: i64 = 1;

/// `sys_enter_openat` and `sys_enter_openat2`, the opens nearly everything makes: their records
/// have four arguments, all loaded directly (see [`openat_args`]).
#[tracepoint]
pub fn openat_enter(ctx: TracePointContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    if current_mark((pid_tgid >> 32) as u32).is_none() {
        return 0;
    }
    let (nr, args) = openat_args(&ctx);
    handle_open_enter(pid_tgid, nr, &args);
    0
}

/// The other `sys_enter_*` of the open family (`open`, `creat`, `open_by_handle_at`).
#[tracepoint]
pub fn open_enter(ctx: TracePointContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    if current_mark((pid_tgid >> 32) as u32).is_none() {
        return 0;
    }
    let (nr, args) = enter_args(&ctx);
    handle_open_enter(pid_tgid, nr, &args);
    0
}

/// The entry of open-family syscall `nr` with arguments `args`, by a marked process: keeps what
/// its exit needs.
#[inline(always)]
pub(crate) fn handle_open_enter(pid_tgid: u64, nr: u32, args: &[u64; 6]) {
    if let Some(pending) = pending_open(nr, args) {
        let _ = save_open(pid_tgid as u32, &pending);
    }
}

/// What the open-family syscall `nr` was given in `args`: the dirfd, the flags, the mode and
/// where the path string is.
#[inline(always)]
fn pending_open(nr: u32, args: &[u64; 6]) -> Option<PendingOpen> {
    let syscall = hooked_syscall(nr, syscall_family::OPEN)?;
    let (dirfd, given_ptr, flags, mode) = match syscall {
        open_syscall::OPENAT | open_syscall::OPENAT2 => {
            let (flags, mode) = if syscall == open_syscall::OPENAT2 {
                // openat2(dfd, filename, struct open_how *how, usize): how = {flags, mode, resolve}.
                // SAFETY: user memory through the probe helper.
                unsafe {
                    (
                        bpf_probe_read_user(args[2] as *const u64).unwrap_or(0),
                        bpf_probe_read_user((args[2] + 8) as *const u64).unwrap_or(0),
                    )
                }
            } else {
                (args[2], args[3])
            };
            (args[0] as i32, args[1], flags, mode)
        }
        open_syscall::OPEN => (AT_FDCWD, args[0], args[1], args[2]),
        // open_by_handle_at(mount_fd, struct file_handle *, flags): no path at all.
        open_syscall::OPEN_BY_HANDLE_AT => (args[0] as i32, 0, args[2], 0),
        _ => (AT_FDCWD, args[0], CREAT_FLAGS, args[1]),
    };
    Some(PendingOpen { syscall, dirfd, flags, mode, given_ptr })
}

/// The exit of open-family syscall `nr` by a marked process, with its arguments `args` (still in
/// the saved registers) and its result `ret`: the fentry backend's fexit, which has no entry
/// program unless the LSM deny needs one (see [`deny_open`]), so that unmarked opens pay for one
/// program. What an entry saved is used when there is one; an open that [`deny_open`] refused
/// and reported is not reported again.
#[inline(always)]
pub(crate) fn handle_open(pid_tgid: u64, mark: Mark, nr: u32, args: &[u64; 6], ret: i64) {
    let pending = match take_pending_open(pid_tgid as u32) {
        Some(seen) if seen.syscall == open_syscall::FILE_OPEN && ret == -EPERM => return,
        Some(entry) if entry.syscall != open_syscall::FILE_OPEN => Some(entry),
        _ => pending_open(nr, args),
    };
    if pending.is_some() {
        let _ = report_open(pid_tgid, mark, pending, nr, ret);
    }
}

/// Keeps what an open's entry saw for its exit: in the thread's slot, or in `PENDING_OPENS`
/// when another thread holds the slot.
#[inline(always)]
fn save_open(tid: u32, pending: &PendingOpen) -> Res<()> {
    if let Some(slot) = OPEN_SLOTS.get_ptr_mut(tid & (OPEN_SLOT_COUNT - 1)) {
        // SAFETY: a map value. Two threads whose ids share a slot entering at the same instant
        // can both find it free; the one overwritten is then reported by its file at exit
        // (NO_ENTRY), like any open whose entry was missed.
        unsafe {
            if (*slot).tid == 0 || (*slot).tid == tid {
                (*slot).open = *pending;
                (*slot).tid = tid;
                return Ok(());
            }
        }
    }
    PENDING_OPENS.insert(&tid, pending, 0).map_err(|e| {
        warn!(&(), "PENDING_OPENS full ({} entries): the entry of an open by tid {} is lost", MAX_PENDING_OPENS, tid);
        e as i64
    })
}

/// What the open's entry saved, from the thread's slot or else `PENDING_OPENS`; both are
/// freed.
#[inline(always)]
fn take_pending_open(tid: u32) -> Option<PendingOpen> {
    if let Some(slot) = OPEN_SLOTS.get_ptr_mut(tid & (OPEN_SLOT_COUNT - 1)) {
        // SAFETY: a map value; see save_open.
        unsafe {
            if (*slot).tid == tid {
                (*slot).tid = 0;
                return Some((*slot).open);
            }
        }
    }
    // SAFETY: copied out at once.
    let pending = unsafe { PENDING_OPENS.get(&tid).copied() }?;
    let _ = PENDING_OPENS.remove(&tid);
    Some(pending)
}

/// Every `sys_exit_*` of the open family.
#[tracepoint]
pub fn open_exit(ctx: TracePointContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    let (nr, ret) = exit_result(&ctx);
    handle_open_exit(pid_tgid, mark, nr, ret);
    0
}

/// The exit of open-family syscall `nr` with result `ret`, by a marked process: reports the
/// open with what its entry saw and the path of the file it opened.
#[inline(always)]
pub(crate) fn handle_open_exit(pid_tgid: u64, mark: Mark, nr: u32, ret: i64) {
    let pending = take_pending_open(pid_tgid as u32);
    let _ = report_open(pid_tgid, mark, pending, nr, ret);
}

#[inline(always)]
fn report_open(pid_tgid: u64, mark: Mark, pending: Option<PendingOpen>, nr: u32, ret: i64) -> Res<()> {
    let config = config().ok_or(-1i64)?;
    let off = &config.offsets;
    // SAFETY: kernel reads through probe helpers only.
    let file = if ret >= 0 { unsafe { fd_file(off, ret as u64) }.unwrap_or(0) } else { 0 };
    if ret >= 0 && file == 0 {
        warn!(
            &(),
            "open: fd {} has no file: task->files->fdt->fd[] read failed (task_struct.files at {}, files_struct.fdt at {}, fdtable.max_fds at {})",
            ret,
            off.task_struct_files,
            off.files_struct_fdt,
            off.fdtable_max_fds
        );
    }
    // Without its entry, an open is still reported when it opened something: by its file.
    let (pending, no_entry) = match pending {
        Some(pending) => (pending, 0),
        None if file != 0 => {
            let syscall = hooked_syscall(nr, syscall_family::OPEN).ok_or(-1i64)?;
            (unseen_open(off, file, syscall)?, record_flag::NO_ENTRY)
        }
        None => return Ok(()),
    };
    emit_open(config, pid_tgid, mark, pending, file, ret, no_entry)
}

/// What an open whose entry was not seen is known by: its file's flags.
#[inline(always)]
fn unseen_open(off: &KernelOffsets, file: u64, syscall: u32) -> Res<PendingOpen> {
    let flags: u32 = read(file, off.file_f_flags)?;
    Ok(PendingOpen { syscall, dirfd: AT_FDCWD, flags: flags as u64, mode: 0, given_ptr: 0 })
}

/// The BPF LSM `file_open` hook's decision (see [`crate::lsm`]), for a marked process opening
/// `file`: under `--enforce`, a `KILL` credential inode that [`spared`] does not spare, or any
/// credential inode while failing closed, is refused (true), and reported as
/// [`record_flag::DENIED`] (and [`record_flag::FAIL_CLOSED`]) with what the open's entry saw
/// (with the LSM hooks, the fentry backend attaches the open family's entry program too), or,
/// for an open that no hooked syscall made (io_uring's `IORING_OP_OPENAT`), by the file's
/// flags. The thread's slot then holds the file's open (`FILE_OPEN`) for the syscall's exit,
/// which finds it and a failed open and reports nothing more (after an io_uring open, the
/// thread's next open syscall replaces it).
#[inline(always)]
pub(crate) fn deny_open(pid_tgid: u64, mark: Mark, file: u64) -> bool {
    let Some(config) = config() else { return false };
    if config.flags & config_flag::ENFORCE == 0 {
        return false;
    }
    let off = &config.offsets;
    let Ok(inode) = read::<u64>(file, off.file_f_inode) else { return false };
    let Ok(key) = inode_key(off, inode) else { return false };
    let Some(cred) = cred_inode(off, inode, &key) else { return false };
    let denied = if cred.flags & cred_flag::KILL != 0 && !spared(config, mark) {
        record_flag::DENIED
    } else if failing_closed(config, mark) {
        record_flag::DENIED | record_flag::FAIL_CLOSED
    } else {
        return false;
    };
    let tid = pid_tgid as u32;
    let (pending, no_entry) = match take_pending_open(tid) {
        Some(entry) if entry.syscall != open_syscall::FILE_OPEN => (entry, 0),
        _ => match unseen_open(off, file, open_syscall::FILE_OPEN) {
            Ok(seen) => (seen, record_flag::NO_ENTRY),
            Err(_) => return true,
        },
    };
    let reported = PendingOpen { syscall: open_syscall::FILE_OPEN, dirfd: AT_FDCWD, flags: 0, mode: 0, given_ptr: 0 };
    let _ = save_open(tid, &reported);
    let _ = emit_open(config, pid_tgid, mark, pending, file, -EPERM, no_entry | denied);
    true
}

/// The `CRED_INODES` entry of the inode at `inode`, whose key is `key`. An entry with a
/// generation is that inode only while the inode has it: a file that got the number of a
/// deleted credential file (ext4, xfs and btrfs reuse numbers) has another.
#[inline(always)]
fn cred_inode(off: &KernelOffsets, inode: u64, key: &InodeKey) -> Option<CredInode> {
    // SAFETY: copied out at once.
    let cred = unsafe { CRED_INODES.get(key).copied() }?;
    if cred.flags & cred_flag::GENERATION != 0 && read::<u32>(inode, off.inode_i_generation) != Ok(cred.generation) {
        return None;
    }
    Some(cred)
}

/// Builds and sends the record of an open of `file` (0: none) with result `ret`, what its
/// entry saw in `pending` and `record_flags` (NO_ENTRY, DENIED) so far; kills the process
/// under `--enforce` when it opened a `KILL` credential inode, or any credential inode while
/// failing closed (but for a denied open).
#[inline(always)]
fn emit_open(
    config: &Config,
    pid_tgid: u64,
    mark: Mark,
    pending: PendingOpen,
    file: u64,
    ret: i64,
    record_flags: u32,
) -> Res<()> {
    let off = &config.offsets;
    let scratch = OPEN_SCRATCH.get_ptr_mut(0).ok_or(-1i64)?;
    let event = unsafe { addr_of_mut!((*scratch).event) };
    let mut record_flags = record_flags;
    // SAFETY: per-CPU scratch owned by this program run; kernel memory read through probe
    // helpers only. Everything known before the path walk goes into the record now and is read
    // back after it: values left in registers across the walk would make the verifier check it
    // once per combination of them.
    unsafe {
        (*event).syscall = pending.syscall;
        (*event).dirfd = pending.dirfd;
        (*event).flags = pending.flags;
        (*event).mode = pending.mode;
        (*event).ret = ret;
        zero(addr_of_mut!((*event).dev));
        zero(addr_of_mut!((*event).ino));
        zero(addr_of_mut!((*event).cred_index));
        zero(addr_of_mut!((*event).repeats));
        zero(addr_of_mut!((*scratch).at.vfsmount));
        zero(addr_of_mut!((*scratch).at.dentry));
        if let Ok(opened) = opened_file(off, file) {
            write_volatile(addr_of_mut!((*scratch).at.vfsmount), opened.at.vfsmount);
            write_volatile(addr_of_mut!((*scratch).at.dentry), opened.at.dentry);
            if let Ok(key) = inode_key(off, opened.inode) {
                (*event).dev = key.dev;
                (*event).ino = key.ino;
                if let Some(cred) = cred_inode(off, opened.inode, &key) {
                    record_flags |= record_flag::CRED_INODE;
                    (*event).cred_index = cred.index;
                    // Under `--enforce`, the tree's later connects are held for the agent's
                    // verdict.
                    taint(mark.root_pid);
                    // Killed before the syscall returns to user space: the fd exists, but the
                    // process never runs again to read it.
                    if config.flags & config_flag::ENFORCE != 0 && record_flags & record_flag::DENIED == 0 {
                        let by_rule = cred.flags & cred_flag::KILL != 0 && !spared(config, mark);
                        let closed = !by_rule && failing_closed(config, mark);
                        if (by_rule || closed) && kill_current() {
                            record_flags |= record_flag::BLOCKED;
                            if closed {
                                record_flags |= record_flag::FAIL_CLOSED;
                            }
                        }
                    }
                }
            }
        }
        write_volatile(addr_of_mut!((*event).record_flags), record_flags);
    }
    // Enforced above; an open of a file this process opened so less than a second ago is only
    // counted, before the walk and the ring (see crate::repeats).
    // SAFETY: as above.
    if let Some(repeat) = unsafe { repeat_key(scratch, (pid_tgid >> 32) as u32) } {
        let Some(carried) = check(&repeat, 0) else { return Ok(()) };
        // SAFETY: as above.
        unsafe { write_volatile(addr_of_mut!((*event).repeats), carried) };
    }
    // SAFETY: as above; user memory through probe helpers only; every write stays inside
    // `tail` (given <= MAX_GIVEN_PATH - 1 bytes, then at most MAX_RESOLVED_PATH).
    unsafe {
        let tail = addr_of_mut!((*scratch).tail) as *mut u8;
        // Read now rather than at entry: the syscall has faulted the string's page in. A
        // thread racing to rewrite it can change what is reported as given, not the resolved
        // path of what was opened.
        let n = bpf_probe_read_user_str(tail as *mut c_void, MAX_GIVEN_PATH as u32, pending.given_ptr as *const c_void);
        let given_len = if n > 0 { (n - 1) as usize & (MAX_GIVEN_PATH - 1) } else { 0 };
        write_volatile(addr_of_mut!((*event).given_len), given_len as u32);
        // Read back: the walk then starts from one pointer range (0 to MAX_GIVEN_PATH - 1), not
        // a second one for a constant 0 (half of open_exit's verification before).
        let given_len = read_volatile(addr_of_mut!((*event).given_len)) as usize & (MAX_GIVEN_PATH - 1);
        let path_len = addr_of_mut!((*event).path_len);
        let path_flags = addr_of_mut!((*event).path_flags);
        if read_volatile(addr_of_mut!((*scratch).at.dentry)) != 0 {
            resolve_into(off, &*addr_of_mut!((*scratch).at), tail.add(given_len), path_len, path_flags);
        } else {
            write_volatile(path_len, 0);
            write_volatile(path_flags, path_flag::UNRESOLVED);
        }
        let given_len = read_volatile(addr_of_mut!((*event).given_len)) as usize;
        let size = size_of::<OpenEvent>() + given_len + read_volatile(path_len) as usize;
        let size = launder(&mut (*scratch).slot, size as u64) as usize;
        if size > MAX_OPEN_RECORD {
            return Err(-1);
        }
        fill_header(addr_of_mut!((*event).header), kind::OPEN, size, pid_tgid, mark);
        let record_flags = read_volatile(addr_of_mut!((*event).record_flags));
        let acted = record_flag::BLOCKED | record_flag::DENIED | record_flag::FAIL_CLOSED;
        let priority = record_flags & (record_flag::CRED_INODE | acted) != 0;
        let lost_as = if priority { lost_kind::CREDENTIAL_OPEN } else { lost_kind::OPEN };
        let record = core::slice::from_raw_parts(scratch as *const u8, size);
        // The mark read back from the record, not held across the walk.
        let root = read_volatile(addr_of_mut!((*event).header.mark.root_pid));
        if !output(record, priority, root, lost_as) {
            if let Some(repeat) = repeat_key(scratch, read_volatile(addr_of_mut!((*event).header.pid))) {
                unsend(&repeat, read_volatile(addr_of_mut!((*event).repeats)));
            }
        }
    }
    Ok(())
}

/// What makes the open being built in `scratch` the same as another of process `tgid` (see
/// [`crate::repeats`]): its file and mount, access mode and enforcement. None without a file.
///
/// # Safety
/// `scratch` holds an open record being built.
#[inline(always)]
unsafe fn repeat_key(scratch: *mut OpenScratch, tgid: u32) -> Option<RepeatKey> {
    // SAFETY: the caller's record.
    unsafe {
        let event = addr_of_mut!((*scratch).event);
        let ino = read_volatile(addr_of_mut!((*event).ino));
        if ino == 0 {
            return None;
        }
        let enforced = record_flag::BLOCKED | record_flag::DENIED | record_flag::FAIL_CLOSED;
        Some(RepeatKey::open(
            tgid,
            read_volatile(addr_of_mut!((*event).dev)),
            ino,
            read_volatile(addr_of_mut!((*scratch).at.vfsmount)),
            read_volatile(addr_of_mut!((*event).flags)) & O_ACCMODE,
            read_volatile(addr_of_mut!((*event).record_flags)) & enforced,
        ))
    }
}
