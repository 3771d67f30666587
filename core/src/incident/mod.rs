//! The incident page (`replay --report-format html`, `fleet report --format html`, `show --html`):
//! one self-contained HTML file for a responder. [`Incident`] gathers what the page shows, in
//! bounded memory, from alerts (the local alert log, the fleet's alert files) and, in a replay,
//! from the events of each package tree too; [`render`] draws it. Every string here is kept as
//! the monitored system wrote it: the renderer alone escapes, in one place.

mod html;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use time::{format_description::well_known::Rfc3339, OffsetDateTime};

pub use self::html::{render, Origin};
use crate::{
    alert::{Alert, AlertDestination, AlertPackage, BlindSpotCause, Severity, BLIND_SPOT_ACTION},
    engine::{open_flags, Engine},
    event::{Connect, Event, EventData, Exec, Open, Rename},
    output::{blind_spot_text, destination_text},
    pipeline::{Sink, SinkError},
    place::Place,
    report::{key, label, PackageKey, MAX_PACKAGES},
};

/// Package trees kept; past this, trees without alerts give way (oldest first), then new trees
/// are only counted.
const MAX_TREES: usize = 64;
/// Processes kept per tree (the SVG draws fewer, see `html`).
const MAX_PROCESSES: usize = 1_000;
/// Names looked up kept per tree (the last one per process, for the connects that follow).
const MAX_LOOKUPS: usize = 1_000;
/// Credential files kept on the page; later ones are only counted.
const MAX_FILES: usize = 1_000;
/// Destinations kept on the page; later ones are only counted.
const MAX_CONNECTIONS: usize = 500;
/// Places (host, container, pod, CI job) kept; later ones are only counted.
const MAX_PLACES: usize = 1_000;
/// Hosts named per package and per item to rotate; later ones are only counted.
pub(crate) const MAX_HOSTS: usize = 100;

/// What a timeline entry is, and how many of each a tree keeps (the rest are counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Exec,
    Read,
    Write,
    Connect,
    Lookup,
    Syscall,
    BlindSpot,
}

impl Kind {
    const ALL: [Kind; 7] =
        [Kind::Exec, Kind::Read, Kind::Write, Kind::Connect, Kind::Lookup, Kind::Syscall, Kind::BlindSpot];

    /// Entries of this kind without an alert kept per tree. An entry with an alert counts
    /// against [`MAX_ALERT_ENTRIES`] instead, so a flood of writes cannot hide a credential read.
    fn limit(self) -> usize {
        match self {
            Kind::Exec => 150,
            Kind::Write => 50,
            Kind::Connect | Kind::Lookup => 60,
            Kind::Read | Kind::Syscall => 0,
            Kind::BlindSpot => 20,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Exec => "exec",
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Connect => "connect",
            Kind::Lookup => "lookup",
            Kind::Syscall => "syscall",
            Kind::BlindSpot => "blind spot",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The category of credential files known only from a sweep.
const SWEPT: &str = "in a credential sweep";

/// Timeline entries with an alert kept per tree.
const MAX_ALERT_ENTRIES: usize = 200;

/// One line of a tree's timeline.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Nanoseconds since the epoch, when the time could be read (alerts from files carry text).
    pub at_ns: Option<i128>,
    /// The time as the alert gave it, when it could not be read.
    pub time_text: String,
    pub kind: Kind,
    pub pid: u32,
    /// The command, file, destination or name.
    pub what: String,
    /// The rule's name, the open flags, how a connect ended, ...
    pub detail: Option<String>,
    pub severity: Option<Severity>,
    /// The alert's number in the agent's local log (`show`).
    pub seq: Option<u64>,
    /// The same act again, this many times, that the sensor counted rather than sent.
    pub repeats: u64,
}

/// A process of a tree, for the drawing.
#[derive(Clone, Debug)]
pub struct Process {
    pub parent: Option<u32>,
    /// Its command line (the latest it executed).
    pub command: String,
    /// When it was first seen, for a stable order among siblings.
    pub order: u64,
    pub worst: Option<Severity>,
}

/// Which tree: its host, its root's pid, and which input it came from (pids of two traces are
/// two histories).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TreeKey {
    pub source: u32,
    pub host: String,
    pub root_pid: u32,
}

#[derive(Debug, Default)]
pub struct Tree {
    /// The first package its code ran as, or its manager.
    pub package: Option<String>,
    /// `package` names a package (not only its manager).
    package_named: bool,
    pub worst: Option<Severity>,
    pub alerts: u64,
    pub user: Option<u32>,
    pub order: u64,
    /// Its root exited (blind spots after that are not its own).
    ended: bool,
    pub timeline: Vec<Entry>,
    kept: [usize; Kind::ALL.len()],
    kept_alerts: usize,
    /// Entries past the limits, by kind, and alerts.
    pub not_shown: [u64; Kind::ALL.len()],
    pub alerts_not_shown: u64,
    pub processes: BTreeMap<u32, Process>,
    pub processes_not_shown: u64,
    lookups: HashMap<u32, String>,
    gaps: BTreeSet<String>,
}

impl Tree {
    fn push(&mut self, entry: Entry) {
        if entry.severity.is_some() {
            if self.kept_alerts < MAX_ALERT_ENTRIES {
                self.kept_alerts += 1;
                self.timeline.push(entry);
            } else {
                self.alerts_not_shown += 1;
            }
        } else if self.kept[entry.kind.index()] < entry.kind.limit() {
            self.kept[entry.kind.index()] += 1;
            self.timeline.push(entry);
        } else {
            self.not_shown[entry.kind.index()] += 1;
        }
    }

    /// An alert about what an event of the replay already put on the timeline marks that
    /// entry rather than adding one.
    fn mark(&mut self, entry: &Entry) -> bool {
        let mut recent = self.timeline.iter_mut().rev().take(16);
        let same =
            |e: &&mut Entry| e.pid == entry.pid && e.kind == entry.kind && e.at_ns.is_some() && e.at_ns == entry.at_ns;
        let Some(found) = recent.find(same) else { return false };
        if found.severity.is_none() && self.kept_alerts < MAX_ALERT_ENTRIES {
            self.kept_alerts += 1;
            self.kept[found.kind.index()] -= 1;
        }
        found.severity = found.severity.max(entry.severity);
        found.detail.clone_from(&entry.detail);
        found.seq = found.seq.or(entry.seq);
        found.repeats = found.repeats.max(entry.repeats);
        true
    }

    /// The tree is named after its first package, or its manager until one is seen.
    fn name_package(&mut self, package: &AlertPackage) {
        let named = package.name.is_some();
        if self.package.is_none() || (named && !self.package_named) {
            self.package = Some(label(&key(package)));
            self.package_named = named;
        }
    }

    fn process(&mut self, pid: u32, parent: Option<u32>, command: &str, order: u64) -> Option<&mut Process> {
        if !self.processes.contains_key(&pid) {
            if self.processes.len() >= MAX_PROCESSES {
                self.processes_not_shown += 1;
                return None;
            }
            let process = Process { parent, command: command.to_owned(), order, worst: None };
            self.processes.insert(pid, process);
        }
        self.processes.get_mut(&pid)
    }

    fn merge(&mut self, other: Tree) {
        if self.package.is_none() || (other.package_named && !self.package_named) {
            (self.package, self.package_named) = (other.package, other.package_named);
        }
        self.worst = self.worst.max(other.worst);
        self.alerts += other.alerts;
        self.ended |= other.ended;
        for entry in other.timeline {
            self.push(entry);
        }
        for (index, count) in other.not_shown.iter().enumerate() {
            self.not_shown[index] += count;
        }
        self.alerts_not_shown += other.alerts_not_shown;
        self.processes_not_shown += other.processes_not_shown;
        for (pid, process) in other.processes {
            if self.processes.len() < MAX_PROCESSES {
                self.processes.entry(pid).or_insert(process);
            } else if !self.processes.contains_key(&pid) {
                self.processes_not_shown += 1;
            }
        }
    }
}

/// A package's verdict: how bad, in which steps, which rules.
#[derive(Debug, Default)]
pub struct Verdict {
    pub worst: Option<Severity>,
    pub steps: BTreeSet<String>,
    /// Rule id to its name and the alerts.
    pub rules: BTreeMap<String, (String, u64)>,
    pub alerts: u64,
    pub hosts: BTreeSet<String>,
    /// Hosts past [`MAX_HOSTS`] were left out of `hosts`.
    pub more_hosts: bool,
    /// What the first of its worst alerts was about.
    pub headline: Option<(Kind, String)>,
    pub first_seen: Option<String>,
    pub last_seen: Option<String>,
}

/// A credential file and the alerts about it.
#[derive(Debug, Default)]
pub struct FileSeen {
    pub rules: BTreeSet<String>,
    pub alerts: u64,
    pub worst: Option<Severity>,
}

/// A destination and who connected there.
#[derive(Debug, Default)]
pub struct Connection {
    /// The name looked up, when known.
    pub domain: Option<String>,
    /// `address:port`, or a socket's path.
    pub address: String,
    /// `[pid] command` of the first process that connected.
    pub by: String,
    pub connects: u64,
    pub worst: Option<Severity>,
    /// How it ended, when not as asked (refused by the box's proxy, failed).
    pub outcome: Option<String>,
}

/// A place and its alerts.
#[derive(Debug)]
pub struct PlaceSeen {
    pub alerts: u64,
    pub first_seen: String,
    pub last_seen: String,
}

/// What the incident page shows, gathered from alerts and (in a replay) events.
#[derive(Debug, Default)]
pub struct Incident {
    pub events: u64,
    pub alerts: u64,
    /// Some alert came from a tree `credwatch selftest` ran.
    pub selftest: bool,
    pub packages: BTreeMap<String, (PackageKey, Verdict)>,
    pub packages_not_shown: u64,
    pub trees: BTreeMap<TreeKey, Tree>,
    pub trees_not_shown: u64,
    /// Trees counted as not shown, so that their later events are not counted again.
    dropped: HashSet<TreeKey>,
    /// Category to path to its alerts.
    pub files: BTreeMap<String, BTreeMap<String, FileSeen>>,
    files_kept: usize,
    pub files_not_shown: u64,
    pub connections: BTreeMap<String, Connection>,
    pub connections_not_shown: u64,
    pub places: BTreeMap<Place, PlaceSeen>,
    pub places_not_shown: u64,
    /// The hosts of the inputs (a trace's header), for a page without alerts.
    pub hosts: BTreeSet<String>,
    /// What to rotate, with the hosts where.
    pub rotate: BTreeMap<String, BTreeSet<String>>,
    next_order: u64,
    source: u32,
    host: String,
}

/// The command line of argv as one string, unescaped (the renderer escapes); words with a
/// space quoted.
fn command(args: &[String], executable: &str) -> String {
    if args.is_empty() {
        return executable.to_owned();
    }
    let words: Vec<String> =
        args.iter().map(|a| if a.is_empty() || a.contains(' ') { format!("'{a}'") } else { a.clone() }).collect();
    words.join(" ")
}

fn rfc3339_ns(text: &str) -> Option<i128> {
    OffsetDateTime::parse(text, &Rfc3339).ok().map(OffsetDateTime::unix_timestamp_nanos)
}

fn is_write(flags: u64) -> bool {
    const O_ACCMODE: u64 = 0o3;
    const O_CREAT: u64 = 0o100;
    const O_TRUNC: u64 = 0o1000;
    flags & O_ACCMODE != 0 || flags & (O_CREAT | O_TRUNC) != 0
}

/// Adds `item` to `set` unless it is full; returns whether it was counted as not shown.
fn insert_bounded(set: &mut BTreeSet<String>, item: &str, max: usize) -> bool {
    if set.contains(item) {
        false
    } else if set.len() < max {
        set.insert(item.to_owned());
        false
    } else {
        true
    }
}

/// What an alert was about, as a timeline entry (time, pid and severity left to the caller).
fn alert_entry(alert: &Alert) -> (Kind, String) {
    if let Some(spot) = alert.credwatch.blind_spot.as_ref().filter(|_| alert.event.action == BLIND_SPOT_ACTION) {
        return (Kind::BlindSpot, blind_spot_text(spot));
    }
    if let Some(sweep) = &alert.credwatch.sweep {
        let what = if sweep.is_final { "swept (summary)" } else { "swept" };
        return (
            Kind::Read,
            format!("{what} {} kinds of credentials: {}", sweep.categories.len(), sweep.categories.join(", ")),
        );
    }
    if let Some(destination) = &alert.destination {
        return (Kind::Connect, destination_text(destination));
    }
    if let Some(syscall) = &alert.credwatch.syscall {
        let mut what = syscall.name.clone();
        if let Some(operation) = &syscall.operation {
            what = format!("{what} {operation}");
        }
        if let Some(pid) = syscall.target_pid {
            what = format!("{what} on pid {pid}");
        }
        return (Kind::Syscall, what);
    }
    match &alert.file {
        Some(file) => match (&file.renamed_from, &file.renamed_to) {
            (Some(from), _) => (Kind::Write, format!("{from} → {}", file.path)),
            (None, Some(to)) => (Kind::Write, format!("{} → {to}", file.path)),
            _ => {
                let write = file.flags.split('|').any(|f| matches!(f, "O_WRONLY" | "O_RDWR" | "O_CREAT" | "O_TRUNC"));
                (if write { Kind::Write } else { Kind::Read }, file.path.clone())
            }
        },
        None => (Kind::Exec, command(&alert.process.args, &alert.process.executable)),
    }
}

impl Incident {
    /// The events and alerts that follow come from a new input (a trace file), with its host.
    /// `source` tells inputs apart: replay's workers pass the file's index.
    pub fn begin_source(&mut self, source: u32, host: &str) {
        self.source = source;
        self.host = host.to_owned();
        insert_bounded(&mut self.hosts, host, MAX_HOSTS);
    }

    fn order(&mut self) -> u64 {
        self.next_order += 1;
        self.next_order
    }

    /// The tree, kept or made room for; `None` when it is one too many.
    fn tree(&mut self, key: TreeKey) -> Option<&mut Tree> {
        if !self.trees.contains_key(&key) {
            if self.dropped.contains(&key) {
                return None;
            }
            if self.trees.len() >= MAX_TREES {
                let quiet = self.trees.iter().filter(|(_, t)| t.alerts == 0).min_by_key(|(_, t)| t.order);
                match quiet.map(|(k, _)| k.clone()) {
                    Some(oldest) => {
                        self.trees.remove(&oldest);
                        self.dropped.insert(oldest);
                    }
                    None => {
                        self.dropped.insert(key);
                        self.trees_not_shown += 1;
                        return None;
                    }
                }
                self.trees_not_shown += 1;
            }
            let order = self.order();
            self.trees.insert(key.clone(), Tree { order, ..Tree::default() });
        }
        self.trees.get_mut(&key)
    }

    fn event_tree(&mut self, root_pid: u32) -> Option<&mut Tree> {
        let key = TreeKey { source: self.source, host: self.host.clone(), root_pid };
        self.tree(key)
    }

    fn verdict(&mut self, key: PackageKey) -> Option<&mut Verdict> {
        let id = label(&key);
        if !self.packages.contains_key(&id) && self.packages.len() >= MAX_PACKAGES {
            self.packages_not_shown += 1;
            return None;
        }
        Some(&mut self.packages.entry(id).or_insert_with(|| (key, Verdict::default())).1)
    }

    /// Takes in one event of a replay after the engine handled it, with the alerts it fired.
    pub fn observe(&mut self, engine: &Engine, event: &Event, alerts: &[Alert]) {
        self.events += 1;
        let time = event.time_ns;
        match &event.data {
            EventData::Exec(exec) => self.exec(engine, event.pid, time, exec),
            EventData::Fork(fork) => {
                if let Some(root) = engine.root_pid_of(event.pid) {
                    let order = self.order();
                    if let Some(tree) = self.event_tree(root) {
                        let command = tree.processes.get(&event.pid).map(|p| p.command.clone()).unwrap_or_default();
                        tree.process(fork.child_pid, Some(event.pid), &command, order);
                    }
                }
            }
            EventData::Exit(_) => {
                let key = TreeKey { source: self.source, host: self.host.clone(), root_pid: event.pid };
                if let Some(tree) = self.trees.get_mut(&key) {
                    tree.ended = true;
                }
            }
            EventData::Open(open) => self.write(engine, event.pid, time, open),
            EventData::Rename(rename) => self.rename(engine, event.pid, time, rename),
            EventData::Connect(connect) => self.connect(engine, event.pid, time, connect),
            EventData::DnsQuery(query) => {
                if let Some(root) = engine.root_pid_of(event.pid) {
                    if let Some(tree) = self.event_tree(root) {
                        if tree.lookups.len() < MAX_LOOKUPS || tree.lookups.contains_key(&event.pid) {
                            tree.lookups.insert(event.pid, query.name.clone());
                        }
                        let detail = Some(format!("{} query", query.qtype));
                        tree.push(entry(time, Kind::Lookup, event.pid, query.name.clone(), detail));
                    }
                }
            }
            EventData::Lost(lost) => {
                let what = format!("{} events lost ({})", lost.count, lost.source);
                self.blind_spot(time, event.pid, &what);
            }
            // Their alerts (`blind-spot-*`) put them on the timeline of each tree they concern.
            EventData::Syscall(_) | EventData::Root(_) | EventData::AgentGap(_) | EventData::BlindSpot(_) => {}
        }
        self.observe_alerts(alerts);
    }

    fn exec(&mut self, engine: &Engine, pid: u32, time: u64, exec: &Exec) {
        let Some(root) = engine.root_pid_of(pid) else { return };
        let package = engine.package_of(pid);
        if let Some(package) = package.as_ref().filter(|p| p.name.is_some()) {
            let step = package.lifecycle.clone();
            if let Some(verdict) = self.verdict(key(package)) {
                verdict.steps.extend(step);
            }
        }
        let order = self.order();
        let Some(tree) = self.event_tree(root) else { return };
        if let Some(package) = &package {
            tree.name_package(package);
        }
        tree.user.get_or_insert(exec.uid);
        let line = command(&exec.args, &exec.executable);
        let parent = Some(exec.ppid).filter(|ppid| *ppid != pid && tree.processes.contains_key(ppid));
        if let Some(process) = tree.process(pid, parent, &line, order) {
            process.command.clone_from(&line);
            process.parent = process.parent.or(parent);
        }
        let step = package.and_then(|p| p.lifecycle);
        tree.push(entry(time, Kind::Exec, pid, line, step));
    }

    fn write(&mut self, engine: &Engine, pid: u32, time: u64, open: &Open) {
        let path = open.target_path();
        if open.ret < 0 || !is_write(open.flags) || path.starts_with("/dev/") || path.starts_with("/proc/") {
            return;
        }
        self.package_write(engine, pid, time, path.to_owned(), Some(open_flags(open.flags)), open.repeats);
    }

    fn rename(&mut self, engine: &Engine, pid: u32, time: u64, rename: &Rename) {
        if rename.ret < 0 {
            return;
        }
        let old = rename.old_abs.as_deref().unwrap_or(&rename.old_path);
        let new = rename.new_abs.as_deref().unwrap_or(&rename.new_path);
        self.package_write(engine, pid, time, format!("{old} → {new}"), Some(rename.syscall.clone()), 0);
    }

    /// A write of package code: a process of a named package, not the tree's root (the
    /// manager installing the package writes its cache, its logs and the project's files).
    fn package_write(
        &mut self,
        engine: &Engine,
        pid: u32,
        time: u64,
        what: String,
        detail: Option<String>,
        repeats: u64,
    ) {
        let Some(root) = engine.root_pid_of(pid).filter(|root| *root != pid) else { return };
        if engine.package_of(pid).is_none_or(|p| p.name.is_none()) {
            return;
        }
        if let Some(tree) = self.event_tree(root) {
            tree.push(Entry { repeats, ..entry(time, Kind::Write, pid, what, detail) });
        }
    }

    fn connect(&mut self, engine: &Engine, pid: u32, time: u64, connect: &Connect) {
        let Some(root) = engine.root_pid_of(pid) else { return };
        let Some(tree) = self.event_tree(root) else { return };
        let destination = AlertDestination {
            address: connect.address.clone().or(connect.path.clone()).unwrap_or_default(),
            port: connect.port,
            domain: connect.proxy_refused.clone().or_else(|| tree.lookups.get(&pid).cloned()),
            family: connect.family.clone(),
            socket_type: connect.socket_type.clone(),
        };
        let outcome = match (&connect.proxy_refused, connect.ret) {
            (Some(_), _) => Some("refused by the box's proxy".to_owned()),
            (None, Some(ret)) if ret < 0 => Some(format!("failed ({ret})")),
            _ => None,
        };
        let by = tree.processes.get(&pid).map(|p| format!("[{pid}] {}", p.command)).unwrap_or(format!("[{pid}]"));
        let repeats = connect.repeats;
        tree.push(Entry {
            repeats,
            ..entry(time, Kind::Connect, pid, destination_text(&destination), outcome.clone())
        });
        self.connection(&destination, by, None, outcome, 1);
    }

    /// Counts `connects` connects to `destination` (0 for an alert about a connect the
    /// replay's events counted already).
    fn connection(
        &mut self,
        destination: &AlertDestination,
        by: String,
        severity: Option<Severity>,
        outcome: Option<String>,
        connects: u64,
    ) {
        let text = destination_text(destination);
        if !self.connections.contains_key(&text) && self.connections.len() >= MAX_CONNECTIONS {
            self.connections_not_shown += 1;
            return;
        }
        let address = match destination.port {
            Some(port) => crate::net::host_port(&destination.address, port),
            None => destination.address.clone(),
        };
        let seen = self.connections.entry(text).or_insert_with(|| Connection {
            domain: destination.domain.clone().filter(|d| *d != destination.address),
            address,
            by,
            ..Connection::default()
        });
        seen.connects += connects;
        seen.worst = seen.worst.max(severity);
        if seen.outcome.is_none() {
            seen.outcome = outcome;
        }
    }

    /// A blind spot of the source: on the timeline of each of its trees still running.
    fn blind_spot(&mut self, time: u64, pid: u32, what: &str) {
        let source = self.source;
        for (_, tree) in self.trees.iter_mut().filter(|(k, t)| k.source == source && !t.ended) {
            tree.push(entry(time, Kind::BlindSpot, pid, what.to_owned(), None));
        }
    }

    /// Takes in alerts (a replay's, or read from a log or files).
    pub fn observe_alerts(&mut self, alerts: &[Alert]) {
        for alert in alerts {
            self.observe_alert(None, alert);
        }
    }

    /// Takes in one alert; `seq` is its number in the agent's local log, when it has one.
    pub fn observe_alert(&mut self, seq: Option<u64>, alert: &Alert) {
        self.alerts += 1;
        self.selftest |= alert.credwatch.selftest;
        let severity = alert.rule.severity;
        let host = alert.host.name.as_str();
        let (kind, what) = alert_entry(alert);
        let order = self.order();

        if let Some(verdict) = self.verdict(key(&alert.package)) {
            verdict.alerts += 1;
            verdict.steps.extend(alert.package.lifecycle.clone());
            let rule = verdict.rules.entry(alert.rule.id.clone()).or_insert_with(|| (alert.rule.name.clone(), 0));
            rule.1 += 1;
            if verdict.worst < Some(severity) {
                verdict.worst = Some(severity);
                verdict.headline = Some((kind, what.clone()));
            }
            verdict.more_hosts |= insert_bounded(&mut verdict.hosts, host, MAX_HOSTS);
            let time = &alert.timestamp;
            if verdict.first_seen.as_ref().is_none_or(|first| time < first) {
                verdict.first_seen = Some(time.clone());
            }
            if verdict.last_seen.as_ref().is_none_or(|last| time > last) {
                verdict.last_seen = Some(time.clone());
            }
        }
        for item in &alert.credwatch.rotate {
            let hosts = self.rotate.entry(item.clone()).or_default();
            insert_bounded(hosts, host, MAX_HOSTS);
        }
        self.place(alert);
        self.files_of(alert);
        if let Some(destination) = &alert.destination {
            let by = format!("[{}] {}", alert.process.pid, command(&alert.process.args, &alert.process.executable));
            let outcome = (alert.event.outcome != "alerted").then(|| alert.event.outcome.clone());
            // In a replay the connect's event counted it.
            let connects = u64::from(self.events == 0);
            self.connection(destination, by, Some(severity), outcome, connects);
        }

        let key = TreeKey { source: self.source, host: host.to_owned(), root_pid: alert.credwatch.root_pid };
        let Some(tree) = self.tree(key) else { return };
        tree.alerts += 1;
        tree.worst = tree.worst.max(Some(severity));
        tree.user.get_or_insert(alert.user.id);
        tree.name_package(&alert.package);
        let chain = alert.process.ancestors.iter().map(|a| (a.pid, command(&a.args, &a.executable)));
        let mut parent = None;
        for (pid, line) in
            chain.chain(std::iter::once((alert.process.pid, command(&alert.process.args, &alert.process.executable))))
        {
            if let Some(process) = tree.process(pid, parent, &line, order) {
                process.parent = process.parent.or(parent).filter(|p| *p != pid);
            }
            parent = Some(pid);
        }
        if let Some(process) = tree.processes.get_mut(&alert.process.pid) {
            process.worst = process.worst.max(Some(severity));
        }
        let at_ns = rfc3339_ns(&alert.timestamp);
        if let Some(spot) = alert.credwatch.blind_spot.as_ref().filter(|s| s.cause == BlindSpotCause::Gap) {
            // Its own entry tells the gap: the alerts inside it need not, nor those before it
            // (a tree that started in the gap alerts for it once the gap's events are over).
            if !tree.gaps.insert(spot.since.clone()) {
                let told = |e: &Entry| e.kind == Kind::BlindSpot && e.severity.is_none() && e.time_text == spot.since;
                let before = tree.timeline.len();
                tree.timeline.retain(|e| !told(e));
                tree.kept[Kind::BlindSpot.index()] -= before - tree.timeline.len();
            }
        }
        if let Some(gap) = &alert.credwatch.gap {
            if tree.gaps.len() < Kind::BlindSpot.limit() && tree.gaps.insert(gap.down_from.clone()) {
                let how = if gap.clean_stop || gap.stopped { "stopped" } else { "down" };
                tree.push(Entry {
                    at_ns: rfc3339_ns(&gap.down_from),
                    time_text: gap.down_from.clone(),
                    kind: Kind::BlindSpot,
                    pid: alert.process.pid,
                    what: format!("credwatch was {how} until {} ({:.1} s); caught up after", gap.down_to, gap.seconds),
                    detail: None,
                    severity: None,
                    seq: None,
                    repeats: 0,
                });
            }
        }
        let mut detail = alert.rule.name.clone();
        if let Some(file) = &alert.file {
            if !file.flags.is_empty() {
                detail = format!("{detail} · {}", file.flags);
            }
        }
        if alert.event.outcome != "alerted" {
            detail = format!("{detail} · {}", alert.event.outcome);
        }
        if alert.credwatch.contained {
            detail.push_str(" · contained");
        }
        if let Some(count) = alert.credwatch.count {
            detail = format!("{detail} · repeated {count} times");
        }
        let entry = Entry {
            at_ns,
            time_text: alert.timestamp.clone(),
            kind,
            pid: alert.process.pid,
            what,
            detail: Some(detail),
            severity: Some(severity),
            seq,
            repeats: 0,
        };
        if !tree.mark(&entry) {
            tree.push(entry);
        }
    }

    fn place(&mut self, alert: &Alert) {
        let place = Place::of(alert);
        let time = &alert.timestamp;
        let room = self.places.len() < MAX_PLACES;
        match self.places.get_mut(&place) {
            Some(seen) => {
                seen.alerts += 1;
                if *time < seen.first_seen {
                    seen.first_seen.clone_from(time);
                }
                if *time > seen.last_seen {
                    seen.last_seen.clone_from(time);
                }
            }
            None if room => {
                let seen = PlaceSeen { alerts: 1, first_seen: time.clone(), last_seen: time.clone() };
                self.places.insert(place, seen);
            }
            None => self.places_not_shown += 1,
        }
    }

    /// The alert's credential files, under its rule's category. A sweep does not say which of
    /// its files was which kind: each goes under the category an alert of its own gave it, else
    /// under [`SWEPT`].
    fn files_of(&mut self, alert: &Alert) {
        let own = alert.file.iter().map(|f| f.path.clone());
        // The sweep's own file is among its files: counted once.
        let swept = alert
            .credwatch
            .sweep
            .iter()
            .flat_map(|sweep| sweep.files.iter())
            .filter(|path| alert.file.as_ref().is_none_or(|file| file.path != **path));
        let swept = swept.cloned();
        let paths: Vec<(String, String)> = match &alert.credwatch.sweep {
            None => own.map(|path| (alert.rule.category.clone(), path)).collect(),
            Some(_) => own
                .chain(swept)
                .map(|path| {
                    let known = self.files.iter().find(|(_, paths)| paths.contains_key(&path));
                    (known.map_or(SWEPT.to_owned(), |(category, _)| category.clone()), path)
                })
                .collect(),
        };
        for (category, path) in paths {
            let known = self.files.get(&category).is_some_and(|paths| paths.contains_key(&path));
            if !known && self.files_kept >= MAX_FILES {
                self.files_not_shown += 1;
                continue;
            }
            self.files_kept += usize::from(!known);
            let seen = self.files.entry(category).or_default().entry(path).or_default();
            seen.rules.insert(alert.rule.id.clone());
            seen.alerts += 1;
            seen.worst = seen.worst.max(Some(alert.rule.severity));
        }
    }

    /// Adds another worker's gatherings (replay's threads each keep one).
    pub fn merge(&mut self, other: Incident) {
        self.events += other.events;
        self.alerts += other.alerts;
        self.selftest |= other.selftest;
        self.packages_not_shown += other.packages_not_shown;
        for (id, (key, theirs)) in other.packages {
            if !self.packages.contains_key(&id) && self.packages.len() >= MAX_PACKAGES {
                self.packages_not_shown += 1;
                continue;
            }
            let ours = &mut self.packages.entry(id).or_insert_with(|| (key, Verdict::default())).1;
            if ours.worst < theirs.worst {
                ours.headline = theirs.headline;
            }
            ours.worst = ours.worst.max(theirs.worst);
            ours.steps.extend(theirs.steps);
            for (rule, (name, count)) in theirs.rules {
                ours.rules.entry(rule).or_insert((name, 0)).1 += count;
            }
            ours.alerts += theirs.alerts;
            ours.more_hosts |= theirs.more_hosts;
            for host in &theirs.hosts {
                ours.more_hosts |= insert_bounded(&mut ours.hosts, host, MAX_HOSTS);
            }
            ours.first_seen = [ours.first_seen.take(), theirs.first_seen].into_iter().flatten().min();
            ours.last_seen = [ours.last_seen.take(), theirs.last_seen].into_iter().flatten().max();
        }
        self.trees_not_shown += other.trees_not_shown;
        for (key, tree) in other.trees {
            match self.trees.get_mut(&key) {
                Some(ours) => ours.merge(tree),
                None => {
                    let order = tree.order;
                    if self.tree(key.clone()).is_some() {
                        if let Some(slot) = self.trees.get_mut(&key) {
                            *slot = Tree { order, ..tree };
                        }
                    }
                }
            }
        }
        for (category, paths) in other.files {
            for (path, theirs) in paths {
                let known = self.files.get(&category).is_some_and(|p| p.contains_key(&path));
                if !known && self.files_kept >= MAX_FILES {
                    self.files_not_shown += 1;
                    continue;
                }
                self.files_kept += usize::from(!known);
                let ours = self.files.entry(category.clone()).or_default().entry(path).or_default();
                ours.rules.extend(theirs.rules);
                ours.alerts += theirs.alerts;
                ours.worst = ours.worst.max(theirs.worst);
            }
        }
        self.files_not_shown += other.files_not_shown;
        for (text, theirs) in other.connections {
            let room = self.connections.len() < MAX_CONNECTIONS;
            match self.connections.get_mut(&text) {
                Some(ours) => {
                    ours.connects += theirs.connects;
                    ours.worst = ours.worst.max(theirs.worst);
                }
                None if room => {
                    self.connections.insert(text, theirs);
                }
                None => self.connections_not_shown += 1,
            }
        }
        self.connections_not_shown += other.connections_not_shown;
        for (place, theirs) in other.places {
            let room = self.places.len() < MAX_PLACES;
            match self.places.get_mut(&place) {
                Some(ours) => {
                    ours.alerts += theirs.alerts;
                    ours.first_seen = ours.first_seen.clone().min(theirs.first_seen);
                    ours.last_seen = ours.last_seen.clone().max(theirs.last_seen);
                }
                None if room => {
                    self.places.insert(place, theirs);
                }
                None => self.places_not_shown += 1,
            }
        }
        self.places_not_shown += other.places_not_shown;
        for host in &other.hosts {
            insert_bounded(&mut self.hosts, host, MAX_HOSTS);
        }
        for (item, hosts) in other.rotate {
            let ours = self.rotate.entry(item).or_default();
            for host in &hosts {
                insert_bounded(ours, host, MAX_HOSTS);
            }
        }
    }
}

/// The page of alert `seq` of the local alert log with the other alerts of its tree
/// (`show SEQ --html`).
pub fn page_of_tree(seq: u64, tree: &[&(u64, Alert)]) -> String {
    let mut incident = Incident::default();
    for (number, alert) in tree {
        incident.observe_alert(Some(*number), alert);
    }
    render(&incident, &Origin::Show { seq })
}

fn entry(time_ns: u64, kind: Kind, pid: u32, what: String, detail: Option<String>) -> Entry {
    Entry {
        at_ns: Some(i128::from(time_ns)),
        time_text: String::new(),
        kind,
        pid,
        what,
        detail,
        severity: None,
        seq: None,
        repeats: 0,
    }
}

/// A replay's sink: every event, and every alert (held ones and the stream's last included).
impl Sink for Incident {
    fn event(&mut self, engine: &Engine, event: &Event, alerts: &[Alert]) -> Result<(), SinkError> {
        self.observe(engine, event, alerts);
        Ok(())
    }

    fn released(&mut self, _: &Engine, alerts: &[Alert]) -> Result<(), SinkError> {
        self.observe_alerts(alerts);
        Ok(())
    }

    fn end(&mut self, alerts: &[Alert]) -> Result<(), SinkError> {
        self.observe_alerts(alerts);
        Ok(())
    }
}
