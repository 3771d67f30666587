//! What `run`, `watch` and `replay` share about alerts leaving: the outputs of `--to`, started
//! and given their grace at the end, and the exit status when any alert fired.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result};
use credwatch_core::output::escape;
use credwatch_outputs::{DispatchOptions, Dispatcher, OutputConfig, DEFAULT_SPOOL_DIR};
use tracing::info;

/// Exit status of `credwatch run` (and `replay`) when any alert fired, whatever CMD did.
pub const ALERT_EXIT_STATUS: u8 = 10;
/// How long the outputs get at the end to deliver what is left, before it stays in their spools
/// for the next start.
const OUTPUTS_GRACE: Duration = Duration::from_secs(3);

/// The outputs of `--to`, when any.
pub fn start_outputs(outputs: &[OutputConfig], spool_dir: Option<&Path>) -> Result<Option<Dispatcher>> {
    if outputs.is_empty() {
        return Ok(None);
    }
    let spool_dir = spool_dir.unwrap_or(Path::new(DEFAULT_SPOOL_DIR));
    Ok(Some(Dispatcher::start(DispatchOptions::new(spool_dir), outputs).context("starting the outputs")?))
}

/// Gives the outputs [`OUTPUTS_GRACE`] to deliver what is left, and logs what each did.
pub fn stop_outputs(dispatcher: Dispatcher) {
    for (name, counts) in dispatcher.shutdown(OUTPUTS_GRACE) {
        let dropped: u64 = counts.dropped.iter().sum();
        let name = escape(&name).into_owned();
        info!(
            output = name,
            delivered = counts.delivered,
            failed_attempts = counts.failed_attempts,
            refused = counts.refused,
            dropped,
            unspooled = counts.unspooled,
            spooled = counts.spooled,
            "output {name}: {} delivered, {} failed attempts, {} refused, {dropped} dropped, {} left in the spool",
            counts.delivered,
            counts.failed_attempts,
            counts.refused,
            counts.spooled
        );
    }
}
