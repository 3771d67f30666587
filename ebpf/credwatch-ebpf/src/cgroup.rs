//! Cgroups: an exec record carries the process's cgroup paths, walked up kernfs nodes from
//! `task->cgroups`: in the v1 hierarchy of the controller `Config::cgroup_subsys` names (its
//! `css_set->subsys[]` state's cgroup) and in the unified one (`dfl_cgrp`). The cgroup v2 id
//! alone names no v1 cgroup, and a process that exits within a millisecond is gone before
//! userspace could read `/proc/<pid>/cgroup`. A process that moves to another cgroup without
//! exec'ing keeps, for the agent, the paths of its last exec.

use core::{
    ffi::c_void,
    ptr::{read_volatile, write_volatile},
};

use aya_ebpf::helpers::generated::bpf_probe_read_kernel_str;
use aya_log_ebpf::warn;
use credwatch_common::{
    path_flag, KernelOffsets, MAX_CGROUP_DEPTH, MAX_CGROUP_NAME, MAX_CGROUP_PATH, NO_CGROUP_SUBSYS,
};

use crate::helpers::{checked, read, Res};

/// Controllers a `css_set` has room for (`CGROUP_SUBSYS_COUNT` is 14 to 16 on the supported
/// kernels): a bound on the index the agent passes.
const MAX_CGROUP_SUBSYS: u32 = 64;

/// The kernfs node of a process's cgroup (0: none to read), from its `css_set`: in the v1
/// hierarchy of controller `subsys` (its state's cgroup), or with [`NO_CGROUP_SUBSYS`] in the
/// unified hierarchy (`dfl_cgrp`).
#[inline(always)]
pub(crate) fn cgroup_node(off: &KernelOffsets, css_set: u64, subsys: u32) -> u64 {
    if css_set == 0 {
        return 0;
    }
    let cgroup: Res<u64> = if subsys == NO_CGROUP_SUBSYS {
        read(css_set, off.css_set_dfl_cgrp)
    } else if subsys < MAX_CGROUP_SUBSYS {
        read::<u64>(css_set, off.css_set_subsys + 8 * subsys).and_then(|css| read(css, off.cgroup_subsys_state_cgroup))
    } else {
        Err(-1)
    };
    match cgroup {
        Ok(cgroup) if cgroup != 0 => read(cgroup, off.cgroup_kn).unwrap_or(0),
        _ => 0,
    }
}

/// Writes the path of the cgroup whose kernfs node is `node` into `data` (room for
/// [`MAX_CGROUP_PATH`] bytes), leaf first like a [`credwatch_common::ResolvedPath`] (the root is the empty path);
/// its length into `len` and its [`path_flag`] bits into `flags` (`UNRESOLVED` for no node).
#[inline(never)]
pub(crate) unsafe fn cgroup_path(off: &KernelOffsets, node: u64, data: *mut u8, len: *mut u32, flags: *mut u32) {
    // SAFETY: the pointers point into a record with that much room.
    unsafe {
        write_volatile(len, 0);
        let result = match walk_cgroup(off, node, data, len) {
            Ok(result) => result,
            Err(_) => {
                write_volatile(len, 0);
                // No node to start from is no error (no such hierarchy).
                if node != 0 {
                    warn!(
                        &(),
                        "cgroup walk failed: a kernfs node read failed or a name was empty (kernfs_node.parent at {})",
                        off.kernfs_node_parent
                    );
                }
                path_flag::UNRESOLVED
            }
        };
        if result == path_flag::TRUNCATED {
            warn!(
                &(),
                "cgroup walk cut short after {} bytes: over MAX_CGROUP_DEPTH ({}) levels or MAX_CGROUP_PATH ({}) bytes",
                read_volatile(len),
                MAX_CGROUP_DEPTH,
                MAX_CGROUP_PATH
            );
        }
        write_volatile(flags, result);
    }
}

/// Walks kernfs nodes from `node` up to the hierarchy's root (the node without a parent, whose
/// name is not part of the path). The length lives in the record, as in `crate::path`.
#[inline(always)]
unsafe fn walk_cgroup(off: &KernelOffsets, mut node: u64, data: *mut u8, len_slot: *mut u32) -> Res<u32> {
    if node == 0 {
        return Err(-1);
    }
    for _ in 0..MAX_CGROUP_DEPTH {
        // parent, then name (the agent checks the layout): one read.
        let [parent, name]: [u64; 2] = read(node, off.kernfs_node_parent)?;
        if parent == 0 {
            return Ok(0);
        }
        // SAFETY: len_slot points into the record.
        let len = unsafe { read_volatile(len_slot) } as usize;
        if len > MAX_CGROUP_PATH - MAX_CGROUP_NAME {
            return Ok(path_flag::TRUNCATED);
        }
        let len = checked(len);
        // Names carry no length: a string read, at most MAX_CGROUP_NAME bytes with its NUL.
        // SAFETY: len <= MAX_CGROUP_PATH - MAX_CGROUP_NAME, so the name fits.
        let n = unsafe {
            bpf_probe_read_kernel_str(data.add(len) as *mut c_void, MAX_CGROUP_NAME as u32, name as *const c_void)
        };
        // Only the root has an empty name.
        if n <= 1 {
            return Err(-1);
        }
        let end = len + ((n as usize - 1) & (MAX_CGROUP_NAME - 1));
        // SAFETY: end < MAX_CGROUP_PATH; len_slot as above.
        unsafe {
            *data.add(end) = b'/';
            write_volatile(len_slot, (end + 1) as u32);
        }
        node = parent;
    }
    // As deep as the walk goes: complete only if this is the root.
    let parent: u64 = read(node, off.kernfs_node_parent)?;
    Ok(if parent == 0 { 0 } else { path_flag::TRUNCATED })
}
