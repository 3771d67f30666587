//! The agent's own log, apart from alerts: records with levels on standard error, as text for
//! a person (`credwatch: message`, as the agent always printed) or as JSON lines for a log
//! pipeline (`timestamp`, `level`, `message` and the record's fields). Text shows the message
//! alone: every message says it all, the fields are for machines.

use std::{fmt, io, sync::OnceLock};

use tracing::{Level, Subscriber};
use tracing_subscriber::{
    field::Visit,
    filter::LevelFilter,
    fmt::{format, FmtContext, FormatEvent, FormatFields},
    layer::SubscriberExt as _,
    registry::LookupSpan,
    reload,
    util::SubscriberInitExt as _,
    Layer as _, Registry,
};

use crate::config::{LogFormat, LogLevel};

/// Changes the level of the running log (`SIGHUP`).
static LEVEL: OnceLock<reload::Handle<LevelFilter, Registry>> = OnceLock::new();

impl From<LogLevel> for LevelFilter {
    fn from(level: LogLevel) -> LevelFilter {
        match level {
            LogLevel::Error => LevelFilter::ERROR,
            LogLevel::Warn => LevelFilter::WARN,
            LogLevel::Info => LevelFilter::INFO,
            LogLevel::Debug => LevelFilter::DEBUG,
            LogLevel::Trace => LevelFilter::TRACE,
        }
    }
}

/// Sets up the log; once per process (later calls change nothing).
pub fn init(format: LogFormat, level: LogLevel) {
    let (filter, handle) = reload::Layer::new(LevelFilter::from(level));
    let output = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer().with_writer(io::stderr).event_format(Text).boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(io::stderr)
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_target(false)
            .boxed(),
    };
    if tracing_subscriber::registry().with(filter).with(output).try_init().is_ok() {
        let _ = LEVEL.set(handle);
    }
}

/// Makes `level` the least severe level written from now on.
pub fn set_level(level: LogLevel) {
    if let Some(handle) = LEVEL.get() {
        // Fails only when the subscriber is gone, at exit.
        let _ = handle.modify(|filter| *filter = LevelFilter::from(level));
    }
}

/// `credwatch: message`, with `error: `, `warning: ` (or `debug: `, `trace: `) before the
/// message of those levels.
struct Text;

impl<S, N> FormatEvent<S, N> for Text
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &FmtContext<'_, S, N>,
        mut writer: format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let level = match *event.metadata().level() {
            Level::ERROR => "error: ",
            Level::WARN => "warning: ",
            Level::INFO => "",
            Level::DEBUG => "debug: ",
            Level::TRACE => "trace: ",
        };
        let mut message = Message(String::new());
        event.record(&mut message);
        writeln!(writer, "credwatch: {level}{}", message.0)
    }
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What the text format writes for records at each level.
    #[test]
    fn text_lines_are_credwatch_then_the_level_then_the_message_alone() {
        let written = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&written);
        let subscriber = tracing_subscriber::fmt()
            .event_format(Text)
            .with_max_level(LevelFilter::DEBUG)
            .with_writer(move || Writer(Arc::clone(&sink)))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let (events, lost) = (12, 0);
            tracing::info!(events, lost, "{events} events, {lost} lost");
            tracing::warn!(file = "r.yaml", "reload refused: r.yaml:3:1: bad");
            tracing::error!("2 errors:\n  a\n  b");
            tracing::debug!("details");
            tracing::trace!("not written");
        });
        let text = String::from_utf8(written.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text,
            "credwatch: 12 events, 0 lost\n\
             credwatch: warning: reload refused: r.yaml:3:1: bad\n\
             credwatch: error: 2 errors:\n  a\n  b\n\
             credwatch: debug: details\n"
        );
    }

    struct Writer(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Writer {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().map_err(|_| io::Error::other("poisoned"))?.extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
}
