//! The kernel struct offsets the programs need, resolved from BTF (see
//! [`credwatch_common::KernelOffsets`]).

use credwatch_common::{KernelOffsets, FILE_WINDOW, PT_REGS_WINDOW};

use super::btf::{Btf, BtfError};

/// Resolves every field of [`KernelOffsets`]; the error names the struct and member missing.
pub fn kernel_offsets(btf: &Btf) -> Result<KernelOffsets, BtfError> {
    let m = |strukt: &str, member: &str| btf.member_offset(strukt, member);
    let offsets = KernelOffsets {
        task_struct_pid: m("task_struct", "pid")?,
        task_struct_tgid: m("task_struct", "tgid")?,
        task_struct_real_parent: m("task_struct", "real_parent")?,
        task_struct_mm: m("task_struct", "mm")?,
        task_struct_fs: m("task_struct", "fs")?,
        task_struct_files: m("task_struct", "files")?,
        task_struct_exit_code: m("task_struct", "exit_code")?,
        fs_struct_pwd: m("fs_struct", "pwd")?,
        fs_struct_root: m("fs_struct", "root")?,
        files_struct_fdt: m("files_struct", "fdt")?,
        fdtable_max_fds: m("fdtable", "max_fds")?,
        fdtable_fd: m("fdtable", "fd")?,
        file_f_path: m("file", "f_path")?,
        file_f_inode: m("file", "f_inode")?,
        path_mnt: m("path", "mnt")?,
        path_dentry: m("path", "dentry")?,
        dentry_d_parent: m("dentry", "d_parent")?,
        dentry_d_name: m("dentry", "d_name")?,
        qstr_len: m("qstr", "len")?,
        qstr_name: m("qstr", "name")?,
        inode_i_ino: m("inode", "i_ino")?,
        inode_i_sb: m("inode", "i_sb")?,
        inode_i_generation: m("inode", "i_generation")?,
        super_block_s_dev: m("super_block", "s_dev")?,
        mount_mnt: m("mount", "mnt")?,
        mount_mnt_parent: m("mount", "mnt_parent")?,
        mount_mnt_mountpoint: m("mount", "mnt_mountpoint")?,
        vfsmount_mnt_root: m("vfsmount", "mnt_root")?,
        mm_struct_arg_start: m("mm_struct", "arg_start")?,
        mm_struct_arg_end: m("mm_struct", "arg_end")?,
        mm_struct_env_start: m("mm_struct", "env_start")?,
        mm_struct_env_end: m("mm_struct", "env_end")?,
        mm_struct_exe_file: m("mm_struct", "exe_file")?,
        linux_binprm_filename: m("linux_binprm", "filename")?,
        task_struct_signal: m("task_struct", "signal")?,
        signal_struct_live: m("signal_struct", "live")?,
        // The prototype's first parameter is the context; (ctx, task, group_dead) since 6.16.
        exit_has_group_dead: u32::from(btf.proto_params("btf_trace_sched_process_exit")? >= 3),
        file_private_data: m("file", "private_data")?,
        pid_numbers: m("pid", "numbers")?,
        upid_nr: m("upid", "nr")?,
        file_f_flags: m("file", "f_flags")?,
        dentry_d_shortname: m("dentry", "d_shortname").or_else(|_| m("dentry", "d_iname"))?,
        socket_type: m("socket", "type")?,
        task_struct_cgroups: m("task_struct", "cgroups")?,
        css_set_subsys: m("css_set", "subsys")?,
        css_set_dfl_cgrp: m("css_set", "dfl_cgrp")?,
        cgroup_subsys_state_cgroup: m("cgroup_subsys_state", "cgroup")?,
        cgroup_kn: m("cgroup", "kn")?,
        // Renamed when it became RCU-protected (Linux 6.15).
        kernfs_node_parent: m("kernfs_node", "__parent").or_else(|_| m("kernfs_node", "parent"))?,
        kernfs_node_name: m("kernfs_node", "name")?,
        // Only the fentry backend reads them (see `syscall_regs`).
        ..KernelOffsets::default()
    };
    check_layout(&offsets)?;
    Ok(offsets)
}

/// Fills the `struct pt_regs` members the fentry backend's syscall hooks read their arguments
/// and syscall number from (x86_64: `__x64_sys_*` take the registers saved at syscall entry).
pub fn syscall_regs(btf: &Btf, offsets: &mut KernelOffsets) -> Result<(), BtfError> {
    let m = |member: &str| btf.member_offset("pt_regs", member);
    offsets.pt_regs_r10 = m("r10")?;
    offsets.pt_regs_r9 = m("r9")?;
    offsets.pt_regs_r8 = m("r8")?;
    offsets.pt_regs_dx = m("dx")?;
    offsets.pt_regs_si = m("si")?;
    offsets.pt_regs_di = m("di")?;
    offsets.pt_regs_orig_ax = m("orig_ax")?;
    check_regs(offsets)
}

/// The hooks read the argument registers and `orig_ax` with one read of [`PT_REGS_WINDOW`]
/// words from `r10`, and pick each by its word index.
fn check_regs(offsets: &KernelOffsets) -> Result<(), BtfError> {
    let start = offsets.pt_regs_r10;
    let members = [
        offsets.pt_regs_r9,
        offsets.pt_regs_r8,
        offsets.pt_regs_dx,
        offsets.pt_regs_si,
        offsets.pt_regs_di,
        offsets.pt_regs_orig_ax,
    ];
    let inside = |at: u32| at >= start && (at - start).is_multiple_of(8) && (at - start) / 8 < PT_REGS_WINDOW as u32;
    if !members.into_iter().all(inside) {
        return Err(BtfError::Layout(
            "struct pt_regs: the argument registers and orig_ax are not within PT_REGS_WINDOW words from r10",
        ));
    }
    Ok(())
}

/// The programs read neighbouring members in one read where the layout has put them side by
/// side for as long as the programs' oldest supported kernel (5.8): a dentry's parent, name
/// length and name pointer (`d_name`, a little-endian `struct qstr`: hash, len, name, right
/// after `d_parent`), then after `d_inode` its inline name; a path's mount and dentry; a file's inode and path (within
/// [`FILE_WINDOW`] words); a mount's parent, mountpoint and root (`mnt.mnt_root`); an fdtable's
/// size and array; an inode's super block and number (within four words); a kernfs node's
/// parent and name.
fn check_layout(offsets: &KernelOffsets) -> Result<(), BtfError> {
    if offsets.dentry_d_name != offsets.dentry_d_parent + 8 || offsets.qstr_len != 4 || offsets.qstr_name != 8 {
        return Err(BtfError::Layout("struct dentry: d_name (hash, len, name) does not follow d_parent"));
    }
    if offsets.dentry_d_shortname != offsets.dentry_d_name + 24 {
        return Err(BtfError::Layout("struct dentry: the inline name is not one word after d_name"));
    }
    if offsets.path_mnt != 0 || offsets.path_dentry != 8 {
        return Err(BtfError::Layout("struct path: not {mnt, dentry}"));
    }
    let (inode, path) = (offsets.file_f_inode, offsets.file_f_path);
    let start = inode.min(path);
    if (inode - start) % 8 != 0
        || (path - start) % 8 != 0
        || (inode + 8).max(path + 16) - start > FILE_WINDOW as u32 * 8
    {
        return Err(BtfError::Layout("struct file: f_inode and f_path are not within FILE_WINDOW words"));
    }
    let parent = offsets.mount_mnt_parent;
    if offsets.mount_mnt_mountpoint != parent + 8 || offsets.mount_mnt + offsets.vfsmount_mnt_root != parent + 16 {
        return Err(BtfError::Layout("struct mount: mnt_parent, mnt_mountpoint and mnt.mnt_root are not side by side"));
    }
    if offsets.fdtable_fd != offsets.fdtable_max_fds + 8 {
        return Err(BtfError::Layout("struct fdtable: fd does not follow max_fds"));
    }
    let ino_after_sb = offsets.inode_i_ino.wrapping_sub(offsets.inode_i_sb);
    if !(8..=24).contains(&ino_after_sb) || !ino_after_sb.is_multiple_of(8) {
        return Err(BtfError::Layout("struct inode: i_ino is not within the three words after i_sb"));
    }
    if offsets.kernfs_node_name != offsets.kernfs_node_parent + 8 {
        return Err(BtfError::Layout("struct kernfs_node: name does not follow parent"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_layouts_the_programs_cannot_read_at_once() {
        let standard = KernelOffsets {
            dentry_d_parent: 24,
            dentry_d_name: 32,
            dentry_d_shortname: 56,
            qstr_len: 4,
            qstr_name: 8,
            path_mnt: 0,
            path_dentry: 8,
            fdtable_max_fds: 0,
            fdtable_fd: 8,
            inode_i_sb: 40,
            inode_i_ino: 64,
            file_f_inode: 32,
            file_f_path: 64,
            mount_mnt_parent: 16,
            mount_mnt_mountpoint: 24,
            mount_mnt: 32,
            vfsmount_mnt_root: 0,
            kernfs_node_parent: 8,
            kernfs_node_name: 16,
            ..Default::default()
        };
        assert!(check_layout(&standard).is_ok());
        // Before Linux 6.12 f_path came first, right before f_inode.
        assert!(check_layout(&KernelOffsets { file_f_path: 16, file_f_inode: 32, ..standard }).is_ok());
        let broken = [
            KernelOffsets { dentry_d_name: 40, ..standard },
            KernelOffsets { qstr_len: 0, ..standard },
            KernelOffsets { dentry_d_shortname: 48, ..standard },
            KernelOffsets { path_dentry: 16, ..standard },
            KernelOffsets { path_mnt: 8, path_dentry: 16, ..standard },
            KernelOffsets { file_f_path: 72, ..standard },
            KernelOffsets { file_f_path: 68, ..standard },
            KernelOffsets { file_f_inode: 100, ..standard },
            KernelOffsets { mount_mnt_mountpoint: 32, ..standard },
            KernelOffsets { mount_mnt: 40, ..standard },
            KernelOffsets { fdtable_fd: 16, ..standard },
            KernelOffsets { inode_i_ino: 80, ..standard },
            KernelOffsets { inode_i_ino: 32, ..standard },
            KernelOffsets { inode_i_ino: 60, ..standard },
            KernelOffsets { kernfs_node_name: 32, ..standard },
        ];
        for offsets in broken {
            assert!(matches!(check_layout(&offsets), Err(BtfError::Layout(_))), "{offsets:?}");
        }
    }

    #[test]
    fn the_syscall_registers_must_be_one_read_from_r10() {
        // x86_64 since 4.17: r10, r9, r8, ax, cx, dx, si, di, orig_ax.
        let x86 = KernelOffsets {
            pt_regs_r10: 56,
            pt_regs_r9: 64,
            pt_regs_r8: 72,
            pt_regs_dx: 96,
            pt_regs_si: 104,
            pt_regs_di: 112,
            pt_regs_orig_ax: 120,
            ..KernelOffsets::default()
        };
        assert!(check_regs(&x86).is_ok());
        for broken in [
            KernelOffsets { pt_regs_orig_ax: 128, ..x86 },
            KernelOffsets { pt_regs_di: 48, ..x86 },
            KernelOffsets { pt_regs_si: 100, ..x86 },
        ] {
            assert!(matches!(check_regs(&broken), Err(BtfError::Layout(_))), "{broken:?}");
        }
    }

    #[test]
    fn resolves_every_offset_on_this_kernel() {
        let btf = Btf::from_sys_fs().expect("the test machine has /sys/kernel/btf/vmlinux");
        let offsets = kernel_offsets(&btf).unwrap();
        // mm_struct's arg_start sits in an anonymous struct on recent kernels; qstr's len in an
        // anonymous struct inside an anonymous union.
        assert_eq!(offsets.mm_struct_arg_end, offsets.mm_struct_arg_start + 8);
        assert_eq!(offsets.mm_struct_env_start, offsets.mm_struct_arg_end + 8);
        assert_eq!(offsets.qstr_len, 4);
        assert_eq!(offsets.qstr_name, 8);
        assert_eq!(offsets.path_dentry, offsets.path_mnt + 8);
        assert_ne!(offsets.task_struct_tgid, 0);
        assert_eq!(offsets.kernfs_node_name, offsets.kernfs_node_parent + 8);
        // The fentry backend's syscall functions and the registers they take.
        let mut offsets = offsets;
        syscall_regs(&btf, &mut offsets).unwrap();
        assert_eq!((offsets.pt_regs_di - offsets.pt_regs_si, offsets.pt_regs_orig_ax - offsets.pt_regs_di), (8, 8));
        assert!(btf.has_function("__x64_sys_openat") && btf.has_function("__x64_sys_renameat2"));
        assert!(!btf.has_function("__x64_sys_no_such_call"));
    }
}
