//! The YAML shapes of a rule file, as serde reads them. Validation that needs no other file
//! happens here (through `try_from`), so that the parser puts the error at the node that is
//! wrong; what is checked later keeps the node's position (`Spanned`).

use std::collections::BTreeMap;

use globset::{Glob, GlobBuilder};
use serde::Deserialize;
use serde_saphyr::Spanned;

use super::{
    agent::{Agent, AgentPolicy},
    door::DoorEntry,
    id::RuleId,
    manager::Manager,
    target::{Pattern, Targets},
};
use crate::{
    alert::{BlindSpotCause, Severity},
    event::Event,
};

/// One rule file; its rules' samples read as `S` ([`SamplesField`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "S: SamplesField"))]
pub(crate) struct FileDoc<S> {
    /// Which rule schema the file is written in: how its rules say what they match.
    pub schema: SchemaVersion,
    #[serde(default)]
    pub managers: Vec<Spanned<Manager>>,
    /// Coding agents: what makes a process the root of an agent tree.
    #[serde(default)]
    pub agents: Vec<Spanned<Agent>>,
    /// What agent trees alert on besides credential reads.
    #[serde(default)]
    pub agent_policy: Option<Spanned<AgentPolicy>>,
    #[serde(default)]
    pub rules: Vec<Spanned<RuleDoc<S>>>,
    /// When one tree's credential alerts become one sweep alert.
    #[serde(default)]
    pub sweep: Option<Spanned<Sweep>>,
    /// Manager invocations that run code rather than manage packages.
    #[serde(default)]
    pub runs_code: Vec<Spanned<RunsCode>>,
    /// Manager invocations that run the developer's own project (`npm run dev`, `cargo run`).
    #[serde(default)]
    pub project_code: Vec<Spanned<ProjectCode>>,
    /// Per-user files each manager opens under its user's home.
    #[serde(default)]
    pub home_files: Vec<Spanned<HomeFiles>>,
    /// Destinations that package trees usually talk to (per manager, or every tree).
    #[serde(default)]
    pub network: Vec<Spanned<UsualDestinations>>,
    /// Sockets and directories that reach a credential without a file of the catalogue.
    #[serde(default)]
    pub doors: Vec<Spanned<DoorEntry>>,
}

/// Destinations that are not "elsewhere" for `connect: {unusual: true}`: every file's entries
/// add up (`--rules DIR` extends the defaults).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsualDestinations {
    /// Managers whose trees (nearest manager, `run` for a CMD tree without one) these apply to;
    /// empty: every tree.
    #[serde(default)]
    pub managers: Vec<String>,
    /// Names looked up (globs; `*` crosses dots): `registry.npmjs.org`, `*.crates.io`.
    #[serde(default)]
    pub names: Vec<NamePattern>,
    /// Addresses, for connects with no name looked up: `127.0.0.0/8`, `::1`.
    #[serde(default)]
    pub addresses: Vec<Cidr>,
}

/// A host-name glob, matched case-insensitively against the name looked up.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "String")]
pub struct NamePattern {
    pub text: String,
    pub matcher: Matcher,
}

impl TryFrom<String> for NamePattern {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        let glob = GlobBuilder::new(&text.to_ascii_lowercase())
            .case_insensitive(true)
            .build()
            .map_err(|e| format!("bad name pattern {text:?}: {}", e.kind()))?;
        Ok(NamePattern { matcher: Matcher::new(glob, true), text })
    }
}

/// An IP network: `169.254.169.254`, `127.0.0.0/8`, `fd00:ec2::254/128`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Cidr {
    pub network: std::net::IpAddr,
    pub prefix: u8,
}

impl TryFrom<String> for Cidr {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        let bad = || format!("bad address {text:?}: use an IP address, optionally with /prefix");
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix.parse::<u8>().map_err(|_| bad())?)),
            None => (text.as_str(), None),
        };
        let network: std::net::IpAddr = address.parse().map_err(|_| bad())?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        if prefix > max {
            return Err(bad());
        }
        Ok(Cidr { network, prefix })
    }
}

impl Cidr {
    /// Whether `address` (text, as events carry it) is in this network. An IPv4-mapped IPv6
    /// address counts as the IPv4 one.
    pub fn contains(&self, address: &str) -> bool {
        use std::net::IpAddr;
        let Ok(address) = address.parse::<IpAddr>() else { return false };
        let address = match address {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
            v4 => v4,
        };
        let bits = |ip: IpAddr| -> u128 {
            match ip {
                IpAddr::V4(v4) => u128::from(u32::from(v4)) << 96,
                IpAddr::V6(v6) => u128::from(v6),
            }
        };
        if address.is_ipv4() != self.network.is_ipv4() {
            return false;
        }
        // An IPv4 address sits in the top 32 bits, so one mask serves both families.
        let mask = if self.prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(self.prefix)) };
        bits(address) & mask == bits(self.network) & mask
    }
}

/// What a blind-spot rule matches: the sensor's reports of what it missed of a tree (lost
/// records, an overflow, a process left unmarked) and the agent's gaps.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlindSpotMatch {
    pub cause: BlindSpotCause,
    /// Said first when a lost record was an open of a credential file; the engine adds the
    /// kinds of credentials the rules know in a home.
    #[serde(default)]
    pub credential_rotate: Vec<String>,
}

/// What a connect rule matches, on the connect events of tree members. Every part that is set
/// must hold; at least one is set.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "ConnectMatchDoc")]
pub struct ConnectMatch {
    /// Unix socket paths (globs; `$SSH_AUTH_SOCK` is the connecting process's own
    /// `SSH_AUTH_SOCK`).
    pub unix_paths: Vec<SocketPath>,
    /// The IP address is in one of these...
    pub addresses: Vec<Cidr>,
    /// ...or the name looked up matches one of these.
    pub names: Vec<NamePattern>,
    pub ports: Vec<u16>,
    /// An IP destination that is not among the tree's usual ones (`network`), judged by the
    /// name looked up when there is one, else by address; port 53 (the resolver) is never
    /// unusual, nor is a unix socket.
    pub unusual: bool,
    /// Package code of the tree opened a credential file before (any credential rule's target,
    /// at any severity, unless an actor allowed it).
    pub after_credential: bool,
    /// credwatch's `--contain-net` proxy refused the connection (`Connect::proxy_refused`). Only
    /// such a match sees those: the process's connect went to the proxy and no further.
    pub proxy_refused: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConnectMatchDoc {
    #[serde(default)]
    unix_paths: Vec<SocketPath>,
    #[serde(default)]
    addresses: Vec<Cidr>,
    #[serde(default)]
    names: Vec<NamePattern>,
    #[serde(default)]
    ports: Vec<u16>,
    #[serde(default)]
    unusual: bool,
    #[serde(default)]
    after_credential: bool,
    #[serde(default)]
    proxy_refused: bool,
}

impl TryFrom<ConnectMatchDoc> for ConnectMatch {
    type Error = &'static str;
    fn try_from(doc: ConnectMatchDoc) -> Result<Self, &'static str> {
        if doc.unix_paths.is_empty()
            && doc.addresses.is_empty()
            && doc.names.is_empty()
            && doc.ports.is_empty()
            && !doc.unusual
            && !doc.after_credential
            && !doc.proxy_refused
        {
            return Err("a connect match needs at least one of `unix_paths`, `addresses`, `names`, `ports`, `unusual`, `after_credential`, `proxy_refused`");
        }
        if !doc.unix_paths.is_empty() && (!doc.addresses.is_empty() || !doc.names.is_empty() || doc.unusual) {
            return Err(
                "`unix_paths` cannot go with `addresses`, `names` or `unusual`: a connect is to one or the other",
            );
        }
        Ok(ConnectMatch {
            unix_paths: doc.unix_paths,
            addresses: doc.addresses,
            names: doc.names,
            ports: doc.ports,
            unusual: doc.unusual,
            after_credential: doc.after_credential,
            proxy_refused: doc.proxy_refused,
        })
    }
}

/// A unix socket path pattern: an absolute glob (`*` stops at `/`), or `$SSH_AUTH_SOCK`.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "String")]
pub enum SocketPath {
    SshAuthSock,
    Glob { text: String, matcher: globset::GlobMatcher },
}

impl TryFrom<String> for SocketPath {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        if text == "$SSH_AUTH_SOCK" {
            return Ok(SocketPath::SshAuthSock);
        }
        if !text.starts_with('/') && !text.starts_with('@') {
            return Err(format!("socket path {text:?} must be absolute, abstract (`@...`) or `$SSH_AUTH_SOCK`"));
        }
        let glob = GlobBuilder::new(&text)
            .literal_separator(true)
            .build()
            .map_err(|e| format!("bad socket path {text:?}: {}", e.kind()))?;
        Ok(SocketPath::Glob { matcher: glob.compile_matcher(), text })
    }
}

/// Invocations of a manager that run code (`bun payload.js`, `bunx pkg`): the process is still
/// the root of a tree (or nested under one), but it is not "the manager itself" for actors,
/// and what it writes or starts is package code's doing.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunsCode {
    /// The manager's `name`.
    pub manager: String,
    /// Executable basenames that always run code (`bunx`).
    #[serde(default)]
    pub execs: Vec<String>,
    /// Patterns for argv[1] that run code (`*.js`, `run`).
    #[serde(default)]
    pub first_args: Vec<WordPattern>,
}

/// Invocations of a manager that run the root project's own scripts or programs (`npm run dev`,
/// `cargo test`): what the manager starts for them is the developer's code, quiet unless
/// `--watch-project`. Managers they start in turn (`npm install` from a script) are watched.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectCode {
    /// The manager's `name`.
    pub manager: String,
    /// Executable basenames this applies to (`npm`, not `npx`, whose first word is a package).
    pub execs: Vec<String>,
    /// First words (after options) that run the project (`run`, `test`, `*.js`): globs, `*`
    /// crosses `/`.
    pub commands: Vec<WordPattern>,
    /// When set, any other first word than these runs a script of the project too (`yarn dev`).
    #[serde(default)]
    pub builtins: Option<Vec<String>>,
    /// When set, only these executables, started by the manager, are the project's program
    /// (cargo builds dependencies first: their build scripts stay watched).
    #[serde(default)]
    pub programs: Vec<WordPattern>,
    /// Executables started by the manager that are never the project's (build scripts).
    #[serde(default)]
    pub exclude: Vec<WordPattern>,
    /// The manager runs the project's code in its own process (`bun test`): the process is the
    /// project's code, not the manager.
    #[serde(default)]
    pub in_process: bool,
    /// Tools the manager starts for the command that build and run the project's code
    /// themselves (rustdoc running each doctest it built).
    #[serde(default)]
    pub tools: Vec<ProjectTool>,
    /// Only a program that `programs` names, or a script of the project's (its own files or
    /// its installed dependencies', not a package fetched elsewhere), is the project's
    /// (`pnpm exec vitest`).
    #[serde(default)]
    pub own_scripts: bool,
}

/// A tool of a [`ProjectCode`] command: what it starts matching `programs` is the project's
/// code, while the tool itself stays watched (a dependency's proc-macro runs inside rustdoc).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectTool {
    /// Executable basenames of the tool (`rustdoc`).
    pub execs: Vec<String>,
    /// The programs it builds and runs (`*/rustdoctest*/rust_out`): globs, `*` crosses `/`.
    #[serde(default)]
    pub programs: Vec<WordPattern>,
    /// A script it runs is the project's when its real path lies in the directory it runs in:
    /// the project's own bin, or its installed dependencies' (`npx vite`), not a package npx
    /// fetched into its cache.
    #[serde(default)]
    pub own_scripts: bool,
}

/// Files under its user's home that a manager itself opens or looks for (`.npmrc`,
/// `.npm/_logs/*`): where it looked tells a foreign trace's home when the trace has no `HOME`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HomeFiles {
    /// The manager's `name`.
    pub manager: String,
    pub files: Vec<HomeFile>,
    /// What the manager writes in the home by design (its caches, its install destinations):
    /// what stays writable in `run --contain`'s read-only home.
    #[serde(default)]
    pub writes: Vec<HomeWrite>,
}

/// A directory (or file) relative to a home that a manager writes: `.npm`, `.cargo/registry`,
/// `.local/lib/python3*` (a component may be a glob: `*` stops at `/`).
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "String")]
pub struct HomeWrite {
    pub text: String,
    /// Its components, each a literal name or a glob.
    pub components: Vec<Matcher>,
    /// No component is a glob: credwatch can create it.
    pub literal: bool,
}

impl TryFrom<String> for HomeWrite {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        let parts: Vec<&str> = text.split('/').collect();
        if text.starts_with('/') || parts.iter().any(|part| part.is_empty() || *part == "." || *part == "..") {
            return Err(format!("home write {text:?}: a relative path of plain names or globs, without `.` or `..`"));
        }
        let components = (parts.iter())
            .map(|part| {
                GlobBuilder::new(part)
                    .literal_separator(true)
                    .build()
                    .map(|glob| Matcher::new(glob, false))
                    .map_err(|e| format!("bad home write pattern {text:?}: {}", e.kind()))
            })
            .collect::<Result<_, _>>()?;
        let literal = !text.contains(['*', '?', '[', '{']);
        Ok(HomeWrite { text, components, literal })
    }
}

/// A path relative to a home: literal first component, then a glob (`*` stops at `/`).
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "String")]
pub struct HomeFile {
    /// `/` and the first component (`/.npm`), looked for in the opened path.
    pub needle: String,
    pub matcher: Matcher,
}

impl TryFrom<String> for HomeFile {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        let first = text.split('/').next().unwrap_or_default();
        if text.starts_with('/') || first.is_empty() || first.contains(['*', '?', '[', '{']) || first == ".." {
            return Err(format!("home file {text:?}: a relative path whose first component is a plain name"));
        }
        let glob = GlobBuilder::new(&text)
            .literal_separator(true)
            .build()
            .map_err(|e| format!("bad home file pattern {text:?}: {}", e.kind()))?;
        Ok(HomeFile { needle: format!("/{first}"), matcher: Matcher::new(glob, false) })
    }
}

/// The newest schema, the one the default rules are written in. Files in schema 1 load too.
pub const SCHEMA_VERSION: u64 = 2;

/// A file's `schema`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "u64")]
pub(crate) enum SchemaVersion {
    /// A rule's kind follows from which of `targets`, `exec`, `syscalls`, `connect` it has,
    /// and `access` defaults to `read`.
    One,
    /// A rule names its kind (`kind`), and a target rule its `access`.
    Two,
}

impl TryFrom<u64> for SchemaVersion {
    type Error = String;
    fn try_from(version: u64) -> Result<Self, String> {
        match version {
            1 => Ok(SchemaVersion::One),
            2 => Ok(SchemaVersion::Two),
            _ => Err(format!(
                "unsupported schema version {version} (this credwatch reads schemas 1 to {SCHEMA_VERSION})"
            )),
        }
    }
}

/// Schema 2's `kind` of a rule: what it matches, and so which key says how.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub(crate) enum KindName {
    Target,
    Exec,
    Syscall,
    Connect,
    BlindSpot,
}

impl TryFrom<String> for KindName {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        if let Some(kind) = KindName::ALL.into_iter().find(|kind| kind.as_str() == text) {
            return Ok(kind);
        }
        let kinds = KindName::ALL.map(KindName::as_str).join(", ");
        match text.as_str() {
            // The sweep settings are one per set of files, not a rule.
            "sweep" => {
                Err(format!("`kind: sweep`: the sweep is the file's `sweep` section, not a rule (kinds: {kinds})"))
            }
            _ => Err(format!("unknown kind {text:?} (kinds: {kinds})")),
        }
    }
}

impl KindName {
    pub const ALL: [KindName; 5] =
        [KindName::Target, KindName::Exec, KindName::Syscall, KindName::Connect, KindName::BlindSpot];

    pub fn as_str(self) -> &'static str {
        match self {
            KindName::Target => "target",
            KindName::Exec => "exec",
            KindName::Syscall => "syscall",
            KindName::Connect => "connect",
            KindName::BlindSpot => "blind_spot",
        }
    }

    /// The key that says what a rule of this kind matches.
    pub fn key(self) -> &'static str {
        match self {
            KindName::Target => "targets",
            KindName::Exec => "exec",
            KindName::Syscall => "syscalls",
            KindName::Connect => "connect",
            KindName::BlindSpot => "blind_spot",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "S: SamplesField"))]
pub(crate) struct RuleDoc<S> {
    pub id: Spanned<RuleId>,
    /// Schema 2: what the rule matches (schema 1 infers it from the one key of `targets`,
    /// `exec`, `syscalls` and `connect` that is present).
    #[serde(default)]
    pub kind: Option<Spanned<KindName>>,
    pub name: String,
    pub description: String,
    pub category: String,
    pub severity: Severity,
    #[serde(default)]
    pub action: Action,
    #[serde(default)]
    pub targets: Option<Spanned<NonEmpty<Pattern>>>,
    /// With `targets`: which opens count (schema 1: default `read`).
    #[serde(default)]
    pub access: Option<Spanned<Access>>,
    #[serde(default)]
    pub exec: Option<Spanned<ExecMatch>>,
    #[serde(default)]
    pub syscalls: Option<Spanned<SyscallMatch>>,
    #[serde(default)]
    pub connect: Option<Spanned<ConnectMatch>>,
    #[serde(default)]
    pub blind_spot: Option<Spanned<BlindSpotMatch>>,
    #[serde(default)]
    pub exclude: Option<Spanned<Vec<Pattern>>>,
    #[serde(default)]
    pub actors: Vec<Spanned<ActorEntry>>,
    #[serde(default)]
    pub conditions: Option<ConditionsEntry>,
    #[serde(default)]
    pub rotate: Vec<String>,
    /// With `access: read`: what `run --contain` puts in place of the rule's files.
    #[serde(default)]
    pub contain: Option<Spanned<Contain>>,
    pub samples: S,
}

/// What a rule's `samples` (required either way) are read as: [`Samples`] for the rules' tests
/// and `rules check`, or skipped unparsed ([`serde::de::IgnoredAny`]) where only the rules are
/// applied (13% of loading the defaults was parsing samples).
pub(crate) trait SamplesField: serde::de::DeserializeOwned {
    fn into_samples(self) -> Samples;
}

impl SamplesField for Samples {
    fn into_samples(self) -> Samples {
        self
    }
}

impl SamplesField for serde::de::IgnoredAny {
    fn into_samples(self) -> Samples {
        Samples::default()
    }
}

/// What `run --contain` puts in place of a credential file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Contain {
    /// An empty file.
    #[default]
    Empty,
    /// A copy without the lines that hold secrets (a manager's configuration: `.npmrc` keeps
    /// `registry=` and `legacy-peer-deps=`, loses `_authToken=`).
    KeepSettings,
}

/// `alert` now; `kill` asks for in-kernel blocking (kept, enforced later).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    #[default]
    Alert,
    Kill,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alert => "alert",
            Action::Kill => "kill",
        }
    }
}

/// A list that must have at least one element.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "Vec<T>")]
pub struct NonEmpty<T>(pub Vec<T>);

impl<T> TryFrom<Vec<T>> for NonEmpty<T> {
    type Error = &'static str;
    fn try_from(items: Vec<T>) -> Result<Self, &'static str> {
        if items.is_empty() {
            Err("must not be empty")
        } else {
            Ok(NonEmpty(items))
        }
    }
}

/// Which accesses to a target a rule is about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Opens that can read (`O_RDONLY`, `O_RDWR`), and `link`/`rename` of the file elsewhere.
    #[default]
    Read,
    /// Opens that can write or create (`O_WRONLY`, `O_RDWR`, `O_CREAT`, `O_TRUNC`,
    /// `O_APPEND`, `creat`), and `rename`/`link`/`symlink` onto the path.
    Write,
}

/// An argv word pattern: a glob where `*` also crosses `/` (`/:*` is any mount of `/`).
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "String")]
pub struct WordPattern {
    pub text: String,
    pub matcher: Matcher,
}

impl TryFrom<String> for WordPattern {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        let glob = Glob::new(&text).map_err(|e| format!("bad argument pattern {text:?}: {}", e.kind()))?;
        Ok(WordPattern { matcher: Matcher::new(glob, false), text })
    }
}

/// A glob matched as [`globset::GlobMatcher`] matches it, but without its regex when the glob
/// has no special character: most names and words of the rules are plain, and a compiled regex
/// costs kilobytes each.
#[derive(Clone, Debug)]
pub enum Matcher {
    /// The same bytes; with `fold`, ASCII letters in either case (a case-insensitive glob:
    /// globset's regexes fold ASCII only).
    Literal {
        text: String,
        fold: bool,
    },
    Glob(globset::GlobMatcher),
}

impl Matcher {
    /// `fold`: `glob` was built case-insensitive.
    pub fn new(glob: Glob, fold: bool) -> Matcher {
        // Every character the glob syntax gives a meaning to (`,` and `}` only inside `{}`,
        // `!` only after `[`, but a plain reading is not worth the doubt).
        if glob.glob().contains(['*', '?', '[', ']', '{', '}', ',', '!', '\\']) {
            Matcher::Glob(glob.compile_matcher())
        } else {
            Matcher::Literal { text: glob.glob().to_owned(), fold }
        }
    }

    pub fn is_match(&self, text: impl AsRef<std::path::Path>) -> bool {
        match self {
            Matcher::Literal { text: literal, fold } => {
                let text = text.as_ref().as_os_str().as_encoded_bytes();
                if *fold {
                    text.eq_ignore_ascii_case(literal.as_bytes())
                } else {
                    text == literal.as_bytes()
                }
            }
            Matcher::Glob(matcher) => matcher.is_match(text),
        }
    }
}

/// A regular expression over a command line.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "String")]
pub struct CommandPattern {
    pub text: String,
    pub regex: regex_automata::meta::Regex,
}

impl TryFrom<String> for CommandPattern {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        let regex = regex_automata::meta::Regex::new(&text).map_err(|e| {
            let why = e.syntax_error().map_or_else(|| e.to_string(), |syntax| syntax.to_string());
            format!("bad command regex {text:?}: {}", why.replace('\n', " "))
        })?;
        Ok(CommandPattern { text, regex })
    }
}

/// What an exec rule matches, on the exec events of tree members below the root. Every part
/// that is set must hold.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "ExecMatchDoc")]
pub struct ExecMatch {
    /// Basenames of the executed file (the path given to execve or the resolved executable);
    /// empty: any (then `written_by_tree` is required, so that not every exec is a candidate).
    pub names: Vec<String>,
    /// Each must match some argv word after argv[0].
    pub all_args: Vec<WordPattern>,
    /// One of them must match some argv word after argv[0] (when any are given).
    pub any_args: Vec<WordPattern>,
    /// Must match somewhere in the argv words after argv[0], joined by single spaces.
    pub command: Option<CommandPattern>,
    /// The executed file (or, for one of `interpreters`, its script: the first argument that
    /// is not an option) was created or written by this tree, not by the manager itself.
    pub written_by_tree: bool,
    pub interpreters: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecMatchDoc {
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    all_args: Vec<WordPattern>,
    #[serde(default)]
    any_args: Vec<WordPattern>,
    #[serde(default)]
    command: Option<CommandPattern>,
    #[serde(default)]
    written_by_tree: bool,
    #[serde(default)]
    interpreters: Vec<String>,
}

impl TryFrom<ExecMatchDoc> for ExecMatch {
    type Error = &'static str;
    fn try_from(doc: ExecMatchDoc) -> Result<Self, &'static str> {
        if doc.names.is_empty() && !doc.written_by_tree {
            return Err("an exec match needs `names` or `written_by_tree: true`");
        }
        if !doc.interpreters.is_empty() && !doc.written_by_tree {
            return Err("`interpreters` goes with `written_by_tree: true`");
        }
        if doc.names.iter().chain(&doc.interpreters).any(|n| n.is_empty() || n.contains('/')) {
            return Err("`names` and `interpreters` are basenames: not empty, no `/`");
        }
        Ok(ExecMatch {
            names: doc.names,
            all_args: doc.all_args,
            any_args: doc.any_args,
            command: doc.command,
            written_by_tree: doc.written_by_tree,
            interpreters: doc.interpreters,
        })
    }
}

/// What a syscall rule matches, on the syscall events of tree members.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyscallMatch {
    /// Syscall names as the event gives them (`ptrace`, `bpf`, `io_uring_submit_req`, ...).
    pub names: NonEmpty<String>,
    /// The operation must be one of these (`PTRACE_ATTACH`, `BPF_PROG_LOAD`); empty: any.
    #[serde(default)]
    pub operations: Vec<String>,
}

/// The sweep: one tree whose credential alerts (rules with `targets` read, at `min_severity`
/// or above) cover `min_categories` categories within `window_s` seconds of event time gets
/// one alert of this rule instead, and its later credential alerts are folded into it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    pub id: RuleId,
    pub name: String,
    pub description: String,
    pub category: String,
    pub severity: Severity,
    pub min_categories: NonZero,
    pub window_s: NonZero,
    pub min_severity: Severity,
    #[serde(default)]
    pub rotate: Vec<String>,
}

/// A count or duration that must not be 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "u64")]
pub struct NonZero(pub u64);

impl TryFrom<u64> for NonZero {
    type Error = &'static str;
    fn try_from(n: u64) -> Result<Self, &'static str> {
        if n == 0 {
            Err("must be at least 1")
        } else {
            Ok(NonZero(n))
        }
    }
}

/// Who may touch a rule's targets. The first actor that matches the opening process decides.
#[derive(Clone, Debug)]
pub struct Actor {
    pub who: Who,
    /// Only when the nearest package manager is one of these (empty: any).
    pub managers: Vec<String>,
    pub verdict: Verdict,
    /// Why an alert at this verdict is not at the rule's severity; it goes into the alert.
    pub why: Option<String>,
}

#[derive(Clone, Debug)]
pub enum Who {
    /// The package-manager process itself (its own exec was the manager). With `outermost`,
    /// only a manager that no other manager started (`npm whoami` from a postinstall is not).
    Manager { outermost: bool },
    /// A process whose executable basename is in `execs`. With `via_manager`, every process
    /// between the nearest manager and it must be such a process too (npm → git → ssh), so
    /// package code cannot borrow the exemption by running its own `git`. With `installed`,
    /// only the system's own program (see [`SYSTEM_BIN_DIRS`]), run as installed. With
    /// `unless_command`, not when the regex matches its argv words after argv[0], joined by
    /// spaces (`ps e` printing every environment is not `ps aux`).
    Execs { execs: Vec<String>, via_manager: bool, installed: bool, unless_command: Option<CommandPattern> },
    /// A configuration loader: the same process tried to open another file of the chain
    /// (`after`, successfully or not) at most `within_ns` before this one, the way config
    /// libraries walk the project's, the user's and the global file in turn.
    Loader { after: Box<Targets>, within_ns: u64 },
    /// Part of a build from sources: the process, or one between it and its nearest manager,
    /// runs one of `execs` (`make`, `configure`, `cmake`, ...).
    Under { execs: Vec<String> },
}

/// Where an `installed` actor's executable must lie (directly): what the distribution's
/// package manager installs, which package code cannot write without root (and a tree's
/// writes there are remembered).
pub const SYSTEM_BIN_DIRS: &[&str] = &["/usr/bin", "/bin", "/usr/sbin", "/sbin"];

/// Longest `within_ms` a loader actor may ask for: a chain is read in one go, and a longer
/// look-back would let a stealer hide behind any earlier read.
pub const LOADER_WITHIN_MS_MAX: u64 = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActorDoc {
    #[serde(default)]
    manager: bool,
    #[serde(default)]
    outermost: bool,
    #[serde(default)]
    execs: Vec<String>,
    #[serde(default)]
    via_manager: bool,
    #[serde(default)]
    installed: bool,
    #[serde(default)]
    unless_command: Option<CommandPattern>,
    #[serde(default)]
    after_opens: Vec<Pattern>,
    #[serde(default)]
    within_ms: Option<u64>,
    #[serde(default)]
    under: Vec<String>,
    #[serde(default)]
    managers: Vec<Spanned<String>>,
    verdict: Verdict,
    #[serde(default)]
    why: Option<String>,
}

/// An actor as read, with where each manager it names is written (checked once every file is
/// read).
#[derive(Debug, Deserialize)]
#[serde(try_from = "ActorDoc")]
pub(crate) struct ActorEntry {
    pub actor: Actor,
    pub managers: Vec<serde_saphyr::Location>,
}

impl TryFrom<ActorDoc> for ActorEntry {
    type Error = String;
    fn try_from(doc: ActorDoc) -> Result<Self, String> {
        let kinds = [doc.manager, !doc.execs.is_empty(), !doc.after_opens.is_empty(), !doc.under.is_empty()];
        if kinds.iter().filter(|&&k| k).count() != 1 {
            return Err(
                "an actor needs exactly one of `manager: true`, `execs: [...]`, `after_opens: [...]` or `under: [...]`"
                    .into(),
            );
        }
        if doc.outermost && !doc.manager {
            return Err("`outermost` goes with `manager: true`".into());
        }
        if doc.via_manager && doc.execs.is_empty() {
            return Err("`via_manager` goes with `execs`".into());
        }
        if (doc.installed || doc.unless_command.is_some()) && doc.execs.is_empty() {
            return Err("`installed` and `unless_command` go with `execs`".into());
        }
        if doc.within_ms.is_some() == doc.after_opens.is_empty() {
            return Err("`after_opens` and `within_ms` go together".into());
        }
        if doc.verdict == Verdict::Allow && doc.why.is_some() {
            return Err("`why` explains an alert's lower severity: an `allow` actor gives no alert".into());
        }
        if doc.under.iter().any(|n| n.is_empty() || n.contains('/')) {
            return Err("`under` lists basenames: not empty, no `/`".into());
        }
        let who = if doc.manager {
            Who::Manager { outermost: doc.outermost }
        } else if !doc.execs.is_empty() {
            Who::Execs {
                execs: doc.execs,
                via_manager: doc.via_manager,
                installed: doc.installed,
                unless_command: doc.unless_command,
            }
        } else if !doc.under.is_empty() {
            Who::Under { execs: doc.under }
        } else {
            let within_ms = doc.within_ms.unwrap_or_default();
            if within_ms == 0 || within_ms > LOADER_WITHIN_MS_MAX {
                return Err(format!("`within_ms` must be 1 to {LOADER_WITHIN_MS_MAX}"));
            }
            let after = Targets::compile(&doc.after_opens, &[]).map_err(|e| e.to_string())?;
            Who::Loader { after: Box::new(after), within_ns: within_ms * 1_000_000 }
        };
        let (managers, at) = unspan(doc.managers);
        Ok(ActorEntry { actor: Actor { who, managers, verdict: doc.verdict, why: doc.why }, managers: at })
    }
}

/// What happens when an actor matches: no alert, or an alert at this severity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allow,
    Low,
    Medium,
    High,
    Critical,
}

impl Verdict {
    pub fn severity(self) -> Option<Severity> {
        match self {
            Verdict::Allow => None,
            Verdict::Low => Some(Severity::Low),
            Verdict::Medium => Some(Severity::Medium),
            Verdict::High => Some(Severity::High),
            Verdict::Critical => Some(Severity::Critical),
        }
    }
}

/// Extra conditions; all that are set must hold.
#[derive(Clone, Debug, Default)]
pub struct Conditions {
    /// Nearest manager names (`run` for a `credwatch run` tree without one).
    pub managers: Vec<String>,
    /// Attributed lifecycle steps (`postinstall`, `build-script`, ...).
    pub lifecycles: Vec<String>,
    pub min_depth: Option<u32>,
    pub max_depth: Option<u32>,
    /// The path is under `/proc/<pid>/` of a process other than the opener; for a syscall
    /// rule, the syscall's target is known and is neither the caller nor a member of its tree.
    pub other_process: bool,
    /// A package manager is among the process's ancestors: the process runs for package code
    /// (a nested `npm publish`), not as the user's own command.
    pub package_code: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConditionsDoc {
    #[serde(default)]
    managers: Vec<Spanned<String>>,
    #[serde(default)]
    lifecycles: Vec<String>,
    #[serde(default)]
    min_depth: Option<u32>,
    #[serde(default)]
    max_depth: Option<u32>,
    #[serde(default)]
    other_process: bool,
    #[serde(default)]
    package_code: bool,
}

/// Conditions as read, with where each manager they name is written.
#[derive(Debug, Deserialize)]
#[serde(from = "ConditionsDoc")]
pub(crate) struct ConditionsEntry {
    pub conditions: Conditions,
    pub managers: Vec<serde_saphyr::Location>,
}

impl From<ConditionsDoc> for ConditionsEntry {
    fn from(doc: ConditionsDoc) -> Self {
        let (managers, at) = unspan(doc.managers);
        let conditions = Conditions {
            managers,
            lifecycles: doc.lifecycles,
            min_depth: doc.min_depth,
            max_depth: doc.max_depth,
            other_process: doc.other_process,
            package_code: doc.package_code,
        };
        ConditionsEntry { conditions, managers: at }
    }
}

/// The values, and where each was written.
fn unspan<T>(items: Vec<Spanned<T>>) -> (Vec<T>, Vec<serde_saphyr::Location>) {
    items.into_iter().map(|item| (item.value, item.referenced)).unzip()
}

/// Empty (the default) when the rules were loaded without their samples.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(try_from = "SamplesDoc")]
pub struct Samples {
    /// Must fire the rule at its own severity.
    pub positive: Vec<Step>,
    /// Must not fire the rule.
    pub negative: Vec<Step>,
    /// When given: must fire the rule, but only below its severity and saying why (an actor
    /// lowered it).
    pub lowered: Vec<Step>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SamplesDoc {
    positive: Vec<Step>,
    negative: Vec<Step>,
    #[serde(default)]
    lowered: Vec<Step>,
}

impl TryFrom<SamplesDoc> for Samples {
    type Error = &'static str;
    fn try_from(doc: SamplesDoc) -> Result<Self, &'static str> {
        match (doc.positive.is_empty(), doc.negative.is_empty()) {
            (false, false) => Ok(Samples { positive: doc.positive, negative: doc.negative, lowered: doc.lowered }),
            (true, _) => Err("the positive sample has no steps"),
            (_, true) => Err("the negative sample has no steps"),
        }
    }
}

/// One step of a sample, in a compact form, or a full `event` in the trace's JSON shape.
/// Written as a one-key map (`- exec: {...}`).
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "StepDoc")]
pub enum Step {
    Exec(ExecStep),
    Fork(ForkStep),
    Exit(ExitStep),
    Open(OpenStep),
    Rename(RenameStep),
    Syscall(SyscallStep),
    Root(RootStep),
    Connect(ConnectStep),
    Dns(DnsStep),
    BlindSpot(BlindSpotStep),
    Gap(GapStep),
    Event(Box<Event>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepDoc {
    exec: Option<ExecStep>,
    fork: Option<ForkStep>,
    exit: Option<ExitStep>,
    open: Option<OpenStep>,
    rename: Option<RenameStep>,
    syscall: Option<SyscallStep>,
    root: Option<RootStep>,
    connect: Option<ConnectStep>,
    dns: Option<DnsStep>,
    blind_spot: Option<BlindSpotStep>,
    gap: Option<GapStep>,
    event: Option<Box<Event>>,
}

impl TryFrom<StepDoc> for Step {
    type Error = &'static str;
    fn try_from(doc: StepDoc) -> Result<Self, &'static str> {
        let steps = [
            doc.exec.map(Step::Exec),
            doc.fork.map(Step::Fork),
            doc.exit.map(Step::Exit),
            doc.open.map(Step::Open),
            doc.rename.map(Step::Rename),
            doc.syscall.map(Step::Syscall),
            doc.root.map(Step::Root),
            doc.connect.map(Step::Connect),
            doc.dns.map(Step::Dns),
            doc.blind_spot.map(Step::BlindSpot),
            doc.gap.map(Step::Gap),
            doc.event.map(Step::Event),
        ];
        let mut set = steps.into_iter().flatten();
        match (set.next(), set.next()) {
            (Some(step), None) => Ok(step),
            _ => Err("a sample step is one of `exec`, `fork`, `exit`, `open`, `rename`, `syscall`, `root`, `connect`, `dns`, `blind_spot`, `gap` or `event`"),
        }
    }
}

/// An exec. When `ppid` is a pid seen earlier in the sample and `pid` is new, the parent's
/// fork is implied.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecStep {
    pub pid: u32,
    #[serde(default)]
    pub ppid: u32,
    /// The path given to execve; default `args[0]`.
    #[serde(default)]
    pub file: Option<String>,
    pub args: NonEmpty<String>,
    #[serde(default = "default_cwd")]
    pub cwd: String,
    #[serde(default = "default_uid")]
    pub uid: u32,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

fn default_cwd() -> String {
    "/".into()
}

fn default_uid() -> u32 {
    1000
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkStep {
    pub pid: u32,
    pub child: u32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExitStep {
    pub pid: u32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RootStep {
    pub pid: u32,
}

/// A successful open unless `ret` says otherwise; `path` is the absolute path the kernel
/// resolved unless `given` is set, in which case `path` is the absolute one.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenStep {
    pub pid: u32,
    pub path: String,
    #[serde(default)]
    pub given: Option<String>,
    #[serde(default = "default_ret")]
    pub ret: i64,
    #[serde(default)]
    pub flags: OpenFlags,
    /// `openat` unless set (`creat`, `openat2`, ...).
    #[serde(default)]
    pub syscall: Option<String>,
    /// The credential file the sensor says this one is (same inode).
    #[serde(default)]
    pub same_file_as: Option<String>,
    #[serde(default)]
    pub blocked: bool,
}

fn default_ret() -> i64 {
    3
}

/// Open flags: a number, or names joined by `|` (`O_WRONLY|O_CREAT|O_TRUNC`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "FlagsDoc")]
pub struct OpenFlags(pub u64);

#[derive(Deserialize)]
#[serde(untagged)]
enum FlagsDoc {
    Number(u64),
    Names(String),
}

impl TryFrom<FlagsDoc> for OpenFlags {
    type Error = String;
    fn try_from(doc: FlagsDoc) -> Result<Self, String> {
        const NAMES: &[(&str, i32)] = &[
            ("O_RDONLY", libc::O_RDONLY),
            ("O_WRONLY", libc::O_WRONLY),
            ("O_RDWR", libc::O_RDWR),
            ("O_CREAT", libc::O_CREAT),
            ("O_EXCL", libc::O_EXCL),
            ("O_TRUNC", libc::O_TRUNC),
            ("O_APPEND", libc::O_APPEND),
            ("O_CLOEXEC", libc::O_CLOEXEC),
            ("O_PATH", libc::O_PATH),
            ("O_NOFOLLOW", libc::O_NOFOLLOW),
            ("O_DIRECTORY", libc::O_DIRECTORY),
        ];
        match doc {
            FlagsDoc::Number(n) => Ok(OpenFlags(n)),
            FlagsDoc::Names(text) => text
                .split('|')
                .try_fold(0u64, |flags, name| {
                    let name = name.trim();
                    NAMES
                        .iter()
                        .find(|(known, _)| *known == name)
                        .map(|(_, bits)| flags | *bits as u64)
                        .ok_or_else(|| format!("unknown open flag {name:?}"))
                })
                .map(OpenFlags),
        }
    }
}

/// A rename or link: `new` (and `old`, unless a symlink) are absolute paths.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenameStep {
    pub pid: u32,
    /// `renameat2` unless set (`link`, `symlink`, ...).
    #[serde(default)]
    pub syscall: Option<String>,
    pub old: String,
    pub new: String,
    #[serde(default)]
    pub ret: i64,
}

/// A syscall event.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyscallStep {
    pub pid: u32,
    pub name: String,
    #[serde(default)]
    pub operation: Option<String>,
    #[serde(default)]
    pub target: Option<u32>,
    #[serde(default)]
    pub ret: Option<i64>,
    #[serde(default)]
    pub blocked: bool,
}

/// A connect: to `address` and `port` (family from the address), or to the unix socket `path`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectStep {
    pub pid: u32,
    #[serde(default)]
    pub address: Option<std::net::IpAddr>,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub held: bool,
    /// The host asked of the `--contain-net` proxy, which refused it (`port` is its port).
    #[serde(default)]
    pub proxy_refused: Option<String>,
}

/// A DNS query for `name` (type A unless `qtype` says).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsStep {
    pub pid: u32,
    pub name: String,
    #[serde(default)]
    pub qtype: Option<String>,
}

/// The sensor's report of what it missed of the tree of `root` (none: a tree it could not tell),
/// over the `seconds` before the step.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlindSpotStep {
    #[serde(default)]
    pub root: Option<u32>,
    pub cause: crate::event::BlindCause,
    #[serde(default)]
    pub counts: BTreeMap<String, u64>,
    #[serde(default)]
    pub credential: bool,
    #[serde(default)]
    pub seconds: u64,
}

/// The agent was down (or, `stopped`, stopped) for the `seconds` before the step.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GapStep {
    pub seconds: u64,
    #[serde(default)]
    pub stopped: bool,
}
