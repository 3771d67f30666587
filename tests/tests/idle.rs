//! `watch` with nothing to do sleeps between records (up to a minute in one wait), so the signals
//! that stop and reload it must wake it whichever of its threads runs their handler: the
//! outputs' runtime has threads, and the kernel may pick one of them.

use std::{
    fs,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use credwatch_e2e::{credwatch_binary, servers::free_port, Sandbox};

/// Sends `signal` to the thread `tid` of `pid` only (tgkill(2), glibc's wrapper through python3,
/// a prerequisite of these tests).
fn signal_thread(pid: u32, tid: u32, signal: i32) {
    let script =
        format!("import ctypes, sys; sys.exit(ctypes.CDLL(None, use_errno=True).tgkill({pid}, {tid}, {signal}))");
    assert!(Command::new("python3").args(["-c", &script]).status().unwrap().success(), "tgkill {pid} {tid}");
}

#[test]
fn signals_handled_on_the_outputs_thread_reload_and_stop_an_idle_watch_at_once() {
    let sandbox = Sandbox::new();
    // No package manager by its usual name: package trees others run on this machine (a build)
    // would give the agent records, which end its wait too.
    let rules = sandbox.top().join("rules");
    fs::create_dir_all(&rules).unwrap();
    let managers: String = ["npm", "yarn", "pnpm", "bun", "cargo", "pip", "uv", "poetry", "pdm", "gem", "bundler"]
        .iter()
        .map(|name| format!("  - name: {name}\n    execs: [cw-none-{name}]\n"))
        .collect();
    fs::write(rules.join("managers.yaml"), format!("schema: 2\nmanagers:\n{managers}")).unwrap();
    let mut command = sandbox.command(credwatch_binary());
    let metrics = format!("127.0.0.1:{}", free_port());
    command
        .args(["watch", "--metrics-listen", &metrics, "--rules"])
        .arg(&rules)
        .arg("--pin-dir")
        .arg(sandbox.pin_dir());
    let mut watch = sandbox.spawn(command);
    let stderr = || sandbox.collect(None, Duration::ZERO).stderr;
    let wait_for = |what: &str, timeout: Duration| {
        let start = Instant::now();
        while !stderr().contains(what) {
            assert!(start.elapsed() < timeout, "no `{what}` after {timeout:?}:\n{}", stderr());
            thread::sleep(Duration::from_millis(10));
        }
        start.elapsed()
    };
    wait_for("watching", Duration::from_secs(60));
    assert!(watch.try_wait().unwrap().is_none(), "{}", stderr());
    let pid = watch.id();
    let outputs_thread = fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|task| task.file_name().to_str()?.parse::<u32>().ok())
        .find(|&tid| tid != pid)
        .expect("the outputs' runtime has a thread");
    // Asleep by now: nothing runs in a package tree of its own.
    thread::sleep(Duration::from_secs(1));
    signal_thread(pid, outputs_thread, 1);
    let reloaded = wait_for("reloaded", Duration::from_secs(5));
    let stopping = Instant::now();
    signal_thread(pid, outputs_thread, 15);
    let run = sandbox.wait(watch);
    let stopped = stopping.elapsed();
    run.assert_exit(0);
    // The python3 that sends the signal takes most of this.
    assert!(reloaded < Duration::from_secs(2) && stopped < Duration::from_secs(2), "{reloaded:?}, {stopped:?}");
}
