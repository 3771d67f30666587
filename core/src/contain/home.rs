//! `run --contain`'s home: what package code in the box may write there. The home is read-only
//! (or an overlay whose changes are dropped), except the project directory and the directories
//! the managers write by design (`writes` in `rules/managers.yaml`); the persistence paths of
//! the rules (shell start-up files, systemd user units, agents' hooks, crontabs) that exist
//! inside those writable places, or outside every home (`/etc/cron.d` as root), are bound
//! read-only after everything else. This module only decides; the agent mounts.

use std::{
    fs,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

use crate::rules::{schema::Access, Rule, RuleKind, RuleSet};

/// Files that make a directory a project's root, when no `.git` says where it is.
const PROJECT_MARKERS: &[&str] =
    &["package.json", "Cargo.toml", "pyproject.toml", "setup.py", "Gemfile", "go.mod", "composer.json"];
/// Directories the project's walk for persistence paths does not enter: packages' own trees
/// (their `.github/workflows` run nowhere, the rules exclude them) and build outputs.
const NOT_WALKED: &[&str] = &["node_modules", ".git", "target", "__pycache__", "site-packages", "dist-packages"];
/// Directory levels entered by a walk for persistence paths (the project's `**/` patterns,
/// `/etc/cron.*/**`).
const MAX_DEPTH: usize = 8;
/// Directory entries examined in all by those walks: a huge project is cut, and says so.
const MAX_ENTRIES: u64 = 200_000;
/// A name no rule targets: a directory all of whose children are targets (`~/.config/systemd/user`
/// for `~/.config/systemd/user/**`) is a persistence path as a whole.
const PROBE: &str = "credwatch-probe-\u{1}";

/// Where the box's home takes writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Writes {
    /// Read-only: a write fails with EROFS.
    #[default]
    ReadOnly,
    /// An overlay: writes land in a directory of credwatch's, listed and dropped after the run.
    Overlay,
}

/// What the box does to the homes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HomePlan {
    /// The user's home (the command's `HOME`), read-only or an overlay.
    pub home: PathBuf,
    pub writes: Writes,
    /// Other users' homes, read-only too (root's package code could write any).
    pub other_homes: Vec<PathBuf>,
    /// The project directory, when it lies in one of those homes.
    pub project: Option<PathBuf>,
    /// Bound through writable (the project, the managers' directories): sorted, none inside
    /// another, each inside a home of the box.
    pub writable: Vec<PathBuf>,
    /// Managers' directories that do not exist yet, to create (as the home's owner) before
    /// the box is made; they are in `writable` too.
    pub create: Vec<PathBuf>,
    /// Existing persistence paths bound read-only last: those inside `writable`, and (root)
    /// those outside every home. Sorted, none inside another.
    pub persistence: Vec<PathBuf>,
    /// A walk for persistence paths was cut short (`MAX_ENTRIES`).
    pub truncated: bool,
}

/// What [`plan`] looks at.
pub struct Input<'a> {
    pub rules: &'a RuleSet,
    /// The command's `HOME`.
    pub home: &'a Path,
    /// The command's working directory.
    pub cwd: &'a Path,
    /// Other users' homes, read-only too (root only; empty for another user).
    pub other_homes: &'a [PathBuf],
    /// Where absolute persistence patterns (`/etc/cron.d/**`) are looked for: `/` as root;
    /// none for another user, who cannot write there anyway.
    pub system_root: Option<&'a Path>,
    pub writes: Writes,
    /// The directories of the command's `PATH`: a manager's missing directories are created
    /// only when it is installed.
    pub path: &'a [PathBuf],
}

/// Decides the box's home: see the module's comment.
pub fn plan(input: &Input) -> HomePlan {
    let home = real(input.home);
    // A home inside another is covered by it; one holding the user's home is left as it is
    // (it would make the user's home read-only twice, and an overlay impossible).
    let other_homes = outermost(
        (input.other_homes.iter().map(|other| real(other)))
            .filter(|other| !home.starts_with(other) && !other.starts_with(&home)),
    );
    // A daemon's HOME of `/`, or one that does not exist, is no home to make read-only.
    let areas: Vec<PathBuf> =
        (is_home(&home).then(|| home.clone()).into_iter()).chain(other_homes.iter().cloned()).collect();
    let cwd = real(input.cwd);
    let project = project_dir(&areas, &cwd);

    let mut writable: Vec<PathBuf> = project.iter().cloned().collect();
    let mut create = Vec::new();
    let installed = |manager: &str| {
        (input.rules.managers().iter())
            .filter(|m| m.name == manager)
            .flat_map(|m| &m.execs)
            .any(|exec| input.path.iter().any(|dir| dir.join(exec).is_file()))
    };
    for entry in input.rules.home_files() {
        for write in &entry.writes {
            if write.literal {
                let path = home.join(&write.text);
                if !path.exists() {
                    if !installed(&entry.manager) {
                        continue;
                    }
                    create.push(path.clone());
                }
                writable.push(path);
            } else {
                writable.extend(expand(&home, &write.components));
            }
        }
    }
    let writable = outermost(writable.into_iter().filter(|path| areas.iter().any(|area| path.starts_with(area))));
    create.retain(|path| writable.iter().any(|w| path.starts_with(w)));
    create.sort();
    create.dedup();

    let persistence_rules = PersistenceRules::of(input.rules);
    let mut finder = Finder {
        rules: &persistence_rules.0,
        home: home.to_str().map(str::to_owned),
        system_root: input.system_root.map(Path::to_path_buf),
        found: Vec::new(),
        entries: 0,
        truncated: false,
    };
    finder.find(&home, project.as_deref());
    // Inside a writable place, or outside every home (root's `/etc/cron.d`): elsewhere the
    // home itself is read-only already, or its overlay's changes are checked at `--keep`.
    let persistence = outermost(finder.found.into_iter().filter(|path| {
        writable.iter().any(|w| path.starts_with(w)) || !areas.iter().any(|area| path.starts_with(area))
    }));
    HomePlan {
        home,
        writes: input.writes,
        other_homes,
        project,
        writable,
        create,
        persistence,
        truncated: finder.truncated,
    }
}

/// Whether `home` is a home directory the box can make read-only.
pub fn is_home(home: &Path) -> bool {
    home != Path::new("/") && home.is_dir()
}

/// The rules about writing persistence: their targets never pass the box.
#[derive(Clone, Debug)]
pub struct PersistenceRules(Vec<Rule>);

impl PersistenceRules {
    pub fn of(rules: &RuleSet) -> PersistenceRules {
        let persistence = |rule: &&Rule| rule.category == "persistence" && rule.kind == RuleKind::Target(Access::Write);
        PersistenceRules(rules.rules().iter().filter(persistence).cloned().collect())
    }

    /// Whether a write at `path` (in a home whose path is `home`) is a persistence path: a
    /// target of a persistence rule, or a directory whose every file would be one. `--keep`
    /// never copies those out of the overlay.
    pub fn matches(&self, path: &Path, home: &Path, directory: bool) -> bool {
        let (Some(text), home) = (path.to_str(), home.to_str()) else { return false };
        let probe = format!("{}/{PROBE}", text.trim_end_matches('/'));
        (self.0.iter()).any(|rule| rule.matches_path(text, home) || (directory && rule.matches_path(&probe, home)))
    }
}

/// The project directory of a command run in `cwd`, when it lies in one of the `areas` (the
/// homes made read-only): the nearest directory from `cwd` up that holds `.git` (the
/// repository: a workspace's `target/` is at its top), else the highest one holding a
/// [`PROJECT_MARKERS`] file, else `cwd` itself; never a home itself, nor above one.
pub fn project_dir(areas: &[PathBuf], cwd: &Path) -> Option<PathBuf> {
    let area = areas.iter().filter(|area| cwd.starts_with(area)).max_by_key(|area| area.as_os_str().len())?;
    let below: Vec<&Path> = cwd.ancestors().take_while(|dir| dir != area).collect();
    if below.is_empty() {
        return None;
    }
    let found = (below.iter().find(|dir| dir.join(".git").exists()))
        .or_else(|| below.iter().rev().find(|dir| PROJECT_MARKERS.iter().any(|marker| dir.join(marker).exists())));
    Some(found.copied().unwrap_or(cwd).to_path_buf())
}

/// The path with its symbolic links resolved where it exists (mounts resolve them too).
fn real(path: &Path) -> PathBuf {
    fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The existing directories under `home` that `components` (each a literal name or a glob)
/// name.
fn expand(home: &Path, components: &[crate::rules::schema::Matcher]) -> Vec<PathBuf> {
    let mut found = vec![home.to_path_buf()];
    for component in components {
        let mut next = Vec::new();
        for dir in &found {
            let Ok(entries) = fs::read_dir(dir) else { continue };
            for entry in entries.flatten() {
                if component.is_match(Path::new(&entry.file_name())) && entry.path().is_dir() {
                    next.push(entry.path());
                }
            }
        }
        found = next;
    }
    found
}

/// Sorted, without the paths inside another of them.
fn outermost(paths: impl IntoIterator<Item = PathBuf>) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = paths.into_iter().collect();
    paths.sort();
    paths.dedup();
    let mut kept: Vec<PathBuf> = Vec::with_capacity(paths.len());
    for path in paths {
        // Sorted, so a path's ancestors come before it.
        if !kept.iter().any(|outer| path.starts_with(outer)) {
            kept.push(path);
        }
    }
    kept
}

/// Looks for the existing persistence paths.
struct Finder<'a> {
    rules: &'a [Rule],
    home: Option<String>,
    system_root: Option<PathBuf>,
    found: Vec<PathBuf>,
    entries: u64,
    truncated: bool,
}

impl Finder<'_> {
    /// The rules' `~/` patterns in `home`, their absolute ones under the system root, and
    /// their `**/` ones in the project.
    fn find(&mut self, home: &Path, project: Option<&Path>) {
        let mut starts = Vec::new();
        let mut anywhere = false;
        for rule in self.rules {
            for target in &rule.targets {
                if let Some(rest) = target.strip_prefix("~/") {
                    starts.push((home.join(rest), false));
                } else if target.starts_with("**/") {
                    anywhere = true;
                } else if let Some(root) = &self.system_root {
                    starts.push((root.join(target.trim_start_matches('/')), true));
                }
            }
        }
        for (start, system) in starts {
            let (prefix, globbed) = literal_prefix(&start);
            if globbed {
                self.walk(&prefix, system, false);
            } else if prefix.exists() {
                self.consider(&prefix, system, prefix.is_dir());
            }
        }
        if let Some(project) = project.filter(|_| anywhere) {
            self.walk(project, false, true);
        }
    }

    /// Walks `top` (itself included), keeping the persistence paths; a directory that is one
    /// as a whole is kept and not entered.
    fn walk(&mut self, top: &Path, system: bool, project: bool) {
        if !top.is_dir() {
            return;
        }
        if self.consider(top, system, true) {
            return;
        }
        let mut stack = vec![(top.to_path_buf(), 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            let Ok(entries) = fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                if self.entries >= MAX_ENTRIES {
                    self.truncated = true;
                    return;
                }
                self.entries += 1;
                let path = entry.path();
                let Ok(kind) = entry.file_type() else { continue };
                // Not followed: a link's target is matched where it is, if anywhere.
                if kind.is_symlink() {
                    continue;
                }
                let is_dir = kind.is_dir();
                if self.consider(&path, system, is_dir) || !is_dir || depth + 1 > MAX_DEPTH {
                    continue;
                }
                if project && NOT_WALKED.iter().any(|name| entry.file_name().as_bytes() == name.as_bytes()) {
                    continue;
                }
                stack.push((path, depth + 1));
            }
        }
    }

    /// Keeps `path` when it is a persistence path.
    fn consider(&mut self, path: &Path, system: bool, directory: bool) -> bool {
        // Matched as this machine names it: below a test's system root, as if it were `/`.
        let text = match self.system_root.as_deref().filter(|root| system && *root != Path::new("/")) {
            Some(root) => match path.strip_prefix(root) {
                Ok(rel) => format!("/{}", rel.to_string_lossy()),
                Err(_) => return false,
            },
            None => path.to_string_lossy().into_owned(),
        };
        let home = if system { None } else { self.home.as_deref() };
        let probe = format!("{}/{PROBE}", text.trim_end_matches('/'));
        let hit = self
            .rules
            .iter()
            .any(|rule| rule.matches_path(&text, home) || (directory && rule.matches_path(&probe, home)));
        if hit {
            self.found.push(path.to_path_buf());
        }
        hit
    }
}

/// The part of `path` before its first glob component, and whether it had one.
fn literal_prefix(path: &Path) -> (PathBuf, bool) {
    let mut prefix = PathBuf::new();
    for component in path.components() {
        if component.as_os_str().as_bytes().iter().any(|b| b"*?[{".contains(b)) {
            return (prefix, true);
        }
        prefix.push(component);
    }
    (prefix, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, "x").unwrap();
    }

    struct Tree {
        _dir: tempfile::TempDir,
        top: PathBuf,
    }

    impl Tree {
        fn new() -> Tree {
            let dir = tempfile::tempdir().unwrap();
            let top = fs::canonicalize(dir.path()).unwrap();
            Tree { _dir: dir, top }
        }

        fn at(&self, relative: &str) -> PathBuf {
            self.top.join(relative)
        }
    }

    fn input<'a>(rules: &'a RuleSet, home: &'a Path, cwd: &'a Path, path: &'a [PathBuf]) -> Input<'a> {
        Input { rules, home, cwd, other_homes: &[], system_root: None, writes: Writes::ReadOnly, path }
    }

    #[test]
    fn the_project_and_the_managers_caches_are_writable_and_their_persistence_paths_are_not() {
        let tree = Tree::new();
        let home = tree.at("home");
        let project = home.join("src/app");
        for file in [
            ".bashrc",
            ".config/systemd/user/old.service",
            ".cargo/registry/index/x",
            "src/app/.git/HEAD",
            "src/app/package.json",
            "src/app/lib/index.js",
            "src/app/.github/workflows/ci.yml",
            "src/app/.claude/settings.json",
            "src/app/.mcp.json",
            "src/app/node_modules/x/.github/workflows/ci.yml",
            "src/app/node_modules/x/.mcp.json",
        ] {
            touch(&home.join(file));
        }
        let bin = tree.at("bin");
        touch(&bin.join("npm"));
        let rules = RuleSet::defaults().unwrap();
        let cwd = project.join("lib");
        let plan = plan(&input(&rules, &home, &cwd, std::slice::from_ref(&bin)));

        assert_eq!(plan.project.as_deref(), Some(project.as_path()), "the repository's top");
        // npm is on PATH: its cache is created; cargo's exists; pip's neither exists nor is
        // its manager installed.
        assert_eq!(plan.create, vec![home.join(".cache"), home.join(".npm")]);
        assert_eq!(
            plan.writable,
            vec![home.join(".cache"), home.join(".cargo/registry"), home.join(".npm"), project.clone()]
        );
        // In the project only: ~/.bashrc and the unit are in the read-only home already, and
        // a package's own workflows run nowhere.
        assert_eq!(
            plan.persistence,
            vec![project.join(".claude/settings.json"), project.join(".github/workflows"), project.join(".mcp.json")]
        );
        assert!(!plan.truncated);
    }

    #[test]
    fn a_command_run_in_the_home_itself_has_no_writable_project() {
        let tree = Tree::new();
        let home = tree.at("home");
        touch(&home.join("package.json"));
        let rules = RuleSet::defaults().unwrap();
        let plan = plan(&input(&rules, &home, &home, &[]));
        assert_eq!((plan.project, plan.writable), (None, Vec::new()));
        // A command outside every home (/tmp/build) needs nothing made writable.
        let elsewhere = tree.at("build");
        fs::create_dir_all(&elsewhere).unwrap();
        assert_eq!(project_dir(std::slice::from_ref(&home), &elsewhere), None);
        // Without `.git`, the highest directory with a project file: a workspace's top.
        touch(&home.join("w/Cargo.toml"));
        touch(&home.join("w/crates/a/Cargo.toml"));
        assert_eq!(project_dir(std::slice::from_ref(&home), &home.join("w/crates/a")), Some(home.join("w")));
        fs::create_dir_all(home.join("notes/today")).unwrap();
        assert_eq!(project_dir(std::slice::from_ref(&home), &home.join("notes/today")), Some(home.join("notes/today")));
    }

    #[test]
    fn as_root_other_homes_and_system_persistence_paths_are_read_only() {
        let tree = Tree::new();
        let root = tree.at("system");
        let home = root.join("root");
        let alice = root.join("home/alice");
        for file in ["etc/cron.d/job", "etc/crontab", "etc/profile.d/x.sh", "var/spool/cron/atjobs/a1", "etc/hostname"]
        {
            touch(&root.join(file));
        }
        fs::create_dir_all(&home).unwrap();
        fs::create_dir_all(alice.join("app")).unwrap();
        let rules = RuleSet::defaults().unwrap();
        let cwd = alice.join("app");
        let homes = [alice.clone(), root.join("home"), home.clone()];
        let plan = plan(&Input { other_homes: &homes, system_root: Some(&root), ..input(&rules, &home, &cwd, &[]) });
        // /home holds alice's home: it is the one kept; the user's own home is not "other".
        assert_eq!(plan.other_homes, vec![root.join("home")]);
        assert_eq!(plan.project, Some(cwd.clone()), "root's command in alice's project");
        assert_eq!(plan.writable, vec![cwd]);
        assert_eq!(
            plan.persistence,
            vec![
                root.join("etc/cron.d"),
                root.join("etc/crontab"),
                root.join("etc/profile.d"),
                root.join("var/spool/cron")
            ]
        );
    }

    #[test]
    fn a_home_of_slash_is_no_home_to_make_read_only() {
        let tree = Tree::new();
        let root = tree.at("system");
        touch(&root.join("etc/cron.d/job"));
        let rules = RuleSet::defaults().unwrap();
        let slash = Path::new("/");
        let plan = plan(&Input { system_root: Some(&root), ..input(&rules, slash, &root, &[]) });
        assert_eq!((plan.project, plan.writable, plan.create), (None, Vec::new(), Vec::new()));
        assert_eq!(plan.persistence, vec![root.join("etc/cron.d")]);
    }

    #[test]
    fn persistence_paths_are_told_for_keep() {
        let rules = PersistenceRules::of(&RuleSet::defaults().unwrap());
        let home = Path::new("/home/alice");
        let persistence = |relative: &str, directory: bool| rules.matches(&home.join(relative), home, directory);
        assert!(persistence(".bashrc", false));
        assert!(persistence(".config/systemd/user/evil.service", false));
        assert!(persistence(".config/systemd/user", true));
        assert!(persistence(".claude/settings.json", false));
        assert!(persistence("app/.github/workflows/x.yml", false));
        assert!(!persistence(".cache/x", false));
        assert!(!persistence(".config", true));
        assert!(!persistence("notes.txt", false));
    }

    #[test]
    fn a_home_write_may_be_a_glob_of_existing_directories() {
        let tree = Tree::new();
        let home = tree.at("home");
        fs::create_dir_all(home.join(".local/lib/python3.12")).unwrap();
        fs::create_dir_all(home.join(".local/lib/python3.13")).unwrap();
        fs::create_dir_all(home.join(".local/lib/ruby")).unwrap();
        let sources = vec![(
            "managers.yaml".into(),
            "schema: 2\nmanagers:\n  - name: pip\n    execs: [pip]\nhome_files:\n  - manager: pip\n    files: [.pypirc]\n    writes: [\".local/lib/python3*\", .cache/pip]\n"
                .into(),
        )];
        let rules = RuleSet::from_sources(sources).unwrap();
        let plan = plan(&input(&rules, &home, &home, &[]));
        assert_eq!(plan.writable, vec![home.join(".local/lib/python3.12"), home.join(".local/lib/python3.13")]);
        let error = RuleSet::from_sources([(
            "m.yaml".to_owned(),
            "schema: 2\nmanagers:\n  - name: pip\n    execs: [pip]\nhome_files:\n  - manager: pip\n    files: [.pypirc]\n    writes: [../x]\n"
                .to_owned(),
        )])
        .unwrap_err()
        .to_string();
        assert!(error.contains("home write \"../x\""), "{error}");
    }
}
