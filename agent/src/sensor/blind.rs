//! The sensor's blind spots: what the kernel lost of each package tree (`LOST_TREES`, read
//! when the `LOST` counters move), and the map sizes settable at load (`--map-size`), which
//! let a test fill a small `MARKS` or ring.
//!
//! - A `LOST_TREES` entry only grows (the kernel cannot tell what the agent read): the sensor
//!   reports what it grew by since the figures it reported last, which a pinned set keeps for
//!   the next agent (`lost_reported`), so a restart reports neither twice nor nothing. An entry
//!   whose root has exited and that has nothing new is deleted, with the sensor's figures.
//! - One `BlindSpot` per tree and cause: `lost` for records the priority ring refused (by
//!   kind), `overflow` for those of the bulk ring, `marks_full` for processes left unmarked. Losses that no entry explains (an entry evicted
//!   from the LRU map, or never made) are one `BlindSpot` with no root, counted as `unknown`.

use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    fmt,
    path::Path,
    str::FromStr,
};

use aya::maps::{HashMap, MapData};
use credwatch_common::{lost_kind, LostTree};
use credwatch_core::{
    event::{BlindCause, BlindSpot, Event, EventData},
    record::Decoder,
};

use super::boot_ns;

/// [`BlindSpot::counts`]' name of each [`lost_kind`].
const KIND_NAMES: [&str; lost_kind::COUNT] =
    ["exec", "fork", "exit", "open", "credential_open", "rename", "syscall", "connect", "dns_query", "mark"];
/// The count of losses no tree entry explains (their kind is unknown too).
const UNKNOWN: &str = "unknown";

/// The agent's view of `LOST_TREES`.
pub(super) struct TreeLosses {
    map: HashMap<MapData, u32, LostTree>,
    /// Per root, the entry as last reported.
    reported: StdHashMap<u32, LostTree>,
    /// With pins: the same, kept in the set for the next agent.
    kept: Option<HashMap<MapData, u32, LostTree>>,
    /// Losses of the priority ring, of the bulk ring and failed marks that tree entries showed
    /// before `LOST` did (a loss counted between the reads of the two), owed to the next moves
    /// of `LOST`.
    ahead: [u64; 3],
    /// `CLOCK_BOOTTIME` of the last look: the start of what no entry explains.
    last_look_ns: u64,
}

impl TreeLosses {
    /// `kept`: the pinned set's figures of the agent before (empty for a new set).
    pub fn new(map: HashMap<MapData, u32, LostTree>, kept: Option<HashMap<MapData, u32, LostTree>>) -> TreeLosses {
        let reported = kept.as_ref().map(|kept| kept.iter().filter_map(Result::ok).collect()).unwrap_or_default();
        TreeLosses { map, reported, kept, ahead: [0; 3], last_look_ns: boot_ns() }
    }

    /// Reports the growth of every tree's entry as `BlindSpot`s, after `LOST` moved by `moved`:
    /// records of the priority ring, records of the bulk ring, failed marks.
    pub fn report(&mut self, moved: [u64; 3], decoder: &Decoder, out: &mut Vec<Event>) {
        let now_ns = boot_ns();
        let entries: Vec<(u32, LostTree)> = self.map.iter().filter_map(Result::ok).collect();
        let mut explained = [0u64; 3];
        for (root, tree) in &entries {
            let before = self.reported.get(root).copied().unwrap_or_default();
            if *tree == before {
                if !Path::new(&format!("/proc/{root}")).exists() {
                    // The tree's root is gone and all of it reported: what its processes lose
                    // from now on starts a new entry, reported from zero.
                    let _ = self.map.remove(root);
                    self.forget(*root);
                }
                continue;
            }
            let grown = |kind: usize| u64::from(tree.counts[kind].wrapping_sub(before.counts[kind]));
            // Grown since the last report: after its last loss then, at the entry's first
            // at most.
            let since_ns = if before.last_boot_ns == 0 { tree.first_boot_ns } else { before.last_boot_ns };
            let (since_ns, until_ns) = window(decoder, since_ns, tree.last_boot_ns);
            let spot = |cause, counts: BTreeMap<String, u64>, credential| Event {
                time_ns: until_ns,
                pid: 0,
                data: EventData::BlindSpot(BlindSpot {
                    cause,
                    root_pid: Some(*root),
                    since_ns,
                    until_ns,
                    counts,
                    credential,
                }),
            };
            let grown_priority = |kind: usize| u64::from(tree.priority[kind].wrapping_sub(before.priority[kind]));
            // The priority ring's losses (records that make alerts) and the bulk ring's
            // overflow are two blind spots: the first is the graver.
            let by_ring = |of_ring: &dyn Fn(usize) -> u64| -> BTreeMap<String, u64> {
                (0..lost_kind::COUNT)
                    .filter(|&kind| kind != lost_kind::MARK && of_ring(kind) > 0)
                    .map(|kind| (KIND_NAMES[kind].to_owned(), of_ring(kind)))
                    .collect()
            };
            for (ring, cause, records) in [
                (0, BlindCause::Lost, by_ring(&grown_priority)),
                (1, BlindCause::Overflow, by_ring(&|kind| grown(kind).saturating_sub(grown_priority(kind)))),
            ] {
                if records.is_empty() {
                    continue;
                }
                explained[ring] += records.values().sum::<u64>();
                let credential = records.contains_key(KIND_NAMES[lost_kind::CREDENTIAL_OPEN]);
                out.push(spot(cause, records, credential));
            }
            let unmarked = grown(lost_kind::MARK);
            if unmarked > 0 {
                explained[2] += unmarked;
                out.push(spot(
                    BlindCause::MarksFull,
                    BTreeMap::from([(KIND_NAMES[lost_kind::MARK].to_owned(), unmarked)]),
                    false,
                ));
            }
            self.reported.insert(*root, *tree);
            if let Some(kept) = &mut self.kept {
                // Best effort: a full map costs the next agent a repeated report of this tree.
                let _ = kept.insert(root, tree, 0);
            }
        }
        // Entries the LRU evicted: their figures are of no use any more.
        let gone: Vec<u32> =
            self.reported.keys().filter(|root| !entries.iter().any(|(r, _)| r == *root)).copied().collect();
        for root in gone {
            self.forget(root);
        }
        let (since_ns, until_ns) = window(decoder, self.last_look_ns, now_ns);
        for (index, (moved, cause)) in
            moved.into_iter().zip([BlindCause::Lost, BlindCause::Overflow, BlindCause::MarksFull]).enumerate()
        {
            let owed = self.ahead[index] + explained[index];
            if moved > owed {
                out.push(Event {
                    time_ns: until_ns,
                    pid: 0,
                    data: EventData::BlindSpot(BlindSpot {
                        cause,
                        root_pid: None,
                        since_ns,
                        until_ns,
                        counts: BTreeMap::from([(UNKNOWN.to_owned(), moved - owed)]),
                        credential: false,
                    }),
                });
            }
            self.ahead[index] = owed.saturating_sub(moved);
        }
        self.last_look_ns = now_ns;
    }

    fn forget(&mut self, root: u32) {
        self.reported.remove(&root);
        if let Some(kept) = &mut self.kept {
            let _ = kept.remove(&root);
        }
    }
}

/// The wall-clock window of two `CLOCK_BOOTTIME` readings, converted with one offset (its length
/// is theirs), never ending before it starts: two CPUs counting a tree's losses at once may
/// store their times out of order.
pub(super) fn window(decoder: &Decoder, since_boot_ns: u64, until_boot_ns: u64) -> (u64, u64) {
    let until_ns = decoder.wall_ns(until_boot_ns);
    (until_ns.saturating_sub(until_boot_ns.saturating_sub(since_boot_ns)), until_ns)
}

/// The maps whose size `--map-size NAME=ENTRIES` (and the config's `map_sizes`) sets at load:
/// entries, or bytes for the two rings.
pub const SIZABLE_MAPS: [&str; 7] = ["MARKS", "LOST_TREES", "TAINTED", "CRED_INODES", "REPEATS", "EVENTS", "PRIORITY"];
/// The ring buffers, sized in bytes: a power of two and a multiple of the page size.
const RINGS: [&str; 2] = ["EVENTS", "PRIORITY"];

/// Map sizes asked for, by [`SIZABLE_MAPS`] index (none: the object's own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapSizes([Option<u32>; SIZABLE_MAPS.len()]);

/// A bad map size: which, and why.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("map size `{given}`: {why}")]
pub struct MapSizeError {
    given: String,
    why: String,
}

impl MapSizes {
    /// Sets `name` to `value` (checked as [`FromStr`] does).
    pub fn set(&mut self, name: &str, value: u64) -> Result<(), MapSizeError> {
        let err = |why: String| MapSizeError { given: format!("{name}={value}"), why };
        let Some(index) = SIZABLE_MAPS.iter().position(|map| *map == name) else {
            return Err(err(format!("no map of that name can be sized; these can: {}", SIZABLE_MAPS.join(", "))));
        };
        let value = u32::try_from(value)
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| err("not between 1 and 4294967295".to_owned()))?;
        if RINGS.contains(&name) {
            let page = page_size();
            if !value.is_power_of_two() || value % page != 0 {
                return Err(err(format!(
                    "a ring buffer's size is bytes: a power of two and a multiple of the page size ({page})"
                )));
            }
        }
        self.0[index] = Some(value);
        Ok(())
    }

    /// The sizes asked for, by map name.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u32)> + '_ {
        SIZABLE_MAPS.iter().zip(self.0).filter_map(|(name, size)| size.map(|size| (*name, size)))
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }
}

impl FromStr for MapSizes {
    type Err = MapSizeError;

    /// One `NAME=ENTRIES` (a `--map-size` argument).
    fn from_str(text: &str) -> Result<MapSizes, MapSizeError> {
        let mut sizes = MapSizes::default();
        let err = |why: &str| MapSizeError { given: text.to_owned(), why: why.to_owned() };
        let (name, value) = text.split_once('=').ok_or_else(|| err("not NAME=ENTRIES"))?;
        let value = value.trim().parse::<u64>().map_err(|_| err("the size is not a whole number"))?;
        sizes.set(name.trim(), value)?;
        Ok(sizes)
    }
}

impl MapSizes {
    /// Adds what `other` sets (a later `--map-size` wins).
    pub fn merge(&mut self, other: MapSizes) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            if theirs.is_some() {
                *mine = theirs;
            }
        }
    }
}

impl fmt::Display for MapSizes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sizes: Vec<String> = self.iter().map(|(name, size)| format!("{name}={size}")).collect();
        f.write_str(&sizes.join(" "))
    }
}

fn page_size() -> u32 {
    // SAFETY: sysconf has no preconditions.
    u32::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_never_ends_before_it_starts_and_keeps_its_length() {
        let decoder = Decoder::new();
        let (since, until) = window(&decoder, 2_000, 1_000);
        assert_eq!(since, until);
        let (since, until) = window(&decoder, 1_000, 5_000_001_000);
        assert_eq!(until - since, 5_000_000_000);
    }

    #[test]
    fn map_sizes_name_the_bad_key() {
        let sizes: MapSizes = "MARKS=64".parse().unwrap();
        assert_eq!(sizes.to_string(), "MARKS=64");
        let error = "MARK=64".parse::<MapSizes>().unwrap_err().to_string();
        assert!(error.contains("`MARK=64`") && error.contains("MARKS"), "{error}");
        let error = "MARKS=0".parse::<MapSizes>().unwrap_err().to_string();
        assert!(error.contains("`MARKS=0`"), "{error}");
        let error = "MARKS".parse::<MapSizes>().unwrap_err().to_string();
        assert!(error.contains("NAME=ENTRIES"), "{error}");
        let error = "PRIORITY=5000".parse::<MapSizes>().unwrap_err().to_string();
        assert!(error.contains("power of two"), "{error}");
        assert!("PRIORITY=65536".parse::<MapSizes>().is_ok());
    }
}
