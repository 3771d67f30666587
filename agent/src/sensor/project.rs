//! The Python project a build runs for, named by its own metadata. pip, uv, poetry and pdm run a
//! project's build backend (and `setup.py`) with the project's directory as the working
//! directory, and a local directory (`pip install ./dir`) has no archive or build-directory
//! name to go by. The engine reads no files, so the sensor reads the metadata when a Python
//! interpreter of a package tree execs, and the exec event (and so the trace) carries it.

use std::{
    fs,
    io::{self, Read},
    path::Path,
};

use credwatch_core::{event::Project, rules::manager::basename};

/// Bytes read of `PKG-INFO` and `setup.cfg`: names and versions come first in both.
const MAX_METADATA: u64 = 64 * 1024;
/// Bytes read of `pyproject.toml`, which is parsed whole (TOML can set `[project]` anywhere);
/// no real one comes near this.
const MAX_PYPROJECT: u64 = 1024 * 1024;

/// The project in `exec`'s working directory when the program is a Python interpreter.
pub fn for_exec(executable: &str, args: &[String], cwd: &str) -> Option<Project> {
    let python = |path: &str| basename(path).starts_with("python");
    if cwd.is_empty() || !(python(executable) || args.first().is_some_and(|arg0| python(arg0))) {
        return None;
    }
    in_dir(Path::new(cwd))
}

/// The first of `PKG-INFO` (an sdist's, generated: exact even when the version is dynamic),
/// `pyproject.toml` and `setup.cfg` in `dir` that names the project.
pub fn in_dir(dir: &Path) -> Option<Project> {
    type Parser = fn(&str) -> Option<(String, Option<String>)>;
    let parsers: [(&str, u64, Parser); 3] = [
        ("PKG-INFO", MAX_METADATA, pkg_info),
        ("pyproject.toml", MAX_PYPROJECT, pyproject_toml),
        ("setup.cfg", MAX_METADATA, setup_cfg),
    ];
    parsers.into_iter().find_map(|(file, limit, parse)| {
        let text = read_head(&dir.join(file), limit).ok()?;
        let (name, version) = parse(&text)?;
        Some(Project { name, version, source: file.to_owned() })
    })
}

fn read_head(path: &Path, limit: u64) -> io::Result<String> {
    let mut bytes = Vec::new();
    fs::File::open(path)?.take(limit).read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `Name:` and `Version:` of the core metadata headers (they end at the first empty line).
fn pkg_info(text: &str) -> Option<(String, Option<String>)> {
    let headers = text.lines().take_while(|line| !line.trim().is_empty());
    let (mut name, mut version) = (None, None);
    for line in headers {
        if let Some((key, value)) = line.split_once(':') {
            let value = value.trim();
            match key {
                "Name" if !value.is_empty() => name = Some(value.to_owned()),
                "Version" if !value.is_empty() => version = Some(value.to_owned()),
                _ => {}
            }
        }
    }
    Some((name?, version))
}

/// `name` and `version` of the `[project]` table (a dynamic version is absent).
// Cost (release build, busy machine): 17 µs for a 1 KB pyproject.toml, against 0.5 µs for the
// line scan it replaced, which misread valid TOML (a table header inside a multi-line string,
// dotted keys, escapes); paid once per Python exec in a package tree, itself milliseconds.
fn pyproject_toml(text: &str) -> Option<(String, Option<String>)> {
    let document: toml::Table = text.parse().ok()?;
    let project = document.get("project")?.as_table()?;
    let value = |key: &str| project.get(key)?.as_str().filter(|value| !value.is_empty()).map(str::to_owned);
    Some((value("name")?, value("version")))
}

/// `name` and `version` of the `[metadata]` section (`key = value`, or `key: value`).
fn setup_cfg(text: &str) -> Option<(String, Option<String>)> {
    let section = section(text, '[', "[metadata]")?;
    let value = |key: &str| {
        section.iter().find_map(|line| {
            let (k, v) = line.split_once(['=', ':'])?;
            // `attr:` and `file:` values are computed when setup runs: not a version.
            let v = v.trim();
            (k.trim() == key && !v.is_empty() && !v.starts_with("attr:") && !v.starts_with("file:"))
                .then(|| v.to_owned())
        })
    };
    Some((value("name")?, value("version")))
}

/// The lines of the section whose header line is `header`, up to the next header.
fn section<'a>(text: &'a str, open: char, header: &str) -> Option<Vec<&'a str>> {
    let mut lines = text.lines().map(str::trim);
    lines.find(|line| *line == header)?;
    Some(lines.take_while(|line| !line.starts_with(open)).filter(|line| !line.starts_with('#')).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_format() {
        let pkg = "Metadata-Version: 2.1\nName: evil-sdist\nVersion: 4.5.6\nSummary: x\n\nName: not-this\n";
        assert_eq!(pkg_info(pkg), Some(("evil-sdist".into(), Some("4.5.6".into()))));
        let toml = "[build-system]\nrequires = [\"setuptools\"]\nname = \"nope\"\n\n[project]\n# c\nname = \"local-dir\"\nversion = '0.7.0' # pinned\n\n[tool.x]\nversion = \"9\"\n";
        assert_eq!(pyproject_toml(toml), Some(("local-dir".into(), Some("0.7.0".into()))));
        let dynamic = "[project]\nname = \"dyn\"\ndynamic = [\"version\"]\n";
        assert_eq!(pyproject_toml(dynamic), Some(("dyn".into(), None)));
        assert_eq!(pyproject_toml("[tool.poetry]\nname = \"p\"\n"), None);
        let cfg = "[metadata]\nname = cfg-pkg\nversion = attr: cfg_pkg.__version__\n[options]\n";
        assert_eq!(setup_cfg(cfg), Some(("cfg-pkg".into(), None)));
        assert_eq!(setup_cfg("[metadata]\nname: colon\nversion: 1.0\n"), Some(("colon".into(), Some("1.0".into()))));
        assert_eq!(pyproject_toml("[project]\nname = \"unterminated\n"), None);
        assert_eq!(pyproject_toml("[project]\nname = 3\n"), None);
        // What TOML means, not what a line looks like: a table in a string is text, and a
        // dotted key is a table too.
        let decoy = "[tool.x]\ndoc = \"\"\"\n[project]\nname = \"decoy\"\n\"\"\"\n[project]\nname = \"real\"\n";
        assert_eq!(pyproject_toml(decoy), Some(("real".into(), None)));
        assert_eq!(pyproject_toml("project.name = \"dotted\"\n"), Some(("dotted".into(), None)));
    }

    #[test]
    fn prefers_pkg_info_and_only_for_python() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path().to_str().unwrap();
        let args = |words: &[&str]| words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
        assert_eq!(for_exec("/usr/bin/python3.11", &args(&["python3"]), cwd), None);
        fs::write(dir.path().join("pyproject.toml"), "[project]\nname = \"from-toml\"\nversion = \"1\"\n").unwrap();
        let project = for_exec("/usr/bin/python3.11", &args(&["python3", "setup.py"]), cwd).unwrap();
        assert_eq!((project.name.as_str(), project.source.as_str()), ("from-toml", "pyproject.toml"));
        fs::write(dir.path().join("PKG-INFO"), "Name: from-pkg-info\nVersion: 2\n").unwrap();
        assert_eq!(for_exec("/usr/bin/python3.11", &args(&["python3"]), cwd).unwrap().name, "from-pkg-info");
        assert_eq!(for_exec("/usr/bin/node", &args(&["node", "x.js"]), cwd), None);
        assert_eq!(for_exec("/usr/bin/python3", &args(&["python3"]), ""), None);
    }
}
