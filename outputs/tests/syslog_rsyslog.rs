//! The syslog output against a real rsyslog (Debian's package): each test writes its own
//! rsyslog.conf in a temporary directory (local sockets, UDP, TCP and RELP (imrelp, Debian's
//! rsyslog-relp) on loopback, every message written as rsyslog's own JSON with the structured
//! data parsed by mmpstrucdata), starts `rsyslogd -n` on it, sends alerts through the transport
//! and reads them back from rsyslog's output file.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use bytes::Bytes;
use credwatch_core::alert::Severity;
use credwatch_outputs::{
    syslog::{Facility, Syslog, SyslogFormat, SyslogOptions, SyslogTarget},
    Outgoing, Transport, TransportError,
};
use serde_json::{json, Value};

mod support;

/// rsyslogd, wherever Debian put it (`/usr/sbin` is not on every user's PATH).
fn rsyslogd() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join("rsyslogd"))
        .find(|program| program.is_file())
        .expect("rsyslogd not found: install Debian's rsyslog package (`cargo xtask test` does)")
}

/// Ports on loopback free right now, for UDP, TCP and RELP: imudp cannot report a port it
/// picks, and a restarted rsyslogd must listen where the transport sends.
fn free_ports() -> (u16, u16, u16) {
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let relp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (udp, tcp.local_addr().unwrap().port(), relp.local_addr().unwrap().port())
}

/// Whether something listens on TCP `port` of 127.0.0.1, asked of the kernel: a connection
/// that sends nothing is an error in imrelp's log.
fn listening(port: u16) -> bool {
    let local = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp").unwrap().lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A")
    })
}

struct Rsyslog {
    dir: tempfile::TempDir,
    child: Option<Child>,
    udp_port: u16,
    tcp_port: u16,
    relp_port: u16,
}

impl Rsyslog {
    fn start() -> Rsyslog {
        Rsyslog::start_with(free_ports())
    }

    /// On these UDP, TCP and RELP ports.
    fn start_with((udp_port, tcp_port, relp_port): (u16, u16, u16)) -> Rsyslog {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("work")).unwrap();
        let d = dir.path().display();
        // Rate limits off: a test sends bursts. `rfc5424.sock` parses what it gets as any
        // network input does; `rfc3164.sock` is left as a system's /dev/log is, for syslog(3)'s
        // format. RELP's messages go through a queue on disk, checkpointed at each message: imrelp
        // acknowledges a message once it is queued, and rsyslog's default queue is in memory,
        // where a `kill -9` loses what it acknowledged (measured with the queue's dequeueing slowed
        // down: 432 of 3,000 acknowledged messages kept; with a disk queue checkpointed at its
        // default interval, 427; with each message checkpointed, all 3,000).
        let conf = format!(
            r#"global(workDirectory="{d}/work")
module(load="imuxsock" SysSock.Use="off")
module(load="imudp")
module(load="imtcp")
module(load="imrelp")
module(load="mmpstrucdata")
input(type="imuxsock" Socket="{d}/rfc5424.sock" UseSpecialParser="off" ParseHostname="on" RateLimit.Interval="0")
input(type="imuxsock" Socket="{d}/rfc3164.sock" RateLimit.Interval="0")
input(type="imudp" address="127.0.0.1" port="{udp_port}" RateLimit.Interval="0")
input(type="imtcp" address="127.0.0.1" port="{tcp_port}")
input(type="imrelp" address="127.0.0.1" port="{relp_port}" ruleset="relp")
template(name="everything" type="string" string="%jsonmesg%\n")
ruleset(name="out") {{
  action(type="mmpstrucdata")
  action(type="omfile" file="{d}/messages.jsonl" template="everything")
}}
ruleset(name="relp" queue.type="Disk" queue.filename="relp" queue.checkpointInterval="1") {{
  call out
}}
call out
"#
        );
        std::fs::write(dir.path().join("rsyslog.conf"), conf).unwrap();
        let mut rsyslog = Rsyslog { dir, child: None, udp_port, tcp_port, relp_port };
        rsyslog.run();
        rsyslog
    }

    fn run(&mut self) {
        let dir = self.dir.path();
        let child = Command::new(rsyslogd())
            .arg("-n")
            .arg("-f")
            .arg(dir.join("rsyslog.conf"))
            .arg("-i")
            .arg(dir.join("rsyslogd.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("rsyslogd.log")).unwrap())
            .spawn()
            .expect("starting rsyslogd");
        self.child = Some(child);
        // Ready once every input listens: the sockets exist and the ports are taken.
        let taken = |port| std::net::UdpSocket::bind(("127.0.0.1", port)).is_err();
        self.wait_for("rsyslogd to listen", || {
            dir.join("rfc5424.sock").exists()
                && dir.join("rfc3164.sock").exists()
                && taken(self.udp_port)
                && std::net::TcpStream::connect(("127.0.0.1", self.tcp_port)).is_ok()
                && listening(self.relp_port)
        });
        // rsyslogd runs on despite a configuration error: say it here rather than as a timeout.
        let said = std::fs::read_to_string(dir.join("rsyslogd.log")).unwrap();
        assert!(!said.contains("error"), "rsyslogd: {said}");
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGTERM: rsyslogd closes its file and sockets.
            Command::new("kill").arg(child.id().to_string()).status().unwrap();
            child.wait().unwrap();
        }
    }

    /// Sends `signal` (`-STOP`, `-KILL`) to rsyslogd; after `-KILL`, reaps it.
    fn signal(&mut self, signal: &str) {
        let child = self.child.as_mut().unwrap();
        assert!(Command::new("kill").args([signal, &child.id().to_string()]).status().unwrap().success());
        if signal == "-KILL" {
            child.wait().unwrap();
            self.child = None;
        }
    }

    fn wait_for(&self, what: &str, mut ready: impl FnMut() -> bool) {
        let start = Instant::now();
        while !ready() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "timed out waiting for {what}; rsyslogd said: {}",
                std::fs::read_to_string(self.dir.path().join("rsyslogd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// rsyslog's records of what it received, once there are `n`, each checked as rsyslog's
    /// JSON.
    fn messages(&self, n: usize) -> Vec<Value> {
        let file = self.dir.path().join("messages.jsonl");
        let read = || std::fs::read_to_string(&file).unwrap_or_default();
        self.wait_for(&format!("{n} messages in {}", file.display()), || read().lines().count() >= n);
        std::thread::sleep(Duration::from_millis(200));
        let messages: Vec<Value> = read().lines().map(|line| serde_json::from_str(line).unwrap()).collect();
        assert_eq!(messages.len(), n, "{messages:#?}");
        messages
    }

    fn unix(&self, socket: &str) -> SyslogTarget {
        SyslogTarget::Unix(self.dir.path().join(socket))
    }

    fn udp(&self) -> SyslogTarget {
        SyslogTarget::Udp { host: "127.0.0.1".into(), port: self.udp_port }
    }

    fn tcp(&self) -> SyslogTarget {
        SyslogTarget::Tcp { host: "localhost".into(), port: self.tcp_port }
    }

    fn relp(&self) -> SyslogTarget {
        SyslogTarget::Relp { host: "127.0.0.1".into(), port: self.relp_port }
    }
}

impl Drop for Rsyslog {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// An alert as the engine writes it, with an id, a severity and a file of the caller's.
fn alert(id: &str, severity: Severity, path: &str) -> Outgoing {
    let json = json!({
        "@timestamp": "2026-11-29T20:00:00.123456789Z",
        "event": { "kind": "alert", "action": "open", "outcome": "alerted", "id": id },
        "rule": { "id": "cred.ssh.private-key", "name": "SSH private key read by package code",
                  "category": "ssh", "severity": severity.as_str(), "description": "" },
        "process": { "pid": 30, "executable": "/usr/bin/node", "args": ["node", "x.js"],
                     "working_directory": "/p", "parent": { "pid": 20 },
                     "ancestors": [{ "pid": 10, "executable": "/usr/bin/npm", "args": ["npm", "install"] }] },
        "file": { "path": path, "given_path": path, "flags": "O_RDONLY" },
        "package": { "manager": "npm", "name": "evil", "version": "1.0.0", "lifecycle": "postinstall" },
        "host": { "name": "build-7" },
        "user": { "id": 1000 },
        "credwatch": { "root_pid": 10, "rotate": [], "enforcement": "userspace" }
    });
    Outgoing { id: id.into(), severity, host: "build-7".into(), json: Bytes::from(serde_json::to_vec(&json).unwrap()) }
}

/// The structured data as rsyslog parsed it.
fn sd(message: &Value) -> &Value {
    &message["$!"]["rfc5424-sd"]["credwatch@32473"]
}

/// The messages by the id in their structured data, or in their text for RFC 3164.
fn by_id<'a>(messages: &'a [Value], id: &str) -> &'a Value {
    let needle = format!("id=\"{id}\"");
    messages
        .iter()
        .find(|m| sd(m)["id"] == id || m["msg"].as_str().is_some_and(|text| text.contains(&needle)))
        .unwrap_or_else(|| panic!("no message with id {id} in {messages:#?}"))
}

async fn send(target: SyslogTarget, options: SyslogOptions, batch: &[Outgoing]) {
    let mut syslog = Syslog::new(target, options).unwrap();
    syslog.send(batch).await.unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn rfc5424_alerts_reach_rsyslog_over_the_local_socket_udp_tcp_and_relp() {
    let rsyslog = Rsyslog::start();
    let hostile = r#"/home/u/.ssh/id "q" \b ]c"#;
    let local0 = SyslogOptions { facility: Facility::Local0, ..SyslogOptions::default() };
    let transports = [
        ("unix", rsyslog.unix("rfc5424.sock"), SyslogOptions::default()),
        ("udp", rsyslog.udp(), local0.clone()),
        ("tcp", rsyslog.tcp(), SyslogOptions::default()),
        ("relp", rsyslog.relp(), SyslogOptions::default()),
    ];
    for (name, target, options) in transports.clone() {
        let batch = [
            alert(&format!("{name}-0"), Severity::High, "/home/u/.ssh/id_ed25519"),
            alert(&format!("{name}-1"), Severity::Critical, hostile),
            alert(&format!("{name}-2"), Severity::Low, "/home/u/.npmrc"),
        ];
        send(target, options, &batch).await;
    }
    let messages = rsyslog.messages(12);

    for (name, _, options) in transports {
        let facility = options.facility as u64;
        for (i, severity, code, path) in
            [(0, "high", 3, "/home/u/.ssh/id_ed25519"), (1, "critical", 2, hostile), (2, "low", 5, "/home/u/.npmrc")]
        {
            let id = format!("{name}-{i}");
            let message = by_id(&messages, &id);
            let input = if name == "unix" { "imuxsock" } else { &format!("im{name}") };
            assert_eq!(message["inputname"], input, "{message:#}");
            assert_eq!(message["pri"], (facility * 8 + code).to_string(), "{message:#}");
            assert_eq!(message["syslogfacility"], facility.to_string());
            assert_eq!(message["syslogseverity"], code.to_string());
            assert_eq!(message["protocol-version"], "1");
            assert_eq!(message["hostname"], "build-7");
            assert_eq!(message["app-name"], "credwatch");
            assert_eq!(message["procid"], std::process::id().to_string());
            assert_eq!(message["msgid"], "cred.ssh.private-key");
            if name != "unix" {
                // imuxsock stamps its own time by default.
                assert_eq!(message["timereported"], "2026-11-29T20:00:00.123456Z");
            }
            let fields = sd(message);
            assert_eq!(fields["id"], id.as_str(), "{message:#}");
            assert_eq!(fields["rule"], "cred.ssh.private-key");
            assert_eq!(fields["severity"], severity);
            assert_eq!(fields["category"], "ssh");
            assert_eq!(fields["manager"], "npm");
            assert_eq!(fields["package"], "evil");
            assert_eq!(fields["version"], "1.0.0");
            assert_eq!(fields["lifecycle"], "postinstall");
            assert_eq!(fields["file"], path, "{message:#}");
            assert_eq!(fields["pid"], "30");
            let summary = format!(
                "[{}] npm package evil@1.0.0 (postinstall) opened {}",
                severity.to_uppercase(),
                path.replace('\\', "\\\\")
            );
            assert_eq!(message["msg"], summary, "{message:#}");
        }
    }
}

#[tokio::test]
async fn rfc3164_alerts_reach_rsyslog_over_a_syslog3_socket_and_udp() {
    let rsyslog = Rsyslog::start();
    let options = SyslogOptions { format: SyslogFormat::Rfc3164, ..SyslogOptions::default() };
    send(rsyslog.unix("rfc3164.sock"), options.clone(), &[alert("unix", Severity::Medium, "/home/u/.env")]).await;
    send(rsyslog.udp(), options, &[alert("udp", Severity::Medium, "/home/u/.env")]).await;
    let messages = rsyslog.messages(2);
    for (id, input, host) in [("unix", "imuxsock", None), ("udp", "imudp", Some("build-7"))] {
        let message = by_id(&messages, id);
        assert_eq!(message["inputname"], input, "{message:#}");
        assert_eq!(message["pri"], "84", "authpriv.warning: {message:#}");
        assert_eq!(message["protocol-version"], "0");
        assert_eq!(message["syslogtag"], format!("credwatch[{}]:", std::process::id()), "{message:#}");
        assert_eq!(message["procid"], std::process::id().to_string());
        if let Some(host) = host {
            assert_eq!(message["hostname"], host, "{message:#}");
        }
        let text = message["msg"].as_str().unwrap();
        let expected = format!(
            " [credwatch@32473 id=\"{id}\" rule=\"cred.ssh.private-key\" severity=\"medium\" category=\"ssh\" \
             outcome=\"alerted\" manager=\"npm\" package=\"evil\" version=\"1.0.0\" lifecycle=\"postinstall\" \
             file=\"/home/u/.env\" pid=\"30\"] [MEDIUM] npm package evil@1.0.0 (postinstall) opened /home/u/.env"
        );
        assert_eq!(text, expected, "{message:#}");
    }
}

#[tokio::test]
async fn long_alerts_reach_rsyslog_cut_in_their_text_with_all_their_structured_data() {
    let rsyslog = Rsyslog::start();
    // Over 8096 bytes whole (rsyslog's default maximum), under it without the summary's copy.
    let long = format!("/home/u/{}", "k".repeat(4500));
    let medium = format!("/home/u/{}", "m".repeat(1200));
    send(rsyslog.tcp(), SyslogOptions::default(), &[alert("tcp", Severity::High, &long)]).await;
    send(rsyslog.unix("rfc5424.sock"), SyslogOptions::default(), &[alert("unix", Severity::High, &long)]).await;
    send(rsyslog.udp(), SyslogOptions::default(), &[alert("udp", Severity::High, &medium)]).await;
    send(rsyslog.relp(), SyslogOptions::default(), &[alert("relp", Severity::High, &long)]).await;
    // Exactly four: no remainder of an oversized TCP frame comes out as a message of its own.
    let messages = rsyslog.messages(4);
    for (id, path, cap) in [("tcp", &long, 8096), ("unix", &long, 8096), ("udp", &medium, 2048), ("relp", &long, 8096)]
    {
        let message = by_id(&messages, id);
        assert_eq!(sd(message)["file"], path.as_str(), "{message:#}");
        assert_eq!(sd(message)["pid"], "30", "the last field: {message:#}");
        let raw = message["rawmsg"].as_str().unwrap();
        assert!(raw.len() <= cap && raw.len() > cap - 8, "{id}: {} bytes", raw.len());
        let text = message["msg"].as_str().unwrap();
        assert!(text.starts_with("[HIGH] npm package evil@1.0.0 (postinstall) opened /home/u/"), "{text}");
        assert!(text.ends_with("..."), "{text}");
    }
}

#[tokio::test]
async fn tcp_delivery_resumes_once_rsyslog_is_back() {
    let mut rsyslog = Rsyslog::start();
    let mut syslog = Syslog::new(rsyslog.tcp(), SyslogOptions::default()).unwrap();
    let batch =
        |from: usize| (from..from + 5).map(|i| alert(&format!("a{i}"), Severity::High, "/k")).collect::<Vec<_>>();
    syslog.send(&batch(0)).await.unwrap();
    rsyslog.messages(5);

    rsyslog.stop();
    let error = syslog.send(&batch(5)).await.unwrap_err();
    assert!(matches!(&error, TransportError::Retry { message, .. } if message.contains("refused")), "{error}");

    rsyslog.run();
    // The batch that failed, retried, then a new one: on a new connection, nothing lost.
    syslog.send(&batch(5)).await.unwrap();
    syslog.send(&batch(10)).await.unwrap();
    let messages = rsyslog.messages(15);
    for i in 0..15 {
        assert_eq!(by_id(&messages, &format!("a{i}"))["inputname"], "imtcp");
    }
}

/// What plain TCP cannot do: rsyslogd stopped (SIGSTOP), then killed, then back. Over RELP what
/// it acknowledged before the stop is kept (its queue on disk), what was sent to it stopped is
/// a retry (no answer within the timeout), and sent again to the new rsyslogd it arrives.
#[tokio::test]
async fn relp_loses_nothing_to_rsyslog_stopped_then_killed() {
    let mut rsyslog = Rsyslog::start();
    let options = SyslogOptions { timeout: Duration::from_secs(1), ..SyslogOptions::default() };
    let mut syslog = Syslog::new(rsyslog.relp(), options).unwrap();
    let batch = |from: usize, n: usize| {
        (from..from + n).map(|i| alert(&format!("r{i}"), Severity::High, &format!("/k{i}"))).collect::<Vec<_>>()
    };
    // Acknowledged, then killed at once: rsyslog may not have written them yet.
    syslog.send(&batch(0, 2000)).await.unwrap();
    rsyslog.signal("-KILL");
    rsyslog.run();

    rsyslog.signal("-STOP");
    let error = syslog.send(&batch(2000, 200)).await.unwrap_err();
    assert!(
        matches!(&error, TransportError::Retry { output, message }
            if output.starts_with("syslog:relp:127.0.0.1:") && message.contains("no progress in 1s")),
        "{error:?}"
    );
    rsyslog.signal("-KILL");
    let error = syslog.send(&batch(2000, 200)).await.unwrap_err();
    assert!(matches!(&error, TransportError::Retry { message, .. } if message.contains("refused")), "{error}");
    rsyslog.run();
    syslog.send(&batch(2000, 200)).await.unwrap();

    // Each once at least; repeats are what a kill between writing and checkpointing leaves.
    let file = rsyslog.dir.path().join("messages.jsonl");
    let ids = || -> std::collections::BTreeSet<String> {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .map(|m| sd(&m)["id"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    rsyslog.wait_for("2,200 distinct alerts", || ids().len() >= 2200);
    let expected: std::collections::BTreeSet<String> = (0..2200).map(|i| format!("r{i}")).collect();
    assert_eq!(ids(), expected);
    let text = std::fs::read_to_string(&file).unwrap();
    let message: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(message["inputname"], "imrelp", "{message:#}");
}

/// Where rsyslog's RELP input should be, a peer that answers garbage, then one that closes
/// before answering, then one that never answers: each delivery a retry, counted, the alerts
/// kept in the spool; rsyslogd there at last, they arrive, in order, each once.
#[test]
fn hostile_relp_peers_are_retried_and_counted_until_rsyslog_is_there() {
    let run = support::after_hostile_peers(
        |port| format!("syslog:relp:127.0.0.1:{port}"),
        |config| config.timeout = Some(0.5),
    );
    let (udp, tcp, _) = free_ports();
    let rsyslog = Rsyslog::start_with((udp, tcp, run.port));
    let counts = support::wait_for_counts(&run.reader, "20 delivered", Duration::from_secs(30), |c| c.delivered == 20);
    assert_eq!((counts.spooled, counts.dropped), (0, [0; 4]), "{counts:?}");
    let got: Vec<String> = rsyslog.messages(20).iter().map(|m| sd(m)["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(got, support::ids(1..=20));
    run.dispatcher.shutdown(Duration::from_secs(1));
    // The agent's session ended with RELP's `close`: rsyslog says no session broke (it would
    // at once, as it noticed the end of the connection).
    std::thread::sleep(Duration::from_millis(300));
    let log = std::fs::read_to_string(rsyslog.dir.path().join("rsyslogd.log")).unwrap();
    assert!(!log.contains("broken"), "{log}");
}
