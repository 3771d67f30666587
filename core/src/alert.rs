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
    /// The coding agent (Claude Code, Codex, ...) the process ran under, when one did: named
    /// before the package, which an agent's `npm install` may also have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coding_agent: Option<AlertCodingAgent>,
    pub host: AlertHost,
    /// The credwatch that raised it (a replay names the recording one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AlertAgent>,
    /// The container the acting process ran in (see [`crate::container`]); absent on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<AlertContainer>,
    /// Under Kubernetes: the pod (ECS `orchestrator.*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orchestrator: Option<AlertOrchestrator>,
    /// The CI job that started the package tree, from the tree root's environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci: Option<AlertCi>,
    pub user: AlertUser,
    pub credwatch: AlertCredwatch,
}

/// An event time (ns since the epoch) as an alert's timestamp.
pub fn rfc3339(time_ns: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(time_ns))
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

impl Alert {
    /// A digest of what makes this alert the one it is: the host, the event's time, the
    /// process, the rule, what it acted on, and the repeat count or the sweep summary's mark
    /// (two alerts differing only there are two alerts). The identity fields (`host.id`,
    /// `agent`, `container`, `orchestrator`, `ci`) are not in it: the pid, root and time already
    /// tell alerts apart, and ids stay what they were before those fields existed. Taken from the
    /// alert's own fields, not
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
        // Only on blind-spot alerts, so that every other alert keeps its id: their updates
        // differ by what they sum.
        let blind_spot = self.credwatch.blind_spot.as_ref().filter(|_| self.event.action == BLIND_SPOT_ACTION);
        let blind_spot = blind_spot.map(|b| format!("{}:{}:{}", b.cause.as_str(), b.reports, b.is_final));
        for part in parts.into_iter().chain(blind_spot.as_deref()) {
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
    /// `alerted`, `blocked` when the kernel killed the process before the syscall ran, or
    /// `denied` when a BPF LSM hook refused it with EPERM and the process lives.
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

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertCodingAgent {
    /// The agent's name in the rules (`claude`, `codex`, `gemini`, `cursor-agent`, `copilot`).
    pub name: String,
    pub pid: u32,
    /// The command the agent ran that led to this process (its child on the way down), as
    /// argv; absent when the agent itself acted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AlertHost {
    pub name: String,
    /// The machine id (`/etc/machine-id`), when the agent could read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertAgent {
    /// credwatch's version.
    pub version: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertContainer {
    /// The full id (64 hex digits).
    pub id: String,
    /// `docker`, `containerd`, `cri-o`, `podman`, or `cri` for a Kubernetes container whose
    /// cgroup does not say which CRI runtime (containerd or cri-dockerd); absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertOrchestrator {
    /// `kubernetes`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The pod's namespace, where the trace states it (a cgroup does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub resource: AlertResource,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertResource {
    /// `pod`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The pod's uid; absent where only its name is known (Tetragon's events name no uid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The pod's name, where the trace states it (a cgroup names the uid only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl AlertOrchestrator {
    /// The pod for people: `<namespace>/<name> (<uid>)` with what is known, the bare uid when
    /// only the uid is (from a cgroup). Not escaped.
    pub fn pod_label(&self) -> String {
        let name = match (&self.namespace, &self.resource.name) {
            (Some(namespace), Some(name)) => Some(format!("{namespace}/{name}")),
            (None, Some(name)) => Some(name.clone()),
            _ => None,
        };
        match (name, &self.resource.id) {
            (Some(name), Some(uid)) => format!("{name} ({uid})"),
            (Some(name), None) => name,
            (None, Some(uid)) => uid.clone(),
            (None, None) => String::new(),
        }
    }
}

impl AlertContainer {
    /// `container` and `orchestrator` of a process in `container`.
    pub fn with_pod(container: &crate::container::ContainerIdentity) -> (AlertContainer, Option<AlertOrchestrator>) {
        let pod = container.pod_uid.as_ref().map(|uid| AlertOrchestrator {
            kind: "kubernetes".into(),
            namespace: None,
            resource: AlertResource { kind: "pod".into(), id: Some(uid.clone()), name: None },
        });
        (AlertContainer { id: container.id.clone(), runtime: container.runtime.map(str::to_owned) }, pod)
    }

    /// `container` and `orchestrator` of a process in a container a foreign trace states.
    pub fn stated(stated: &crate::event::StatedContainer) -> (AlertContainer, Option<AlertOrchestrator>) {
        let pod = (stated.pod_uid.is_some() || stated.pod_name.is_some()).then(|| AlertOrchestrator {
            kind: "kubernetes".into(),
            namespace: stated.namespace.clone(),
            resource: AlertResource { kind: "pod".into(), id: stated.pod_uid.clone(), name: stated.pod_name.clone() },
        });
        (AlertContainer { id: stated.id.clone(), runtime: stated.runtime.clone() }, pod)
    }
}

/// The CI job a package tree ran in. The same names for every provider; each field is there
/// only when the provider sets its variable.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertCi {
    /// `github` (GitHub Actions) or `gitlab` (GitLab CI).
    pub provider: String,
    /// `GITHUB_SERVER_URL`, `CI_SERVER_URL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_url: Option<String>,
    /// `GITHUB_REPOSITORY` (`owner/name`), `CI_PROJECT_PATH` (`group/project`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// `GITHUB_WORKFLOW`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    /// `GITHUB_RUN_ID`, `CI_PIPELINE_ID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// `GITHUB_RUN_ATTEMPT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_attempt: Option<String>,
    /// The job's name: `GITHUB_JOB` (its key in the workflow), `CI_JOB_NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// `CI_JOB_ID` (GitHub sets no job id in the environment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// `RUNNER_NAME`, `CI_RUNNER_DESCRIPTION`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<String>,
}

impl AlertCi {
    /// The job named by an environment, when it is a GitHub Actions (`GITHUB_ACTIONS=true`) or
    /// GitLab CI (`GITLAB_CI=true`) job's.
    pub fn from_env(env: &std::collections::BTreeMap<String, String>) -> Option<AlertCi> {
        let get = |key: &str| env.get(key).filter(|value| !value.is_empty()).cloned();
        if env.get("GITHUB_ACTIONS").is_some_and(|v| v == "true") {
            Some(AlertCi {
                provider: "github".into(),
                server_url: get("GITHUB_SERVER_URL"),
                repository: get("GITHUB_REPOSITORY"),
                workflow: get("GITHUB_WORKFLOW"),
                run_id: get("GITHUB_RUN_ID"),
                run_attempt: get("GITHUB_RUN_ATTEMPT"),
                job: get("GITHUB_JOB"),
                job_id: None,
                runner: get("RUNNER_NAME"),
            })
        } else if env.get("GITLAB_CI").is_some_and(|v| v == "true") {
            Some(AlertCi {
                provider: "gitlab".into(),
                server_url: get("CI_SERVER_URL"),
                repository: get("CI_PROJECT_PATH"),
                workflow: None,
                run_id: get("CI_PIPELINE_ID"),
                run_attempt: None,
                job: get("CI_JOB_NAME"),
                job_id: get("CI_JOB_ID"),
                runner: get("CI_RUNNER_DESCRIPTION"),
            })
        } else {
            None
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlertUser {
    pub id: u32,
}

/// credwatch's own fields.
/// `enforcement` of a write a read-only mount refused (EROFS): nothing was written.
pub const READ_ONLY_MOUNT: &str = "read-only-mount";
/// `event.action` of a blind-spot alert: about a tree's unseen acts, not one act.
pub const BLIND_SPOT_ACTION: &str = "blind_spot";
/// `enforcement` suffix of what the kernel refused, killed or held because no agent had read
/// its rings for a while (`--enforce` fails closed): `kernel-fail-closed`, `lsm-fail-closed`.
pub const FAIL_CLOSED: &str = "fail-closed";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AlertCredwatch {
    /// pid of the tree's root.
    pub root_pid: u32,
    /// What to rotate or check now, for a person to act on.
    pub rotate: Vec<String>,
    /// Whether this match could have been blocked in the kernel (`kernel`: a kill; `lsm`: a
    /// BPF LSM refusal; `kernel-hold`: a held connect) or only alerted on (`userspace`); what
    /// refused it otherwise (`proxy`: `--contain-net`'s; [`READ_ONLY_MOUNT`]: a write the file
    /// system refused, as `run --contain`'s home does).
    pub enforcement: String,
    /// `run --contain`: the file (every file, for a sweep) was one the box had replaced by an
    /// empty one, so the credential was not read and nothing is to rotate for it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub contained: bool,
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
    /// The tree is one `credwatch selftest` registered with the agent: a rehearsal of an attack
    /// on fake credentials, not an incident.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub selftest: bool,
    /// On a blind-spot alert (what was missed of the tree, and when); on a connect alert that
    /// counts the tree as having touched credentials because a process of it went unmarked:
    /// that blind spot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blind_spot: Option<AlertBlindSpot>,
}

/// How acts of a tree went unseen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlindSpotCause {
    /// The kernel could not send records (a ring was full).
    #[default]
    Lost,
    /// A ring overflowed as the agent read it.
    Overflow,
    /// A process went unmarked: the kernel's table of watched processes was full.
    MarksFull,
    /// The agent was down or stopped: nothing read the rings.
    Gap,
}

impl BlindSpotCause {
    pub const ALL: [BlindSpotCause; 4] =
        [BlindSpotCause::Lost, BlindSpotCause::Overflow, BlindSpotCause::MarksFull, BlindSpotCause::Gap];

    pub fn as_str(self) -> &'static str {
        match self {
            BlindSpotCause::Lost => "lost",
            BlindSpotCause::Overflow => "overflow",
            BlindSpotCause::MarksFull => "marks_full",
            BlindSpotCause::Gap => "gap",
        }
    }
}

impl From<crate::event::BlindCause> for BlindSpotCause {
    fn from(cause: crate::event::BlindCause) -> BlindSpotCause {
        match cause {
            crate::event::BlindCause::Lost => BlindSpotCause::Lost,
            crate::event::BlindCause::Overflow => BlindSpotCause::Overflow,
            crate::event::BlindCause::MarksFull => BlindSpotCause::MarksFull,
        }
    }
}

/// What a blind-spot alert says was missed (see [`AlertCredwatch::blind_spot`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AlertBlindSpot {
    pub cause: BlindSpotCause,
    /// RFC 3339: the first and last loss (for a gap: the agent's last sign of life, and when it
    /// read again).
    pub since: String,
    pub until: String,
    pub seconds: f64,
    /// Records lost, by kind (`exec`, `open`, `credential_open`, `connect`, `mark`, ...); empty
    /// for a gap, whose records the kernel kept.
    pub counts: std::collections::BTreeMap<String, u64>,
    /// A lost record was an open of a credential file.
    pub credential: bool,
    /// A gap: the same agent was stopped (SIGSTOP, a freezer, a hung disk), not restarted.
    pub stopped: bool,
    /// The named packages the tree ran (the first 16), the alert's `package` the latest of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<AlertPackage>,
    /// The sensor's reports summed into this alert: a tree's losses are reported at each poll
    /// while they last.
    pub reports: u64,
    /// The sum since the alert that went out first, when the tree or the stream ended.
    #[serde(rename = "final", default, skip_serializing_if = "std::ops::Not::not")]
    pub is_final: bool,
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
    /// The same agent was stopped (SIGSTOP, a freezer, a hung disk), not restarted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
}

/// Where a connect went.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertDestination {
    /// The IP address, or a unix socket's path.
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The name the process looked up last before it connected (see docs/src/catches.md), when any.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::attribution_env;

    /// Every variable `from_env` reads, through the sensor's filter (`ATTRIBUTION_ENV`).
    fn through_sensor(vars: &[(&str, &str)]) -> Option<AlertCi> {
        let block: Vec<u8> = vars.iter().flat_map(|(key, value)| format!("{key}={value}\0").into_bytes()).collect();
        AlertCi::from_env(&attribution_env(&block))
    }

    #[test]
    fn names_a_github_actions_job() {
        let ci = through_sensor(&[
            ("GITHUB_ACTIONS", "true"),
            ("GITHUB_SERVER_URL", "https://github.com"),
            ("GITHUB_REPOSITORY", "octo/app"),
            ("GITHUB_WORKFLOW", "CI"),
            ("GITHUB_RUN_ID", "1234567890"),
            ("GITHUB_RUN_ATTEMPT", "2"),
            ("GITHUB_JOB", "build"),
            ("RUNNER_NAME", "GitHub Actions 7"),
            ("GITHUB_TOKEN", "ghs_secret"),
            ("CI_JOB_ID", "not GitLab's"),
        ]);
        let expected = AlertCi {
            provider: "github".into(),
            server_url: Some("https://github.com".into()),
            repository: Some("octo/app".into()),
            workflow: Some("CI".into()),
            run_id: Some("1234567890".into()),
            run_attempt: Some("2".into()),
            job: Some("build".into()),
            job_id: None,
            runner: Some("GitHub Actions 7".into()),
        };
        assert_eq!(ci, Some(expected));
    }

    #[test]
    fn names_a_gitlab_ci_job_and_absent_variables_are_absent() {
        let ci = through_sensor(&[
            ("GITLAB_CI", "true"),
            ("CI_SERVER_URL", "https://gitlab.example"),
            ("CI_PROJECT_PATH", "group/project"),
            ("CI_PIPELINE_ID", "77"),
            ("CI_JOB_NAME", "test"),
            ("CI_JOB_ID", "991"),
            ("CI_RUNNER_DESCRIPTION", "shared-runner-3"),
        ])
        .unwrap();
        assert_eq!(
            (ci.provider.as_str(), ci.repository.as_deref(), ci.run_id.as_deref(), ci.job.as_deref()),
            ("gitlab", Some("group/project"), Some("77"), Some("test"))
        );
        assert_eq!((ci.job_id.as_deref(), ci.runner.as_deref()), (Some("991"), Some("shared-runner-3")));
        assert_eq!(ci.server_url.as_deref(), Some("https://gitlab.example"));
        let json = serde_json::to_value(through_sensor(&[("GITLAB_CI", "true"), ("CI_JOB_NAME", "")])).unwrap();
        assert_eq!(json, serde_json::json!({"provider": "gitlab"}));
    }

    #[test]
    fn no_ci_without_the_providers_flag() {
        assert_eq!(through_sensor(&[("GITHUB_REPOSITORY", "octo/app"), ("CI_JOB_ID", "3")]), None);
        assert_eq!(through_sensor(&[("GITHUB_ACTIONS", "false")]), None);
        assert_eq!(through_sensor(&[("GITLAB_CI", "1")]), None);
    }
}
