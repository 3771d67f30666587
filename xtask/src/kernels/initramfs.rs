//! The busybox initramfs each kernel of the matrix boots: its init, which loads virtio_blk and
//! switches to the host's userland, and the kernel's own modules that init loads, found from their
//! .modinfo.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

/// Where the initramfs mounts the run disk in the guest.
pub const RUN_MOUNT: &str = "/mnt/kernels-run";

/// The busybox init of the initramfs: load the block driver, mount the disks, switch root.
const INITRAMFS_INIT: &str = r#"#!/bin/busybox sh
/bin/busybox mount -t devtmpfs dev /dev
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox --install -s /bin
fail() { echo "kernels initramfs: $*"; poweroff -f; }
for m in $(cat /modules/order); do insmod /modules/$m.ko || fail "insmod $m"; done
i=0
while [ ! -b /dev/vdb ]; do
    i=$((i+1)); [ $i -gt 200 ] && fail "no /dev/vdb after 20s"; sleep 0.1
done
mount -t ext4 /dev/vda /newroot || fail "mounting the base image"
mount -t ext4 /dev/vdb /newroot@RUN@ || fail "mounting the run disk"
mount --move /dev /newroot/dev
umount /proc /sys
exec switch_root /newroot /bin/sh @RUN@/.kernels/init.sh
"#;

/// The initramfs of a kernel: static busybox, the init above, virtio_blk, loop and their dependencies.
pub fn make(release_dir: &Path, release: &str, out: &Path) -> Result<()> {
    if !crate::busybox_static_installed() {
        bail!("the kernel matrix needs Debian's busybox-static");
    }
    let stage = out.with_extension("stage");
    let _ = fs::remove_dir_all(&stage);
    for dir in ["bin", "dev", "proc", "sys", "modules", "newroot"] {
        fs::create_dir_all(stage.join(dir))?;
    }
    fs::copy("/usr/bin/busybox", stage.join("bin/busybox")).context("copying /usr/bin/busybox")?;
    let init = stage.join("init");
    fs::write(&init, INITRAMFS_INIT.replace("@RUN@", RUN_MOUNT))?;
    set_mode(&init, 0o755)?;
    // virtio_pci is the transport (a module on 5.10 and 6.1, built in later); loop for the
    // sensor test that needs an ext4 of its own (tmpfs never reuses an inode number).
    let modules = module_closure(release_dir, &["virtio_pci", "virtio_blk", "loop"])?;
    let mut order = String::new();
    for (name, bytes) in &modules {
        fs::write(stage.join("modules").join(format!("{name}.ko")), bytes)?;
        order.push_str(name);
        order.push('\n');
    }
    fs::write(stage.join("modules/order"), order)?;
    let status = Command::new("sh")
        .arg("-c")
        .arg(r#"find . | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0 > "$0""#)
        .arg(out)
        .current_dir(&stage)
        .status()
        .context("starting cpio")?;
    if !status.success() {
        bail!("making the initramfs of {release} with cpio failed ({status})");
    }
    fs::remove_dir_all(&stage)?;
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).with_context(|| format!("chmod {}", path.display()))
}

/// The modules `wanted` needs, dependencies first, from the `depends=` of each module's
/// .modinfo (the packages ship no modules.dep: depmod makes it at install), decompressed.
fn module_closure(release_dir: &Path, wanted: &[&str]) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = BTreeMap::new();
    index_modules(&release_dir.join("kernel"), &mut files)?;
    let mut order = Vec::new();
    let mut done = BTreeSet::new();
    for name in wanted {
        visit(name, &files, &mut done, &mut order, 0)?;
    }
    Ok(order)
}

fn visit(
    name: &str,
    files: &BTreeMap<String, PathBuf>,
    done: &mut BTreeSet<String>,
    order: &mut Vec<(String, Vec<u8>)>,
    depth: usize,
) -> Result<()> {
    if depth > 32 {
        bail!("module dependencies of {name} loop");
    }
    if !done.insert(name.to_owned()) {
        return Ok(());
    }
    // Absent: built into this kernel (modules.builtin), nothing to load.
    let Some(path) = files.get(name) else { return Ok(()) };
    let bytes = decompress(path)?;
    for dep in modinfo_depends(&bytes) {
        visit(&dep, files, done, order, depth + 1)?;
    }
    order.push((name.to_owned(), bytes));
    Ok(())
}

fn index_modules(dir: &Path, files: &mut BTreeMap<String, PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            index_modules(&path, files)?;
        } else if let Some(name) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.split(".ko").next()) {
            files.insert(name.replace('-', "_"), path);
        }
    }
    Ok(())
}

fn decompress(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        "xz"
    } else if name.ends_with(".zst") {
        "zstd"
    } else {
        return fs::read(path).with_context(|| format!("reading {}", path.display()));
    };
    let out = Command::new(tool).arg("-dc").arg(path).output().with_context(|| format!("starting {tool}"))?;
    if !out.status.success() {
        bail!("{tool} -dc {} failed: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(out.stdout)
}

/// The `depends=a,b` string of a module's .modinfo section (NUL-separated `key=value`s).
fn modinfo_depends(module: &[u8]) -> Vec<String> {
    module
        .split(|&b| b == 0)
        .find_map(|field| field.strip_prefix(b"depends="))
        .map(|list| {
            String::from_utf8_lossy(list).split(',').filter(|d| !d.is_empty()).map(|d| d.replace('-', "_")).collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modinfo_depends_reads_the_nul_separated_field() {
        let module = b"\x7fELF...\0license=GPL\0depends=virtio_ring,virtio\0retpoline=Y\0name=virtio_blk\0";
        assert_eq!(modinfo_depends(module), ["virtio_ring", "virtio"]);
        assert!(modinfo_depends(b"\0depends=\0name=virtio\0").is_empty());
    }
}
