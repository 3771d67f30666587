//! Which package a process works for, from what each manager leaves in the exec: npm's
//! environment, cargo's build-script path and rustc's arguments, pip's build directories.
//! Only the events are used (never the filesystem), so replay attributes like live.

use std::collections::BTreeMap;

use crate::rules::manager::basename;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attribution {
    pub name: Option<String>,
    pub version: Option<String>,
    pub lifecycle: Option<String>,
}

/// rustc state needed to name the proc-macro that runs inside it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rustc {
    /// `--extern name=path` entries whose path is a shared object (proc-macros).
    pub proc_macros: Vec<(String, String)>,
}

/// Attribution of a manager process itself: the package named by the one archive in its
/// arguments (`pip install ./evil-1.0.tar.gz`, `npm install ./x-1.0.0.tgz`), if exactly one.
pub fn for_manager(args: &[String]) -> Attribution {
    let mut archives = args.iter().skip(1).filter_map(|arg| archive_name_version(basename(arg)));
    match (archives.next(), archives.next()) {
        (Some((name, version)), None) => Attribution { name: Some(name), version: Some(version), lifecycle: None },
        _ => Attribution::default(),
    }
}

/// Refines `inherited` for a process that executed `executable` with `args`, in `cwd`, with
/// the attribution variables `env`. Also returns the rustc state when it is rustc.
pub fn for_exec(
    inherited: &Attribution,
    executable: &str,
    args: &[String],
    cwd: &str,
    env: &BTreeMap<String, String>,
) -> (Attribution, Option<Rustc>) {
    let mut attr = inherited.clone();
    if let Some(name) = env.get("npm_package_name") {
        attr = Attribution {
            name: Some(name.clone()),
            version: env.get("npm_package_version").cloned(),
            lifecycle: env.get("npm_lifecycle_event").cloned(),
        };
    }
    if let Some(krate) = build_script_crate(executable) {
        attr = Attribution {
            name: Some(env.get("CARGO_PKG_NAME").cloned().unwrap_or(krate)),
            version: env.get("CARGO_PKG_VERSION").cloned(),
            lifecycle: Some("build-script".into()),
        };
        return (attr, None);
    }
    if basename(executable) == "rustc" || args.first().is_some_and(|a| basename(a) == "rustc") {
        let rustc = Rustc { proc_macros: proc_macro_externs(args) };
        let crate_name = flag_value(args, "--crate-name").map(str::to_owned);
        attr = Attribution {
            name: crate_name.or_else(|| env.get("CARGO_PKG_NAME").cloned()),
            version: env.get("CARGO_PKG_VERSION").cloned(),
            // Code runs inside rustc only through proc-macros; a read without any is the
            // crate's own `include_*!`.
            lifecycle: Some(if rustc.proc_macros.is_empty() { "compile" } else { "proc-macro" }.into()),
        };
        if let [(name, _)] = rustc.proc_macros.as_slice() {
            attr.name = Some(name.clone());
            attr.version = None;
        }
        return (attr, Some(rustc));
    }
    if let Some(name) = std::iter::once(cwd).chain(args.iter().map(String::as_str)).find_map(pip_build_dir_name) {
        if attr.name.as_deref() != Some(name.as_str()) {
            attr.version = None;
        }
        attr.name = Some(name);
    }
    if args.iter().any(|arg| arg.contains("_in_process.py")) {
        attr.lifecycle = Some("build-backend".into());
    } else if args.iter().skip(1).any(|arg| arg.contains("setup.py")) {
        attr.lifecycle = Some("setup.py".into());
    }
    (attr, None)
}

/// The crate of `.../build/<crate>-<hash>/build-script-build`.
pub fn build_script_crate(executable: &str) -> Option<String> {
    let mut parts = executable.rsplit('/');
    if parts.next()? != "build-script-build" {
        return None;
    }
    let dir = parts.next()?;
    (parts.next()? == "build").then_some(())?;
    let (krate, hash) = dir.rsplit_once('-')?;
    (!krate.is_empty() && !hash.is_empty() && hash.bytes().all(|b| b.is_ascii_hexdigit())).then(|| krate.to_owned())
}

fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let prefix = format!("{flag}=");
    args.iter().enumerate().find_map(|(i, arg)| {
        if arg == flag {
            args.get(i + 1).map(String::as_str)
        } else {
            arg.strip_prefix(&prefix)
        }
    })
}

fn proc_macro_externs(args: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, arg) in args.iter().enumerate() {
        let value = match arg.strip_prefix("--extern=") {
            Some(value) => value,
            None if arg == "--extern" => match args.get(i + 1) {
                Some(value) => value.as_str(),
                None => continue,
            },
            None => continue,
        };
        if let Some((name, path)) = value.split_once('=') {
            if path.ends_with(".so") {
                out.push((name.to_owned(), path.to_owned()));
            }
        }
    }
    out
}

/// The package of pip's build directory in `path`: `/tmp/pip-install-<r>/<name>_<hash>/...`.
/// (`/tmp/pip-req-build-<r>` has no name: the manager's archive argument names it.)
fn pip_build_dir_name(path: &str) -> Option<String> {
    let mut parts = path.split('/');
    parts.find(|part| part.starts_with("pip-install-"))?;
    let dir = parts.next()?;
    let (name, hash) = dir.rsplit_once('_')?;
    (!name.is_empty() && !hash.is_empty() && hash.bytes().all(|b| b.is_ascii_alphanumeric())).then(|| name.to_owned())
}

/// (name, version) of an sdist, wheel or npm tarball file name.
fn archive_name_version(file: &str) -> Option<(String, String)> {
    if let Some(stem) = file.strip_suffix(".whl") {
        let mut parts = stem.split('-');
        let (name, version) = (parts.next()?, parts.next()?);
        return Some((name.to_owned(), version.to_owned()));
    }
    let stem =
        [".tar.gz", ".tgz", ".zip", ".tar.bz2", ".tar.xz", ".tar"].iter().find_map(|ext| file.strip_suffix(ext))?;
    let (name, version) = stem.rsplit_once('-')?;
    (!name.is_empty() && version.starts_with(|c: char| c.is_ascii_digit()))
        .then(|| (name.to_owned(), version.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn names_archives_and_build_dirs() {
        assert_eq!(archive_name_version("evil-1.0.tar.gz"), Some(("evil".into(), "1.0".into())));
        assert_eq!(archive_name_version("evil_pkg-2.1.0-py3-none-any.whl"), Some(("evil_pkg".into(), "2.1.0".into())));
        assert_eq!(archive_name_version("evil-pkg-0.3.0.tgz"), Some(("evil-pkg".into(), "0.3.0".into())));
        assert_eq!(archive_name_version("requirements.txt"), None);
        assert_eq!(for_manager(&args(&["pip", "install", "a-1.tar.gz", "b-2.tar.gz"])), Attribution::default());
        assert_eq!(pip_build_dir_name("/tmp/pip-install-x1y2/evil_0123abcd/src"), Some("evil".into()));
        assert_eq!(pip_build_dir_name("/tmp/pip-req-build-x1y2"), None);
        assert_eq!(
            build_script_crate("/w/target/debug/build/proc-macro1-0a1b2c3d4e5f6789/build-script-build"),
            Some("proc-macro1".into())
        );
        assert_eq!(build_script_crate("/w/target/debug/deps/foo-0a1b/build-script-build"), None);
        assert_eq!(build_script_crate("/usr/bin/build-script-build"), None);
    }
}
