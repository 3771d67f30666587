//! Doors (`doors:` in a rule file): the sockets and directories through which package code
//! reaches a credential without opening a file of the catalogue: an ssh-agent signs with the
//! user's keys, the docker socket mounts the whole disk, the session bus reaches the keyring.
//! `run --contain` shuts them, `credwatch exposure` lists them; the `doors` module finds them.

use std::collections::BTreeMap;

use globset::GlobBuilder;
use serde::Deserialize;

use super::id::RuleId;

/// One door, as a rule file writes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "DoorDoc")]
pub struct DoorEntry {
    /// `docker`, `ssh-agent`, ...: a found door's `kind`.
    pub id: String,
    /// For people: "the docker socket".
    pub name: String,
    /// `containers`, `ssh`, `gpg`, `desktop`, `kerberos`.
    pub category: String,
    pub paths: Vec<DoorPath>,
    /// Variables whose value names the door, and how to read the value, by name.
    pub variables: BTreeMap<String, ValueForm>,
    /// How `credwatch exposure` asks what it holds, without reading a secret.
    pub probe: Option<Probe>,
    pub samples: DoorSamples,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DoorDoc {
    id: RuleId,
    name: String,
    category: String,
    #[serde(default)]
    paths: Vec<DoorPath>,
    #[serde(default)]
    variables: BTreeMap<String, ValueForm>,
    #[serde(default)]
    probe: Option<Probe>,
    samples: DoorSamples,
}

impl TryFrom<DoorDoc> for DoorEntry {
    type Error = String;
    fn try_from(doc: DoorDoc) -> Result<Self, String> {
        let id = doc.id.0;
        if doc.paths.is_empty() && doc.variables.is_empty() {
            return Err(format!("door {id}: needs `paths` or `variables`"));
        }
        if doc.name.trim().is_empty() || doc.category.trim().is_empty() {
            return Err(format!("door {id}: `name` and `category` must not be empty"));
        }
        if let Some(name) = doc.variables.keys().find(|name| !is_variable_name(name)) {
            return Err(format!("door {id}: {name:?} is no variable name (letters, digits and `_`)"));
        }
        let samples = &doc.samples;
        if samples.found.is_empty() != doc.paths.is_empty() {
            return Err(match doc.paths.is_empty() {
                false => format!("door {id}: `samples.found` needs a path each door path finds"),
                true => format!("door {id}: `samples.found` without `paths`"),
            });
        }
        if let Some(value) = samples.values.iter().find(|v| !doc.variables.contains_key(&v.variable)) {
            return Err(format!("door {id}: the value sample's variable {:?} is not in `variables`", value.variable));
        }
        if let Some(name) = doc.variables.keys().find(|name| !samples.values.iter().any(|v| &v.variable == *name)) {
            return Err(format!("door {id}: variable {name} has no sample in `samples.values`"));
        }
        let placeholders =
            |path: &String| path.starts_with('/') || path.starts_with("~/") || path.starts_with(RUNTIME_PLACEHOLDER);
        if let Some(path) = samples.found.iter().chain(&samples.not_found).find(|p| !placeholders(p)) {
            return Err(format!("door {id}: sample {path:?} must be absolute, or start with `~/` or `{{runtime}}/`"));
        }
        Ok(DoorEntry {
            id,
            name: doc.name,
            category: doc.category,
            paths: doc.paths,
            variables: doc.variables,
            probe: doc.probe,
            samples: doc.samples,
        })
    }
}

fn is_variable_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// What each entry's samples promise, checked without a file system (see
/// `doors::sample_failures`), for a user of uid 1000 whose home is `/home/alice` and
/// runtime directory `/run/user/1000`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DoorSamples {
    /// Paths that one of the entry's `paths` finds (a trailing `/`: a directory).
    #[serde(default)]
    pub found: Vec<String>,
    /// Paths that none of them finds.
    #[serde(default)]
    pub not_found: Vec<String>,
    /// Values of the entry's variables, and a path each names (none: no path at all).
    #[serde(default)]
    pub values: Vec<ValueSample>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValueSample {
    pub variable: String,
    pub value: String,
    #[serde(default)]
    pub path: Option<String>,
}

/// How a variable's value names a door's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ValueForm {
    /// An absolute path (`SSH_AUTH_SOCK`).
    Path,
    /// `unix:///path` (or `unix:/path`); another scheme (`tcp://`, `ssh://`) names no path
    /// here (`DOCKER_HOST`, `CONTAINER_HOST`, `BUILDKIT_HOST`).
    Url,
    /// A D-Bus address list: `unix:path=/run/user/1000/bus,guid=...;...`, with `%XX` escapes
    /// (`DBUS_SESSION_BUS_ADDRESS`); `unix:abstract=` and TCP name no path.
    DbusAddress,
    /// A Kerberos credential cache name: `FILE:path`, `DIR:dir`, `DIR::path`, or a bare path;
    /// `KEYRING:`, `KCM:`, `MEMORY:` name no path (`KRB5CCNAME`).
    Krb5Cache,
    /// An X display: `:0`, `unix:0.0` are `/tmp/.X11-unix/X0`; a host before the `:` is TCP
    /// (`DISPLAY`).
    X11Display,
    /// A Wayland socket name, relative to the runtime directory unless absolute
    /// (`WAYLAND_DISPLAY`).
    WaylandDisplay,
    /// `path:pid:protocol` (`GPG_AGENT_INFO`, gnupg before 2.1).
    GpgAgentInfo,
    /// A gnupg home directory (`GNUPGHOME`): the sockets gnupg puts there when there is no
    /// `/run/user/UID` (containers, CI), by the names `gpgconf --list-dirs` gives.
    GnupgHome,
}

/// How `credwatch exposure` asks a door what it holds, never for a secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Probe {
    /// The agent protocol's identities request: the count of keys, not the keys.
    SshAgent,
    /// Assuan `KEYINFO --list` on `S.gpg-agent` (in a directory door too): keys, and how many
    /// are cached (unlocked); `S.gpg-agent.ssh` as an ssh-agent.
    GpgAgent,
    /// `GET /_ping` over the socket (Docker's and Podman's API).
    HttpPing,
    /// The bus's `NameHasOwner` and `ListActivatableNames` for `org.freedesktop.secrets`.
    SessionBus,
}

/// The placeholder of the user's runtime directory (`$XDG_RUNTIME_DIR`, `/run/user/UID`).
pub const RUNTIME_PLACEHOLDER: &str = "{runtime}";
/// The placeholder of the user's uid, inside any component.
pub const UID_PLACEHOLDER: &str = "{uid}";

/// Where a door path starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathStart {
    /// `/...`: the system's root.
    Root,
    /// `~/...`: the user's home.
    Home,
    /// `{runtime}/...`: the user's runtime directory.
    Runtime,
}

/// A door path: `/run/docker.sock`, `~/.gnupg/S.*`, `{runtime}/gnupg/` (a trailing `/`: a
/// directory, emptied as a whole), `/tmp/krb5cc_{uid}`. Components are literal or globs (`*`,
/// `?`, `[...]`, within one component; no `**`).
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "String")]
pub struct DoorPath {
    pub text: String,
    pub start: PathStart,
    /// The components after the start, `{uid}` still in them.
    pub parts: Vec<PathPart>,
    /// Only a directory is this door; otherwise anything but a directory.
    pub directory: bool,
}

#[derive(Clone, Debug)]
pub struct PathPart {
    pub text: String,
    pub glob: bool,
}

impl PathPart {
    /// The component for the user `uid`: its literal name, or a matcher of names.
    pub fn for_uid(&self, uid: u32) -> Result<PartFor, String> {
        let text = self.text.replace(UID_PLACEHOLDER, &uid.to_string());
        if !self.glob {
            return Ok(PartFor::Literal(text));
        }
        let glob = GlobBuilder::new(&text)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| format!("bad door path component {text:?}: {}", e.kind()))?;
        Ok(PartFor::Glob(glob.compile_matcher()))
    }
}

pub enum PartFor {
    Literal(String),
    Glob(globset::GlobMatcher),
}

impl TryFrom<String> for DoorPath {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        let bad = |why: &str| format!("door path {text:?}: {why}");
        let (start, rest) = if let Some(rest) = text.strip_prefix("~/") {
            (PathStart::Home, rest)
        } else if let Some(rest) = text.strip_prefix(RUNTIME_PLACEHOLDER) {
            let rest = rest.strip_prefix('/').ok_or_else(|| bad("`{runtime}` is followed by `/`"))?;
            (PathStart::Runtime, rest)
        } else if let Some(rest) = text.strip_prefix('/') {
            (PathStart::Root, rest)
        } else {
            return Err(bad("must be absolute, or start with `~/` or `{runtime}/`"));
        };
        let (rest, directory) = match rest.strip_suffix('/') {
            Some(rest) => (rest, true),
            None => (rest, false),
        };
        let mut parts = Vec::new();
        for part in rest.split('/') {
            if part.is_empty() || part == "." || part == ".." {
                return Err(bad("no empty, `.` or `..` component"));
            }
            if part.contains("**") {
                return Err(bad("`**` would walk whole trees: name each level (`*` stays in one)"));
            }
            if part.replace(UID_PLACEHOLDER, "").contains(['{', '}']) {
                return Err(bad("`{` and `}` only in the placeholders `{runtime}` (first) and `{uid}`"));
            }
            let part = PathPart { text: part.to_owned(), glob: part.contains(['*', '?', '[']) };
            // Checked now with any uid: only digits take the placeholder's place.
            part.for_uid(0).map_err(|e| bad(&e))?;
            parts.push(part);
        }
        Ok(DoorPath { text, start, parts, directory })
    }
}
