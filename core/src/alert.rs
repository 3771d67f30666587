//! The alert: one JSON object per line, ECS-style. The field names are a contract that other
//! tools rely on; add fields freely, never rename or remove one.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Low,
    Medium,
    High,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
            Severity::Critical => "critical",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    /// RFC 3339 time of the event that fired the rule.
    #[serde(rename = "@timestamp")]
    pub timestamp: String,
    pub event: AlertEvent,
    pub rule: AlertRule,
    pub process: AlertProcess,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<AlertFile>,
    /// On a connect alert: where the process connected (ECS `destination`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<AlertDestination>,
    pub package: AlertPackage,
    pub host: AlertHost,
    pub user: AlertUser,
    pub credwatch: AlertCredwatch,
}

impl Alert {
    /// A digest of what makes this alert the one it is: the host, the event's time, the
    /// process, the rule, what it acted on, and the repeat count or the sweep summary's mark
    /// (two alerts differing only there are two alerts). Taken from the alert's own fields, not
    /// from the agent's state, so the same event gives the same id live, replayed, and after a
    /// restart. 128 bits of SHA-256, in hex.
    pub fn stable_id(&self) -> String {
        use sha2::Digest as _;
        let mut digest = sha2::Sha256::new();
        let file = self.file.as_ref();
        let destination = self.destination.as_ref();
        let parts = [
            self.host.name.as_str(),
            self.timestamp.as_str(),
            &self.process.pid.to_string(),
            &self.credwatch.root_pid.to_string(),
            self.rule.id.as_str(),
            self.event.action.as_str(),
            self.event.outcome.as_str(),
            file.map_or("", |f| f.path.as_str()),
            file.and_then(|f| f.renamed_from.as_deref()).unwrap_or(""),
            file.and_then(|f| f.renamed_to.as_deref()).unwrap_or(""),
            destination.map_or("", |d| d.address.as_str()),
            &destination.and_then(|d| d.port).map(|p| p.to_string()).unwrap_or_default(),
            &self.credwatch.count.map(|c| c.to_string()).unwrap_or_default(),
            match &self.credwatch.sweep {
                Some(sweep) if sweep.is_final => "final",
                Some(_) => "sweep",
                None => "",
            },
        ];
        for part in parts {
            // Length-prefixed, so that no two different field lists hash the same bytes.
            digest.update((part.len() as u64).to_le_bytes());
            digest.update(part.as_bytes());
        }
        hex::encode(&digest.finalize()[..16])
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlertEvent {
    /// The alert's stable id ([`Alert::stable_id`]): the same for the same alert wherever and
    /// however often it is sent (a retry, a spool replayed after a restart, a replay of the
    /// trace), so that receivers dedup on it. Empty only in alerts written before it existed.
    #[serde(default)]
    pub id: String,
    /// Always `"alert"`.
    pub kind: String,
    /// What triggered the rule: `open`, `exec`, `rename`, `link`, `symlink` or `syscall`.
    pub action: String,
    /// `alerted`, or `blocked` when the kernel killed the process before the syscall ran.
    pub outcome: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlertRule {
    pub id: String,
    pub name: String,
    pub category: String,
    pub severity: Severity,
    pub description: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlertProcess {
    pub pid: u32,
    pub executable: String,
    pub args: Vec<String>,
    pub working_directory: String,
    pub parent: AlertParent,
    /// Root (the package manager, or CMD under `run`) first, down to the parent.
    pub ancestors: Vec<AlertAncestor>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlertParent {
    pub pid: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlertAncestor {
    pub pid: u32,
    pub executable: String,
    pub args: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AlertFile {
    /// Absolute path of the file the kernel opened (or, when unresolved, the path as given).
    pub path: String,
    /// The path exactly as the process gave it to the syscall.
    pub given_path: String,
    /// `O_*` open flags, symbolic (`O_RDONLY|O_CLOEXEC`); empty for a rename or link.
    pub flags: String,
    /// The credential file this one is (same device and inode: a hardlink, a moved copy, a
    /// bind mount), when the rule matched that file rather than `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_file_as: Option<String>,
    /// For a rename or link onto `path`: where it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renamed_from: Option<String>,
    /// For a rename or link of `path` (a credential file) elsewhere: where it went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renamed_to: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AlertPackage {
    /// `npm`, `yarn`, `pnpm`, `bun`, `cargo`, `pip`, `uv`, `poetry`, or `run` for a CMD tree.
    pub manager: String,
    pub name: Option<String>,
    pub version: Option<String>,
    /// `preinstall`, `install`, `postinstall`, `prepare`, `build-script`, `proc-macro`,
    /// `setup.py`, `build-backend`, ... when known.
    pub lifecycle: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlertHost {
    pub name: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlertUser {
    pub id: u32,
}

/// credwatch's own fields.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AlertCredwatch {
    /// pid of the tree's root.
    pub root_pid: u32,
    /// What to rotate or check now, for a person to act on.
    pub rotate: Vec<String>,
    /// Whether this match could have been blocked in the kernel (`kernel`) or only alerted on
    /// (`userspace`).
    pub enforcement: String,
    /// On a repeat of an identical alert (same rule, tree and file or command): how many
    /// times it has happened. Repeats are reported at the 10th, 100th, 1000th, ... time only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// On a credential sweep alert: what the tree touched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<AlertSweep>,
    /// On a syscall alert: the syscall.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall: Option<AlertSyscall>,
    /// On an exec alert about a file the tree wrote: that file (the program or its script).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_file: Option<String>,
    /// Why the alert is at a lower severity than its rule's (an actor of the rule judged it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// On an exfiltration alert: the credential files the tree's package code had opened before
    /// (the first ones, at most 32).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials_touched: Vec<String>,
    /// On an alert about something done while the agent was down (killed, crashed, stopped):
    /// the gap, which the kernel side recorded through and the restarted agent caught up on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gap: Option<AlertGap>,
}

/// The time the agent was down (see [`AlertCredwatch::gap`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AlertGap {
    /// RFC 3339: the agent's last sign of life (its last heartbeat, or its clean stop).
    pub down_from: String,
    /// RFC 3339: when the restarted agent took over.
    pub down_to: String,
    pub seconds: f64,
    /// The agent before stopped cleanly (SIGTERM) rather than died.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clean_stop: bool,
}

/// Where a connect went.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertDestination {
    /// The IP address, or a unix socket's path.
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The name the process looked up last before it connected (see the README), when any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// `inet`, `inet6` or `unix`.
    pub family: String,
    /// `stream` (TCP for inet), `dgram` (UDP), ... when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_type: Option<String>,
}

/// One tree reading many kinds of credentials.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AlertSweep {
    /// Credential categories touched, sorted.
    pub categories: Vec<String>,
    /// Ids of the rules that fired, sorted.
    pub rules: Vec<String>,
    /// The files opened, in the order first seen (at most 100).
    pub files: Vec<String>,
    /// Further files (beyond `files`) folded into the sweep.
    pub files_not_listed: u64,
    /// Credential alerts of the tree folded into the sweep after it fired (not printed).
    pub folded: u64,
    /// `folded`, by category.
    pub folded_by_category: std::collections::BTreeMap<String, u64>,
    /// The window the categories fell in.
    pub window_s: u64,
    /// The final summary, emitted when the tree ends or the stream does (`false` on the alert
    /// that started the sweep).
    #[serde(rename = "final")]
    pub is_final: bool,
}

/// The syscall a syscall alert is about.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertSyscall {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// The process it acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_pid: Option<u32>,
    /// The result or `-errno`; absent when the process was killed before it returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ret: Option<i64>,
}
