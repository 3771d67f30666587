//! One output's spool on disk: every alert the output has not delivered yet, one file each
//! (`<seq>-<severity>.json`, mode 0600, in a 0700 folder), so that an agent stopped or killed
//! leaves them for the next one, which delivers them first and in order.
//!
//! One file per alert rather than a log: dropping the lowest severity first when the spool is
//! full takes alerts from the middle, which a file per alert makes an unlink. A file is written
//! to a temporary name and renamed, so a crash leaves either the whole alert or none of it.
//! There is no fsync: the spool outlives the agent, not a power cut (a sync per alert would cost
//! more than the delivery).

use std::{
    collections::BTreeMap,
    fs,
    io::{self, Write as _},
    os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use bytes::Bytes;
use credwatch_core::alert::Severity;

use crate::transport::Outgoing;

/// Spooled alerts kept in memory too (for the common case: delivered at once), beyond which
/// they are read back from disk when their turn comes.
const MAX_CACHED: usize = 4096;
const SEVERITIES: [Severity; 4] = [Severity::Low, Severity::Medium, Severity::High, Severity::Critical];

#[derive(Debug, thiserror::Error)]
#[error("spool {}: {action}", path.display())]
pub struct SpoolError {
    pub path: PathBuf,
    pub action: &'static str,
    #[source]
    pub source: io::Error,
}

pub struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    entries: BTreeMap<u64, Entry>,
    bytes: u64,
    cached: usize,
    next_seq: u64,
}

struct Entry {
    severity: Severity,
    size: u64,
    item: Option<Outgoing>,
}

/// What [`Spool::put`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Put {
    /// The severities of the alerts dropped to make room (the new one's, when it was the least).
    pub dropped: Vec<Severity>,
}

impl Spool {
    /// Opens (creating it) the spool in `dir`, with what an earlier agent left there.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Spool, SpoolError> {
        let error = |action| move |source| SpoolError { path: dir.to_owned(), action, source };
        fs::create_dir_all(dir).map_err(error("creating the folder"))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(error("making the folder 0700"))?;
        let mut spool =
            Spool { dir: dir.to_owned(), max_bytes, entries: BTreeMap::new(), bytes: 0, cached: 0, next_seq: 0 };
        for entry in fs::read_dir(dir).map_err(error("listing"))? {
            let entry = entry.map_err(error("listing"))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".tmp") {
                // Half-written when an agent died: never delivered, never acknowledged.
                let _ = fs::remove_file(entry.path());
                continue;
            }
            let Some((seq, severity)) = parse_name(&name) else { continue };
            let size = entry.metadata().map_err(error("reading a file's size"))?.len();
            spool.entries.insert(seq, Entry { severity, size, item: None });
            spool.bytes += size;
            spool.next_seq = spool.next_seq.max(seq + 1);
        }
        // Writable now rather than at the first alert: a spool that cannot be written is a
        // start-up error.
        let probe = dir.join(".probe.tmp");
        fs::write(&probe, b"").map_err(error("writing"))?;
        let _ = fs::remove_file(probe);
        Ok(spool)
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

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Stores `item` as alert `seq`. Past the cap, the least severe alerts go first (the newest
    /// of them first, so that the start of a story stays), `item` itself when it is the least.
    pub fn put(&mut self, seq: u64, item: Outgoing) -> Result<Put, SpoolError> {
        let size = item.json.len() as u64;
        let mut put = Put::default();
        while self.bytes + size > self.max_bytes {
            let victim = SEVERITIES
                .iter()
                .filter(|severity| **severity <= item.severity)
                .find_map(|severity| self.entries.iter().rev().find(|(_, e)| e.severity == *severity).map(|(s, _)| *s));
            match victim {
                // Equal severity: the newest goes, and that is the new one.
                Some(victim) if self.entries[&victim].severity < item.severity => {
                    let severity = self.entries[&victim].severity;
                    self.remove(victim);
                    put.dropped.push(severity);
                }
                _ => {
                    put.dropped.push(item.severity);
                    return Ok(put);
                }
            }
        }
        let path = self.path(seq, item.severity);
        let temporary = path.with_extension("tmp");
        let write = || -> io::Result<()> {
            let mut file =
                fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&temporary)?;
            file.write_all(&item.json)?;
            fs::rename(&temporary, &path)
        };
        write().map_err(|source| SpoolError { path: path.clone(), action: "writing an alert", source })?;
        let cache = self.cached < MAX_CACHED;
        self.cached += usize::from(cache);
        self.bytes += size;
        self.next_seq = self.next_seq.max(seq + 1);
        self.entries.insert(seq, Entry { severity: item.severity, size, item: cache.then_some(item) });
        Ok(put)
    }

    /// The oldest `max` alerts, in order, with their sequence numbers: in memory, or where to
    /// [`Spooled::load`] them from (outside the lock the spool is under, so that the engine's
    /// thread never waits for these reads).
    pub fn oldest(&self, max: usize) -> Vec<(u64, Spooled)> {
        let spooled = |(&seq, entry): (&u64, &Entry)| match &entry.item {
            Some(item) => (seq, Spooled::Memory(item.clone())),
            None => (seq, Spooled::Disk(self.path(seq, entry.severity), entry.severity)),
        };
        self.entries.iter().take(max).map(spooled).collect()
    }

    /// Forgets alert `seq` (delivered or refused) and returns its file, for the caller to
    /// remove outside the lock; nothing when it is gone already.
    pub fn forget(&mut self, seq: u64) -> Option<PathBuf> {
        let entry = self.entries.remove(&seq)?;
        self.bytes -= entry.size;
        self.cached -= usize::from(entry.item.is_some());
        Some(self.path(seq, entry.severity))
    }

    /// Forgets alert `seq` and removes its file (dropped); nothing when it is gone already.
    fn remove(&mut self, seq: u64) {
        if let Some(path) = self.forget(seq) {
            let _ = fs::remove_file(path);
        }
    }

    fn path(&self, seq: u64, severity: Severity) -> PathBuf {
        self.dir.join(format!("{seq:020}-{}.json", severity.as_str()))
    }
}

/// A spooled alert, in memory or on disk.
pub enum Spooled {
    Memory(Outgoing),
    Disk(PathBuf, Severity),
}

impl Spooled {
    /// The alert; an error when its file is gone (dropped since, or removed by hand) or is no
    /// alert.
    pub fn load(self) -> Result<Outgoing, SpoolError> {
        match self {
            Spooled::Memory(item) => Ok(item),
            Spooled::Disk(path, severity) => read(&path, severity),
        }
    }
}

fn parse_name(name: &str) -> Option<(u64, Severity)> {
    let (seq, severity) = name.strip_suffix(".json")?.split_once('-')?;
    let severity = SEVERITIES.into_iter().find(|s| s.as_str() == severity)?;
    Some((seq.parse().ok()?, severity))
}

/// An alert back from its file: the id and host from its JSON.
fn read(path: &Path, severity: Severity) -> Result<Outgoing, SpoolError> {
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
    let json = fs::read(path).map_err(|source| SpoolError { path: path.to_owned(), action: "reading", source })?;
    let head: Head = serde_json::from_slice(&json).map_err(|error| SpoolError {
        path: path.to_owned(),
        action: "reading an alert",
        source: io::Error::new(io::ErrorKind::InvalidData, error),
    })?;
    Ok(Outgoing { id: head.event.id, severity, host: head.host.name, json: Bytes::from(json) })
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

    fn ids(batch: &[(u64, Outgoing)]) -> Vec<&str> {
        batch.iter().map(|(_, item)| item.id.as_str()).collect()
    }

    /// The oldest alerts that load, and the errors of those that do not (forgotten).
    fn oldest(spool: &mut Spool, max: usize) -> (Vec<(u64, Outgoing)>, Vec<SpoolError>) {
        let (mut batch, mut errors) = (Vec::new(), Vec::new());
        for (seq, spooled) in spool.oldest(max) {
            match spooled.load() {
                Ok(item) => batch.push((seq, item)),
                Err(error) => {
                    errors.push(error);
                    spool.remove(seq);
                }
            }
        }
        (batch, errors)
    }

    #[test]
    fn survives_a_restart_in_order_with_private_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let mut spool = Spool::open(&path, 1 << 20).unwrap();
        for (seq, id) in ["a", "b", "c"].into_iter().enumerate() {
            assert_eq!(spool.put(seq as u64, outgoing(id, Severity::High)).unwrap(), Put::default());
        }
        spool.remove(1);
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o700);
        for file in fs::read_dir(&path).unwrap() {
            assert_eq!(file.unwrap().metadata().unwrap().mode() & 0o777, 0o600);
        }
        // A half-written alert of an agent that died is not delivered.
        fs::write(path.join("00000000000000000007-high.tmp"), b"{").unwrap();
        drop(spool);
        let mut spool = Spool::open(&path, 1 << 20).unwrap();
        assert_eq!(spool.len(), 2);
        assert_eq!(spool.next_seq(), 3);
        let (batch, errors) = oldest(&mut spool, 10);
        assert!(errors.is_empty());
        assert_eq!(ids(&batch), ["a", "c"]);
        assert_eq!(batch[1].1, outgoing("c", Severity::High));
        assert_eq!(spool.bytes(), 2 * outgoing("a", Severity::High).json.len() as u64);
        assert!(!path.join("00000000000000000007-high.tmp").exists());
    }

    #[test]
    fn a_full_spool_drops_the_lowest_severity_first() {
        let dir = tempfile::tempdir().unwrap();
        let size = outgoing("xx", Severity::Low).json.len() as u64;
        let mut spool = Spool::open(dir.path(), 4 * size).unwrap();
        for (seq, (id, severity)) in
            [("l1", Severity::Low), ("h1", Severity::High), ("l2", Severity::Low), ("m1", Severity::Medium)]
                .into_iter()
                .enumerate()
        {
            spool.put(seq as u64, outgoing(id, severity)).unwrap();
        }
        // Full: a critical alert takes the newest low one's place.
        assert_eq!(spool.put(4, outgoing("c1", Severity::Critical)).unwrap().dropped, [Severity::Low]);
        // A low one is the least: it is the one dropped.
        assert_eq!(spool.put(5, outgoing("l3", Severity::Low)).unwrap().dropped, [Severity::Low]);
        // A medium one: the last low one goes.
        assert_eq!(spool.put(6, outgoing("m2", Severity::Medium)).unwrap().dropped, [Severity::Low]);
        // Another medium: equal to the least, so the new one goes.
        assert_eq!(spool.put(7, outgoing("m3", Severity::Medium)).unwrap().dropped, [Severity::Medium]);
        let (batch, _) = oldest(&mut spool, 10);
        assert_eq!(ids(&batch), ["h1", "m1", "c1", "m2"]);
        assert_eq!(spool.bytes(), 4 * size);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 4);
        // Removed by hand or corrupt: left out, said, forgotten.
        fs::write(dir.path().join(format!("{:020}-medium.json", 3)), b"not json").unwrap();
        let mut spool = Spool::open(dir.path(), 4 * size).unwrap();
        let (batch, errors) = oldest(&mut spool, 10);
        assert_eq!(ids(&batch), ["h1", "c1", "m2"]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(spool.len(), 3);
    }

    #[test]
    fn a_spool_that_cannot_be_written_is_an_error_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, b"").unwrap();
        let error = Spool::open(&file.join("spool"), 1024).err().unwrap();
        assert!(error.to_string().contains("file/spool: creating the folder"), "{error}");
    }
}
