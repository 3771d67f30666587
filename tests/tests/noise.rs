//! Real package behaviour that is not theft stays below medium, and says why; the same act
//! outside it still alerts at the rule's severity. Found on real packages (the corpus).

use std::{fs, path::PathBuf};

use credwatch_e2e::{Sandbox, EXIT_ALERT};
use serde_json::Value;

fn exec_alerts_of(alerts: &[Value], program: &str) -> Vec<Value> {
    alerts
        .iter()
        .filter(|a| a["rule"]["id"] == "exec-of-written-file")
        .filter(|a| a["credwatch"]["written_file"].as_str().is_some_and(|f| f.ends_with(program)))
        .cloned()
        .collect()
}

/// bin-build's way (the image optimisers): vendored C sources copied to a temp dir, then
/// `configure` (which compiles and runs its conftest) and `make check` (which runs what it
/// built). Every program the build generated is low, with the reason; the script the same
/// postinstall drops and runs afterwards is high.
#[test]
fn a_build_from_vendored_sources_is_low_a_dropped_script_is_high() {
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack("npm/vendored-build");
    let project = sandbox.npm_project();
    let run = sandbox.run(&project, &["npm", "install", tarball.to_str().unwrap()]);

    run.assert_exit(EXIT_ALERT);
    let alerts = run.alerts();
    for program in ["/configure", "/conftest", "/demo"] {
        let built = exec_alerts_of(&alerts, program);
        assert!(!built.is_empty(), "no exec alert for {program}: the build did not run\n{}", run.describe());
        for alert in built {
            assert_eq!(alert["rule"]["severity"], "low", "{alert:#}");
            let why = alert["credwatch"]["why"].as_str().unwrap_or_default();
            assert!(why.contains("own sources"), "{alert:#}");
            assert_eq!(alert["package"]["name"], "vendored-build", "{alert:#}");
        }
    }
    let dropped = exec_alerts_of(&alerts, "/dropped.sh");
    assert_eq!(dropped.len(), 1, "{}", run.describe());
    assert_eq!(dropped[0]["rule"]["severity"], "high", "{:#}", dropped[0]);
    assert!(dropped[0]["credwatch"]["why"].is_null(), "{:#}", dropped[0]);
    let others: Vec<&Value> = alerts.iter().filter(|a| a["rule"]["id"] != "exec-of-written-file").collect();
    assert!(others.is_empty(), "{others:#?}");
}

/// pip's default: build requirements installed by pip's own runner (`__pip-runner__.py`) into
/// an isolated build environment, setuptools' `distutils-precedence.pth` included. That is pip
/// at work, not a `.pth` planted in site-packages.
#[test]
fn pips_isolated_build_environment_is_quiet() {
    let sandbox = Sandbox::new();
    let wheels = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-wheels");
    assert!(
        fs::read_dir(&wheels)
            .is_ok_and(|mut d| d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("setuptools-")))),
        "{} has no setuptools wheel: `cargo xtask test` downloads it in its set-up",
        wheels.display()
    );
    let source = sandbox.copy_fixture("pip/plain-sdist");
    let target = sandbox.work().join("site");
    let run = sandbox.run(
        &source,
        &[
            "python3",
            "-m",
            "pip",
            "install",
            // Keeps the build environment, to show below that this run planted the `.pth`.
            "--no-clean",
            "--find-links",
            wheels.to_str().unwrap(),
            "--no-deps",
            "--target",
            target.to_str().unwrap(),
            ".",
        ],
    );

    run.assert_exit(0);
    assert!(target.join("plain_sdist.py").exists(), "pip did not install the sdist\n{}", run.describe());
    // Not vacuous: pip's runner did write the `.pth` into its isolated build environment.
    let output = run.describe();
    let planted = fs::read_dir(sandbox.home().parent().unwrap())
        .unwrap()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("pip-build-env-"))
        .any(|env| find_file(&env.path(), "distutils-precedence.pth"));
    assert!(planted, "no distutils-precedence.pth in a pip-build-env-* under TMPDIR\n{output}");
    assert!(run.alerts().is_empty(), "{output}");
}

/// Whether a file named `name` lies anywhere below `dir`.
fn find_file(dir: &std::path::Path, name: &str) -> bool {
    fs::read_dir(dir).into_iter().flatten().flatten().any(|entry| {
        let path = entry.path();
        entry.file_name() == name || (path.is_dir() && !path.is_symlink() && find_file(&path, name))
    })
}
