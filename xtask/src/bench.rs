//! `cargo xtask bench [--quick] [--no-build] [--binary PATH] [--only SECTION,...]`: credwatch's costs, measured
//! side by side with the hook's floor, bpftrace, auditd and strace, written to
//! `target/bench/bench.md` and `target/bench/bench.json`.
//!
//! Every comparison is a ratio of figures taken in the same run; configurations are interleaved
//! round by round (the starting configuration rotates) and medians are reported, because the
//! machine's cores are shared and noisy. Nothing here uses the network once the set-up (apt-get
//! of the peers, the builds) is done.
//!
//! This module runs the sections and holds what they share (the context, the report's tables,
//! the agent started and measured); each section is a module under `bench/`: `syscalls` (1, a
//! syscall's cost), `install` (2, install workloads), `events` (3 and 5, throughput, memory and
//! start-up), `replay` (4), `outputs` (6), `idle`, `footprint` (the budget), `kernels` (the two
//! backends in a 6.12 guest), and `receive` (the outputs' receivers, in the release xtask).

mod events;
mod footprint;
mod idle;
mod install;
mod kernels;
mod outputs;
#[cfg(feature = "bench-outputs")]
pub mod receive;
pub mod replay;
mod syscalls;

use std::{
    collections::BTreeMap,
    env, fs,
    io::{self, BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::toolchain::find_in_path;

/// Set in the detached bench (see [`detach`]): where it writes its exit status.
const DETACHED_ENV: &str = "CREDWATCH_BENCH_STATUS";
pub const SECTIONS: &[&str] =
    &["syscalls", "install", "throughput", "replay", "memory", "outputs", "idle", "footprint", "kernels"];
/// Peers installed from Debian when missing (set-up, before anything is measured); rsyslogd and
/// nats-server are the outputs' receivers.
const APT_PEERS: &[(&str, &str)] = &[
    ("strace", "strace"),
    ("bpftrace", "bpftrace"),
    ("auditctl", "auditd"),
    ("jq", "jq"),
    ("rsyslogd", "rsyslog"),
    ("nats-server", "nats-server"),
];
/// Fake credential files of the throwaway HOME: what auditd watches and bpftrace matches.
pub const CREDENTIAL_FILES: &[&str] = &[
    ".npmrc",
    ".ssh/id_ed25519",
    ".ssh/id_rsa",
    ".aws/credentials",
    ".config/gcloud/application_default_credentials.json",
    ".azure/msal_token_cache.json",
    ".kube/config",
    ".docker/config.json",
    ".cargo/credentials.toml",
    ".pypirc",
    ".git-credentials",
    ".netrc",
];

pub struct Options {
    pub quick: bool,
    pub build: bool,
    /// `--binary PATH`: the agent measured, instead of target/release/credwatch (not built then).
    pub binary: Option<PathBuf>,
    pub only: Vec<String>,
}

fn parse_options(args: &[&str]) -> Result<Options> {
    let mut options =
        Options { quick: false, build: true, binary: None, only: SECTIONS.iter().map(|s| (*s).to_owned()).collect() };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match *arg {
            "--quick" => options.quick = true,
            "--no-build" => options.build = false,
            "--binary" => {
                let path = args.next().context("--binary needs the path of a credwatch binary")?;
                options.binary = Some(PathBuf::from(path));
                options.build = false;
            }
            "--only" => {
                let list = args.next().context("--only needs a list of sections")?;
                options.only = list.split(',').map(str::to_owned).collect();
                if let Some(bad) = options.only.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
                    bail!("unknown section `{bad}` (sections: {})", SECTIONS.join(","));
                }
            }
            other => bail!("unknown bench option `{other}`"),
        }
    }
    Ok(options)
}

/// A peer tool: usable, or why not (shown in its cells).
pub type Availability = Result<(), String>;

/// What every section needs.
pub struct Ctx {
    pub quick: bool,
    /// target/bench
    pub out: PathBuf,
    /// Scratch space (generated projects, traces); removed at the end.
    pub work: PathBuf,
    /// The compiled helpers (xtask/bench/*.c).
    pub bin: PathBuf,
    pub credwatch: PathBuf,
    /// The release xtask with the `bench-trace` feature (trace generator, parse-only baseline).
    pub xtask_release: PathBuf,
    /// Throwaway HOME with fake credentials, for every workload.
    pub home: PathBuf,
    pub bpftrace: Availability,
    pub auditd: Availability,
    pub strace: Availability,
    pub jq: Availability,
    pub targets: Vec<Target>,
    /// Why the bench fails once its report is written: figures over `xtask/budget.toml`.
    pub budget_failures: Vec<String>,
}

/// One of the targets, as measured.
pub struct Target {
    pub what: String,
    pub measured: String,
    pub limit: String,
    /// None when it could not be measured.
    pub holds: Option<bool>,
}

impl Ctx {
    pub fn target(&mut self, what: &str, measured: String, limit: &str, holds: Option<bool>) {
        self.targets.push(Target { what: what.to_owned(), measured, limit: limit.to_owned(), holds });
    }

    pub fn rounds(&self, full: usize) -> usize {
        if self.quick {
            1
        } else {
            full
        }
    }
}

/// A section's output: a Markdown table, notes under it, further tables (each with its title and
/// notes; their figures are in the section's JSON), and every figure as JSON.
pub struct Section {
    pub key: &'static str,
    pub title: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
    pub tables: Vec<Section>,
    pub json: Value,
}

impl Section {
    pub fn new(key: &'static str, title: &str, header: &[&str]) -> Section {
        Section {
            key,
            title: title.to_owned(),
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
            tables: Vec::new(),
            json: json!({}),
        }
    }

    fn markdown(&self) -> String {
        let mut text = format!("### {}\n\n", self.title);
        if !self.header.is_empty() {
            text += &format!("| {} |\n", self.header.join(" | "));
            text += &format!("|{}\n", "---|".repeat(self.header.len()));
            for row in &self.rows {
                text += &format!("| {} |\n", row.join(" | "));
            }
            text.push('\n');
        }
        for note in &self.notes {
            text += &format!("- {note}\n");
        }
        text.push('\n');
        for table in &self.tables {
            text += &table.markdown();
        }
        text
    }
}

pub fn bench(args: &[&str]) -> Result<()> {
    let options = parse_options(args)?;
    if !crate::is_root() {
        bail!("the bench loads eBPF programs and audit rules: run `sudo -E cargo xtask bench`");
    }
    match env::var_os(DETACHED_ENV) {
        None => detach(args),
        Some(status_file) => {
            let result = run_bench(&options);
            let code = if let Err(error) = &result { format!("1 {error:#}") } else { "0".to_owned() };
            fs::write(&status_file, code).with_context(|| format!("writing {}", Path::new(&status_file).display()))?;
            result
        }
    }
}

/// `cargo xtask` runs under cargo, a package manager to credwatch: a `credwatch watch` started by
/// the bench would seed the bench from /proc as part of cargo's package tree, so every loop it
/// starts would be "package code". The bench therefore runs again reparented to init
/// (`setsid -f`); this process only relays its standard output and exit status.
fn detach(args: &[&str]) -> Result<()> {
    let out = crate::workspace().join("target/bench");
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let status_file = out.join(".status");
    let _ = fs::remove_file(&status_file);
    let exe = env::current_exe().context("finding the xtask executable")?;
    let mut child = Command::new("setsid")
        .arg("-f")
        .arg(&exe)
        .arg("bench")
        .args(args)
        .env(DETACHED_ENV, &status_file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the detached bench with setsid")?;
    let mut stdout = child.stdout.take().context("the bench's stdout")?;
    child.wait().context("waiting for setsid")?;
    // EOF once the detached bench (and anything it started that still holds stdout) ends.
    io::copy(&mut stdout, &mut io::stdout()).context("relaying the bench's output")?;
    let status = fs::read_to_string(&status_file).context("the detached bench ended without a status")?;
    let _ = fs::remove_file(&status_file);
    match status.split_once(' ') {
        None if status == "0" => Ok(()),
        Some((_, error)) => bail!("{error}"),
        None => bail!("the detached bench failed"),
    }
}

fn run_bench(options: &Options) -> Result<()> {
    let started = Instant::now();
    let workspace = crate::workspace();
    let out = workspace.join("target/bench");
    let work = out.join("work");
    let bin = out.join("bin");
    for dir in [&out, &work, &bin] {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    say(&format!(
        "bench: pid {} (detached from cargo; stop it with `kill {}`)",
        std::process::id(),
        std::process::id()
    ));
    if options.build {
        crate::build()?;
    }
    for helper in ["loop", "floor", "opener", "uring", "reader"] {
        let source = workspace.join(format!("xtask/bench/{helper}.c"));
        crate::run(
            &format!("compile xtask/bench/{helper}.c"),
            Command::new("gcc").args(["-O2", "-Wall", "-o"]).arg(bin.join(helper)).arg(&source),
        )?;
    }
    let mut ctx = Ctx {
        quick: options.quick,
        credwatch: options.binary.clone().unwrap_or_else(|| workspace.join("target/release/credwatch")),
        xtask_release: workspace.join("target/release/xtask"),
        home: make_home()?,
        out: out.clone(),
        work: work.clone(),
        bin,
        bpftrace: Ok(()),
        auditd: Ok(()),
        strace: Ok(()),
        jq: Ok(()),
        targets: Vec::new(),
        budget_failures: Vec::new(),
    };
    if !ctx.credwatch.is_file() {
        bail!("{} is missing: run `cargo xtask build` (or drop --no-build)", ctx.credwatch.display());
    }
    set_up_peers(&mut ctx);
    let machine_before = machine();

    let mut sections = Vec::new();
    for key in SECTIONS.iter().filter(|key| options.only.iter().any(|o| o == *key)) {
        let section_started = Instant::now();
        say(&format!("bench: {key}"));
        let result = match *key {
            "syscalls" => syscalls::run(&mut ctx),
            "install" => install::run(&mut ctx),
            "throughput" => events::throughput(&mut ctx),
            "replay" => replay::run(&mut ctx),
            "outputs" => outputs::run(&mut ctx),
            "idle" => idle::run(&mut ctx),
            "footprint" => footprint::run(&mut ctx),
            "kernels" => kernels::run(&mut ctx),
            _ => events::memory_and_start_up(&ctx),
        };
        match result {
            Ok(section) => sections.push(section),
            Err(error) => {
                // One broken section should not cost the others' figures.
                say(&format!("bench: {key} failed: {error:#}"));
                if *key == "footprint" {
                    ctx.budget_failures.push(format!("footprint: not measured: {error:#}"));
                }
                let mut section = Section::new(key_static(key), &format!("{key}: failed"), &[]);
                section.notes.push(format!("error: {}", format!("{error:#}").replace('\n', " ")));
                section.json = json!({ "error": format!("{error:#}") });
                sections.push(section);
            }
        }
        say(&format!("bench: {key}: {:.0}s", section_started.elapsed().as_secs_f64()));
    }
    let _ = fs::remove_dir_all(&work);
    let _ = fs::remove_dir_all(&ctx.home);
    write_report(&ctx, &sections, &machine_before, &machine(), started.elapsed(), options)?;
    say(&format!(
        "bench: wrote {} and {} in {:.0}s",
        out.join("bench.md").display(),
        out.join("bench.json").display(),
        started.elapsed().as_secs_f64()
    ));
    if !ctx.budget_failures.is_empty() {
        bail!("over the footprint budget:\n  {}", ctx.budget_failures.join("\n  "));
    }
    Ok(())
}

/// The release xtask with every bench feature: the trace generator and parse-only baseline
/// (`bench-trace`), the outputs' receivers (`bench-outputs`). One build for every section.
pub fn build_release_xtask() -> Result<()> {
    crate::run(
        "build the bench's helpers (release xtask: trace generator, parse-only baseline, receivers)",
        crate::cargo().args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "xtask",
            "--features",
            "bench-trace,bench-outputs",
        ]),
    )
}

fn key_static(key: &str) -> &'static str {
    SECTIONS.iter().find(|s| **s == key).copied().unwrap_or("section")
}

/// Progress on stdout (relayed by the front process).
pub fn say(line: &str) {
    let mut stdout = io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

/// A throwaway HOME with fake credential files: workloads never see the real one. Its path is
/// short because bpftrace compares paths on a 512-byte BPF stack (see syscalls.rs).
pub const HOME: &str = "/tmp/cwb-h";

fn make_home() -> Result<PathBuf> {
    let home = PathBuf::from(HOME);
    let _ = fs::remove_dir_all(&home);
    for file in CREDENTIAL_FILES {
        let path = home.join(file);
        fs::create_dir_all(path.parent().expect("credential files are under HOME"))?;
        fs::write(&path, "fake credential for the credwatch bench\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(home)
}

/// Installs missing peers from Debian (set-up, before any measurement), then checks that each
/// works here; one that does not is reported with the error instead of its figures.
fn set_up_peers(ctx: &mut Ctx) {
    let missing: Vec<&str> =
        APT_PEERS.iter().filter(|(program, _)| find_in_path(program).is_none()).map(|(_, package)| *package).collect();
    if !missing.is_empty() && find_in_path("apt-get").is_some() {
        let _ = crate::run(
            &format!("install the bench's peers: apt-get install -y {}", missing.join(" ")),
            Command::new("apt-get").args(["install", "-y", "-q"]).args(&missing),
        );
    }
    let check = |program: &str, args: &[&str]| -> Availability {
        if find_in_path(program).is_none() {
            return Err(format!("`{program}` is not installed"));
        }
        let output = Command::new(program).args(args).stdin(Stdio::null()).output().map_err(|e| e.to_string())?;
        if output.status.success() {
            Ok(())
        } else {
            let text = String::from_utf8_lossy(&output.stderr);
            Err(format!("`{program} {}` failed: {}", args.join(" "), text.trim().lines().last().unwrap_or("")))
        }
    };
    ctx.strace = check("strace", &["-f", "-o", "/dev/null", "true"]);
    ctx.jq = check("jq", &["-n", "1"]);
    ctx.bpftrace = check("bpftrace", &["-e", "tracepoint:syscalls:sys_enter_getppid { } BEGIN { exit(); }"]);
    ctx.auditd = check("auditctl", &["-s"]).and_then(|()| {
        if find_in_path("auditd").is_none() {
            return Err("`auditd` is not installed".into());
        }
        Ok(())
    });
    for (name, availability) in
        [("strace", &ctx.strace), ("jq", &ctx.jq), ("bpftrace", &ctx.bpftrace), ("auditd", &ctx.auditd)]
    {
        if let Err(reason) = availability {
            say(&format!("bench: {name} unavailable: {reason}"));
        }
    }
}

/// The machine, and what else was running on it (the bench cannot own the cores).
fn machine() -> Value {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name").and_then(|rest| rest.split_once(':')).map(|(_, v)| v.trim()))
        .unwrap_or("unknown")
        .to_owned();
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_kb: u64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse().ok())
        .unwrap_or(0);
    let read = |path: &str| fs::read_to_string(path).map(|s| s.trim().to_owned()).unwrap_or_default();
    json!({
        "cpu": cpu,
        "cores": thread::available_parallelism().map_or(0, usize::from),
        "memory_gib": (memory_kb as f64 / 1048576.0 * 10.0).round() / 10.0,
        "kernel": read("/proc/sys/kernel/osrelease"),
        "load_average": read("/proc/loadavg"),
        "foreign_bpf_holders": foreign_bpf_holders(),
        "date": Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]).output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default(),
    })
}

/// Other processes holding eBPF programs (another agent left attached inflates every figure:
/// syscall tracepoints put every task on the slow syscall path).
fn foreign_bpf_holders() -> Vec<String> {
    let me = std::process::id().to_string();
    let mut holders = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else { return holders };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) || name == me {
            continue;
        }
        let Ok(fds) = fs::read_dir(entry.path().join("fd")) else { continue };
        let programs = fds
            .flatten()
            .filter(|fd| fs::read_link(fd.path()).is_ok_and(|target| target.to_string_lossy().contains("bpf-prog")))
            .count();
        if programs > 0 {
            let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline: String = String::from_utf8_lossy(&cmdline)
                .replace('\0', " ")
                .chars()
                .filter(|c| !c.is_control())
                .take(80)
                .collect();
            holders.push(format!("pid {name} ({programs} programs): {}", cmdline.trim()));
        }
    }
    holders
}

fn write_report(
    ctx: &Ctx,
    sections: &[Section],
    before: &Value,
    after: &Value,
    elapsed: Duration,
    options: &Options,
) -> Result<()> {
    let mut md = String::from("## credwatch bench\n\n");
    md += &format!(
        "{} · {} cores · {} GiB · kernel {} · {} · {:.0} s{}\n\n",
        before["cpu"].as_str().unwrap_or(""),
        before["cores"],
        before["memory_gib"],
        before["kernel"].as_str().unwrap_or(""),
        before["date"].as_str().unwrap_or(""),
        elapsed.as_secs_f64(),
        if options.quick { " · --quick (smoke run: 1 round, small sizes)" } else { "" }
    );
    md += &format!(
        "Load average at start {}, at end {} (the cores are shared: other engineers were building).\n",
        before["load_average"].as_str().unwrap_or(""),
        after["load_average"].as_str().unwrap_or("")
    );
    let holders: Vec<&str> = before["foreign_bpf_holders"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !holders.is_empty() {
        md += &format!(
            "Other eBPF programs were attached during the run (they slow every configuration alike, (a) included): {}.\n",
            holders.join("; ")
        );
    }
    md += "\n### Targets\n\n| target | measured | limit | holds |\n|---|---|---|---|\n";
    for target in &ctx.targets {
        let holds = match target.holds {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "n/a",
        };
        md += &format!("| {} | {} | {} | {} |\n", target.what, target.measured, target.limit, holds);
    }
    md.push('\n');
    for section in sections {
        md += &section.markdown();
    }
    fs::write(ctx.out.join("bench.md"), &md).context("writing bench.md")?;

    let mut figures = BTreeMap::new();
    for section in sections {
        figures.insert(section.key, section.json.clone());
    }
    let targets: Vec<Value> = ctx
        .targets
        .iter()
        .map(|t| json!({ "target": t.what, "measured": t.measured, "limit": t.limit, "holds": t.holds }))
        .collect();
    let report = json!({
        "machine": before,
        "machine_at_end": after,
        "quick": options.quick,
        "seconds": elapsed.as_secs_f64(),
        "targets": targets,
        "sections": figures,
    });
    fs::write(ctx.out.join("bench.json"), serde_json::to_string_pretty(&report)? + "\n").context("writing bench.json")
}

// ---------------------------------------------------------------------------------------------
// Shared helpers

pub fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    }
}

/// `value` with `digits` decimals, or "n/a" when it was not measured.
pub fn fmt(value: f64, digits: usize) -> String {
    if value.is_finite() {
        format!("{value:.digits$}")
    } else {
        "n/a".to_owned()
    }
}

pub fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a pid this bench started.
    unsafe { libc::kill(pid as libc::pid_t, signal) };
}

/// Waits for `child` up to `timeout`, then kills it.
pub fn wait_or_kill(child: &mut Child, timeout: Duration) -> Result<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            return Ok(child.wait()?);
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Reads a child's stream line by line on a thread: each line goes to a channel (to wait for a
/// readiness line) and to a shared log.
pub struct Lines {
    receiver: mpsc::Receiver<String>,
    pub all: Arc<Mutex<Vec<String>>>,
}

impl Lines {
    pub fn new(stream: impl Read + Send + 'static) -> Lines {
        let (sender, receiver) = mpsc::channel();
        let all = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&all);
        thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                if let Ok(mut log) = log.lock() {
                    log.push(line.clone());
                }
                let _ = sender.send(line);
            }
        });
        Lines { receiver, all }
    }

    /// The first line containing `needle`, within `timeout`.
    pub fn wait_for(&self, needle: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.receiver.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return Ok(line),
                Ok(_) => continue,
                Err(_) => bail!("no line with `{needle}` within {timeout:?}; got: {}", self.text().trim()),
            }
        }
    }

    pub fn text(&self) -> String {
        self.all.lock().map(|lines| lines.join("\n")).unwrap_or_default()
    }
}

/// A process the bench started in the background (an agent, a peer, the floor), stopped with
/// `stop_signal` and killed if it lingers; dropped, it is killed, so that no program or audit
/// rule outlives a failed section.
pub struct Background {
    pub child: Child,
    pub stdout: Option<Lines>,
    pub stderr: Option<Lines>,
    stop_signal: i32,
    /// A `credwatch watch`: the credwatch binary, to detach what it pinned once it has ended.
    unpin: Option<PathBuf>,
}

impl Background {
    pub fn start(command: &mut Command, stop_signal: i32) -> Result<Background> {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {command:?}"))?;
        let stdout = child.stdout.take().map(Lines::new);
        let stderr = child.stderr.take().map(Lines::new);
        Ok(Background { child, stdout, stderr, stop_signal, unpin: None })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Signals, waits (10 s at most) and returns what it wrote to stderr.
    pub fn stop(mut self) -> Result<String> {
        signal(self.child.id(), self.stop_signal);
        wait_or_kill(&mut self.child, Duration::from_secs(10))?;
        if let Some(credwatch) = self.unpin.take() {
            unpin(&credwatch);
        }
        // The reader threads end at EOF; give them a moment to take the last lines.
        thread::sleep(Duration::from_millis(50));
        Ok(self.stderr.as_ref().map(Lines::text).unwrap_or_default())
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let Some(credwatch) = self.unpin.take() {
            unpin(&credwatch);
        }
    }
}

/// Where every `credwatch watch` the bench starts pins its kernel side: a folder of the bench's,
/// detached as each agent ends ([`unpin`]). `watch` leaves its programs attached and recording
/// when it stops, for the next agent to adopt: without this, every start after the first would
/// be an adoption, and the programs would stay attached after the bench.
pub fn pin_dir() -> PathBuf {
    PathBuf::from(format!("/sys/fs/bpf/credwatch-bench-{}", std::process::id()))
}

/// `credwatch stop --pin-dir PIN_DIR`: detaches what an agent of the bench left pinned (nothing
/// to do when nothing is).
pub fn unpin(credwatch: &Path) {
    let _ = Command::new(credwatch)
        .args(["stop", "--pin-dir"])
        .arg(pin_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// `credwatch watch`, attached: returns it with the agent's own "after N ms" figure and the time
/// from spawn to that line.
pub fn start_watch(ctx: &Ctx) -> Result<(Background, f64, f64)> {
    start_watch_with(ctx, &mut watch_command(ctx))
}

/// `credwatch watch` pinning in [`pin_dir`], with the throwaway HOME: add options, then start it
/// with [`start_watch_with`].
pub fn watch_command(ctx: &Ctx) -> Command {
    let mut command = Command::new(&ctx.credwatch);
    command.arg("watch").arg("--pin-dir").arg(pin_dir()).env("HOME", &ctx.home);
    command
}

/// [`start_watch`] with a [`watch_command`].
pub fn start_watch_with(ctx: &Ctx, command: &mut Command) -> Result<(Background, f64, f64)> {
    let spawned = Instant::now();
    let mut agent = Background::start(command, libc::SIGTERM)?;
    agent.unpin = Some(ctx.credwatch.clone());
    let line = agent
        .stderr
        .as_ref()
        .context("agent stderr")?
        .wait_for("watching package trees", Duration::from_secs(30))
        .context("waiting for `credwatch watch` to attach")?;
    let to_line = spawned.elapsed().as_secs_f64() * 1e3;
    let reported = line
        .split(" after ")
        .nth(1)
        .and_then(|rest| rest.split(" ms").next())
        .and_then(|ms| ms.trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    Ok((agent, reported, to_line))
}

/// The agent's closing summary: `credwatch: N events, M lost, K alerts in S s`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Summary {
    pub events: u64,
    pub lost: u64,
}

pub fn parse_summary(stderr: &str) -> Option<Summary> {
    let line = stderr.lines().rev().find(|line| line.contains(" events, ") && line.contains(" lost, "))?;
    let number_before = |word: &str| -> Option<u64> {
        let index = line.find(word)?;
        line[..index].split(|c: char| !c.is_ascii_digit()).rfind(|s| !s.is_empty())?.parse().ok()
    };
    Some(Summary { events: number_before(" events")?, lost: number_before(" lost")? })
}

/// Runs `command` to the end, returning wall seconds and its output.
pub fn timed(command: &mut Command) -> Result<(f64, std::process::Output)> {
    let started = Instant::now();
    let output = command.stdin(Stdio::null()).output().with_context(|| format!("running {command:?}"))?;
    Ok((started.elapsed().as_secs_f64(), output))
}

/// Runs `command` to the end like [`timed`], and also returns the CPU seconds of the process
/// itself (not of its children), sampled every 20 ms until it exits.
pub fn timed_with_own_cpu(command: &mut Command) -> Result<(f64, std::process::Output, f64)> {
    let started = Instant::now();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {command:?}"))?;
    let stdout = Lines::new(child.stdout.take().context("stdout")?);
    let stderr = Lines::new(child.stderr.take().context("stderr")?);
    let mut cpu = 0.0;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        let now = cpu_seconds(child.id());
        if now.is_finite() {
            cpu = now;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let seconds = started.elapsed().as_secs_f64();
    thread::sleep(Duration::from_millis(50));
    let text = |lines: &Lines| (lines.text() + "\n").into_bytes();
    Ok((seconds, std::process::Output { status, stdout: text(&stdout), stderr: text(&stderr) }, cpu))
}

/// The `ns_per_op` (wall) and `cpu_ns_per_op` figures printed by the loop helper, wherever they
/// are in `text`.
pub fn ns_per_op(text: &str) -> Option<(f64, f64)> {
    let figure = |key: &str| text.lines().find_map(|line| line.strip_prefix(key)).and_then(|v| v.trim().parse().ok());
    Some((figure("ns_per_op ")?, figure("cpu_ns_per_op ")?))
}

/// User + system CPU seconds a process has used so far (fields 14 and 15 of /proc/PID/stat).
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return f64::NAN };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return f64::NAN };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_agent_summary() {
        let stderr = "credwatch: watching package trees (40 rules) after 80 ms; Ctrl-C to stop\n\
                      credwatch: 915 events, 3 lost, 2 alerts in 2.2s\n";
        let summary = parse_summary(stderr).unwrap();
        assert_eq!((summary.events, summary.lost), (915, 3));
        assert!(parse_summary("credwatch: interrupted").is_none());
    }

    #[test]
    fn median_of_odd_even_and_unmeasured() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[f64::NAN, 5.0]), 5.0);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn rejects_unknown_options_and_sections() {
        assert!(parse_options(&["--only", "syscalls,nope"]).is_err());
        assert!(parse_options(&["--fast"]).is_err());
        let options = parse_options(&["--quick", "--only", "replay"]).unwrap();
        assert!(options.quick && options.build && options.binary.is_none());
        assert_eq!(options.only, ["replay"]);
    }

    #[test]
    fn a_binary_given_is_measured_unbuilt() {
        let options = parse_options(&["--binary", "/tmp/credwatch", "--only", "footprint"]).unwrap();
        assert!(!options.build && options.binary == Some(PathBuf::from("/tmp/credwatch")));
        assert_eq!(options.only, ["footprint"]);
        assert!(parse_options(&["--binary"]).is_err());
    }
}
