//! `cargo xtask fuzz [--time SECS] [TARGET...]`: the core's decoders of untrusted input under
//! libFuzzer (cargo-fuzz, `core/fuzz/`), one target after another, each from its committed
//! seeds. See docs/fuzzing.md.
//!
//! cargo-fuzz passes `-Z` flags (sanitizer, coverage): the machine's stable toolchain takes them
//! with `RUSTC_BOOTSTRAP=1` and ships the AddressSanitizer runtime, so no nightly is needed.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::SystemTime,
};

use anyhow::{bail, Context, Result};

use crate::{cargo, run, workspace};

/// The targets in the order they run, each with the longest input worth trying: a kernel
/// record is at most a few KiB; text inputs get enough lines for processes to fork, exec and
/// open, without the fuzzer spending its time on megabytes.
pub const TARGETS: [(&str, usize); 8] = [
    ("record", 32 << 10),
    ("trace", 64 << 10),
    ("strace", 64 << 10),
    ("auditd", 64 << 10),
    ("tetragon", 64 << 10),
    ("tracee", 64 << 10),
    ("rules", 64 << 10),
    ("fleet", 64 << 10),
];

/// The cargo-fuzz release the targets are measured with (`cargo install --locked`).
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Seconds each target runs unless `--time` says otherwise.
const DEFAULT_SECS: u64 = 60;

pub fn fuzz(options: &[&str]) -> Result<()> {
    let mut secs = DEFAULT_SECS;
    let mut targets = Vec::new();
    let mut options = options.iter();
    while let Some(&option) = options.next() {
        match option {
            "--time" => {
                let value = options.next().context("--time needs a number of seconds")?;
                secs = value.parse().with_context(|| format!("--time {value:?}: not a number of seconds"))?;
            }
            name => match TARGETS.iter().find(|(target, _)| *target == name) {
                Some(&(target, _)) => targets.push(target),
                None => bail!(
                    "unknown fuzz target {name:?} (targets: {})",
                    TARGETS.iter().map(|(t, _)| *t).collect::<Vec<_>>().join(", ")
                ),
            },
        }
    }
    if targets.is_empty() {
        targets = TARGETS.iter().map(|(target, _)| *target).collect();
    }
    fuzz_targets(&targets, secs)
}

/// Builds the targets once, runs each for `secs`, and fails naming every crash's reproducer.
pub fn fuzz_targets(targets: &[&str], secs: u64) -> Result<()> {
    ensure_cargo_fuzz()?;
    let dir = fuzz_dir();
    run("build the fuzz targets (cargo fuzz, AddressSanitizer)", fuzz_command().args(["build", "-a"]))?;
    let mut crashes = Vec::new();
    for &target in targets {
        let max_len = TARGETS.iter().find(|(t, _)| *t == target).map(|(_, len)| *len).expect("a known target");
        let corpus = dir.join("corpus").join(target);
        fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
        let artifacts = dir.join("artifacts").join(target);
        let before = files(&artifacts);
        let started = SystemTime::now();
        // The first directory gets what the fuzzer finds (ignored by git); the seeds stay as
        // committed. One process, one job: the machine is shared.
        let outcome = run(
            &format!("fuzz {target} for {secs}s"),
            fuzz_command()
                .args(["run", "-a", target])
                .arg(&corpus)
                .arg(dir.join("seeds").join(target))
                .arg("--")
                .arg(format!("-max_total_time={secs}"))
                .arg(format!("-max_len={max_len}"))
                .args(["-rss_limit_mb=2048", "-timeout=10", "-print_final_stats=1"]),
        );
        if let Err(error) = outcome {
            let found: Vec<PathBuf> = files(&artifacts)
                .into_iter()
                .filter(|path| {
                    !before.contains(path)
                        || fs::metadata(path).and_then(|m| m.modified()).is_ok_and(|time| time >= started)
                })
                .collect();
            if found.is_empty() {
                crashes.push(format!("{target}: {error:#}"));
            }
            for path in found {
                crashes.push(format!(
                    "{target}: reproducer {} (RUSTC_BOOTSTRAP=1 cargo fuzz run -a {target} {0} in core/fuzz)",
                    path.display()
                ));
            }
        }
    }
    if !crashes.is_empty() {
        bail!("the fuzzer found {} problem(s):\n  {}", crashes.len(), crashes.join("\n  "));
    }
    Ok(())
}

fn fuzz_dir() -> PathBuf {
    workspace().join("core").join("fuzz")
}

/// `cargo fuzz` with the machine's stable toolchain accepting cargo-fuzz's `-Z` flags.
fn fuzz_command() -> Command {
    let mut command = cargo();
    command.current_dir(fuzz_dir()).arg("fuzz").env("RUSTC_BOOTSTRAP", "1").env_remove("RUSTC");
    command
}

fn ensure_cargo_fuzz() -> Result<()> {
    let present = cargo().args(["fuzz", "--version"]).output().is_ok_and(|output| output.status.success());
    if present {
        return Ok(());
    }
    run(
        &format!("install cargo-fuzz {CARGO_FUZZ_VERSION} from crates.io"),
        cargo().args(["install", "cargo-fuzz", "--locked", "--version", CARGO_FUZZ_VERSION]),
    )
}

/// The files in `dir` (none when it does not exist yet).
fn files(dir: &Path) -> BTreeSet<PathBuf> {
    fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|entry| entry.path()).filter(|path| path.is_file()).collect())
        .unwrap_or_default()
}
