//! The local alert log: `{"seq": N, "alert": {...}}` lines, `seq` counting on across restarts,
//! renamed to `<file>.1` past [`ROTATE_AT`] bytes.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write},
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use credwatch_core::{alert::Alert, output::escape};
use serde::Deserialize;

use super::protocol::Logged;

/// Past this size the log is rotated.
pub const ROTATE_AT: u64 = 16 << 20;

/// How much of a log's end is read at start for its last seq: several of the longest alerts.
const TAIL: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("the alert log {}: {what}", escape(&.path.display().to_string()))]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

fn io_error<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> LogError + 'a {
    move |source| LogError::Io { path: path.to_owned(), what, source }
}

/// The log's previous file: `alerts.jsonl.1` of `alerts.jsonl`.
pub fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// The log `watch` appends to.
pub struct AlertLog {
    path: PathBuf,
    file: File,
    size: u64,
    last_seq: u64,
    rotate_at: u64,
}

impl AlertLog {
    /// Opens (creates) the log at `path`, its directory 0755 and the file 0600, and reads the
    /// last seq written (of the previous file when this one is empty).
    pub fn open(path: &Path) -> Result<AlertLog, LogError> {
        AlertLog::with_limit(path, ROTATE_AT)
    }

    fn with_limit(path: &Path, rotate_at: u64) -> Result<AlertLog, LogError> {
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(io_error(path, "creating its directory"))?;
        }
        let mut last_seq = last_seq_of(path)?;
        if last_seq == 0 {
            last_seq = last_seq_of(&rotated(path))?;
        }
        let mut log = AlertLog { path: path.to_owned(), file: open_append(path)?, size: 0, last_seq, rotate_at };
        log.size = log.file.metadata().map_err(io_error(path, "reading its size"))?.len();
        log.end_torn_line()?;
        Ok(log)
    }

    /// The last seq written.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Appends `alert` with the next seq; returns the seq and the line written (with its newline).
    pub fn append(&mut self, alert: &Alert) -> Result<(u64, String), LogError> {
        if self.size >= self.rotate_at {
            self.rotate()?;
        }
        let seq = self.last_seq + 1;
        #[derive(serde::Serialize)]
        struct Line<'a> {
            seq: u64,
            alert: &'a Alert,
        }
        let mut line = serde_json::to_string(&Line { seq, alert }).expect("an alert serialises");
        line.push('\n');
        // One write: a reader sees whole lines but for the last one at a crash.
        self.file.write_all(line.as_bytes()).map_err(io_error(&self.path, "appending an alert"))?;
        self.size += line.len() as u64;
        self.last_seq = seq;
        Ok((seq, line))
    }

    fn rotate(&mut self) -> Result<(), LogError> {
        fs::rename(&self.path, rotated(&self.path)).map_err(io_error(&self.path, "renaming it to .1"))?;
        self.file = open_append(&self.path)?;
        self.size = 0;
        Ok(())
    }

    /// A line torn by a crash mid-write is ended, so that the next one is whole.
    fn end_torn_line(&mut self) -> Result<(), LogError> {
        if self.size == 0 {
            return Ok(());
        }
        let mut last = [0u8];
        let mut reader = File::open(&self.path).map_err(io_error(&self.path, "opening it"))?;
        reader
            .seek(SeekFrom::End(-1))
            .and_then(|_| reader.read_exact(&mut last))
            .map_err(io_error(&self.path, "reading it"))?;
        if last[0] != b'\n' {
            self.file.write_all(b"\n").map_err(io_error(&self.path, "ending a torn line"))?;
            self.size += 1;
        }
        Ok(())
    }
}

fn open_append(path: &Path) -> Result<File, LogError> {
    OpenOptions::new().create(true).append(true).mode(0o600).open(path).map_err(io_error(path, "opening it"))
}

/// The seq of the last whole line of `path`; 0 when it has none or is missing.
fn last_seq_of(path: &Path) -> Result<u64, LogError> {
    #[derive(Deserialize)]
    struct Seq {
        seq: u64,
    }
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(error) => return Err(io_error(path, "opening it")(error)),
    };
    let size = file.metadata().map_err(io_error(path, "reading its size"))?.len();
    let mut tail = Vec::new();
    file.seek(SeekFrom::Start(size.saturating_sub(TAIL)))
        .and_then(|_| file.read_to_end(&mut tail))
        .map_err(io_error(path, "reading its end"))?;
    Ok(tail
        .split(|byte| *byte == b'\n')
        .rev()
        .find_map(|line| serde_json::from_slice::<Seq>(line).ok())
        .map_or(0, |line| line.seq))
}

/// The alerts of the log at `path` (its `.1` first) with a seq above `after`, oldest first. A
/// line that is no logged alert (torn by a crash) is skipped and handed to `skipped` with its
/// file and line number.
pub fn read(path: &Path, after: u64, skipped: &mut dyn FnMut(String)) -> Result<Vec<Logged>, LogError> {
    let mut alerts = Vec::new();
    for file in [rotated(path), path.to_owned()] {
        read_file(&file, after, &mut alerts, skipped)?;
    }
    Ok(alerts)
}

fn read_file(
    path: &Path,
    after: u64,
    alerts: &mut Vec<Logged>,
    skipped: &mut dyn FnMut(String),
) -> Result<(), LogError> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(io_error(path, "opening it")(error)),
    };
    for (number, line) in BufReader::new(file).split(b'\n').enumerate() {
        let line = line.map_err(io_error(path, "reading it"))?;
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<Logged>(&line) {
            Ok(logged) if logged.seq > after => alerts.push(logged),
            Ok(_) => {}
            Err(error) => skipped(format!(
                "{}:{}: skipped a line that is no logged alert (torn by a crash?): {error}",
                escape(&path.display().to_string()),
                number + 1
            )),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn alert(pid: u32) -> Alert {
        let mut alert: Alert = serde_json::from_value(serde_json::json!({
            "@timestamp": "2026-12-05T18:00:00Z",
            "event": {"kind": "alert", "action": "open", "outcome": "alerted"},
            "rule": {"id": "ssh-private-key", "name": "SSH key", "category": "ssh", "severity": "critical", "description": "d"},
            "process": {"pid": pid, "executable": "/usr/bin/node", "args": [], "working_directory": "/", "parent": {"pid": 1}, "ancestors": []},
            "package": {"manager": "npm", "name": "evil", "version": "1.0.0", "lifecycle": "postinstall"},
            "host": {"name": "dev"},
            "user": {"id": 1000},
            "credwatch": {"root_pid": 10, "rotate": [], "enforcement": "userspace"}
        }))
        .unwrap();
        alert.event.id = alert.stable_id();
        alert
    }

    fn seqs(path: &Path, after: u64) -> (Vec<u64>, Vec<String>) {
        let mut skipped = Vec::new();
        let read = read(path, after, &mut |why| skipped.push(why)).unwrap();
        (read.iter().map(|logged| logged.seq).collect(), skipped)
    }

    #[test]
    fn seq_goes_on_across_opens_and_the_file_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/alerts.jsonl");
        let mut log = AlertLog::open(&path).unwrap();
        assert_eq!(log.append(&alert(1)).unwrap().0, 1);
        let (seq, line) = log.append(&alert(2)).unwrap();
        assert_eq!(seq, 2);
        assert!(line.starts_with("{\"seq\":2,\"alert\":{") && line.ends_with("}\n"), "{line}");
        drop(log);
        let mut log = AlertLog::open(&path).unwrap();
        assert_eq!(log.last_seq(), 2);
        assert_eq!(log.append(&alert(3)).unwrap().0, 3);
        assert_eq!(seqs(&path, 0).0, [1, 2, 3]);
        assert_eq!(seqs(&path, 2).0, [3]);
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o755);
        let back = read(&path, 0, &mut |_| {}).unwrap();
        assert_eq!(back[2].alert, alert(3));
    }

    #[test]
    fn rotates_past_the_limit_and_counts_on_from_the_previous_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("alerts.jsonl");
        let line = AlertLog::open(&path).unwrap().append(&alert(1)).unwrap().1.len() as u64;
        fs::remove_file(&path).unwrap();
        // Three lines a file.
        let mut log = AlertLog::with_limit(&path, 3 * line).unwrap();
        for pid in 1..=7 {
            log.append(&alert(pid)).unwrap();
        }
        assert_eq!(seqs(&rotated(&path), 0).0, [4, 5, 6], "the older file was replaced");
        assert_eq!(seqs(&path, 0).0, [4, 5, 6, 7], "the .1 first, then the file");
        assert_eq!(seqs(&path, 5).0, [6, 7]);
        // Rotated just now: the new file is empty, the seq comes from the .1.
        drop(log);
        fs::write(&path, "").unwrap();
        let mut log = AlertLog::open(&path).unwrap();
        assert_eq!(log.last_seq(), 6);
        assert_eq!(log.append(&alert(8)).unwrap().0, 7);
    }

    #[test]
    fn a_torn_last_line_is_skipped_with_a_warning_and_ended_before_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("alerts.jsonl");
        let mut log = AlertLog::open(&path).unwrap();
        log.append(&alert(1)).unwrap();
        let (_, line) = log.append(&alert(2)).unwrap();
        drop(log);
        // A kill -9 mid-write of seq 3.
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(line[..line.len() / 2].replace("\"seq\":2", "\"seq\":3").as_bytes()).unwrap();
        drop(file);
        let (read, skipped) = seqs(&path, 0);
        assert_eq!(read, [1, 2]);
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert!(skipped[0].contains("alerts.jsonl:3: skipped a line"), "{}", skipped[0]);

        let mut log = AlertLog::open(&path).unwrap();
        assert_eq!(log.last_seq(), 2, "the torn line's seq is not taken");
        assert_eq!(log.append(&alert(3)).unwrap().0, 3);
        let (read, skipped) = seqs(&path, 0);
        assert_eq!((read, skipped.len()), (vec![1, 2, 3], 1));
    }

    #[test]
    fn a_missing_log_has_no_alerts_and_an_unreadable_one_says_which() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(seqs(&dir.path().join("none.jsonl"), 0).0, Vec::<u64>::new());
        let error = read(dir.path(), 0, &mut |_| {}).unwrap_err().to_string();
        assert!(error.contains(&dir.path().display().to_string()), "{error}");
    }
}
