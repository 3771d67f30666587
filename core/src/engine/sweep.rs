//! Sweeps: once a tree's credential alerts cover enough categories, one sweep alert stands for
//! them, the later ones are folded into it, and a final summary goes out when the tree ends
//! (see the engine's documentation).

use std::collections::BTreeSet;

use crate::{
    alert::{rfc3339, Alert},
    rules::{Rule, RuleSet},
};

/// Most files a sweep alert lists; the others are counted.
pub(super) const MAX_SWEEP_FILES: usize = 100;

/// A tree's sweep, once one has gone out.
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
    /// The sweep that `alert` opened at `time_ns`, over the rules of `rules`.
    pub(super) fn new(alert: Alert, rules: BTreeSet<usize>, time_ns: u64) -> SweepState {
        SweepState { alert, rules, last_ns: time_ns, unreported: false }
    }

    /// The rules were reloaded: rule `i` is now `remap[i]`, or gone.
    pub(super) fn remap_rules(&mut self, remap: &[Option<usize>]) {
        self.rules = self.rules.iter().filter_map(|&index| remap[index]).collect();
    }
}

/// Folds an alert of the rule `index` (about `file`, at `time_ns`) into the sweep.
pub(super) fn fold(state: &mut SweepState, rule: &Rule, index: usize, file: Option<&str>, time_ns: u64) {
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
pub(super) fn sweep_summary(
    rules: &RuleSet,
    contained: &BTreeSet<String>,
    sweep: &mut Option<SweepState>,
) -> Option<Alert> {
    let state = sweep.as_mut().filter(|state| state.unreported)?;
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
pub(super) fn contain_sweep(
    alert: &mut Alert,
    contained: &BTreeSet<String>,
    rules: &RuleSet,
    indices: &BTreeSet<usize>,
) {
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
