//! Issue 4: the evasion suite. Each test is a payload that hides its read of a (fake) key the
//! way a careful stealer would, run as package code under a fake `npm`, and must still be
//! reported. Run as root with `cargo xtask test`.

use std::{
    fs,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use credwatch_e2e::{fixtures, in_tree, Run, Sandbox, Sleeper, EXIT_ALERT};
use serde_json::Value;

/// The fake key's secret line (see `FAKE_CREDENTIALS`).
const SECRET: &str = "FAKE-credwatch-e2e-not-a-key";

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

fn key(sandbox: &Sandbox) -> String {
    sandbox.credential(".ssh/id_ed25519")
}

/// `credwatch run -- npm PACKAGE SCRIPT ARGS...` under the fake manager: SCRIPT is the
/// package's lifecycle script, package code.
fn payload(sandbox: &Sandbox, options: &[&str], package: &str, script: &str, args: &[&str]) -> Run {
    let manager = sandbox.fake_manager();
    let mut cmd = vec![manager.to_str().unwrap(), package, script];
    cmd.extend_from_slice(args);
    sandbox.run_with(&sandbox.work(), options, &cmd, &[])
}

/// The first alert that `wanted` accepts, or a failure that shows the whole run.
#[track_caller]
fn expect(run: &Run, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
    run.alerts().into_iter().find(|a| wanted(a)).unwrap_or_else(|| panic!("no alert for {what}\n{}", run.describe()))
}

/// A key alert of rule `ssh-private-keys` for `path` by package `package`.
#[track_caller]
fn expect_key_alert(run: &Run, package: &str, path: &str) -> Value {
    let alert = expect(run, path, |a| a["file"]["path"] == path && a["rule"]["id"] == "ssh-private-keys");
    assert_eq!(alert["package"]["name"], package, "{alert:#}");
    assert_eq!(alert["package"]["manager"], "npm", "{alert:#}");
    alert
}

#[test]
fn a_double_forked_setsid_payload_is_followed() {
    let sandbox = Sandbox::new();
    let script = r#"
import os, time
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
time.sleep(0.5)
open(os.path.expanduser("~/.ssh/id_ed25519")).read()
"#;
    let run = payload(&sandbox, &[], "daemon", r#"python3 -c "$1""#, &[script]);

    run.assert_exit(EXIT_ALERT);
    let alert = expect_key_alert(&run, "daemon", &key(&sandbox));
    assert!(alert["process"]["executable"].as_str().is_some_and(|e| e.contains("python3")), "{alert:#}");
}

/// The payload leaves the manager's session and reads the key 30 s after the manager exited.
#[test]
fn a_payload_reading_30_s_after_the_manager_exited_is_caught() {
    let sandbox = Sandbox::new();
    let script = r#"setsid sh -c 'sleep 30; cat "$HOME/.ssh/id_ed25519" > /dev/null' < /dev/null > /dev/null 2>&1 &"#;
    let run = payload(&sandbox, &["--linger", "60"], "sleeper", script, &[]);

    run.assert_exit(EXIT_ALERT);
    expect_key_alert(&run, "sleeper", &key(&sandbox));
    assert!(run.elapsed >= Duration::from_secs(30), "the read came too early\n{}", run.describe());
}

/// node copied to an innocent name reads the key: the process is what counts, not its name;
/// running a program the tree wrote is reported too.
#[test]
fn a_copied_and_renamed_interpreter_is_caught() {
    let sandbox = Sandbox::new();
    let script = r#"cp "$(command -v node)" "$TMPDIR/xyz" && "$TMPDIR/xyz" -e 'require("fs").readFileSync(require("os").homedir() + "/.ssh/id_ed25519")'"#;
    let run = payload(&sandbox, &[], "renamed", script, &[]);

    run.assert_exit(EXIT_ALERT);
    let copy = sandbox.top().join("xyz").to_string_lossy().into_owned();
    let alert = expect_key_alert(&run, "renamed", &key(&sandbox));
    assert_eq!(text(&alert["process"]["executable"]), copy, "{alert:#}");
    let exec = expect(&run, "running the copy", |a| a["rule"]["id"] == "exec-of-written-file");
    assert_eq!(text(&exec["credwatch"]["written_file"]), copy, "{exec:#}");
}

/// A static binary (no libc to hook, no interpreter) dropped in /tmp and run.
#[test]
fn a_static_binary_dropped_in_tmp_is_caught() {
    let sandbox = Sandbox::new();
    let reader = sandbox.work().join("reader");
    let built = sandbox
        .command("gcc")
        .args(["-static", "-O2", "-o"])
        .arg(&reader)
        .arg(fixtures().join("evasion/reader.c"))
        .output()
        .is_ok_and(|output| output.status.success());
    if !built {
        // No compiler or no static libc: a copied system binary stands in.
        println!("gcc -static failed: /bin/cat stands in for the static binary");
        fs::copy("/bin/cat", &reader).unwrap();
    }
    let script = r#"cp "$1" "$TMPDIR/kworker" && "$TMPDIR/kworker" "$HOME/.ssh/id_ed25519" > "$TMPDIR/loot""#;
    let run = payload(&sandbox, &[], "dropper", script, &[reader.to_str().unwrap()]);

    run.assert_exit(EXIT_ALERT);
    let dropped = sandbox.top().join("kworker").to_string_lossy().into_owned();
    assert!(fs::read_to_string(sandbox.top().join("loot")).unwrap_or_default().contains(SECRET), "{}", run.describe());
    let alert = expect_key_alert(&run, "dropper", &key(&sandbox));
    assert_eq!(text(&alert["process"]["executable"]), dropped, "{alert:#}");
    let exec = expect(&run, "running the dropped binary", |a| a["rule"]["id"] == "exec-of-written-file");
    assert_eq!(text(&exec["credwatch"]["written_file"]), dropped, "{exec:#}");
}

/// A symlink made before credwatch started: the read through it is the key's.
#[test]
fn a_read_through_an_old_symlink_to_a_key_is_caught_as_the_key() {
    let sandbox = Sandbox::new();
    let link = sandbox.work().join("notes.txt");
    std::os::unix::fs::symlink(key(&sandbox), &link).unwrap();
    let run = payload(&sandbox, &[], "symlinked", r#"cat "$1" > /dev/null"#, &[link.to_str().unwrap()]);

    run.assert_exit(EXIT_ALERT);
    let alert = expect_key_alert(&run, "symlinked", &key(&sandbox));
    assert_eq!(text(&alert["file"]["given_path"]), link.to_str().unwrap(), "{alert:#}");
    assert_eq!(alert["event"]["action"], "open", "{alert:#}");
}

/// Package code pointing a symlink at the key: the symlink is reported (the read through it
/// is then a repeat of the same alert, counted, not printed).
#[test]
fn a_symlink_to_a_key_made_by_package_code_is_caught() {
    let sandbox = Sandbox::new();
    let script = r#"ln -s "$HOME/.ssh/id_ed25519" "$TMPDIR/notes.txt" && cat "$TMPDIR/notes.txt" > /dev/null"#;
    let run = payload(&sandbox, &[], "symlinker", script, &[]);

    run.assert_exit(EXIT_ALERT);
    let alert = expect_key_alert(&run, "symlinker", &key(&sandbox));
    assert_eq!(alert["event"]["action"], "symlink", "{alert:#}");
    assert_eq!(text(&alert["file"]["renamed_to"]), sandbox.top().join("notes.txt").to_str().unwrap(), "{alert:#}");
}

/// A hardlink made before credwatch started has a name no rule knows: the sensor matches the
/// key's inode.
#[test]
fn an_old_hardlink_to_a_key_is_caught_by_its_inode() {
    let sandbox = Sandbox::new();
    let link = sandbox.work().join("backup.dat");
    fs::hard_link(key(&sandbox), &link).unwrap();
    let run = payload(&sandbox, &[], "hardlinked", r#"cat "$1" > /dev/null"#, &[link.to_str().unwrap()]);

    run.assert_exit(EXIT_ALERT);
    let link = link.to_string_lossy().into_owned();
    let alert = expect(&run, &link, |a| a["file"]["path"] == link.as_str());
    assert_eq!(alert["rule"]["id"], "ssh-private-keys", "{alert:#}");
    assert_eq!(text(&alert["file"]["same_file_as"]), key(&sandbox), "{alert:#}");
    assert_eq!(alert["package"]["name"], "hardlinked", "{alert:#}");
}

/// Package code linking the key to a new name: the link is reported (the read through the new
/// name is then a repeat of the same alert, counted, not printed).
#[test]
fn a_hardlink_to_a_key_made_by_package_code_is_caught() {
    let sandbox = Sandbox::new();
    let script = r#"ln "$HOME/.ssh/id_ed25519" "$TMPDIR/h" && cat "$TMPDIR/h" > /dev/null"#;
    let run = payload(&sandbox, &[], "linker", script, &[]);

    run.assert_exit(EXIT_ALERT);
    let link = sandbox.top().join("h").to_string_lossy().into_owned();
    let linked = expect_key_alert(&run, "linker", &key(&sandbox));
    assert_eq!(linked["event"]["action"], "link", "{linked:#}");
    assert_eq!(text(&linked["file"]["renamed_to"]), link, "{linked:#}");
}

/// Six ways to spell a key's path, each on its own key (so that none is a repeat of another):
/// each alert names the real file and the path as the payload gave it.
#[test]
fn relative_dirfd_proc_self_dotdot_and_doubled_slash_paths_resolve_to_the_key() {
    let sandbox = Sandbox::new();
    let home = sandbox.home();
    let ssh = home.join(".ssh");
    let ssh_text = ssh.to_string_lossy().into_owned();
    let home_text = home.to_string_lossy().into_owned();
    for name in ["id_ecdsa", "id_dsa", "id_work", "id_backup"] {
        fs::write(ssh.join(name), format!("{SECRET}\n")).unwrap();
    }
    let script = r#"
        k=$HOME/.ssh
        (cd "$k" && cat id_rsa > /dev/null)
        python3 -c 'import os; d = os.open(os.path.expanduser("~/.ssh"), os.O_RDONLY | os.O_DIRECTORY); os.read(os.open("id_ecdsa", os.O_RDONLY, dir_fd=d), 99)'
        (cd "$k" && cat /proc/self/cwd/id_dsa > /dev/null)
        cat "/proc/self/root$k/id_ed25519" > /dev/null
        cat "$k/../.ssh/../.ssh/./id_work" > /dev/null
        cat "$HOME//.ssh///id_backup" > /dev/null
    "#;
    let run = payload(&sandbox, &[], "paths", script, &[]);

    run.assert_exit(EXIT_ALERT);
    let cases = [
        ("id_rsa", "id_rsa".to_owned()),
        ("id_ecdsa", "id_ecdsa".to_owned()),
        ("id_dsa", "/proc/self/cwd/id_dsa".to_owned()),
        ("id_ed25519", format!("/proc/self/root{ssh_text}/id_ed25519")),
        ("id_work", format!("{ssh_text}/../.ssh/../.ssh/./id_work")),
        ("id_backup", format!("{home_text}//.ssh///id_backup")),
    ];
    let alerts = run.alerts();
    let mut wrong = Vec::new();
    for (name, given) in &cases {
        let path = ssh.join(name).to_string_lossy().into_owned();
        match alerts.iter().find(|a| a["file"]["path"] == path.as_str()) {
            None => wrong.push(format!("{given}: no alert for {path}")),
            Some(a) if a["file"]["given_path"] != given.as_str() => {
                wrong.push(format!("{given}: given_path {}", a["file"]["given_path"]))
            }
            Some(a) if a["rule"]["id"] != "ssh-private-keys" => {
                wrong.push(format!("{given}: rule {}", a["rule"]["id"]))
            }
            Some(_) => {}
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}\n{}", run.describe());
}

/// cp, cat, tar and dd of ~/.ssh, each its own package tree.
#[test]
fn cp_cat_tar_and_dd_of_the_ssh_directory_are_caught() {
    let sandbox = Sandbox::new();
    let cases = [
        ("cp", r#"cp -r "$HOME/.ssh" "$TMPDIR/ssh-cp""#),
        ("cat", r#"cat "$HOME/.ssh/id_ed25519" > "$TMPDIR/ssh-cat""#),
        ("tar", r#"tar -C "$HOME" -cf "$TMPDIR/ssh.tar" .ssh"#),
        ("dd", r#"dd if="$HOME/.ssh/id_ed25519" of="$TMPDIR/ssh-dd" status=none"#),
    ];
    for (tool, script) in cases {
        let run = payload(&sandbox, &[], tool, script, &[]);
        run.assert_exit(EXIT_ALERT);
        let alert = expect_key_alert(&run, tool, &key(&sandbox));
        let executable = text(&alert["process"]["executable"]);
        assert!(executable.rsplit('/').next() == Some(tool), "{tool}: {alert:#}");
        fs::remove_file(sandbox.alerts_file()).unwrap();
    }
}

/// `find -exec cat` and `grep -r` over $HOME: one sweep alert listing the categories.
#[test]
fn find_and_grep_sweeping_home_give_a_credential_sweep() {
    let sandbox = Sandbox::new();
    let cases = [
        ("find", r#"find "$HOME" -type f -exec cat {} + > /dev/null"#),
        ("grep", r#"grep -r FAKE "$HOME" > /dev/null"#),
    ];
    for (tool, script) in cases {
        let run = payload(&sandbox, &[], tool, script, &[]);
        run.assert_exit(EXIT_ALERT);
        // The final summary lists every category swept (the first sweep alert, the three that
        // made it one, which depend on the order find and grep walk the home in).
        let sweep = expect(&run, "the sweep's final summary", |a| {
            a["rule"]["id"] == "credential-sweep" && a["credwatch"]["sweep"]["final"] == true
        });
        let categories: Vec<&str> =
            sweep["credwatch"]["sweep"]["categories"].as_array().unwrap().iter().map(text).collect();
        for category in ["cloud", "registry", "ssh", "gpg", "iac", "password-managers"] {
            assert!(categories.contains(&category), "{tool}: {category} missing in {sweep:#}");
        }
        assert_eq!(sweep["package"]["name"], tool, "{sweep:#}");
        let sweeps = run.alerts().iter().filter(|a| a["rule"]["id"] == "credential-sweep").count();
        assert!(sweeps <= 2, "{tool}: one sweep and its final summary, not {sweeps}\n{}", run.describe());
        fs::remove_file(sandbox.alerts_file()).unwrap();
    }
}

/// An io_uring IORING_OP_OPENAT of the key, which the open tracepoints never see: the io_uring
/// set-up by package code and its open submission are reported.
#[test]
fn an_io_uring_open_of_a_key_is_reported() {
    let sandbox = Sandbox::new();
    let (run, _) = key_copied_by_syscalls_py(&sandbox, "uring", "io_uring");
    let alert = expect(&run, "io_uring_setup", |a| a["rule"]["id"] == "io-uring-by-package");
    assert_eq!(alert["credwatch"]["syscall"]["name"], "io_uring_setup", "{alert:#}");
    assert_eq!(alert["package"]["name"], "uring", "{alert:#}");
    // The open itself is seen only as a submission (the io_uring tracepoint has no path).
    let open = expect(&run, "IORING_OP_OPENAT", |a| a["rule"]["id"] == "io-uring-file-ops");
    assert_eq!(open["credwatch"]["syscall"]["operation"], "IORING_OP_OPENAT", "{open:#}");
}

/// /proc/<pid>/environ and /proc/<pid>/mem of a process outside the tree.
#[test]
fn reading_another_process_environ_and_mem_is_caught() {
    let sandbox = Sandbox::new();
    let victim = Sleeper::start(&sandbox);
    let script =
        r#"cat "/proc/$1/environ" > /dev/null; python3 -c 'import sys; open("/proc/%s/mem" % sys.argv[1], "rb")' "$1""#;
    let run = payload(&sandbox, &[], "procspy", script, &[&victim.pid()]);

    run.assert_exit(EXIT_ALERT);
    for file in ["environ", "mem"] {
        let path = format!("/proc/{}/{file}", victim.pid());
        let alert = expect(&run, &path, |a| a["file"]["path"] == path.as_str());
        assert_eq!(alert["rule"]["id"], "proc-environ-mem", "{alert:#}");
        assert_eq!(alert["package"]["name"], "procspy", "{alert:#}");
    }
}

/// process_vm_readv of, and a ptrace attach to, a process outside the tree (tj-actions'
/// memory dump of the runner).
#[test]
fn process_vm_readv_and_ptrace_attach_to_another_process_are_caught() {
    let sandbox = Sandbox::new();
    let victim = Sleeper::start(&sandbox);
    let syscalls = fixtures().join("evasion/syscalls.py");
    let script = r#"python3 "$1" vm_readv "$2" && python3 "$1" ptrace "$2""#;
    let run = payload(&sandbox, &[], "memdump", script, &[syscalls.to_str().unwrap(), &victim.pid()]);

    run.assert_exit(EXIT_ALERT);
    let victim_pid: u32 = victim.pid().parse().unwrap();
    let read = expect(&run, "process_vm_readv", |a| a["rule"]["id"] == "process-vm-access");
    assert_eq!(read["credwatch"]["syscall"]["name"], "process_vm_readv", "{read:#}");
    assert_eq!(read["credwatch"]["syscall"]["target_pid"], victim_pid, "{read:#}");
    let attach = expect(&run, "ptrace", |a| a["rule"]["id"] == "ptrace-attach");
    assert_eq!(attach["credwatch"]["syscall"]["operation"], "PTRACE_ATTACH", "{attach:#}");
    assert_eq!(attach["credwatch"]["syscall"]["target_pid"], victim_pid, "{attach:#}");
    assert_eq!(attach["package"]["name"], "memdump", "{attach:#}");
}

/// name_to_handle_at + open_by_handle_at: an open with no path at all.
#[test]
fn open_by_handle_at_of_a_key_is_caught() {
    let sandbox = Sandbox::new();
    let (run, key) = key_copied_by_syscalls_py(&sandbox, "byhandle", "by_handle");
    let alert = expect_key_alert(&run, "byhandle", &key);
    assert!(alert["process"]["executable"].as_str().is_some_and(|e| e.contains("python3")), "{alert:#}");
}

/// Package `package` copies the fake key to a loot file with `syscalls.py MODE KEY LOOT`;
/// returns the run (exit checked) and the key's path. Not vacuous: the loot must hold the key.
fn key_copied_by_syscalls_py(sandbox: &Sandbox, package: &str, mode: &str) -> (Run, String) {
    let loot = sandbox.work().join("loot");
    let syscalls = fixtures().join("evasion/syscalls.py");
    let key = key(sandbox);
    let script = format!(r#"python3 "$1" {mode} "$2" "$3""#);
    let run = payload(sandbox, &[], package, &script, &[syscalls.to_str().unwrap(), &key, loot.to_str().unwrap()]);
    run.assert_exit(EXIT_ALERT);
    assert!(fs::read_to_string(&loot).unwrap_or_default().contains(SECRET), "{}", run.describe());
    (run, key)
}

fn wait_for_file(path: &Path, timeout: Duration) -> bool {
    let start = Instant::now();
    while !path.exists() {
        if start.elapsed() > timeout {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
    true
}

/// A payload started before `credwatch watch`, under a manager that was reparented to init
/// (as a daemonised install is), reads the key once watch is up: the alert comes from the
/// lineage watch seeded from /proc, rooted at that manager.
#[test]
fn a_payload_already_running_when_watch_starts_is_caught() {
    let sandbox = Sandbox::new();
    let dir = sandbox.work();
    let (pid_file, go, done) = (dir.join("manager.pid"), dir.join("go"), dir.join("done"));
    // A shell binary named npm, its own process the manager (`$$`) as npm's node is. It runs
    // the lifecycle script: write the manager's pid, wait for `go` (a minute at most, so that
    // a failed test leaves nothing running), read the key.
    let manager = dir.join("bin/npm");
    fs::create_dir_all(manager.parent().unwrap()).unwrap();
    fs::copy(fs::canonicalize("/bin/sh").unwrap(), &manager).unwrap();
    let script = r#"sh -c 'echo $1 > manager.pid; i=0; while [ ! -e go ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; cat "$HOME/.ssh/id_ed25519" > /dev/null; touch done' sh $$"#;
    // The outer sh exits at once: the manager's parent becomes init, outside the test's own
    // tree (the test runs under cargo, a package manager).
    sandbox.setup(
        "starting the payload",
        sandbox
            .command("sh")
            .args(["-c", r#"setsid "$@" < /dev/null > /dev/null 2>&1 &"#, "sh"])
            .args([manager.to_str().unwrap(), "-c", script])
            .envs([("npm_package_name", "early-bird"), ("npm_lifecycle_event", "postinstall")])
            .current_dir(&dir),
    );
    assert!(wait_for_file(&pid_file, Duration::from_secs(30)), "the payload did not start");
    let root: u32 = fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();

    let watch = sandbox.watch();
    fs::write(&go, "").unwrap();
    let key = key(&sandbox);
    let alert = sandbox.wait_for(|a| in_tree(a, root) && a["file"]["path"] == key.as_str(), Duration::from_secs(20));
    let read = wait_for_file(&done, Duration::from_secs(20));
    let run = watch.stop();
    let alert = alert.unwrap_or_else(|| {
        panic!("no alert from the tree of {root} (the payload read the key: {read})\n{}", run.describe())
    });
    run.assert_exit(0);
    assert_eq!(alert["rule"]["id"], "ssh-private-keys", "{alert:#}");
    assert_eq!(alert["package"]["name"], "early-bird", "{alert:#}");
    assert_eq!(alert["package"]["manager"], "npm", "{alert:#}");
    assert_eq!(alert["package"]["lifecycle"], "postinstall", "{alert:#}");
    let ancestors = alert["process"]["ancestors"].as_array().unwrap();
    assert_eq!(ancestors.first().map(|a| &a["pid"]), Some(&Value::from(root)), "the seeded root first: {alert:#}");
}
