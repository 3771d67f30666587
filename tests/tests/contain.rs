//! `credwatch run --contain`: package code in the box finds the catalogue's credential files
//! empty and secret variables gone, cannot unmount or reach around the box, and its reads still
//! alert; real installs in the box succeed; without root the box is a user namespace.

use std::{fs, path::Path};

use credwatch_e2e::{assert_field, OtherUser, Run, Sandbox, EXIT_ALERT, FAKE_CREDENTIALS};
use serde_json::Value;

/// Variables the fixtures' environment carries, as a CI job's would: all withheld in the box.
const FAKE_VARIABLES: &[(&str, &str)] = &[
    ("GITHUB_TOKEN", "ghs_FAKEcredwatchE2E"),
    ("NPM_TOKEN", "npm_FAKEcredwatchE2E"),
    ("AWS_SECRET_ACCESS_KEY", "FAKEcredwatchE2E"),
];

fn contained(sandbox: &Sandbox, cwd: &Path, cmd: &[&str], env: &[(&str, &str)]) -> Run {
    let mut env = env.to_vec();
    env.extend_from_slice(FAKE_VARIABLES);
    sandbox.run_with(cwd, &["--contain"], cmd, &env)
}

/// No fake secret anywhere in `text`: every fake credential and variable holds `FAKE`.
fn assert_no_secret(text: &str, run: &Run) {
    assert!(!text.contains("FAKE"), "a secret reached the box:\n{text}\n{}", run.describe());
}

#[test]
fn an_attack_in_the_box_reads_nothing_secret_and_still_alerts() {
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack("npm/contain-probe");
    let project = sandbox.npm_project();
    let report_path = sandbox.work().join("probe.json");
    let probed: Vec<String> = FAKE_CREDENTIALS.iter().map(|(relative, _)| sandbox.credential(relative)).collect();
    let run = contained(
        &sandbox,
        &project,
        &["npm", "install", tarball.to_str().unwrap()],
        &[("CREDWATCH_E2E_REPORT", report_path.to_str().unwrap()), ("CREDWATCH_E2E_PROBE", &probed.join("\n"))],
    );

    run.assert_exit(EXIT_ALERT);
    let text = fs::read_to_string(&report_path).unwrap_or_else(|_| panic!("the probe did not run\n{}", run.describe()));
    assert_no_secret(&text, &run);
    let report: Value = serde_json::from_str(&text).unwrap();
    // Each file is there and empty (found, so a scanner moves on), but for ~/.npmrc: npm's
    // settings without the token.
    for file in &probed {
        let expected = if file.ends_with("/.npmrc") { "package-lock=false\n" } else { "" };
        assert_eq!(report["files"][file]["ok"], expected, "{file} in the box\n{text}\n{}", run.describe());
        assert!(report["around"][file]["ok"].is_null(), "{file} through /proc/1/root\n{text}");
    }
    for (name, _) in FAKE_VARIABLES {
        assert!(report["env"][name].is_null(), "${name} reached the box\n{text}");
    }
    assert_ne!(report["umount"], 0, "root in the box unmounted ~/.ssh/id_ed25519\n{text}");
    assert_eq!(report["write"]["error"], "EROFS", "a hidden file took a write\n{text}");
    // Outside the box the files are untouched.
    assert!(fs::read_to_string(sandbox.home().join(".npmrc")).unwrap().contains("FAKE"));

    // The reads alert as they would outside the box: the first ones each, then as a sweep.
    for relative in [".npmrc", ".ssh/id_ed25519"] {
        let alert = run.expect_alert(&sandbox.credential(relative));
        assert_field(&alert, "/package/name", "contain-probe", &run);
        assert_field(&alert, "/package/lifecycle", "postinstall", &run);
        // And say that the credential was not read.
        assert_eq!(alert["credwatch"]["contained"], true, "{alert:#}");
        assert_eq!(alert["credwatch"]["rotate"], serde_json::json!([]), "{alert:#}");
    }
    let sweep = run.alerts().into_iter().find(|alert| alert["rule"]["id"] == "credential-sweep");
    let sweep = sweep.unwrap_or_else(|| panic!("no credential-sweep alert\n{}", run.describe()));
    assert_field(&sweep, "/package/name", "contain-probe", &run);
    assert_eq!(sweep["credwatch"]["contained"], true, "{sweep:#}");
    // The registry credentials are said not to be passed, by path and name, never by value.
    assert!(run.stderr.contains("not passed to the package manager"), "{}", run.describe());
    assert!(
        run.stderr.contains(&sandbox.credential(".npmrc")) && run.stderr.contains("$NPM_TOKEN"),
        "{}",
        run.describe()
    );
    assert_no_secret(&run.stderr, &run);
}

#[test]
fn the_attack_fixtures_of_cargo_and_pip_still_alert_in_the_box() {
    let sandbox = Sandbox::new();
    let krate = sandbox.copy_fixture("cargo/build-script");
    let run = contained(&sandbox, &krate, &["cargo", "build", "--offline"], &[]);
    run.assert_exit(EXIT_ALERT);
    let alert = run.expect_alert(&sandbox.credential(".cargo/credentials.toml"));
    assert_field(&alert, "/package/name", "evil-build", &run);

    let source = sandbox.copy_fixture("pip/evil-sdist");
    fs::rename(&source, sandbox.work().join("evil_sdist-4.5.6")).unwrap();
    sandbox.setup(
        "tar (building the sdist)",
        sandbox.command("tar").args(["czf", "evil_sdist-4.5.6.tar.gz", "evil_sdist-4.5.6"]),
    );
    let target = sandbox.work().join("site");
    let pip = ["python3", "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps", "--target"];
    let sdist = ["evil_sdist-4.5.6.tar.gz"];
    let cmd: Vec<&str> = pip.into_iter().chain([target.to_str().unwrap()]).chain(sdist).collect();
    let run = contained(&sandbox, &sandbox.work(), &cmd, &[]);
    run.assert_exit(EXIT_ALERT);
    assert!(target.join("evil_sdist.py").exists(), "pip did not install the sdist\n{}", run.describe());
    let alert = run.expect_alert(&sandbox.credential(".pypirc"));
    assert_field(&alert, "/package/manager", "pip", &run);
}

#[test]
fn real_installs_succeed_in_the_box() {
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack("npm/benign");
    let project = sandbox.npm_project();
    let run = contained(&sandbox, &project, &["npm", "install", tarball.to_str().unwrap()], &[]);
    run.assert_exit(0);
    assert!(run.alerts().is_empty(), "expected no alert\n{}", run.describe());
    let built = fs::read_to_string(project.join("node_modules/benign-build/built.txt"));
    assert_eq!(built.ok().as_deref(), Some("built by benign-build 2.0.0\n"), "{}", run.describe());
    // npm read the settings of ~/.npmrc in the box: its `package-lock=false` took effect.
    assert!(!project.join("package-lock.json").exists(), "npm lost the settings of ~/.npmrc\n{}", run.describe());

    // pip's default: the build in an isolated environment of setuptools' wheel, which `cargo
    // xtask test` downloads in its set-up.
    let wheels = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-wheels");
    let source = sandbox.copy_fixture("pip/plain-sdist");
    let target = sandbox.work().join("site");
    let pip = ["python3", "-m", "pip", "install", "--no-deps", "--find-links", wheels.to_str().unwrap(), "--target"];
    let cmd: Vec<&str> = pip.into_iter().chain([target.to_str().unwrap(), "."]).collect();
    let run = contained(&sandbox, &source, &cmd, &[]);
    run.assert_exit(0);
    assert!(target.join("plain_sdist.py").exists(), "pip did not install the sdist\n{}", run.describe());
    assert!(run.alerts().is_empty(), "expected no alert\n{}", run.describe());
}

/// An unprivileged user's `run --contain`: a user namespace hides its files, and the run says
/// that it watches nothing itself.
#[test]
fn without_root_the_box_is_a_user_namespace() {
    const UID: u32 = 64_123;
    let user = OtherUser::new(UID);
    let home = &user.home;
    for (relative, text) in FAKE_CREDENTIALS {
        let path = home.join(relative);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, text).unwrap();
    }
    user.own(home);
    let output = user
        .command(&user.binary)
        .args(["run", "--contain", "--", "sh", "-c"])
        .arg("cat ~/.ssh/id_ed25519 ~/.aws/credentials ~/.npmrc; echo \"token=$NPM_TOKEN\"; id -u")
        .env("NPM_TOKEN", "npm_FAKEcredwatchE2E")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{}\n{stdout}\n{stderr}", output.status);
    // The files read empty (npm's settings without the token), the variable is gone; the same
    // uid inside.
    assert_eq!(stdout, format!("package-lock=false\ntoken=\n{UID}\n"), "{stderr}");
    assert!(stderr.contains("not root") && stderr.contains("credwatch watch"), "{stderr}");
    assert!(fs::read_to_string(home.join(".npmrc")).unwrap().contains("FAKE"));
}
