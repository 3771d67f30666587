//! One output's spool on disk: every alert the output has not delivered yet, so that an agent
//! stopped or killed leaves them for the next one, which delivers them first and in order.
//!
//! Append-only segments, one chain per severity: `<number>-<severity>.seg` files (mode 0600,
//! in a 0700 folder) of records `magic | length | CRC-32 | seq | id | host | ECS JSON`, written
//! through a buffered writer (one write(2) per 64 KiB rather than a file per alert: measured,
//! 70-110 µs per alert with a file each, see the module's bench `examples/spool_flood.rs`).
//! Delivery merges the chains by sequence number, so alerts leave in the order they came.
//! A chain per severity because the cap drops the least severe first: a whole segment of theirs
//! is one unlink, each of its alerts counted. A segment is removed once every alert in it is
//! delivered, and the `ack` file holds the lowest sequence number not delivered yet, so that a
//! restart skips what was (what an agent killed had delivered since its last ack is sent again:
//! at-least-once, receivers dedup on `event.id`).
//!
//! When the folder cannot be written (a full disk, a file system remounted read-only), the
//! alerts that did not reach it are kept in memory, up to [`MAX_MEMORY_ONLY`] bytes (the
//! least severe dropped first past it), and delivered from there; each is counted (the
//! dispatcher's `unspooled`), and the disk is tried again every [`RETRY_UNWRITABLE`]. The
//! spool says when it started failing and when it was written again ([`Spool::take_changes`]),
//! not at each alert.
//!
//! There is no fsync: the spool outlives the agent (`kill -9` included: written data is in the
//! page cache), not a power cut (a sync per alert would cost more than the delivery). An agent
//! killed in the middle of an append leaves a torn last record: the next one finds it, says so
//! and cuts it off. A record that fails its check elsewhere is an error naming the file and the
//! offset; the records after it are still delivered.

use std::{
    collections::BTreeMap,
    fmt, fs,
    io::{self, BufWriter, Write as _},
    os::unix::fs::{FileExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::{Bytes, BytesMut};
use credwatch_core::alert::Severity;

use crate::transport::Outgoing;

/// Spooled alerts kept in memory too (for the common case: delivered at once), beyond which
/// they are read back from disk when their turn comes.
const MAX_CACHED: usize = 4096;
pub(crate) const SEVERITIES: [Severity; 4] = [Severity::Low, Severity::Medium, Severity::High, Severity::Critical];
/// The start of every record: what a reader resynchronises on after a corrupt one.
const MAGIC: [u8; 4] = *b"CWsp";
/// magic, payload length, CRC-32 of the payload.
const HEADER: usize = 12;
/// The payload's fixed part: seq, id length, host length.
const FIXED: usize = 12;
const WRITE_BUFFER: usize = 64 << 10;
/// Largest segment: what a drop at the cap takes at once at most (~4k alerts).
const MAX_SEGMENT: u64 = 4 << 20;
/// Segments per cap: the cap is reached with that many segments at least, so that a drop takes
/// a sixteenth of the spool at most.
const SEGMENTS_PER_CAP: u64 = 16;
const ACK: &str = "ack";
/// Alerts kept in memory at most while the folder cannot be written: a few thousand alerts.
pub const MAX_MEMORY_ONLY: u64 = 16 << 20;
/// How often a spool that could not be written tries its folder again.
pub const RETRY_UNWRITABLE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
#[error("spool {}: {action}", path.display())]
pub struct SpoolError {
    pub path: PathBuf,
    pub action: String,
    #[source]
    pub source: io::Error,
}

impl SpoolError {
    fn new(path: &Path, action: impl Into<String>) -> impl FnOnce(io::Error) -> SpoolError {
        let (path, action) = (path.to_owned(), action.into());
        move |source| SpoolError { path, action, source }
    }
}

/// What [`Spool::open`] found wrong and mended.
#[derive(Debug, PartialEq, Eq)]
pub enum Recovered {
    /// The last record of a chain, half-written when an agent died: cut off (never delivered,
    /// never acknowledged).
    Torn { path: PathBuf, offset: u64, bytes: u64 },
    /// Bytes that are no record (damaged on disk, or a write that failed): skipped; the alerts
    /// in them are lost.
    Corrupt { path: PathBuf, offset: u64, bytes: u64 },
    /// The `ack` file is unreadable: every alert in the spool is sent again.
    Ack { path: PathBuf },
    /// A spool of an older credwatch (a file per alert), taken in; `dropped` at the cap.
    Older { dir: PathBuf, taken: u64, dropped: u64 },
}

impl Recovered {
    /// Alerts were lost (rather than an alert that was never whole left out).
    pub fn is_loss(&self) -> bool {
        matches!(self, Recovered::Corrupt { .. } | Recovered::Older { dropped: 1.., .. })
    }
}

impl fmt::Display for Recovered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Recovered::Torn { path, offset, bytes } => write!(
                f,
                "spool {}: a torn last record at offset {offset} ({bytes} bytes, an agent stopped while \
                 writing it) skipped",
                path.display()
            ),
            Recovered::Corrupt { path, offset, bytes } => write!(
                f,
                "spool {}: {bytes} corrupt bytes at offset {offset} skipped, the alerts in them are lost",
                path.display()
            ),
            Recovered::Ack { path } => {
                write!(f, "spool {}: unreadable, every spooled alert is sent again", path.display())
            }
            Recovered::Older { dir, taken, dropped } => write!(
                f,
                "spool {}: {taken} alerts of an older credwatch's spool (a file each) taken in, {dropped} \
                 dropped at the cap",
                dir.display()
            ),
        }
    }
}

/// A segment: (severity, its number; the newest has the highest).
type Key = (Severity, u64);

struct Segment {
    path: Arc<Path>,
    /// The lowest sequence number in it. Not always its first record's: when the queue is full
    /// the engine's thread appends alerts that the task's, queued before, follow.
    lowest: u64,
    /// Bytes on disk (or in its writer's buffer).
    size: u64,
    /// Its records not delivered yet.
    live: u64,
}

struct Writer {
    key: Key,
    file: BufWriter<fs::File>,
    /// The alerts appended since its last write out, in order: kept in memory until written.
    pending: Vec<u64>,
    /// The segment's bytes known to be on disk.
    written: u64,
}

struct Entry {
    /// None: kept in memory only (the folder could not be written).
    segment: Option<Key>,
    offset: u64,
    len: u32,
    /// Boxed: most entries of a full spool have none, and a full spool has ~250k entries.
    item: Option<Box<Outgoing>>,
}

pub struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    segment_bytes: u64,
    entries: BTreeMap<u64, Entry>,
    segments: BTreeMap<Key, Segment>,
    /// The segment each severity appends to, when one is open.
    writers: [Option<Writer>; 4],
    bytes: u64,
    cached: usize,
    next_seq: u64,
    next_segment: u64,
    ack: fs::File,
    /// What the `ack` file says: every alert below it is delivered.
    acked: u64,
    /// Segments to remove, outside the lock the spool is under.
    doomed: Vec<Arc<Path>>,
    /// Bytes of the alerts kept in memory only.
    memory_only: u64,
    /// Alerts that could not be written, since the start: kept in memory, or dropped.
    unspooled: u64,
    /// Set while the folder cannot be written.
    trouble: Option<Trouble>,
    /// What [`Spool::take_changes`] hands over.
    changes: Vec<Change>,
}

/// An episode of a folder that cannot be written.
struct Trouble {
    /// When to try the folder again.
    retry_at: Instant,
    /// Alerts kept in memory only, and dropped for want of that room, meanwhile.
    kept: u64,
    dropped: u64,
}

/// The spool's folder stopped or started again taking alerts.
#[derive(Debug)]
pub enum Change {
    /// It cannot be written (the first error of an episode): alerts are kept in memory.
    Unwritable(SpoolError),
    /// Written again; `kept` alerts were kept in memory only meanwhile, `dropped` dropped when
    /// that room was full.
    Writable { kept: u64, dropped: u64 },
}

/// What [`Spool::put`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Put {
    /// The alerts dropped to make room, by severity (the new one, when it was the least).
    pub dropped: [u64; 4],
    /// The alerts dropped because the folder cannot be written and the memory kept for that
    /// was full, by severity (said once, when the episode ends: [`Change::Writable`]).
    pub unwritable: [u64; 4],
}

impl Spool {
    /// Opens (creating it) the spool in `dir`, with what an earlier agent left there, and what
    /// was found wrong in it. A folder that cannot be created is an error; one that exists but
    /// cannot be written (a file system read-only or full when an agent restarts) starts the
    /// spool in memory, as when it fails later (see the module's documentation).
    pub fn open(dir: &Path, max_bytes: u64) -> Result<(Spool, Vec<Recovered>), SpoolError> {
        fs::create_dir_all(dir).map_err(SpoolError::new(dir, "creating the folder"))?;
        let mode = fs::metadata(dir).map_err(SpoolError::new(dir, "reading the folder"))?.permissions().mode();
        let mut unwritable = None;
        if mode & 0o777 != 0o700 {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
                .map_err(SpoolError::new(dir, "making the folder 0700"))?;
        }
        let mut recovered = Vec::new();
        let ack_path = dir.join(ACK);
        let open_ack = |write: bool| {
            fs::OpenOptions::new().read(true).write(write).create(write).truncate(false).mode(0o600).open(&ack_path)
        };
        let ack = match open_ack(true) {
            Ok(ack) => ack,
            Err(error) => match open_ack(false) {
                Ok(ack) => {
                    unwritable = Some(("writing", ack_path.clone(), error));
                    ack
                }
                Err(_) => return Err(SpoolError::new(&ack_path, "opening")(error)),
            },
        };
        // Two agents appending to one spool would interleave their records and acknowledge
        // each other's: the lock (released when the process dies) keeps it to one.
        ack.try_lock().map_err(|error| {
            let source = match error {
                fs::TryLockError::WouldBlock => io::Error::from(io::ErrorKind::WouldBlock),
                fs::TryLockError::Error(error) => error,
            };
            SpoolError {
                path: dir.to_owned(),
                action: "in use by another credwatch process (give each its own --spool-dir)".into(),
                source,
            }
        })?;
        let acked = match read_ack(&ack) {
            Ok(acked) => acked,
            Err(_) => {
                recovered.push(Recovered::Ack { path: ack_path });
                0
            }
        };
        let mut spool = Spool {
            dir: dir.to_owned(),
            max_bytes,
            segment_bytes: (max_bytes / SEGMENTS_PER_CAP).clamp(1, MAX_SEGMENT),
            entries: BTreeMap::new(),
            segments: BTreeMap::new(),
            writers: [None, None, None, None],
            bytes: 0,
            cached: 0,
            next_seq: acked,
            next_segment: 0,
            ack,
            acked,
            doomed: Vec::new(),
            memory_only: 0,
            unspooled: 0,
            trouble: None,
            changes: Vec::new(),
        };
        let mut found: Vec<(Key, PathBuf)> = Vec::new();
        let mut older: Vec<(u64, Severity, PathBuf)> = Vec::new();
        for entry in fs::read_dir(dir).map_err(SpoolError::new(dir, "listing"))? {
            let entry = entry.map_err(SpoolError::new(dir, "listing"))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some(key) = parse_name(&name) {
                found.push((key, entry.path()));
            } else if let Some((seq, severity)) = parse_older_name(&name) {
                older.push((seq, severity, entry.path()));
            } else if name.ends_with(".tmp") {
                // An older credwatch's alert half-written when it died: never delivered.
                let _ = fs::remove_file(entry.path());
            }
        }
        found.sort();
        for (n, (key, path)) in found.iter().enumerate() {
            let last = found.get(n + 1).is_none_or(|(next, _)| next.0 != key.0);
            spool.load_segment(*key, path, last, &mut recovered)?;
        }
        // Whether it can be written, said now rather than at the first alert.
        if let Some((action, path, error)) = unwritable {
            spool.unwritable(&path, action, error);
        }
        let probe = dir.join(".probe.tmp");
        match fs::write(&probe, b"") {
            Ok(()) => {
                let _ = fs::remove_file(probe);
            }
            Err(error) => spool.unwritable(dir, "writing", error),
        }
        spool.take_older(older, &mut recovered)?;
        Ok((spool, recovered))
    }

    /// Alerts an older credwatch spooled, a file each (`<seq>-<severity>.json`): into segments,
    /// in their order, and their files removed once the segments are written.
    fn take_older(
        &mut self,
        mut files: Vec<(u64, Severity, PathBuf)>,
        recovered: &mut Vec<Recovered>,
    ) -> Result<(), SpoolError> {
        if files.is_empty() {
            return Ok(());
        }
        files.sort();
        let (mut taken, mut dropped) = (0, 0);
        for (_, severity, path) in &files {
            match read_older(path, *severity) {
                Ok(item) => {
                    let put = self.put(self.next_seq, item);
                    dropped += put.dropped.iter().sum::<u64>();
                    taken += 1;
                }
                Err(bytes) => recovered.push(Recovered::Corrupt { path: path.clone(), offset: 0, bytes }),
            }
        }
        self.flush();
        // Kept in memory only while the folder cannot be written: the files stay for the next agent.
        if self.trouble.is_none() {
            for (_, _, path) in files {
                let _ = fs::remove_file(path);
            }
        }
        recovered.push(Recovered::Older { dir: self.dir.clone(), taken, dropped });
        Ok(())
    }

    /// Reads a segment an earlier agent left: its records not delivered yet are spooled again.
    fn load_segment(
        &mut self,
        key: Key,
        path: &Path,
        last_of_chain: bool,
        recovered: &mut Vec<Recovered>,
    ) -> Result<(), SpoolError> {
        let data = Bytes::from(fs::read(path).map_err(SpoolError::new(path, "reading"))?);
        let mut size = data.len() as u64;
        let path: Arc<Path> = Arc::from(path);
        let (mut live, mut lowest) = (0, u64::MAX);
        let mut offset = 0;
        self.next_segment = self.next_segment.max(key.1 + 1);
        while offset < data.len() {
            match decode(&data, offset) {
                Some(record) => {
                    if record.seq >= self.acked {
                        let len = record.len as u32;
                        let entry = Entry { segment: Some(key), offset: offset as u64, len, item: None };
                        self.entries.insert(record.seq, entry);
                        live += 1;
                        lowest = lowest.min(record.seq);
                    }
                    self.next_seq = self.next_seq.max(record.seq + 1);
                    offset += record.len;
                }
                None => {
                    let next = resync(&data, offset + 1);
                    let bytes = (next.unwrap_or(data.len()) - offset) as u64;
                    if next.is_none() && last_of_chain {
                        // The agent died in the middle of this append: cut it off, so that the
                        // next append to this chain (in a new segment) is not behind garbage.
                        let cut =
                            fs::OpenOptions::new().write(true).open(&path).and_then(|file| file.set_len(offset as u64));
                        match cut {
                            Ok(()) => size = offset as u64,
                            Err(error) => self.unwritable(&path, "cutting off a torn record", error),
                        }
                        recovered.push(Recovered::Torn { path: path.to_path_buf(), offset: offset as u64, bytes });
                    } else {
                        recovered.push(Recovered::Corrupt { path: path.to_path_buf(), offset: offset as u64, bytes });
                    }
                    offset = next.unwrap_or(data.len());
                }
            }
        }
        if live == 0 {
            // Every alert in it was delivered (or none is left whole): an agent died before
            // removing it.
            let _ = fs::remove_file(&path);
        } else {
            self.bytes += size;
            self.segments.insert(key, Segment { path, lowest, size, live });
        }
        Ok(())
    }

    /// The sequence number after every spooled alert's: where the next alert's goes.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes on disk: the segments, with what their delivered records still take until the
    /// whole segment is delivered.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Alerts that could not be written since the start (kept in memory, or dropped).
    pub fn unspooled(&self) -> u64 {
        self.unspooled
    }

    /// When the folder stopped or started again taking alerts, since the last call.
    pub fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.changes)
    }

    /// Stores `item` as alert `seq` (in the buffered writer: [`Spool::flush`] writes it out).
    /// Past the cap, the least severe alerts go first: the newest segment of them, so that
    /// the start of a story stays; `item` itself when its severity is the least in the spool.
    /// While the folder cannot be written, in memory (see the module's documentation).
    pub fn put(&mut self, seq: u64, item: Outgoing) -> Put {
        let size = record_size(&item);
        let mut put = Put::default();
        if self.trouble.as_ref().is_some_and(|trouble| Instant::now() < trouble.retry_at) {
            self.keep_in_memory(seq, item, &mut put);
            return put;
        }
        while self.bytes + size > self.max_bytes {
            let victim = self.segments.keys().find(|(severity, _)| *severity <= item.severity).map(|(severity, _)| {
                let newest = self.segments.range((*severity, 0)..=(*severity, u64::MAX)).next_back();
                *newest.expect("a segment of that severity").0
            });
            match victim {
                Some(victim) if victim.0 < item.severity => {
                    put.dropped[victim.0 as usize] += self.drop_segment(victim);
                }
                // Equal severity: the newest goes, and that is the new one.
                _ => {
                    put.dropped[item.severity as usize] += 1;
                    return put;
                }
            }
        }
        let Some((offset, key)) = self.append(seq, &item) else {
            self.keep_in_memory(seq, item, &mut put);
            return put;
        };
        // Cached until written out (what the writer holds is lost if the write fails).
        self.cached += 1;
        self.bytes += size;
        self.next_seq = self.next_seq.max(seq + 1);
        let segment = self.segments.get_mut(&key).expect("the writer's segment");
        segment.size += size;
        segment.live += 1;
        segment.lowest = segment.lowest.min(seq);
        self.writers[key.0 as usize].as_mut().expect("the segment's writer").pending.push(seq);
        let entry = Entry { segment: Some(key), offset, len: size as u32, item: Some(Box::new(item)) };
        self.entries.insert(seq, entry);
        put
    }

    /// The folder cannot be written: `item` in memory only, while there is room for it (else
    /// the least severe alert kept so goes first, the new one when it is the least).
    fn keep_in_memory(&mut self, seq: u64, item: Outgoing, put: &mut Put) {
        let size = record_size(&item);
        self.next_seq = self.next_seq.max(seq + 1);
        self.unspooled += 1;
        let trouble = self.trouble.as_mut().expect("in memory only while the folder cannot be written");
        while self.memory_only + size > MAX_MEMORY_ONLY {
            let victim = self
                .entries
                .iter()
                .filter(|(_, entry)| entry.segment.is_none())
                .map(|(seq, entry)| (entry.item.as_ref().expect("kept in memory").severity, *seq))
                .filter(|(severity, _)| *severity < item.severity)
                .min_by_key(|(severity, seq)| (*severity, std::cmp::Reverse(*seq)));
            trouble.dropped += 1;
            let Some((severity, victim)) = victim else {
                put.unwritable[item.severity as usize] += 1;
                return;
            };
            put.unwritable[severity as usize] += 1;
            let entry = self.entries.remove(&victim).expect("listed above");
            self.memory_only -= u64::from(entry.len);
            self.cached -= 1;
        }
        trouble.kept += 1;
        self.memory_only += size;
        self.cached += 1;
        self.entries.insert(seq, Entry { segment: None, offset: 0, len: size as u32, item: Some(Box::new(item)) });
    }

    /// The folder could not be written (`error` on `path`): said at the first failure of an
    /// episode; the next try waits [`RETRY_UNWRITABLE`].
    fn unwritable(&mut self, path: &Path, action: &str, source: io::Error) {
        let retry_at = Instant::now() + RETRY_UNWRITABLE;
        match &mut self.trouble {
            Some(trouble) => trouble.retry_at = retry_at,
            None => {
                self.trouble = Some(Trouble { retry_at, kept: 0, dropped: 0 });
                let error = SpoolError { path: path.to_owned(), action: action.into(), source };
                self.changes.push(Change::Unwritable(error));
            }
        }
    }

    /// Appends `item`'s record to its severity's segment (a new one when there is none open or
    /// it is full): where it went; None when the folder could not be written.
    fn append(&mut self, seq: u64, item: &Outgoing) -> Option<(u64, Key)> {
        let class = item.severity as usize;
        let open = match &self.writers[class] {
            Some(writer) => self.segments[&writer.key].size >= self.segment_bytes,
            None => true,
        };
        if open {
            if !self.close_writer(item.severity) {
                return None;
            }
            let key = (item.severity, self.next_segment);
            self.next_segment += 1;
            let path = self.path(key);
            let file = match fs::OpenOptions::new().append(true).create_new(true).mode(0o600).open(&path) {
                Ok(file) => file,
                Err(error) => {
                    self.unwritable(&path, "creating a segment", error);
                    return None;
                }
            };
            self.segments.insert(key, Segment { path: Arc::from(path), lowest: seq, size: 0, live: 0 });
            let file = BufWriter::with_capacity(WRITE_BUFFER, file);
            self.writers[class] = Some(Writer { key, file, pending: Vec::new(), written: 0 });
        }
        let writer = self.writers[class].as_mut().expect("opened above");
        let key = writer.key;
        let offset = self.segments[&key].size;
        if let Err(error) = encode(&mut writer.file, seq, item) {
            self.write_failed(item.severity, error);
            return None;
        }
        Some((offset, key))
    }

    /// Writes out what the buffered writers hold, so that it survives the agent and reads
    /// back. What a write that failed held stays in memory (see the module's documentation).
    pub fn flush(&mut self) {
        for severity in SEVERITIES {
            self.flush_writer(severity);
        }
    }

    /// Writes out `severity`'s writer: whether all it held is out.
    fn flush_writer(&mut self, severity: Severity) -> bool {
        let Some(writer) = &mut self.writers[severity as usize] else { return true };
        if let Err(error) = writer.file.flush() {
            self.write_failed(severity, error);
            return false;
        }
        if writer.pending.is_empty() {
            return true;
        }
        writer.written = self.segments[&writer.key].size;
        for seq in std::mem::take(&mut writer.pending) {
            // On disk now: past the cache, read back from there when its turn comes.
            if self.cached > MAX_CACHED {
                if let Some(item) = self.entries.get_mut(&seq).and_then(|entry| entry.item.take()) {
                    drop(item);
                    self.cached -= 1;
                }
            }
        }
        if let Some(Trouble { kept, dropped, .. }) = self.trouble.take() {
            self.changes.push(Change::Writable { kept, dropped });
        }
        true
    }

    /// A write to `severity`'s segment failed: the segment is cut back to the whole records on
    /// disk, and the alerts that did not reach it are kept in memory only.
    fn write_failed(&mut self, severity: Severity, error: io::Error) {
        let Some(writer) = self.writers[severity as usize].take() else { return };
        let (key, written) = (writer.key, writer.written);
        let (file, _unwritten) = writer.file.into_parts();
        let path = Arc::clone(&self.segments[&key].path);
        self.unwritable(&path, "writing alerts", error);
        let trouble = self.trouble.as_mut().expect("set above");
        let on_disk = file.metadata().map_or(written, |metadata| metadata.len());
        let segment = self.segments.get_mut(&key).expect("the writer's segment");
        let mut whole = written;
        for seq in writer.pending {
            let Some(entry) = self.entries.get_mut(&seq) else { continue };
            let end = entry.offset + u64::from(entry.len);
            if end <= on_disk {
                whole = whole.max(end);
                continue;
            }
            // Cached while pending: from memory, and counted as not spooled.
            entry.segment = None;
            segment.live -= 1;
            self.memory_only += u64::from(entry.len);
            self.unspooled += 1;
            trouble.kept += 1;
        }
        // A record half out would read as damaged at the next start (on a read-only file
        // system nothing got out, and this fails).
        let _ = file.set_len(whole);
        self.bytes -= segment.size - whole;
        segment.size = whole;
        if segment.live == 0 {
            self.remove_segment(key);
        }
    }

    /// Writes out and lets go `severity`'s writer: whether all it held is out.
    fn close_writer(&mut self, severity: Severity) -> bool {
        let flushed = self.flush_writer(severity);
        self.writers[severity as usize] = None;
        flushed
    }

    /// Lets a writer go with what it still holds unwritten (a `BufWriter` dropped would write
    /// it).
    fn discard_writer(&mut self, severity: Severity) {
        if let Some(writer) = self.writers[severity as usize].take() {
            drop(writer.file.into_parts());
        }
    }

    /// The oldest `max` alerts, in order, with their sequence numbers: in memory, or where to
    /// [`load`] them from (outside the lock the spool is under, so that the engine's thread
    /// never waits for these reads). Flushes first, so that what is on disk is whole.
    pub fn oldest(&mut self, max: usize) -> Vec<(u64, Spooled)> {
        self.flush();
        let spooled = |(&seq, entry): (&u64, &Entry)| match &entry.item {
            Some(item) => (seq, Spooled::Memory(Outgoing::clone(item))),
            None => {
                let segment = entry.segment.expect("an alert not in memory is on disk");
                (
                    seq,
                    Spooled::Disk {
                        path: Arc::clone(&self.segments[&segment].path),
                        offset: entry.offset,
                        len: entry.len,
                        severity: segment.0,
                    },
                )
            }
        };
        self.entries.iter().take(max).map(spooled).collect()
    }

    /// Forgets the alerts `seqs` (delivered, refused or unreadable): how many were still here
    /// (not dropped meanwhile). Segments left with nothing to deliver are for
    /// [`Spool::take_doomed`]; the `ack` file moves past what was delivered (when it cannot be
    /// written, a restart sends them again).
    pub fn forget(&mut self, seqs: impl IntoIterator<Item = u64>) -> usize {
        let mut forgotten = 0;
        for seq in seqs {
            let Some(entry) = self.entries.remove(&seq) else { continue };
            forgotten += 1;
            self.cached -= usize::from(entry.item.is_some());
            match entry.segment {
                Some(key) => {
                    let segment = self.segments.get_mut(&key).expect("an entry's segment");
                    segment.live -= 1;
                    if segment.live == 0 {
                        self.remove_segment(key);
                    }
                }
                None => self.memory_only -= u64::from(entry.len),
            }
        }
        let acked = self.entries.first_key_value().map_or(self.next_seq, |(seq, _)| *seq);
        if acked != self.acked {
            let mut record = [0; 16];
            record[..8].copy_from_slice(&acked.to_le_bytes());
            record[8..].copy_from_slice(&(!acked).to_le_bytes());
            match self.ack.write_all_at(&record, 0) {
                Ok(()) => self.acked = acked,
                Err(error) => self.unwritable(&self.dir.join(ACK), "writing", error),
            }
        }
        forgotten
    }

    /// Drops a whole segment at the cap: how many alerts went with it.
    fn drop_segment(&mut self, key: Key) -> u64 {
        let Segment { live, lowest, .. } = self.segments[&key];
        let dropped: Vec<u64> = self
            .entries
            .range(lowest..)
            .filter(|(_, entry)| entry.segment == Some(key))
            .map(|(seq, _)| *seq)
            .take(live as usize)
            .collect();
        for seq in dropped {
            let entry = self.entries.remove(&seq).expect("listed above");
            self.cached -= usize::from(entry.item.is_some());
        }
        self.remove_segment(key);
        live
    }

    fn remove_segment(&mut self, key: Key) {
        if self.writers[key.0 as usize].as_ref().is_some_and(|writer| writer.key == key) {
            // Nothing in it to keep: what its writer holds goes with it unwritten.
            self.discard_writer(key.0);
        }
        let segment = self.segments.remove(&key).expect("a segment");
        self.bytes -= segment.size;
        self.doomed.push(segment.path);
    }

    /// The files of the segments delivered or dropped since the last call, to remove.
    pub fn take_doomed(&mut self) -> Vec<Arc<Path>> {
        std::mem::take(&mut self.doomed)
    }

    fn path(&self, (severity, number): Key) -> PathBuf {
        self.dir.join(format!("{number:020}-{}.seg", severity.as_str()))
    }
}

/// The bytes `item` takes in the spool.
pub fn record_size(item: &Outgoing) -> u64 {
    (HEADER + FIXED + item.id.len() + item.host.len() + item.json.len()) as u64
}

/// A spooled alert, in memory or on disk.
pub enum Spooled {
    Memory(Outgoing),
    Disk { path: Arc<Path>, offset: u64, len: u32, severity: Severity },
}

/// The alerts of a batch taken with [`Spool::oldest`], in its order, each or why it cannot be
/// read (its segment dropped since, removed by hand, or damaged). A batch is the oldest alerts,
/// so those of one segment are next to each other in it (but for a few the engine's thread
/// appended ahead): one read per segment.
pub fn load(taken: Vec<(u64, Spooled)>) -> Vec<(u64, Result<Outgoing, SpoolError>)> {
    // Each segment's span in this batch, then its bytes.
    let mut spans: Vec<(Arc<Path>, u64, u64)> = Vec::new();
    for (_, spooled) in &taken {
        if let Spooled::Disk { path, offset, len, .. } = spooled {
            let end = offset + u64::from(*len);
            match spans.iter_mut().find(|(p, _, _)| p == path) {
                Some((_, start, stop)) => (*start, *stop) = ((*start).min(*offset), (*stop).max(end)),
                None => spans.push((Arc::clone(path), *offset, end)),
            }
        }
    }
    let read: Vec<io::Result<Bytes>> = spans
        .iter()
        .map(|(path, start, end)| {
            let mut data = BytesMut::zeroed((end - start) as usize);
            fs::File::open(path)?.read_exact_at(&mut data, *start)?;
            Ok(data.freeze())
        })
        .collect();
    let load = |seq: u64, path: &Arc<Path>, offset: u64, len: u32, severity| {
        let span = spans.iter().position(|(p, _, _)| p == path).expect("a span for every segment");
        let error = |action: String, source| SpoolError { path: path.to_path_buf(), action, source };
        match &read[span] {
            Ok(data) => match decode(data, (offset - spans[span].1) as usize) {
                Some(record) if record.seq == seq && record.len == len as usize => Ok(record.outgoing(severity)),
                _ => Err(error(
                    format!("alert {seq} at offset {offset}"),
                    io::Error::new(io::ErrorKind::InvalidData, "not the record written there"),
                )),
            },
            Err(source) => Err(error(
                format!("reading alert {seq} at offset {offset}"),
                io::Error::new(source.kind(), source.to_string()),
            )),
        }
    };
    taken
        .into_iter()
        .map(|(seq, spooled)| match spooled {
            Spooled::Memory(item) => (seq, Ok(item)),
            Spooled::Disk { path, offset, len, severity } => (seq, load(seq, &path, offset, len, severity)),
        })
        .collect()
}

/// A record, decoded from a segment's bytes.
struct Record {
    seq: u64,
    /// The whole record's length, header included.
    len: usize,
    id: String,
    host: String,
    json: Bytes,
}

impl Record {
    fn outgoing(self, severity: Severity) -> Outgoing {
        Outgoing { id: self.id, severity, host: self.host, json: self.json }
    }
}

fn encode(out: &mut impl io::Write, seq: u64, item: &Outgoing) -> io::Result<()> {
    let too_long = || io::Error::new(io::ErrorKind::InvalidInput, "an id or host name longer than 64 KiB");
    let id_len = u16::try_from(item.id.len()).map_err(|_| too_long())?;
    let host_len = u16::try_from(item.host.len()).map_err(|_| too_long())?;
    let payload = FIXED + item.id.len() + item.host.len() + item.json.len();
    let payload =
        u32::try_from(payload).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "an alert of 4 GiB"))?;
    let mut fixed = [0; FIXED];
    fixed[..8].copy_from_slice(&seq.to_le_bytes());
    fixed[8..10].copy_from_slice(&id_len.to_le_bytes());
    fixed[10..].copy_from_slice(&host_len.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    for part in [&fixed[..], item.id.as_bytes(), item.host.as_bytes(), &item.json] {
        crc.update(part);
    }
    let mut header = [0; HEADER];
    header[..4].copy_from_slice(&MAGIC);
    header[4..8].copy_from_slice(&payload.to_le_bytes());
    header[8..].copy_from_slice(&crc.finalize().to_le_bytes());
    for part in [&header[..], &fixed[..], item.id.as_bytes(), item.host.as_bytes(), &item.json] {
        out.write_all(part)?;
    }
    Ok(())
}

/// The record at `at`, when one whole and intact starts there.
fn decode(data: &Bytes, at: usize) -> Option<Record> {
    let header = data.get(at..at + HEADER)?;
    if header[..4] != MAGIC {
        return None;
    }
    let payload_len = u32::from_le_bytes(header[4..8].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[8..].try_into().ok()?);
    let payload = data.get(at + HEADER..(at + HEADER).checked_add(payload_len)?)?;
    if payload_len < FIXED || crc32fast::hash(payload) != crc {
        return None;
    }
    let seq = u64::from_le_bytes(payload[..8].try_into().ok()?);
    let id_len = usize::from(u16::from_le_bytes(payload[8..10].try_into().ok()?));
    let host_len = usize::from(u16::from_le_bytes(payload[10..12].try_into().ok()?));
    let json_at = FIXED.checked_add(id_len)?.checked_add(host_len)?;
    if json_at > payload_len {
        return None;
    }
    let id = std::str::from_utf8(&payload[FIXED..FIXED + id_len]).ok()?.to_owned();
    let host = std::str::from_utf8(&payload[FIXED + id_len..json_at]).ok()?.to_owned();
    let start = at + HEADER;
    Some(Record { seq, len: HEADER + payload_len, id, host, json: data.slice(start + json_at..start + payload_len) })
}

/// Where the next intact record starts at or after `from`, if one does.
fn resync(data: &Bytes, from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(found) = data.get(at..)?.windows(MAGIC.len()).position(|window| window == MAGIC) {
        if decode(data, at + found).is_some() {
            return Some(at + found);
        }
        at += found + 1;
    }
    None
}

fn read_ack(file: &fs::File) -> io::Result<u64> {
    let mut record = [0; 16];
    match file.read_exact_at(&mut record, 0) {
        // New: nothing delivered yet.
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof && file.metadata()?.len() == 0 => return Ok(0),
        result => result?,
    }
    let acked = u64::from_le_bytes(record[..8].try_into().expect("8 bytes"));
    let check = u64::from_le_bytes(record[8..].try_into().expect("8 bytes"));
    if check != !acked {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not an ack record"));
    }
    Ok(acked)
}

/// An older credwatch's spooled alert, `<seq>-<severity>.json`.
fn parse_older_name(name: &str) -> Option<(u64, Severity)> {
    let (seq, severity) = name.strip_suffix(".json")?.split_once('-')?;
    let severity = SEVERITIES.into_iter().find(|s| s.as_str() == severity)?;
    Some((seq.parse().ok()?, severity))
}

/// An older credwatch's spooled alert: its id and host from its JSON; else its size, lost.
fn read_older(path: &Path, severity: Severity) -> Result<Outgoing, u64> {
    #[derive(serde::Deserialize)]
    struct Head {
        event: Id,
        host: Host,
    }
    #[derive(serde::Deserialize)]
    struct Id {
        id: String,
    }
    #[derive(serde::Deserialize)]
    struct Host {
        name: String,
    }
    let json = fs::read(path).map_err(|_| 0u64)?;
    let head: Head = serde_json::from_slice(&json).map_err(|_| json.len() as u64)?;
    Ok(Outgoing { id: head.event.id, severity, host: head.host.name, json: Bytes::from(json) })
}

fn parse_name(name: &str) -> Option<Key> {
    let (number, severity) = name.strip_suffix(".seg")?.split_once('-')?;
    let severity = SEVERITIES.into_iter().find(|s| s.as_str() == severity)?;
    Some((severity, number.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;

    /// An alert of the same size whatever its severity, for ids of the same length.
    fn outgoing(id: &str, severity: Severity) -> Outgoing {
        let json = format!(r#"{{"event":{{"id":"{id}"}},"host":{{"name":"box"}}}}"#);
        Outgoing { id: id.into(), severity, host: "box".into(), json: Bytes::from(json) }
    }

    fn size() -> u64 {
        record_size(&outgoing("xx", Severity::Low))
    }

    /// The oldest alerts that load, forgotten as delivered, and the errors of those that do not.
    fn deliver(spool: &mut Spool, max: usize) -> (Vec<Outgoing>, Vec<SpoolError>) {
        let taken = spool.oldest(max);
        let (mut batch, mut errors) = (Vec::new(), Vec::new());
        let mut seqs = Vec::new();
        for (seq, loaded) in load(taken) {
            seqs.push(seq);
            match loaded {
                Ok(item) => batch.push(item),
                Err(error) => errors.push(error),
            }
        }
        spool.forget(seqs);
        for path in spool.take_doomed() {
            fs::remove_file(path).unwrap();
        }
        (batch, errors)
    }

    fn ids(batch: &[Outgoing]) -> Vec<&str> {
        batch.iter().map(|item| item.id.as_str()).collect()
    }

    fn segments(dir: &Path) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|e| e == "seg"))
            .collect();
        found.sort();
        found
    }

    fn open(dir: &Path, max_bytes: u64) -> (Spool, Vec<Recovered>) {
        Spool::open(dir, max_bytes).unwrap()
    }

    #[test]
    fn survives_a_restart_in_order_with_private_files_and_a_torn_last_record_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let (mut spool, recovered) = open(&path, 1 << 20);
        assert!(recovered.is_empty());
        let severities = [Severity::High, Severity::Low, Severity::Critical, Severity::Low];
        for (seq, id) in ["a", "b", "c", "d"].into_iter().enumerate() {
            assert_eq!(spool.put(seq as u64, outgoing(id, severities[seq])), Put::default());
        }
        spool.flush();
        assert_eq!(spool.bytes(), 4 * record_size(&outgoing("a", Severity::Low)));
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o700);
        for file in fs::read_dir(&path).unwrap() {
            assert_eq!(file.unwrap().metadata().unwrap().mode() & 0o777, 0o600);
        }
        // The agent dies in the middle of its next append to the low chain: half a record.
        let mut torn = Vec::new();
        encode(&mut torn, 4, &outgoing("e", Severity::Low)).unwrap();
        let low = path.join(format!("{:020}-low.seg", 1));
        let whole = fs::metadata(&low).unwrap().len();
        fs::OpenOptions::new().append(true).open(&low).unwrap().write_all(&torn[..torn.len() / 2]).unwrap();
        drop(spool);

        let (mut spool, recovered) = open(&path, 1 << 20);
        assert_eq!(recovered, [Recovered::Torn { path: low.clone(), offset: whole, bytes: torn.len() as u64 / 2 }]);
        assert!(recovered[0].to_string().contains(&format!("{}: a torn last record at offset {whole}", low.display())));
        assert_eq!(fs::metadata(&low).unwrap().len(), whole);
        assert_eq!((spool.len(), spool.next_seq()), (4, 4));
        // Read back from the disk, merged across the severities' chains in the order they came.
        let (batch, errors) = deliver(&mut spool, 10);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(ids(&batch), ["a", "b", "c", "d"]);
        assert_eq!(batch[2], outgoing("c", Severity::Critical));
        // Delivered: nothing left on disk but the ack, and nothing sent again after a restart.
        assert_eq!((spool.len(), spool.bytes()), (0, 0));
        assert!(segments(&path).is_empty());
        drop(spool);
        let (mut spool, _) = open(&path, 1 << 20);
        assert_eq!((spool.len(), spool.next_seq()), (0, 4));
        assert!(deliver(&mut spool, 10).0.is_empty());
    }

    #[test]
    fn delivered_segments_are_reclaimed_and_a_restart_resumes_after_the_last_delivered() {
        let dir = tempfile::tempdir().unwrap();
        // Segments of 4 alerts.
        let max = 64 * size();
        let (mut spool, _) = open(dir.path(), max);
        for seq in 0..20 {
            spool.put(seq, outgoing(&format!("{seq:02}"), Severity::Medium));
        }
        spool.flush();
        assert_eq!(segments(dir.path()).len(), 5);
        // 10 delivered: two segments removed, the third half delivered stays.
        let (batch, _) = deliver(&mut spool, 10);
        assert_eq!(batch.len(), 10);
        assert_eq!(segments(dir.path()).len(), 3);
        assert_eq!((spool.len(), spool.bytes()), (10, 12 * size()));
        // Killed here: the next agent starts at the 11th.
        drop(spool);
        let (mut spool, recovered) = open(dir.path(), max);
        assert!(recovered.is_empty(), "{recovered:?}");
        assert_eq!((spool.len(), spool.next_seq()), (10, 20));
        let (batch, _) = deliver(&mut spool, 100);
        assert_eq!(ids(&batch), (10..20).map(|n| format!("{n:02}")).collect::<Vec<_>>());
        // An ack file that is no ack: everything still spooled is sent again, said.
        spool.put(20, outgoing("20", Severity::Medium));
        spool.flush();
        drop(spool);
        fs::write(dir.path().join(ACK), b"garbage, not an ack").unwrap();
        let (mut spool, recovered) = open(dir.path(), max);
        assert_eq!(recovered, [Recovered::Ack { path: dir.path().join(ACK) }]);
        assert_eq!(ids(&deliver(&mut spool, 100).0), ["20"]);
    }

    #[test]
    fn a_full_spool_drops_the_lowest_severity_first() {
        let dir = tempfile::tempdir().unwrap();
        // Room for 4 alerts: a segment each.
        let (mut spool, _) = open(dir.path(), 4 * size());
        for (seq, (id, severity)) in
            [("l1", Severity::Low), ("h1", Severity::High), ("l2", Severity::Low), ("m1", Severity::Medium)]
                .into_iter()
                .enumerate()
        {
            spool.put(seq as u64, outgoing(id, severity));
        }
        let dropped = |low, medium| Put { dropped: [low, medium, 0, 0], ..Put::default() };
        // Full: a critical alert takes the newest low one's place.
        assert_eq!(spool.put(4, outgoing("c1", Severity::Critical)), dropped(1, 0));
        // A low one is the least: it is the one dropped.
        assert_eq!(spool.put(5, outgoing("l3", Severity::Low)), dropped(1, 0));
        // A medium one: the last low one goes.
        assert_eq!(spool.put(6, outgoing("m2", Severity::Medium)), dropped(1, 0));
        // Another medium: equal to the least, so the new one goes.
        assert_eq!(spool.put(7, outgoing("m3", Severity::Medium)), dropped(0, 1));
        assert_eq!(spool.bytes(), 4 * size());
        let (batch, _) = deliver(&mut spool, 10);
        assert_eq!(ids(&batch), ["h1", "m1", "c1", "m2"]);
        for path in spool.take_doomed() {
            fs::remove_file(path).unwrap();
        }
        assert!(segments(dir.path()).is_empty());
    }

    #[test]
    fn a_drop_takes_a_whole_segment_and_counts_each_of_its_alerts() {
        let dir = tempfile::tempdir().unwrap();
        // Room for 64 alerts, in segments of 4.
        let (mut spool, _) = open(dir.path(), 64 * size());
        for seq in 0..40 {
            assert_eq!(spool.put(seq, outgoing("lo", Severity::Low)), Put::default());
        }
        for seq in 40..64 {
            assert_eq!(spool.put(seq, outgoing("hi", Severity::High)), Put::default());
        }
        // Full: the newest segment of low alerts (36..40) goes, 4 alerts counted.
        assert_eq!(spool.put(64, outgoing("cr", Severity::Critical)), Put { dropped: [4, 0, 0, 0], ..Put::default() });
        for seq in 65..68 {
            assert_eq!(spool.put(seq, outgoing("cr", Severity::Critical)), Put::default());
        }
        assert_eq!(spool.put(68, outgoing("cr", Severity::Critical)), Put { dropped: [4, 0, 0, 0], ..Put::default() });
        assert_eq!((spool.len(), spool.bytes()), (61, 61 * size()));
        let doomed = spool.take_doomed();
        assert_eq!(doomed.len(), 2);
        for path in doomed {
            fs::remove_file(path).unwrap();
        }
        // What is left reads back in order, the dropped ones gone.
        let (batch, errors) = deliver(&mut spool, 100);
        assert!(errors.is_empty(), "{errors:?}");
        let kept: Vec<&str> = ids(&batch);
        assert_eq!(kept.len(), 61);
        assert_eq!(kept.iter().filter(|id| **id == "lo").count(), 32);
        assert_eq!(kept[32..56], ["hi"; 24]);
    }

    #[test]
    fn alerts_appended_ahead_of_earlier_ones_leave_in_order_and_drop_whole() {
        // The engine's thread appends alert 1 before the task appends alert 0, queued before it.
        let dir = tempfile::tempdir().unwrap();
        let (mut spool, _) = open(dir.path(), 64 * size());
        for seq in [1, 0, 2] {
            spool.put(seq, outgoing(&format!("l{seq}"), Severity::Low));
        }
        for seq in 3..64 {
            spool.put(seq, outgoing("hi", Severity::High));
        }
        spool.flush();
        drop(spool);
        let (mut spool, _) = open(dir.path(), 64 * size());
        let taken = spool.oldest(3);
        let loaded: Vec<String> = load(taken).into_iter().map(|(_, item)| item.unwrap().id).collect();
        assert_eq!(loaded, ["l0", "l1", "l2"]);
        // Full: the low segment goes whole, each of its alerts counted, none left behind.
        assert_eq!(spool.put(64, outgoing("cr", Severity::Critical)), Put { dropped: [3, 0, 0, 0], ..Put::default() });
        assert_eq!(spool.len(), 62);
        let (batch, errors) = deliver(&mut spool, 100);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(ids(&batch)[..2], ["hi", "hi"]);
        assert_eq!(ids(&batch)[61], "cr");
    }

    #[test]
    fn a_damaged_record_is_named_with_its_offset_and_the_rest_delivered() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spool, _) = open(dir.path(), 1 << 20);
        for seq in 0..10 {
            spool.put(seq, outgoing(&format!("{seq:02}"), Severity::High));
        }
        spool.flush();
        drop(spool);
        // A byte of the 4th alert's JSON flipped on disk.
        let segment = dir.path().join(format!("{:020}-high.seg", 0));
        let mut data = fs::read(&segment).unwrap();
        let offset = 3 * size();
        data[offset as usize + size() as usize - 3] ^= 0x20;
        fs::write(&segment, &data).unwrap();
        let (mut spool, recovered) = open(dir.path(), 1 << 20);
        assert_eq!(recovered, [Recovered::Corrupt { path: segment.clone(), offset, bytes: size() }]);
        assert!(recovered[0].is_loss());
        let said = recovered[0].to_string();
        assert!(
            said.contains(&format!("{}: {} corrupt bytes at offset {offset}", segment.display(), size())),
            "{said}"
        );
        let (batch, errors) = deliver(&mut spool, 100);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(ids(&batch), ["00", "01", "02", "04", "05", "06", "07", "08", "09"]);
        // Damaged while the agent runs: that alert alone is an error naming the file and offset.
        for seq in 10..13 {
            spool.put(seq, outgoing(&format!("{seq:02}"), Severity::High));
        }
        let taken = spool.oldest(MAX_CACHED + 10);
        let taken: Vec<(u64, Spooled)> = taken
            .into_iter()
            .map(|(seq, spooled)| match spooled {
                // Read back from disk, not from the cache.
                Spooled::Memory(_) => {
                    let entry = &spool.entries[&seq];
                    let path = Arc::clone(&spool.segments[&entry.segment.unwrap()].path);
                    (seq, Spooled::Disk { path, offset: entry.offset, len: entry.len, severity: Severity::High })
                }
                disk => (seq, disk),
            })
            .collect();
        let segment = segments(dir.path()).pop().unwrap();
        let mut data = fs::read(&segment).unwrap();
        data[size() as usize + 20] ^= 1;
        fs::write(&segment, &data).unwrap();
        let loaded = load(taken);
        let error = loaded[1].1.as_ref().unwrap_err().to_string();
        assert_eq!(error, format!("spool {}: alert 11 at offset {}", segment.display(), size()));
        assert!(loaded[0].1.is_ok() && loaded[2].1.is_ok());
    }

    #[test]
    fn an_older_spool_of_a_file_per_alert_is_taken_in_order() {
        let dir = tempfile::tempdir().unwrap();
        for (seq, id, severity) in [(7, "b", Severity::Low), (3, "a", Severity::High), (12, "c", Severity::Critical)] {
            let item = outgoing(id, severity);
            fs::write(dir.path().join(format!("{seq:020}-{}.json", severity.as_str())), &item.json).unwrap();
        }
        fs::write(dir.path().join(format!("{:020}-high.json", 9)), b"not json").unwrap();
        fs::write(dir.path().join(format!("{:020}-high.tmp", 13)), b"{").unwrap();
        let (mut spool, recovered) = open(dir.path(), 1 << 20);
        let garbled = dir.path().join(format!("{:020}-high.json", 9));
        assert_eq!(
            recovered,
            [
                Recovered::Corrupt { path: garbled, offset: 0, bytes: 8 },
                Recovered::Older { dir: dir.path().to_owned(), taken: 3, dropped: 0 }
            ]
        );
        let (batch, _) = deliver(&mut spool, 10);
        assert_eq!(
            batch,
            [outgoing("a", Severity::High), outgoing("b", Severity::Low), outgoing("c", Severity::Critical)]
        );
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, [ACK]);
    }

    #[test]
    fn alerts_that_cannot_be_written_are_kept_in_memory_said_once_and_delivered() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spool, _) = open(dir.path(), 64 << 20);
        spool.put(0, outgoing("00", Severity::High));
        spool.flush();
        // The next segment's name is taken (as a full or read-only folder would refuse it).
        std::os::unix::fs::symlink("/dev/full", spool.path((Severity::Low, spool.next_segment))).unwrap();
        for seq in 1..4 {
            assert_eq!(spool.put(seq, outgoing(&format!("{seq:02}"), Severity::Low)), Put::default());
        }
        let changes = spool.take_changes();
        assert!(
            matches!(&changes[..], [Change::Unwritable(error)] if error.to_string().contains("creating a segment")),
            "{changes:?}"
        );
        assert_eq!(spool.unspooled(), 3);
        let (batch, errors) = deliver(&mut spool, 2);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(ids(&batch), ["00", "01"]);

        // Past the memory kept for it, the least severe goes first, the newest of them.
        let big = |id: &str, severity| {
            let mut item = outgoing(id, severity);
            item.json = Bytes::from(vec![b' '; 1 << 20]);
            item
        };
        let mut seq = 4;
        while spool.put(seq, big(&format!("{seq:02}"), Severity::Low)).unwritable == [0; 4] {
            seq += 1;
        }
        // The low alert `seq` was dropped itself; 3, 4.., and the critical one are kept.
        let (last_low, kept) = (seq - 1, 3 + (seq - 4) + 1);
        seq += 1;
        let put = spool.put(seq, big("cr", Severity::Critical));
        assert_eq!(put.unwritable, [1, 0, 0, 0]);
        assert!(!spool.entries.contains_key(&last_low) && spool.entries.contains_key(&seq));
        assert!(spool.take_changes().is_empty(), "said once");

        // Tried again once the wait is over, and said when written.
        spool.trouble.as_mut().unwrap().retry_at = Instant::now();
        seq += 1;
        spool.put(seq, outgoing("ok", Severity::Low));
        spool.flush();
        let changes = spool.take_changes();
        assert!(matches!(changes[..], [Change::Writable { kept: k, dropped: 2 }] if k == kept), "{changes:?}");
        let (batch, errors) = deliver(&mut spool, 100);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(batch.first().map(|item| item.id.as_str()), Some("02"));
        assert_eq!(batch.last().map(|item| item.id.as_str()), Some("ok"));
        assert_eq!(spool.memory_only, 0);
        assert!(spool.is_empty());
    }

    #[test]
    fn a_spool_folder_that_cannot_be_created_is_an_error_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, b"").unwrap();
        let error = Spool::open(&file.join("spool"), 1024).err().unwrap();
        assert!(error.to_string().contains("file/spool: creating the folder"), "{error}");
    }

    #[test]
    fn a_spool_in_use_by_another_agent_is_an_error_at_open_until_it_is_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let (first, _) = Spool::open(dir.path(), 1024).unwrap();
        let error = Spool::open(dir.path(), 1024).err().unwrap();
        assert!(error.to_string().contains("in use by another credwatch process"), "{error}");
        drop(first);
        Spool::open(dir.path(), 1024).unwrap();
    }
}
