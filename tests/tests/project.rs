//! The developer's own code is not package code (issue 9, point 4): the project's scripts run by
//! `npm run` and the program `cargo run` built are quiet, while a dependency's install or build
//! step started from them, and registry code run through `npx`, still alert and name the
//! package. `--watch-project` watches the project's own code too. Real npm and cargo, offline,
//! a throwaway HOME of fake credentials. Run as root with `cargo xtask test`.

use std::{fs, path::PathBuf};

use credwatch_e2e::{assert_field, Run, Sandbox, EXIT_ALERT};
use serde_json::Value;

/// The dotenv app in the sandbox, with the dependency's tarball where its `setup` script
/// installs it from.
fn dotenv_app(sandbox: &Sandbox) -> PathBuf {
    let tarball = sandbox.npm_pack("project/npmrc-peek");
    let app = sandbox.copy_fixture("project/dotenv-app");
    fs::create_dir_all(app.join("vendor")).unwrap();
    fs::copy(&tarball, app.join("vendor/npmrc-peek-1.0.0.tgz")).unwrap();
    app
}

/// The app ran to its end (it reads both files first): a quiet run is not a vacuous one.
#[track_caller]
fn assert_served(app: &std::path::Path, run: &Run) {
    let served = fs::read_to_string(app.join("served.txt")).unwrap_or_default();
    assert!(served.starts_with("read .env"), "the app did not run: {served:?}\n{}", run.describe());
}

#[test]
fn npm_run_dev_of_a_dotenv_app_is_quiet() {
    let sandbox = Sandbox::new();
    let app = dotenv_app(&sandbox);
    let run = sandbox.run(&app, &["npm", "run", "dev"]);
    assert_served(&app, &run);
    run.assert_exit(0);
    assert_eq!(run.alerts(), Vec::<Value>::new(), "{}", run.describe());
}

#[test]
fn watch_project_makes_the_dotenv_app_alert() {
    let sandbox = Sandbox::new();
    let app = dotenv_app(&sandbox);
    let run = sandbox.run_with(&app, &["--watch-project"], &["npm", "run", "dev"], &[]);
    assert_served(&app, &run);
    run.assert_exit(EXIT_ALERT);
    let env = run.expect_alert(&app.join(".env").to_string_lossy());
    assert_field(&env, "/rule/id", "dotenv-files", &run);
    assert_field(&env, "/package/name", "dotenv-app", &run);
    assert_field(&env, "/package/lifecycle", "dev", &run);
    let aws = run.expect_alert(&sandbox.credential(".aws/credentials"));
    assert_field(&aws, "/rule/id", "aws-credentials", &run);
}

#[test]
fn a_dependencys_postinstall_in_npm_install_run_by_the_projects_script_alerts() {
    let sandbox = Sandbox::new();
    let app = dotenv_app(&sandbox);
    let run = sandbox.run(&app, &["npm", "run", "setup"]);
    assert!(app.join("node_modules/npmrc-peek/package.json").exists(), "not installed\n{}", run.describe());
    run.assert_exit(EXIT_ALERT);
    let npmrc = sandbox.credential(".npmrc");
    // One alert, from the postinstall: npm itself reading its configuration is not one.
    let alerts = run.alerts();
    assert_eq!(alerts.len(), 1, "{}", run.describe());
    let alert = run.expect_alert(&npmrc);
    assert_field(&alert, "/rule/id", "npm-registry-token", &run);
    assert_field(&alert, "/package/manager", "npm", &run);
    assert_field(&alert, "/package/name", "npmrc-peek", &run);
    assert_field(&alert, "/package/lifecycle", "postinstall", &run);
    // Its ancestry goes through the project's script and the npm install it ran.
    let ancestors = alert["process"]["ancestors"].as_array().cloned().unwrap_or_default();
    let command =
        |a: &Value| a["args"].as_array().map(|w| w.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "));
    let lines: Vec<String> = ancestors.iter().filter_map(command).collect();
    assert!(lines.iter().any(|l| l.contains("npm run setup")), "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains("npm install ./vendor/npmrc-peek-1.0.0.tgz")), "{lines:#?}");
}

#[test]
fn npx_of_a_local_tarball_whose_bin_reads_a_key_alerts() {
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack("project/key-cli");
    let project = sandbox.npm_project();
    let run = sandbox.run(&project, &["npx", "--yes", "--package", tarball.to_str().unwrap(), "key-cli"]);
    assert!(run.stdout.contains("key-cli ran"), "the bin did not run\n{}", run.describe());
    run.assert_exit(EXIT_ALERT);
    let alert = run.expect_alert(&sandbox.credential(".ssh/id_ed25519"));
    assert_field(&alert, "/rule/id", "ssh-private-keys", &run);
    assert_field(&alert, "/package/manager", "npm", &run);
}

#[test]
fn cargo_run_of_the_projects_program_is_quiet_but_a_dependencys_build_script_alerts() {
    let sandbox = Sandbox::new();
    sandbox.copy_fixture("cargo/build-script");
    let app = sandbox.copy_fixture("project/cargo-app");
    let run = sandbox.run(&app, &["cargo", "run", "--offline"]);
    assert!(run.stdout.contains("cargo-app read the AWS credentials"), "the program did not run\n{}", run.describe());
    run.assert_exit(EXIT_ALERT);
    assert_eq!(run.alerts_for(&sandbox.credential(".aws/credentials")), Vec::<Value>::new(), "{}", run.describe());
    let alert = run.expect_alert(&sandbox.credential(".cargo/credentials.toml"));
    assert_field(&alert, "/package/manager", "cargo", &run);
    assert_field(&alert, "/package/name", "evil-build", &run);
    assert_field(&alert, "/package/lifecycle", "build-script", &run);
    assert_eq!(run.alerts().len(), 1, "{}", run.describe());

    // `cargo test`, built already: its test binary reads the same file, quietly.
    fs::remove_file(sandbox.alerts_file()).unwrap();
    let run = sandbox.run(&app, &["cargo", "test", "--offline"]);
    assert!(run.stdout.contains("test reads_the_aws_credentials ... ok"), "{}", run.describe());
    run.assert_exit(0);
    assert_eq!(run.alerts(), Vec::<Value>::new(), "{}", run.describe());
}

#[test]
fn a_recorded_npm_run_dev_replays_quiet_and_alerts_with_watch_project() {
    let sandbox = Sandbox::new();
    let app = dotenv_app(&sandbox);
    let trace = sandbox.work().join("dev.jsonl");
    let mut record = sandbox.command(credwatch_e2e::credwatch_binary());
    record.arg("record").arg("-o").arg(&trace).args(["--", "npm", "run", "dev"]).current_dir(&app);
    let run = sandbox.wait(sandbox.spawn(record));
    assert_served(&app, &run);
    run.assert_exit(0);
    // The decision is the engine's, from the recorded events: replay agrees with live, and
    // `--watch-project` on replay watches the project's code as it would have live.
    let replay = |options: &[&str]| {
        let mut command = sandbox.command(credwatch_e2e::credwatch_binary());
        command.arg("replay").arg("--json").args(options).arg(&trace);
        sandbox.wait(sandbox.spawn(command))
    };
    let quiet = replay(&[]);
    quiet.assert_exit(0);
    assert_eq!(quiet.stdout, "", "{}", quiet.describe());
    let watched = replay(&["--watch-project"]);
    watched.assert_exit(EXIT_ALERT);
    let rules: Vec<String> = credwatch_e2e::parse_alerts(&watched.stdout)
        .iter()
        .filter_map(|a| a["rule"]["id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(rules, ["dotenv-files", "aws-credentials"], "{}", watched.describe());
}

/// `watch`, the main mode: the project's script is quiet between two `npx` runs that alert (they
/// prove the watch saw what happened in between). The test itself runs under `cargo test`, the
/// project's own code: the npm commands it starts are managers of their own, as a developer's.
#[test]
fn under_watch_the_projects_script_is_quiet_between_npx_runs_that_alert() {
    let sandbox = Sandbox::new();
    let app = dotenv_app(&sandbox);
    let tarball = sandbox.npm_pack("project/key-cli");
    let key = sandbox.credential(".ssh/id_ed25519");
    let npx = || {
        let mut command = sandbox.command("npx");
        command.args(["--yes", "--package", tarball.to_str().unwrap(), "key-cli"]).current_dir(&app);
        sandbox.setup("npx key-cli", &mut command);
    };
    let key_alerts = || sandbox.alerts_now().into_iter().filter(|a| a["file"]["path"] == key.as_str()).count();
    let watch = sandbox.watch();
    npx();
    let first = sandbox.wait_for(|a| a["file"]["path"] == key.as_str(), std::time::Duration::from_secs(20));
    sandbox.setup("npm run dev", sandbox.command("npm").args(["run", "dev"]).current_dir(&app));
    npx();
    let start = std::time::Instant::now();
    while key_alerts() < 2 && start.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let run = watch.stop();
    assert!(first.is_some(), "no alert from the first npx\n{}", run.describe());
    assert_eq!(key_alerts(), 2, "{}", run.describe());
    assert_served(&app, &run);
    let env = app.join(".env").to_string_lossy().into_owned();
    let project = run
        .alerts()
        .into_iter()
        .filter(|a| a["file"]["path"] == env.as_str() || a["file"]["path"] == sandbox.credential(".aws/credentials"))
        .collect::<Vec<_>>();
    assert_eq!(project, Vec::<Value>::new(), "{}", run.describe());
}

/// rustup's proxy for `cargo` on the machine's PATH (`~/.cargo/bin/cargo`, what a developer
/// types), with the environment that makes it run the toolchain these tests run with.
fn cargo_as_a_developer_has_it(sandbox: &Sandbox) -> std::process::Command {
    // cargo sets CARGO for its tests: <rustup home>/toolchains/<toolchain>/bin/cargo.
    let toolchain_cargo = PathBuf::from(std::env::var_os("CARGO").expect("run through cargo"));
    let toolchain_dir = toolchain_cargo.parent().and_then(|bin| bin.parent()).expect("a toolchain's cargo");
    let rustup_home = toolchain_dir.parent().and_then(|toolchains| toolchains.parent()).expect("under RUSTUP_HOME");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let proxies = std::env::split_paths(&path)
        .find(|dir| dir.join("rustup").is_file() && dir.join("cargo").is_file())
        .expect("rustup and its cargo proxy on PATH, as a developer has them");
    let mut command = sandbox.command(proxies.join("cargo"));
    command
        .env("RUSTUP_HOME", rustup_home)
        .env("RUSTUP_TOOLCHAIN", toolchain_dir.file_name().expect("a toolchain's name"));
    command
}

/// A Rust developer's day in cargo's default layout (`target/` in the crate, doctests built in
/// `$TMPDIR`), under `watch`, through rustup's proxy: `cargo run` (cargo executes
/// `target/debug/cargo-app`, relative, in its own process), `cargo test` (the unit-test and
/// integration-test binaries, and the doctest rustdoc builds and runs) all read the AWS
/// credentials quietly, while the dependency's build script still alerts.
#[test]
fn under_watch_cargo_run_test_and_doctests_in_the_default_layout_are_quiet() {
    let sandbox = Sandbox::new();
    sandbox.copy_fixture("cargo/build-script");
    let app = sandbox.copy_fixture("project/cargo-app");
    let watch = sandbox.watch();
    let run_output =
        sandbox.setup("cargo run", cargo_as_a_developer_has_it(&sandbox).args(["run", "--offline"]).current_dir(&app));
    let test_output = sandbox
        .setup("cargo test", cargo_as_a_developer_has_it(&sandbox).args(["test", "--offline"]).current_dir(&app));
    let script = sandbox.wait_for(|a| a["package"]["name"] == "evil-build", std::time::Duration::from_secs(20));
    let run = watch.stop();
    assert!(run_output.contains("cargo-app read the AWS credentials"), "{run_output}\n{}", run.describe());
    for ran in [
        "reads_the_aws_credentials ... ok",
        "the_integration_test_reads_the_aws_credentials ... ok",
        "aws_credentials_path (line 5) ... ok",
    ] {
        assert!(test_output.contains(ran), "{ran}: {test_output}\n{}", run.describe());
    }
    let script = script.unwrap_or_else(|| panic!("the build script's read was not seen\n{}", run.describe()));
    assert_field(&script, "/package/lifecycle", "build-script", &run);
    let others: Vec<Value> = run.alerts().into_iter().filter(|a| a["package"]["name"] != "evil-build").collect();
    assert_eq!(others, Vec::<Value>::new(), "{}", run.describe());
}

/// `npx` of the project's own bin (npm 11 links the project into its `_npx` cache and runs
/// the bin from there) is the project's code: quiet under `watch`; `npx` of another package's
/// bin (the key-cli tarball) still alerts.
#[test]
fn under_watch_npx_of_the_projects_own_bin_is_quiet() {
    let sandbox = Sandbox::new();
    let app = sandbox.copy_fixture("project/key-cli");
    let watch = sandbox.watch();
    let own = sandbox.setup("npx key-cli", sandbox.command("npx").args(["--yes", "key-cli"]).current_dir(&app));
    let tarball = sandbox.npm_pack("project/key-cli");
    let other = sandbox.npm_project();
    let mut npx = sandbox.command("npx");
    npx.args(["--yes", "--package", tarball.to_str().unwrap(), "key-cli"]).current_dir(&other);
    sandbox.setup("npx of the tarball", &mut npx);
    let key = sandbox.credential(".ssh/id_ed25519");
    let alert = sandbox.wait_for(|a| a["file"]["path"] == key.as_str(), std::time::Duration::from_secs(20));
    let run = watch.stop();
    assert!(own.contains("key-cli ran"), "{own}\n{}", run.describe());
    let alert = alert.unwrap_or_else(|| panic!("npx of the tarball raised nothing\n{}", run.describe()));
    assert_eq!(alert["process"]["working_directory"], other.to_str().unwrap(), "{}", run.describe());
    assert_eq!(run.alerts().len(), 1, "only the other project's npx alerts\n{}", run.describe());
}
