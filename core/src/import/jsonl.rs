//! One JSON object per line (Tetragon, Tracee): reading, numbering, parsing and error positions
//! are shared here; each format is only a [`Decoder`] from one object to events.

use std::{
    collections::VecDeque,
    sync::{atomic::AtomicU64, Arc},
};

use serde_json::{Map, Value};

use super::{EventSource, Format, ImportError, Lines};
use crate::event::Event;

/// A format's mapping of one JSON object (one line) to events.
pub(super) trait Decoder: Send {
    const FORMAT: Format;

    /// Pushes the object's events (none, one or more) to `out`. An error is about this line
    /// only: it becomes a recoverable error naming the file and line.
    fn decode(&mut self, object: &Map<String, Value>, out: &mut VecDeque<Event>) -> Result<(), String>;

    /// `host.name`, when the format records it.
    fn host(&self) -> Option<String> {
        None
    }
}

/// An [`EventSource`] over JSON lines: blank lines are skipped, a line that is not a JSON
/// object or that the decoder refuses is a recoverable error, and reading goes on after it.
pub(super) struct JsonLines<D> {
    lines: Lines,
    decoder: D,
    out: VecDeque<Event>,
}

impl<D: Decoder> JsonLines<D> {
    pub(super) fn with_decoder(lines: Lines, decoder: D) -> JsonLines<D> {
        JsonLines { lines, decoder, out: VecDeque::new() }
    }
}

impl<D: Decoder> EventSource for JsonLines<D> {
    fn next_event(&mut self) -> Result<Option<Event>, ImportError> {
        loop {
            if let Some(event) = self.out.pop_front() {
                return Ok(Some(event));
            }
            let Some((number, text)) = self.lines.next()? else { return Ok(None) };
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let decoded = match serde_json::from_slice::<Value>(text) {
                Ok(Value::Object(object)) => self.decoder.decode(&object, &mut self.out),
                Ok(_) => Err("not a JSON object".to_owned()),
                Err(error) => Err(format!("not JSON: {error}")),
            };
            decoded.map_err(|message| ImportError::bad_line(self.lines.name(), number, message))?;
        }
    }

    fn name(&self) -> &str {
        self.lines.name()
    }

    fn format(&self) -> Format {
        D::FORMAT
    }

    fn host(&self) -> Option<String> {
        self.decoder.host()
    }

    fn consumed(&self) -> Arc<AtomicU64> {
        self.lines.consumed()
    }
}

/// RFC 3339 time (both formats' timestamps) to nanoseconds since the epoch.
pub(super) fn rfc3339_ns(text: &str) -> Option<u64> {
    let time = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    u64::try_from(time.unix_timestamp_nanos()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{EventData, Fork};

    /// One `Fork` per object with `"pid"`, then an error if it also has `"bad"`.
    struct Pids;

    impl Decoder for Pids {
        const FORMAT: Format = Format::Tracee;

        fn decode(&mut self, object: &Map<String, Value>, out: &mut VecDeque<Event>) -> Result<(), String> {
            let pid = object.get("pid").and_then(Value::as_u64).ok_or("no pid")? as u32;
            out.push_back(Event { time_ns: 0, pid, data: EventData::Fork(Fork { child_pid: pid + 1 }) });
            match object.get("bad") {
                Some(_) => Err("bad".into()),
                None => Ok(()),
            }
        }
    }

    #[test]
    fn skips_blank_lines_and_goes_on_after_bad_ones() {
        let text = "{\"pid\":1}\n\n  \n[1]\noops\n{\"x\":1}\n{\"pid\":2,\"bad\":1}\n{\"pid\":3}";
        let mut source = JsonLines::with_decoder(Lines::from_bytes("j", text.as_bytes()), Pids);
        let mut seen = Vec::new();
        loop {
            match source.next_event() {
                Ok(Some(event)) => seen.push(event.pid.to_string()),
                Ok(None) => break,
                Err(error) => seen.push(format!("{error} ({})", error.recoverable)),
            }
        }
        assert_eq!(
            seen,
            [
                "1",
                "j:4: not a JSON object (true)",
                "j:5: not JSON: expected value at line 1 column 1 (true)",
                "j:6: no pid (true)",
                "j:7: bad (true)",
                // What the line gave before its error is kept.
                "2",
                "3",
            ]
        );
        assert_eq!((source.name(), source.format(), source.host()), ("j", Format::Tracee, None));
    }
}
