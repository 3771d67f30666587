//! Matching: the rules against each exec, open, rename and syscall of a tree's processes, and
//! the severity each hit alerts at (or none, when an actor of the rule may do it).

use super::{
    alerts::{repeated, Held, Judgement, Stop},
    process::{absolute, agent_tree, learn_from_open, resolved_path, Proc},
    Engine, Id,
};
use crate::{
    alert::{Alert, AlertFile, AlertSyscall, FAIL_CLOSED, READ_ONLY_MOUNT},
    event::{normalize_path, Event, Open, Rename, Syscall},
    rules::{
        manager::basename,
        schema::{Access, Conditions, ExecMatch, Who, SYSTEM_BIN_DIRS},
        Rule, RuleKind,
    },
};

/// Most opens of configuration-chain files remembered per process for loader actors.
const MAX_LOADER_OPENS: usize = 8;

impl Engine {
    pub(super) fn exec_rules(&mut self, event: &Event, id: Id, by_manager: bool) -> Vec<Alert> {
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
            let mut alert = self.alert(event.time_ns, id, rule, judgement, "exec", Stop::None, None);
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

    pub(super) fn open(&mut self, event: &Event, open: &Open) -> Vec<Alert> {
        let Some(id) = self.live(event.pid) else {
            // The kernel stops only processes of watched trees: a kill is never silent.
            return if open.stopped() { self.unattributed_stop(event, open) } else { Vec::new() };
        };
        self.learn_home(id, open);
        // The kernel blocks without knowing what is the project's: a kill is never silent.
        if self.quiet(id) && !open.stopped() {
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
            self.chain_followed(id, &path, event.time_ns);
        }
        // A failed open read nothing; probing for files that do not exist is what every
        // config loader does. A blocked one failed because the kernel stopped it: that is
        // the alert. So is a write a read-only mount refused (`run --contain`'s home): the
        // attempt tells what the code is.
        let refused_write = open.ret == -i64::from(libc::EROFS);
        if open.ret < 0 && !open.stopped() && !refused_write {
            return Vec::new();
        }
        let p = self.procs.get_mut(&id).expect("live");
        learn_from_open(p, &path);
        if open.flags & libc::O_PATH as u64 != 0 {
            // An O_PATH descriptor can neither read nor write the file.
            return Vec::new();
        }
        p.opened_foreign =
            p.opened_foreign || !system_file(&path) || self.trees.values().any(|tree| tree.written.contains(&path));
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
        if writes && !is_manager && !open.stopped() && !refused_write {
            self.remember_written(root, &path);
        }
        let p = &self.procs[&id];
        let mut hits: Vec<(usize, Judgement, Option<&str>)> = self
            .target_hits(p, &path, (event.pid, open.tid), accesses, open.stopped(), Some(event.time_ns))
            .into_iter()
            .map(|(i, s)| (i, s, None))
            .collect();
        // The sensor knows the file by its inode: a hardlink or moved copy matches as the
        // credential file it is.
        if let Some(original) = open.same_file_as.as_deref().filter(|original| *original != path) {
            for (index, severity) in
                self.target_hits(p, original, (event.pid, open.tid), accesses, open.stopped(), Some(event.time_ns))
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
            let judged = original.unwrap_or(&path);
            // A first link of a chain waits for the next; what the kernel stopped does not.
            let chain = (!open.stopped() && severity.why.is_none())
                .then(|| self.chain_verdict(&self.procs[&id], rule, judged))
                .flatten();
            // A fail-closed act is a kill unless the LSM refused it.
            let stop = Stop::of(open.blocked || open.fail_closed, open.denied);
            let mut alert = self.alert(event.time_ns, id, rule, severity, "open", stop, Some(file));
            alert.credwatch.count = repeated(open.repeats);
            if open.fail_closed {
                fail_closed(&mut alert);
            }
            if refused_write {
                // Nothing was written: the mount refused it, so nothing is to be undone.
                alert.event.outcome = "denied".into();
                alert.credwatch.enforcement = READ_ONLY_MOUNT.into();
                alert.credwatch.rotate = Vec::new();
            }
            let subject = open_subject(rule, alert.credwatch.why.is_some(), judged);
            match chain {
                Some(chain) => {
                    let held = Held::new(id, root, index, subject, judged.to_owned(), alert, event.time_ns, chain);
                    alerts.extend(self.hold(held));
                }
                None => {
                    // A loader reads its chain and nothing else in between: another credential
                    // read ends the process's chain, and its alerts keep the order of the reads.
                    if rule.is_credential() {
                        alerts.extend(self.release_of(id));
                    }
                    alerts.extend(self.deliver(root, index, subject, alert, event.time_ns));
                }
            }
        }
        alerts
    }

    /// For a read of `path` that no actor lowered: when `path` is a file of a configuration
    /// chain that a loader actor of `rule` lowers reads in, the chain's window and the actor's
    /// verdict (None: allow), for when another file of the chain follows it.
    fn chain_verdict(&self, p: &Proc, rule: &Rule, path: &str) -> Option<(u64, Option<Judgement>)> {
        let home = self.home_of(p);
        rule.actors.iter().find_map(|actor| {
            let Who::Loader { after, within_ns } = &actor.who else { return None };
            let applies = actor.managers.is_empty() || actor.managers.iter().any(|m| m == self.manager_name(p));
            (applies && after.matches(path, home)).then(|| {
                let why = actor.why.clone().unwrap_or_else(|| default_why(&actor.who));
                (*within_ns, actor.verdict.severity().map(|severity| Judgement { severity, why: Some(why) }))
            })
        })
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
        let agent = agent_tree(p);
        // An agent's own files are its work, and so is reading the project it works in.
        let agents_own = agent.is_some_and(|of| self.rules.agent_owns(of.index, path, home));
        let in_project = agent
            .and_then(|of| of.project.as_deref())
            .is_some_and(|project| path.strip_prefix(project).is_some_and(|rest| rest.starts_with('/')));
        self.rules
            .matching_targets(path, home)
            .into_iter()
            .filter_map(|index| {
                let rule = &self.rules.rules()[index];
                let RuleKind::Target(access) = rule.kind else { return None };
                if agent.is_some()
                    && !blocked
                    && (agents_own || !self.rules.applies_to_agents(index) || (in_project && access == Access::Read))
                {
                    return None;
                }
                // The kernel stops any open of a `kill` target, whatever its access: a kill or
                // a refusal is never silent.
                if !(blocked || accesses.contains(&access)) || !self.conditions_hold(&rule.conditions, p, other) {
                    return None;
                }
                self.verdict(p, rule, blocked, open_time.map(|t| (path, t))).map(|judgement| (index, judgement))
            })
            .collect()
    }

    /// A rename or link: onto a target is a write of it, of a credential file elsewhere a
    /// read (it is about to be opened under another name).
    pub(super) fn rename(&mut self, event: &Event, rename: &Rename) -> Vec<Alert> {
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
                self.alert(event.time_ns, id, &self.rules.rules()[index], severity, action, Stop::None, Some(file)),
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
                self.alert(event.time_ns, id, &self.rules.rules()[index], severity, action, Stop::None, Some(file)),
            ));
        }
        if !is_manager {
            self.remember_written(root, &new);
        }
        hits.into_iter()
            .filter_map(|(index, subject, alert)| self.deliver(root, index, subject, alert, event.time_ns))
            .collect()
    }

    pub(super) fn syscall(&mut self, event: &Event, syscall: &Syscall) -> Vec<Alert> {
        let Some(id) = self.live(event.pid) else { return Vec::new() };
        // Syscall rules are about package code; an agent tree is judged by what it reads.
        if (self.quiet(id) || agent_tree(&self.procs[&id]).is_some()) && !syscall.stopped() {
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
            let Some(judgement) = self.verdict(p, rule, syscall.stopped(), None) else { continue };
            let mut alert = self.alert(
                event.time_ns,
                id,
                rule,
                judgement,
                "syscall",
                Stop::of(syscall.blocked, syscall.denied),
                None,
            );
            alert.credwatch.syscall = Some(AlertSyscall {
                name: syscall.name.clone(),
                operation: syscall.operation.clone(),
                target_pid: syscall.target_pid,
                ret: syscall.ret,
            });
            alert.credwatch.count = repeated(syscall.repeats);
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

    /// `other`: the event is about another process than `p` (`/proc/<pid>/...` of another
    /// process, or a syscall aimed at one).
    pub(super) fn conditions_hold(&self, c: &Conditions, p: &Proc, other: bool) -> bool {
        (c.managers.is_empty() || c.managers.iter().any(|m| m == self.manager_name(p)))
            && (c.lifecycles.is_empty() || p.attribution.lifecycle.as_ref().is_some_and(|l| c.lifecycles.contains(l)))
            && c.min_depth.is_none_or(|d| p.depth >= d)
            && c.max_depth.is_none_or(|d| p.depth <= d)
            && (!c.other_process || other)
            && (!c.package_code || self.under_manager(p))
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
                Who::Execs { execs, via_manager, installed, unless_command } => {
                    p.is_one_of(execs)
                        && (!via_manager || self.launched_by_manager(p, execs))
                        && (!installed || self.runs_as_installed(p))
                        && unless_command.as_ref().is_none_or(|pattern| {
                            !pattern.regex.is_match(&p.args.get(1..).unwrap_or_default().join(" "))
                        })
                }
                Who::Loader { within_ns, .. } => open.is_some_and(|(path, time_ns)| {
                    p.loader_opens.iter().any(|(t, other)| other != path && time_ns.saturating_sub(*t) <= *within_ns)
                }),
                Who::Under { execs } => self.under_one_of(p, execs),
            };
            if hit {
                return actor.verdict.severity().map(|severity| Judgement {
                    severity,
                    why: Some(actor.why.clone().unwrap_or_else(|| self.default_why_of(p, &actor.who))),
                });
            }
        }
        Some(Judgement { severity: rule.severity, why: None })
    }

    /// [`default_why`] in words that fit `p`'s tree: a coding agent's tools run for the agent,
    /// not for a package manager.
    fn default_why_of(&self, p: &Proc, who: &Who) -> String {
        match (who, agent_tree(p)) {
            (Who::Execs { execs, via_manager: true, .. }, Some(of)) => format!(
                "{} started by the coding agent {} itself, for its own work (not package code)",
                execs.join("/"),
                self.rules.agents()[of.index].name
            ),
            _ => default_why(who),
        }
    }

    /// `p` runs the system's own program as installed: its executable lies directly in one of
    /// [`SYSTEM_BIN_DIRS`], no tree wrote it, and since its exec it opened only the system's own
    /// files (not a library it was made to preload: `LD_PRELOAD=./x.so ps aux`).
    fn runs_as_installed(&self, p: &Proc) -> bool {
        let in_system_dir = p.executable.rsplit_once('/').is_some_and(|(dir, _)| SYSTEM_BIN_DIRS.contains(&dir));
        in_system_dir && !p.opened_foreign && !self.trees.values().any(|tree| tree.written.contains(&p.executable))
    }

    /// The judgement to alert with, or None. What the kernel blocked is always told (at the
    /// rule's severity when an actor would have allowed it): a silent kill helps no one.
    pub(super) fn verdict(&self, p: &Proc, rule: &Rule, blocked: bool, open: Option<(&str, u64)>) -> Option<Judgement> {
        self.severity(p, rule, open).or(blocked.then_some(Judgement { severity: rule.severity, why: None }))
    }
}

/// The kernel acted on its own, no agent having read its records for a while (`--enforce` fails
/// closed): the alert's enforcement says so (`kernel-fail-closed`, `lsm-fail-closed`).
pub(super) fn fail_closed(alert: &mut Alert) {
    alert.credwatch.enforcement = format!("{}-{FAIL_CLOSED}", alert.credwatch.enforcement);
}

/// Why an actor without a `why` of its own lowered an alert.
fn default_why(who: &Who) -> String {
    match who {
        Who::Manager { .. } => "a package manager read it, but one that package code started".into(),
        Who::Execs { execs, via_manager: true, .. } => {
            format!("{} started by the package manager itself (e.g. for a git dependency)", execs.join("/"))
        }
        Who::Execs { execs, .. } => format!("{} is expected to read it", execs.join("/")),
        Who::Loader { .. } => "read as one file of a configuration chain, the way config loaders do".into(),
        Who::Under { execs } => format!("part of a build from sources (under {})", execs.join("/")),
    }
}

/// Files a system program opens as installed: the kernel's views (not `/dev/shm`), the
/// system's configuration, and shared libraries, `gconv` modules and locale data where the
/// distribution puts them; not a subdirectory of `/usr/lib` that a language's package manager
/// fills (`node_modules`, `python3.12/site-packages`), nor a home or `/tmp`.
fn system_file(path: &str) -> bool {
    const UNDER: &[&str] =
        &["/proc/", "/sys/", "/etc/", "/usr/share/locale/", "/usr/share/zoneinfo/", "/var/lib/sss/mc/"];
    const LIBRARY_DIRS: &[&str] = &["/usr/lib/", "/lib/", "/usr/lib64/", "/lib64/"];
    if path.starts_with("/dev/") {
        return !path.starts_with("/dev/shm/") && !path.starts_with("/dev/mqueue/");
    }
    // The directories themselves too: ps opens `/proc` to list it.
    UNDER.iter().any(|dir| path.starts_with(dir) || path == dir.trim_end_matches('/'))
        || LIBRARY_DIRS.iter().filter_map(|dir| path.strip_prefix(dir)).any(|rest| match rest.split_once('/') {
            None => true,
            // The multiarch directory (`x86_64-linux-gnu`) is the distribution's alone.
            Some((dir, _)) => dir.contains("-linux-") || matches!(dir, "gconv" | "glibc-hwcaps" | "locale"),
        })
}

/// What identical open alerts share for dedup: the file, except that a lowered read of
/// another process's `/proc/<pid>/...` is one of a lister's walk over every process
/// (`/proc/*/environ`), so a `ps aux` alerts once, not once per process.
fn open_subject(rule: &Rule, lowered: bool, path: &str) -> String {
    if !(lowered && rule.conditions.other_process && path.starts_with("/proc/")) {
        return path.to_owned();
    }
    let parts: Vec<&str> = path
        .split('/')
        .map(|part| if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) { "*" } else { part })
        .collect();
    parts.join("/")
}

/// `/proc/<n>/...` with `n` neither the opener's pid nor its thread's id. (The kernel resolves
/// `/proc/self` to `/proc/<pid>`.)
fn names_other_process(path: &str, pid: u32, tid: u32) -> bool {
    path.strip_prefix("/proc/")
        .and_then(|rest| rest.split('/').next())
        .and_then(|n| n.parse::<u32>().ok())
        .is_some_and(|n| n != pid && n != tid)
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
