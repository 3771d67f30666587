//! Importers: other tools' traces (strace, auditd, Tetragon, Tracee) and credwatch's own,
//! turned into the one [`Event`] stream. Each is a thin, streaming translator: bounded state,
//! no detection logic, a bad line is an error naming the file and line after which reading
//! goes on. What each format gives and cannot give is in `docs/src/importers.md`.

mod auditd;
mod jsonl;
pub mod passwd;
mod strace;
mod tetragon;
mod tracee;

use std::{
    collections::{HashMap, VecDeque},
    fmt,
    io::Read,
    path::{Path, PathBuf},
    sync::{atomic::AtomicU64, Arc},
};

pub use crate::input::InputError as ImportError;
pub(crate) use crate::{
    event::normalize_path,
    names::{signal_name, signal_number},
};
use crate::{
    event::{Event, EventData, Fork},
    input::{Input, Lines},
    trace::{TraceError, TraceReader},
};

/// The formats credwatch reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// credwatch's own trace (`credwatch record`).
    Credwatch,
    /// `strace -f -tt -y [-v] [-s N]` output, one file or the `-ff` files of one run.
    Strace,
    /// Raw `audit.log` (RAW or ENRICHED).
    Auditd,
    /// Tetragon JSON export (one event per line).
    Tetragon,
    /// Tracee JSON events, legacy `trace.Event` or `v1beta1.Event`.
    Tracee,
}

impl Format {
    pub const ALL: [Format; 5] = [Format::Credwatch, Format::Strace, Format::Auditd, Format::Tetragon, Format::Tracee];

    pub fn as_str(self) -> &'static str {
        match self {
            Format::Credwatch => "credwatch",
            Format::Strace => "strace",
            Format::Auditd => "auditd",
            Format::Tetragon => "tetragon",
            Format::Tracee => "tracee",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        Format::ALL.into_iter().find(|f| f.as_str() == s).ok_or_else(|| {
            format!("unknown trace format {s:?} (expected credwatch, strace, auditd, tetragon or tracee)")
        })
    }
}

impl From<TraceError> for ImportError {
    fn from(error: TraceError) -> ImportError {
        match error {
            TraceError::BadLine { file, line, message } => ImportError::bad_line(&file, line, message),
            TraceError::Input(error) => error,
            TraceError::BadHeader { file, message } => ImportError {
                file,
                line: Some(1),
                message: format!("not a credwatch trace header: {message}"),
                recoverable: false,
            },
            TraceError::Io { ref file, .. }
            | TraceError::Empty { ref file }
            | TraceError::UnsupportedSchema { ref file, .. } => {
                let message = error.to_string();
                let message = message.strip_prefix(&format!("{file}: ")).unwrap_or(&message).to_owned();
                ImportError::fatal(file, message)
            }
        }
    }
}

/// A stream of events from one history (one engine's worth of input).
pub trait EventSource: Send {
    /// The next event; `Ok(None)` at the end. After an error with `recoverable`, calling again
    /// goes on with the next line; after any other error the source is finished.
    fn next_event(&mut self) -> Result<Option<Event>, ImportError>;
    /// The input's name for messages (file name, or `prefix.*` for strace `-ff` sets).
    fn name(&self) -> &str;
    fn format(&self) -> Format;
    /// `host.name` for alerts, when the format records it.
    fn host(&self) -> Option<String> {
        None
    }
    /// `host.id` for alerts, when the format records it.
    fn host_id(&self) -> Option<String> {
        None
    }
    /// `agent.version` for alerts: the credwatch that recorded the input, when it was one.
    fn agent_version(&self) -> Option<String> {
        None
    }
    /// Bytes of the input files read so far (compressed bytes for compressed files), shared so
    /// another thread can show progress.
    fn consumed(&self) -> Arc<AtomicU64>;
}

#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// The date of strace `-tt` times (they carry none). Default: the UTC date of the file's
    /// modification time; for standard input, 1970-01-01.
    pub date: Option<time::Date>,
}

/// The first non-empty line of `bytes`, if complete.
fn first_line(bytes: &[u8]) -> Option<&[u8]> {
    bytes.split(|&b| b == b'\n').find(|l| !l.iter().all(u8::is_ascii_whitespace)).filter(|l| l.len() < bytes.len())
}

/// The format of an input from its first bytes (already decompressed), or None.
pub fn detect(first_bytes: &[u8]) -> Option<Format> {
    let text = String::from_utf8_lossy(first_bytes);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    if line.starts_with('{') {
        if line.contains("\"credwatch_trace\"") {
            return Some(Format::Credwatch);
        }
        if tetragon::EVENT_KEYS.iter().any(|k| line.contains(&format!("\"{k}\""))) {
            return Some(Format::Tetragon);
        }
        if line.contains("\"eventName\"") || line.contains("\"workload\"") || line.contains("\"policies\"") {
            return Some(Format::Tracee);
        }
        return None;
    }
    if auditd::looks_like(line) {
        return Some(Format::Auditd);
    }
    if strace::looks_like(line) {
        return Some(Format::Strace);
    }
    None
}

/// Opens one input (`-` for standard input) as `from`, or as the format detected from its
/// first bytes. `.gz` and `.zst` are recognised by their magic bytes.
pub fn open(path: &Path, from: Option<Format>, options: &ImportOptions) -> Result<Box<dyn EventSource>, ImportError> {
    let input = Input::open(path, Arc::default())?;
    open_input(input, from, || strace_date(path, options))
}

/// [`open`] for an input already in hand (named `name` in messages; a `name.<pid>` name gives
/// strace's pid as for `-ff` files). strace times get `options.date`, or 1970-01-01 as for
/// standard input.
pub fn open_reader(
    name: &str,
    raw: Box<dyn Read + Send>,
    from: Option<Format>,
    options: &ImportOptions,
) -> Result<Box<dyn EventSource>, ImportError> {
    let input = Input::new(name.to_owned(), raw, Arc::default())?;
    open_input(input, from, || strace_date(Path::new("-"), options))
}

/// The source for `input`, as `from` or detected; `strace_date` is asked only for strace.
fn open_input(
    mut input: Input,
    from: Option<Format>,
    strace_date: impl FnOnce() -> Result<time::Date, ImportError>,
) -> Result<Box<dyn EventSource>, ImportError> {
    let name = input.name().to_owned();
    let format = match from {
        Some(format) => format,
        None => detect(input.peek()?).ok_or_else(|| {
            ImportError::fatal(&name, "unrecognised trace format (use --from credwatch|strace|auditd|tetragon|tracee)")
        })?,
    };
    Ok(match format {
        Format::Credwatch => Box::new(CredwatchSource(TraceReader::from_input(input)?)),
        Format::Strace => {
            let pid = ff_pid(Path::new(&name));
            Box::new(strace::StraceSource::new(vec![(input.into_lines(), pid)], name, strace_date()?))
        }
        Format::Auditd => {
            let host = first_line(input.peek()?).and_then(auditd::node_name);
            Box::new(auditd::AuditdSource::new(input.into_lines(), host))
        }
        Format::Tetragon => {
            // The host is wanted before the first event (for the engine's alerts).
            let host = first_line(input.peek()?).and_then(tetragon::node_name);
            Box::new(tetragon::TetragonSource::new(input.into_lines(), host))
        }
        Format::Tracee => Box::new(tracee::TraceeSource::new(input.into_lines())),
    })
}

/// Opens the `-ff` files of one strace run (`prefix.<pid>` each) as one source, merged by time.
pub fn open_strace_ff(paths: &[PathBuf], options: &ImportOptions) -> Result<Box<dyn EventSource>, ImportError> {
    let Some(first) = paths.first() else {
        return Err(ImportError::fatal("", "no strace -ff files"));
    };
    let date = strace_date(first, options)?;
    let consumed = Arc::new(AtomicU64::new(0));
    let mut inputs = Vec::new();
    for path in paths {
        let Some(pid) = ff_pid(path) else {
            return Err(ImportError::fatal(&path.display().to_string(), "not an strace -ff file (no .<pid> suffix)"));
        };
        inputs.push((Input::open(path, Arc::clone(&consumed))?.into_lines(), Some(pid)));
    }
    let name = format!("{}.*", first.display().to_string().rsplit_once('.').map_or("", |(p, _)| p));
    Ok(Box::new(strace::StraceSource::new(inputs, name, date)))
}

/// The inputs of one `replay` command grouped into histories (one engine each): each file is
/// one, except that strace `-ff` files sharing a `prefix.` (two or more `prefix.<pid>` files
/// detected or declared as strace) form one. Files that cannot be read stay alone, for
/// [`open_group`] to report.
pub fn group_inputs(paths: &[PathBuf], from: Option<Format>) -> Vec<Vec<PathBuf>> {
    let mut groups: Vec<(Option<String>, Vec<PathBuf>)> = Vec::new();
    for path in paths {
        let prefix = ff_pid(path).and_then(|_| Some(path.to_str()?.rsplit_once('.')?.0.to_owned()));
        let is_strace = prefix.is_some()
            && match from {
                Some(format) => format == Format::Strace,
                None => Input::open(path, Arc::default())
                    .and_then(|mut input| Ok(detect(input.peek()?)))
                    .is_ok_and(|format| format == Some(Format::Strace)),
            };
        let key = if is_strace { prefix } else { None };
        match groups.iter_mut().find(|(k, _)| key.is_some() && *k == key) {
            Some((_, group)) => group.push(path.clone()),
            None => groups.push((key, vec![path.clone()])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// Opens one group of [`group_inputs`].
pub fn open_group(
    group: &[PathBuf],
    from: Option<Format>,
    options: &ImportOptions,
) -> Result<Box<dyn EventSource>, ImportError> {
    match group {
        [one] => open(one, from, options),
        _ => open_strace_ff(group, options),
    }
}

/// [`group_inputs`] and [`open_group`] in one call.
pub fn open_all(
    paths: &[PathBuf],
    from: Option<Format>,
    options: &ImportOptions,
) -> Result<Vec<Box<dyn EventSource>>, ImportError> {
    group_inputs(paths, from).iter().map(|group| open_group(group, from, options)).collect()
}

/// The pid of an strace `-ff` file name (`prefix.<pid>`).
fn ff_pid(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let (_, suffix) = name.rsplit_once('.')?;
    (!suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit())).then(|| suffix.parse().ok()).flatten()
}

fn strace_date(path: &Path, options: &ImportOptions) -> Result<time::Date, ImportError> {
    if let Some(date) = options.date {
        return Ok(date);
    }
    if path == Path::new("-") {
        return Ok(time::Date::from_calendar_date(1970, time::Month::January, 1).expect("valid date"));
    }
    let modified = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map_err(|e| ImportError::fatal(&path.display().to_string(), e.to_string()))?;
    Ok(time::OffsetDateTime::from(modified).date())
}

/// credwatch's own trace, through the same interface.
struct CredwatchSource(TraceReader);

impl EventSource for CredwatchSource {
    fn next_event(&mut self) -> Result<Option<Event>, ImportError> {
        self.0.next_event().map_err(ImportError::from)
    }
    fn name(&self) -> &str {
        self.0.name()
    }
    fn format(&self) -> Format {
        Format::Credwatch
    }
    fn host(&self) -> Option<String> {
        Some(self.0.header().host.clone())
    }
    fn host_id(&self) -> Option<String> {
        self.0.header().host_id.clone()
    }
    fn agent_version(&self) -> Option<String> {
        Some(self.0.header().credwatch_version.clone())
    }
    fn consumed(&self) -> Arc<AtomicU64> {
        self.0.consumed()
    }
}

/// Most processes whose lineage an importer remembers. Past it the oldest are forgotten: their
/// children then look like new processes (`Fork` events may be missing), never memory growth.
const MAX_KNOWN: usize = 1 << 16;

/// Processes an importer has announced to the engine (by a fork or a first event), so that
/// formats that report lineage only as a parent pid on each record (auditd, Tetragon, Tracee)
/// emit one `Fork` per child, before the child's first event, and a late fork record does not
/// announce the child again.
#[derive(Default)]
pub(crate) struct Known {
    pids: HashMap<u32, u64>,
    order: VecDeque<(u32, u64)>,
    next: u64,
}

impl Known {
    pub(crate) fn contains(&self, pid: u32) -> bool {
        self.pids.contains_key(&pid)
    }

    pub(crate) fn insert(&mut self, pid: u32) {
        if self.pids.contains_key(&pid) {
            return;
        }
        while self.pids.len() >= MAX_KNOWN {
            let Some((old, stamp)) = self.order.pop_front() else { break };
            if self.pids.get(&old) == Some(&stamp) {
                self.pids.remove(&old);
            }
        }
        self.next += 1;
        self.pids.insert(pid, self.next);
        self.order.push_back((pid, self.next));
        // Exits leave stale entries in `order`; drop them now and then so it stays bounded.
        if self.order.len() > 2 * MAX_KNOWN {
            let pids = &self.pids;
            self.order.retain(|(p, s)| pids.get(p) == Some(s));
        }
    }

    pub(crate) fn remove(&mut self, pid: u32) {
        self.pids.remove(&pid);
    }

    /// A `Fork` from `ppid` announcing `pid`, when `pid` is new (and the parent is a real one).
    pub(crate) fn announce(&mut self, time_ns: u64, ppid: u32, pid: u32) -> Option<Event> {
        if self.contains(pid) {
            return None;
        }
        self.insert(pid);
        (ppid != 0 && ppid != pid).then_some(Event {
            time_ns,
            pid: ppid,
            data: EventData::Fork(Fork { child_pid: pid }),
        })
    }
}

/// `path` made absolute against `dir` when it is relative and `dir` is known.
pub(crate) fn join(dir: Option<&str>, path: &str) -> Option<String> {
    if path.starts_with('/') {
        return Some(normalize_path(path));
    }
    dir.filter(|d| d.starts_with('/')).map(|d| normalize_path(&format!("{d}/{path}")))
}

/// `O_*` flag values (x86_64, the same on aarch64 but for the directory flags).
const OPEN_FLAGS: &[(&str, u64)] = &[
    ("O_RDONLY", 0),
    ("O_WRONLY", 0o1),
    ("O_RDWR", 0o2),
    ("O_CREAT", 0o100),
    ("O_EXCL", 0o200),
    ("O_NOCTTY", 0o400),
    ("O_TRUNC", 0o1000),
    ("O_APPEND", 0o2000),
    ("O_NONBLOCK", 0o4000),
    ("O_NDELAY", 0o4000),
    ("O_DSYNC", 0o10000),
    ("O_ASYNC", 0o20000),
    ("FASYNC", 0o20000),
    ("O_DIRECT", 0o40000),
    ("O_LARGEFILE", 0o100000),
    ("O_DIRECTORY", 0o200000),
    ("O_NOFOLLOW", 0o400000),
    ("O_NOATIME", 0o1000000),
    ("O_CLOEXEC", 0o2000000),
    ("O_SYNC", 0o4010000),
    ("O_PATH", 0o10000000),
    ("O_TMPFILE", 0o20200000),
];

/// Symbolic `O_RDONLY|O_CLOEXEC` (or a number, or a mix) to the flag bits; None if a name is
/// unknown.
pub(crate) fn parse_open_flags(text: &str) -> Option<u64> {
    let mut flags = 0;
    for part in text.split('|').map(str::trim) {
        flags |= match OPEN_FLAGS.iter().find(|(name, _)| *name == part) {
            Some((_, value)) => *value,
            None => parse_int(part)? as u64,
        };
    }
    Some(flags)
}

/// A C integer literal: decimal, `0x` hex or `0` octal, with an optional sign.
pub(crate) fn parse_int(text: &str) -> Option<i64> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let value = if let Some(hex) = digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()? as i64
    } else if digits.len() > 1 && digits.starts_with('0') {
        i64::from_str_radix(&digits[1..], 8).ok()?
    } else {
        digits.parse::<i64>().ok()?
    };
    if negative {
        value.checked_neg()
    } else {
        Some(value)
    }
}

/// Userspace `st_dev` encoding (glibc `makedev`) of a device number.
pub(crate) fn makedev(major: u64, minor: u64) -> u64 {
    ((major & 0xffff_f000) << 32) | ((major & 0xfff) << 8) | ((minor & 0xffff_ff00) << 12) | (minor & 0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_each_format_from_its_first_line() {
        let cases: &[(&str, Option<Format>)] = &[
            (r#"{"credwatch_trace":1,"host":"h"}"#, Some(Format::Credwatch)),
            (
                r#"{"process_exec":{"process":{"pid":1}},"node_name":"n","time":"2024-01-01T00:00:00Z"}"#,
                Some(Format::Tetragon),
            ),
            (r#"{"timestamp":1,"processId":2,"eventName":"openat","args":[]}"#, Some(Format::Tracee)),
            (r#"{"timestamp":{"seconds":"1"},"name":"openat","workload":{}}"#, Some(Format::Tracee)),
            ("type=SYSCALL msg=audit(1364481363.243:24287): arch=c000003e syscall=2", Some(Format::Auditd)),
            ("node=web1 type=EXECVE msg=audit(1.2:3): argc=1 a0=\"ls\"", Some(Format::Auditd)),
            ("12727 19:32:01.821869 execve(\"/usr/bin/sh\", [\"sh\"], 0x7ff /* 39 vars */) = 0", Some(Format::Strace)),
            ("19:32:01.821869 openat(AT_FDCWD, \"x\", O_RDONLY) = 3", Some(Format::Strace)),
            ("[pid  12] 1700000000.000001 +++ exited with 0 +++", Some(Format::Strace)),
            ("\n\n12 vfork( <unfinished ...>", Some(Format::Strace)),
            ("\u{7f}ELF\u{2}\u{1}\u{1}", None),
            (r#"{"something":"else"}"#, None),
            ("hello world", None),
            ("", None),
        ];
        for (text, expected) in cases {
            assert_eq!(detect(text.as_bytes()), *expected, "{text:?}");
        }
    }

    /// Every importer on cut and corrupted copies of real input: errors, never a panic.
    #[test]
    fn cut_and_corrupted_input_never_panics() {
        const STRACE: &str = concat!(
            "100 10:00:00.000001 execve(\"/tmp/bin/npm\", [\"npm\", \"i\"], [\"HOME=/h\"]) = 0\n",
            "100 10:00:00.000002 clone3({flags=CLONE_VM|CLONE_VFORK, exit_signal=SIGCHLD}, 88 <unfinished ...>\n",
            "101 10:00:00.000003 openat(AT_FDCWD</w\\76x>, \"a\\nb\\33[\", O_RDONLY|O_CLOEXEC) = 3</w\\76x/a\\nb\\33[>\n",
            "100 10:00:00.000004 <... clone3 resumed>) = 101\n",
            "101 10:00:00.000005 renameat2(AT_FDCWD, \"a\", 3</e>, \"b\", 0) = -1 EXDEV (Invalid cross-device link)\n",
            "101 10:00:00.000006 +++ killed by SIGKILL (core dumped) +++\n",
        );
        let samples: [(Format, &[u8]); 4] = [
            (Format::Strace, STRACE.as_bytes()),
            (Format::Auditd, include_bytes!("../../tests/fixtures/import/auditd/npm-install.log")),
            (Format::Tetragon, include_bytes!("../../tests/fixtures/import/tetragon/npm-install.jsonl")),
            (Format::Tracee, include_bytes!("../../tests/fixtures/import/tracee/npm-install-v1beta1.jsonl")),
        ];
        let run = |format: Format, bytes: &[u8]| {
            let lines = Lines::from_bytes("f", bytes);
            let mut source: Box<dyn EventSource> = match format {
                Format::Strace => Box::new(strace::StraceSource::new(
                    vec![(lines, None)],
                    "f".into(),
                    time::macros::date!(2026 - 11 - 29),
                )),
                Format::Auditd => Box::new(auditd::AuditdSource::new(lines, None)),
                Format::Tetragon => Box::new(tetragon::TetragonSource::new(lines, None)),
                _ => Box::new(tracee::TraceeSource::new(lines)),
            };
            for _ in 0..100_000 {
                match source.next_event() {
                    Ok(None) => return,
                    Ok(Some(_)) => {}
                    Err(error) => assert!(error.recoverable || error.line.is_some(), "{error}"),
                }
            }
            panic!("{format}: no end");
        };
        for (format, sample) in samples {
            let step = (sample.len() / 100).max(1);
            for cut in (0..sample.len()).step_by(step) {
                run(format, &sample[..cut]);
                for byte in [b'"', b'<', b'>', b'(', b')', b'\\', b'[', b'{', b'\n', b' ', 0xff, 0] {
                    let mut corrupted = sample.to_vec();
                    corrupted[cut] = byte;
                    run(format, &corrupted);
                }
            }
        }
    }

    #[test]
    fn parses_flags_and_integers() {
        assert_eq!(parse_open_flags("O_RDONLY|O_CLOEXEC"), Some(0o2000000));
        assert_eq!(parse_open_flags("O_WRONLY|O_CREAT|O_TRUNC"), Some(0o1101));
        assert_eq!(parse_open_flags("O_RDONLY|0x20"), Some(0x20));
        assert_eq!(parse_open_flags("O_BOGUS"), None);
        assert_eq!(parse_int("-100"), Some(-100));
        assert_eq!(parse_int("0666"), Some(0o666));
        assert_eq!(parse_int("0"), Some(0));
        assert_eq!(parse_int("0x1f"), Some(31));
    }

    #[test]
    fn lines_report_truncation_and_overlong_lines() {
        let mut json = Lines::from_bytes("j", b"{\"a\":1}");
        assert_eq!(json.next().unwrap(), Some((1, &b"{\"a\":1}"[..])));
        let mut lines = Lines::from_bytes("f", b"a\r\nb\nc");
        assert_eq!(lines.next().unwrap(), Some((1, &b"a"[..])));
        assert_eq!(lines.next().unwrap(), Some((2, &b"b"[..])));
        let error = lines.next().unwrap_err();
        assert_eq!(error.to_string(), "f:3: truncated line (no newline at the end of the input)");
        assert!(lines.next().unwrap().is_none());
    }

    #[test]
    fn known_announces_each_child_once() {
        let mut known = Known::default();
        assert!(known.announce(1, 10, 11).is_some());
        assert!(known.announce(2, 10, 11).is_none());
        known.remove(11);
        assert!(known.announce(3, 10, 11).is_some(), "a reused pid is a new process");
        assert!(known.announce(4, 0, 12).is_none(), "no parent: nothing to announce");
        assert!(known.contains(12));
    }

    #[test]
    fn groups_strace_ff_files_and_opens_others_alone() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("run.100");
        let b = dir.path().join("run.101");
        let c = dir.path().join("other.jsonl");
        std::fs::write(&a, "10:00:00.000001 clone(child_stack=NULL, flags=SIGCHLD) = 101\n").unwrap();
        std::fs::write(&b, "10:00:00.000002 exit_group(0) = ?\n10:00:00.000003 +++ exited with 0 +++\n").unwrap();
        std::fs::write(&c, r#"{"timestamp":1,"processId":2,"eventName":"close","args":[]}"#.to_owned() + "\n").unwrap();
        let options = ImportOptions { date: Some(time::macros::date!(2026 - 11 - 29)) };
        let sources = open_all(&[a, b, c], None, &options).unwrap();
        let formats: Vec<Format> = sources.iter().map(|s| s.format()).collect();
        assert_eq!(formats, [Format::Strace, Format::Tracee]);
        assert!(sources[0].name().ends_with("run.*"), "{}", sources[0].name());
    }

    #[test]
    fn opens_in_memory_input_as_given_or_detected_compressed_or_not() {
        let tetragon = include_bytes!("../../tests/fixtures/import/tetragon/npm-install.jsonl");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, tetragon).unwrap();
        let gz = gz.finish().unwrap();
        let options = ImportOptions::default();
        for (bytes, from) in [(&tetragon[..], None), (&gz[..], None), (&gz[..], Some(Format::Tetragon))] {
            let mut source =
                open_reader("t.jsonl", Box::new(std::io::Cursor::new(bytes.to_vec())), from, &options).unwrap();
            assert_eq!((source.name(), source.format()), ("t.jsonl", Format::Tetragon));
            assert!(source.next_event().unwrap().is_some());
        }
        let error =
            open_reader("x", Box::new(std::io::Cursor::new(b"hello\n".to_vec())), None, &options).err().unwrap();
        assert_eq!(
            error.to_string(),
            "x: unrecognised trace format (use --from credwatch|strace|auditd|tetragon|tracee)"
        );
        // strace times from standard input or memory: 1970-01-01 unless a date is given.
        let strace = b"5 00:00:01.000000 exit_group(0) = ?\n5 00:00:01.000000 +++ exited with 0 +++\n";
        let mut source = open_reader("s", Box::new(std::io::Cursor::new(strace.to_vec())), None, &options).unwrap();
        assert_eq!(source.next_event().unwrap().unwrap().time_ns, 1_000_000_000);
    }
}
