//! Which package a process works for, from what each manager leaves in the exec: npm's
//! environment, cargo's build-script path and rustc's arguments, pip's build directories,
//! the unpacked gem in which RubyGems and Bundler build an extension.
//! Only the events are used (never the filesystem), so replay attributes like live.

use std::collections::{BTreeMap, HashMap};

use crate::{event::Exec, rules::manager::basename};

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
    pub proc_macros: Vec<ProcMacro>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcMacro {
    /// The package as published (`derive-stamp`) when the tree built it, else the crate
    /// identifier of `--extern` (`derive_stamp`).
    pub name: String,
    pub version: Option<String>,
    /// The shared object.
    pub path: String,
}

/// Most proc-macro packages remembered per tree.
const MAX_PROC_MACROS: usize = 4096;

/// The packages of the proc-macros a tree's rustc built, by the shared object's file stem
/// (`libderive_stamp-0a1b2c3d4e5f6789`). cargo gives rustc the package's name and version
/// when it compiles a crate; a crate that uses the macro later sees only the crate identifier.
#[derive(Debug, Default)]
pub struct ProcMacroPackages {
    by_stem: HashMap<String, (String, Option<String>)>,
}

/// A proc-macro package a rustc exec builds: the stem of its shared object, its name and version.
pub type BuiltProcMacro = (String, (String, Option<String>));

impl ProcMacroPackages {
    /// The proc-macro package that a rustc exec with `args` and `env` builds, if it builds one.
    pub fn built_by(args: &[String], env: &BTreeMap<String, String>) -> Option<BuiltProcMacro> {
        if flag_value(args, "--crate-type") != Some("proc-macro") {
            return None;
        }
        let (krate, package) = (flag_value(args, "--crate-name")?, env.get("CARGO_PKG_NAME")?);
        let extra = codegen_option(args, "extra-filename").unwrap_or_default();
        Some((format!("lib{krate}{extra}"), (package.clone(), env.get("CARGO_PKG_VERSION").cloned())))
    }

    pub fn insert(&mut self, (stem, package): BuiltProcMacro) {
        if self.by_stem.len() < MAX_PROC_MACROS {
            self.by_stem.insert(stem, package);
        }
    }

    fn package(&self, so: &str) -> Option<&(String, Option<String>)> {
        let stem = basename(so).split_once('.').map_or(basename(so), |(stem, _)| stem);
        self.by_stem.get(stem)
    }
}

/// Attribution of a manager process itself: the package named by the one archive among the
/// words of its command (`pip install ./evil-1.0.tar.gz`, `npm install ./x-1.0.0.tgz`), if
/// exactly one.
pub fn for_manager(words: &[String]) -> Attribution {
    let mut archives = words.iter().filter_map(|arg| archive_name_version(basename(arg)));
    match (archives.next(), archives.next()) {
        (Some((name, version)), None) => Attribution { name: Some(name), version: Some(version), lifecycle: None },
        _ => Attribution::default(),
    }
}

/// Refines `inherited` for a process that executed `executable` with `args`, in `cwd`, with
/// the attribution variables `env` and the `project` the sensor found in `cwd`. Also returns
/// the rustc state when it is rustc.
pub fn for_exec(
    inherited: &Attribution,
    executable: &str,
    exec: &Exec,
    proc_macro_packages: Option<&ProcMacroPackages>,
) -> (Attribution, Option<Rustc>) {
    let (args, cwd, env, project) = (&exec.args, exec.cwd.as_str(), &exec.env, exec.project.as_ref());
    let mut attr = inherited.clone();
    if let Some(name) = env.get("npm_package_name") {
        attr = Attribution {
            name: Some(name.clone()),
            version: env.get("npm_package_version").cloned(),
            lifecycle: env.get("npm_lifecycle_event").cloned(),
        };
    }
    // A gem's extension build names the gem over what it inherits: `gem install` run by an
    // npm postinstall passes npm's variables down to it.
    if let Some(step) = gem_build_step(executable, args) {
        if let Some((name, version)) = gem_dir(cwd) {
            // A step that another step of the same gem started (`make` run by its extconf.rb)
            // stays that step: the alert names the one RubyGems ran.
            let within = attr.lifecycle.is_some() && attr.name.as_deref() == Some(&name) && attr.version == version;
            if !within {
                attr = Attribution { name: Some(name), version, lifecycle: Some(step.into()) };
            }
            return (attr, None);
        }
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
        let rustc = Rustc { proc_macros: proc_macro_externs(args, proc_macro_packages) };
        // The package as published (`evil-macro`), else the crate identifier (`evil_macro`).
        let crate_name = flag_value(args, "--crate-name").map(str::to_owned);
        attr = Attribution {
            name: env.get("CARGO_PKG_NAME").cloned().or(crate_name),
            version: env.get("CARGO_PKG_VERSION").cloned(),
            // Code runs inside rustc only through proc-macros; a read without any is the
            // crate's own `include_*!`.
            lifecycle: Some(if rustc.proc_macros.is_empty() { "compile" } else { "proc-macro" }.into()),
        };
        if let [only] = rustc.proc_macros.as_slice() {
            attr.name = Some(only.name.clone());
            attr.version.clone_from(&only.version);
        }
        return (attr, Some(rustc));
    }
    if let Some(name) = std::iter::once(cwd).chain(args.iter().map(String::as_str)).find_map(pip_build_dir_name) {
        // The directory's name is pip's normalised one (`pynacl`): a name the project's own
        // metadata gave (`PyNaCl` 1.6.2) stays, with its version.
        if attr.name.as_deref().is_none_or(|known| normalized(known) != normalized(&name)) {
            attr.version = None;
            attr.name = Some(name);
        }
    }
    let lifecycle = if runs_build_backend(args) {
        Some("build-backend")
    } else if args.iter().skip(1).any(|arg| arg.contains("setup.py")) {
        Some("setup.py")
    } else {
        None
    };
    // A build step names the project it builds by the project's own metadata (exact, and the
    // only name a local directory has); any Python process of an unnamed tree too.
    if let Some(project) = project.filter(|_| lifecycle.is_some() || attr.name.is_none()) {
        attr.name = Some(project.name.clone());
        attr.version.clone_from(&project.version);
    }
    if let Some(lifecycle) = lifecycle {
        attr.lifecycle = Some(lifecycle.into());
    }
    (attr, None)
}

/// A PEP 517 build backend's hooks: pip, poetry and pdm run them through pyproject_hooks'
/// `_in_process.py`, uv from a `python -c` script.
fn runs_build_backend(args: &[String]) -> bool {
    const HOOKS: [&str; 3] = ["build_wheel", "build_editable", "build_sdist"];
    args.iter().any(|arg| arg.contains("_in_process.py"))
        || (args.get(1).is_some_and(|flag| flag == "-c")
            && args.get(2).is_some_and(|code| HOOKS.iter().any(|hook| code.contains(hook))))
}

/// The step of a gem's extension build that an exec is, by what RubyGems' builders run (its
/// `Gem::Ext` classes, which Bundler uses too): `ruby -I... -r ./siteconf....rb extconf.rb`
/// (an extension file matching /extconf/), `ruby mkrf_conf.rb`, rake, `sh ./configure`,
/// `cmake .`, then `make`. Only in a gem's directory (see [`gem_dir`]).
fn gem_build_step(executable: &str, args: &[String]) -> Option<&'static str> {
    let program = basename(executable);
    let words = || args.iter().skip(1).map(|arg| basename(arg));
    match program {
        "make" | "gmake" => Some("make"),
        "cmake" => Some("cmake"),
        "rake" => Some("rake"),
        _ if args.get(1).is_some_and(|arg| basename(arg) == "configure") => Some("configure"),
        // `ruby`, `ruby3.1`: Debian's `ruby` links to the versioned one, which RubyGems runs.
        _ if program.strip_prefix("ruby").is_some_and(|v| v.bytes().all(|b| b.is_ascii_digit() || b == b'.')) => {
            if words().any(|word| word.contains("extconf")) {
                Some("extconf")
            } else if words().any(|word| word.contains("mkrf_conf")) {
                Some("mkrf_conf")
            } else if words().any(|word| word == "rake") {
                Some("rake")
            } else {
                None
            }
        }
        _ => None,
    }
}

/// The gem (name, version) whose unpacked directory holds `path`, the innermost one:
/// `.../gems/<name>-<version>[-<platform>]/...`, where RubyGems and Bundler install gems and
/// run the builders in the extension's directory. A git source of Bundler is checked out in
/// `.../bundler/gems/<repository>-<revision>/...` (Bundler 2.3, seen with strace): named by
/// its repository (usually the gem's name; the gemspec inside is not in the events), no version.
fn gem_dir(path: &str) -> Option<(String, Option<String>)> {
    let parts: Vec<&str> = path.split('/').collect();
    (1..parts.len()).rev().filter(|&i| parts[i - 1] == "gems").find_map(|i| {
        if i >= 2 && parts[i - 2] == "bundler" {
            let (name, revision) = parts[i].rsplit_once('-')?;
            let hex = revision.len() >= 7 && revision.bytes().all(|b| b.is_ascii_hexdigit());
            return (!name.is_empty() && hex).then(|| (name.to_owned(), None));
        }
        gem_full_name(parts[i]).map(|(name, version)| (name, Some(version)))
    })
}

/// (name, version) of a gem's full name, `<name>-<version>` or `<name>-<version>-<platform>`
/// (`nokogiri-1.18.8-x86_64-linux`): the version is the last `-` word that starts with a digit.
/// A version holds no `-` (RubyGems writes `1.0-rc1` as `1.0.pre.rc1`), and no Linux platform
/// word starts with one; a name may (`net-http2`, `sass-3`).
fn gem_full_name(full: &str) -> Option<(String, String)> {
    let words: Vec<&str> = full.split('-').collect();
    let at = (1..words.len()).rev().find(|&i| {
        words[i].starts_with(|c: char| c.is_ascii_digit())
            && words[i].bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.')
    })?;
    let name = words[..at].join("-");
    (!name.is_empty()).then(|| (name, words[at].to_owned()))
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

/// The value of `-C key=value` (or `-Ckey=value`, `--codegen key=value`).
fn codegen_option<'a>(args: &'a [String], key: &str) -> Option<&'a str> {
    let prefix = format!("{key}=");
    args.iter().enumerate().find_map(|(i, arg)| {
        let option = match arg.as_str() {
            "-C" | "--codegen" => args.get(i + 1)?.as_str(),
            _ => arg.strip_prefix("-C").or_else(|| arg.strip_prefix("--codegen="))?,
        };
        option.strip_prefix(&prefix)
    })
}

fn proc_macro_externs(args: &[String], packages: Option<&ProcMacroPackages>) -> Vec<ProcMacro> {
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
                let (name, version) = match packages.and_then(|packages| packages.package(path)) {
                    Some((package, version)) => (package.clone(), version.clone()),
                    None => (name.to_owned(), None),
                };
                out.push(ProcMacro { name, version, path: path.to_owned() });
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

/// A Python project name as PEP 503 compares them: lowercase, runs of `-`, `_` and `.` as one `-`.
fn normalized(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// (name, version) of an sdist, wheel, npm tarball or gem file name.
fn archive_name_version(file: &str) -> Option<(String, String)> {
    if let Some(stem) = file.strip_suffix(".gem") {
        return gem_full_name(stem);
    }
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
        assert_eq!(for_manager(&args(&["install", "a-1.tar.gz", "b-2.tar.gz"])), Attribution::default());
        assert_eq!(pip_build_dir_name("/tmp/pip-install-x1y2/evil_0123abcd/src"), Some("evil".into()));
        assert_eq!(pip_build_dir_name("/tmp/pip-req-build-x1y2"), None);
        assert_eq!(
            build_script_crate("/w/target/debug/build/proc-macro1-0a1b2c3d4e5f6789/build-script-build"),
            Some("proc-macro1".into())
        );
        assert_eq!(build_script_crate("/w/target/debug/deps/foo-0a1b/build-script-build"), None);
        assert_eq!(build_script_crate("/usr/bin/build-script-build"), None);
    }

    #[test]
    fn names_gems_by_their_directory_and_file() {
        let named = |name: &str, version: Option<&str>| Some((name.to_owned(), version.map(str::to_owned)));
        assert_eq!(gem_dir("/tmp/i/gems/x-1.2.3/ext/x"), named("x", Some("1.2.3")));
        assert_eq!(gem_dir("/var/lib/gems/3.1.0/gems/net-http2-0.19.0"), named("net-http2", Some("0.19.0")));
        assert_eq!(
            gem_dir("/w/vendor/bundle/ruby/3.3.0/gems/ffi-1.17.0-x86_64-linux-gnu/ext/ffi_c"),
            named("ffi", Some("1.17.0"))
        );
        assert_eq!(gem_dir("/w/v/ruby/3.1.0/gems/pg-1.5.0.pre.rc1/ext"), named("pg", Some("1.5.0.pre.rc1")));
        // The innermost gem: a project that lives in a directory called gems.
        assert_eq!(gem_dir("/home/a/gems/app-2.0/vendor/bundle/ruby/3.1.0/gems/x-1.0/ext"), named("x", Some("1.0")));
        // A git source of Bundler: the repository's checkout at a revision, no version.
        assert_eq!(gem_dir("/w/v/ruby/3.1.0/bundler/gems/evil-0a1b2c3d4e5f/ext/evil"), named("evil", None));
        assert_eq!(gem_dir("/b/ruby/3.1.0/bundler/gems/gitrepo-1f193afbb4e2/ext/x"), named("gitrepo", None));
        assert_eq!(gem_dir("/w/v/ruby/3.1.0/bundler/gems/evil-main/ext"), None);
        assert_eq!(gem_dir("/home/a/gems/notes"), None);
        assert_eq!(gem_dir("/home/a/src/x-1.0/ext"), None);
        assert_eq!(gem_full_name("-1.0"), None);
        assert_eq!(archive_name_version("evil-gem-0.1.0.gem"), Some(("evil-gem".into(), "0.1.0".into())));
        assert_eq!(
            archive_name_version("nokogiri-1.18.8-x86_64-linux-gnu.gem"),
            Some(("nokogiri".into(), "1.18.8".into()))
        );
    }

    #[test]
    fn gem_build_steps_are_named_by_what_rubygems_runs() {
        let step = |executable: &str, words: &[&str]| gem_build_step(executable, &args(words));
        let extconf =
            ["/usr/bin/ruby3.1", "-I", "/usr/lib/ruby/vendor_ruby", "-r", "./siteconf20261202-1-x.rb", "extconf.rb"];
        assert_eq!(step("/usr/bin/ruby3.1", &extconf), Some("extconf"));
        assert_eq!(step("/usr/bin/make", &["make", "DESTDIR="]), Some("make"));
        assert_eq!(step("/bin/sh", &["sh", "./configure", "--prefix=/x"]), Some("configure"));
        assert_eq!(step("/usr/bin/cmake", &["cmake", ".", "-DCMAKE_INSTALL_PREFIX=/x"]), Some("cmake"));
        assert_eq!(step("/usr/bin/ruby", &["ruby", "mkrf_conf.rb"]), Some("mkrf_conf"));
        assert_eq!(step("/usr/bin/ruby", &["ruby", "-rrubygems", "/usr/bin/rake", "RUBYARCHDIR=/x"]), Some("rake"));
        assert_eq!(step("/usr/bin/ruby", &["ruby", "-e", "puts 1"]), None);
        assert_eq!(step("/usr/bin/rubocop", &["rubocop", "extconf.rb"]), None);
        assert_eq!(step("/bin/sh", &["sh", "-c", "cat ~/.ssh/id_rsa"]), None);

        // Inside the gem: named by its directory; what the step starts keeps the step.
        let dir = "/tmp/i/gems/evil-0.1.0/ext/evil";
        let exec = |words: &[&str], cwd: &str| Exec { args: args(words), cwd: cwd.into(), ..Exec::default() };
        let manager = for_manager(&args(&["install", "--local", "./evil-0.1.0.gem"]));
        let (attr, _) = for_exec(&manager, "/usr/bin/ruby3.1", &exec(&extconf, dir), None);
        let named = |attr: &Attribution| (attr.name.clone(), attr.version.clone(), attr.lifecycle.clone());
        let evil = |step: &str| (Some("evil".into()), Some("0.1.0".into()), Some(step.into()));
        assert_eq!(named(&attr), evil("extconf"));
        let (child, _) = for_exec(&attr, "/usr/bin/make", &exec(&["make"], dir), None);
        assert_eq!(named(&child), evil("extconf"));
        let (shell, _) = for_exec(&attr, "/bin/sh", &exec(&["sh", "-c", "cat id_rsa"], "/tmp"), None);
        assert_eq!(named(&shell), evil("extconf"));
        // RubyGems' own make, started by the manager.
        let (make, _) = for_exec(&manager, "/usr/bin/make", &exec(&["make", "DESTDIR="], dir), None);
        assert_eq!(named(&make), evil("make"));
        // The same step outside a gem's directory is anyone's build.
        let (elsewhere, _) = for_exec(&Attribution::default(), "/usr/bin/make", &exec(&["make"], "/home/a/src"), None);
        assert_eq!(elsewhere, Attribution::default());
        // `gem install` under an npm postinstall: the gem, not the npm package.
        let npm = Exec {
            env: [("npm_package_name", "outer"), ("npm_lifecycle_event", "postinstall")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into(),
            ..exec(&extconf, dir)
        };
        assert_eq!(named(&for_exec(&Attribution::default(), "/usr/bin/ruby3.1", &npm, None).0), evil("extconf"));
    }

    #[test]
    fn a_build_step_below_the_sdist_keeps_the_projects_own_name_and_version() {
        let sdist = "/tmp/pip-install-x1y2/pynacl_0123abcd";
        let backend = Exec {
            args: args(&["python3", "_in_process.py", "build_wheel"]),
            cwd: sdist.into(),
            project: Some(crate::event::Project {
                name: "PyNaCl".into(),
                version: Some("1.6.2".into()),
                source: "PKG-INFO".into(),
            }),
            ..Exec::default()
        };
        let (attr, _) = for_exec(&Attribution::default(), "/usr/bin/python3", &backend, None);
        let configure = Exec {
            args: args(&["sh", "./configure"]),
            cwd: format!("{sdist}/build/temp/libsodium"),
            ..Exec::default()
        };
        let (attr, _) = for_exec(&attr, "/bin/sh", &configure, None);
        assert_eq!((attr.name.as_deref(), attr.version.as_deref()), (Some("PyNaCl"), Some("1.6.2")));
        // Another project's build directory is another name.
        let other = Exec { args: args(&["sh"]), cwd: "/tmp/pip-install-x1y2/cffi_4567cdef".into(), ..Exec::default() };
        let (attr, _) = for_exec(&attr, "/bin/sh", &other, None);
        assert_eq!((attr.name.as_deref(), attr.version), (Some("cffi"), None));
    }

    #[test]
    fn remembers_proc_macro_packages_by_shared_object() {
        let env: BTreeMap<String, String> = [("CARGO_PKG_NAME", "derive-stamp"), ("CARGO_PKG_VERSION", "1.0.2")]
            .map(|(k, v)| (k.into(), v.into()))
            .into();
        let rustc = |words: &[&str]| args(words);
        let built = ProcMacroPackages::built_by(
            &rustc(&["rustc", "--crate-name", "derive_stamp", "--crate-type=proc-macro", "-Cextra-filename=-0a1b"]),
            &env,
        );
        assert_eq!(built, Some(("libderive_stamp-0a1b".into(), ("derive-stamp".into(), Some("1.0.2".into())))));
        assert_eq!(
            ProcMacroPackages::built_by(&rustc(&["rustc", "--crate-name", "lib", "--crate-type", "lib"]), &env),
            None
        );
        let mut packages = ProcMacroPackages::default();
        packages.insert(built.unwrap());
        let externs = proc_macro_externs(
            &rustc(&[
                "rustc",
                "--extern",
                "derive_stamp=/t/deps/libderive_stamp-0a1b.so",
                "--extern=other=/t/libother-9.so",
            ]),
            Some(&packages),
        );
        let names: Vec<(&str, Option<&str>)> =
            externs.iter().map(|m| (m.name.as_str(), m.version.as_deref())).collect();
        assert_eq!(names, [("derive-stamp", Some("1.0.2")), ("other", None)]);
        assert_eq!(
            codegen_option(&rustc(&["-C", "opt-level=3", "--codegen", "extra-filename=-x"]), "extra-filename"),
            Some("-x")
        );
    }
}
