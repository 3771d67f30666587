//! Files, fds and inodes of the current task, read through probe helpers with the offsets the
//! agent resolved from BTF.

use aya_ebpf::helpers::bpf_get_current_task;
use credwatch_common::{InodeKey, KernelOffsets, FILE_WINDOW};

use crate::{
    helpers::{read, Res},
    values::Location,
};

/// The `struct file` behind `fd` of the current task: task->files->fdt->fd[fd].
#[inline(always)]
pub(crate) unsafe fn fd_file(off: &KernelOffsets, fd: u64) -> Res<u64> {
    let task = unsafe { bpf_get_current_task() };
    let files: u64 = read(task, off.task_struct_files)?;
    let fdt: u64 = read(files, off.files_struct_fdt)?;
    // max_fds, then the fd array (the agent checks this layout): one read.
    let [max_fds, fd_array]: [u64; 2] = read(fdt, off.fdtable_max_fds)?;
    if fd >= max_fds & 0xffff_ffff {
        return Err(-1);
    }
    let file: u64 = read(fd_array + fd * 8, 0)?;
    if file == 0 {
        return Err(-1);
    }
    Ok(file)
}

/// An open file's inode and where it is.
pub(crate) struct OpenedFile {
    pub(crate) inode: u64,
    pub(crate) at: Location,
}

/// `f_inode` and `f_path` of the `struct file` at `file`: they lie within [`FILE_WINDOW`] words
/// of each other (the agent checks), so one read.
#[inline(always)]
pub(crate) fn opened_file(off: &KernelOffsets, file: u64) -> Res<OpenedFile> {
    if file == 0 {
        return Err(-1);
    }
    let start = off.file_f_inode.min(off.file_f_path);
    let words: [u64; FILE_WINDOW] = read(file, start)?;
    let path = (off.file_f_path - start) / 8;
    Ok(OpenedFile {
        inode: window_word(&words, (off.file_f_inode - start) / 8),
        at: Location { vfsmount: window_word(&words, path), dentry: window_word(&words, path + 1) },
    })
}

/// `words[index]`, by constant indexes that the verifier checks once each.
#[inline(always)]
fn window_word(words: &[u64; FILE_WINDOW], index: u32) -> u64 {
    match index {
        0 => words[0],
        1 => words[1],
        2 => words[2],
        3 => words[3],
        4 => words[4],
        _ => words[5],
    }
}

/// The (s_dev, i_ino) of an open file.
#[inline(always)]
pub(crate) fn file_key(off: &KernelOffsets, file: u64) -> Res<InodeKey> {
    inode_key(off, read(file, off.file_f_inode)?)
}

/// The (s_dev, i_ino) of the `struct inode` at `inode`.
#[inline(always)]
pub(crate) fn inode_key(off: &KernelOffsets, inode: u64) -> Res<InodeKey> {
    if inode == 0 {
        return Err(-1);
    }
    // i_sb and i_ino lie within four words of each other (the agent checks): one read.
    let words: [u64; 4] = read(inode, off.inode_i_sb)?;
    let ino = match (off.inode_i_ino - off.inode_i_sb) / 8 {
        1 => words[1],
        2 => words[2],
        _ => words[3],
    };
    Ok(InodeKey { dev: read::<u32>(words[0], off.super_block_s_dev)? as u64, ino })
}

/// The (dev, ino) of the current process's executable.
#[inline(always)]
pub(crate) fn exe_key(off: &KernelOffsets) -> Res<InodeKey> {
    let task = unsafe { bpf_get_current_task() };
    let mm: u64 = read(task, off.task_struct_mm)?;
    let exe: u64 = read(mm, off.mm_struct_exe_file)?;
    file_key(off, exe)
}
