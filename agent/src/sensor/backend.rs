//! The two kernel backends and the fentry one's loading.
//!
//! - `tracepoint`: the syscall families on `syscalls:sys_enter_*`/`sys_exit_*` tracepoints.
//!   Loads wherever tracepoint programs do, and is the tested fallback; but a syscall
//!   tracepoint puts every task of the machine on the slow syscall path.
//! - `fentry`: the same family logic in fentry/fexit programs on the x86_64 syscall functions
//!   (`__x64_sys_openat`, ...), which cost only those functions; and, under `--enforce` where
//!   the BPF LSM is active, BPF LSM hooks that refuse with EPERM (see the kernel's `lsm.rs`).
//! - Both keep the raw tracepoints of exec, fork and exit (no syscall tracepoints, so they cost
//!   other syscalls nothing) and io_uring's submission tracepoint.
//!
//! A tracing program has one attach target: each family's program is loaded (verified) once
//! per syscall of the family, attached, its link kept, and unloaded for the next target (the
//! link holds the kernel's program). Loading is most of start-up; each thread takes the next
//! family, the costliest (the open exit, which walks paths) first.

use std::{fmt, fs, path::Path, sync::Mutex};

use aya::{
    programs::{links::FdLink, Program, ProgramError},
    Btf as AyaBtf, Ebpf,
};
use credwatch_common::{syscall_family, tamper_syscall};

use super::SensorError;

/// Which kernel programs the sensor runs (`--sensor`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// fentry where it loads, else tracepoints.
    #[default]
    Auto,
    Tracepoint,
    Fentry,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Auto => "auto",
            Backend::Tracepoint => "tracepoint",
            Backend::Fentry => "fentry",
        })
    }
}

/// How to start the sensor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SensorOptions {
    pub backend: Backend,
    /// `--enforce` at start: with the fentry backend where the BPF LSM is active, the LSM
    /// hooks that refuse are attached (without, a reload that turns `--enforce` on kills, as
    /// the tracepoint backend does).
    pub enforce: bool,
    /// `--map-size`: sizes of the kernel maps other than the object's (a fresh load only: an
    /// adopted pinned set keeps its own).
    pub map_sizes: super::MapSizes,
}

/// The fentry (entry) and fexit (exit) programs of a syscall family (see the kernel's
/// `fentry.rs`), with or without the LSM hooks: the open family runs from its exit alone (its
/// arguments are still in the saved registers, and every unmarked open pays for each program),
/// but the LSM deny's record needs what the entry saw; the net family reports at entry.
pub(super) fn family_programs(family: u32, lsm: bool) -> &'static [&'static str] {
    match family {
        syscall_family::OPEN if lsm => &["fentry_open", "fexit_open"],
        syscall_family::OPEN => &["fexit_open"],
        syscall_family::RENAME => &["fentry_rename", "fexit_rename"],
        syscall_family::NET => &["fentry_net"],
        _ => &["fentry_tamper", "fexit_tamper"],
    }
}

/// The x86_64 function of syscall `name`, an fentry program's target.
pub fn syscall_function(name: &str) -> String {
    format!("__x64_sys_{name}")
}

/// The BPF LSM programs: (program, hook, the tamper syscalls it refuses: `Config::lsm_syscalls`).
pub(super) const LSM_HOOKS: &[(&str, &str, u32)] = &[
    ("lsm_file_open", "file_open", 0),
    ("lsm_bpf", "bpf", 1 << tamper_syscall::BPF),
    (
        "lsm_task_kill",
        "task_kill",
        1 << tamper_syscall::KILL
            | 1 << tamper_syscall::TKILL
            | 1 << tamper_syscall::TGKILL
            | 1 << tamper_syscall::PIDFD_SEND_SIGNAL,
    ),
    (
        "lsm_ptrace_access_check",
        "ptrace_access_check",
        1 << tamper_syscall::PTRACE | 1 << tamper_syscall::PROCESS_VM_READV | 1 << tamper_syscall::PROCESS_VM_WRITEV,
    ),
    ("lsm_kernel_read_file", "kernel_read_file", 1 << tamper_syscall::FINIT_MODULE),
    ("lsm_kernel_load_data", "kernel_load_data", 1 << tamper_syscall::INIT_MODULE),
];

const LSM_LIST: &str = "/sys/kernel/security/lsm";

/// Whether `bpf` is among the active LSMs (`/sys/kernel/security/lsm`, mounting securityfs
/// when it is not), or why that is unknown. BPF LSM programs load without it, but never run.
pub fn bpf_lsm_active() -> Result<bool, String> {
    if !Path::new(LSM_LIST).exists() {
        // Failing leaves the error below.
        mount_securityfs();
    }
    let list = fs::read_to_string(LSM_LIST).map_err(|e| format!("reading {LSM_LIST}: {e}"))?;
    Ok(list.trim().split(',').any(|lsm| lsm == "bpf"))
}

/// Mounts securityfs at /sys/kernel/security, where some machines boot without it: as root
/// that is harmless, and the lockdown mode and the active LSMs are read there. A failure
/// (already mounted, no permission) leaves the callers' own fallbacks.
pub(super) fn mount_securityfs() {
    // SAFETY: mount(2) with valid NUL-terminated strings and no data.
    unsafe {
        libc::mount(
            c"securityfs".as_ptr(),
            c"/sys/kernel/security".as_ptr(),
            c"securityfs".as_ptr(),
            0,
            std::ptr::null(),
        );
    }
}

/// The program loaded first, alone (see [`load_tracing`]): it only reports what the syscall's
/// entry kept.
const PROBE: &str = "fexit_tamper";

/// One tracing program to load for each of its targets, or a tracepoint program to load
/// (attached later, by name) alongside them.
pub(super) struct Work {
    pub program: &'static str,
    /// Kernel functions (fentry, fexit) or the LSM hook; none for a tracepoint program.
    pub targets: Vec<String>,
}

/// A link of a tracing program, named for its pin (`fentry___x64_sys_openat`, `lsm_bpf`).
pub(super) type NamedLink = (String, FdLink);

/// Loads and attaches each program of `work` once per target (a tracepoint program: loads it),
/// on one thread per core; stops at the first failure, whose links are then dropped (detached).
pub(super) fn load_tracing(ebpf: &mut Ebpf, work: Vec<Work>, btf: &AyaBtf) -> Result<Vec<NamedLink>, SensorError> {
    let mut by_name: std::collections::HashMap<&str, &mut Program> = ebpf.programs_mut().collect();
    let mut queue = Vec::with_capacity(work.len());
    for item in work {
        let name = item.program;
        let program = by_name.remove(name).ok_or(SensorError::Missing { what: "program", name })?;
        queue.push((item, program));
    }
    // The probe: the cheapest program to verify, on its first target, before the others start;
    // where fentry cannot load this is the error, the same each time.
    let mut probed = Vec::new();
    if let Some((item, program)) = queue.iter_mut().find(|(item, _)| item.program == PROBE) {
        let target = item.targets.remove(0);
        match attach_one(program, &target, btf) {
            Ok(link) => probed.push(link),
            Err(source) => return Err(SensorError::Tracing { name: PROBE, target, source }),
        }
    }
    let queue = Mutex::new(queue.into_iter());
    let failed = std::sync::atomic::AtomicBool::new(false);
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    std::thread::scope(|scope| {
        let loaders: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut links = Vec::new();
                    loop {
                        if failed.load(std::sync::atomic::Ordering::Relaxed) {
                            return Ok(links);
                        }
                        let Some((item, program)) = queue.lock().unwrap_or_else(|e| e.into_inner()).next() else {
                            return Ok(links);
                        };
                        if item.targets.is_empty() {
                            let name = item.program;
                            if let Err(source) = load_tracepoint(program) {
                                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                                return Err(SensorError::Program { name, source });
                            }
                        }
                        for target in &item.targets {
                            match attach_one(program, target, btf) {
                                Ok(link) => links.push(link),
                                Err(source) => {
                                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                                    let name = item.program;
                                    return Err(SensorError::Tracing { name, target: target.clone(), source });
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        let mut all = probed;
        let mut error = None;
        for loader in loaders {
            match loader.join().unwrap_or(Err(SensorError::LoaderPanicked)) {
                Ok(links) => all.extend(links),
                Err(e) => error = error.or(Some(e)),
            }
        }
        match error {
            Some(error) => Err(error),
            None => Ok(all),
        }
    })
}

/// Loads a tracepoint or raw tracepoint program (attached by the caller).
fn load_tracepoint(program: &mut Program) -> Result<(), ProgramError> {
    match program {
        Program::TracePoint(program) => program.load(),
        Program::RawTracePoint(program) => program.load(),
        _ => Err(ProgramError::UnexpectedProgramType),
    }
}

/// Loads `program` for `target`, attaches it and keeps the link; unloads the program, so that
/// it can be loaded for the next target (the link holds the kernel's copy).
fn attach_one(program: &mut Program, target: &str, btf: &AyaBtf) -> Result<NamedLink, ProgramError> {
    let (kind, link) = match program {
        Program::FEntry(program) => {
            program.load(target, btf)?;
            let id = program.attach()?;
            let link = FdLink::from(program.take_link(id)?);
            program.unload()?;
            ("fentry", link)
        }
        Program::FExit(program) => {
            program.load(target, btf)?;
            let id = program.attach()?;
            let link = FdLink::from(program.take_link(id)?);
            program.unload()?;
            ("fexit", link)
        }
        Program::Lsm(program) => {
            program.load(target, btf)?;
            let id = program.attach()?;
            let link = FdLink::from(program.take_link(id)?);
            program.unload()?;
            ("lsm", link)
        }
        _ => return Err(ProgramError::UnexpectedProgramType),
    };
    Ok((format!("{kind}_{target}"), link))
}

/// The backend of the set pinned in `dir`, by its links' names (see [`load_tracing`]), and
/// whether it has LSM hooks.
pub(super) fn pinned_backend(dir: &Path) -> (Backend, bool) {
    let names: Vec<String> = fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    let fentry = names.iter().any(|n| n.starts_with("link_fentry_") || n.starts_with("link_fexit_"));
    let lsm = names.iter().any(|n| n.starts_with("link_lsm_"));
    (if fentry { Backend::Fentry } else { Backend::Tracepoint }, lsm)
}
