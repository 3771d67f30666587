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

mod attribution;
mod egress;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use time::{format_description::well_known::Rfc3339, OffsetDateTime};

use self::attribution::{Attribution, ProcMacroPackages, Rustc};
use crate::{
    alert::{
        Alert, AlertAncestor, AlertCredwatch, AlertEvent, AlertFile, AlertHost, AlertPackage, AlertParent,
        AlertProcess, AlertRule, AlertSweep, AlertSyscall, AlertUser, Severity,
    },
    event::{normalize_path, Event, EventData, Exec, Open, Rename, Syscall},
    rules::{
        manager::{basename, command_args, root_manager, script_arg, TEMP_DIRS},
        schema::{Access, Conditions, ExecMatch, Who},
        Rule, RuleKind, RuleSet,
    },
};

/// `dirfd` meaning the current directory.
const AT_FDCWD: i32 = -100;
/// Most processes the table holds. Reached only when exits were lost: the oldest entries go
/// first, so memory stays bounded in long runs.
const MAX_PROCESSES: usize = 1 << 16;
/// Longest description `live_tree` returns, in characters.
const DESCRIPTION_MAX: usize = 200;
/// Most paths remembered per tree as written by it; the oldest go first.
const MAX_WRITTEN: usize = 4096;
/// Most distinct alerts remembered per tree for deduplication; past it, new ones are printed
/// but not remembered.
const MAX_SEEN: usize = 4096;
/// Most files a sweep alert lists; the others are counted.
const MAX_SWEEP_FILES: usize = 100;
/// Most opens of configuration-chain files remembered per process for loader actors.
const MAX_LOADER_OPENS: usize = 8;

#[derive(Clone, Debug, Default)]
pub struct EngineOptions {
    /// `host.name` of the alerts.
    pub host_name: String,
    /// The project's own scripts and programs (`npm run dev`, `cargo test`) alert like package
    /// code (CI jobs that run untrusted pull requests' tests).
    pub watch_project: bool,
    /// The home of processes whose events carry no `HOME` (`--home`): beats the home inferred
    /// from a manager's own reads, which beats `passwd`.
    pub home: Option<String>,
    /// Homes by uid, from the traced host's passwd file (`--passwd`).
    pub passwd: HashMap<u32, String>,
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

#[derive(Clone, Copy, Debug)]
struct ManagerSelf {
    /// No other manager is among its ancestors (the project's own code is none).
    outermost: bool,
    /// It runs the developer's own project: its `project_code` entry (`npm run dev`).
    project: Option<usize>,
}

#[derive(Clone, Debug)]
struct Proc {
    pid: u32,
    /// The forker, or for a root the parent its exec reported.
    ppid: u32,
    parent: Option<Id>,
    /// The tree's root entry.
    root: Id,
    /// Whose [`Tree`] holds its dedup, sweep, written files and home: the root's, or that of a
    /// manager the project's own code started (each `npx` in `npm run dev` is a tree of its own).
    tree: Id,
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
    /// `SSH_AUTH_SOCK` likewise: a connect to it uses the SSH agent.
    ssh_auth_sock: Option<String>,
    /// Nearest package manager (index in the rule set's managers).
    manager: Option<usize>,
    /// Set when this process is that manager itself.
    manager_self: Option<ManagerSelf>,
    attribution: Attribution,
    rustc: Option<Rustc>,
    /// Table entries whose `parent` is this one: a dead entry stays while it has any.
    children: u32,
    /// The outermost manager forked it and it has not executed anything yet: its exec is the
    /// manager's doing (cargo running a build script it had built). A nested "manager" may be
    /// package code (`bun payload.js`).
    started_by_manager: bool,
    /// A manager running the project (`npm run`, `cargo run`) forked it and it has not executed
    /// anything yet: that manager's `project_code` entry.
    started_by_project: Option<usize>,
    /// The developer's own code (a script of `npm run`, the program of `cargo run`): quiet
    /// unless `watch_project`. Inherited until it starts a manager that is not running the
    /// project (`npm install`, `npx`), whose tree is watched.
    project: bool,
    /// Its latest attempts (time, path) to open a file a loader actor looks back for.
    loader_opens: VecDeque<(u64, String)>,
}

impl Proc {
    fn new_root(pid: u32, ppid: u32) -> Proc {
        Proc {
            pid,
            ppid,
            parent: None,
            root: 0,
            tree: 0,
            root_pid: pid,
            depth: 0,
            alive: true,
            filename: String::new(),
            executable: String::new(),
            args: Vec::new(),
            cwd: String::new(),
            uid: 0,
            home: None,
            ssh_auth_sock: None,
            manager: None,
            manager_self: None,
            attribution: Attribution::default(),
            rustc: None,
            children: 0,
            started_by_manager: false,
            started_by_project: None,
            project: false,
            loader_opens: VecDeque::new(),
        }
    }

    fn is_one_of(&self, execs: &[String]) -> bool {
        execs.iter().any(|e| e == basename(&self.executable) || e == basename(&self.filename))
    }
}

/// What the engine keeps per tree, by the root's table id.
#[derive(Default)]
struct Tree {
    /// Paths that members (other than the outermost manager itself) created or wrote, for
    /// `written_by_tree`; `written_order` is their age, oldest first.
    written: HashSet<String>,
    written_order: VecDeque<String>,
    /// How often each (rule, severity, subject) alerted: the same rule at another severity
    /// (package code, not git under the manager) is another alert.
    seen: HashMap<(usize, Severity, String), u64>,
    /// Credential alerts within the sweep window: (time, rule index, file).
    recent: VecDeque<(u64, usize, String)>,
    sweep: Option<SweepState>,
    /// The home its managers' own per-user files were in (`<home>/.npmrc`), for events without
    /// `HOME`.
    home: Option<String>,
    /// The packages of the proc-macros the tree built, to name them when they run.
    proc_macro_packages: ProcMacroPackages,
}

struct SweepState {
    /// The sweep alert, its counts kept current.
    alert: Alert,
    /// Rules that fired in it (indices).
    rules: BTreeSet<usize>,
    /// Time of the latest folded alert.
    last_ns: u64,
    /// Alerts were folded since the last summary.
    unreported: bool,
}

pub struct Engine {
    rules: RuleSet,
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
}

impl Engine {
    pub fn new(rules: RuleSet, options: EngineOptions) -> Engine {
        Engine {
            rules,
            options,
            procs: BTreeMap::new(),
            by_pid: HashMap::new(),
            next_id: 0,
            trees: BTreeMap::new(),
            pending: Vec::new(),
            stats: EngineStats::default(),
            egress: egress::Egress::default(),
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
        let mut alerts = match &event.data {
            EventData::Exec(exec) => self.exec(event, exec),
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
            EventData::Rename(rename) => self.rename(event, rename),
            EventData::Syscall(syscall) => self.syscall(event, syscall),
            EventData::Connect(connect) => self.connect(event, connect),
            EventData::DnsQuery(query) => self.dns_query(event, query),
            EventData::Lost(lost) => {
                self.stats.lost += lost.count;
                Vec::new()
            }
        };
        alerts.append(&mut self.pending);
        self.stats.alerts += alerts.len() as u64;
        alerts
    }

    /// The end of the stream: the final summaries of sweeps whose trees are still running and
    /// folded alerts since their last summary. Call it once the last event was handled (live:
    /// when the session ends; replay: at the end of each file).
    pub fn flush(&mut self) -> Vec<Alert> {
        let rules = &self.rules;
        let alerts: Vec<Alert> = self.trees.values_mut().filter_map(|tree| sweep_summary(rules, tree)).collect();
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
        let id = self.insert(Proc::new_root(pid, ppid));
        let p = self.procs.get_mut(&id).expect("just inserted");
        p.root = id;
        p.tree = id;
        id
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
            started_by_manager: p.manager_self.is_some_and(|own| own.outermost),
            started_by_project: p.manager_self.and_then(|own| own.project),
            loader_opens: VecDeque::new(),
            ..p.clone()
        };
        self.procs.get_mut(&parent).expect("live parent").children += 1;
        self.insert(child)
    }

    fn evict_oldest(&mut self) {
        let Some((id, p)) = self.procs.pop_first() else { return };
        self.stats.evicted += 1;
        self.tree_ended(id, &p);
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
            self.tree_ended(id, &p);
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

    /// When the entry `id` that left the table holds a tree's state (a root, or a manager the
    /// project's code started), that tree is gone: its sweep's final summary is due.
    fn tree_ended(&mut self, id: Id, p: &Proc) {
        self.egress.forget(id);
        if p.tree != id {
            return;
        }
        if let Some(mut tree) = self.trees.remove(&id) {
            if let Some(summary) = sweep_summary(&self.rules, &mut tree) {
                self.pending.push(summary);
            }
        }
    }

    fn exec(&mut self, event: &Event, exec: &Exec) -> Vec<Alert> {
        let pid = event.pid;
        let filename = if exec.filename.is_empty() { &exec.executable } else { &exec.filename };
        let started = root_manager(self.rules.managers(), filename, &exec.args);
        // `bun payload.js` roots a tree like `bun install`, but it is code, not the manager;
        // so is a program that only poses as a manager (node copied to /tmp/x/npm).
        let runs_code =
            started.filter(|&m| self.rules.runs_code(m, filename, &exec.args) || self.masquerades(m, filename, exec));
        let project_command = started.and_then(|m| self.rules.project_command(m, filename, &exec.args));
        let id = match self.live(pid) {
            Some(id) => id,
            // A member's child whose fork we did not see (lost) is still a member.
            None => match self.live(exec.ppid) {
                Some(parent) => self.spawn(parent, pid),
                None if started.is_some() => self.insert_root(pid, exec.ppid),
                None => return Vec::new(),
            },
        };
        // A tree whose state holder was evicted keeps no state (nothing would ever drop it).
        let tree = self.procs[&id].tree;
        if let Some(built) =
            ProcMacroPackages::built_by(&exec.args, &exec.env).filter(|_| self.procs.contains_key(&tree))
        {
            self.trees.entry(tree).or_default().proc_macro_packages.insert(built);
        }
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
        if let Some(socket) = exec.env.get("SSH_AUTH_SOCK") {
            p.ssh_auth_sock = Some(socket.clone());
        }
        p.rustc = None;
        // `npm` is a script: the kernel runs `/usr/bin/npm`, then env execs `node /usr/bin/npm`
        // in the same process, which is still the manager.
        let hop = p.manager_self.is_some()
            && p.manager.is_some_and(|m| {
                exec.args.iter().skip(1).any(|arg| managers[m].execs.iter().any(|e| e == basename(arg)))
            });
        // That exec matches the manager again (a script run by its interpreter): nothing changes.
        let (started, runs_code, project_command) =
            if hop { (None, None, None) } else { (started, runs_code, project_command) };
        // The developer's own project: only when no package code runs this (a postinstall's
        // `npm run build` is package code).
        let package_code = p.manager.is_some() && !p.project;
        let project_command = project_command.filter(|_| !package_code);
        let in_place = p.manager_self.and_then(|own| own.project).filter(|_| !hop);
        if let Some(entry) = std::mem::take(&mut p.started_by_project).or(in_place) {
            // What the project's manager starts (or becomes: `poetry run` execs in place).
            if started.is_none() {
                p.project = self.rules.project_program(entry, &p.executable);
            }
        }
        if started.is_some() {
            // `bun test` is the project's code itself; `npm install` from a script is not: its
            // tree (dedup, sweep) is its own.
            let was_project = std::mem::replace(
                &mut p.project,
                project_command.is_some_and(|entry| runs_code.is_some() || self.rules.project_in_process(entry)),
            );
            if was_project && !p.project {
                p.tree = id;
            }
        }
        if let Some(kind) = started.filter(|_| runs_code.is_none()) {
            let helper = p.started_by_manager
                && p.manager == Some(kind)
                && script_arg(&exec.args)
                    .is_some_and(|script| managers[kind].helpers.iter().any(|h| h == basename(script)));
            let outermost = match p.manager_self {
                Some(own) => own.outermost,
                None => !package_code || helper,
            };
            p.manager = Some(kind);
            p.manager_self = Some(ManagerSelf { outermost, project: project_command });
            // A manager started by package code (`npm whoami` in a postinstall) keeps naming
            // that package unless its own arguments name another.
            let own = attribution::for_manager(command_args(&managers[kind], filename, &exec.args));
            if outermost || own.name.is_some() {
                p.attribution = own;
            }
        } else if !hop {
            p.manager_self = None;
            if runs_code.is_some() {
                p.manager = runs_code;
            }
            let path = if filename.starts_with('/') { filename.as_str() } else { p.executable.as_str() };
            let packages = self.trees.get(&tree).map(|tree| &tree.proc_macro_packages);
            let (attr, rustc) = attribution::for_exec(&p.attribution, path, exec, packages);
            p.attribution = attr;
            p.rustc = rustc;
        }
        let by_manager = std::mem::take(&mut p.started_by_manager);
        // The root is the user's own command (or the manager): exec rules are about what runs
        // below it.
        if p.parent.is_none() || self.quiet(id) {
            return Vec::new();
        }
        self.exec_rules(event, id, by_manager)
    }

    /// Whether an exec of the manager `manager` is not the installed manager but a program
    /// posing as it: its program (or the release file an interpreter runs) was written by
    /// package code of a tree still running, or it is a binary executed by the name of a
    /// manager whose installed form is a script (npm, yarn, pip: for those the kernel reports
    /// the interpreter as the executable), lying in a temporary directory.
    fn masquerades(&self, manager: usize, filename: &str, exec: &Exec) -> bool {
        let m = &self.rules.managers()[manager];
        let exe = absolute(if exec.executable.is_empty() { filename } else { &exec.executable }, &exec.cwd);
        let named = m.execs.iter().any(|name| name == basename(filename));
        if m.script && named && basename(&exe) == basename(filename) && TEMP_DIRS.iter().any(|d| exe.starts_with(d)) {
            return true;
        }
        let mut paths = vec![absolute(filename, &exec.cwd), exe];
        let interpreter = basename(filename);
        if m.scripts.iter().any(|s| s.interpreters.iter().any(|i| i == interpreter)) {
            paths.extend(script_arg(&exec.args).map(|script| absolute(script, &exec.cwd)));
        }
        self.trees.values().any(|tree| paths.iter().any(|path| tree.written.contains(path)))
    }

    fn exec_rules(&mut self, event: &Event, id: Id, by_manager: bool) -> Vec<Alert> {
        let p = &self.procs[&id];
        let exe =
            if p.executable.starts_with('/') { normalize_path(&p.executable) } else { absolute(&p.filename, &p.cwd) };
        let names = [basename(&p.filename), basename(&p.executable)];
        let words = p.args.get(1..).unwrap_or_default();
        let mut command: Option<String> = None;
        let mut hits = Vec::new();
        for index in self.rules.exec_candidates(&names) {
            let rule = &self.rules.rules()[index];
            let Some(m) = &rule.exec else { continue };
            if !m.names.is_empty() && !m.names.iter().any(|n| names.contains(&n.as_str())) {
                continue;
            }
            if !m.all_args.iter().all(|pattern| words.iter().any(|w| pattern.matcher.is_match(w)))
                || (!m.any_args.is_empty()
                    && !m.any_args.iter().any(|pattern| words.iter().any(|w| pattern.matcher.is_match(w))))
            {
                continue;
            }
            if let Some(pattern) = &m.command {
                if !pattern.regex.is_match(command.get_or_insert_with(|| words.join(" ")).as_str()) {
                    continue;
                }
            }
            let written = if m.written_by_tree {
                // What a manager starts itself (cargo running the build script rustc linked)
                // is the manager's doing.
                if by_manager {
                    continue;
                }
                match self.written_file(p, m, &exe, &names) {
                    Some(path) if !rule.excludes(&path, self.home_of(p)) => Some(path),
                    _ => continue,
                }
            } else {
                if rule.excludes(&exe, self.home_of(p)) {
                    continue;
                }
                None
            };
            if !self.conditions_hold(&rule.conditions, p, false) {
                continue;
            }
            let Some(judgement) = self.severity(p, rule, None) else { continue };
            let mut alert = self.alert(event, id, rule, judgement, "exec", false, None);
            alert.credwatch.written_file = written;
            hits.push((index, alert));
        }
        let subject = format!("{exe}\0{}", words.join("\0"));
        let tree = p.tree;
        hits.into_iter()
            .filter_map(|(index, alert)| self.deliver(tree, index, subject.clone(), alert, event.time_ns))
            .collect()
    }

    /// The file of the exec that the tree wrote: the program, or for an interpreter of `m` the
    /// script (its first argument that is not an option).
    fn written_file(&self, p: &Proc, m: &ExecMatch, exe: &str, names: &[&str]) -> Option<String> {
        let tree = self.trees.get(&p.tree)?;
        // The kernel's executable, or the path given to execve (a script's own path).
        for path in [exe.to_owned(), absolute(&p.filename, &p.cwd)] {
            if tree.written.contains(&path) {
                return Some(path);
            }
        }
        if m.interpreters.iter().any(|i| names.contains(&i.as_str())) {
            let script = p.args.iter().skip(1).find(|arg| !arg.starts_with('-'))?;
            let script = absolute(script, &p.cwd);
            if tree.written.contains(&script) {
                return Some(script);
            }
        }
        None
    }

    /// Remembers that the tree of `root` (a process's `tree`) created or wrote `path`.
    fn remember_written(&mut self, root: Id, path: &str) {
        // A tree whose root was evicted keeps no state (nothing would ever drop it).
        if !self.procs.contains_key(&root) {
            return;
        }
        let tree = self.trees.entry(root).or_default();
        if tree.written.contains(path) {
            return;
        }
        if tree.written.len() >= MAX_WRITTEN {
            if let Some(oldest) = tree.written_order.pop_front() {
                tree.written.remove(&oldest);
            }
        }
        tree.written.insert(path.to_owned());
        tree.written_order.push_back(path.to_owned());
    }

    fn open(&mut self, event: &Event, open: &Open) -> Vec<Alert> {
        let Some(id) = self.live(event.pid) else { return Vec::new() };
        self.learn_home(id, open);
        // The kernel blocks without knowing what is the project's: a kill is never silent.
        if self.quiet(id) && !open.blocked {
            return Vec::new();
        }
        let p = &self.procs[&id];
        let path = resolved_path(open, &p.cwd);
        // Loaders probe for files that do not exist: failed attempts count as links of a chain.
        if self.rules.is_loader_input(&path, self.home_of(p)) {
            let p = self.procs.get_mut(&id).expect("live");
            if p.loader_opens.len() >= MAX_LOADER_OPENS {
                p.loader_opens.pop_front();
            }
            p.loader_opens.push_back((event.time_ns, path.clone()));
        }
        // A failed open read nothing; probing for files that do not exist is what every
        // config loader does. A blocked one failed because the kernel stopped it: that is
        // the alert.
        if open.ret < 0 && !open.blocked {
            return Vec::new();
        }
        let p = self.procs.get_mut(&id).expect("live");
        learn_from_open(p, &path);
        if open.flags & libc::O_PATH as u64 != 0 {
            // An O_PATH descriptor can neither read nor write the file.
            return Vec::new();
        }
        let accmode = open.flags & libc::O_ACCMODE as u64;
        let write_bits = (libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND) as u64;
        let writes = accmode != libc::O_RDONLY as u64 || open.flags & write_bits != 0 || open.syscall == "creat";
        let reads = accmode != libc::O_WRONLY as u64 && open.syscall != "creat";
        let accesses: &[Access] = match (reads, writes) {
            (true, true) => &[Access::Read, Access::Write],
            (true, false) => &[Access::Read],
            (false, true) => &[Access::Write],
            (false, false) => &[],
        };
        // Files the outermost manager writes are the packages it installs; a nested one may be
        // package code (`bun payload.js`).
        let (root, is_manager) = (p.tree, p.manager_self.is_some_and(|own| own.outermost));
        if writes && !is_manager && !open.blocked {
            self.remember_written(root, &path);
        }
        let p = &self.procs[&id];
        let mut hits: Vec<(usize, Judgement, Option<&str>)> = self
            .target_hits(p, &path, (event.pid, open.tid), accesses, open.blocked, Some(event.time_ns))
            .into_iter()
            .map(|(i, s)| (i, s, None))
            .collect();
        // The sensor knows the file by its inode: a hardlink or moved copy matches as the
        // credential file it is.
        if let Some(original) = open.same_file_as.as_deref().filter(|original| *original != path) {
            for (index, severity) in
                self.target_hits(p, original, (event.pid, open.tid), accesses, open.blocked, Some(event.time_ns))
            {
                if !hits.iter().any(|(i, ..)| *i == index) {
                    hits.push((index, severity, Some(original)));
                }
            }
        }
        // Whatever it alerts at (or is folded into), a credential read counts for egress.
        for (index, _, original) in &hits {
            if self.rules.rules()[*index].is_credential() {
                self.egress.touched(root, original.unwrap_or(&path));
            }
        }
        let mut alerts = Vec::new();
        for (index, severity, original) in hits {
            let rule = &self.rules.rules()[index];
            let file = AlertFile {
                path: path.clone(),
                given_path: open.path.clone(),
                flags: open_flags(open.flags),
                same_file_as: original.map(str::to_owned),
                ..AlertFile::default()
            };
            let alert = self.alert(event, id, rule, severity, "open", open.blocked, Some(file));
            let subject = original.unwrap_or(&path).to_owned();
            alerts.extend(self.deliver(root, index, subject, alert, event.time_ns));
        }
        alerts
    }

    /// The developer's own code, and not watched (`--watch-project` watches it).
    fn quiet(&self, id: Id) -> bool {
        !self.options.watch_project && self.procs[&id].project
    }

    /// A manager's own read (or look-up) of one of its per-user files tells its tree's home,
    /// for events without `HOME`. Only the manager itself counts, and only reads: package code
    /// must not choose where credentials are looked for, and a package's files that the manager
    /// writes while unpacking it (a `.npm/` or `.pypirc` in the archive) are the package's. The
    /// first one found stays.
    fn learn_home(&mut self, id: Id, open: &Open) {
        let p = &self.procs[&id];
        let Some(manager) = p.manager.filter(|_| p.manager_self.is_some() && p.home.is_none()) else { return };
        let writes = (libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC) as u64;
        if open.flags & writes != 0 || open.syscall == "creat" {
            return;
        }
        if self.trees.get(&p.tree).is_some_and(|tree| tree.home.is_some()) || !self.procs.contains_key(&p.tree) {
            return;
        }
        let path = resolved_path(open, &p.cwd);
        if let Some(home) = self.rules.home_of_manager_file(manager, &path, &p.cwd) {
            self.trees.entry(p.tree).or_default().home = Some(home);
        }
    }

    /// The home of `p`'s user: its `HOME`, else `--home`, else where its tree's managers found
    /// their per-user files, else the passwd file's entry for its uid.
    fn home_of<'a>(&'a self, p: &'a Proc) -> Option<&'a str> {
        p.home
            .as_deref()
            .or(self.options.home.as_deref())
            .or_else(|| self.trees.get(&p.tree).and_then(|tree| tree.home.as_deref()))
            .or_else(|| self.options.passwd.get(&p.uid).map(String::as_str))
    }

    /// Target rules about one of `accesses` that match `path` for `p`, with the severity to
    /// alert at (actors that allow are left out). `open_time`: the path is being opened then.
    fn target_hits(
        &self,
        p: &Proc,
        path: &str,
        (pid, tid): (u32, u32),
        accesses: &[Access],
        blocked: bool,
        open_time: Option<u64>,
    ) -> Vec<(usize, Judgement)> {
        let home = self.home_of(p);
        let other = names_other_process(path, pid, tid);
        self.rules
            .candidates(path, home)
            .into_iter()
            .filter_map(|index| {
                let rule = &self.rules.rules()[index];
                let RuleKind::Target(access) = rule.kind else { return None };
                if !accesses.contains(&access)
                    || !rule.matches_path(path, home)
                    || !self.conditions_hold(&rule.conditions, p, other)
                {
                    return None;
                }
                self.verdict(p, rule, blocked, open_time.map(|t| (path, t))).map(|judgement| (index, judgement))
            })
            .collect()
    }

    /// A rename or link: onto a target is a write of it, of a credential file elsewhere a
    /// read (it is about to be opened under another name).
    fn rename(&mut self, event: &Event, rename: &Rename) -> Vec<Alert> {
        let Some(id) = self.live(event.pid) else { return Vec::new() };
        if rename.ret < 0 || self.quiet(id) {
            return Vec::new();
        }
        let p = &self.procs[&id];
        let action = if rename.syscall.starts_with("rename") {
            "rename"
        } else if rename.syscall.starts_with("symlink") {
            "symlink"
        } else {
            "link"
        };
        let new = rename.new_abs.as_deref().map(normalize_path).unwrap_or_else(|| absolute(&rename.new_path, &p.cwd));
        // A symlink's old path is the link's text: relative to the link's directory.
        let old = match action {
            "symlink" => absolute(&rename.old_path, new.rsplit_once('/').map_or("/", |(dir, _)| dir)),
            _ => rename.old_abs.as_deref().map(normalize_path).unwrap_or_else(|| absolute(&rename.old_path, &p.cwd)),
        };
        // Files the outermost manager writes are the packages it installs; a nested one may be
        // package code (`bun payload.js`).
        let (root, is_manager) = (p.tree, p.manager_self.is_some_and(|own| own.outermost));
        let mut hits = Vec::new();
        for (index, severity) in self.target_hits(p, &new, (event.pid, rename.tid), &[Access::Write], false, None) {
            let file = AlertFile {
                path: new.clone(),
                given_path: rename.new_path.clone(),
                renamed_from: Some(old.clone()),
                ..AlertFile::default()
            };
            hits.push((
                index,
                new.clone(),
                self.alert(event, id, &self.rules.rules()[index], severity, action, false, Some(file)),
            ));
        }
        for (index, severity) in self.target_hits(p, &old, (event.pid, rename.tid), &[Access::Read], false, None) {
            let file = AlertFile {
                path: old.clone(),
                given_path: rename.old_path.clone(),
                renamed_to: Some(new.clone()),
                ..AlertFile::default()
            };
            hits.push((
                index,
                old.clone(),
                self.alert(event, id, &self.rules.rules()[index], severity, action, false, Some(file)),
            ));
        }
        if !is_manager {
            self.remember_written(root, &new);
        }
        hits.into_iter()
            .filter_map(|(index, subject, alert)| self.deliver(root, index, subject, alert, event.time_ns))
            .collect()
    }

    fn syscall(&mut self, event: &Event, syscall: &Syscall) -> Vec<Alert> {
        let Some(id) = self.live(event.pid) else { return Vec::new() };
        if self.quiet(id) && !syscall.blocked {
            return Vec::new();
        }
        let p = &self.procs[&id];
        // Another process: not the caller and not a member of its tree (a parent stopping its
        // own children, a test debugging its own child, are no tamper).
        let other = syscall.target_pid.is_some_and(|target| {
            target != event.pid
                && target != syscall.tid
                && self.live(target).is_none_or(|t| self.procs[&t].root != p.root)
        });
        let mut hits = Vec::new();
        for &index in self.rules.syscall_candidates(&syscall.name) {
            let rule = &self.rules.rules()[index];
            let Some(m) = &rule.syscalls else { continue };
            if !m.operations.is_empty() && !syscall.operation.as_ref().is_some_and(|op| m.operations.contains(op)) {
                continue;
            }
            if !self.conditions_hold(&rule.conditions, p, other) {
                continue;
            }
            let Some(judgement) = self.verdict(p, rule, syscall.blocked, None) else { continue };
            let mut alert = self.alert(event, id, rule, judgement, "syscall", syscall.blocked, None);
            alert.credwatch.syscall = Some(AlertSyscall {
                name: syscall.name.clone(),
                operation: syscall.operation.clone(),
                target_pid: syscall.target_pid,
                ret: syscall.ret,
            });
            hits.push((index, alert));
        }
        let subject = format!(
            "{} {} {}",
            syscall.name,
            syscall.operation.as_deref().unwrap_or(""),
            syscall.target_pid.map(|t| t.to_string()).unwrap_or_default()
        );
        let tree = p.tree;
        hits.into_iter()
            .filter_map(|(index, alert)| self.deliver(tree, index, subject.clone(), alert, event.time_ns))
            .collect()
    }

    /// Dedup and sweeps (see the module's documentation): whether `alert`, of the rule
    /// `index` about `subject` in the tree of `root` (the alerting process's `tree`), goes out,
    /// and as what.
    fn deliver(&mut self, root: Id, index: usize, subject: String, mut alert: Alert, time_ns: u64) -> Option<Alert> {
        if !self.procs.contains_key(&root) {
            // The root was evicted: no tree state to dedup or sweep with.
            return Some(alert);
        }
        let rules = &self.rules;
        let rule = &rules.rules()[index];
        let blocked = alert.event.outcome == "blocked";
        // What was blocked is always told on its own.
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
        alert.credwatch.rotate = sweep_rotate(rules, &indices);
        alert.credwatch.count = None;
        tree.recent.clear();
        tree.sweep = Some(SweepState { alert: alert.clone(), rules: indices, last_ns: time_ns, unreported: false });
        Some(alert)
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

    /// `other`: the event is about another process than `p` (`/proc/<pid>/...` of another
    /// process, or a syscall aimed at one).
    fn conditions_hold(&self, c: &Conditions, p: &Proc, other: bool) -> bool {
        (c.managers.is_empty() || c.managers.iter().any(|m| m == self.manager_name(p)))
            && (c.lifecycles.is_empty() || p.attribution.lifecycle.as_ref().is_some_and(|l| c.lifecycles.contains(l)))
            && c.min_depth.is_none_or(|d| p.depth >= d)
            && c.max_depth.is_none_or(|d| p.depth <= d)
            && (!c.other_process || other)
            && (!c.package_code || self.under_manager(p))
    }

    /// A package manager process is among `p`'s ancestors, nearer than the developer's own code
    /// (`npm publish` from `npm run release` is the developer's).
    fn under_manager(&self, p: &Proc) -> bool {
        let mut next = p.parent;
        while let Some(ancestor) = next.and_then(|id| self.procs.get(&id)) {
            if ancestor.manager_self.is_some() {
                return true;
            }
            if ancestor.project && !self.options.watch_project {
                return false;
            }
            next = ancestor.parent;
        }
        false
    }

    /// The severity to alert at (and why it is not the rule's), or None when an actor of the
    /// rule may do this. `open` is the path and time of the open being judged, if it is one.
    fn severity(&self, p: &Proc, rule: &Rule, open: Option<(&str, u64)>) -> Option<Judgement> {
        for actor in &rule.actors {
            if !actor.managers.is_empty() && !actor.managers.iter().any(|m| m == self.manager_name(p)) {
                continue;
            }
            let hit = match &actor.who {
                Who::Manager { outermost } => p.manager_self.is_some_and(|own| !outermost || own.outermost),
                Who::Execs { execs, via_manager } => {
                    p.is_one_of(execs) && (!via_manager || self.launched_by_manager(p, execs))
                }
                Who::Loader { within_ns, .. } => open.is_some_and(|(path, time_ns)| {
                    p.loader_opens.iter().any(|(t, other)| other != path && time_ns.saturating_sub(*t) <= *within_ns)
                }),
                Who::Under { execs } => self.under_one_of(p, execs),
            };
            if hit {
                return actor.verdict.severity().map(|severity| Judgement {
                    severity,
                    why: Some(actor.why.clone().unwrap_or_else(|| default_why(&actor.who))),
                });
            }
        }
        Some(Judgement { severity: rule.severity, why: None })
    }

    /// The judgement to alert with, or None. What the kernel blocked is always told (at the
    /// rule's severity when an actor would have allowed it): a silent kill helps no one.
    fn verdict(&self, p: &Proc, rule: &Rule, blocked: bool, open: Option<(&str, u64)>) -> Option<Judgement> {
        self.severity(p, rule, open).or(blocked.then_some(Judgement { severity: rule.severity, why: None }))
    }

    /// `p`, or a process between it and its nearest manager, runs one of `execs`.
    fn under_one_of(&self, p: &Proc, execs: &[String]) -> bool {
        let mut next = Some(p);
        while let Some(proc) = next {
            if proc.manager_self.is_some() {
                return false;
            }
            // `sh ./configure` and `node .../node-gyp rebuild` name the driver in argv[1].
            let script = proc.args.get(1).filter(|arg| !arg.starts_with('-')).map(|arg| basename(arg));
            if proc.is_one_of(execs) || script.is_some_and(|script| execs.iter().any(|e| e == script)) {
                return true;
            }
            next = proc.parent.and_then(|id| self.procs.get(&id));
        }
        false
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

    #[allow(clippy::too_many_arguments)]
    fn alert(
        &self,
        event: &Event,
        id: Id,
        rule: &Rule,
        judgement: Judgement,
        action: &str,
        blocked: bool,
        file: Option<AlertFile>,
    ) -> Alert {
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
            event: AlertEvent {
                kind: "alert".into(),
                action: action.into(),
                outcome: if blocked { "blocked" } else { "alerted" }.into(),
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
            host: AlertHost { name: self.options.host_name.clone() },
            user: AlertUser { id: p.uid },
            credwatch: AlertCredwatch {
                root_pid: p.root_pid,
                rotate: rule.rotate.clone(),
                // Only the kernel blocks; a match here is after the fact.
                enforcement: if blocked { "kernel" } else { "userspace" }.into(),
                why: judgement.why,
                ..AlertCredwatch::default()
            },
        }
    }
}

/// The severity an alert goes out at, and why it is not the rule's own when an actor lowered
/// it.
#[derive(Clone, Debug)]
struct Judgement {
    severity: Severity,
    why: Option<String>,
}

/// Why an actor without a `why` of its own lowered an alert.
fn default_why(who: &Who) -> String {
    match who {
        Who::Manager { .. } => "a package manager read it, but one that package code started".into(),
        Who::Execs { execs, via_manager: true } => {
            format!("{} started by the package manager itself (e.g. for a git dependency)", execs.join("/"))
        }
        Who::Execs { execs, .. } => format!("{} is expected to read it", execs.join("/")),
        Who::Loader { .. } => "read as one file of a configuration chain, the way config loaders do".into(),
        Who::Under { execs } => format!("part of a build from sources (under {})", execs.join("/")),
    }
}

/// What an open teaches attribution: which proc-macro rustc loaded, that a build backend is
/// running `setup.py`.
fn learn_from_open(p: &mut Proc, path: &str) {
    if let Some(rustc) = &p.rustc {
        if let Some(found) = rustc.proc_macros.iter().find(|m| m.path == path || basename(&m.path) == basename(path)) {
            p.attribution.name = Some(found.name.clone());
            p.attribution.version.clone_from(&found.version);
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
        _ if open.path.starts_with('/') => normalize_path(&open.path),
        _ if open.dirfd == AT_FDCWD && cwd.starts_with('/') => normalize_path(&format!("{cwd}/{}", open.path)),
        Some(abs) => abs.clone(),
        None => open.path.clone(),
    }
}

/// `path` made absolute against `cwd`, lexically.
fn absolute(path: &str, cwd: &str) -> String {
    if path.starts_with('/') || !cwd.starts_with('/') {
        normalize_path(path)
    } else {
        normalize_path(&format!("{cwd}/{path}"))
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
fn sweep_summary(rules: &RuleSet, tree: &mut Tree) -> Option<Alert> {
    let state = tree.sweep.as_mut().filter(|state| state.unreported)?;
    state.unreported = false;
    let mut alert = state.alert.clone();
    alert.timestamp = rfc3339(state.last_ns);
    alert.credwatch.rotate = sweep_rotate(rules, &state.rules);
    if let Some(sweep) = &mut alert.credwatch.sweep {
        sweep.is_final = true;
    }
    Some(alert)
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
