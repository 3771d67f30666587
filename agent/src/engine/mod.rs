//! The engine: process table (lineage and attribution), rules, alert decisions. It sees only
//! [`Event`]s and never reads the filesystem or `/proc`, so replaying a trace gives the same
//! alerts as watching live.
//!
//! Lineage is fixed at fork: a child's parent is the process that forked it, whatever the
//! kernel later reparents it to. A process belongs to a tree when it is a root (it executed
//! a package manager, or `credwatch run` marked it) or when a member forked it. Only members
//! alert; events about other processes are ignored.

mod attribution;

use std::collections::{BTreeMap, HashMap, HashSet};

use time::{format_description::well_known::Rfc3339, OffsetDateTime};

use self::attribution::{Attribution, Rustc};
use crate::{
    alert::{
        Alert, AlertAncestor, AlertCredwatch, AlertEvent, AlertFile, AlertHost, AlertPackage, AlertParent,
        AlertProcess, AlertRule, AlertUser, Severity,
    },
    event::{Event, EventData, Exec, Open},
    rules::{
        manager::{basename, root_manager},
        schema::{Conditions, Who},
        Rule, RuleSet,
    },
};

/// `dirfd` meaning the current directory.
const AT_FDCWD: i32 = -100;
/// Most processes the table holds. Reached only when exits were lost: the oldest entries go
/// first, so memory stays bounded in long runs.
const MAX_PROCESSES: usize = 1 << 16;
/// Longest description `live_tree` returns, in characters.
const DESCRIPTION_MAX: usize = 200;

#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// `host.name` of the alerts.
    pub host_name: String,
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
}

/// Identifies one process (not one pid: pids are reused) in the table.
type Id = u64;

#[derive(Clone, Copy, Debug)]
struct ManagerSelf {
    /// No other manager is among its ancestors.
    outermost: bool,
}

#[derive(Clone, Debug)]
struct Proc {
    pid: u32,
    /// The forker, or for a root the parent its exec reported.
    ppid: u32,
    parent: Option<Id>,
    root_pid: u32,
    depth: u32,
    alive: bool,
    filename: String,
    executable: String,
    args: Vec<String>,
    cwd: String,
    uid: u32,
    /// `HOME` from its exec's environment or its ancestors'.
    home: Option<String>,
    /// Nearest package manager (index in the rule set's managers).
    manager: Option<usize>,
    /// Set when this process is that manager itself.
    manager_self: Option<ManagerSelf>,
    attribution: Attribution,
    rustc: Option<Rustc>,
    /// Table entries whose `parent` is this one: a dead entry stays while it has any.
    children: u32,
    /// (rule index, path) already alerted for this process.
    alerted: HashSet<(usize, String)>,
}

impl Proc {
    fn new_root(pid: u32, ppid: u32) -> Proc {
        Proc {
            pid,
            ppid,
            parent: None,
            root_pid: pid,
            depth: 0,
            alive: true,
            filename: String::new(),
            executable: String::new(),
            args: Vec::new(),
            cwd: String::new(),
            uid: 0,
            home: None,
            manager: None,
            manager_self: None,
            attribution: Attribution::default(),
            rustc: None,
            children: 0,
            alerted: HashSet::new(),
        }
    }

    fn is_one_of(&self, execs: &[String]) -> bool {
        execs.iter().any(|e| e == basename(&self.executable) || e == basename(&self.filename))
    }
}

pub struct Engine {
    rules: RuleSet,
    options: EngineOptions,
    /// By id, so the oldest entry is the first.
    procs: BTreeMap<Id, Proc>,
    /// The latest process of each pid.
    by_pid: HashMap<u32, Id>,
    next_id: Id,
    stats: EngineStats,
}

impl Engine {
    pub fn new(rules: RuleSet, options: EngineOptions) -> Engine {
        Engine {
            rules,
            options,
            procs: BTreeMap::new(),
            by_pid: HashMap::new(),
            next_id: 0,
            stats: EngineStats::default(),
        }
    }

    pub fn rules(&self) -> &RuleSet {
        &self.rules
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats { processes: self.procs.len(), ..self.stats }
    }

    /// Updates the process table with `event` and returns the alerts it fires.
    pub fn handle(&mut self, event: &Event) -> Vec<Alert> {
        self.stats.events += 1;
        let alerts = match &event.data {
            EventData::Exec(exec) => {
                self.exec(event.pid, exec);
                Vec::new()
            }
            EventData::Fork(fork) => {
                if let Some(parent) = self.live(event.pid) {
                    self.spawn(parent, fork.child_pid);
                }
                Vec::new()
            }
            EventData::Exit(_) => {
                if let Some(id) = self.live(event.pid) {
                    self.procs.get_mut(&id).expect("by_pid points into procs").alive = false;
                    self.collect(id);
                }
                Vec::new()
            }
            EventData::Root(_) => {
                if self.live(event.pid).is_none() {
                    self.insert_root(event.pid, 0);
                }
                Vec::new()
            }
            EventData::Open(open) => self.open(event, open),
            // Rules over renames and syscalls come with the persistence and tamper rules.
            EventData::Rename(_) | EventData::Syscall(_) => Vec::new(),
            EventData::Lost(lost) => {
                self.stats.lost += lost.count;
                Vec::new()
            }
        };
        self.stats.alerts += alerts.len() as u64;
        alerts
    }

    /// Live processes of the tree rooted at `root_pid`, by pid, each with a one-line
    /// description (escaped: it comes from the monitored system).
    pub fn live_tree(&self, root_pid: u32) -> Vec<(u32, String)> {
        let mut out: Vec<(u32, String)> = self
            .procs
            .values()
            .filter(|p| p.alive && p.root_pid == root_pid)
            .map(|p| {
                let mut line = p.executable.clone();
                for arg in p.args.iter().skip(1) {
                    line.push(' ');
                    line.push_str(arg);
                }
                (p.pid, escape_line(&line))
            })
            .collect();
        out.sort();
        out
    }

    fn live(&self, pid: u32) -> Option<Id> {
        self.by_pid.get(&pid).copied().filter(|id| self.procs[id].alive)
    }

    fn insert(&mut self, proc: Proc) -> Id {
        if self.procs.len() >= MAX_PROCESSES {
            self.evict_oldest();
        }
        let id = self.next_id;
        self.next_id += 1;
        // A pid seen again belongs to a new process: the old entry lives on only for its
        // descendants' lineage.
        if let Some(old) = self.by_pid.insert(proc.pid, id) {
            if let Some(old_proc) = self.procs.get_mut(&old) {
                old_proc.alive = false;
            }
            self.procs.insert(id, proc);
            self.collect(old);
        } else {
            self.procs.insert(id, proc);
        }
        id
    }

    fn insert_root(&mut self, pid: u32, ppid: u32) -> Id {
        self.insert(Proc::new_root(pid, ppid))
    }

    /// `parent` forked `child_pid`: the child starts as a copy, one level deeper. It is not the
    /// manager itself: managers fork only to exec something else.
    fn spawn(&mut self, parent: Id, child_pid: u32) -> Id {
        let p = &self.procs[&parent];
        let child = Proc {
            pid: child_pid,
            ppid: p.pid,
            parent: Some(parent),
            depth: p.depth + 1,
            alive: true,
            manager_self: None,
            children: 0,
            alerted: HashSet::new(),
            ..p.clone()
        };
        self.procs.get_mut(&parent).expect("live parent").children += 1;
        self.insert(child)
    }

    fn evict_oldest(&mut self) {
        let Some((_, p)) = self.procs.pop_first() else { return };
        self.stats.evicted += 1;
        if self.by_pid.get(&p.pid).is_some_and(|id| !self.procs.contains_key(id)) {
            self.by_pid.remove(&p.pid);
        }
        // Its descendants lose the ancestors above this point; their own entries stay valid.
        if let Some(parent) = p.parent {
            if let Some(entry) = self.procs.get_mut(&parent) {
                entry.children -= 1;
                self.collect(parent);
            }
        }
    }

    /// Drops dead entries that no descendant needs, walking up from `id`.
    fn collect(&mut self, mut id: Id) {
        loop {
            let Some(p) = self.procs.get(&id) else { return };
            if p.alive || p.children > 0 {
                return;
            }
            let p = self.procs.remove(&id).expect("just found");
            if self.by_pid.get(&p.pid) == Some(&id) {
                self.by_pid.remove(&p.pid);
            }
            let Some(parent) = p.parent else { return };
            match self.procs.get_mut(&parent) {
                Some(entry) => entry.children -= 1,
                None => return,
            }
            id = parent;
        }
    }

    fn exec(&mut self, pid: u32, exec: &Exec) {
        let filename = if exec.filename.is_empty() { &exec.executable } else { &exec.filename };
        let started = root_manager(self.rules.managers(), filename, &exec.args);
        let id = match self.live(pid) {
            Some(id) => id,
            // A member's child whose fork we did not see (lost) is still a member.
            None => match self.live(exec.ppid) {
                Some(parent) => self.spawn(parent, pid),
                None if started.is_some() => self.insert_root(pid, exec.ppid),
                None => return,
            },
        };
        let managers = self.rules.managers();
        let p = self.procs.get_mut(&id).expect("just found or inserted");
        p.filename = filename.clone();
        p.executable = if exec.executable.is_empty() { filename.clone() } else { exec.executable.clone() };
        p.args = exec.args.clone();
        p.cwd = exec.cwd.clone();
        p.uid = exec.uid;
        if p.parent.is_none() {
            p.ppid = exec.ppid;
        }
        if let Some(home) = exec.env.get("HOME") {
            p.home = Some(home.clone());
        }
        p.rustc = None;
        // `npm` is a script: the kernel runs `/usr/bin/npm`, then env execs `node /usr/bin/npm`
        // in the same process, which is still the manager.
        let hop = p.manager_self.is_some()
            && p.manager.is_some_and(|m| {
                exec.args.iter().skip(1).any(|arg| managers[m].execs.iter().any(|e| e == basename(arg)))
            });
        if let Some(kind) = started {
            let outermost = match p.manager_self {
                Some(own) => own.outermost,
                None => p.manager.is_none(),
            };
            p.manager = Some(kind);
            p.manager_self = Some(ManagerSelf { outermost });
            // A manager started by package code (`npm whoami` in a postinstall) keeps naming
            // that package unless its own arguments name another.
            let own = attribution::for_manager(&exec.args);
            if outermost || own.name.is_some() {
                p.attribution = own;
            }
        } else if !hop {
            p.manager_self = None;
            let path = if filename.starts_with('/') { filename.as_str() } else { p.executable.as_str() };
            let (attr, rustc) = attribution::for_exec(&p.attribution, path, &exec.args, &exec.cwd, &exec.env);
            p.attribution = attr;
            p.rustc = rustc;
        }
    }

    fn open(&mut self, event: &Event, open: &Open) -> Vec<Alert> {
        let Some(id) = self.live(event.pid) else { return Vec::new() };
        if open.ret < 0 {
            // A failed open read nothing; probing for files that do not exist is what every
            // config loader does.
            return Vec::new();
        }
        let p = self.procs.get_mut(&id).expect("live");
        let path = resolved_path(open, &p.cwd);
        learn_from_open(p, &path);
        if open.flags & libc::O_PATH as u64 != 0 {
            // An O_PATH descriptor cannot read the file.
            return Vec::new();
        }
        let mut alerts = Vec::new();
        let candidates = self.rules.candidates(&path, self.procs[&id].home.as_deref());
        for index in candidates {
            let rule = &self.rules.rules()[index];
            let p = &self.procs[&id];
            if !rule.matches_path(&path, p.home.as_deref())
                || !self.conditions_hold(&rule.conditions, p, &path, event.pid, open.tid)
            {
                continue;
            }
            let Some(severity) = self.severity(p, rule) else { continue };
            if !self.procs.get_mut(&id).expect("live").alerted.insert((index, path.clone())) {
                continue;
            }
            alerts.push(self.alert(event, open, id, &path, rule, severity));
        }
        alerts
    }

    /// The package a live process of a tree runs for, as its alerts would name it.
    pub fn package_of(&self, pid: u32) -> Option<AlertPackage> {
        self.live(pid).map(|id| self.package(&self.procs[&id]))
    }

    fn package(&self, p: &Proc) -> AlertPackage {
        AlertPackage {
            manager: self.manager_name(p).to_owned(),
            name: p.attribution.name.clone(),
            version: p.attribution.version.clone(),
            lifecycle: p.attribution.lifecycle.clone(),
        }
    }

    fn manager_name(&self, p: &Proc) -> &str {
        p.manager.map(|m| self.rules.managers()[m].name.as_str()).unwrap_or("run")
    }

    fn conditions_hold(&self, c: &Conditions, p: &Proc, path: &str, pid: u32, tid: u32) -> bool {
        (c.managers.is_empty() || c.managers.iter().any(|m| m == self.manager_name(p)))
            && (c.lifecycles.is_empty() || p.attribution.lifecycle.as_ref().is_some_and(|l| c.lifecycles.contains(l)))
            && c.min_depth.is_none_or(|d| p.depth >= d)
            && c.max_depth.is_none_or(|d| p.depth <= d)
            && (!c.other_process || names_other_process(path, pid, tid))
    }

    /// The severity to alert at, or None when an actor of the rule may do this.
    fn severity(&self, p: &Proc, rule: &Rule) -> Option<Severity> {
        for actor in &rule.actors {
            if !actor.managers.is_empty() && !actor.managers.iter().any(|m| m == self.manager_name(p)) {
                continue;
            }
            let hit = match &actor.who {
                Who::Manager { outermost } => p.manager_self.is_some_and(|own| !outermost || own.outermost),
                Who::Execs { execs, via_manager } => {
                    p.is_one_of(execs) && (!via_manager || self.launched_by_manager(p, execs))
                }
            };
            if hit {
                return actor.verdict.severity();
            }
        }
        Some(rule.severity)
    }

    /// Every process between `p` and its nearest manager is one of `execs`.
    fn launched_by_manager(&self, p: &Proc, execs: &[String]) -> bool {
        let mut next = p.parent;
        while let Some(id) = next {
            let Some(ancestor) = self.procs.get(&id) else { return false };
            if ancestor.manager_self.is_some() {
                return true;
            }
            if !ancestor.is_one_of(execs) {
                return false;
            }
            next = ancestor.parent;
        }
        false
    }

    fn alert(&self, event: &Event, open: &Open, id: Id, path: &str, rule: &Rule, severity: Severity) -> Alert {
        let p = &self.procs[&id];
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
        Alert {
            timestamp: rfc3339(event.time_ns),
            event: AlertEvent { kind: "alert".into(), action: "open".into(), outcome: "alerted".into() },
            rule: AlertRule {
                id: rule.id.clone(),
                name: rule.name.clone(),
                category: rule.category.clone(),
                severity,
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
            file: Some(AlertFile {
                path: path.to_owned(),
                given_path: open.path.clone(),
                flags: open_flags(open.flags),
            }),
            package: self.package(p),
            host: AlertHost { name: self.options.host_name.clone() },
            user: AlertUser { id: p.uid },
            credwatch: AlertCredwatch {
                root_pid: p.root_pid,
                rotate: rule.rotate.clone(),
                enforcement: "userspace".into(),
            },
        }
    }
}

/// What an open teaches attribution: which proc-macro rustc loaded, that a build backend is
/// running `setup.py`.
fn learn_from_open(p: &mut Proc, path: &str) {
    if let Some(rustc) = &p.rustc {
        if let Some((name, _)) = rustc.proc_macros.iter().find(|(_, so)| so == path || basename(so) == basename(path)) {
            p.attribution.name = Some(name.clone());
            p.attribution.version = None;
            p.attribution.lifecycle = Some("proc-macro".into());
        }
    }
    if basename(path) == "setup.py" && p.attribution.lifecycle.as_deref() == Some("build-backend") {
        p.attribution.lifecycle = Some("setup.py".into());
    }
}

/// The absolute path of the opened file: the kernel's when it has it, else the given path
/// made absolute against the exec's cwd (lexically; a later chdir is not seen).
fn resolved_path(open: &Open, cwd: &str) -> String {
    match &open.abs_path {
        Some(abs) if !open.truncated => abs.clone(),
        _ if open.path.starts_with('/') => normalize(&open.path),
        _ if open.dirfd == AT_FDCWD && cwd.starts_with('/') => normalize(&format!("{cwd}/{}", open.path)),
        Some(abs) => abs.clone(),
        None => open.path.clone(),
    }
}

fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}

/// `/proc/<n>/...` with `n` neither the opener's pid nor its thread's id. (The kernel resolves
/// `/proc/self` to `/proc/<pid>`.)
fn names_other_process(path: &str, pid: u32, tid: u32) -> bool {
    path.strip_prefix("/proc/")
        .and_then(|rest| rest.split('/').next())
        .and_then(|n| n.parse::<u32>().ok())
        .is_some_and(|n| n != pid && n != tid)
}

fn rfc3339(time_ns: u64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(time_ns))
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

/// `O_*` flags, symbolic (`O_RDONLY|O_CLOEXEC`); unknown bits in hex.
pub fn open_flags(flags: u64) -> String {
    const NAMED: &[(&str, i32)] = &[
        ("O_CREAT", libc::O_CREAT),
        ("O_EXCL", libc::O_EXCL),
        ("O_NOCTTY", libc::O_NOCTTY),
        ("O_TRUNC", libc::O_TRUNC),
        ("O_APPEND", libc::O_APPEND),
        ("O_NONBLOCK", libc::O_NONBLOCK),
        ("O_SYNC", libc::O_SYNC),
        ("O_DSYNC", libc::O_DSYNC),
        ("O_ASYNC", libc::O_ASYNC),
        ("O_DIRECT", libc::O_DIRECT),
        ("O_TMPFILE", libc::O_TMPFILE),
        ("O_DIRECTORY", libc::O_DIRECTORY),
        ("O_NOFOLLOW", libc::O_NOFOLLOW),
        ("O_NOATIME", libc::O_NOATIME),
        ("O_CLOEXEC", libc::O_CLOEXEC),
        ("O_PATH", libc::O_PATH),
        ("O_LARGEFILE", libc::O_LARGEFILE),
    ];
    let mut rest = flags;
    let mut names = vec![match flags & libc::O_ACCMODE as u64 {
        0 => "O_RDONLY".to_owned(),
        1 => "O_WRONLY".to_owned(),
        2 => "O_RDWR".to_owned(),
        other => format!("{other:#x}"),
    }];
    rest &= !(libc::O_ACCMODE as u64);
    for (name, bits) in NAMED {
        let bits = *bits as u64;
        if bits != 0 && rest & bits == bits {
            names.push((*name).to_owned());
            rest &= !bits;
        }
    }
    // The 64-bit x86 kernel adds O_LARGEFILE (0o100000) itself; libc calls it 0 there.
    #[cfg(target_arch = "x86_64")]
    if rest & 0o100000 != 0 {
        names.push("O_LARGEFILE".to_owned());
        rest &= !0o100000;
    }
    if rest != 0 {
        names.push(format!("{rest:#x}"));
    }
    names.join("|")
}

/// One line of at most [`DESCRIPTION_MAX`] characters, escaped for a terminal.
fn escape_line(text: &str) -> String {
    let line: String = text.chars().take(DESCRIPTION_MAX).collect();
    crate::output::escape(&line).into_owned()
}

#[cfg(test)]
mod tests;
