//! Debian's cloud kernels, downloaded once with apt-get into a private apt state (never the
//! host's /etc/apt), unpacked to a bzImage and an initramfs that loads virtio_blk.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
};

use anyhow::{bail, Context, Result};

/// A kernel series of the matrix: the newest cloud kernel of one Debian suite.
#[derive(Debug, Clone, Copy)]
pub struct Series {
    /// What `--kernel` takes and the table shows (`sid` is whatever 7.x sid has today).
    pub name: &'static str,
    pub suite: &'static str,
}

pub const SERIES: [Series; 4] = [
    Series { name: "5.10", suite: "bullseye" },
    Series { name: "6.1", suite: "bookworm" },
    Series { name: "6.12", suite: "trixie" },
    Series { name: "sid", suite: "sid" },
];

/// The cloud kernels' metapackage: it depends on the image of the suite's newest kernel.
const META: &str = "linux-image-cloud-amd64";

/// A kernel ready to boot.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub series: Series,
    /// The Debian package version (`6.12.117-1`).
    pub version: String,
    /// `uname -r` in the guest (`6.12.117+deb13-cloud-amd64`).
    pub release: String,
    pub bzimage: PathBuf,
    pub initrd: PathBuf,
}

/// The kernel of `series` from the cache, downloading and unpacking it the first time.
pub fn kernel(cache: &Path, series: Series) -> Result<Kernel> {
    let dir = cache.join(series.suite);
    let done = dir.join("kernel.txt");
    if !done.is_file() {
        prepare(cache, series, &dir)
            .with_context(|| format!("preparing the {} kernel ({})", series.name, series.suite))?;
    }
    let text = fs::read_to_string(&done).with_context(|| format!("reading {}", done.display()))?;
    let mut lines = text.lines();
    let (Some(version), Some(release)) = (lines.next(), lines.next()) else {
        bail!("{} is damaged: remove {} and run again", done.display(), dir.display());
    };
    Ok(Kernel {
        series,
        version: version.to_owned(),
        release: release.to_owned(),
        bzimage: dir.join("vmlinuz"),
        initrd: dir.join("initrd.cpio"),
    })
}

/// Apt with its own sources list, lists and cache under `cache/apt`.
fn apt(cache: &Path, program: &str) -> Result<Command> {
    let root = cache.join("apt");
    for dir in ["lists/partial", "cache/archives/partial"] {
        fs::create_dir_all(root.join(dir)).with_context(|| format!("creating {}", root.join(dir).display()))?;
    }
    let sources = root.join("sources.list");
    let lines: String = SERIES
        .iter()
        .map(|s| {
            format!(
                "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian {} main\n",
                s.suite
            )
        })
        .collect();
    fs::write(&sources, lines).with_context(|| format!("writing {}", sources.display()))?;
    let mut command = Command::new(program);
    for option in [
        format!("Dir::Etc::SourceList={}", sources.display()),
        "Dir::Etc::SourceParts=/nonexistent".into(),
        format!("Dir::State::Lists={}", root.join("lists").display()),
        format!("Dir::Cache={}", root.join("cache").display()),
        "Dir::State::status=/dev/null".into(),
        "APT::Architecture=amd64".into(),
        // The downloads land in our cache directory, which _apt may not be able to write.
        "APT::Sandbox::User=root".into(),
        "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false".into(),
    ] {
        command.arg("-o").arg(option);
    }
    Ok(command)
}

fn output(command: &mut Command, what: &str) -> Result<String> {
    let out = command.output().with_context(|| format!("starting {what}"))?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A package name and the version a `(= version)` pins.
type Dependency = (String, Option<String>);

/// `Depends:` of `package` (`name/suite` or `name=version`), first stanza: (name, pinned version).
fn depends(cache: &Path, package: &str) -> Result<(String, Vec<Dependency>)> {
    let text = output(apt(cache, "apt-cache")?.args(["show", package]), &format!("apt-cache show {package}"))?;
    let stanza = text.split("\n\n").next().unwrap_or_default();
    let field =
        |name: &str| stanza.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned())).unwrap_or_default();
    let version = field("Version:");
    let deps = field("Depends:")
        .split(',')
        .filter_map(|alternatives| {
            // `a | b`: the kernel's own packages never come as alternatives.
            let dep = alternatives.split('|').next()?.trim();
            let (name, rest) = dep.split_once(' ').unwrap_or((dep, ""));
            let version = rest.trim().strip_prefix("(=").and_then(|v| v.strip_suffix(')')).map(|v| v.trim().to_owned());
            Some((name.to_owned(), version))
        })
        .collect();
    Ok((version, deps))
}

/// The packages that hold the newest cloud kernel of the suite and its modules: the image
/// (`linux-image-*`, or on 7.x `linux-binary-*`) and `linux-modules-*` where they are split off.
fn kernel_packages(cache: &Path, suite: &str) -> Result<(String, Vec<String>)> {
    let (meta_version, deps) = depends(cache, &format!("{META}/{suite}"))?;
    let mut queue: Vec<(String, String)> = deps
        .into_iter()
        .filter(|(name, _)| name.starts_with("linux-image-"))
        .map(|(name, version)| (name, version.unwrap_or_else(|| meta_version.clone())))
        .collect();
    let mut seen = BTreeSet::new();
    let mut packages = Vec::new();
    while let Some((name, version)) = queue.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let pinned = format!("{name}={version}");
        let (_, deps) = depends(cache, &pinned)?;
        packages.push(pinned);
        for (dep, dep_version) in deps {
            let ours = ["linux-image-", "linux-binary-", "linux-modules-"].iter().any(|p| dep.starts_with(p));
            if ours {
                queue.push((dep, dep_version.unwrap_or_else(|| version.clone())));
            }
        }
    }
    if packages.is_empty() {
        bail!("{META} in {suite} depends on no linux-image package");
    }
    Ok((meta_version, packages))
}

fn prepare(cache: &Path, series: Series, dir: &Path) -> Result<()> {
    // One update serves every suite of the run.
    static UPDATED: AtomicBool = AtomicBool::new(false);
    if !UPDATED.swap(true, Ordering::SeqCst) {
        crate::run(
            "apt-get update (private lists under the kernel cache)",
            apt(cache, "apt-get")?.args(["-q", "update"]),
        )?;
    }
    let (version, packages) = kernel_packages(cache, series.suite)?;
    let _ = fs::remove_dir_all(dir);
    let debs = dir.join("debs");
    let unpacked = dir.join("unpacked");
    fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
    crate::run(
        &format!("download {}", packages.join(" ")),
        apt(cache, "apt-get")?.current_dir(&debs).arg("download").args(&packages),
    )?;
    for deb in fs::read_dir(&debs)?.flatten() {
        crate::run(
            &format!("unpack {}", deb.file_name().to_string_lossy()),
            Command::new("dpkg-deb").arg("-x").arg(deb.path()).arg(&unpacked),
        )?;
    }
    // 5.10 and 6.1 put them in /boot and /lib/modules, 6.12 in /usr/lib/modules, 7.x keeps the
    // image next to its modules.
    let modules_root = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|d| unpacked.join(d))
        .find(|d| d.is_dir())
        .with_context(|| format!("no lib/modules in {}", packages.join(" ")))?;
    let release_dir = fs::read_dir(&modules_root)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("kernel").is_dir())
        .with_context(|| format!("no kernel modules under {}", modules_root.display()))?;
    let release = release_dir.file_name().expect("a directory entry has a name").to_string_lossy().into_owned();
    let bzimage = [unpacked.join(format!("boot/vmlinuz-{release}")), release_dir.join("vmlinuz")]
        .into_iter()
        .find(|p| p.is_file())
        .with_context(|| format!("no vmlinuz for {release} in {}", packages.join(" ")))?;
    fs::rename(&bzimage, dir.join("vmlinuz"))?;
    super::initramfs::make(&release_dir, &release, &dir.join("initrd.cpio"))?;
    fs::remove_dir_all(&unpacked)?;
    fs::remove_dir_all(&debs)?;
    fs::write(dir.join("kernel.txt"), format!("{version}\n{release}\n"))?;
    println!("kernels: {} = Debian {} linux {version} ({release})", series.name, series.suite);
    Ok(())
}
