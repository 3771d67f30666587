//! Issue 12: every alert says where it came from (host name and machine id, agent version, the CI
//! job that started the package tree, the container), live and replayed alike.

use std::{fs, path::Path};

use credwatch_e2e::{credwatch_binary, parse_alerts, require_root, Run, Sandbox, EXIT_ALERT};
use serde_json::{json, Value};

/// What a GitHub Actions runner sets (fake values), and a token that must not reach the trace.
const GITHUB: &[(&str, &str)] = &[
    ("CI", "true"),
    ("GITHUB_ACTIONS", "true"),
    ("GITHUB_SERVER_URL", "https://github.com"),
    ("GITHUB_REPOSITORY", "octo-org/web-app"),
    ("GITHUB_WORKFLOW", "Build and test"),
    ("GITHUB_RUN_ID", "9876543210"),
    ("GITHUB_RUN_ATTEMPT", "1"),
    ("GITHUB_JOB", "install"),
    ("RUNNER_NAME", "GitHub Actions 42"),
    ("GITHUB_TOKEN", "ghs_notarealtokennotarealtoken000000"),
];

fn credwatch(sandbox: &Sandbox, cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = sandbox.command(credwatch_binary());
    command.args(args).envs(env.iter().copied()).current_dir(cwd);
    sandbox.wait(sandbox.spawn(command))
}

fn alerts_in(path: &Path) -> Vec<Value> {
    parse_alerts(&fs::read_to_string(path).unwrap_or_default())
}

#[test]
fn a_ci_job_is_named_with_the_host_and_agent_live_and_replayed() {
    require_root();
    let sandbox = Sandbox::new();
    let tarball = sandbox.npm_pack("npm/telemetry-helper");
    let project = sandbox.npm_project();
    let work = sandbox.work();
    let trace = work.join("install.jsonl");
    let (live, replayed) = (work.join("live.jsonl"), work.join("replayed.jsonl"));

    let args = ["record", "-o", trace.to_str().unwrap(), "--json", "--alerts", live.to_str().unwrap(), "--"];
    let recording =
        credwatch(&sandbox, &project, &[&args[..], &["npm", "install", tarball.to_str().unwrap()]].concat(), GITHUB);
    recording.assert_exit(EXIT_ALERT);
    let live_alerts = alerts_in(&live);
    let npmrc = sandbox.credential(".npmrc");
    let alert = live_alerts
        .iter()
        .find(|a| a["file"]["path"] == npmrc.as_str() && a["package"]["name"] == "telemetry-helper")
        .unwrap_or_else(|| panic!("no alert for {npmrc}\n{}", recording.describe()));

    let machine_id = fs::read_to_string("/etc/machine-id").unwrap();
    let host_name = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(alert["host"], json!({"name": host_name.trim(), "id": machine_id.trim()}), "{alert:#}");
    assert_eq!(alert["agent"], json!({"version": env!("CARGO_PKG_VERSION")}), "{alert:#}");
    assert_eq!(
        alert["ci"],
        json!({
            "provider": "github",
            "server_url": "https://github.com",
            "repository": "octo-org/web-app",
            "workflow": "Build and test",
            "run_id": "9876543210",
            "run_attempt": "1",
            "job": "install",
            "runner": "GitHub Actions 42",
        }),
        "{alert:#}"
    );
    // The tree ran on the host (CI machines are VMs, not containers): no container, no pod.
    for field in ["container", "orchestrator"] {
        assert!(alert.get(field).is_none(), "a host process with {field}: {alert:#}");
    }
    // Every alert of the tree names the job, not only the one looked at.
    assert!(live_alerts.iter().all(|a| a["ci"]["run_id"] == "9876543210"), "{live_alerts:#?}");

    // The trace holds the identity (since schema 5; 7 is current), and not the token.
    let text = fs::read_to_string(&trace).unwrap();
    let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!((header["credwatch_trace"].as_u64(), header["host_id"].as_str()), (Some(7), Some(machine_id.trim())));
    assert!(text.contains("\"GITHUB_RUN_ID\":\"9876543210\"") && !text.contains("ghs_"), "the trace's env is wrong");

    // Replayed (anywhere, with no CI variables): the same alerts, identity included.
    let replay_args = ["replay", "--json", "--alerts", replayed.to_str().unwrap(), trace.to_str().unwrap()];
    let replay = credwatch(&sandbox, &work, &replay_args, &[]);
    replay.assert_exit(EXIT_ALERT);
    assert_eq!(alerts_in(&replayed), live_alerts, "replay differs from live\n{}", replay.describe());

    // The host and agent come from the trace's header, not from the replaying machine.
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let mut other = header.clone();
    (other["host"], other["host_id"], other["credwatch_version"]) =
        ("elsewhere".into(), "feedfacefeedfacefeedfacefeedface".into(), "0.0.9".into());
    lines[0] = other.to_string();
    let moved = work.join("moved.jsonl");
    fs::write(&moved, lines.join("\n") + "\n").unwrap();
    let replay = credwatch(&sandbox, &work, &["replay", "--json", moved.to_str().unwrap()], &[]);
    replay.assert_exit(EXIT_ALERT);
    let alerts = parse_alerts(&replay.stdout);
    assert!(!alerts.is_empty(), "{}", replay.describe());
    for alert in alerts {
        assert_eq!(alert["host"], json!({"name": "elsewhere", "id": "feedfacefeedfacefeedfacefeedface"}));
        assert_eq!(alert["agent"]["version"], "0.0.9");
    }
}
