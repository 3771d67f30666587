//! Section 6: the outputs. (a) Alerts delivered per second to each output, with the real binary
//! and real receivers on loopback (rsyslogd over unix/udp/tcp, `nats-server -js`, an HTTP
//! receiver), counted at the receiver, and the agent's CPU per delivered alert; (b) a flood of
//! alerts from live package code under `credwatch watch` with the webhook's receiver down,
//! against the same flood with no outputs: the kernel events lost must not grow, since outputs
//! never hold the engine (and so the ring buffers) back.
//!
//! The driver of (a) is `credwatch run --config FILE -- reader DIR N hold`: a package reading N
//! distinct credential files, one alert each. `run` rather than `replay` because the outputs'
//! knobs (NDJSON) are set in the configuration file, which `replay` does not read, and because
//! `replay` gives its outputs 3 s at the end, while a held `run` stays up until the receiver has
//! every alert.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::{BufRead, BufReader, Read, Seek, SeekFrom, Write},
    net::{TcpListener, TcpStream, UdpSocket},
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::{
    cpu_seconds, events::settled_cpu_seconds, fmt, median, parse_summary, pin_dir, say, signal, syscalls::nan_null,
    unpin, wait_or_kill, Ctx, Lines, Section,
};
use crate::toolchain::find_in_path;

/// The credential files read, under the bench's HOME: `pass`'s store, one rule and one
/// category (no sweep folds them), so that each file read is one alert.
const SECRETS: &str = ".password-store/cwbench";
/// No new id at the receiver for this long: what is missing will not come.
const STALLED: Duration = Duration::from_secs(10);
/// The longest one delivery measurement may take.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(180);
/// Where the outputs spool (and the file output writes), on an ext4 of its own (see [`Mount`]).
const SPOOLS: &str = "spools";
/// The flood's package manager under the bench's work folder: sh, named npm.
const FLOOD_NPM: &str = "flood-bin/npm";
/// Exit status of `credwatch run` when an alert fired.
const RUN_ALERTED: i32 = 10;

/// Where alerts go in (a).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// No output: the agent's own `--alerts` file is the receiver (the raising rate).
    None,
    File,
    SyslogUnix,
    SyslogUdp,
    SyslogTcp,
    Webhook,
    WebhookNdjson,
    Falcosidekick,
    Nats,
}

const KINDS: [Kind; 9] = [
    Kind::None,
    Kind::File,
    Kind::SyslogUnix,
    Kind::SyslogUdp,
    Kind::SyslogTcp,
    Kind::Webhook,
    Kind::WebhookNdjson,
    Kind::Falcosidekick,
    Kind::Nats,
];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::None => "none (the `--alerts` file only)",
            Kind::File => "file",
            Kind::SyslogUnix => "syslog unix",
            Kind::SyslogUdp => "syslog udp",
            Kind::SyslogTcp => "syslog tcp",
            Kind::Webhook => "webhook ECS (one per request)",
            Kind::WebhookNdjson => "webhook NDJSON (batches)",
            Kind::Falcosidekick => "falcosidekick",
            Kind::Nats => "NATS JetStream",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Kind::None => "none",
            Kind::File => "file",
            Kind::SyslogUnix => "syslog_unix",
            Kind::SyslogUdp => "syslog_udp",
            Kind::SyslogTcp => "syslog_tcp",
            Kind::Webhook => "webhook",
            Kind::WebhookNdjson => "webhook_ndjson",
            Kind::Falcosidekick => "falcosidekick",
            Kind::Nats => "nats",
        }
    }

    fn receiver(self) -> &'static str {
        match self {
            Kind::None => "the agent's `--alerts` file",
            Kind::File => "the output's file",
            Kind::SyslogUnix | Kind::SyslogUdp | Kind::SyslogTcp => "rsyslogd (imuxsock/imudp/imtcp → omfile)",
            Kind::Webhook | Kind::WebhookNdjson | Kind::Falcosidekick => "HTTP receiver (hyper, loopback)",
            Kind::Nats => "nats-server -js, stream read back",
        }
    }
}

/// Every id a receiver has seen, and when the last new one came.
#[derive(Default)]
struct Arrivals {
    seen: BTreeMap<String, u32>,
    total: u64,
    last_new: Option<Instant>,
}

type Shared = Arc<Mutex<Arrivals>>;

fn arrive(arrivals: &Shared, id: String) {
    let mut arrivals = arrivals.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    arrivals.total += 1;
    let count = arrivals.seen.entry(id).or_insert(0);
    *count += 1;
    if *count == 1 {
        arrivals.last_new = Some(Instant::now());
    }
}

fn unique(arrivals: &Shared) -> usize {
    arrivals.lock().map(|a| a.seen.len()).unwrap_or(0)
}

/// The alert's `event.id` in an ECS JSON line.
fn ecs_id(line: &str) -> Option<String> {
    let alert: Value = serde_json::from_str(line).ok()?;
    alert.pointer("/event/id")?.as_str().map(str::to_owned)
}

/// The alert's id in a syslog message's structured data (`[credwatch@32473 id=".." ...`).
fn syslog_id(line: &str) -> Option<String> {
    let rest = line.split_once("[credwatch@32473 id=\"")?.1;
    Some(rest.split_once('"')?.0.to_owned())
}

/// A file's new lines, from `offset` on, read every 10 ms on a thread until stopped: each line's
/// id (by `extract`) arrives.
struct Tail {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Tail {
    fn start(path: PathBuf, offset: u64, extract: fn(&str) -> Option<String>, arrivals: Shared) -> Tail {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = thread::spawn(move || {
            let (mut offset, mut partial) = (offset, Vec::new());
            loop {
                let last = stopped.load(Ordering::Relaxed);
                if let Ok(mut file) = fs::File::open(&path) {
                    let mut buffer = Vec::new();
                    if file.seek(SeekFrom::Start(offset)).is_ok() && file.read_to_end(&mut buffer).is_ok() {
                        offset += buffer.len() as u64;
                        partial.extend_from_slice(&buffer);
                        // Only whole lines: the writer may be in the middle of one.
                        if let Some(end) = partial.iter().rposition(|b| *b == b'\n') {
                            let lines: Vec<u8> = partial.drain(..=end).collect();
                            for line in String::from_utf8_lossy(&lines).lines() {
                                arrive(&arrivals, extract(line).unwrap_or_else(|| "?".into()));
                            }
                        }
                    }
                }
                if last {
                    return;
                }
                thread::sleep(Duration::from_millis(10));
            }
        });
        Tail { stop, thread: Some(thread) }
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A program from a Debian package, wherever it put it (`/usr/sbin` is not on every PATH).
fn program(name: &str) -> Option<PathBuf> {
    find_in_path(name).or_else(|| {
        ["/usr/sbin", "/usr/bin", "/sbin"].iter().map(|dir| Path::new(dir).join(name)).find(|path| path.is_file())
    })
}

fn free_tcp_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0").context("binding a loopback port")?.local_addr()?.port())
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > timeout {
            bail!("timed out waiting for {what}");
        }
        thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A server child, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A file system mounted on a folder for the section, unmounted when dropped (its files gone at
/// once). This machine's root file system is ext4 without a journal, mounted with `discard`:
/// every unlink waits for a discard (~1 ms), and every file created after many were deleted
/// scans for an inode not "recently deleted" (~1 ms of CPU, seen with perf in the spool's
/// creates). The flood's 100k credential files and the outputs' spools would measure that, and
/// take minutes to remove; so the credential files are on a tmpfs and the spools on a journaled
/// ext4 in an image file, as a typical host's /var/lib would be.
struct Mount {
    dir: PathBuf,
    image: Option<PathBuf>,
}

impl Mount {
    fn tmpfs(dir: &Path) -> Result<Mount> {
        fs::create_dir_all(dir)?;
        mount(Command::new("mount").args(["-t", "tmpfs", "-o", "size=2g,mode=0700", "tmpfs"]).arg(dir))?;
        Ok(Mount { dir: dir.to_owned(), image: None })
    }

    /// A fresh ext4 (journaled, mkfs's defaults) of `bytes` in a sparse `image`, on a loop device.
    fn ext4(dir: &Path, image: &Path, bytes: u64) -> Result<Mount> {
        fs::create_dir_all(dir)?;
        fs::File::create(image).and_then(|file| file.set_len(bytes)).context("making the ext4 image")?;
        let mounted = Mount { dir: dir.to_owned(), image: Some(image.to_owned()) };
        mount(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(image))?;
        mount(Command::new("mount").args(["-o", "loop"]).arg(image).arg(dir))?;
        Ok(mounted)
    }
}

fn mount(command: &mut Command) -> Result<()> {
    let output = command.stdin(Stdio::null()).output().with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).stderr(Stdio::null()).status();
        if let Some(image) = &self.image {
            let _ = fs::remove_file(image);
        }
    }
}

/// The kernel's count of UDP datagrams dropped because a receiving socket's buffer was full
/// (`RcvbufErrors` in /proc/net/snmp).
fn udp_receive_buffer_errors() -> Option<u64> {
    let snmp = fs::read_to_string("/proc/net/snmp").ok()?;
    let mut udp = snmp.lines().filter(|line| line.starts_with("Udp: "));
    let (names, values) = (udp.next()?, udp.next()?);
    let index = names.split_whitespace().position(|name| name == "RcvbufErrors")?;
    values.split_whitespace().nth(index)?.parse().ok()
}

/// One rsyslogd with an input per syslog transport, each into a file of its own (the raw
/// message: the bench reads the id from the structured data).
struct Rsyslog {
    _server: Server,
    dir: PathBuf,
    tcp: u16,
    udp: u16,
}

impl Rsyslog {
    fn start(dir: &Path) -> Result<Rsyslog> {
        let rsyslogd = program("rsyslogd").context("rsyslogd is not installed (Debian's rsyslog)")?;
        fs::create_dir_all(dir.join("work"))?;
        let tcp = free_tcp_port()?;
        let udp = UdpSocket::bind("127.0.0.1:0").context("binding a loopback UDP port")?.local_addr()?.port();
        let d = dir.display();
        let conf = format!(
            r#"global(workDirectory="{d}/work")
module(load="imtcp")
module(load="imudp")
module(load="imuxsock" SysSock.Use="off")
template(name="raw" type="string" string="%rawmsg%\n")
ruleset(name="tcp") {{ action(type="omfile" file="{d}/tcp.log" template="raw") }}
ruleset(name="udp") {{ action(type="omfile" file="{d}/udp.log" template="raw") }}
ruleset(name="unix") {{ action(type="omfile" file="{d}/unix.log" template="raw") }}
input(type="imtcp" address="127.0.0.1" port="{tcp}" ruleset="tcp")
input(type="imudp" address="127.0.0.1" port="{udp}" ruleset="udp")
input(type="imuxsock" socket="{d}/log.sock" ruleset="unix" ratelimit.interval="0")
"#
        );
        fs::write(dir.join("rsyslog.conf"), conf)?;
        let log = dir.join("rsyslogd.log");
        let child = Command::new(rsyslogd)
            .arg("-n")
            .arg("-f")
            .arg(dir.join("rsyslog.conf"))
            .arg("-i")
            .arg(dir.join("rsyslogd.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log)?)
            .spawn()
            .context("starting rsyslogd")?;
        let server = Server(child);
        wait_until("rsyslogd to listen", Duration::from_secs(30), || {
            TcpStream::connect(("127.0.0.1", tcp)).is_ok() && dir.join("log.sock").exists()
        })
        .with_context(|| fs::read_to_string(&log).unwrap_or_default())?;
        let said = fs::read_to_string(&log).unwrap_or_default();
        if said.contains("error") {
            bail!("rsyslogd: {}", said.trim());
        }
        Ok(Rsyslog { _server: server, dir: dir.to_owned(), tcp, udp })
    }

    fn file(&self, kind: Kind) -> PathBuf {
        self.dir.join(match kind {
            Kind::SyslogTcp => "tcp.log",
            Kind::SyslogUdp => "udp.log",
            _ => "unix.log",
        })
    }
}

/// `nats-server -js` on loopback, its store in `dir`.
struct Nats {
    _server: Server,
    url: String,
}

impl Nats {
    fn start(dir: &Path) -> Result<Nats> {
        let nats_server = program("nats-server").context("nats-server is not installed (Debian's nats-server)")?;
        fs::create_dir_all(dir)?;
        let port = free_tcp_port()?;
        let log_path = dir.join("server.log");
        let log = fs::File::create(&log_path)?;
        let child = Command::new(nats_server)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(dir.join("store"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting nats-server")?;
        let server = Server(child);
        wait_until("nats-server to be ready", Duration::from_secs(30), || {
            fs::read_to_string(&log_path).unwrap_or_default().contains("Server is ready")
        })
        .with_context(|| fs::read_to_string(&log_path).unwrap_or_default())?;
        Ok(Nats { _server: server, url: format!("nats://127.0.0.1:{port}") })
    }
}

/// The receivers started once for the section; a missing one makes its rows n/a.
struct Servers {
    rsyslog: Result<Rsyslog, String>,
    nats: Result<Nats, String>,
}

/// A receiver process of the release xtask (`bench-receive-*`): its stdout's lines are ids.
struct ReceiverProcess {
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    reader: Option<thread::JoinHandle<()>>,
}

impl ReceiverProcess {
    /// Starts it, returns it with its first line (`listening PORT` or `ready`); every later line
    /// arrives as an id.
    fn start(command: &mut Command, arrivals: Shared) -> Result<(ReceiverProcess, String)> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {command:?}"))?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().context("the receiver's stdout")?);
        let mut first = String::new();
        stdout.read_line(&mut first).context("the receiver's first line")?;
        if first.is_empty() {
            let _ = child.kill();
            let status = child.wait()?;
            bail!("the receiver {command:?} ended ({status}) before it was ready");
        }
        let reader = thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                arrive(&arrivals, line);
            }
        });
        Ok((ReceiverProcess { child, stdin, reader: Some(reader) }, first.trim().to_owned()))
    }

    /// Closes its stdin (the NATS receiver then deletes its stream), waits a little, kills it.
    fn stop(mut self) {
        drop(self.stdin.take());
        let _ = wait_or_kill(&mut self.child, Duration::from_secs(5));
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// What one delivery measurement gives.
struct Delivery {
    kind: Kind,
    raised: usize,
    received_unique: usize,
    received_total: u64,
    missing: usize,
    /// Received ids that were not raised (`?`: not an alert).
    foreign: usize,
    /// From `go` to the last new id at the receiver.
    seconds: f64,
    agent_cpu_s: f64,
    lost: u64,
    /// Syslog over UDP: datagrams the kernel dropped at a full receive buffer meanwhile.
    udp_dropped: Option<u64>,
    output_line: String,
}

impl Delivery {
    fn zero_loss(&self) -> bool {
        self.raised > 0 && self.missing == 0 && self.foreign == 0 && self.lost == 0
    }

    fn rate(&self) -> f64 {
        self.received_unique as f64 / self.seconds
    }

    fn json(&self) -> Value {
        json!({
            "raised": self.raised, "received_unique": self.received_unique, "received_total": self.received_total,
            "duplicates": self.received_total.saturating_sub(self.received_unique as u64),
            "missing": self.missing, "foreign": self.foreign, "seconds": nan_null(self.seconds),
            "alerts_per_s": nan_null(self.rate()), "agent_cpu_s": nan_null(self.agent_cpu_s),
            "agent_cpu_us_per_alert": nan_null(self.agent_cpu_s * 1e6 / self.raised as f64),
            "lost_kernel_events": self.lost, "zero_loss": self.zero_loss(), "agent_says": self.output_line,
            "udp_receive_buffer_errors": self.udp_dropped,
        })
    }
}

/// The agent's `output NAME: N delivered, ...` line(s), joined.
fn output_lines(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains(" delivered, ") && line.contains(" left in the spool"))
        .map(|line| line.split_once("output ").map_or(line, |(_, rest)| rest))
        .collect();
    lines.join("; ")
}

/// The number just before `word` in `text` (`3 dropped` → 3).
fn number_before(text: &str, word: &str) -> Option<u64> {
    let index = text.find(word)?;
    text[..index].split(|c: char| !c.is_ascii_digit()).rfind(|s| !s.is_empty())?.parse().ok()
}

/// Makes `n` credential files `DIR/000000`... once; returns DIR.
fn secrets(ctx: &Ctx, n: usize) -> Result<PathBuf> {
    let dir = ctx.home.join(SECRETS);
    fs::create_dir_all(&dir)?;
    for i in 0..n {
        let path = dir.join(format!("{i:06}"));
        if !path.exists() {
            fs::write(&path, "FAKE-credwatch-bench-not-a-gpg-message\n")
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    Ok(dir)
}

fn yaml_string(text: &str) -> String {
    // A JSON string is a YAML double-quoted scalar.
    Value::String(text.to_owned()).to_string()
}

/// (a): `n` alerts to `kind`'s output, counted at its receiver.
fn deliver(ctx: &Ctx, servers: &Servers, kind: Kind, n: usize, tag: &str) -> Result<Delivery> {
    let dir = ctx.work.join(SPOOLS).join(format!("outputs-{tag}"));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let alerts_file = dir.join("alerts.jsonl");
    let arrivals: Shared = Arc::default();
    let mut tail = None;
    let mut receiver = None;
    let mut output: Option<(String, bool)> = None;
    match kind {
        Kind::None => tail = Some(Tail::start(alerts_file.clone(), 0, ecs_id, Arc::clone(&arrivals))),
        Kind::File => {
            let file = dir.join("out.jsonl");
            tail = Some(Tail::start(file.clone(), 0, ecs_id, Arc::clone(&arrivals)));
            output = Some((format!("file:{}", file.display()), false));
        }
        Kind::SyslogUnix | Kind::SyslogUdp | Kind::SyslogTcp => {
            let rsyslog = servers.rsyslog.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
            let file = rsyslog.file(kind);
            let offset = fs::metadata(&file).map_or(0, |m| m.len());
            tail = Some(Tail::start(file, offset, syslog_id, Arc::clone(&arrivals)));
            let to = match kind {
                Kind::SyslogTcp => format!("syslog:tcp:127.0.0.1:{}", rsyslog.tcp),
                Kind::SyslogUdp => format!("syslog:udp:127.0.0.1:{}", rsyslog.udp),
                _ => format!("syslog:unix:{}", rsyslog.dir.join("log.sock").display()),
            };
            output = Some((to, false));
        }
        Kind::Webhook | Kind::WebhookNdjson | Kind::Falcosidekick => {
            let (process, first) = ReceiverProcess::start(
                Command::new(&ctx.xtask_release).arg("bench-receive-http"),
                Arc::clone(&arrivals),
            )?;
            let port = first.strip_prefix("listening ").context("the HTTP receiver's port")?.to_owned();
            receiver = Some(process);
            let scheme = if kind == Kind::Falcosidekick { "falcosidekick" } else { "webhook" };
            output = Some((format!("{scheme}:http://127.0.0.1:{port}/"), kind == Kind::WebhookNdjson));
        }
        Kind::Nats => {
            let nats = servers.nats.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
            let prefix = format!("cwbench.{}", tag.replace(['-', '.'], "_"));
            let stream = format!("CWBENCH_{}", tag.replace(['-', '.'], "_"));
            let (process, _) = ReceiverProcess::start(
                Command::new(&ctx.xtask_release).args([
                    "bench-receive-nats",
                    &nats.url,
                    &stream,
                    &format!("{prefix}.>"),
                ]),
                Arc::clone(&arrivals),
            )?;
            receiver = Some(process);
            output = Some((format!("nats:{}/{prefix}", nats.url), false));
        }
    }
    let mut config = format!("spool_dir: {}\n", yaml_string(&dir.join("spool").to_string_lossy()));
    if let Some((to, ndjson)) = &output {
        config += &format!("outputs:\n  - to: {}\n", yaml_string(to));
        if *ndjson {
            config += "    ndjson: true\n";
        }
    }
    let config_file = dir.join("credwatch.yaml");
    fs::write(&config_file, config)?;

    let udp_before = udp_receive_buffer_errors();
    let measured = drive(ctx, &config_file, &alerts_file, n, &arrivals);
    let udp_dropped =
        (kind == Kind::SyslogUdp).then(|| udp_receive_buffer_errors()?.checked_sub(udp_before?)).flatten();
    if let Some(tail) = tail {
        tail.stop();
    }
    if let Some(receiver) = receiver {
        receiver.stop();
    }
    let (seconds, agent_cpu_s, stderr) = measured?;
    let raised: BTreeSet<String> =
        fs::read_to_string(&alerts_file).unwrap_or_default().lines().filter_map(ecs_id).collect();
    let arrivals = arrivals.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let received: BTreeSet<&String> = arrivals.seen.keys().collect();
    let delivery = Delivery {
        kind,
        raised: raised.len(),
        received_unique: arrivals.seen.len(),
        received_total: arrivals.total,
        missing: raised.iter().filter(|id| !received.contains(id)).count(),
        foreign: received.iter().filter(|id| !raised.contains(id.as_str())).count(),
        seconds,
        agent_cpu_s,
        lost: parse_summary(&stderr).map_or(u64::MAX, |s| s.lost),
        udp_dropped,
        output_line: output_lines(&stderr),
    };
    drop(arrivals);
    let _ = fs::remove_dir_all(&dir);
    Ok(delivery)
}

/// `credwatch run --config CONFIG --alerts ALERTS -- reader SECRETS N hold`: `go`, then waits
/// until the receiver has `n` ids (or gives up); returns the seconds from `go` to the last new
/// id, the agent's CPU seconds over that, and the agent's stderr.
fn drive(ctx: &Ctx, config: &Path, alerts: &Path, n: usize, arrivals: &Shared) -> Result<(f64, f64, String)> {
    let mut child = Command::new(&ctx.credwatch)
        .arg("run")
        .arg("--config")
        .arg(config)
        .arg("--alerts")
        .arg(alerts)
        .arg("--")
        .arg(ctx.bin.join("reader"))
        .arg(ctx.home.join(SECRETS))
        .arg(n.to_string())
        .arg("hold")
        .env("HOME", &ctx.home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting credwatch run -- reader")?;
    let agent = child.id();
    let mut go = child.stdin.take().context("the agent's stdin")?;
    let stdout = Lines::new(child.stdout.take().context("the agent's stdout")?);
    let stderr = Lines::new(child.stderr.take().context("the agent's stderr")?);
    let measured = (|| -> Result<(f64, f64)> {
        stdout.wait_for("ready", Duration::from_secs(60)).context("waiting for the reader under credwatch run")?;
        let before = cpu_seconds(agent);
        let started = Instant::now();
        go.write_all(b"go\n").context("starting the reader")?;
        // A slow output is a figure, not a failure: the wait ends when every id is there, or
        // when none came for a while (a lossy one: syslog over UDP), the CPU taken then.
        let (mut count, mut changed, mut cpu_then) = (0, Instant::now(), before);
        loop {
            let now = unique(arrivals);
            if now != count {
                (count, changed, cpu_then) = (now, Instant::now(), cpu_seconds(agent));
            }
            if count >= n || changed.elapsed() > STALLED || started.elapsed() > DELIVERY_TIMEOUT {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        // Duplicates that come right after the last new id are counted too.
        thread::sleep(Duration::from_millis(200));
        // All there: what the output does after (forgetting delivered alerts) counts too.
        let cpu = if count >= n { settled_cpu_seconds(agent) } else { cpu_then } - before;
        let last = arrivals.lock().ok().and_then(|a| a.last_new).unwrap_or(started);
        Ok((last.duration_since(started).as_secs_f64(), cpu))
    })();
    drop(go);
    let status = wait_or_kill(&mut child, Duration::from_secs(60))?;
    thread::sleep(Duration::from_millis(50));
    let stderr = stderr.text();
    if !(status.success() || status.code() == Some(RUN_ALERTED)) {
        bail!("credwatch run -- reader failed ({status}): {}", stderr.trim());
    }
    let (seconds, cpu) = measured.with_context(|| stderr.trim().to_owned())?;
    Ok((seconds, cpu, stderr))
}

/// How the webhook's receiver is down in (b).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Down {
    /// No outputs at all.
    NoOutputs,
    /// Nothing listens: every connection is refused at once.
    Refused,
    /// A listener that never accepts: connections hang until the webhook's timeouts.
    Stalled,
}

const DOWNS: [Down; 3] = [Down::NoOutputs, Down::Refused, Down::Stalled];

impl Down {
    fn name(self) -> &'static str {
        match self {
            Down::NoOutputs => "no outputs",
            Down::Refused => "webhook down (connection refused)",
            Down::Stalled => "webhook down (listener never answers)",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Down::NoOutputs => "no_outputs",
            Down::Refused => "webhook_refused",
            Down::Stalled => "webhook_stalled",
        }
    }
}

struct Flood {
    opens: u64,
    drive_seconds: f64,
    events: u64,
    lost: u64,
    alerts: u64,
    agent_cpu_s: f64,
    /// From the flood's start until the agent's CPU went quiet (it had handled the flood).
    handled_seconds: f64,
    output_line: String,
}

impl Flood {
    fn json(&self) -> Value {
        json!({
            "opens": self.opens, "drive_seconds": self.drive_seconds, "events": self.events,
            "lost_kernel_events": self.lost, "alerts": self.alerts, "agent_cpu_s": nan_null(self.agent_cpu_s),
            "handled_seconds": self.handled_seconds, "agent_says": self.output_line,
        })
    }
}

/// CPU seconds of `pid` once it has gone quiet (less than 20 ms CPU in 500 ms), for `cap` at
/// most: the agent has taken the flood from its ring buffer through the engine.
fn quiet_cpu_seconds(pid: u32, cap: Duration) -> f64 {
    let started = Instant::now();
    let mut last = cpu_seconds(pid);
    while started.elapsed() < cap {
        thread::sleep(Duration::from_millis(500));
        let now = cpu_seconds(pid);
        if !now.is_finite() || now - last < 0.02 {
            return now;
        }
        last = now;
    }
    last
}

/// (b): `credwatch watch` with `down`'s outputs, and a package tree (a shell named npm running
/// a postinstall-like script) that reads `n` credential files as fast as it can.
fn flood(ctx: &Ctx, down: Down, n: usize, tag: &str) -> Result<Flood> {
    let spool = ctx.work.join(SPOOLS).join(format!("flood-{tag}"));
    let _ = fs::remove_dir_all(&spool);
    // Held for the whole round: it takes connections into its backlog and never answers.
    let mut stalled = None;
    let mut command = Command::new(&ctx.credwatch);
    command.arg("watch").arg("--pin-dir").arg(pin_dir());
    let port = match down {
        Down::NoOutputs => None,
        Down::Refused => Some(free_tcp_port()?),
        Down::Stalled => {
            let listener = TcpListener::bind("127.0.0.1:0").context("binding the stalled listener")?;
            let port = listener.local_addr()?.port();
            stalled = Some(listener);
            Some(port)
        }
    };
    if let Some(port) = port {
        command.arg("--to").arg(format!("webhook:http://127.0.0.1:{port}/")).arg("--spool-dir").arg(&spool);
    }
    unpin(&ctx.credwatch);
    let mut agent = command
        .env("HOME", &ctx.home)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting credwatch watch")?;
    let pid = agent.id();
    let stderr = Lines::new(agent.stderr.take().context("the agent's stderr")?);
    let measured = (|| -> Result<(f64, f64, String)> {
        stderr
            .wait_for("watching package trees", Duration::from_secs(60))
            .context("waiting for `credwatch watch` to attach")?;
        let before = cpu_seconds(pid);
        let started = Instant::now();
        // The exec of a program named npm makes a package tree; its child with npm's lifecycle
        // variables is package code. `; true`: sh would exec the last command in its own process.
        let npm = ctx.work.join(FLOOD_NPM);
        let script = format!("{} {} {n}; true", ctx.bin.join("reader").display(), ctx.home.join(SECRETS).display());
        let output = Command::new(&npm)
            .args(["-c", &script])
            .env("HOME", &ctx.home)
            .env("npm_package_name", "cwbench-flood")
            .env("npm_lifecycle_event", "postinstall")
            .stdin(Stdio::null())
            .output()
            .context("running the flood's package tree")?;
        let cpu = quiet_cpu_seconds(pid, Duration::from_secs(120)) - before;
        Ok((started.elapsed().as_secs_f64(), cpu, String::from_utf8_lossy(&output.stdout).into_owned()))
    })();
    signal(pid, libc::SIGTERM);
    let _ = wait_or_kill(&mut agent, Duration::from_secs(60));
    thread::sleep(Duration::from_millis(50));
    unpin(&ctx.credwatch);
    drop(stalled);
    let _ = fs::remove_dir_all(&spool);
    let stderr = stderr.text();
    let (handled_seconds, agent_cpu_s, stdout) = measured.with_context(|| stderr.trim().to_owned())?;
    let figure = |key: &str| stdout.lines().find_map(|line| line.strip_prefix(key)).and_then(|v| v.trim().parse().ok());
    let summary = parse_summary(&stderr).with_context(|| format!("no summary from the agent: {}", stderr.trim()))?;
    let alerts = stderr
        .lines()
        .rev()
        .find(|line| line.contains(" lost, ") && line.contains(" alerts in "))
        .and_then(|line| number_before(line, " alerts in "))
        .unwrap_or(0);
    Ok(Flood {
        opens: figure("opens ").unwrap_or(0.0) as u64,
        drive_seconds: figure("seconds ").unwrap_or(f64::NAN),
        events: summary.events,
        lost: summary.lost,
        alerts,
        agent_cpu_s,
        handled_seconds,
        output_line: output_lines(&stderr),
    })
}

pub fn run(ctx: &mut Ctx) -> Result<Section> {
    super::build_release_xtask()?;
    let n = if ctx.quick { 2_000 } else { 10_000 };
    let flood_n = if ctx.quick { 20_000 } else { 100_000 };
    let rounds = ctx.rounds(3);
    // The flood's losses vary from round to round (a ring buffer overflowing): more rounds.
    let flood_rounds = ctx.rounds(5);
    say(&format!("bench: outputs: making {flood_n} credential files"));
    let _secrets = Mount::tmpfs(&ctx.home.join(SECRETS))?;
    let _spools = Mount::ext4(&ctx.work.join(SPOOLS), &ctx.work.join("spools.img"), 8 << 30)?;
    secrets(ctx, n.max(flood_n))?;
    let servers_dir = ctx.work.join("servers");
    let servers = Servers {
        rsyslog: Rsyslog::start(&servers_dir.join("rsyslog")).map_err(|e| format!("{e:#}")),
        nats: Nats::start(&servers_dir.join("nats")).map_err(|e| format!("{e:#}")),
    };
    for (name, server) in [("rsyslogd", servers.rsyslog.as_ref().err()), ("nats-server", servers.nats.as_ref().err())] {
        if let Some(error) = server {
            say(&format!("bench: outputs: {name} unavailable: {error}"));
        }
    }

    let mut section = deliveries(ctx, &servers, n, rounds);
    drop(servers);
    let flood_table = floods(ctx, flood_n, flood_rounds)?;
    // A further table's figures go in its section's JSON.
    section.json["flood"] = flood_table.json.clone();
    section.tables.push(flood_table);
    Ok(section)
}

/// (a): every output, the order rotating round by round; the table, and the zero-loss target.
fn deliveries(ctx: &mut Ctx, servers: &Servers, n: usize, rounds: usize) -> Section {
    // (a) Every output, the order rotating round by round.
    let mut deliveries: BTreeMap<&str, Vec<Delivery>> = BTreeMap::new();
    let mut errors: BTreeMap<&str, String> = BTreeMap::new();
    for round in 0..rounds {
        for i in 0..KINDS.len() {
            let kind = KINDS[(i + round) % KINDS.len()];
            say(&format!("bench: outputs: {} (round {}/{rounds})", kind.name(), round + 1));
            match deliver(ctx, servers, kind, n, &format!("{}-{round}", kind.key())) {
                Ok(delivery) => deliveries.entry(kind.key()).or_default().push(delivery),
                Err(error) => {
                    say(&format!("bench: outputs: {}: {error:#}", kind.name()));
                    errors.insert(kind.key(), format!("{error:#}").replace('\n', " "));
                }
            }
        }
    }
    let cpu_us = |d: &Delivery| d.agent_cpu_s * 1e6 / d.raised.max(1) as f64;
    let none_us = deliveries.get("none").map_or(f64::NAN, |ds| median(&ds.iter().map(cpu_us).collect::<Vec<_>>()));
    let mut section = Section::new(
        "outputs",
        &format!(
            "6. Outputs: {n} alerts delivered to real receivers on loopback (`credwatch run` of a package reading {n} credential files; median of {rounds} round(s))"
        ),
        &[
            "output",
            "receiver",
            "alerts/s (go → last at receiver)",
            "received / raised",
            "duplicates",
            "zero loss",
            "agent CPU µs/alert",
            "outputs' µs/alert (− none)",
        ],
    );
    let mut delivery_json = serde_json::Map::new();
    // Outputs that lost alerts; syslog over UDP is told apart: it has no flow control.
    let mut lossy = Vec::new();
    let mut every_output_measured = true;
    for kind in KINDS {
        let Some(ds) = deliveries.get(kind.key()) else {
            every_output_measured = false;
            let error = errors.get(kind.key()).cloned().unwrap_or_default();
            section.rows.push(vec![
                kind.name().into(),
                kind.receiver().into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
                "n/a".into(),
            ]);
            section.notes.push(format!("{}: n/a: {error}", kind.name()));
            delivery_json.insert(kind.key().into(), json!({ "error": error }));
            continue;
        };
        let rate = median(&ds.iter().map(Delivery::rate).collect::<Vec<_>>());
        let us = median(&ds.iter().map(cpu_us).collect::<Vec<_>>());
        let zero_loss = ds.iter().all(Delivery::zero_loss);
        if !zero_loss {
            lossy.push(kind);
        }
        let worst = ds.iter().min_by_key(|d| d.received_unique).expect("at least one round");
        let duplicates: u64 = ds.iter().map(|d| d.received_total.saturating_sub(d.received_unique as u64)).sum();
        section.rows.push(vec![
            kind.name().into(),
            kind.receiver().into(),
            fmt(rate, 0),
            format!("{} / {}", worst.received_unique, worst.raised),
            duplicates.to_string(),
            if zero_loss { "yes".into() } else { "**no**".into() },
            fmt(us, 1),
            if kind == Kind::None { "—".into() } else { fmt(us - none_us, 1) },
        ]);
        for d in ds.iter().filter(|d| !d.zero_loss()) {
            section.notes.push(format!(
                "{}: {} of {} raised alerts missing at the receiver, {} foreign ids, {} kernel events lost{}; the agent said: {}",
                d.kind.name(),
                d.missing,
                d.raised,
                d.foreign,
                d.lost,
                d.udp_dropped.map_or(String::new(), |dropped| format!(
                    "; the kernel dropped {dropped} UDP datagrams at a full receive buffer meanwhile (no flow control in syslog over UDP)"
                )),
                if d.output_line.is_empty() { "nothing" } else { &d.output_line }
            ));
        }
        delivery_json.insert(
            kind.key().into(),
            json!({
                "receiver": kind.receiver(), "alerts_per_s": nan_null(rate), "agent_cpu_us_per_alert": nan_null(us),
                "outputs_cpu_us_per_alert": nan_null(if kind == Kind::None { f64::NAN } else { us - none_us }),
                "zero_loss": zero_loss, "rounds": ds.iter().map(Delivery::json).collect::<Vec<_>>(),
            }),
        );
    }
    section.notes.push(format!(
        "Alerts/s: {n} alerts counted at the receiver (every raised `event.id` present; duplicates are at-least-once retries), over the time from the package's first read to the last new id there; the alerts are raised in a burst (row `none`: how fast the agent raises them), so this is each output's delivery rate with its queue and spool in the way. Agent CPU: user+system of the agent (sensor, engine, every thread of the outputs) over the same time, per alert; `− none` is what the output added."
    ));
    section.notes.push("Spools (and the file output) are on a journaled ext4 in an image file of the bench's, not on this machine's root file system: that one is ext4 without a journal, mounted with `discard`, where a file created after many were deleted costs ~1 ms of CPU (ext4 looks for an inode not recently deleted: seen with perf) and each unlink waits for a discard; a spool of one file per alert delivers ~700/s there.".into());

    section.json = json!({ "alerts": n, "rounds": rounds, "delivery": delivery_json });
    let lost_by = |udp: bool| -> Vec<&str> {
        lossy.iter().filter(|kind| (**kind == Kind::SyslogUdp) == udp).map(|kind| kind.name()).collect()
    };
    let (reliable_lossy, udp_lossy) = (lost_by(false), lost_by(true));
    ctx.target(
        "alerts delivered at zero loss to every output but syslog over UDP",
        format!(
            "{}; syslog udp: {}",
            if reliable_lossy.is_empty() {
                "no loss".to_owned()
            } else {
                format!("lost by {}", reliable_lossy.join(", "))
            },
            if udp_lossy.is_empty() { "no loss" } else { "lossy (no flow control)" }
        ),
        "every raised id at the receiver",
        every_output_measured.then_some(reliable_lossy.is_empty()),
    );
    section
}

/// (b): the flood with the webhook down, against no outputs; the table, and its target.
fn floods(ctx: &mut Ctx, flood_n: usize, flood_rounds: usize) -> Result<Section> {
    // (b) The flood with the webhook down, against no outputs.
    let npm = ctx.work.join(FLOOD_NPM);
    fs::create_dir_all(npm.parent().expect("FLOOD_NPM is in a folder"))?;
    let _ = fs::remove_file(&npm);
    symlink("/bin/sh", &npm).context("linking sh as `npm`")?;
    let mut floods: BTreeMap<&str, Vec<Flood>> = BTreeMap::new();
    let mut flood_errors: BTreeMap<&str, String> = BTreeMap::new();
    for round in 0..flood_rounds {
        for i in 0..DOWNS.len() {
            let down = DOWNS[(i + round) % DOWNS.len()];
            say(&format!("bench: outputs: flood of {flood_n}, {} (round {}/{flood_rounds})", down.name(), round + 1));
            match flood(ctx, down, flood_n, &format!("{}-{round}", down.key())) {
                Ok(flood) => floods.entry(down.key()).or_default().push(flood),
                Err(error) => {
                    say(&format!("bench: outputs: flood, {}: {error:#}", down.name()));
                    flood_errors.insert(down.key(), format!("{error:#}").replace('\n', " "));
                }
            }
        }
    }
    let mut flood_table = Section::new(
        "outputs",
        &format!(
            "6b. A flood of {flood_n} alerts from live package code under `credwatch watch`, the webhook's receiver down vs no outputs (median of {flood_rounds} round(s))"
        ),
        &[
            "outputs",
            "alerts raised",
            "kernel events received",
            "lost kernel events (min–max)",
            "agent CPU s",
            "agent CPU µs/alert",
            "reads/s made",
            "handled in s",
        ],
    );
    let mut flood_json = serde_json::Map::new();
    let mut lost = BTreeMap::new();
    for down in DOWNS {
        let fs_ = floods.get(down.key()).map_or(&[][..], Vec::as_slice);
        if let Some(error) = flood_errors.get(down.key()) {
            flood_table.notes.push(format!("{}: a round failed: {error}", down.name()));
        }
        let m = |f: &dyn Fn(&Flood) -> f64| median(&fs_.iter().map(f).collect::<Vec<_>>());
        let lost_median = m(&|f| f.lost as f64);
        lost.insert(down.key(), lost_median);
        let alerts = m(&|f| f.alerts as f64);
        flood_table.rows.push(vec![
            down.name().into(),
            fmt(alerts, 0),
            fmt(m(&|f| f.events as f64), 0),
            format!(
                "{} ({}–{})",
                fmt(lost_median, 0),
                fs_.iter().map(|f| f.lost).min().map_or("n/a".into(), |v| v.to_string()),
                fs_.iter().map(|f| f.lost).max().map_or("n/a".into(), |v| v.to_string())
            ),
            fmt(m(&|f| f.agent_cpu_s), 2),
            fmt(m(&|f| f.agent_cpu_s * 1e6 / f.alerts.max(1) as f64), 1),
            fmt(m(&|f| f.opens as f64 / f.drive_seconds), 0),
            fmt(m(&|f| f.handled_seconds), 1),
        ]);
        if down != Down::NoOutputs {
            if let Some(said) = fs_.iter().map(|f| f.output_line.as_str()).find(|l| !l.is_empty()) {
                flood_table.notes.push(format!("{}: the agent said at its stop: {said}", down.name()));
            }
        }
        flood_json.insert(
            down.key().into(),
            json!({ "lost_median": nan_null(lost_median), "rounds": fs_.iter().map(Flood::json).collect::<Vec<_>>() }),
        );
    }
    flood_table.notes.push(format!(
        "The package tree is `npm -c 'reader DIR {flood_n}'` with npm's postinstall variables (sh named npm; `reader` opens {flood_n} distinct `~/.password-store` files as fast as it goes, one alert each). Lost kernel events: the agent's closing summary (ring buffers' drops counted by the kernel). The webhook's spool is on the bench's ext4, as above. Handled in: from the flood's start until the agent's CPU went quiet; then SIGTERM (the webhook gets its 3 s, the rest stays spooled). `watch` takes every package tree of the machine: builds and installs that other users run meanwhile add their events (and losses) to a round's; the three floods of a round run back to back, so compare them round by round too (the target says in how many rounds the webhook down lost more)."
    ));
    flood_table.json = json!({ "alerts": flood_n, "rounds": flood_rounds, "configs": flood_json });
    let none = lost["no_outputs"];
    let down = lost["webhook_refused"].max(lost["webhook_stalled"]);
    // The three floods of a round ran back to back: how often the webhook down lost more.
    let lost_of = |key: &str| floods.get(key).map_or(Vec::new(), |fs| fs.iter().map(|f| f.lost).collect::<Vec<_>>());
    let (no_outputs, refused, stalled) =
        (lost_of("no_outputs"), lost_of("webhook_refused"), lost_of("webhook_stalled"));
    let paired = no_outputs.len() == refused.len() && no_outputs.len() == stalled.len();
    let more = no_outputs.iter().zip(refused.iter().zip(&stalled)).filter(|(n, (r, s))| r.max(s) > n).count();
    let rounds_told =
        if paired { format!("; down lost more in {more} of {} rounds", no_outputs.len()) } else { String::new() };
    ctx.target(
        "lost kernel events with webhook down ≤ with no outputs",
        format!(
            "medians: refused {}, stalled {}; no outputs {} (flood of {flood_n} alerts{rounds_told})",
            fmt(lost["webhook_refused"], 0),
            fmt(lost["webhook_stalled"], 0),
            fmt(none, 0)
        ),
        "≤ no outputs",
        (none.is_finite() && down.is_finite()).then_some(down <= none),
    );
    Ok(flood_table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ids_from_ecs_and_syslog_lines() {
        assert_eq!(ecs_id(r#"{"event":{"id":"abc","kind":"alert"},"rule":{}}"#).as_deref(), Some("abc"));
        assert_eq!(ecs_id("not json"), None);
        let message =
            r#"<84>1 2026-12-01T18:00:00Z box credwatch 42 pass-store [credwatch@32473 id="5f0c" rule="x"] msg"#;
        assert_eq!(syslog_id(message).as_deref(), Some("5f0c"));
        assert_eq!(syslog_id("<84>1 - - - - - - no data"), None);
    }

    #[test]
    fn reads_the_agents_output_line() {
        let stderr = "2026 INFO output webhook:http://127.0.0.1:1/: 0 delivered, 5 failed attempts, 0 refused, 3 dropped, 99 left in the spool\n\
                      2026 INFO credwatch: 915 events, 3 lost, 102 alerts in 2.2s\n";
        let line = output_lines(stderr);
        assert!(line.starts_with("webhook:http://127.0.0.1:1/: 0 delivered"), "{line}");
        assert_eq!(number_before(&line, " dropped"), Some(3));
        assert_eq!(number_before(stderr, " alerts in "), Some(102));
    }

    #[test]
    fn zero_loss_needs_every_raised_id_and_nothing_else() {
        let delivery = |missing, foreign, lost| Delivery {
            kind: Kind::File,
            raised: 10,
            received_unique: 10 - missing,
            received_total: 12,
            missing,
            foreign,
            seconds: 1.0,
            agent_cpu_s: 0.1,
            lost,
            udp_dropped: None,
            output_line: String::new(),
        };
        assert!(delivery(0, 0, 0).zero_loss());
        assert!(!delivery(1, 0, 0).zero_loss());
        assert!(!delivery(0, 1, 0).zero_loss());
        assert!(!delivery(0, 0, 1).zero_loss());
    }
}
