//! `cargo xtask fuzz [--time SECS] [--jobs N] [TARGET...]`: the core's decoders of untrusted
//! input under libFuzzer (cargo-fuzz, `core/fuzz/`), one target after another (or N side by
//! side), each from its committed seeds. See docs/src/fuzzing.md.
//!
//! cargo-fuzz passes `-Z` flags (sanitizer, coverage): the machine's stable toolchain takes them
//! with `RUSTC_BOOTSTRAP=1` and ships the AddressSanitizer runtime, so no nightly is needed.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex, PoisonError,
    },
    thread,
    time::SystemTime,
};

use anyhow::{bail, Context, Result};

use crate::{cargo, run, workspace};

/// The targets in the order they run, each with the longest input worth trying: a kernel
/// record is at most a few KiB; text inputs get enough lines for processes to fork, exec and
/// open, without the fuzzer spending its time on megabytes.
pub const TARGETS: [(&str, usize); 9] = [
    ("record", 32 << 10),
    ("trace", 64 << 10),
    ("strace", 64 << 10),
    ("auditd", 64 << 10),
    ("tetragon", 64 << 10),
    ("tracee", 64 << 10),
    ("rules", 64 << 10),
    ("fleet", 64 << 10),
    // A request head: the proxy refuses more than 16 KiB.
    ("proxy", 32 << 10),
];

/// The cargo-fuzz release the targets are measured with (`cargo install --locked`).
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Seconds each target runs unless `--time` says otherwise.
const DEFAULT_SECS: u64 = 60;

pub fn fuzz(options: &[&str]) -> Result<()> {
    let mut secs = DEFAULT_SECS;
    // One at a time unless told: the machine is shared.
    let mut at_once = 1;
    let mut targets = Vec::new();
    let mut options = options.iter();
    while let Some(&option) = options.next() {
        match option {
            "--time" => {
                let value = options.next().context("--time needs a number of seconds")?;
                secs = value.parse().with_context(|| format!("--time {value:?}: not a number of seconds"))?;
            }
            "--jobs" => {
                let value = options.next().context("--jobs needs a number of targets")?;
                at_once = value.parse().with_context(|| format!("--jobs {value:?}: not a number of targets"))?;
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
    fuzz_targets(&targets, secs, at_once)
}

/// Builds the targets once, runs each for `secs`, `at_once` of them side by side, and fails
/// naming every crash's reproducer.
pub fn fuzz_targets(targets: &[&str], secs: u64, at_once: usize) -> Result<()> {
    ensure_cargo_fuzz()?;
    run("build the fuzz targets (cargo fuzz, AddressSanitizer)", fuzz_command().args(["build", "-a"]))?;
    let next = AtomicUsize::new(0);
    let crashes = Mutex::new(Vec::new());
    thread::scope(|scope| {
        for _ in 0..at_once.max(1) {
            scope.spawn(|| {
                while let Some(&target) = targets.get(next.fetch_add(1, Ordering::SeqCst)) {
                    let found = fuzz_one(target, secs, at_once > 1);
                    crashes.lock().unwrap_or_else(PoisonError::into_inner).extend(found);
                }
            });
        }
    });
    let mut crashes = crashes.into_inner().unwrap_or_else(PoisonError::into_inner);
    if !crashes.is_empty() {
        crashes.sort();
        bail!("the fuzzer found {} problem(s):\n  {}", crashes.len(), crashes.join("\n  "));
    }
    Ok(())
}

/// Fuzzes one target for `secs`; its problems, each naming its reproducer. `to_log`: the
/// fuzzer's output goes to target/fuzz/<target>.log (fuzzers side by side would interleave
/// theirs), and only its final stats, or its tail on failure, are printed.
fn fuzz_one(target: &str, secs: u64, to_log: bool) -> Vec<String> {
    let dir = fuzz_dir();
    let max_len = TARGETS.iter().find(|(t, _)| *t == target).map(|(_, len)| *len).expect("a known target");
    let corpus = dir.join("corpus").join(target);
    if let Err(error) = fs::create_dir_all(&corpus) {
        return vec![format!("{target}: creating {}: {error}", corpus.display())];
    }
    let artifacts = dir.join("artifacts").join(target);
    let before = files(&artifacts);
    let started = SystemTime::now();
    // The first directory gets what the fuzzer finds (ignored by git); the seeds stay as
    // committed. One process, one job.
    let mut command = fuzz_command();
    command
        .args(["run", "-a", target])
        .arg(&corpus)
        .arg(dir.join("seeds").join(target))
        .arg("--")
        .arg(format!("-max_total_time={secs}"))
        .arg(format!("-max_len={max_len}"))
        .args(["-rss_limit_mb=2048", "-timeout=10", "-print_final_stats=1"]);
    let log = workspace().join("target/fuzz").join(format!("{target}.log"));
    let outcome = if to_log {
        log_to(&mut command, &log).and_then(|()| run(&format!("fuzz {target} for {secs}s"), &mut command))
    } else {
        run(&format!("fuzz {target} for {secs}s"), &mut command)
    };
    if to_log {
        let text = fs::read_to_string(&log).unwrap_or_default();
        let shown: Vec<&str> = if outcome.is_ok() {
            text.lines().filter(|line| line.starts_with("stat::") || line.starts_with("Done ")).collect()
        } else {
            text.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect()
        };
        println!("xtask: fuzz {target} ({}):\n{}", log.display(), shown.join("\n"));
    }
    let Err(error) = outcome else { return Vec::new() };
    let found: Vec<PathBuf> = files(&artifacts)
        .into_iter()
        .filter(|path| {
            !before.contains(path) || fs::metadata(path).and_then(|m| m.modified()).is_ok_and(|time| time >= started)
        })
        .collect();
    if found.is_empty() {
        return vec![format!("{target}: {error:#}")];
    }
    found
        .into_iter()
        .map(|path| {
            format!(
                "{target}: reproducer {} (RUSTC_BOOTSTRAP=1 cargo fuzz run -a {target} {0} in core/fuzz)",
                path.display()
            )
        })
        .collect()
}

/// Sends the command's output to a new `log`.
fn log_to(command: &mut Command, log: &Path) -> Result<()> {
    if let Some(parent) = log.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let file = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let copy = file.try_clone().with_context(|| format!("opening {} twice", log.display()))?;
    command.stdout(copy).stderr(file);
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
