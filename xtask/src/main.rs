//! `cargo xtask <command>`: credwatch's build, test, bench and release tasks (USAGE below lists
//! the commands). This file: the commands' dispatch, `build`, and `test`'s flow (CI's and
//! `--quick`'s, with the prerequisites it installs).
//!
//! Modules, by command:
//! - `toolchain`: the eBPF toolchain, found or set up (`build` starts there);
//! - `package`: the static agent `build` links, and its `.deb` (`package`);
//! - `image`: the container image FROM scratch (`image`);
//! - `nspawn`: the Debian root the real-systemd test boots (`nspawn-root`);
//! - `kernels`: the kernel matrix in qemu (`kernels`, and in `test`): `fetch` (Debian's kernels),
//!   `initramfs` (what each boots with), `guest` (one boot), `matrix` (every boot);
//! - `fuzz`: the core's decoders under cargo-fuzz (`fuzz`, and 25 s each in `test`);
//! - `docs`: the book and its rules reference (`docs`);
//! - `bench`, and its sections under `bench/`: the measurements and the footprint budget (`bench`);
//! - `corpus`: real packages from the registries under credwatch (`corpus`), and `workflows`:
//!   developers' daily commands on real projects (`corpus --workflows`).
//!
//! Sibling modules import each other in one direction only (xtask/tests/module_graph.rs checks
//! it for every crate of the workspace): what two need goes in a module below both.

mod bench;
mod corpus;
mod docs;
mod fuzz;
mod image;
mod kernels;
mod nspawn;
mod package;
mod toolchain;
mod workflows;

use std::{
    env,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::Instant,
};

use anyhow::{bail, Context, Result};
use toolchain::Route;

const USAGE: &str = "usage: cargo xtask <command>
  toolchain [--dry-run]  check the eBPF toolchain and set it up when missing (--dry-run: only say how)
  build                  toolchain, then the eBPF object and the agent, linked statically (no glibc
                         version required): target/x86_64-unknown-linux-gnu/release/credwatch,
                         copied to target/release/credwatch
  package [--test|--no-build]
                         build, then target/credwatch_<version>_amd64.deb (the binary,
                         the systemd unit, the default configuration); --test (root): then
                         install it with dpkg, check it and purge it, as `test` does;
                         --no-build: of the binary built already (the real-systemd test's way)
  nspawn-root            (root, network) debootstrap the Debian root that the real-systemd test
                         boots, once: target/nspawn/root (`test` makes it)
  image [--no-build]     build, then the container image credwatch:<version> (and
                         :latest) FROM scratch (deploy/Dockerfile) with the machine's docker
                         (DOCKER_HOST: which daemon; CREDWATCH_DOCKER: another client);
                         --no-build: of the binary built already (the image test's way)
  test [--quick]         build, set up what the tests need, run the unit tests, fuzz each decoder
                         for 25s, then (as root) the static binary, the end-to-end tests (the
                         container image's among them), and the package installed, checked and
                         purged with dpkg; --quick (root): the core's, the host's unit and the
                         end-to-end tests on this kernel alone (tests/README.md)
  bench [--quick] [--no-build] [--binary PATH]
        [--only syscalls,install,throughput,replay,memory,outputs,idle,footprint,kernels]
                         (root) build, then measure overhead, install workloads, event and replay
                         throughput, memory and start-up, side by side with the hook's floor,
                         bpftrace, auditd and strace, the outputs' delivery to real local
                         receivers, the idle agent, the footprint against xtask/budget.toml (over
                         it: fails) and both sensor backends in the 6.12 qemu guest with lsm=bpf
                         (`kernels`): target/bench/bench.md and bench.json; --binary: measure
                         that agent, not built
  corpus [--only npm,pip,uv,cargo] [--jobs N] [--list FILE] [--binary PATH] [--timeout SECS] [--contain]
                         (root, network) install each package of xtask/corpus/packages.txt from its
                         registry under `credwatch run`, with a throwaway HOME of fake credentials:
                         target/corpus/corpus.md and corpus.json, alerts/<eco>/<pkg>.jsonl;
                         --contain: under `run --contain`, in target/corpus-contain
  corpus --workflows [--only PROJECT,...] [--list FILE] [--binary PATH] [--timeout SECS]
                         (root, network) run each project of xtask/corpus/workflows.txt (crates,
                         npm tarballs, sdists, fixtures) through developers' daily commands (cargo
                         test, npm start, npx, uv run, ...) under one `credwatch watch` each, in the
                         tools' default layout with a throwaway HOME of fake credentials:
                         target/workflows/workflows.md and workflows.json
  fuzz [--time SECS] [--jobs N] [TARGET...]
                         fuzz the core's decoders (record, trace, strace, auditd, tetragon, tracee,
                         rules, fleet; default all) with cargo-fuzz, each for SECS (default 60), N
                         targets side by side (default 1; their output in target/fuzz/): fails
                         naming each crash's reproducer (docs/src/fuzzing.md)
  docs [--refresh]       the book (docs/, mdBook; installs mdbook with cargo when missing) with its
                         rules reference generated from the rule set, into target/book/, every
                         internal link checked; --refresh (root): first run the commands whose
                         outputs the book and README show, and write them (docs/src/generated/)";

/// Everything but the kernel side: builds and tests with stable Rust alone.
const CORE_CRATE: &str = "credwatch-core";

/// Seconds each fuzz target runs in `cargo xtask test` (eight targets: a few minutes in all).
const FUZZ_SECS_IN_TEST: u64 = 25;

/// Fuzz targets side by side in `cargo xtask test`: each fuzzer is one process on one core, and
/// CI has two (the eight targets in four rounds of ~26.5 s: 106 s, where one at a time measured
/// 211 s).
const FUZZ_AT_ONCE_IN_TEST: usize = 2;

/// The end-to-end crate: it needs root and the release binary, so it runs after the unit tests.
const E2E_CRATE: &str = "credwatch-e2e";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["toolchain"] => toolchain::ensure(false).map(drop),
        ["toolchain", "--dry-run"] => toolchain::ensure(true).map(drop),
        ["build"] => build(),
        ["package"] => build().and_then(|()| package::package()).map(drop),
        ["package", "--no-build"] => package::package().map(drop),
        ["package", "--test"] => build().and_then(|()| package::package()).and_then(|deb| package::test_package(&deb)),
        ["image"] => build().and_then(|()| image::image()),
        ["image", "--no-build"] => image::image(),
        ["test"] => test(TestMode::Full),
        ["test", "--quick"] => test(TestMode::Quick),
        ["nspawn-root"] => nspawn::prepare(),
        ["bench", options @ ..] => bench::bench(options),
        ["corpus", options @ ..] if options.contains(&"--workflows") => {
            let rest: Vec<&str> = options.iter().copied().filter(|option| *option != "--workflows").collect();
            workflows::workflows(&rest)
        }
        ["corpus", options @ ..] => corpus::corpus(options),
        ["docs", options @ ..] => docs::docs(options),
        ["fuzz", options @ ..] => fuzz::fuzz(options),
        ["kernels", options @ ..] => match kernels::kernels(options) {
            Ok(0) => Ok(()),
            // `--run`'s command failed: its status is ours.
            Ok(status) => return ExitCode::from(u8::try_from(status).unwrap_or(1).max(1)),
            Err(error) => Err(error),
        },
        #[cfg(feature = "bench-trace")]
        ["bench-gen-trace", file, bytes] => {
            bytes.parse().context("trace size").and_then(|bytes| bench::replay::generate(Path::new(file), bytes))
        }
        #[cfg(feature = "bench-trace")]
        ["bench-parse", file] => bench::replay::parse_only(Path::new(file)),
        #[cfg(feature = "bench-outputs")]
        ["bench-receive-http"] => bench::receive::http(),
        #[cfg(feature = "bench-outputs")]
        ["bench-receive-nats", url, stream, subjects] => bench::receive::nats(url, stream, subjects),
        _ => {
            eprintln!("{USAGE}\n{}", kernels::USAGE);
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask/ lives in the workspace").to_path_buf()
}

/// The cargo that runs us (the machine's toolchain), not whatever `cargo` PATH finds first.
fn cargo() -> Command {
    let mut command = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(workspace());
    command
}

pub fn is_root() -> bool {
    // /proc/self belongs to the effective uid of whoever looks at it.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn run(what: &str, command: &mut Command) -> Result<()> {
    let start = Instant::now();
    println!("xtask: {what}");
    let status = command.status().with_context(|| format!("starting {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    println!("xtask: {what}: done in {:.1}s", start.elapsed().as_secs_f64());
    Ok(())
}

/// The kernel programs as bpf-linker leaves them, with their DWARF, for debugging (`llvm-objdump -S`).
const EBPF_OBJECT: &str = "target/bpf/bpfel-unknown-none/release/credwatch";
/// The same without DWARF, which the agent embeds (agent/build.rs).
const EBPF_OBJECT_STRIPPED: &str = "target/bpf/bpfel-unknown-none/release/credwatch.stripped";

fn build() -> Result<()> {
    let route = toolchain::ensure(false)?.expect("ensure without dry-run returns a route or an error");
    let ebpf_args =
        ["build", "-p", "credwatch-ebpf", "--release", "--target", "bpfel-unknown-none", "--target-dir", "target/bpf"];
    let mut ebpf = match &route {
        Route::Debian { rustc, llvm_bin } => {
            let mut command = cargo();
            command
                .args(ebpf_args)
                .env("RUSTC", rustc)
                // Debian's rustc is stable; the bpf target and its prebuilt core need this.
                .env("RUSTC_BOOTSTRAP", "1")
                .env("PATH", toolchain::prefixed_path(llvm_bin));
            command
        }
        Route::Nightly => {
            let mut command = Command::new("rustup");
            command
                .current_dir(workspace())
                .args(["run", "nightly", "cargo"])
                .args(ebpf_args)
                .args(["-Z", "build-std=core"])
                // A RUSTC from outside would override nightly's rustc.
                .env_remove("RUSTC");
            command
        }
    };
    ebpf.env("CARGO_TARGET_BPFEL_UNKNOWN_NONE_RUSTFLAGS", "-C debuginfo=2 -C link-arg=--btf");
    run(&format!("build the eBPF object ({EBPF_OBJECT})"), &mut ebpf)?;
    strip_ebpf(&toolchain::objcopy(&route)?)?;
    package::build_static()
}

/// Strips the object's DWARF: BTF is made from it at link time, but the loaders (aya, aya-log)
/// read only .BTF, .BTF.ext, the programs, maps and symbols, and embedded it would be 2.9 of the
/// object's 3.4 MB in every agent binary.
fn strip_ebpf(objcopy: &Path) -> Result<()> {
    let (object, stripped) = (workspace().join(EBPF_OBJECT), workspace().join(EBPF_OBJECT_STRIPPED));
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified());
    // A copy made anew for an unchanged object would make cargo rebuild the agent, whose build
    // script watches it.
    if let (Ok(made), Ok(from)) = (modified(&stripped), modified(&object)) {
        if made >= from {
            return Ok(());
        }
    }
    run(
        &format!("strip the eBPF object's DWARF ({EBPF_OBJECT_STRIPPED})"),
        Command::new(objcopy).arg("--strip-debug").arg(&object).arg(&stripped),
    )
}

/// Which run of `cargo xtask test`: everything (CI's), or the contributor's loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TestMode {
    Full,
    /// `--quick`: what a change to the core, the agent or the outputs can break on this machine's
    /// kernel, without the layers that take most of CI's hour.
    Quick,
}

/// What a mode runs beyond the core's tests, the build, the prerequisites and the host unit
/// tests, which both run.
#[derive(Debug)]
struct TestPlan {
    /// The book built and its internal links checked.
    book: bool,
    /// Each fuzz target for [`FUZZ_SECS_IN_TEST`].
    fuzz: bool,
    /// The kernel matrix in qemu, its set-up and the real-systemd test's Debian root made in the
    /// background meanwhile.
    kernel_matrix: bool,
    /// The .deb installed, checked and purged with dpkg.
    package: bool,
    /// The end-to-end targets run first, alone, one test at a time.
    e2e_alone: Vec<String>,
    /// The end-to-end targets run on the host beside the kernel matrix.
    e2e_alongside_matrix: Vec<String>,
}

impl TestPlan {
    fn of(mode: TestMode) -> Result<TestPlan> {
        let (alone, alongside) = e2e_targets()?;
        let full = mode == TestMode::Full;
        Ok(TestPlan {
            book: full,
            fuzz: full,
            kernel_matrix: full,
            package: full,
            e2e_alone: alone,
            // They mostly wait (E2E_ALONGSIDE_MATRIX): alone, they would double the quick run.
            e2e_alongside_matrix: if full { alongside } else { Vec::new() },
        })
    }
}

fn test(mode: TestMode) -> Result<()> {
    let plan = TestPlan::of(mode)?;
    if mode == TestMode::Quick && !is_root() {
        bail!(
            "the sensor and end-to-end tests load eBPF programs and need root: run `sudo -E cargo xtask test --quick`"
        );
    }
    let mut phases = Phases::start();
    if env::var_os("CI").is_some() {
        lean_ci_builds();
    }
    // mdbook's install (a few minutes of compiling, most of it waiting on crates.io when the
    // machine is fresh) overlaps the core's tests and the build rather than following them.
    let mdbook_ready = plan.book.then(|| std::thread::spawn(docs::mdbook));
    core_alone()?;
    phases.done("core unit tests");
    build()?;
    phases.done("build");
    test_prerequisites()?;
    phases.done("test prerequisites");
    // The kernel matrix's packages, kernels and base image (downloads and mke2fs: mostly the
    // network and the disk) are made meanwhile, while the host's tests and the fuzzers keep
    // the CPUs busy, and are ready before the end-to-end tests, which they would disturb.
    let kernels_ready = (plan.kernel_matrix && is_root()).then(|| std::thread::spawn(kernels::prepare));
    // So is the Debian root that the real-systemd test boots (debootstrap: the network).
    let nspawn_ready = (plan.kernel_matrix && is_root()).then(|| std::thread::spawn(nspawn::prepare));
    run(
        "host unit tests",
        cargo().args([
            "test",
            "--workspace",
            "--exclude",
            "credwatch-ebpf",
            "--exclude",
            CORE_CRATE,
            "--exclude",
            E2E_CRATE,
        ]),
    )?;
    phases.done("host unit tests");
    if let Some(mdbook_ready) = mdbook_ready {
        mdbook_ready.join().map_err(|_| anyhow::anyhow!("mdbook's install panicked"))??;
        docs::build_book()?;
        phases.done("docs");
    }
    if plan.fuzz {
        // Every decoder of untrusted input meets the fuzzer on every run, briefly (docs/src/fuzzing.md).
        fuzz::fuzz_targets(&fuzz::TARGETS.map(|(target, _)| target), FUZZ_SECS_IN_TEST, FUZZ_AT_ONCE_IN_TEST)?;
        phases.done("fuzz");
    }
    if !is_root() {
        bail!("the end-to-end tests load eBPF programs and need root: run `sudo -E cargo xtask test`");
    }
    if let Some(kernels_ready) = kernels_ready {
        kernels_ready
            .join()
            .map_err(|_| anyhow::anyhow!("the kernel matrix's set-up panicked"))?
            .context("setting up the kernel matrix (its packages, kernels and base image)")?;
        phases.done("waiting for the kernel matrix's set-up");
    }
    if let Some(nspawn_ready) = nspawn_ready {
        nspawn_ready
            .join()
            .map_err(|_| anyhow::anyhow!("the Debian root's set-up panicked"))?
            .context("debootstrapping the Debian root of the real-systemd test")?;
        phases.done("waiting for the Debian root's set-up");
    }
    // The binary the tests run is the one that ships; the image test (tests/tests/image.rs)
    // makes the container image of it with `xtask image --no-build` against its own dockerd.
    package::check_static(&package::static_binary())?;
    run(
        "privileged end-to-end tests",
        cargo()
            .args(["test", "-p", E2E_CRATE])
            .args(plan.e2e_alone.iter().flat_map(|target| ["--test", target]))
            .args(["--", "--test-threads=1", "--show-output"]),
    )?;
    phases.done("end-to-end tests");
    if plan.kernel_matrix {
        // Then the same binaries on the other kernels fleets run, in qemu, while the end-to-end
        // tests that mostly wait (see E2E_ALONGSIDE_MATRIX) run on the host.
        let alongside = plan.e2e_alongside_matrix;
        let waiting =
            std::thread::spawn(move || run_captured("end-to-end tests alongside the kernel matrix", &alongside));
        let matrix = kernels::matrix();
        let waited =
            waiting.join().map_err(|_| anyhow::anyhow!("the end-to-end tests alongside the matrix panicked"))?;
        matrix?;
        waited?;
        phases.done("kernel matrix, and the end-to-end tests alongside it");
    }
    if plan.package {
        // Then the package made of it, with the real dpkg.
        let deb = package::package()?;
        package::test_package(&deb)?;
        phases.done("package");
    }
    phases.print();
    Ok(())
}

/// CI's disk is what is free on a fresh machine, which once ran out (at 11 minutes, while the
/// kernel matrix's base image was made). Debug builds' incremental caches and full debug info were
/// most of the debug target dir (measured on credwatch-core's tests from clean: 1.2 GB, 0.44 GB
/// with these) and serve nothing in a run that starts clean; line tables keep the panics'
/// backtraces readable.
const CI_BUILD_ENV: &[(&str, &str)] = &[("CARGO_INCREMENTAL", "0"), ("CARGO_PROFILE_DEV_DEBUG", "line-tables-only")];

/// Sets [`CI_BUILD_ENV`] for every cargo that `test` starts, the tests' own builds included (set
/// before any thread starts).
fn lean_ci_builds() {
    for (name, value) in CI_BUILD_ENV {
        env::set_var(name, value);
    }
}

/// End-to-end test targets that spend their time waiting (a 2-minute SIGSTOP of the agent, a
/// watchdog's timeout, a booting container) rather than computing: `cargo xtask test` runs them
/// on the host while the kernel matrix keeps both cores busy in qemu, which they cannot disturb
/// (the guests run kernels of their own); every other target runs first, alone, one test at a
/// time, because they share the host's kernel programs.
const E2E_ALONGSIDE_MATRIX: &[&str] = &["faults", "systemd_boot"];

/// The end-to-end crate's test targets that run without features: those to run first, and
/// [`E2E_ALONGSIDE_MATRIX`] (each checked to exist).
fn e2e_targets() -> Result<(Vec<String>, Vec<String>)> {
    let output =
        cargo().args(["metadata", "--no-deps", "--format-version", "1"]).output().context("running cargo metadata")?;
    if !output.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("reading cargo metadata's JSON")?;
    let package = metadata["packages"]
        .as_array()
        .and_then(|packages| packages.iter().find(|package| package["name"] == E2E_CRATE))
        .with_context(|| format!("cargo metadata lists no package {E2E_CRATE}"))?;
    let targets = package["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
    let names: Vec<String> = targets
        .iter()
        .filter(|target| target["kind"].as_array().is_some_and(|kinds| kinds.iter().any(|kind| kind == "test")))
        .filter(|target| target["required-features"].as_array().is_none_or(Vec::is_empty))
        .filter_map(|target| target["name"].as_str().map(str::to_owned))
        .collect();
    if let Some(missing) = E2E_ALONGSIDE_MATRIX.iter().find(|name| !names.iter().any(|n| n == *name)) {
        bail!("E2E_ALONGSIDE_MATRIX names {missing}, which is no test target of {E2E_CRATE}");
    }
    Ok(names.into_iter().partition(|name| !E2E_ALONGSIDE_MATRIX.contains(&name.as_str())))
}

/// Runs the end-to-end test `targets` with their output kept, printed once they are done (they
/// run beside the kernel matrix, whose own output goes on meanwhile).
fn run_captured(what: &str, targets: &[String]) -> Result<()> {
    let start = Instant::now();
    let output = cargo()
        .args(["test", "-p", E2E_CRATE])
        .args(targets.iter().flat_map(|target| ["--test", target.as_str()]))
        .args(["--", "--test-threads=1", "--show-output"])
        .output()
        .with_context(|| format!("starting {what}"))?;
    println!("xtask: {what} ({}):", targets.join(", "));
    std::io::Write::write_all(&mut std::io::stdout(), &output.stdout).context("printing their output")?;
    std::io::Write::write_all(&mut std::io::stderr(), &output.stderr).context("printing their errors")?;
    if !output.status.success() {
        bail!("{what} failed ({})", output.status);
    }
    println!("xtask: {what}: done in {:.1}s", start.elapsed().as_secs_f64());
    Ok(())
}

/// The wall-clock time of each of `cargo xtask test`'s phases, printed at the end (CI's
/// budget is watched by them).
struct Phases {
    done: Vec<(&'static str, f64)>,
    since: Instant,
}

impl Phases {
    fn start() -> Self {
        Phases { done: Vec::new(), since: Instant::now() }
    }

    fn done(&mut self, phase: &'static str) {
        let now = Instant::now();
        self.done.push((phase, (now - self.since).as_secs_f64()));
        self.since = now;
    }

    fn print(&self) {
        println!("xtask: test: phases (wall clock):");
        for (phase, secs) in &self.done {
            println!("xtask:   {phase:<40} {secs:>7.0}s");
        }
        println!("xtask:   {:<40} {:>7.0}s", "total", self.done.iter().map(|(_, secs)| secs).sum::<f64>());
    }
}

/// Tests the core before anything of the eBPF toolchain is set up (on a fresh machine it is
/// not there yet), with the machine's stable Rust and nothing bpf in the environment, after
/// checking that no aya crate is among its dependencies.
fn core_alone() -> Result<()> {
    let tree = cargo()
        .args(["tree", "-p", CORE_CRATE, "--edges", "normal,build", "--prefix", "none"])
        .output()
        .context("running cargo tree")?;
    if !tree.status.success() {
        bail!("cargo tree -p {CORE_CRATE} failed: {}", String::from_utf8_lossy(&tree.stderr));
    }
    let dependencies = String::from_utf8_lossy(&tree.stdout);
    let names = dependencies.lines().filter_map(|line| line.split_whitespace().next());
    if let Some(kernel_side) = names.into_iter().find(|name| name.starts_with("aya") || name.ends_with("-ebpf")) {
        bail!("{CORE_CRATE} must build without the eBPF toolchain, but depends on {kernel_side}");
    }
    run(
        "core unit tests, stable Rust alone",
        cargo()
            .args(["test", "-p", CORE_CRATE])
            .env_remove("RUSTC")
            .env_remove("RUSTC_BOOTSTRAP")
            .env_remove("CREDWATCH_EBPF_OBJECT"),
    )
}

/// Where the set-up keeps the wheels pip installs into an isolated build environment: a test
/// builds an sdist the way pip does by default, offline, from this directory.
const E2E_WHEELS: &str = "target/e2e-wheels";

/// Downloads setuptools' wheel into [`E2E_WHEELS`] once (the tests never use the network).
fn build_requirement_wheels() -> Result<()> {
    let dir = workspace().join(E2E_WHEELS);
    let present = std::fs::read_dir(&dir)
        .map(|entries| entries.flatten().any(|e| e.file_name().to_string_lossy().starts_with("setuptools-")))
        .unwrap_or(false);
    if present {
        return Ok(());
    }
    run(
        "download setuptools' wheel (pip's isolated build environment in a test)",
        Command::new("python3")
            .args(["-m", "pip", "download", "--quiet", "--only-binary", ":all:", "--no-deps", "--dest"])
            .arg(&dir)
            .arg("setuptools"),
    )
}

/// The pinned coding-agent CLIs (package, version, bin), one a line; `#` starts a comment.
const AGENT_CLIS: &str = "tests/agent-clis.txt";

/// Installs each CLI of [`AGENT_CLIS`] with npm into `target/agent-clis/<name>@<version>`, once:
/// the agent CLI tests run them offline from there. A CLI counts as installed when its bin says
/// its version (Claude Code's bin is a stub until its postinstall puts the native binary there).
fn agent_clis() -> Result<()> {
    let list = workspace().join(AGENT_CLIS);
    let text = std::fs::read_to_string(&list).with_context(|| format!("reading {}", list.display()))?;
    // A HOME of their own: Gemini CLI and Codex write their state there even for --version.
    let home = workspace().join("target/agent-clis/home");
    std::fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let [package, version, bin] = line.split_whitespace().collect::<Vec<_>>()[..] else {
            bail!("{}:{}: expected `package version bin`, found {line:?}", list.display(), number + 1);
        };
        let name = package.rsplit('/').next().unwrap_or(package);
        let prefix = workspace().join("target/agent-clis").join(format!("{name}@{version}"));
        let bin = prefix.join("node_modules/.bin").join(bin);
        let says_version = || {
            Command::new(&bin)
                .arg("--version")
                .env("HOME", &home)
                .stdin(std::process::Stdio::null())
                .output()
                .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(version))
        };
        if says_version() {
            continue;
        }
        run(
            &format!("install {package}@{version} (the agent CLI tests run it)"),
            Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--no-save", "--prefix"])
                .arg(&prefix)
                .arg(format!("{package}@{version}")),
        )?;
        if !says_version() {
            bail!("{} --version does not say {version} after npm installed {package}@{version}", bin.display());
        }
    }
    Ok(())
}

/// Whether Debian's busybox-static is installed: the dynamic busybox package puts a binary at
/// the same path, useless in a container FROM scratch.
fn busybox_static_installed() -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "busybox-static"])
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("ok installed"))
}

/// Whether ruby finds its own C headers (Debian's ruby-dev), which mkmf needs.
fn ruby_headers_installed() -> bool {
    Command::new("ruby")
        .args(["-rrbconfig", "-e", "exit File.file?(File.join(RbConfig::CONFIG['rubyhdrdir'], 'ruby.h'))"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether rsyslog has the module `name`: Debian puts them in /usr/lib/<triplet>/rsyslog.
fn rsyslog_has_module(name: &str) -> bool {
    let file = format!("{name}.so");
    ["/usr/lib", "/usr/lib64"].iter().any(|lib| {
        Path::new(lib).join("rsyslog").join(&file).is_file()
            || std::fs::read_dir(lib)
                .into_iter()
                .flatten()
                .flatten()
                .any(|entry| entry.path().join("rsyslog").join(&file).is_file())
    })
}

/// The fixtures run real npm and pip offline; pip builds the sdist with the interpreter's own
/// setuptools and wheel (no build isolation), so those are installed here, never by a test.
fn test_prerequisites() -> Result<()> {
    for program in ["node", "npm", "corepack", "python3"] {
        if toolchain::find_in_path(program).is_none() {
            bail!("the end-to-end tests need `{program}` on PATH");
        }
    }
    let importable = |modules: &str| {
        Command::new("python3").args(["-c", &format!("import {modules}")]).output().is_ok_and(|o| o.status.success())
    };
    // The importer tests run the real strace and auditd to make their traces; the syslog
    // output's tests start a real rsyslogd (with imrelp, from rsyslog-relp, for RELP), the NATS
    // output's a real JetStream server, and a real Prometheus scrapes the metrics.
    let mut missing: Vec<&str> = [
        ("strace", "strace"),
        ("auditd", "auditd"),
        ("rsyslogd", "rsyslog"),
        ("nats-server", "nats-server"),
        ("prometheus", "prometheus"),
        // The package's test: the unit verified, the static binary's ELF headers read.
        ("systemd-analyze", "systemd"),
        ("readelf", "binutils"),
        ("dpkg-deb", "dpkg"),
        // The real-systemd test (tests/tests/systemd_boot.rs): a debootstrapped Debian booted
        // with systemd as PID 1.
        ("debootstrap", "debootstrap"),
        ("systemd-nspawn", "systemd-container"),
        // The image's test: its own dockerd builds and runs the image, and another container
        // (FROM scratch too: nothing is pulled) holds a static busybox.
        ("dockerd", "docker.io"),
        // The RubyGems and Bundler tests build local gems and install them offline; RubyGems
        // runs `make` after the extension's extconf.rb, and a C extension's extconf.rb (mkmf)
        // needs ruby's headers and a C compiler.
        ("gem", "ruby"),
        ("bundle", "bundler"),
        ("make", "make"),
        ("gcc", "gcc"),
        // The box's doors (tests/tests/contain_doors.rs): real agents and a session bus with
        // gnome-keyring's Secret Service outside it, their clients and keyctl inside.
        ("ssh-agent", "openssh-client"),
        ("gpg", "gpg"),
        ("gpg-agent", "gpg-agent"),
        ("gpg-connect-agent", "gpgconf"),
        ("dbus-daemon", "dbus-daemon"),
        ("dbus-send", "dbus-bin"),
        ("gnome-keyring-daemon", "gnome-keyring"),
        ("secret-tool", "libsecret-tools"),
        ("keyctl", "keyutils"),
        // `credwatch notify` (tests/tests/notify.rs): a session bus of its own, an X server, a
        // real notification daemon and its control, the bus's monitor; `import` screenshots the
        // popup. The incident page is loaded in a real headless Chromium.
        ("Xvfb", "xvfb"),
        ("dbus-launch", "dbus-x11"),
        ("dunst", "dunst"),
        ("notify-send", "libnotify-bin"),
        ("import", "imagemagick"),
        ("xdpyinfo", "x11-utils"),
        ("chromium", "chromium"),
    ]
    .iter()
    .filter(|(program, _)| toolchain::find_in_path(program).is_none())
    .map(|(_, package)| *package)
    .collect();
    if !rsyslog_has_module("imrelp") {
        missing.push("rsyslog-relp");
    }
    if !busybox_static_installed() {
        missing.push("busybox-static");
    }
    if !ruby_headers_installed() {
        missing.push("ruby-dev");
    }
    if !missing.is_empty() {
        if !is_root() || toolchain::find_in_path("apt-get").is_none() {
            bail!("the tests need {} (as root with apt-get, `cargo xtask test` installs them)", missing.join(" and "));
        }
        run("refresh the package lists", Command::new("apt-get").args(["update", "-q"]))?;
        run(
            &format!("install {} (the tests run them)", missing.join(" and ")),
            Command::new("apt-get").args(["install", "-y", "--no-install-recommends"]).args(&missing),
        )?;
    }
    build_requirement_wheels()?;
    agent_clis()?;
    if importable("setuptools, wheel, uv") {
        println!(
            "xtask: test prerequisites: node, npm, strace, auditd, rsyslogd with imrelp, nats-server, prometheus, systemd-analyze, readelf, dpkg-deb, debootstrap, systemd-nspawn, dockerd, busybox, gem, bundle, make, gcc, ruby's headers, ssh-agent, gpg-agent, dbus-daemon, gnome-keyring, secret-tool, keyctl, Xvfb, dunst, notify-send, import, chromium, python3 with setuptools, wheel and uv: present"
        );
        return Ok(());
    }
    // uv: a test runs `python3 -m uv` offline on a local project.
    run(
        "install setuptools, wheel and uv for python3 (the pip fixture builds without isolation)",
        Command::new("python3").args(["-m", "pip", "install", "--quiet", "setuptools", "wheel", "uv"]),
    )?;
    if !importable("setuptools, wheel, uv") {
        bail!("python3 still cannot import setuptools, wheel and uv after installing them");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_end_to_end_targets_split_between_alone_and_alongside_the_matrix() {
        let (alone, alongside) = super::e2e_targets().unwrap();
        assert_eq!(alongside, super::E2E_ALONGSIDE_MATRIX);
        assert!(alone.iter().any(|target| target == "e2e") && alone.iter().any(|target| target == "blind_spots"));
        // The guests' targets need a feature, and run in the kernel matrix only.
        assert!(!alone.iter().any(|target| target.starts_with("guest_")), "{alone:?}");
        assert!(!alone.iter().any(|target| alongside.contains(target)), "{alone:?}");
    }

    #[test]
    fn quick_runs_the_host_layers_and_leaves_the_matrix_fuzz_book_and_package_to_ci() {
        use super::{TestMode, TestPlan, E2E_ALONGSIDE_MATRIX};
        let full = TestPlan::of(TestMode::Full).unwrap();
        let quick = TestPlan::of(TestMode::Quick).unwrap();
        assert!(full.book && full.fuzz && full.kernel_matrix && full.package, "{full:?}");
        assert_eq!(full.e2e_alongside_matrix, E2E_ALONGSIDE_MATRIX);
        assert!(!quick.book && !quick.fuzz && !quick.kernel_matrix && !quick.package, "{quick:?}");
        // Every end-to-end target that runs alone in CI runs in the quick loop too, and none of
        // the ones that wait beside the matrix (faults, systemd_boot).
        assert_eq!(quick.e2e_alone, full.e2e_alone);
        assert!(quick.e2e_alongside_matrix.is_empty(), "{quick:?}");
        assert!(!quick.e2e_alone.iter().any(|target| E2E_ALONGSIDE_MATRIX.contains(&target.as_str())), "{quick:?}");
    }
}
