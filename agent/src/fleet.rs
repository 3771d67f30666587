//! `credwatch fleet report`: the fleet's alerts (the NATS stream the `nats:` output publishes
//! to, or alert files from many hosts) folded per package and version by credwatch-core's
//! [`FleetReport`].

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Context as _, Result};
use credwatch_core::{
    fleet::{FleetReport, PackageFilter},
    incident::{render, Origin},
    input::InputError,
    output::escape,
};
use credwatch_outputs::{
    nats::{Nats, NatsOptions},
    Destination, Transport as _,
};

use crate::replay::{ReportFormat, BAD_LINES_SHOWN};

/// The fleet's NATS JetStream: the server and the subject prefix the agents publish under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsSource {
    pub url: String,
    pub prefix: String,
}

/// `nats://HOST:PORT/PREFIX` (or `tls://...`): as the `nats:` output spells it after `nats:`.
pub fn parse_nats(text: &str) -> Result<NatsSource, String> {
    match format!("nats:{text}").parse::<Destination>() {
        Ok(Destination::Nats { url, subject_prefix }) => Ok(NatsSource { url, prefix: subject_prefix }),
        Ok(_) => Err(format!("{text:?} is not nats://HOST:PORT/SUBJECT_PREFIX")),
        Err(error) => Err(error.problem),
    }
}

pub struct FleetOptions {
    pub from: Option<NatsSource>,
    pub stream: Option<String>,
    pub nats: NatsOptions,
    pub files: Vec<PathBuf>,
    /// Skip and count bad alerts instead of stopping at the first.
    pub keep_going: bool,
    /// Only this package's alerts.
    pub package: Option<PackageFilter>,
    pub format: ReportFormat,
}

pub fn report(options: &FleetOptions) -> Result<ExitCode> {
    let mut report = options.package.clone().map_or_else(FleetReport::default, FleetReport::only);
    if options.format == ReportFormat::Html {
        report = report.with_incident();
    }
    let mut bad = 0u64;
    let mut skip = |error: &dyn std::fmt::Display| {
        bad += 1;
        if bad <= BAD_LINES_SHOWN {
            tracing::warn!("skipped {}", escape(&error.to_string()));
        }
    };
    let source = if let Some(from) = &options.from {
        let mut nats = Nats::new(&from.url, &from.prefix, options.nats.clone()).context("the NATS stream")?;
        let read = nats
            .read_stream(options.stream.as_deref(), |message| match report.add_json(&message.payload) {
                Ok(_) => Ok(()),
                Err(error) if options.keep_going => {
                    skip(&format!("subject {:?}, sequence {}: {error}", message.subject, message.sequence));
                    Ok(())
                }
                Err(error) => Err(error.to_string()),
            })
            .context("reading the fleet's alerts")?;
        format!("{read} messages of {}", nats.name())
    } else {
        let mut skip_line = |error: &InputError| skip(error);
        let skip_line = options.keep_going.then_some(&mut skip_line as &mut dyn FnMut(&InputError));
        report.read_files(&options.files, skip_line).context("reading alert files")?;
        format!("{} file(s)", options.files.len())
    };
    match options.format {
        ReportFormat::Text => print!("{}", report.to_text()),
        ReportFormat::Md => print!("{}", report.to_markdown()),
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&report).context("serialising the report")?),
        ReportFormat::Html => {
            let origin = Origin::Fleet { repeats: report.repeats, hosts: report.hosts.len() };
            print!("{}", render(report.incident().context("the incident page's gatherings")?, &origin));
        }
    }
    tracing::info!(
        "read {source}: {} alerts from {} hosts, {} repeats dropped, {bad} bad skipped",
        report.alerts,
        report.hosts.len(),
        report.repeats,
    );
    Ok(ExitCode::SUCCESS)
}
