//! The `credwatch` command.

use std::{
    io::{self, Read as _, Write as _},
    io::PipeWriter,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};
use credwatch::{
    engine::{Engine, EngineOptions},
    event::{Event, EventData, Root},
    output::{escape, AlertSink},
    rules::{self, RuleSet},
    sensor::{self, Sensor},
};

/// Exit status of `credwatch run` when any alert fired, whatever CMD did.
const ALERT_EXIT_STATUS: u8 = 10;
/// How long one wait for kernel events lasts: bounds alert latency and Ctrl-C response.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

#[derive(Parser)]
#[command(
    name = "credwatch",
    version,
    about = "Watches package-manager process trees (npm, cargo, pip, ...) and alerts when package code touches credentials."
)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Watch the whole machine: every process tree a package manager starts. Ctrl-C or SIGTERM stops.
    Watch(WatchArgs),
    /// Run CMD and watch only its process tree (CMD is a root whatever it is).
    ///
    /// Exit status: 0 when CMD succeeded and no alert fired; CMD's own status when it failed and no
    /// alert fired; 10 when any alert fired.
    Run(RunArgs),
    /// Report the kernel features credwatch needs and which sensor it will use.
    Doctor,
    /// Check or list rules.
    #[command(subcommand)]
    Rules(RulesCommand),
}

#[derive(Args)]
struct CommonArgs {
    /// Print alerts as JSON lines instead of the readable form.
    #[arg(long)]
    json: bool,
    /// A folder of rule files that add to or override the default rules (same id overrides).
    #[arg(long, value_name = "DIR")]
    rules: Option<PathBuf>,
}

#[derive(Args)]
struct WatchArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Also append every alert as a JSON line to FILE.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Also append every alert as a JSON line to FILE.
    #[arg(long, value_name = "FILE")]
    alerts: Option<PathBuf>,
    /// After CMD exits, wait at most SECS for the rest of its tree (daemonised payloads) before
    /// giving up and naming the processes still running. Without it, wait until all have exited.
    #[arg(long, value_name = "SECS")]
    linger: Option<f64>,
    /// The command to run, after `--`.
    #[arg(required = true, last = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Subcommand)]
enum RulesCommand {
    /// Parse and validate every rule file in DIR and run each rule's samples.
    Check {
        /// The folder of rule files.
        dir: PathBuf,
    },
    /// List the rules in force.
    List {
        /// A folder of rule files added to the defaults.
        #[arg(long, value_name = "DIR")]
        rules: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Commands::Watch(args) => watch(args),
        Commands::Run(args) => run(args),
        Commands::Doctor => {
            print!("{}", sensor::doctor());
            Ok(ExitCode::SUCCESS)
        }
        Commands::Rules(RulesCommand::Check { dir }) => rules_check(&dir),
        Commands::Rules(RulesCommand::List { rules }) => rules_list(rules.as_deref()),
    };
    result.unwrap_or_else(|error| {
        eprintln!("credwatch: {}", escape(&format!("{error:#}")));
        ExitCode::FAILURE
    })
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_default()
}

/// Set by SIGINT or SIGTERM: the loops finish their round and print a summary.
fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("installing signal handlers")?;
    }
    Ok(stop)
}

/// The sensor, the engine and the outputs, wired together.
struct Session {
    sensor: Sensor,
    engine: Engine,
    sink: AlertSink,
    batch: Vec<Event>,
    started: Instant,
}

impl Session {
    fn start(common: &CommonArgs, output: Option<&Path>, auto_roots: bool) -> Result<Session> {
        let started = Instant::now();
        let rules = RuleSet::load(common.rules.as_deref()).context("loading rules")?;
        let sensor = Sensor::start(rules.managers(), auto_roots).context("starting the eBPF sensor")?;
        let sink = AlertSink::new(common.json, output)
            .with_context(|| format!("opening {}", output.map(Path::display).map(|d| d.to_string()).unwrap_or_default()))?;
        let engine = Engine::new(rules, EngineOptions { host_name: host_name() });
        Ok(Session { sensor, engine, sink, batch: Vec::new(), started })
    }

    fn handle(&mut self, event: &Event) -> Result<()> {
        for alert in self.engine.handle(event) {
            self.sink.write(&alert).context("writing an alert")?;
        }
        Ok(())
    }

    /// Waits for kernel events once and runs them through the engine.
    fn pump(&mut self) -> Result<()> {
        let mut batch = std::mem::take(&mut self.batch);
        self.sensor.poll(POLL_INTERVAL, &mut batch).context("reading kernel events")?;
        for event in batch.drain(..) {
            self.handle(&event)?;
        }
        self.batch = batch;
        Ok(())
    }

    fn summary(&self) {
        let sensor = self.sensor.stats();
        let engine = self.engine.stats();
        eprintln!(
            "credwatch: {} events, {} lost, {} alerts in {:.1}s",
            engine.events,
            sensor.lost + sensor.marks_full,
            self.sink.written(),
            self.started.elapsed().as_secs_f64()
        );
    }
}

fn watch(args: WatchArgs) -> Result<ExitCode> {
    let stop = stop_flag()?;
    let mut session = Session::start(&args.common, args.output.as_deref(), true)?;
    let managers = session.engine.rules().managers().to_vec();
    for event in session.sensor.seed(&managers).context("seeding running package trees from /proc")? {
        session.handle(&event)?;
    }
    eprintln!(
        "credwatch: watching package trees ({} rules) after {} ms; Ctrl-C to stop",
        session.engine.rules().rules().len(),
        session.started.elapsed().as_millis()
    );
    while !stop.load(Ordering::Relaxed) {
        session.pump()?;
    }
    session.summary();
    Ok(ExitCode::SUCCESS)
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// CMD, started but held before its exec until the sensor has marked it, so that nothing CMD
/// does happens unwatched.
struct HeldCommand {
    pid: u32,
    release: PipeWriter,
    /// `Command::spawn` returns only once the child has exec'd, so it runs on its own thread.
    spawning: std::thread::JoinHandle<io::Result<Child>>,
}

impl HeldCommand {
    fn spawn(command: &[String]) -> Result<HeldCommand> {
        let (release_reader, release) = std::io::pipe().context("creating a pipe")?;
        let (mut pid_reader, pid_writer) = std::io::pipe().context("creating a pipe")?;
        let mut held = Command::new(&command[0]);
        held.args(&command[1..]);
        let mut handshake = Some((pid_writer, release_reader));
        // SAFETY: the closure only calls getpid(2), write(2) and read(2) on pipes, all
        // async-signal-safe, and allocates nothing.
        unsafe {
            held.pre_exec(move || {
                let (mut pid_writer, mut release_reader) =
                    handshake.take().ok_or_else(|| io::Error::other("pre-exec hook ran twice"))?;
                pid_writer.write_all(&std::process::id().to_ne_bytes())?;
                let mut byte = [0u8; 1];
                if release_reader.read(&mut byte)? == 1 {
                    Ok(())
                } else {
                    Err(io::Error::other("credwatch did not release the command"))
                }
            });
        }
        let spawning = std::thread::spawn(move || held.spawn());
        let mut pid = [0u8; 4];
        if pid_reader.read_exact(&mut pid).is_err() {
            // The child never reached its pre-exec hook: spawn failed, and says why.
            let error = match spawning.join() {
                Ok(Err(error)) => anyhow::Error::from(error),
                _ => anyhow::anyhow!("the command did not start"),
            };
            return Err(error.context(format!("starting {}", escape(&command[0]))));
        }
        Ok(HeldCommand { pid: u32::from_ne_bytes(pid), release, spawning })
    }

    /// Lets CMD exec; returns once it has (or failed to).
    fn release(mut self, command: &[String]) -> Result<Child> {
        self.release.write_all(b"go").context("releasing the command")?;
        drop(self.release);
        match self.spawning.join() {
            Ok(child) => child.with_context(|| format!("starting {}", escape(&command[0]))),
            Err(_) => anyhow::bail!("the thread starting the command panicked"),
        }
    }
}

fn run(args: RunArgs) -> Result<ExitCode> {
    let stop = stop_flag()?;
    let mut session = Session::start(&args.common, args.alerts.as_deref(), false)?;
    let held = HeldCommand::spawn(&args.command)?;
    let root = held.pid;
    if let Err(error) = session.sensor.mark_root(root) {
        // SAFETY: kill(2) on our own child, which is still waiting before its exec.
        unsafe { libc::kill(root as libc::pid_t, libc::SIGKILL) };
        return Err(error).context("marking the command's process");
    }
    session.handle(&Event { time_ns: now_ns(), pid: root, data: EventData::Root(Root { reason: "run".into() }) })?;
    let mut child = held.release(&args.command)?;

    let mut status = None;
    let mut cmd_exited_at = None;
    let linger = args.linger.map(Duration::from_secs_f64);
    loop {
        session.pump()?;
        if status.is_none() {
            status = child.try_wait().context("waiting for the command")?;
            if status.is_some() {
                cmd_exited_at = Some(Instant::now());
            }
        }
        if stop.load(Ordering::Relaxed) {
            eprintln!("credwatch: interrupted");
            break;
        }
        let Some(exited_at) = cmd_exited_at else { continue };
        let still_running: Vec<(u32, String)> =
            session.engine.live_tree(root).into_iter().filter(|(pid, _)| process_exists(*pid)).collect();
        if still_running.is_empty() {
            // One more round so that the last processes' final events are in.
            session.pump()?;
            break;
        }
        if linger.is_some_and(|linger| exited_at.elapsed() >= linger) {
            eprintln!("credwatch: stopped waiting; still running in the command's tree:");
            for (pid, description) in still_running {
                eprintln!("  [{pid}] {}", escape(&description));
            }
            break;
        }
    }
    session.summary();

    if session.sink.written() > 0 {
        return Ok(ExitCode::from(ALERT_EXIT_STATUS));
    }
    Ok(match status {
        Some(status) if status.success() => ExitCode::SUCCESS,
        Some(status) => ExitCode::from(exit_byte(status)),
        None => ExitCode::FAILURE,
    })
}

/// CMD's exit status as a shell reports it: the code, or 128 + signal.
fn exit_byte(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .map_or(1, |code| u8::try_from(code).unwrap_or(1))
}

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn rules_check(dir: &Path) -> Result<ExitCode> {
    let report = rules::check_dir(dir).with_context(|| format!("checking rules in {}", dir.display()))?;
    println!("{report}");
    Ok(ExitCode::SUCCESS)
}

fn rules_list(extra: Option<&Path>) -> Result<ExitCode> {
    let rules = RuleSet::load(extra).context("loading rules")?;
    let mut out = io::stdout().lock();
    writeln!(out, "{:<36} {:<9} {:<6} {:<22} NAME", "ID", "SEVERITY", "ACTION", "CATEGORY")?;
    for rule in rules.rules() {
        writeln!(
            out,
            "{:<36} {:<9} {:<6} {:<22} {}",
            rule.id,
            rule.severity.as_str(),
            rule.action.as_str(),
            rule.category,
            rule.name
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_the_command_after_double_dash() {
        let cli = Cli::try_parse_from(["credwatch", "run", "--json", "--", "npm", "install", "--json"]).unwrap();
        let Commands::Run(args) = cli.command else { panic!("not run") };
        assert!(args.common.json);
        assert_eq!(args.command, ["npm", "install", "--json"]);
    }

    #[test]
    fn bails_without_a_command() {
        assert!(Cli::try_parse_from(["credwatch", "run"]).is_err());
    }
}
