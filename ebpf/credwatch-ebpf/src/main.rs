//! credwatch's kernel programs: process lineage (exec, fork, exit), file opens, renames and
//! links, tamper syscalls, io_uring submissions and network egress of the processes inside
//! package trees.
//!
//! - Every program starts with a lookup in `MARKS` ([`maps`]) and returns on a miss, so an
//!   unmarked process costs one lookup.
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
//! - Layers, each naming only those below it: `values` < `maps` < `helpers`, `syscall` <
//!   `file` < `path`, `repeats`, `enforce`, `roots`, `cgroup` < the hook families (`uring` uses
//!   `tamper`) < `fentry`,
//!   `lsm`.
//! - Verifier cost: values that would otherwise be followed one by one (a path's length, where
//!   a basename starts, map keys built byte by byte) go through memory, where the verifier
//!   keeps no per-value state, and are bounded again after (see [`helpers::launder`]).
#![no_std]
#![no_main]

mod cgroup;
mod enforce;
mod fentry;
mod file;
mod helpers;
mod lineage;
mod lsm;
mod maps;
mod net;
mod open;
mod path;
mod rename;
mod repeats;
mod roots;
mod syscall;
mod tamper;
mod uring;
mod values;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // A panic path that survives optimisation becomes an infinite loop, which the verifier
    // rejects at load time instead of it ever running.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
