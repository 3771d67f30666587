//! credwatch's kernel programs: process lineage (exec, fork, exit), file opens, renames and
//! links, tamper syscalls, io_uring submissions and network egress of the processes inside
//! package trees.
//!
//! - Every program starts with the mark of the current process (see Marks below) and returns
//!   without one, so an unmarked process costs one lookup.
//! - One module per hook family: [`lineage`] (exec, fork, exit; [`roots`] finds a manager at
//!   exec, [`cgroup`] walks its cgroups), [`open`], [`rename`], [`tamper`], [`uring`] and
//!   [`net`]. The syscall families' logic takes the syscall number and its arguments (and, at
//!   exit, its result) as plain integers; the tracepoint programs read them from their record
//!   ([`syscall`]), so that other hooks can call the same functions: the fentry backend's
//!   fentry/fexit programs on the syscall functions ([`fentry`]), and its BPF LSM hooks that
//!   refuse under `--enforce` ([`lsm`]).
//! - Shared: [`maps`] (every map and its limits), [`values`] (what the kernel-only maps hold:
//!   scratch room, what an entry saw for its exit, repeat keys), [`helpers`] (ring buffers,
//!   marks, probe reads, per-CPU scratch), [`repeats`] (repeated acts as counts), [`path`] (the
//!   dentry walk), [`file`] (fds, files, inodes), [`enforce`] (`--enforce`).
//! - Layers, each naming only those below it: `task_storage`, `values` < `maps` < `helpers`,
//!   `syscall` < `file` < `path`, `repeats`, `enforce`, `roots`, `cgroup` < the hook families
//!   (`uring` uses `tamper`) < `fentry`, `lsm`.
//! - Marks: `MARKS`, a hash by tgid, holds every mark. Where the kernel allows (5.12 and later,
//!   the agent's choice: [`maps::TASK_MARKS_ON`]), a marked process's group leader also holds a
//!   value in `TASK_MARKS`, a task storage map ([`task_storage`]), and the syscall programs look
//!   there first ([`helpers::may_be_marked`]): an unmarked process returns after two loads from
//!   its task, without hashing its tgid.
//! - Verifier cost: values that would otherwise be followed one by one (a path's length, where
//!   a basename starts, map keys built byte by byte) go through memory, where the verifier
//!   keeps no per-value state, and are bounded again after (see [`helpers::launder`]).
// Only the bpf target is freestanding and has the programs: the host build (`cargo check
// --workspace`, clippy on a fresh clone) sees an empty binary.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod cgroup;
#[cfg(target_arch = "bpf")]
mod enforce;
#[cfg(target_arch = "bpf")]
mod fentry;
#[cfg(target_arch = "bpf")]
mod file;
#[cfg(target_arch = "bpf")]
mod helpers;
#[cfg(target_arch = "bpf")]
mod lineage;
#[cfg(target_arch = "bpf")]
mod lsm;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod net;
#[cfg(target_arch = "bpf")]
mod open;
#[cfg(target_arch = "bpf")]
mod path;
#[cfg(target_arch = "bpf")]
mod rename;
#[cfg(target_arch = "bpf")]
mod repeats;
#[cfg(target_arch = "bpf")]
mod roots;
#[cfg(target_arch = "bpf")]
mod syscall;
#[cfg(target_arch = "bpf")]
mod tamper;
#[cfg(target_arch = "bpf")]
mod task_storage;
#[cfg(target_arch = "bpf")]
mod uring;
#[cfg(target_arch = "bpf")]
mod values;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // A panic path that survives optimisation becomes an infinite loop, which the verifier
    // rejects at load time instead of it ever running.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";

#[cfg(not(target_arch = "bpf"))]
fn main() {}
