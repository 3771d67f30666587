//! The responder's report: per package, the lifecycle steps it ran, the commands, the credential
//! files it touched with the process tree of each incident, and what to rotate. Built while
//! events stream through the engine, in bounded memory.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
};

use serde::Serialize;

use crate::{
    alert::{Alert, AlertPackage, Severity, BLIND_SPOT_ACTION},
    engine::Engine,
    event::{Event, EventData},
    output::{blind_spot_text, command_line, escape, process_tree},
};

/// Commands kept per package; past this they are only counted.
pub(crate) const MAX_COMMANDS: usize = 100;
/// Incidents kept per package; past this they are only counted.
const MAX_INCIDENTS: usize = 100;
/// Packages kept; later ones are only counted.
pub(crate) const MAX_PACKAGES: usize = 10_000;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PackageKey {
    pub manager: String,
    pub name: Option<String>,
    pub version: Option<String>,
}

#[derive(Debug, Default, Serialize)]
pub struct PackageReport {
    /// Lifecycle steps seen running (`postinstall`, `build-script`, ...).
    pub steps: BTreeSet<String>,
    /// Distinct commands its processes executed, in order.
    pub commands: Vec<String>,
    pub commands_not_shown: u64,
    /// Credential files touched: path to the rule ids that fired.
    pub files: BTreeMap<String, BTreeSet<String>>,
    pub incidents: Vec<Incident>,
    pub incidents_not_shown: u64,
    pub worst: Option<Severity>,
}

#[derive(Debug, Serialize)]
pub struct Incident {
    pub timestamp: String,
    pub rule: String,
    pub severity: Severity,
    pub file: Option<String>,
    /// For a connect: where to (`name (address:port)`, or the socket path).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    /// For a blind spot: what was missed, and when.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missed: Option<String>,
    /// Root first, down to the process.
    pub tree: Vec<String>,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub packages: BTreeMap<String, (PackageKey, PackageReport)>,
    pub packages_not_shown: u64,
    /// What to rotate, from every rule that fired.
    pub rotate: BTreeSet<String>,
    pub events: u64,
    pub alerts: u64,
}

pub(crate) fn key(package: &AlertPackage) -> PackageKey {
    PackageKey { manager: package.manager.clone(), name: package.name.clone(), version: package.version.clone() }
}

/// The package's name in a report, and its key there: `npm package evil@1.0.0`.
pub(crate) fn label(key: &PackageKey) -> String {
    match (&key.name, &key.version) {
        (Some(name), Some(version)) => format!("{} package {name}@{version}", key.manager),
        (Some(name), None) => format!("{} package {name}", key.manager),
        _ => format!("{} (no package named)", key.manager),
    }
}

/// Adds `item` to `list` unless there already; past `max` items only counts it.
pub(crate) fn push_distinct(list: &mut Vec<String>, not_shown: &mut u64, item: String, max: usize) {
    if list.contains(&item) {
        return;
    }
    if list.len() < max {
        list.push(item);
    } else {
        *not_shown += 1;
    }
}

/// Packages with alerts first (worst first), then the rest by name.
pub(crate) fn ordered<P>(
    packages: &BTreeMap<String, (PackageKey, P)>,
    worst: impl Fn(&P) -> Option<Severity>,
) -> Vec<(&String, &P)> {
    let mut packages: Vec<(&String, &P)> = packages.iter().map(|(id, (_, p))| (id, p)).collect();
    packages.sort_by(|a, b| worst(b.1).cmp(&worst(a.1)).then_with(|| a.0.cmp(b.0)));
    packages
}

/// A Markdown code span of `text`, escaped, that no backtick in it can end.
pub(crate) fn code(text: &str) -> String {
    format!("`{}`", escape(text).replace('`', "'"))
}

impl Report {
    /// Takes in one event after the engine handled it, with the alerts it fired.
    pub fn observe(&mut self, engine: &Engine, event: &Event, alerts: &[Alert]) {
        self.events += 1;
        if let EventData::Exec(exec) = &event.data {
            if let Some(package) = engine.package_of(event.pid) {
                if let Some(entry) = self.entry(&package) {
                    if let Some(step) = &package.lifecycle {
                        entry.steps.insert(step.clone());
                    }
                    let command = command_line(&exec.args, &exec.executable);
                    push_distinct(&mut entry.commands, &mut entry.commands_not_shown, command, MAX_COMMANDS);
                }
            }
        }
        self.observe_alerts(alerts);
    }

    /// Takes in alerts released without an event (held ones).
    pub fn observe_alerts(&mut self, alerts: &[Alert]) {
        for alert in alerts {
            self.alerts += 1;
            self.rotate.extend(alert.credwatch.rotate.iter().cloned());
            let Some(entry) = self.entry(&alert.package) else { continue };
            if let Some(step) = &alert.package.lifecycle {
                entry.steps.insert(step.clone());
            }
            entry.worst = entry.worst.max(Some(alert.rule.severity));
            if let Some(file) = &alert.file {
                entry.files.entry(file.path.clone()).or_default().insert(alert.rule.id.clone());
            }
            if entry.incidents.len() < MAX_INCIDENTS {
                entry.incidents.push(Incident {
                    timestamp: alert.timestamp.clone(),
                    rule: alert.rule.id.clone(),
                    severity: alert.rule.severity,
                    file: alert.file.as_ref().map(|f| f.path.clone()),
                    destination: alert.destination.as_ref().map(crate::output::destination_text),
                    missed: alert
                        .credwatch
                        .blind_spot
                        .as_ref()
                        .filter(|_| alert.event.action == BLIND_SPOT_ACTION)
                        .map(blind_spot_text),
                    tree: process_tree(alert),
                });
            } else {
                entry.incidents_not_shown += 1;
            }
        }
    }

    /// Adds another file's report to this one (replay builds one per worker thread).
    pub fn merge(&mut self, other: Report) {
        self.events += other.events;
        self.alerts += other.alerts;
        self.packages_not_shown += other.packages_not_shown;
        self.rotate.extend(other.rotate);
        for (id, (key, theirs)) in other.packages {
            if !self.packages.contains_key(&id) && self.packages.len() >= MAX_PACKAGES {
                self.packages_not_shown += 1;
                continue;
            }
            let ours = &mut self.packages.entry(id).or_insert_with(|| (key, PackageReport::default())).1;
            ours.steps.extend(theirs.steps);
            ours.commands_not_shown += theirs.commands_not_shown;
            for command in theirs.commands {
                push_distinct(&mut ours.commands, &mut ours.commands_not_shown, command, MAX_COMMANDS);
            }
            for (path, rules) in theirs.files {
                ours.files.entry(path).or_default().extend(rules);
            }
            let room = MAX_INCIDENTS.saturating_sub(ours.incidents.len());
            ours.incidents_not_shown += theirs.incidents_not_shown + theirs.incidents.len().saturating_sub(room) as u64;
            ours.incidents.extend(theirs.incidents.into_iter().take(room));
            ours.worst = ours.worst.max(theirs.worst);
        }
    }

    fn entry(&mut self, package: &AlertPackage) -> Option<&mut PackageReport> {
        let key = key(package);
        let id = label(&key);
        if !self.packages.contains_key(&id) && self.packages.len() >= MAX_PACKAGES {
            self.packages_not_shown += 1;
            return None;
        }
        Some(&mut self.packages.entry(id).or_insert_with(|| (key, PackageReport::default())).1)
    }

    fn ordered(&self) -> Vec<(&String, &PackageReport)> {
        ordered(&self.packages, |p| p.worst)
    }

    /// Readable text for a terminal; every string from the trace is escaped.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "credwatch report: {} events, {} alerts, {} packages\n",
            self.events,
            self.alerts,
            self.packages.len()
        );
        for (id, package) in self.ordered() {
            let worst = package.worst.map_or("no alerts".to_owned(), |s| s.as_str().to_uppercase());
            let _ = writeln!(out, "{} [{worst}]", escape(id));
            let steps: Vec<String> = package.steps.iter().map(|s| escape(s).into_owned()).collect();
            let _ = writeln!(out, "  steps      {}", if steps.is_empty() { "-".into() } else { steps.join(", ") });
            for (path, rules) in &package.files {
                let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
                let _ = writeln!(out, "  touched    {} ({})", escape(path), escape(&rules.join(", ")));
            }
            for command in &package.commands {
                let _ = writeln!(out, "  ran        {command}");
            }
            if package.commands_not_shown > 0 {
                let _ = writeln!(out, "  ran        ... and {} more commands", package.commands_not_shown);
            }
            for incident in &package.incidents {
                let subject =
                    incident.file.as_deref().or(incident.destination.as_deref()).or(incident.missed.as_deref());
                let file = subject.map(|f| escape(f).into_owned()).unwrap_or_default();
                let _ = writeln!(
                    out,
                    "  incident   {} {} {} {file}",
                    incident.timestamp,
                    incident.severity.as_str(),
                    escape(&incident.rule)
                );
                for line in &incident.tree {
                    let _ = writeln!(out, "               {line}");
                }
            }
            if package.incidents_not_shown > 0 {
                let _ = writeln!(out, "  incident   ... and {} more", package.incidents_not_shown);
            }
            out.push('\n');
        }
        if self.packages_not_shown > 0 {
            let _ = writeln!(out, "... and {} more packages\n", self.packages_not_shown);
        }
        out.push_str("Rotate these:\n");
        if self.rotate.is_empty() {
            out.push_str("  nothing: no credential was touched\n");
        }
        for item in &self.rotate {
            let _ = writeln!(out, "  - {}", escape(item));
        }
        out
    }

    /// Markdown for a ticket: paths and commands in code spans or blocks, escaped.
    pub fn to_markdown(&self) -> String {
        let mut out = String::from("# credwatch incident report\n\n");
        let _ = writeln!(out, "{} events, {} alerts, {} packages.\n", self.events, self.alerts, self.packages.len());
        for (id, package) in self.ordered() {
            let worst = package.worst.map_or("no alerts", Severity::as_str);
            let _ = writeln!(out, "## {} ({worst})\n", code(id));
            let steps: Vec<String> = package.steps.iter().map(|s| code(s)).collect();
            let _ = writeln!(out, "- Steps: {}", if steps.is_empty() { "none seen".into() } else { steps.join(", ") });
            for (path, rules) in &package.files {
                let rules: Vec<String> = rules.iter().map(|r| code(r)).collect();
                let _ = writeln!(out, "- Touched {} ({})", code(path), rules.join(", "));
            }
            if !package.commands.is_empty() {
                out.push_str("- Commands:\n");
                for command in &package.commands {
                    let _ = writeln!(out, "  - {}", code(command));
                }
            }
            for incident in &package.incidents {
                let subject =
                    incident.file.as_deref().or(incident.destination.as_deref()).or(incident.missed.as_deref());
                let file = subject.map(code).unwrap_or_default();
                let _ = writeln!(out, "\n### {} {} {}\n", incident.timestamp, code(&incident.rule), file);
                out.push_str("```\n");
                for line in &incident.tree {
                    let _ = writeln!(out, "{}", line.replace("```", "'''"));
                }
                out.push_str("```\n");
            }
            out.push('\n');
        }
        out.push_str("## Rotate these\n\n");
        if self.rotate.is_empty() {
            out.push_str("Nothing: no credential was touched.\n");
        }
        for item in &self.rotate {
            let _ = writeln!(out, "- [ ] {}", escape(item));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        engine::EngineOptions,
        event::{Fork, Open},
        rules::RuleSet,
    };

    fn exec(pid: u32, ppid: u32, args: &[&str], env: &[(&str, &str)]) -> Event {
        crate::event::test_exec(1_000, pid, ppid, args, env)
    }

    fn report_of(events: &[Event]) -> Report {
        let mut engine = Engine::new(
            RuleSet::defaults().unwrap(),
            EngineOptions { host_name: "h".into(), ..EngineOptions::default() },
        );
        let mut report = Report::default();
        for event in events {
            let alerts = engine.handle(event);
            report.observe(&engine, event, &alerts);
        }
        // The end of the stream: alerts still held go out (no sweep here to summarise).
        report.observe_alerts(&engine.flush());
        report
    }

    #[test]
    fn names_package_steps_commands_files_and_rotation() {
        let env =
            [("npm_package_name", "evil"), ("npm_package_version", "1.0.0"), ("npm_lifecycle_event", "postinstall")];
        let report = report_of(&[
            exec(100, 1, &["npm", "install"], &[("HOME", "/home/alice")]),
            Event { time_ns: 2_000, pid: 100, data: EventData::Fork(Fork { child_pid: 101 }) },
            exec(101, 100, &["sh", "-c", "node steal\x1b[2J.js"], &env),
            Event { time_ns: 3_000, pid: 101, data: EventData::Fork(Fork { child_pid: 102 }) },
            exec(102, 101, &["node", "steal.js"], &env),
            Event {
                time_ns: 4_000,
                pid: 102,
                data: EventData::Open(Open {
                    tid: 102,
                    syscall: "openat".into(),
                    dirfd: -100,
                    path: "/home/alice/.npmrc".into(),
                    abs_path: Some("/home/alice/.npmrc".into()),
                    ret: 3,
                    ..Open::default()
                }),
            },
        ]);
        assert_eq!(report.alerts, 1);
        let text = report.to_text();
        assert!(text.contains("npm package evil@1.0.0 [HIGH]"), "{text}");
        assert!(text.contains("steps      postinstall"), "{text}");
        assert!(text.contains("touched    /home/alice/.npmrc (npm-registry-token)"), "{text}");
        assert!(text.contains("ran        sh -c 'node steal\\u{1b}[2J.js'"), "{text}");
        assert!(text.contains("└─ [101] sh -c"), "{text}");
        assert!(text.contains("Rotate these:\n  - "), "{text}");
        assert!(!text.contains('\x1b'), "raw escape in the report: {text}");
        let markdown = report.to_markdown();
        assert!(markdown.contains("## `npm package evil@1.0.0` (high)"), "{markdown}");
        assert!(markdown.contains("- [ ] "), "{markdown}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["alerts"], 1);
    }

    #[test]
    fn merging_reports_adds_them_up() {
        let mut one = report_of(&[exec(100, 1, &["npm", "install"], &[])]);
        let two = report_of(&[exec(200, 1, &["npm", "ci"], &[])]);
        one.merge(two);
        assert_eq!(one.events, 2);
        let (_, npm) = &one.packages["npm (no package named)"];
        assert_eq!(npm.commands, ["npm install", "npm ci"]);
    }

    #[test]
    fn a_quiet_trace_says_nothing_to_rotate() {
        let report = report_of(&[exec(100, 1, &["npm", "install"], &[])]);
        assert!(report.to_text().contains("nothing: no credential was touched"));
    }

    #[test]
    fn a_blind_spot_says_what_was_missed_of_which_package_and_when() {
        let env =
            [("npm_package_name", "evil"), ("npm_package_version", "1.0.0"), ("npm_lifecycle_event", "postinstall")];
        let spot = crate::event::BlindSpot {
            cause: crate::event::BlindCause::Lost,
            root_pid: Some(100),
            since_ns: 1_000_000_000,
            until_ns: 3_000_000_000,
            counts: [("open\x1b[2J".to_owned(), 5)].into(),
            credential: false,
        };
        let report = report_of(&[
            exec(100, 1, &["npm", "install"], &[]),
            Event { time_ns: 2_000, pid: 100, data: EventData::Fork(Fork { child_pid: 101 }) },
            exec(101, 100, &["node", "x.js"], &env),
            Event { time_ns: 3_000_000_000, pid: 0, data: EventData::BlindSpot(spot) },
        ]);
        let text = report.to_text();
        assert!(text.contains("npm package evil@1.0.0 [HIGH]"), "{text}");
        assert!(
            text.contains("  incident   1970-01-01T00:00:03Z high blind-spot-lost records lost from 1970-01-01T00:00:01Z to 1970-01-01T00:00:03Z (2.0 s): 5 open\\u{1b}[2J\n"),
            "{text}"
        );
        assert!(
            report.to_markdown().contains("`blind-spot-lost` `records lost from 1970-01-01T00:00:01Z"),
            "{}",
            report.to_markdown()
        );
    }
}
