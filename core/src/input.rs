//! Reading inputs: files or standard input, gzip and zstd recognised by their magic bytes, the
//! bytes read counted for progress, and lines bounded in length and numbered. Shared by the
//! trace reader and the importers.

use std::{
    fs::File,
    io::{self, BufRead, BufReader, Read},
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

/// A line longer than this is an error, not an allocation: memory stays bounded on garbage.
pub const MAX_LINE: usize = 16 << 20;

/// A problem with the input. With `line`, it is about that line; `recoverable` says whether
/// reading can go on with the next line (`--keep-going` skips and counts those).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct InputError {
    pub file: String,
    pub line: Option<u64>,
    pub message: String,
    pub recoverable: bool,
}

impl InputError {
    pub fn fatal(file: &str, message: impl Into<String>) -> InputError {
        InputError { file: file.to_owned(), line: None, message: message.into(), recoverable: false }
    }

    pub fn bad_line(file: &str, line: u64, message: impl Into<String>) -> InputError {
        InputError { file: file.to_owned(), line: Some(line), message: message.into(), recoverable: true }
    }
}

pub(crate) const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
pub(crate) const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];
/// Bytes looked at to detect the format.
const PEEK: usize = 64 << 10;

/// Counts the bytes read from the file itself (before decompression), for progress.
struct Counting<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.count.fetch_add(read as u64, Ordering::Relaxed);
        Ok(read)
    }
}

/// An opened input, decompressed, with its first bytes available for detection.
pub(crate) struct Input {
    name: String,
    reader: BufReader<Box<dyn Read + Send>>,
    consumed: Arc<AtomicU64>,
}

impl Input {
    /// Opens `path` (`-`: standard input), adding the bytes it reads to `consumed`.
    pub(crate) fn open(path: &Path, consumed: Arc<AtomicU64>) -> Result<Input, InputError> {
        let name = path.display().to_string();
        let raw: Box<dyn Read + Send> = if path == Path::new("-") {
            Box::new(io::stdin())
        } else {
            Box::new(File::open(path).map_err(|e| InputError::fatal(&name, e.to_string()))?)
        };
        Input::new(name, raw, consumed)
    }

    pub(crate) fn new(name: String, raw: Box<dyn Read + Send>, consumed: Arc<AtomicU64>) -> Result<Input, InputError> {
        let mut raw = BufReader::new(Counting { inner: raw, count: Arc::clone(&consumed) });
        let magic = raw.fill_buf().map_err(|e| InputError::fatal(&name, e.to_string()))?;
        let decoded: Box<dyn Read + Send> = if magic.starts_with(GZIP_MAGIC) {
            Box::new(flate2::bufread::MultiGzDecoder::new(raw))
        } else if magic.starts_with(ZSTD_MAGIC) {
            Box::new(zstd::Decoder::with_buffer(raw).map_err(|e| InputError::fatal(&name, e.to_string()))?)
        } else {
            Box::new(raw)
        };
        Ok(Input { name, reader: BufReader::with_capacity(PEEK, decoded), consumed })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn peek(&mut self) -> Result<&[u8], InputError> {
        let name = &self.name;
        self.reader.fill_buf().map_err(|e| InputError::fatal(name, e.to_string()))
    }

    pub(crate) fn into_lines(self) -> Lines {
        Lines {
            name: self.name,
            input: Box::new(self.reader),
            consumed: self.consumed,
            line: 0,
            buffer: Vec::new(),
            done: false,
        }
    }
}

/// Lines of an input, bounded in length, numbered from 1.
pub(crate) struct Lines {
    name: String,
    input: Box<dyn BufRead + Send>,
    consumed: Arc<AtomicU64>,
    line: u64,
    buffer: Vec<u8>,
    done: bool,
}

impl Lines {
    #[cfg(test)]
    pub(crate) fn from_bytes(name: &str, bytes: &[u8]) -> Lines {
        Input::new(name.to_owned(), Box::new(io::Cursor::new(bytes.to_vec())), Arc::default())
            .expect("in memory")
            .into_lines()
    }

    /// The line the last [`Lines::next`] returned.
    pub(crate) fn current(&self) -> &[u8] {
        &self.buffer
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn consumed(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.consumed)
    }

    /// The next line without its newline and its number. A line longer than `MAX_LINE` and a
    /// last line without a newline (a file cut while being written) that is not a complete
    /// JSON object are recoverable errors.
    pub(crate) fn next(&mut self) -> Result<Option<(u64, &[u8])>, InputError> {
        if self.done {
            return Ok(None);
        }
        self.buffer.clear();
        let read = (&mut self.input)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut self.buffer)
            .map_err(|e| self.read_error(e))?;
        if read == 0 {
            self.done = true;
            return Ok(None);
        }
        self.line += 1;
        if self.buffer.len() > MAX_LINE {
            self.skip_rest_of_line()?;
            return Err(InputError::bad_line(&self.name, self.line, format!("line longer than {MAX_LINE} bytes")));
        }
        if self.buffer.last() == Some(&b'\n') {
            self.buffer.pop();
            if self.buffer.last() == Some(&b'\r') {
                self.buffer.pop();
            }
        } else {
            self.done = true;
            // A JSON object complete without its newline is fine; anything else was cut short.
            let complete_json = self.buffer.first() == Some(&b'{')
                && serde_json::from_slice::<serde::de::IgnoredAny>(&self.buffer).is_ok();
            if !complete_json {
                return Err(InputError::bad_line(
                    &self.name,
                    self.line,
                    "truncated line (no newline at the end of the input)",
                ));
            }
        }
        Ok(Some((self.line, &self.buffer)))
    }

    fn skip_rest_of_line(&mut self) -> Result<(), InputError> {
        loop {
            self.buffer.clear();
            let read =
                (&mut self.input).take(64 << 10).read_until(b'\n', &mut self.buffer).map_err(|e| self.read_error(e))?;
            if read == 0 || self.buffer.last() == Some(&b'\n') {
                return Ok(());
            }
        }
    }

    fn read_error(&mut self, error: io::Error) -> InputError {
        // A read error (corrupt compressed stream) ends the input.
        self.done = true;
        InputError {
            file: self.name.clone(),
            line: Some(self.line + 1),
            message: format!("reading: {error}"),
            recoverable: false,
        }
    }
}
