//! Configuration chains judged whole (issue 24, point 4): a package's install step that loads
//! npm's configuration with the loader npm itself ships (`@npmcli/config`) reads the project's
//! `.npmrc`, then `~/.npmrc`, then the global npmrc, in one process within a few ms. Both reads
//! are low, the project's too although it came first: its alert waits for the chain's window.
//! A postinstall that reads the project's `.npmrc` alone is high. Real npm, offline, a
//! throwaway HOME of fake credentials. Run as root with `cargo xtask test`.

use std::{fs, path::PathBuf};

use credwatch_e2e::{assert_field, Run, Sandbox, EXIT_ALERT};
use serde_json::Value;

/// An npm project with its own `.npmrc` holding only a registry, as many have.
fn project_with_npmrc(sandbox: &Sandbox) -> (PathBuf, String) {
    let project = sandbox.npm_project();
    let npmrc = project.join(".npmrc");
    fs::write(&npmrc, "registry=http://127.0.0.1:4873/\n").unwrap();
    (project, npmrc.to_string_lossy().into_owned())
}

/// The one alert about `path`, from `package`'s postinstall.
#[track_caller]
fn one_alert(run: &Run, path: &str, package: &str) -> Value {
    let alerts = run.alerts_for(path);
    assert_eq!(alerts.len(), 1, "one alert for {path}\n{}", run.describe());
    let alert = alerts.into_iter().next().unwrap();
    assert_field(&alert, "/rule/id", "npm-registry-token", run);
    assert_field(&alert, "/package/name", package, run);
    assert_field(&alert, "/package/lifecycle", "postinstall", run);
    alert
}

#[test]
fn npms_own_config_loader_in_a_postinstall_reads_the_chain_at_low_the_projects_file_first() {
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack("npm/config-loader");
    let (project, project_npmrc) = project_with_npmrc(&sandbox);
    let run = sandbox.run(&project, &["npm", "install", tarball.to_str().unwrap()]);

    // The loader ran and took the registry from the project's file: it read it.
    let found = fs::read_to_string(project.join("config-loader.txt")).unwrap_or_default();
    assert_eq!(found, "registry http://127.0.0.1:4873/\n", "{}", run.describe());
    run.assert_exit(EXIT_ALERT);
    // npm reading both files itself is no alert; the loader's reads are one each, both low.
    let first = one_alert(&run, &project_npmrc, "config-loader");
    let then = one_alert(&run, &sandbox.credential(".npmrc"), "config-loader");
    for alert in [&first, &then] {
        assert_field(alert, "/rule/severity", "low", &run);
        let why = alert["credwatch"]["why"].as_str().unwrap_or_default();
        assert!(why.contains("configuration chain"), "{alert:#}");
    }
    assert_eq!(first["process"]["pid"], then["process"]["pid"], "one loader read both");
    assert!(first["@timestamp"].as_str() < then["@timestamp"].as_str(), "the project's file was read first");
    println!(
        "@npmcli/config in a postinstall: the project's .npmrc at {}, ~/.npmrc at {}: both low",
        first["@timestamp"].as_str().unwrap_or_default(),
        then["@timestamp"].as_str().unwrap_or_default()
    );
}

#[test]
fn a_postinstall_reading_the_projects_npmrc_alone_is_high() {
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack("npm/project-npmrc-grab");
    let (project, project_npmrc) = project_with_npmrc(&sandbox);
    let run = sandbox.run(&project, &["npm", "install", tarball.to_str().unwrap()]);

    run.assert_exit(EXIT_ALERT);
    let alert = one_alert(&run, &project_npmrc, "project-npmrc-grab");
    assert_field(&alert, "/rule/severity", "high", &run);
    assert_eq!(alert["credwatch"]["why"], Value::Null, "{alert:#}");
    assert!(run.alerts_for(&sandbox.credential(".npmrc")).is_empty(), "{}", run.describe());
}
