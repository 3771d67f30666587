//! The doors of the rules (`doors:`, rules/doors.yaml) that exist for a user: the sockets and
//! directories through which package code reaches a credential without opening a file of the
//! catalogue (the docker socket, an ssh-agent, gpg-agent, the session bus). `run --contain`
//! binds an empty file or directory over each; `credwatch exposure` lists them.
//!
//! Only names and metadata are read here; [`probe`] asks a running door what it holds.

pub mod probe;

use std::{
    collections::BTreeSet,
    ffi::{OsStr, OsString},
    fs, io,
    os::unix::ffi::{OsStrExt as _, OsStringExt as _},
    path::{Path, PathBuf},
};

use crate::rules::{
    door::{DoorEntry, DoorPath, PartFor, PathStart, Probe, ValueForm, RUNTIME_PLACEHOLDER},
    RuleSet,
};

/// Entries read from one directory while matching a glob component (`/tmp` can be large).
pub const MAX_DIRECTORY_ENTRIES: usize = 10_000;
/// Paths one door path may expand to.
pub const MAX_MATCHES_PER_PATH: usize = 64;
/// Doors found in all.
pub const MAX_DOORS: usize = 512;
/// Longest variable value read for a path (the kernel's `PATH_MAX`, and some).
const MAX_VALUE_BYTES: usize = 8192;

/// Whose doors, and where.
#[derive(Clone, Debug)]
pub struct DoorScope {
    /// Where `~/` paths start (not absolute, empty: not looked in).
    pub home: PathBuf,
    pub uid: u32,
    /// `$XDG_RUNTIME_DIR`, or `/run/user/UID`: where `{runtime}/` paths start (not absolute,
    /// empty: not looked in).
    pub runtime_dir: PathBuf,
    /// The environment whose variables (`SSH_AUTH_SOCK`, ...) name doors. Their values are
    /// paths on this machine as they are, never under `system_root`.
    pub env: Vec<(OsString, OsString)>,
    /// Where absolute paths (`/run/docker.sock`) are looked for: `/` normally, a directory in
    /// tests; none: not looked for (`exposure --home DIR`).
    pub system_root: Option<PathBuf>,
}

/// A door that exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Door {
    /// Absolute, resolved (no symbolic link in it), existing.
    pub path: PathBuf,
    /// The entry's id: `docker`, `ssh-agent`, `gpg-agent`, `session-bus`, ...
    pub kind: String,
    /// For people: "the docker socket".
    pub name: String,
    pub category: String,
    /// A directory: `run --contain` binds an empty directory over it, else an empty file.
    pub directory: bool,
    /// The variable whose value named it (`SSH_AUTH_SOCK`), if one did.
    pub from_variable: Option<String>,
    pub probe: Option<Probe>,
}

/// What a search found, and what it could not look at.
#[derive(Debug, Default)]
pub struct Search {
    /// Sorted by path, one per resolved path, none inside a directory door.
    pub doors: Vec<Door>,
    /// Directories that could not be listed (permissions), where a glob needed them.
    pub unlisted: Vec<PathBuf>,
    /// A limit was reached: [`MAX_DIRECTORY_ENTRIES`], [`MAX_MATCHES_PER_PATH`] or
    /// [`MAX_DOORS`]; what, in words.
    pub cut: Vec<String>,
}

/// `/run/user/UID`: where logind puts a user's runtime directory (`XDG_RUNTIME_DIR` when its
/// session does not say otherwise).
pub fn runtime_dir_of(uid: u32) -> PathBuf {
    PathBuf::from(format!("/run/user/{uid}"))
}

/// The doors of `rules` that exist in `scope`: sorted by path, deduplicated by resolved path
/// (`/var/run/docker.sock` is `/run/docker.sock`), none inside a directory door (binding the
/// directory shuts it), at most [`MAX_DOORS`].
pub fn find(rules: &RuleSet, scope: &DoorScope) -> Vec<Door> {
    search(rules, scope).doors
}

/// [`find`], with what it could not see.
pub fn search(rules: &RuleSet, scope: &DoorScope) -> Search {
    let mut search = Search::default();
    let mut found: Vec<Door> = Vec::new();
    for entry in rules.doors() {
        for door_path in &entry.paths {
            let base = match door_path.start {
                PathStart::Root => match &scope.system_root {
                    Some(root) => root.clone(),
                    None => continue,
                },
                PathStart::Home => scope.home.clone(),
                PathStart::Runtime => scope.runtime_dir.clone(),
            };
            // An empty (unknown) home or runtime directory: not the working directory.
            if !base.is_absolute() {
                continue;
            }
            for path in expand(&base, door_path, scope.uid, &mut search) {
                let Ok(meta) = fs::metadata(&path) else { continue };
                if meta.is_dir() == door_path.directory {
                    found.push(door(entry, &path, meta.is_dir(), None));
                }
            }
        }
        for (name, form) in &entry.variables {
            let Some((_, value)) = scope.env.iter().find(|(key, _)| key.as_bytes() == name.as_bytes()) else {
                continue;
            };
            for path in value_paths(*form, value, &scope.runtime_dir) {
                if let Ok(meta) = fs::metadata(&path) {
                    found.push(door(entry, &path, meta.is_dir(), Some(name.clone())));
                }
            }
        }
    }
    for door in &mut found {
        if let Ok(real) = fs::canonicalize(&door.path) {
            door.path = real;
        }
    }
    let mut doors = tidy(found);
    if doors.len() > MAX_DOORS {
        search.cut.push(format!("{} doors found, the first {MAX_DOORS} kept", doors.len()));
        doors.truncate(MAX_DOORS);
    }
    search.doors = doors;
    search
}

/// `doors` (resolved paths, from one search or several) sorted by path, one per path (its
/// first kind, and a variable that named it if any did), and none inside a directory door:
/// binding the directory shuts them, and the path would not exist in the empty one.
pub fn tidy(mut doors: Vec<Door>) -> Vec<Door> {
    // Stable: among the same path, the first found stays first.
    doors.sort_by(|a, b| a.path.cmp(&b.path));
    let mut kept: Vec<Door> = Vec::new();
    for door in doors {
        if let Some(last) = kept.last_mut().filter(|last| last.path == door.path) {
            if last.from_variable.is_none() {
                last.from_variable = door.from_variable;
            }
            continue;
        }
        if kept.iter().any(|d| d.directory && door.path.starts_with(&d.path)) {
            continue;
        }
        kept.push(door);
    }
    kept
}

fn door(entry: &DoorEntry, path: &Path, directory: bool, from_variable: Option<String>) -> Door {
    Door {
        path: path.to_path_buf(),
        kind: entry.id.clone(),
        name: entry.name.clone(),
        category: entry.category.clone(),
        directory,
        from_variable,
        probe: entry.probe,
    }
}

/// The existing paths `door_path` names under `base`: each glob component matched against a
/// directory's entries, within the limits.
fn expand(base: &Path, door_path: &DoorPath, uid: u32, search: &mut Search) -> Vec<PathBuf> {
    let mut current = vec![base.to_path_buf()];
    for part in &door_path.parts {
        // Checked at load; a uid's digits cannot make it fail.
        let Ok(part) = part.for_uid(uid) else { return Vec::new() };
        let mut next = Vec::new();
        for dir in current {
            match &part {
                PartFor::Literal(name) => next.push(dir.join(name)),
                PartFor::Glob(matcher) => {
                    let entries = match fs::read_dir(&dir) {
                        Ok(entries) => entries,
                        Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
                            search.unlisted.push(dir);
                            continue;
                        }
                        Err(_) => continue,
                    };
                    let mut names = Vec::new();
                    for (read, entry) in entries.enumerate() {
                        if read == MAX_DIRECTORY_ENTRIES {
                            search.cut.push(format!(
                                "{}: more than {MAX_DIRECTORY_ENTRIES} entries, the rest not matched against {}",
                                dir.display(),
                                door_path.text
                            ));
                            break;
                        }
                        let Ok(entry) = entry else { continue };
                        if matcher.is_match(Path::new(&entry.file_name())) {
                            names.push(entry.file_name());
                        }
                    }
                    // The same matches whatever order the directory lists them in.
                    names.sort();
                    next.extend(names.into_iter().map(|name| dir.join(name)));
                }
            }
        }
        if next.len() > MAX_MATCHES_PER_PATH {
            search.cut.push(format!(
                "{}: {} matches, the first {MAX_MATCHES_PER_PATH} kept",
                door_path.text,
                next.len()
            ));
            next.truncate(MAX_MATCHES_PER_PATH);
        }
        current = next;
    }
    current
}

/// The paths a variable's value names, read as `form` (none for a TCP address, an abstract
/// socket, a kernel keyring).
pub fn value_paths(form: ValueForm, value: &OsStr, runtime_dir: &Path) -> Vec<PathBuf> {
    let value = value.as_bytes();
    if value.is_empty() || value.len() > MAX_VALUE_BYTES {
        return Vec::new();
    }
    let absolute = |bytes: &[u8]| -> Option<PathBuf> {
        bytes.starts_with(b"/").then(|| PathBuf::from(OsString::from_vec(bytes.to_vec())))
    };
    match form {
        ValueForm::Path => absolute(value).into_iter().collect(),
        ValueForm::Url => {
            let rest = value.strip_prefix(b"unix://").or_else(|| value.strip_prefix(b"unix:"));
            rest.and_then(absolute).into_iter().collect()
        }
        ValueForm::DbusAddress => value
            .split(|&b| b == b';')
            .filter_map(|address| address.strip_prefix(b"unix:"))
            .filter_map(|keys| keys.split(|&b| b == b',').find_map(|pair| pair.strip_prefix(b"path=")))
            .filter_map(|escaped| absolute(&percent_decode(escaped)))
            .collect(),
        ValueForm::Krb5Cache => {
            let rest = if let Some(rest) = value.strip_prefix(b"FILE:") {
                rest
            } else if let Some(rest) = value.strip_prefix(b"DIR:") {
                // `DIR::path` is one cache of a collection, `DIR:dir` the collection.
                rest.strip_prefix(b":").unwrap_or(rest)
            } else {
                value
            };
            absolute(rest).into_iter().collect()
        }
        ValueForm::X11Display => {
            // `/private/tmp/.../org.xquartz:0`: a socket path, then the display.
            if value.starts_with(b"/") {
                let end = value.iter().rposition(|&b| b == b':').unwrap_or(value.len());
                return absolute(&value[..end]).into_iter().collect();
            }
            let Some(colon) = value.iter().position(|&b| b == b':') else { return Vec::new() };
            let (host, display) = (&value[..colon], &value[colon + 1..]);
            let number: Vec<u8> = display.iter().copied().take_while(u8::is_ascii_digit).collect();
            if !(host.is_empty() || host == b"unix") || number.is_empty() {
                return Vec::new();
            }
            vec![PathBuf::from(format!("/tmp/.X11-unix/X{}", String::from_utf8_lossy(&number)))]
        }
        ValueForm::WaylandDisplay => match absolute(value) {
            Some(path) => vec![path],
            None => vec![runtime_dir.join(OsStr::from_bytes(value))],
        },
        ValueForm::GpgAgentInfo => {
            let end = value.iter().position(|&b| b == b':').unwrap_or(value.len());
            absolute(&value[..end]).into_iter().collect()
        }
        ValueForm::GnupgHome => match absolute(value) {
            Some(dir) => GNUPG_SOCKETS.iter().map(|name| dir.join(name)).collect(),
            None => Vec::new(),
        },
    }
}

/// The sockets gnupg 2.2 makes in its socket directory (`gpgconf --list-dirs`), and the
/// smartcard daemon's and keyboxd's of later versions.
const GNUPG_SOCKETS: &[&str] = &[
    "S.gpg-agent",
    "S.gpg-agent.ssh",
    "S.gpg-agent.extra",
    "S.gpg-agent.browser",
    "S.dirmngr",
    "S.scdaemon",
    "S.keyboxd",
];

/// D-Bus addresses escape bytes as `%XX`.
fn percent_decode(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut at = 0;
    while at < text.len() {
        let hex = text.get(at + 1..at + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (text[at], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                at += 3;
            }
            (byte, _) => {
                out.push(byte);
                at += 1;
            }
        }
    }
    out
}

/// The names of the variables of `env` that lead to a door: every door's own variables
/// (`SSH_AUTH_SOCK`, `DOCKER_HOST`, `DISPLAY`, ... whatever their value: `tcp://` reaches a
/// daemon too), and any other whose value names a door of `doors` or a path inside a
/// directory door (`MY_SOCK=unix:///var/run/docker.sock`). Sorted.
pub fn withheld_variables(rules: &RuleSet, env: &[(OsString, OsString)], doors: &[Door]) -> Vec<String> {
    let own: BTreeSet<&str> = rules.doors().iter().flat_map(|d| d.variables.keys()).map(String::as_str).collect();
    let mut withheld = BTreeSet::new();
    for (name, value) in env {
        let Some(name) = name.to_str() else { continue };
        if own.contains(name) || names_a_door(value, doors) {
            withheld.insert(name.to_owned());
        }
    }
    withheld.into_iter().collect()
}

/// Whether `value` holds a door's path (whole: not as part of a longer name), or a path that
/// resolves to one or into a directory door.
fn names_a_door(value: &OsStr, doors: &[Door]) -> bool {
    let bytes = value.as_bytes();
    if bytes.len() > MAX_VALUE_BYTES {
        return false;
    }
    let name_byte = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+' | b'~');
    let holds = |door: &Door| {
        let path = door.path.as_os_str().as_bytes();
        (0..bytes.len()).filter(|&at| bytes[at..].starts_with(path)).any(|at| {
            let before = at.checked_sub(1).map(|i| bytes[i]);
            let after = bytes.get(at + path.len()).copied();
            before.is_none_or(|b| !name_byte(b)) && after.is_none_or(|b| !name_byte(b) && (b != b'/' || door.directory))
        })
    };
    if doors.iter().any(holds) {
        return true;
    }
    // Through a link (`/var/run` is `/run`): every form's reading of the value, resolved.
    let forms =
        [ValueForm::Path, ValueForm::Url, ValueForm::DbusAddress, ValueForm::Krb5Cache, ValueForm::GpgAgentInfo];
    forms
        .into_iter()
        .flat_map(|form| value_paths(form, value, Path::new("/")))
        .filter_map(|path| fs::canonicalize(path).ok())
        .any(|real| doors.iter().any(|d| real == d.path || (d.directory && real.starts_with(&d.path))))
}

/// The sample user: what each entry's samples are written for.
const SAMPLE_HOME: &str = "/home/alice";
const SAMPLE_RUNTIME: &str = "/run/user/1000";
const SAMPLE_UID: u32 = 1000;

/// Checks every door's samples over `rules` (no file system: the paths are matched as text);
/// the failures, one line each.
pub fn sample_failures(rules: &RuleSet) -> Vec<String> {
    let mut failures = Vec::new();
    for entry in rules.doors() {
        for (sample, want) in
            entry.samples.found.iter().map(|s| (s, true)).chain(entry.samples.not_found.iter().map(|s| (s, false)))
        {
            let path = sample_path(sample);
            let directory = sample.ends_with('/');
            let matched = entry.paths.iter().find(|p| p.directory == directory && matches_text(p, &path));
            match (matched, want) {
                (None, true) => failures.push(format!("door {}: no path finds {sample:?}", entry.id)),
                (Some(p), false) => {
                    failures.push(format!("door {}: {:?} finds {sample:?}, a `not_found` sample", entry.id, p.text))
                }
                _ => {}
            }
        }
        for sample in &entry.samples.values {
            let form = entry.variables[&sample.variable];
            let got = value_paths(form, OsStr::new(&sample.value), Path::new(SAMPLE_RUNTIME));
            let right = match &sample.path {
                Some(path) => got.contains(&sample_path(path)),
                None => got.is_empty(),
            };
            if !right {
                let want: Vec<PathBuf> = sample.path.iter().map(|p| sample_path(p)).collect();
                failures.push(format!(
                    "door {}: {}={:?} names {got:?}, its sample says {want:?}",
                    entry.id, sample.variable, sample.value
                ));
            }
        }
    }
    failures
}

fn sample_path(text: &str) -> PathBuf {
    let text = text.trim_end_matches('/');
    if let Some(rest) = text.strip_prefix("~/") {
        Path::new(SAMPLE_HOME).join(rest)
    } else if let Some(rest) = text.strip_prefix(RUNTIME_PLACEHOLDER) {
        PathBuf::from(format!("{SAMPLE_RUNTIME}{rest}"))
    } else {
        PathBuf::from(text)
    }
}

/// Whether `door_path` names `path` for the sample user, component by component.
fn matches_text(door_path: &DoorPath, path: &Path) -> bool {
    let base = match door_path.start {
        PathStart::Root => Path::new("/"),
        PathStart::Home => Path::new(SAMPLE_HOME),
        PathStart::Runtime => Path::new(SAMPLE_RUNTIME),
    };
    let Ok(rest) = path.strip_prefix(base) else { return false };
    let names: Vec<&OsStr> = rest.iter().collect();
    names.len() == door_path.parts.len()
        && door_path.parts.iter().zip(names).all(|(part, name)| match part.for_uid(SAMPLE_UID) {
            Ok(PartFor::Literal(literal)) => literal.as_bytes() == name.as_bytes(),
            Ok(PartFor::Glob(matcher)) => matcher.is_match(Path::new(name)),
            Err(_) => false,
        })
}

#[cfg(test)]
mod tests;
