//! The credential inode table: the (device, inode) of every existing file that a rule targets,
//! under every home the agent knows of, for the kernel's `CRED_INODES` map. An open of one of
//! these inodes is reported by the kernel whatever name it was opened by (hardlink, renamed
//! copy, bind mount), goes to the priority ring buffer, and is killed under `--enforce` when a
//! `kill` rule targets the file.
//!
//! Kept current by rescans, bounded by [`MAX_WALK_ENTRIES`]: a rescan walks only the few
//! directories that hold targets, and catches a file created, removed or replaced by a new inode
//! whatever the name. What starts one is inotify on those very directories ([`DirWatch`]: the
//! directory a target is in, or its nearest existing ancestor while it does not exist, and the
//! directories a recursive target walks), [`RESCAN_AFTER_CHANGE`] after a change; a full rescan
//! every [`FULL_RESCAN_INTERVAL`] is kept as a safety net for what inotify does not see (a
//! queue overflow, watches past [`MAX_WATCHED_DIRS`], a mount over a watched directory). inotify
//! alone would not do: targets under directories that do not exist yet, and recursive ones,
//! need the walk to know what to watch. An idle agent thus wakes for the table once a minute
//! rather than every few seconds.
//!
//! The table matches only the file it was made for. A file system that reuses inode numbers
//! (ext4, xfs, btrfs) gives a file made after a credential file's deletion its number; what
//! tells them apart is the inode's generation, which the agent reads (`FS_IOC_GETVERSION`) and
//! the kernel compares on a hit. Where no generation can be read, tmpfs reuses no numbers; on
//! the rest (overlayfs, FUSE, ...) a hit is confirmed in userspace by the credential's path
//! still naming that inode ([`CredentialTable::confirms`]). A file replaced by a rename over it
//! (an atomic rewrite) is a new inode: inotify sees the rename and the next scan follows it.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    fs, io,
    os::{
        fd::{AsFd, AsRawFd as _, BorrowedFd},
        unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    },
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

use credwatch_common::{cred_flag, spare_flag, CredInode, InodeKey, SparedExe};

use credwatch_core::{
    event::Open,
    rules::{
        schema::{Action, Who},
        RuleSet,
    },
};

/// How often the table is rebuilt from the file system whatever inotify says.
pub const FULL_RESCAN_INTERVAL: Duration = Duration::from_secs(60);
/// How long after a change in a watched directory the table is rebuilt: a few changes made
/// together (a directory then its files) cost one rescan.
pub const RESCAN_AFTER_CHANGE: Duration = Duration::from_millis(100);
/// Least time between two rescans started by changes: a directory that changes all the time
/// (a browser's profile under a recursive target) costs at most one rescan per this.
pub const MIN_RESCAN_GAP: Duration = Duration::from_secs(2);
/// Directories watched with inotify, over all homes (each watch costs the kernel ~1 KiB).
pub const MAX_WATCHED_DIRS: usize = 2048;
/// Directory levels walked below a target's literal prefix (`~/.ssh/**` -> `~/.ssh`).
pub const MAX_WALK_DEPTH: usize = 6;
/// Directory entries examined per scan, over all targets and homes.
pub const MAX_WALK_ENTRIES: usize = 50_000;
/// Credential files in the table (the kernel map's size).
pub const MAX_CRED_FILES: usize = 16384;
/// Homes scanned (`/root`, `/home/*`, the agent's `$HOME`, `HOME`s of watched processes).
pub const MAX_HOMES: usize = 256;

/// Where an actor's executable is looked for besides `$PATH` (git's helpers live in its
/// exec path).
const EXEC_DIRS: &[&str] =
    &["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/lib/git-core", "/usr/libexec/git-core"];

/// Characters that make a path component a glob.
const GLOB_CHARS: &[char] = &['*', '?', '[', '{'];
/// Pseudo file systems: their targets (`/proc/*/environ`) are matched by name only.
const NAME_ONLY_ROOTS: &[&str] = &["/proc/", "/sys/", "/dev/"];

/// The rules, the homes, and the paths the kernel's indexes refer to.
#[derive(Debug)]
pub struct CredentialTable {
    /// Shared with the engine and the sensor: one copy of the rules.
    rules: Arc<RuleSet>,
    homes: BTreeSet<PathBuf>,
    /// Index -> path. Append-only, so that a record in flight still names the right file after
    /// a rescan.
    paths: Vec<String>,
    indexes: HashMap<String, u32>,
    /// What tells each file of the last scan from one that reuses its inode number.
    identities: HashMap<InodeKey, Known>,
    /// The files of the scan before that left the map and whose hits the kernel checked: a
    /// record made before a rescan may be read after it.
    exact_before: HashSet<InodeKey>,
}

/// What tells a credential file from another that gets its inode number once it is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Identity {
    /// The inode's generation: the kernel compares it on a hit.
    Generation(u32),
    /// tmpfs: inode numbers come from a per-mount counter and are not reused.
    NumbersNotReused,
    /// Nothing: a hit is confirmed by the path still naming the inode.
    PathOnly,
}

/// A file's [`Identity`] and its change time when it was read: the next scan reads it again
/// only for a file changed since (a file that reuses an inode number is made later), so that
/// an idle table does not open every credential file every minute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Known {
    ctime: (i64, i64),
    identity: Identity,
}

/// What one scan found: the kernel map's new content, whether a limit cut it short, and the
/// directories whose changes can change it.
#[derive(Debug, Default)]
pub struct Scan {
    pub inodes: HashMap<InodeKey, CredInode>,
    pub truncated: bool,
    pub dirs: BTreeSet<PathBuf>,
    /// What tells the files of `inodes` from others (see [`CredentialTable::confirms`]).
    identities: HashMap<InodeKey, Known>,
}

/// The kernel's `dev_t` encoding (major << 20 | minor) of a userspace `st_dev`.
pub fn kernel_dev(dev: u64) -> u64 {
    (u64::from(libc::major(dev)) << 20) | u64::from(libc::minor(dev))
}

/// `/root`, every directory in `/home`, and `$HOME`.
pub fn system_homes() -> Vec<PathBuf> {
    let mut homes = vec![PathBuf::from("/root")];
    if let Ok(entries) = fs::read_dir("/home") {
        homes.extend(entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_dir()));
    }
    if let Some(home) = std::env::var_os("HOME") {
        homes.push(PathBuf::from(home));
    }
    homes
}

impl CredentialTable {
    pub fn new(rules: Arc<RuleSet>, homes: impl IntoIterator<Item = PathBuf>) -> CredentialTable {
        let mut table = CredentialTable {
            rules,
            homes: BTreeSet::new(),
            paths: Vec::new(),
            indexes: HashMap::new(),
            identities: HashMap::new(),
            exact_before: HashSet::new(),
        };
        for home in homes {
            table.add_home(&home);
        }
        table
    }

    /// Adds a home (an absolute directory); true when it is new.
    pub fn add_home(&mut self, home: &Path) -> bool {
        if !home.is_absolute() || self.homes.len() >= MAX_HOMES || self.homes.contains(home) {
            return false;
        }
        self.homes.insert(home.to_path_buf())
    }

    /// The credential path of a kernel index.
    pub fn path(&self, index: u32) -> Option<&str> {
        self.paths.get(index as usize).map(String::as_str)
    }

    /// Every path, by index.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.paths.iter().map(String::as_str)
    }

    /// Takes the paths (by index) of the table of the agent before, whose indexes are still in
    /// the kernel's map and in records not yet read. Only on a table that has none yet.
    pub fn restore(&mut self, paths: Vec<String>) {
        if !self.paths.is_empty() {
            return;
        }
        self.indexes = paths.iter().enumerate().map(|(index, path)| (path.clone(), index as u32)).collect();
        self.paths = paths;
    }

    /// Whether a hit of the kernel's map that named the credential file `path`, for an opened
    /// file of `dev` (userspace `st_dev`) and `ino`, is that file. Where the kernel could not
    /// compare a generation (and the file system may reuse numbers), `path` must still name
    /// the inode (one `stat`): not for a number reused, or a file replaced since the last scan.
    pub fn confirms(&self, path: &str, dev: u64, ino: u64) -> bool {
        let key = InodeKey { dev: kernel_dev(dev), ino };
        self.identities.get(&key).is_some_and(|known| known.identity != Identity::PathOnly)
            || self.exact_before.contains(&key)
            || fs::metadata(path).is_ok_and(|meta| meta.dev() == dev && meta.ino() == ino)
    }

    /// Drops the `same_file_as` of `open` unless the table [`confirms`](Self::confirms) it;
    /// false when it did.
    pub fn confirm(&self, open: &mut Open) -> bool {
        let confirmed = open.same_file_as.as_deref().is_none_or(|cred| self.confirms(cred, open.dev, open.ino));
        if !confirmed {
            open.same_file_as = None;
        }
        confirmed
    }

    /// Finds every existing file that a rule targets.
    pub fn scan(&mut self) -> Scan {
        let mut scan = Scan::default();
        let mut budget = MAX_WALK_ENTRIES;
        let homes: Vec<Option<PathBuf>> =
            if self.homes.is_empty() { vec![None] } else { self.homes.iter().cloned().map(Some).collect() };
        // A handle of its own, so that the walks below can update the table.
        let rules = Arc::clone(&self.rules);
        for (rule_index, rule) in rules.rules().iter().enumerate() {
            for target in &rule.targets {
                let starts: Vec<(PathBuf, Option<PathBuf>)> = if let Some(rest) = target.strip_prefix("~/") {
                    homes.iter().flatten().map(|home| (home.join(rest), Some(home.clone()))).collect()
                } else if target.starts_with('/') && !NAME_ONLY_ROOTS.iter().any(|root| target.starts_with(root)) {
                    vec![(PathBuf::from(target), None)]
                } else {
                    // `**/.env` and the like: name-only, matched in userspace.
                    Vec::new()
                };
                for (pattern, home) in starts {
                    self.walk_target(rule_index, &pattern, home.as_deref(), &mut budget, &mut scan);
                }
            }
        }
        let before = std::mem::replace(&mut self.identities, std::mem::take(&mut scan.identities));
        self.exact_before = before
            .into_iter()
            .filter(|(key, known)| known.identity != Identity::PathOnly && !scan.inodes.contains_key(key))
            .map(|(key, _)| key)
            .collect();
        scan
    }

    /// Walks the literal prefix directory of `pattern` and keeps what the rule confirms.
    fn walk_target(&mut self, rule: usize, pattern: &Path, home: Option<&Path>, budget: &mut usize, scan: &mut Scan) {
        let mut prefix = PathBuf::new();
        let mut globbed = false;
        for component in pattern.components() {
            if component.as_os_str().to_string_lossy().contains(GLOB_CHARS) {
                globbed = true;
                break;
            }
            prefix.push(component);
        }
        // A file appears, goes or is replaced in its directory; one that does not exist yet
        // appears with the first of its directories that does not.
        let watched = if globbed { prefix.as_path() } else { prefix.parent().unwrap_or(&prefix) };
        if let Some(existing) = watched.ancestors().find(|dir| dir.is_dir()) {
            scan.dirs.insert(existing.to_path_buf());
        }
        if !globbed {
            self.consider(rule, &prefix, home, scan);
            return;
        }
        let mut stack = vec![(prefix, 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            let Ok(entries) = fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                if *budget == 0 {
                    scan.truncated = true;
                    return;
                }
                *budget -= 1;
                let path = entry.path();
                // Symlinked directories are not followed (loops, and the walk must stay
                // inside the prefix); a symlinked file counts as the file it points to.
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                if is_dir && depth + 1 < MAX_WALK_DEPTH {
                    scan.dirs.insert(path.clone());
                    stack.push((path.clone(), depth + 1));
                }
                self.consider(rule, &path, home, scan);
            }
        }
    }

    /// Adds `path` when it exists and the rule matches it.
    fn consider(&mut self, rule: usize, path: &Path, home: Option<&Path>, scan: &mut Scan) {
        let Some(text) = path.to_str() else { return };
        let home_text = home.and_then(Path::to_str);
        if !self.rules.rules()[rule].matches_path(text, home_text) {
            return;
        }
        let Some((key, known)) = identify(path, &self.identities) else { return };
        let kill = if self.rules.rules()[rule].action == Action::Kill { cred_flag::KILL } else { 0 };
        if let Some(existing) = scan.inodes.get_mut(&key) {
            existing.flags |= kill;
            return;
        }
        let (flags, generation) = match known.identity {
            Identity::Generation(generation) => (kill | cred_flag::GENERATION, generation),
            Identity::NumbersNotReused | Identity::PathOnly => (kill, 0),
        };
        if scan.inodes.len() >= MAX_CRED_FILES {
            scan.truncated = true;
            return;
        }
        let Some(index) = self.index_of(text) else {
            scan.truncated = true;
            return;
        };
        scan.inodes.insert(key, CredInode { index, flags, generation });
        scan.identities.insert(key, known);
    }

    fn index_of(&mut self, path: &str) -> Option<u32> {
        if let Some(&index) = self.indexes.get(path) {
            return Some(index);
        }
        // Paths are never reused for another index; past the limit, new files go unregistered.
        if self.paths.len() >= 4 * MAX_CRED_FILES {
            return None;
        }
        let index = self.paths.len() as u32;
        self.paths.push(path.to_owned());
        self.indexes.insert(path.to_owned(), index);
        Some(index)
    }
}

/// The kernel's key of the file at `path` (following symlinks) and what tells it from a file
/// that reuses its number: as `known` says for a file unchanged since, else read from the
/// opened file, so that the generation is that of the inode keyed. Only regular files and
/// directories are opened (a device's open can do things), without blocking (a FIFO) and
/// without reading.
fn identify(path: &Path, known: &HashMap<InodeKey, Known>) -> Option<(InodeKey, Known)> {
    let seen = |meta: &fs::Metadata| {
        (InodeKey { dev: kernel_dev(meta.dev()), ino: meta.ino() }, (meta.ctime(), meta.ctime_nsec()))
    };
    let meta = fs::metadata(path).ok()?;
    let (key, ctime) = seen(&meta);
    if let Some(same) = known.get(&key).filter(|known| known.ctime == ctime) {
        return Some((key, *same));
    }
    let path_only = Some((key, Known { ctime, identity: Identity::PathOnly }));
    if !meta.is_file() && !meta.is_dir() {
        return path_only;
    }
    let opened = fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path);
    let Some((file, meta)) = opened.ok().and_then(|file| file.metadata().ok().map(|meta| (file, meta))) else {
        return path_only;
    };
    let (key, ctime) = seen(&meta);
    // The kernel writes an int (ext4, xfs, btrfs, f2fs); room for the long the request names.
    let mut generation: [libc::c_int; 2] = [0; 2];
    // SAFETY: `file` is open for the call, and the buffer outlives it and holds what it writes.
    let identity = if unsafe { libc::ioctl(file.as_raw_fd(), libc::FS_IOC_GETVERSION, generation.as_mut_ptr()) } == 0 {
        Identity::Generation(generation[0] as u32)
    } else {
        // SAFETY: all-zero is a valid statfs, filled by the call on the open `file`.
        let mut stats: libc::statfs = unsafe { std::mem::zeroed() };
        let tmpfs = unsafe { libc::fstatfs(file.as_raw_fd(), &mut stats) } == 0 && stats.f_type == libc::TMPFS_MAGIC;
        if tmpfs {
            Identity::NumbersNotReused
        } else {
            Identity::PathOnly
        }
    };
    Some((key, Known { ctime, identity }))
}

/// inotify on the directories of the last [`Scan`]: says when the table may have changed.
pub struct DirWatch {
    inotify: Inotify,
    watched: HashMap<PathBuf, WatchDescriptor>,
}

impl DirWatch {
    pub fn new() -> io::Result<DirWatch> {
        Ok(DirWatch { inotify: Inotify::init()?, watched: HashMap::new() })
    }

    /// Watches `dirs` (the first [`MAX_WATCHED_DIRS`]) and no other; true when one was not
    /// watched before, so that what changed in it between the scan and its watch went unseen.
    pub fn update(&mut self, dirs: &BTreeSet<PathBuf>) -> bool {
        // Entries made, removed or moved: a file's content does not change its inode.
        let mask = WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::MOVED_FROM
            | WatchMask::MOVED_TO
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF
            | WatchMask::ONLYDIR;
        let mut watched = HashMap::with_capacity(dirs.len().min(MAX_WATCHED_DIRS));
        let mut added = false;
        for dir in dirs.iter().take(MAX_WATCHED_DIRS) {
            // Added again each time: a directory removed and made again is another inode.
            let Ok(wd) = self.inotify.watches().add(dir, mask) else { continue };
            added |= self.watched.remove(dir).as_ref() != Some(&wd);
            watched.insert(dir.clone(), wd);
        }
        for (_, wd) in self.watched.drain() {
            // Gone already (its directory removed) is fine.
            let _ = self.inotify.watches().remove(wd);
        }
        self.watched = watched;
        added
    }

    /// Reads what inotify reported; true when anything changed (or its queue overflowed).
    pub fn changed(&mut self) -> bool {
        let mut buffer = [0u8; 4096];
        let mut changed = false;
        while let Ok(mut events) = self.inotify.read_events(&mut buffer) {
            // IGNORED follows a watch's removal (ours, or its directory's): no entry changed.
            changed |= events.any(|event| !event.mask.contains(EventMask::IGNORED));
        }
        changed
    }
}

impl AsFd for DirWatch {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inotify.as_fd()
    }
}

/// What `--enforce` spares, from the actors of the `kill` rules: the executables they name
/// (found in `$PATH` and [`EXEC_DIRS`]), and the managers whose root process they name (the
/// `Config::spare_root_managers` mask). The kernel checks executables and the chain from the
/// manager only; other actor conditions are left to userspace, so the kernel may spare an
/// actor that userspace still alerts on, never the reverse. The shells agents run their tools
/// through are there too ([`spare_flag::TOOL_SHELL`]), under the agents' roots only.
pub fn spared(rules: &RuleSet) -> (HashMap<InodeKey, SparedExe>, u32) {
    let manager_mask = |names: &[String]| -> u32 {
        if names.is_empty() {
            return u32::MAX;
        }
        rules
            .managers()
            .iter()
            .enumerate()
            .filter(|(index, manager)| *index < 32 && names.contains(&manager.name))
            .fold(0, |mask, (index, _)| mask | 1 << index)
    };
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    dirs.extend(EXEC_DIRS.iter().map(PathBuf::from));
    let mut exes: HashMap<InodeKey, SparedExe> = HashMap::new();
    let mut spare = |exec: &str, flags: u32, managers: u32| {
        for meta in dirs.iter().filter_map(|dir| fs::metadata(dir.join(exec)).ok()).filter(|m| m.is_file()) {
            let key = InodeKey { dev: kernel_dev(meta.dev()), ino: meta.ino() };
            let spared = exes.entry(key).or_insert(SparedExe { flags: 0, managers: 0 });
            spared.flags |= flags;
            // A shell that is an actor too is spared under both masks: more, never less.
            spared.managers |= managers;
        }
    };
    let mut root_managers = 0;
    for actor in rules.rules().iter().filter(|rule| rule.action == Action::Kill).flat_map(|rule| &rule.actors) {
        let managers = manager_mask(&actor.managers);
        match &actor.who {
            Who::Manager { .. } => root_managers |= managers,
            // Refused on kill rules when the rules load: only the engine can judge them.
            Who::Loader { .. } | Who::Under { .. } => {}
            Who::Execs { execs, via_manager, .. } => {
                let flags = if *via_manager { spare_flag::VIA_MANAGER } else { spare_flag::ANYWHERE };
                for exec in execs {
                    spare(exec, flags, managers);
                }
            }
        }
    }
    for shell in rules.agent_tool_shells() {
        spare(shell, spare_flag::TOOL_SHELL, agent_roots(rules));
    }
    (exes, root_managers)
}

/// The agents' bits in the kernel's root table, the `Config::agent_roots` mask: the agents
/// come after the managers there ([`RuleSet::kernel_roots`]).
pub fn agent_roots(rules: &RuleSet) -> u32 {
    let managers = rules.managers().len();
    (managers..managers + rules.agent_roots().len())
        .filter(|index| *index < 32)
        .fold(0, |mask, index| mask | 1 << index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use credwatch_core::rules::RuleSet;

    fn rules(yaml: &str) -> Arc<RuleSet> {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("test.yaml"), yaml).unwrap();
        Arc::new(RuleSet::load_dir(dir.path()).unwrap())
    }

    const RULES: &str = r#"schema: 1
rules:
  - id: keys
    name: keys
    description: keys
    category: ssh
    severity: critical
    action: kill
    targets: ["~/.ssh/**", "**/.env"]
    samples:
      positive:
        - exec: {pid: 100, args: [npm, install], cwd: /home/alice/app}
        - open: {pid: 100, path: /home/alice/.ssh/id_rsa}
      negative:
        - exec: {pid: 100, args: [npm, install], cwd: /home/alice/app}
        - open: {pid: 100, path: /home/alice/app/x}
  - id: npmrc
    name: npmrc
    description: npmrc
    category: registry
    severity: high
    targets: ["~/.npmrc"]
    samples:
      positive:
        - exec: {pid: 100, args: [npm, install], cwd: /home/alice/app}
        - open: {pid: 100, path: /home/alice/.npmrc}
      negative:
        - exec: {pid: 100, args: [npm, install], cwd: /home/alice/app}
        - open: {pid: 100, path: /home/alice/app/x}
"#;

    #[test]
    fn finds_targets_under_each_home_with_kill_flags() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("alice");
        fs::create_dir_all(home.join(".ssh/deep")).unwrap();
        fs::write(home.join(".ssh/id_rsa"), "k").unwrap();
        fs::write(home.join(".ssh/deep/other"), "k").unwrap();
        fs::write(home.join(".npmrc"), "t").unwrap();
        fs::write(home.join(".env"), "name-only").unwrap();
        fs::write(home.join("unrelated"), "x").unwrap();
        let mut table = CredentialTable::new(rules(RULES), [home.clone()]);
        let scan = table.scan();
        assert!(!scan.truncated);
        let found: HashMap<String, u32> =
            scan.inodes.values().map(|cred| (table.path(cred.index).unwrap().to_owned(), cred.flags)).collect();
        let path = |rel: &str| home.join(rel).to_str().unwrap().to_owned();
        let mut names: Vec<&String> = found.keys().collect();
        names.sort();
        assert_eq!(names, [&path(".npmrc"), &path(".ssh/deep"), &path(".ssh/deep/other"), &path(".ssh/id_rsa")]);
        assert_eq!(found[&path(".ssh/id_rsa")] & cred_flag::KILL, cred_flag::KILL);
        assert_eq!(found[&path(".npmrc")] & cred_flag::KILL, 0);
        let meta = fs::metadata(home.join(".ssh/id_rsa")).unwrap();
        let key = InodeKey { dev: kernel_dev(meta.dev()), ino: meta.ino() };
        assert_eq!(table.path(scan.inodes[&key].index), Some(path(".ssh/id_rsa").as_str()));
    }

    #[test]
    fn a_scan_names_the_directories_whose_changes_change_it_and_inotify_reports_them() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("alice");
        fs::create_dir_all(home.join(".ssh/deep")).unwrap();
        let mut table = CredentialTable::new(rules(RULES), [home.clone()]);
        let scan = table.scan();
        // `~/.ssh/**` walks .ssh and what is below; `~/.npmrc` is in the home itself.
        assert!(scan.dirs.contains(&home.join(".ssh")) && scan.dirs.contains(&home.join(".ssh/deep")));
        assert!(scan.dirs.contains(&home));

        // A target whose directory does not exist yet: its nearest existing ancestor.
        fs::remove_dir_all(home.join(".ssh")).unwrap();
        let scan = table.scan();
        assert!(scan.dirs.contains(&home) && !scan.dirs.iter().any(|d| d.starts_with(home.join(".ssh"))));

        let mut watch = DirWatch::new().unwrap();
        assert!(watch.update(&scan.dirs), "new watches");
        assert!(!watch.update(&scan.dirs), "the same ones");
        assert!(!watch.changed(), "nothing yet");
        fs::write(home.join("unrelated-content"), "x").unwrap();
        assert!(watch.changed(), "an entry made in a watched directory");
        fs::write(home.join("unrelated-content"), "changed in place").unwrap();
        assert!(!watch.changed(), "a file's content is no entry change");
        fs::create_dir(home.join(".ssh")).unwrap();
        assert!(watch.changed());
        // Watches removed (their directories gone from the scan) report nothing.
        assert!(!watch.update(&BTreeSet::new()));
        assert!(!watch.changed());
    }

    #[test]
    fn a_restored_table_keeps_the_indexes_of_the_agent_before() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().to_path_buf();
        fs::write(home.join(".npmrc"), "t").unwrap();
        let npmrc = home.join(".npmrc").to_string_lossy().into_owned();
        let before = vec!["/gone/.ssh/id_rsa".to_owned(), npmrc.clone()];
        let mut table = CredentialTable::new(rules(RULES), [home.clone()]);
        table.restore(before.clone());
        let scan = table.scan();
        assert_eq!(scan.inodes.values().map(|cred| cred.index).collect::<Vec<_>>(), [1]);
        assert_eq!(table.path(0), Some("/gone/.ssh/id_rsa"));
        assert_eq!(table.paths().collect::<Vec<_>>(), [before[0].as_str(), npmrc.as_str()]);
        // Only a table with no index yet takes them.
        table.restore(vec!["/other".to_owned()]);
        assert_eq!(table.path(0), Some("/gone/.ssh/id_rsa"));
    }

    #[test]
    fn indexes_stay_stable_across_rescans_and_homes_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().to_path_buf();
        fs::write(home.join(".npmrc"), "t").unwrap();
        let mut table = CredentialTable::new(rules(RULES), [home.clone()]);
        let first = table.scan();
        fs::remove_file(home.join(".npmrc")).unwrap();
        assert!(table.scan().inodes.is_empty(), "a deleted file leaves the table");
        fs::write(home.join(".npmrc"), "t2").unwrap();
        let again = table.scan();
        let index = |scan: &Scan| scan.inodes.values().next().unwrap().index;
        assert_eq!(index(&first), index(&again));
        assert!(!table.add_home(&home), "known");
        assert!(!table.add_home(Path::new("relative")), "not absolute");
    }

    /// A hit is that file when the kernel compared its generation (or numbers are not reused),
    /// else when its path still names the inode; an inode replaced by a rename over its path
    /// stays that file for records made before the scan that dropped it, not after the next.
    #[test]
    fn a_hit_is_confirmed_by_the_generation_or_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().to_path_buf();
        let npmrc = home.join(".npmrc");
        fs::write(&npmrc, "t").unwrap();
        let unrelated = home.join("unrelated");
        fs::write(&unrelated, "x").unwrap();
        let id = |path: &Path| {
            let meta = fs::metadata(path).unwrap();
            (meta.dev(), meta.ino())
        };
        let mut table = CredentialTable::new(rules(RULES), [home.clone()]);
        let scan = table.scan();
        let cred = scan.inodes.values().next().copied().unwrap();
        // The file system of the temp dir: ext4 gives a generation, tmpfs none but reuses no
        // numbers; either way the kernel's match needs no path check.
        let (generation, tmpfs) = match identify(&npmrc, &HashMap::new()).unwrap().1.identity {
            Identity::Generation(generation) => (generation, false),
            Identity::NumbersNotReused => (0, true),
            Identity::PathOnly => panic!("the temp dir's file system is neither ext4-like nor tmpfs"),
        };
        assert_eq!((cred.flags & cred_flag::GENERATION != 0, cred.generation), (!tmpfs, generation));
        let text = npmrc.to_str().unwrap();
        let (dev, ino) = id(&npmrc);
        assert!(table.confirms(text, dev, ino));
        // Not in the table, and not what the path names: a number reused on a file system
        // without generations.
        let (other_dev, other_ino) = id(&unrelated);
        assert!(!table.confirms(text, other_dev, other_ino));

        // An atomic rewrite: the old inode lives on under another name.
        fs::hard_link(&npmrc, home.join("old")).unwrap();
        fs::write(home.join(".npmrc.tmp"), "t2").unwrap();
        fs::rename(home.join(".npmrc.tmp"), &npmrc).unwrap();
        let (new_dev, new_ino) = id(&npmrc);
        assert_ne!(new_ino, ino);
        assert!(table.confirms(text, dev, ino), "the kernel's entry is still the old inode's");
        let scan = table.scan();
        assert_eq!(scan.inodes.keys().map(|key| key.ino).collect::<Vec<_>>(), [new_ino], "followed to the new inode");
        assert_eq!(scan.inodes.values().next().unwrap().index, cred.index);
        assert!(table.confirms(text, dev, ino), "a record made before this scan");
        assert!(table.confirms(text, new_dev, new_ino));
        table.scan();
        assert!(!table.confirms(text, dev, ino), "two scans on, the old inode is another file");
        assert!(table.confirms(text, new_dev, new_ino));
        let mut open = Open { same_file_as: Some(text.to_owned()), dev, ino, ..Open::default() };
        assert!(!table.confirm(&mut open) && open.same_file_as.is_none());
        let mut open = Open { same_file_as: Some(text.to_owned()), dev: new_dev, ino: new_ino, ..Open::default() };
        assert!(table.confirm(&mut open) && open.same_file_as.as_deref() == Some(text));
    }

    /// A file's identity is read again only when it changed: a file made anew at a credential's
    /// path, with the number of the one deleted, has another change time.
    #[test]
    fn an_identity_is_read_again_for_a_changed_file_only() {
        let dir = tempfile::tempdir().unwrap();
        let npmrc = dir.path().join(".npmrc");
        fs::write(&npmrc, "t").unwrap();
        let (key, read) = identify(&npmrc, &HashMap::new()).unwrap();
        // What no read of this file gives, so that a value from `known` shows.
        let other = match read.identity {
            Identity::Generation(generation) => Identity::Generation(generation ^ 1),
            Identity::NumbersNotReused | Identity::PathOnly => Identity::Generation(1),
        };
        let remembered = Known { identity: other, ..read };
        let known = HashMap::from([(key, remembered)]);
        assert_eq!(identify(&npmrc, &known).unwrap(), (key, remembered), "unchanged: not opened");
        std::thread::sleep(Duration::from_millis(20));
        fs::remove_file(&npmrc).unwrap();
        fs::write(&npmrc, "t2").unwrap();
        let (new_key, again) = identify(&npmrc, &known).unwrap();
        assert_ne!(again, remembered);
        assert_eq!((new_key, again), identify(&npmrc, &HashMap::new()).unwrap(), "read from the new file");
    }

    #[test]
    fn spares_the_executables_and_managers_of_kill_rules_actors() {
        let dir = tempfile::tempdir().unwrap();
        let actors = |action: &str, actors: &str| {
            RULES.replacen("    action: kill\n", &format!("    action: {action}\n    actors:\n{actors}"), 1)
        };
        fs::write(
            dir.path().join("managers.yaml"),
            "schema: 1\nmanagers:\n  - name: npm\n    execs: [npm]\n  - name: cargo\n    execs: [cargo]\n",
        )
        .unwrap();
        let kill = actors(
            "kill",
            "      - execs: [cat]\n        via_manager: true\n        verdict: low\n      - execs: [ls]\n        verdict: low\n      - manager: true\n        managers: [cargo]\n        verdict: low\n",
        );
        fs::write(dir.path().join("test.yaml"), kill).unwrap();
        let rules = RuleSet::load_dir(dir.path()).unwrap();
        let (exes, root_managers) = spared(&rules);
        let key = |path: &str| {
            let meta = fs::metadata(path).unwrap();
            InodeKey { dev: kernel_dev(meta.dev()), ino: meta.ino() }
        };
        assert_eq!(exes[&key("/bin/cat")], SparedExe { flags: spare_flag::VIA_MANAGER, managers: u32::MAX });
        assert_eq!(exes[&key("/bin/ls")], SparedExe { flags: spare_flag::ANYWHERE, managers: u32::MAX });
        let cargo = rules.managers().iter().position(|m| m.name == "cargo").unwrap();
        assert_eq!(root_managers, 1 << cargo);

        // The same actors on an alert rule spare nothing: nothing is killed for it.
        let alert = actors("alert", "      - execs: [cat]\n        verdict: low\n");
        fs::write(dir.path().join("test.yaml"), alert).unwrap();
        let (exes, root_managers) = spared(&RuleSet::load_dir(dir.path()).unwrap());
        assert!(exes.is_empty() && root_managers == 0);
    }

    #[test]
    fn the_agents_tool_shells_pass_the_chain_under_the_agents_roots_only() {
        let dir = tempfile::tempdir().unwrap();
        let managers = "schema: 1\nmanagers:\n  - name: npm\n    execs: [npm]\n  - name: cargo\n    execs: [cargo]\n";
        fs::write(dir.path().join("managers.yaml"), managers).unwrap();
        let agents = "schema: 2\nagents:\n  - name: claude\n    execs: [claude]\n  - name: codex\n    execs: [codex]\nagent_policy:\n  tool_shells: [bash]\n";
        fs::write(dir.path().join("agents.yaml"), agents).unwrap();
        let rules = RuleSet::load_dir(dir.path()).unwrap();
        // Managers first, then the agents, as the kernel's root table has them.
        assert_eq!(agent_roots(&rules), 0b1100);
        let (exes, _) = spared(&rules);
        let meta = fs::metadata("/bin/bash").unwrap();
        let bash = InodeKey { dev: kernel_dev(meta.dev()), ino: meta.ino() };
        assert_eq!(exes[&bash], SparedExe { flags: spare_flag::TOOL_SHELL, managers: 0b1100 });
        assert_eq!(exes.len(), 1, "{exes:?}");
    }

    #[test]
    fn converts_to_kernel_dev_t() {
        assert_eq!(kernel_dev(libc::makedev(259, 3)), (259 << 20) | 3);
    }
}
