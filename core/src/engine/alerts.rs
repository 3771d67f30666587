//! Alert building: an alert from a rule's hit on a process (with its ancestry and package),
//! and what goes out of it per tree, deduplicated and folded into sweeps (see the engine's
//! documentation).

use std::collections::{BTreeMap, BTreeSet};

use time::{format_description::well_known::Rfc3339, OffsetDateTime};

use super::{matching::Judgement, process::Tree, Engine, Id};
use crate::{
    alert::{
        Alert, AlertAgent, AlertAncestor, AlertCredwatch, AlertEvent, AlertFile, AlertHost, AlertParent, AlertProcess,
        AlertRule, AlertSweep, AlertUser,
    },
    event::Event,
    rules::{Rule, RuleSet},
};

/// Most distinct alerts remembered per tree for deduplication; past it, new ones are printed
/// but not remembered.
const MAX_SEEN: usize = 4096;
/// Most files a sweep alert lists; the others are counted.
const MAX_SWEEP_FILES: usize = 100;

pub(super) struct SweepState {
    /// The sweep alert, its counts kept current.
    alert: Alert,
    /// Rules that fired in it (indices).
    rules: BTreeSet<usize>,
    /// Time of the latest folded alert.
    last_ns: u64,
    /// Alerts were folded since the last summary.
    unreported: bool,
}

impl SweepState {
    /// See [`super::process::Tree::remap_rules`].
    pub(super) fn remap_rules(&mut self, remap: &[Option<usize>]) {
        self.rules = self.rules.iter().filter_map(|&index| remap[index]).collect();
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
            let count = tree.seen.entry(key).or_insert(0);
            *count += 1;
            if *count > 1 {
                if !blocked && !is_power_of_ten(*count) {
                    self.stats.repeats += 1;
                    return None;
                }
                alert.credwatch.count = Some(*count);
                return Some(alert);
            }
        }
        let Some(sweep) = sweep else { return Some(alert) };
        let window_ns = sweep.window_s.0.saturating_mul(1_000_000_000);
        tree.recent.push_back((time_ns, index, alert.file.as_ref().map(|f| f.path.clone()).unwrap_or_default()));
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
        tree.sweep = Some(SweepState { alert: alert.clone(), rules: indices, last_ns: time_ns, unreported: false });
        Some(alert)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn alert(
        &self,
        event: &Event,
        id: Id,
        rule: &Rule,
        judgement: Judgement,
        action: &str,
        stop: Stop,
        file: Option<AlertFile>,
    ) -> Alert {
        let p = &self.procs[&id];
        let contained = file.as_ref().is_some_and(|file| self.options.contained.contains(&file.path));
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
        Alert {
            timestamp: rfc3339(event.time_ns),
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
                description: rule.description.clone(),
            },
            process: AlertProcess {
                pid: p.pid,
                executable: p.executable.clone(),
                args: p.args.clone(),
                working_directory: p.cwd.clone(),
                parent: AlertParent { pid: p.ppid },
                ancestors,
            },
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

    fn outcome(self) -> &'static str {
        match self {
            Stop::None => "alerted",
            Stop::Killed => "blocked",
            Stop::Denied => "denied",
        }
    }

    fn enforcement(self) -> &'static str {
        match self {
            Stop::None => "userspace",
            Stop::Killed => "kernel",
            Stop::Denied => "lsm",
        }
    }
}

/// Counts the repeats of an identical alert that are printed again.
fn is_power_of_ten(mut n: u64) -> bool {
    while n >= 10 && n.is_multiple_of(10) {
        n /= 10;
    }
    n == 1
}

fn fold(state: &mut SweepState, rule: &Rule, index: usize, file: Option<&str>, time_ns: u64) {
    state.rules.insert(index);
    state.last_ns = state.last_ns.max(time_ns);
    state.unreported = true;
    if let Some(sweep) = &mut state.alert.credwatch.sweep {
        sweep.folded += 1;
        if let Some(file) = file.filter(|file| !sweep.files.iter().any(|f| f == file)) {
            if sweep.files.len() < MAX_SWEEP_FILES {
                sweep.files.push(file.to_owned());
            } else {
                sweep.files_not_listed += 1;
            }
        }
        *sweep.folded_by_category.entry(rule.category.clone()).or_insert(0) += 1;
        insert_sorted(&mut sweep.categories, &rule.category);
        insert_sorted(&mut sweep.rules, &rule.id);
    }
}

fn insert_sorted(list: &mut Vec<String>, item: &str) {
    if let Err(at) = list.binary_search_by(|x| x.as_str().cmp(item)) {
        list.insert(at, item.to_owned());
    }
}

/// The final summary of the tree's sweep, when alerts were folded since the last one.
pub(super) fn sweep_summary(rules: &RuleSet, contained: &BTreeSet<String>, tree: &mut Tree) -> Option<Alert> {
    let state = tree.sweep.as_mut().filter(|state| state.unreported)?;
    state.unreported = false;
    let mut alert = state.alert.clone();
    alert.timestamp = rfc3339(state.last_ns);
    contain_sweep(&mut alert, contained, rules, &state.rules);
    if let Some(sweep) = &mut alert.credwatch.sweep {
        sweep.is_final = true;
    }
    Some(alert)
}

/// A sweep alert's `contained` (every file of it was one the box replaced, none went unlisted)
/// and its `rotate`: nothing when contained, else the advice of the rules of `indices`.
fn contain_sweep(alert: &mut Alert, contained: &BTreeSet<String>, rules: &RuleSet, indices: &BTreeSet<usize>) {
    alert.credwatch.contained = alert.credwatch.sweep.as_ref().is_some_and(|sweep| {
        sweep.files_not_listed == 0
            && !sweep.files.is_empty()
            && sweep.files.iter().all(|file| contained.contains(file))
    });
    alert.credwatch.rotate = if alert.credwatch.contained { Vec::new() } else { sweep_rotate(rules, indices) };
}

/// What to rotate after a sweep over `indices`: each rule's advice once, then the sweep's.
fn sweep_rotate(rules: &RuleSet, indices: &BTreeSet<usize>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let advice = indices.iter().flat_map(|i| &rules.rules()[*i].rotate);
    for item in advice.chain(rules.sweep().into_iter().flat_map(|sweep| &sweep.rotate)) {
        if !out.contains(item) {
            out.push(item.clone());
        }
    }
    out
}

pub(super) fn rfc3339(time_ns: u64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(time_ns))
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}
