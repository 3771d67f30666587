//! `cargo xtask kernels`: Debian's cloud kernels from 5.10 to sid booted in qemu (TCG), with and
//! without `lsm=bpf`, running credwatch and its tests inside (issue 13's kernel matrix).
//!
//! The kernels and the base image are downloaded and built once, in CREDWATCH_KERNEL_CACHE
//! (default target/kernels).

mod fetch;
mod guest;
mod initramfs;
mod matrix;

use std::{env, path::PathBuf, process::Command, time::Duration};

use anyhow::{bail, Context, Result};

pub const USAGE: &str = "  kernels [--no-build] [--full] [--kernel K]
                         (root) build, then the kernel matrix: Debian's cloud kernels 5.10, 6.1,
                         6.12 and sid booted in qemu, with and without lsm=bpf, running doctor,
                         the sensor tests and the guest tests: target/kernels/matrix.md (--kernel:
                         that one only; --no-build: of the binaries built already; --full: every
                         test on every boot, not CI's cut). Kernels and the base image are made
                         once, in CREDWATCH_KERNEL_CACHE (default target/kernels)
  kernels --list         the kernels, with their exact versions
  kernels --kernel 5.10|6.1|6.12|sid [--lsm] [--icount] [--env K=V]... [--add PATH]... [--timeout SECS] --run CMD
                         (root) boot one (--lsm: with lsm=lockdown,capability,yama,bpf), run CMD
                         (sh) in the workspace with the host's userland, print its output, exit
                         with its status; files of target/ CMD names come along, --add: others;
                         --icount: one vCPU whose clock counts instructions (1 ns each; the bench)";

/// Debian packages the matrix runs: qemu, the image and initramfs makers, the kernels' module
/// decompressors, busybox for the initramfs.
const PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("mke2fs", "e2fsprogs"),
    ("cpio", "cpio"),
    ("xz", "xz-utils"),
    ("zstd", "zstd"),
    ("dpkg-deb", "dpkg"),
    ("apt-get", "apt"),
];

/// Where the kernels and the base image are kept.
fn cache() -> PathBuf {
    env::var_os("CREDWATCH_KERNEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace().join("target/kernels"))
}

/// Installs what is missing (as root with apt-get, like the test prerequisites).
pub fn prerequisites() -> Result<()> {
    let mut missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(program, _)| crate::toolchain::find_in_path(program).is_none())
        .map(|(_, p)| *p)
        .collect();
    if !crate::busybox_static_installed() {
        missing.push("busybox-static");
    }
    if missing.is_empty() {
        return Ok(());
    }
    if !crate::is_root() || crate::toolchain::find_in_path("apt-get").is_none() {
        bail!(
            "the kernel matrix needs {} (as root with apt-get, `cargo xtask kernels` installs them)",
            missing.join(" ")
        );
    }
    crate::run("refresh the package lists", Command::new("apt-get").args(["update", "-q"]))?;
    crate::run(
        &format!("install {} (the kernel matrix runs them)", missing.join(" ")),
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn series(name: &str) -> Result<fetch::Series> {
    fetch::SERIES.iter().copied().find(|s| s.name == name || s.suite == name).with_context(|| {
        format!("no kernel `{name}`: one of {}", fetch::SERIES.iter().map(|s| s.name).collect::<Vec<_>>().join(", "))
    })
}

fn kernel(series: fetch::Series) -> Result<fetch::Kernel> {
    let cache = cache();
    let _lock = guest::CacheLock::take(&cache)?;
    fetch::kernel(&cache, series)
}

struct Options {
    list: bool,
    kernel: Option<String>,
    run: Option<String>,
    lsm: bool,
    no_build: bool,
    full: bool,
    env: Vec<(String, String)>,
    add: Vec<PathBuf>,
    timeout: Duration,
    icount: bool,
}

fn parse(args: &[&str]) -> Result<Options> {
    let mut options = Options {
        list: false,
        kernel: None,
        run: None,
        lsm: false,
        no_build: false,
        full: false,
        env: Vec::new(),
        add: Vec::new(),
        timeout: Duration::from_secs(3600),
        icount: false,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value =
            |name: &str| args.next().map(|v| v.to_string()).with_context(|| format!("{name} needs a value"));
        match *arg {
            "--list" => options.list = true,
            "--lsm" => options.lsm = true,
            "--icount" => options.icount = true,
            "--no-build" => options.no_build = true,
            "--full" => options.full = true,
            "--kernel" => options.kernel = Some(value("--kernel")?),
            "--run" => options.run = Some(value("--run")?),
            "--env" => {
                let pair = value("--env")?;
                let (k, v) = pair.split_once('=').with_context(|| format!("--env {pair}: not K=V"))?;
                options.env.push((k.to_owned(), v.to_owned()));
            }
            "--add" => options.add.push(PathBuf::from(value("--add")?)),
            "--timeout" => {
                let secs = value("--timeout")?;
                options.timeout = Duration::from_secs(secs.parse().with_context(|| format!("--timeout {secs}"))?);
            }
            other => bail!("kernels: unknown option `{other}`\n{USAGE}"),
        }
    }
    Ok(options)
}

/// What the matrix boots from, made ahead of it: its packages, every kernel and the base image
/// (`cargo xtask test` makes them in the background, see there; measured on a fresh cache: the
/// kernels 231 s, of which 58 s of CPU, the base image 64-176 s).
pub fn prepare() -> Result<()> {
    prerequisites()?;
    let cache = cache();
    let _lock = guest::CacheLock::take(&cache)?;
    for series in fetch::SERIES {
        fetch::kernel(&cache, series)?;
    }
    guest::base_image(&cache).map(drop)
}

/// The matrix of the binaries built already, after the host's own tests (`cargo xtask test`'s
/// step).
pub fn matrix() -> Result<()> {
    prerequisites()?;
    matrix::matrix(None, false, matrix::Host::TestedAlready)
}

/// `cargo xtask kernels ...`; returns the exit status of `--run`'s command.
pub fn kernels(args: &[&str]) -> Result<i32> {
    let options = parse(args)?;
    prerequisites()?;
    if options.list {
        for series in fetch::SERIES {
            let k = kernel(series)?;
            println!("{:<5} Debian {:<9} linux {:<12} {}", series.name, series.suite, k.version, k.release);
        }
        return Ok(0);
    }
    if let Some(command) = options.run {
        if !crate::is_root() {
            bail!("the guest's disks and qemu are made as root: run as root");
        }
        let name = options.kernel.as_deref().unwrap_or("6.12");
        let kernel = kernel(series(name)?)?;
        println!(
            "kernels: booting {} (Debian {} linux {}, {}){}",
            name,
            kernel.series.suite,
            kernel.version,
            kernel.release,
            if options.lsm { format!(" with lsm={}", guest::LSM_LIST) } else { String::new() }
        );
        let outcome = guest::run(
            &cache(),
            &guest::Run {
                kernel: &kernel,
                lsm: options.lsm,
                command,
                env: options.env,
                add: options.add,
                timeout: options.timeout,
                echo: true,
                icount: options.icount,
            },
        )?;
        println!(
            "kernels: exit status {} (boot {:.1}s, total {:.1}s)",
            outcome.status,
            outcome.boot.as_secs_f64(),
            outcome.total.as_secs_f64()
        );
        return Ok(outcome.status);
    }
    if options.lsm || !options.env.is_empty() || !options.add.is_empty() {
        bail!("--lsm, --env and --add go with --run");
    }
    let only = options.kernel.as_deref().map(series).transpose()?;
    if !options.no_build {
        crate::build()?;
    }
    matrix::matrix(only, options.full, matrix::Host::Test).map(|()| 0)
}
