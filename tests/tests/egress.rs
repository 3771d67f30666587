//! Egress of package code, end to end: a postinstall connects where `EGRESS_CASE` says
//! (`tests/fixtures/npm/egress-probe`). Everything runs inside a mount and network namespace of
//! the test's own (`tests/fixtures/egress/netns.sh`): only loopback exists, invented names
//! resolve through a DNS responder on 127.0.0.53 to receivers on 127.0.0.x, and a socket of the
//! lab's own stands at /run/docker.sock. Nothing leaves the machine.

use std::{fs, path::PathBuf};

use credwatch_e2e::{credwatch_binary, fixtures, parse_alerts, Run, Sandbox, EXIT_ALERT};
use serde_json::Value;

/// Where the exfiltrating case posts, and the registry name, as the lab's DNS maps them.
const COLLECTOR: (&str, &str) = ("collector.exfil.invalid", "127.0.0.9");
const REGISTRY: (&str, &str) = ("registry.npmjs.org", "127.0.0.10");
const PORT: u16 = 8080;
/// The lab's stand-in for an SSH agent, in the private /run; the install's `SSH_AUTH_SOCK`.
const AGENT_SOCKET: &str = "/run/lab-ssh-agent.sock";

/// One `npm install` of the probe package under `credwatch run OPTIONS`, in a fresh lab.
struct LabRun {
    /// The lab's records live in its directory.
    sandbox: Sandbox,
    run: Run,
    lab: PathBuf,
    npmrc: String,
}

impl LabRun {
    /// `credwatch run OPTIONS -- <the install>`.
    fn new(case: &str, options: &[&str]) -> LabRun {
        LabRun::with(case, |sandbox| {
            let alerts = sandbox.alerts_file().to_string_lossy().into_owned();
            ["run", "--json", "--alerts", &alerts].iter().chain(options).map(|s| (*s).to_owned()).collect()
        })
    }

    /// `credwatch ARGS -- <the install>`, ARGS made from the sandbox.
    fn with(case: &str, args: impl Fn(&Sandbox) -> Vec<String>) -> LabRun {
        let sandbox = Sandbox::new();
        let tarball = sandbox.npm_pack("npm/egress-probe");
        let project = sandbox.npm_project();
        let lab = sandbox.work().join("lab");
        fs::create_dir_all(&lab).unwrap();
        let netns = fixtures().join("egress/netns.sh");
        let receivers = format!(
            "--dns 127.0.0.53 --map {}={} {}={} --tcp {}:{PORT} {}:{PORT} --unix /run/docker.sock {AGENT_SOCKET}",
            COLLECTOR.0, COLLECTOR.1, REGISTRY.0, REGISTRY.1, COLLECTOR.1, REGISTRY.1
        );
        let cmd = [
            "unshare",
            "--mount",
            "--net",
            "--",
            "sh",
            netns.to_str().unwrap(),
            lab.to_str().unwrap(),
            "--",
            "npm",
            "install",
            tarball.to_str().unwrap(),
        ];
        let done = lab.join("probe-done");
        let env = [
            ("EGRESS_CASE", case),
            ("NETLAB_ARGS", receivers.as_str()),
            ("SSH_AUTH_SOCK", AGENT_SOCKET),
            ("EGRESS_DONE", done.to_str().unwrap()),
        ];
        let mut command = sandbox.command(credwatch_binary());
        command.args(args(&sandbox)).arg("--").args(cmd).current_dir(&project).envs(env);
        let run = sandbox.wait(sandbox.spawn(command));
        assert!(lab.join("ready").exists(), "the lab never started\n{}", run.describe());
        let npmrc = sandbox.credential(".npmrc");
        LabRun { sandbox, run, lab, npmrc }
    }

    /// What a receiver got (it records every connection, even an empty one).
    fn received(&self, name: &str) -> String {
        let path = self.lab.join(name);
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), self.run.describe()))
    }

    /// The probe ran to its end (it was not killed).
    fn probe_finished(&self) -> bool {
        self.lab.join("probe-done").exists()
    }

    fn alerts_of(&self, rule: &str) -> Vec<Value> {
        self.run.alerts().into_iter().filter(|a| a["rule"]["id"] == rule).collect()
    }

    #[track_caller]
    fn one_alert_of(&self, rule: &str) -> Value {
        let alerts = self.alerts_of(rule);
        assert_eq!(alerts.len(), 1, "one {rule} alert expected\n{}", self.run.describe());
        alerts.into_iter().next().unwrap()
    }
}

#[test]
fn postinstall_posting_the_npmrc_to_an_invented_host_is_one_critical_exfiltration() {
    let lab = LabRun::new("exfil", &[]);
    lab.run.assert_exit(EXIT_ALERT);
    let alert = lab.one_alert_of("exfiltration");
    assert_eq!(alert["rule"]["severity"], "critical", "{alert:#}");
    assert_eq!(alert["event"]["action"], "connect", "{alert:#}");
    assert_eq!(alert["event"]["outcome"], "alerted", "{alert:#}");
    assert_eq!(alert["destination"]["domain"], COLLECTOR.0, "{alert:#}");
    assert_eq!(alert["destination"]["address"], COLLECTOR.1, "{alert:#}");
    assert_eq!(alert["destination"]["port"], PORT, "{alert:#}");
    assert_eq!(alert["destination"]["socket_type"], "stream", "{alert:#}");
    assert_eq!(alert["credwatch"]["credentials_touched"], serde_json::json!([lab.npmrc]), "{alert:#}");
    assert_eq!(alert["package"]["name"], "egress-probe", "{alert:#}");
    assert_eq!(alert["package"]["lifecycle"], "postinstall", "{alert:#}");
    // Without --enforce the post goes through: the receiver has the fake token.
    let received = lab.received(&format!("tcp-{}-{PORT}", COLLECTOR.1));
    assert!(received.contains("npm_FAKEcredwatchE2E"), "the collector got: {received:?}\n{}", lab.run.describe());
    assert!(lab.probe_finished(), "{}", lab.run.describe());
}

#[test]
fn enforce_kills_the_exfiltrating_postinstall_before_it_sends_anything() {
    let lab = LabRun::new("exfil", &["--enforce"]);
    let alert = lab.one_alert_of("exfiltration");
    assert_eq!(alert["event"]["outcome"], "blocked", "{alert:#}");
    assert_eq!(alert["credwatch"]["enforcement"], "kernel-hold", "{alert:#}");
    assert_eq!(alert["destination"]["domain"], COLLECTOR.0, "{alert:#}");
    // The kernel stopped the process at the connect; the agent killed it on the verdict. The
    // handshake may have completed, but not one byte of the request was sent.
    let received = lab.received(&format!("tcp-{}-{PORT}", COLLECTOR.1));
    assert_eq!(received, "", "the collector got data despite --enforce\n{}", lab.run.describe());
    assert!(!lab.probe_finished(), "the probe ran to its end despite --enforce\n{}", lab.run.describe());
}

#[test]
fn a_recorded_enforced_exfiltration_replays_to_the_same_blocked_alert() {
    let trace = std::sync::OnceLock::new();
    let lab = LabRun::with("exfil", |sandbox| {
        let path = trace.get_or_init(|| sandbox.work().join("exfil.jsonl")).to_string_lossy().into_owned();
        let alerts = sandbox.alerts_file().to_string_lossy().into_owned();
        ["record", "--enforce", "-o", &path, "--json", "--alerts", &alerts].map(str::to_owned).to_vec()
    });
    let live = lab.one_alert_of("exfiltration");
    assert_eq!(live["event"]["outcome"], "blocked", "{live:#}");
    let trace = trace.get().unwrap();
    let text = fs::read_to_string(trace).unwrap();
    assert!(text.contains(r#""kind":"connect""#) && text.contains(r#""held":true"#), "{}", lab.run.describe());
    assert!(text.contains(r#""kind":"dns_query""#), "{}", lab.run.describe());
    let replay = lab
        .sandbox
        .command(credwatch_binary())
        .args(["replay", "--json", trace.to_str().unwrap()])
        .output()
        .expect("running credwatch replay");
    let replayed = parse_alerts(&String::from_utf8_lossy(&replay.stdout));
    assert_eq!(replayed, lab.run.alerts(), "replay differs from live\n{}", lab.run.describe());
}

#[test]
fn a_config_read_then_the_registry_is_no_exfiltration() {
    let lab = LabRun::new("read-then-registry", &[]);
    assert!(lab.alerts_of("exfiltration").is_empty(), "{}", lab.run.describe());
    // The read itself is still told (its severity is the registry rule's business).
    assert!(lab.run.alerts().iter().any(|a| a["file"]["path"] == lab.npmrc.as_str()), "{}", lab.run.describe());
    let received = lab.received(&format!("tcp-{}-{PORT}", REGISTRY.1));
    assert!(received.contains("POST /collect"), "the registry stand-in got: {received:?}\n{}", lab.run.describe());
}

#[test]
fn a_config_loaders_read_is_low_alone_and_critical_once_it_is_sent_elsewhere() {
    let quiet = LabRun::new("loader-then-registry", &[]);
    let reads: Vec<Value> =
        quiet.run.alerts().into_iter().filter(|a| a["file"]["path"] == quiet.npmrc.as_str()).collect();
    assert!(!reads.is_empty() && reads.iter().all(|a| a["rule"]["severity"] == "low"), "{}", quiet.run.describe());
    assert!(quiet.alerts_of("exfiltration").is_empty(), "{}", quiet.run.describe());

    let sent = LabRun::new("loader-then-collector", &[]);
    let alert = sent.one_alert_of("exfiltration");
    assert_eq!(alert["rule"]["severity"], "critical", "{alert:#}");
    assert_eq!(alert["destination"]["domain"], COLLECTOR.0, "{alert:#}");
    assert_eq!(alert["credwatch"]["credentials_touched"], serde_json::json!([sent.npmrc]), "{alert:#}");
}

#[test]
fn postinstall_talking_to_the_registry_without_reading_anything_is_quiet() {
    let lab = LabRun::new("registry", &[]);
    lab.run.assert_exit(0);
    assert!(lab.run.alerts().is_empty(), "{}", lab.run.describe());
    assert!(lab.received(&format!("tcp-{}-{PORT}", REGISTRY.1)).contains("POST /collect"), "{}", lab.run.describe());
}

#[test]
fn postinstall_connecting_to_the_docker_socket_is_high() {
    let lab = LabRun::new("docker", &[]);
    lab.run.assert_exit(EXIT_ALERT);
    let alert = lab.one_alert_of("docker-socket");
    assert_eq!(alert["rule"]["severity"], "high", "{alert:#}");
    assert_eq!(alert["destination"]["address"], "/run/docker.sock", "{alert:#}");
    assert_eq!(alert["destination"]["family"], "unix", "{alert:#}");
    assert!(lab.received("unix-docker.sock").contains("/containers/json"), "{}", lab.run.describe());
}

#[test]
fn postinstall_connecting_to_the_cloud_metadata_address_is_high_even_when_it_fails() {
    let lab = LabRun::new("metadata", &[]);
    lab.run.assert_exit(EXIT_ALERT);
    let alert = lab.one_alert_of("cloud-metadata");
    assert_eq!(alert["rule"]["severity"], "high", "{alert:#}");
    assert_eq!(alert["destination"]["address"], "169.254.169.254", "{alert:#}");
    assert_eq!(alert["destination"]["port"], 80, "{alert:#}");
}

#[test]
fn postinstall_connecting_to_the_ssh_agent_socket_is_high() {
    let lab = LabRun::new("ssh-agent", &[]);
    lab.run.assert_exit(EXIT_ALERT);
    let alert = lab.one_alert_of("ssh-agent-socket");
    assert_eq!(alert["rule"]["severity"], "high", "{alert:#}");
    assert_eq!(alert["destination"]["address"], AGENT_SOCKET, "{alert:#}");
    // The request the package sent (SSH_AGENTC_REQUEST_IDENTITIES) reached the lab's socket.
    assert!(lab.received("unix-lab-ssh-agent.sock").contains('\u{b}'), "{}", lab.run.describe());
}
