//! Roots everywhere (a manager started through its interpreter and release file is a manager),
//! masquerade (a program posing as a manager is not one), attribution of pip and cargo builds.
//! Privileged: run as root with `cargo xtask test`.

use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use credwatch_e2e::{credwatch_binary, detached, detached_pid, in_tree, parse_alerts, Run, Sandbox, EXIT_ALERT};
use serde_json::Value;

const YARNRC: &str = "npmAuthToken: npm_FAKEcredwatchE2Eyarn000000000000000000\n";

#[track_caller]
fn assert_field(alert: &Value, pointer: &str, expected: &str, run: &Run) {
    assert_eq!(
        alert.pointer(pointer).and_then(Value::as_str),
        Some(expected),
        "{pointer} in {alert:#}\n{}",
        run.describe()
    );
}

/// The Yarn Berry project with its (fake) release file, its dependency beside it, and a fake
/// ~/.yarnrc.yml holding a token.
fn berry_project(sandbox: &Sandbox) -> PathBuf {
    sandbox.copy_fixture("yarn/yarnrc-reader");
    fs::write(sandbox.home().join(".yarnrc.yml"), YARNRC).unwrap();
    sandbox.copy_fixture("yarn/berry-app")
}

/// [`berry_project`] pinned to yarn 4.5.3 through `packageManager`, with corepack's cache
/// (`COREPACK_HOME`) already holding that version: the fake release file. Returns the project
/// and the environment that keeps corepack offline and in the sandbox.
fn corepack_project(sandbox: &Sandbox) -> (PathBuf, Vec<(&'static str, String)>) {
    let project = berry_project(sandbox);
    let manifest = project.join("package.json");
    let mut package: Value = serde_json::from_str(&fs::read_to_string(&manifest).unwrap()).unwrap();
    package["packageManager"] = "yarn@4.5.3".into();
    fs::write(&manifest, package.to_string()).unwrap();
    let home = sandbox.top().join("corepack");
    let cached = home.join("v1/yarn/4.5.3");
    fs::create_dir_all(&cached).unwrap();
    fs::copy(project.join(".yarn/releases/yarn-4.5.3.cjs"), cached.join("yarn.js")).unwrap();
    let corepack = r#"{"locator":{"name":"yarn","reference":"4.5.3"},"bin":{"yarn":"yarn.js","yarnpkg":"yarn.js"},"hash":"sha512.0"}"#;
    fs::write(cached.join(".corepack"), corepack).unwrap();
    let env = vec![
        ("COREPACK_HOME", home.to_string_lossy().into_owned()),
        ("COREPACK_ENABLE_NETWORK", "0".to_owned()),
        ("COREPACK_ENABLE_DOWNLOAD_PROMPT", "0".to_owned()),
        ("COREPACK_ENABLE_AUTO_PIN", "0".to_owned()),
    ];
    (project, env)
}

/// The real npm's entry point (`/usr/lib/node_modules/npm/bin/npm-cli.js`): `npm` on PATH is a
/// link to it.
fn npm_cli(sandbox: &Sandbox) -> String {
    let which = sandbox.setup("which npm", sandbox.command("sh").args(["-c", "command -v npm"]));
    let cli = fs::canonicalize(which.trim()).expect("resolving npm's link");
    assert!(cli.ends_with("bin/npm-cli.js"), "npm is not npm-cli.js: {}", cli.display());
    cli.to_string_lossy().into_owned()
}

/// The alerts of the process whose executable ends with `suffix`.
fn by_executable(run: &Run, suffix: &str) -> Vec<Value> {
    run.alerts()
        .into_iter()
        .filter(|a| a["process"]["executable"].as_str().is_some_and(|e| e.ends_with(suffix)))
        .collect()
}

#[test]
fn yarn_berry_release_file_run_by_node_is_the_manager() {
    let sandbox = Sandbox::new();
    let project = berry_project(&sandbox);
    let run = sandbox.run(&project, &["node", ".yarn/releases/yarn-4.5.3.cjs", "install"]);

    run.assert_exit(EXIT_ALERT);
    let yarnrc = sandbox.credential(".yarnrc.yml");
    let alerts = run.alerts_for(&yarnrc);
    // yarn reading its own configuration is what it is for: only the postinstall's read alerts.
    assert_eq!(alerts.len(), 1, "{}", run.describe());
    let alert = &alerts[0];
    assert!(alert["process"]["executable"].as_str().is_some_and(|e| e.ends_with("/cat")), "{alert:#}");
    assert_field(alert, "/rule/id", "npm-registry-token", &run);
    assert_field(alert, "/package/manager", "yarn", &run);
    assert_field(alert, "/package/name", "yarnrc-reader", &run);
    assert_field(alert, "/package/version", "0.4.1", &run);
    assert_field(alert, "/package/lifecycle", "postinstall", &run);
}

/// `corepack yarn install` runs the release inside corepack's own process (`node
/// /usr/bin/corepack yarn install`): that process is yarn.
#[test]
fn corepack_yarn_is_the_manager() {
    let sandbox = Sandbox::new();
    let (project, env) = corepack_project(&sandbox);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let run = sandbox.run_with_env(&project, &["corepack", "yarn", "install"], &env);

    run.assert_exit(EXIT_ALERT);
    let alerts = run.alerts_for(&sandbox.credential(".yarnrc.yml"));
    assert_eq!(alerts.len(), 1, "only the postinstall's read alerts\n{}", run.describe());
    let alert = &alerts[0];
    assert!(alert["process"]["executable"].as_str().is_some_and(|e| e.ends_with("/cat")), "{alert:#}");
    assert_field(alert, "/package/manager", "yarn", &run);
    assert_field(alert, "/package/name", "yarnrc-reader", &run);
}

#[test]
fn npm_cli_js_run_by_node_is_the_manager() {
    let sandbox = Sandbox::new();
    let cli = npm_cli(&sandbox);
    let tarball = sandbox.npm_pack("npm/npmrc-reader");
    let project = sandbox.npm_project();
    let run = sandbox.run(&project, &["node", &cli, "install", tarball.to_str().unwrap()]);

    run.assert_exit(EXIT_ALERT);
    // npm read the fake ~/.npmrc (its `package-lock=false` took effect) without an alert.
    assert!(!project.join("package-lock.json").exists(), "npm did not read the fake ~/.npmrc");
    let alerts = run.alerts_for(&sandbox.credential(".npmrc"));
    assert_eq!(alerts.len(), 1, "only the postinstall's read alerts\n{}", run.describe());
    let alert = &alerts[0];
    assert_ne!(alert["process"]["pid"], alert["credwatch"]["root_pid"], "npm itself was reported: {alert:#}");
    assert_field(alert, "/package/manager", "npm", &run);
    assert_field(alert, "/package/name", "npmrc-reader", &run);
    assert_field(alert, "/package/version", "3.1.4", &run);
    assert_field(alert, "/package/lifecycle", "postinstall", &run);
}

/// The kernel marks these execs itself: nothing they started from was in a tree before.
#[test]
fn watch_roots_a_release_file_corepack_and_npm_cli_js_started_after_it() {
    let sandbox = Sandbox::new();
    let (project, corepack_env) = corepack_project(&sandbox);
    let cli = npm_cli(&sandbox);
    let tarball = sandbox.npm_pack("npm/npmrc-reader");
    let npm_project = sandbox.npm_project();
    let go = [
        detached(&sandbox, &project, "yarn", &[], "exec node .yarn/releases/yarn-4.5.3.cjs install"),
        detached(&sandbox, &project, "corepack", &corepack_env, "exec corepack yarn install"),
        detached(&sandbox, &npm_project, "npm", &[], &format!("exec node {cli} install {}", tarball.to_str().unwrap())),
    ];
    let watch = sandbox.watch();
    go.iter().for_each(|go| go());
    let yarnrc = sandbox.credential(".yarnrc.yml");
    let npmrc = sandbox.credential(".npmrc");
    let trees = [
        (detached_pid(&project, "yarn"), &yarnrc, "yarn", "yarnrc-reader"),
        (detached_pid(&project, "corepack"), &yarnrc, "yarn", "yarnrc-reader"),
        (detached_pid(&npm_project, "npm"), &npmrc, "npm", "npmrc-reader"),
    ];
    let alerts: Vec<Option<Value>> = trees
        .iter()
        .map(|(pid, path, ..)| {
            sandbox.wait_for(|a| a["file"]["path"] == **path && in_tree(a, *pid), Duration::from_secs(60))
        })
        .collect();
    let run = watch.stop();
    run.assert_exit(0);
    for ((pid, path, manager, package), alert) in trees.iter().zip(alerts) {
        let alert = alert.unwrap_or_else(|| panic!("no alert in the {manager} tree of {pid}\n{}", run.describe()));
        assert_field(&alert, "/package/manager", manager, &run);
        assert_field(&alert, "/package/name", package, &run);
        // The manager's own read of its configuration raised nothing.
        let own = run.alerts().into_iter().filter(|a| a["process"]["pid"] == *pid && a["file"]["path"] == **path);
        assert_eq!(own.count(), 0, "the manager ({pid}) was reported\n{}", run.describe());
    }
}

#[test]
fn node_copied_to_tmp_as_npm_is_package_code() {
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack("npm/masquerade");
    let project = sandbox.npm_project();
    let run = sandbox.run(&project, &["npm", "install", tarball.to_str().unwrap()]);

    run.assert_exit(EXIT_ALERT);
    let fake = sandbox.top().join("x/npm");
    assert!(fake.is_file(), "the postinstall did not copy node\n{}", run.describe());
    let alerts: Vec<Value> = by_executable(&run, "/x/npm")
        .into_iter()
        .filter(|a| a["file"]["path"] == sandbox.credential(".npmrc"))
        .collect();
    let alert = alerts.first().unwrap_or_else(|| panic!("no alert for the fake npm's read\n{}", run.describe()));
    // Not the low "manager started by package code": package code reading the token.
    assert_field(alert, "/rule/id", "npm-registry-token", &run);
    assert_field(alert, "/rule/severity", "high", &run);
    assert_field(alert, "/package/name", "npm-masquerade", &run);
    assert_field(alert, "/package/lifecycle", "postinstall", &run);

    // Run later, by a tree that did not write it: a binary named npm in a temporary directory
    // is still not npm (the installed npm is a script: its executable is node).
    fs::remove_file(sandbox.alerts_file()).unwrap();
    let read = "require('fs').readFileSync(require('os').homedir() + '/.npmrc')";
    let later = sandbox.run(&project, &["sh", "-c", r#""$1" -e "$2""#, "sh", fake.to_str().unwrap(), read]);
    later.assert_exit(EXIT_ALERT);
    let alert = later.expect_alert(&sandbox.credential(".npmrc"));
    assert_field(&alert, "/rule/severity", "high", &later);
    assert!(alert["process"]["executable"].as_str().is_some_and(|e| e.ends_with("/x/npm")), "{alert:#}");
}

#[test]
fn pip_install_of_a_local_directory_names_the_project() {
    let sandbox = Sandbox::new();
    let project = sandbox.copy_fixture("pip/local-project");
    let target = sandbox.work().join("site");
    let run = sandbox.run(
        &sandbox.work(),
        &[
            "python3",
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-build-isolation",
            "--no-deps",
            "--target",
            target.to_str().unwrap(),
            project.to_str().unwrap(),
        ],
    );

    run.assert_exit(EXIT_ALERT);
    assert!(target.join("local_project.py").exists(), "pip did not install the project\n{}", run.describe());
    let alert = run.expect_alert(&sandbox.credential(".pypirc"));
    assert_field(&alert, "/package/manager", "pip", &run);
    // From pyproject.toml's [project]: there is no archive or build directory to go by.
    assert_field(&alert, "/package/name", "local-project", &run);
    assert_field(&alert, "/package/version", "0.7.0", &run);
    assert_field(&alert, "/package/lifecycle", "setup.py", &run);
}

/// `python3 -m uv` is uv (`cargo xtask test` installs uv for python3 beforehand; this test
/// stays offline), and uv's build of a local directory names the project.
#[test]
fn python_m_uv_pip_install_of_a_local_directory_names_the_project() {
    let sandbox = Sandbox::new();
    let project = sandbox.copy_fixture("pip/local-project");
    let target = sandbox.work().join("site");
    let run = sandbox.run(
        &sandbox.work(),
        &[
            "python3",
            "-m",
            "uv",
            "pip",
            "install",
            "--offline",
            "--no-index",
            "--no-build-isolation",
            "--no-deps",
            "--python",
            "python3",
            "--target",
            target.to_str().unwrap(),
            project.to_str().unwrap(),
        ],
    );

    run.assert_exit(EXIT_ALERT);
    let alert = run.expect_alert(&sandbox.credential(".pypirc"));
    assert_field(&alert, "/package/manager", "uv", &run);
    assert_field(&alert, "/package/name", "local-project", &run);
    assert_field(&alert, "/package/version", "0.7.0", &run);
    assert_field(&alert, "/package/lifecycle", "setup.py", &run);
}

/// The project's metadata travels in the trace: replay names the package as live did, and so
/// does it for a program posing as npm (decided from the events).
#[test]
fn replay_names_local_builds_and_masquerades_as_live() {
    let sandbox = Sandbox::new();
    let work = sandbox.work();
    let project = sandbox.copy_fixture("pip/local-project");
    let target = work.join("site");
    let tarball = sandbox.npm_pack("npm/masquerade");
    let app = sandbox.npm_project();
    let cases: [(&Path, Vec<&str>); 2] = [
        (
            &work,
            vec![
                "python3",
                "-m",
                "pip",
                "install",
                "--no-index",
                "--no-build-isolation",
                "--no-deps",
                "--target",
                target.to_str().unwrap(),
                project.to_str().unwrap(),
            ],
        ),
        (&app, vec!["npm", "install", tarball.to_str().unwrap()]),
    ];
    for (i, (cwd, cmd)) in cases.iter().enumerate() {
        let trace = work.join(format!("trace-{i}.jsonl"));
        let (live, replayed) = (work.join(format!("live-{i}.jsonl")), work.join(format!("replayed-{i}.jsonl")));
        let mut record = sandbox.command(credwatch_binary());
        record.args(["record", "-o"]).arg(&trace).args(["--json", "--alerts"]).arg(&live).arg("--").args(cmd);
        record.current_dir(cwd);
        let recording = sandbox.wait(sandbox.spawn(record));
        recording.assert_exit(EXIT_ALERT);
        let mut replay = sandbox.command(credwatch_binary());
        replay.args(["replay", "--json", "--alerts"]).arg(&replayed).arg(&trace);
        let replay = sandbox.wait(sandbox.spawn(replay));
        replay.assert_exit(EXIT_ALERT);
        let live = parse_alerts(&fs::read_to_string(&live).unwrap());
        assert_eq!(parse_alerts(&fs::read_to_string(&replayed).unwrap()), live, "{}", replay.describe());
        let wanted = if i == 0 { "local-project" } else { "npm-masquerade" };
        assert!(
            live.iter().any(|a| a["package"]["name"] == wanted && a["rule"]["severity"] == "high"),
            "no high alert naming {wanted}\n{}",
            recording.describe()
        );
    }
    let trace = fs::read_to_string(work.join("trace-0.jsonl")).unwrap();
    assert!(trace.contains(r#""project":{"name":"local-project","version":"0.7.0","source":"pyproject.toml"}"#));
}
