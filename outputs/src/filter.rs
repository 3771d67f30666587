//! One output's configuration (an entry of `outputs:`, or a `--to DEST`) and which alerts it takes.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use credwatch_core::alert::{Alert, Severity};
use serde::{Deserialize, Serialize};

use crate::{
    destination::Destination,
    nats::NatsOptions,
    syslog::{Facility, SyslogFormat, SyslogOptions},
    webhook::{WebhookFormat, WebhookOptions},
};

/// Default bound of an output's in-memory queue, in alerts: a burst the output's task has not
/// yet taken to its spool (at most ~10 MiB of alerts). Past it, the engine's thread appends
/// alerts to the spool's buffered writer itself (measured: 2-7 µs each, rendering included).
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
    /// `syslog`: `rfc5424` (default, with structured data) or `rfc3164`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<SyslogFormat>,
    /// `syslog`: the facility (default `authpriv`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facility: Option<Facility>,
    /// `syslog`: the longest message in bytes (default by transport: see the syslog module).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_message: Option<usize>,
    /// `syslog`: seconds a connect, a write or (RELP) an answer may make no progress (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    /// `webhook`: a batch as one NDJSON request rather than one request per alert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ndjson: Option<bool>,
    /// `webhook`, `falcosidekick`: sent as `Authorization: Bearer TOKEN`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token: Option<String>,
    /// `webhook`, `falcosidekick`: further headers on every request.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// `webhook`, `falcosidekick`, `nats`: trust only the CA certificates of this PEM file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// `webhook`, `falcosidekick`, `nats`: seconds to connect (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<f64>,
    /// `webhook`, `falcosidekick`: seconds for a whole request (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout: Option<f64>,
    /// `nats`: a `.creds` file (JWT and NKey seed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_file: Option<PathBuf>,
    /// `nats`: a token to authenticate with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// `nats`: TLS even for a `nats://` URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_tls: Option<bool>,
    /// `nats`: seconds to wait for the stream's acknowledgement (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_timeout: Option<f64>,
}

/// The kinds of output, for the knobs that belong to some only.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Syslog,
    Webhook,
    Nats,
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
            format: None,
            facility: None,
            max_message: None,
            timeout: None,
            ndjson: None,
            bearer_token: None,
            headers: BTreeMap::new(),
            ca_file: None,
            connect_timeout: None,
            request_timeout: None,
            credentials_file: None,
            token: None,
            require_tls: None,
            ack_timeout: None,
        }
    }

    fn kind(&self) -> Kind {
        match self.to {
            Destination::File(_) => Kind::File,
            Destination::Syslog(_) => Kind::Syslog,
            Destination::Webhook(_) | Destination::Falcosidekick(_) => Kind::Webhook,
            Destination::Nats { .. } => Kind::Nats,
        }
    }

    /// The knobs set, each with the kinds of output it belongs to.
    fn knobs(&self) -> [(&'static str, bool, &'static [Kind]); 18] {
        use Kind::*;
        [
            ("max_bytes", self.max_bytes.is_some(), &[File]),
            ("keep", self.keep.is_some(), &[File]),
            ("format", self.format.is_some(), &[Syslog]),
            ("facility", self.facility.is_some(), &[Syslog]),
            ("max_message", self.max_message.is_some(), &[Syslog]),
            ("timeout", self.timeout.is_some(), &[Syslog]),
            ("ndjson", self.ndjson.is_some(), &[Webhook]),
            ("bearer_token", self.bearer_token.is_some(), &[Webhook]),
            ("headers", !self.headers.is_empty(), &[Webhook]),
            ("ca_file", self.ca_file.is_some(), &[Webhook, Nats]),
            ("connect_timeout", self.connect_timeout.is_some(), &[Webhook, Nats]),
            ("request_timeout", self.request_timeout.is_some(), &[Webhook]),
            ("credentials_file", self.credentials_file.is_some(), &[Nats]),
            ("token", self.token.is_some(), &[Nats]),
            ("require_tls", self.require_tls.is_some(), &[Nats]),
            ("ack_timeout", self.ack_timeout.is_some(), &[Nats]),
            ("queue", self.queue.is_some(), &[File, Syslog, Webhook, Nats]),
            ("spool_max_bytes", self.spool_max_bytes.is_some(), &[File, Syslog, Webhook, Nats]),
        ]
    }

    /// `syslog`'s options, defaults where a knob is not set.
    pub fn syslog_options(&self) -> SyslogOptions {
        let default = SyslogOptions::default();
        SyslogOptions {
            format: self.format.unwrap_or(default.format),
            facility: self.facility.unwrap_or(default.facility),
            max_message: self.max_message,
            timeout: seconds(self.timeout).unwrap_or(default.timeout),
        }
    }

    /// `webhook`'s or `falcosidekick`'s options.
    pub fn webhook_options(&self, format: WebhookFormat) -> WebhookOptions {
        let default = WebhookOptions::default();
        WebhookOptions {
            format,
            ndjson: self.ndjson.unwrap_or(default.ndjson),
            bearer_token: self.bearer_token.clone(),
            headers: self.headers.iter().map(|(name, value)| (name.clone(), value.clone())).collect(),
            ca_file: self.ca_file.clone(),
            connect_timeout: seconds(self.connect_timeout).unwrap_or(default.connect_timeout),
            request_timeout: seconds(self.request_timeout).unwrap_or(default.request_timeout),
        }
    }

    pub fn nats_options(&self) -> NatsOptions {
        let default = NatsOptions::default();
        NatsOptions {
            credentials_file: self.credentials_file.clone(),
            token: self.token.clone(),
            require_tls: self.require_tls.unwrap_or(default.require_tls),
            ca_file: self.ca_file.clone(),
            connect_timeout: seconds(self.connect_timeout).unwrap_or(default.connect_timeout),
            ack_timeout: seconds(self.ack_timeout).unwrap_or(default.ack_timeout),
        }
    }

    /// What is wrong with the knobs for this kind of destination, each with its key.
    pub fn invalid(&self) -> Vec<(&'static str, String)> {
        let mut invalid = Vec::new();
        let kind = self.kind();
        for (key, set, kinds) in self.knobs() {
            if set && !kinds.contains(&kind) {
                let of = match kinds {
                    [Kind::File] => "file outputs",
                    [Kind::Syslog] => "syslog outputs",
                    [Kind::Webhook] => "webhook and falcosidekick outputs",
                    [Kind::Nats] => "nats outputs",
                    _ => "webhook, falcosidekick and nats outputs",
                };
                invalid.push((key, format!("`{key}` is a knob of {of}, not of {}", self.to)));
            }
        }
        for (key, value) in [
            ("timeout", self.timeout),
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
            ("ack_timeout", self.ack_timeout),
        ] {
            if value.is_some() && seconds(value).is_none() {
                invalid.push((key, format!("{} is not a number of seconds above 0", value.unwrap_or_default())));
            }
        }
        // Read by the transport at start-up; missing, `config check` says so too, at its key.
        for (key, path) in [("ca_file", &self.ca_file), ("credentials_file", &self.credentials_file)] {
            if let Some(path) = path.as_ref().filter(|path| !path.is_file()) {
                invalid.push((key, format!("{} is not a file", path.display())));
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

/// Seconds as a duration: `None` when not set, or not a number above 0.
fn seconds(value: Option<f64>) -> Option<Duration> {
    value.filter(|s| s.is_finite() && *s > 0.0).and_then(|s| Duration::try_from_secs_f64(s).ok())
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
        output.token = Some("t".into());
        output.facility = Some(Facility::Local0);
        let keys: Vec<&str> = output.invalid().iter().map(|(key, _)| *key).collect();
        assert_eq!(keys, ["max_bytes", "keep", "token"]);
        let mut nats = OutputConfig::to("nats:nats://127.0.0.1:4222/alerts".parse().unwrap());
        nats.ca_file = Some("/ca.pem".into());
        nats.bearer_token = Some("t".into());
        nats.ack_timeout = Some(0.0);
        let invalid = nats.invalid();
        let keys: Vec<&str> = invalid.iter().map(|(key, _)| *key).collect();
        assert_eq!(keys, ["bearer_token", "ack_timeout", "ca_file"]);
        assert!(invalid[0].1.contains("webhook and falcosidekick"), "{}", invalid[0].1);
        assert_eq!(invalid[2].1, "/ca.pem is not a file");
        let mut file = OutputConfig::to("file:/tmp/a".parse().unwrap());
        file.max_bytes = Some(10);
        file.keep = Some(0);
        assert!(file.invalid().is_empty());
        file.queue = Some(0);
        assert_eq!(file.invalid()[0].0, "queue");
    }

    #[test]
    fn every_network_output_has_its_timeouts() {
        let mut nats = OutputConfig::to("nats:nats://127.0.0.1:4222/alerts".parse().unwrap());
        nats.connect_timeout = Some(1.5);
        nats.ack_timeout = Some(2.0);
        assert!(nats.invalid().is_empty(), "{:?}", nats.invalid());
        let options = nats.nats_options();
        assert_eq!(
            (options.connect_timeout, options.ack_timeout),
            (Duration::from_millis(1500), Duration::from_secs(2))
        );
        let mut webhook = OutputConfig::to("falcosidekick:http://127.0.0.1:2801/".parse().unwrap());
        webhook.connect_timeout = Some(1.0);
        webhook.request_timeout = Some(3.0);
        let options = webhook.webhook_options(WebhookFormat::Falcosidekick);
        assert_eq!(
            (options.connect_timeout, options.request_timeout),
            (Duration::from_secs(1), Duration::from_secs(3))
        );
        let mut syslog = OutputConfig::to("syslog:tcp:127.0.0.1:514".parse().unwrap());
        syslog.timeout = Some(0.5);
        syslog.connect_timeout = Some(1.0);
        assert_eq!(syslog.syslog_options().timeout, Duration::from_millis(500));
        let invalid = syslog.invalid();
        assert_eq!(invalid.len(), 1, "{invalid:?}");
        assert_eq!(invalid[0].0, "connect_timeout");
        assert!(invalid[0].1.contains("a knob of webhook, falcosidekick and nats outputs"), "{}", invalid[0].1);
    }
}
