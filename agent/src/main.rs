//! The `credwatch` command: the command line, and each command's entry point.
//!
//! - `config`: the configuration of the live modes (file, environment, flags);
//! - `live`: `watch`, `run` and `record`, the sensor driven through the engine to the outputs;
//! - `replay`: `replay`, traces through the same pipeline and rules;
//! - `delivery`: what both share about alerts leaving (the outputs, the exit status);
//! - `contain`: `run --contain`, CMD's tree in a box without the credential files;
//! - `local`: the agent's local alert log and its socket (`credwatch alerts`, `show`);
//! - `notify`: `credwatch notify`, the agent's alerts as desktop notifications;
//! - `fleet`: `credwatch fleet report`, the fleet's alerts per package;
//! - `selftest`: `credwatch selftest`, safe reproductions of real attacks;
//! - `log`: the agent's own log (not its alerts).
//!
//! The kernel side is the library's `sensor` (lib.rs); detection is credwatch-core's.

mod config;
mod contain;
mod delivery;
mod fleet;
mod live;
mod local;
mod log;
mod notify;
mod replay;
mod selftest;

use std::{
    io::{self, Write as _},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};
use config::{Config, ContainNet, ContainWrites, KernelLog, Layers, LogFormat, LogLevel, SensorChoice};
use credwatch::sensor::{self, MapSizes};
use credwatch_core::{engine::EngineOptions, output::escape, rules::RuleSet, samples};
use credwatch_outputs::{Destination, OutputConfig};
use serde_json::{Map, Value};

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
    /// Watch the whole machine: every process tree a package manager starts. Ctrl-C or SIGTERM
    /// stops the agent; the kernel programs stay attached (pinned) until `credwatch stop`.
    Watch(WatchArgs),
    /// Run CMD and watch only its process tree (CMD is a root whatever it is).
    ///
    /// Exit status: 0 when CMD succeeded and no alert fired; CMD's own status when it failed and no
    /// alert fired; 10 when any alert fired.
    Run(RunArgs),
    /// Record every event of package trees to a trace file (JSON lines; `.gz`, `.zst` by
    /// extension): CMD's tree with `-- CMD`, else the whole machine until Ctrl-C.
    Record(RecordArgs),
    /// Replay trace files (`-` for standard input) through the rules, as if live.
    ///
    /// Exit status: 0 when no alert fired, 10 when any did.
    Replay(ReplayArgs),
    /// Stop `watch`: stop the agent if one runs, and detach and unpin its kernel programs.
    ///
    /// Exit status: 0 when they were detached or nothing was pinned.
    Stop(StopArgs),
    /// Report the kernel features credwatch needs and which sensor it will use.
    Doctor,
    /// Which credential files of the catalogue (the rules' targets) are here, who can read them,
    /// how old each is and what to rotate: Markdown, or JSON with `--json`. Reads file metadata,
    /// never contents; unprivileged, it says what it could not list.
    Exposure(ExposureArgs),
    /// Check or list rules.
    #[command(subcommand)]
    Rules(RulesCommand),
    /// The fleet's alerts at once.
    #[command(subcommand)]
    Fleet(FleetCommand),
    /// Check a configuration file, or print the configuration in force.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// The alerts of the local alert log that `watch` keeps: root reads the log, anyone else
    /// asks the agent, which gives each user the alerts about their own processes.
    Alerts(local::commands::AlertsArgs),
    /// One alert of the local alert log in full, and the other alerts of its process tree.
    Show(local::commands::ShowArgs),
    /// Rehearse a real npm attack (Nx "s1ngularity", Shai-Hulud 2.0) as package code of the real
    /// npm, in a throwaway home of fake credentials, its network steps to a loopback stub, and
    /// check that the running agent (else credwatch's own sensor, as root) raised each alert it
    /// must. The agent marks them `credwatch.selftest` and sends them to its outputs.
    ///
    /// Exit status: 0 when every expected alert came, 3 when one is missing, 4 when the agent did
    /// not answer or report in time (or none runs, with --agent), 1 on an error.
    Selftest(SelftestArgs),
    /// Show the running agent's alerts as desktop notifications, in the user's session: the
    /// alerts of the user's own processes (all of them for root and group `credwatch`), and at
    /// start those raised since the last one shown.
    Notify(notify::NotifyArgs),
}

/// The configuration of `watch`, `run` and `record`: a file, `CREDWATCH_<KEY>` variables over
/// it, the flags over both. `SIGHUP` reloads it (and the rules) in `watch` and `record`
/// without CMD.
#[derive(Args)]
struct ConfigArgs {
    /// The configuration file (YAML): every flag of this command has a key of the same name
    /// (`watch_project: true`; `alerts` for `--output`/`--alerts`, `trace` for `record -o`).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The agent's own log on standard error (not alerts): text lines or JSON lines.
    #[arg(long, value_enum, value_name = "FORMAT")]
    log_format: Option<LogFormat>,
    /// The least severe log records written.
    #[arg(long, value_enum, value_name = "LEVEL")]
    log_level: Option<LogLevel>,
    /// The kernel programs [default: auto]: fentry where they load (cheaper; with the BPF LSM
    /// active, `--enforce` refuses with EPERM rather than kills), else tracepoints.
    #[arg(long, value_enum, value_name = "BACKEND")]
    sensor: Option<SensorChoice>,
    /// The kernel programs' own diagnostics (a failed read, a walk cut short, a full map), from
    /// this level up, in the log as `kernel: ...` lines [default: off]
    #[arg(long, value_enum, value_name = "LEVEL")]
    kernel_log: Option<KernelLog>,
    /// The size of a kernel map at load (repeatable): MARKS, LOST_TREES, TAINTED, CRED_INODES,
    /// REPEATS in entries, the EVENTS and PRIORITY rings in bytes (a power of two). A pinned set
    /// that is adopted keeps its own sizes.
    #[arg(long = "map-size", value_name = "NAME=ENTRIES")]
    map_size: Vec<MapSizes>,
}

#[derive(Args)]
struct CommonArgs {
    /// Print alerts as JSON lines instead of the readable form.
    #[arg(long)]
    json: bool,
    /// A folder of rule files that add to or override the default rules (same id overrides).
    #[arg(long, value_name = "DIR")]
    rules: Option<PathBuf>,
    /// Watch the project's own scripts and programs too (`npm run`, `npm test`, `cargo run`,
    /// `cargo test`, ...), which are quiet by default: for CI jobs that run untrusted pull
    /// requests' code.
    #[arg(long)]
    watch_project: bool,
}

/// Where alerts go besides the terminal, each output with its own queue and spool.
#[derive(Args)]
struct OutputArgs {
    /// Also send every alert to DEST (repeatable): file:PATH, syslog:unix:PATH,
    /// syslog:udp:HOST:PORT, syslog:tcp:HOST:PORT, syslog:relp:HOST:PORT, webhook:URL,
    /// falcosidekick:URL, nats:URL/SUBJECT_PREFIX. Filters and knobs: `outputs` in the
    /// configuration.
    #[arg(long = "to", value_name = "DEST")]
    to: Vec<Destination>,
    /// Where outputs keep the alerts not delivered yet, for the next start [default:
    /// /var/lib/credwatch/spool].
    #[arg(long, value_name = "DIR")]
    spool_dir: Option<PathBuf>,
}

#[derive(Args)]
struct EnforceArgs {
    /// Block in the kernel: kill package code when it opens a file of a rule whose action is
    /// `kill` (before the open returns), or calls bpf(), loads a kernel module, ptraces or
    /// signals credwatch.
    #[arg(long)]
    enforce: bool,
}

#[derive(Args)]
struct PinArgs {
    /// Where the kernel side of `watch` (and `record` without CMD) is pinned, on bpffs (default
    /// /sys/fs/bpf/credwatch): the programs stay attached and recording while no agent runs, and
    /// the next one adopts them.
    #[arg(long, value_name = "DIR")]
    pin_dir: Option<PathBuf>,
}

impl PinArgs {
    /// The `pin_dir` key, when the flag is given.
    fn add_to(&self, flags: &mut Map<String, Value>) {
        if let Some(dir) = &self.pin_dir {
            flags.insert("pin_dir".into(), Value::String(dir.to_string_lossy().into_owned()));
        }
    }
}

/// The agent's Prometheus metrics.
#[derive(Args)]
struct MetricsArgs {
    /// Serve Prometheus metrics on ADDR (`127.0.0.1:9464`), at `/metrics`.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
}

impl MetricsArgs {
    /// The `metrics_listen` key, when the flag is given.
    fn add_to(&self, flags: &mut Map<String, Value>) {
        if let Some(addr) = &self.metrics_listen {
            flags.insert("metrics_listen".into(), Value::String(addr.to_string()));
        }
    }
}

#[derive(Args)]
struct StopArgs {
    #[command(flatten)]
    pin: PinArgs,
    #[command(flatten)]
    config: ConfigArgs,
}

#[derive(Args)]
struct WatchArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    outputs: OutputArgs,
    #[command(flatten)]
    metrics: MetricsArgs,
    #[command(flatten)]
    enforce: EnforceArgs,
    #[command(flatten)]
    pin: PinArgs,
    #[command(flatten)]
    config: ConfigArgs,
    /// Also append every alert as a JSON line to FILE.
    #[arg(long, visible_alias = "alerts", value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    local: local::commands::WatchLocalArgs,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    outputs: OutputArgs,
    #[command(flatten)]
    metrics: MetricsArgs,
    #[command(flatten)]
    enforce: EnforceArgs,
    #[command(flatten)]
    config: ConfigArgs,
    /// Also append every alert as a JSON line to FILE.
    #[arg(long, value_name = "FILE")]
    alerts: Option<PathBuf>,
    /// After CMD exits, wait at most SECS for the rest of its tree (daemonised payloads) before
    /// giving up and naming the processes still running. Without it, wait until all have exited.
    #[arg(long, value_name = "SECS")]
    linger: Option<f64>,
    /// Run CMD's tree in a box where every credential file of the catalogue that exists is an
    /// empty, read-only file (a manager's configuration, a copy without its tokens), and
    /// environment variables holding secrets are withheld; reads of the files still alert. Registry
    /// tokens are not passed to the package manager (said before CMD runs). Without root: a user
    /// namespace, and no sensor of its own (a running `credwatch watch` alerts). The home is
    /// read-only in the box but for the project directory and the managers' caches; persistence
    /// paths (rc files, systemd user units, agents' hooks, crontabs) stay read-only even there
    /// (see --contain-writes). The side doors are shut: the sockets of ssh-agent, gpg-agent, the
    /// container engines, the session bus and the user's systemd manager, X11 and Wayland, and
    /// Kerberos caches (rules' `doors:`), with their variables; the box gets a fresh session
    /// keyring.
    #[arg(long)]
    contain: bool,
    /// With --contain: `read-only` (the default), a write to the home elsewhere fails (EROFS)
    /// and alerts; `overlay`, the home is an overlay whose changes are listed after the run and
    /// dropped (see --keep).
    #[arg(long, value_name = "HOW", requires = "contain")]
    contain_writes: Option<ContainWrites>,
    /// With --contain-writes overlay: copy what the box wrote into the real home after the run,
    /// but for persistence paths (said).
    #[arg(long, requires = "contain_writes")]
    keep: bool,
    /// With --contain, as root: the box's only network is a proxy of credwatch's that reaches
    /// the usual registries (the rules' `network:` names, on ports 443 and 80) and the registries
    /// CMD's environment and npmrc files configure; every other connection fails (no route) or,
    /// through the proxy, gets 403 and an alert. Loopback in the box is the box's own.
    #[arg(long, value_name = "WHAT", requires = "contain")]
    contain_net: Option<ContainNet>,
    /// `credwatch selftest` runs its attack so when no agent runs: the alerts are marked
    /// `credwatch.selftest`.
    #[arg(long, hide = true)]
    selftest: bool,
    /// The command to run, after `--`.
    #[arg(required = true, last = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Args)]
struct SelftestArgs {
    /// The attack to reproduce.
    #[arg(long, value_enum, value_name = "ATTACK", default_value = "all")]
    attack: selftest::Which,
    /// Only the running agent checks: fail when none answers (a canary after a rollout).
    #[arg(long)]
    agent: bool,
    /// The running agent's socket.
    #[arg(long, value_name = "PATH", default_value = local::client::DEFAULT_SOCKET)]
    alerts_socket: PathBuf,
    /// The report as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct RecordArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    outputs: OutputArgs,
    #[command(flatten)]
    metrics: MetricsArgs,
    #[command(flatten)]
    enforce: EnforceArgs,
    /// Without CMD only.
    #[command(flatten)]
    pin: PinArgs,
    #[command(flatten)]
    config: ConfigArgs,
    /// The trace file to write (or `trace` in the configuration).
    #[arg(short = 'o', long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Also append every alert as a JSON line to FILE.
    #[arg(long, value_name = "FILE")]
    alerts: Option<PathBuf>,
    /// As for `run`: how long to wait for CMD's tree after CMD exits.
    #[arg(long, value_name = "SECS")]
    linger: Option<f64>,
    /// The command to record, after `--`.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Args)]
struct ReplayArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    outputs: OutputArgs,
    /// Skip and count bad lines instead of stopping at the first one.
    #[arg(long)]
    keep_going: bool,
    /// Also append every alert as a JSON line to FILE.
    #[arg(long, value_name = "FILE")]
    alerts: Option<PathBuf>,
    /// Print a responder's report (per package: steps, commands, credential files touched with
    /// each incident's process tree, and what to rotate) instead of each alert.
    #[arg(long)]
    report: bool,
    /// The report's format (`html`: the incident page, one self-contained file).
    #[arg(long, value_enum, value_name = "FORMAT", default_value = "text")]
    report_format: replay::ReportFormat,
    /// The files' format: credwatch, strace, auditd, tetragon or tracee (detected when omitted).
    #[arg(long, value_name = "FORMAT")]
    from: Option<credwatch_core::import::Format>,
    /// The date (YYYY-MM-DD, UTC) of strace `-t`/`-tt` times, which carry none (default: the
    /// date of the file's modification time).
    #[arg(long, value_name = "DATE", value_parser = parse_date)]
    date: Option<time::Date>,
    /// The home of the traced processes when the trace does not carry `HOME` (strace without
    /// `-v`, auditd, Tetragon): beats the home inferred from the managers' own reads.
    #[arg(long, value_name = "DIR", value_parser = parse_home)]
    home: Option<String>,
    /// The traced host's passwd file: homes by uid, the last resort when the trace carries no
    /// `HOME` and no manager's own reads tell it.
    #[arg(long, value_name = "FILE")]
    passwd: Option<PathBuf>,
    /// Trace files; `-` reads standard input.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
}

#[derive(Args)]
struct ExposureArgs {
    /// This user's home and the system's paths, readable as this user (a name or uid, from
    /// /etc/passwd and /etc/group), and what it can read in the other homes of /etc/passwd
    /// [default: the user running credwatch, its $HOME]
    #[arg(long, value_name = "NAME", conflicts_with = "home")]
    user: Option<String>,
    /// Only this directory, taken as a home (no system paths), readable as the user running
    /// credwatch.
    #[arg(long, value_name = "DIR")]
    home: Option<PathBuf>,
    /// JSON instead of Markdown.
    #[arg(long)]
    json: bool,
    /// A folder of rule files that add to or override the default rules (same id overrides).
    #[arg(long, value_name = "DIR")]
    rules: Option<PathBuf>,
    /// The users' accounts and homes.
    #[arg(long, value_name = "FILE", default_value = "/etc/passwd")]
    passwd: PathBuf,
    /// The groups `--user` is a member of.
    #[arg(long, value_name = "FILE", default_value = "/etc/group")]
    group: PathBuf,
    /// List the doors (agent and daemon sockets) without connecting to them; by default each is
    /// asked what it holds (an ssh-agent's key count, gpg-agent's keys and unlocked ones, whether
    /// a container engine answers, a Secret Service on the session bus), never for a secret.
    #[arg(long)]
    no_probe: bool,
}

#[derive(Subcommand)]
enum FleetCommand {
    /// Per package and version, from the fleet's alerts (the NATS stream with `--from`, else
    /// alert files): the hosts, containers, pods and CI jobs where it ran, first and last seen,
    /// the credential files and commands, and what to rotate where. Alerts delivered more than
    /// once count once (by `event.id`).
    ///
    /// Exit status: 0 when every alert was read (or skipped with `--keep-going`), 1 otherwise.
    Report(FleetReportArgs),
}

#[derive(Args)]
struct FleetReportArgs {
    /// Read the NATS JetStream the `nats:` output publishes to: `nats://HOST:PORT/PREFIX` (or
    /// `tls://`), what follows `nats:` in its `--to`. Every subject `PREFIX.>` is read.
    #[arg(
        long,
        value_name = "URL/PREFIX",
        value_parser = fleet::parse_nats,
        conflicts_with = "files",
        required_unless_present = "files"
    )]
    from: Option<fleet::NatsSource>,
    /// The stream to read (default: the stream that holds `PREFIX.>`).
    #[arg(long, value_name = "NAME", requires = "from", conflicts_with = "files")]
    stream: Option<String>,
    /// NATS: a `.creds` file (JWT and NKey seed).
    #[arg(long, value_name = "FILE", requires = "from", conflicts_with = "files")]
    credentials_file: Option<PathBuf>,
    /// NATS: trust only the CA certificates of this PEM file (and use TLS).
    #[arg(long, value_name = "FILE", requires = "from", conflicts_with = "files")]
    ca_file: Option<PathBuf>,
    /// Only this package (`NAME`, or `NAME@VERSION`; `@scope/name@1.0.0`).
    #[arg(long, value_name = "NAME[@VERSION]")]
    package: Option<credwatch_core::fleet::PackageFilter>,
    /// Skip and count alerts that are not (bad lines, bad messages) instead of stopping at
    /// the first one.
    #[arg(long)]
    keep_going: bool,
    /// The report's format (`html`: the incident page, one self-contained file).
    #[arg(long, visible_alias = "format", value_enum, value_name = "FORMAT", default_value = "text")]
    report_format: replay::ReportFormat,
    /// Alert files: JSON lines, as the `file:` output and `--alerts` write them (`.gz`, `.zst`
    /// too); `-` reads standard input.
    #[arg(value_name = "FILE")]
    files: Vec<PathBuf>,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Check a configuration file alone (no environment): every error with its file, line and
    /// key, and the rules it names. Exit status 0 when it is fine.
    Check {
        /// The configuration file.
        file: PathBuf,
    },
    /// Print the configuration in force (the file, `CREDWATCH_*` variables, defaults) as a
    /// configuration file.
    Show {
        /// The configuration file.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
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
    // One malloc arena: each thread that parses BTF or loads programs at start-up would leave an
    // arena of its own behind, whose free pages `malloc_trim` (after start-up) cannot all return;
    // with one arena the trim takes the idle heap from 22.5 to 15.9 MB. The threads that live
    // on allocate little.
    // SAFETY: mallopt takes any parameter and value; it returns 0 for one it refuses.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    let cli = Cli::parse();
    // The live modes set the log up as their configuration says.
    if !matches!(cli.command, Commands::Watch(_) | Commands::Run(_) | Commands::Record(_) | Commands::Stop(_)) {
        log::init(LogFormat::default(), LogLevel::default());
    }
    // Commands whose output is for a reader (a pipe to `head`, a pager) rather than a live mode's.
    let for_a_reader = matches!(
        cli.command,
        Commands::Alerts(_)
            | Commands::Show(_)
            | Commands::Replay(_)
            | Commands::Rules(_)
            | Commands::Fleet(_)
            | Commands::Exposure(_)
            | Commands::Config(_)
    );
    let result = match cli.command {
        Commands::Watch(args) => {
            let mut flags = flags(&args.common, &args.outputs, &args.enforce, &args.output, None, None);
            args.pin.add_to(&mut flags);
            args.metrics.add_to(&mut flags);
            args.local.add_to(&mut flags);
            configure(&args.config, flags).and_then(|(config, layers)| live::watch_machine(&config, layers, true))
        }
        Commands::Run(args) => {
            let mut flags = flags(&args.common, &args.outputs, &args.enforce, &args.alerts, args.linger, None);
            args.metrics.add_to(&mut flags);
            if args.contain {
                flags.insert("contain".into(), Value::Bool(true));
            }
            if let Some(writes) = args.contain_writes {
                let how = match writes {
                    ContainWrites::ReadOnly => "read-only",
                    ContainWrites::Overlay => "overlay",
                };
                flags.insert("contain_writes".into(), Value::from(how));
            }
            if args.keep {
                flags.insert("contain_keep".into(), Value::Bool(true));
            }
            if let Some(ContainNet::Registries) = args.contain_net {
                flags.insert("contain_net".into(), Value::from("registries"));
            }
            configure(&args.config, flags).and_then(|(config, _)| {
                linger(config.linger)
                    .and_then(|linger| live::run_command(&config, &args.command, linger, args.selftest))
            })
        }
        Commands::Record(args) => {
            let mut flags =
                flags(&args.common, &args.outputs, &args.enforce, &args.alerts, args.linger, args.output.as_ref());
            args.pin.add_to(&mut flags);
            args.metrics.add_to(&mut flags);
            configure(&args.config, flags).and_then(|(config, layers)| {
                if config.trace.is_none() {
                    anyhow::bail!("record needs a trace file: -o FILE, or `trace` in the configuration");
                }
                if args.command.is_empty() {
                    live::watch_machine(&config, layers, false)
                } else {
                    linger(config.linger).and_then(|linger| live::run_command(&config, &args.command, linger, false))
                }
            })
        }
        Commands::Stop(args) => {
            let mut flags = Map::new();
            args.pin.add_to(&mut flags);
            configure(&args.config, flags).and_then(|(config, _)| stop(config.pin_dir()))
        }
        Commands::Replay(args) => replay_options(&args).and_then(|engine| {
            replay::replay(
                &args.files,
                &replay::ReplayOptions {
                    json: args.common.json,
                    rules: args.common.rules.as_deref(),
                    keep_going: args.keep_going,
                    alerts_file: args.alerts.as_deref(),
                    report: args.report.then_some(args.report_format),
                    from: args.from,
                    import: credwatch_core::import::ImportOptions { date: args.date },
                    engine,
                    outputs: args.outputs.to.iter().cloned().map(OutputConfig::to).collect(),
                    spool_dir: args.outputs.spool_dir.clone(),
                },
            )
        }),
        Commands::Doctor => {
            print!("{}", sensor::doctor());
            Ok(ExitCode::SUCCESS)
        }
        Commands::Exposure(args) => exposure(&args),
        Commands::Rules(RulesCommand::Check { dir }) => rules_check(&dir),
        Commands::Rules(RulesCommand::List { rules }) => rules_list(rules.as_deref()),
        Commands::Fleet(FleetCommand::Report(args)) => fleet::report(&fleet::FleetOptions {
            nats: credwatch_outputs::nats::NatsOptions {
                credentials_file: args.credentials_file,
                ca_file: args.ca_file,
                ..Default::default()
            },
            from: args.from,
            stream: args.stream,
            files: args.files,
            keep_going: args.keep_going,
            package: args.package,
            format: args.report_format,
        }),
        Commands::Config(ConfigCommand::Check { file }) => config_check(&file),
        Commands::Config(ConfigCommand::Show { config }) => config_show(config),
        Commands::Alerts(args) => local::commands::alerts(&args),
        Commands::Show(args) => local::commands::show(&args),
        Commands::Selftest(args) => selftest::selftest(&selftest::Options {
            which: args.attack,
            agent_only: args.agent,
            socket: args.alerts_socket,
            json: args.json,
        }),
        Commands::Notify(args) => notify::run(&args),
    };
    result.unwrap_or_else(|error| {
        // `credwatch alerts | head`: the reader has what it wanted; nothing went wrong here.
        let reader_left = error.chain().any(|cause| {
            cause.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
        });
        if for_a_reader && reader_left {
            return ExitCode::SUCCESS;
        }
        // Line by line: a configuration's errors are one a line.
        let text: Vec<String> = format!("{error:#}").lines().map(|line| escape(line).into_owned()).collect();
        tracing::error!("{}", text.join("\n"));
        ExitCode::FAILURE
    })
}

/// The keys the command line gives: only flags that were given (a flag left out leaves the
/// file's or the environment's value).
fn flags(
    common: &CommonArgs,
    outputs: &OutputArgs,
    enforce: &EnforceArgs,
    alerts: &Option<PathBuf>,
    linger: Option<f64>,
    trace: Option<&PathBuf>,
) -> Map<String, Value> {
    let path = |path: &PathBuf| Value::String(path.to_string_lossy().into_owned());
    let mut flags = Map::new();
    let mut set = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            flags.insert(key.to_owned(), value);
        }
    };
    set("json", common.json.then_some(Value::Bool(true)));
    set("rules", common.rules.as_ref().map(path));
    set("watch_project", common.watch_project.then_some(Value::Bool(true)));
    set("enforce", enforce.enforce.then_some(Value::Bool(true)));
    set("alerts", alerts.as_ref().map(path));
    set("linger", linger.map(Value::from));
    set("trace", trace.map(path));
    // `--to DEST` is an output with every knob at its default; given, the flags' list replaces
    // the configuration's, as any key does.
    let to = outputs.to.iter().map(|to| serde_json::json!({ "to": to.to_string() })).collect::<Vec<Value>>();
    set("outputs", (!to.is_empty()).then_some(Value::Array(to)));
    set("spool_dir", outputs.spool_dir.as_ref().map(path));
    flags
}

/// The configuration of a live mode from its file, the environment and `flags`, with the
/// layers kept for `SIGHUP`; sets up the log as it says (as by default when it is wrong).
fn configure(args: &ConfigArgs, mut flags: Map<String, Value>) -> Result<(Config, Layers)> {
    if let Some(format) = args.log_format {
        flags.insert("log_format".into(), serde_json::to_value(format)?);
    }
    if let Some(level) = args.log_level {
        flags.insert("log_level".into(), serde_json::to_value(level)?);
    }
    if let Some(sensor) = args.sensor {
        flags.insert("sensor".into(), serde_json::to_value(sensor)?);
    }
    if let Some(level) = args.kernel_log {
        flags.insert("kernel_log".into(), serde_json::to_value(level)?);
    }
    if !args.map_size.is_empty() {
        let mut sizes = MapSizes::default();
        for size in &args.map_size {
            sizes.merge(*size);
        }
        let sizes: Map<String, Value> = sizes.iter().map(|(name, size)| (name.to_owned(), Value::from(size))).collect();
        flags.insert("map_sizes".into(), Value::Object(sizes));
    }
    let layers = Layers::new(args.config.clone(), flags);
    match layers.load() {
        Ok(loaded) => {
            log::init(loaded.config.log_format, loaded.config.log_level);
            credwatch::sensor::kernel_log::set_level(loaded.config.kernel_log.level());
            for warning in &loaded.warnings {
                tracing::warn!("{}", escape(warning));
            }
            Ok((loaded.config, layers))
        }
        Err(error) => {
            log::init(LogFormat::default(), LogLevel::default());
            Err(error.into())
        }
    }
}

/// The engine's options of a replay: `--watch-project`, `--home`, `--passwd`.
fn replay_options(args: &ReplayArgs) -> Result<EngineOptions> {
    let passwd = match &args.passwd {
        Some(path) => credwatch_core::import::passwd::read(path).context("reading --passwd")?,
        None => Default::default(),
    };
    Ok(EngineOptions {
        watch_project: args.common.watch_project,
        home: args.home.clone(),
        passwd,
        ..EngineOptions::default()
    })
}

fn parse_home(text: &str) -> Result<String, String> {
    if text.starts_with('/') {
        Ok(credwatch_core::event::normalize_path(text))
    } else {
        Err(format!("{text:?} is not an absolute path (the home as the traced host saw it)"))
    }
}

fn parse_date(text: &str) -> Result<time::Date, String> {
    time::Date::parse(text, time::macros::format_description!("[year]-[month]-[day]"))
        .map_err(|e| format!("{text:?} is not a date YYYY-MM-DD: {e}"))
}

fn linger(seconds: Option<f64>) -> Result<Option<Duration>> {
    seconds
        .map(|s| Duration::try_from_secs_f64(s).with_context(|| format!("--linger {s}: not a number of seconds")))
        .transpose()
}

fn stop(dir: &Path) -> Result<ExitCode> {
    let shown = dir.display().to_string();
    let shown = escape(&shown);
    match sensor::pins::stop(dir).with_context(|| format!("detaching the kernel programs pinned in {shown}"))? {
        sensor::pins::Stopped::NothingPinned => {
            tracing::info!("nothing is pinned in {shown}: no kernel programs to detach");
        }
        sensor::pins::Stopped::Detached { agent } => {
            if let Some(pid) = agent {
                tracing::info!(pid, "stopped the agent (pid {pid})");
            }
            tracing::info!("detached the kernel programs pinned in {shown}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn config_check(file: &Path) -> Result<ExitCode> {
    let loaded = config::check(file)?;
    let (config, places) = (loaded.config, loaded.places);
    let rules = RuleSet::load(config.rules.as_deref()).with_context(|| {
        let at = places.get("rules").map_or_else(|| file.display().to_string(), ToString::to_string);
        format!("{at}: key `rules`: loading the rules")
    })?;
    let changed = config.changed_keys();
    println!(
        "{}: valid; {} ({} rules in force)",
        escape(&file.display().to_string()),
        if changed.is_empty() { "every key at its default".to_owned() } else { format!("set: {}", changed.join(", ")) },
        rules.rules().len()
    );
    Ok(ExitCode::SUCCESS)
}

fn config_show(file: Option<PathBuf>) -> Result<ExitCode> {
    let loaded = Layers::new(file.clone(), Map::new()).load()?;
    for warning in &loaded.warnings {
        tracing::warn!("{}", escape(warning));
    }
    let from = file.map_or_else(|| "no file".to_owned(), |file| file.display().to_string());
    print!(
        "# credwatch configuration in force: {}, CREDWATCH_* variables, defaults\n{}",
        escape(&from),
        loaded.config.to_yaml()?
    );
    Ok(ExitCode::SUCCESS)
}

fn exposure(args: &ExposureArgs) -> Result<ExitCode> {
    use std::ffi::OsString;

    use credwatch_core::{
        doors::{runtime_dir_of, DoorScope},
        exposure,
        import::passwd,
    };
    let rules = RuleSet::load(args.rules.as_deref()).context("loading rules")?;
    let (passwd_file, group_file) = (args.passwd.display().to_string(), args.group.display().to_string());
    let read = |path: &Path| std::fs::read(path).map(|text| String::from_utf8_lossy(&text).into_owned());
    // SAFETY: geteuid cannot fail.
    let running_uid = unsafe { libc::geteuid() };
    let env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    let env_runtime_dir = std::env::var_os("XDG_RUNTIME_DIR").filter(|dir| !dir.is_empty()).map(PathBuf::from);
    let (who, scope, door_scope) = if let Some(user) = &args.user {
        let text = read(&args.passwd).with_context(|| format!("reading {passwd_file}"))?;
        let accounts = passwd::accounts(&passwd_file, &text)?;
        let account = accounts
            .iter()
            .find(|a| &a.name == user)
            .or_else(|| accounts.iter().find(|a| user.parse() == Ok(a.uid)))
            .with_context(|| format!("no user {} in {passwd_file}", escape(user)))?;
        let mut gids = vec![account.gid];
        let groups = read(&args.group).with_context(|| format!("reading {group_file}"))?;
        gids.extend(passwd::member_of(&group_file, &groups, &account.name)?.into_iter().filter(|g| *g != account.gid));
        let who = exposure::Identity { name: Some(account.name.clone()), uid: account.uid, gids };
        let other_homes = homes(&accounts);
        // Another user's session is not this process's: its doors by their places only.
        let door_scope = DoorScope {
            home: PathBuf::from(&account.home),
            uid: account.uid,
            runtime_dir: runtime_dir_of(account.uid),
            env: if account.uid == running_uid { env } else { Vec::new() },
            system_root: Some(PathBuf::from("/")),
        };
        (
            who,
            exposure::Scope { home: PathBuf::from(&account.home), system_root: Some(PathBuf::from("/")), other_homes },
            door_scope,
        )
    } else {
        let uid = running_uid;
        // Best effort: the name is for the reader, the ids decide, and the homes are extra.
        let accounts =
            read(&args.passwd).ok().and_then(|text| passwd::accounts(&passwd_file, &text).ok()).unwrap_or_default();
        let account = accounts.iter().find(|a| a.uid == uid).cloned();
        let who = exposure::Identity { name: account.as_ref().map(|a| a.name.clone()), uid, gids: own_groups()? };
        let scope = match &args.home {
            Some(dir) => {
                let home = std::fs::canonicalize(dir).with_context(|| format!("--home {}", dir.display()))?;
                anyhow::ensure!(home.is_dir(), "--home {}: not a directory", dir.display());
                exposure::Scope { home, system_root: None, other_homes: Vec::new() }
            }
            None => {
                let home = std::env::var_os("HOME")
                    .map(PathBuf::from)
                    .or_else(|| account.map(|a| PathBuf::from(a.home)))
                    .with_context(|| {
                        format!("no HOME, and the running user is not in {passwd_file}: give --home DIR")
                    })?;
                exposure::Scope { home, system_root: Some(PathBuf::from("/")), other_homes: homes(&accounts) }
            }
        };
        // With --home, no system path: the home's doors, and those this session's variables and
        // XDG_RUNTIME_DIR name.
        let door_scope = DoorScope {
            home: scope.home.clone(),
            uid,
            runtime_dir: match &args.home {
                Some(_) => env_runtime_dir.unwrap_or_default(),
                None => env_runtime_dir.unwrap_or_else(|| runtime_dir_of(uid)),
            },
            env,
            system_root: scope.system_root.clone(),
        };
        (who, scope, door_scope)
    };
    let mut found = exposure::scan(&rules, &who, &scope, exposure::Limits::default(), std::time::SystemTime::now());
    found.add_doors(&rules, &door_scope, !args.no_probe);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&found).context("serialising the exposure")?);
    } else {
        print!("{}", found.to_markdown());
    }
    Ok(ExitCode::SUCCESS)
}

/// The homes of the passwd accounts that are directories (not `/`, which would be the machine);
/// the scan drops repeats and homes inside others.
pub(crate) fn homes(accounts: &[credwatch_core::import::passwd::Account]) -> Vec<PathBuf> {
    accounts.iter().map(|a| PathBuf::from(&a.home)).filter(|home| home != Path::new("/") && home.is_dir()).collect()
}

/// The effective group and the supplementary ones of this process.
pub(crate) fn own_groups() -> Result<Vec<u32>> {
    // SAFETY: getegid cannot fail; getgroups writes at most `len` ids into a buffer of that
    // many, and with 0 only counts them.
    let mut gids = vec![unsafe { libc::getegid() }];
    let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let mut groups = vec![0; usize::try_from(count).context("getgroups")?];
    let written = unsafe { libc::getgroups(count, groups.as_mut_ptr()) };
    groups.truncate(usize::try_from(written).context("getgroups")?);
    for gid in groups {
        if !gids.contains(&gid) {
            gids.push(gid);
        }
    }
    Ok(gids)
}

fn rules_check(dir: &Path) -> Result<ExitCode> {
    let report = samples::check_dir(dir).with_context(|| format!("checking rules in {}", dir.display()))?;
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
    fn watch_project_is_on_every_mode_and_home_on_replay() {
        for mode in [&["watch"][..], &["run", "--", "true"], &["record", "-o", "t.jsonl"], &["replay", "t.jsonl"]] {
            let words = [&["credwatch"][..], &mode[..1], &["--watch-project"], &mode[1..]].concat();
            assert!(Cli::try_parse_from(&words).is_ok(), "{words:?}");
        }
        let cli =
            Cli::try_parse_from(["credwatch", "replay", "--home", "/var/lib/jenkins/", "--passwd", "p", "t"]).unwrap();
        let Commands::Replay(args) = cli.command else { panic!("not replay") };
        assert_eq!(args.home.as_deref(), Some("/var/lib/jenkins"));
        assert!(Cli::try_parse_from(["credwatch", "replay", "--home", "jenkins", "t"]).is_err());
        assert!(Cli::try_parse_from(["credwatch", "run", "--home", "/h", "--", "true"]).is_err());
    }

    #[test]
    fn pin_dir_is_a_key_of_watch_record_and_stop() {
        let cli = Cli::try_parse_from(["credwatch", "stop"]).unwrap();
        let Commands::Stop(args) = cli.command else { panic!("not stop") };
        assert_eq!(args.pin.pin_dir, None);
        let cli = Cli::try_parse_from(["credwatch", "watch", "--pin-dir", "/sys/fs/bpf/x"]).unwrap();
        let Commands::Watch(args) = cli.command else { panic!("not watch") };
        let mut given = Map::new();
        args.pin.add_to(&mut given);
        assert_eq!(Value::Object(given), serde_json::json!({"pin_dir": "/sys/fs/bpf/x"}));
        assert!(Cli::try_parse_from(["credwatch", "record", "-o", "t", "--pin-dir", "/sys/fs/bpf/x"]).is_ok());
        assert!(Cli::try_parse_from(["credwatch", "run", "--pin-dir", "/sys/fs/bpf/x", "--", "true"]).is_err());
        assert_eq!(Config::default().pin_dir(), Path::new(sensor::pins::DEFAULT_PIN_DIR));
    }

    #[test]
    fn only_the_flags_given_are_keys_over_the_configuration() {
        let cli = Cli::try_parse_from(["credwatch", "watch", "--json", "--alerts", "a.jsonl"]).unwrap();
        let Commands::Watch(args) = cli.command else { panic!("not watch") };
        let given = flags(&args.common, &args.outputs, &args.enforce, &args.output, None, None);
        assert_eq!(Value::Object(given), serde_json::json!({"json": true, "alerts": "a.jsonl"}));
        let cli = Cli::try_parse_from(["credwatch", "record", "--linger", "2", "-o", "t.jsonl", "--", "true"]).unwrap();
        let Commands::Record(args) = cli.command else { panic!("not record") };
        let given = flags(&args.common, &args.outputs, &args.enforce, &args.alerts, args.linger, args.output.as_ref());
        assert_eq!(Value::Object(given), serde_json::json!({"linger": 2.0, "trace": "t.jsonl"}));
        assert!(Cli::try_parse_from(["credwatch", "run", "--config", "c.yaml", "--log-format", "json", "--", "true"])
            .is_ok());
    }

    #[test]
    fn to_is_repeatable_on_every_mode_and_checked_at_parse_time() {
        for mode in [&["watch"][..], &["run", "--", "true"], &["record", "-o", "t.jsonl"], &["replay", "t.jsonl"]] {
            let words = [
                &["credwatch"][..],
                &mode[..1],
                &["--to", "file:/tmp/a.jsonl", "--to", "syslog:tcp:127.0.0.1:601", "--spool-dir", "/tmp/s"],
                &mode[1..],
            ]
            .concat();
            assert!(Cli::try_parse_from(&words).is_ok(), "{words:?}");
        }
        let cli =
            Cli::try_parse_from(["credwatch", "watch", "--to", "file:/a", "--to", "nats:nats://h:4222/cw"]).unwrap();
        let Commands::Watch(args) = cli.command else { panic!("not watch") };
        let given = flags(&args.common, &args.outputs, &args.enforce, &args.output, None, None);
        assert_eq!(
            Value::Object(given),
            serde_json::json!({"outputs": [{"to": "file:/a"}, {"to": "nats:nats://h:4222/cw"}]})
        );
        let error = Cli::try_parse_from(["credwatch", "watch", "--to", "syslog:tcp:host"]).err().unwrap().to_string();
        assert!(error.contains("syslog:tcp:host") && error.contains("no port"), "{error}");
    }

    #[test]
    fn fleet_report_reads_nats_or_files_not_both_nor_neither() {
        let parse = |words: &[&str]| Cli::try_parse_from([&["credwatch", "fleet", "report"][..], words].concat());
        let Commands::Fleet(FleetCommand::Report(args)) =
            parse(&["--from", "nats://bus:4222/credwatch.alerts", "--stream", "S"]).unwrap().command
        else {
            panic!("not fleet report")
        };
        let from = args.from.unwrap();
        assert_eq!((from.url.as_str(), from.prefix.as_str()), ("nats://bus:4222", "credwatch.alerts"));
        assert_eq!(args.stream.as_deref(), Some("S"));
        let Commands::Fleet(FleetCommand::Report(args)) =
            parse(&["a.jsonl", "b.jsonl.gz", "--report-format", "md", "--package", "@s/p@1.0.0"]).unwrap().command
        else {
            panic!("not fleet report")
        };
        assert_eq!(args.files, [PathBuf::from("a.jsonl"), PathBuf::from("b.jsonl.gz")]);
        let package = args.package.unwrap();
        assert_eq!((package.name.as_str(), package.version.as_deref()), ("@s/p", Some("1.0.0")));
        assert!(parse(&["--package", "p@", "a.jsonl"]).is_err());
        assert!(parse(&[]).is_err(), "neither");
        assert!(parse(&["--from", "nats://bus:4222/p", "a.jsonl"]).is_err(), "both");
        assert!(parse(&["--stream", "S", "a.jsonl"]).is_err(), "--stream without --from");
        let error = parse(&["--from", "nats://bus:4222"]).err().unwrap().to_string();
        assert!(error.contains("no subject prefix"), "{error}");
        let error = parse(&["--from", "http://bus/p"]).err().unwrap().to_string();
        assert!(error.contains("scheme \"http\""), "{error}");
    }

    #[test]
    fn exposure_takes_a_user_or_a_home_not_both() {
        let cli = Cli::try_parse_from(["credwatch", "exposure", "--home", "/tmp/h", "--json"]).unwrap();
        let Commands::Exposure(args) = cli.command else { panic!("not exposure") };
        assert_eq!((args.home.as_deref(), args.json), (Some(Path::new("/tmp/h")), true));
        assert!(Cli::try_parse_from(["credwatch", "exposure", "--user", "alice"]).is_ok());
        assert!(Cli::try_parse_from(["credwatch", "exposure", "--user", "alice", "--home", "/h"]).is_err());
    }

    #[test]
    fn bails_without_a_command() {
        assert!(Cli::try_parse_from(["credwatch", "run"]).is_err());
    }
}
