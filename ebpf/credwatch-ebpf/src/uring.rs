//! io_uring: requests never pass the syscall tracepoints, so each one a marked process submits is
//! reported (as a tamper-family record) with its opcode.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext};
use credwatch_common::{tamper_syscall, Mark};

use crate::{
    helpers::{config, current_mark, may_be_marked},
    tamper::emit_syscall,
};

/// `IORING_OP_OPENAT` and `IORING_OP_OPENAT2`: submissions that open files go to `PRIORITY`.
const IORING_OP_OPENAT: u8 = 18;
const IORING_OP_OPENAT2: u8 = 28;

/// io_uring requests never pass the syscall tracepoints (an `IORING_OP_OPENAT` opens a file
/// without `openat`): each request a marked process submits is reported with its opcode.
#[tracepoint(category = "io_uring", name = "io_uring_submit_req")]
pub fn io_uring_submit_req(ctx: TracePointContext) -> u32 {
    if !may_be_marked() {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mark) = current_mark((pid_tgid >> 32) as u32) else { return 0 };
    let Some(config) = config() else { return 0 };
    // SAFETY: the offset comes from this tracepoint's format.
    let Ok(opcode) = (unsafe { ctx.read_at::<u8>(config.uring_opcode_offset as usize) }) else { return 0 };
    handle_uring_submit(pid_tgid, mark, opcode);
    0
}

/// A marked process submitted an io_uring request with `opcode`: reported, opens to `PRIORITY`.
#[inline(always)]
pub(crate) fn handle_uring_submit(pid_tgid: u64, mark: Mark, opcode: u8) {
    let priority = opcode == IORING_OP_OPENAT || opcode == IORING_OP_OPENAT2;
    emit_syscall(pid_tgid, mark, tamper_syscall::IO_URING_SUBMIT_REQ, 0, 0, opcode as u64, 0, priority);
}
