//! Trace files: the [`Event`] stream serialised as JSON lines behind a header line. The trace
//! schema is versioned apart from the program (see `docs/src/trace-format.md`); `.gz` and `.zst`
//! compression are chosen by file extension when writing and by magic bytes when reading.

use std::{
    fs::File,
    io::{self, BufWriter, Read, Write},
    path::{Path, PathBuf},
    sync::{atomic::AtomicU64, Arc},
};

use serde::{Deserialize, Serialize};

use crate::{
    event::Event,
    input::{Input, InputError, Lines},
};

/// The trace schema this build writes. 2 added the `rename` and `syscall` kinds and the
/// `same_file_as` and `blocked` fields of `open`; 3 the `connect` and `dns_query` kinds; 4 the
/// `agent_gap` kind; 5 identity: `host_id` in the header, `cgroups` and the CI variables on
/// `exec`; 6 the `denied` field of `open` and `syscall` (a BPF LSM refusal); 7 the `blind_spot`
/// kind and `stopped` on `agent_gap`.
pub const TRACE_SCHEMA: u32 = 7;
/// Trace schemas this build reads: every schema is a subset of the next.
pub const READABLE_SCHEMAS: std::ops::RangeInclusive<u32> = 1..=7;

/// The first line of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// The trace schema version ([`TRACE_SCHEMA`]); its presence identifies a credwatch trace.
    pub credwatch_trace: u32,
    pub credwatch_version: String,
    pub host: String,
    /// The recording machine's id (`/etc/machine-id`), when it could be read (schema 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
    /// Kernel release (`uname -r`) of the recording machine.
    pub kernel: String,
    /// RFC 3339 time the recording started.
    pub start_time: String,
    /// SHA-256 of the rules in force while recording.
    pub rules_digest: String,
    /// `machine` (every package tree) or `command` (one CMD's tree).
    pub scope: String,
    /// CMD and its arguments for a `command` trace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{file}: {source}")]
    Io { file: String, source: io::Error },
    #[error("{file}: empty input: a credwatch trace starts with a header line")]
    Empty { file: String },
    #[error("{file}:1: not a credwatch trace header: {message}")]
    BadHeader { file: String, message: String },
    #[error("{file}: trace schema {version} is not supported (this credwatch reads {first} to {last})", first = READABLE_SCHEMAS.start(), last = READABLE_SCHEMAS.end())]
    UnsupportedSchema { file: String, version: u32 },
    #[error("{file}:{line}: {message}")]
    BadLine { file: String, line: u64, message: String },
    /// Reading failed: a bad line (recoverable) or the input itself (not).
    #[error(transparent)]
    Input(#[from] InputError),
}

/// Writes a trace, compressed by the file's extension.
pub struct TraceWriter {
    out: Box<dyn Write + Send>,
    path: PathBuf,
}

impl TraceWriter {
    pub fn create(path: &Path, header: &TraceHeader) -> Result<TraceWriter, TraceError> {
        let io_error = |source| TraceError::Io { file: path.display().to_string(), source };
        let file = BufWriter::new(File::create(path).map_err(io_error)?);
        let out: Box<dyn Write + Send> = match path.extension().and_then(|e| e.to_str()) {
            Some("gz") => Box::new(flate2::write::GzEncoder::new(file, flate2::Compression::default())),
            Some("zst") => Box::new(zstd::Encoder::new(file, 3).map_err(io_error)?.auto_finish()),
            _ => Box::new(file),
        };
        let mut writer = TraceWriter { out, path: path.to_owned() };
        writer.write_line(header)?;
        Ok(writer)
    }

    pub fn write(&mut self, event: &Event) -> Result<(), TraceError> {
        self.write_line(event)
    }

    fn write_line(&mut self, value: &impl Serialize) -> Result<(), TraceError> {
        let io_error = |source| TraceError::Io { file: self.path.display().to_string(), source };
        serde_json::to_writer(&mut self.out, value).map_err(|e| io_error(io::Error::other(e)))?;
        self.out.write_all(b"\n").map_err(io_error)
    }

    /// Flushes buffers and ends the compressed stream.
    pub fn finish(mut self) -> Result<(), TraceError> {
        let path = self.path.display().to_string();
        self.out.flush().map_err(|source| TraceError::Io { file: path, source })
        // Dropping `out` ends the gzip or zstd stream.
    }
}

/// Reads a trace: the header, then events one at a time, in constant memory.
pub struct TraceReader {
    lines: Lines,
    header: TraceHeader,
}

impl TraceReader {
    /// Opens `path` (`-` for standard input).
    pub fn open(path: &Path) -> Result<TraceReader, TraceError> {
        TraceReader::from_input(Input::open(path, Arc::default())?)
    }

    pub fn new(name: String, raw: Box<dyn Read + Send>) -> Result<TraceReader, TraceError> {
        TraceReader::from_input(Input::new(name, raw, Arc::default())?)
    }

    /// Reads a trace from an input already opened (and perhaps peeked at).
    pub(crate) fn from_input(input: Input) -> Result<TraceReader, TraceError> {
        let mut lines = input.into_lines();
        let file = lines.name().to_owned();
        let header: TraceHeader = match next_content(&mut lines) {
            Ok(Some((_, first))) => serde_json::from_slice(first)
                .map_err(|e| TraceError::BadHeader { file: file.clone(), message: e.to_string() })?,
            Ok(None) => return Err(TraceError::Empty { file }),
            Err(error) => return Err(TraceError::BadHeader { file, message: error.message }),
        };
        if !READABLE_SCHEMAS.contains(&header.credwatch_trace) {
            return Err(TraceError::UnsupportedSchema { file, version: header.credwatch_trace });
        }
        Ok(TraceReader { lines, header })
    }

    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    pub fn name(&self) -> &str {
        self.lines.name()
    }

    /// Bytes of the input read so far (compressed bytes for a compressed trace), shared so
    /// another thread can show progress.
    pub fn consumed(&self) -> Arc<AtomicU64> {
        self.lines.consumed()
    }

    /// The next event: `Ok(None)` at the end; a bad line is an error naming the file and line,
    /// after which reading can go on with the next line.
    pub fn next_event(&mut self) -> Result<Option<Event>, TraceError> {
        let Some((line, text)) = next_content(&mut self.lines)? else { return Ok(None) };
        serde_json::from_slice::<Event>(text).map(Some).map_err(|error| TraceError::BadLine {
            file: self.lines.name().to_owned(),
            line,
            message: error.to_string(),
        })
    }
}

/// The next line that is not blank.
fn next_content(lines: &mut Lines) -> Result<Option<(u64, &[u8])>, InputError> {
    let number = loop {
        match lines.next()? {
            Some((number, text)) if !text.iter().all(u8::is_ascii_whitespace) => break number,
            Some(_) => {}
            None => return Ok(None),
        }
    };
    Ok(Some((number, lines.current())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::{EventData, Exit},
        input::MAX_LINE,
    };

    fn header() -> TraceHeader {
        TraceHeader {
            credwatch_trace: TRACE_SCHEMA,
            credwatch_version: "0.1.0".into(),
            host: "h".into(),
            host_id: Some("0123456789abcdef0123456789abcdef".into()),
            kernel: "6.18".into(),
            start_time: "2026-11-29T00:00:00Z".into(),
            rules_digest: "00".into(),
            scope: "machine".into(),
            command: vec![],
        }
    }

    fn event(pid: u32) -> Event {
        Event { time_ns: 1, pid, data: EventData::Exit(Exit { code: 0, repeats: 0 }) }
    }

    fn reader(text: &str) -> Result<TraceReader, TraceError> {
        TraceReader::new("t.jsonl".into(), Box::new(io::Cursor::new(text.as_bytes().to_vec())))
    }

    fn header_line() -> String {
        serde_json::to_string(&header()).unwrap()
    }

    #[test]
    fn round_trips_plain_gzip_and_zstd() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["t.jsonl", "t.jsonl.gz", "t.jsonl.zst"] {
            let path = dir.path().join(name);
            let mut writer = TraceWriter::create(&path, &header()).unwrap();
            for pid in 1..=3 {
                writer.write(&event(pid)).unwrap();
            }
            writer.finish().unwrap();
            let mut reader = TraceReader::open(&path).unwrap();
            assert_eq!(reader.header(), &header(), "{name}");
            let pids: Vec<u32> = std::iter::from_fn(|| reader.next_event().unwrap()).map(|e| e.pid).collect();
            assert_eq!(pids, [1, 2, 3], "{name}");
        }
    }

    #[test]
    fn schema_5_keeps_identity_and_schema_4_reads_without() {
        use crate::event::Exec;
        let exec = Event {
            time_ns: 2,
            pid: 9,
            data: EventData::Exec(Exec {
                cgroups: vec!["/memory/docker/x".into(), "/".into()],
                env: [("GITHUB_RUN_ID".to_owned(), "42".to_owned())].into(),
                ..Exec::default()
            }),
        };
        let text = format!("{}\n{}\n", header_line(), serde_json::to_string(&exec).unwrap());
        assert!(text.starts_with(&format!(r#"{{"credwatch_trace":{TRACE_SCHEMA},"#)), "{text}");
        let mut five = reader(&text).unwrap();
        assert_eq!(five.header().host_id.as_deref(), Some("0123456789abcdef0123456789abcdef"));
        assert_eq!(five.next_event().unwrap(), Some(exec));
        // Written by a schema 4 credwatch: no host id, execs without cgroups.
        let old = r#"{"credwatch_trace":4,"credwatch_version":"0.0.9","host":"h","kernel":"6.1","start_time":"2026-01-01T00:00:00Z","rules_digest":"00","scope":"machine"}
{"time_ns":1,"pid":7,"kind":"exec","ppid":1,"filename":"/bin/sh","executable":"/bin/sh","args":["sh"],"cwd":"/","uid":0,"gid":0,"cgroup_id":5}
"#;
        let mut four = reader(old).unwrap();
        assert_eq!((four.header().host_id.as_deref(), four.header().credwatch_version.as_str()), (None, "0.0.9"));
        let Some(Event { data: EventData::Exec(exec), .. }) = four.next_event().unwrap() else { panic!("an exec") };
        assert!(exec.cgroups.is_empty() && exec.env.is_empty());
    }

    #[test]
    fn bad_lines_name_file_and_line_and_reading_goes_on() {
        let good = serde_json::to_string(&event(7)).unwrap();
        let text = format!("{}\n{good}\n\n{{\"kind\":\"exec\"\n\u{1b}[2J\x00\x01garbage\n{good}\n", header_line());
        let mut reader = reader(&text).unwrap();
        assert_eq!(reader.next_event().unwrap().unwrap().pid, 7);
        let first = reader.next_event().unwrap_err().to_string();
        assert!(first.starts_with("t.jsonl:4: "), "{first}");
        let second = reader.next_event().unwrap_err().to_string();
        assert!(second.starts_with("t.jsonl:5: "), "{second}");
        assert_eq!(reader.next_event().unwrap().unwrap().pid, 7);
        assert!(reader.next_event().unwrap().is_none());
    }

    #[test]
    fn a_cut_last_line_is_an_error() {
        let good = serde_json::to_string(&event(7)).unwrap();
        let mut reader = reader(&format!("{}\n{}", header_line(), &good[..good.len() - 3])).unwrap();
        let error = reader.next_event().unwrap_err().to_string();
        assert!(error.contains("t.jsonl:2: truncated line"), "{error}");
    }

    #[test]
    fn rejects_what_is_not_a_readable_trace() {
        assert!(matches!(reader(""), Err(TraceError::Empty { .. })));
        assert!(matches!(reader("\u{7f}ELF\x02\x01\n"), Err(TraceError::BadHeader { .. })));
        let future = header_line().replace(&format!("\"credwatch_trace\":{TRACE_SCHEMA}"), "\"credwatch_trace\":99");
        let error = reader(&future).err().unwrap();
        assert!(matches!(error, TraceError::UnsupportedSchema { version: 99, .. }), "{error}");
        assert!(error.to_string().contains("schema 99 is not supported"), "{error}");
    }

    #[test]
    fn an_overlong_line_is_an_error_not_an_allocation() {
        let good = serde_json::to_string(&event(7)).unwrap();
        let long = format!("{}\n{}\n{good}\n", header_line(), "x".repeat(MAX_LINE + 100_000));
        let mut reader = reader(&long).unwrap();
        let error = reader.next_event().unwrap_err().to_string();
        assert!(error.starts_with("t.jsonl:2: line longer than"), "{error}");
        assert_eq!(reader.next_event().unwrap().unwrap().pid, 7);
        assert!(reader.next_event().unwrap().is_none());
    }
}
