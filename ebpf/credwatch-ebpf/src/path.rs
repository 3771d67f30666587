//! Paths from the kernel's point of view: the path of a kernel `struct path`, walked from its
//! dentry up through its mounts, leaf first (see [`ResolvedPath`]). Every walk is bounded
//! ([`MAX_PATH_COMPONENTS`], [`MAX_RESOLVED_PATH`]), and a path cut short is flagged
//! `TRUNCATED`.

use core::{
    ffi::c_void,
    ptr::{addr_of_mut, read_volatile, write_volatile},
};

use aya_ebpf::helpers::{bpf_get_current_task, generated::bpf_probe_read_kernel};
use aya_log_ebpf::warn;
use credwatch_common::{path_flag, KernelOffsets, ResolvedPath, MAX_PATH_COMPONENTS, MAX_RESOLVED_PATH};

use crate::{
    file::fd_file,
    helpers::{checked, read, Res},
    syscall::AT_FDCWD,
    values::Location,
};

/// A dentry name is at most NAME_MAX (255) bytes plus its NUL.
const NAME_SPACE: usize = 256;
/// Words of a dentry read per path component, from `d_parent`: parent, `d_name` (2), `d_inode`,
/// then the inline name's first [`INLINE_NAME`] bytes.
const DENTRY_WINDOW: usize = 8;
/// Names shorter than this (a power of two) are copied from the component's read (see
/// [`DENTRY_WINDOW`]).
const INLINE_NAME: usize = 32;

/// The location in the kernel `struct path` at `path`: one read (the agent checks the layout).
#[inline(always)]
fn location(off: &KernelOffsets, path: u64) -> Res<Location> {
    // A NULL fs_struct or file plus a small member offset: nothing to read.
    if path < 0x1000 {
        return Err(-1);
    }
    let [vfsmount, dentry]: [u64; 2] = read(path, off.path_mnt)?;
    Ok(Location { vfsmount, dentry })
}

/// Writes the path of the kernel `struct path` at `path` into `out`, leaf first (see
/// [`ResolvedPath`]).
#[inline(always)]
pub(crate) unsafe fn resolve_path(off: &KernelOffsets, path: u64, out: *mut ResolvedPath) {
    // SAFETY: out points into a record.
    unsafe {
        resolve_at(
            off,
            path,
            addr_of_mut!((*out).data) as *mut u8,
            addr_of_mut!((*out).len),
            addr_of_mut!((*out).flags),
        )
    }
}

/// [`resolve_into`] from the kernel `struct path` at `path`.
#[inline(always)]
pub(crate) unsafe fn resolve_at(off: &KernelOffsets, path: u64, data: *mut u8, len: *mut u32, flags: *mut u32) {
    // SAFETY: the pointers point into a record with that much room.
    unsafe {
        match location(off, path) {
            Ok(at) => resolve_into(off, &at, data, len, flags),
            Err(_) => {
                write_volatile(len, 0);
                write_volatile(flags, path_flag::UNRESOLVED);
            }
        }
    }
}

/// Writes the path of `at` into `data` (room for [`MAX_RESOLVED_PATH`] bytes), leaf first,
/// walking dentries up to each mount's root and crossing to the parent mount, up to the root of
/// the mount tree; its length into `len` and its [`path_flag`] bits into `flags`.
#[inline(never)]
pub(crate) unsafe fn resolve_into(off: &KernelOffsets, at: &Location, data: *mut u8, len: *mut u32, flags: *mut u32) {
    // SAFETY: the pointers point into a record with that much room.
    unsafe {
        write_volatile(len, 0);
        let result = match walk(off, *at, data, len) {
            Ok(result) => result,
            Err(_) => {
                write_volatile(len, 0);
                warn!(
                    &(),
                    "path walk failed: a dentry or mount read failed, or a name was empty or too long (dentry.d_parent at {}, mount.mnt_parent at {}, mount.mnt at {})",
                    off.dentry_d_parent,
                    off.mount_mnt_parent,
                    off.mount_mnt
                );
                path_flag::UNRESOLVED
            }
        };
        if result == path_flag::TRUNCATED {
            warn!(
                &(),
                "path walk cut short after {} bytes: over MAX_PATH_COMPONENTS ({}) components or MAX_RESOLVED_PATH ({}) bytes",
                read_volatile(len),
                MAX_PATH_COMPONENTS,
                MAX_RESOLVED_PATH
            );
        }
        write_volatile(flags, result);
    }
}

/// A mount's parent, the dentry it is mounted on, and its root dentry: `struct mount` has
/// `mnt_parent`, `mnt_mountpoint`, then the embedded `vfsmount` whose first member is
/// `mnt_root` (the agent checks): one read.
#[inline(always)]
fn mount_links(off: &KernelOffsets, mount: u64) -> Res<[u64; 3]> {
    read(mount, off.mount_mnt_parent)
}

/// The length so far lives in the record (`len_slot`), not in a register: read back from
/// memory it is an unknown scalar, so the verifier sees every iteration alike and prunes,
/// instead of following each possible length separately.
#[inline(always)]
unsafe fn walk(off: &KernelOffsets, at: Location, data: *mut u8, len_slot: *mut u32) -> Res<u32> {
    let mut dentry = at.dentry;
    if dentry == 0 || at.vfsmount == 0 {
        return Err(-1);
    }
    // struct mount embeds struct vfsmount: container_of.
    let mut mount = at.vfsmount - off.mount_mnt as u64;
    let [mut parent_mount, mut mountpoint, mut mount_root] = mount_links(off, mount)?;
    for _ in 0..MAX_PATH_COMPONENTS {
        if dentry == mount_root {
            if parent_mount == mount || parent_mount == 0 {
                return Ok(0);
            }
            dentry = mountpoint;
            mount = parent_mount;
            [parent_mount, mountpoint, mount_root] = mount_links(off, mount)?;
            continue;
        }
        // d_parent; d_name: hash and len (one u64), name; d_inode; the first words of the inline
        // name (the agent checks this layout).
        let link: [u64; DENTRY_WINDOW] = read(dentry, off.dentry_d_parent)?;
        let (parent, name_len, name) = (link[0], (link[1] >> 32) as usize, link[2]);
        if parent == dentry || parent == 0 {
            return Ok(0);
        }
        // SAFETY: len_slot points into the record.
        let len = unsafe { read_volatile(len_slot) } as usize;
        if len > MAX_RESOLVED_PATH - NAME_SPACE {
            return Ok(path_flag::TRUNCATED);
        }
        let len = checked(len);
        if name_len == 0 || name_len >= NAME_SPACE {
            return Err(-1);
        }
        // One test on a value derived from both conditions: a branch on `name_len` itself would
        // give the verifier two ranges of it to follow through the rest of the walk.
        let inline =
            (name ^ (dentry + off.dentry_d_shortname as u64)) | (name_len as u64 >> INLINE_NAME.trailing_zeros());
        if inline == 0 {
            // A short name lives in the dentry, and the read above has it: stored as words,
            // without a helper call. Bytes past its length are overwritten by the separator and
            // the next component, or lie past the end of the record.
            // SAFETY: len <= MAX_RESOLVED_PATH - NAME_SPACE and INLINE_NAME < NAME_SPACE.
            unsafe {
                let to = data.add(len) as *mut u64;
                to.write_unaligned(link[4]);
                to.add(1).write_unaligned(link[5]);
                to.add(2).write_unaligned(link[6]);
                to.add(3).write_unaligned(link[7]);
            }
        } else {
            // A plain copy of the length the dentry gives, rather than a string read byte by
            // byte.
            // SAFETY: len <= MAX_RESOLVED_PATH - NAME_SPACE and name_len < NAME_SPACE, so the
            // name and its separator fit.
            let copied = unsafe {
                bpf_probe_read_kernel(
                    data.add(len) as *mut c_void,
                    (name_len & (NAME_SPACE - 1)) as u32,
                    name as *const c_void,
                )
            };
            if copied != 0 {
                return Err(-1);
            }
        }
        let end = len + (name_len & (NAME_SPACE - 1));
        // SAFETY: end < MAX_RESOLVED_PATH; len_slot as above.
        unsafe {
            *data.add(end) = b'/';
            write_volatile(len_slot, (end + 1) as u32);
        }
        dentry = parent;
    }
    Ok(path_flag::TRUNCATED)
}

/// Marks `out` as a path not resolved (empty).
#[inline(always)]
pub(crate) unsafe fn unresolved(out: *mut ResolvedPath) {
    // SAFETY: out points into a record.
    unsafe {
        (*out).len = 0;
        (*out).flags = path_flag::UNRESOLVED;
    }
}

/// The directory a relative path given with `dirfd` starts from: the dirfd's file, or the cwd.
#[inline(always)]
pub(crate) unsafe fn resolve_dir(off: &KernelOffsets, dirfd: i32, out: *mut ResolvedPath) {
    let path = if dirfd == AT_FDCWD {
        let task = unsafe { bpf_get_current_task() };
        read::<u64>(task, off.task_struct_fs).map(|fs| fs + off.fs_struct_pwd as u64)
    } else if dirfd >= 0 {
        // SAFETY: kernel reads through probe helpers only.
        unsafe { fd_file(off, dirfd as u64) }.map(|file| file + off.file_f_path as u64)
    } else {
        Err(-1)
    };
    // SAFETY: out points into a record.
    unsafe {
        match path {
            Ok(path) => resolve_path(off, path, out),
            Err(_) => unresolved(out),
        }
    }
}
