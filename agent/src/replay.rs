//! `credwatch replay`: traces through the same pipeline, engine and rules as the live modes,
//! with the same alert output. Files are replayed in parallel, each with an engine of its own (traces are
//! separate histories), each streamed in constant memory.

use std::{
    io::IsTerminal as _,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use credwatch_core::{
    alert::Alert,
    engine::{Engine, EngineOptions},
    event::Event,
    import::{self, Format, ImportError, ImportOptions},
    incident::{self, Incident},
    output::{escape, AlertSink},
    pipeline::{self, Control, Sink, SinkError},
    report::Report,
    rules::RuleSet,
};
use credwatch_outputs::{Dispatcher, OutputConfig};
use indicatif::{ProgressBar, ProgressStyle};

use crate::delivery::{start_outputs, stop_outputs, ALERT_EXIT_STATUS};

/// Bad lines reported one by one under `--keep-going`; past this only the count is given.
pub const BAD_LINES_SHOWN: u64 = 10;
/// How often the progress line on a terminal is updated.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);
/// The progress line: the input files' bytes read (compressed bytes for compressed files).
const PROGRESS_TEMPLATE: &str = "replaying: {bar:30} {percent:>3}% of {total_bytes}, {msg}";

pub struct ReplayOptions<'a> {
    pub json: bool,
    pub rules: Option<&'a Path>,
    /// Skip and count bad lines instead of stopping at the first.
    pub keep_going: bool,
    pub alerts_file: Option<&'a Path>,
    /// Print a responder's report instead of each alert.
    pub report: Option<ReportFormat>,
    /// The files' format; detected from each file's first bytes when None.
    pub from: Option<Format>,
    pub import: ImportOptions,
    /// `--watch-project`, `--home`, `--passwd` (the host name comes from each file).
    pub engine: EngineOptions,
    /// `--to DEST`: alerts also go there (for responders feeding their own pipeline).
    pub outputs: Vec<OutputConfig>,
    pub spool_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    Text,
    Json,
    Md,
    /// The incident page: one self-contained HTML file (see credwatch-core's `incident`).
    Html,
}

/// What a worker gathers from its files for the report: the page's gatherings for `html`, the
/// report's for the other formats.
struct Gathered {
    report: Option<Report>,
    incident: Option<Incident>,
}

impl Gathered {
    fn new(format: Option<ReportFormat>) -> Gathered {
        let html = format == Some(ReportFormat::Html);
        Gathered { report: format.filter(|_| !html).map(|_| Report::default()), incident: html.then(Incident::default) }
    }

    fn merge(&mut self, other: Gathered) {
        if let (Some(ours), Some(theirs)) = (&mut self.report, other.report) {
            ours.merge(theirs);
        }
        if let (Some(ours), Some(theirs)) = (&mut self.incident, other.incident) {
            ours.merge(theirs);
        }
    }
}

/// What every worker adds to.
#[derive(Default)]
struct Totals {
    events: AtomicU64,
    bad_lines: AtomicU64,
    /// Per open file, the bytes read so far (for progress and MB/s).
    consumed: Mutex<Vec<Arc<AtomicU64>>>,
}

impl Totals {
    fn bytes(&self) -> u64 {
        self.consumed.lock().map(|all| all.iter().map(|c| c.load(Ordering::Relaxed)).sum()).unwrap_or(0)
    }
}

pub fn replay(files: &[PathBuf], options: &ReplayOptions) -> Result<ExitCode> {
    let rules = RuleSet::load(options.rules).context("loading rules")?;
    // With a report, stdout carries the report: alerts go only to the alerts file.
    let sink = Mutex::new(
        AlertSink::new(options.json, options.alerts_file, options.report.is_some())
            .with_context(|| format!("opening {}", options.alerts_file.unwrap_or(Path::new("")).display()))?,
    );
    let dispatcher = start_outputs(&options.outputs, options.spool_dir.as_deref())?.map(Mutex::new);
    let totals = Totals::default();
    // strace -ff files of one run are one history: one engine, one worker.
    let groups = import::group_inputs(files, options.from);
    let next_file = AtomicUsize::new(0);
    let workers = thread::available_parallelism().map_or(1, usize::from).min(groups.len()).max(1);
    let total_size: Option<u64> = files.iter().map(|f| std::fs::metadata(f).ok().map(|m| m.len())).sum();
    let show_progress = std::io::stderr().is_terminal() && total_size.is_some_and(|size| size > 0);
    let started = Instant::now();

    let results: Vec<Result<Gathered>> = thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut gathered = Gathered::new(options.report);
                    loop {
                        let index = next_file.fetch_add(1, Ordering::Relaxed);
                        let Some(group) = groups.get(index) else { return Ok(gathered) };
                        let (file, shared) = ((index, group.as_slice()), (&sink, dispatcher.as_ref()));
                        replay_file(file, &rules, shared, &mut gathered, options, &totals)?;
                    }
                })
            })
            .collect();
        if let Some(total_size) = total_size.filter(|_| show_progress) {
            // indicatif draws on stderr, no more often than it is worth, and clears the line.
            let style =
                ProgressStyle::with_template(PROGRESS_TEMPLATE).unwrap_or_else(|_| ProgressStyle::default_bar());
            let progress = ProgressBar::new(total_size).with_style(style);
            while !handles.iter().all(|h| h.is_finished()) {
                thread::sleep(PROGRESS_INTERVAL);
                let seconds = started.elapsed().as_secs_f64().max(1e-9);
                progress.set_position(totals.bytes());
                progress.set_message(format!("{:.0} events/s", totals.events.load(Ordering::Relaxed) as f64 / seconds));
            }
            progress.finish_and_clear();
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a replay thread panicked"))))
            .collect()
    });

    let mut gathered = Gathered::new(options.report);
    for result in results {
        gathered.merge(result?);
    }
    if let Some(dispatcher) = dispatcher {
        let dispatcher = dispatcher.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner());
        stop_outputs(dispatcher);
    }
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    let events = totals.events.load(Ordering::Relaxed);
    let alerts = sink.lock().map(|s| s.written()).unwrap_or(0);
    if let (Some(report), Some(format)) = (&gathered.report, options.report) {
        match format {
            ReportFormat::Text => print!("{}", report.to_text()),
            ReportFormat::Md => print!("{}", report.to_markdown()),
            ReportFormat::Json => {
                println!("{}", serde_json::to_string_pretty(report).context("serialising the report")?)
            }
            ReportFormat::Html => {}
        }
    }
    if let Some(incident) = &gathered.incident {
        print!("{}", incident::render(incident, &incident::Origin::Replay { files: files.len() }));
    }
    tracing::info!(
        "replayed {} file(s): {events} events, {alerts} alerts, {} bad lines skipped in {seconds:.1}s ({:.0} events/s, {:.1} MB/s)",
        files.len(),
        totals.bad_lines.load(Ordering::Relaxed),
        events as f64 / seconds,
        totals.bytes() as f64 / 1e6 / seconds,
    );
    Ok(if alerts > 0 { ExitCode::from(ALERT_EXIT_STATUS) } else { ExitCode::SUCCESS })
}

/// Counts events for the progress display and the summary.
struct Counted<'a>(&'a AtomicU64);

impl Sink for Counted<'_> {
    fn event(&mut self, _: &Engine, _: &Event, _: &[Alert]) -> Result<(), SinkError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn released(&mut self, _: &Engine, _: &[Alert]) -> Result<(), SinkError> {
        Ok(())
    }
}

/// The outputs shared by the replay's workers: locked only to hand alerts over.
struct SharedOutputs<'a>(&'a Mutex<Dispatcher>);

impl Sink for SharedOutputs<'_> {
    fn event(&mut self, engine: &Engine, event: &Event, alerts: &[Alert]) -> Result<(), SinkError> {
        if alerts.is_empty() {
            return Ok(());
        }
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).event(engine, event, alerts)
    }

    fn released(&mut self, engine: &Engine, alerts: &[Alert]) -> Result<(), SinkError> {
        if alerts.is_empty() {
            return Ok(());
        }
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).released(engine, alerts)
    }

    fn end(&mut self, alerts: &[Alert]) -> Result<(), SinkError> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).end(alerts)
    }
}

/// Replays file group `index` to the shared alert sink and outputs, and into `gathered`.
fn replay_file(
    (index, group): (usize, &[PathBuf]),
    rules: &RuleSet,
    (sink, dispatcher): (&Mutex<AlertSink>, Option<&Mutex<Dispatcher>>),
    gathered: &mut Gathered,
    options: &ReplayOptions,
    totals: &Totals,
) -> Result<()> {
    let mut reader = import::open_group(group, options.from, &options.import)?;
    totals.consumed.lock().map_err(|_| anyhow::anyhow!("progress lock poisoned"))?.push(reader.consumed());
    // The recording's identity, so that a replay's alerts are the live ones; another tool's
    // trace was watched by no credwatch: this one names itself.
    let engine_options = EngineOptions {
        host_name: reader.host().unwrap_or_default(),
        host_id: reader.host_id(),
        agent_version: Some(reader.agent_version().unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned())),
        ..options.engine.clone()
    };
    let host = engine_options.host_name.clone();
    let mut engine = Engine::new(rules.clone(), engine_options);
    let (mut counted, mut output) = (Counted(&totals.events), sink);
    let mut sinks: Vec<&mut dyn Sink> = vec![&mut counted, &mut output];
    let mut outputs = dispatcher.map(SharedOutputs);
    if let Some(outputs) = &mut outputs {
        sinks.push(outputs);
    }
    if let Some(report) = &mut gathered.report {
        sinks.push(report);
    }
    if let Some(incident) = &mut gathered.incident {
        incident.begin_source(index as u32, &host);
        sinks.push(incident);
    }
    let mut skip = |error: &ImportError| {
        if totals.bad_lines.fetch_add(1, Ordering::Relaxed) < BAD_LINES_SHOWN {
            tracing::warn!("skipped {}", escape(&error.to_string()));
        }
    };
    let skip = options.keep_going.then_some(&mut skip as &mut dyn FnMut(&ImportError));
    // Each file to its end: sweep summaries of trees still running come out then.
    pipeline::drive(&mut *reader, &mut engine, &mut sinks, skip, |_, _| Control::Continue)?;
    Ok(())
}
