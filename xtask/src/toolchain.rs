//! The eBPF toolchain: which route is present, what is missing, and how to set it up.
//!
//! Route A is Debian's: rustc-web (>= 1.96) ships a prebuilt `core` for bpfel-unknown-none, so no
//! nightly and no build-std; bpf-linker must link the same LLVM major (22) that Debian ships.
//! Route B is rustup's nightly with rust-src (`-Z build-std=core`) and any working bpf-linker.

use std::{
    env, fmt, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

/// The LLVM major that Debian's rustc-web and bpf-linker's `llvm-22` feature agree on.
const LLVM_MAJOR: u32 = 22;
/// The oldest Debian rustc that builds the kernel programs with the pinned aya-ebpf.
const MIN_DEBIAN_RUSTC: (u32, u32) = (1, 96);
const APT_PACKAGES: &[&str] = &["rustc-web", "libstd-rust-web-dev-bpf", "llvm-22-dev"];

/// Where route A's pieces live. Tests point `root` at a scratch directory.
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn system() -> Self {
        Layout { root: PathBuf::from("/") }
    }
    fn path(&self, absolute: &str) -> PathBuf {
        self.root.join(absolute.trim_start_matches('/'))
    }
    pub fn debian_rustc(&self) -> PathBuf {
        self.path("/usr/bin/rustc")
    }
    pub fn llvm_bin(&self) -> PathBuf {
        self.path(&format!("/usr/lib/llvm-{LLVM_MAJOR}/bin"))
    }
    fn bpf_core_dir(&self) -> PathBuf {
        self.path("/usr/lib/rustlib/bpfel-unknown-none/lib")
    }
    fn llvm_dev_lib(&self) -> PathBuf {
        self.path(&format!("/usr/lib/llvm-{LLVM_MAJOR}/lib/libLLVM.so"))
    }
}

/// A piece of route A that is absent or unusable, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    DebianRustc(String),
    BpfCore,
    Llvm,
    BpfLinker(String),
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Missing::DebianRustc(why) => write!(f, "Debian rustc >= 1.96 (package rustc-web): {why}"),
            Missing::BpfCore => {
                write!(f, "prebuilt core for bpfel-unknown-none (package libstd-rust-web-dev-bpf): no libcore-*.rlib")
            }
            Missing::Llvm => {
                write!(f, "LLVM {LLVM_MAJOR} (package llvm-{LLVM_MAJOR}-dev): no libLLVM.so or llvm-config")
            }
            Missing::BpfLinker(why) => write!(f, "bpf-linker built against LLVM {LLVM_MAJOR}: {why}"),
        }
    }
}

/// What `cargo xtask build` compiles the kernel programs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Debian { rustc: PathBuf, llvm_bin: PathBuf },
    Nightly,
}

/// The llvm-objcopy that strips the object's DWARF (GNU objcopy does not know BPF objects):
/// LLVM 22's on the Debian route, any on PATH on the nightly one.
pub fn objcopy(route: &Route) -> Result<PathBuf> {
    match route {
        Route::Debian { llvm_bin, .. } => Ok(llvm_bin.join("llvm-objcopy")),
        Route::Nightly => find_in_path("llvm-objcopy").context(NIGHTLY_OBJCOPY),
    }
}

const NIGHTLY_OBJCOPY: &str = "llvm-objcopy on PATH (package llvm, any version)";

/// The state of both routes on this machine.
pub struct Survey {
    pub debian_missing: Vec<Missing>,
    pub debian_summary: String,
    pub nightly_missing: Vec<String>,
}

/// A set-up step, printed before it runs (and only printed with `--dry-run`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub program: String,
    pub args: Vec<String>,
    /// Directory put in front of PATH (llvm-config must be found by llvm-sys).
    pub path_prefix: Option<PathBuf>,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(prefix) = &self.path_prefix {
            write!(f, "PATH={}:$PATH ", prefix.display())?;
        }
        write!(f, "{} {}", self.program, self.args.join(" "))
    }
}

/// What to do about the toolchain.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    Ready(Route),
    SetUp(Vec<Step>),
    Impossible(String),
}

pub fn survey(layout: &Layout) -> Survey {
    let mut debian_missing = Vec::new();
    let mut parts = Vec::new();

    match debian_rustc_version(&layout.debian_rustc()) {
        Ok(version) => parts.push(format!("rustc {version}")),
        Err(why) => debian_missing.push(Missing::DebianRustc(why)),
    }
    if has_core_rlib(&layout.bpf_core_dir()) {
        parts.push("bpfel core".into());
    } else {
        debian_missing.push(Missing::BpfCore);
    }
    if layout.llvm_dev_lib().exists() && layout.llvm_bin().join("llvm-config").exists() {
        parts.push(format!("LLVM {LLVM_MAJOR}"));
    } else {
        debian_missing.push(Missing::Llvm);
    }
    match bpf_linker_llvm() {
        Ok(summary) => parts.push(summary),
        Err(why) => debian_missing.push(Missing::BpfLinker(why)),
    }

    // Route B is only looked at when route A is incomplete.
    let nightly_missing = if debian_missing.is_empty() { Vec::new() } else { nightly_missing() };
    Survey { debian_missing, debian_summary: parts.join(", "), nightly_missing }
}

/// Decides from the survey, whether we may install (root with apt-get), what to do.
pub fn plan(layout: &Layout, survey: &Survey, can_install: bool) -> Plan {
    if survey.debian_missing.is_empty() {
        return Plan::Ready(Route::Debian { rustc: layout.debian_rustc(), llvm_bin: layout.llvm_bin() });
    }
    if survey.nightly_missing.is_empty() {
        return Plan::Ready(Route::Nightly);
    }
    if !can_install {
        let mut message = String::from("the eBPF toolchain is incomplete and this is not root with apt-get, so it cannot be set up here.\nMissing for the Debian route:\n");
        for missing in &survey.debian_missing {
            message.push_str(&format!("  - {missing}\n"));
        }
        let apt = if needs_apt(&survey.debian_missing) {
            format!("apt-get install -y {} && ", APT_PACKAGES.join(" "))
        } else {
            String::new()
        };
        message.push_str(&format!(
            "  get them as root: {apt}PATH=/usr/lib/llvm-{LLVM_MAJOR}/bin:$PATH cargo install --force bpf-linker --no-default-features --features llvm-{LLVM_MAJOR}\n"
        ));
        message.push_str("Missing for the rustup nightly route:\n");
        for missing in &survey.nightly_missing {
            message.push_str(&format!("  - {missing}\n"));
        }
        message
            .push_str("  get them: rustup toolchain install nightly --component rust-src && cargo install bpf-linker");
        return Plan::Impossible(message);
    }

    let mut steps = Vec::new();
    if needs_apt(&survey.debian_missing) {
        steps.push(Step { program: "apt-get".into(), args: vec!["update".into()], path_prefix: None });
        let mut args = vec!["install".to_owned(), "-y".to_owned()];
        args.extend(APT_PACKAGES.iter().map(|p| p.to_string()));
        steps.push(Step { program: "apt-get".into(), args, path_prefix: None });
    }
    // A new LLVM invalidates an old bpf-linker too, so it is rebuilt whenever anything changed.
    steps.push(Step {
        program: "cargo".into(),
        args: ["install", "--force", "bpf-linker", "--no-default-features", "--features"]
            .iter()
            .map(|s| s.to_string())
            .chain([format!("llvm-{LLVM_MAJOR}")])
            .collect(),
        path_prefix: Some(layout.llvm_bin()),
    });
    Plan::SetUp(steps)
}

/// Everything but bpf-linker comes from Debian's packages.
fn needs_apt(missing: &[Missing]) -> bool {
    missing.iter().any(|m| !matches!(m, Missing::BpfLinker(_)))
}

/// Makes sure a route is ready, setting up route A when allowed; prints what it finds and does.
pub fn ensure(dry_run: bool) -> Result<Option<Route>> {
    let layout = Layout::system();
    let survey = survey(&layout);
    match plan(&layout, &survey, can_install()) {
        Plan::Ready(route) => {
            match &route {
                Route::Debian { .. } => println!("toolchain: Debian route ready ({})", survey.debian_summary),
                Route::Nightly => println!("toolchain: rustup nightly route ready (nightly with rust-src, bpf-linker)"),
            }
            Ok(Some(route))
        }
        Plan::Impossible(message) => bail!(message),
        Plan::SetUp(steps) => {
            println!("toolchain: setting up the Debian route; missing:");
            for missing in &survey.debian_missing {
                println!("  - {missing}");
            }
            for step in &steps {
                println!("toolchain: {}{step}", if dry_run { "would run: " } else { "running: " });
                if !dry_run {
                    run_step(step)?;
                }
            }
            if dry_run {
                return Ok(None);
            }
            let after = self::survey(&layout);
            match plan(&layout, &after, false) {
                Plan::Ready(route @ Route::Debian { .. }) => {
                    println!("toolchain: Debian route ready ({})", after.debian_summary);
                    Ok(Some(route))
                }
                _ => bail!(
                    "the set-up ran but the Debian route is still incomplete: {}",
                    after.debian_missing.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
                ),
            }
        }
    }
}

fn run_step(step: &Step) -> Result<()> {
    let mut command = Command::new(&step.program);
    command.args(&step.args);
    if step.program == "apt-get" {
        command.env("DEBIAN_FRONTEND", "noninteractive");
    }
    if let Some(prefix) = &step.path_prefix {
        command.env("PATH", prefixed_path(prefix));
    }
    let status = command.status().with_context(|| format!("starting `{step}`"))?;
    if !status.success() {
        bail!("`{step}` failed ({status})");
    }
    Ok(())
}

/// PATH with `dir` first.
pub fn prefixed_path(dir: &Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_path_buf()];
    paths.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
    env::join_paths(paths).expect("PATH entries came from PATH")
}

/// Root can install; so can nobody else, and a machine without apt-get cannot take route A.
fn can_install() -> bool {
    crate::is_root() && find_in_path("apt-get").is_some()
}

fn debian_rustc_version(rustc: &Path) -> Result<String, String> {
    if !rustc.exists() {
        return Err(format!("{} not found", rustc.display()));
    }
    let output = Command::new(rustc).arg("--version").output().map_err(|e| format!("{}: {e}", rustc.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    // `rustc 1.96.0 (ac68faa20 2026-05-25) (built from a source tarball)`
    let version = text.split_whitespace().nth(1).unwrap_or_default().to_owned();
    let mut numbers = version.split('.').map(|n| n.parse::<u32>().unwrap_or(0));
    let found = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    if found < MIN_DEBIAN_RUSTC {
        return Err(format!("{} is `{}`", rustc.display(), text.trim()));
    }
    Ok(version)
}

fn has_core_rlib(dir: &Path) -> bool {
    fs::read_dir(dir).into_iter().flatten().flatten().any(|entry| {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        name.starts_with("libcore-") && name.ends_with(".rlib")
    })
}

/// bpf-linker's version and the LLVM it loads, or why it will not do for route A.
fn bpf_linker_llvm() -> Result<String, String> {
    let linker = find_in_path("bpf-linker").ok_or("not on PATH")?;
    let version = Command::new(&linker).arg("--version").output().map_err(|e| format!("{}: {e}", linker.display()))?;
    if !version.status.success() {
        return Err(format!(
            "`{} --version` failed (a stale build whose LLVM is gone?): {}",
            linker.display(),
            String::from_utf8_lossy(&version.stderr).trim()
        ));
    }
    // `--version` does not name the LLVM, but the dynamic loader does.
    let ldd = Command::new("ldd").arg(&linker).output().map_err(|e| format!("ldd: {e}"))?;
    let libs = String::from_utf8_lossy(&ldd.stdout);
    let llvm = libs
        .lines()
        .find(|line| line.contains("libLLVM"))
        .map(str::trim)
        .ok_or_else(|| format!("{} does not load a shared libLLVM, so its LLVM is unknown", linker.display()))?;
    let wanted = format!("libLLVM.so.{LLVM_MAJOR}");
    if !llvm.starts_with(&wanted) || llvm.contains("not found") {
        return Err(format!("{} loads `{llvm}`, not {wanted}", linker.display()));
    }
    Ok(format!("{} on {wanted}", String::from_utf8_lossy(&version.stdout).trim()))
}

fn nightly_missing() -> Vec<String> {
    if find_in_path("rustup").is_none() {
        return vec!["rustup".into()];
    }
    let mut missing = Vec::new();
    let sysroot = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    match sysroot {
        None => missing.push("a nightly toolchain (rustup toolchain install nightly)".into()),
        Some(sysroot) if !sysroot.join("lib/rustlib/src/rust/library/core").is_dir() => {
            missing.push("nightly's rust-src component (rustup component add rust-src --toolchain nightly)".into())
        }
        Some(_) => {}
    }
    let linker_runs = find_in_path("bpf-linker")
        .and_then(|l| Command::new(l).arg("--version").output().ok())
        .is_some_and(|o| o.status.success());
    if !linker_runs {
        missing.push("a working bpf-linker on PATH (cargo install bpf-linker)".into());
    }
    if find_in_path("llvm-objcopy").is_none() {
        missing.push(NIGHTLY_OBJCOPY.into());
    }
    missing
}

pub fn find_in_path(program: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?).map(|dir| dir.join(program)).find(|path| path.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_survey(layout: &Layout) -> Survey {
        Survey {
            debian_missing: vec![
                Missing::DebianRustc(format!("{} not found", layout.debian_rustc().display())),
                Missing::BpfCore,
                Missing::Llvm,
                Missing::BpfLinker("not on PATH".into()),
            ],
            debian_summary: String::new(),
            nightly_missing: vec!["rustup".into()],
        }
    }

    #[test]
    fn an_empty_root_lacks_every_debian_piece() {
        let scratch = env::temp_dir().join(format!("xtask-empty-{}", std::process::id()));
        fs::create_dir_all(&scratch).unwrap();
        let layout = Layout { root: scratch.clone() };
        let survey = survey(&layout);
        // bpf-linker comes from PATH, not from the layout, so only the first three are certain.
        assert_eq!(&survey.debian_missing[..3], &empty_survey(&layout).debian_missing[..3]);
        fs::remove_dir_all(scratch).unwrap();
    }

    #[test]
    fn the_core_rlib_is_recognised_by_name() {
        let scratch = env::temp_dir().join(format!("xtask-core-{}", std::process::id()));
        let layout = Layout { root: scratch.clone() };
        fs::create_dir_all(layout.bpf_core_dir()).unwrap();
        assert!(!has_core_rlib(&layout.bpf_core_dir()));
        fs::write(layout.bpf_core_dir().join("libcore-8056e5e5b270ef4d.rlib"), b"").unwrap();
        assert!(has_core_rlib(&layout.bpf_core_dir()));
        fs::remove_dir_all(scratch).unwrap();
    }

    #[test]
    fn nothing_present_as_root_installs_packages_then_bpf_linker() {
        let layout = Layout { root: PathBuf::from("/nonexistent") };
        let Plan::SetUp(steps) = plan(&layout, &empty_survey(&layout), true) else { panic!("expected a set-up") };
        let shown: Vec<String> = steps.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "apt-get update",
                "apt-get install -y rustc-web libstd-rust-web-dev-bpf llvm-22-dev",
                "PATH=/nonexistent/usr/lib/llvm-22/bin:$PATH cargo install --force bpf-linker --no-default-features --features llvm-22",
            ]
        );
    }

    #[test]
    fn a_stale_bpf_linker_alone_is_rebuilt_without_apt() {
        let layout = Layout::system();
        let survey = Survey {
            debian_missing: vec![Missing::BpfLinker("loads `libLLVM.so.21.1`".into())],
            debian_summary: String::new(),
            nightly_missing: vec!["rustup".into()],
        };
        let Plan::SetUp(steps) = plan(&layout, &survey, true) else { panic!("expected a set-up") };
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].program, "cargo");
    }

    #[test]
    fn without_root_the_message_names_every_missing_piece() {
        let layout = Layout { root: PathBuf::from("/nonexistent") };
        let Plan::Impossible(message) = plan(&layout, &empty_survey(&layout), false) else {
            panic!("expected an error")
        };
        for piece in ["rustc-web", "libstd-rust-web-dev-bpf", "llvm-22-dev", "bpf-linker", "rustup", "rust-src"] {
            assert!(message.contains(piece), "{piece} not named in:\n{message}");
        }
    }

    #[test]
    fn a_complete_route_wins_over_setting_up() {
        let layout = Layout::system();
        let mut survey = empty_survey(&layout);
        survey.nightly_missing.clear();
        assert_eq!(plan(&layout, &survey, true), Plan::Ready(Route::Nightly));
        survey.debian_missing.clear();
        assert!(matches!(plan(&layout, &survey, true), Plan::Ready(Route::Debian { .. })));
    }
}
