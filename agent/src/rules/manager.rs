//! Package managers: which execs make a process the root of a package tree. The kernel gets
//! the same table (basenames and module keys) so that both sides agree on what a root is.

use serde::Deserialize;

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
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
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleRoot {
    /// Interpreter basenames (`python`, `python3`, `python3.11`).
    pub interpreters: Vec<String>,
    /// The argv words right after argv[0] (`["-m", "pip"]`).
    pub args: Vec<String>,
}

/// The last component of a path, as the kernel's basename lookup sees it.
pub fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The index in `managers` of the manager that `filename` with `args` (argv, argv[0] included)
/// starts, if any.
pub fn root_manager(managers: &[Manager], filename: &str, args: &[String]) -> Option<usize> {
    let name = basename(filename);
    managers.iter().position(|manager| {
        manager.execs.iter().any(|exec| exec == name)
            || manager.modules.iter().any(|module| {
                module.interpreters.iter().any(|interpreter| interpreter == name)
                    && args.len() > module.args.len()
                    && args[1..=module.args.len()] == module.args[..]
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn managers() -> Vec<Manager> {
        vec![
            Manager { name: "npm".into(), execs: vec!["npm".into(), "npx".into()], modules: vec![] },
            Manager {
                name: "pip".into(),
                execs: vec!["pip3".into()],
                modules: vec![ModuleRoot {
                    interpreters: vec!["python3".into()],
                    args: vec!["-m".into(), "pip".into()],
                }],
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
}
