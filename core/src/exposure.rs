//! `credwatch exposure`: the credential files of the rules' catalogue that exist in a home (and,
//! for a user, on the system and in the other homes), who can read them, how old they are and
//! what to rotate. Only
//! file metadata is read, never a file's content, so it runs unprivileged; what the running
//! user cannot list is counted and said. The doors (rules/doors.yaml: agent and daemon sockets)
//! are listed too, with who can connect and, asked without reading a secret, what they hold.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt::Write as _,
    fs, io,
    os::unix::{
        ffi::OsStrExt as _,
        fs::{FileTypeExt as _, MetadataExt as _},
    },
    path::{Path, PathBuf},
    time::SystemTime,
};

use serde::Serialize;
use time::{format_description::well_known::Rfc3339, OffsetDateTime};

use crate::{
    alert::Severity,
    doors::{
        self,
        probe::{self, Answer},
        DoorScope,
    },
    output::escape,
    report::code,
    rules::{Rule, RuleSet},
};

/// Directory levels entered below each place walked (the home, `~/.ssh` for `~/.ssh/id_*`).
pub const MAX_DEPTH: usize = 12;
/// Directory entries examined in all: a home with millions of files is cut, and says so.
pub const MAX_ENTRIES: u64 = 1_000_000;
/// Examples kept of each kind of cut.
const MAX_EXAMPLES: usize = 10;
/// Directories never entered by the walk of the whole home (the catalogue's `**/` patterns):
/// package trees and caches, huge, which the rules exclude or which hold no one's credentials.
/// Targets under them (`~/.cache/huggingface/token`) are still looked for by name.
const SKIPPED_NAMES: &[&str] = &["node_modules", ".git", "__pycache__", "site-packages", "dist-packages"];
const SKIPPED_IN_HOME: &[&str] = &[".cache", ".rustup", ".npm", ".cargo/registry", ".cargo/git", ".local/share/Trash"];
/// Pseudo file systems: `/proc/*/environ` is a process's memory, not a file to rotate.
const NOT_FILES: &[&str] = &["/proc/", "/sys/", "/dev/"];
/// Characters that make a path component a glob.
const GLOB_CHARS: &[char] = &['*', '?', '[', '{'];

/// Whose exposure: the access checks use these ids.
#[derive(Clone, Debug, Serialize)]
pub struct Identity {
    pub name: Option<String>,
    pub uid: u32,
    /// The primary group and the others.
    pub gids: Vec<u32>,
}

/// Where to look.
#[derive(Clone, Debug)]
pub struct Scope {
    /// `~/` patterns and `**/` patterns are looked for under it.
    pub home: PathBuf,
    /// Absolute patterns (`/etc/shadow`) are looked for under it (`/` on this machine); none
    /// for `--home DIR`.
    pub system_root: Option<PathBuf>,
    /// Other users' homes: their `~/` patterns are looked for, and the files the user can read
    /// there are listed (another user's world-readable token is this user's exposure too).
    pub other_homes: Vec<PathBuf>,
}

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_depth: usize,
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_depth: MAX_DEPTH, max_entries: MAX_ENTRIES }
    }
}

/// The result; its JSON field names are a contract (docs/src/exposure.md).
#[derive(Debug, Serialize)]
pub struct Exposure {
    /// Version of this JSON shape.
    pub schema: u32,
    pub generated_at: String,
    pub user: Identity,
    /// Root reads every file: all of them are exposed to package code run as root.
    pub root: bool,
    pub home: String,
    pub system_paths: bool,
    pub summary: Summary,
    /// Worst severity first, then by name.
    pub categories: Vec<Category>,
    /// Sockets and directories that reach credentials without a file, by path.
    pub doors: Vec<DoorExposure>,
    pub containment: String,
    pub walk: Walk,
}

#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub files: usize,
    /// Files the user can read.
    pub readable: usize,
    /// Files only root can read (package code run with sudo).
    pub root_only: usize,
    pub categories: usize,
    pub doors: usize,
}

/// A door (rules/doors.yaml) that exists: a socket, or a directory of them.
#[derive(Debug, Serialize)]
pub struct DoorExposure {
    /// Resolved, escaped as file paths are.
    pub path: String,
    /// The door's id: `docker`, `ssh-agent`, `gpg-agent`, `session-bus`, ...
    pub kind: String,
    /// For people: "the docker socket".
    pub name: String,
    pub category: String,
    /// `socket`, `directory`, `file` or `other`.
    pub file_type: &'static str,
    /// The variable of credwatch's environment that named it (`SSH_AUTH_SOCK`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_variable: Option<String>,
    pub uid: u32,
    pub gid: u32,
    pub mode: String,
    /// The user can connect to it (a socket: write permission), enter it (a directory) or
    /// read it (a file), by the mode bits and the directories above.
    pub reachable: bool,
    /// What it said when asked (`exposure` without `--no-probe`, and the door has a probe).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holds: Option<Answer>,
}

#[derive(Debug, Serialize)]
pub struct Category {
    pub category: String,
    pub severity: Severity,
    pub files: Vec<FileExposure>,
    /// From the rules of its files (`rotate` in the rules), each once.
    pub rotate: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct FileExposure {
    /// Escaped: `\n`, `\u{1b}`, `\\`, and `\xff` for a byte that is not UTF-8.
    pub path: String,
    /// The rules whose targets it is, most severe first.
    pub rules: Vec<String>,
    pub severity: Severity,
    /// Last modification (RFC 3339, UTC).
    pub modified: String,
    /// Whole days since the last modification.
    pub age_days: u64,
    pub readable: bool,
    pub uid: u32,
    pub gid: u32,
    /// Permission bits, octal (`0600`).
    pub mode: String,
    pub size: u64,
    /// The file it points to, for a symbolic link (escaped too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_to: Option<String>,
}

/// How the walk went, and where it was cut.
#[derive(Debug, Default, Serialize)]
pub struct Walk {
    pub entries: u64,
    pub max_entries: u64,
    pub max_depth: usize,
    /// The entry budget ran out: the list is incomplete.
    pub truncated: bool,
    /// Directories not entered because deeper than `max_depth`, and some of them.
    pub too_deep: u64,
    pub too_deep_examples: Vec<String>,
    /// Directories credwatch could not list or enter (permissions), and some of them: the
    /// outermost one that stopped it (`/root`, not each catalogue path below it).
    pub unlisted: u64,
    pub unlisted_examples: Vec<String>,
    /// Directory names not entered by the walk of the whole home.
    pub skipped: Vec<String>,
    /// Catalogue patterns not looked for, with why.
    pub not_searched: Vec<String>,
    /// Other homes looked at, and the files found there that the user cannot read (not listed).
    pub other_homes: usize,
    pub other_homes_not_readable: u64,
    /// Where the search for doors could not look, or stopped at a limit.
    pub doors_not_seen: Vec<String>,
}

/// Looks for every file of the catalogue (the rules' credential targets) in `scope`, and
/// checks whether `who` can read it.
pub fn scan(rules: &RuleSet, who: &Identity, scope: &Scope, limits: Limits, now: SystemTime) -> Exposure {
    search(rules, scope, limits).finish(who, scope, now)
}

/// A credential file found by [`credential_files`], its path as it is (not escaped).
#[derive(Clone, Debug)]
pub struct CredentialFile {
    pub path: PathBuf,
    /// The rules whose targets it is, most severe first.
    pub rules: Vec<String>,
    /// The most severe rule's category.
    pub category: String,
    pub readable: bool,
}

/// The files [`scan`] would list, with their paths as they are, for `run --contain` to hide;
/// and how the walk went.
pub fn credential_files(rules: &RuleSet, who: &Identity, scope: &Scope, limits: Limits) -> (Vec<CredentialFile>, Walk) {
    let walker = search(rules, scope, limits);
    let mut access = Access { who, searchable: HashMap::new() };
    let files = (walker.found.iter())
        .map(|(path, found)| {
            let matched = found.ranked(rules);
            CredentialFile {
                path: path.clone(),
                rules: matched.iter().map(|rule| rule.id.clone()).collect(),
                category: matched[0].category.clone(),
                readable: access.readable_found(path, found),
            }
        })
        .collect();
    (files, walker.walk)
}

/// Walks `scope` for the catalogue's files.
fn search<'a>(rules: &'a RuleSet, scope: &Scope, limits: Limits) -> Walker<'a> {
    let credential: Vec<&Rule> = rules.rules().iter().filter(|rule| rule.is_credential()).collect();
    // The user's home first, then each other one once (a home inside another still has its
    // own `~/` files: /var/lib/jenkins under /var/lib).
    let mut homes = vec![scope.home.clone()];
    for other in &scope.other_homes {
        if !homes.contains(other) {
            homes.push(other.clone());
        }
    }
    let mut walker = Walker {
        rules,
        home_texts: homes.iter().map(|home| home.to_str().map(str::to_owned)).collect(),
        homes,
        system_root: scope.system_root.clone(),
        limits,
        walk: Walk { max_entries: limits.max_entries, max_depth: limits.max_depth, ..Walk::default() },
        found: BTreeMap::new(),
        roots: BTreeMap::new(),
        blockers: BTreeSet::new(),
    };
    walker.walk.other_homes = walker.homes.len() - 1;
    let mut literal = Vec::new();
    let mut anywhere = false;
    // Rules with targets in /proc, /sys or /dev; absolute targets left out with a home alone.
    let mut pseudo = BTreeSet::new();
    let mut system = 0;
    for rule in &credential {
        for target in &rule.targets {
            // Where the pattern starts, and in which home (none: a system path).
            let starts: Vec<(PathBuf, Option<usize>)> = if let Some(rest) = target.strip_prefix("~/") {
                walker.homes.iter().enumerate().map(|(index, home)| (home.join(rest), Some(index))).collect()
            } else if target.starts_with("**/") {
                anywhere = true;
                continue;
            } else if let Some(root) = &scope.system_root {
                if NOT_FILES.iter().any(|pseudo| target.starts_with(pseudo)) {
                    pseudo.insert(&rule.id);
                    continue;
                }
                vec![(root.join(target.trim_start_matches('/')), None)]
            } else {
                system += 1;
                continue;
            };
            for (start, home) in starts {
                let (prefix, globbed) = literal_prefix(&start);
                if globbed {
                    walker.roots.insert(prefix, home);
                } else {
                    literal.push((prefix, home));
                }
            }
        }
    }
    if !pseudo.is_empty() {
        let rules: Vec<&str> = pseudo.into_iter().map(String::as_str).collect();
        walker.walk.not_searched.push(format!("{}: process memory (`/proc/*/environ`), not files", rules.join(", ")));
    }
    if system > 0 {
        walker
            .walk
            .not_searched
            .push(format!("{system} patterns of system paths (`/etc/shadow`, ...): not looked for with a home alone"));
    }
    if anywhere && scope.system_root.is_some() {
        walker.walk.not_searched.push("patterns anywhere on disk (`**/.env`, `**/*.key`): under the home only".into());
    }
    // A place inside another is walked with it.
    let roots: Vec<PathBuf> = walker.roots.keys().cloned().collect();
    walker.roots.retain(|root, _| !roots.iter().any(|other| other != root && root.starts_with(other)));
    for (path, home) in literal {
        walker.consider(&path, home);
    }
    for (root, home) in walker.roots.clone() {
        walker.walk_dir(&root, home, false);
    }
    if anywhere && !walker.roots.contains_key(&scope.home) {
        walker.walk.skipped = SKIPPED_NAMES.iter().chain(SKIPPED_IN_HOME).map(|s| (*s).to_owned()).collect();
        walker.walk_dir(&scope.home, Some(0), true);
    }
    walker
}

struct Found {
    rules: Vec<usize>,
    /// Index in `Walker::homes`; none for a system path.
    home: Option<usize>,
    meta: fs::Metadata,
    symlink_to: Option<PathBuf>,
}

impl Found {
    /// Its rules, most severe first.
    fn ranked<'r>(&self, rules: &'r RuleSet) -> Vec<&'r Rule> {
        let mut ranked: Vec<&Rule> = self.rules.iter().map(|&i| &rules.rules()[i]).collect();
        ranked.sort_by_key(|rule| std::cmp::Reverse(rule.severity));
        ranked
    }
}

struct Walker<'a> {
    rules: &'a RuleSet,
    /// The user's home, then the others.
    homes: Vec<PathBuf>,
    home_texts: Vec<Option<String>>,
    system_root: Option<PathBuf>,
    limits: Limits,
    walk: Walk,
    found: BTreeMap<PathBuf, Found>,
    /// Places walked on their own (below a pattern's literal prefix), with their home.
    roots: BTreeMap<PathBuf, Option<usize>>,
    /// The directories counted in `walk.unlisted`.
    blockers: BTreeSet<PathBuf>,
}

impl Walker<'_> {
    /// Walks `top` without following symbolic links to directories; `whole_home` skips the
    /// places walked on their own and [`SKIPPED_NAMES`], [`SKIPPED_IN_HOME`].
    fn walk_dir(&mut self, top: &Path, home: Option<usize>, whole_home: bool) {
        let mut stack = vec![(top.to_path_buf(), 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(error)
                    if error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(libc::ENOTDIR) =>
                {
                    continue
                }
                Err(_) => {
                    self.denied(&dir);
                    continue;
                }
            };
            for entry in entries.flatten() {
                if self.walk.entries >= self.limits.max_entries {
                    self.walk.truncated = true;
                    return;
                }
                self.walk.entries += 1;
                let path = entry.path();
                let Ok(kind) = entry.file_type() else { continue };
                if !kind.is_dir() {
                    self.consider(&path, home);
                    continue;
                }
                if whole_home && (self.roots.contains_key(&path) || self.skipped(&path)) {
                    continue;
                }
                if depth + 1 > self.limits.max_depth {
                    self.walk.too_deep += 1;
                    note(&mut self.walk.too_deep_examples, display_path(&path));
                    continue;
                }
                stack.push((path, depth + 1));
            }
        }
    }

    /// Counts the directory that kept this process from `path`: the path itself when it could
    /// be looked at, else the nearest directory above that could (the one it cannot search).
    fn denied(&mut self, path: &Path) {
        let blocker = path.ancestors().find(|at| fs::symlink_metadata(at).is_ok()).unwrap_or(path).to_path_buf();
        if self.blockers.insert(blocker.clone()) {
            self.walk.unlisted += 1;
            note(&mut self.walk.unlisted_examples, display_path(&blocker));
        }
    }

    fn skipped(&self, dir: &Path) -> bool {
        let name = dir.file_name().map(|n| n.as_bytes()).unwrap_or_default();
        SKIPPED_NAMES.iter().any(|skip| skip.as_bytes() == name)
            || dir
                .strip_prefix(&self.homes[0])
                .is_ok_and(|rel| SKIPPED_IN_HOME.iter().any(|skip| rel == Path::new(skip)))
    }

    /// Keeps `path` when it is a regular file (or a link to one) that a rule targets.
    fn consider(&mut self, path: &Path, home: Option<usize>) {
        if self.found.contains_key(path) {
            return;
        }
        let link = match fs::symlink_metadata(path) {
            Ok(link) => link,
            Err(error) if error.kind() == io::ErrorKind::PermissionDenied => return self.denied(path),
            Err(_) => return,
        };
        let (meta, symlink_to) = if link.file_type().is_symlink() {
            let Ok(meta) = fs::metadata(path) else { return };
            (meta, fs::read_link(path).ok())
        } else {
            (link, None)
        };
        if !meta.is_file() {
            return;
        }
        // The rules match paths as this machine names them: below a test's system root, as
        // if it were `/`. A name that is not UTF-8 is matched with U+FFFD in its place (the
        // catalogue's literal parts are ASCII, so only its wildcards meet those bytes).
        let text = match self.system_root.as_deref().filter(|r| *r != Path::new("/")) {
            Some(root) if home.is_none() => match path.strip_prefix(root) {
                Ok(rel) => format!("/{}", rel.to_string_lossy()),
                Err(_) => path.to_string_lossy().into_owned(),
            },
            _ => path.to_string_lossy().into_owned(),
        };
        // The set's index finds the few of ~100 rules that match: measured on a tree of
        // 15,362 entries (debug build), 0.49 s against 1.44 s trying every rule.
        let home_text = home.and_then(|index| self.home_texts[index].as_deref());
        let all = self.rules.rules();
        let rules: Vec<usize> = (self.rules.matching_targets(&text, home_text).into_iter())
            .filter(|&index| all[index].is_credential())
            .collect();
        if !rules.is_empty() {
            self.found.insert(path.to_path_buf(), Found { rules, home, meta, symlink_to });
        }
    }

    fn finish(mut self, who: &Identity, scope: &Scope, now: SystemTime) -> Exposure {
        let mut access = Access { who, searchable: HashMap::new() };
        let mut categories: BTreeMap<String, Category> = BTreeMap::new();
        let mut summary = Summary::default();
        for (path, found) in &self.found {
            let rules = found.ranked(self.rules);
            let worst = rules[0];
            let readable = access.readable_found(path, found);
            if found.home.is_some_and(|home| home > 0) && !readable {
                self.walk.other_homes_not_readable += 1;
                continue;
            }
            summary.files += 1;
            if readable {
                summary.readable += 1;
            } else {
                summary.root_only += 1;
            }
            let modified = found.meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let category = categories.entry(worst.category.clone()).or_insert_with(|| Category {
                category: worst.category.clone(),
                severity: worst.severity,
                files: Vec::new(),
                rotate: Vec::new(),
            });
            category.severity = category.severity.max(worst.severity);
            for advice in rules.iter().flat_map(|rule| &rule.rotate) {
                if !category.rotate.contains(advice) {
                    category.rotate.push(advice.clone());
                }
            }
            category.files.push(FileExposure {
                path: display_path(path),
                rules: rules.iter().map(|rule| rule.id.clone()).collect(),
                severity: worst.severity,
                modified: timestamp(modified),
                age_days: now.duration_since(modified).map_or(0, |age| age.as_secs() / 86_400),
                readable,
                uid: found.meta.uid(),
                gid: found.meta.gid(),
                mode: format!("{:04o}", found.meta.mode() & 0o7777),
                size: found.meta.len(),
                symlink_to: found.symlink_to.as_deref().map(display_path),
            });
        }
        let mut categories: Vec<Category> = categories.into_values().collect();
        categories.sort_by(|a, b| b.severity.cmp(&a.severity).then_with(|| a.category.cmp(&b.category)));
        summary.categories = categories.len();
        Exposure {
            schema: 1,
            generated_at: timestamp(now),
            user: who.clone(),
            root: who.uid == 0,
            home: display_path(&scope.home),
            system_paths: scope.system_root.is_some(),
            containment: containment(&categories),
            summary,
            categories,
            doors: Vec::new(),
            walk: self.walk,
        }
    }
}

/// The one-line suggestion: the box around an install and blocking, and
/// where the keys found would be better kept than in files.
fn containment(categories: &[Category]) -> String {
    if categories.is_empty() {
        return "Nothing to contain: no file of the catalogue was found.".into();
    }
    let mut line = "Run installs under `credwatch run --contain -- <install command>` (package code finds these \
                    files empty and alerts if it looks; `--enforce` kills it when it opens a private key, cloud \
                    credentials or a Vault or PyPI token), never with sudo"
        .to_owned();
    let found = |name: &str| categories.iter().any(|c| c.category == name);
    let moves: Vec<&str> = [
        ("ssh", "SSH keys into ssh-agent or a hardware key"),
        ("cloud", "cloud keys into short-lived SSO sessions"),
        ("registry", "registry tokens into short-lived, scoped CI tokens"),
        ("env-files", "`.env` secrets into a secret manager"),
    ]
    .into_iter()
    .filter(|(category, _)| found(category))
    .map(|(_, advice)| advice)
    .collect();
    if !moves.is_empty() {
        line.push_str(", and move keys out of files: ");
        line.push_str(&moves.join(", "));
    }
    line.push('.');
    line
}

/// Mode bits against the user's ids, and search permission on every directory above.
/// Access control lists and capabilities other than root's are not looked at.
struct Access<'a> {
    who: &'a Identity,
    searchable: HashMap<PathBuf, bool>,
}

impl Access<'_> {
    /// Through a link: the link's directories and the file's own.
    fn readable_found(&mut self, path: &Path, found: &Found) -> bool {
        let real = found.symlink_to.as_ref().and_then(|_| fs::canonicalize(path).ok());
        self.readable(path, &found.meta) && real.as_deref().is_none_or(|real| self.readable(real, &found.meta))
    }

    fn readable(&mut self, path: &Path, meta: &fs::Metadata) -> bool {
        self.reaches(path, meta, 0o4)
    }

    /// Whether the mode bits grant `bit` (read 4, write 2, search 1), and every directory
    /// above is searchable.
    fn reaches(&mut self, path: &Path, meta: &fs::Metadata, bit: u32) -> bool {
        if self.who.uid == 0 {
            return true;
        }
        allows(self.who, meta, bit) && path.ancestors().skip(1).all(|dir| self.search(dir))
    }

    fn search(&mut self, dir: &Path) -> bool {
        if let Some(&known) = self.searchable.get(dir) {
            return known;
        }
        let ok = fs::metadata(dir).is_ok_and(|meta| allows(self.who, &meta, 0o1));
        self.searchable.insert(dir.to_path_buf(), ok);
        ok
    }
}

/// Whether the owner, group or other bits (the first class that applies) grant `bit`.
fn allows(who: &Identity, meta: &fs::Metadata, bit: u32) -> bool {
    let mode = meta.mode();
    let class = if meta.uid() == who.uid {
        mode >> 6
    } else if who.gids.contains(&meta.gid()) {
        mode >> 3
    } else {
        mode
    };
    class & bit != 0
}

/// `path` up to its first component with a glob character, and whether there was one.
fn literal_prefix(path: &Path) -> (PathBuf, bool) {
    let mut prefix = PathBuf::new();
    for component in path.components() {
        if component.as_os_str().to_string_lossy().contains(GLOB_CHARS) {
            return (prefix, true);
        }
        prefix.push(component);
    }
    (prefix, false)
}

/// A path for a terminal or a document: [`escape`]d, each byte that is not UTF-8 as `\xNN`.
pub fn display_path(path: &Path) -> String {
    let mut out = String::new();
    for chunk in path.as_os_str().as_bytes().utf8_chunks() {
        out.push_str(&escape(chunk.valid()));
        for byte in chunk.invalid() {
            let _ = write!(out, "\\x{byte:02x}");
        }
    }
    out
}

fn timestamp(at: SystemTime) -> String {
    // Whole seconds: nobody rotates a key by the nanosecond.
    OffsetDateTime::from(at)
        .replace_nanosecond(0)
        .map_or_else(|_| String::new(), |t| t.format(&Rfc3339).unwrap_or_default())
}

/// `1 file`, `2 files`, `3 directories`.
fn count(n: u64, noun: &str) -> String {
    match (n, noun.strip_suffix('y')) {
        (1, _) => format!("1 {noun}"),
        (_, Some(stem)) => format!("{n} {stem}ies"),
        _ => format!("{n} {noun}s"),
    }
}

/// A Markdown code span of text [`display_path`] escaped already: only a backtick could end it.
fn span(escaped: &str) -> String {
    format!("`{}`", escaped.replace('`', "'"))
}

/// Pushes `item` while fewer than [`MAX_EXAMPLES`] are kept.
fn note(list: &mut Vec<String>, item: String) {
    if list.len() < MAX_EXAMPLES && !list.contains(&item) {
        list.push(item);
    }
}

impl Exposure {
    /// Adds the doors of `scope` that exist: who can reach them and, with `ask`, what each holds
    /// ([`probe::probe`]: counts and names, never a secret).
    pub fn add_doors(&mut self, rules: &RuleSet, scope: &DoorScope, ask: bool) {
        let search = doors::search(rules, scope);
        let mut access = Access { who: &self.user, searchable: HashMap::new() };
        for door in &search.doors {
            let Ok(meta) = fs::metadata(&door.path) else { continue };
            let kind = meta.file_type();
            let (file_type, bit) = if kind.is_socket() {
                ("socket", 0o2)
            } else if kind.is_dir() {
                ("directory", 0o1)
            } else if kind.is_file() {
                ("file", 0o4)
            } else {
                ("other", 0o4)
            };
            let reachable = access.reaches(&door.path, &meta, bit);
            self.doors.push(DoorExposure {
                path: display_path(&door.path),
                kind: door.kind.clone(),
                name: door.name.clone(),
                category: door.category.clone(),
                file_type,
                from_variable: door.from_variable.clone(),
                uid: meta.uid(),
                gid: meta.gid(),
                mode: format!("{:04o}", meta.mode() & 0o7777),
                reachable,
                holds: if ask { probe::probe(door) } else { None },
            });
        }
        self.summary.doors = self.doors.len();
        let unlisted =
            search.unlisted.iter().map(|dir| format!("{}: not listed (permission denied)", display_path(dir)));
        self.walk.doors_not_seen.extend(unlisted.chain(search.cut.iter().map(|cut| escape(cut).into_owned())));
    }

    /// Markdown, as the report's: paths in code spans, escaped.
    pub fn to_markdown(&self) -> String {
        let mut out = String::from("# credwatch exposure\n\n");
        let user = self.user.name.as_deref().map_or_else(|| format!("uid {}", self.user.uid), code);
        let gids: Vec<String> = self.user.gids.iter().map(u32::to_string).collect();
        let others = match self.walk.other_homes {
            0 => String::new(),
            n => format!(", and {n} other users' homes (their files {user} can read)"),
        };
        let _ = writeln!(
            out,
            "User {user} (uid {}, groups {}), home {}; {}{others}.\n",
            self.user.uid,
            if gids.is_empty() { "none".into() } else { gids.join(", ") },
            span(&self.home),
            if self.system_paths { "system paths checked too" } else { "this home only" }
        );
        let s = &self.summary;
        if self.root {
            let _ = writeln!(
                out,
                "**{} credential files in {} categories, all readable: root reads every file.**\n",
                s.files, s.categories
            );
        } else {
            let _ = writeln!(
                out,
                "**{} credential files in {} categories: {} readable by {user}, {} only by package code run as \
                 root (`sudo npm install -g`, a root CI job).**\n",
                s.files, s.categories, s.readable, s.root_only
            );
        }
        for category in &self.categories {
            let count = category.files.len();
            let _ = writeln!(
                out,
                "## {} ({}): {count} file{}\n",
                code(&category.category),
                category.severity.as_str(),
                if count == 1 { "" } else { "s" }
            );
            for file in &category.files {
                let rules: Vec<String> = file.rules.iter().map(|r| code(r)).collect();
                let link = file.symlink_to.as_deref().map(|to| format!(" → {}", span(to))).unwrap_or_default();
                let _ = writeln!(
                    out,
                    "- {}{link}: {} day{} old, {}, {} (mode {}, owner {}:{})",
                    span(&file.path),
                    file.age_days,
                    if file.age_days == 1 { "" } else { "s" },
                    if file.readable { "readable" } else { "root only" },
                    rules.join(", "),
                    file.mode,
                    file.uid,
                    file.gid
                );
            }
            out.push_str("\nRotate:\n\n");
            for advice in &category.rotate {
                let _ = writeln!(out, "- [ ] {}", escape(advice));
            }
            out.push('\n');
        }
        if self.categories.is_empty() {
            out.push_str("No file of the catalogue was found.\n\n");
        }
        self.doors_markdown(&mut out, &user);
        let _ = writeln!(out, "## Containment\n\n{}\n", self.containment);
        out.push_str("## What the walk did not see\n\n");
        let w = &self.walk;
        let _ = writeln!(out, "- {} entries examined (at most {}).", w.entries, w.max_entries);
        if w.truncated {
            let _ = writeln!(out, "- **Cut:** the walk stopped after {} entries: files may be missing.", w.max_entries);
        }
        if w.too_deep > 0 {
            let examples: Vec<String> = w.too_deep_examples.iter().map(|p| span(p)).collect();
            let _ = writeln!(
                out,
                "- **Cut:** {} deeper than {} levels not entered, e.g. {}.",
                count(w.too_deep, "directory"),
                w.max_depth,
                examples.join(", ")
            );
        }
        if w.unlisted > 0 {
            let examples: Vec<String> = w.unlisted_examples.iter().map(|p| span(p)).collect();
            let _ = writeln!(
                out,
                "- {} this process could not list or enter (run as root to see into them): {}{}.",
                count(w.unlisted, "directory"),
                examples.join(", "),
                if w.unlisted > examples.len() as u64 { ", ..." } else { "" }
            );
        }
        if !w.skipped.is_empty() {
            let skipped: Vec<String> = w.skipped.iter().map(|p| code(p)).collect();
            let _ = writeln!(out, "- Not entered by the walk of the home: {}.", skipped.join(", "));
        }
        if w.other_homes_not_readable > 0 {
            let _ = writeln!(
                out,
                "- {} of the catalogue in other users' homes that {user} cannot read: not listed.",
                count(w.other_homes_not_readable, "file")
            );
        }
        for item in &w.not_searched {
            let _ = writeln!(out, "- Not searched: {}.", escape(item));
        }
        for item in &w.doors_not_seen {
            let _ = writeln!(out, "- Doors: {item}.");
        }
        out.push_str("- Symbolic links to directories are not followed; access control lists are not read.\n");
        out
    }
}

/// What `user` (the Markdown's name of the user) is told of a door it can reach, by file type.
fn reach_words(file_type: &str) -> &'static str {
    match file_type {
        "socket" => "can connect",
        "directory" => "can enter it",
        _ => "can read it",
    }
}

impl Exposure {
    /// The "Doors" heading: each door, who can reach it, what it holds.
    fn doors_markdown(&self, out: &mut String, user: &str) {
        let count = self.doors.len();
        let _ = writeln!(
            out,
            "## Doors: {count} socket{} and director{} that reach credentials without a file\n",
            if count == 1 { "" } else { "s" },
            if count == 1 { "y" } else { "ies" }
        );
        if self.doors.is_empty() {
            out.push_str("No door of rules/doors.yaml was found.\n\n");
            return;
        }
        out.push_str(
            "Package code that reaches one borrows what it holds: an agent signs with its keys, a container \
             engine reads every file. `credwatch run --contain` shuts each (an empty file or directory over it) \
             and withholds the variables that name it.\n\n",
        );
        for door in &self.doors {
            let reach = if door.reachable {
                format!("{user} {}", reach_words(door.file_type))
            } else {
                format!("{user} cannot reach it (root can)")
            };
            let variable =
                door.from_variable.as_deref().map(|v| format!("; found through {}", code(v))).unwrap_or_default();
            let holds = door.holds.as_ref().map(|a| format!(": {}", escape(&a.describe()))).unwrap_or_default();
            let _ = writeln!(
                out,
                "- {} ({}, {}): {}, mode {}, owner {}:{}, {reach}{variable}{holds}",
                span(&door.path),
                escape(&door.name),
                code(&door.category),
                door.file_type,
                door.mode,
                door.uid,
                door.gid,
            );
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests;
