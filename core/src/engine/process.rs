//! The process table: who forked whom, what each process executed (and as which package), its
//! tree and the tree's state, and the walks up a process's ancestry that the rules ask about.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
};

use super::{
    attribution::{self, Attribution, ProcMacroPackages, Rustc},
    sweep::{sweep_summary, SweepState},
    Engine, Id,
};
use crate::{
    alert::{Alert, AlertCi, AlertCodingAgent, AlertContainer, AlertOrchestrator, AlertPackage, Severity},
    container::container_of,
    event::{normalize_path, Event, Exec, Open},
    rules::{
        manager::{basename, command_args, root_manager, script_arg, TEMP_DIRS},
        Program,
    },
};

/// `dirfd` meaning the current directory.
pub(super) const AT_FDCWD: i32 = -100;
/// Most processes the table holds. Reached only when exits were lost: the oldest entries go
/// first, so memory stays bounded in long runs.
pub(super) const MAX_PROCESSES: usize = 1 << 16;
/// Longest description `live_tree` returns, in characters.
const DESCRIPTION_MAX: usize = 200;
/// Most paths remembered per tree as written by it; the oldest go first.
const MAX_WRITTEN: usize = 4096;

#[derive(Clone, Copy, Debug)]
pub(super) struct ManagerSelf {
    /// No other manager is among its ancestors (the project's own code is none).
    pub(super) outermost: bool,
    /// It runs the developer's own project: its `project_code` entry (`npm run dev`).
    pub(super) project: Option<usize>,
}

/// The coding agent a process runs under: the nearest process that executed one.
#[derive(Clone, Debug)]
pub(super) struct AgentOf {
    /// Index in the rule set's agents.
    pub(super) index: usize,
    /// The agent's own table entry.
    pub(super) id: Id,
    pub(super) pid: u32,
    /// The directory it started in, when that is a project (not the home, nor above it): what
    /// the agent and its tools read there is the project's.
    pub(super) project: Option<Arc<str>>,
}

#[derive(Clone, Debug)]
pub(super) struct Proc {
    pub(super) pid: u32,
    /// The forker, or for a root the parent its exec reported.
    pub(super) ppid: u32,
    pub(super) parent: Option<Id>,
    /// The tree's root entry.
    pub(super) root: Id,
    /// Whose [`Tree`] holds its dedup, sweep, written files and home: the root's, or that of a
    /// manager the project's own code started (each `npx` in `npm run dev` is a tree of its own).
    pub(super) tree: Id,
    pub(super) root_pid: u32,
    pub(super) depth: u32,
    pub(super) alive: bool,
    pub(super) filename: String,
    pub(super) executable: String,
    pub(super) args: Vec<String>,
    pub(super) cwd: String,
    pub(super) uid: u32,
    /// `HOME` from its exec's environment or its ancestors'.
    pub(super) home: Option<String>,
    /// `SSH_AUTH_SOCK` likewise: a connect to it uses the SSH agent.
    pub(super) ssh_auth_sock: Option<String>,
    /// Nearest package manager (index in the rule set's managers).
    pub(super) manager: Option<usize>,
    /// Set when this process is that manager itself.
    pub(super) manager_self: Option<ManagerSelf>,
    /// Nearest coding agent.
    pub(super) agent: Option<AgentOf>,
    pub(super) attribution: Attribution,
    pub(super) rustc: Option<Rustc>,
    /// Table entries whose `parent` is this one: a dead entry stays while it has any.
    pub(super) children: u32,
    /// The outermost manager forked it and it has not executed anything yet: its exec is the
    /// manager's doing (cargo running a build script it had built). A nested "manager" may be
    /// package code (`bun payload.js`).
    pub(super) started_by_manager: bool,
    /// A manager running the project (`npm run`, `cargo run`) forked it and it has not executed
    /// anything yet: that manager's `project_code` entry.
    pub(super) started_by_project: Option<usize>,
    /// It is a tool of a project command (rustdoc under `cargo test`): that command's
    /// `project_code` entry and the tool's index in it.
    pub(super) project_tool: Option<(usize, usize)>,
    /// Such a tool forked it and it has not executed anything yet.
    pub(super) started_by_tool: Option<(usize, usize)>,
    /// The developer's own code (a script of `npm run`, the program of `cargo run`): quiet
    /// unless `watch_project`. Inherited until it starts a manager that is not running the
    /// project (`npm install`, `npx`), whose tree is watched.
    pub(super) project: bool,
    /// Its latest attempts (time, path) to open a file a loader actor looks back for.
    pub(super) loader_opens: VecDeque<(u64, String)>,
    /// Since its latest exec it opened a file that is not the system's own (a library it was
    /// made to preload, a file a tree wrote): it may not run as installed.
    pub(super) opened_foreign: bool,
    /// Its container and pod, from the cgroups at its latest exec (a fork's until it executes).
    pub(super) container: Option<Arc<(AlertContainer, Option<AlertOrchestrator>)>>,
    /// The CI job, from the tree root's environment.
    pub(super) ci: Option<Arc<AlertCi>>,
}

impl Proc {
    pub(super) fn new_root(pid: u32, ppid: u32) -> Proc {
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
            agent: None,
            attribution: Attribution::default(),
            rustc: None,
            children: 0,
            started_by_manager: false,
            started_by_project: None,
            project_tool: None,
            started_by_tool: None,
            project: false,
            loader_opens: VecDeque::new(),
            opened_foreign: false,
            container: None,
            ci: None,
        }
    }

    pub(super) fn is_one_of(&self, execs: &[String]) -> bool {
        execs.iter().any(|e| e == basename(&self.executable) || e == basename(&self.filename))
    }
    /// What an exec tells of the process, in place of what its previous program did.
    fn take_exec(&mut self, filename: &str, exec: &Exec) {
        self.filename = filename.to_owned();
        // Rules, project globs and agent entries all see one absolute path, however the exec
        // named the file (`target/debug/app`, `./app`, `/proc/self/cwd/app`): the kernel's, else
        // the given one resolved against the cwd.
        self.executable = absolute(if exec.executable.is_empty() { filename } else { &exec.executable }, &exec.cwd);
        self.args = exec.args.clone();
        self.cwd = exec.cwd.clone();
        self.uid = exec.uid;
        // No cgroups is "not known" (a source that has none), not the host: the fork's stay.
        if let Some(stated) = &exec.stated_container {
            self.container = Some(Arc::new(AlertContainer::stated(stated)));
        } else if !exec.cgroups.is_empty() {
            self.container = container_of(&exec.cgroups).map(|c| Arc::new(AlertContainer::with_pod(&c)));
        }
        if self.parent.is_none() {
            self.ppid = exec.ppid;
            self.ci = AlertCi::from_env(&exec.env).map(Arc::new);
        }
        if let Some(home) = exec.env.get("HOME") {
            self.home = Some(home.clone());
        }
        if let Some(socket) = exec.env.get("SSH_AUTH_SOCK") {
            self.ssh_auth_sock = Some(socket.clone());
        }
        self.rustc = None;
        self.opened_foreign = false;
    }

    /// The project of a coding agent started here: its working directory, but not `/`, nor the
    /// home or a directory above it: that would make every file "the project's". An unknown home
    /// leaves only the homes of the usual layout to rule out.
    fn agent_project(&self) -> Option<Arc<str>> {
        let cwd = self.cwd.trim_end_matches('/');
        let above_home = |home: &str| format!("{home}/").starts_with(&format!("{cwd}/"));
        let usual_home =
            cwd == "/root" || cwd == "/home" || cwd.strip_prefix("/home/").is_some_and(|user| !user.contains('/'));
        (self.cwd.starts_with('/') && !cwd.is_empty() && !usual_home && !self.home.as_deref().is_some_and(above_home))
            .then(|| Arc::from(cwd))
    }
}

/// What the engine keeps per tree, by the root's table id.
#[derive(Default)]
pub(super) struct Tree {
    /// Paths that members (other than the outermost manager itself) created or wrote, for
    /// `written_by_tree`; `written_order` is their age, oldest first.
    pub(super) written: HashSet<String>,
    pub(super) written_order: VecDeque<String>,
    /// How often each (rule, severity, subject) alerted: the same rule at another severity
    /// (package code, not git under the manager) is another alert.
    pub(super) seen: HashMap<(usize, Severity, String), u64>,
    /// Credential alerts within the sweep window: (time, rule index, file).
    pub(super) recent: VecDeque<(u64, usize, String)>,
    pub(super) sweep: Option<SweepState>,
    /// The home its managers' own per-user files were in (`<home>/.npmrc`), for events without
    /// `HOME`.
    pub(super) home: Option<String>,
    /// The packages of the proc-macros the tree built, to name them when they run.
    pub(super) proc_macro_packages: ProcMacroPackages,
    /// The named packages its processes ran for, first seen first, and the latest (see `blind`).
    pub(super) packages: Vec<AlertPackage>,
    pub(super) latest_package: Option<AlertPackage>,
}

impl Tree {
    /// The rules were reloaded: rule `i` is now `remap[i]`, or gone.
    pub(super) fn remap_rules(&mut self, remap: &[Option<usize>]) {
        self.seen = std::mem::take(&mut self.seen)
            .into_iter()
            .filter_map(|((index, severity, subject), count)| Some(((remap[index]?, severity, subject), count)))
            .collect();
        self.recent = std::mem::take(&mut self.recent)
            .into_iter()
            .filter_map(|(time, index, file)| Some((time, remap[index]?, file)))
            .collect();
        if let Some(sweep) = &mut self.sweep {
            sweep.remap_rules(remap);
        }
    }
}

impl Engine {
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
    /// The package a live process of a tree runs for, as its alerts would name it.
    pub fn package_of(&self, pid: u32) -> Option<AlertPackage> {
        self.live(pid).map(|id| self.package(&self.procs[&id]))
    }

    /// The pid of the root of the tree a live process is in.
    pub fn root_pid_of(&self, pid: u32) -> Option<u32> {
        self.live(pid).map(|id| self.procs[&id].root_pid)
    }

    pub(super) fn live(&self, pid: u32) -> Option<Id> {
        self.by_pid.get(&pid).copied().filter(|id| self.procs[id].alive)
    }

    /// A member forked `child_pid`.
    pub(super) fn fork(&mut self, pid: u32, child_pid: u32) {
        if let Some(parent) = self.live(pid) {
            self.spawn(parent, child_pid);
        }
    }

    pub(super) fn exit(&mut self, pid: u32) {
        if let Some(id) = self.live(pid) {
            self.procs.get_mut(&id).expect("by_pid points into procs").alive = false;
            self.collect(id);
        }
    }

    /// `credwatch run` made `pid` a root.
    pub(super) fn root(&mut self, pid: u32) {
        if self.live(pid).is_none() {
            self.insert_root(pid, 0);
        }
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
            project_tool: None,
            started_by_tool: p.project_tool,
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
        self.blind_tree_ended(id, p);
        self.egress.forget(id);
        if p.tree != id {
            return;
        }
        if let Some(mut tree) = self.trees.remove(&id) {
            if let Some(summary) = sweep_summary(&self.rules, &self.options.contained, &mut tree.sweep) {
                self.pending.push(summary);
            }
        }
    }

    pub(super) fn exec(&mut self, event: &Event, exec: &Exec) -> Vec<Alert> {
        let pid = event.pid;
        let filename = if exec.filename.is_empty() { &exec.executable } else { &exec.filename };
        let started = root_manager(self.rules.managers(), filename, &exec.args);
        let agent = root_manager(self.rules.agent_roots(), filename, &exec.args);
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
                None if started.is_some() || agent.is_some() => self.insert_root(pid, exec.ppid),
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
        let (managers, agent_roots) = (self.rules.managers(), self.rules.agent_roots());
        let p = self.procs.get_mut(&id).expect("just found or inserted");
        p.take_exec(filename, exec);
        // `node /usr/bin/claude` after `/usr/bin/claude` (its shebang) is the same agent.
        let agent_hop = p.agent.as_ref().is_some_and(|of| {
            of.id == id
                && exec.args.iter().skip(1).any(|arg| agent_roots[of.index].execs.iter().any(|e| e == basename(arg)))
        });
        if let Some(index) = agent.filter(|_| !agent_hop) {
            p.agent = Some(AgentOf { index, id, pid, project: p.agent_project() });
        }
        // `npm` is a script: the kernel runs `/usr/bin/npm`, then env execs `node /usr/bin/npm`
        // in the same process, which is still the manager; so is a version manager's shim
        // executing the real one (rustup's `~/.cargo/bin/cargo` executes the toolchain's cargo).
        let hop = p.manager_self.is_some()
            && runs_code.is_none()
            && p.manager.is_some_and(|m| {
                started == Some(m)
                    || exec.args.iter().skip(1).any(|arg| managers[m].execs.iter().any(|e| e == basename(arg)))
            });
        // That exec matches the manager again (a script run by its interpreter): nothing changes.
        let (started, runs_code, project_command) =
            if hop { (None, None, None) } else { (started, runs_code, project_command) };
        // The developer's own project: only when no package code runs this (a postinstall's
        // `npm run build` is package code).
        let package_code = p.manager.is_some() && !p.project;
        let project_command = project_command.filter(|_| !package_code);
        let in_place = p.manager_self.and_then(|own| own.project).filter(|_| !hop);
        let started_by_tool = std::mem::take(&mut p.started_by_tool);
        p.project_tool = None;
        // A script run through its `#!` line (the given path is not the executable): where
        // the sensor found it leads, else the given path.
        let shebang = basename(filename) != basename(&p.executable);
        let script = exec.script.clone().or_else(|| shebang.then(|| absolute(filename, &exec.cwd)));
        let program = Program { executable: &p.executable, script: script.as_deref(), cwd: &exec.cwd };
        if let Some(entry) = std::mem::take(&mut p.started_by_project).or(in_place) {
            // What the project's manager starts (or becomes: `poetry run` execs in place).
            if started.is_none() {
                p.project = self.rules.project_program(entry, &program);
                p.project_tool =
                    self.rules.project_tool(entry, &p.executable).filter(|_| !p.project).map(|tool| (entry, tool));
            }
        } else if let Some((entry, tool)) = started_by_tool.filter(|_| started.is_none()) {
            // A doctest rustdoc built and runs, a bin of the project's that npx's shell runs.
            p.project = self.rules.project_tool_program(entry, tool, &program);
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
        // An agent the developer started (from a shell, or from the project's own scripts: a
        // `cargo test` that drives one) is the nearest root of what it runs: its tree, its
        // policy. Started by package code, it stays package code (a payload driving the
        // installed agents).
        if agent.is_some() && !agent_hop && !package_code {
            if std::mem::take(&mut p.project) {
                p.tree = id;
            }
            p.manager = None;
            p.manager_self = None;
            p.attribution = Attribution::default();
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
        if p.parent.is_none() || agent_tree(p).is_some() || self.quiet(id) {
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

    /// Remembers that the tree of `root` (a process's `tree`) created or wrote `path`.
    pub(super) fn remember_written(&mut self, root: Id, path: &str) {
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

    /// The developer's own code, and not watched (`--watch-project` watches it).
    pub(super) fn quiet(&self, id: Id) -> bool {
        !self.options.watch_project && self.procs[&id].project
    }

    /// A manager's own read (or look-up) of one of its per-user files tells its tree's home,
    /// for events without `HOME`. Only the manager itself counts, and only reads: package code
    /// must not choose where credentials are looked for, and a package's files that the manager
    /// writes while unpacking it (a `.npm/` or `.pypirc` in the archive) are the package's. The
    /// first one found stays.
    pub(super) fn learn_home(&mut self, id: Id, open: &Open) {
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
    pub(super) fn home_of<'a>(&'a self, p: &'a Proc) -> Option<&'a str> {
        p.home
            .as_deref()
            .or(self.options.home.as_deref())
            .or_else(|| self.trees.get(&p.tree).and_then(|tree| tree.home.as_deref()))
            .or_else(|| self.options.passwd.get(&p.uid).map(String::as_str))
    }

    pub(super) fn package(&self, p: &Proc) -> AlertPackage {
        AlertPackage {
            manager: self.manager_name(p).to_owned(),
            name: p.attribution.name.clone(),
            version: p.attribution.version.clone(),
            lifecycle: p.attribution.lifecycle.clone(),
        }
    }

    /// The agent `p` runs under, and the command it ran on the way down to `p`.
    pub(super) fn coding_agent(&self, p: &Proc) -> Option<AlertCodingAgent> {
        let of = p.agent.as_ref()?;
        let mut command = None;
        let mut next = Some(p);
        while let Some(proc) = next {
            if proc.parent == Some(of.id) {
                command = Some(proc.args.clone());
                break;
            }
            next = proc.parent.and_then(|id| self.procs.get(&id));
        }
        Some(AlertCodingAgent { name: self.rules.agents()[of.index].name.clone(), pid: of.pid, command })
    }

    pub(super) fn manager_name(&self, p: &Proc) -> &str {
        p.manager.map(|m| self.rules.managers()[m].name.as_str()).unwrap_or("run")
    }

    /// A package manager process is among `p`'s ancestors, nearer than the developer's own code
    /// (`npm publish` from `npm run release` is the developer's).
    pub(super) fn under_manager(&self, p: &Proc) -> bool {
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

    /// `p`, or a process between it and its nearest manager, runs one of `execs`.
    pub(super) fn under_one_of(&self, p: &Proc, execs: &[String]) -> bool {
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

    /// Every process between `p` and its nearest manager is one of `execs`; in an agent's
    /// tree, between `p` and the agent, also one of the shells it runs its tools through.
    pub(super) fn launched_by_manager(&self, p: &Proc, execs: &[String]) -> bool {
        let shells = if agent_tree(p).is_some() { self.rules.agent_tool_shells() } else { &[] };
        let mut next = p.parent;
        while let Some(id) = next {
            let Some(ancestor) = self.procs.get(&id) else { return false };
            // An agent's tools are its work, as a manager's are (`git push` running ssh).
            if ancestor.manager_self.is_some() || p.agent.as_ref().is_some_and(|of| of.id == id) {
                return true;
            }
            if !ancestor.is_one_of(execs) && !ancestor.is_one_of(shells) {
                return false;
            }
            next = ancestor.parent;
        }
        false
    }
}

/// The agent `p` works for, when no package manager stands between them: the agent tree's
/// policy judges it. (Package code the agent's `npm install` runs is judged as package code.)
pub(super) fn agent_tree(p: &Proc) -> Option<&AgentOf> {
    p.agent.as_ref().filter(|_| p.manager.is_none())
}

/// What an open teaches attribution: which proc-macro rustc loaded, that a build backend is
/// running `setup.py`.
pub(super) fn learn_from_open(p: &mut Proc, path: &str) {
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
pub(super) fn resolved_path(open: &Open, cwd: &str) -> String {
    match &open.abs_path {
        Some(abs) if !open.truncated => abs.clone(),
        _ if open.path.starts_with('/') || (open.dirfd == AT_FDCWD && cwd.starts_with('/')) => {
            absolute(&open.path, cwd)
        }
        Some(abs) => abs.clone(),
        None => open.path.clone(),
    }
}

/// `path` made absolute against `cwd`, lexically, with the process's own `/proc/self/cwd`
/// (and `thread-self`) as `cwd` and its `/proc/self/root` as `/`: for paths no kernel
/// resolved (a foreign trace's), so every form of a path meets the same rules.
pub(super) fn absolute(path: &str, cwd: &str) -> String {
    let cwd = cwd.starts_with('/').then_some(cwd);
    for own in ["/proc/self/", "/proc/thread-self/"] {
        let Some(rest) = path.strip_prefix(own) else { continue };
        let (link, below) = rest.split_once('/').unwrap_or((rest, ""));
        match (link, cwd) {
            ("cwd", Some(cwd)) => return normalize_path(&format!("{cwd}/{below}")),
            ("root", _) => return normalize_path(below),
            _ => {}
        }
    }
    match cwd {
        Some(cwd) if !path.starts_with('/') => normalize_path(&format!("{cwd}/{path}")),
        _ => normalize_path(path),
    }
}

/// One line of at most [`DESCRIPTION_MAX`] characters, escaped for a terminal.
fn escape_line(text: &str) -> String {
    let line: String = text.chars().take(DESCRIPTION_MAX).collect();
    crate::output::escape(&line).into_owned()
}
