//! The YAML shapes of a rule file, as serde reads them. Validation that needs no other file
//! happens here (through `try_from`), so that serde_yaml attaches the line to the error.

use std::collections::BTreeMap;

use globset::{Glob, GlobBuilder};
use serde::Deserialize;

use super::manager::Manager;
use crate::{alert::Severity, event::Event};

/// One rule file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileDoc {
    /// Read only to reject other versions.
    #[serde(rename = "schema")]
    pub _schema: SchemaVersion,
    #[serde(default)]
    pub managers: Vec<Manager>,
    #[serde(default)]
    pub rules: Vec<RuleDoc>,
}

/// The only schema this build reads.
pub const SCHEMA_VERSION: u64 = 1;

#[derive(Debug, Deserialize)]
#[serde(try_from = "u64")]
pub(crate) struct SchemaVersion;

impl TryFrom<u64> for SchemaVersion {
    type Error = String;
    fn try_from(version: u64) -> Result<Self, String> {
        if version == SCHEMA_VERSION {
            Ok(SchemaVersion)
        } else {
            Err(format!("unsupported schema version {version} (this credwatch reads schema {SCHEMA_VERSION})"))
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RuleDoc {
    pub id: RuleId,
    pub name: String,
    pub description: String,
    pub category: String,
    pub severity: Severity,
    #[serde(default)]
    pub action: Action,
    pub targets: NonEmpty<Pattern>,
    #[serde(default)]
    pub exclude: Vec<Pattern>,
    #[serde(default)]
    pub actors: Vec<Actor>,
    #[serde(default)]
    pub conditions: Conditions,
    #[serde(default)]
    pub rotate: Vec<String>,
    pub samples: Samples,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct RuleId(pub String);

impl TryFrom<String> for RuleId {
    type Error = String;
    fn try_from(id: String) -> Result<Self, String> {
        let ok = !id.is_empty()
            && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' || b == b'.');
        if ok {
            Ok(RuleId(id))
        } else {
            Err(format!("bad rule id {id:?}: use lowercase letters, digits, '-', '_' and '.'"))
        }
    }
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

/// Where a path pattern is anchored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anchor {
    /// `~/...`: relative to each user's home.
    Home,
    /// `/...` or `**/...`: matched against the absolute path.
    Absolute,
}

/// A path glob: `~/...` (under any home), `/...` or `**/...`. `*` stops at `/`, `**` does not.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "String")]
pub struct Pattern {
    pub text: String,
    pub anchor: Anchor,
    pub glob: Glob,
}

impl TryFrom<String> for Pattern {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        let (anchor, body) = if let Some(rest) = text.strip_prefix("~/") {
            (Anchor::Home, rest)
        } else if text.starts_with('/') || text.starts_with("**/") {
            (Anchor::Absolute, text.as_str())
        } else {
            return Err(format!("path pattern {text:?} must start with `~/`, `/` or `**/`"));
        };
        let glob = GlobBuilder::new(body)
            .literal_separator(true)
            .build()
            .map_err(|e| format!("bad glob {text:?}: {}", e.kind()))?;
        Ok(Pattern { text, anchor, glob })
    }
}

/// Who may touch a rule's targets. The first actor that matches the opening process decides.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "ActorDoc")]
pub struct Actor {
    pub who: Who,
    /// Only when the nearest package manager is one of these (empty: any).
    pub managers: Vec<String>,
    pub verdict: Verdict,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Who {
    /// The package-manager process itself (its own exec was the manager). With `outermost`,
    /// only a manager that no other manager started (`npm whoami` from a postinstall is not).
    Manager { outermost: bool },
    /// A process whose executable basename is in `execs`. With `via_manager`, every process
    /// between the nearest manager and it must be such a process too (npm → git → ssh), so
    /// package code cannot borrow the exemption by running its own `git`.
    Execs { execs: Vec<String>, via_manager: bool },
}

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
    managers: Vec<String>,
    verdict: Verdict,
}

impl TryFrom<ActorDoc> for Actor {
    type Error = &'static str;
    fn try_from(doc: ActorDoc) -> Result<Self, &'static str> {
        let who = match (doc.manager, doc.execs.is_empty()) {
            (true, true) if !doc.via_manager => Who::Manager { outermost: doc.outermost },
            (false, false) if !doc.outermost => Who::Execs { execs: doc.execs, via_manager: doc.via_manager },
            (true, true) => return Err("`via_manager` goes with `execs`, not with `manager`"),
            (false, false) => return Err("`outermost` goes with `manager: true`, not with `execs`"),
            _ => return Err("an actor needs exactly one of `manager: true` or `execs: [...]`"),
        };
        Ok(Actor { who, managers: doc.managers, verdict: doc.verdict })
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
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conditions {
    /// Nearest manager names (`run` for a `credwatch run` tree without one).
    #[serde(default)]
    pub managers: Vec<String>,
    /// Attributed lifecycle steps (`postinstall`, `build-script`, ...).
    #[serde(default)]
    pub lifecycles: Vec<String>,
    #[serde(default)]
    pub min_depth: Option<u32>,
    #[serde(default)]
    pub max_depth: Option<u32>,
    /// The path is under `/proc/<pid>/` of a process other than the opener.
    #[serde(default)]
    pub other_process: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "SamplesDoc")]
pub struct Samples {
    /// Must fire the rule.
    pub positive: Vec<Step>,
    /// Must not fire the rule.
    pub negative: Vec<Step>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SamplesDoc {
    positive: Vec<Step>,
    negative: Vec<Step>,
}

impl TryFrom<SamplesDoc> for Samples {
    type Error = &'static str;
    fn try_from(doc: SamplesDoc) -> Result<Self, &'static str> {
        match (doc.positive.is_empty(), doc.negative.is_empty()) {
            (false, false) => Ok(Samples { positive: doc.positive, negative: doc.negative }),
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
    Root(RootStep),
    Event(Box<Event>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepDoc {
    exec: Option<ExecStep>,
    fork: Option<ForkStep>,
    exit: Option<ExitStep>,
    open: Option<OpenStep>,
    root: Option<RootStep>,
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
            doc.root.map(Step::Root),
            doc.event.map(Step::Event),
        ];
        let mut set = steps.into_iter().flatten();
        match (set.next(), set.next()) {
            (Some(step), None) => Ok(step),
            _ => Err("a sample step is one of `exec`, `fork`, `exit`, `open`, `root` or `event`"),
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
    pub flags: u64,
}

fn default_ret() -> i64 {
    3
}
