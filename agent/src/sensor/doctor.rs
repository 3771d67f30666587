//! `credwatch doctor`: what this kernel offers the sensor, probed rather than assumed.

use std::{fmt, fs, path::Path};

use aya::{
    maps::MapType,
    programs::{Lsm, LsmAttachType, ProgramType},
    sys::{is_map_supported, is_program_supported},
    util::KernelVersion,
    Btf as AyaBtf, EbpfLoader,
};

use super::{
    backend::{self, bpf_lsm_active, Backend, SensorOptions},
    btf::Btf,
    cgroups::Hierarchies,
    hooks::fentry_hooks,
    kernel_object,
    offsets::{kernel_offsets, syscall_regs},
    task_marks::Globals,
    Sensor, Unwatched, TRACEFS,
};

/// One probed feature: `Ok(true)` loads, `Ok(false)` does not, `Err` the probe itself failed.
pub type Probe = Result<bool, String>;

#[derive(Debug)]
pub struct DoctorReport {
    pub kernel_release: String,
    /// `/sys/kernel/btf/vmlinux` is there.
    pub btf: bool,
    /// Every kernel offset the programs need resolved from BTF, or the first that did not.
    pub offsets: Result<(), String>,
    /// The selected lockdown mode (`none`, `integrity`, `confidentiality`), when readable.
    pub lockdown: Option<String>,
    /// tracefs is mounted (the sensor mounts it when it is not).
    pub tracefs: bool,
    /// The cgroup hierarchies whose paths exec records carry, or why they are unknown.
    pub cgroups: Result<Hierarchies, String>,
    /// Program types and whether they load here.
    pub programs: Vec<(&'static str, Probe)>,
    pub ring_buffer: Probe,
    /// The fentry backend: its whole set really loaded (verified) and attached as start-up
    /// does with `--sensor auto`, or why not (then `auto` runs the tracepoints).
    pub fentry: Result<(), String>,
    /// The syscalls the fentry backend leaves out on this kernel, and why.
    pub unwatched: Vec<Unwatched>,
    /// `bpf` is an active LSM (with the fentry backend, `--enforce` refuses), or why unknown.
    pub bpf_lsm: Result<bool, String>,
    /// A BPF LSM program really loaded, or why not.
    pub lsm_program: Result<(), String>,
    /// The sensor `--sensor auto` picks (`None`: no live sensor can run).
    pub sensor: Option<&'static str>,
    pub reason: String,
}

/// An error with its causes (`bpf_prog_load failed: Operation not permitted`).
pub(super) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn probe_program(program_type: ProgramType) -> Probe {
    is_program_supported(program_type).map_err(|e| chain(&e))
}

/// The release as the kernel gives it (`6.1.0-28-amd64`); procfs only offers it parsed into
/// numbers, without the distribution's suffix.
fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_owned()).unwrap_or_else(|_| "unknown".into())
}

/// The bracketed entry of `/sys/kernel/security/lockdown` (`none [integrity] confidentiality`),
/// or, when securityfs is not mounted, a `lockdown=` on the kernel command line.
fn lockdown() -> Option<String> {
    const LOCKDOWN: &str = "/sys/kernel/security/lockdown";
    if !Path::new(LOCKDOWN).exists() {
        // Failure just leaves the command-line fallback below.
        backend::mount_securityfs();
    }
    if let Ok(text) = fs::read_to_string(LOCKDOWN) {
        let start = text.find('[')? + 1;
        let end = start + text[start..].find(']')?;
        return Some(text[start..end].to_owned());
    }
    // Not `procfs::cmdline()`: it splits at ' ' only, so a last `lockdown=integrity` would keep
    // the file's newline.
    let cmdline = fs::read_to_string("/proc/cmdline").ok()?;
    let mode = cmdline.split_whitespace().find_map(|word| word.strip_prefix("lockdown="))?;
    Some(format!("{mode} (from the kernel command line)"))
}

pub fn doctor() -> DoctorReport {
    let btf = Path::new("/sys/kernel/btf/vmlinux").is_file();
    let cgroups = Hierarchies::of_this_namespace().map_err(|e| format!("reading /proc/self/mountinfo: {e}"));
    // The v1 controller's index comes from BTF like the offsets.
    let offsets = Btf::from_sys_fs()
        .and_then(|btf| {
            kernel_offsets(&btf)?;
            cgroups.as_ref().map_or(Ok(0), |hierarchies| hierarchies.subsys_index(&btf))
        })
        .map(drop)
        .map_err(|e| e.to_string());
    let programs = vec![
        ("tracepoint", probe_program(ProgramType::TracePoint)),
        ("raw_tracepoint", probe_program(ProgramType::RawTracePoint)),
        ("tracing (fentry/fexit)", probe_program(ProgramType::Tracing)),
        ("lsm", probe_program(ProgramType::Lsm(LsmAttachType::Mac))),
    ];
    let ring_buffer = is_map_supported(MapType::RingBuf).map_err(|e| chain(&e));
    let loads = |name: &str| programs.iter().any(|(n, probe)| *n == name && matches!(probe, Ok(true)));
    let (fentry, unwatched, lsm_program) = probe_fentry();
    let bpf_lsm = bpf_lsm_active();
    let (sensor, reason) = if let Err(error) = kernel_object() {
        (None, error.to_string())
    } else if !btf {
        (None, "no kernel BTF, so the kernel struct offsets cannot be resolved".to_owned())
    } else if let Err(error) = &offsets {
        (None, format!("kernel BTF lacks what the programs need: {error}"))
    } else if !loads("raw_tracepoint") {
        (None, "raw_tracepoint programs (exec, fork, exit) do not load".to_owned())
    } else if !matches!(ring_buffer, Ok(true)) {
        (None, "BPF ring buffers are not supported".to_owned())
    } else if fentry.is_ok() {
        let deny = match (&bpf_lsm, &lsm_program) {
            (Ok(true), Ok(())) => "the BPF LSM is active: `--enforce` refuses with EPERM".to_owned(),
            (Ok(true), Err(why)) => {
                format!("the BPF LSM is active but its programs do not load ({why}): `--enforce` kills")
            }
            (Ok(false), _) => "`bpf` is not an active LSM (boot with lsm=...,bpf to refuse): `--enforce` kills".into(),
            (Err(why), _) => format!("the active LSMs are unknown ({why}): `--enforce` kills"),
        };
        let gaps = match unwatched.len() {
            0 => String::new(),
            n => format!("; {n} syscall(s) not watched (above)"),
        };
        let reason = format!(
            "fentry/fexit programs load on the syscall functions, so no syscall tracepoint slows other \
             processes; {deny}{gaps}"
        );
        (Some("fentry"), reason)
    } else if loads("tracepoint") {
        let why = fentry.as_ref().err().map_or("", String::as_str);
        let reason = format!(
            "the fentry backend does not load ({why}); tracepoint programs load, the ring buffer works and every \
             offset resolves from BTF"
        );
        (Some("tracepoints"), reason)
    } else {
        (None, "neither fentry nor tracepoint programs load".to_owned())
    };
    DoctorReport {
        kernel_release: kernel_release(),
        btf,
        offsets,
        lockdown: lockdown(),
        tracefs: Path::new(TRACEFS).join("events").is_dir(),
        cgroups,
        programs,
        ring_buffer,
        fentry,
        unwatched,
        bpf_lsm,
        lsm_program,
        sensor,
        reason,
    }
}

/// The fentry backend, probed the way `--sensor auto` starts (every program verified and
/// attached, then detached; nothing is marked, so they see nothing): `doctor` says what `auto`
/// picks by running it. With the BPF LSM active, its hooks load too, as under `--enforce`.
/// Also a BPF LSM program loaded alone on its hook, which says whether LSM programs load at
/// all, and the syscalls the fentry backend leaves out.
fn probe_fentry() -> (Result<(), String>, Vec<Unwatched>, Result<(), String>) {
    let btf = match Btf::from_sys_fs() {
        Ok(btf) => btf,
        Err(e) => return (Err(e.to_string()), Vec::new(), Err(e.to_string())),
    };
    let regs = kernel_offsets(&btf).and_then(|mut offsets| syscall_regs(&btf, &mut offsets));
    if let Err(e) = regs {
        let why = format!("struct pt_regs: {e}");
        return (Err(why.clone()), fentry_hooks(&btf).1, Err(why));
    }
    let options = SensorOptions { backend: Backend::Auto, enforce: true, ..SensorOptions::default() };
    let (fentry, unwatched) = match Sensor::start(&[], false, options) {
        Ok(sensor) if sensor.backend() == Backend::Fentry => (Ok(()), sensor.unwatched().to_vec()),
        Ok(sensor) => (Err(sensor.fallback().unwrap_or("not tried").to_owned()), fentry_hooks(&btf).1),
        Err(e) => (Err(chain(&e)), fentry_hooks(&btf).1),
    };
    let loaded = AyaBtf::from_sys_fs()
        .map_err(|e| chain(&e))
        // The programs as the sensor loads them: aya-log's default level would keep every log call.
        .and_then(|aya_btf| {
            let level = super::kernel_log::level_byte();
            let object = kernel_object().map_err(|e| chain(&e))?;
            let globals = Globals::resolve(KernelVersion::current().ok(), Some(&btf));
            let mut loader = EbpfLoader::new();
            loader.btf(None).override_global(aya_log::LEVEL, &level, true);
            let _stand_in = globals.prepare(&mut loader).map_err(|e| chain(&e))?;
            let loaded = loader.load(object).map_err(|e| chain(&e))?;
            Ok((aya_btf, loaded))
        });
    let (aya_btf, mut ebpf) = match loaded {
        Ok(loaded) => loaded,
        Err(why) => return (fentry, unwatched, Err(why)),
    };
    let lsm = (|| {
        let program: &mut Lsm = ebpf.program_mut("lsm_bpf").ok_or("no program lsm_bpf")?.try_into()?;
        program.load("bpf", &aya_btf)?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })()
    .map_err(|e| e.to_string());
    (fentry, unwatched, lsm)
}

fn yes_no(probe: &Probe) -> String {
    match probe {
        Ok(true) => "yes".into(),
        Ok(false) => "no".into(),
        // Lockdown or a missing hook makes the kernel refuse the probe outright.
        Err(error) => format!("no ({error})"),
    }
}

impl fmt::Display for DoctorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "kernel release:   {}", self.kernel_release)?;
        writeln!(f, "BTF (vmlinux):    {}", if self.btf { "yes" } else { "no" })?;
        match &self.offsets {
            Ok(()) => writeln!(f, "kernel offsets:   all resolved")?,
            Err(error) => writeln!(f, "kernel offsets:   {error}")?,
        }
        writeln!(
            f,
            "lockdown:         {}",
            self.lockdown.as_deref().unwrap_or("unknown (securityfs not mounted, no lockdown= on the command line)")
        )?;
        writeln!(f, "tracefs mounted:  {}", if self.tracefs { "yes" } else { "no (the sensor mounts it)" })?;
        match &self.cgroups {
            Ok(hierarchies) => writeln!(f, "cgroups read:     {hierarchies}")?,
            Err(error) => writeln!(f, "cgroups read:     unknown: {error}")?,
        }
        for (name, probe) in &self.programs {
            writeln!(f, "loads {name:<23} {}", yes_no(probe))?;
        }
        writeln!(f, "ring buffer:      {}", yes_no(&self.ring_buffer))?;
        match &self.fentry {
            Ok(()) => writeln!(f, "fentry backend:   loads")?,
            Err(why) => writeln!(f, "fentry backend:   does not load: {why}")?,
        }
        if self.fentry.is_ok() {
            for Unwatched { syscall, why } in &self.unwatched {
                writeln!(f, "fentry: not watched: {syscall}: {why}")?;
            }
        }
        match &self.bpf_lsm {
            Ok(active) => writeln!(f, "BPF LSM active:   {}", if *active { "yes" } else { "no" })?,
            Err(why) => writeln!(f, "BPF LSM active:   unknown: {why}")?,
        }
        match &self.lsm_program {
            Ok(()) => writeln!(f, "lsm program:      loads")?,
            Err(why) => writeln!(f, "lsm program:      does not load: {why}")?,
        }
        match self.sensor {
            Some(sensor) => writeln!(f, "sensor:           {sensor}: {}", self.reason),
            None => writeln!(f, "sensor:           none: {}", self.reason),
        }
    }
}
