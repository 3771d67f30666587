//! Sections 3 and 5: how many events from marked processes the agent takes without loss (and
//! whether the loss above that is counted exactly), its memory, and its start-up.

use std::{
    fs,
    io::{BufRead, BufReader, Write},
    os::unix::fs::symlink,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::{
    bench::{
        cpu_seconds, fmt, median, parse_summary, say, signal, start_watch, timed, wait_or_kill, Ctx, Lines, Section,
        Summary,
    },
    bench_syscalls::nan_null,
};

/// A path that does not exist: each open is one event (ENOENT, no path walk), the cheapest open
/// a driver can make, so that as little of the driver's CPU as possible goes to anything else.
const MISSING: &str = "/nonexistent/credwatch-bench";

struct Drive {
    /// Total opens the driver made.
    opens: u64,
    /// The driver processes' own user+system CPU time, summed.
    cpu_ns: u64,
    seconds: f64,
}

fn parse_drive(stdout: &str) -> Result<Drive> {
    let (mut opens, mut cpu_ns) = (0, 0);
    let mut seconds = None;
    for line in stdout.lines() {
        if let Some(n) = line.strip_prefix("opens ") {
            opens += n.trim().parse::<u64>().context("opens")?;
        } else if let Some(n) = line.strip_prefix("cpu_ns ") {
            cpu_ns += n.trim().parse::<u64>().context("cpu_ns")?;
        } else if let Some(s) = line.strip_prefix("seconds ") {
            seconds = Some(s.trim().parse::<f64>().context("seconds")?);
        }
    }
    Ok(Drive { opens, cpu_ns, seconds: seconds.context("the driver printed no `seconds`")? })
}

/// One flood: what the driver did, what the agent says it received and lost, and the agent's own
/// CPU time over the flood.
struct Flood {
    drive: Drive,
    summary: Summary,
    agent_cpu_ns: f64,
}

/// `credwatch run -- opener RATE SECONDS MISSING PROCS 0 hold`. The driver waits on its stdin
/// (inherited through the agent) before and after the flood, so that the agent's CPU time is read
/// once it is attached and again once it has drained the flood, before its shut-down.
fn run_driver(ctx: &Ctx, rate: u64, seconds: f64, procs: u32) -> Result<Flood> {
    let mut child = Command::new(&ctx.credwatch)
        .args(["run", "--"])
        .arg(ctx.bin.join("opener"))
        .args([rate.to_string(), seconds.to_string(), MISSING.to_owned(), procs.to_string()])
        .args(["0", "hold"])
        .env("HOME", &ctx.home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting credwatch run -- opener")?;
    let agent = child.id();
    let mut go = child.stdin.take().context("the agent's stdin")?;
    let stdout = Lines::new(child.stdout.take().context("the agent's stdout")?);
    let stderr = Lines::new(child.stderr.take().context("the agent's stderr")?);
    let measured = (|| -> Result<f64> {
        stdout.wait_for("ready", Duration::from_secs(60)).context("waiting for the driver under credwatch run")?;
        let before = cpu_seconds(agent);
        go.write_all(b"go\n").context("starting the driver")?;
        stdout
            .wait_for("seconds ", Duration::from_secs_f64(seconds + 60.0))
            .context("waiting for the driver to finish")?;
        Ok((settled_cpu_seconds(agent) - before) * 1e9)
    })();
    // Closing its stdin lets the driver exit (or give up waiting, after an error).
    drop(go);
    let status = wait_or_kill(&mut child, Duration::from_secs(60))?;
    thread::sleep(Duration::from_millis(50));
    let stderr = stderr.text();
    if !status.success() {
        bail!("credwatch run -- opener failed ({status}): {}", stderr.trim());
    }
    let agent_cpu_ns = measured?;
    let drive = parse_drive(&stdout.text())?;
    let summary = parse_summary(&stderr).with_context(|| format!("no summary from the agent: {}", stderr.trim()))?;
    Ok(Flood { drive, summary, agent_cpu_ns })
}

/// The CPU seconds of `pid` once they stop growing (the agent has drained its ring buffer): read
/// every 100 ms until two readings agree, for 5 s at most.
fn settled_cpu_seconds(pid: u32) -> f64 {
    let mut last = cpu_seconds(pid);
    for _ in 0..50 {
        thread::sleep(Duration::from_millis(100));
        let now = cpu_seconds(pid);
        if now == last {
            break;
        }
        last = now;
    }
    last
}

pub fn throughput(ctx: &mut Ctx) -> Result<Section> {
    // (total rate, processes); rate 0 = as fast as the processes go.
    let steps: &[(u64, u32)] = if ctx.quick {
        &[(100_000, 1), (0, 2)]
    } else {
        &[(50_000, 1), (100_000, 1), (200_000, 1), (300_000, 1), (400_000, 2), (0, 1), (0, 2)]
    };
    let seconds = if ctx.quick { 1.0 } else { 2.0 };
    let mut section = Section::new(
        "throughput",
        "3. Event throughput (marked driver under `credwatch run`)",
        &[
            "asked opens/s",
            "procs",
            "made opens/s",
            "opens made",
            "events received",
            "lost (agent)",
            "zero loss",
            "driver CPU ns/open",
            "agent CPU ns/event",
        ],
    );
    let mut steps_json = Vec::new();
    let mut best_zero_loss = 0.0f64;
    // Driver CPU ns per open, step by step (the producer's own cost).
    let mut ns_per_open_of_steps = Vec::new();
    let (mut agent_cpu_ns, mut agent_events) = (0.0, 0);
    for &(rate, procs) in steps {
        let Flood { drive, summary, agent_cpu_ns: flood_cpu_ns } = run_driver(ctx, rate, seconds, procs)?;
        let made = drive.opens as f64 / drive.seconds;
        if summary.lost == 0 {
            best_zero_loss = best_zero_loss.max(made);
        }
        let ns_per_open = drive.cpu_ns as f64 / drive.opens as f64;
        let ns_per_event = flood_cpu_ns / summary.events as f64;
        ns_per_open_of_steps.push(ns_per_open);
        agent_cpu_ns += flood_cpu_ns;
        agent_events += summary.events;
        section.rows.push(vec![
            if rate == 0 { "max".into() } else { rate.to_string() },
            procs.to_string(),
            fmt(made, 0),
            drive.opens.to_string(),
            summary.events.to_string(),
            summary.lost.to_string(),
            if summary.lost == 0 { "yes".into() } else { "no".into() },
            fmt(ns_per_open, 0),
            fmt(ns_per_event, 0),
        ]);
        steps_json.push(json!({
            "asked_rate": rate, "procs": procs, "made_rate": made, "opens": drive.opens, "seconds": drive.seconds,
            "events_received": summary.events, "lost": summary.lost,
            "driver_cpu_ns": drive.cpu_ns, "driver_cpu_ns_per_open": nan_null(ns_per_open),
            "agent_cpu_ns": nan_null(flood_cpu_ns), "agent_cpu_ns_per_event": nan_null(ns_per_event),
        }));
    }
    // (a) the producer's ceiling and (b) the consumer's capacity, from the floods above.
    let cores = thread::available_parallelism().map_or(1, usize::from) as f64;
    // The cheapest step: the ceiling is the most generous that the run supports.
    let producer_ns = ns_per_open_of_steps.iter().copied().filter(|v| v.is_finite()).fold(f64::NAN, f64::min);
    let producer_ceiling = cores * 1e9 / producer_ns;
    let consumer_ns = agent_cpu_ns / agent_events as f64;
    let consumer_one_core = 1e9 / consumer_ns;
    let shared_bound = cores * 1e9 / (producer_ns + consumer_ns);
    // SAFETY: sysconf has no preconditions.
    let clock_ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };

    // Exact accounting: a flood recorded to a trace while the agent is stopped for a while (its
    // ring buffer fills, the kernel counts what it drops), opens counted in the trace.
    let trace = ctx.work.join("flood.jsonl");
    let flood_seconds = if ctx.quick { 2.0 } else { 3.0 };
    let stall = Duration::from_millis(500);
    let record = Command::new(&ctx.credwatch)
        .args(["record", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(ctx.bin.join("opener"))
        .args(["0".to_owned(), flood_seconds.to_string(), MISSING.to_owned(), "2".to_owned()])
        .env("HOME", &ctx.home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting credwatch record -- opener")?;
    let waited = Instant::now();
    // Events flowing: the trace has grown past its header and the first execs.
    while fs::metadata(&trace).map_or(0, |m| m.len()) < 1 << 20 && waited.elapsed() < Duration::from_secs(10) {
        thread::sleep(Duration::from_millis(10));
    }
    signal(record.id(), libc::SIGSTOP);
    thread::sleep(stall);
    signal(record.id(), libc::SIGCONT);
    let output = record.wait_with_output().context("waiting for credwatch record")?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        bail!("credwatch record -- opener failed ({}): {}", output.status, stderr.trim());
    }
    let drive = parse_drive(&String::from_utf8_lossy(&output.stdout))?;
    let (received, lost_in_trace) = count_trace(&trace)?;
    let _ = fs::remove_file(&trace);
    let summary = parse_summary(&stderr).unwrap_or_default();
    let missed = drive.opens as i64 - received as i64;
    let exact = missed == lost_in_trace as i64;
    section.notes.push(format!(
        "Each step drives opens of a missing path for {seconds} s (one event each, no path walk: the cheapest event). The agent's ring buffer is 16 MiB; it polls every 50 ms and is woken past 4 MiB."
    ));
    section.notes.push(format!("Highest rate with zero loss: **{} events/s**.", fmt(best_zero_loss, 0)));
    section.notes.push(format!(
        "(a) Producer's ceiling: one event-producing open costs the marked driver **{} ns** of its own user+system CPU (the syscall and credwatch's eBPF programs in it; `getrusage` of each driver process; the cheapest step, so that the ceiling is the most generous this run supports), so {cores:.0} cores doing nothing but opens could make at most **{} events/s** ({} per core).",
        fmt(producer_ns, 0),
        fmt(producer_ceiling, 0),
        fmt(producer_ceiling / cores, 0),
    ));
    section.notes.push(format!(
        "(b) Consumer's capacity: the agent used **{} ns** of CPU per event received ({} ms of utime+stime from /proc/PID/stat, in 1/{clock_ticks} s ticks, read once it was attached and again once it had drained each flood, over {agent_events} events), so one core of agent could take **{} events/s**. Producer and agent sharing the {cores:.0} cores: at most {} events/s.",
        fmt(consumer_ns, 0),
        fmt(agent_cpu_ns / 1e6, 0),
        fmt(consumer_one_core, 0),
        fmt(shared_bound, 0),
    ));
    section.notes.push(format!(
        "{} {}",
        if producer_ceiling < 1e6 {
            format!(
                "The measured zero-loss rate ({} /s) is bounded by (a): this machine cannot produce 1M events/s from marked processes ({} /s at most on {cores:.0} cores with nothing else running), so the target cannot be shown here.",
                fmt(best_zero_loss, 0),
                fmt(producer_ceiling, 0)
            )
        } else {
            format!(
                "(a) is above 1M events/s ({} /s), so the producer alone does not bound the measured zero-loss rate ({} /s).",
                fmt(producer_ceiling, 0),
                fmt(best_zero_loss, 0)
            )
        },
        if consumer_one_core >= 1e6 {
            format!("(b) would reach 1M events/s: one core of agent takes {} /s.", fmt(consumer_one_core, 0))
        } else if consumer_one_core.is_finite() {
            format!(
                "(b) would not reach 1M events/s: one core of agent takes {} /s, {:.1}× short.",
                fmt(consumer_one_core, 0),
                1e6 / consumer_one_core
            )
        } else {
            "(b) could not be measured.".to_owned()
        }
    ));
    section.notes.push(format!(
        "Loss accounting (`credwatch record` of a 2-process flood, {flood_seconds} s, the agent stopped with SIGSTOP for {} ms meanwhile): driver made {} opens, the trace has {received} of them, so {missed} missed; `lost` events in the trace count {lost_in_trace} (agent summary: {} lost): {}.",
        stall.as_millis(),
        drive.opens,
        summary.lost,
        if exact { "exact" } else { "**not exact**" }
    ));
    section.json = json!({
        "steps": steps_json,
        "max_zero_loss_rate": best_zero_loss,
        "producer": {
            "driver_cpu_ns_per_open": nan_null(producer_ns),
            "from": "the cheapest step",
            "steps_ns_per_open": ns_per_open_of_steps,
            "cores": cores,
            "ceiling_events_per_s": nan_null(producer_ceiling),
            "ceiling_events_per_s_one_core": nan_null(producer_ceiling / cores),
        },
        "consumer": {
            "agent_cpu_ns_per_event": nan_null(consumer_ns),
            "agent_cpu_ns": agent_cpu_ns,
            "events_received": agent_events,
            "clock_ticks_per_s": clock_ticks,
            "events_per_s_one_core": nan_null(consumer_one_core),
        },
        "producer_and_consumer_sharing_cores_events_per_s": nan_null(shared_bound),
        "accounting": {
            "opens_made": drive.opens, "opens_in_trace": received, "missed": missed,
            "lost_in_trace": lost_in_trace, "lost_in_summary": summary.lost, "exact": exact,
        },
    });
    ctx.target(
        "events/s with zero loss",
        format!(
            "{} /s (producer's ceiling on {cores:.0} cores: {} /s; agent on one core: {} /s)",
            fmt(best_zero_loss, 0),
            fmt(producer_ceiling, 0),
            fmt(consumer_one_core, 0)
        ),
        "≥ 1,000,000 /s",
        Some(best_zero_loss >= 1e6),
    );
    ctx.target(
        "loss counted exactly (missed = lost)",
        format!("missed {missed}, lost {lost_in_trace}"),
        "equal",
        Some(exact),
    );
    Ok(section)
}

/// Opens of [`MISSING`] in a trace, and the sum of its `lost` events of the ring buffer.
fn count_trace(trace: &Path) -> Result<(u64, u64)> {
    let file = fs::File::open(trace).with_context(|| format!("opening {}", trace.display()))?;
    let needle = format!("\"path\":\"{MISSING}\"");
    let (mut opens, mut lost) = (0, 0);
    for line in BufReader::with_capacity(1 << 20, file).lines() {
        let line = line?;
        if line.contains("\"kind\":\"open\"") && line.contains(&needle) {
            opens += 1;
        } else if line.contains("\"kind\":\"lost\"") {
            let event: Value = serde_json::from_str(&line).context("a lost event")?;
            if event["source"] == "events" {
                lost += event["count"].as_u64().unwrap_or(0);
            }
        }
    }
    Ok((opens, lost))
}

/// kB figures of /proc/PID/status, and the resident size of eBPF map mappings (the ring buffer
/// is the only map the agent maps) from /proc/PID/smaps.
fn memory(pid: u32) -> Result<Value> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).context("reading the agent's status")?;
    let kb = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let smaps = fs::read_to_string(format!("/proc/{pid}/smaps")).context("reading the agent's smaps")?;
    let (mut in_bpf, mut bpf_rss, mut bpf_size) = (false, 0u64, 0u64);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            in_bpf = line.contains("bpf");
        } else if in_bpf {
            let value = || line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            if line.starts_with("Rss:") {
                bpf_rss += value();
            } else if line.starts_with("Size:") {
                bpf_size += value();
            }
        }
    }
    Ok(json!({
        "vm_rss_kb": kb("VmRSS:"), "vm_hwm_kb": kb("VmHWM:"), "rss_anon_kb": kb("RssAnon:"),
        "rss_file_kb": kb("RssFile:"), "rss_shmem_kb": kb("RssShmem:"),
        "bpf_map_mappings_rss_kb": bpf_rss, "bpf_map_mappings_size_kb": bpf_size,
    }))
}

fn mb(value: &Value, key: &str) -> String {
    fmt(value[key].as_u64().map_or(f64::NAN, |kb| kb as f64 / 1024.0), 1)
}

pub fn memory_and_start_up(ctx: &mut Ctx) -> Result<Section> {
    let rounds = ctx.rounds(5);
    let mut section = Section::new("memory", "5. Agent memory and start-up", &["figure", "value"]);

    // Start-up: the agent's own figure, the spawn-to-line time, and a first event end to end.
    let (mut reported, mut to_line, mut first_alert) = (Vec::new(), Vec::new(), Vec::new());
    let (mut shutdown, mut run_true) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (agent, ms, line_ms) = start_watch(ctx)?;
        let stopping = Instant::now();
        agent.stop()?;
        shutdown.push(stopping.elapsed().as_secs_f64() * 1e3);
        reported.push(ms);
        to_line.push(line_ms);
        first_alert.push(first_alert_ms(ctx)?);
        let (seconds, _) = timed(Command::new(&ctx.credwatch).args(["run", "--", "true"]).env("HOME", &ctx.home))?;
        run_true.push(seconds * 1e3);
    }

    // Memory: steady (idle after attach), then after a million events from a marked tree.
    let (agent, _, _) = start_watch(ctx)?;
    thread::sleep(Duration::from_secs(if ctx.quick { 1 } else { 3 }));
    let steady = memory(agent.pid())?;
    let events = if ctx.quick { 200_000 } else { 1_000_000 };
    // An exec whose basename is a manager's makes a root under `watch`: a symlink named npm.
    let manager_dir = ctx.work.join("manager");
    fs::create_dir_all(&manager_dir)?;
    let npm = manager_dir.join("npm");
    let _ = fs::remove_file(&npm);
    symlink(ctx.bin.join("opener"), &npm).context("linking the driver as `npm`")?;
    let started = Instant::now();
    let (_, output) = timed(Command::new(&npm).args(["0", "120", MISSING, "2", &(events / 2).to_string()]))?;
    let drive = parse_drive(&String::from_utf8_lossy(&output.stdout))?;
    let drive_seconds = started.elapsed().as_secs_f64();
    thread::sleep(Duration::from_secs(1));
    let after = memory(agent.pid())?;
    let stderr = agent.stop()?;
    let summary = parse_summary(&stderr).unwrap_or_default();

    let steady_rss = steady["vm_rss_kb"].as_u64().unwrap_or(0) as f64 / 1024.0;
    let rows = [
        ("attached, agent's own figure (`after N ms`), median", format!("{} ms", fmt(median(&reported), 0))),
        ("spawn to the `watching` line, median", format!("{} ms", fmt(median(&to_line), 0))),
        (
            "`credwatch run -- cat ~/.npmrc`: spawn to the alert on stdout, median",
            format!("{} ms", fmt(median(&first_alert), 0)),
        ),
        (
            "`watch` shutdown: SIGTERM to exit (detaching the programs), median",
            format!("{} ms", fmt(median(&shutdown), 0)),
        ),
        ("`credwatch run -- true`: wall, median", format!("{} ms", fmt(median(&run_true), 0))),
        ("steady VmRSS (idle, attached)", format!("{} MB", mb(&steady, "vm_rss_kb"))),
        (
            "steady: of which ring buffer / eBPF map mappings resident",
            format!(
                "{} MB (mapped {} MB)",
                mb(&steady, "bpf_map_mappings_rss_kb"),
                mb(&steady, "bpf_map_mappings_size_kb")
            ),
        ),
        (
            "steady: RssAnon (heap and stacks) / RssFile (binary)",
            format!("{} / {} MB", mb(&steady, "rss_anon_kb"), mb(&steady, "rss_file_kb")),
        ),
        ("after events: VmRSS / VmHWM (peak)", format!("{} / {} MB", mb(&after, "vm_rss_kb"), mb(&after, "vm_hwm_kb"))),
        (
            "after events: ring buffer resident / RssAnon",
            format!("{} / {} MB", mb(&after, "bpf_map_mappings_rss_kb"), mb(&after, "rss_anon_kb")),
        ),
        (
            "events driven (2 marked processes, missing-path opens)",
            format!(
                "{} opens in {:.1} s; agent: {} events, {} lost",
                drive.opens, drive_seconds, summary.events, summary.lost
            ),
        ),
    ];
    for (figure, value) in rows {
        section.rows.push(vec![figure.to_owned(), value]);
    }
    section.notes.push(format!("{rounds} start-up round(s). The first-alert time includes the agent's 50 ms poll interval (records are not woken per event)."));
    section.notes.push("Ring buffer pages are shared memory mapped from the kernel: VmRSS counts the pages touched (RssShmem), although they are the kernel map's, not the agent's heap.".into());
    section.json = json!({
        "start_up": {
            "attached_reported_ms": { "median": nan_null(median(&reported)), "rounds": reported },
            "spawn_to_line_ms": { "median": nan_null(median(&to_line)), "rounds": to_line },
            "first_alert_ms": { "median": nan_null(median(&first_alert)), "rounds": first_alert },
            "watch_shutdown_ms": { "median": nan_null(median(&shutdown)), "rounds": shutdown },
            "run_true_wall_ms": { "median": nan_null(median(&run_true)), "rounds": run_true },
        },
        "memory_steady": steady,
        "memory_after_events": after,
        "events": { "opens": drive.opens, "seconds": drive_seconds, "received": summary.events, "lost": summary.lost },
    });
    ctx.target("steady RSS (VmRSS)", format!("{steady_rss:.1} MB"), "≤ 30 MB", Some(steady_rss <= 30.0));
    let ring = steady["bpf_map_mappings_rss_kb"].as_u64().unwrap_or(0) as f64 / 1024.0;
    ctx.target(
        "steady RSS less the ring buffer mapping (the agent's own)",
        format!("{:.1} MB (ring {ring:.1} MB)", steady_rss - ring),
        "≤ 30 MB",
        Some(steady_rss - ring <= 30.0),
    );
    let attached = median(&reported);
    ctx.target(
        "attached after start (agent's figure; spawn to line)",
        format!("{} ms; {} ms", fmt(attached, 0), fmt(median(&to_line), 0)),
        "≤ 150 ms",
        attached.is_finite().then_some(attached <= 150.0),
    );
    Ok(section)
}

/// `credwatch run --json -- cat HOME/.npmrc` (a fake HOME): milliseconds from spawn to the alert
/// line on stdout.
fn first_alert_ms(ctx: &Ctx) -> Result<f64> {
    let started = Instant::now();
    let mut child = Command::new(&ctx.credwatch)
        .args(["run", "--json", "--", "cat"])
        .arg(ctx.home.join(".npmrc"))
        .env("HOME", &ctx.home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting credwatch run")?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut elapsed = f64::NAN;
    for line in BufReader::new(stdout).lines() {
        if line?.contains("\"rule\"") {
            elapsed = started.elapsed().as_secs_f64() * 1e3;
            break;
        }
    }
    wait_or_kill(&mut child, Duration::from_secs(20))?;
    if elapsed.is_nan() {
        say("bench: `credwatch run -- cat ~/.npmrc` gave no alert");
    }
    Ok(elapsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_driver_processes() {
        let drive = parse_drive("ready\nopens 10\ncpu_ns 900\nopens 32\ncpu_ns 100\nseconds 1.5\n").unwrap();
        assert_eq!(drive.opens, 42);
        assert_eq!(drive.cpu_ns, 1000);
        assert_eq!(drive.seconds, 1.5);
        assert!(parse_drive("opens 3\n").is_err());
    }
}
