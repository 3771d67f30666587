//! The scenarios the guest test targets share (`guest_backends` runs each on both sensor
//! backends, checks what each reported and compares them, `guest_deny` refuses):
//! each runs one payload as package code under `credwatch run OPTIONS` in a [`Sandbox`] and
//! returns the run and what the payload itself saw.

use std::{fs, path::PathBuf};

use serde_json::Value;

use crate::{fixtures, Run, Sandbox};

/// The fake SSH key's secret line (see `FAKE_CREDENTIALS`).
pub const SECRET: &str = "FAKE-credwatch-e2e-not-a-key";

/// Whether `bpf` is among the kernel's active LSMs (booted with `lsm=...,bpf`).
pub fn bpf_lsm_active() -> bool {
    let lsms = fs::read_to_string("/sys/kernel/security/lsm")
        .expect("reading /sys/kernel/security/lsm (is securityfs mounted?)");
    lsms.trim().split(',').any(|lsm| lsm == "bpf")
}

/// The outcome `--enforce` gives a payload's read of a key with the sensor backend `sensor`:
/// `denied` (the BPF LSM refuses the open with EPERM, the process lives) with the fentry
/// backend where bpf is an active LSM, else `blocked` (killed at the open).
pub fn refusal(sensor: &str) -> &'static str {
    if sensor == "fentry" && bpf_lsm_active() {
        "denied"
    } else {
        "blocked"
    }
}

/// What a payload that copies a key and records its own exit status left behind.
pub struct Stolen {
    pub run: Run,
    /// What the payload copied (empty when it got nothing).
    pub copy: String,
    /// The exit status of the copying command, as the shell saw it (`137`: SIGKILL).
    pub status: String,
}

fn read(path: &PathBuf) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

/// A real `npm install` of `npm/evil-postinstall`, whose postinstall (node) reads `~/.npmrc`.
pub fn npm_postinstall_reads_npmrc(sandbox: &Sandbox, options: &[&str]) -> Run {
    let tarball = sandbox.npm_pack("npm/evil-postinstall");
    let project = sandbox.npm_project();
    let alerts = sandbox.alerts_file();
    let report = sandbox.work().join("postinstall-report.json");
    sandbox.run_with(
        &project,
        options,
        &["npm", "install", tarball.to_str().unwrap()],
        &[("CREDWATCH_E2E_ALERTS", alerts.to_str().unwrap()), ("CREDWATCH_E2E_REPORT", report.to_str().unwrap())],
    )
}

/// A real `npm install` of `npm/evil-preinstall`, whose preinstall daemonises (fork, setsid,
/// fork) and reads `~/.ssh/id_ed25519` after npm exited. Returns the run and the payload's
/// report (its pid, whether npm was gone and its session left).
pub fn npm_daemon_reads_key_after_npm_exits(sandbox: &Sandbox, options: &[&str]) -> (Run, Value) {
    let tarball = sandbox.npm_pack("npm/evil-preinstall");
    let project = sandbox.npm_project();
    let report = sandbox.work().join("preinstall-report.json");
    let run = sandbox.run_with(
        &project,
        options,
        &["npm", "install", tarball.to_str().unwrap()],
        &[("CREDWATCH_E2E_REPORT", report.to_str().unwrap())],
    );
    // run lingers until the daemon has exited, so its report is there when run returns.
    let text = fs::read_to_string(&report)
        .unwrap_or_else(|e| panic!("the payload wrote no report {} ({e})\n{}", report.display(), run.describe()));
    (run, serde_json::from_str(&text).unwrap())
}

/// A real `cargo build --offline` of `cargo/build-script`, whose build script reads
/// `~/.cargo/credentials.toml`.
pub fn cargo_build_script_reads_credentials(sandbox: &Sandbox, options: &[&str]) -> Run {
    let krate = sandbox.copy_fixture("cargo/build-script");
    sandbox.run_with(&krate, options, &["cargo", "build", "--offline"], &[])
}

/// A real `npm install` of a package whose postinstall copies `~/.ssh/id_ed25519` with `cat`
/// and records cat's exit status.
pub fn npm_postinstall_copies_key(sandbox: &Sandbox, options: &[&str]) -> Stolen {
    let package = sandbox.work().join("key-thief");
    fs::create_dir_all(&package).unwrap();
    fs::write(
        package.join("package.json"),
        r#"{ "name": "key-thief", "version": "1.0.0", "scripts": { "postinstall": "sh steal.sh" } }"#,
    )
    .unwrap();
    fs::write(
        package.join("steal.sh"),
        "cat \"$HOME/.ssh/id_ed25519\" > \"$STEAL_COPY\"\necho $? > \"$STEAL_STATUS\"\n",
    )
    .unwrap();
    let tarball = sandbox.setup("npm pack", sandbox.command("npm").args(["pack", "--silent"]).current_dir(&package));
    let tarball = package.join(tarball.trim());
    let project = sandbox.npm_project();
    let (copy, status) = (sandbox.work().join("copy"), sandbox.work().join("status"));
    let run = sandbox.run_with(
        &project,
        options,
        &["npm", "install", tarball.to_str().unwrap()],
        &[("STEAL_COPY", copy.to_str().unwrap()), ("STEAL_STATUS", status.to_str().unwrap())],
    );
    Stolen { run, copy: read(&copy), status: read(&status).trim().to_owned() }
}

/// `credwatch run OPTIONS -- npm PACKAGE SCRIPT ARGS...` under the fake manager (see
/// `FAKE_MANAGER`): SCRIPT is the package's lifecycle script, package code.
pub fn fake_npm(sandbox: &Sandbox, options: &[&str], package: &str, script: &str, args: &[&str]) -> Run {
    let manager = sandbox.fake_manager();
    let mut cmd = vec![manager.to_str().unwrap(), package, script];
    cmd.extend_from_slice(args);
    sandbox.run_with(&sandbox.work(), options, &cmd, &[])
}

/// Package code hardlinking `~/.ssh/id_ed25519` to `$TMPDIR/h` and renaming
/// `~/.aws/credentials` to `$TMPDIR/c`.
pub fn key_linked_and_renamed(sandbox: &Sandbox, options: &[&str]) -> Run {
    let script = r#"ln "$HOME/.ssh/id_ed25519" "$TMPDIR/h" && mv "$HOME/.aws/credentials" "$TMPDIR/c""#;
    let run = fake_npm(sandbox, options, "linker", script, &[]);
    assert!(sandbox.top().join("h").is_file() && sandbox.top().join("c").is_file(), "{}", run.describe());
    run
}

/// Package code calling bpf() (a harmless BPF_PROG_GET_NEXT_ID) and sending SIGCONT to the
/// agent (its manager's parent). Nothing in the payload's command lines depends on the run.
pub fn tamper_syscalls(sandbox: &Sandbox, options: &[&str]) -> Run {
    let syscalls = fixtures().join("evasion/syscalls.py");
    let script = r#"
        python3 "$1" bpf
        read -r _ _ _ agent _ < /proc/$PPID/stat
        kill -CONT "$agent"
    "#;
    fake_npm(sandbox, options, "tamperer", script, &[syscalls.to_str().unwrap()])
}

/// Where the egress lab posts, as its DNS maps the invented name.
pub const COLLECTOR: (&str, &str) = ("collector.exfil.invalid", "127.0.0.9");
pub const COLLECTOR_PORT: u16 = 8080;

/// A real `npm install` of `npm/egress-probe` (case `exfil`: the postinstall reads `~/.npmrc`,
/// resolves an invented name and posts the file there) inside a mount and network namespace
/// of the test's own where only loopback exists (`egress/netns.sh`, as in egress.rs). Returns
/// the run and what the collector received.
pub fn npm_postinstall_exfiltrates(sandbox: &Sandbox, options: &[&str]) -> (Run, String) {
    let tarball = sandbox.npm_pack("npm/egress-probe");
    let project = sandbox.npm_project();
    let lab = sandbox.work().join("lab");
    fs::create_dir_all(&lab).unwrap();
    let netns = fixtures().join("egress/netns.sh");
    let (name, address) = COLLECTOR;
    let receivers = format!("--dns 127.0.0.53 --map {name}={address} --tcp {address}:{COLLECTOR_PORT}");
    let mut cmd = vec!["unshare", "--mount", "--net", "--", "sh", netns.to_str().unwrap(), lab.to_str().unwrap()];
    cmd.extend(["--", "npm", "install", tarball.to_str().unwrap()]);
    let run = sandbox.run_with(&project, options, &cmd, &[("EGRESS_CASE", "exfil"), ("NETLAB_ARGS", &receivers)]);
    assert!(lab.join("ready").exists(), "the lab never started\n{}", run.describe());
    let received = read(&lab.join(format!("tcp-{address}-{COLLECTOR_PORT}")));
    (run, received)
}

/// The alerts of `run` made comparable across two runs in two sandboxes: the sandbox's own
/// directory spelled `<sandbox>`, cargo's 16-hex-digit hashes `<hash>`, and the fields that
/// must differ between runs dropped (ids, pids, times), along with the `extra` keys. Sorted,
/// one JSON text each.
pub fn comparable(run: &Run, sandbox: &Sandbox, extra: &[&str]) -> Vec<String> {
    let top = sandbox.top().to_string_lossy().into_owned();
    let pins = sandbox.pin_dir().to_string_lossy().into_owned();
    let mut alerts: Vec<String> = run
        .alerts()
        .into_iter()
        .map(|mut alert| {
            normalise(&mut alert, &[top.as_str(), pins.as_str()], extra);
            alert.to_string()
        })
        .collect();
    alerts.sort();
    alerts
}

/// Keys whose values differ from run to run whatever the backend.
const VARYING: &[&str] =
    &["@timestamp", "id", "pid", "ppid", "root_pid", "target_pid", "down_from", "down_to", "seconds"];

fn normalise(value: &mut Value, dirs: &[&str], extra: &[&str]) {
    match value {
        Value::Object(map) => {
            map.retain(|key, _| !VARYING.contains(&key.as_str()) && !extra.contains(&key.as_str()));
            map.values_mut().for_each(|v| normalise(v, dirs, extra));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| normalise(v, dirs, extra)),
        Value::String(text) => {
            for dir in dirs {
                *text = text.replace(dir, "<sandbox>");
            }
            *text = without_hashes(text);
        }
        _ => {}
    }
}

/// `text` with each `-` followed by exactly 16 hex digits (cargo's metadata hashes, which
/// depend on the project's path) spelled `-<hash>`.
fn without_hashes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('-') {
        out.push_str(&rest[..=at]);
        rest = &rest[at + 1..];
        let digits = rest.bytes().take_while(u8::is_ascii_hexdigit).count();
        let ends_word = rest[digits..].bytes().next().is_none_or(|b| !b.is_ascii_alphanumeric());
        if digits == 16 && ends_word {
            out.push_str("<hash>");
            rest = &rest[16..];
        }
    }
    out.push_str(rest);
    out
}
