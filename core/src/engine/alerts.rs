//! Alert building: an alert from a rule's hit on a process (with its ancestry and package),
//! and what goes out of it per tree, deduplicated and folded into sweeps (see the engine's
//! documentation).

use std::collections::{BTreeMap, BTreeSet};

use super::{
    process::{agent_tree, Proc},
    sweep::{contain_sweep, fold, SweepState, MAX_SWEEP_FILES},
    Engine, Id,
};
use crate::{
    alert::{
        rfc3339, Alert, AlertAgent, AlertAncestor, AlertContainer, AlertCredwatch, AlertEvent, AlertFile, AlertHost,
        AlertOrchestrator, AlertParent, AlertProcess, AlertRule, AlertSweep, AlertUser, Severity,
    },
    rules::Rule,
};

/// Most distinct alerts remembered per tree for deduplication; past it, new ones are printed
/// but not remembered.
const MAX_SEEN: usize = 4096;
/// Most alerts held at once for a configuration chain's window; past it the oldest goes out
/// at its own severity without waiting.
const MAX_HELD: usize = 256;
/// A held read more than this after "now" means the wall clock was stepped back (event times
/// follow it, see `record::Decoder`): it is released rather than held until the clock caught up.
const STEPPED_BACK_NS: u64 = 60_000_000_000;

/// A read of one file of a configuration chain, held until the chain's window after it closes:
/// if the same process opens another file of the chain by then, a loader read them all and the
/// alert goes out at the loader's verdict, else at its own severity.
pub(super) struct Held {
    /// The reading process.
    proc: Id,
    root: Id,
    index: usize,
    subject: String,
    /// The file read, as judged.
    path: String,
    alert: Alert,
    time_ns: u64,
    within_ns: u64,
    /// The loader actor's verdict (None: allow) and why, for when another file follows.
    chained: Option<Judgement>,
    followed: bool,
}

impl Held {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        proc: Id,
        root: Id,
        index: usize,
        subject: String,
        path: String,
        alert: Alert,
        time_ns: u64,
        (within_ns, chained): (u64, Option<Judgement>),
    ) -> Held {
        Held { proc, root, index, subject, path, alert, time_ns, within_ns, chained, followed: false }
    }

    /// See [`super::process::Tree::remap_rules`]; false when its rule is gone.
    pub(super) fn remap_rules(&mut self, remap: &[Option<usize>]) -> bool {
        remap[self.index].map(|index| self.index = index).is_some()
    }

    /// When the window closes (event time): later events can no longer lower it.
    fn until_ns(&self) -> u64 {
        self.time_ns.saturating_add(self.within_ns)
    }
}

impl Engine {
    /// Dedup and sweeps (see the module's documentation): whether `alert`, of the rule
    /// `index` about `subject` in the tree of `root` (the alerting process's `tree`), goes out,
    /// and as what.
    pub(super) fn deliver(
        &mut self,
        root: Id,
        index: usize,
        subject: String,
        mut alert: Alert,
        time_ns: u64,
    ) -> Option<Alert> {
        if !self.procs.contains_key(&root) {
            // The root was evicted: no tree state to dedup or sweep with.
            return Some(alert);
        }
        let rules = &self.rules;
        let rule = &rules.rules()[index];
        let blocked = matches!(alert.event.outcome.as_str(), "blocked" | "denied");
        // What was blocked or denied is always told on its own.
        let sweep =
            rules.sweep().filter(|sweep| rule.is_credential() && !blocked && alert.rule.severity >= sweep.min_severity);
        let tree = self.trees.entry(root).or_default();
        if sweep.is_some() {
            if let Some(state) = &mut tree.sweep {
                fold(state, rule, index, alert.file.as_ref().map(|f| f.path.as_str()), time_ns);
                self.stats.folded += 1;
                return None;
            }
        }
        let key = (index, alert.rule.severity, subject);
        if tree.seen.len() < MAX_SEEN || tree.seen.contains_key(&key) {
            // An event the kernel counted repeats of stands for that many acts (`weight`).
            let weight = alert.credwatch.count.unwrap_or(1).max(1);
            let count = tree.seen.entry(key).or_insert(0);
            let before = *count;
            *count += weight;
            if before > 0 {
                if !blocked && !passes_power_of_ten(before, *count) {
                    self.stats.repeats += weight;
                    return None;
                }
                alert.credwatch.count = Some(*count);
                return Some(alert);
            }
        }
        let Some(sweep) = sweep else { return Some(alert) };
        let window_ns = sweep.window_s.0.saturating_mul(1_000_000_000);
        // In time order: a held alert comes in after later ones.
        let at = tree.recent.iter().rposition(|(t, ..)| *t <= time_ns).map_or(0, |i| i + 1);
        tree.recent.insert(at, (time_ns, index, alert.file.as_ref().map(|f| f.path.clone()).unwrap_or_default()));
        while tree.recent.len() > MAX_SEEN
            || tree.recent.front().is_some_and(|(t, ..)| t.saturating_add(window_ns) < time_ns)
        {
            tree.recent.pop_front();
        }
        let categories: BTreeSet<&str> =
            tree.recent.iter().map(|(_, i, _)| rules.rules()[*i].category.as_str()).collect();
        if (categories.len() as u64) < sweep.min_categories.0 {
            return Some(alert);
        }
        let indices: BTreeSet<usize> = tree.recent.iter().map(|(_, i, _)| *i).collect();
        let (mut files, mut files_not_listed) = (Vec::new(), 0);
        for (.., file) in &tree.recent {
            if file.is_empty() || files.contains(file) {
                continue;
            }
            if files.len() < MAX_SWEEP_FILES {
                files.push(file.clone());
            } else {
                files_not_listed += 1;
            }
        }
        let mut ids: Vec<String> = indices.iter().map(|i| rules.rules()[*i].id.clone()).collect();
        ids.sort();
        alert.rule = AlertRule {
            id: sweep.id.0.clone(),
            name: sweep.name.clone(),
            category: sweep.category.clone(),
            severity: sweep.severity,
            description: sweep.description.clone(),
        };
        alert.credwatch.sweep = Some(AlertSweep {
            categories: categories.into_iter().map(str::to_owned).collect(),
            rules: ids,
            files,
            files_not_listed,
            folded: 0,
            folded_by_category: BTreeMap::new(),
            window_s: sweep.window_s.0,
            is_final: false,
        });
        contain_sweep(&mut alert, &self.options.contained, rules, &indices);
        alert.credwatch.count = None;
        tree.recent.clear();
        tree.sweep = Some(SweepState::new(alert.clone(), indices, time_ns));
        Some(alert)
    }

    /// Holds `held` for its chain's window; returns what goes out at once (the oldest held
    /// alert, when too many are).
    pub(super) fn hold(&mut self, held: Held) -> Vec<Alert> {
        self.held.push(held);
        if self.held.len() <= MAX_HELD {
            return Vec::new();
        }
        let oldest = (0..self.held.len()).min_by_key(|&i| self.held[i].time_ns).expect("not empty");
        let held = self.held.remove(oldest);
        self.release(held).into_iter().collect()
    }

    /// The process `proc` tried to open `path`, a file of a configuration chain, at `time_ns`:
    /// its held reads of other files of the chain whose window is still open were one loader's.
    pub(super) fn chain_followed(&mut self, proc: Id, path: &str, time_ns: u64) {
        for held in &mut self.held {
            // An open that came in before the read it follows (the kernel's rings are read
            // apart) is as much a link of the chain as one after it.
            if held.proc == proc && held.path != path && time_ns <= held.until_ns() {
                held.followed = true;
            }
        }
    }

    /// Releases the held alerts whose window closed before `now_ns` (event time), or that a
    /// wall clock stepped back left in the future, oldest read first.
    pub(super) fn release_due(&mut self, now_ns: u64) -> Vec<Alert> {
        self.release_where(|held| held.until_ns() < now_ns || held.time_ns > now_ns.saturating_add(STEPPED_BACK_NS))
    }

    /// Releases the held alerts of `proc`: it ended, or read another credential, so nothing it
    /// does can follow them any more.
    pub(super) fn release_of(&mut self, proc: Id) -> Vec<Alert> {
        self.release_where(|held| held.proc == proc)
    }

    pub(super) fn release_all(&mut self) -> Vec<Alert> {
        self.release_where(|_| true)
    }

    fn release_where(&mut self, due: impl Fn(&Held) -> bool) -> Vec<Alert> {
        if !self.held.iter().any(&due) {
            return Vec::new();
        }
        let (mut going, staying): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.held).into_iter().partition(due);
        self.held = staying;
        going.sort_by_key(|held| held.time_ns);
        going.into_iter().filter_map(|held| self.release(held)).collect()
    }

    /// A held alert, judged whole with its chain, through dedup and sweeps as if delivered at
    /// its read.
    fn release(&mut self, held: Held) -> Option<Alert> {
        let mut alert = held.alert;
        if held.followed {
            let judgement = held.chained?;
            alert.rule.severity = judgement.severity;
            alert.credwatch.why = judgement.why;
        }
        if let Some(gap) = self.gap.as_ref().filter(|_| (self.gap_ns.0..=self.gap_ns.1).contains(&held.time_ns)) {
            alert.credwatch.gap = Some(gap.clone());
        }
        self.deliver(held.root, held.index, held.subject, alert, held.time_ns)
    }

    /// The end of the earliest window an alert is held for (event time), if any is.
    pub fn held_until(&self) -> Option<u64> {
        self.held.iter().map(Held::until_ns).min()
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn alert(
        &self,
        time_ns: u64,
        id: Id,
        rule: &Rule,
        judgement: Judgement,
        action: &str,
        stop: Stop,
        file: Option<AlertFile>,
    ) -> Alert {
        let p = &self.procs[&id];
        let contained = file.as_ref().is_some_and(|file| self.options.contained.contains(&file.path));
        let (process, container, orchestrator) = self.alert_process(p);
        Alert {
            timestamp: rfc3339(time_ns),
            event: AlertEvent {
                // Set once the alert is final ([`Engine::handle`]): dedup and sweeps change it.
                id: String::new(),
                kind: "alert".into(),
                action: action.into(),
                outcome: stop.outcome().into(),
            },
            rule: AlertRule {
                id: rule.id.clone(),
                name: rule.name.clone(),
                category: rule.category.clone(),
                severity: judgement.severity,
                description: self.description(p, rule),
            },
            process,
            file,
            destination: None,
            package: self.package(p),
            coding_agent: self.coding_agent(p),
            host: AlertHost { name: self.options.host_name.clone(), id: self.options.host_id.clone() },
            agent: self.options.agent_version.clone().map(|version| AlertAgent { version }),
            container,
            orchestrator,
            ci: p.ci.as_deref().cloned(),
            user: AlertUser { id: p.uid },
            credwatch: AlertCredwatch {
                root_pid: p.root_pid,
                rotate: if contained { Vec::new() } else { rule.rotate.clone() },
                contained,
                // Only the kernel blocks; a match here is after the fact.
                enforcement: stop.enforcement().into(),
                why: judgement.why,
                ..AlertCredwatch::default()
            },
        }
    }

    /// Process `p` as an alert names it, with its ancestors (the root first), and where it ran:
    /// its container and pod.
    pub(super) fn alert_process(&self, p: &Proc) -> (AlertProcess, Option<AlertContainer>, Option<AlertOrchestrator>) {
        let mut ancestors = Vec::new();
        let mut next = p.parent;
        while let Some(ancestor) = next.and_then(|id| self.procs.get(&id)) {
            ancestors.push(AlertAncestor {
                pid: ancestor.pid,
                executable: ancestor.executable.clone(),
                args: ancestor.args.clone(),
            });
            next = ancestor.parent;
        }
        ancestors.reverse();
        let (container, orchestrator) = match p.container.as_deref() {
            Some((container, pod)) => (Some(container.clone()), pod.clone()),
            None => (None, None),
        };
        let process = AlertProcess {
            pid: p.pid,
            executable: p.executable.clone(),
            args: p.args.clone(),
            working_directory: p.cwd.clone(),
            parent: AlertParent { pid: p.ppid },
            ancestors,
        };
        (process, container, orchestrator)
    }

    /// The rule's description, whose subject is package code; in an agent tree what runs is the
    /// agent's work, and the description says so: `codex or a tool it ran opened ~/.netrc, ...`.
    fn description(&self, p: &Proc, rule: &Rule) -> String {
        match (agent_tree(p), rule.description.strip_prefix("Package code ")) {
            (Some(of), Some(rest)) => format!("{} or a tool it ran {rest}", self.rules.agents()[of.index].name),
            _ => rule.description.clone(),
        }
    }
}

/// The severity an alert goes out at, and why it is not the rule's own when an actor lowered
/// it.
#[derive(Clone, Debug)]
pub(super) struct Judgement {
    pub(super) severity: Severity,
    pub(super) why: Option<String>,
}

/// What the kernel did to the action an alert is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// Nothing: it happened.
    None,
    /// The process was killed (`bpf_send_signal`): the alert's outcome is `blocked`.
    Killed,
    /// A BPF LSM hook refused it with EPERM and the process lives: `denied`.
    Denied,
}

impl Stop {
    pub(super) fn of(blocked: bool, denied: bool) -> Stop {
        match (blocked, denied) {
            (_, true) => Stop::Denied,
            (true, false) => Stop::Killed,
            _ => Stop::None,
        }
    }

    pub(super) fn outcome(self) -> &'static str {
        match self {
            Stop::None => "alerted",
            Stop::Killed => "blocked",
            Stop::Denied => "denied",
        }
    }

    pub(super) fn enforcement(self) -> &'static str {
        match self {
            Stop::None => "userspace",
            Stop::Killed => "kernel",
            Stop::Denied => "lsm",
        }
    }
}

/// The acts an event stands for, when the kernel counted repeats of it rather than sending them
/// (see [`Engine::deliver`], which takes it as the alert's weight).
pub(super) fn repeated(repeats: u64) -> Option<u64> {
    (repeats > 0).then(|| repeats.saturating_add(1))
}

/// Whether an identical alert is printed again as its count goes from `before` to `after`: when
/// it reaches or passes a power of ten (10, 100, ...), one kernel record possibly carrying
/// thousands of counted repeats.
pub(super) fn passes_power_of_ten(before: u64, after: u64) -> bool {
    let mut power = 10u64;
    while power <= before {
        let Some(next) = power.checked_mul(10) else { return false };
        power = next;
    }
    power <= after
}
