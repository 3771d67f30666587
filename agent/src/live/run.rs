//! `run`, and `record -- CMD`: CMD started but held before its exec until the sensor has marked
//! it (in `run --contain`'s box when asked), then watched until its whole tree is done.

use std::{
    ffi::OsString,
    io::{self, PipeWriter, Read as _, Write as _},
    os::unix::process::{CommandExt as _, ExitStatusExt as _},
    path::PathBuf,
    process::{Child, Command, ExitCode, ExitStatus},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use credwatch_core::{
    event::{Event, EventData, Root},
    output::escape,
    pipeline::Control,
    rules::RuleSet,
};
use tracing::{info, warn};

use super::{now_ns, stop_flag, wake_on_signals, Outputs, Session, POLL_INTERVAL};
use crate::{
    config::{Config, ContainWrites},
    contain::{self, Containment},
    delivery::ALERT_EXIT_STATUS,
};

/// CMD, started but held before its exec until the sensor has marked it, so that nothing CMD
/// does happens unwatched.
struct HeldCommand {
    pid: u32,
    release: PipeWriter,
    /// `Command::spawn` returns only once the child has exec'd, so it runs on its own thread.
    spawning: std::thread::JoinHandle<io::Result<Child>>,
}

impl HeldCommand {
    /// Starts CMD, in `containment`'s box when given (entered before the child reports its
    /// pid, so that the box is whole before the sensor marks it).
    fn spawn(command: &[String], containment: Option<Arc<Containment>>) -> Result<HeldCommand> {
        let (release_reader, release) = std::io::pipe().context("creating a pipe")?;
        let (mut pid_reader, pid_writer) = std::io::pipe().context("creating a pipe")?;
        let mut held = Command::new(&command[0]);
        held.args(&command[1..]);
        for name in containment.iter().flat_map(|containment| containment.withheld()) {
            held.env_remove(name);
        }
        for (name, value) in containment.iter().flat_map(|containment| containment.added_env()) {
            held.env(name, value);
        }
        let boxed = containment.clone();
        let mut handshake = Some((pid_writer, release_reader));
        // SAFETY: the closure only calls getpid(2), write(2) and read(2) on pipes and the
        // system calls of `Containment::enter`, all async-signal-safe, and allocates nothing.
        unsafe {
            held.pre_exec(move || {
                let (mut pid_writer, mut release_reader) =
                    handshake.take().ok_or_else(|| io::Error::other("pre-exec hook ran twice"))?;
                // Each step's outcome goes to credwatch as [step, errno]; the first with the pid.
                let mut tell = |outcome: Result<(), contain::Failure>, pid: Option<u32>| {
                    let (step, errno) = outcome.map_or_else(|f| (f.step, f.errno), |()| (contain::STEP_NONE, 0));
                    let mut report = [0u8; 12];
                    report[..4].copy_from_slice(&pid.unwrap_or_default().to_ne_bytes());
                    report[4..8].copy_from_slice(&step.to_ne_bytes());
                    report[8..].copy_from_slice(&errno.to_ne_bytes());
                    let at = if pid.is_some() { 0 } else { 4 };
                    pid_writer.write_all(&report[at..])?;
                    match outcome {
                        Ok(()) => Ok(()),
                        Err(_) => Err(io::Error::from_raw_os_error(errno)),
                    }
                };
                let mut byte = [0u8; 1];
                tell(boxed.as_ref().map_or(Ok(()), |containment| containment.enter()), Some(std::process::id()))?;
                if let Some(containment) = boxed.as_ref().filter(|containment| containment.maps_first()) {
                    if release_reader.read(&mut byte)? != 1 {
                        return Err(io::Error::other("credwatch did not map the user namespace"));
                    }
                    tell(containment.fill(), None)?;
                }
                if release_reader.read(&mut byte)? == 1 {
                    Ok(())
                } else {
                    Err(io::Error::other("credwatch did not release the command"))
                }
            });
        }
        let spawning = std::thread::spawn(move || held.spawn());
        let mut report = [0u8; 12];
        if pid_reader.read_exact(&mut report).is_err() {
            // The child never reached its pre-exec hook: spawn failed, and says why.
            let error = match spawning.join() {
                Ok(Err(error)) => anyhow::Error::from(error),
                _ => anyhow::anyhow!("the command did not start"),
            };
            return Err(error.context(format!("starting {}", escape(&command[0]))));
        }
        let word = |report: &[u8], at: usize| u32::from_ne_bytes(report[at..at + 4].try_into().expect("4 bytes"));
        let pid = word(&report, 0);
        let mut held = HeldCommand { pid, release, spawning };
        let Some(containment) = containment else { return Ok(held) };
        let outcome = |report: &[u8]| match word(report, 4) {
            contain::STEP_NONE => Ok(()),
            step => Err(contain::Failure { step, errno: word(report, 8) as i32 }),
        };
        let boxed = outcome(&report).map_err(|failure| containment.explain(failure)).and_then(|()| {
            containment.map_ids(pid)?;
            if containment.maps_first() {
                held.release.write_all(b"m").context("telling the command its ids are mapped")?;
                pid_reader.read_exact(&mut report[4..]).context("the command's box")?;
                outcome(&report).map_err(|failure| containment.explain(failure))?;
            }
            Ok(())
        });
        if let Err(error) = boxed {
            // SAFETY: kill(2) on our own child, which is still before its exec (or gave up).
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            let _ = held.spawning.join();
            return Err(error);
        }
        Ok(held)
    }

    /// Lets CMD exec; returns once it has (or failed to).
    fn release(mut self, command: &[String]) -> Result<Child> {
        self.release.write_all(b"g").context("releasing the command")?;
        drop(self.release);
        match self.spawning.join() {
            Ok(child) => child.with_context(|| format!("starting {}", escape(&command[0]))),
            Err(_) => anyhow::bail!("the thread starting the command panicked"),
        }
    }
}

/// `run`, or `record -- CMD`: CMD's tree only, until every process of it has exited (or
/// `linger` has passed since CMD exited). `selftest`: the tree is `credwatch selftest`'s, its
/// alerts marked so.
pub fn run_command(config: &Config, command: &[String], linger: Option<Duration>, selftest: bool) -> Result<ExitCode> {
    let mut network = None;
    anyhow::ensure!(
        !config.contain_keep || config.contain_writes == ContainWrites::Overlay,
        "--keep needs --contain-writes overlay"
    );
    let containment = if config.contain {
        let rules = RuleSet::load_without_samples(config.rules.as_deref()).context("loading rules")?;
        let env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        let mut containment = Containment::prepare(&rules, &env)?;
        if config.contain_writes == ContainWrites::Overlay {
            containment.overlay_home(config.contain_keep)?;
        }
        containment.say(&escape(&command[0]));
        if config.contain_net.is_some() {
            network = Some(containment.shut_network(&rules, &env)?);
        }
        Some(Arc::new(containment))
    } else {
        anyhow::ensure!(config.contain_net.is_none(), "--contain-net needs --contain");
        anyhow::ensure!(config.contain_writes == ContainWrites::ReadOnly, "--contain-writes needs --contain");
        None
    };
    if let Some(containment) = containment.as_ref().filter(|containment| !containment.as_root()) {
        return run_contained_unwatched(Arc::clone(containment), command);
    }
    let outputs = &Outputs::from_config(config);
    let stop = stop_flag()?;
    // A handler (not the default, which ignores it) so that SIGCHLD interrupts the sensor's wait:
    // CMD's exit is noticed at once, not at the next poll.
    let child_exited = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGCHLD, child_exited).context("installing signal handlers")?;
    let contained = containment.as_ref().map(|containment| containment.hidden_paths()).unwrap_or_default();
    let mut session = Session::start(outputs, command, contained)?;
    use signal_hook::consts::{SIGCHLD, SIGINT, SIGTERM};
    wake_on_signals(&mut session.live.sensor, &[SIGINT, SIGTERM, SIGCHLD])?;
    let held = HeldCommand::spawn(command, containment.clone())?;
    let root = held.pid;
    if selftest {
        session.engine.mark_selftests(Arc::new(Mutex::new([root].into())));
    }
    if let Err(error) = session.live.sensor.mark_root(root) {
        // SAFETY: kill(2) on our own child, which is still waiting before its exec.
        unsafe { libc::kill(root as libc::pid_t, libc::SIGKILL) };
        return Err(error).context("marking the command's process");
    }
    session.live.queued.push(Event {
        time_ns: now_ns(),
        pid: root,
        data: EventData::Root(Root { reason: "run".into() }),
    });
    let mut child = held.release(command)?;

    let mut status = None;
    let mut cmd_exited_at = None;
    let mut wait_error = None;
    let mut last_read = false;
    session.drive(|live, engine| {
        if let Some(network) = &network {
            live.queued.extend(network.refused(root));
        }
        if last_read {
            // That read may have brought more of the tree: a process CMD forked just before it
            // exited, whose fork record was still in the ring when CMD's exit was seen.
            if !engine.live_tree(root).into_iter().any(|(pid, _)| process_exists(pid)) {
                return Control::Stop;
            }
            last_read = false;
            live.wait = POLL_INTERVAL;
        }
        if status.is_none() {
            match child.try_wait() {
                Ok(exited) => status = exited,
                Err(error) => {
                    wait_error = Some(error);
                    return Control::Stop;
                }
            }
            if status.is_some() {
                cmd_exited_at = Some(Instant::now());
            }
        }
        if stop.load(Ordering::Relaxed) {
            info!("interrupted");
            return Control::Stop;
        }
        let Some(exited_at) = cmd_exited_at else { return Control::Continue };
        let still_running: Vec<(u32, String)> =
            engine.live_tree(root).into_iter().filter(|(pid, _)| process_exists(*pid)).collect();
        if still_running.is_empty() {
            // The last processes' final records are in the ring already (their exit tracepoint
            // ran before they could be reaped): one more read, without waiting.
            live.wait = Duration::ZERO;
            last_read = true;
            return Control::Continue;
        }
        if linger.is_some_and(|linger| exited_at.elapsed() >= linger) {
            // Already escaped by the engine.
            let running: Vec<String> =
                still_running.iter().map(|(pid, description)| format!("\n  [{pid}] {description}")).collect();
            warn!("stopped waiting; still running in the command's tree:{}", running.concat());
            return Control::Stop;
        }
        Control::Continue
    })?;
    if let Some(error) = wait_error {
        return Err(error).context("waiting for the command");
    }
    let alerted = session.finish()?;
    if let Some(containment) = &containment {
        containment.after_run()?;
    }
    if alerted > 0 {
        return Ok(ExitCode::from(ALERT_EXIT_STATUS));
    }
    Ok(match status {
        Some(status) if status.success() => ExitCode::SUCCESS,
        Some(status) => ExitCode::from(exit_byte(status)),
        None => ExitCode::FAILURE,
    })
}

/// `run --contain` without root: the box alone, since the sensor needs root.
fn run_contained_unwatched(containment: Arc<Containment>, command: &[String]) -> Result<ExitCode> {
    warn!(
        "not root: {} runs contained but is not watched by this run (the sensor needs root); \
         a running `credwatch watch` alerts on its package code",
        escape(&command[0])
    );
    let mut child = HeldCommand::spawn(command, Some(Arc::clone(&containment)))?.release(command)?;
    let status = child.wait().context("waiting for the command")?;
    containment.after_run()?;
    Ok(if status.success() { ExitCode::SUCCESS } else { ExitCode::from(exit_byte(status)) })
}

/// CMD's exit status as a shell reports it: the code, or 128 + signal.
fn exit_byte(status: ExitStatus) -> u8 {
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .map_or(1, |code| u8::try_from(code).unwrap_or(1))
}

fn process_exists(pid: u32) -> bool {
    PathBuf::from(format!("/proc/{pid}")).exists()
}
