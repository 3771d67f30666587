//! `cargo xtask build`'s static agent (one file that runs on any x86_64 Linux with BTF, whatever
//! its glibc) and `cargo xtask package` (a `.deb` of it with the systemd unit and the default
//! configuration), and their checks in `cargo xtask test`: the static binary is static and
//! runs, and the `.deb` installs, runs, verifies and purges with the real dpkg.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context as _, Result};

use crate::{cargo, run, workspace};

/// The target of the static build: the gnu target with the C runtime linked in (`crt-static`).
/// Through an explicit `--target`, its flags leave the host's build scripts and proc-macros
/// alone.
const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where `build` leaves the binary.
pub fn static_binary() -> PathBuf {
    workspace().join("target").join(STATIC_TARGET).join("release/credwatch")
}

/// Where `package` leaves the `.deb`.
pub fn deb_file() -> PathBuf {
    workspace().join(format!("target/credwatch_{VERSION}_amd64.deb"))
}

/// The agent linked statically (the eBPF object must be built already: `crate::build` does it),
/// and a copy at target/release/credwatch, where the README and the tests run it: the one build
/// serves both (a second, dynamic, release build took CI 4.5 minutes more).
pub fn build_static() -> Result<()> {
    run(
        &format!("build the agent, statically linked ({})", static_binary().display()),
        cargo()
            .args(["build", "--release", "-p", "credwatch", "--target", STATIC_TARGET])
            .env("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS", "-C target-feature=+crt-static")
            // One fat-LTO unit: idle RSS of `watch` 41.0 -> 35.5 MB (binary pages 15.7 -> 14.5,
            // RssAnon 16.8 -> 12.1), VmHWM 67.2 -> 55.5 MB, file 31.0 -> 23.1 MB, for a cold
            // build of 404 s instead of 382 s on 2 cores. Here, not in the workspace's profile,
            // so that the eBPF object and xtask build as before.
            .env("CARGO_PROFILE_RELEASE_LTO", "fat")
            .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
            // agent/build.rs fails without the eBPF object, rather than embed an empty stand-in.
            .env("CREDWATCH_EBPF_REQUIRED", "1"),
    )?;
    let copy = workspace().join("target/release/credwatch");
    fs::create_dir_all(copy.parent().expect("a file in target/release"))?;
    // Removed first: a copy over a binary that runs fails (ETXTBSY).
    match fs::remove_file(&copy) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing the old {}", copy.display()))
        }
        _ => {}
    }
    fs::copy(static_binary(), &copy).with_context(|| format!("copying the agent to {}", copy.display()))?;
    Ok(())
}

fn output(what: &str, command: &mut Command) -> Result<String> {
    let output = command.output().with_context(|| format!("starting {what}"))?;
    if !output.status.success() {
        bail!("{what} failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The binary asks the dynamic loader for nothing (no interpreter, no shared library, hence no
/// glibc version), and runs: `--version` and `doctor`.
pub fn check_static(binary: &Path) -> Result<()> {
    let program_headers = output("readelf -l", Command::new("readelf").arg("-lW").arg(binary))?;
    ensure!(
        !program_headers.contains("INTERP"),
        "{} asks for a program interpreter: it is not statically linked",
        binary.display()
    );
    let dynamic = output("readelf -d", Command::new("readelf").arg("-dW").arg(binary))?;
    if let Some(needed) = dynamic.lines().find(|line| line.contains("(NEEDED)")) {
        bail!("{} needs a shared library: {}", binary.display(), needed.trim());
    }
    let version = output("credwatch --version", Command::new(binary).arg("--version"))?;
    ensure!(version.trim() == format!("credwatch {VERSION}"), "--version said {version:?}");
    let doctor = output("credwatch doctor", Command::new(binary).arg("doctor"))?;
    ensure!(doctor.contains("sensor:"), "doctor said nothing of the sensor: {doctor}");
    println!("xtask: {} is static (no interpreter, no shared library) and runs", binary.display());
    Ok(())
}

/// A file of the package: its path in the package, where its content comes from, and its mode.
struct Entry {
    path: &'static str,
    source: &'static str,
    mode: u32,
}

const FILES: [Entry; 6] = [
    Entry { path: "usr/bin/credwatch", source: "", mode: 0o755 },
    Entry { path: "lib/systemd/system/credwatch.service", source: "deploy/credwatch.service", mode: 0o644 },
    Entry { path: "etc/credwatch/credwatch.yaml", source: "deploy/credwatch.yaml", mode: 0o644 },
    // `credwatch notify` in every graphical session, or as a user unit where wanted.
    Entry {
        path: "etc/xdg/autostart/credwatch-notify.desktop",
        source: "deploy/credwatch-notify.desktop",
        mode: 0o644,
    },
    Entry {
        path: "usr/lib/systemd/user/credwatch-notify.service",
        source: "deploy/credwatch-notify.service",
        mode: 0o644,
    },
    Entry { path: "usr/share/doc/credwatch/README.md", source: "README.md", mode: 0o644 },
];

/// Empty folders the package owns: local rules, the spool, the alerts files.
const DIRS: [&str; 3] = ["etc/credwatch/rules.d", "var/lib/credwatch", "var/log/credwatch"];

/// Everything the package puts on the machine or its service makes there: gone after a purge.
const INSTALLED: [&str; 8] = [
    "/usr/bin/credwatch",
    "/lib/systemd/system/credwatch.service",
    "/etc/xdg/autostart/credwatch-notify.desktop",
    "/usr/lib/systemd/user/credwatch-notify.service",
    "/etc/credwatch",
    "/usr/share/doc/credwatch",
    "/var/lib/credwatch",
    "/var/log/credwatch",
];

const CONTROL: &str = "Package: credwatch
Version: @VERSION@
Architecture: amd64
Maintainer: credwatch maintainers <maintainers@users.noreply.a-seed-6b3c2df4.example>
Section: admin
Priority: optional
Installed-Size: @SIZE@
Description: alerts when package code touches credentials
 An eBPF agent that watches the process trees of package managers (npm, yarn,
 pnpm, bun, cargo, pip, uv) and alerts when package code (lifecycle scripts,
 build scripts, proc-macros) touches credentials. Static binary: it needs a
 kernel >= 5.8 with BTF, and no library.
";

/// Installing starts nothing: the unit is made known to systemd, not enabled or started, and the
/// group `credwatch` is made. An upgrade restarts a service that runs (it adopts its pinned
/// programs).
const POSTINST: &str = "#!/bin/sh
set -e
# Its members see every user's alerts on the local alerts socket (docs/src/usage.md: Past alerts).
if [ \"$1\" = configure ] && ! getent group credwatch >/dev/null; then
    groupadd --system credwatch
fi
if [ \"$1\" = configure ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
    if [ -n \"$2\" ]; then
        systemctl try-restart credwatch.service || true
    fi
fi
";

/// Removal stops the service and detaches the kernel programs it left pinned (a service stop
/// leaves them attached for the next start).
const PRERM: &str = "#!/bin/sh
set -e
if [ \"$1\" = remove ]; then
    if [ -d /run/systemd/system ]; then
        systemctl stop credwatch.service || true
    fi
    /usr/bin/credwatch stop --config /etc/credwatch/credwatch.yaml || true
fi
";

/// A purge removes what the service made (the spool, the alerts, an enabled unit's link) and the
/// group postinst made.
const POSTRM: &str = "#!/bin/sh
set -e
if [ \"$1\" = purge ]; then
    rm -rf /var/lib/credwatch /var/log/credwatch
    rm -f /etc/systemd/system/multi-user.target.wants/credwatch.service
    if getent group credwatch >/dev/null; then
        groupdel credwatch
    fi
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
fi
";

/// `cargo xtask package`: the `.deb` of the static binary ([`deb_file`]).
pub fn package() -> Result<PathBuf> {
    let root = workspace();
    let stage = root.join(format!("target/package/credwatch_{VERSION}_amd64"));
    if stage.exists() {
        fs::remove_dir_all(&stage).with_context(|| format!("removing {}", stage.display()))?;
    }
    let mut size = 0;
    for entry in &FILES {
        let from = if entry.source.is_empty() { static_binary() } else { root.join(entry.source) };
        let to = stage.join(entry.path);
        fs::create_dir_all(to.parent().expect("a file in a folder"))?;
        size += fs::copy(&from, &to).with_context(|| format!("copying {} into the package", from.display()))?;
        fs::set_permissions(&to, fs::Permissions::from_mode(entry.mode))?;
    }
    for dir in DIRS {
        fs::create_dir_all(stage.join(dir))?;
    }
    let debian = stage.join("DEBIAN");
    fs::create_dir_all(&debian)?;
    let control = CONTROL.replace("@VERSION@", VERSION).replace("@SIZE@", &size.div_ceil(1024).to_string());
    fs::write(debian.join("control"), control)?;
    fs::write(
        debian.join("conffiles"),
        "/etc/credwatch/credwatch.yaml\n/etc/xdg/autostart/credwatch-notify.desktop\n",
    )?;
    for (name, script) in [("postinst", POSTINST), ("prerm", PRERM), ("postrm", POSTRM)] {
        fs::write(debian.join(name), script)?;
        fs::set_permissions(debian.join(name), fs::Permissions::from_mode(0o755))?;
    }
    // Folders as dpkg expects them whatever the umask was.
    for dir in walk_dirs(&stage)? {
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
    }
    let deb = deb_file();
    run(
        &format!("build the package ({})", deb.display()),
        Command::new("dpkg-deb").args(["--root-owner-group", "-Zxz", "--build"]).arg(&stage).arg(&deb),
    )?;
    Ok(deb)
}

fn walk_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut dirs = vec![dir.to_path_buf()];
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            dirs.extend(walk_dirs(&entry.path())?);
        }
    }
    Ok(dirs)
}

/// Purges the package when dropped, whatever the test did: the machine is left as it was.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "credwatch"]).status();
    }
}

fn is_installed() -> Result<bool> {
    let status = Command::new("dpkg-query").args(["-W", "-f=${Status}", "credwatch"]).output()?;
    Ok(status.status.success() && !String::from_utf8_lossy(&status.stdout).contains("not-installed"))
}

/// What `credwatch watch` run from the build tree makes as the package's service would (the
/// local alert log, the spool, an alerts file): the README's two commands run `watch`, then the
/// tests. The package test sets them aside, since the purge removes them, and puts them back.
const MADE_BY_WATCH: [&str; 2] = ["/var/lib/credwatch", "/var/log/credwatch"];

/// Puts back what [`set_aside`] moved, when dropped: after the purge and its checks.
struct SetAside(Vec<(PathBuf, PathBuf)>);

impl Drop for SetAside {
    fn drop(&mut self) {
        for (original, aside) in &self.0 {
            if let Err(error) = fs::rename(aside, original) {
                eprintln!("xtask: putting {} back from {} failed: {error}", original.display(), aside.display());
            }
        }
    }
}

fn set_aside() -> Result<SetAside> {
    let mut moved = SetAside(Vec::new());
    for original in MADE_BY_WATCH.map(PathBuf::from).into_iter().filter(|path| path.exists()) {
        let aside = original.with_extension("set-aside-by-xtask");
        ensure!(!aside.exists(), "{} exists: put it back as {} or remove it", aside.display(), original.display());
        fs::rename(&original, &aside)
            .with_context(|| format!("setting {} aside as {}", original.display(), aside.display()))?;
        println!("xtask: {} set aside as {} while the package is tested", original.display(), aside.display());
        moved.0.push((original, aside));
    }
    Ok(moved)
}

/// `cargo xtask test` (root): the real dpkg installs the package, `/usr/bin/credwatch` runs,
/// systemd accepts the unit, nothing starts, and a purge leaves nothing behind. It refuses to
/// run over a credwatch it did not install.
pub fn test_package(deb: &Path) -> Result<()> {
    if !crate::is_root() {
        bail!("the package test installs the package with dpkg and needs root");
    }
    if is_installed()? {
        bail!("the package credwatch is installed already: the package test installs and purges it, so it leaves it alone (`dpkg --purge credwatch` first)");
    }
    let _set_aside = set_aside()?;
    if let Some(there) = INSTALLED.iter().find(|path| Path::new(path).exists()) {
        bail!("{there} exists and the package credwatch is not installed: the package test would overwrite or remove it, so it stops");
    }
    let installed = Installed;
    run("install the package (dpkg -i)", Command::new("dpkg").arg("-i").arg(deb))?;
    check_installed()?;
    drop(installed);
    ensure!(!is_installed()?, "dpkg --purge credwatch left the package installed");
    let left: Vec<&str> = INSTALLED.iter().copied().filter(|path| Path::new(path).exists()).collect();
    ensure!(left.is_empty(), "dpkg --purge credwatch left {}", left.join(", "));
    let group = Command::new("getent").args(["group", "credwatch"]).output().context("running getent")?;
    ensure!(!group.status.success(), "dpkg --purge credwatch left the group credwatch");
    println!("xtask: the package installs, runs, verifies and purges to nothing");
    Ok(())
}

fn check_installed() -> Result<()> {
    for path in INSTALLED {
        ensure!(Path::new(path).exists(), "the package did not install {path}");
    }
    ensure!(Path::new("/etc/credwatch/rules.d").is_dir(), "no /etc/credwatch/rules.d");
    check_static(Path::new("/usr/bin/credwatch"))?;
    let checked = output(
        "credwatch config check /etc/credwatch/credwatch.yaml",
        Command::new("/usr/bin/credwatch").args(["config", "check", "/etc/credwatch/credwatch.yaml"]),
    )?;
    ensure!(checked.contains("valid"), "config check said {checked:?}");
    let conffiles =
        output("dpkg-query conffiles", Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", "credwatch"]))?;
    for conffile in ["/etc/credwatch/credwatch.yaml", "/etc/xdg/autostart/credwatch-notify.desktop"] {
        ensure!(conffiles.contains(conffile), "{conffile} is not a conffile: {conffiles:?}");
    }
    verify_unit(Path::new("/lib/systemd/system/credwatch.service"))?;
    verify_user_unit(Path::new("/usr/lib/systemd/user/credwatch-notify.service"))?;
    check_autostart(Path::new("/etc/xdg/autostart/credwatch-notify.desktop"))?;
    ensure!(
        !Path::new("/etc/systemd/system/multi-user.target.wants/credwatch.service").exists(),
        "installing enabled the service"
    );
    // What the service would make: a purge removes it too.
    fs::create_dir_all("/var/lib/credwatch/spool/e2e")?;
    fs::write("/var/lib/credwatch/spool/e2e/segment", "spooled\n")?;
    fs::write("/var/log/credwatch/alerts.jsonl", "{}\n")?;
    Ok(())
}

/// `systemd-analyze verify UNIT` passes without a word on the unit (unknown keys are only
/// warnings, with status 0).
pub fn verify_unit(unit: &Path) -> Result<()> {
    verify(Command::new("systemd-analyze").arg("verify").arg(unit), unit)
}

/// [`verify_unit`] of a user unit: `systemd-analyze verify --user` needs a runtime directory,
/// which root outside a session has not (a throwaway one).
fn verify_user_unit(unit: &Path) -> Result<()> {
    let runtime = std::env::temp_dir().join(format!("credwatch-xtask-runtime-{}", std::process::id()));
    fs::create_dir_all(&runtime).with_context(|| format!("creating {}", runtime.display()))?;
    fs::set_permissions(&runtime, fs::Permissions::from_mode(0o700))?;
    let verified = verify(
        Command::new("systemd-analyze").args(["verify", "--user"]).arg(unit).env("XDG_RUNTIME_DIR", &runtime),
        unit,
    );
    let _ = fs::remove_dir_all(&runtime);
    verified
}

fn verify(command: &mut Command, unit: &Path) -> Result<()> {
    let verified = command.output().context("starting systemd-analyze")?;
    let stderr = String::from_utf8_lossy(&verified.stderr);
    let name = unit.file_name().expect("a unit file").to_string_lossy();
    let about: Vec<&str> = stderr.lines().filter(|line| line.contains(&*name)).collect();
    ensure!(
        verified.status.success() && about.is_empty(),
        "systemd-analyze verify {} ({}): {}",
        unit.display(),
        verified.status,
        stderr.trim()
    );
    println!("xtask: systemd-analyze verify {}: clean", unit.display());
    Ok(())
}

/// The autostart entry: `desktop-file-validate` says nothing when it is installed; either way its
/// `[Desktop Entry]` starts the installed `credwatch notify`.
fn check_autostart(entry: &Path) -> Result<()> {
    if let Ok(validated) = Command::new("desktop-file-validate").arg(entry).output() {
        let said =
            String::from_utf8_lossy(&validated.stdout).into_owned() + &String::from_utf8_lossy(&validated.stderr);
        ensure!(
            validated.status.success() && said.trim().is_empty(),
            "desktop-file-validate {} ({}): {}",
            entry.display(),
            validated.status,
            said.trim()
        );
        println!("xtask: desktop-file-validate {}: clean", entry.display());
    }
    let text = fs::read_to_string(entry).with_context(|| format!("reading {}", entry.display()))?;
    let keys = desktop_entry(&text).with_context(|| format!("{}", entry.display()))?;
    let key = |name: &str| keys.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str());
    ensure!(key("Type") == Some("Application"), "{}: Type is {:?}, not Application", entry.display(), key("Type"));
    ensure!(key("Name").is_some_and(|name| !name.is_empty()), "{}: no Name", entry.display());
    ensure!(key("Exec") == Some("/usr/bin/credwatch notify"), "{}: Exec is {:?}", entry.display(), key("Exec"));
    let ran = output("credwatch notify --help", Command::new("/usr/bin/credwatch").args(["notify", "--help"]))?;
    ensure!(ran.contains("--alerts-socket"), "credwatch notify --help said {ran:?}");
    println!("xtask: {}: a [Desktop Entry] that runs /usr/bin/credwatch notify", entry.display());
    Ok(())
}

/// The keys of a desktop file's `[Desktop Entry]` group, in order; an error names the line
/// that is no comment, group header or `key=value`, and a key given twice.
fn desktop_entry(text: &str) -> Result<Vec<(String, String)>> {
    let mut group = None;
    let mut keys: Vec<(String, String)> = Vec::new();
    for (number, line) in text.lines().enumerate().map(|(i, line)| (i + 1, line.trim())) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')) {
            group = Some(name.to_owned());
            continue;
        }
        let Some((key, value)) = line.split_once('=') else { bail!("line {number}: not key=value: {line:?}") };
        let Some(group) = &group else { bail!("line {number}: a key before any group") };
        if group == "Desktop Entry" {
            let key = key.trim().to_owned();
            ensure!(!keys.iter().any(|(k, _)| *k == key), "line {number}: {key} given twice");
            keys.push((key, value.trim().to_owned()));
        }
    }
    ensure!(group.is_some(), "no [Desktop Entry] group");
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_autostart_entry_parses_and_bad_lines_are_named() {
        let text = fs::read_to_string(workspace().join("deploy/credwatch-notify.desktop")).unwrap();
        let keys = desktop_entry(&text).unwrap();
        assert!(keys.contains(&("Exec".into(), "/usr/bin/credwatch notify".into())), "{keys:?}");
        let error = desktop_entry("[Desktop Entry]\nType=Application\nnonsense\n").unwrap_err().to_string();
        assert_eq!(error, "line 3: not key=value: \"nonsense\"");
        let error = desktop_entry("[Desktop Entry]\nName=a\nName=b\n").unwrap_err().to_string();
        assert_eq!(error, "line 3: Name given twice");
    }
}
