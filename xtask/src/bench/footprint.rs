//! `footprint`: what `credwatch watch` holds and how fast it starts, on the tracepoint backend,
//! against the budget in `xtask/budget.toml` (which says how each figure is measured). A figure
//! over its limit fails the bench, after the report is written.

use std::{
    fs,
    os::unix::fs::symlink,
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    events::{memory, MISSING},
    fmt,
    idle::{renamed_managers, usage},
    median, parse_summary, say, start_watch_with, timed, watch_command, Ctx, Section,
};

/// The budget file, relative to the workspace.
pub const BUDGET_FILE: &str = "xtask/budget.toml";
/// Past start-up before the idle window: the first rescans and the first canary (as `idle`).
const SETTLE: Duration = Duration::from_secs(6);

/// A tracefs file whose read takes the kernel's `event_mutex`, as attaching a tracepoint does.
const EVENT_FORMAT: &str = "/sys/kernel/tracing/events/syscalls/sys_enter_openat/format";

/// Waits until the kernel has finished detaching the previous agent's tracepoints. It does that
/// after the agent is gone, holding `event_mutex` through an RCU grace period per tracepoint
/// (55-75 ms each here, 1.6 s for an agent's), and an agent starting meanwhile waits for that
/// mutex in `perf_event_open`: 1 s after a stop, 4 of 8 starts took 60-160 ms longer. Each round
/// starts as on a machine where no agent was just stopped.
fn wait_for_tracepoints_detached() {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut uncontended = 0;
    while uncontended < 3 && Instant::now() < deadline {
        let began = Instant::now();
        if fs::read(EVENT_FORMAT).is_err() {
            return;
        }
        uncontended = if began.elapsed() < Duration::from_millis(5) { uncontended + 1 } else { 0 };
        thread::sleep(Duration::from_millis(100));
    }
}

/// The limits of `xtask/budget.toml`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub idle_rss_mb: f64,
    pub peak_rss_mb: f64,
    pub start_ms: f64,
    pub idle_cpu_percent: f64,
}

impl Budget {
    pub fn load(path: &Path) -> Result<Budget> {
        let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Budget::parse(&text).with_context(|| format!("reading the budget in {}", path.display()))
    }

    fn parse(text: &str) -> Result<Budget> {
        Ok(toml::from_str(text)?)
    }

    /// Each figure against its limit, in the file's order.
    fn checks(&self, figures: &Figures) -> [Check; 4] {
        [
            Check {
                figure: "idle RSS",
                measured: figures.idle_rss_mb,
                limit: self.idle_rss_mb,
                unit: "MB",
                how: "VmRSS at the end of the idle window",
            },
            Check {
                figure: "peak RSS",
                measured: figures.peak_rss_mb,
                limit: self.peak_rss_mb,
                unit: "MB",
                how: "VmHWM after start-up, the idle window and a flood of events",
            },
            Check {
                figure: "start to watching",
                measured: figures.start_ms,
                limit: self.start_ms,
                unit: "ms",
                how: "spawn to the `watching package trees` line",
            },
            Check {
                figure: "idle CPU",
                measured: figures.idle_cpu_percent,
                limit: self.idle_cpu_percent,
                unit: "% of a core",
                how: "CPU of every thread and reaped child over the idle window",
            },
        ]
    }
}

/// The medians of the rounds.
#[derive(Clone, Copy, Debug)]
pub struct Figures {
    pub idle_rss_mb: f64,
    pub peak_rss_mb: f64,
    pub start_ms: f64,
    pub idle_cpu_percent: f64,
}

/// One figure against its limit.
struct Check {
    figure: &'static str,
    measured: f64,
    limit: f64,
    unit: &'static str,
    how: &'static str,
}

impl Check {
    /// An unmeasured figure (NaN) does not hold.
    fn holds(&self) -> bool {
        self.measured <= self.limit
    }

    /// Why the bench fails, when it does: the figure, its limit and the measurement.
    fn failure(&self, rounds: usize) -> Option<String> {
        let (figure, measured, limit, unit, how) = (self.figure, self.measured, self.limit, self.unit, self.how);
        if self.holds() {
            None
        } else if measured.is_nan() {
            Some(format!("{figure}: not measured, its limit is {limit} {unit} in {BUDGET_FILE} ({how})"))
        } else {
            Some(format!(
                "{figure}: {measured:.2} {unit}, over its limit of {limit} {unit} in {BUDGET_FILE} ({how}, median of {rounds} rounds)"
            ))
        }
    }
}

/// What one start of the agent measured.
struct Round {
    start_ms: f64,
    idle_cpu_percent: f64,
    idle_memory: Value,
    peak_memory: Value,
    /// Opens the flood made, events the agent read.
    flood: (u64, u64),
}

impl Round {
    fn kb(memory: &Value, key: &str) -> f64 {
        memory[key].as_u64().map_or(f64::NAN, |kb| kb as f64)
    }

    fn idle_rss_mb(&self) -> f64 {
        Round::kb(&self.idle_memory, "vm_rss_kb") / 1024.0
    }

    fn peak_rss_mb(&self) -> f64 {
        Round::kb(&self.peak_memory, "vm_hwm_kb") / 1024.0
    }
}

/// One fresh start (nothing pinned to adopt): the time to the `watching` line, the idle window's
/// CPU and memory, then the peak after a flood of events from `driver` (a manager of `rules`).
fn round(ctx: &Ctx, rules: &Path, driver: &Path, idle: Duration, flood: u64) -> Result<Round> {
    let mut command = watch_command(ctx);
    command
        .args(["--sensor", "tracepoint", "--rules"])
        .arg(rules)
        .arg("--alert-log")
        .arg(ctx.work.join("footprint-alerts.jsonl"))
        .arg("--alerts-socket")
        .arg(ctx.work.join("footprint-alerts.sock"))
        // The environment of a service: no variable of the bench's, no backtraces captured.
        .env_remove("CREDWATCH_BENCH_STATUS")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    wait_for_tracepoints_detached();
    let (agent, _, start_ms) = start_watch_with(ctx, &mut command)?;
    thread::sleep(SETTLE);
    let before = usage(agent.pid())?;
    thread::sleep(idle);
    let after = usage(agent.pid())?;
    let idle_cpu_percent =
        (after.own_seconds_since(&before) + after.children_seconds_since(&before)) / idle.as_secs_f64() * 100.0;
    let idle_memory = memory(agent.pid())?;
    let (_, output) = timed(Command::new(driver).args(["0", "120", MISSING, "2", &(flood / 2).to_string()]))?;
    let opens = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.strip_prefix("opens ")?.trim().parse::<u64>().ok())
        .sum();
    thread::sleep(Duration::from_secs(1));
    let peak_memory = memory(agent.pid())?;
    let stderr = agent.stop()?;
    let received = parse_summary(&stderr).map_or(0, |summary| summary.events);
    Ok(Round { start_ms, idle_cpu_percent, idle_memory, peak_memory, flood: (opens, received) })
}

pub fn run(ctx: &mut Ctx) -> Result<Section> {
    let budget = Budget::load(&crate::workspace().join(BUDGET_FILE))?;
    let (rounds, idle, flood) =
        if ctx.quick { (3, Duration::from_secs(10), 200_000) } else { (5, Duration::from_secs(30), 1_000_000) };
    let rules = ctx.work.join("footprint-rules");
    renamed_managers(&rules)?;
    // The opens driver under the renamed npm's name: its tree is package code.
    let driver = ctx.work.join("cwb-no-npm");
    let _ = fs::remove_file(&driver);
    symlink(ctx.bin.join("opener"), &driver).context("linking the opens driver as the renamed npm")?;
    let mut measured = Vec::new();
    for at in 1..=rounds {
        say(&format!("bench: footprint: round {at}/{rounds}"));
        measured.push(round(ctx, &rules, &driver, idle, flood)?);
    }
    let of = |figure: fn(&Round) -> f64| -> Vec<f64> { measured.iter().map(figure).collect() };
    let (idle_rss, peak_rss) = (of(Round::idle_rss_mb), of(Round::peak_rss_mb));
    let (start, cpu) = (of(|r| r.start_ms), of(|r| r.idle_cpu_percent));
    let figures = Figures {
        idle_rss_mb: median(&idle_rss),
        peak_rss_mb: median(&peak_rss),
        start_ms: median(&start),
        idle_cpu_percent: median(&cpu),
    };
    let checks = budget.checks(&figures);
    let mut section = Section::new(
        "footprint",
        "8. Footprint budget (`credwatch watch --sensor tracepoint`)",
        &["figure", "median", "rounds", "limit", "holds"],
    );
    for (check, values) in checks.iter().zip([&idle_rss, &peak_rss, &start, &cpu]) {
        let digits = if check.unit == "ms" { 0 } else { 2 };
        let per_round: Vec<String> = values.iter().map(|v| fmt(*v, digits)).collect();
        section.rows.push(vec![
            check.figure.to_owned(),
            format!("{} {}", fmt(check.measured, digits), check.unit),
            per_round.join(", "),
            format!("{} {}", check.limit, check.unit),
            if check.holds() { "yes".into() } else { "**no**".into() },
        ]);
        ctx.target(
            &format!("footprint: {}", check.figure),
            format!("{} {}", fmt(check.measured, digits), check.unit),
            &format!("≤ {} {} ({BUDGET_FILE})", check.limit, check.unit),
            Some(check.holds()),
        );
        ctx.budget_failures.extend(check.failure(rounds));
    }
    section.notes.push(breakdown(&measured[measured.len() / 2].idle_memory));
    let floods: Vec<String> =
        measured.iter().map(|r| format!("{} opens, {} events read", r.flood.0, r.flood.1)).collect();
    section.notes.push(format!(
        "{rounds} fresh starts with the default rules (managers renamed); idle window {} s after {} s; floods: {}.",
        idle.as_secs(),
        SETTLE.as_secs(),
        floods.join("; ")
    ));
    let memory: Vec<Value> =
        measured.iter().map(|r| json!({ "idle": r.idle_memory, "after_flood": r.peak_memory })).collect();
    section.json = json!({
        "budget": { "idle_rss_mb": budget.idle_rss_mb, "peak_rss_mb": budget.peak_rss_mb,
                    "start_ms": budget.start_ms, "idle_cpu_percent": budget.idle_cpu_percent },
        "rounds": { "idle_rss_mb": idle_rss, "peak_rss_mb": peak_rss, "start_ms": start, "idle_cpu_percent": cpu },
        "memory": memory,
    });
    Ok(section)
}

/// Where the idle agent's resident memory is: the ring buffers' mappings (kernel memory), the
/// rest of the file mappings (the binary's pages), and the anonymous memory (heap and stacks).
fn breakdown(memory: &Value) -> String {
    let mb = |key: &str| Round::kb(memory, key) / 1024.0;
    let rings = mb("bpf_map_mappings_rss_kb");
    format!(
        "Idle VmRSS of the median round {} MB: ring buffers {} MB, the binary's pages {} MB, heap and stacks (RssAnon) {} MB.",
        fmt(mb("vm_rss_kb"), 1),
        fmt(rings, 1),
        fmt(mb("rss_file_kb") - rings, 1),
        fmt(mb("rss_anon_kb"), 1)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(idle_rss_mb: f64, peak_rss_mb: f64, start_ms: f64, idle_cpu_percent: f64) -> Figures {
        Figures { idle_rss_mb, peak_rss_mb, start_ms, idle_cpu_percent }
    }

    #[test]
    fn the_budget_file_parses() {
        let budget = Budget::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("budget.toml")).unwrap();
        assert_eq!(budget, Budget { idle_rss_mb: 20.0, peak_rss_mb: 32.0, start_ms: 150.0, idle_cpu_percent: 0.05 });
    }

    #[test]
    fn unknown_and_missing_keys_are_errors() {
        let full = "idle_rss_mb = 20\npeak_rss_mb = 32\nstart_ms = 150\nidle_cpu_percent = 0.05\n";
        assert!(Budget::parse(full).is_ok());
        let unknown = Budget::parse(&format!("{full}idle_rss_gb = 1\n")).unwrap_err();
        assert!(format!("{unknown:#}").contains("idle_rss_gb"), "{unknown:#}");
        let missing = Budget::parse("idle_rss_mb = 20\n").unwrap_err();
        assert!(format!("{missing:#}").contains("peak_rss_mb"), "{missing:#}");
    }

    #[test]
    fn a_figure_over_its_limit_fails_naming_figure_limit_and_measurement() {
        let budget = Budget { idle_rss_mb: 20.0, peak_rss_mb: 32.0, start_ms: 150.0, idle_cpu_percent: 0.05 };
        let within = budget.checks(&figures(19.5, 32.0, 140.0, 0.01));
        assert!(within.iter().all(|check| check.failure(5).is_none()));

        let over = budget.checks(&figures(19.5, 41.25, 140.0, f64::NAN));
        let failures: Vec<String> = over.iter().filter_map(|check| check.failure(5)).collect();
        assert_eq!(failures.len(), 2, "{failures:?}");
        assert_eq!(
            failures[0],
            "peak RSS: 41.25 MB, over its limit of 32 MB in xtask/budget.toml (VmHWM after start-up, the idle \
             window and a flood of events, median of 5 rounds)"
        );
        // Not measured is no pass.
        assert_eq!(
            failures[1],
            "idle CPU: not measured, its limit is 0.05 % of a core in xtask/budget.toml (CPU of every thread and \
             reaped child over the idle window)"
        );
    }
}
