//! The engine: process table (lineage and attribution), rules, alert decisions. It sees only
//! [`Event`]s and never reads the filesystem or `/proc`, so replaying a trace gives the same
//! alerts as watching live.
//!
//! Lineage is fixed at fork: a child's parent is the process that forked it, whatever the
//! kernel later reparents it to. A process belongs to a tree when it is a root (it executed
//! a package manager, or `credwatch run` marked it) or when a member forked it. Only members
//! alert; events about other processes are ignored.
//!
//! Alerts go out per tree, deduplicated and folded:
//! - an alert identical to an earlier one of the tree (same rule, and same file, command or
//!   syscall) is counted, and printed again only at its 10th, 100th, 1000th, ... time, with
//!   `credwatch.count`;
//! - when a tree's credential alerts cover the sweep's `min_categories` categories within its
//!   window (event time), one sweep alert replaces the one that got there; the tree's later
//!   credential alerts are folded into it, and a final summary of the sweep (with the counts)
//!   goes out when the tree ends, or at [`Engine::flush`] for trees still running at the end of
//!   the stream. All of it depends on the events alone, so replay still equals live.
//!
//! A read at the rule's severity of a file of a configuration chain (a loader actor's
//! `after_opens`) is held until the chain's window after it closes: another file of the chain
//! opened by the same process within it lowers it like the later reads. It goes out when an
//! event (of any process) is past the window, when the process ends or raises an alert about
//! another credential, at [`Engine::tick`] (a live source's clock past the window) or at
//! [`Engine::flush`], through dedup and sweeps as of its read. What the kernel stopped is
//! never held.
//!
//! Its parts: `process` keeps the process table (lineage, what each process runs, its tree),
//! `matching` judges each event against the rules, `alerts` builds the alerts and decides
//! which go out (dedup, and `sweep` for sweeps); `blind` alerts on what the sensor missed,
//! `egress` correlates connects and look-ups with credentials touched, and `attribution` names
//! the package a process runs for.

mod alerts;
mod attribution;
mod blind;
mod egress;
mod matching;
mod process;
mod sweep;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::{Arc, Mutex},
};

pub use self::matching::open_flags;
use self::{
    alerts::Held,
    process::{Proc, Tree},
    sweep::sweep_summary,
};
use crate::{
    alert::{rfc3339, Alert, AlertGap, BLIND_SPOT_ACTION},
    event::{Event, EventData},
    rules::RuleSet,
};

#[derive(Clone, Debug, Default)]
pub struct EngineOptions {
    /// `host.name` of the alerts.
    pub host_name: String,
    /// `host.id` of the alerts (the machine id), when known.
    pub host_id: Option<String>,
    /// `agent.version` of the alerts: the credwatch that watched (a replay: the one that
    /// recorded the trace).
    pub agent_version: Option<String>,
    /// The project's own scripts and programs (`npm run dev`, `cargo test`) alert like package
    /// code (CI jobs that run untrusted pull requests' tests).
    pub watch_project: bool,
    /// The home of processes whose events carry no `HOME` (`--home`): beats the home inferred
    /// from a manager's own reads, which beats `passwd`.
    pub home: Option<String>,
    /// Homes by uid, from the traced host's passwd file (`--passwd`).
    pub passwd: HashMap<u32, String>,
    /// `run --contain`: the files its box replaced by empty ones. An alert about them says so
    /// (`credwatch.contained`) and has nothing to rotate.
    pub contained: BTreeSet<String>,
}

/// The roots of the trees `credwatch selftest` registered with `watch` (by pid), shared with the
/// thread that takes the registrations: their alerts carry `credwatch.selftest` until the root
/// exits.
pub type SelftestRoots = Arc<Mutex<HashSet<u32>>>;

/// Why a running engine does not take new rules.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(
        "the package managers or coding agents changed: the kernel programs were given them at start-up, so this change needs a restart"
    )]
    ManagersChanged,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub events: u64,
    pub alerts: u64,
    /// Events the sources reported lost (`Lost` events).
    pub lost: u64,
    /// Entries in the process table (live members and the ancestors they keep).
    pub processes: usize,
    /// Entries dropped because the table was full (their exits were probably lost).
    pub evicted: u64,
    /// Repeats of an identical alert that were counted, not printed.
    pub repeats: u64,
    /// Credential alerts folded into a sweep.
    pub folded: u64,
}

/// Identifies one process (not one pid: pids are reused) in the table.
type Id = u64;

pub struct Engine {
    /// Shared with the sensor, which registers the same rules' files with the kernel: one copy.
    rules: Arc<RuleSet>,
    options: EngineOptions,
    /// By id, so the oldest entry is the first.
    procs: BTreeMap<Id, Proc>,
    /// The latest process of each pid.
    by_pid: HashMap<u32, Id>,
    next_id: Id,
    /// By root id (ordered, so that summaries come out in a fixed order).
    trees: BTreeMap<Id, Tree>,
    /// Sweep summaries of trees that ended, for the caller of `handle`.
    pending: Vec<Alert>,
    stats: EngineStats,
    /// Credentials touched per tree and names looked up per process (see `egress`).
    egress: egress::Egress,
    /// The last time the source was down (`AgentGap`): alerts on events of that time say so.
    gap: Option<AlertGap>,
    /// The gap's bounds, wall-clock ns.
    gap_ns: (u64, u64),
    /// Alerts on reads of configuration chains, until their window closes.
    held: Vec<Held>,
    /// Set by [`Engine::mark_selftests`]; kept through reloads.
    selftest_roots: Option<SelftestRoots>,
    /// Blind spots folded, trees that ended, the trees a gap alerted for (see `blind`).
    blind: blind::Blind,
}

impl Engine {
    pub fn new(rules: impl Into<Arc<RuleSet>>, options: EngineOptions) -> Engine {
        Engine {
            rules: rules.into(),
            options,
            procs: BTreeMap::new(),
            by_pid: HashMap::new(),
            next_id: 0,
            trees: BTreeMap::new(),
            pending: Vec::new(),
            stats: EngineStats::default(),
            egress: egress::Egress::default(),
            gap: None,
            gap_ns: (0, 0),
            held: Vec::new(),
            selftest_roots: None,
            blind: blind::Blind::default(),
        }
    }

    /// From now on, alerts of the trees whose root pid is in `roots` are marked as a self-test's
    /// (`credwatch.selftest`), and a root leaves the set when it exits.
    pub fn mark_selftests(&mut self, roots: SelftestRoots) {
        self.selftest_roots = Some(roots);
    }

    pub fn rules(&self) -> &RuleSet {
        &self.rules
    }

    /// The rules, to share rather than copy.
    pub fn shared_rules(&self) -> &Arc<RuleSet> {
        &self.rules
    }

    /// Whether [`Engine::reload`] takes `rules`: their package managers must be the running
    /// ones (the kernel programs and the process table know them by position).
    pub fn check_reload(&self, rules: &RuleSet) -> Result<(), ReloadError> {
        if rules.kernel_roots() == self.rules.kernel_roots() {
            Ok(())
        } else {
            Err(ReloadError::ManagersChanged)
        }
    }

    /// New rules and options (a reload), keeping the process table: running trees stay
    /// attributed, and what they already raised stays deduplicated and in their sweeps under
    /// the rules of the same id (a rule gone is forgotten).
    pub fn reload(&mut self, rules: impl Into<Arc<RuleSet>>, options: EngineOptions) -> Result<(), ReloadError> {
        let rules = rules.into();
        self.check_reload(&rules)?;
        let by_id: HashMap<&str, usize> = rules.rules().iter().enumerate().map(|(i, r)| (r.id.as_str(), i)).collect();
        let remap: Vec<Option<usize>> =
            self.rules.rules().iter().map(|rule| by_id.get(rule.id.as_str()).copied()).collect();
        for tree in self.trees.values_mut() {
            tree.remap_rules(&remap);
        }
        self.held.retain_mut(|held| held.remap_rules(&remap));
        // A manager's `project_code` entry is a position in the new rules' list: found again
        // from what it executed, then handed to the children it forked that have not executed yet.
        for p in self.procs.values_mut() {
            if let (Some(own), Some(manager)) = (&mut p.manager_self, p.manager) {
                if own.project.is_some() {
                    own.project = rules.project_command(manager, &p.filename, &p.args);
                }
            }
        }
        let project_of =
            |parent: Option<&Proc>| parent.and_then(|parent| parent.manager_self).and_then(|own| own.project);
        self.set_from_parent(
            |p| p.started_by_project.is_some(),
            |_, parent| project_of(parent),
            |p, entry| p.started_by_project = entry,
        );
        // Tools of a project command (rustdoc) likewise, then the children they have just forked.
        self.set_from_parent(
            |p| p.project_tool.is_some(),
            |p, parent| project_of(parent).and_then(|entry| Some((entry, rules.project_tool(entry, &p.executable)?))),
            |p, tool| p.project_tool = tool,
        );
        self.set_from_parent(
            |p| p.started_by_tool.is_some(),
            |_, parent| parent.and_then(|tool| tool.project_tool),
            |p, tool| p.started_by_tool = tool,
        );
        self.rules = rules;
        self.options = options;
        Ok(())
    }

    /// After a reload: `set` on every process that `wanted` picks, of what `value` finds again
    /// from it and its parent (whose own state the reload already updated).
    fn set_from_parent<T>(
        &mut self,
        wanted: impl Fn(&Proc) -> bool,
        value: impl Fn(&Proc, Option<&Proc>) -> T,
        set: impl Fn(&mut Proc, T),
    ) {
        let found: Vec<(Id, T)> = self
            .procs
            .iter()
            .filter(|(_, p)| wanted(p))
            .map(|(&id, p)| (id, value(p, p.parent.and_then(|parent| self.procs.get(&parent)))))
            .collect();
        for (id, value) in found {
            set(self.procs.get_mut(&id).expect("listed above"), value);
        }
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats { processes: self.procs.len(), ..self.stats }
    }

    /// Updates the process table with `event` and returns the alerts it fires, after the held
    /// alerts it releases.
    pub fn handle(&mut self, event: &Event) -> Vec<Alert> {
        self.stats.events += 1;
        // Past their window: nothing from here on can lower them.
        let mut released = self.release_due(event.time_ns);
        // The unit an exiting process was in, for a gap's alerts.
        let unit_before = self.gap.as_ref().and_then(|_| self.unit_of(event.pid));
        let mut alerts = match &event.data {
            EventData::Exec(exec) => {
                let alerts = self.exec(event, exec);
                self.note_package(event.pid);
                alerts
            }
            EventData::Fork(fork) => {
                self.fork(event.pid, fork.child_pid);
                Vec::new()
            }
            EventData::Exit(_) => {
                if let Some(id) = self.live(event.pid) {
                    released.extend(self.release_of(id));
                }
                self.exit(event.pid);
                Vec::new()
            }
            EventData::Root(_) => {
                self.root(event.pid);
                Vec::new()
            }
            EventData::Open(open) => self.open(event, open),
            EventData::Rename(rename) => self.rename(event, rename),
            EventData::Syscall(syscall) => self.syscall(event, syscall),
            EventData::Connect(connect) => self.connect(event, connect),
            EventData::DnsQuery(query) => self.dns_query(event, query),
            EventData::Lost(lost) => {
                self.stats.lost += lost.count;
                Vec::new()
            }
            EventData::AgentGap(gap) => {
                self.gap_ns = (gap.since_ns, event.time_ns);
                self.gap = Some(AlertGap {
                    down_from: rfc3339(gap.since_ns),
                    down_to: rfc3339(event.time_ns),
                    seconds: event.time_ns.saturating_sub(gap.since_ns) as f64 / 1e9,
                    clean_stop: gap.clean_stop,
                    stopped: gap.stopped,
                });
                self.gap_began(gap, event.time_ns)
            }
            EventData::BlindSpot(spot) => self.blind_spot(spot),
        };
        if !matches!(event.data, EventData::AgentGap(_)) {
            // The gap first: what the tree did in it comes after.
            let mut gap_alerts = self.gap_event(event, unit_before);
            gap_alerts.append(&mut alerts);
            alerts = gap_alerts;
        }
        alerts.append(&mut self.pending);
        if let Some(gap) = self.gap.as_ref().filter(|_| (self.gap_ns.0..=self.gap_ns.1).contains(&event.time_ns)) {
            // A gap's own alert says it already.
            for alert in alerts.iter_mut().filter(|alert| alert.event.action != BLIND_SPOT_ACTION) {
                alert.credwatch.gap = Some(gap.clone());
            }
        }
        released.append(&mut alerts);
        let released = self.out(released);
        if let (EventData::Exit(_), Some(roots)) = (&event.data, &self.selftest_roots) {
            // After its own alerts (a sweep's final summary) were marked.
            roots.lock().unwrap_or_else(|e| e.into_inner()).remove(&event.pid);
        }
        released
    }

    /// A live source's clock (event time) with no event to tell it: the held alerts whose
    /// window closed before `now_ns` go out, so that an idle machine still gets them.
    pub fn tick(&mut self, now_ns: u64) -> Vec<Alert> {
        let mut alerts = self.release_due(now_ns);
        alerts.extend(self.gap_tick(now_ns));
        self.out(alerts)
    }

    /// The end of the stream: the held alerts (their window cut short: nothing follows), then
    /// the final summaries of sweeps whose trees are still running and folded alerts since
    /// their last summary. Call it once the last event was handled (live: when the session
    /// ends; replay: at the end of each file).
    pub fn flush(&mut self) -> Vec<Alert> {
        let mut alerts = self.release_all();
        alerts.extend(self.gap_due());
        let (rules, contained) = (&self.rules, &self.options.contained);
        alerts.extend(self.trees.values_mut().filter_map(|tree| sweep_summary(rules, contained, &mut tree.sweep)));
        alerts.extend(self.blind_flush());
        self.out(alerts)
    }

    /// Alerts as they leave the engine: counted, with their ids.
    fn out(&mut self, mut alerts: Vec<Alert>) -> Vec<Alert> {
        self.stats.alerts += alerts.len() as u64;
        if let Some(roots) = self.selftest_roots.as_ref().filter(|_| !alerts.is_empty()) {
            let roots = roots.lock().unwrap_or_else(|e| e.into_inner());
            for alert in &mut alerts {
                alert.credwatch.selftest = roots.contains(&alert.credwatch.root_pid);
            }
        }
        set_ids(&mut alerts);
        alerts
    }
}

/// `event.id` of alerts as they leave the engine, in their final form.
fn set_ids(alerts: &mut [Alert]) {
    for alert in alerts {
        alert.event.id = alert.stable_id();
    }
}

#[cfg(test)]
mod tests;
