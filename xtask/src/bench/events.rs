//! Sections 3 and 5: how many events from marked processes the agent takes without loss (and
//! whether the loss above that is counted exactly), its memory, and its start-up.

use std::{
    fs,
    io::{BufRead, BufReader, Write},
    os::unix::fs::symlink,
    path::Path,
    process::{Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::{
    cpu_seconds, fmt, median, parse_summary, say, signal, start_watch, syscalls::nan_null, timed, wait_or_kill, Ctx,
    Lines, Section, Summary,
};

/// A path that does not exist: each open is one event (ENOENT, no path walk), the cheapest open
/// a driver can make, so that as little of the driver's CPU as possible goes to anything else.
pub const MISSING: &str = "/nonexistent/credwatch-bench";

/// io_uring requests per `io_uring_enter` of the `uring` driver.
const URING_BATCH: u32 = 256;

/// Exit status of `credwatch run` when an alert fired.
const RUN_ALERTED: i32 = 10;

/// `map_type` of a ring buffer in /proc/PID/fdinfo (`BPF_MAP_TYPE_RINGBUF`).
const BPF_MAP_TYPE_RINGBUF: u64 = 27;

/// A marked driver of events, run under `credwatch run` (see [`run_driver`]).
#[derive(Clone, Copy)]
enum Driver {
    /// `opener`: `procs` processes open [`MISSING`], one event per open.
    Opens { procs: u32 },
    /// `uring`: one process submits io_uring no-ops, `batch` per `io_uring_enter`, one event per
    /// request.
    Uring { batch: u32 },
}

impl Driver {
    fn program(self) -> &'static str {
        match self {
            Driver::Opens { .. } => "opener",
            Driver::Uring { .. } => "uring",
        }
    }

    /// The driver's arguments for a held flood of `rate` events/s (0: as fast as it goes).
    fn args(self, rate: u64, seconds: f64) -> Vec<String> {
        let (rate, seconds) = (rate.to_string(), seconds.to_string());
        match self {
            Driver::Opens { procs } => {
                vec![rate, seconds, MISSING.to_owned(), procs.to_string(), "0".to_owned(), "hold".to_owned()]
            }
            Driver::Uring { batch } => vec![rate, seconds, batch.to_string(), "hold".to_owned()],
        }
    }

    /// Whether `credwatch run` ended as a good flood does: the `uring` driver's io_uring_setup
    /// raises the `io-uring-by-package` alert (status 10), which is detection working.
    fn ran(self, status: ExitStatus) -> bool {
        status.success() || matches!(self, Driver::Uring { .. }) && status.code() == Some(RUN_ALERTED)
    }
}

struct Drive {
    /// Total events the driver made (opens, or io_uring submissions).
    events: u64,
    /// The driver processes' own user+system CPU time, summed.
    cpu_ns: u64,
    seconds: f64,
}

/// The output of `opener` (`opens N` and `cpu_ns N` per process) or `uring` (`events N`).
fn parse_drive(stdout: &str) -> Result<Drive> {
    let (mut events, mut cpu_ns) = (0, 0);
    let mut seconds = None;
    for line in stdout.lines() {
        if let Some(n) = line.strip_prefix("opens ").or_else(|| line.strip_prefix("events ")) {
            events += n.trim().parse::<u64>().context("opens or events")?;
        } else if let Some(n) = line.strip_prefix("cpu_ns ") {
            cpu_ns += n.trim().parse::<u64>().context("cpu_ns")?;
        } else if let Some(s) = line.strip_prefix("seconds ") {
            seconds = Some(s.trim().parse::<f64>().context("seconds")?);
        }
    }
    Ok(Drive { events, cpu_ns, seconds: seconds.context("the driver printed no `seconds`")? })
}

/// No loss in a flood: the agent counted none lost and received at least every event the driver
/// made (its count also has the driver's own exec, exit and set-up records, a handful).
fn zero_loss(made: u64, summary: &Summary) -> bool {
    summary.lost == 0 && summary.events >= made
}

/// One flood: what the driver did, what the agent says it received and lost, the agent's own
/// CPU time over the flood, and the size of its largest ring buffer.
struct Flood {
    drive: Drive,
    summary: Summary,
    agent_cpu_ns: f64,
    ring_bytes: Option<u64>,
}

/// `credwatch run -- DRIVER ... hold`. The driver waits on its stdin (inherited through the
/// agent) before and after the flood, so that the agent's CPU time is read once it is attached
/// and again once it has drained the flood, before its shut-down.
fn run_driver(ctx: &Ctx, driver: Driver, rate: u64, seconds: f64) -> Result<Flood> {
    let name = driver.program();
    let mut child = Command::new(&ctx.credwatch)
        .args(["run", "--"])
        .arg(ctx.bin.join(name))
        .args(driver.args(rate, seconds))
        .env("HOME", &ctx.home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting credwatch run -- {name}"))?;
    let agent = child.id();
    let mut go = child.stdin.take().context("the agent's stdin")?;
    let stdout = Lines::new(child.stdout.take().context("the agent's stdout")?);
    let stderr = Lines::new(child.stderr.take().context("the agent's stderr")?);
    let mut ring_bytes = None;
    let measured = (|| -> Result<f64> {
        stdout.wait_for("ready", Duration::from_secs(60)).context("waiting for the driver under credwatch run")?;
        ring_bytes = largest_ring_buffer(agent);
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
    if !driver.ran(status) {
        bail!("credwatch run -- {name} failed ({status}): {}", stderr.trim());
    }
    let agent_cpu_ns = measured?;
    let drive = parse_drive(&stdout.text())?;
    let summary = parse_summary(&stderr).with_context(|| format!("no summary from the agent: {}", stderr.trim()))?;
    Ok(Flood { drive, summary, agent_cpu_ns, ring_bytes })
}

/// The CPU seconds of `pid` once they stop growing (the agent has drained its ring buffer): read
/// every 100 ms until two readings agree, for 5 s at most.
pub fn settled_cpu_seconds(pid: u32) -> f64 {
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

/// Bytes of the largest ring buffer `pid` holds (the agent's bulk one), from /proc/PID/fdinfo.
fn largest_ring_buffer(pid: u32) -> Option<u64> {
    fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .ok()?
        .flatten()
        .filter_map(|entry| ring_buffer_bytes(&fs::read_to_string(entry.path()).ok()?))
        .max()
}

/// `max_entries` (its size in bytes) of a ring buffer's fdinfo; None for anything else.
fn ring_buffer_bytes(fdinfo: &str) -> Option<u64> {
    let field = |key: &str| -> Option<u64> {
        fdinfo.lines().find_map(|line| line.strip_prefix(key)).and_then(|v| v.trim().parse().ok())
    };
    (field("map_type:")? == BPF_MAP_TYPE_RINGBUF).then(|| field("max_entries:")).flatten()
}

/// One step of a throughput table: a flood at an asked rate, and its figures.
struct Step {
    /// Asked events/s; 0: as fast as the driver goes.
    rate: u64,
    flood: Flood,
    /// Events the driver made per second.
    made: f64,
    driver_ns_per_event: f64,
    agent_ns_per_event: f64,
    zero_loss: bool,
}

impl Step {
    fn run(ctx: &Ctx, driver: Driver, rate: u64, seconds: f64) -> Result<Step> {
        let flood = run_driver(ctx, driver, rate, seconds)?;
        let (drive, summary) = (&flood.drive, &flood.summary);
        Ok(Step {
            rate,
            made: drive.events as f64 / drive.seconds,
            driver_ns_per_event: drive.cpu_ns as f64 / drive.events as f64,
            agent_ns_per_event: flood.agent_cpu_ns / summary.events as f64,
            zero_loss: zero_loss(drive.events, summary),
            flood,
        })
    }

    fn asked(&self) -> String {
        if self.rate == 0 {
            "max".to_owned()
        } else {
            self.rate.to_string()
        }
    }

    /// The table row: asked rate, then `leading` (the open table's process count), then what was
    /// made, received and lost, and the CPU each side spent per event.
    fn row(&self, leading: &[String]) -> Vec<String> {
        let Flood { drive, summary, .. } = &self.flood;
        let mut row = vec![self.asked()];
        row.extend_from_slice(leading);
        row.extend([
            fmt(self.made, 0),
            drive.events.to_string(),
            summary.events.to_string(),
            summary.lost.to_string(),
            if self.zero_loss { "yes".into() } else { "no".into() },
            fmt(self.driver_ns_per_event, 0),
            fmt(self.agent_ns_per_event, 0),
        ]);
        row
    }

    fn json(&self) -> Value {
        let Flood { drive, summary, agent_cpu_ns, .. } = &self.flood;
        json!({
            "asked_rate": self.rate, "made_rate": self.made, "events_made": drive.events, "seconds": drive.seconds,
            "events_received": summary.events, "lost": summary.lost, "zero_loss": self.zero_loss,
            "driver_cpu_ns": drive.cpu_ns, "driver_cpu_ns_per_event": nan_null(self.driver_ns_per_event),
            "agent_cpu_ns": nan_null(*agent_cpu_ns), "agent_cpu_ns_per_event": nan_null(self.agent_ns_per_event),
        })
    }
}

/// The fastest zero-loss step (made events/s), if any.
fn best_zero_loss(steps: &[Step]) -> Option<&Step> {
    steps.iter().filter(|step| step.zero_loss).max_by(|a, b| a.made.total_cmp(&b.made))
}

/// What bounds a driver's best zero-loss rate, as far as its steps show.
fn bound(steps: &[Step]) -> String {
    let lossy: Vec<&Step> = steps.iter().filter(|step| !step.zero_loss).collect();
    match lossy.iter().map(|step| step.made).min_by(f64::total_cmp) {
        None => "producer-bound: no step lost".to_owned(),
        Some(lowest) => {
            format!("{} of {} steps lost, the slowest of them at {} /s", lossy.len(), steps.len(), fmt(lowest, 0))
        }
    }
}

/// The agent's CPU ns per event received over `steps`, and the events they count.
fn agent_ns_per_event(steps: &[Step]) -> (f64, f64, u64) {
    let cpu_ns: f64 = steps.iter().map(|step| step.flood.agent_cpu_ns).sum();
    let events: u64 = steps.iter().map(|step| step.flood.summary.events).sum();
    (cpu_ns / events as f64, cpu_ns, events)
}

/// (a) The producer's ceiling and (b) the consumer's capacity, from the open floods.
struct Capacity {
    cores: f64,
    /// Driver CPU ns per open, step by step (the producer's own cost).
    ns_per_open_of_steps: Vec<f64>,
    /// The cheapest step's: the ceiling is the most generous that the run supports.
    producer_ns: f64,
    producer_ceiling: f64,
    consumer_ns: f64,
    agent_cpu_ns: f64,
    agent_events: u64,
    consumer_one_core: f64,
    shared_bound: f64,
    clock_ticks: i64,
}

impl Capacity {
    fn of(opens: &[Step]) -> Capacity {
        let cores = thread::available_parallelism().map_or(1, usize::from) as f64;
        // Driver CPU ns per open, step by step (the producer's own cost).
        let ns_per_open_of_steps: Vec<f64> = opens.iter().map(|step| step.driver_ns_per_event).collect();
        // The cheapest step: the ceiling is the most generous that the run supports.
        let producer_ns = ns_per_open_of_steps.iter().copied().filter(|v| v.is_finite()).fold(f64::NAN, f64::min);
        let producer_ceiling = cores * 1e9 / producer_ns;
        let (consumer_ns, agent_cpu_ns, agent_events) = agent_ns_per_event(opens);
        let consumer_one_core = 1e9 / consumer_ns;
        let shared_bound = cores * 1e9 / (producer_ns + consumer_ns);
        // SAFETY: sysconf has no preconditions.
        let clock_ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        Capacity {
            cores,
            ns_per_open_of_steps,
            producer_ns,
            producer_ceiling,
            consumer_ns,
            agent_cpu_ns,
            agent_events,
            consumer_one_core,
            shared_bound,
            clock_ticks,
        }
    }

    /// (a), (b) and what bounds the zero-loss rate of opens (`opens_best`).
    fn notes(&self, opens_best: f64) -> Vec<String> {
        let Capacity {
            cores,
            producer_ns,
            producer_ceiling,
            consumer_ns,
            agent_cpu_ns,
            agent_events,
            consumer_one_core,
            shared_bound,
            clock_ticks,
            ..
        } = *self;
        let mut notes = Vec::new();
        notes.push(format!(
            "(a) Producer's ceiling: one event-producing open costs the marked driver **{} ns** of its own user+system CPU (the syscall and credwatch's eBPF programs in it; `getrusage` of each driver process; the cheapest step, so that the ceiling is the most generous this run supports), so {cores:.0} cores doing nothing but opens could make at most **{} events/s** ({} per core).",
            fmt(producer_ns, 0),
            fmt(producer_ceiling, 0),
            fmt(producer_ceiling / cores, 0),
        ));
        notes.push(format!(
            "(b) Consumer's capacity: the agent used **{} ns** of CPU per event received ({} ms of utime+stime from /proc/PID/stat, in 1/{clock_ticks} s ticks, read once it was attached and again once it had drained each open flood, over {agent_events} events), so one core of agent could take **{} events/s**. Producer and agent sharing the {cores:.0} cores: at most {} events/s.",
            fmt(consumer_ns, 0),
            fmt(agent_cpu_ns / 1e6, 0),
            fmt(consumer_one_core, 0),
            fmt(shared_bound, 0),
        ));
        notes.push(format!(
            "{} {}",
            if producer_ceiling < 1e6 {
                format!(
                    "The zero-loss rate of opens ({} /s) is bounded by (a): opens from marked processes cannot reach 1M events/s on this machine ({} /s at most on {cores:.0} cores with nothing else running); 3b drives cheaper events.",
                    fmt(opens_best, 0),
                    fmt(producer_ceiling, 0)
                )
            } else {
                format!(
                    "(a) is above 1M events/s ({} /s), so the producer alone does not bound the zero-loss rate of opens ({} /s).",
                    fmt(producer_ceiling, 0),
                    fmt(opens_best, 0)
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
        notes
    }

    fn producer_json(&self) -> Value {
        json!({
            "driver_cpu_ns_per_open": nan_null(self.producer_ns),
            "from": "the cheapest open step",
            "steps_ns_per_open": self.ns_per_open_of_steps,
            "cores": self.cores,
            "ceiling_events_per_s": nan_null(self.producer_ceiling),
            "ceiling_events_per_s_one_core": nan_null(self.producer_ceiling / self.cores),
        })
    }

    fn consumer_json(&self) -> Value {
        json!({
            "agent_cpu_ns_per_event": nan_null(self.consumer_ns),
            "agent_cpu_ns": self.agent_cpu_ns,
            "events_received": self.agent_events,
            "clock_ticks_per_s": self.clock_ticks,
            "events_per_s_one_core": nan_null(self.consumer_one_core),
        })
    }
}

pub fn throughput(ctx: &mut Ctx) -> Result<Section> {
    // (total rate, processes); rate 0 = as fast as the processes go.
    let open_rates: &[(u64, u32)] = if ctx.quick {
        &[(100_000, 1), (0, 2)]
    } else {
        &[(50_000, 1), (100_000, 1), (200_000, 1), (300_000, 1), (400_000, 2), (0, 1), (0, 2)]
    };
    let uring_rates: &[u64] =
        if ctx.quick { &[1_000_000, 0] } else { &[250_000, 500_000, 1_000_000, 1_500_000, 2_000_000, 0] };
    let seconds = if ctx.quick { 1.0 } else { 2.0 };
    let (mut section, opens, opens_json) = open_steps(ctx, open_rates, seconds)?;

    let (mut uring_table, uring) = uring_steps(ctx, uring_rates, seconds)?;

    let capacity = Capacity::of(&opens);
    let (cores, producer_ns) = (capacity.cores, capacity.producer_ns);
    let opens_best = best_zero_loss(&opens).map_or(0.0, |step| step.made);
    let uring_best = best_zero_loss(&uring);
    let uring_best_rate = uring_best.map_or(0.0, |step| step.made);
    let (best, best_driver) =
        if uring_best_rate > opens_best { (uring_best_rate, "uring") } else { (opens_best, "opener") };
    let ring_bytes = opens.iter().chain(&uring).find_map(|step| step.flood.ring_bytes);
    let ring =
        ring_bytes.map_or("of unknown size".to_owned(), |bytes| format!("{} MiB", fmt(bytes as f64 / 1048576.0, 1)));

    let Accounting { flood_seconds, stall, drive, received, lost_in_trace, summary, missed, exact } =
        loss_accounting(ctx)?;
    section.notes.push(format!(
        "Each step drives opens of a missing path for {seconds} s (one event each, no path walk: the cheapest event). The agent's bulk ring buffer is {ring} (the largest ring buffer in its /proc/PID/fdinfo); it reads it every 10 ms while records flow, and is woken by the first record after it caught up or past a fill watermark."
    ));
    section.notes.push(
        "Zero loss (this table and 3b): the agent's summary counts 0 lost **and** at least as many events received as the driver made (the agent's count also has the driver's exec, exit and set-up records, a handful per step).".to_owned(),
    );
    section.notes.push(format!("Highest rate with zero loss from opens: **{} events/s**.", fmt(opens_best, 0)));
    section.notes.extend(capacity.notes(opens_best));
    section.notes.push(format!(
        "Loss accounting (`credwatch record` of a 2-process flood, {flood_seconds} s, the agent stopped with SIGSTOP for {} ms meanwhile): driver made {} opens, the trace has {received} of them, so {missed} missed; `lost` events in the trace count {lost_in_trace} (agent summary: {} lost): {}.",
        stall.as_millis(),
        drive.events,
        summary.lost,
        if exact { "exact" } else { "**not exact**" }
    ));

    let uring_driver_ns =
        uring.iter().map(|step| step.driver_ns_per_event).filter(|v| v.is_finite()).fold(f64::NAN, f64::min);
    let (uring_agent_ns, uring_agent_cpu_ns, uring_agent_events) = agent_ns_per_event(&uring);
    uring_table.notes.push(format!(
        "The driver (xtask/bench/uring.c) submits io_uring no-op requests (`IORING_OP_NOP`), {URING_BATCH} per `io_uring_enter`, at the asked rate for {seconds} s. Every request a marked process submits is an event of credwatch's: the `io_uring:io_uring_submit_req` tracepoint puts a record in the agent's bulk ring buffer, which the agent decodes and runs through the rules like any other event. It exists because an open costs the producer {} ns of CPU here ((a) in 3), so opens cannot offer 1M events/s on {cores:.0} shared cores; a no-op submission costs it {} ns (the cheapest step; credwatch's eBPF program included), so in these steps the agent, not the producer, is what is measured.",
        fmt(producer_ns, 0),
        fmt(uring_driver_ns, 0),
    ));
    uring_table.notes.push(
        "The driver's `io_uring_setup` raises the `io-uring-by-package` alert (package code set up an io_uring), so `credwatch run` exits 10 on these steps: detection working, accepted for this driver only.".to_owned(),
    );
    uring_table.notes.push(format!(
        "The agent used {} ns of CPU per event received over these steps ({} ms over {uring_agent_events} events), so one core of agent could take {} such events/s.",
        fmt(uring_agent_ns, 0),
        fmt(uring_agent_cpu_ns / 1e6, 0),
        fmt(1e9 / uring_agent_ns, 0),
    ));
    // Every record is far larger than 16 bytes (its header alone): below that, the buffer cannot
    // have held the step.
    let ring_per_event =
        uring_best.zip(ring_bytes).map(|(step, bytes)| (step, bytes as f64 / step.flood.drive.events as f64));
    if let Some((step, per_event)) = ring_per_event.filter(|(_, per_event)| *per_event < 16.0) {
        uring_table.notes.push(format!(
            "The bulk ring buffer ({ring}) is {:.1} bytes per event of the fastest zero-loss step ({} events in {:.1} s), far less than one record: it cannot have held that step, so the agent drained it as fast as it was filled.",
            per_event,
            step.flood.drive.events,
            step.flood.drive.seconds,
        ));
    }
    uring_table.notes.push(format!(
        "Highest rate with zero loss from io_uring submissions: **{} events/s**; over both drivers: **{} events/s** ({}).",
        fmt(uring_best_rate, 0),
        fmt(best, 0),
        if best_driver == "uring" { "io_uring submissions" } else { "opens" },
    ));
    section.tables.push(uring_table);

    section.json = json!({
        "steps": opens_json,
        "max_zero_loss_rate": best,
        "max_zero_loss_driver": best_driver,
        "opens_max_zero_loss_rate": opens_best,
        "zero_loss": "lost == 0 and events received >= events made",
        "ring_buffer_bytes": ring_bytes,
        "uring": {
            "driver": "io_uring IORING_OP_NOP submissions (xtask/bench/uring.c)",
            "batch": URING_BATCH,
            "steps": uring.iter().map(Step::json).collect::<Vec<_>>(),
            "max_zero_loss_rate": uring_best_rate,
            "driver_cpu_ns_per_event": nan_null(uring_driver_ns),
            "agent_cpu_ns_per_event": nan_null(uring_agent_ns),
            "agent_cpu_ns": uring_agent_cpu_ns,
            "events_received": uring_agent_events,
        },
        "producer": capacity.producer_json(),
        "consumer": capacity.consumer_json(),
        "producer_and_consumer_sharing_cores_events_per_s": nan_null(capacity.shared_bound),
        "accounting": {
            "opens_made": drive.events, "opens_in_trace": received, "missed": missed,
            "lost_in_trace": lost_in_trace, "lost_in_summary": summary.lost, "exact": exact,
        },
    });
    let (best_name, other_name, other_rate, best_steps, other_steps) = if best_driver == "uring" {
        ("io_uring submissions", "opens", opens_best, &uring, &opens)
    } else {
        ("opens", "io_uring submissions", uring_best_rate, &opens, &uring)
    };
    ctx.target(
        "events/s with zero loss",
        format!(
            "{} /s ({best_name}, {}; {other_name}: {} /s, {})",
            fmt(best, 0),
            bound(best_steps),
            fmt(other_rate, 0),
            bound(other_steps)
        ),
        "≥ 1,000,000 /s",
        Some(best >= 1e6),
    );
    ctx.target(
        "loss counted exactly (missed = lost)",
        format!("missed {missed}, lost {lost_in_trace}"),
        "equal",
        Some(exact),
    );
    Ok(section)
}

/// Section 3's open floods: each of `steps` (total rate, processes; rate 0: as fast as they go)
/// for `seconds`, a row each.
fn open_steps(ctx: &Ctx, steps: &[(u64, u32)], seconds: f64) -> Result<(Section, Vec<Step>, Vec<Value>)> {
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
    let mut opens = Vec::new();
    for &(rate, procs) in steps {
        let step = Step::run(ctx, Driver::Opens { procs }, rate, seconds)?;
        section.rows.push(step.row(&[procs.to_string()]));
        let mut json = step.json();
        json["procs"] = json!(procs);
        opens.push((step, json));
    }
    let (opens, opens_json) = opens.into_iter().unzip();
    Ok((section, opens, opens_json))
}

/// Table 3b's io_uring floods: each of `rates` (0: as fast as the driver goes) for `seconds`.
fn uring_steps(ctx: &Ctx, rates: &[u64], seconds: f64) -> Result<(Section, Vec<Step>)> {
    let mut uring_table = Section::new(
        "throughput",
        "3b. Event throughput, io_uring submissions (marked driver under `credwatch run`)",
        &[
            "asked events/s",
            "made events/s",
            "events made",
            "events received",
            "lost (agent)",
            "zero loss",
            "driver CPU ns/event",
            "agent CPU ns/event",
        ],
    );
    let mut uring = Vec::new();
    for &rate in rates {
        let step = Step::run(ctx, Driver::Uring { batch: URING_BATCH }, rate, seconds)?;
        uring_table.rows.push(step.row(&[]));
        uring.push(step);
    }
    Ok((uring_table, uring))
}

/// What [`loss_accounting`] found.
struct Accounting {
    flood_seconds: f64,
    stall: Duration,
    drive: Drive,
    /// Opens of the flood in the trace.
    received: u64,
    /// The `lost` events of the trace, summed.
    lost_in_trace: u64,
    summary: Summary,
    /// Opens made and not in the trace.
    missed: i64,
    /// Every missed open counted lost.
    exact: bool,
}

/// Exact accounting: a flood recorded to a trace while the agent is stopped for a while (its
/// ring buffer fills, the kernel counts what it drops), opens counted in the trace.
fn loss_accounting(ctx: &Ctx) -> Result<Accounting> {
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
    let missed = drive.events as i64 - received as i64;
    let exact = missed == lost_in_trace as i64;
    Ok(Accounting { flood_seconds, stall, drive, received, lost_in_trace, summary, missed, exact })
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
pub fn memory(pid: u32) -> Result<Value> {
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

/// The figures under the default backend; the budget's are `footprint`'s (tracepoint backend).
pub fn memory_and_start_up(ctx: &Ctx) -> Result<Section> {
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
                drive.events, drive_seconds, summary.events, summary.lost
            ),
        ),
    ];
    for (figure, value) in rows {
        section.rows.push(vec![figure.to_owned(), value]);
    }
    section.notes.push(format!("{rounds} start-up round(s). The first record after the agent caught up wakes it (no fixed poll interval before it)."));
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
        "events": { "opens": drive.events, "seconds": drive_seconds, "received": summary.events, "lost": summary.lost },
    });
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
        assert_eq!(drive.events, 42);
        assert_eq!(drive.cpu_ns, 1000);
        assert_eq!(drive.seconds, 1.5);
        assert!(parse_drive("opens 3\n").is_err());
    }

    #[test]
    fn reads_the_uring_driver() {
        let drive = parse_drive("ready\nevents 1994496\ncpu_ns 2000000000\nseconds 2.000012\n").unwrap();
        assert_eq!((drive.events, drive.cpu_ns, drive.seconds), (1_994_496, 2_000_000_000, 2.000012));
    }

    #[test]
    fn zero_loss_needs_no_loss_and_every_event() {
        let summary = |events, lost| Summary { events, lost };
        // The agent's count has a few records of the driver's own (exec, exit, set-up).
        assert!(zero_loss(1_994_496, &summary(1_994_502, 0)));
        assert!(zero_loss(100, &summary(100, 0)));
        assert!(!zero_loss(1_994_496, &summary(1_994_502, 1)));
        // Nothing counted lost, yet events missing: not zero loss.
        assert!(!zero_loss(1_994_496, &summary(1_994_000, 0)));
    }

    #[test]
    fn only_the_uring_driver_may_alert() {
        use std::os::unix::process::ExitStatusExt;
        let exited = |code: i32| ExitStatus::from_raw(code << 8);
        let (opens, uring) = (Driver::Opens { procs: 1 }, Driver::Uring { batch: URING_BATCH });
        assert!(opens.ran(exited(0)) && uring.ran(exited(0)));
        assert!(!opens.ran(exited(RUN_ALERTED)));
        assert!(uring.ran(exited(RUN_ALERTED)));
        assert!(!uring.ran(exited(1)));
    }

    #[test]
    fn finds_ring_buffers_in_fdinfo() {
        let ring = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t2070\nmap_type:\t27\nkey_size:\t0\nvalue_size:\t0\nmax_entries:\t4194304\nmap_flags:\t0x0\n";
        assert_eq!(ring_buffer_bytes(ring), Some(4 << 20));
        let hash = "map_type:\t1\nkey_size:\t4\nvalue_size:\t8\nmax_entries:\t4096\n";
        assert_eq!(ring_buffer_bytes(hash), None);
        assert_eq!(ring_buffer_bytes("pos:\t0\nflags:\t02\n"), None);
    }
}
