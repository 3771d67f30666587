//! Every form of a path meets the same rules (issue 24, point 2), and the developer's own
//! Rust workflow in cargo's default layout is the project's code: rustup's proxy executing the
//! toolchain's cargo, `cargo run`'s exec in place of `target/debug/app`, test binaries and
//! doctests.

use super::*;

const HOME: &str = "/home/alice";
const APP: &str = "/home/alice/app";
const TOOLCHAIN: &str = "/home/alice/.rustup/toolchains/stable-x86_64-unknown-linux-gnu/bin";

/// An exec as a foreign trace has it (strace, auditd): the path as given, no kernel path.
fn exec_given(run: &mut Run, pid: u32, ppid: u32, file: &str, args: &[&str], cwd: &str) {
    run.send(
        pid,
        EventData::Exec(Exec {
            ppid,
            filename: file.into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            cwd: cwd.into(),
            uid: 1000,
            gid: 1000,
            ..Exec::default()
        }),
    );
}

/// An exec as the kernel reports it: the given path and the executable it resolved.
fn exec_resolved(run: &mut Run, pid: u32, ppid: u32, (file, executable): (&str, &str), args: &[&str]) {
    run.send(
        pid,
        EventData::Exec(Exec {
            ppid,
            filename: file.into(),
            executable: executable.into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            cwd: APP.into(),
            uid: 1000,
            gid: 1000,
            env: [("HOME".to_owned(), HOME.to_owned())].into(),
            ..Exec::default()
        }),
    );
}

/// `cargo <command>` as a developer types it: rustup's proxy (`~/.cargo/bin/cargo`, a link to
/// rustup), which executes the toolchain's cargo in the same process.
fn cargo_via_rustup(run: &mut Run, pid: u32, words: &[&str]) {
    let mut args = vec!["cargo"];
    args.extend(words);
    exec_resolved(run, pid, 1, ("/home/alice/.cargo/bin/cargo", "/home/alice/.cargo/bin/rustup"), &args);
    let cargo = format!("{TOOLCHAIN}/cargo");
    let mut args = vec![cargo.as_str()];
    args.extend(words);
    exec_resolved(run, pid, 1, (&cargo, &cargo), &args);
}

#[test]
fn cargo_run_through_rustups_proxy_execs_the_program_in_place_quietly() {
    for words in [&["run", "-q"][..], &["+nightly", "run"], &["r", "--release"]] {
        let mut run = Run::new();
        cargo_via_rustup(&mut run, 500, words);
        // rustc compiling (a proc-macro runs in it): watched.
        let rustc = format!("{TOOLCHAIN}/rustc");
        run.fork(500, 501);
        exec_resolved(&mut run, 501, 500, (&rustc, &rustc), &[&rustc, "--crate-name", "app"]);
        run.open(501, "/home/alice/.aws/credentials");
        assert_eq!(run.one().rule.id, "aws-credentials", "{words:?}");
        // cargo executes the program in its own process, by a path relative to the crate.
        let profile = if words.contains(&"--release") { "release" } else { "debug" };
        let program = format!("{APP}/target/{profile}/app");
        exec_resolved(
            &mut run,
            500,
            1,
            (&format!("target/{profile}/app"), &program),
            &[&format!("target/{profile}/app")],
        );
        run.open(500, "/home/alice/.aws/credentials");
        assert!(run.take().is_empty(), "cargo {words:?}");
    }
}

#[test]
fn cargo_test_binaries_and_doctests_are_the_projects_but_rustdoc_stays_watched() {
    let mut run = Run::new();
    cargo_via_rustup(&mut run, 600, &["test"]);
    let test_binary = format!("{APP}/target/debug/deps/app-5998cd5bf04e420f");
    run.fork(600, 601);
    exec_resolved(&mut run, 601, 600, (&test_binary, &test_binary), &[&test_binary]);
    run.open(601, "/home/alice/.aws/credentials");
    assert!(run.take().is_empty(), "the unit-test binary");

    // rustdoc links each doctest (cc writes rust_out), then runs it.
    let rustdoc = format!("{TOOLCHAIN}/rustdoc");
    run.fork(600, 610);
    exec_resolved(&mut run, 610, 600, (&rustdoc, &rustdoc), &[&rustdoc, "--test", "src/lib.rs", "--crate-name", "app"]);
    let out = "/tmp/rustdoctestdtChqj/rust_out";
    run.fork(610, 611);
    exec_resolved(&mut run, 611, 610, ("cc", "/usr/bin/x86_64-linux-gnu-gcc-12"), &["cc", "-o", out]);
    run.open_full(611, out, Some(out), 3, write_flags());
    run.exit(611).fork(610, 612);
    exec_resolved(&mut run, 612, 610, (out, out), &[out]);
    run.open(612, "/home/alice/.aws/credentials");
    assert!(run.take().is_empty(), "a doctest");
    // A dependency's proc-macro running inside rustdoc is no doctest.
    run.open(610, "/home/alice/.ssh/id_ed25519");
    assert_eq!(run.one().rule.id, "ssh-private-keys");
    // Nor is a program named like one that rustdoc's children start.
    run.fork(610, 613);
    exec_resolved(&mut run, 613, 610, ("/bin/sh", "/bin/sh"), &["sh", "-c", out]);
    run.fork(613, 614);
    exec_resolved(&mut run, 614, 613, (out, out), &[out]);
    let alerts = run.take();
    assert!(alerts.iter().any(|a| a.process.pid == 614 && a.rule.id == "exec-of-written-file"), "{alerts:#?}");

    // `cargo test` run by package code (a postinstall) is package code, doctests included.
    let mut run = Run::new();
    run.exec(700, 1, &["npm", "install"], &[]).spawn(701, 700, &["sh", "-c", "cargo test"], POSTINSTALL);
    run.fork(701, 702);
    exec_resolved(
        &mut run,
        702,
        701,
        (&format!("{TOOLCHAIN}/cargo"), &format!("{TOOLCHAIN}/cargo")),
        &["cargo", "test"],
    );
    run.fork(702, 703);
    exec_resolved(&mut run, 703, 702, (&rustdoc, &rustdoc), &[&rustdoc, "--test", "src/lib.rs"]);
    run.open_full(703, out, Some(out), 3, write_flags()).fork(703, 704);
    exec_resolved(&mut run, 704, 703, (out, out), &[out]);
    assert_eq!(run.one().rule.id, "exec-of-written-file");
}

#[test]
fn every_form_of_an_executed_path_meets_the_project_globs() {
    // Forms a foreign trace gives, relative to the crate or through /proc/self/cwd.
    let forms = [
        "target/debug/app",
        "./target/debug/app",
        "../app/target/debug/app",
        "target/debug/../debug/app",
        "/proc/self/cwd/target/debug/app",
        "/proc/thread-self/cwd/./target/debug/app",
        "/proc/self/root/home/alice/app/target/debug/app",
        "/home/alice/app//target/debug/app",
    ];
    for form in forms {
        let mut run = Run::new();
        exec_given(&mut run, 800, 1, "cargo", &["cargo", "run"], APP);
        exec_given(&mut run, 800, 1, form, &[form], APP);
        run.open_full(800, "/home/alice/.aws/credentials", None, 3, 0);
        assert!(run.take().is_empty(), "{form}");
        // The same program under `cargo build` (nothing of the project's runs) is watched.
        let mut run = Run::new();
        exec_given(&mut run, 800, 1, "cargo", &["cargo", "build"], APP);
        run.fork(800, 801);
        exec_given(&mut run, 801, 800, form, &[form], APP);
        run.open_full(801, "/home/alice/.aws/credentials", None, 3, 0);
        assert_eq!(run.one().process.executable, "/home/alice/app/target/debug/app", "{form}");
    }
    // A symlink to the program: the kernel's path is the program's.
    let mut run = Run::new();
    cargo_via_rustup(&mut run, 900, &["run"]);
    exec_resolved(&mut run, 900, 1, ("/home/alice/bin/app", "/home/alice/app/target/debug/app"), &["app"]);
    run.open(900, "/home/alice/.aws/credentials");
    assert!(run.take().is_empty());
}

#[test]
fn every_form_of_an_opened_path_meets_the_same_rule() {
    let forms = [
        ("/home/alice", ".aws/credentials"),
        ("/home/alice", "./.aws/credentials"),
        ("/home/alice/app", "../.aws/credentials"),
        ("/home/alice/app", "/proc/self/cwd/../.aws/credentials"),
        ("/home/alice", "/proc/thread-self/cwd/.aws/credentials"),
        ("/tmp", "/proc/self/root/home/alice/.aws/credentials"),
        ("/tmp", "/home/alice/.aws//./credentials"),
    ];
    for (cwd, given) in forms {
        let mut run = Run::new();
        run.exec(100, 1, &["npm", "install"], &[]);
        run.fork(100, 101);
        exec_given(&mut run, 101, 100, "/usr/bin/node", &["node", "x.js"], cwd);
        run.open_full(101, given, None, 3, 0);
        let alert = run.one();
        assert_eq!(alert.rule.id, "aws-credentials", "{cwd} {given}");
        assert_eq!(alert.file.as_ref().map(|f| f.path.as_str()), Some("/home/alice/.aws/credentials"), "{given}");
    }
}

#[test]
fn a_program_the_tree_wrote_is_caught_however_it_is_executed() {
    for (cwd, form) in [("/tmp/x", "./payload"), ("/tmp", "x/payload"), ("/tmp/x", "/proc/self/cwd/payload")] {
        let mut run = npm_tree();
        run.open_full(102, "/tmp/x/payload", Some("/tmp/x/payload"), 4, write_flags()).fork(102, 103);
        exec_given(&mut run, 103, 102, form, &[form], cwd);
        let alert = run.one();
        assert_eq!(
            (alert.rule.id.as_str(), alert.credwatch.written_file.as_deref()),
            ("exec-of-written-file", Some("/tmp/x/payload")),
            "{form}"
        );
    }
}

/// `npx <bin>` (npm 11) in the project: npx runs `sh -c <bin>`, and the shell runs the bin's
/// link in npx's cache; `script` is where the link leads, as the sensor found it.
fn npx_bin(run: &mut Run, pid: u32, ppid: u32, bin: &str, script: Option<&str>) {
    let npx = ["/usr/bin/npx", bin];
    exec_resolved(run, pid, ppid, ("/usr/bin/npx", "/usr/bin/node"), &npx);
    exec_resolved(run, pid, ppid, ("/usr/bin/node", "/usr/bin/node"), &["node", "/usr/bin/npx", bin]);
    run.fork(pid, pid + 1);
    exec_resolved(run, pid + 1, pid, ("/bin/sh", "/usr/bin/dash"), &["sh", "-c", bin]);
    let link = format!("/home/alice/.npm/_npx/387bb4f387f12ee2/node_modules/.bin/{bin}");
    run.fork(pid + 1, pid + 2);
    run.send(
        pid + 2,
        EventData::Exec(Exec {
            ppid: pid + 1,
            filename: link.clone(),
            executable: "/usr/bin/node".into(),
            args: vec!["node".into(), link],
            cwd: APP.into(),
            uid: 1000,
            gid: 1000,
            script: script.map(str::to_owned),
            ..Exec::default()
        }),
    );
    run.open(pid + 2, "/home/alice/app/.env");
}

#[test]
fn npx_of_the_projects_bins_is_the_project_and_fetched_bins_are_not() {
    let mut run = Run::new();
    npx_bin(&mut run, 1000, 1, "devcli", Some("/home/alice/app/cli.js"));
    assert!(run.take().is_empty(), "the project's own bin");
    // The bin of a dependency the project installed is its toolchain, as under `npm run`.
    let mut run = Run::new();
    npx_bin(&mut run, 1050, 1, "vite", Some("/home/alice/app/node_modules/vite/bin/vite.js"));
    assert!(run.take().is_empty(), "an installed dependency's bin");
    // A package npx fetched into its cache, or installed globally, is package code.
    for script in
        ["/home/alice/.npm/_npx/387bb4f387f12ee2/node_modules/cowsay/cli.js", "/usr/lib/node_modules/tool/cli.js"]
    {
        let mut run = Run::new();
        npx_bin(&mut run, 1100, 1, "tool", Some(script));
        assert_eq!(run.one().rule.id, "dotenv-files", "{script}");
    }
    // Where the link leads is unknown (a foreign trace): its path in the cache is no project's.
    let mut run = Run::new();
    npx_bin(&mut run, 1200, 1, "devcli", None);
    assert_eq!(run.one().rule.id, "dotenv-files");
    // The project's bin run by npx in a postinstall is package code.
    let mut run = Run::new();
    run.exec(1300, 1, &["npm", "install"], &[]).spawn(1301, 1300, &["sh", "-c", "npx devcli"], POSTINSTALL);
    npx_bin(&mut run, 1302, 1301, "devcli", Some("/home/alice/app/cli.js"));
    assert_eq!(run.one().rule.id, "dotenv-files");
}
