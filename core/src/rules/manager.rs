//! Package managers: which execs make a process the root of a package tree. The kernel gets
//! the same table (basenames, module keys and script stems) so that both sides agree on what a
//! root is: the kernel marks a superset (a stem, not the whole pattern), the engine decides.

use serde::Deserialize;

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manager {
    /// `npm`, `cargo`, `pip`, ...
    pub name: String,
    /// Basenames of the executables that are this manager (`npm`, `npx`).
    #[serde(default)]
    pub execs: Vec<String>,
    /// Interpreter invocations that are this manager (`python3 -m pip`).
    #[serde(default)]
    pub modules: Vec<ModuleRoot>,
    /// Release files an interpreter runs that are this manager (`node yarn-4.5.3.cjs`).
    #[serde(default)]
    pub scripts: Vec<ScriptRoot>,
    /// The installed manager is a script run by an interpreter (npm, yarn, pip): a binary of
    /// its name in a temporary directory is not it (see [`TEMP_DIRS`]).
    #[serde(default)]
    pub script: bool,
    /// Script basenames through which the manager runs itself for its own work (pip's
    /// `__pip-runner__.py` installing build requirements into its isolated build environment):
    /// forked by the outermost manager and executed at once, such a process is that manager
    /// too, not a manager package code started.
    #[serde(default)]
    pub helpers: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleRoot {
    /// Interpreter basenames (`python`, `python3`, `python3.11`).
    pub interpreters: Vec<String>,
    /// The argv words right after argv[0] (`["-m", "pip"]`).
    pub args: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptRoot {
    /// Interpreter basenames (`node`).
    pub interpreters: Vec<String>,
    /// Basename patterns of the script, the first argv word after argv[0] that is not an
    /// option (`yarn-*.cjs`, `npm-cli.js`); `*` matches any run of characters. Each starts with
    /// its stem, the literal text up to the first `-` or `.`, which is what the kernel looks up.
    #[serde(deserialize_with = "script_patterns")]
    pub files: Vec<String>,
    /// The argv words right after the script (`corepack yarn ...`: `[yarn]`). The kernel looks
    /// up the stem only, so it marks every one of them (`corepack enable` too).
    #[serde(default)]
    pub args: Vec<String>,
}

/// A script pattern with a stem the kernel can look up, checked where it is written.
#[derive(Deserialize)]
#[serde(try_from = "String")]
struct ScriptPattern(String);

impl TryFrom<String> for ScriptPattern {
    type Error = String;
    fn try_from(pattern: String) -> Result<Self, String> {
        pattern_stem(&pattern)?;
        Ok(ScriptPattern(pattern))
    }
}

fn script_patterns<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    let patterns = Vec::<ScriptPattern>::deserialize(deserializer)?;
    Ok(patterns.into_iter().map(|ScriptPattern(pattern)| pattern).collect())
}

/// Directories where anyone may write and nothing is installed: a binary named like a script
/// manager there is a copy made to pass for it.
pub const TEMP_DIRS: &[&str] = &["/tmp/", "/var/tmp/", "/dev/shm/"];

/// The last component of a path, as the kernel's basename lookup sees it.
pub fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The kernel's key for a script: its basename up to the first `-` or `.` (`yarn-4.5.3.cjs`:
/// `yarn`).
pub fn script_stem(path: &str) -> &str {
    let base = basename(path);
    &base[..base.find(['-', '.']).unwrap_or(base.len())]
}

/// The stem of a script pattern, or why it has none the kernel could look up.
pub fn pattern_stem(pattern: &str) -> Result<&str, String> {
    let stem = script_stem(pattern);
    if pattern.contains('/') || stem.is_empty() || stem.contains('*') {
        return Err(format!(
            "script pattern {pattern:?} must start with a literal name up to its first '-' or '.' (`yarn-*.cjs`)"
        ));
    }
    Ok(stem)
}

/// The script an interpreter runs: the first word of `args` after argv[0] that is not an
/// option. (An option's value, `node -r x`, is taken for the script; the kernel does the same.)
pub fn script_arg(args: &[String]) -> Option<&str> {
    script_index(args).map(|i| args[i].as_str())
}

fn script_index(args: &[String]) -> Option<usize> {
    (1..args.len()).find(|&i| !args[i].starts_with('-'))
}

/// `*` matches any run of characters, everything else itself.
fn wildcard(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(text) = text.strip_prefix(head) else { return false };
            (0..=text.len()).filter(|&i| text.is_char_boundary(i)).any(|i| wildcard(rest, &text[i..]))
        }
    }
}

/// The index in `managers` of the manager that `filename` with `args` (argv, argv[0] included)
/// starts, if any.
pub fn root_manager(managers: &[Manager], filename: &str, args: &[String]) -> Option<usize> {
    let name = basename(filename);
    let script = script_index(args);
    managers.iter().position(|manager| {
        manager.execs.iter().any(|exec| exec == name)
            || manager.modules.iter().any(|module| {
                module.interpreters.iter().any(|interpreter| interpreter == name)
                    && args.len() > module.args.len()
                    && args[1..=module.args.len()] == module.args[..]
            })
            || manager.scripts.iter().any(|scripts| {
                scripts.interpreters.iter().any(|interpreter| interpreter == name)
                    && script.is_some_and(|i| {
                        scripts.files.iter().any(|file| wildcard(file, basename(&args[i])))
                            && args[i + 1..].starts_with(&scripts.args)
                    })
            })
    })
}

/// The words of `args` that are the command given to `manager`, started as `filename` (see
/// [`root_manager`]): after argv[0] for one of its executables, after the module words
/// (`python3 -m pip install x`: `install x`), after the script and its words (`node
/// .yarn/releases/yarn-4.5.3.cjs install`, `node corepack yarn install`: `install`).
pub fn command_args<'a>(manager: &Manager, filename: &str, args: &'a [String]) -> &'a [String] {
    let name = basename(filename);
    let after = |n: usize| args.get(n..).unwrap_or_default();
    if manager.execs.iter().any(|exec| exec == name) {
        return after(1);
    }
    if let Some(module) = manager.modules.iter().find(|module| {
        module.interpreters.iter().any(|interpreter| interpreter == name)
            && args.get(1..=module.args.len()).is_some_and(|words| words == module.args)
    }) {
        return after(1 + module.args.len());
    }
    let Some(i) = script_index(args) else { return after(1) };
    let scripts = manager.scripts.iter().find(|scripts| {
        scripts.interpreters.iter().any(|interpreter| interpreter == name)
            && scripts.files.iter().any(|file| wildcard(file, basename(&args[i])))
            && args[i + 1..].starts_with(&scripts.args)
    });
    match scripts {
        Some(scripts) => after(i + 1 + scripts.args.len()),
        None => after(1),
    }
}

/// The name `manager` was started by when an interpreter started it: the script's stem
/// (`npm-cli.js`: `npm`, `npx-cli.js`: `npx`, `yarn-4.5.3.cjs`: `yarn`), the last of the words
/// after the script (`corepack pnpm`: `pnpm`) or of the module words (`-m poetry`: `poetry`).
/// None when it was one of its executables, or not it at all.
pub fn invoked_name(manager: &Manager, filename: &str, args: &[String]) -> Option<String> {
    let name = basename(filename);
    if manager.execs.iter().any(|exec| exec == name) {
        return None;
    }
    let module = manager.modules.iter().find(|module| {
        module.interpreters.iter().any(|interpreter| interpreter == name)
            && args.get(1..=module.args.len()).is_some_and(|words| words == module.args)
    });
    if let Some(module) = module {
        return module.args.last().cloned();
    }
    let i = script_index(args)?;
    let scripts = manager.scripts.iter().find(|scripts| {
        scripts.interpreters.iter().any(|interpreter| interpreter == name)
            && scripts.files.iter().any(|file| wildcard(file, basename(&args[i])))
            && args[i + 1..].starts_with(&scripts.args)
    })?;
    Some(scripts.args.last().map_or_else(|| script_stem(&args[i]).to_owned(), Clone::clone))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn managers() -> Vec<Manager> {
        vec![
            Manager { name: "npm".into(), execs: vec!["npm".into(), "npx".into()], ..Manager::default() },
            Manager {
                name: "pip".into(),
                execs: vec!["pip3".into()],
                modules: vec![ModuleRoot {
                    interpreters: vec!["python3".into()],
                    args: vec!["-m".into(), "pip".into()],
                }],
                ..Manager::default()
            },
            Manager {
                name: "yarn".into(),
                scripts: vec![
                    ScriptRoot {
                        interpreters: vec!["node".into()],
                        files: vec!["yarn-*.cjs".into(), "yarn.js".into()],
                        args: vec![],
                    },
                    ScriptRoot {
                        interpreters: vec!["node".into()],
                        files: vec!["corepack".into()],
                        args: vec!["yarn".into()],
                    },
                ],
                ..Manager::default()
            },
        ]
    }

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn finds_managers_by_basename_and_module() {
        let m = managers();
        assert_eq!(root_manager(&m, "/usr/bin/npx", &args(&["npx", "x"])), Some(0));
        assert_eq!(root_manager(&m, "/usr/bin/python3", &args(&["python3", "-m", "pip", "install"])), Some(1));
        assert_eq!(root_manager(&m, "/usr/bin/python3", &args(&["python3", "-m", "venv"])), None);
        assert_eq!(root_manager(&m, "/usr/bin/python3", &args(&["python3", "-m"])), None);
        assert_eq!(root_manager(&m, "/usr/bin/node", &args(&["node"])), None);
    }

    #[test]
    fn finds_release_files_run_by_their_interpreter() {
        let m = managers();
        let yarn = |words: &[&str]| root_manager(&m, "/usr/bin/node", &args(words));
        assert_eq!(yarn(&["node", ".yarn/releases/yarn-4.5.3.cjs", "install"]), Some(2));
        assert_eq!(yarn(&["node", "--max-old-space-size=4096", "/w/.yarn/releases/yarn-4.5.3.cjs"]), Some(2));
        assert_eq!(yarn(&["node", "/opt/yarn/bin/yarn.js"]), Some(2));
        // Same stem, another file: the kernel marks it, the engine does not take it for yarn.
        assert_eq!(yarn(&["node", "yarn-helper.js"]), None);
        assert_eq!(yarn(&["node", "app.js", "yarn-4.5.3.cjs"]), None);
        // Another interpreter running the same file is not it.
        assert_eq!(root_manager(&m, "/usr/bin/python3", &args(&["python3", "yarn-4.5.3.cjs"])), None);
        // A script that is a manager only with the words after it.
        assert_eq!(yarn(&["node", "/usr/bin/corepack", "yarn", "install"]), Some(2));
        assert_eq!(yarn(&["node", "/usr/bin/corepack", "enable"]), None);
        assert_eq!(yarn(&["node", "/usr/bin/corepack"]), None);
    }

    #[test]
    fn command_words_start_after_the_invocation() {
        let m = managers();
        let words =
            |manager: usize, filename: &str, argv: &[&str]| command_args(&m[manager], filename, &args(argv)).join(" ");
        assert_eq!(words(0, "/usr/bin/npm", &["npm", "run", "dev"]), "run dev");
        assert_eq!(words(1, "/usr/bin/python3", &["python3", "-m", "pip", "install", "x"]), "install x");
        assert_eq!(
            words(2, "/usr/bin/node", &["node", "--x", ".yarn/releases/yarn-4.5.3.cjs", "run", "dev"]),
            "run dev"
        );
        assert_eq!(words(2, "/usr/bin/node", &["node", "/usr/bin/corepack", "yarn", "install"]), "install");
        assert_eq!(words(2, "/usr/bin/node", &["node", "/usr/bin/corepack", "yarn"]), "");
    }

    #[test]
    fn invoked_names() {
        let m = managers();
        let name = |manager: usize, filename: &str, argv: &[&str]| invoked_name(&m[manager], filename, &args(argv));
        assert_eq!(name(0, "/usr/bin/npm", &["npm", "run"]), None);
        assert_eq!(name(1, "/usr/bin/python3", &["python3", "-m", "pip", "install"]).as_deref(), Some("pip"));
        assert_eq!(
            name(2, "/usr/bin/node", &["node", ".yarn/releases/yarn-4.5.3.cjs", "dev"]).as_deref(),
            Some("yarn")
        );
        assert_eq!(name(2, "/usr/bin/node", &["node", "/usr/bin/corepack", "yarn", "dev"]).as_deref(), Some("yarn"));
        assert_eq!(name(2, "/usr/bin/node", &["node", "server.js"]), None);
    }

    #[test]
    fn stems_and_patterns() {
        assert_eq!(script_stem("/usr/lib/node_modules/npm/bin/npm-cli.js"), "npm");
        assert_eq!(script_stem(".yarn/releases/yarn-4.5.3.cjs"), "yarn");
        assert_eq!(script_stem("pnpm.cjs"), "pnpm");
        assert_eq!(script_stem("/x/.yarnrc"), "");
        assert_eq!(pattern_stem("yarn-*.cjs"), Ok("yarn"));
        assert_eq!(pattern_stem("__pip-runner__.py"), Ok("__pip"));
        assert!(pattern_stem("*.cjs").is_err());
        assert!(pattern_stem("ya*rn.js").is_err());
        assert!(pattern_stem("bin/yarn.js").is_err());
        assert!(wildcard("yarn-*.cjs", "yarn-4.5.3.cjs"));
        assert!(wildcard("a*b*c", "aXXbYc"));
        assert!(!wildcard("yarn-*.cjs", "yarn-4.5.3.js"));
    }
}
