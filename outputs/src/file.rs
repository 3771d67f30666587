//! The `file` output: JSON lines appended to a file (created 0600), rotated by size
//! (`PATH.1` newest to `PATH.<keep>`), and reopened by path on `SIGHUP`.
//!
//! With logrotate: `create` renames the file and makes a new one, then signals; alerts written
//! in between land in the renamed file, and after the reopen in the new one. `copytruncate`
//! copies then truncates in place: the file is opened with `O_APPEND`, so the next alert goes to
//! the new end (no hole), and the size that rotation goes by is the file's own, read before
//! each batch, not a count of what was written.
//!
//! A failed batch is retried whole: the lines before the failure are written twice (receivers
//! dedup on `event.id`), a half-written line is cut off. So is the half line of an agent killed
//! in the middle of a write (a SIGKILL, the OOM killer's too, ends a write(2) between two
//! pages): when the file is opened, before anything is appended (its alert is still in the
//! spool, sent again whole).
//!
//! The writes are std's blocking ones on the outputs' runtime thread: a local file's append
//! returns in microseconds, and the engine never waits for it.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write as _},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

use crate::transport::{Outgoing, Transport, TransportError};

pub struct FileOutput {
    name: String,
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    file: Option<File>,
}

impl FileOutput {
    /// Opens (creating) `path` now, so that a file that cannot be written stops the start.
    pub fn open(path: &Path, max_bytes: u64, keep: u32) -> io::Result<FileOutput> {
        let file = open(path)?;
        Ok(FileOutput {
            name: format!("file:{}", path.display()),
            path: path.to_owned(),
            max_bytes,
            keep,
            file: Some(file),
        })
    }

    fn write(&mut self, batch: &[Outgoing]) -> io::Result<()> {
        let mut size = match &self.file {
            Some(file) => file.metadata()?.len(),
            None => 0,
        };
        for item in batch {
            let line = item.json.len() as u64 + 1;
            if self.file.is_some() && size > 0 && size + line > self.max_bytes {
                self.rotate()?;
                size = 0;
            }
            if self.file.is_none() {
                let file = open(&self.path)?;
                size = file.metadata()?.len();
                self.file = Some(file);
            }
            let file = self.file.as_mut().expect("opened above");
            // One write per line: a reader never sees half an alert.
            let mut buffer = Vec::with_capacity(item.json.len() + 1);
            buffer.extend_from_slice(&item.json);
            buffer.push(b'\n');
            if let Err(error) = file.write_all(&buffer) {
                // A full disk can take half a line: cut it off, so that the retry leaves every
                // line whole (we are the file's only writer; with O_APPEND the next line goes to
                // the end).
                let _ = file.set_len(size);
                return Err(error);
            }
            size += line;
        }
        Ok(())
    }

    /// `PATH.<keep-1>` → `PATH.<keep>`, ..., `PATH` → `PATH.1`; the next write opens a new `PATH`.
    fn rotate(&mut self) -> io::Result<()> {
        self.file = None;
        let numbered = |n: u32| {
            let mut name = self.path.clone().into_os_string();
            name.push(format!(".{n}"));
            PathBuf::from(name)
        };
        if self.keep == 0 {
            return remove_if_there(&self.path);
        }
        remove_if_there(&numbered(self.keep))?;
        for n in (1..self.keep).rev() {
            match fs::rename(numbered(n), numbered(n + 1)) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
                _ => {}
            }
        }
        fs::rename(&self.path, numbered(1))
    }
}

fn open(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new().read(true).append(true).create(true).mode(0o600).open(path)?;
    let whole = whole_lines(&file)?;
    if whole < file.metadata()?.len() {
        file.set_len(whole)?;
    }
    Ok(file)
}

/// The length of `file` up to the end of its last whole line.
fn whole_lines(file: &File) -> io::Result<u64> {
    use std::os::unix::fs::FileExt as _;
    const CHUNK: u64 = 64 << 10;
    let mut end = file.metadata()?.len();
    let mut chunk = vec![0; CHUNK as usize];
    while end > 0 {
        let start = end.saturating_sub(CHUNK);
        let read = &mut chunk[..(end - start) as usize];
        file.read_exact_at(read, start)?;
        if let Some(at) = read.iter().rposition(|byte| *byte == b'\n') {
            return Ok(start + at as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

fn remove_if_there(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

impl Transport for FileOutput {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send(&mut self, batch: &[Outgoing]) -> Result<(), TransportError> {
        self.write(batch).map_err(|error| {
            // Reopened by path on the retry: the file may have been removed or its disk remounted.
            self.file = None;
            TransportError::Retry { output: self.name.clone(), message: error.to_string() }
        })
    }

    fn reopen(&mut self) {
        self.file = None;
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use credwatch_core::alert::Severity;

    use super::*;
    use crate::tests::outgoing;

    fn lines(path: &Path) -> Vec<String> {
        let text = fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .map(|line| {
                serde_json::from_str::<serde_json::Value>(line).unwrap()["event"]["id"].as_str().unwrap().to_owned()
            })
            .collect()
    }

    fn send(output: &mut FileOutput, ids: &[&str]) {
        let batch: Vec<Outgoing> = ids.iter().map(|id| outgoing(id, Severity::High)).collect();
        futures_lite(output.send(&batch)).unwrap();
    }

    /// The file output's future never waits: polled once, it is done.
    fn futures_lite<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(future)
    }

    #[test]
    fn json_lines_0600_rotated_by_size_keeping_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("alerts.jsonl");
        let line = outgoing("a", Severity::High).json.len() as u64 + 1;
        // Two alerts a file.
        let mut output = FileOutput::open(&path, 2 * line, 2).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        send(&mut output, &["a", "b", "c"]);
        assert_eq!(lines(&path), ["c"]);
        assert_eq!(lines(&dir.path().join("alerts.jsonl.1")), ["a", "b"]);
        send(&mut output, &["d", "e", "f", "g"]);
        assert_eq!(lines(&path), ["g"]);
        assert_eq!(lines(&dir.path().join("alerts.jsonl.1")), ["e", "f"]);
        assert_eq!(lines(&dir.path().join("alerts.jsonl.2")), ["c", "d"]);
        assert!(!dir.path().join("alerts.jsonl.3").exists());
        for file in fs::read_dir(dir.path()).unwrap() {
            assert_eq!(file.unwrap().metadata().unwrap().mode() & 0o777, 0o600);
        }
    }

    #[test]
    fn a_half_line_left_by_a_killed_agent_is_cut_off_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("alerts.jsonl");
        let mut output = FileOutput::open(&path, 1 << 20, 1).unwrap();
        send(&mut output, &["a"]);
        let whole = fs::read(&path).unwrap();
        // Killed in the middle of the next line, longer than a chunk of the search.
        let mut torn = whole.clone();
        torn.extend_from_slice(b"{\"event\":{\"id\":\"b");
        torn.extend(std::iter::repeat_n(b' ', 100 << 10));
        fs::write(&path, &torn).unwrap();
        let mut output = FileOutput::open(&path, 1 << 20, 1).unwrap();
        assert_eq!(fs::read(&path).unwrap(), whole);
        send(&mut output, &["b"]);
        assert_eq!(lines(&path), ["a", "b"]);
        // Nothing whole at all.
        fs::write(&path, b"{\"event\"").unwrap();
        FileOutput::open(&path, 1 << 20, 1).unwrap();
        assert!(fs::read(&path).unwrap().is_empty());
    }

    #[test]
    fn logrotate_create_and_copytruncate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("alerts.jsonl");
        let mut output = FileOutput::open(&path, 1 << 20, 3).unwrap();
        send(&mut output, &["a"]);
        // create: renamed, a new file made, then SIGHUP. Before the reopen, alerts go on to
        // the renamed file; after, to the new one.
        let rotated = dir.path().join("alerts.jsonl-20260101");
        fs::rename(&path, &rotated).unwrap();
        File::create(&path).unwrap();
        send(&mut output, &["b"]);
        output.reopen();
        send(&mut output, &["c"]);
        assert_eq!(lines(&rotated), ["a", "b"]);
        assert_eq!(lines(&path), ["c"]);
        // copytruncate: copied, truncated in place; the next line starts the file (no hole).
        fs::copy(&path, &rotated).unwrap();
        OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
        send(&mut output, &["d"]);
        let text = fs::read(&path).unwrap();
        assert_eq!(text[0], b'{', "a hole at the start of the truncated file");
        assert_eq!(lines(&path), ["d"]);
        // Its folder gone at a reopen: retried, and written once the folder is back.
        fs::remove_dir_all(dir.path()).unwrap();
        output.reopen();
        let batch = [outgoing("e", Severity::High)];
        assert!(matches!(futures_lite(output.send(&batch)), Err(TransportError::Retry { .. })));
        fs::create_dir(dir.path()).unwrap();
        send(&mut output, &["e"]);
        assert_eq!(lines(&path), ["e"]);
    }
}
