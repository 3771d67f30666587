//! How many notifications: the alerts of one package in a process tree share one notification, updated in
//! place (`replaces_id`), so a sweep is one popup however many files it took; new popups are
//! limited to [`BURST`] per [`WINDOW`], and what is held back past that is counted in one
//! notification; alerts raised while `notify` was not running are shown one by one only when
//! they are few, else counted in one.

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use credwatch_core::alert::{Alert, Severity};

use super::content::{self, Notice};

/// New popups allowed within [`WINDOW`].
pub const BURST: usize = 3;
pub const WINDOW: Duration = Duration::from_secs(10);
/// A notification is updated at most this often (a tree reading 1,000 files is not 1,000 calls).
const UPDATE_EVERY: Duration = Duration::from_secs(1);
/// A tree's notification is forgotten after this long without an alert (a new one then pops up).
const TREE_IDLE: Duration = Duration::from_secs(600);
/// The trees remembered at most (the oldest is forgotten first).
const MAX_TREES: usize = 1024;
/// The alerts a count notification describes.
const EXAMPLES: usize = 3;

/// Where notifications go.
pub trait Desk {
    /// Shows `notice`, in place of notification `replaces` when given: its id, or None when it
    /// could not be shown (no notification daemon: the desk said so).
    fn show(&mut self, notice: &Notice, replaces: Option<u32>) -> Option<u32>;
}

/// A package in a process tree: the host, the root's pid, the package (one `npm install` may run
/// several packages' scripts; a test's tree is the `cargo test` running it).
type Tree = (String, u32, Option<String>, Option<String>);

/// The alerts of one tree and its notification.
struct Group {
    /// Its notification, once shown.
    id: Option<u32>,
    /// The alert the notification is about: the sweep once there is one, else the most severe
    /// (the latest of equals).
    lead: (u64, Alert),
    /// Alerts of the tree besides the lead.
    others: u64,
    swept: bool,
    /// Its first alert came in a burst, past the popups allowed: its alerts are counted.
    held: bool,
    /// Changed since it was last sent.
    dirty: bool,
    sent: Option<Instant>,
    seen: Instant,
}

impl Group {
    fn new(seq: u64, alert: Alert, now: Instant) -> Group {
        let swept = alert.credwatch.sweep.is_some();
        Group { id: None, lead: (seq, alert), others: 0, swept, held: false, dirty: true, sent: None, seen: now }
    }

    /// Takes in another alert of the tree.
    fn add(&mut self, seq: u64, alert: Alert, now: Instant) {
        self.others += 1;
        self.seen = now;
        self.dirty = true;
        if alert.credwatch.sweep.is_some() {
            // The final summary counts what the start did not; the files it folded are in it.
            self.swept = true;
            self.lead = (seq, alert);
        } else if !(self.swept && content::reads_a_credential(&alert))
            && alert.rule.severity >= self.lead.1.rule.severity
        {
            self.lead = (seq, alert);
        }
    }

    fn notice(&self) -> Notice {
        content::alert_notice(self.lead.0, &self.lead.1, self.others)
    }

    fn severity(&self) -> Severity {
        self.lead.1.rule.severity
    }
}

/// The count of alerts held back in the current burst, and its notification.
#[derive(Default)]
struct Held {
    count: u64,
    critical: bool,
    id: Option<u32>,
    dirty: bool,
    sent: Option<Instant>,
}

#[derive(Default)]
pub struct Volume {
    /// When the last popups were shown (at most [`BURST`], within [`WINDOW`]).
    popups: VecDeque<Instant>,
    trees: HashMap<Tree, Group>,
    held: Held,
}

fn tree_of(alert: &Alert) -> Tree {
    let package = &alert.package;
    (alert.host.name.clone(), alert.credwatch.root_pid, package.name.clone(), package.version.clone())
}

impl Volume {
    /// Takes in an alert raised now.
    pub fn live(&mut self, seq: u64, alert: Alert, now: Instant, desk: &mut dyn Desk) {
        self.forget_idle(now);
        let tree = tree_of(&alert);
        let popup_allowed = self.popup_allowed(now);
        if let Some(group) = self.trees.get_mut(&tree) {
            group.add(seq, alert, now);
            if group.held && popup_allowed {
                // Held back in a burst that is over: its own popup now.
                group.held = false;
                self.popups.push_back(now);
                send(group, now, desk);
            } else if group.held {
                let severity = group.severity();
                self.hold(severity, now, desk);
            } else if group.id.is_none() || group.sent.is_none_or(|sent| now.duration_since(sent) >= UPDATE_EVERY) {
                send(group, now, desk);
            }
            return;
        }
        let mut group = Group::new(seq, alert, now);
        if popup_allowed {
            self.popups.push_back(now);
            send(&mut group, now, desk);
        } else {
            group.held = true;
            self.hold(group.severity(), now, desk);
        }
        self.trees.insert(tree, group);
    }

    /// Takes in the alerts raised while `notify` was not running, oldest first: each tree's
    /// notification when there are at most [`BURST`] trees, else one that counts them.
    pub fn missed(&mut self, alerts: Vec<(u64, Alert)>, now: Instant, desk: &mut dyn Desk) {
        let total = alerts.len() as u64;
        let mut trees: Vec<(Tree, Group)> = Vec::new();
        for (seq, alert) in alerts {
            let tree = tree_of(&alert);
            match trees.iter_mut().find(|(t, _)| *t == tree) {
                Some((_, group)) => group.add(seq, alert, now),
                None => trees.push((tree, Group::new(seq, alert, now))),
            }
        }
        if trees.len() <= BURST {
            for (tree, mut group) in trees {
                if self.popup_allowed(now) {
                    self.popups.push_back(now);
                }
                send(&mut group, now, desk);
                self.trees.insert(tree, group);
            }
            return;
        }
        let critical = trees.iter().any(|(_, group)| group.severity() == Severity::Critical);
        let examples: Vec<String> =
            trees.iter().rev().take(EXAMPLES).map(|(_, group)| content::summary(&group.lead.1)).collect();
        let more = trees.len().saturating_sub(EXAMPLES) as u64;
        let summary = format!("credwatch: {total} alerts while notify was not running");
        desk.show(&content::count_notice(summary, &examples, more, critical), None);
        self.popups.push_back(now);
    }

    /// Sends what changed and waited for its turn; forgets the burst's count once it is over.
    pub fn tick(&mut self, now: Instant, desk: &mut dyn Desk) {
        for group in self.trees.values_mut() {
            if group.dirty
                && group.id.is_some()
                && group.sent.is_none_or(|sent| now.duration_since(sent) >= UPDATE_EVERY)
            {
                send(group, now, desk);
            }
        }
        if self.held.dirty && self.held.sent.is_none_or(|sent| now.duration_since(sent) >= UPDATE_EVERY) {
            self.send_held(now, desk);
        }
        self.popup_allowed(now);
        if self.popups.is_empty() && !self.held.dirty && self.held.count > 0 {
            self.held = Held::default();
        }
    }

    /// Sends everything that waits, now (before exiting).
    pub fn flush(&mut self, now: Instant, desk: &mut dyn Desk) {
        for group in self.trees.values_mut().filter(|group| group.dirty && group.id.is_some()) {
            send(group, now, desk);
        }
        if self.held.dirty {
            self.send_held(now, desk);
        }
    }

    /// Whether a new popup may show now, dropping the popups older than the window.
    fn popup_allowed(&mut self, now: Instant) -> bool {
        while self.popups.front().is_some_and(|shown| now.duration_since(*shown) >= WINDOW) {
            self.popups.pop_front();
        }
        self.popups.len() < BURST
    }

    fn hold(&mut self, severity: Severity, now: Instant, desk: &mut dyn Desk) {
        self.held.count += 1;
        self.held.critical |= severity == Severity::Critical;
        self.held.dirty = true;
        if self.held.sent.is_none_or(|sent| now.duration_since(sent) >= UPDATE_EVERY) {
            self.send_held(now, desk);
        }
    }

    fn send_held(&mut self, now: Instant, desk: &mut dyn Desk) {
        let held = &mut self.held;
        let s = if held.count == 1 { "" } else { "s" };
        let summary = format!("credwatch: {} more alert{s} held back", held.count);
        let notice = content::count_notice(summary, &[], 0, held.critical);
        held.id = desk.show(&notice, held.id).or(held.id);
        held.dirty = false;
        held.sent = Some(now);
    }

    fn forget_idle(&mut self, now: Instant) {
        self.trees.retain(|_, group| now.duration_since(group.seen) < TREE_IDLE);
        if self.trees.len() >= MAX_TREES {
            if let Some(oldest) = self.trees.iter().min_by_key(|(_, group)| group.seen).map(|(tree, _)| tree.clone()) {
                self.trees.remove(&oldest);
            }
        }
    }
}

/// Shows the group's notification, in place of its last one.
fn send(group: &mut Group, now: Instant, desk: &mut dyn Desk) {
    // Not shown (no daemon): the next alert tries again with a new popup.
    group.id = desk.show(&group.notice(), group.id);
    group.dirty = false;
    group.sent = Some(now);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::content::tests::read_alert;

    /// Records what was shown; ids from 1.
    #[derive(Default)]
    struct Recorder {
        shown: Vec<(Notice, Option<u32>)>,
        next: u32,
        absent: bool,
    }

    impl Desk for Recorder {
        fn show(&mut self, notice: &Notice, replaces: Option<u32>) -> Option<u32> {
            if self.absent {
                return None;
            }
            self.shown.push((notice.clone(), replaces));
            Some(replaces.unwrap_or_else(|| {
                self.next += 1;
                self.next
            }))
        }
    }

    fn sweep(alert: &mut Alert, is_final: bool, folded: u64) {
        alert.rule.id = "credential-sweep".into();
        alert.file = None;
        alert.credwatch.sweep = Some(credwatch_core::alert::AlertSweep {
            categories: vec!["cloud".into(), "npm".into(), "ssh".into()],
            files: vec!["/h/.ssh/id_rsa".into(), "/h/.npmrc".into(), "/h/.aws/credentials".into()],
            folded,
            is_final,
            ..Default::default()
        });
    }

    #[test]
    fn a_tree_and_its_sweep_are_one_notification_updated_in_place() {
        let (mut volume, mut desk, start) = (Volume::default(), Recorder::default(), Instant::now());
        volume.live(1, read_alert("stealer", "/h/.ssh/id_rsa", 10), start, &mut desk);
        volume.live(2, read_alert("stealer", "/h/.npmrc", 10), start, &mut desk);
        let mut start_alert = read_alert("stealer", "", 10);
        sweep(&mut start_alert, false, 0);
        volume.live(3, start_alert, start + Duration::from_millis(10), &mut desk);
        // Folded after the sweep: a read of the tree.
        volume.live(4, read_alert("stealer", "/h/.kube/config", 10), start + Duration::from_millis(20), &mut desk);
        volume.tick(start + Duration::from_millis(900), &mut desk);
        assert_eq!(desk.shown.len(), 1, "updates wait for their turn");
        volume.tick(start + Duration::from_millis(1100), &mut desk);
        let mut final_alert = read_alert("stealer", "", 10);
        sweep(&mut final_alert, true, 7);
        volume.live(5, final_alert, start + Duration::from_secs(3), &mut desk);
        let replaced: Vec<Option<u32>> = desk.shown.iter().map(|(_, replaces)| *replaces).collect();
        assert_eq!(replaced, [None, Some(1), Some(1)]);
        let (last, _) = desk.shown.last().unwrap();
        assert!(last.summary.contains("swept 3 kinds"), "{}", last.summary);
        assert_eq!(last.details, Some(5));
        assert!(last.body.ends_with("+4 more alerts of the same package and tree"), "{}", last.body);
        let (middle, _) = &desk.shown[1];
        assert_eq!(middle.details, Some(3), "the sweep leads, not the read it folded");
    }

    #[test]
    fn a_burst_shows_three_and_counts_the_rest_in_one_notification() {
        let (mut volume, mut desk, start) = (Volume::default(), Recorder::default(), Instant::now());
        for i in 0..8u32 {
            let at = start + Duration::from_millis(u64::from(i) * 100);
            volume.live(u64::from(i), read_alert(&format!("p{i}"), "/h/.npmrc", 100 + i), at, &mut desk);
            volume.tick(at, &mut desk);
        }
        volume.flush(start + Duration::from_secs(1), &mut desk);
        let new: Vec<&Notice> = desk.shown.iter().filter(|(_, r)| r.is_none()).map(|(n, _)| n).collect();
        assert_eq!(new.len(), 4, "three alerts and one count");
        assert!(new[..3].iter().all(|notice| notice.details.is_some()));
        let (held, replaces) = desk.shown.last().unwrap();
        assert_eq!(held.summary, "credwatch: 5 more alerts held back");
        assert!(held.critical && held.body.contains("`credwatch alerts`"));
        assert_eq!(*replaces, Some(4), "the count is updated in place");
        // After the window, a new tree pops up again, and so does a held one that alerts again.
        let later = start + WINDOW + Duration::from_secs(2);
        volume.tick(later, &mut desk);
        volume.live(20, read_alert("q", "/h/.npmrc", 500), later, &mut desk);
        assert_eq!(desk.shown.last().unwrap().1, None);
        assert!(desk.shown.last().unwrap().0.summary.contains("q@1.0.0"));
        volume.live(21, read_alert("p7", "/h/.aws/credentials", 107), later, &mut desk);
        let (notice, replaces) = desk.shown.last().unwrap();
        assert_eq!(*replaces, None);
        assert!(notice.summary.contains("p7@1.0.0") && notice.body.contains("+1 more alert"), "{notice:?}");
    }

    #[test]
    fn missed_alerts_are_shown_when_few_and_counted_when_many() {
        let (mut volume, mut desk, now) = (Volume::default(), Recorder::default(), Instant::now());
        let few = vec![(1, read_alert("a", "/h/.npmrc", 1)), (2, read_alert("a", "/h/.ssh/id_rsa", 1))];
        volume.missed(few, now, &mut desk);
        assert_eq!(desk.shown.len(), 1);
        assert!(desk.shown[0].0.body.contains("+1 more alert of the same package and tree"));
        let many: Vec<(u64, Alert)> =
            (0..5u32).map(|i| (10 + u64::from(i), read_alert(&format!("m{i}"), "/h/.npmrc", 50 + i))).collect();
        let mut desk = Recorder::default();
        volume.missed(many, now, &mut desk);
        assert_eq!(desk.shown.len(), 1);
        let (notice, _) = &desk.shown[0];
        assert_eq!(notice.summary, "credwatch: 5 alerts while notify was not running");
        assert!(notice.body.starts_with("CRITICAL m4@1.0.0 read SSH private keys\n"), "{}", notice.body);
        assert!(notice.body.contains("and 2 more"), "{}", notice.body);
    }

    #[test]
    fn without_a_daemon_the_next_alert_of_the_tree_tries_a_new_popup() {
        let (mut volume, mut desk, now) =
            (Volume::default(), Recorder { absent: true, ..Default::default() }, Instant::now());
        volume.live(1, read_alert("a", "/h/.npmrc", 1), now, &mut desk);
        desk.absent = false;
        volume.live(2, read_alert("a", "/h/.ssh/id_rsa", 1), now + UPDATE_EVERY, &mut desk);
        assert_eq!(desk.shown.len(), 1);
        assert_eq!(desk.shown[0].1, None);
        assert!(desk.shown[0].0.body.contains("+1 more alert"));
    }
}
