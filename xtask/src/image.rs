//! `cargo xtask image`: the container image `FROM scratch` (deploy/Dockerfile) holding the static
//! binary, built with the machine's container engine (`docker`; `DOCKER_HOST` says which daemon)
//! and tagged `credwatch:<version>` and `credwatch:latest`.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::{package::static_binary, run, workspace};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The image's name; tagged with the version and `latest`.
pub const IMAGE: &str = "credwatch";

/// The CA bundle of Debian's `ca-certificates`: the webhook's and NATS' TLS trust the system's
/// roots (rustls-native-certs looks here), and scratch has none.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// What the image holds besides the binary: (path in the image, source in the workspace or on
/// the build machine, mode).
const FILES: [(&str, &str, u32); 2] = [
    ("etc/credwatch/credwatch.yaml", "deploy/credwatch.yaml", 0o644),
    ("etc/ssl/certs/ca-certificates.crt", CA_BUNDLE, 0o644),
];

/// Empty folders: local rules (the default configuration names it, and a rules folder that does
/// not exist is an error), the spool and the alerts file (the DaemonSet mounts the host's over
/// them), and /tmp for whatever a library puts there.
const DIRS: [(&str, u32); 4] =
    [("etc/credwatch/rules.d", 0o755), ("var/lib/credwatch", 0o755), ("var/log/credwatch", 0o755), ("tmp", 0o1777)];

/// The engine's client: `docker`, or what `CREDWATCH_DOCKER` names (a podman, a client elsewhere
/// on the machine).
fn client() -> String {
    std::env::var("CREDWATCH_DOCKER").unwrap_or_else(|_| "docker".into())
}

pub fn docker() -> Command {
    Command::new(client())
}

/// Fails with what to do when no engine answers: no client, or no daemon behind it.
pub fn check_engine() -> Result<String> {
    engine_version(&client())
}

/// The engine's version, asked of `client`; the error says what to do when it does not answer.
fn engine_version(client: &str) -> Result<String> {
    let output = Command::new(client).args(["version", "--format", "{{.Server.Version}}"]).output();
    let output = match output {
        Ok(output) => output,
        Err(error) => bail!(
            "no container engine: `{client}` cannot be started ({error}); install one (Debian: apt-get install docker.io) or name its client in CREDWATCH_DOCKER"
        ),
    };
    let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if !output.status.success() || version.is_empty() {
        let host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| "the default socket".into());
        bail!(
            "no container engine answers at {host}: start dockerd (or point DOCKER_HOST at a running one); `{client} version` said: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(version)
}

/// Stages the build context: rootfs/ as the image's file system.
fn stage() -> Result<PathBuf> {
    let root = workspace();
    let context = root.join("target/image");
    if context.exists() {
        fs::remove_dir_all(&context).with_context(|| format!("removing {}", context.display()))?;
    }
    if !static_binary().is_file() {
        bail!("{} is missing: `cargo xtask build` builds it", static_binary().display());
    }
    let rootfs = context.join("rootfs");
    let binary = rootfs.join("usr/bin/credwatch");
    fs::create_dir_all(binary.parent().expect("a folder"))?;
    fs::copy(static_binary(), &binary).with_context(|| format!("copying {}", static_binary().display()))?;
    fs::set_permissions(&binary, fs::Permissions::from_mode(0o755))?;
    for (path, source, mode) in FILES {
        let from = if Path::new(source).is_absolute() { PathBuf::from(source) } else { root.join(source) };
        let to = rootfs.join(path);
        fs::create_dir_all(to.parent().expect("a folder"))?;
        fs::copy(&from, &to).with_context(|| {
            if source == CA_BUNDLE {
                format!("copying {CA_BUNDLE} (the image's TLS roots; Debian: apt-get install ca-certificates)")
            } else {
                format!("copying {}", from.display())
            }
        })?;
        fs::set_permissions(&to, fs::Permissions::from_mode(mode))?;
    }
    for (dir, mode) in DIRS {
        fs::create_dir_all(rootfs.join(dir))?;
        fs::set_permissions(rootfs.join(dir), fs::Permissions::from_mode(mode))?;
    }
    Ok(context)
}

/// `cargo xtask image` (after `build`): the image built and tagged; its size printed.
pub fn image() -> Result<()> {
    let engine = check_engine()?;
    println!("xtask: container engine: docker {engine}");
    let context = stage()?;
    let tag = format!("{IMAGE}:{VERSION}");
    run(
        &format!("build the image {tag} (deploy/Dockerfile, FROM scratch)"),
        docker()
            .arg("build")
            .args(["--tag", &tag, "--tag", &format!("{IMAGE}:latest")])
            .args(["--build-arg", &format!("VERSION={VERSION}")])
            .arg("--file")
            .arg(workspace().join("deploy/Dockerfile"))
            .arg(&context),
    )?;
    let size =
        docker().args(["image", "inspect", "--format", "{{.Size}}", &tag]).output().context("docker image inspect")?;
    if !size.status.success() {
        bail!("the image {tag} was built but `docker image inspect` does not find it");
    }
    let bytes: u64 = String::from_utf8_lossy(&size.stdout).trim().parse().context("the image's size")?;
    println!("xtask: image {tag} (and {IMAGE}:latest): {:.1} MB", bytes as f64 / 1e6);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in client: a script that prints `stdout`, `stderr` and exits with `status`.
    fn client(dir: &Path, stdout: &str, stderr: &str, status: i32) -> String {
        let path = dir.join("docker");
        fs::write(&path, format!("#!/bin/sh\necho '{stdout}'\necho '{stderr}' >&2\nexit {status}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path.to_string_lossy().into_owned()
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-image-{name}-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn no_client_and_no_daemon_are_errors_that_say_what_to_do() {
        let missing = engine_version("/nonexistent/docker").unwrap_err().to_string();
        assert!(missing.contains("`/nonexistent/docker` cannot be started"), "{missing}");
        assert!(missing.contains("apt-get install docker.io"), "{missing}");

        let dir = scratch("down");
        let down = client(&dir, "", "Cannot connect to the Docker daemon. Is the docker daemon running?", 1);
        let error = engine_version(&down).unwrap_err().to_string();
        assert!(error.contains("no container engine answers"), "{error}");
        assert!(error.contains("start dockerd"), "{error}");
        assert!(error.contains("Is the docker daemon running?"), "{error}");

        let up = client(&dir, "20.10.24", "", 0);
        assert_eq!(engine_version(&up).unwrap(), "20.10.24");
        fs::remove_dir_all(dir).unwrap();
    }
}
