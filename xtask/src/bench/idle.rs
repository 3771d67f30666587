//! `idle`: what `credwatch watch` costs on a host where no package tree runs, the state most
//! agents of a fleet are in most of the time. Issue 11's target: at most 0.1% of one core.
//!
//! The agent's CPU is read from `/proc/PID/task/*/schedstat` (nanoseconds on a CPU, every
//! thread), not from `/proc/PID/stat` (10 ms ticks: an idle minute is a few ticks), plus the
//! CPU of its reaped children (the canaries) from `stat`. Wake-ups are its threads' context
//! switches (voluntary and not): each is one return from a sleep.

use std::{
    fs,
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::{fmt, parse_summary, say, Background, Ctx, Section};

/// The limit: 0.1% of one core.
const LIMIT_CORE_SHARE: f64 = 0.001;
/// Where the measured agents pin their kernel side: their own, removed at the end.
const PIN_DIR: &str = "/sys/fs/bpf/credwatch-bench-idle";
/// The managers renamed, so that package trees run by others on a shared machine (a cargo
/// build) are not the measured agent's work; everything an idle agent does (rescans of the
/// default rules' targets, the canary, the heartbeat, the ring buffers' waits) is unchanged.
const NO_MANAGERS: &[&str] = &["npm", "yarn", "pnpm", "bun", "cargo", "pip", "uv", "poetry", "pdm", "gem", "bundler"];

/// CPU nanoseconds of every thread, CPU ticks of the reaped children, context switches.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub cpu_ns: u64,
    pub children_ticks: u64,
    pub switches: u64,
}

impl Usage {
    /// The agent's own CPU seconds from `before` to `self`.
    pub fn own_seconds_since(&self, before: &Usage) -> f64 {
        self.cpu_ns.saturating_sub(before.cpu_ns) as f64 / 1e9
    }

    /// The CPU seconds of the children reaped from `before` to `self`.
    pub fn children_seconds_since(&self, before: &Usage) -> f64 {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        self.children_ticks.saturating_sub(before.children_ticks) as f64 / hz
    }
}

pub fn usage(pid: u32) -> Result<Usage> {
    let mut usage = Usage::default();
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).with_context(|| format!("reading /proc/{pid}/task"))?;
    for task in tasks.flatten() {
        let schedstat = fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        usage.cpu_ns += schedstat.split_whitespace().next().and_then(|ns| ns.parse::<u64>().ok()).unwrap_or(0);
        let status = fs::read_to_string(task.path().join("status")).unwrap_or_default();
        usage.switches += status
            .lines()
            .filter(|line| {
                line.starts_with("voluntary_ctxt_switches") || line.starts_with("nonvoluntary_ctxt_switches")
            })
            .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).context("reading the agent's stat")?;
    let fields: Vec<&str> = stat.rfind(')').map(|i| stat[i + 1..].split_whitespace().collect()).unwrap_or_default();
    // cutime and cstime (fields 16 and 17; 13 and 14 after the command).
    usage.children_ticks = [13, 14].iter().filter_map(|&i| fields.get(i)?.parse::<u64>().ok()).sum();
    Ok(usage)
}

/// One idle measurement of `credwatch watch EXTRA`.
struct Idle {
    seconds: f64,
    cpu_seconds: f64,
    children_seconds: f64,
    wakeups: u64,
    threads: usize,
    /// Events the agent read meanwhile (0 when the machine really was idle for it).
    events: u64,
}

impl Idle {
    fn cpu_per_minute_ms(&self) -> f64 {
        (self.cpu_seconds + self.children_seconds) / self.seconds * 60.0 * 1e3
    }

    fn core_share(&self) -> f64 {
        (self.cpu_seconds + self.children_seconds) / self.seconds
    }

    fn json(&self) -> Value {
        json!({
            "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
            "children_cpu_seconds": self.children_seconds,
            "cpu_ms_per_minute": self.cpu_per_minute_ms(),
            "core_percent": self.core_share() * 100.0,
            "wakeups": self.wakeups,
            "wakeups_per_second": self.wakeups as f64 / self.seconds,
            "threads": self.threads,
            "events_read": self.events,
        })
    }
}

fn measure(ctx: &Ctx, rules: &Path, extra: &[String], seconds: u64) -> Result<Idle> {
    let _ = Command::new(&ctx.credwatch).args(["stop", "--pin-dir", PIN_DIR]).output();
    let mut command = Command::new(&ctx.credwatch);
    command.args(["watch", "--pin-dir", PIN_DIR, "--rules"]).arg(rules).args(extra).env("HOME", &ctx.home);
    // The bench's own variable is no key of credwatch's: it would warn about it.
    command.env_remove("CREDWATCH_BENCH_STATUS");
    let agent = Background::start(&mut command, libc::SIGTERM)?;
    agent
        .stderr
        .as_ref()
        .context("agent stderr")?
        .wait_for("watching package trees", Duration::from_secs(60))
        .context("waiting for `credwatch watch` to attach")?;
    // Past start-up: the first rescans (the homes, the watches they add) and the first canary.
    thread::sleep(Duration::from_secs(6));
    let (before, started) = (usage(agent.pid())?, Instant::now());
    thread::sleep(Duration::from_secs(seconds));
    let (after, elapsed) = (usage(agent.pid())?, started.elapsed().as_secs_f64());
    let threads = fs::read_dir(format!("/proc/{}/task", agent.pid())).map(|tasks| tasks.count()).unwrap_or(0);
    let stderr = agent.stop()?;
    let _ = Command::new(&ctx.credwatch).args(["stop", "--pin-dir", PIN_DIR]).output();
    Ok(Idle {
        seconds: elapsed,
        cpu_seconds: after.own_seconds_since(&before),
        children_seconds: after.children_seconds_since(&before),
        wakeups: after.switches.saturating_sub(before.switches),
        threads,
        events: parse_summary(&stderr).map_or(0, |summary| summary.events),
    })
}

/// A rules overlay in `dir` renaming every package manager NAME to `cwb-no-NAME` (see
/// [`NO_MANAGERS`]).
pub fn renamed_managers(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let managers: String =
        NO_MANAGERS.iter().map(|name| format!("  - name: {name}\n    execs: [cwb-no-{name}]\n")).collect();
    fs::write(dir.join("managers.yaml"), format!("schema: 2\nmanagers:\n{managers}")).context("writing the overlay")
}

pub fn run(ctx: &mut Ctx) -> Result<Section> {
    let seconds = if ctx.quick { 15 } else { 60 };
    let rules = ctx.work.join("idle-rules");
    renamed_managers(&rules)?;
    let alerts = ctx.work.join("idle-alerts.jsonl");
    let spool = ctx.work.join("idle-spool");
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let configurations: [(&str, Vec<String>); 2] = [
        ("`credwatch watch`", Vec::new()),
        (
            "with a file output, a webhook that refuses connections, `--metrics-listen` (not scraped)",
            vec![
                "--to".into(),
                format!("file:{}", alerts.display()),
                "--to".into(),
                // Port 9 (discard) on loopback: nothing listens, the connection is refused.
                "webhook:http://127.0.0.1:9/alerts".into(),
                "--spool-dir".into(),
                spool.display().to_string(),
                "--metrics-listen".into(),
                format!("127.0.0.1:{port}"),
            ],
        ),
    ];
    let mut section = Section::new(
        "idle",
        "7. Idle agent (no package tree runs)",
        &["configuration", "CPU per minute", "share of one core", "wake-ups/s", "threads", "events read"],
    );
    let mut figures = Vec::new();
    for (name, extra) in &configurations {
        say(&format!("bench: idle: {name}, {seconds} s"));
        let idle = measure(ctx, &rules, extra, seconds)?;
        section.rows.push(vec![
            (*name).to_owned(),
            format!("{} ms", fmt(idle.cpu_per_minute_ms(), 1)),
            format!("{}%", fmt(idle.core_share() * 100.0, 3)),
            fmt(idle.wakeups as f64 / idle.seconds, 2),
            idle.threads.to_string(),
            idle.events.to_string(),
        ]);
        figures.push(json!({ "configuration": name, "figures": idle.json() }));
        if extra.is_empty() {
            ctx.target(
                "idle `credwatch watch`: CPU per minute (share of one core)",
                format!("{} ms ({}%)", fmt(idle.cpu_per_minute_ms(), 1), fmt(idle.core_share() * 100.0, 3)),
                "≤ 60 ms (0.1%)",
                Some(idle.core_share() <= LIMIT_CORE_SHARE),
            );
        }
    }
    let _ = fs::remove_file(&alerts);
    let _ = fs::remove_dir_all(&spool);
    section.notes.push(format!(
        "{seconds} s each, after 6 s past the `watching` line; CPU of every thread (schedstat, ns) and of the reaped canaries; wake-ups are the threads' context switches."
    ));
    section.notes.push(
        "The package managers are renamed in a rules overlay so that trees others run on a shared machine are not counted; the rest is the default rules: the credential table's directories watched by inotify (a full rescan every 60 s), the canary every 5 s, the pinned set's heartbeat every second."
            .into(),
    );
    section.notes.push(
        "Before this section existed (issue 11): 0.70 s of CPU per idle minute (1.2% of a core), from 10 ms ring polls, 5 s rescans and canaries."
            .into(),
    );
    section.json = json!({ "seconds": seconds, "configurations": figures });
    Ok(section)
}
