//! The matrix: every kernel with and without `lsm=bpf`, each boot running `credwatch doctor`,
//! the sensor tests per backend and (where the CI budget allows) the guest test targets; a
//! table of kernel x lsm x backend x result in target/kernels/matrix.md.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{
    fetch::{self, Kernel},
    guest,
};

pub const BACKENDS: [&str; 2] = ["tracepoint", "fentry"];

/// The boot that also runs the guest test targets (real npm and cargo on both backends
/// compared, the LSM deny tests) unless `--full`: the kernel and boot the issue names. Measured
/// under TCG on 2 cores: a boot takes ~15 s, the sensor tests 3-5 min per backend (each test
/// verifies the whole sensor), the guest targets ~12 min more; CI's 60 minutes leave the
/// matrix about 25.
const GUEST_TESTS_ON: (&str, bool) = ("6.12", true);

/// Sensor tests that start the backends they check themselves (auto, then fentry and
/// tracepoint by name, whatever `CREDWATCH_E2E_SENSOR` says) and whose result `lsm=` does not
/// change (no LSM program loads without `--enforce`): unless `--full`, they run on one boot of
/// each kernel, the `lsm=bpf` one, not on both.
const ONE_BOOT_PER_KERNEL: [&str; 2] =
    ["auto_picks_fentry_where_it_loads_and_falls_back_to_tracepoints", "doctor_finds_what_this_kernel_offers"];

/// Sensor tests whose result the kernel's version cannot change once the programs load and
/// attach (which every other test checks on every kernel): a million opens overflowing the bulk
/// ring buffer while the key's record goes through the priority one, and an idle poll woken by
/// the first record (the BPF ring buffer and its wakeups behave the same from 5.8 on); and three
/// of userspace logic, the credential table following its directories by inotify, the seed of
/// trees already running (a walk of /proc), and the credential indexes kept through a reload and
/// an adoption (the pinned set's adoption itself runs on every boot). So are the counting tests
/// of issue 27, the slowest under TCG: 60,000 repeated opens, a flooded priority ring and a
/// MARKS map filled by 100 children (the programs that count are verified on every boot). Unless
/// `--full`, they run on [`GUEST_TESTS_ON`]'s kernel alone, once per backend.
const ONE_KERNEL_PER_BACKEND: [&str; 8] = [
    "a_flood_of_bulk_opens_does_not_push_out_the_key_record",
    "repeated_opens_of_one_file_are_counted_and_the_key_read_after_them_arrives",
    "a_flooded_priority_ring_is_a_blind_spot_naming_the_tree_and_the_lost_key_reads",
    "a_full_marks_map_is_a_blind_spot_of_the_tree_which_is_tainted",
    "an_idle_poll_sleeps_until_a_record_or_the_waker",
    "the_credential_table_follows_its_directories_by_inotify",
    "seed_marks_trees_that_were_already_running",
    "credential_indexes_survive_a_reload_and_an_adoption",
];

/// Each step's time limit in the guest (a hung test fails its step, not the whole matrix).
const STEP_TIMEOUT_SECS: u64 = 1200;

/// A test binary built on the host to run in the guests.
struct Binaries {
    sensor: PathBuf,
    /// guest_deny and guest_backends, the e2e crate's `guest` feature.
    guest: Vec<(String, PathBuf)>,
}

/// What one step of a boot gave.
struct Step {
    name: String,
    status: Option<i32>,
    secs: f64,
    /// How busy the guest's vCPUs were meanwhile (100: both all the time), from /proc/stat:
    /// whether the guests wait or compute says how many may share the host's cores.
    busy: Option<u32>,
    output: String,
}

struct Boot {
    kernel: Kernel,
    lsm: bool,
    steps: Vec<Step>,
    boot_secs: f64,
    total_secs: f64,
    /// The whole serial output, kept in target/kernels/logs.
    log: PathBuf,
}

/// The test executables of `cargo test --no-run` for these arguments, by target name.
fn test_binaries(args: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    let out = crate::cargo()
        .args(["test", "--no-run", "--message-format=json"])
        .args(args)
        .output()
        .context("running cargo test --no-run")?;
    if !out.status.success() {
        bail!("cargo test --no-run {} failed:\n{}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    let mut binaries = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let (Some(name), Some(path)) =
            (message.pointer("/target/name").and_then(|v| v.as_str()), message["executable"].as_str())
        else {
            continue;
        };
        binaries.push((name.to_owned(), PathBuf::from(path)));
    }
    Ok(binaries)
}

fn build_binaries() -> Result<Binaries> {
    let sensor = test_binaries(&["-p", "credwatch", "--test", "sensor"])?
        .into_iter()
        .find(|(name, _)| name == "sensor")
        .map(|(_, path)| path)
        .context("cargo built no `sensor` test binary")?;
    let guest = test_binaries(&[
        "-p",
        crate::E2E_CRATE,
        "--features",
        "guest",
        "--test",
        "guest_deny",
        "--test",
        "guest_backends",
    ])?;
    Ok(Binaries { sensor, guest })
}

/// The sensor tests a boot leaves out unless `full` (see [`ONE_BOOT_PER_KERNEL`] and
/// [`ONE_KERNEL_PER_BACKEND`]).
fn skipped(kernel: &str, lsm: bool, full: bool) -> Vec<&'static str> {
    let mut skip = Vec::new();
    if !full && !lsm {
        skip.extend(ONE_BOOT_PER_KERNEL);
    }
    if !full && kernel != GUEST_TESTS_ON.0 {
        skip.extend(ONE_KERNEL_PER_BACKEND);
    }
    skip
}

/// The shell script one boot runs: each step between markers the host parses. Unless `full`,
/// each backend's sensor tests run on one boot of each kernel, for CI's time: the tracepoint
/// backend's on the default-LSM boot (it loads no LSM program, so `lsm=` cannot change its
/// result), the fentry backend's on the `lsm=bpf` boot (where its LSM hooks load too); doctor
/// on both says what loads on each. The sensor tests named in `skip` are left out.
fn script(binaries: &Binaries, full: bool, guest_tests: bool, lsm: bool, skip: &[&str]) -> String {
    let workspace = crate::workspace();
    let rel = |p: &Path| p.strip_prefix(&workspace).unwrap_or(p).display().to_string();
    let mut s = String::from(
        "step() { name=$1; shift; echo \"@@step $name\"; t0=$(date +%s%N); \
         read -r _ u0 n0 s0 i0 w0 q0 sq0 _ < /proc/stat; \
         timeout @TIMEOUT@ \"$@\" 2>&1; rc=$?; \
         read -r _ u1 n1 s1 i1 w1 q1 sq1 _ < /proc/stat; \
         busy=$(( u1+n1+s1+q1+sq1 - u0-n0-s0-q0-sq0 )); idle=$(( i1+w1 - i0-w0 )); \
         printf '\\n@@done %s %s %s %s\\n' $name $rc $(( ($(date +%s%N) - t0) / 1000000 )) \
         $(( busy * 100 / (busy + idle + 1) )); }\n",
    )
    .replace("@TIMEOUT@", &STEP_TIMEOUT_SECS.to_string());
    s.push_str("step lsm cat /sys/kernel/security/lsm\n");
    s.push_str("step doctor target/release/credwatch doctor\n");
    for backend in BACKENDS.iter().filter(|b| full || (**b == "tracepoint") != lsm) {
        // --exact: each --skip names one test, not every test containing it.
        let skip: String = match skip {
            [] => String::new(),
            _ => skip.iter().map(|test| format!(" --skip {test}")).collect::<String>() + " --exact",
        };
        let _ = writeln!(
            s,
            "step sensor:{backend} env CREDWATCH_E2E_SENSOR={backend} {} --test-threads=1{skip}",
            rel(&binaries.sensor)
        );
    }
    if guest_tests {
        for (name, path) in &binaries.guest {
            // LSM deny needs bpf among the active LSMs; guest_backends runs both backends
            // itself, and is counted as the fentry backend's.
            if name == "guest_deny" && !lsm {
                continue;
            }
            let _ = writeln!(s, "step {name}:fentry env CREDWATCH_E2E_SENSOR=fentry {} --test-threads=1", rel(path));
        }
    }
    s
}

fn parse_steps(output: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut current: Option<Step> = None;
    for line in output.lines() {
        if let Some(name) = line.strip_prefix("@@step ") {
            current = Some(Step { name: name.to_owned(), status: None, secs: 0.0, busy: None, output: String::new() });
        } else if let Some(rest) = line.strip_prefix("@@done ") {
            let mut fields = rest.split_whitespace();
            if let (Some(mut step), Some(_name)) = (current.take(), fields.next()) {
                step.status = fields.next().and_then(|s| s.parse().ok());
                step.secs = fields.next().and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0) / 1000.0;
                step.busy = fields.next().and_then(|s| s.parse().ok());
                steps.push(step);
            }
        } else if let Some(step) = current.as_mut() {
            step.output.push_str(line);
            step.output.push('\n');
        }
    }
    // A step cut off by the guest's end (a crash, the timeout) has no status.
    steps.extend(current);
    steps
}

/// `17 passed; 0 failed` of libtest's summary lines, summed.
fn counts(output: &str) -> Option<(u32, u32)> {
    let mut found = None;
    for line in output.lines().filter_map(|l| l.strip_prefix("test result: ")) {
        let number = |word: &str| {
            line.split(';')
                .find_map(|part| part.trim().strip_suffix(word)?.split_whitespace().last()?.parse::<u32>().ok())
        };
        let (passed, failed) = found.unwrap_or((0, 0));
        found = Some((passed + number(" passed").unwrap_or(0), failed + number(" failed").unwrap_or(0)));
    }
    found
}

/// The first panic message of a failed test run, on one line.
fn first_failure(output: &str) -> String {
    let mut lines = output.lines();
    while let Some(line) = lines.next() {
        if line.contains("panicked at") {
            let message = lines.next().unwrap_or_default().trim();
            let message: String = message.chars().take(240).collect();
            return message.replace('|', "\\|");
        }
    }
    output.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output").chars().take(160).collect()
}

/// A doctor line's value (`fentry backend:   does not load: why`).
fn doctor_says<'a>(doctor: &'a str, prefix: &str) -> Option<&'a str> {
    doctor.lines().find_map(|l| l.strip_prefix(prefix)).map(str::trim)
}

/// One cell: (passed, text).
fn cell(boot: &Boot, backend: &str) -> (bool, String) {
    let doctor = boot.steps.iter().find(|s| s.name == "doctor");
    let doctor_text = doctor.map(|s| s.output.as_str()).unwrap_or_default();
    let mut parts = Vec::new();
    let mut ok = true;
    match doctor {
        Some(step) if step.status == Some(0) => parts.push("doctor ok".to_owned()),
        Some(step) => {
            ok = false;
            parts.push(format!("doctor failed: {}", first_failure(&step.output)));
        }
        None => {
            ok = false;
            parts.push("doctor did not run".into());
        }
    }
    let suffix = format!(":{backend}");
    if !boot.steps.iter().any(|s| s.name.ends_with(&suffix)) {
        parts.push(format!("tests on the {} boot", if boot.lsm { "default-LSM" } else { "lsm=bpf" }));
    }
    let mut failures = Vec::new();
    for step in boot.steps.iter().filter(|s| s.name.ends_with(&suffix)) {
        let name = step.name.trim_end_matches(&suffix);
        let tally = counts(&step.output).map(|(p, f)| format!(" {p}/{}", p + f)).unwrap_or_default();
        match step.status {
            Some(0) => parts.push(format!("{name}{tally} ({:.0}s)", step.secs)),
            Some(124) => failures.push(format!("{name}: timed out after {STEP_TIMEOUT_SECS}s")),
            _ => failures.push(format!("{name}{tally}: {}", first_failure(&step.output))),
        }
    }
    // A backend the kernel cannot load is a result, not a failure: doctor says why.
    if backend == "fentry" {
        if let Some(why) = doctor_says(doctor_text, "fentry backend:").and_then(|v| v.strip_prefix("does not load")) {
            return (true, format!("can't load{}", why.replace('|', "\\|")));
        }
    }
    if failures.is_empty() {
        return (ok, format!("{}: {}", if ok { "pass" } else { "FAIL" }, parts.join(", ")));
    }
    (false, format!("FAIL: {}; passed: {}", failures.join("; "), parts.join(", ")))
}

/// Whether a boot runs the guest test targets: all do with `--full`, else [`GUEST_TESTS_ON`].
fn guest_tests_on(kernel: &Kernel, lsm: bool, full: bool) -> bool {
    full || GUEST_TESTS_ON == (kernel.series.name, lsm)
}

fn boot_one(cache: &Path, kernel: &Kernel, lsm: bool, binaries: &Binaries, full: bool, logs: &Path) -> Result<Boot> {
    let guest_tests = guest_tests_on(kernel, lsm, full);
    let command = script(binaries, full, guest_tests, lsm, &skipped(kernel.series.name, lsm, full));
    println!(
        "kernels: {} {} ({}){}: {}",
        kernel.series.name,
        if lsm { "lsm=bpf" } else { "default LSMs" },
        kernel.release,
        if guest_tests { ", guest tests too" } else { "" },
        command.lines().skip(1).filter_map(|l| l.split_whitespace().nth(1)).collect::<Vec<_>>().join(" ")
    );
    let outcome = guest::run(
        cache,
        &guest::Run {
            kernel,
            lsm,
            command,
            env: Vec::new(),
            add: Vec::new(),
            timeout: Duration::from_secs(STEP_TIMEOUT_SECS * 6),
            echo: false,
            icount: false,
        },
    )?;
    let log = logs.join(format!("{}-{}.log", kernel.series.name, if lsm { "lsm" } else { "default" }));
    fs::write(&log, &outcome.output)?;
    let steps = parse_steps(&outcome.output);
    let label = format!("{} {}", kernel.series.name, if lsm { "lsm=bpf" } else { "default" });
    for step in &steps {
        println!(
            "kernels:   {label:<12} {:<28} {:>6.1}s {:>9}  {}",
            step.name,
            step.secs,
            step.busy.map(|busy| format!("{busy}% busy")).unwrap_or_default(),
            match step.status {
                Some(0) => "ok".to_owned(),
                Some(code) => format!("exit {code}"),
                None => "cut off".to_owned(),
            }
        );
    }
    Ok(Boot {
        kernel: kernel.clone(),
        lsm,
        steps,
        boot_secs: outcome.boot.as_secs_f64(),
        total_secs: outcome.total.as_secs_f64(),
        log,
    })
}

/// Boots at once: each guest keeps more than one of CI's two cores busy (its two vCPUs 57-69%
/// busy, its tests' time growing with the host's load: 5.10's tracepoint sensor tests took 225 s
/// in a CI-like run and 549 s at a load average of 10), so two fill them and a third would not
/// shorten the matrix.
const PARALLEL_BOOTS: usize = 2;

/// Runs `boot` on every job, [`PARALLEL_BOOTS`] at a time; the results in the jobs' order.
fn boot_all<J: Sync>(jobs: &[J], boot: impl Fn(&J) -> Result<Boot> + Sync) -> Result<Vec<Boot>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<Result<Boot>>>> = jobs.iter().map(|_| Default::default()).collect();
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL_BOOTS {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(job) = jobs.get(i) else { break };
                *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(boot(job));
            });
        }
    });
    results.into_iter().map(|r| r.into_inner().unwrap_or_else(|e| e.into_inner()).expect("every job ran")).collect()
}

/// Whether the matrix runs the sensor tests on the host: `cargo xtask test` ran them already
/// (its host unit tests, then the whole e2e suite), so that its matrix only says so.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Host {
    Test,
    TestedAlready,
}

/// The host's own kernel for the tracepoint backend: the sensor tests here (the full e2e suite
/// is `cargo xtask test`'s own step).
fn host_row(binaries: &Binaries, host: Host) -> Result<(bool, String, String)> {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned();
    if host == Host::TestedAlready {
        return Ok((
            true,
            release,
            "pass: the sensor tests and the whole e2e suite, `cargo xtask test`'s steps before".into(),
        ));
    }
    let start = Instant::now();
    let out = Command::new(&binaries.sensor)
        .arg("--test-threads=1")
        .env("CREDWATCH_E2E_SENSOR", "tracepoint")
        .current_dir(crate::workspace())
        .output()
        .context("running the sensor tests on the host")?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let tally = counts(&text).map(|(p, f)| format!(" {p}/{}", p + f)).unwrap_or_default();
    let secs = start.elapsed().as_secs_f64();
    if out.status.success() {
        Ok((true, release, format!("pass: sensor{tally} ({secs:.0}s); the full e2e suite is `cargo xtask test`'s")))
    } else {
        Ok((false, release, format!("FAIL: sensor{tally}: {}", first_failure(&text))))
    }
}

/// What the host's doctor says of the fentry backend (this host refuses fentry programs).
fn host_fentry() -> Result<String> {
    let out = Command::new(crate::workspace().join("target/release/credwatch"))
        .arg("doctor")
        .output()
        .context("running credwatch doctor on the host")?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(match doctor_says(&text, "fentry backend:") {
        Some(line) if line.starts_with("does not load") => format!("can't load{}", &line["does not load".len()..]),
        Some(line) => format!("doctor: {line} (not tested on the host)"),
        None => "doctor says nothing of it".into(),
    }
    .replace('|', "\\|"))
}

/// Runs the matrix; fails (showing the failing guests' output) when a cell fails.
pub fn matrix(only: Option<fetch::Series>, full: bool, host: Host) -> Result<()> {
    let start = Instant::now();
    let cache = super::cache();
    let out_dir = crate::workspace().join("target/kernels");
    let logs = out_dir.join("logs");
    fs::create_dir_all(&logs)?;
    let binaries = build_binaries()?;
    let mut kernels = Vec::new();
    for series in fetch::SERIES.into_iter().filter(|s| only.is_none_or(|o| o.name == s.name)) {
        kernels.push(super::kernel(series)?);
    }
    let mut jobs: Vec<(&Kernel, bool)> = kernels.iter().flat_map(|k| [(k, false), (k, true)]).collect();
    // The longest boot first, so that the other lane takes the short ones meanwhile.
    jobs.sort_by_key(|&(kernel, lsm)| !guest_tests_on(kernel, lsm, full));
    let mut boots = boot_all(&jobs, |&(kernel, lsm)| boot_one(&cache, kernel, lsm, &binaries, full, &logs))?;
    boots.sort_by_key(|boot| (fetch::SERIES.iter().position(|s| s.name == boot.kernel.series.name), boot.lsm));
    let (host_ok, host_release, host_text) = host_row(&binaries, host)?;
    let host_fentry = host_fentry()?;

    let mut table = String::from("| kernel | Debian package | boot | backend | result |\n|---|---|---|---|---|\n");
    let _ = writeln!(table, "| {host_release} (host) | - | host | tracepoint | {host_text} |");
    let _ = writeln!(table, "| {host_release} (host) | - | host | fentry | {host_fentry} |");
    let mut failed = Vec::new();
    for boot in &boots {
        let lsms = boot.steps.iter().find(|s| s.name == "lsm").map(|s| s.output.trim().to_owned()).unwrap_or_default();
        let bpf_active = lsms.split(',').any(|l| l == "bpf");
        for backend in BACKENDS {
            let (ok, text) = cell(boot, backend);
            let _ = writeln!(
                table,
                "| {} ({}) | {} {} | {}{} | {backend} | {text} |",
                boot.kernel.series.name,
                boot.kernel.release,
                boot.kernel.series.suite,
                boot.kernel.version,
                if boot.lsm { "lsm=bpf" } else { "default LSMs" },
                if bpf_active { " (bpf LSM active)" } else { " (bpf LSM not active)" },
            );
            if !ok {
                failed.push((boot, backend, text));
            }
        }
    }
    let mut report = String::from("# Kernel matrix\n\n");
    let _ = writeln!(
        report,
        "`cargo xtask kernels`: Debian's cloud kernels in qemu (TCG, 2 vCPUs, 4 GB), each booted with its \
         default LSMs and with `lsm={}`. Every boot runs `credwatch doctor` and the sensor tests \
         (agent/tests/sensor.rs) per backend; the guest tests (guest_backends, guest_deny) run on {}{}. \
         Logs: target/kernels/logs/.\n",
        guest::LSM_LIST,
        if full { "every boot" } else { GUEST_TESTS_ON.0 },
        if !full && GUEST_TESTS_ON.1 { " with lsm=bpf" } else { "" },
    );
    if !full {
        let _ = writeln!(
            report,
            "CI's cut (`--full` runs every sensor test on every boot): {} on the `lsm=bpf` boots alone, {} on {} \
             alone.\n",
            ONE_BOOT_PER_KERNEL.join(" and "),
            ONE_KERNEL_PER_BACKEND.join(" and "),
            GUEST_TESTS_ON.0
        );
    }
    report.push_str(&table);
    report.push_str("\n## Times\n\n| kernel | boot | to the command | total | steps |\n|---|---|---|---|---|\n");
    for boot in &boots {
        let steps: Vec<String> = boot
            .steps
            .iter()
            .map(|s| match s.busy {
                Some(busy) => format!("{} {:.0}s ({busy}% busy)", s.name, s.secs),
                None => format!("{} {:.0}s", s.name, s.secs),
            })
            .collect();
        let _ = writeln!(
            report,
            "| {} | {} | {:.1}s | {:.0}s | {} |",
            boot.kernel.series.name,
            if boot.lsm { "lsm=bpf" } else { "default" },
            boot.boot_secs,
            boot.total_secs,
            steps.join(", ")
        );
    }
    let _ = writeln!(report, "\nWhole matrix: {:.1} min.", start.elapsed().as_secs_f64() / 60.0);
    let path = out_dir.join("matrix.md");
    fs::write(&path, &report)?;
    println!("{report}\nkernels: written to {}", path.display());
    if !host_ok {
        bail!("the sensor tests failed on the host: {host_text}");
    }
    if !failed.is_empty() {
        for (boot, backend, _) in &failed {
            let suffix = format!(":{backend}");
            for step in
                boot.steps.iter().filter(|s| s.status != Some(0) && (s.name.ends_with(&suffix) || s.name == "doctor"))
            {
                eprintln!(
                    "===== {} {} {}: output =====\n{}",
                    boot.kernel.series.name,
                    if boot.lsm { "lsm=bpf" } else { "default LSMs" },
                    step.name,
                    step.output
                );
            }
            eprintln!("(the whole serial output: {})", boot.log.display());
        }
        bail!(
            "{} cell(s) of the kernel matrix failed: {}",
            failed.len(),
            failed
                .iter()
                .map(|(b, backend, text)| format!(
                    "{} {} {backend}: {text}",
                    b.kernel.series.name,
                    if b.lsm { "lsm=bpf" } else { "default" }
                ))
                .collect::<Vec<_>>()
                .join("\n  ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_cut_at_their_markers_with_status_and_time() {
        let output = "boot noise\n@@step doctor\nkernel release: 6.12\n@@done doctor 0 1500 37\n@@step sensor:tracepoint\nrunning 2 tests\n";
        let steps = parse_steps(output);
        assert_eq!(steps.len(), 2);
        assert_eq!((steps[0].name.as_str(), steps[0].status, steps[0].secs), ("doctor", Some(0), 1.5));
        assert_eq!(steps[0].busy, Some(37));
        assert_eq!(steps[0].output, "kernel release: 6.12\n");
        assert_eq!((steps[1].name.as_str(), steps[1].status), ("sensor:tracepoint", None));
    }

    fn steps_of(script: &str) -> Vec<&str> {
        script.lines().filter_map(|l| l.strip_prefix("step ")?.split_whitespace().next()).collect()
    }

    #[test]
    fn each_backend_runs_once_per_kernel_and_the_guest_tests_where_told() {
        let ws = crate::workspace();
        let binaries = Binaries {
            sensor: ws.join("target/debug/deps/sensor-1"),
            guest: ["guest_deny", "guest_backends"]
                .map(|n| (n.to_owned(), ws.join(format!("target/debug/deps/{n}-1"))))
                .into(),
        };
        let lsm_boot = script(&binaries, false, true, true, &[]);
        assert_eq!(
            steps_of(&lsm_boot),
            ["lsm", "doctor", "sensor:fentry", "guest_deny:fentry", "guest_backends:fentry"]
        );
        assert!(lsm_boot.contains("env CREDWATCH_E2E_SENSOR=fentry target/debug/deps/sensor-1 --test-threads=1\n"));
        let default_boot = script(&binaries, false, false, false, &["a", "b"]);
        assert_eq!(steps_of(&default_boot), ["lsm", "doctor", "sensor:tracepoint"]);
        assert!(default_boot.contains("sensor-1 --test-threads=1 --skip a --skip b --exact\n"));
        // --full: both backends on every boot; the deny tests need bpf among the active LSMs.
        assert_eq!(
            steps_of(&script(&binaries, true, true, false, &[])),
            ["lsm", "doctor", "sensor:tracepoint", "sensor:fentry", "guest_backends:fentry"]
        );
    }

    #[test]
    fn tests_are_left_out_by_backend_and_kernel_unless_full() {
        let one_kernel = ONE_KERNEL_PER_BACKEND;
        let [auto, doctor] = ONE_BOOT_PER_KERNEL;
        // The tests that pick their backends themselves run on the lsm=bpf boot alone...
        assert_eq!(skipped("6.12", false, false), [auto, doctor]);
        assert_eq!(skipped("6.12", true, false), [] as [&str; 0]);
        // ... and those the kernel's version cannot change on one kernel, once per backend.
        assert_eq!(skipped("5.10", false, false), [[auto, doctor].as_slice(), &one_kernel].concat());
        assert_eq!(skipped("sid", true, false), one_kernel);
        assert_eq!(skipped("5.10", false, true), [] as [&str; 0]);
    }

    #[test]
    fn the_tests_left_out_exist() {
        let sensor = fs::read_to_string(crate::workspace().join("agent/tests/sensor.rs")).unwrap();
        for test in ONE_BOOT_PER_KERNEL.iter().chain(&ONE_KERNEL_PER_BACKEND) {
            assert!(sensor.contains(&format!("#[test]\nfn {test}()")), "agent/tests/sensor.rs has no test {test}");
        }
    }

    #[test]
    fn libtest_summaries_are_summed() {
        let output = "test result: ok. 3 passed; 0 failed; 0 ignored\n\ntest result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.0s\n";
        assert_eq!(counts(output), Some((4, 2)));
        assert_eq!(counts("no tests here"), None);
    }

    #[test]
    fn the_first_panic_message_is_the_failure() {
        let output = "test a ... FAILED\nthread 'a' (197) panicked at agent/tests/sensor.rs:356:36:\ncalled `Result::unwrap()` on an `Err` value: EINVAL | x\nstack backtrace:\n";
        assert_eq!(first_failure(output), "called `Result::unwrap()` on an `Err` value: EINVAL \\| x");
    }
}
