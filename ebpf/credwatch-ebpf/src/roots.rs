//! Roots: whether an exec starts a package manager, so that the process is marked as the
//! root of a package tree. The exec'd file's basename is looked up in `MANAGERS`; for an
//! interpreter, the words after argv[0] in `MANAGER_MODULES` (`python -m pip`) or its script's
//! stem in `MANAGER_SCRIPTS` (`node .yarn/releases/yarn-4.5.3.cjs`).

use core::{ffi::c_void, ptr::write_volatile};

use aya_ebpf::helpers::{
    bpf_get_current_task,
    generated::{bpf_probe_read_kernel_str, bpf_probe_read_user, bpf_probe_read_user_str},
};
use credwatch_common::{manager_flag, KernelOffsets, MANAGER_NAME_LEN, MAX_GIVEN_PATH, MODULE_KEY_LEN};

use crate::{
    helpers::{launder, read, Res},
    maps::{MANAGERS, MANAGER_MODULES, MANAGER_SCRIPTS, SCRATCH},
    values::{Scratch, SCRATCH_ARGS, SCRATCH_NAME},
};

/// Bytes of argv examined to find the words after argv[0] for `MANAGER_MODULES`.
const MODULE_SCAN: usize = 256;
/// argv words after argv[0] looked at for an interpreter's script (options come first).
const SCRIPT_WORDS: usize = 8;
/// Longest basename of a script that is looked up in `MANAGER_SCRIPTS`.
const SCRIPT_BASE_MAX: usize = 48;

/// Where the basename of the `len`-byte path in `name` starts: after its last '/', scanning back
/// at most `MAX + 1` bytes (None: the basename is longer than `MAX`). One path through the loop
/// per iteration keeps the verifier's work linear.
#[inline(always)]
fn basename_start<const MAX: usize>(name: &[u8; SCRATCH_NAME + MANAGER_NAME_LEN], len: usize) -> Option<usize> {
    for i in 1..=MAX + 1 {
        if i > len {
            return Some(0);
        }
        if name[(len - i) & (SCRATCH_NAME - 1)] == b'/' {
            return Some(len - i + 1);
        }
    }
    None
}

/// Index of the manager whose exec this is, per `MANAGERS` and `MANAGER_MODULES`.
#[inline(never)]
pub(crate) fn manager_root(off: &KernelOffsets, bprm: u64) -> Res<Option<u32>> {
    let scratch = SCRATCH.get_ptr_mut(0).ok_or(-1i64)?;
    // SAFETY: per-CPU scratch owned by this program run.
    let scratch = unsafe { &mut *scratch };
    let filename: u64 = read(bprm, off.linux_binprm_filename)?;
    // SAFETY: the destination is MAX_GIVEN_PATH bytes of the scratch buffer.
    let n = unsafe {
        bpf_probe_read_kernel_str(
            scratch.name.as_mut_ptr() as *mut c_void,
            MAX_GIVEN_PATH as u32,
            filename as *const c_void,
        )
    };
    if n <= 1 {
        return Ok(None);
    }
    let len = (n as usize - 1) & (SCRATCH_NAME - 1);
    // A longer basename than a key is no manager's.
    let Some(start) = basename_start::<MANAGER_NAME_LEN>(&scratch.name, len) else { return Ok(None) };
    let start = launder(&mut scratch.slot, start as u64) as usize & (SCRATCH_NAME - 1);
    if start >= len || len - start > MANAGER_NAME_LEN {
        return Ok(None);
    }
    // Keys are built in the scratch map, not on the stack: the verifier tracks stack bytes one
    // by one (zero or not) and would follow every combination separately.
    for j in 0..MANAGER_NAME_LEN {
        let byte = if start + j < len { scratch.name[(start + j) & (SCRATCH_NAME - 1)] } else { 0 };
        scratch.name_key[j] = byte;
    }
    // SAFETY: copied out at once.
    let Some(value) = (unsafe { MANAGERS.get(&scratch.name_key).copied() }) else { return Ok(None) };
    if value.flags & (manager_flag::NEEDS_MODULE | manager_flag::NEEDS_SCRIPT) == 0 {
        return Ok(Some(value.manager));
    }
    interpreter_root(off, scratch, value.flags)
}

/// For an interpreter: the manager whose argv words after argv[0] (`-m pip`) start this argv
/// (`NEEDS_MODULE`), or whose script it runs (`NEEDS_SCRIPT`).
#[inline(always)]
fn interpreter_root(off: &KernelOffsets, scratch: &mut Scratch, flags: u32) -> Res<Option<u32>> {
    let task = unsafe { bpf_get_current_task() };
    let mm: u64 = read(task, off.task_struct_mm)?;
    let arg_start: u64 = read(mm, off.mm_struct_arg_start)?;
    let arg_end: u64 = read(mm, off.mm_struct_arg_end)?;
    let argv_len = arg_end.saturating_sub(arg_start) as usize;
    let mut len = argv_len;
    if len > MODULE_SCAN {
        len = MODULE_SCAN;
    }
    // Whatever lies past argv reads as zeros. Volatile, so that it stays a loop of stores and
    // does not become a call to memset.
    for i in 0..(MODULE_SCAN + MODULE_KEY_LEN) / 8 {
        // SAFETY: in bounds of args (MODULE_SCAN + MODULE_KEY_LEN <= its size), 8-byte chunks.
        unsafe { write_volatile(scratch.args.as_mut_ptr().add(i * 8) as *mut [u8; 8], [0; 8]) };
    }
    // SAFETY: len <= MODULE_SCAN <= SCRATCH_ARGS.
    if unsafe { bpf_probe_read_user(scratch.args.as_mut_ptr() as *mut c_void, len as u32, arg_start as *const c_void) }
        != 0
    {
        return Ok(None);
    }
    // argv[0] ends at its NUL; the string read says where without a loop over the bytes.
    // SAFETY: the destination is the first MODULE_SCAN bytes of the name buffer, free by now.
    let n = unsafe {
        bpf_probe_read_user_str(
            scratch.name.as_mut_ptr() as *mut c_void,
            MODULE_SCAN as u32,
            arg_start as *const c_void,
        )
    };
    let first = if n > 0 && n as usize <= len { n as usize } else { MODULE_SCAN };
    let first = launder(&mut scratch.slot, first as u64) as usize & (SCRATCH_ARGS - 1);
    // Try the key after each word: `-m\0`, `-m\0pip\0`, ...
    for j in 0..MODULE_KEY_LEN / 8 {
        // SAFETY: in bounds of module_key, 8-byte chunks; volatile as above.
        unsafe { write_volatile(scratch.module_key.as_mut_ptr().add(j * 8) as *mut [u8; 8], [0; 8]) };
    }
    if flags & manager_flag::NEEDS_MODULE != 0 {
        let mut previous = 1u8;
        for j in 0..MODULE_KEY_LEN {
            let byte = scratch.args[(first + j) & (SCRATCH_ARGS - 1)];
            scratch.module_key[j] = byte;
            if byte == 0 {
                if previous == 0 {
                    break;
                }
                // SAFETY: copied out at once.
                if let Some(manager) = unsafe { MANAGER_MODULES.get(&scratch.module_key).copied() } {
                    return Ok(Some(manager));
                }
            }
            previous = byte;
        }
    }
    if flags & manager_flag::NEEDS_SCRIPT == 0 {
        return Ok(None);
    }
    script_root(scratch, arg_start, argv_len, first)
}

/// The manager whose script stem is that of the first argv word after argv[0] (it starts at
/// `first`, argv is `len` bytes from `arg_start`) that does not start with `-`: its basename
/// up to the first `-` or `.` (see `MANAGER_SCRIPTS`). Each word is read with one string read
/// rather than scanned byte by byte: the verifier follows a byte loop per byte.
#[inline(never)]
fn script_root(scratch: &mut Scratch, arg_start: u64, len: usize, first: usize) -> Res<Option<u32>> {
    let mut offset = first;
    let mut word_len = 0usize;
    for _ in 0..SCRIPT_WORDS {
        // Only an address in user memory: no bound needed but argv's length.
        let at = launder(&mut scratch.slot, offset as u64) as usize;
        if at >= len {
            return Ok(None);
        }
        // SAFETY: the destination is MAX_GIVEN_PATH bytes of the name buffer.
        let n = unsafe {
            bpf_probe_read_user_str(
                scratch.name.as_mut_ptr() as *mut c_void,
                MAX_GIVEN_PATH as u32,
                (arg_start + at as u64) as *const c_void,
            )
        };
        // An empty word, or one too long to hold its basename, ends the search.
        if n <= 1 || n as usize >= MAX_GIVEN_PATH {
            return Ok(None);
        }
        if scratch.name[0] != b'-' {
            word_len = n as usize - 1;
            break;
        }
        offset = at + n as usize;
    }
    if word_len == 0 {
        return Ok(None);
    }
    let len = launder(&mut scratch.slot, word_len as u64) as usize & (SCRATCH_NAME - 1);
    // Only as far back as a script's basename that is looked up can reach.
    let Some(start) = basename_start::<SCRIPT_BASE_MAX>(&scratch.name, len) else { return Ok(None) };
    let start = launder(&mut scratch.slot, start as u64) as usize & (SCRATCH_NAME - 1);
    // The stem, NUL-padded (the word's NUL ends it too); one longer than a key is no manager's.
    let mut ended = false;
    for k in 0..MANAGER_NAME_LEN {
        let byte = scratch.name[(start + k) & (SCRATCH_NAME - 1)];
        if byte == 0 || byte == b'-' || byte == b'.' {
            ended = true;
        }
        scratch.name_key[k] = if ended { 0 } else { byte };
    }
    let next = scratch.name[(start + MANAGER_NAME_LEN) & (SCRATCH_NAME - 1)];
    if !ended && next != 0 && next != b'-' && next != b'.' {
        return Ok(None);
    }
    // SAFETY: copied out at once.
    let Some(manager) = (unsafe { MANAGER_SCRIPTS.get(&scratch.name_key).copied() }) else { return Ok(None) };
    Ok(Some(manager))
}
