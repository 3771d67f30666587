//! Which programs serve which syscalls, for each backend: the syscall hooks and their
//! tracepoint programs, the fentry backend's work list, io_uring's tracepoint.

use std::path::Path;

use aya::{maps::Array, Ebpf};
use credwatch_common::{net_syscall, open_syscall, rename_syscall, syscall_family, tamper_syscall, HookedSyscall};

use super::{
    backend::{self, syscall_function},
    btf, map_err, SensorError, Unwatched, TRACEFS,
};

/// The raw tracepoints: program (function) name = tracepoint name.
pub(super) const RAW_TRACEPOINTS: &[&str] = &["sched_process_exec", "sched_process_fork", "sched_process_exit"];
/// Fork's BTF-typed tracepoint program, in place of its raw one where marks are also kept in
/// task storage (see [`super::task_marks`]): it gives the child's task storage its value.
pub(super) const FORK_BTF: &str = "sched_process_fork_btf";
pub(super) const FORK_TRACEPOINT: &str = "sched_process_fork";

/// The raw tracepoints loaded: all but fork's where `task_marks` puts [`FORK_BTF`] there.
pub(super) fn raw_tracepoints(task_marks: bool) -> Vec<&'static str> {
    RAW_TRACEPOINTS.iter().copied().filter(|&name| !(task_marks && name == FORK_TRACEPOINT)).collect()
}

/// A hooked syscall: its `syscalls:sys_enter_NAME` and `sys_exit_NAME` tracepoints run the
/// entry and exit programs of its family, which learn which syscall it is from `SYSCALLS`.
pub(super) struct SyscallHook {
    pub(super) name: &'static str,
    /// The architecture's number (`__syscall_nr` in the tracepoint records).
    pub(super) number: i64,
    /// One of [`syscall_family`], and the family's own number for it.
    pub(super) family: u32,
    pub(super) syscall: u32,
    /// Fail to start without it. The others exist only on some kernels: the module syscalls
    /// only with modules, io_uring only with io_uring.
    pub(super) required: bool,
}

/// The programs (entry, exit) that serve a hooked syscall: one pair per [`syscall_family`],
/// but for `openat` and `openat2`, whose entries have a program of their own (their records
/// have four arguments, which it loads directly). The net family reports at entry only.
pub(super) fn hook_programs(hook: &SyscallHook) -> (&'static str, Option<&'static str>) {
    match hook.family {
        syscall_family::OPEN if matches!(hook.syscall, open_syscall::OPENAT | open_syscall::OPENAT2) => {
            ("openat_enter", Some("open_exit"))
        }
        syscall_family::OPEN => ("open_enter", Some("open_exit")),
        syscall_family::RENAME => ("rename_enter", Some("rename_exit")),
        syscall_family::NET => ("net_enter", None),
        _ => ("tamper_enter", Some("tamper_exit")),
    }
}

/// Fills `SYSCALLS`: which family and syscall each hooked syscall number is.
pub(super) fn fill_syscalls(ebpf: &mut Ebpf, hooks: &[SyscallHook]) -> Result<(), SensorError> {
    // Borrowed, not taken: a taken map is closed when dropped, and programs loaded after would
    // refer to a closed fd.
    let name = "SYSCALLS";
    let map = ebpf.map_mut(name).ok_or(SensorError::Missing { what: "map", name })?;
    let mut syscall_map: Array<_, HookedSyscall> = Array::try_from(map).map_err(map_err(name))?;
    for hook in hooks {
        let value = HookedSyscall { family: hook.family, syscall: hook.syscall };
        syscall_map.set(hook.number as u32, value, 0).map_err(map_err("SYSCALLS"))?;
    }
    Ok(())
}

/// The fentry backend's programs, each with its targets, the costliest to verify first (the
/// open exit walks a path); with `lsm`, the BPF LSM hooks too. Also the `Config::lsm_syscalls`
/// they refuse.
pub(super) fn fentry_work(hooks: &[SyscallHook], lsm: bool) -> (Vec<backend::Work>, u32) {
    let mut work: Vec<backend::Work> = Vec::new();
    let mut add = |program: &'static str, target: String| match work.iter_mut().find(|w| w.program == program) {
        Some(item) => item.targets.push(target),
        None => work.push(backend::Work { program, targets: vec![target] }),
    };
    for hook in hooks {
        for &program in backend::family_programs(hook.family, lsm) {
            add(program, syscall_function(hook.name));
        }
    }
    let mut lsm_syscalls = 0;
    if lsm {
        for &(program, hook, refuses) in backend::LSM_HOOKS {
            add(program, hook.to_owned());
            lsm_syscalls |= refuses;
        }
    }
    work.sort_by_key(|item| {
        std::cmp::Reverse(if item.program == "fexit_open" { usize::MAX } else { item.targets.len() })
    });
    (work, lsm_syscalls)
}

/// The syscalls the fentry backend hooks on this kernel (decided from its BTF, so that start-up
/// and `doctor` agree), and those it leaves out: a function the kernel lacks (a module syscall
/// without modules).
pub(super) fn fentry_hooks(btf: &btf::Btf) -> (Vec<SyscallHook>, Vec<Unwatched>) {
    let (hooks, missing): (Vec<SyscallHook>, _) =
        syscall_hooks().into_iter().partition(|hook| btf.has_function(&syscall_function(hook.name)));
    let unwatched = missing
        .into_iter()
        .map(|hook| Unwatched { syscall: hook.name, why: format!("the kernel has no {}", syscall_function(hook.name)) })
        .collect();
    (hooks, unwatched)
}

pub(super) fn syscall_hooks() -> Vec<SyscallHook> {
    use syscall_family::{NET, OPEN, RENAME, TAMPER};
    let hook = |name, number, family, syscall, required| SyscallHook { name, number, family, syscall, required };
    #[allow(unused_mut)]
    let mut hooks = vec![
        hook("openat", libc::SYS_openat, OPEN, open_syscall::OPENAT, true),
        hook("openat2", libc::SYS_openat2, OPEN, open_syscall::OPENAT2, true),
        hook("open_by_handle_at", libc::SYS_open_by_handle_at, OPEN, open_syscall::OPEN_BY_HANDLE_AT, true),
        hook("renameat2", libc::SYS_renameat2, RENAME, rename_syscall::RENAMEAT2, true),
        hook("linkat", libc::SYS_linkat, RENAME, rename_syscall::LINKAT, true),
        hook("symlinkat", libc::SYS_symlinkat, RENAME, rename_syscall::SYMLINKAT, true),
        hook("ptrace", libc::SYS_ptrace, TAMPER, tamper_syscall::PTRACE, true),
        hook("process_vm_readv", libc::SYS_process_vm_readv, TAMPER, tamper_syscall::PROCESS_VM_READV, true),
        hook("process_vm_writev", libc::SYS_process_vm_writev, TAMPER, tamper_syscall::PROCESS_VM_WRITEV, true),
        hook("bpf", libc::SYS_bpf, TAMPER, tamper_syscall::BPF, true),
        hook("init_module", libc::SYS_init_module, TAMPER, tamper_syscall::INIT_MODULE, false),
        hook("finit_module", libc::SYS_finit_module, TAMPER, tamper_syscall::FINIT_MODULE, false),
        hook("kill", libc::SYS_kill, TAMPER, tamper_syscall::KILL, true),
        hook("tkill", libc::SYS_tkill, TAMPER, tamper_syscall::TKILL, true),
        hook("tgkill", libc::SYS_tgkill, TAMPER, tamper_syscall::TGKILL, true),
        hook("pidfd_send_signal", libc::SYS_pidfd_send_signal, TAMPER, tamper_syscall::PIDFD_SEND_SIGNAL, true),
        hook("io_uring_setup", libc::SYS_io_uring_setup, TAMPER, tamper_syscall::IO_URING_SETUP, false),
        hook("connect", libc::SYS_connect, NET, net_syscall::CONNECT, true),
        hook("sendto", libc::SYS_sendto, NET, net_syscall::SENDTO, true),
        hook("sendmsg", libc::SYS_sendmsg, NET, net_syscall::SENDMSG, true),
        hook("sendmmsg", libc::SYS_sendmmsg, NET, net_syscall::SENDMMSG, true),
    ];
    // The legacy syscalls exist only on some architectures (not arm64).
    #[cfg(target_arch = "x86_64")]
    hooks.extend([
        hook("open", libc::SYS_open, OPEN, open_syscall::OPEN, true),
        hook("creat", libc::SYS_creat, OPEN, open_syscall::CREAT, true),
        hook("rename", libc::SYS_rename, RENAME, rename_syscall::RENAME, true),
        hook("renameat", libc::SYS_renameat, RENAME, rename_syscall::RENAMEAT, true),
        hook("link", libc::SYS_link, RENAME, rename_syscall::LINK, true),
        hook("symlink", libc::SYS_symlink, RENAME, rename_syscall::SYMLINK, true),
    ]);
    hooks
}

/// The programs the kernel takes longest to verify, costliest first (`verified_insns`): exec
/// walks two paths, the open exit one, the rename entry one or two.
pub(super) const COSTLIEST_TO_VERIFY: &[&str] = &["sched_process_exec", "open_exit", "rename_enter"];

/// io_uring requests pass no syscall tracepoint; present only on kernels with io_uring.
pub(super) const URING_PROGRAM: &str = "io_uring_submit_req";

/// The tracepoints the program attaches to, the first the kernel has: `io_uring_submit_sqe`
/// (5.5 to 6.1 at least: Debian's 6.1.176 has only it) was renamed `io_uring_submit_req` later;
/// both fire in the submitting task and carry the opcode, which the program reads at the format's offset.
pub(super) const URING_TRACEPOINTS: &[&str] = &["io_uring_submit_req", "io_uring_submit_sqe"];

/// The io_uring submission tracepoint of this kernel, if it has io_uring.
pub(super) fn uring_tracepoint() -> Option<&'static str> {
    URING_TRACEPOINTS.iter().copied().find(|name| Path::new(TRACEFS).join("events/io_uring").join(name).is_dir())
}

/// Where the record of io_uring's submission `tracepoint` keeps its opcode, per its tracefs format.
pub(super) fn uring_opcode_offset(tracepoint: &str) -> u32 {
    let format = std::fs::read_to_string(Path::new(TRACEFS).join("events/io_uring").join(tracepoint).join("format"))
        .unwrap_or_default();
    format
        .lines()
        .find(|line| line.contains(" opcode;"))
        .and_then(|line| line.split("offset:").nth(1))
        .and_then(|rest| rest.split(';').next())
        .and_then(|offset| offset.trim().parse().ok())
        .unwrap_or(0)
}
