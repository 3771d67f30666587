//! Rules are data: YAML files with `schema: 2` (or 1), embedded defaults plus `--rules DIR`
//! (the format is described in `rules/README.md`).
//!
//! A file holds `managers` (what makes a process the root of a package tree) and `rules`
//! (credential targets, who may touch them, and samples). Loading a directory on top of the
//! defaults replaces a rule or manager of the same id/name and adds the others.

pub mod agent;
pub mod door;
mod id;

/// Managers and agents: declared once per rules file set by name, and replaced by name by an
/// overlay.
trait Named {
    fn name(&self) -> &str;
}

impl Named for Manager {
    fn name(&self) -> &str {
        &self.name
    }
}

impl Named for Agent {
    fn name(&self) -> &str {
        &self.name
    }
}

impl Named for DoorEntry {
    /// A door is named by its id.
    fn name(&self) -> &str {
        self.id.as_str()
    }
}

/// Adds `item`, declared at `origin`, to `items` (whose origins are `origins`); a second `kind`
/// of the same name is an error naming both places.
fn declare<T: Named>(
    items: &mut Vec<T>,
    origins: &mut Vec<Origin>,
    item: T,
    origin: Origin,
    kind: &str,
) -> Result<(), RulesError> {
    if let Some(first) = items.iter().position(|known| known.name() == item.name()) {
        return Err(RulesError::invalid(
            origin,
            format!("duplicate {kind} {:?} (first at {})", item.name(), origins[first]),
        ));
    }
    items.push(item);
    origins.push(origin);
    Ok(())
}

/// An overlay's `item`: it replaces the one of its name in `items`, or is added.
fn replace_or_add<T: Named>(items: &mut Vec<T>, origins: &mut Vec<Origin>, item: T, origin: Origin) {
    match items.iter().position(|known| known.name() == item.name()) {
        Some(i) => {
            items[i] = item;
            origins[i] = origin;
        }
        None => {
            items.push(item);
            origins.push(origin);
        }
    }
}

#[cfg(test)]
pub(crate) mod fixtures;
pub mod manager;
pub mod schema;
pub mod target;
mod yaml;

use std::{
    collections::HashMap,
    fmt, fs, io,
    path::{Path, PathBuf},
    sync::Arc,
};

use serde_saphyr::Spanned;

use self::{
    agent::{Agent, AgentPolicy},
    door::DoorEntry,
    manager::Manager,
    schema::{
        Access, Action, Actor, BlindSpotMatch, Conditions, ConnectMatch, Contain, ExecMatch, FileDoc, HomeFiles,
        KindName, ProjectCode, RuleDoc, RunsCode, Samples, SamplesField, SchemaVersion, Sweep, SyscallMatch,
        UsualDestinations, Who,
    },
    target::{Pattern, RuleTargets, TargetIndex, Targets},
};
use crate::alert::{BlindSpotCause, Severity};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/default_rules.rs"));
}

/// The rule files built into the binary: (`rules/<name>.yaml`, text).
pub use embedded::DEFAULT_RULES;

/// Where something was defined, for error messages: the file, and the line and column
/// (1-based) of its node as the parser reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub file: String,
    pub line: Option<usize>,
    pub column: Option<usize>,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    /// Anything wrong in a file: syntax, unknown key, bad value, duplicate, bad reference.
    #[error("{origin}: {message}")]
    Invalid { origin: Origin, message: String },
}

impl RulesError {
    fn invalid(origin: Origin, message: impl Into<String>) -> RulesError {
        RulesError::Invalid { origin, message: message.into() }
    }
}

/// What a rule matches: opens (and renames) of its targets, execs, syscalls, connects, or what
/// the sensor missed of a tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleKind {
    Target(Access),
    Exec,
    Syscall,
    Connect,
    BlindSpot,
}

/// One rule.
#[derive(Clone, Debug)]
pub struct Rule {
    pub id: String,
    pub name: String,
    pub description: String,
    pub category: String,
    pub severity: Severity,
    pub action: Action,
    pub kind: RuleKind,
    /// The target patterns as written (empty for exec and syscall rules).
    pub targets: Vec<String>,
    /// Paths that are never targets, or (exec rules) executed files that never match.
    pub exclude: Vec<String>,
    pub exec: Option<ExecMatch>,
    pub syscalls: Option<SyscallMatch>,
    pub connect: Option<ConnectMatch>,
    pub blind_spot: Option<BlindSpotMatch>,
    pub actors: Vec<Actor>,
    pub conditions: Conditions,
    pub rotate: Vec<String>,
    /// What `run --contain` puts in place of the rule's files.
    pub contain: Contain,
    pub samples: Samples,
    /// The rule's mapping in its file.
    pub origin: Origin,
    patterns: Vec<Pattern>,
    exclude_patterns: Vec<Pattern>,
    /// Its view of the set's [`TargetIndex`] (set by `finish`).
    matcher: RuleTargets,
    /// The managers the rule names (`conditions`, `actors`), and where: checked against the
    /// whole set.
    references: Vec<(String, Origin)>,
}

impl Rule {
    /// Whether the absolute `path` is one of this rule's targets for a process whose `HOME`
    /// is `home`.
    pub fn matches_path(&self, path: &str, home: Option<&str>) -> bool {
        self.matcher.matches(path, home)
    }

    /// Whether `path` is in the rule's `exclude`.
    pub fn excludes(&self, path: &str, home: Option<&str>) -> bool {
        self.matcher.excludes(path, home)
    }

    /// A rule about reading credentials: these make up sweeps.
    pub fn is_credential(&self) -> bool {
        self.kind == RuleKind::Target(Access::Read)
    }
}

/// A validated set of managers and rules.
#[derive(Clone, Debug, Default)]
pub struct RuleSet {
    managers: Vec<Manager>,
    manager_origins: Vec<Origin>,
    agents: Vec<Agent>,
    agent_origins: Vec<Origin>,
    /// The agents as roots, and their own files, by agent index (set by `finish`).
    agent_roots: Vec<Manager>,
    agent_own: Vec<Targets>,
    agent_policy: Option<(AgentPolicy, Origin)>,
    /// The rules of the policy's `writes`, by index (set by `finish`).
    agent_writes: Vec<usize>,
    rules: Vec<Rule>,
    index: Arc<TargetIndex>,
    /// Exec rules by the basenames they name, and those that name none.
    exec_by_name: HashMap<String, Vec<usize>>,
    exec_any: Vec<usize>,
    /// Syscall rules by syscall name.
    syscall_by_name: HashMap<String, Vec<usize>>,
    sweep: Option<(Sweep, Origin)>,
    runs_code: Vec<(RunsCode, Origin)>,
    project_code: Vec<(ProjectCode, Origin)>,
    home_files: Vec<(HomeFiles, Origin)>,
    /// The `after_opens` of every loader actor: the opens the engine remembers per process.
    loader_inputs: Vec<Targets>,
    /// Usual destinations of package trees (all files' entries, defaults then `--rules DIR`).
    network: Vec<(UsualDestinations, Origin)>,
    /// Connect rules.
    connect_rules: Vec<usize>,
    /// Blind-spot rules.
    blind_spot_rules: Vec<usize>,
    /// Sockets and directories `run --contain` shuts (by id: an overlay replaces one).
    doors: Vec<DoorEntry>,
    door_origins: Vec<Origin>,
    /// SHA-256 over every source file (name and text) in load order: names the rules in force
    /// in a trace header.
    digest: sha2::Sha256,
}

/// A program a project command's manager (or one of its tools) started, as
/// [`RuleSet::project_program`] judges it.
pub struct Program<'a> {
    /// Its absolute path.
    pub executable: &'a str,
    /// For a script run through its `#!` line, the script's absolute (real, where known) path.
    pub script: Option<&'a str>,
    /// The directory it runs in: the project's.
    pub cwd: &'a str,
}

impl Program<'_> {
    /// Its script lies in the project: the project's own files, or its installed
    /// dependencies' (`<project>/node_modules`, what `npm run` runs too), not a package fetched
    /// elsewhere (npx's cache, a global install).
    fn runs_own_script(&self) -> bool {
        let Some(script) = self.script else { return false };
        let cwd = self.cwd.trim_end_matches('/');
        let Some(rest) = script.strip_prefix(cwd).filter(|rest| rest.starts_with('/') && self.cwd.starts_with('/'))
        else {
            return false;
        };
        rest.starts_with("/node_modules/") || !rest.contains("/node_modules/")
    }
}

impl RuleSet {
    /// The rules built into the binary.
    pub fn defaults() -> Result<RuleSet, RulesError> {
        parse_sources::<Samples>(default_sources())?.finish()
    }

    /// The defaults, then `extra_dir`'s files on top (same id or name replaces, new ones add).
    pub fn load(extra_dir: Option<&Path>) -> Result<RuleSet, RulesError> {
        load_with::<Samples>(extra_dir)
    }

    /// As [`RuleSet::load`], each rule's `samples` skipped unparsed (left empty): for the modes
    /// that apply the rules and never replay their samples (`watch`, `run`, `record`).
    pub fn load_without_samples(extra_dir: Option<&Path>) -> Result<RuleSet, RulesError> {
        load_with::<serde::de::IgnoredAny>(extra_dir)
    }

    /// Only the files of `dir`.
    pub fn load_dir(dir: &Path) -> Result<RuleSet, RulesError> {
        RuleSet::from_sources(read_dir(dir)?)
    }

    /// Rules from (file name, text) pairs alone: no defaults, no filesystem.
    pub fn from_sources(sources: impl IntoIterator<Item = (String, String)>) -> Result<RuleSet, RulesError> {
        parse_sources::<Samples>(sources)?.finish()
    }

    pub fn managers(&self) -> &[Manager] {
        &self.managers
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    pub fn agents(&self) -> &[Agent] {
        &self.agents
    }

    /// The doors: sockets and directories that reach a credential without a file.
    pub fn doors(&self) -> &[DoorEntry] {
        &self.doors
    }

    /// The agents as roots (by agent index), for [`manager::root_manager`].
    pub fn agent_roots(&self) -> &[Manager] {
        &self.agent_roots
    }

    /// What the kernel marks as roots: the managers, then the agents (the kernel only needs
    /// their executables and scripts, and knows no difference).
    pub fn kernel_roots(&self) -> Vec<Manager> {
        self.managers.iter().chain(&self.agent_roots).cloned().collect()
    }

    /// The shells agents run their tools through ([`AgentPolicy::tool_shells`]).
    pub fn agent_tool_shells(&self) -> &[String] {
        self.agent_policy.as_ref().map_or(&[], |(policy, _)| policy.tool_shells.as_slice())
    }

    /// Whether `path` is one of the agent `agent`'s own files for a process whose home is
    /// `home`.
    pub fn agent_owns(&self, agent: usize, path: &str, home: Option<&str>) -> bool {
        self.agent_own[agent].matches(path, home)
    }

    /// Whether rule `index` applies to agent trees: credential reads, and the policy's writes.
    pub fn applies_to_agents(&self, index: usize) -> bool {
        self.rules[index].is_credential() || self.agent_writes.contains(&index)
    }

    /// The rules whose action is `kill`: the kernel's blocking set. Target rules give paths
    /// (`targets`, `exclude`), syscall rules syscall names and operations (`syscalls`); their
    /// `actors` say who the kernel should spare.
    pub fn kill_rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter().filter(|rule| rule.action == Action::Kill)
    }

    /// Whether the manager `manager` (an index in [`RuleSet::managers`]), executed as
    /// `filename` with `args`, runs code rather than manages packages.
    pub fn runs_code(&self, manager: usize, filename: &str, args: &[String]) -> bool {
        let name = &self.managers[manager].name;
        let exec = manager::basename(filename);
        self.runs_code.iter().filter(|(r, _)| &r.manager == name).any(|(r, _)| {
            r.execs.iter().any(|e| e == exec)
                || args.get(1).is_some_and(|first| r.first_args.iter().any(|p| p.matcher.is_match(first)))
        })
    }

    /// Whether the manager `manager` (an index in [`RuleSet::managers`]), executed as `filename`
    /// with `args`, runs the developer's own project: the index of its `project_code` entry.
    /// Options before the first word are skipped (`npm --silent run`, `cargo +nightly test`).
    /// No word, or options with values before it (`npm -w pkg run`), is no project command.
    pub fn project_command(&self, manager: usize, filename: &str, args: &[String]) -> Option<usize> {
        let managed = &self.managers[manager];
        let name = &managed.name;
        // Started by an interpreter (`node .yarn/releases/yarn-4.5.3.cjs dev`, `python3 -m
        // poetry run x`): by the name it stands for, with the words after the invocation.
        let invoked = manager::invoked_name(managed, filename, args);
        let exec = invoked.as_deref().unwrap_or_else(|| manager::basename(filename));
        // A script run through its `#!` line has the interpreter's argv
        // (`/usr/bin/env node /usr/bin/npm run dev`): the manager's words follow its path. A
        // running npm seen in /proc has retitled itself: argv is the one string `npm run dev`.
        let retitled: Vec<String>;
        let words = match args.first() {
            _ if invoked.is_some() => manager::command_args(managed, filename, args),
            Some(first) if args.len() == 1 && first.split(' ').next().is_some_and(|w| manager::basename(w) == exec) => {
                retitled = first.split(' ').skip(1).map(str::to_owned).collect();
                &retitled[..]
            }
            Some(first) if manager::basename(first) != exec => {
                let at = args.iter().skip(1).position(|arg| manager::basename(arg) == exec)?;
                &args[at + 2..]
            }
            _ => args.get(1..).unwrap_or_default(),
        };
        let first = words.iter().find(|arg| !arg.starts_with(['-', '+']))?;
        self.project_code.iter().position(|(p, _)| {
            &p.manager == name
                && p.execs.iter().any(|e| e == exec)
                && (p.commands.iter().any(|c| c.matcher.is_match(first))
                    || p.builtins.as_ref().is_some_and(|b| !b.contains(first)))
        })
    }

    /// Whether the manager running the project command `entry` runs the project's code in its
    /// own process (`bun test`).
    pub fn project_in_process(&self, entry: usize) -> bool {
        self.project_code[entry].0.in_process
    }

    /// Whether `program`, started by a manager running the project command `entry` (from
    /// [`RuleSet::project_command`]), is the project's own.
    pub fn project_program(&self, entry: usize, program: &Program) -> bool {
        let (project, _) = &self.project_code[entry];
        let executable = program.executable;
        let listed = if project.own_scripts {
            project.programs.iter().any(|p| p.matcher.is_match(executable)) || program.runs_own_script()
        } else {
            project.programs.is_empty() || project.programs.iter().any(|p| p.matcher.is_match(executable))
        };
        listed && !project.exclude.iter().any(|p| p.matcher.is_match(executable))
    }

    /// Which of the tools of the project command `entry` `executable` is, when started by the
    /// manager running that command (rustdoc under `cargo test`).
    pub fn project_tool(&self, entry: usize, executable: &str) -> Option<usize> {
        let name = manager::basename(executable);
        self.project_code[entry].0.tools.iter().position(|tool| tool.execs.iter().any(|e| e == name))
    }

    /// Whether `program`, started by the tool `tool` of the project command `entry`, is the
    /// project's: one the tool built of the project's code (a doctest), or with `own_scripts`
    /// a script of the project's.
    pub fn project_tool_program(&self, entry: usize, tool: usize, program: &Program) -> bool {
        let tool = &self.project_code[entry].0.tools[tool];
        tool.programs.iter().any(|p| p.matcher.is_match(program.executable))
            || (tool.own_scripts && program.runs_own_script())
    }

    /// Every manager's `home_files` entry (its `writes`: `run --contain`'s writable home).
    pub fn home_files(&self) -> impl Iterator<Item = &HomeFiles> {
        self.home_files.iter().map(|(entry, _)| entry)
    }

    /// The home that `path`, opened (or looked for) by the manager `manager` itself, lies in,
    /// when it is one of the manager's per-user files. Files in `cwd` or below it are the
    /// project's own (`<project>/.npmrc`), and those under a `node_modules` a package's.
    pub fn home_of_manager_file(&self, manager: usize, path: &str, cwd: &str) -> Option<String> {
        let name = &self.managers[manager].name;
        for (entry, _) in self.home_files.iter().filter(|(h, _)| &h.manager == name) {
            for file in &entry.files {
                for (at, _) in path.match_indices(&file.needle) {
                    let (home, rest) = (&path[..at], &path[at + 1..]);
                    let first = file.needle.len() - 1;
                    let boundary = rest.len() == first || rest.as_bytes()[first] == b'/';
                    let in_project = home == cwd || home.strip_prefix(cwd).is_some_and(|r| r.starts_with('/'));
                    if boundary
                        && home.starts_with('/')
                        && !in_project
                        && !home.contains("/node_modules/")
                        && file.matcher.is_match(rest)
                    {
                        return Some(home.to_owned());
                    }
                }
            }
        }
        None
    }

    /// The sweep settings, if any file defines them.
    /// The connect rules (indices).
    pub fn connect_rules(&self) -> &[usize] {
        &self.connect_rules
    }

    /// Every file's usual destinations, whatever trees they apply to.
    pub fn network(&self) -> impl Iterator<Item = &UsualDestinations> {
        self.network.iter().map(|(usual, _)| usual)
    }

    /// Usual destinations that apply to a tree whose nearest manager is `manager`.
    pub fn usual_destinations<'a>(&'a self, manager: &'a str) -> impl Iterator<Item = &'a UsualDestinations> + 'a {
        self.network
            .iter()
            .map(|(usual, _)| usual)
            .filter(move |usual| usual.managers.is_empty() || usual.managers.iter().any(|m| m == manager))
    }

    /// The blind-spot rules about `cause` (indices).
    pub fn blind_spot_rules(&self, cause: BlindSpotCause) -> impl Iterator<Item = usize> + '_ {
        self.blind_spot_rules
            .iter()
            .copied()
            .filter(move |&index| self.rules[index].blind_spot.as_ref().is_some_and(|m| m.cause == cause))
    }

    pub fn sweep(&self) -> Option<&Sweep> {
        self.sweep.as_ref().map(|(sweep, _)| sweep)
    }

    /// Indices of the exec rules that may match an exec of `names` (its basenames).
    pub fn exec_candidates(&self, names: &[&str]) -> Vec<usize> {
        let mut out: Vec<usize> = self.exec_any.clone();
        for name in names {
            out.extend(self.exec_by_name.get(*name).into_iter().flatten());
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Indices of the syscall rules about the syscall `name`.
    pub fn syscall_candidates(&self, name: &str) -> &[usize] {
        self.syscall_by_name.get(name).map(Vec::as_slice).unwrap_or_default()
    }

    /// Hex SHA-256 of the rule sources in force.
    pub fn digest(&self) -> String {
        use sha2::Digest as _;
        self.digest.clone().finalize().iter().map(|byte| format!("{byte:02x}")).collect()
    }

    fn overlay(&mut self, other: RuleSet) {
        use sha2::Digest as _;
        self.digest.update(other.digest.finalize());
        for (manager, origin) in other.managers.into_iter().zip(other.manager_origins) {
            replace_or_add(&mut self.managers, &mut self.manager_origins, manager, origin);
        }
        for (agent, origin) in other.agents.into_iter().zip(other.agent_origins) {
            replace_or_add(&mut self.agents, &mut self.agent_origins, agent, origin);
        }
        for (door, origin) in other.doors.into_iter().zip(other.door_origins) {
            replace_or_add(&mut self.doors, &mut self.door_origins, door, origin);
        }
        if other.agent_policy.is_some() {
            self.agent_policy = other.agent_policy;
        }
        if other.sweep.is_some() {
            self.sweep = other.sweep;
        }
        let replaced: Vec<String> = other.runs_code.iter().map(|(r, _)| r.manager.clone()).collect();
        self.runs_code.retain(|(r, _)| !replaced.contains(&r.manager));
        self.runs_code.extend(other.runs_code);
        let replaced: Vec<String> = other.project_code.iter().map(|(p, _)| p.manager.clone()).collect();
        self.project_code.retain(|(p, _)| !replaced.contains(&p.manager));
        self.project_code.extend(other.project_code);
        let replaced: Vec<String> = other.home_files.iter().map(|(h, _)| h.manager.clone()).collect();
        self.home_files.retain(|(h, _)| !replaced.contains(&h.manager));
        self.home_files.extend(other.home_files);
        // Usual destinations add up: a directory extends the defaults.
        self.network.extend(other.network);
        for rule in other.rules {
            match self.rules.iter().position(|r| r.id == rule.id) {
                Some(i) => self.rules[i] = rule,
                None => self.rules.push(rule),
            }
        }
    }

    /// Whether an attempt to open `path` is one a loader actor looks back for.
    pub fn is_loader_input(&self, path: &str, home: Option<&str>) -> bool {
        self.loader_inputs.iter().any(|inputs| inputs.matches(path, home))
    }

    /// Indices (into [`RuleSet::rules`]) of the rules of which `path` is a target (as
    /// [`Rule::matches_path`] of each).
    pub fn matching_targets(&self, path: &str, home: Option<&str>) -> Vec<usize> {
        self.index.matching(path, home)
    }

    fn finish(mut self) -> Result<RuleSet, RulesError> {
        self.validate()?;
        self.agent_roots = self.agents.iter().map(Agent::as_root).collect();
        self.agent_own = Vec::new();
        for (agent, origin) in self.agents.iter().zip(&self.agent_origins) {
            let own = Targets::compile(&agent.own, &[])
                .map_err(|e| RulesError::invalid(origin.clone(), format!("agent {:?}: {e}", agent.name)))?;
            self.agent_own.push(own);
        }
        self.agent_writes = Vec::new();
        if let Some((policy, origin)) = &self.agent_policy {
            for id in &policy.writes {
                match self.rules.iter().position(|r| &r.id == id) {
                    Some(index) if self.rules[index].kind == RuleKind::Target(Access::Write) => {
                        self.agent_writes.push(index)
                    }
                    Some(_) => {
                        return Err(RulesError::invalid(
                            origin.clone(),
                            format!("agent_policy: rule {id:?} is not a write rule (`kind: target`, `access: write`)"),
                        ))
                    }
                    None => {
                        return Err(RulesError::invalid(origin.clone(), format!("agent_policy: unknown rule {id:?}")))
                    }
                }
            }
        }
        let index =
            TargetIndex::build(self.rules.iter().map(|r| (r.patterns.as_slice(), r.exclude_patterns.as_slice())))
                .map_err(|e| self.index_error(e))?;
        self.index = Arc::new(index);
        for (index, rule) in self.rules.iter_mut().enumerate() {
            rule.matcher = RuleTargets::new(Arc::clone(&self.index), index);
        }
        for (index, rule) in self.rules.iter().enumerate() {
            if let Some(exec) = &rule.exec {
                if exec.names.is_empty() {
                    self.exec_any.push(index);
                }
                for name in &exec.names {
                    self.exec_by_name.entry(name.clone()).or_default().push(index);
                }
            }
            if let Some(syscalls) = &rule.syscalls {
                for name in &syscalls.names.0 {
                    self.syscall_by_name.entry(name.clone()).or_default().push(index);
                }
            }
            for actor in &rule.actors {
                if let Who::Loader { after, .. } = &actor.who {
                    self.loader_inputs.push((**after).clone());
                }
            }
            if rule.connect.is_some() {
                self.connect_rules.push(index);
            }
            if rule.blind_spot.is_some() {
                self.blind_spot_rules.push(index);
            }
        }
        Ok(self)
    }

    /// The index of every rule's patterns failed to build: the first rule whose own patterns fail
    /// is named (compiling each rule apart costs start-up time only on this path).
    fn index_error(&self, error: globset::Error) -> RulesError {
        for rule in &self.rules {
            if let Err(own) = Targets::compile(&rule.patterns, &rule.exclude_patterns) {
                return RulesError::invalid(rule.origin.clone(), format!("rule {}: {own}", rule.id));
            }
        }
        RulesError::invalid(Origin { file: "rules".into(), line: None, column: None }, error.to_string())
    }

    /// Checks what needs the whole set: references to managers.
    fn validate(&self) -> Result<(), RulesError> {
        for (manager, origin) in self.managers.iter().zip(&self.manager_origins) {
            if manager.execs.is_empty() && manager.modules.is_empty() && manager.scripts.is_empty() {
                return Err(RulesError::invalid(
                    origin.clone(),
                    format!("manager {:?} has none of `execs`, `modules` and `scripts`", manager.name),
                ));
            }
        }
        for (agent, origin) in self.agents.iter().zip(&self.agent_origins) {
            if agent.execs.is_empty() && agent.scripts.is_empty() {
                return Err(RulesError::invalid(
                    origin.clone(),
                    format!("agent {:?} has neither `execs` nor `scripts`", agent.name),
                ));
            }
            if self.managers.iter().any(|m| m.name == agent.name) {
                return Err(RulesError::invalid(origin.clone(), format!("agent {:?} is also a manager", agent.name)));
            }
        }
        let known = |name: &str| name == "run" || self.managers.iter().any(|m| m.name == name);
        let entries = self
            .runs_code
            .iter()
            .map(|(r, origin)| ("runs_code", &r.manager, origin))
            .chain(self.project_code.iter().map(|(p, origin)| ("project_code", &p.manager, origin)))
            .chain(self.home_files.iter().map(|(h, origin)| ("home_files", &h.manager, origin)));
        for (list, manager, origin) in entries {
            if !self.managers.iter().any(|m| &m.name == manager) {
                return Err(RulesError::invalid(origin.clone(), format!("{list}: unknown manager {manager:?}")));
            }
        }
        for (usual, origin) in &self.network {
            if let Some(name) = usual.managers.iter().find(|name| !known(name)) {
                return Err(RulesError::invalid(origin.clone(), format!("network: unknown manager {name:?}")));
            }
        }
        for rule in &self.rules {
            if let Some((name, origin)) = rule.references.iter().find(|(name, _)| !known(name)) {
                return Err(RulesError::invalid(origin.clone(), format!("rule {}: unknown manager {name:?}", rule.id)));
            }
        }
        // A path found through a variable is that variable's door: one door per variable.
        for (index, (door, origin)) in self.doors.iter().zip(&self.door_origins).enumerate() {
            for name in door.variables.keys() {
                if let Some(first) = self.doors[..index].iter().find(|d| d.variables.contains_key(name)) {
                    return Err(RulesError::invalid(
                        origin.clone(),
                        format!("door {}: variable {name} is door {}'s already", door.id, first.id),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A directory's own rules, and the set they make merged over the defaults as `--rules DIR`
/// does.
pub struct DirOverDefaults {
    /// Rule files read from the directory.
    pub files: usize,
    /// Managers and rules defined in the directory.
    pub managers: usize,
    pub rules: usize,
    pub merged: RuleSet,
}

/// Parses and validates `dir`, and merges it over the defaults.
pub fn load_dir_over_defaults(dir: &Path) -> Result<DirOverDefaults, RulesError> {
    dir_over_defaults::<Samples>(dir)
}

fn dir_over_defaults<S: SamplesField>(dir: &Path) -> Result<DirOverDefaults, RulesError> {
    let sources = read_dir(dir)?;
    let files = sources.len();
    let own = parse_sources::<S>(sources)?;
    let (managers, rules) = (own.managers.len(), own.rules.len());
    let mut merged = parse_sources::<S>(default_sources())?;
    merged.overlay(own);
    Ok(DirOverDefaults { files, managers, rules, merged: merged.finish()? })
}

/// The defaults, and `extra_dir` over them, their samples read as `S`.
fn load_with<S: SamplesField>(extra_dir: Option<&Path>) -> Result<RuleSet, RulesError> {
    match extra_dir {
        Some(dir) => dir_over_defaults::<S>(dir).map(|loaded| loaded.merged),
        None => parse_sources::<S>(default_sources())?.finish(),
    }
}

/// The `*.yaml` and `*.yml` files of `dir`, sorted by name: (path, text).
fn read_dir(dir: &Path) -> Result<Vec<(String, String)>, RulesError> {
    let io_error = |path: &Path| {
        let path = path.to_owned();
        move |source| RulesError::Io { path, source }
    };
    let mut paths = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error(dir))? {
        let path = entry.map_err(io_error(dir))?.path();
        if path.extension().is_some_and(|ext| ext == "yaml" || ext == "yml") && path.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = fs::read_to_string(&path).map_err(io_error(&path))?;
            Ok((path.display().to_string(), text))
        })
        .collect()
}

/// The rule files built into the binary, as (file name, text) sources.
fn default_sources() -> impl Iterator<Item = (String, String)> {
    DEFAULT_RULES.iter().map(|(file, text)| ((*file).to_owned(), (*text).to_owned()))
}

/// Parses one set of files (the defaults, or one directory): a rule id or a manager name may
/// appear once.
fn parse_sources<S: SamplesField>(sources: impl IntoIterator<Item = (String, String)>) -> Result<RuleSet, RulesError> {
    use sha2::Digest as _;
    let mut set = RuleSet::default();
    for (file, text) in sources {
        for part in [file.as_bytes(), &[0], text.as_bytes(), &[0]] {
            set.digest.update(part);
        }
        let doc: FileDoc<S> = yaml::parse(&file, &text)?;
        let at = |spanned_at| yaml::origin(&file, Some(spanned_at));
        if let Some(sweep) = doc.sweep {
            let origin = at(sweep.referenced);
            if let Some((_, first)) = &set.sweep {
                return Err(RulesError::invalid(origin, format!("duplicate `sweep` (first at {first})")));
            }
            set.sweep = Some((sweep.value, origin));
        }
        set.network.extend(doc.network.into_iter().map(|usual| (usual.value, at(usual.referenced))));
        set.runs_code.extend(doc.runs_code.into_iter().map(|entry| (entry.value, at(entry.referenced))));
        set.project_code.extend(doc.project_code.into_iter().map(|entry| (entry.value, at(entry.referenced))));
        set.home_files.extend(doc.home_files.into_iter().map(|entry| (entry.value, at(entry.referenced))));
        for manager in doc.managers {
            declare(&mut set.managers, &mut set.manager_origins, manager.value, at(manager.referenced), "manager")?;
        }
        for agent in doc.agents {
            declare(&mut set.agents, &mut set.agent_origins, agent.value, at(agent.referenced), "agent")?;
        }
        for door in doc.doors {
            declare(&mut set.doors, &mut set.door_origins, door.value, at(door.referenced), "door")?;
        }
        if let Some(policy) = doc.agent_policy {
            let origin = at(policy.referenced);
            if let Some((_, first)) = &set.agent_policy {
                return Err(RulesError::invalid(origin, format!("duplicate `agent_policy` (first at {first})")));
            }
            set.agent_policy = Some((policy.value, origin));
        }
        for rule in doc.rules {
            let id = &rule.value.id;
            if let Some(first) = set.rules.iter().find(|r| r.id == id.value.0) {
                return Err(RulesError::invalid(
                    at(id.referenced),
                    format!("duplicate rule id {:?} (first at {})", id.value.0, first.origin),
                ));
            }
            set.rules.push(build_rule(&file, doc.schema, rule)?);
        }
    }
    Ok(set)
}

/// A rule from its document: its kind (named in schema 2, inferred in schema 1) and the keys
/// that go with it.
fn build_rule<S: SamplesField>(
    file: &str,
    schema: SchemaVersion,
    rule: Spanned<RuleDoc<S>>,
) -> Result<Rule, RulesError> {
    let (doc, origin) = (rule.value, yaml::origin(file, Some(rule.referenced)));
    let id = doc.id.value.0;
    let invalid = |at: serde_saphyr::Location, message: String| {
        RulesError::invalid(yaml::origin(file, Some(at)), format!("rule {id}: {message}"))
    };
    // The keys that say what the rule matches, with where each is.
    let keys: Vec<(KindName, serde_saphyr::Location)> = [
        (KindName::Target, doc.targets.as_ref().map(|t| t.referenced)),
        (KindName::Exec, doc.exec.as_ref().map(|e| e.referenced)),
        (KindName::Syscall, doc.syscalls.as_ref().map(|s| s.referenced)),
        (KindName::Connect, doc.connect.as_ref().map(|c| c.referenced)),
        (KindName::BlindSpot, doc.blind_spot.as_ref().map(|b| b.referenced)),
    ]
    .into_iter()
    .filter_map(|(kind, at)| Some((kind, at?)))
    .collect();
    let kind = match (schema, &doc.kind) {
        (SchemaVersion::One, Some(kind)) => {
            return Err(invalid(
                kind.referenced,
                "`kind` is schema 2: write `schema: 2` at the top of the file, and name every rule's kind".into(),
            ))
        }
        (SchemaVersion::One, None) => match keys[..] {
            [(kind, _)] => kind,
            [] => return Err(invalid(rule.referenced, needs_one_of("needs"))),
            [_, (_, second), ..] => return Err(invalid(second, needs_one_of("needs only"))),
        },
        (SchemaVersion::Two, None) => return Err(invalid(rule.referenced, missing_kind(&keys, doc.access.is_some()))),
        (SchemaVersion::Two, Some(kind)) => {
            let named = kind.value;
            if let Some((other, at)) = keys.iter().find(|(other, _)| *other != named) {
                return Err(invalid(
                    *at,
                    format!(
                        "`{}` does not go with `kind: {}` (it says what a {} rule matches)",
                        other.key(),
                        named.as_str(),
                        other.as_str()
                    ),
                ));
            }
            if keys.is_empty() {
                return Err(invalid(kind.referenced, format!("`kind: {}` needs `{}`", named.as_str(), named.key())));
            }
            if named == KindName::Target && doc.access.is_none() {
                return Err(invalid(
                    kind.referenced,
                    "`kind: target` needs `access`: `read` (credentials) or `write` (persistence)".into(),
                ));
            }
            named
        }
    };
    let reads = kind == KindName::Target && doc.access.as_ref().is_none_or(|a| a.value == Access::Read);
    if let Some(contain) = doc.contain.as_ref().filter(|_| !reads) {
        return Err(invalid(contain.referenced, "`contain` goes with `targets` and `access: read`".into()));
    }
    if let Some(access) = doc.access.as_ref().filter(|_| kind != KindName::Target) {
        return Err(invalid(access.referenced, "`access` goes with `targets`".into()));
    }
    let judged_here = |a: &&Spanned<schema::ActorEntry>| {
        matches!(a.value.actor.who, Who::Loader { .. } | Who::Under { .. } | Who::Execs { unless_command: Some(_), .. })
    };
    if let Some(actor) = doc.actors.iter().find(judged_here).filter(|_| doc.action == Action::Kill) {
        return Err(invalid(
            actor.referenced,
            "`after_opens`, `under` and `unless_command` actors are judged in userspace only: not on a `kill` rule"
                .into(),
        ));
    }
    if kind == KindName::BlindSpot {
        // What the sensor missed is told whoever the tree is: nothing may spare or lower it.
        let at = |referenced| {
            invalid(referenced, "a blind-spot rule takes no `action: kill`, `actors`, `conditions` nor `exclude`: what was missed is always told".into())
        };
        if let Some(actor) = doc.actors.first() {
            return Err(at(actor.referenced));
        }
        if let Some(exclude) = &doc.exclude {
            return Err(at(exclude.referenced));
        }
        if doc.conditions.is_some() || doc.action == Action::Kill {
            return Err(at(rule.referenced));
        }
    }
    let nothing_to_exclude = matches!(kind, KindName::Syscall | KindName::Connect);
    if let Some(exclude) = doc.exclude.as_ref().filter(|e| nothing_to_exclude && !e.value.is_empty()) {
        return Err(invalid(
            exclude.referenced,
            "`exclude` goes with `targets` or `exec`, not with `syscalls` or `connect`".into(),
        ));
    }
    let kind = match kind {
        KindName::Target => RuleKind::Target(doc.access.map(|a| a.value).unwrap_or_default()),
        KindName::Exec => RuleKind::Exec,
        KindName::Syscall => RuleKind::Syscall,
        KindName::Connect => RuleKind::Connect,
        KindName::BlindSpot => RuleKind::BlindSpot,
    };
    let patterns = doc.targets.map(|t| t.value.0).unwrap_or_default();
    let exclude = doc.exclude.map(|e| e.value).unwrap_or_default();
    let (conditions, conditions_at) = doc.conditions.map(|c| (c.conditions, c.managers)).unwrap_or_default();
    let mut references: Vec<(String, Origin)> = conditions
        .managers
        .iter()
        .cloned()
        .zip(conditions_at.into_iter().map(|at| yaml::origin(file, Some(at))))
        .collect();
    let mut actors = Vec::with_capacity(doc.actors.len());
    for entry in doc.actors {
        let actor = entry.value.actor;
        let at = entry.value.managers.into_iter().map(|at| yaml::origin(file, Some(at)));
        references.extend(actor.managers.iter().cloned().zip(at));
        actors.push(actor);
    }
    Ok(Rule {
        id,
        name: doc.name,
        description: doc.description,
        category: doc.category,
        severity: doc.severity,
        action: doc.action,
        kind,
        targets: patterns.iter().map(|p| p.text.clone()).collect(),
        exclude: exclude.iter().map(|p| p.text.clone()).collect(),
        exec: doc.exec.map(|e| e.value),
        syscalls: doc.syscalls.map(|s| s.value),
        connect: doc.connect.map(|c| c.value),
        blind_spot: doc.blind_spot.map(|b| b.value),
        actors,
        conditions,
        rotate: doc.rotate,
        contain: doc.contain.map(|c| c.value).unwrap_or_default(),
        samples: doc.samples.into_samples(),
        origin,
        patterns,
        exclude_patterns: exclude,
        matcher: RuleTargets::default(),
        references,
    })
}

/// Schema 1's error for a rule with none, or more than one, of the keys that say what it
/// matches.
fn needs_one_of(needs: &str) -> String {
    format!("{needs} one of `targets`, `exec`, `syscalls`, `connect` and `blind_spot`")
}

/// Schema 2's error for a rule without `kind`: the key and value to add, when the rule's other
/// keys say (as schema 1 would have read it).
fn missing_kind(keys: &[(KindName, serde_saphyr::Location)], has_access: bool) -> String {
    match keys {
        [(KindName::Target, _)] if !has_access => {
            "schema 2 names the rule's kind: add `kind: target` and `access: read` (what schema 1 assumed)".into()
        }
        [(kind, _)] => format!("schema 2 names the rule's kind: add `kind: {}`", kind.as_str()),
        _ => format!(
            "schema 2 names the rule's kind: add `kind:` ({}) and the one key that goes with it ({})",
            KindName::ALL.map(KindName::as_str).join(", "),
            KindName::ALL.map(|k| format!("`{}`", k.key())).join(", "),
        ),
    }
}

#[cfg(test)]
mod tests;
