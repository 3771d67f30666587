//! The alert in Falco's shape, for a Falcosidekick already deployed: it takes what Falco POSTs
//! (`output`, `priority`, `rule`, `time`, `output_fields`, `source`, `tags`, `hostname`; its
//! `types.FalcoPayload`) and forwards it to every destination it knows, unchanged.
//!
//! What Falcosidekick checks (its handler and `FalcoPayload.Check`): one JSON object per request
//! (it decodes the first and ignores the rest, so never NDJSON), a priority it knows, a rule, a
//! non-zero time and at least one output field. It replaces `uuid` with its own, so credwatch's id
//! travels as the output field `credwatch.id`.

use std::collections::BTreeMap;

use credwatch_core::alert::{Alert, Severity};
use serde::Serialize;
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{OffsetDateTime, UtcOffset};

use crate::Outgoing;

/// Falco's `source` for credwatch's alerts (Falco's own are `syscall`, `k8s_audit`, ...).
pub const SOURCE: &str = "credwatch";

/// An alert as Falco sends it to Falcosidekick.
#[derive(Debug, Serialize)]
pub struct FalcoPayload {
    pub output: String,
    pub priority: &'static str,
    pub rule: String,
    /// RFC 3339 in UTC with nanoseconds, as Falco writes it.
    pub time: String,
    pub output_fields: BTreeMap<&'static str, Value>,
    pub source: &'static str,
    pub tags: Vec<String>,
    pub hostname: String,
}

#[derive(Debug, thiserror::Error)]
pub enum FalcoError {
    #[error("alert {id}: not an alert's JSON: {source}")]
    Json { id: String, source: serde_json::Error },
    #[error("alert {id}: @timestamp {time:?} is not RFC 3339: {source}")]
    Time { id: String, time: String, source: time::error::Parse },
}

/// Falco's priority for a credwatch severity. Falco has eight (Emergency .. Debug); credwatch's
/// four map onto the ones Falco's own rules use, so Falcosidekick's `minimumpriority` filters
/// behave as they do for Falco: critical is Critical, high Error, medium Warning, low Notice.
pub fn priority(severity: Severity) -> &'static str {
    match severity {
        Severity::Critical => "Critical",
        Severity::High => "Error",
        Severity::Medium => "Warning",
        Severity::Low => "Notice",
    }
}

/// Translates one outgoing alert (its ECS JSON) into Falco's shape.
pub fn payload(alert: &Outgoing) -> Result<FalcoPayload, FalcoError> {
    let parsed: Alert =
        serde_json::from_slice(&alert.json).map_err(|source| FalcoError::Json { id: alert.id.clone(), source })?;
    let time = falco_time(&parsed.timestamp).map_err(|source| FalcoError::Time {
        id: alert.id.clone(),
        time: parsed.timestamp.clone(),
        source,
    })?;
    Ok(FalcoPayload {
        output: output(&parsed),
        priority: priority(parsed.rule.severity),
        rule: parsed.rule.name.clone(),
        time,
        output_fields: output_fields(&alert.id, &parsed),
        source: SOURCE,
        tags: vec![parsed.rule.category.clone(), SOURCE.to_string()],
        hostname: parsed.host.name.clone(),
    })
}

/// Falco writes `time` in UTC with all nine digits of the nanoseconds.
fn falco_time(timestamp: &str) -> Result<String, time::error::Parse> {
    let utc = OffsetDateTime::parse(timestamp, &Rfc3339)?.to_offset(UtcOffset::UTC);
    let format = format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:9]Z");
    // Formatting a parsed date with a fixed all-numeric format cannot fail.
    Ok(utc.format(&format).unwrap_or_else(|_| timestamp.to_string()))
}

/// The executable's file name: Falco's `proc.name`.
fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// One line as Falco's outputs read: what happened, then `field=value` pairs.
fn output(alert: &Alert) -> String {
    let package = match (&alert.package.name, &alert.package.version) {
        (Some(name), Some(version)) => format!("{name}@{version}"),
        (Some(name), None) => name.clone(),
        _ => "(unknown)".to_string(),
    };
    let mut line = format!("{} (package={package} manager={}", alert.rule.name, alert.package.manager);
    if let Some(lifecycle) = &alert.package.lifecycle {
        line.push_str(&format!(" lifecycle={lifecycle}"));
    }
    if let Some(file) = &alert.file {
        line.push_str(&format!(" file={}", file.path));
    }
    if let Some(destination) = &alert.destination {
        match destination.port {
            Some(port) => line.push_str(&format!(" connection={}:{port}", destination.address)),
            None => line.push_str(&format!(" connection={}", destination.address)),
        }
    }
    line.push_str(&format!(
        " proc.name={} proc.pid={} rule={} outcome={})",
        base_name(&alert.process.executable),
        alert.process.pid,
        alert.rule.id,
        alert.event.outcome
    ));
    line
}

/// Falco's field names where Falco has the field, `credwatch.*` for the rest.
fn output_fields(id: &str, alert: &Alert) -> BTreeMap<&'static str, Value> {
    let mut fields = BTreeMap::new();
    let process = &alert.process;
    fields.insert("evt.type", Value::from(alert.event.action.clone()));
    fields.insert("proc.name", Value::from(base_name(&process.executable)));
    fields.insert("proc.exepath", Value::from(process.executable.clone()));
    // Falco's proc.cmdline is the name and the arguments after argv[0].
    let mut cmdline = base_name(&process.executable).to_string();
    for arg in process.args.iter().skip(1) {
        cmdline.push(' ');
        cmdline.push_str(arg);
    }
    fields.insert("proc.cmdline", Value::from(cmdline));
    fields.insert("proc.pid", Value::from(process.pid));
    fields.insert("proc.ppid", Value::from(process.parent.pid));
    fields.insert("proc.cwd", Value::from(process.working_directory.clone()));
    if let Some(parent) = process.ancestors.last() {
        fields.insert("proc.pname", Value::from(base_name(&parent.executable)));
    }
    fields.insert("user.uid", Value::from(alert.user.id));
    if let Some(file) = &alert.file {
        fields.insert("fd.name", Value::from(file.path.clone()));
    }
    if let Some(destination) = &alert.destination {
        fields.insert("fd.rip", Value::from(destination.address.clone()));
        if let Some(port) = destination.port {
            fields.insert("fd.rport", Value::from(port));
        }
        if let Some(domain) = &destination.domain {
            fields.insert("fd.rip.name", Value::from(domain.clone()));
        }
    }
    if let Some(container) = &alert.container {
        // Falco's `container.id` is the id's first 12 digits, `container.full_id` all of them.
        fields.insert("container.id", Value::from(container.id.chars().take(12).collect::<String>()));
        fields.insert("container.full_id", Value::from(container.id.clone()));
        if let Some(runtime) = &container.runtime {
            fields.insert("container.type", Value::from(runtime.clone()));
        }
    }
    if let Some(pod) = &alert.orchestrator {
        for (field, value) in
            [("k8s.pod.uid", &pod.resource.id), ("k8s.pod.name", &pod.resource.name), ("k8s.ns.name", &pod.namespace)]
        {
            if let Some(value) = value {
                fields.insert(field, Value::from(value.clone()));
            }
        }
    }
    let optional = |value: &Option<String>| value.clone().map_or(Value::Null, Value::from);
    if let Some(ci) = &alert.ci {
        fields.insert("credwatch.ci.provider", Value::from(ci.provider.clone()));
        fields.insert("credwatch.ci.repository", optional(&ci.repository));
        fields.insert("credwatch.ci.run_id", optional(&ci.run_id));
        fields.insert("credwatch.ci.job", optional(&ci.job));
    }
    if let Some(host_id) = &alert.host.id {
        fields.insert("credwatch.host.id", Value::from(host_id.clone()));
    }
    fields.insert("credwatch.id", Value::from(id));
    fields.insert("credwatch.rule.id", Value::from(alert.rule.id.clone()));
    fields.insert("credwatch.rule.category", Value::from(alert.rule.category.clone()));
    fields.insert("credwatch.severity", Value::from(alert.rule.severity.as_str()));
    fields.insert("credwatch.outcome", Value::from(alert.event.outcome.clone()));
    fields.insert("credwatch.package.manager", Value::from(alert.package.manager.clone()));
    fields.insert("credwatch.package.name", optional(&alert.package.name));
    fields.insert("credwatch.package.version", optional(&alert.package.version));
    fields.insert("credwatch.package.lifecycle", optional(&alert.package.lifecycle));
    fields.insert("credwatch.root_pid", Value::from(alert.credwatch.root_pid));
    fields.insert("credwatch.enforcement", Value::from(alert.credwatch.enforcement.clone()));
    fields.insert("credwatch.rotate", Value::from(alert.credwatch.rotate.join("; ")));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde::Deserialize;

    /// Falcosidekick's `types.FalcoPayload` field for field (its `uuid` is set by Falcosidekick
    /// itself), refusing any other key: what credwatch sends must be what Falcosidekick reads.
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SidekickPayload {
        #[serde(default)]
        uuid: Option<String>,
        output: String,
        priority: String,
        rule: String,
        time: String,
        output_fields: serde_json::Map<String, Value>,
        source: String,
        #[serde(default)]
        tags: Vec<String>,
        #[serde(default)]
        hostname: String,
    }

    /// Falcosidekick's priority names (types/priority.go), matched case-insensitively there.
    const SIDEKICK_PRIORITIES: [&str; 9] =
        ["emergency", "alert", "critical", "error", "warning", "notice", "informational", "info", "debug"];

    fn alert_json(severity: &str, timestamp: &str) -> serde_json::Value {
        serde_json::json!({
            "@timestamp": timestamp,
            "event": {"kind": "alert", "action": "open", "outcome": "alerted", "id": "a1b2c3"},
            "rule": {"id": "ssh-private-key", "name": "SSH private key read by package code",
                     "category": "ssh", "severity": severity, "description": "d"},
            "process": {"pid": 4242, "executable": "/usr/bin/node",
                        "args": ["node", "-e", "require('fs').readFileSync(k)"],
                        "working_directory": "/tmp/pkg", "parent": {"pid": 4200},
                        "ancestors": [{"pid": 4100, "executable": "/usr/bin/npm", "args": ["npm", "install"]},
                                      {"pid": 4200, "executable": "/bin/sh", "args": ["sh", "-c", "node x.js"]}]},
            "file": {"path": "/home/u/.ssh/id_ed25519", "given_path": "~/.ssh/id_ed25519", "flags": "O_RDONLY"},
            "package": {"manager": "npm", "name": "evil-pkg", "version": "1.0.0", "lifecycle": "postinstall"},
            "host": {"name": "build-7"},
            "user": {"id": 1000},
            "credwatch": {"root_pid": 4100, "rotate": ["the SSH key"], "enforcement": "kernel"}
        })
    }

    fn outgoing(json: &serde_json::Value) -> Outgoing {
        Outgoing {
            id: "a1b2c3".into(),
            severity: Severity::High,
            host: "build-7".into(),
            json: serde_json::to_vec(json).unwrap().into(),
        }
    }

    #[test]
    fn the_payload_is_what_falcosidekick_reads() {
        let payload = payload(&outgoing(&alert_json("high", "2023-11-14T22:13:20.000004Z"))).unwrap();
        let sent = serde_json::to_string(&payload).unwrap();
        let read: SidekickPayload = serde_json::from_str(&sent).unwrap();
        // What Falcosidekick's Check() requires.
        assert!(SIDEKICK_PRIORITIES.contains(&read.priority.to_lowercase().as_str()));
        assert_eq!(read.priority, "Error");
        assert_eq!(read.rule, "SSH private key read by package code");
        assert_eq!(read.time, "2023-11-14T22:13:20.000004000Z");
        assert!(!read.output_fields.is_empty());
        assert_eq!(read.uuid, None);
        assert_eq!(read.source, "credwatch");
        assert_eq!(read.tags, ["ssh", "credwatch"]);
        assert_eq!(read.hostname, "build-7");
        assert!(read.output.starts_with("SSH private key read by package code (package=evil-pkg@1.0.0"));
        assert!(read.output.contains(" file=/home/u/.ssh/id_ed25519 "), "{}", read.output);
        let fields = &read.output_fields;
        assert_eq!(fields["proc.name"], "node");
        assert_eq!(fields["proc.exepath"], "/usr/bin/node");
        assert_eq!(fields["proc.cmdline"], "node -e require('fs').readFileSync(k)");
        assert_eq!(fields["proc.pid"], 4242);
        assert_eq!(fields["proc.ppid"], 4200);
        assert_eq!(fields["proc.pname"], "sh");
        assert_eq!(fields["fd.name"], "/home/u/.ssh/id_ed25519");
        assert_eq!(fields["user.uid"], 1000);
        assert_eq!(fields["evt.type"], "open");
        assert_eq!(fields["credwatch.id"], "a1b2c3");
        assert_eq!(fields["credwatch.rule.id"], "ssh-private-key");
        assert_eq!(fields["credwatch.severity"], "high");
        assert_eq!(fields["credwatch.package.lifecycle"], "postinstall");
        assert_eq!(fields["credwatch.rotate"], "the SSH key");
        // Falcosidekick asserts k8s.ns.name and k8s.pod.name to be strings: never send them
        // as anything else.
        assert!(!fields.contains_key("k8s.ns.name") && !fields.contains_key("k8s.pod.name"));
    }

    #[test]
    fn every_severity_has_a_falcosidekick_priority_in_order() {
        let order = ["debug", "informational", "notice", "warning", "error", "critical", "alert", "emergency"];
        let rank = |s: Severity| order.iter().position(|p| *p == priority(s).to_lowercase()).unwrap();
        assert!(rank(Severity::Low) < rank(Severity::Medium));
        assert!(rank(Severity::Medium) < rank(Severity::High));
        assert!(rank(Severity::High) < rank(Severity::Critical));
    }

    #[test]
    fn time_is_utc_with_nanoseconds() {
        assert_eq!(falco_time("2026-12-01T16:00:00+02:00").unwrap(), "2026-12-01T14:00:00.000000000Z");
        assert_eq!(falco_time("2026-12-01T16:00:00.123456789Z").unwrap(), "2026-12-01T16:00:00.123456789Z");
    }

    #[test]
    fn a_connect_alert_has_falcos_remote_fields() {
        let mut json = alert_json("critical", "2026-12-01T16:00:00Z");
        json.as_object_mut().unwrap().remove("file");
        json["destination"] = serde_json::json!({"address": "203.0.113.9", "port": 443,
                                                  "domain": "exfil.example", "family": "inet"});
        let payload = payload(&outgoing(&json)).unwrap();
        assert_eq!(payload.priority, "Critical");
        assert_eq!(payload.output_fields["fd.rip"], "203.0.113.9");
        assert_eq!(payload.output_fields["fd.rport"], 443);
        assert_eq!(payload.output_fields["fd.rip.name"], "exfil.example");
        assert!(!payload.output_fields.contains_key("fd.name"));
        assert!(payload.output.contains(" connection=203.0.113.9:443 "), "{}", payload.output);
    }

    #[test]
    fn the_container_pod_and_ci_job_have_falcos_names_where_falco_has_them() {
        let fields = payload(&outgoing(&alert_json("high", "2026-12-01T16:00:00Z"))).unwrap().output_fields;
        assert!(!fields.keys().any(|k| k.starts_with("container.") || k.starts_with("k8s.") || k.contains(".ci.")));
        let mut json = alert_json("high", "2026-12-01T16:00:00Z");
        let id = "3ad7b26ded6d8e7b23da7d48fe889434573036c27ae5a74837233de441c3601e";
        json["host"]["id"] = "0123456789abcdef0123456789abcdef".into();
        json["container"] = serde_json::json!({"id": id, "runtime": "cri-o"});
        json["orchestrator"] = serde_json::json!({"type": "kubernetes", "namespace": "ci",
            "resource": {"type": "pod", "id": "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", "name": "build-1"}});
        json["ci"] = serde_json::json!({"provider": "gitlab", "repository": "g/p", "run_id": "7", "job": "test"});
        let payload = payload(&outgoing(&json)).unwrap();
        let read: SidekickPayload = serde_json::from_str(&serde_json::to_string(&payload).unwrap()).unwrap();
        let fields = &read.output_fields;
        assert_eq!(
            (fields["container.id"].as_str(), fields["container.full_id"].as_str()),
            (Some("3ad7b26ded6d"), Some(id))
        );
        assert_eq!(fields["container.type"], "cri-o");
        assert_eq!(fields["k8s.pod.uid"], "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d");
        assert_eq!((fields["k8s.pod.name"].as_str(), fields["k8s.ns.name"].as_str()), (Some("build-1"), Some("ci")));
        assert_eq!(fields["credwatch.host.id"], "0123456789abcdef0123456789abcdef");
        assert_eq!(
            (fields["credwatch.ci.provider"].as_str(), fields["credwatch.ci.run_id"].as_str()),
            (Some("gitlab"), Some("7"))
        );
        assert_eq!(
            (fields["credwatch.ci.repository"].as_str(), fields["credwatch.ci.job"].as_str()),
            (Some("g/p"), Some("test"))
        );
    }

    #[test]
    fn bad_alert_json_and_time_are_errors_naming_the_alert() {
        let mut bad = outgoing(&alert_json("low", "2026-12-01T16:00:00Z"));
        bad.json = bytes::Bytes::from_static(b"{not json");
        let error = payload(&bad).unwrap_err().to_string();
        assert!(error.starts_with("alert a1b2c3: not an alert's JSON"), "{error}");
        let error = payload(&outgoing(&alert_json("low", "yesterday"))).unwrap_err().to_string();
        assert!(error.contains("alert a1b2c3: @timestamp \"yesterday\" is not RFC 3339"), "{error}");
    }
}
