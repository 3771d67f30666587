//! The fleet's report (`credwatch fleet report`): alerts from many hosts, as their agents sent
//! them (alert files, the NATS stream), folded per package and version into where it ran (host,
//! container, pod, CI job; first and last seen), what it touched and what to rotate. Alerts come
//! at least once, so each `event.id` is counted once. Pure: the caller reads the files or the
//! stream and hands over each alert's JSON.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    fmt::Write as _,
    path::Path,
    sync::Arc,
};

use serde::{Deserialize as _, Serialize, Serializer};
use serde_json::Value;
use time::{format_description::well_known::Rfc3339, OffsetDateTime};

use crate::{
    alert::{Alert, Severity},
    incident::Incident,
    input::{Input, InputError},
    output::{command_line, destination_text, escape},
    place::Place,
    report::{code, key, label, ordered, push_distinct, PackageKey, MAX_COMMANDS, MAX_PACKAGES},
};

/// Places (host, container, pod, CI job) kept per package; later ones are only counted.
const MAX_PLACES: usize = 10_000;
/// Credential files (and destinations) kept per package; later ones are only counted.
const MAX_FILES: usize = 1_000;
/// Hosts named in the text and Markdown per line of "rotate"; the JSON has them all.
const HOSTS_SHOWN: usize = 20;

/// Why an alert's JSON was not taken.
#[derive(Debug, thiserror::Error)]
pub enum AlertJsonError {
    #[error("not JSON: {0}")]
    Json(serde_json::Error),
    #[error("not a credwatch alert: {0}")]
    NotAlert(serde_json::Error),
    #[error("@timestamp {0:?} is not an RFC 3339 time")]
    Timestamp(String),
}

/// The span of time over which something was seen.
#[derive(Clone, Debug, Serialize)]
pub struct Seen {
    /// RFC 3339, as the alerts gave it.
    pub first_seen: String,
    pub last_seen: String,
    pub alerts: u64,
    #[serde(skip)]
    first: OffsetDateTime,
    #[serde(skip)]
    last: OffsetDateTime,
}

impl Seen {
    fn new(timestamp: &str, at: OffsetDateTime) -> Seen {
        Seen { first_seen: timestamp.to_owned(), last_seen: timestamp.to_owned(), alerts: 1, first: at, last: at }
    }

    fn add(&mut self, timestamp: &str, at: OffsetDateTime) {
        self.alerts += 1;
        if at < self.first {
            (self.first, self.first_seen) = (at, timestamp.to_owned());
        }
        if at > self.last {
            (self.last, self.last_seen) = (at, timestamp.to_owned());
        }
    }
}

/// A place and when the package was seen there.
#[derive(Clone, Debug, Serialize)]
pub struct PlaceSeen {
    #[serde(flatten)]
    pub place: Place,
    #[serde(flatten)]
    pub seen: Seen,
}

/// One package version across the fleet.
#[derive(Debug, Default, Serialize)]
pub struct FleetPackage {
    /// When it was seen anywhere; `None` only before its first alert.
    #[serde(flatten)]
    pub seen: Option<Seen>,
    pub worst: Option<Severity>,
    /// Distinct hosts.
    pub hosts: BTreeSet<String>,
    /// Where it ran, in (host, container, pod, CI job) order.
    #[serde(serialize_with = "values")]
    pub places: BTreeMap<Place, PlaceSeen>,
    pub places_not_shown: u64,
    /// Lifecycle steps seen running.
    pub steps: BTreeSet<String>,
    /// Credential files touched (the alert's file, a sweep's files): path to the rules that fired.
    pub files: BTreeMap<String, BTreeSet<String>>,
    pub files_not_shown: u64,
    /// Where its code connected, on exfiltration alerts.
    pub destinations: BTreeSet<String>,
    /// The commands of the processes the alerts are about, distinct, in order first seen.
    pub commands: Vec<String>,
    pub commands_not_shown: u64,
    /// Rule id to the number of alerts.
    pub rules: BTreeMap<String, u64>,
    /// What to rotate, each with the hosts where.
    pub rotate: BTreeMap<String, BTreeSet<String>>,
}

fn values<S: Serializer>(map: &BTreeMap<Place, PlaceSeen>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(map.values())
}

/// What [`FleetReport::add_json`] did with an alert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    New,
    /// Its `event.id` was seen before: a redelivery, not counted again.
    Repeat,
    /// About another package than the report's.
    Other,
}

/// `--package NAME[@VERSION]`: the one package (version) a report is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackageFilter {
    pub name: String,
    pub version: Option<String>,
}

impl std::str::FromStr for PackageFilter {
    type Err = String;

    /// `NAME` or `NAME@VERSION`; a scoped npm name keeps its leading `@` (`@scope/pkg@1.0.0`).
    fn from_str(text: &str) -> Result<PackageFilter, String> {
        let (name, version) = match text[1.min(text.len())..].rfind('@') {
            Some(at) => (&text[..at + 1], Some(&text[at + 2..])),
            None => (text, None),
        };
        if name.trim_start_matches('@').is_empty() || version.is_some_and(str::is_empty) {
            return Err(format!("{text:?} is not NAME or NAME@VERSION"));
        }
        Ok(PackageFilter { name: name.to_owned(), version: version.map(str::to_owned) })
    }
}

impl PackageFilter {
    fn matches(&self, alert: &Alert) -> bool {
        alert.package.name.as_deref() == Some(self.name.as_str())
            && self.version.as_ref().is_none_or(|v| alert.package.version.as_ref() == Some(v))
    }
}

#[derive(Debug, Default, Serialize)]
pub struct FleetReport {
    pub packages: BTreeMap<String, (PackageKey, FleetPackage)>,
    pub packages_not_shown: u64,
    /// Distinct hosts that sent alerts.
    pub hosts: BTreeSet<String>,
    /// Distinct alerts taken in.
    pub alerts: u64,
    /// Alerts whose `event.id` had been taken in already (at-least-once delivery).
    pub repeats: u64,
    /// What to rotate, from every alert, each with the hosts where.
    pub rotate: BTreeMap<String, BTreeSet<String>>,
    #[serde(skip)]
    ids: HashSet<String>,
    #[serde(skip)]
    only: Option<PackageFilter>,
    /// The incident page's gatherings, when the report is to be one (`--format html`).
    #[serde(skip)]
    incident: Option<Box<Incident>>,
}

impl FleetReport {
    /// A report of `package`'s alerts only.
    pub fn only(package: PackageFilter) -> FleetReport {
        FleetReport { only: Some(package), ..FleetReport::default() }
    }

    /// The same report, gathering what the incident page shows too.
    pub fn with_incident(self) -> FleetReport {
        FleetReport { incident: Some(Box::default()), ..self }
    }

    /// What the incident page shows, when [`FleetReport::with_incident`] made the report.
    pub fn incident(&self) -> Option<&Incident> {
        self.incident.as_deref()
    }

    /// Takes in one alert as JSON (a line of an alert file, a message of the stream).
    pub fn add_json(&mut self, json: &[u8]) -> Result<Added, AlertJsonError> {
        let value: Value = serde_json::from_slice(json).map_err(AlertJsonError::Json)?;
        let alert = Alert::deserialize(&value).map_err(AlertJsonError::NotAlert)?;
        let at = OffsetDateTime::parse(&alert.timestamp, &Rfc3339)
            .map_err(|_| AlertJsonError::Timestamp(alert.timestamp.clone()))?;
        if self.only.as_ref().is_some_and(|only| !only.matches(&alert)) {
            return Ok(Added::Other);
        }
        // Alerts written before ids existed: the id they would have had.
        let id = if alert.event.id.is_empty() { alert.stable_id() } else { alert.event.id.clone() };
        if !self.ids.insert(id) {
            self.repeats += 1;
            return Ok(Added::Repeat);
        }
        self.add(&alert, Place::of(&alert), at);
        Ok(Added::New)
    }

    fn add(&mut self, alert: &Alert, place: Place, at: OffsetDateTime) {
        if let Some(incident) = &mut self.incident {
            incident.observe_alert(None, alert);
        }
        self.alerts += 1;
        let host = &alert.host.name;
        self.hosts.insert(host.clone());
        for item in &alert.credwatch.rotate {
            self.rotate.entry(item.clone()).or_default().insert(host.clone());
        }
        let key = key(&alert.package);
        let id = label(&key);
        if !self.packages.contains_key(&id) && self.packages.len() >= MAX_PACKAGES {
            self.packages_not_shown += 1;
            return;
        }
        let package = &mut self.packages.entry(id).or_insert_with(|| (key, FleetPackage::default())).1;
        let timestamp = alert.timestamp.as_str();
        match &mut package.seen {
            Some(seen) => seen.add(timestamp, at),
            None => package.seen = Some(Seen::new(timestamp, at)),
        }
        package.worst = package.worst.max(Some(alert.rule.severity));
        package.hosts.insert(host.clone());
        let room = package.places.len() < MAX_PLACES;
        match package.places.get_mut(&place) {
            Some(seen) => seen.seen.add(timestamp, at),
            None if room => {
                package.places.insert(place.clone(), PlaceSeen { place, seen: Seen::new(timestamp, at) });
            }
            None => package.places_not_shown += 1,
        }
        if let Some(step) = &alert.package.lifecycle {
            package.steps.insert(step.clone());
        }
        let sweep = alert.credwatch.sweep.iter().flat_map(|s| &s.files);
        for path in alert.file.iter().map(|f| &f.path).chain(sweep) {
            let room = package.files.len() < MAX_FILES;
            match package.files.get_mut(path) {
                Some(rules) => {
                    rules.insert(alert.rule.id.clone());
                }
                None if room => {
                    package.files.insert(path.clone(), BTreeSet::from([alert.rule.id.clone()]));
                }
                None => package.files_not_shown += 1,
            }
        }
        if let Some(destination) = &alert.destination {
            if package.destinations.len() < MAX_FILES {
                package.destinations.insert(destination_text(destination));
            }
        }
        let command = command_line(&alert.process.args, &alert.process.executable);
        push_distinct(&mut package.commands, &mut package.commands_not_shown, command, MAX_COMMANDS);
        *package.rules.entry(alert.rule.id.clone()).or_default() += 1;
        for item in &alert.credwatch.rotate {
            package.rotate.entry(item.clone()).or_default().insert(host.clone());
        }
    }

    /// Reads alert files (JSON lines, as the `file:` output and `--alerts` write them; gzip and
    /// zstd recognised; `-` is standard input). A bad line stops the reading with its file and
    /// line, unless `skip` takes it.
    pub fn read_files(
        &mut self,
        paths: &[impl AsRef<Path>],
        mut skip: Option<&mut dyn FnMut(&InputError)>,
    ) -> Result<(), InputError> {
        for path in paths {
            let mut lines = Input::open(path.as_ref(), Arc::default())?.into_lines();
            loop {
                let error = match lines.next() {
                    Ok(None) => break,
                    // A blank line (a file edited by hand) is no alert, and no harm.
                    Ok(Some((_, line))) if line.iter().all(u8::is_ascii_whitespace) => continue,
                    Ok(Some((number, line))) => match self.add_json(line) {
                        Ok(_) => continue,
                        Err(error) => InputError::bad_line(lines.name(), number, error.to_string()),
                    },
                    Err(error) => error,
                };
                match skip.as_deref_mut() {
                    Some(skip) if error.recoverable => skip(&error),
                    _ => return Err(error),
                }
            }
        }
        Ok(())
    }

    fn ordered(&self) -> Vec<(&String, &FleetPackage)> {
        ordered(&self.packages, |p| p.worst)
    }

    /// Readable text for a terminal; every string from the hosts is escaped.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "credwatch fleet report: {} alerts ({} repeats dropped) from {} hosts, {} packages\n",
            self.alerts,
            self.repeats,
            self.hosts.len(),
            self.packages.len()
        );
        let or_dash = |text: &Option<String>| text.as_deref().map_or("-".into(), |t| escape(t).into_owned());
        for (id, package) in self.ordered() {
            let worst = package.worst.map_or("no alerts".to_owned(), |s| s.as_str().to_uppercase());
            let _ = writeln!(out, "{} [{worst}]", escape(id));
            if let Some(seen) = &package.seen {
                let _ = writeln!(out, "  first seen {}", seen.first_seen);
                let _ = writeln!(out, "  last seen  {}", seen.last_seen);
            }
            let _ = writeln!(
                out,
                "  alerts     {} on {} hosts",
                package.seen.as_ref().map_or(0, |s| s.alerts),
                package.hosts.len()
            );
            let steps: Vec<String> = package.steps.iter().map(|s| escape(s).into_owned()).collect();
            let _ = writeln!(out, "  steps      {}", if steps.is_empty() { "-".into() } else { steps.join(", ") });
            let _ = writeln!(out, "  where      HOST | CONTAINER | POD | CI JOB | FIRST SEEN | LAST SEEN | ALERTS");
            for place in package.places.values() {
                let (p, s) = (&place.place, &place.seen);
                let _ = writeln!(
                    out,
                    "             {} | {} | {} | {} | {} | {} | {}",
                    escape(&p.host),
                    or_dash(&p.container),
                    or_dash(&p.pod),
                    or_dash(&p.ci_job),
                    s.first_seen,
                    s.last_seen,
                    s.alerts
                );
            }
            if package.places_not_shown > 0 {
                let _ = writeln!(out, "             ... and {} more places", package.places_not_shown);
            }
            for (path, rules) in &package.files {
                let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
                let _ = writeln!(out, "  touched    {} ({})", escape(path), escape(&rules.join(", ")));
            }
            if package.files_not_shown > 0 {
                let _ = writeln!(out, "  touched    ... and {} more files", package.files_not_shown);
            }
            for destination in &package.destinations {
                let _ = writeln!(out, "  connected  {}", escape(destination));
            }
            for command in &package.commands {
                let _ = writeln!(out, "  ran        {command}");
            }
            if package.commands_not_shown > 0 {
                let _ = writeln!(out, "  ran        ... and {} more commands", package.commands_not_shown);
            }
            for (item, hosts) in &package.rotate {
                let _ = writeln!(out, "  rotate     {} (on {})", escape(item), hosts_text(hosts));
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
        for (item, hosts) in &self.rotate {
            let _ = writeln!(out, "  - {} (on {})", escape(item), hosts_text(hosts));
        }
        out
    }

    /// Markdown for a ticket: every string from the hosts in a code span, escaped.
    pub fn to_markdown(&self) -> String {
        let mut out = String::from("# credwatch fleet report\n\n");
        let _ = writeln!(
            out,
            "{} alerts ({} repeats dropped) from {} hosts, {} packages.\n",
            self.alerts,
            self.repeats,
            self.hosts.len(),
            self.packages.len()
        );
        let or_dash = |text: &Option<String>| text.as_deref().map_or("-".into(), code);
        for (id, package) in self.ordered() {
            let worst = package.worst.map_or("no alerts", Severity::as_str);
            let _ = writeln!(out, "## {} ({worst})\n", code(id));
            if let Some(seen) = &package.seen {
                let _ = writeln!(
                    out,
                    "- Seen from {} to {}: {} alerts on {} hosts",
                    seen.first_seen,
                    seen.last_seen,
                    seen.alerts,
                    package.hosts.len()
                );
            }
            let steps: Vec<String> = package.steps.iter().map(|s| code(s)).collect();
            let _ = writeln!(out, "- Steps: {}", if steps.is_empty() { "none seen".into() } else { steps.join(", ") });
            for (path, rules) in &package.files {
                let rules: Vec<String> = rules.iter().map(|r| code(r)).collect();
                let _ = writeln!(out, "- Touched {} ({})", code(path), rules.join(", "));
            }
            if package.files_not_shown > 0 {
                let _ = writeln!(out, "- Touched {} more files", package.files_not_shown);
            }
            for destination in &package.destinations {
                let _ = writeln!(out, "- Connected to {}", code(destination));
            }
            if !package.commands.is_empty() {
                out.push_str("- Commands:\n");
                for command in &package.commands {
                    let _ = writeln!(out, "  - {}", code(command));
                }
            }
            out.push_str("\n| Host | Container | Pod | CI job | First seen | Last seen | Alerts |\n");
            out.push_str("|---|---|---|---|---|---|---|\n");
            for place in package.places.values() {
                let (p, s) = (&place.place, &place.seen);
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    code(&p.host).replace('|', "\\|"),
                    or_dash(&p.container).replace('|', "\\|"),
                    or_dash(&p.pod).replace('|', "\\|"),
                    or_dash(&p.ci_job).replace('|', "\\|"),
                    s.first_seen,
                    s.last_seen,
                    s.alerts
                );
            }
            if package.places_not_shown > 0 {
                let _ = writeln!(out, "\n... and {} more places.", package.places_not_shown);
            }
            out.push('\n');
        }
        out.push_str("## Rotate these\n\n");
        if self.rotate.is_empty() {
            out.push_str("Nothing: no credential was touched.\n");
        }
        for (item, hosts) in &self.rotate {
            let _ = writeln!(out, "- [ ] {} (on {})", escape(item), hosts_text(hosts));
        }
        out
    }
}

/// The hosts, escaped, the first [`HOSTS_SHOWN`] by name.
fn hosts_text(hosts: &BTreeSet<String>) -> String {
    let mut shown: Vec<String> = hosts.iter().take(HOSTS_SHOWN).map(|h| escape(h).into_owned()).collect();
    if hosts.len() > HOSTS_SHOWN {
        shown.push(format!("and {} more hosts", hosts.len() - HOSTS_SHOWN));
    }
    shown.join(", ")
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;
    use crate::{
        engine::{Engine, EngineOptions},
        event::{test_exec as exec, Event, EventData, Fork, Open},
        rules::RuleSet,
    };

    /// The alerts the engine raises, as JSON lines, on `host` at `second` (of 2023-11-14):
    /// `package`'s postinstall reads `~/.npmrc`.
    fn alerts(host: &str, second: u64, package: (&str, &str)) -> Vec<String> {
        let mut engine = Engine::new(
            RuleSet::defaults().unwrap(),
            EngineOptions { host_name: host.into(), ..EngineOptions::default() },
        );
        let t = 1_700_000_000_000_000_000 + second * 1_000_000_000;
        let env = [
            ("npm_package_name", package.0),
            ("npm_package_version", package.1),
            ("npm_lifecycle_event", "postinstall"),
        ];
        let events = [
            exec(t, 100, 1, &["npm", "install"], &[("HOME", "/home/alice")]),
            Event { time_ns: t + 1, pid: 100, data: EventData::Fork(Fork { child_pid: 101 }) },
            exec(t + 2, 101, 100, &["node", "steal.js"], &env),
            Event {
                time_ns: t + 3,
                pid: 101,
                data: EventData::Open(Open {
                    tid: 101,
                    syscall: "openat".into(),
                    dirfd: -100,
                    path: "/home/alice/.npmrc".into(),
                    abs_path: Some("/home/alice/.npmrc".into()),
                    ret: 3,
                    ..Open::default()
                }),
            },
        ];
        // Flushed: the read of ~/.npmrc, a file of npm's configuration chain, is held for its window.
        let mut raised: Vec<Alert> = events.iter().flat_map(|e| engine.handle(e)).collect();
        raised.extend(engine.flush());
        let raised: Vec<String> = raised.iter().map(|a| serde_json::to_string(a).unwrap()).collect();
        assert!(!raised.is_empty(), "no alert on {host}");
        raised
    }

    #[test]
    fn folds_hosts_first_and_last_seen_files_and_rotation_and_drops_repeats() {
        let mut report = FleetReport::default();
        let mut lines = Vec::new();
        for (host, second) in [("build-2", 20), ("build-1", 10), ("build-3", 30), ("build-1", 40)] {
            lines.extend(alerts(host, second, ("evil", "1.0.0")));
        }
        lines.extend(alerts("build-9", 50, ("evil", "2.0.0")));
        for line in &lines {
            assert_eq!(report.add_json(line.as_bytes()).unwrap(), Added::New);
        }
        // Delivered again (a retry, the spool after a restart): not counted twice.
        for line in &lines {
            assert_eq!(report.add_json(line.as_bytes()).unwrap(), Added::Repeat);
        }
        assert_eq!((report.alerts, report.repeats), (lines.len() as u64, lines.len() as u64));
        assert_eq!(report.hosts.len(), 4);
        let (_, one) = &report.packages["npm package evil@1.0.0"];
        let seen = one.seen.as_ref().unwrap();
        assert_eq!(
            (seen.first_seen.as_str(), seen.last_seen.as_str()),
            ("2023-11-14T22:13:30.000000003Z", "2023-11-14T22:14:00.000000003Z")
        );
        assert_eq!(one.hosts, BTreeSet::from(["build-1".into(), "build-2".into(), "build-3".into()]));
        let places: Vec<(&str, &str, &str, u64)> = one
            .places
            .values()
            .map(|p| (p.place.host.as_str(), p.seen.first_seen.as_str(), p.seen.last_seen.as_str(), p.seen.alerts))
            .collect();
        assert_eq!(places[0], ("build-1", "2023-11-14T22:13:30.000000003Z", "2023-11-14T22:14:00.000000003Z", 2));
        assert_eq!(places.len(), 3);
        assert_eq!(one.files.keys().collect::<Vec<_>>(), ["/home/alice/.npmrc"]);
        assert_eq!(one.commands, ["node steal.js"]);
        assert_eq!(one.steps, BTreeSet::from(["postinstall".into()]));
        assert!(!one.rotate.is_empty());
        assert!(one.rotate.values().all(|hosts| hosts.len() == 3), "{:?}", one.rotate);
        let (_, two) = &report.packages["npm package evil@2.0.0"];
        assert_eq!(two.hosts, BTreeSet::from(["build-9".into()]));
        assert!(report.rotate.values().all(|hosts| hosts.len() == 4), "{:?}", report.rotate);

        let text = report.to_text();
        assert!(text.contains("from 4 hosts, 2 packages"), "{text}");
        assert!(text.contains("npm package evil@1.0.0 [HIGH]"), "{text}");
        assert!(
            text.contains("  first seen 2023-11-14T22:13:30.000000003Z\n  last seen  2023-11-14T22:14:00.000000003Z"),
            "{text}"
        );
        assert!(text.contains("             build-1 | - | - | - | 2023-11-14T22:13:30.000000003Z"), "{text}");
        assert!(text.contains("  touched    /home/alice/.npmrc (npm-registry-token)"), "{text}");
        assert!(text.contains("(on build-1, build-2, build-3)"), "{text}");
        let markdown = report.to_markdown();
        assert!(markdown.contains("## `npm package evil@1.0.0` (high)"), "{markdown}");
        assert!(markdown.contains("| `build-9` | - | - | - |"), "{markdown}");
        assert!(markdown.contains("- [ ] "), "{markdown}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["alerts"], lines.len());
        let places = &json["packages"]["npm package evil@1.0.0"][1]["places"];
        assert_eq!(places[0]["host"], "build-1");
        assert_eq!(places[0]["container"], Value::Null);
        assert_eq!(places[0]["alerts"], 2);
    }

    #[test]
    fn names_a_pod_a_trace_stated_by_namespace_and_name_with_its_uid_when_known() {
        let line = &alerts("node-1", 0, ("evil", "1.0.0"))[0];
        let id = "ab".repeat(32);
        let uid = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
        let mut report = FleetReport::default();
        // As the engine writes them for a Tracee trace (uid, name, namespace) and a Tetragon
        // one (name and namespace only).
        for (at, uid) in [(1, Some(uid)), (2, None)] {
            let mut alert: Alert = serde_json::from_str(line).unwrap();
            let stated = crate::container::stated(&id, uid, Some("build-7f9c4d-x2k8q"), Some("ci")).unwrap();
            let (container, orchestrator) = crate::alert::AlertContainer::stated(&stated);
            (alert.container, alert.orchestrator) = (Some(container), orchestrator);
            alert.event.id = format!("stated-{at}");
            report.add_json(serde_json::to_string(&alert).unwrap().as_bytes()).unwrap();
        }
        let (_, package) = &report.packages["npm package evil@1.0.0"];
        let pods: Vec<Option<&str>> = package.places.keys().map(|p| p.pod.as_deref()).collect();
        assert_eq!(pods, [Some("ci/build-7f9c4d-x2k8q"), Some(&*format!("ci/build-7f9c4d-x2k8q ({uid})"))]);
        assert!(
            report.to_text().contains(&format!("| {id} | ci/build-7f9c4d-x2k8q ({uid}) |")),
            "{}",
            report.to_text()
        );
    }

    #[test]
    fn names_the_container_pod_and_ci_job_when_the_alert_carries_them_and_escapes_them() {
        let line = &alerts("node-1", 0, ("evil", "1.0.0"))[0];
        let mut alert: Alert = serde_json::from_str(line).unwrap();
        let id = "ab".repeat(32);
        let uid = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
        let cgroup = format!("/kubepods/besteffort/pod{uid}/crio-{id}");
        let container = crate::container::container_of(&[cgroup]).unwrap();
        let (container, orchestrator) = crate::alert::AlertContainer::with_pod(&container);
        (alert.container, alert.orchestrator) = (Some(container), orchestrator);
        alert.ci = Some(crate::alert::AlertCi {
            provider: "github".into(),
            repository: Some("o/r".into()),
            run_id: Some("42".into()),
            job: Some("test-\u{1b}[2J".into()),
            ..crate::alert::AlertCi::default()
        });
        alert.event.id = "other".into();
        alert.host.name = "node-\u{1b}]0;x\u{7}".into();
        let mut report = FleetReport::default();
        report.add_json(line.as_bytes()).unwrap();
        report.add_json(serde_json::to_string(&alert).unwrap().as_bytes()).unwrap();
        let (_, package) = &report.packages["npm package evil@1.0.0"];
        let with: Vec<&Place> = package.places.keys().filter(|p| p.container.is_some()).collect();
        assert_eq!(with.len(), 1);
        assert_eq!(with[0].container, Some(format!("cri-o://{id}")));
        assert_eq!(with[0].pod, Some(format!("pod {uid}")));
        assert_eq!(with[0].ci_job.as_deref(), Some("job=test-\u{1b}[2J provider=github repository=o/r run_id=42"));
        let text = report.to_text();
        assert!(text.contains("             node-1 | - | - | - |"), "{text}");
        assert!(
            text.contains(&format!("| cri-o://{id} | pod {uid} | job=test-\\u{{1b}}[2J provider=github")),
            "{text}"
        );
        for out in [text, report.to_markdown()] {
            assert!(!out.contains('\x1b') && !out.contains('\x07'), "raw control characters: {out}");
        }
    }

    #[test]
    fn a_bad_line_is_named_by_file_and_line_unless_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("alerts.jsonl");
        let good = alerts("h", 0, ("evil", "1.0.0"));
        let mut file = std::fs::File::create(&path).unwrap();
        writeln!(file, "{}\n\nnot json\n{{\"event\": 1}}\n{}", good[0], good[0]).unwrap();
        drop(file);
        let name = path.display().to_string();

        let error = FleetReport::default().read_files(&[&path], None).unwrap_err();
        assert_eq!(error.file, name);
        assert_eq!(error.line, Some(3));
        assert!(error.to_string().starts_with(&format!("{name}:3: not JSON")), "{error}");

        let mut skipped = Vec::new();
        let mut skip = |e: &InputError| skipped.push(e.to_string());
        let mut report = FleetReport::default();
        report.read_files(&[&path], Some(&mut skip)).unwrap();
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(skipped[1].starts_with(&format!("{name}:4: not a credwatch alert")), "{skipped:?}");
        assert_eq!((report.alerts, report.repeats), (1, 1));

        let missing = dir.path().join("missing.jsonl");
        let error = FleetReport::default().read_files(&[&missing], None).unwrap_err();
        assert!(error.to_string().starts_with(&missing.display().to_string()), "{error}");
    }

    #[test]
    fn a_timestamp_that_is_no_time_is_no_alert() {
        let mut value: Value = serde_json::from_str(&alerts("h", 0, ("evil", "1.0.0"))[0]).unwrap();
        value["@timestamp"] = "yesterday".into();
        let error = FleetReport::default().add_json(value.to_string().as_bytes()).unwrap_err();
        assert_eq!(error.to_string(), "@timestamp \"yesterday\" is not an RFC 3339 time");
    }

    #[test]
    fn a_report_of_one_package_or_one_version_leaves_the_others_out() {
        let lines: Vec<String> = [("a", "evil", "1.0.0"), ("b", "evil", "2.0.0"), ("c", "@scope/pkg", "1.0.0")]
            .into_iter()
            .flat_map(|(host, name, version)| alerts(host, 0, (name, version)))
            .collect();
        for (filter, packages) in [
            ("evil", &["npm package evil@1.0.0", "npm package evil@2.0.0"][..]),
            ("evil@2.0.0", &["npm package evil@2.0.0"]),
            ("@scope/pkg", &["npm package @scope/pkg@1.0.0"]),
            ("@scope/pkg@1.0.0", &["npm package @scope/pkg@1.0.0"]),
            ("evil@3", &[]),
        ] {
            let mut report = FleetReport::only(filter.parse().unwrap());
            for line in &lines {
                report.add_json(line.as_bytes()).unwrap();
            }
            assert_eq!(report.packages.keys().map(String::as_str).collect::<Vec<_>>(), packages, "{filter}");
            assert_eq!(report.hosts.len(), packages.len(), "{filter}");
        }
        for bad in ["", "@", "evil@", "@scope/pkg@"] {
            assert!(bad.parse::<PackageFilter>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_empty_report_says_nothing_to_rotate() {
        assert!(FleetReport::default().to_text().contains("nothing: no credential was touched"));
    }
}
