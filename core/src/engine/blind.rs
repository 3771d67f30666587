//! Blind spots: what went unseen of a tree (records the kernel could not send, a ring that
//! overflowed, a process it could not mark, the agent down or stopped) alerts by the rules of
//! `kind: blind_spot`, naming the tree and its packages, the window and the counts.
//!
//! The sensor reports a tree's losses at each poll while they last, so reports of one tree and
//! rule are folded: the first alerts, later ones add to it, and the sum goes out again when a
//! lost record turns out to be a credential's, when [`FOLD_NS`] of event time passed since it
//! last went out, and (`final`) when the tree leaves the table or the stream ends. A gap alerts
//! once per tree live in it: alive when the gap is told (at once), or with an event timed inside
//! it (the records that waited in the rings, and an adopting agent's seeded execs: once the
//! gap's events are over, the first event past it, the live clock past it, the tree's end or
//! the stream's, so that the alert names the packages they ran).

use std::collections::{BTreeMap, BTreeSet};

use super::{alerts::Stop, process::Proc, Engine, Id};
use crate::{
    alert::{
        rfc3339, Alert, AlertAgent, AlertBlindSpot, AlertCredwatch, AlertEvent, AlertFile, AlertHost, AlertPackage,
        AlertParent, AlertProcess, AlertRule, AlertUser, BlindSpotCause, BLIND_SPOT_ACTION,
    },
    event::{normalize_path, AgentGap, BlindSpot, Event, EventData, Open},
    output::UNKNOWN_TREE_MANAGER,
    rules::{Rule, RuleKind},
};

/// Event time after which a folded blind spot that is still growing goes out again.
const FOLD_NS: u64 = 60_000_000_000;
/// Most (tree, rule) pairs folded at once; past it, a new one alerts without folding.
const MAX_FOLDED: usize = 4096;
/// Most named packages remembered per tree.
const MAX_PACKAGES: usize = 16;
/// Trees remembered after they left the table: the sensor tells a tree's losses at its next
/// poll, often after the tree's last exit.
const MAX_ENDED: usize = 256;

/// Whose acts went unseen, as the engine knows the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Whose {
    /// A tree in the table, by its root's (or its unit's) entry.
    Tree(Id),
    /// A root pid the table does not hold (the tree ended, or its exec went unseen too).
    Pid(u32),
    /// The kernel could not tell which tree.
    Unknown,
}

/// A tree as blind-spot alerts name it: an alert about its root with no rule yet, and the home
/// its credentials are under.
#[derive(Clone, Debug)]
pub(super) struct Named {
    base: Alert,
    home: Option<String>,
}

/// A blind spot that went out, and what was reported since.
pub(super) struct Folded {
    alert: Alert,
    since_ns: u64,
    until_ns: u64,
    /// `until_ns` of the report that last went out.
    sent_ns: u64,
    unreported: bool,
}

/// The state of blind spots (see the module's documentation).
#[derive(Default)]
pub(super) struct Blind {
    folded: BTreeMap<(Whose, String), Folded>,
    /// Trees that left the table, latest last: (root pid, name).
    ended: Vec<(u32, Named)>,
    /// The last gap, as its alerts say it.
    gap_spot: Option<AlertBlindSpot>,
    /// The trees (units) the last gap alerted for, or will.
    gap_told: BTreeSet<Id>,
    /// Trees with an event inside the last gap, whose alert waits until its events are over.
    gap_pending: BTreeSet<Id>,
    /// Since the gap was told, only an adopting agent's seeded execs (and their forks) came.
    seeding: bool,
}

impl Engine {
    /// A tree's process executed: the tree (and the unit it is in) remember its package.
    pub(super) fn note_package(&mut self, pid: u32) {
        let Some(id) = self.live(pid) else { return };
        let p = &self.procs[&id];
        if p.attribution.name.is_none() {
            return;
        }
        let package = self.package(p);
        for tree in BTreeSet::from([p.root, p.tree]) {
            let tree = self.trees.entry(tree).or_default();
            if tree.packages.len() < MAX_PACKAGES && !tree.packages.contains(&package) {
                tree.packages.push(package.clone());
            }
            tree.latest_package = Some(package.clone());
        }
    }

    /// The kernel stopped an open of `event.pid`, a process it had marked, whose start the
    /// engine never saw (its fork and exec records were lost): what it stopped is told all the
    /// same, by the rules the file (or the credential file it is) matches under any home the
    /// engine knows, for a tree it cannot name.
    pub(super) fn unattributed_stop(&self, event: &Event, open: &Open) -> Vec<Alert> {
        let path = open.abs_path.as_deref().map_or_else(|| normalize_path(&open.path), str::to_owned);
        let judged = open.same_file_as.as_deref().unwrap_or(&path);
        let mut homes: BTreeSet<Option<&str>> = BTreeSet::from([None, self.options.home.as_deref()]);
        homes.extend(self.procs.values().map(|p| p.home.as_deref()));
        let mut indices = BTreeSet::new();
        for home in homes {
            let hits = (self.rules.matching_targets(judged, home).into_iter())
                .filter(|&index| matches!(self.rules.rules()[index].kind, RuleKind::Target(_)));
            indices.extend(hits);
        }
        let stop = Stop::of(open.blocked || open.fail_closed, open.denied);
        indices
            .into_iter()
            .map(|index| {
                let rule = &self.rules.rules()[index];
                let mut alert = self.name_unknown(0).base;
                alert.process.pid = event.pid;
                alert.timestamp = rfc3339(event.time_ns);
                alert.event.action = "open".into();
                alert.event.outcome = stop.outcome().into();
                alert.rule = alerted_rule(rule);
                alert.file = Some(AlertFile {
                    path: path.clone(),
                    given_path: open.path.clone(),
                    flags: super::open_flags(open.flags),
                    same_file_as: open.same_file_as.clone(),
                    ..AlertFile::default()
                });
                alert.credwatch.rotate = rule.rotate.clone();
                alert.credwatch.enforcement = stop.enforcement().into();
                alert.credwatch.blind_spot = None;
                alert.credwatch.why = Some(
                    "the kernel stopped a process of a watched tree whose start credwatch did not see (its records were lost)"
                        .into(),
                );
                if open.fail_closed {
                    super::matching::fail_closed(&mut alert);
                }
                alert
            })
            .collect()
    }

    /// The sensor's report of what it missed of a tree.
    pub(super) fn blind_spot(&mut self, spot: &BlindSpot) -> Vec<Alert> {
        let cause = BlindSpotCause::from(spot.cause);
        let whose = match spot.root_pid {
            None => Whose::Unknown,
            Some(pid) => match self.by_pid.get(&pid).copied().filter(|id| self.procs[id].root == *id) {
                Some(id) => Whose::Tree(id),
                None => Whose::Pid(pid),
            },
        };
        let named = match whose {
            Whose::Tree(id) => self.name_tree(id, &self.procs[&id]),
            Whose::Pid(pid) => match self.blind.ended.iter().rev().find(|(root, _)| *root == pid) {
                Some((_, named)) => named.clone(),
                None => self.name_unknown(pid),
            },
            Whose::Unknown => self.name_unknown(0),
        };
        let report = AlertBlindSpot {
            cause,
            counts: spot.counts.clone(),
            credential: spot.credential,
            packages: named.base.credwatch.blind_spot.as_ref().map(|b| b.packages.clone()).unwrap_or_default(),
            reports: 1,
            ..AlertBlindSpot::default()
        };
        if let (BlindSpotCause::MarksFull, Whose::Tree(id)) = (cause, whose) {
            // A process of the tree ran unwatched: it may have read anything.
            self.egress.unwatched(id, window(report.clone(), spot.since_ns, spot.until_ns));
        }
        let indices: Vec<usize> = self.rules.blind_spot_rules(cause).collect();
        let mut alerts = Vec::new();
        for index in indices {
            let key = (whose, self.rules.rules()[index].id.clone());
            alerts.extend(self.fold(key, index, &named, report.clone(), (spot.since_ns, spot.until_ns)));
        }
        alerts
    }

    /// Folds a report into the blind spot of `key`; what goes out now.
    fn fold(
        &mut self,
        key: (Whose, String),
        index: usize,
        named: &Named,
        report: AlertBlindSpot,
        (since_ns, until_ns): (u64, u64),
    ) -> Option<Alert> {
        let credential_rotate = report.credential.then(|| self.blind_rotate(index, true, named.home.as_deref()));
        let Some(folded) = self.blind.folded.get_mut(&key) else {
            let alert = self.blind_alert(index, named, window(report, since_ns, until_ns));
            if self.blind.folded.len() < MAX_FOLDED {
                let folded = Folded { alert: alert.clone(), since_ns, until_ns, sent_ns: until_ns, unreported: false };
                self.blind.folded.insert(key, folded);
            }
            return Some(alert);
        };
        folded.since_ns = folded.since_ns.min(since_ns);
        folded.until_ns = folded.until_ns.max(until_ns);
        let spot = folded.alert.credwatch.blind_spot.take().unwrap_or_default();
        let newly_credential = report.credential && !spot.credential;
        let mut counts = spot.counts;
        for (kind, count) in report.counts {
            *counts.entry(kind).or_insert(0) += count;
        }
        let spot = AlertBlindSpot {
            counts,
            credential: spot.credential || report.credential,
            reports: spot.reports + 1,
            ..spot
        };
        let spot = window(spot, folded.since_ns, folded.until_ns);
        if let Some(rotate) = credential_rotate.filter(|_| newly_credential) {
            folded.alert.credwatch.rotate = rotate;
        }
        folded.alert.timestamp = rfc3339(folded.until_ns);
        folded.alert.credwatch.blind_spot = Some(spot);
        if newly_credential || folded.until_ns.saturating_sub(folded.sent_ns) >= FOLD_NS {
            folded.sent_ns = folded.until_ns;
            folded.unreported = false;
            return Some(folded.alert.clone());
        }
        folded.unreported = true;
        self.stats.repeats += 1;
        None
    }

    /// The alert of the blind-spot rule `index` about the tree `named`.
    fn blind_alert(&self, index: usize, named: &Named, spot: AlertBlindSpot) -> Alert {
        let rule = &self.rules.rules()[index];
        let mut alert = named.base.clone();
        alert.timestamp = spot.until.clone();
        alert.rule = alerted_rule(rule);
        alert.credwatch.rotate = self.blind_rotate(index, spot.credential, named.home.as_deref());
        alert.credwatch.blind_spot = Some(spot);
        alert
    }

    /// The rule's advice; first, when a lost record was a credential's, its `credential_rotate`
    /// and the kinds of credentials the rules know in a home.
    fn blind_rotate(&self, index: usize, credential: bool, home: Option<&str>) -> Vec<String> {
        let rule = &self.rules.rules()[index];
        let mut rotate = Vec::new();
        if credential {
            rotate.extend(rule.blind_spot.iter().flat_map(|m| m.credential_rotate.iter().cloned()));
            let kinds: BTreeSet<&str> = self
                .rules
                .rules()
                .iter()
                .filter(|r| r.is_credential() && r.targets.iter().any(|t| t.starts_with("~/")))
                .map(|r| r.category.as_str())
                .collect();
            let home = home.map(|home| format!(" ({home})")).unwrap_or_default();
            rotate.push(format!(
                "Credentials of these kinds in the home{home}, as the rules know them: {}",
                kinds.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
        rotate.extend(rule.rotate.iter().cloned());
        rotate
    }

    /// `p` (entry `id`, a tree's root or unit) as blind-spot alerts name its tree: the root's
    /// process, and of the packages the tree ran, the latest (the first 16 in `blind_spot`).
    pub(super) fn name_tree(&self, id: Id, p: &Proc) -> Named {
        let tree = self.trees.get(&id);
        let packages = tree.map(|tree| tree.packages.clone()).unwrap_or_default();
        let package = tree.and_then(|tree| tree.latest_package.clone()).unwrap_or_else(|| self.package(p));
        let (process, container, orchestrator) = self.alert_process(p);
        let base = Alert {
            package,
            coding_agent: self.coding_agent(p),
            container,
            orchestrator,
            ci: p.ci.as_deref().cloned(),
            user: AlertUser { id: p.uid },
            ..self.base_alert(process, p.root_pid, packages)
        };
        Named { base, home: self.home_of(p).map(str::to_owned) }
    }

    /// A tree the engine cannot name: the root's pid, when the kernel told it (else 0).
    fn name_unknown(&self, root_pid: u32) -> Named {
        let process = AlertProcess {
            pid: root_pid,
            executable: String::new(),
            args: Vec::new(),
            working_directory: String::new(),
            parent: AlertParent { pid: 0 },
            ancestors: Vec::new(),
        };
        let mut base = self.base_alert(process, root_pid, Vec::new());
        base.package.manager = UNKNOWN_TREE_MANAGER.into();
        Named { base, home: self.options.home.clone() }
    }

    fn base_alert(&self, process: AlertProcess, root_pid: u32, packages: Vec<AlertPackage>) -> Alert {
        Alert {
            timestamp: String::new(),
            event: AlertEvent {
                id: String::new(),
                kind: "alert".into(),
                action: BLIND_SPOT_ACTION.into(),
                outcome: "alerted".into(),
            },
            rule: AlertRule {
                id: String::new(),
                name: String::new(),
                category: String::new(),
                severity: crate::alert::Severity::High,
                description: String::new(),
            },
            process,
            file: None,
            destination: None,
            package: AlertPackage::default(),
            coding_agent: None,
            host: AlertHost { name: self.options.host_name.clone(), id: self.options.host_id.clone() },
            agent: self.options.agent_version.clone().map(|version| AlertAgent { version }),
            container: None,
            orchestrator: None,
            ci: None,
            user: AlertUser { id: 0 },
            credwatch: AlertCredwatch {
                root_pid,
                enforcement: "userspace".into(),
                blind_spot: Some(AlertBlindSpot { packages, ..AlertBlindSpot::default() }),
                ..AlertCredwatch::default()
            },
        }
    }

    /// The entry `id` left the table: its folded blind spots' sums go out (final), and a root is
    /// remembered for reports that come after it.
    pub(super) fn blind_tree_ended(&mut self, id: Id, p: &Proc) {
        if self.blind.gap_pending.remove(&id) {
            let alerts = self.gap_alert(id, p);
            self.pending.extend(alerts);
        }
        if p.root == id {
            let named = self.name_tree(id, p);
            if self.blind.ended.len() >= MAX_ENDED {
                self.blind.ended.remove(0);
            }
            self.blind.ended.push((p.root_pid, named));
        }
        // Every process leaving the table comes here: only its own keys are looked at.
        let own = (Whose::Tree(id), String::new())..(Whose::Tree(id + 1), String::new());
        let keys: Vec<(Whose, String)> = self.blind.folded.range(own).map(|(key, _)| key.clone()).collect();
        for key in keys {
            if let Some(summary) = self.blind.folded.remove(&key).and_then(summary) {
                self.pending.push(summary);
            }
        }
    }

    /// The end of the stream: every folded blind spot's sum not yet out (final).
    pub(super) fn blind_flush(&mut self) -> Vec<Alert> {
        std::mem::take(&mut self.blind.folded).into_values().filter_map(summary).collect()
    }

    /// The agent was down or stopped: a gap alert for each tree live now (it was alive when the
    /// gap began, since every event from before it came first).
    pub(super) fn gap_began(&mut self, gap: &AgentGap, until_ns: u64) -> Vec<Alert> {
        let mut alerts = self.gap_due();
        self.blind.gap_told.clear();
        self.blind.seeding = true;
        let spot = AlertBlindSpot {
            cause: BlindSpotCause::Gap,
            stopped: gap.stopped,
            reports: 1,
            ..AlertBlindSpot::default()
        };
        self.blind.gap_spot = Some(window(spot, gap.since_ns, until_ns));
        let units: BTreeSet<Id> = self.procs.values().filter(|p| p.alive).map(|p| p.tree).collect();
        for unit in units {
            if self.gap_concerns(unit) {
                alerts.extend(self.gap_alert(unit, &self.procs[&unit]));
            }
        }
        alerts
    }

    /// The entry (unit) of the tree `pid` is in, if it is live; for [`Engine::gap_event`].
    pub(super) fn unit_of(&self, pid: u32) -> Option<Id> {
        self.live(pid).map(|id| self.procs[&id].tree)
    }

    /// After `event` (of a process of the unit `before`, when it was in one): an event timed
    /// inside the last gap, or an adopting agent's seed, puts its tree's gap alert off until the
    /// gap's events are over, so that it names the packages they ran; the first event past the
    /// gap releases what was put off.
    pub(super) fn gap_event(&mut self, event: &Event, before: Option<Id>) -> Vec<Alert> {
        if self.blind.gap_spot.is_none() {
            return Vec::new();
        }
        let seeded = match &event.data {
            EventData::Exec(exec) => exec.seeded,
            EventData::Fork(_) => self.blind.seeding,
            _ => false,
        };
        self.blind.seeding &= seeded;
        let (since_ns, until_ns) = self.gap_ns;
        if self.blind.seeding || (since_ns..=until_ns).contains(&event.time_ns) {
            if let Some(unit) = before.or_else(|| self.unit_of(event.pid)) {
                if self.gap_concerns(unit) {
                    self.blind.gap_pending.insert(unit);
                }
            }
            return Vec::new();
        }
        if event.time_ns > until_ns {
            return self.gap_due();
        }
        Vec::new()
    }

    /// A live source's clock is past the last gap: its alerts put off go out (an adopting
    /// agent's seeds came in one batch before the clock ticks).
    pub(super) fn gap_tick(&mut self, now_ns: u64) -> Vec<Alert> {
        if now_ns > self.gap_ns.1 {
            return self.gap_due();
        }
        Vec::new()
    }

    /// The gap alerts put off, of the trees still in the table.
    pub(super) fn gap_due(&mut self) -> Vec<Alert> {
        let units = std::mem::take(&mut self.blind.gap_pending);
        units.into_iter().filter_map(|unit| self.procs.get(&unit).map(|p| self.gap_alert(unit, p))).flatten().collect()
    }

    /// Whether the last gap is to alert for the unit: once per gap, and not for the
    /// developer's own project (its code is not watched).
    fn gap_concerns(&mut self, unit: Id) -> bool {
        let Some(p) = self.procs.get(&unit) else { return false };
        let project = p.manager_self.is_some_and(|own| own.project.is_some()) || p.project;
        (!project || self.options.watch_project) && self.blind.gap_told.insert(unit)
    }

    /// The gap alerts of the unit (entry `unit`, `p`).
    fn gap_alert(&self, unit: Id, p: &Proc) -> Vec<Alert> {
        let Some(spot) = &self.blind.gap_spot else { return Vec::new() };
        let named = self.name_tree(unit, p);
        let packages = named.base.credwatch.blind_spot.as_ref().map(|b| b.packages.clone()).unwrap_or_default();
        self.rules
            .blind_spot_rules(BlindSpotCause::Gap)
            .map(|index| self.blind_alert(index, &named, AlertBlindSpot { packages: packages.clone(), ..spot.clone() }))
            .collect()
    }
}

/// `spot` over the window from `since_ns` to `until_ns`.
/// The rule `rule` as an alert names it, at its own severity.
fn alerted_rule(rule: &Rule) -> AlertRule {
    AlertRule {
        id: rule.id.clone(),
        name: rule.name.clone(),
        category: rule.category.clone(),
        severity: rule.severity,
        description: rule.description.clone(),
    }
}

fn window(spot: AlertBlindSpot, since_ns: u64, until_ns: u64) -> AlertBlindSpot {
    AlertBlindSpot {
        since: rfc3339(since_ns),
        until: rfc3339(until_ns),
        seconds: until_ns.saturating_sub(since_ns) as f64 / 1e9,
        ..spot
    }
}

/// A folded blind spot's final sum, when reports came since it last went out.
fn summary(folded: Folded) -> Option<Alert> {
    if !folded.unreported {
        return None;
    }
    let mut alert = folded.alert;
    if let Some(spot) = &mut alert.credwatch.blind_spot {
        spot.is_final = true;
    }
    Some(alert)
}
