//! Syscall tracepoint records, read once by each program and handed to its family's logic as
//! plain integers (the syscall number, its six arguments, its result), so that other hooks on
//! the same syscalls can call the same functions.

use core::{ffi::c_void, mem::size_of, mem::MaybeUninit};

use aya_ebpf::{helpers::generated::bpf_probe_read_kernel, programs::TracePointContext, EbpfContext};

use crate::maps::SYSCALLS;

pub(crate) const AT_FDCWD: i32 = -100;

/// Syscall tracepoint records: `__syscall_nr` is at offset 8, arguments start at 16, 8 bytes
/// each; the result of a `sys_exit_*` is at 16.
const TP_SYSCALL_NR: usize = 8;
const TP_ARG0: usize = 16;
const TP_ARG1: usize = 24;
const TP_ARG2: usize = 32;
const TP_ARG3: usize = 40;
const TP_RET: usize = 16;

/// A field of a syscall tracepoint's record, at a constant offset: tracepoint programs may
/// load from their record directly, which is cheaper than a probe-read helper call.
#[inline(always)]
fn field<T: Copy>(ctx: &TracePointContext, offset: usize) -> T {
    // SAFETY: callers pass the offsets of the syscall tracepoint format (TP_*), inside the
    // record and aligned for T.
    unsafe { (ctx.as_ptr().add(offset) as *const T).read() }
}

/// The syscall number and the six arguments of a `sys_enter_*` record. Arguments 0 and 1 are
/// loaded directly: every hooked syscall has at least two, and the kernel refuses to attach a
/// program that loads past a tracepoint's record. Arguments 2 to 5 come with one probe read:
/// BPF programs see a copy of the record with room for six arguments (`syscall_tp_t` in
/// kernel/trace/trace_syscalls.c), those past the syscall's own are left as they were, and its
/// users look only at the arguments their syscall has. Loading each argument at a constant
/// offset up front, rather than picking one per syscall after, is also what the verifier
/// requires (LLVM would otherwise select a pointer per branch and load through it).
#[inline(always)]
pub(crate) fn enter_args(ctx: &TracePointContext) -> (u32, [u64; 6]) {
    let mut later = MaybeUninit::<[u64; 4]>::uninit();
    // SAFETY: the helper checks the address (the offsets are inside the record's copy) and
    // zeroes the destination when it fails. Its result is not looked at: a branch on it would
    // give the verifier two states (zeros, or unknown values) to follow through everything
    // after.
    let later = unsafe {
        bpf_probe_read_kernel(
            later.as_mut_ptr() as *mut c_void,
            size_of::<[u64; 4]>() as u32,
            ctx.as_ptr().add(TP_ARG2),
        );
        later.assume_init()
    };
    (syscall_nr(ctx), [field(ctx, TP_ARG0), field(ctx, TP_ARG1), later[0], later[1], later[2], later[3]])
}

/// [`enter_args`] of `sys_enter_openat` and `sys_enter_openat2`, whose records have four
/// arguments, all loaded directly (arguments 4 and 5, which they do not have, are 0).
#[inline(always)]
pub(crate) fn openat_args(ctx: &TracePointContext) -> (u32, [u64; 6]) {
    (syscall_nr(ctx), [field(ctx, TP_ARG0), field(ctx, TP_ARG1), field(ctx, TP_ARG2), field(ctx, TP_ARG3), 0, 0])
}

/// The syscall number and the result of a `sys_exit_*` record.
#[inline(always)]
pub(crate) fn exit_result(ctx: &TracePointContext) -> (u32, i64) {
    (syscall_nr(ctx), field(ctx, TP_RET))
}

#[inline(always)]
fn syscall_nr(ctx: &TracePointContext) -> u32 {
    field::<i32>(ctx, TP_SYSCALL_NR) as u32
}

/// Which syscall of `family` syscall number `nr` is (per `SYSCALLS`).
#[inline(always)]
pub(crate) fn hooked_syscall(nr: u32, family: u32) -> Option<u32> {
    // An array the verifier inlines the lookup of; family 0 is an unhooked number.
    let hooked = SYSCALLS.get(nr).copied()?;
    (hooked.family == family).then_some(hooked.syscall)
}
