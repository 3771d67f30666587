//! The Debian root that tests/tests/systemd_boot.rs boots with systemd as PID 1
//! (`systemd-nspawn -b`): debootstrapped once and kept in `target/nspawn/<key>`, where the key
//! names what it holds, with `target/nspawn/root` pointing at the current one. The test boots an
//! overlay of it, so the cached root is never written.

use std::{
    fs,
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _, Result};

use crate::{run, workspace};

const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";

/// Beyond minbase (dpkg, apt, coreutils, dash, passwd for the package's `groupadd`): systemd as
/// PID 1. The package tree the test runs is a script named `npm` (the exec's name makes a tree),
/// so neither node nor npm is needed: the host's tests run the real npm already.
const PACKAGES: [&str; 2] = ["systemd", "systemd-sysv"];

/// What the root holds, as its folder's name: another suite or package list is another root.
fn key() -> String {
    format!("{SUITE}-minbase-{}", PACKAGES.join("-"))
}

fn cache() -> PathBuf {
    workspace().join("target/nspawn")
}

/// `cargo xtask test` (root, network: Debian's mirror): the root made when missing (about
/// 40 s), then `target/nspawn/root` pointed at it.
pub fn prepare() -> Result<()> {
    let keyed = cache().join(key());
    if !keyed.join("sbin/init").exists() {
        // Made aside and renamed when complete: an interrupted debootstrap leaves no half root.
        let partial = cache().join(format!("{}.partial", key()));
        if partial.exists() {
            fs::remove_dir_all(&partial).with_context(|| format!("removing {}", partial.display()))?;
        }
        fs::create_dir_all(cache()).with_context(|| format!("creating {}", cache().display()))?;
        run(
            &format!("debootstrap {SUITE} with {} (the real-systemd test boots it)", PACKAGES.join(", ")),
            Command::new("debootstrap")
                .args(["--variant=minbase", &format!("--include={}", PACKAGES.join(","))])
                .arg(SUITE)
                .arg(&partial)
                .arg(MIRROR)
                .stdout(Stdio::null()),
        )?;
        // The downloaded .debs are of no use to the test (a third of the root's size).
        let archives = partial.join("var/cache/apt/archives");
        for entry in fs::read_dir(&archives).with_context(|| format!("reading {}", archives.display()))? {
            let path = entry?.path();
            if path.extension().is_some_and(|extension| extension == "deb") {
                fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            }
        }
        if keyed.exists() {
            fs::remove_dir_all(&keyed).with_context(|| format!("removing {}", keyed.display()))?;
        }
        fs::rename(&partial, &keyed)
            .with_context(|| format!("renaming {} to {}", partial.display(), keyed.display()))?;
    }
    let link = cache().join("root");
    let fresh = cache().join("root.new");
    let _ = fs::remove_file(&fresh);
    std::os::unix::fs::symlink(key(), &fresh).with_context(|| format!("creating {}", fresh.display()))?;
    fs::rename(&fresh, &link).with_context(|| format!("replacing {}", link.display()))?;
    if !link.join("sbin/init").exists() {
        bail!("{} holds no sbin/init after debootstrap", link.display());
    }
    Ok(())
}
