//! One output's configuration (an entry of `outputs:`, or a `--to DEST`) and which alerts it takes.

use credwatch_core::alert::{Alert, Severity};
use serde::{Deserialize, Serialize};

use crate::destination::Destination;

/// Default bound of an output's in-memory queue, in alerts: a burst the output's task has not
/// yet taken to its spool (at most ~10 MiB of alerts). Past it, alerts go straight to the spool
/// from the engine's thread, which then pays a file write per alert (measured: 70 µs each with
/// a queue of 1024 under a flood of 100k, 5 µs with the queue taking the flood).
pub const DEFAULT_QUEUE: usize = 8192;
/// Default cap of an output's spool on disk.
pub const DEFAULT_SPOOL_MAX_BYTES: u64 = 256 << 20;
/// Default size at which a `file` output rotates, and the number of rotated files kept.
pub const DEFAULT_FILE_MAX_BYTES: u64 = 100 << 20;
pub const DEFAULT_FILE_KEEP: u32 = 5;

/// An output as configured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    /// Where: `file:PATH`, `syslog:tcp:HOST:PORT`, ... (see [`Destination`]).
    pub to: Destination,
    /// The least severe alerts sent (default: every alert).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_severity: Option<Severity>,
    /// Only alerts of these rule ids, or of [`OutputConfig::categories`] (default: every rule).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
    /// Only alerts of rules of these categories, or of [`OutputConfig::rules`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub categories: Vec<String>,
    /// The in-memory queue's bound, in alerts (default [`DEFAULT_QUEUE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<usize>,
    /// The spool's cap on disk, in bytes (default [`DEFAULT_SPOOL_MAX_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spool_max_bytes: Option<u64>,
    /// `file`: rotate when the file would pass this size (default [`DEFAULT_FILE_MAX_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// `file`: rotated files kept, `PATH.1` (newest) to `PATH.<keep>` (default [`DEFAULT_FILE_KEEP`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<u32>,
}

impl OutputConfig {
    /// An output with every knob at its default: `--to DEST`.
    pub fn to(destination: Destination) -> OutputConfig {
        OutputConfig {
            to: destination,
            min_severity: None,
            rules: Vec::new(),
            categories: Vec::new(),
            queue: None,
            spool_max_bytes: None,
            max_bytes: None,
            keep: None,
        }
    }

    /// What is wrong with the knobs for this kind of destination, each with its key.
    pub fn invalid(&self) -> Vec<(&'static str, String)> {
        let mut invalid = Vec::new();
        let is_file = matches!(self.to, Destination::File(_));
        if !is_file {
            for (key, set) in [("max_bytes", self.max_bytes.is_some()), ("keep", self.keep.is_some())] {
                if set {
                    invalid.push((key, format!("`{key}` is a knob of file outputs, not of {}", self.to)));
                }
            }
        }
        if self.max_bytes == Some(0) {
            invalid.push(("max_bytes", "0 bytes: a file could hold no alert".into()));
        }
        if self.queue == Some(0) {
            invalid.push(("queue", "a queue of 0 alerts".into()));
        }
        if self.spool_max_bytes == Some(0) {
            invalid.push(("spool_max_bytes", "a spool of 0 bytes".into()));
        }
        invalid
    }

    pub fn filter(&self) -> Filter {
        Filter { min_severity: self.min_severity, rules: self.rules.clone(), categories: self.categories.clone() }
    }
}

/// Which alerts an output takes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub min_severity: Option<Severity>,
    pub rules: Vec<String>,
    pub categories: Vec<String>,
}

impl Filter {
    /// At least the minimum severity, and, when rules or categories are named, of one of them. A
    /// sweep alert is of every rule and category it gathered, as well as of its own.
    pub fn takes(&self, alert: &Alert) -> bool {
        if self.min_severity.is_some_and(|min| alert.rule.severity < min) {
            return false;
        }
        if self.rules.is_empty() && self.categories.is_empty() {
            return true;
        }
        let sweep = alert.credwatch.sweep.as_ref();
        let rules = std::iter::once(&alert.rule.id).chain(sweep.into_iter().flat_map(|s| &s.rules));
        let categories = std::iter::once(&alert.rule.category).chain(sweep.into_iter().flat_map(|s| &s.categories));
        rules.into_iter().any(|id| self.rules.contains(id))
            || categories.into_iter().any(|category| self.categories.contains(category))
    }
}

#[cfg(test)]
mod tests {
    use credwatch_core::alert::AlertSweep;

    use super::*;
    use crate::tests::alert;

    #[test]
    fn severity_rules_and_categories() {
        let ssh = alert("ssh-private-key", "ssh", Severity::High);
        let npmrc = alert("npm-token", "package-registry", Severity::Medium);
        let all = Filter::default();
        assert!(all.takes(&ssh) && all.takes(&npmrc));
        let high = Filter { min_severity: Some(Severity::High), ..Filter::default() };
        assert!(high.takes(&ssh) && !high.takes(&npmrc));
        let critical = Filter { min_severity: Some(Severity::Critical), ..Filter::default() };
        assert!(!critical.takes(&ssh));
        let by_rule = Filter { rules: vec!["npm-token".into()], ..Filter::default() };
        assert!(!by_rule.takes(&ssh) && by_rule.takes(&npmrc));
        let by_category = Filter { categories: vec!["ssh".into()], ..Filter::default() };
        assert!(by_category.takes(&ssh) && !by_category.takes(&npmrc));
        // Rules or categories; the severity applies to both.
        let either = Filter {
            min_severity: Some(Severity::High),
            rules: vec!["npm-token".into()],
            categories: vec!["ssh".into()],
        };
        assert!(either.takes(&ssh) && !either.takes(&npmrc));
        // A sweep carries the rules and categories it gathered.
        let mut sweep = alert("credential-sweep", "sweep", Severity::Critical);
        sweep.credwatch.sweep = Some(AlertSweep {
            rules: vec!["ssh-private-key".into()],
            categories: vec!["ssh".into()],
            ..AlertSweep::default()
        });
        assert!(by_category.takes(&sweep) && !by_rule.takes(&sweep));
    }

    #[test]
    fn knobs_of_another_kind_are_refused() {
        let mut output = OutputConfig::to("syslog:udp:h:514".parse().unwrap());
        output.max_bytes = Some(10);
        output.keep = Some(2);
        let keys: Vec<&str> = output.invalid().iter().map(|(key, _)| *key).collect();
        assert_eq!(keys, ["max_bytes", "keep"]);
        let mut file = OutputConfig::to("file:/tmp/a".parse().unwrap());
        file.max_bytes = Some(10);
        file.keep = Some(0);
        assert!(file.invalid().is_empty());
        file.queue = Some(0);
        assert_eq!(file.invalid()[0].0, "queue");
    }
}
