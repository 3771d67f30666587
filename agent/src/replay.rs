//! `credwatch replay`: traces through the same engine and rules as the live modes, with the
//! same alert output.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::Instant,
};

use anyhow::{Context as _, Result};
use credwatch::{
    engine::{Engine, EngineOptions},
    output::{escape, AlertSink},
    report::Report,
    rules::RuleSet,
    trace::{TraceError, TraceReader},
};

use crate::live::ALERT_EXIT_STATUS;

/// Bad lines reported one by one under `--keep-going`; past this only the count is given.
const BAD_LINES_SHOWN: u64 = 10;

pub struct ReplayOptions<'a> {
    pub json: bool,
    pub rules: Option<&'a Path>,
    /// Skip and count bad lines instead of stopping at the first.
    pub keep_going: bool,
    pub alerts_file: Option<&'a Path>,
    /// Print a responder's report instead of each alert.
    pub report: Option<ReportFormat>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    Text,
    Json,
    Md,
}

/// Replays each file in turn, each with an engine of its own (traces are separate histories).
pub fn replay(files: &[PathBuf], options: &ReplayOptions) -> Result<ExitCode> {
    let rules = RuleSet::load(options.rules).context("loading rules")?;
    let mut report = options.report.map(|_| Report::default());
    // With a report, stdout carries the report: alerts go only to the alerts file.
    let quiet = report.is_some();
    let mut sink = AlertSink::new(options.json, options.alerts_file, quiet)
        .with_context(|| format!("opening {}", options.alerts_file.unwrap_or(Path::new("")).display()))?;
    let started = Instant::now();
    let (mut events, mut bad_lines) = (0u64, 0u64);
    for file in files {
        let mut reader = TraceReader::open(file)?;
        let host = reader.header().host.clone();
        let mut engine = Engine::new(rules.clone(), EngineOptions { host_name: host });
        loop {
            match reader.next_event() {
                Ok(Some(event)) => {
                    events += 1;
                    let alerts = engine.handle(&event);
                    for alert in &alerts {
                        sink.write(alert).context("writing an alert")?;
                    }
                    if let Some(report) = &mut report {
                        report.observe(&engine, &event, &alerts);
                    }
                }
                Ok(None) => break,
                Err(error @ TraceError::BadLine { .. }) if options.keep_going => {
                    bad_lines += 1;
                    if bad_lines <= BAD_LINES_SHOWN {
                        eprintln!("credwatch: skipped {}", escape(&error.to_string()));
                    }
                }
                Err(error) => return Err(error.into()),
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    if let (Some(report), Some(format)) = (&report, options.report) {
        match format {
            ReportFormat::Text => print!("{}", report.to_text()),
            ReportFormat::Md => print!("{}", report.to_markdown()),
            ReportFormat::Json => println!("{}", serde_json::to_string_pretty(report).context("serialising the report")?),
        }
    }
    eprintln!(
        "credwatch: replayed {} file(s): {events} events, {} alerts, {bad_lines} bad lines skipped, {:.0} events/s",
        files.len(),
        sink.written(),
        events as f64 / seconds.max(1e-9)
    );
    Ok(if sink.written() > 0 { ExitCode::from(ALERT_EXIT_STATUS) } else { ExitCode::SUCCESS })
}
