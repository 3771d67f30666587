//! `--to` outputs with the real binary: the `file` output's rotation and its reopen on `SIGHUP`
//! as logrotate's `create` and `copytruncate` need, and no alert lost while the receiver is
//! down and the agent restarts in between.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use credwatch_e2e::{credwatch_binary, parse_alerts, write_executable, Run, Sandbox};
use serde_json::Value;

/// Whether `alert` is about one of the files of [`Sandbox::secrets`] in `sandbox`: the machine may have
/// other package trees, which `watch` sees too.
fn ours(sandbox: &Sandbox, alert: &Value) -> bool {
    let dir = sandbox.credential(".password-store/e2e/");
    alert["file"]["path"].as_str().is_some_and(|path| path.starts_with(&dir))
}

/// The `event.id`s of [`ours`] alerts in the files given, in order, each once (the first time).
fn ids_in(sandbox: &Sandbox, files: &[PathBuf]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut ids = Vec::new();
    for file in files {
        for alert in parse_alerts(&fs::read_to_string(file).unwrap_or_default()).iter().filter(|a| ours(sandbox, a)) {
            let id = alert["event"]["id"].as_str().expect("event.id").to_owned();
            if seen.insert(id.clone()) {
                ids.push(id);
            }
        }
    }
    ids
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "{what}: not after {timeout:?}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// A package tree started before `watch`, detached from the test's own (cargo's) tree: once
/// `go` exists it executes a manager (a copy of sh named npm), whose lifecycle script, for each
/// stage N, waits for `stageN`, reads the files of that stage and touches `doneN`.
fn detached_tree(sandbox: &Sandbox, stages: &[&[String]]) -> PathBuf {
    let dir = sandbox.work().join("tree");
    let manager = dir.join("bin/npm");
    fs::create_dir_all(manager.parent().unwrap()).unwrap();
    fs::copy(fs::canonicalize("/bin/sh").unwrap(), &manager).unwrap();
    let mut script = String::new();
    for (n, files) in stages.iter().enumerate() {
        let n = n + 1;
        script += &format!("i=0; while [ ! -e stage{n} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; ");
        for file in *files {
            script += &format!("cat '{file}' > /dev/null; ");
        }
        script += &format!("touch done{n}; ");
    }
    let payload = dir.join("payload.sh");
    write_executable(&payload, &script);
    let outer = format!(
        "setsid sh -c 'while [ ! -e go ]; do sleep 0.05; done; exec \"$0\" \"$1\"' {} {} < /dev/null > tree.log 2>&1 &",
        manager.display(),
        payload.display()
    );
    sandbox.setup(
        "starting the waiting tree",
        sandbox
            .command("sh")
            .args(["-c", &outer])
            .envs([("npm_package_name", "spool-tree"), ("npm_lifecycle_event", "postinstall")])
            .current_dir(&dir),
    );
    dir
}

fn stage(dir: &Path, n: usize) {
    fs::write(dir.join(format!("stage{n}")), "").unwrap();
    wait_until(&format!("stage {n} of the tree"), Duration::from_secs(60), || dir.join(format!("done{n}")).exists());
}

/// `credwatch watch` with a configuration file, until it says it is watching.
fn watch(sandbox: &Sandbox, config: &Path) -> std::process::Child {
    let mut command = sandbox.command(credwatch_binary());
    command.args(["watch", "--json", "--output"]).arg(sandbox.alerts_file()).arg("--config").arg(config);
    let mut child = sandbox.spawn(command);
    let start = Instant::now();
    while !sandbox.collect(None, Duration::ZERO).stderr.contains("watching") {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("credwatch watch exited early\n{}", sandbox.collect(Some(status), start.elapsed()).describe());
        }
        assert!(start.elapsed() < Duration::from_secs(60), "credwatch watch never said it was watching");
        thread::sleep(Duration::from_millis(20));
    }
    child
}

fn signal(child: &std::process::Child, signal: &str) {
    assert!(Command::new("kill").args([signal, &child.id().to_string()]).status().unwrap().success());
}

#[test]
fn file_output_rotates_by_size_and_reopens_on_sighup_for_logrotate() {
    let sandbox = Sandbox::new();
    let files = sandbox.secrets(26);
    let out_dir = sandbox.top().join("out");
    fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join("alerts.jsonl");
    let numbered = |n: u32| out_dir.join(format!("alerts.jsonl.{n}"));
    // About three alerts a file.
    let config = sandbox.top().join("credwatch.yaml");
    fs::write(
        &config,
        format!(
            "spool_dir: {}\noutputs:\n  - to: file:{}\n    max_bytes: 4000\n    keep: 20\n",
            sandbox.top().join("spool").display(),
            out.display()
        ),
    )
    .unwrap();
    let tree = detached_tree(&sandbox, &[&files[..20], &files[20..25], &files[25..]]);
    let child = watch(&sandbox, &config);
    fs::write(tree.join("go"), "").unwrap();

    // Rotated by size: PATH.1 (newest) ... PATH.<n>, every file 0600 and under its cap unless
    // it holds one alert.
    stage(&tree, 1);
    let rotated = |upto: u32| -> Vec<PathBuf> {
        let mut all: Vec<PathBuf> = (1..=upto).rev().map(numbered).filter(|p| p.exists()).collect();
        all.push(out.clone());
        all
    };
    wait_until("20 alerts in the file output", Duration::from_secs(30), || ids_in(&sandbox, &rotated(20)).len() == 20);
    assert!(numbered(3).exists(), "20 alerts of ~1.3 kB in 4 kB files: rotated at least 3 times");
    for file in rotated(20) {
        let metadata = fs::metadata(&file).unwrap();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&metadata.permissions()) & 0o777, 0o600, "{file:?}");
        let lines = fs::read_to_string(&file).unwrap().lines().count();
        assert!(metadata.len() <= 4000 || lines == 1, "{file:?}: {} bytes", metadata.len());
    }
    let first = ids_in(&sandbox, &rotated(20));

    // logrotate's `create`: moved, a new file made, SIGHUP. What comes after the reopen goes to
    // the new file (and its rotations), none of it to the moved one.
    let moved = out_dir.join("alerts.jsonl-moved");
    fs::rename(&out, &moved).unwrap();
    fs::write(&out, "").unwrap();
    let in_moved = ids_in(&sandbox, std::slice::from_ref(&moved));
    signal(&child, "-HUP");
    wait_until("the reload after SIGHUP", Duration::from_secs(30), || {
        sandbox.collect(None, Duration::ZERO).stderr.contains("reloaded")
    });
    stage(&tree, 2);
    wait_until("25 alerts in the new file and the rotated ones", Duration::from_secs(30), || {
        let mut files = vec![moved.clone()];
        files.extend(rotated(20));
        ids_in(&sandbox, &files).len() == 25
    });
    assert_eq!(ids_in(&sandbox, std::slice::from_ref(&moved)), in_moved);
    assert!(!fs::read_to_string(&out).unwrap().is_empty(), "nothing in the new file");

    // logrotate's `copytruncate`: copied, truncated in place; no signal. The next alert starts
    // the file (appended, no hole where the old end was).
    let copy = out_dir.join("alerts.jsonl-copy");
    fs::copy(&out, &copy).unwrap();
    fs::OpenOptions::new().write(true).open(&out).unwrap().set_len(0).unwrap();
    stage(&tree, 3);
    wait_until("1 alert in the truncated file", Duration::from_secs(30), || {
        ids_in(&sandbox, std::slice::from_ref(&out)).len() == 1
    });
    let text = fs::read(&out).unwrap();
    assert_eq!(text.first(), Some(&b'{'), "the truncated file starts with a hole");
    assert_eq!(text.iter().filter(|b| **b == b'\n').count(), 1);

    signal(&child, "-TERM");
    let run: Run = sandbox.wait(child);
    run.assert_exit(0);
    // Every alert of the agent's own output is in the file output's files exactly once, and
    // nothing else is.
    let mut all = rotated(20);
    all.extend([moved.clone(), copy.clone()]);
    let mut delivered: Vec<String> = Vec::new();
    for file in &all {
        let alerts = parse_alerts(&fs::read_to_string(file).unwrap());
        delivered
            .extend(alerts.iter().filter(|a| ours(&sandbox, a)).map(|a| a["event"]["id"].as_str().unwrap().to_owned()));
    }
    let mut raised: Vec<String> = run
        .alerts()
        .iter()
        .filter(|a| ours(&sandbox, a))
        .map(|a| a["event"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(raised.len(), 26, "{}", run.describe());
    assert_eq!(first, raised[..20]);
    delivered.sort();
    raised.sort();
    assert_eq!(delivered, raised, "{}", run.describe());
    assert!(
        run.stderr.contains(" delivered, 0 failed attempts, 0 refused, 0 dropped, 0 left in the spool"),
        "{}",
        run.describe()
    );
}

/// A tmpfs mounted for the test: the receiver's disk, full at first. Unmounted when dropped.
struct Disk(PathBuf);

impl Disk {
    fn mount(path: &Path, size: &str) -> Disk {
        fs::create_dir_all(path).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755")])
            .arg("tmpfs")
            .arg(path)
            .status();
        assert!(status.unwrap().success(), "mounting a tmpfs on {}", path.display());
        Disk(path.to_owned())
    }

    fn resize(&self, size: &str) {
        let status = Command::new("mount").args(["-o", &format!("remount,size={size}")]).arg(&self.0).status();
        assert!(status.unwrap().success(), "resizing the tmpfs on {}", self.0.display());
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        // A process of the test's trees may still be closing its files: a few tries, then lazily.
        for _ in 0..50 {
            let unmounted = Command::new("umount").arg(&self.0).stderr(std::process::Stdio::null()).status();
            if unmounted.is_ok_and(|status| status.success()) {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// `--to file:OUT --spool-dir SPOOL`.
fn file_and_spool(out: &Path, spool: &Path) -> Vec<String> {
    vec!["--to".into(), format!("file:{}", out.display()), "--spool-dir".into(), spool.display().to_string()]
}

#[test]
fn a_thousand_alerts_reach_a_receiver_that_was_down_across_an_agent_restart() {
    let sandbox = Sandbox::new();
    let files = sandbox.secrets(1000);
    let spool = sandbox.top().join("spool");
    // The receiver: a file on a disk with room for a page, full after two or three alerts.
    let disk = Disk::mount(&sandbox.top().join("receiver"), "4k");
    let out = disk.0.join("alerts.jsonl");

    // The first agent: 500 alerts, the receiver down all along; at its end what it could not
    // deliver stays in its spool.
    let release = sandbox.top().join("release-1");
    let first = sandbox.spawn_reader("spool-flood", &file_and_spool(&out, &spool), &files[..500], &release);
    wait_until("500 alerts raised", Duration::from_secs(60), || {
        sandbox.alerts_now().iter().filter(|a| a["package"]["name"] == "spool-flood").count() >= 500
    });
    fs::write(&release, "").unwrap();
    let run = sandbox.wait(first);
    run.assert_exit(10);
    // As the agent counted its spool at the end (`N alerts left in the spool, sent at the next start`).
    let spooled: usize = run
        .stderr
        .split(" alerts left in the spool")
        .next()
        .and_then(|before| before.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no spool left\n{}", run.describe()));
    assert!(spooled >= 490, "only {spooled} alerts spooled\n{}", run.describe());
    assert!(spool.read_dir().unwrap().next().is_some(), "{}", run.describe());
    assert!(run.stderr.contains("delivery failed, retried in"), "the disk was never full\n{}", run.describe());

    // The second agent: the spool first, then 500 more alerts; the receiver comes back meanwhile.
    let release = sandbox.top().join("release-2");
    let second = sandbox.spawn_reader("spool-flood", &file_and_spool(&out, &spool), &files[500..], &release);
    wait_until("1000 alerts raised", Duration::from_secs(60), || {
        sandbox.alerts_now().iter().filter(|a| a["package"]["name"] == "spool-flood").count() >= 1000
    });
    disk.resize("16m");
    wait_until("1000 alerts delivered", Duration::from_secs(60), || {
        ids_in(&sandbox, std::slice::from_ref(&out)).len() >= 1000
    });
    fs::write(&release, "").unwrap();
    let run = sandbox.wait(second);
    run.assert_exit(10);

    // Each alert exactly once after dedup by id, in the order raised, every line whole.
    let raised: Vec<Value> =
        sandbox.alerts_now().into_iter().filter(|a| a["package"]["name"] == "spool-flood").collect();
    assert_eq!(raised.len(), 1000, "{}", run.describe());
    let delivered = parse_alerts(&fs::read_to_string(&out).unwrap());
    let mut seen = BTreeSet::new();
    let order: Vec<String> = delivered
        .iter()
        .filter(|a| seen.insert(a["event"]["id"].as_str().unwrap().to_owned()))
        .map(|a| a["file"]["path"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(order, files, "delivered out of order or not at all");
    let raised_ids: BTreeSet<&str> = raised.iter().map(|a| a["event"]["id"].as_str().unwrap()).collect();
    assert_eq!(seen.iter().map(String::as_str).collect::<BTreeSet<_>>(), raised_ids);
    assert!(run.stderr.contains("0 dropped, 0 left in the spool"), "{}", run.describe());
    // Every segment delivered is removed; the spool keeps its `ack` file alone.
    let left: Vec<String> = fs::read_dir(&spool)
        .unwrap()
        .flat_map(|dir| fs::read_dir(dir.unwrap().path()).unwrap())
        .map(|file| file.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != "ack")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn an_output_that_cannot_start_stops_credwatch_with_its_name() {
    let sandbox = Sandbox::new();
    // An output whose own settings are wrong (a missing CA file): see outputs_net.rs.
    let cases: [(&[&str], &str); 2] = [
        (&["--to", "file:/nonexistent/dir/a.jsonl"], "output file:/nonexistent/dir/a.jsonl: opening it"),
        (&["--to", "sylog:udp:h:514"], "kind \"sylog\" is none of"),
    ];
    for (options, message) in cases {
        let run = sandbox.run_with(&sandbox.work(), options, &["true"], &[]);
        run.assert_exit(if message.contains("none of") { 2 } else { 1 });
        assert!(run.stderr.contains(message), "{message}\n{}", run.describe());
    }
    // A spool folder that cannot be written.
    let file = sandbox.top().join("a-file");
    fs::write(&file, "").unwrap();
    let out = sandbox.top().join("out.jsonl");
    let run = sandbox.run_with(
        &sandbox.work(),
        &["--to", &format!("file:{}", out.display()), "--spool-dir", &file.join("spool").to_string_lossy()],
        &["true"],
        &[],
    );
    run.assert_exit(1);
    assert!(run.stderr.contains("a-file/spool"), "{}", run.describe());
}

#[test]
fn a_spool_survives_the_agent_killed_with_sigkill_and_is_delivered_once_in_order() {
    let sandbox = Sandbox::new();
    let files = sandbox.secrets(300);
    let spool = sandbox.top().join("spool");
    // The receiver: a full disk, as above.
    let disk = Disk::mount(&sandbox.top().join("receiver"), "4k");
    let out = disk.0.join("alerts.jsonl");

    // 300 alerts raised with the receiver down, then the agent is killed dead.
    let release = sandbox.top().join("release-1");
    let mut first = sandbox.spawn_reader("spool-kill", &file_and_spool(&out, &spool), &files, &release);
    wait_until("300 alerts raised", Duration::from_secs(60), || {
        sandbox.alerts_now().iter().filter(|a| a["package"]["name"] == "spool-kill").count() >= 300
    });
    // The output's task spools what it takes at once; give it a moment on a loaded machine.
    thread::sleep(Duration::from_secs(1));
    first.kill().unwrap();
    fs::write(&release, "").unwrap();
    let run = sandbox.wait(first);
    assert!(!run.stderr.contains("left in the spool"), "not killed\n{}", run.describe());

    // The next agent, the receiver back: the spool first, each alert once, in the order raised.
    disk.resize("16m");
    let release = sandbox.top().join("release-2");
    let second = sandbox.spawn_reader("spool-kill", &file_and_spool(&out, &spool), &[], &release);
    wait_until("300 alerts delivered", Duration::from_secs(60), || {
        ids_in(&sandbox, std::slice::from_ref(&out)).len() >= 300
    });
    fs::write(&release, "").unwrap();
    let run = sandbox.wait(second);
    run.assert_exit(0);
    // The disk has room for a page: the first alert or two may have reached it before it was
    // full (as soon as they were raised, one at a time); the rest waited in the spool.
    let spooled: usize = run
        .stderr
        .split(" alerts spooled before, sent first")
        .next()
        .and_then(|before| before.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("nothing spooled before\n{}", run.describe()));
    assert!(spooled >= 295, "only {spooled} alerts spooled\n{}", run.describe());
    let raised: Vec<String> = sandbox
        .alerts_now()
        .iter()
        .filter(|a| a["package"]["name"] == "spool-kill")
        .map(|a| a["event"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids_in(&sandbox, std::slice::from_ref(&out)), raised);
    let delivered = format!("{spooled} delivered, 0 failed attempts, 0 refused, 0 dropped, 0 left in the spool");
    assert!(run.stderr.contains(&delivered), "{}", run.describe());
}
