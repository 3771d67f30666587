//! `credwatch selftest`: safe reproductions of real npm attacks (Nx "s1ngularity", Shai-Hulud 2.0)
//! run as package code of the real npm, in a throwaway home of fake credentials, their network
//! steps to a loopback stub; then a check that the running agent (or, when none runs, credwatch's
//! own sensor under `credwatch run`) raised each alert the attack must raise. The agent marks the
//! tree's alerts as a self-test (`credwatch.selftest`), and sends them to its outputs as usual: a
//! fleet's canary after a rollout.

mod attacks;
mod stub;

use std::{
    ffi::OsString,
    fs,
    io::{self, Read as _, Write as _},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode, ExitStatus, Stdio},
    sync::{mpsc, Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use attacks::{Attack, Expected, Lab, Target, PROJECT};
use credwatch_core::{alert::Alert, output::escape};
use serde::Serialize;

use crate::local::client::{register_selftest, AlertStream, ClientError, Message};

/// `--attack`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Which {
    /// Nx "s1ngularity" (Aug 2025): the postinstall telemetry.js.
    Nx,
    /// Shai-Hulud 2.0 (Nov 2025): the preinstall setup_bun.js and its bun_environment.js.
    #[value(name = "shai-hulud-2")]
    ShaiHulud2,
    /// Every attack, one after the other.
    All,
}

pub struct Options {
    pub which: Which,
    /// Only the running agent: fail when none answers (a fleet's canary).
    pub agent_only: bool,
    pub socket: PathBuf,
    pub json: bool,
}

/// An expected alert did not come.
pub const EXIT_MISSING: u8 = 3;
/// The agent did not answer, or did not report the self-test in time (stopped, hung, absent
/// under `--agent`).
pub const EXIT_NO_ANSWER: u8 = 4;

/// How long the agent has to answer the connection and the registration.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// How long the agent has to report the tree's alerts once npm has exited.
const ALERTS_WITHIN: Duration = Duration::from_secs(20);
/// npm installs one local package in about 2 s; past this it is killed.
const INSTALL_WITHIN: Duration = Duration::from_secs(120);

pub fn selftest(options: &Options) -> Result<ExitCode> {
    let npm = on_path("npm").context(
        "npm is not on PATH: the self-test installs its packages with the real npm (Debian: apt-get install npm)",
    )?;
    let attacks: Vec<&Attack> = match options.which {
        Which::Nx => vec![&attacks::NX],
        Which::ShaiHulud2 => vec![&attacks::SHAI_HULUD_2],
        Which::All => attacks::ALL.to_vec(),
    };
    let socket = escape(&options.socket.display().to_string()).into_owned();
    let mut sensor = match AlertStream::connect(&options.socket, None, true) {
        Ok(mut stream) => match caught_up(&mut stream, &options.socket) {
            Ok(()) => Sensor::Agent(Follower::start(stream)),
            Err(ClientError::Timeout { .. }) => {
                return no_answer(
                    options,
                    &format!(
                        "the agent at {socket} did not report the self-test within {} s: is it stopped?",
                        ANSWER_WITHIN.as_secs()
                    ),
                );
            }
            Err(error) => return Err(error).context("connecting to the agent"),
        },
        Err(ClientError::NoAgent { .. }) if options.agent_only => {
            return no_answer(options, &format!("no agent answers at {socket} (--agent needs the running agent)"));
        }
        Err(ClientError::NoAgent { .. }) => {
            // SAFETY: geteuid cannot fail.
            anyhow::ensure!(
                unsafe { libc::geteuid() } == 0,
                "no agent answers at {socket}, and the self-test's own sensor (`credwatch run`) needs root: run it as \
                 root, or start `credwatch watch`"
            );
            Sensor::Own(std::env::current_exe().context("finding credwatch's own executable")?)
        }
        Err(error) => return Err(error).context("connecting to the agent"),
    };
    let mut report = Report {
        passed: true,
        sensor: match &sensor {
            Sensor::Agent(_) => "agent",
            Sensor::Own(_) => "own",
        },
        socket: options.socket.display().to_string(),
        npm: npm.display().to_string(),
        attacks: Vec::new(),
        no_answer: None,
    };
    if !options.json {
        match &sensor {
            Sensor::Agent(_) => println!("credwatch selftest: checked by the running agent at {socket}"),
            Sensor::Own(_) => {
                println!("credwatch selftest: no agent at {socket}; checked by its own sensor (`credwatch run`)")
            }
        }
    }
    for attack in attacks {
        let outcome = match run_attack(attack, &npm, &mut sensor, &options.socket) {
            Ok(outcome) => outcome,
            Err(Failure::NoAnswer(why)) => {
                report.passed = false;
                report.no_answer = Some(why.clone());
                return finish(options, &report, why.as_str());
            }
            Err(Failure::Error(error)) => return Err(error).with_context(|| format!("the {} attack", attack.name)),
        };
        report.passed &= outcome.passed();
        if !options.json {
            print!("{}", outcome.text());
        }
        report.attacks.push(outcome);
    }
    finish(options, &report, "")
}

/// Prints the report (and `why` the agent did not answer), and the exit status it calls for.
fn finish(options: &Options, report: &Report, why: &str) -> Result<ExitCode> {
    if options.json {
        println!("{}", serde_json::to_string(report).context("serialising the report")?);
    }
    if report.no_answer.is_some() {
        tracing::error!("{why}");
        return Ok(ExitCode::from(EXIT_NO_ANSWER));
    }
    let missing: usize = report.attacks.iter().map(|outcome| outcome.missing()).sum();
    if !options.json {
        if missing == 0 {
            let names: Vec<&str> = report.attacks.iter().map(|outcome| outcome.attack).collect();
            println!("passed: every expected alert was raised ({})", names.join(", "));
        } else {
            println!("FAILED: {missing} expected alerts missing");
        }
    }
    Ok(if missing == 0 { ExitCode::SUCCESS } else { ExitCode::from(EXIT_MISSING) })
}

fn no_answer(options: &Options, why: &str) -> Result<ExitCode> {
    let report = Report {
        passed: false,
        sensor: "agent",
        socket: options.socket.display().to_string(),
        npm: String::new(),
        attacks: Vec::new(),
        no_answer: Some(why.to_owned()),
    };
    finish(options, &report, why)
}

/// Waits for the agent's `caught_up`: it answers, and the stream is live from here on.
fn caught_up(stream: &mut AlertStream, socket: &Path) -> Result<(), ClientError> {
    let deadline = Instant::now() + ANSWER_WITHIN;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match stream.next(Some(left))? {
            Some(Message::CaughtUp { .. }) => return Ok(()),
            Some(Message::Alert { .. }) => {}
            None => {
                return Err(ClientError::Protocol {
                    socket: socket.to_owned(),
                    why: "the agent closed the connection before it caught up".into(),
                })
            }
        }
    }
}

/// Who reports the alerts.
enum Sensor {
    /// The running agent, followed from before the attack.
    Agent(Follower),
    /// `credwatch run` (this executable) around npm.
    Own(PathBuf),
}

/// The agent's alert stream, drained by a thread of its own: the agent drops a client that
/// falls 1,024 alerts behind, and a busy machine raises that many in a second while the
/// self-test writes a lab or waits for npm. It passes on the alerts of the trees of interest.
struct Follower {
    received: mpsc::Receiver<Result<Option<(u64, Alert)>, ClientError>>,
    /// npm's pids: alerts of their trees, or under them in another tree, are passed on.
    roots: Arc<Mutex<Vec<u32>>>,
}

impl Follower {
    fn start(mut stream: AlertStream) -> Follower {
        let (send, received) = mpsc::channel();
        let roots: Arc<Mutex<Vec<u32>>> = Arc::default();
        let watched = Arc::clone(&roots);
        thread::spawn(move || loop {
            let next = match stream.next(None) {
                Ok(Some(Message::Alert { seq, alert })) => {
                    let roots = watched.lock().unwrap_or_else(|e| e.into_inner());
                    let ours = roots.iter().any(|root| {
                        alert.credwatch.root_pid == *root
                            || alert.process.pid == *root
                            || alert.process.ancestors.iter().any(|a| a.pid == *root)
                    });
                    if !ours {
                        continue;
                    }
                    Ok(Some((seq, *alert)))
                }
                Ok(Some(Message::CaughtUp { .. })) => continue,
                Ok(None) => Ok(None),
                Err(error) => Err(error),
            };
            let last = !matches!(next, Ok(Some(_)));
            if send.send(next).is_err() || last {
                break;
            }
        });
        Follower { received, roots }
    }
}

enum Failure {
    /// The agent did not answer or report in time (why).
    NoAnswer(String),
    Error(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Failure {
        Failure::Error(error)
    }
}

#[derive(Serialize)]
struct Report {
    passed: bool,
    /// `agent` or `own`.
    sensor: &'static str,
    socket: String,
    npm: String,
    attacks: Vec<Outcome>,
    #[serde(skip_serializing_if = "Option::is_none")]
    no_answer: Option<String>,
}

#[derive(Serialize)]
struct Outcome {
    attack: &'static str,
    title: &'static str,
    /// npm's pid: the tree's root.
    root_pid: u32,
    /// How npm failed (its status, or killed), and the end of its output; under `--enforce` the
    /// agent may well have killed part of the tree.
    #[serde(skip_serializing_if = "Option::is_none")]
    npm_failed: Option<String>,
    checks: Vec<Check>,
    /// The tree's alerts of rules the attack does not expect (what changed in the rules).
    unexpected: Vec<Unexpected>,
    /// What reached the loopback stub.
    stub: Vec<stub::Request>,
}

#[derive(Serialize)]
struct Check {
    /// The rule of the alert found, else the one expected first.
    rule: &'static str,
    /// The file (`~` is the throwaway home) or the command.
    what: String,
    found: Option<Found>,
}

#[derive(Serialize)]
struct Unexpected {
    rule: String,
    severity: &'static str,
    /// The file, or the command.
    what: String,
}

#[derive(Serialize)]
struct Found {
    severity: &'static str,
    outcome: String,
    event_id: String,
    /// In the agent's local log.
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
    /// Marked `credwatch.selftest`.
    selftest: bool,
}

impl Outcome {
    fn missing(&self) -> usize {
        self.checks.iter().filter(|check| check.found.is_none()).count()
    }

    fn passed(&self) -> bool {
        self.missing() == 0
    }

    fn text(&self) -> String {
        let mut text = format!("\n{}: {}\n", self.attack, self.title);
        text += &format!(
            "  npm install (pid {}) as package code, in a throwaway home of fake credentials, network to a loopback stub\n",
            self.root_pid
        );
        for check in &self.checks {
            let what = escape(&check.what);
            text += &match &check.found {
                Some(found) if found.outcome == "alerted" => {
                    format!("  found    {:<9} {:<26} {what}\n", found.severity, check.rule)
                }
                Some(found) => {
                    let outcome = escape(&found.outcome);
                    format!("  found    {:<9} {:<26} {what} ({outcome})\n", found.severity, check.rule)
                }
                None => format!("  MISSING  {:<9} {:<26} {what}\n", "", check.rule),
            };
        }
        for request in &self.stub {
            let size = if request.bytes > 0 { format!(" ({} B)", request.bytes) } else { String::new() };
            text += &format!("  stub     {} {}{size}\n", escape(&request.method), escape(&request.path));
        }
        for also in &self.unexpected {
            text += &format!("  also     {:<9} {:<26} {}\n", also.severity, escape(&also.rule), escape(&also.what));
        }
        if let Some(failed) = &self.npm_failed {
            for line in failed.lines() {
                text += &format!("  {}\n", escape(line));
            }
        }
        let found = self.checks.len() - self.missing();
        let marked = self.checks.iter().filter_map(|check| check.found.as_ref()).filter(|found| found.selftest).count();
        // The agent's log has them: `show` gives the tree (and `--html` its incident page).
        let show = self
            .checks
            .iter()
            .filter_map(|check| check.found.as_ref()?.seq)
            .min()
            .map(|seq| format!("; `credwatch show {seq}` shows the tree"))
            .unwrap_or_default();
        text += &format!(
            "  {}: {found} of {} expected alerts, {marked} marked as a self-test{show}\n",
            self.attack,
            self.checks.len()
        );
        text
    }
}

/// Writes the lab, runs npm in it under `sensor`, and checks the alerts of its tree.
fn run_attack(attack: &Attack, npm: &Path, sensor: &mut Sensor, socket: &Path) -> Result<Outcome, Failure> {
    let stub = stub::Stub::start()?;
    let temp = tempfile::Builder::new().prefix("credwatch-selftest-").tempdir().context("creating the lab")?;
    // The kernel reports resolved paths.
    let dir = fs::canonicalize(temp.path()).with_context(|| format!("{}", temp.path().display()))?;
    let lab = Lab::write(&dir, attack, &stub.url())?;
    let npm_args = ["install", "--offline", "--no-audit", "--no-fund"];
    let log = lab.path("npm.log");
    let (root_pid, status, alerts) = match sensor {
        Sensor::Agent(follower) => {
            let mut command = Command::new(npm);
            command.args(npm_args);
            lab_env(&mut command, &lab, &stub);
            let output = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
            command.stdout(output.try_clone().context("npm's output")?).stderr(output);
            let held = Held::spawn(command).context("starting npm")?;
            let pid = held.pid;
            follower.roots.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
            match register_selftest(socket, pid) {
                Ok(()) => {}
                Err(ClientError::Timeout { .. }) => {
                    held.kill();
                    return Err(Failure::NoAnswer(format!(
                        "the agent at {} did not report the self-test within {} s: is it stopped?",
                        escape(&socket.display().to_string()),
                        ANSWER_WITHIN.as_secs()
                    )));
                }
                Err(error) => {
                    held.kill();
                    return Err(anyhow::Error::from(error).context("registering the self-test with the agent").into());
                }
            }
            let mut child = held.release().context("starting npm")?;
            let (status, alerts) = follow(follower, &mut child, pid, attack, &dir, socket)?;
            (pid, status, alerts)
        }
        Sensor::Own(exe) => {
            let out = lab.path("run.stdout");
            let mut command = Command::new(exe);
            command.args(["run", "--json", "--selftest", "--"]).arg(npm).args(npm_args);
            lab_env(&mut command, &lab, &stub);
            // The run's own settings (`CREDWATCH_SENSOR`, outputs, ...) hold for it too.
            command.envs(std::env::vars_os().filter(|(name, _)| name.to_string_lossy().starts_with("CREDWATCH_")));
            command
                .stdout(fs::File::create(&out).with_context(|| format!("creating {}", out.display()))?)
                .stderr(fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?)
                .process_group(0);
            let mut child = command.spawn().context("starting `credwatch run`")?;
            let status = wait_bounded(&mut child, INSTALL_WITHIN + ALERTS_WITHIN)?;
            // 10: alerts fired.
            if !matches!(status.and_then(|status| status.code()), Some(0 | 10)) {
                let said = tail(&fs::read_to_string(&log).unwrap_or_default());
                return Err(anyhow::anyhow!("`credwatch run` failed ({status:?}):\n{}", escape(&said)).into());
            }
            let alerts: Seen = fs::read_to_string(&out)
                .with_context(|| format!("reading {}", out.display()))?
                .lines()
                .filter_map(|line| serde_json::from_str::<Alert>(line).ok())
                .map(|alert| (None, alert))
                .collect();
            let root = alerts.first().map_or(0, |(_, alert)| alert.credwatch.root_pid);
            // npm's own status does not come through `run` once an alert fired.
            (root, Ok(()), alerts)
        }
    };
    let checks = attack
        .expected
        .iter()
        .map(|expected| {
            let found = best(expected, &alerts, &dir);
            Check {
                rule: found.map_or(expected.rules[0], |(_, alert)| {
                    expected.rules.iter().copied().find(|rule| *rule == alert.rule.id).unwrap_or(expected.rules[0])
                }),
                what: shown(expected),
                found: found.map(|(seq, alert)| Found {
                    severity: alert.rule.severity.as_str(),
                    outcome: alert.event.outcome.clone(),
                    event_id: alert.event.id.clone(),
                    seq: *seq,
                    selftest: alert.credwatch.selftest,
                }),
            }
        })
        .collect();
    let expected_rules: Vec<&str> =
        attack.expected.iter().flat_map(|expected| expected.rules.iter().copied()).collect();
    let unexpected = alerts
        .iter()
        .filter(|(_, alert)| !expected_rules.contains(&alert.rule.id.as_str()))
        .map(|(_, alert)| Unexpected {
            rule: alert.rule.id.clone(),
            severity: alert.rule.severity.as_str(),
            what: alert.file.as_ref().map_or_else(|| alert.process.args.join(" "), |file| file.path.clone()),
        })
        .collect();
    let npm_failed = status.err().map(|how| {
        let output = tail(&fs::read_to_string(&log).unwrap_or_default());
        format!("npm {how}; the end of its output:\n{output}")
    });
    Ok(Outcome {
        attack: attack.name,
        title: attack.title,
        root_pid,
        npm_failed,
        checks,
        unexpected,
        stub: stub.requests(),
    })
}

/// The tree's alerts, each with its seq in the agent's local log (none from `credwatch run`).
type Seen = Vec<(Option<u64>, Alert)>;

/// Reads the agent's alerts of the tree at `root` while npm runs, then until every expected one
/// came or [`ALERTS_WITHIN`] passed. Returns how npm ended and the alerts.
fn follow(
    follower: &Follower,
    child: &mut Child,
    root: u32,
    attack: &Attack,
    lab: &Path,
    socket: &Path,
) -> Result<(Result<(), String>, Seen), Failure> {
    let started = Instant::now();
    let mut alerts = Vec::new();
    let mut status: Option<Option<ExitStatus>> = None;
    let mut exited_at = Instant::now();
    // The root of a tree npm turned out to be part of (credwatch selftest run by a package script).
    let mut outer = None;
    loop {
        if status.is_none() {
            if let Some(exited) = child.try_wait().context("waiting for npm")? {
                status = Some(Some(exited));
                exited_at = Instant::now();
            } else if started.elapsed() > INSTALL_WITHIN {
                kill_group(child.id());
                let _ = child.wait();
                status = Some(None);
                exited_at = Instant::now();
            }
        }
        if status.is_some() {
            let all = attack.expected.iter().all(|expected| best(expected, &alerts, lab).is_some());
            if all || exited_at.elapsed() >= ALERTS_WITHIN {
                break;
            }
        }
        match follower.received.recv_timeout(Duration::from_millis(100)) {
            Ok(Ok(Some((seq, alert)))) if alert.credwatch.root_pid == root => alerts.push((Some(seq), alert)),
            // Under npm in another tree.
            Ok(Ok(Some((_, alert)))) => {
                outer.get_or_insert(alert.credwatch.root_pid);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Ok(Ok(None)) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(anyhow::anyhow!(
                    "the agent at {} closed the connection during the self-test (it drops a client that falls 1,024 \
                     alerts behind)",
                    escape(&socket.display().to_string())
                )
                .into())
            }
            Ok(Err(error)) => return Err(anyhow::Error::from(error).context("reading the agent's alerts").into()),
        }
    }
    if let (true, Some(outer)) = (alerts.is_empty(), outer) {
        return Err(anyhow::anyhow!(
            "npm (pid {root}) ran inside a tree the agent already watches (root pid {outer}): its alerts are that \
             tree's, not a self-test's; run `credwatch selftest` from a shell, a service or a CI step, not under a \
             package manager"
        )
        .into());
    }
    if alerts.is_empty() {
        return Err(Failure::NoAnswer(format!(
            "the agent at {} did not report the self-test within {} s: is it stopped?",
            escape(&socket.display().to_string()),
            ALERTS_WITHIN.as_secs()
        )));
    }
    let status = match status.flatten() {
        Some(status) if status.success() => Ok(()),
        Some(status) => Err(format!("failed ({status})")),
        None => Err(format!("was killed after {}s", INSTALL_WITHIN.as_secs())),
    };
    Ok((status, alerts))
}

/// The alert that meets `expected`, the most severe when several do.
fn best<'a>(expected: &Expected, alerts: &'a [(Option<u64>, Alert)], lab: &Path) -> Option<&'a (Option<u64>, Alert)> {
    alerts.iter().filter(|(_, alert)| meets(expected, alert, lab)).max_by_key(|(_, alert)| alert.rule.severity)
}

fn meets(expected: &Expected, alert: &Alert, lab: &Path) -> bool {
    if !expected.rules.contains(&alert.rule.id.as_str()) {
        return false;
    }
    match expected.what {
        Target::File(relative) => {
            let path = lab.join(relative);
            let path = path.to_string_lossy();
            alert.file.as_ref().is_some_and(|file| file.path == path)
                || alert.credwatch.sweep.as_ref().is_some_and(|sweep| sweep.files.iter().any(|file| *file == path))
        }
        Target::Command(needle) => alert.process.args.join(" ").contains(needle),
    }
}

/// The file as the user would write it (`~` for the throwaway home), or the command.
fn shown(expected: &Expected) -> String {
    match expected.what {
        Target::File(relative) => match relative.strip_prefix("home/") {
            Some(in_home) => format!("~/{in_home}"),
            None => relative.to_owned(),
        },
        Target::Command(needle) => needle.to_owned(),
    }
}

/// npm's environment: nothing of the caller's but PATH, so that no real token or home leaks in;
/// the throwaway home, npm's cache and configuration in the lab, the stub as the only registry,
/// and the fake secrets Shai-Hulud 2.0 harvested from the environment.
fn lab_env(command: &mut Command, lab: &Lab, stub: &stub::Stub) {
    let home = lab.path("home");
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin")))
        .env("HOME", &home)
        .env("USER", "credwatch-selftest")
        .env("LANG", "C.UTF-8")
        .env("TMPDIR", lab.path("tmp"))
        .env("npm_config_userconfig", home.join(".npmrc"))
        .env("npm_config_globalconfig", lab.path("npmrc-global"))
        .env("npm_config_cache", lab.path("npm-cache"))
        .env("npm_config_registry", stub.url())
        .env("npm_config_update_notifier", "false")
        // Installed as a copy, as from a registry's tarball, not as a link to the package.
        .env("npm_config_install_links", "true")
        .env("SELFTEST_STUB", stub.url())
        .env("SELFTEST_TOOLS", lab.path("tools"))
        .envs(attacks::FAKE_ENV.iter().copied())
        .current_dir(lab.path(PROJECT));
}

/// npm started and held before its exec until [`Held::release`]: its pid is the tree's root, and
/// the agent knows it as a self-test before npm runs.
struct Held {
    pid: u32,
    release: io::PipeWriter,
    spawning: thread::JoinHandle<io::Result<Child>>,
}

impl Held {
    fn spawn(mut command: Command) -> Result<Held> {
        let (release_reader, release) = io::pipe().context("creating a pipe")?;
        let (mut pid_reader, pid_writer) = io::pipe().context("creating a pipe")?;
        let mut handshake = Some((pid_writer, release_reader));
        // Its own process group: a hung install is killed whole.
        command.stdin(Stdio::null()).process_group(0);
        // SAFETY: the closure only calls getpid(2), write(2) and read(2) on pipes, all
        // async-signal-safe, and allocates nothing.
        unsafe {
            command.pre_exec(move || {
                let (mut pid_writer, mut release_reader) =
                    handshake.take().ok_or_else(|| io::Error::other("pre-exec hook ran twice"))?;
                pid_writer.write_all(&std::process::id().to_ne_bytes())?;
                let mut byte = [0u8; 1];
                if release_reader.read(&mut byte)? == 1 {
                    Ok(())
                } else {
                    Err(io::Error::other("credwatch selftest did not release npm"))
                }
            });
        }
        let spawning = thread::spawn(move || command.spawn());
        let mut pid = [0u8; 4];
        if pid_reader.read_exact(&mut pid).is_err() {
            return Err(match spawning.join() {
                Ok(Err(error)) => anyhow::Error::from(error),
                _ => anyhow::anyhow!("npm did not start"),
            });
        }
        Ok(Held { pid: u32::from_ne_bytes(pid), release, spawning })
    }

    /// Lets npm exec; returns once it has (or failed to).
    fn release(mut self) -> Result<Child> {
        self.release.write_all(b"g").context("releasing npm")?;
        drop(self.release);
        match self.spawning.join() {
            Ok(child) => Ok(child?),
            Err(_) => anyhow::bail!("the thread starting npm panicked"),
        }
    }

    /// Kills npm before its exec.
    fn kill(self) {
        // SAFETY: kill(2) on our own child, still waiting before its exec.
        unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGKILL) };
        drop(self.release);
        let _ = self.spawning.join();
    }
}

fn kill_group(pid: u32) {
    // SAFETY: kill(2) on the process group of our own child.
    unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
}

/// Waits for `child` at most `limit`, then kills its process group (None).
fn wait_bounded(child: &mut Child, limit: Duration) -> Result<Option<ExitStatus>> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().context("waiting")? {
            return Ok(Some(status));
        }
        if started.elapsed() > limit {
            kill_group(child.id());
            let _ = child.wait();
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// The last lines of a program's output.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.metadata().is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0))
}

#[cfg(test)]
mod tests {
    use credwatch_core::{alert::AlertSweep, rules::RuleSet};

    use super::*;

    #[test]
    fn every_expected_alert_is_of_a_default_rule() {
        let rules = RuleSet::defaults().unwrap();
        let sweep = rules.sweep().map(|sweep| sweep.id.0.clone());
        for attack in attacks::ALL {
            for id in attack.expected.iter().flat_map(|expected| expected.rules) {
                let known = rules.rules().iter().any(|rule| rule.id == *id) || sweep.as_deref() == Some(*id);
                assert!(known, "{}: no default rule {id}", attack.name);
            }
        }
    }

    #[test]
    fn the_lab_holds_only_fake_credentials_and_the_marker_the_payloads_insist_on() {
        let dir = tempfile::tempdir().unwrap();
        let lab = Lab::write(dir.path(), &attacks::NX, "http://127.0.0.1:9/").unwrap();
        assert!(lab.path("home/.credwatch-selftest").is_file());
        let npmrc = fs::read_to_string(lab.path("home/.npmrc")).unwrap();
        assert!(npmrc.contains("//127.0.0.1:9/:_authToken=npm_FAKE"), "{npmrc}");
        let mut credentials = 0;
        let mut pending = vec![lab.path("home")];
        while let Some(dir) = pending.pop() {
            for entry in fs::read_dir(dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    pending.push(path);
                    continue;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                if [".credwatch-selftest", ".bashrc", ".zshrc", "package.json"].contains(&name.as_str()) {
                    continue;
                }
                credentials += 1;
                let text = fs::read_to_string(&path).unwrap();
                assert!(text.contains("FAKE"), "{} says nowhere that it is fake: {text}", path.display());
            }
        }
        assert!(credentials >= 9, "{credentials}");
        // The project depends on the attack's package, whose scripts npm runs.
        let manifest: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(lab.path("home/src/app/package.json")).unwrap()).unwrap();
        assert_eq!(manifest["dependencies"]["credwatch-selftest-nx"], "file:../../../packages/nx");
        assert!(lab.path("packages/nx/telemetry.js").is_file());
    }

    #[test]
    fn a_file_is_met_by_its_own_alert_or_by_a_sweep_that_lists_it() {
        let lab = Path::new("/tmp/lab");
        let key = Expected { rules: &["credential-sweep", "ssh-private-keys"], what: Target::File("home/.ssh/id_rsa") };
        let mut alert: Alert = serde_json::from_value(serde_json::json!({
            "@timestamp": "2026-12-05T18:50:48.538366187Z",
            "event": {"id": "d102d7973eded7ad9b05de3dff01ef98", "kind": "alert", "action": "open", "outcome": "alerted"},
            "rule": {"id": "credential-sweep", "name": "Credential sweep", "category": "sweep", "severity": "critical", "description": ""},
            "process": {"pid": 9711, "executable": "/usr/bin/node", "args": ["node"], "working_directory": "/", "parent": {"pid": 9704}, "ancestors": []},
            "package": {"manager": "npm"},
            "host": {"name": "vm"},
            "user": {"id": 0},
            "credwatch": {"root_pid": 9586, "rotate": [], "enforcement": "userspace"}
        }))
        .unwrap();
        alert.file =
            Some(credwatch_core::alert::AlertFile { path: "/tmp/lab/home/.npmrc".into(), ..Default::default() });
        assert!(!meets(&key, &alert, lab));
        alert.credwatch.sweep =
            Some(AlertSweep { files: vec!["/tmp/lab/home/.ssh/id_rsa".into()], ..Default::default() });
        assert!(meets(&key, &alert, lab));
        // Under --enforce: the key's own rule, blocked.
        alert.rule.id = "ssh-private-keys".into();
        alert.credwatch.sweep = None;
        assert!(!meets(&key, &alert, lab), "another file");
        alert.file.as_mut().unwrap().path = "/tmp/lab/home/.ssh/id_rsa".into();
        assert!(meets(&key, &alert, lab));
        alert.rule.id = "private-key-files".into();
        assert!(!meets(&key, &alert, lab), "another rule");
        let gh = Expected { rules: &["gh-auth-token"], what: Target::Command("gh auth token") };
        alert.rule.id = "gh-auth-token".into();
        alert.process.args = vec!["/bin/sh".into(), "/tmp/lab/tools/gh".into(), "--version".into()];
        assert!(!meets(&gh, &alert, lab));
        alert.process.args = vec!["/bin/sh".into(), "/tmp/lab/tools/gh".into(), "auth".into(), "token".into()];
        assert!(meets(&gh, &alert, lab));
        assert_eq!(shown(&key), "~/.ssh/id_rsa");
    }
}
