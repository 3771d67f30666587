//! `credwatch notify`: the running agent's alerts as desktop notifications, in the user's
//! session (issue 26). It follows the agent's socket ([`crate::local::client`]), shows each
//! alert the user may see on the session bus ([`desktop`]) at a volume a person can read
//! ([`volume`]), remembers the last alert it showed (`$XDG_STATE_HOME/credwatch/notify.seq`)
//! and, at its next start, shows what it missed. Every alert is also a line of its log.

mod content;
mod desktop;
mod volume;

use std::{
    fs,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use credwatch_core::{alert::Severity, output::escape};

use crate::local::{
    client::{self, AlertStream, ClientError, Message},
    commands::{self, Wanted},
};

/// How often a missing agent is looked for again (it may start later, at boot).
const RECONNECT_EVERY: Duration = Duration::from_secs(3);
/// How long a read waits before the pending updates and the stop flag are looked at.
const TICK: Duration = Duration::from_millis(250);

#[derive(clap::Args)]
pub struct NotifyArgs {
    /// The agent's socket (`alerts_socket` of `watch`).
    #[arg(long, value_name = "PATH", default_value = client::DEFAULT_SOCKET)]
    alerts_socket: PathBuf,
    /// The least severe alerts shown: low, medium, high or critical.
    #[arg(long, value_name = "SEVERITY", default_value = "medium", value_parser = <Severity as std::str::FromStr>::from_str)]
    min_severity: Severity,
    /// Show the alerts raised since the last one shown, then exit instead of following (exit
    /// status 1 when no agent answers).
    #[arg(long)]
    once: bool,
}

pub fn run(args: &NotifyArgs) -> Result<ExitCode> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("installing signal handlers")?;
    }
    let state_dir = xdg_dir("XDG_STATE_HOME", ".local/state")?.join("credwatch");
    // Held until exit: the autostart entry and the user unit may both start one.
    let Some(_lock) = lock(&state_dir.join("notify.lock"))? else {
        tracing::info!("another credwatch notify runs in this session: nothing to do");
        return Ok(ExitCode::SUCCESS);
    };
    let state = SeqFile { path: state_dir.join("notify.seq"), said: Default::default() };
    let cache = xdg_dir("XDG_CACHE_HOME", ".cache")?.join("credwatch");
    let mut desk = desktop::Desktop::new(args.alerts_socket.clone(), cache);
    let mut volume = volume::Volume::default();
    let mut shown = state.read();
    let socket = &args.alerts_socket;
    let mut said: Option<String> = None;
    while !stop.load(Ordering::Relaxed) {
        let mut stream = match AlertStream::connect(socket, shown, !args.once) {
            Ok(stream) => stream,
            Err(error) if args.once => return Err(error.into()),
            Err(error) => {
                let why = error.to_string();
                if said.as_ref() != Some(&why) {
                    tracing::warn!("{why}: trying again every {} s", RECONNECT_EVERY.as_secs());
                    said = Some(why);
                }
                sleep_unless(&stop, RECONNECT_EVERY);
                continue;
            }
        };
        said = None;
        tracing::info!("following the agent's alerts at {}", escape(&socket.display().to_string()));
        let mut missed = Some(Vec::new());
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            match stream.next(Some(TICK)) {
                Ok(Some(Message::Alert { seq, alert })) => {
                    if alert.rule.severity >= args.min_severity {
                        tracing::info!("{}", content::log_line(seq, &alert));
                        match missed.as_mut() {
                            Some(missed) => missed.push((seq, *alert)),
                            None => volume.live(seq, *alert, now, &mut desk),
                        }
                    }
                    if missed.is_none() {
                        shown = Some(seq);
                        state.write(seq);
                    }
                }
                Ok(Some(Message::CaughtUp { last_seq })) => {
                    if let Some(missed) = missed.take().filter(|missed| !missed.is_empty()) {
                        volume.missed(missed, now, &mut desk);
                    }
                    shown = Some(last_seq);
                    state.write(last_seq);
                    if args.once {
                        volume.flush(now, &mut desk);
                        return Ok(ExitCode::SUCCESS);
                    }
                }
                Ok(None) if args.once => {
                    anyhow::bail!("the agent closed the connection before the missed alerts were sent")
                }
                Ok(None) => {
                    tracing::warn!("the agent closed the connection: connecting again");
                    break;
                }
                Err(ClientError::Timeout { .. }) => {}
                Err(error) if args.once => return Err(error.into()),
                Err(error) => {
                    tracing::warn!("{error}: connecting again");
                    break;
                }
            }
            volume.tick(Instant::now(), &mut desk);
        }
        // Not at once: an agent that refuses (too many clients) would be asked in a loop.
        sleep_unless(&stop, RECONNECT_EVERY);
    }
    volume.flush(Instant::now(), &mut desk);
    Ok(ExitCode::SUCCESS)
}

/// `$VARIABLE` when it is an absolute path (the XDG rule), else `$HOME/fallback`.
fn xdg_dir(variable: &str, fallback: &str) -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(variable).map(PathBuf::from).filter(|dir| dir.is_absolute()) {
        return Ok(dir);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|home| home.is_absolute())
        .with_context(|| format!("neither {variable} nor HOME is set to an absolute path"))?;
    Ok(home.join(fallback))
}

/// The lock file `path`, locked (flock) for this process; None when another holds it.
fn lock(path: &Path) -> Result<Option<fs::File>> {
    use std::os::fd::AsRawFd as _;
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", escape(&dir.display().to_string())))?;
    }
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", escape(&path.display().to_string())))?;
    // SAFETY: flock on a descriptor this File owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(Some(file));
    }
    let error = std::io::Error::last_os_error();
    if error.kind() == std::io::ErrorKind::WouldBlock {
        return Ok(None);
    }
    Err(error).with_context(|| format!("locking {}", escape(&path.display().to_string())))
}

fn sleep_unless(stop: &AtomicBool, duration: Duration) {
    let until = Instant::now() + duration;
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        std::thread::sleep(TICK.min(until.saturating_duration_since(Instant::now())));
    }
}

/// The last alert shown (its `seq`), kept across runs.
struct SeqFile {
    path: PathBuf,
    /// A failed write was said (once: it would fail at every alert).
    said: std::cell::Cell<bool>,
}

impl SeqFile {
    /// None the first time (no history is asked for then), or when the file is unreadable
    /// (said).
    fn read(&self) -> Option<u64> {
        let shown = escape(&self.path.display().to_string()).into_owned();
        match fs::read_to_string(&self.path) {
            Ok(text) => match text.trim().parse() {
                Ok(seq) => Some(seq),
                Err(_) => {
                    tracing::warn!("{shown}: not an alert number ({}): starting from now", escape(text.trim()));
                    None
                }
            },
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => {
                tracing::warn!("reading {shown}: {error}: starting from now");
                None
            }
        }
    }

    /// Replaces the file whole (a crash leaves the old number or the new one); a failure is
    /// said once and the alerts go on.
    fn write(&self, seq: u64) {
        let temporary = self.path.with_extension("seq.new");
        let written = self
            .path
            .parent()
            .map_or(Ok(()), fs::create_dir_all)
            .and_then(|()| fs::write(&temporary, format!("{seq}\n")))
            .and_then(|()| fs::rename(&temporary, &self.path));
        match written {
            Err(error) if !self.said.replace(true) => tracing::warn!(
                "writing {}: {error}: the alerts shown are not remembered for the next start",
                escape(&self.path.display().to_string())
            ),
            Err(_) => {}
            Ok(()) => self.said.set(false),
        }
    }
}

/// The incident page of alert `seq` (what `credwatch show SEQ --html` writes), from the alerts
/// the agent gives this user, written to `page`.
fn write_incident_page(socket: &Path, seq: u64, page: &Path) -> Result<()> {
    let logged = client::logged_by_agent(socket)?;
    let (seq, alert) = commands::find(&logged, &Wanted::Seq(seq))?;
    let tree = commands::tree_of(&logged, alert);
    if let Some(dir) = page.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", escape(&dir.display().to_string())))?;
    }
    fs::write(page, credwatch_core::incident::page_of_tree(seq, &tree))
        .with_context(|| format!("writing {}", escape(&page.display().to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shown_seq_survives_a_restart_and_a_bad_file_starts_from_now() {
        let dir = tempfile::tempdir().unwrap();
        let state = SeqFile { path: dir.path().join("state/credwatch/notify.seq"), said: Default::default() };
        assert_eq!(state.read(), None, "the first start asks for no history");
        state.write(41);
        state.write(42);
        assert_eq!(state.read(), Some(42));
        fs::write(&state.path, "forty-two\n").unwrap();
        assert_eq!(state.read(), None);
    }

    #[test]
    fn one_instance_holds_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credwatch/notify.lock");
        let first = lock(&path).unwrap();
        assert!(first.is_some());
        assert!(lock(&path).unwrap().is_none(), "a second instance");
        drop(first);
        assert!(lock(&path).unwrap().is_some(), "free again once the first exits");
    }

    #[test]
    fn severities_parse_and_a_bad_one_is_named() {
        assert_eq!("high".parse::<Severity>(), Ok(Severity::High));
        let error = "\x1b[31mred".parse::<Severity>().unwrap_err();
        assert!(error.starts_with("\\u{1b}[31mred: not a severity"), "{error}");
    }
}
