//! Section 1: the cost of a syscall under each configuration, from tight loops (xtask/bench/loop.c):
//! open+close of a temp file (the hooked syscall) and getppid (a syscall no hook is about, which
//! still pays for any syscall tracepoint being enabled).

use std::{
    ffi::CString,
    fs,
    mem::size_of,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::{
    fmt, median, ns_per_op, parse_summary, pin_dir, start_watch, timed_with_own_cpu, Background, Ctx, Section,
    CREDENTIAL_FILES,
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Config {
    Nothing,
    Floor,
    Watch,
    Marked,
    /// As `Marked`, with the kernel log on at its most verbose level (`--kernel-log debug`):
    /// against `Marked` (off), what the log calls cost when the verifier keeps them.
    MarkedKernelLog,
    Bpftrace,
    Auditd,
    Strace,
}

const CONFIGS: &[Config] = &[
    Config::Nothing,
    Config::Floor,
    Config::Watch,
    Config::Marked,
    Config::MarkedKernelLog,
    Config::Bpftrace,
    Config::Auditd,
    Config::Strace,
];

impl Config {
    fn label(self) -> &'static str {
        match self {
            Config::Nothing => "(a) nothing attached",
            Config::Floor => "(b) empty programs on credwatch's hooks",
            Config::Watch => "(c) credwatch watch, loop not marked",
            Config::Marked => "(d) credwatch run -- loop (marked)",
            Config::MarkedKernelLog => "(d2) credwatch run --kernel-log debug -- loop (marked)",
            Config::Bpftrace => "(e) bpftrace, tree filter + path match",
            Config::Auditd => "(f) auditd, watch rules on credentials",
            Config::Strace => "(g) strace -f",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Config::Nothing => "a_nothing",
            Config::Floor => "b_floor",
            Config::Watch => "c_watch_unmarked",
            Config::Marked => "d_run_marked",
            Config::MarkedKernelLog => "d2_run_marked_kernel_log_debug",
            Config::Bpftrace => "e_bpftrace",
            Config::Auditd => "f_auditd",
            Config::Strace => "g_strace",
        }
    }
}

/// Where tracefs lists the tracepoints, one directory per category (floor.c reads ids there too).
const TRACEPOINTS: &str = "/sys/kernel/tracing/events";

/// The hooks a running `credwatch watch` has attached, as `tp:CATEGORY/NAME` and `raw:NAME` (what
/// floor.c takes), one per bpf link: read from the links themselves rather than from the eBPF
/// object, because one program may be attached to several tracepoints. `watch` pins every link
/// in its pin directory and closes its own fds (the pins keep them attached), so the links are
/// opened from there.
pub fn credwatch_hooks(ctx: &Ctx) -> Result<Vec<String>> {
    let (agent, _, _) = start_watch(ctx)?;
    let pid = agent.pid();
    let hooks = pinned_hooks(&pin_dir(), Path::new(TRACEPOINTS));
    agent.stop().context("stopping the agent whose hooks the floor copies")?;
    let hooks = hooks.with_context(|| format!("reading the hooks of `credwatch watch` (pid {pid})"))?;
    if hooks.is_empty() {
        bail!(
            "`credwatch watch` (pid {pid}) pinned no tracepoint or raw tracepoint link in {}: no hooks for the floor",
            pin_dir().display()
        );
    }
    Ok(hooks)
}

/// The hooks of the bpf links pinned in `dir` (its `link_*` entries), sorted (a hook attached
/// twice is listed twice).
fn pinned_hooks(dir: &Path, tracepoints: &Path) -> Result<Vec<String>> {
    let mut hooks = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if !path.file_name().is_some_and(|name| name.to_string_lossy().starts_with("link_")) {
            continue;
        }
        let link = open_pinned(&path)?;
        let fdinfo = format!("/proc/self/fdinfo/{}", link.as_raw_fd());
        let fdinfo = fs::read_to_string(&fdinfo).with_context(|| format!("reading {fdinfo}"))?;
        match link_hook(&fdinfo) {
            None => bail!("{} is not a bpf link", path.display()),
            Some(LinkHook::Raw(name)) => hooks.push(format!("raw:{name}")),
            Some(LinkHook::Tracepoint(name)) => {
                hooks.push(format!("tp:{}/{name}", tracepoint_category(tracepoints, &name)?));
            }
            Some(LinkHook::Other(kind)) => {
                bail!("{} is a bpf link of a kind floor.c cannot copy ({kind})", path.display())
            }
        }
    }
    hooks.sort();
    Ok(hooks)
}

/// An fd of the bpf object pinned at `path` (`BPF_OBJ_GET`; a pinned object cannot be
/// `open`ed). By hand: one syscall, where a bpf library would be a dependency of xtask's.
fn open_pinned(path: &Path) -> Result<OwnedFd> {
    const BPF_OBJ_GET: libc::c_long = 7;
    /// `union bpf_attr` as BPF_OBJ_GET reads it.
    #[repr(C)]
    struct ObjGet {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
    }
    let name = CString::new(path.as_os_str().as_bytes()).with_context(|| format!("{} has a NUL", path.display()))?;
    let attr = ObjGet { pathname: name.as_ptr() as u64, bpf_fd: 0, file_flags: 0 };
    // SAFETY: attr and the path it points to outlive the call; its size is passed.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_OBJ_GET, &attr as *const ObjGet, size_of::<ObjGet>()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("opening the pinned {}", path.display()));
    }
    // SAFETY: a new fd, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[derive(Debug, PartialEq, Eq)]
enum LinkHook {
    /// `link_type: perf`, `event_type: tracepoint`: a program on a tracepoint's perf event.
    Tracepoint(String),
    /// `link_type: raw_tracepoint`.
    Raw(String),
    /// Any other link, as `link_type` (and `event_type` for perf links).
    Other(String),
}

/// What an fd's /proc/PID/fdinfo text says it is attached to, if it is a bpf link.
fn link_hook(fdinfo: &str) -> Option<LinkHook> {
    let field = |key: &str| {
        fdinfo
            .lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let link_type = field("link_type")?;
    let name = field("tp_name").map(str::to_owned);
    match (link_type, field("event_type"), name) {
        ("perf", Some("tracepoint"), Some(name)) => Some(LinkHook::Tracepoint(name)),
        ("raw_tracepoint", _, Some(name)) => Some(LinkHook::Raw(name)),
        (link_type, event_type, _) => {
            Some(LinkHook::Other(event_type.map_or(link_type.to_owned(), |e| format!("{link_type}, {e}"))))
        }
    }
}

/// The category of tracepoint `name`: the directory of `tracepoints` that holds it.
fn tracepoint_category(tracepoints: &Path, name: &str) -> Result<String> {
    let mut categories = Vec::new();
    for entry in fs::read_dir(tracepoints).with_context(|| format!("listing {}", tracepoints.display()))? {
        let entry = entry?;
        if entry.path().join(name).is_dir() {
            categories.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    match categories.as_slice() {
        [category] => Ok(category.clone()),
        [] => bail!("no tracepoint `{name}` under {}", tracepoints.display()),
        _ => bail!(
            "tracepoint `{name}` is in several categories under {}: {}",
            tracepoints.display(),
            categories.join(", ")
        ),
    }
}

/// bpftrace doing what credwatch does on the same tracepoints: roots by manager exec, lineage by
/// fork, and for marked processes the path given to open matched against the credential paths.
pub fn bpftrace_script(home: &Path) -> String {
    let managers = ["npm", "npx", "yarn", "pnpm", "bun", "cargo", "pip", "pip3", "uv", "poetry"];
    let is_manager = managers.iter().map(|m| format!("comm == \"{m}\"")).collect::<Vec<_>>().join(" || ");
    let prefixes = [
        ".ssh/",
        ".aws/",
        ".kube/",
        ".azure/",
        ".docker/",
        ".config/gcloud/",
        ".cargo/credentials",
        ".npmrc",
        ".pypirc",
        ".git-credentials",
        ".netrc",
    ];
    let matches = prefixes
        .iter()
        .map(|p| {
            let full = format!("{}/{p}", home.display());
            format!("strncmp($p, \"{full}\", {}) == 0", full.len())
        })
        .collect::<Vec<_>>()
        .join(" || ");
    let mut script = String::from("BEGIN { printf(\"attached\\n\"); }\n");
    script += &format!("tracepoint:sched:sched_process_exec /@m[pid] == 0 && ({is_manager})/ {{ @m[pid] = 1; }}\n");
    script += "tracepoint:sched:sched_process_fork /@m[args->parent_pid]/ { @m[args->child_pid] = 1; }\n";
    script += "tracepoint:sched:sched_process_exit /@m[pid]/ { delete(@m[pid]); }\n";
    for (syscall, argument) in
        [("openat", "filename"), ("openat2", "filename"), ("open", "filename"), ("creat", "pathname")]
    {
        if !Path::new("/sys/kernel/tracing/events/syscalls").join(format!("sys_enter_{syscall}")).is_dir() {
            continue;
        }
        script +=
            &format!("tracepoint:syscalls:sys_enter_{syscall} /@m[pid]/ {{ @p[tid] = str(args->{argument}); }}\n");
        script += &format!(
            "tracepoint:syscalls:sys_exit_{syscall} /@m[pid]/ {{ $p = @p[tid]; if ({matches}) {{ printf(\"credential %d %s\\n\", pid, $p); }} delete(@p[tid]); }}\n"
        );
    }
    script += "END { clear(@m); clear(@p); }\n";
    script
}

/// bpftrace on `script`: output line-buffered (its readiness line is awaited through a pipe), and
/// strings cut at 40 bytes so that eleven path comparisons fit the 512-byte BPF stack (hence the
/// short fake HOME).
pub fn bpftrace_command(script: &Path) -> Command {
    let mut command = Command::new("bpftrace");
    command.args(["-B", "line"]).arg(script).env("BPFTRACE_STRLEN", "40");
    command
}

/// auditd with read watches on the credential files; restores the audit state on stop.
pub struct Audit {
    daemon: Option<Background>,
    was_enabled: String,
}

const AUDIT_KEY: &str = "credwatch-bench";

impl Audit {
    pub fn start(ctx: &Ctx) -> Result<Audit> {
        let status = auditctl(&["-s"])?;
        let field = |name: &str| {
            status.lines().find_map(|line| line.strip_prefix(name)).map(|v| v.trim().to_owned()).unwrap_or_default()
        };
        let was_enabled = field("enabled ");
        // An auditd already running keeps running; otherwise one is started for the bench.
        let daemon = if field("pid ") == "0" || field("pid ").is_empty() {
            let daemon = Background::start(Command::new("auditd").arg("-n"), libc::SIGTERM)?;
            let mut up = false;
            for _ in 0..200 {
                std::thread::sleep(Duration::from_millis(25));
                if auditctl(&["-s"])?.lines().any(|l| l.starts_with("pid ") && l.trim() != "pid 0") {
                    up = true;
                    break;
                }
            }
            if !up {
                bail!("auditd did not register with the kernel within 5 s");
            }
            Some(daemon)
        } else {
            None
        };
        let audit = Audit { daemon, was_enabled };
        auditctl(&["-e", "1"])?;
        for file in CREDENTIAL_FILES {
            let path = ctx.home.join(file);
            auditctl(&["-w", &path.to_string_lossy(), "-p", "r", "-k", AUDIT_KEY])?;
        }
        Ok(audit)
    }

    pub fn stop(mut self) -> Result<()> {
        self.clean_up();
        if let Some(daemon) = self.daemon.take() {
            daemon.stop()?;
        }
        Ok(())
    }

    fn clean_up(&mut self) {
        let _ = auditctl(&["-D", "-k", AUDIT_KEY]);
        if !self.was_enabled.is_empty() {
            let _ = auditctl(&["-e", &self.was_enabled]);
        }
        self.was_enabled.clear();
    }
}

impl Drop for Audit {
    fn drop(&mut self) {
        self.clean_up();
    }
}

fn auditctl(args: &[&str]) -> Result<String> {
    let output = Command::new("auditctl").args(args).stdin(Stdio::null()).output().context("running auditctl")?;
    if !output.status.success() {
        bail!("auditctl {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Whatever a configuration keeps running while its loops run.
enum Running {
    Nothing,
    Process(Background),
    Audit(Audit),
}

struct Sizes {
    open: u64,
    getppid: u64,
    strace_open: u64,
    strace_getppid: u64,
}

/// One configuration's figures in one round, ns per op.
#[derive(Clone, Copy)]
struct Sample {
    open_wall: f64,
    open_cpu: f64,
    getppid_wall: f64,
    getppid_cpu: f64,
}

/// What the agent did meanwhile, for (c) and (d).
#[derive(Default)]
struct AgentLoad {
    events: u64,
    lost: u64,
    cpu_s: f64,
    wall_s: f64,
}

/// Every configuration's samples (or why it could not be measured), and the agent's load under
/// (c) and under (d) and (d2).
struct Rounds {
    samples: Vec<Vec<Sample>>,
    errors: Vec<Option<String>>,
    watch_load: AgentLoad,
    marked_load: AgentLoad,
}

/// `rounds` rounds of every configuration, interleaved.
fn measure_rounds(ctx: &Ctx, rounds: usize, hooks: &[String], script: &Path, file: &Path, sizes: &Sizes) -> Rounds {
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); CONFIGS.len()];
    let mut errors: Vec<Option<String>> = CONFIGS
        .iter()
        .map(|config| match config {
            Config::Bpftrace => ctx.bpftrace.clone().err(),
            Config::Auditd => ctx.auditd.clone().err(),
            Config::Strace => ctx.strace.clone().err(),
            _ => None,
        })
        .collect();
    let mut watch_load = AgentLoad::default();
    let mut marked_load = AgentLoad::default();
    for round in 0..rounds {
        super::say(&format!("bench: syscalls: round {}/{rounds}", round + 1));
        for offset in 0..CONFIGS.len() {
            // Rotate the order so that no configuration always runs first or last.
            let index = (round + offset) % CONFIGS.len();
            let config = CONFIGS[index];
            if errors[index].is_some() {
                continue;
            }
            let load = match config {
                Config::Watch => &mut watch_load,
                _ => &mut marked_load,
            };
            match measure(ctx, config, hooks, script, file, sizes, load) {
                Ok(sample) => samples[index].push(sample),
                Err(error) => errors[index] = Some(format!("{error:#}")),
            }
        }
    }
    Rounds { samples, errors, watch_load, marked_load }
}

/// The issue's targets for the open loop's CPU per configuration (`open`).
fn check_targets(ctx: &mut Ctx, open: impl Fn(Config) -> f64) {
    let (floor, c, e, f, d) =
        (open(Config::Floor), open(Config::Watch), open(Config::Bpftrace), open(Config::Auditd), open(Config::Marked));
    let nothing = open(Config::Nothing);
    let finite = |v: f64| v.is_finite().then_some(v);
    ctx.target(
        "(c) over (b), open loop (CPU)",
        format!("{:+.1}% ({} vs {} ns)", (c / floor - 1.0) * 100.0, fmt(c, 0), fmt(floor, 0)),
        "≤ +10%",
        finite(c / floor).map(|r| r <= 1.10),
    );
    ctx.target(
        "(c) cheaper than (e) bpftrace and (f) auditd, open loop (CPU)",
        format!("{} vs {} / {} ns", fmt(c, 0), fmt(e, 0), fmt(f, 0)),
        "(c) < (e), (c) < (f)",
        finite(c).and_then(|c| Some(c < finite(e)? && c < finite(f)?)),
    );
    ctx.target(
        "(d) added per open, vs (a) (CPU)",
        format!("{} ns", fmt(d - nothing, 0)),
        "≤ 1500 ns",
        finite(d - nothing).map(|v| v <= 1500.0),
    );
}

pub fn run(ctx: &mut Ctx) -> Result<Section> {
    let sizes = if ctx.quick {
        Sizes { open: 200_000, getppid: 500_000, strace_open: 10_000, strace_getppid: 20_000 }
    } else {
        Sizes { open: 1_000_000, getppid: 2_000_000, strace_open: 50_000, strace_getppid: 100_000 }
    };
    let rounds = ctx.rounds(5);
    let hooks = credwatch_hooks(ctx)?;
    super::say(&format!("bench: syscalls: floor hooks (from credwatch watch): {}", hooks.join(" ")));
    let file = ctx.work.join("open-target");
    fs::write(&file, "harmless\n")?;
    let script = ctx.work.join("credwatch-equivalent.bt");
    fs::write(&script, bpftrace_script(&ctx.home))?;

    let Rounds { samples, errors, watch_load, marked_load } =
        measure_rounds(ctx, rounds, &hooks, &script, &file, &sizes);

    let column = |index: usize, pick: fn(&Sample) -> f64| median(&samples[index].iter().map(pick).collect::<Vec<_>>());
    let position = |config: Config| CONFIGS.iter().position(|c| *c == config).expect("listed");
    let (a, b) = (position(Config::Nothing), position(Config::Floor));
    let mut section = Section::new(
        "syscalls",
        "1. Syscall overhead (ns per op, median of rounds; CPU = the loop's own user+system time)",
        &[
            "configuration",
            "open+close CPU ns",
            "+ns vs (a)",
            "× (a)",
            "× (b)",
            "open+close wall ns",
            "wall × (a)",
            "getppid CPU ns",
            "× (a)",
            "× (b)",
            "getppid wall ns",
        ],
    );
    let mut figures = serde_json::Map::new();
    let open_cpu = |s: &Sample| s.open_cpu;
    let open_wall = |s: &Sample| s.open_wall;
    let getppid_cpu = |s: &Sample| s.getppid_cpu;
    let getppid_wall = |s: &Sample| s.getppid_wall;
    for (index, config) in CONFIGS.iter().enumerate() {
        let (oc, ow, gc, gw) = (
            column(index, open_cpu),
            column(index, open_wall),
            column(index, getppid_cpu),
            column(index, getppid_wall),
        );
        let row = match &errors[index] {
            Some(error) if samples[index].is_empty() => {
                let mut row = vec![config.label().to_owned(), format!("n/a: {}", one_line(error))];
                row.resize(11, String::new());
                row
            }
            _ => vec![
                config.label().to_owned(),
                fmt(oc, 0),
                fmt(oc - column(a, open_cpu), 0),
                fmt(oc / column(a, open_cpu), 2),
                fmt(oc / column(b, open_cpu), 2),
                fmt(ow, 0),
                fmt(ow / column(a, open_wall), 2),
                fmt(gc, 0),
                fmt(gc / column(a, getppid_cpu), 2),
                fmt(gc / column(b, getppid_cpu), 2),
                fmt(gw, 0),
            ],
        };
        section.rows.push(row);
        let rounds_of = |pick: fn(&Sample) -> f64| samples[index].iter().map(pick).collect::<Vec<_>>();
        figures.insert(
            config.key().to_owned(),
            json!({
                "open_close_cpu_ns": { "median": nan_null(oc), "rounds": rounds_of(open_cpu) },
                "open_close_wall_ns": { "median": nan_null(ow), "rounds": rounds_of(open_wall) },
                "getppid_cpu_ns": { "median": nan_null(gc), "rounds": rounds_of(getppid_cpu) },
                "getppid_wall_ns": { "median": nan_null(gw), "rounds": rounds_of(getppid_wall) },
                "open_cpu_ratio_to_a": nan_null(oc / column(a, open_cpu)),
                "open_cpu_ratio_to_b": nan_null(oc / column(b, open_cpu)),
                "open_wall_ratio_to_a": nan_null(ow / column(a, open_wall)),
                "open_wall_ratio_to_b": nan_null(ow / column(b, open_wall)),
                "getppid_cpu_ratio_to_a": nan_null(gc / column(a, getppid_cpu)),
                "getppid_cpu_ratio_to_b": nan_null(gc / column(b, getppid_cpu)),
                "getppid_wall_ratio_to_a": nan_null(gw / column(a, getppid_wall)),
                "error": errors[index],
            }),
        );
    }
    section.notes.push(format!(
        "Loops (xtask/bench/loop.c, gcc -O2): open+close of a temp file {} times, getppid {} times (under strace: {} and {}); {rounds} round(s), configurations interleaved, order rotated each round. CPU time is the loop's own (eBPF programs and audit run in its syscalls, so they count; what other processes on the 2 shared cores take does not); strace's cost is in the tracer and the stops, so read its wall column.",
        sizes.open, sizes.getppid, sizes.strace_open, sizes.strace_getppid
    ));
    section.notes.push(format!(
        "(b) is two instructions (`r0 = 0; exit`) loaded by xtask/bench/floor.c on exactly the hooks a running `credwatch watch` had attached (its bpf links, opened from its pin directory and read in /proc/self/fdinfo; one empty program per link): {}.",
        hooks.join(", ")
    ));
    section.notes.push(format!(
        "(c): meanwhile the agent received {} events from the machine's other package trees (colleagues' cargo builds are package trees to `watch`), {} lost, and used {:.1} s of CPU over {:.1} s.",
        watch_load.events, watch_load.lost, watch_load.cpu_s, watch_load.wall_s
    ));
    section.notes.push(format!(
        "(d): the agent received {} events and counted {} lost over its runs (the loop does not wait for the agent), using {:.1} s of CPU over {:.1} s.",
        marked_load.events, marked_load.lost, marked_load.cpu_s, marked_load.wall_s
    ));
    let (d, d2) = (position(Config::Marked), position(Config::MarkedKernelLog));
    let kernel_log_ratio = column(d2, open_cpu) / column(d, open_cpu);
    section.notes.push(format!(
        "(d2) against (d): a marked open with the kernel log at `debug` costs {} times one with it off (the default), in the same run. Off, the verifier drops the log calls (the level is a read-only global set before load); at `debug` it keeps them, and a marked open that goes well takes their level tests only.",
        fmt(kernel_log_ratio, 3)
    ));
    figures.insert("d2_over_d_open_cpu".into(), nan_null(kernel_log_ratio));
    section.notes.push("(e) marks roots by manager exec and children by fork, and matches the path as given against the credential paths (bpftrace cannot resolve paths on tracepoints); (f) is `auditctl -w FILE -p r` on each fake credential file, with auditd running.".into());
    figures.insert("hooks".into(), json!(hooks));
    figures.insert(
        "sizes".into(),
        json!({"open": sizes.open, "getppid": sizes.getppid, "strace_open": sizes.strace_open, "strace_getppid": sizes.strace_getppid, "rounds": rounds}),
    );
    for (key, load) in [("c_agent_load", &watch_load), ("d_agent_load", &marked_load)] {
        figures.insert(
            key.into(),
            json!({"events": load.events, "lost": load.lost, "cpu_s": load.cpu_s, "wall_s": load.wall_s}),
        );
    }
    section.json = Value::Object(figures);

    check_targets(ctx, |config| column(position(config), open_cpu));
    Ok(section)
}

fn one_line(text: &str) -> String {
    text.replace(['\n', '|'], " ")
}

pub fn nan_null(value: f64) -> Value {
    if value.is_finite() {
        json!(value)
    } else {
        Value::Null
    }
}

/// One configuration, both loops.
fn measure(
    ctx: &Ctx,
    config: Config,
    hooks: &[String],
    script: &Path,
    file: &Path,
    sizes: &Sizes,
    load: &mut AgentLoad,
) -> Result<Sample> {
    let looper = ctx.bin.join("loop");
    let running = match config {
        Config::Floor => {
            let floor = Background::start(Command::new(ctx.bin.join("floor")).args(hooks), libc::SIGTERM)?;
            floor.stdout.as_ref().context("floor stdout")?.wait_for("attached", Duration::from_secs(10))?;
            Running::Process(floor)
        }
        Config::Watch => Running::Process(start_watch(ctx)?.0),
        Config::Bpftrace => {
            let bpftrace = Background::start(&mut bpftrace_command(script), libc::SIGINT)?;
            let ready =
                bpftrace.stdout.as_ref().context("bpftrace stdout")?.wait_for("attached", Duration::from_secs(60));
            if let Err(error) = ready {
                let stderr = bpftrace.stderr.as_ref().map(|l| l.text()).unwrap_or_default();
                bail!("bpftrace did not attach: {}: {error:#}", stderr.trim());
            }
            Running::Process(bpftrace)
        }
        Config::Auditd => Running::Audit(Audit::start(ctx)?),
        _ => Running::Nothing,
    };
    let agent = match &running {
        Running::Process(process) if config == Config::Watch => Some(process.pid()),
        _ => None,
    };
    let started = std::time::Instant::now();
    let agent_cpu = agent.map_or(f64::NAN, super::cpu_seconds);
    let mut run_loop = |kind: &str| -> Result<(f64, f64)> {
        let iterations = match (kind, config) {
            ("open", Config::Strace) => sizes.strace_open,
            ("open", _) => sizes.open,
            (_, Config::Strace) => sizes.strace_getppid,
            _ => sizes.getppid,
        };
        let mut command = match config {
            Config::Marked | Config::MarkedKernelLog => {
                let mut command = Command::new(&ctx.credwatch);
                command.arg("run");
                if config == Config::MarkedKernelLog {
                    command.args(["--kernel-log", "debug"]);
                }
                command.arg("--").arg(&looper).env("HOME", &ctx.home);
                command
            }
            Config::Strace => {
                let mut command = Command::new("strace");
                command.args(["-f", "-o", "/dev/null"]).arg(&looper);
                command
            }
            _ => Command::new(&looper),
        };
        command.arg(kind).arg(iterations.to_string());
        if kind == "open" {
            command.arg(file);
        }
        let (seconds, output, own_cpu) = timed_with_own_cpu(&mut command)?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            bail!("the {kind} loop failed ({}): {}", output.status, stderr.trim());
        }
        if config == Config::Marked {
            if let Some(summary) = parse_summary(&stderr) {
                load.events += summary.events;
                load.lost += summary.lost;
            }
            load.wall_s += seconds;
            load.cpu_s += own_cpu;
        }
        ns_per_op(&stdout).with_context(|| format!("no figures from the {kind} loop: {}", stdout.trim()))
    };
    let result = run_loop("open").and_then(|(open_wall, open_cpu)| {
        let (getppid_wall, getppid_cpu) = run_loop("getppid")?;
        Ok(Sample { open_wall, open_cpu, getppid_wall, getppid_cpu })
    });
    if let Some(pid) = agent {
        load.cpu_s += super::cpu_seconds(pid) - agent_cpu;
        load.wall_s += started.elapsed().as_secs_f64();
    }
    match running {
        Running::Nothing => {}
        Running::Process(process) => {
            let stderr = process.stop()?;
            if config == Config::Watch {
                if let Some(summary) = parse_summary(&stderr) {
                    load.events += summary.events;
                    load.lost += summary.lost;
                }
            }
        }
        Running::Audit(audit) => audit.stop()?,
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpftrace_script_filters_by_mark_and_matches_credential_paths() {
        let script = bpftrace_script(Path::new("/tmp/h"));
        assert!(script.contains("tracepoint:sched:sched_process_fork /@m[args->parent_pid]/"), "{script}");
        assert!(script.contains("strncmp($p, \"/tmp/h/.ssh/\", 12) == 0"), "{script}");
        assert!(script.contains("strncmp($p, \"/tmp/h/.npmrc\", 13) == 0"), "{script}");
    }

    #[test]
    fn reads_the_hook_of_a_link_from_fdinfo() {
        let perf = "pos:\t0\nflags:\t02000000\nmnt_id:\t17\nino:\t1038\nlink_type:\tperf\nlink_id:\t34733\n\
                    prog_tag:\t34e6307322f76b5d\nprog_id:\t38664\ntp_name:\tsys_exit_openat\nevent_type:\ttracepoint\ncookie:\t0\n";
        assert_eq!(link_hook(perf), Some(LinkHook::Tracepoint("sys_exit_openat".into())));
        let raw = "pos:\t0\nlink_type:\traw_tracepoint\nlink_id:\t7\nprog_tag:\tab\nprog_id:\t9\ntp_name:\tsched_process_exec\n";
        assert_eq!(link_hook(raw), Some(LinkHook::Raw("sched_process_exec".into())));
        let kprobe = "link_type:\tperf\nlink_id:\t8\nevent_type:\tkprobe\nfunc_name:\tdo_sys_open\n";
        assert_eq!(link_hook(kprobe), Some(LinkHook::Other("perf, kprobe".into())));
        let map = "pos:\t0\nmap_type:\t27\nkey_size:\t0\nmax_entries:\t16777216\n";
        assert_eq!(link_hook(map), None);
    }

    #[test]
    fn finds_the_category_of_a_tracepoint() {
        let root = std::env::temp_dir().join(format!("credwatch-bench-tracepoints-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for dir in ["syscalls/sys_exit_openat", "io_uring/io_uring_submit_req", "a/twice", "b/twice"] {
            fs::create_dir_all(root.join(dir)).unwrap();
        }
        assert_eq!(tracepoint_category(&root, "sys_exit_openat").unwrap(), "syscalls");
        assert_eq!(tracepoint_category(&root, "io_uring_submit_req").unwrap(), "io_uring");
        assert!(tracepoint_category(&root, "missing").is_err());
        assert!(tracepoint_category(&root, "twice").is_err());
        fs::remove_dir_all(&root).unwrap();
    }
}
