//! Booting a kernel in qemu (TCG) on the host's own userland and running one command in it.
//!
//! Two disks: a base ext4 image of the host's /usr, /etc and root's toolchains, made once and
//! shared (qemu `snapshot=on`: never written), and a small run disk made fresh for each boot
//! with the workspace (sources, fixtures, binaries) at the same absolute path as on the host,
//! since the test binaries find the agent and their fixtures by compiled-in paths. A busybox
//! initramfs loads virtio_blk, mounts both and switches to the host's /bin/sh, which mounts what
//! credwatch and the tests need and runs the command with its output on a second serial port.

use std::{
    fs,
    io::{BufRead, BufReader, Write},
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{fetch::Kernel, initramfs::RUN_MOUNT};

/// The LSMs of the `lsm=` boots: bpf among the active ones, as on the fleets that enable it.
pub const LSM_LIST: &str = "lockdown,capability,yama,bpf";
/// The last line of a run on the command's serial port, with its exit status.
const EXIT_MARK: &str = "@@credwatch-kernels-exit ";
/// The guest writes this once its init is done, just before the command starts.
const START_MARK: &str = "@@credwatch-kernels-start";
/// The tests scale their timeouts by this (TCG is 5-20x slower than the host).
pub const SLOW_FACTOR: &str = "10";

/// Trees of /usr no guest command needs, left out of the base image (measured: /usr is 7.8 GB
/// here, 5.2 GB of it these; the image is made on CI's disk beside the builds).
const USR_LEFT_OUT: &[&str] = &[
    "lib/chromium",
    "lib/firefox-esr",
    "lib/google-cloud-sdk",
    "lib/jvm",
    "lib/llvm-14",
    "lib/llvm-22",
    "lib/postgresql",
    "lib/rustlib",
    "share/doc",
    "share/man",
    "share/locale",
    "share/javascript",
    "share/package-lists",
];

/// One command to run in one boot.
pub struct Run<'a> {
    pub kernel: &'a Kernel,
    pub lsm: bool,
    pub command: String,
    pub env: Vec<(String, String)>,
    /// Host paths (files or directories) the run disk carries besides the workspace's defaults.
    pub add: Vec<PathBuf>,
    pub timeout: Duration,
    /// Print the command's output as it comes.
    pub echo: bool,
    /// One vCPU whose clock counts its instructions (`-icount shift=0`: 1 ns each): a process's
    /// CPU time is then the instructions it ran, which the host's load cannot move (the bench).
    pub icount: bool,
}

pub struct Outcome {
    pub status: i32,
    pub output: String,
    /// From qemu's start to the command's start.
    pub boot: Duration,
    pub total: Duration,
}

/// Holds an exclusive flock on a file of the cache, so concurrent runs sharing a cache
/// (CREDWATCH_KERNEL_CACHE) download and build once.
pub struct CacheLock {
    _file: fs::File,
}

impl CacheLock {
    pub fn take(cache: &Path) -> Result<Self> {
        use std::os::fd::AsRawFd;
        fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
        let path = cache.join(".lock");
        let file = fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        // SAFETY: flock on a descriptor we own; it is released when the file is closed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!("locking {}: {}", path.display(), std::io::Error::last_os_error());
        }
        Ok(CacheLock { _file: file })
    }
}

/// The guest's init after switch_root, in the host's /bin/sh.
const GUEST_INIT: &str = r#"K=@RUN@/.kernels
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf
mount -t securityfs securityfs /sys/kernel/security
# The cgroups as this host (and docker on cgroup v1 hosts) has them: v1 hierarchies, v2 unified.
mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
for c in cpu cpuacct cpuset memory devices freezer blkio pids; do
    mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c 2>/dev/null || rmdir /sys/fs/cgroup/$c
done
mkdir -p /sys/fs/cgroup/systemd /sys/fs/cgroup/unified
mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified
ip link set lo up
hostname credwatch-guest
while read -r d; do mkdir -p "$d" && mount --bind "@RUN@$d" "$d"; done < $K/binds
set -a
. $K/env
set +a
out=/dev/ttyS1
stty -F $out raw -echo
echo "@START@" > $out
cd "$(cat $K/cwd)"
sh $K/cmd.sh > $out 2>&1 < /dev/null
echo "@EXIT@$?" > $out
sync
$K/busybox poweroff -f
"#;

/// `cp -a` (with `-l`: hard links, same filesystem, no copy) of `from` to `to`.
fn copy_tree(from: &Path, to: &Path, link: bool) -> Result<()> {
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent)?;
    }
    let flags = if link { "-al" } else { "-a" };
    let status = Command::new("cp").arg(flags).arg(from).arg(to).status().context("starting cp")?;
    if !status.success() && link {
        // Another filesystem (a bind-mounted file, a separate mount): copy instead.
        let _ = fs::remove_dir_all(to);
        let _ = fs::remove_file(to);
        return copy_tree(from, to, false);
    }
    if !status.success() {
        bail!("cp {flags} {} {} failed ({status})", from.display(), to.display());
    }
    Ok(())
}

/// The pyenv Python that `python3` is on the host, when there is one: the tests' python3.
fn pyenv_version() -> Option<String> {
    let version = fs::read_to_string("/root/.pyenv/version").ok()?;
    let version = version.lines().next()?.trim().to_owned();
    Path::new("/root/.pyenv/versions").join(&version).is_dir().then_some(version)
}

/// The guest's PATH: root's rustup cargo, the pyenv python3, then the system's.
fn guest_path() -> String {
    let mut path = String::from("/root/.cargo/bin:");
    if let Some(version) = pyenv_version() {
        path.push_str(&format!("/root/.pyenv/versions/{version}/bin:"));
    }
    path.push_str("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    path
}

/// What the base image was made of: when the host's packages, toolchains or python change, the
/// image is made again (a test prerequisite installed later must reach the guests too), as when
/// what it leaves out changes.
fn host_userland_stamp() -> String {
    let modified = |path: &str| {
        fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs())
    };
    let mut toolchains: Vec<String> = fs::read_dir("/root/.rustup/toolchains")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    toolchains.sort();
    format!(
        "dpkg status {}\n/usr/local/bin {}\nrustup {} {}\npyenv {:?}\nleft out {} and rust-docs\n",
        modified("/var/lib/dpkg/status"),
        modified("/usr/local/bin"),
        modified("/root/.rustup/settings.toml"),
        toolchains.join(" "),
        pyenv_version(),
        USR_LEFT_OUT.join(" ")
    )
}

/// The shared base image, built the first time and whenever the host's userland changed
/// (callers hold the [`CacheLock`]).
pub fn base_image(cache: &Path) -> Result<PathBuf> {
    let image = cache.join("base.ext4");
    let stamp_file = cache.join("base.stamp");
    let stamp = host_userland_stamp();
    if image.is_file() && fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp) {
        return Ok(image);
    }
    let start = Instant::now();
    println!("kernels: building the base image of the host's userland (shared: {})", image.display());
    let stage = cache.join("base-stage");
    let _ = fs::remove_dir_all(&stage);
    fs::create_dir_all(&stage)?;
    copy_tree(Path::new("/usr"), &stage.join("usr"), true)?;
    for left_out in USR_LEFT_OUT {
        let _ = fs::remove_dir_all(stage.join("usr").join(left_out));
    }
    copy_tree(Path::new("/etc"), &stage.join("etc"), false)?;
    // Root's rustup toolchains but nightly (only the eBPF build on the host uses it), cargo
    // without its registry (the tests' cargo runs offline in a fake HOME), pyenv's one python.
    let root = stage.join("root");
    fs::create_dir_all(&root)?;
    if Path::new("/root/.rustup").is_dir() {
        copy_tree(Path::new("/root/.rustup"), &root.join(".rustup"), true)?;
        for entry in fs::read_dir(root.join(".rustup/toolchains"))?.flatten() {
            if entry.file_name().to_string_lossy().starts_with("nightly") {
                fs::remove_dir_all(entry.path())?;
            } else if entry.file_type().is_ok_and(|t| t.is_dir()) {
                // rust-docs' HTML: 0.8 GB of the 1.4 GB toolchain, read by no test. (A
                // toolchain symlink, such as 1.95.0 -> stable, points at the host's own.)
                let _ = fs::remove_dir_all(entry.path().join("share/doc"));
            }
        }
        let _ = fs::remove_dir_all(root.join(".rustup/downloads"));
        let _ = fs::remove_dir_all(root.join(".rustup/tmp"));
    }
    if let Ok(entries) = fs::read_dir("/root/.cargo") {
        // Never copied at all (`cargo xtask test` makes this image while cargo may be
        // downloading crates into them).
        for entry in entries.flatten().filter(|e| e.file_name() != "registry" && e.file_name() != "git") {
            copy_tree(&entry.path(), &root.join(".cargo").join(entry.file_name()), true)?;
        }
    }
    if let Some(version) = pyenv_version() {
        let from = Path::new("/root/.pyenv/versions").join(&version);
        copy_tree(&from, &root.join(".pyenv/versions").join(&version), true)?;
        fs::write(root.join(".pyenv/version"), format!("{version}\n"))?;
    }
    for (link, target) in [("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")] {
        symlink(target, stage.join(link))?;
    }
    for dir in
        ["dev", "proc", "sys", "tmp", "run", &RUN_MOUNT[1..], "var/tmp", "var/lib", "var/log", "var/cache", "home"]
    {
        fs::create_dir_all(stage.join(dir))?;
    }
    mkfs(&stage, &image, "credwatch-base")?;
    fs::remove_dir_all(&stage)?;
    fs::write(&stamp_file, stamp)?;
    println!("kernels: base image built in {:.0}s", start.elapsed().as_secs_f64());
    Ok(image)
}

/// An ext4 image of `stage` with room to spare, readable by every kernel of the matrix.
fn mkfs(stage: &Path, image: &Path, label: &str) -> Result<()> {
    let du = Command::new("du").args(["-sk", "--apparent-size"]).arg(stage).output().context("starting du")?;
    let kib: u64 = String::from_utf8_lossy(&du.stdout).split_whitespace().next().unwrap_or("0").parse().unwrap_or(0);
    let files =
        Command::new("sh").arg("-c").arg(r#"find "$0" | wc -l"#).arg(stage).output().context("counting files")?;
    let files: u64 = String::from_utf8_lossy(&files.stdout).trim().parse().unwrap_or(0);
    // ext4's overhead, block rounding of small files, and room for what the guest writes.
    let size_kib = kib + kib / 4 + files * 4 + 1024 * 1024;
    let inodes = files + files / 4 + 65536;
    let _ = fs::remove_file(image);
    let tmp = image.with_extension("tmp");
    // Made here (sparse) so that mke2fs does not announce that it creates it.
    fs::File::create(&tmp)
        .and_then(|f| f.set_len(size_kib * 1024))
        .with_context(|| format!("creating {}", tmp.display()))?;
    let status = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-L", label, "-m", "0"])
        // orphan_file: 5.10 mounts such a filesystem read-only.
        .args(["-O", "^orphan_file", "-N", &inodes.to_string(), "-d"])
        .arg(stage)
        .arg(&tmp)
        .status()
        .context("starting mke2fs")?;
    if !status.success() {
        bail!("mke2fs -d {} failed ({status})", stage.display());
    }
    fs::rename(&tmp, image)?;
    Ok(())
}

/// Single-quoted for sh.
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// Removes the cargo build directories (marked by cargo's CACHEDIR.TAG) under `dir`: the
/// fuzz targets' `core/fuzz/target` (1.8 GB after `cargo xtask test`'s fuzz step) would
/// otherwise be written to every boot's run disk (measured: 75 s of mke2fs a boot, 2.5 s
/// without it).
fn remove_build_dirs(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?.flatten() {
        let path = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if path.join("CACHEDIR.TAG").is_file() {
            fs::remove_dir_all(&path).with_context(|| format!("removing {}", path.display()))?;
        } else {
            remove_build_dirs(&path)?;
        }
    }
    Ok(())
}

/// The run disk: the workspace at its own path, the binaries, the command and its environment.
fn run_disk(run: &Run, dir: &Path) -> Result<PathBuf> {
    let workspace = crate::workspace().canonicalize()?;
    let stage = dir.join("stage");
    let _ = fs::remove_dir_all(&stage);
    let at = |path: &Path| stage.join(path.strip_prefix("/").expect("absolute"));
    // The sources and fixtures; of target/ only what the guest runs.
    for entry in fs::read_dir(&workspace)?.flatten() {
        let name = entry.file_name();
        if name == "target" || name == ".git" {
            continue;
        }
        copy_tree(&entry.path(), &at(&workspace.join(&name)), true)?;
    }
    remove_build_dirs(&at(&workspace))?;
    let mut add: Vec<PathBuf> = [
        "target/release/credwatch",
        "target/x86_64-unknown-linux-gnu/release/credwatch",
        "target/e2e-wheels",
        "target/bpf/bpfel-unknown-none/release/credwatch",
    ]
    .iter()
    .map(|p| workspace.join(p))
    .filter(|p| p.exists())
    .collect();
    // A file of target/ that the command names (a test binary) comes along without --add.
    let named = run
        .command
        .split_whitespace()
        .map(|word| workspace.join(word))
        .filter(|p| p.starts_with(workspace.join("target")) && p.is_file() && !add.contains(p));
    let named: Vec<PathBuf> = named.collect();
    for path in run.add.iter().chain(&named) {
        let path = if path.is_absolute() { path.clone() } else { workspace.join(path) };
        add.push(path.canonicalize().with_context(|| format!("--add {}", path.display()))?);
    }
    let mut binds = vec![workspace.clone()];
    for path in &add {
        copy_tree(path, &at(path), true)?;
        if !path.starts_with(&workspace) {
            binds.push(path.clone());
        }
    }
    let kernels = stage.join(".kernels");
    fs::create_dir_all(&kernels)?;
    fs::write(
        kernels.join("init.sh"),
        GUEST_INIT.replace("@RUN@", RUN_MOUNT).replace("@START@", START_MARK).replace("@EXIT@", EXIT_MARK),
    )?;
    fs::copy("/usr/bin/busybox", kernels.join("busybox")).context("copying busybox")?;
    fs::write(kernels.join("cmd.sh"), format!("{}\n", run.command))?;
    fs::write(kernels.join("cwd"), format!("{}\n", workspace.display()))?;
    fs::write(kernels.join("binds"), binds.iter().map(|b| format!("{}\n", b.display())).collect::<String>())?;
    let mut env = vec![
        ("HOME".to_owned(), "/root".to_owned()),
        ("USER".into(), "root".into()),
        ("LOGNAME".into(), "root".into()),
        ("PATH".into(), guest_path()),
        ("LANG".into(), "C.UTF-8".into()),
        ("TERM".into(), "dumb".into()),
        ("RUST_BACKTRACE".into(), "1".into()),
        ("CREDWATCH_E2E_SLOW".into(), SLOW_FACTOR.into()),
        // The e2e Sandbox puts cargo's directory first on PATH, as cargo sets it on the host: the
        // toolchain's own cargo (in the base image), whose rustc needs no rustup HOME.
        ("CARGO".into(), std::env::var("CARGO").unwrap_or_else(|_| "/root/.cargo/bin/cargo".into())),
        ("CREDWATCH_GUEST_KERNEL".into(), run.kernel.series.name.into()),
        ("CREDWATCH_GUEST_LSM".into(), if run.lsm { LSM_LIST.into() } else { String::new() }),
    ];
    env.extend(run.env.iter().cloned());
    let env_file: String = env.iter().map(|(k, v)| format!("{k}={}\n", quote(v))).collect();
    fs::write(kernels.join("env"), env_file)?;
    let image = dir.join("run.ext4");
    mkfs(&stage, &image, "credwatch-run")?;
    fs::remove_dir_all(&stage)?;
    Ok(image)
}

/// Boots the kernel, runs the command, returns its status and output.
pub fn run(cache: &Path, run: &Run) -> Result<Outcome> {
    let base = {
        let _lock = CacheLock::take(cache)?;
        base_image(cache)?
    };
    // Unique per boot: the matrix boots several at once.
    static BOOTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = BOOTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = crate::workspace().join("target/kernels").join(format!("run-{}-{n}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let result = boot(&base, run, &dir);
    let _ = fs::remove_dir_all(&dir);
    result
}

fn boot(base: &Path, run: &Run, dir: &Path) -> Result<Outcome> {
    let disk = run_disk(run, dir)?;
    let console = dir.join("console.log");
    let mut append = String::from("console=ttyS0 panic=-1 quiet");
    if run.lsm {
        append.push_str(&format!(" lsm={LSM_LIST}"));
    }
    let start = Instant::now();
    let mut child = Command::new("qemu-system-x86_64")
        .args(if run.icount {
            ["-accel", "tcg", "-icount", "shift=0,sleep=on", "-smp", "1"].as_slice()
        } else {
            ["-accel", "tcg,thread=multi", "-smp", "2"].as_slice()
        })
        .args(["-cpu", "max", "-m", "4G"])
        .args(["-nodefaults", "-display", "none", "-no-reboot", "-nic", "none"])
        .arg("-kernel")
        .arg(&run.kernel.bzimage)
        .arg("-initrd")
        .arg(&run.kernel.initrd)
        .args(["-append", &append])
        .arg("-drive")
        .arg(format!("file={},format=raw,if=virtio,snapshot=on,cache=unsafe", base.display()))
        .arg("-drive")
        .arg(format!("file={},format=raw,if=virtio,cache=unsafe", disk.display()))
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .args(["-serial", "stdio"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting qemu-system-x86_64")?;
    let pid = child.id() as libc::pid_t;
    let (done, watchdog) = mpsc::channel::<()>();
    let timeout = run.timeout;
    let killer = thread::spawn(move || {
        let expired = matches!(watchdog.recv_timeout(timeout), Err(mpsc::RecvTimeoutError::Timeout));
        if expired {
            // SAFETY: the pid is our qemu child, not yet reaped (we wait for it after this thread).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        expired
    });
    let mut output = String::new();
    let mut status = None;
    let mut boot = None;
    let stdout = child.stdout.take().expect("piped");
    let mut echo = std::io::stdout();
    for line in BufReader::new(stdout).split(b'\n') {
        let line = line.context("reading the guest's serial port")?;
        let line = String::from_utf8_lossy(&line);
        let line = line.trim_end_matches('\r');
        if line == START_MARK {
            boot = Some(start.elapsed());
            continue;
        }
        if let Some(code) = line.strip_prefix(EXIT_MARK) {
            status = code.trim().parse::<i32>().ok();
            continue;
        }
        if run.echo {
            let _ = writeln!(echo, "{line}");
        }
        output.push_str(line);
        output.push('\n');
    }
    let exit = child.wait().context("waiting for qemu")?;
    let _ = done.send(());
    let timed_out = killer.join().unwrap_or(false);
    let total = start.elapsed();
    let Some(status) = status else {
        let log = fs::read_to_string(&console).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(60).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        let why = if timed_out { format!("timed out after {}s", timeout.as_secs()) } else { format!("qemu: {exit}") };
        bail!(
            "the {} guest{} ended without the command's exit status ({why}); its output:\n{output}\nlast console lines:\n{}",
            run.kernel.series.name,
            if run.lsm { " (lsm=bpf)" } else { "" },
            tail.join("\n")
        );
    };
    Ok(Outcome { status, output, boot: boot.unwrap_or_default(), total })
}
