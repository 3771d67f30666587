//! The `credwatch` command.

mod live;
mod replay;

use std::{
    io::{self, Write as _},
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};
use credwatch::sensor;
use credwatch_core::{engine::EngineOptions, output::escape, rules::RuleSet, samples};
use live::Outputs;

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
    Stop(PinArgs),
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
    /// Watch the project's own scripts and programs too (`npm run`, `npm test`, `cargo run`,
    /// `cargo test`, ...), which are quiet by default: for CI jobs that run untrusted pull
    /// requests' code.
    #[arg(long)]
    watch_project: bool,
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
    /// Where the kernel side of `watch` (and `record` without CMD) is pinned, on bpffs: the
    /// programs stay attached and recording while no agent runs, and the next one adopts them.
    #[arg(long, value_name = "DIR", default_value = sensor::pins::DEFAULT_PIN_DIR)]
    pin_dir: PathBuf,
}

#[derive(Args)]
struct WatchArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    enforce: EnforceArgs,
    #[command(flatten)]
    pin: PinArgs,
    /// Also append every alert as a JSON line to FILE.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    enforce: EnforceArgs,
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

#[derive(Args)]
struct RecordArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    enforce: EnforceArgs,
    /// Without CMD only.
    #[command(flatten)]
    pin: PinArgs,
    /// The trace file to write.
    #[arg(short = 'o', long, value_name = "FILE")]
    output: PathBuf,
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
    /// The report's format.
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
        Commands::Watch(args) => live::watch_machine(&Outputs {
            json: args.common.json,
            rules: args.common.rules.as_deref(),
            alerts_file: args.output.as_deref(),
            trace: None,
            enforce: args.enforce.enforce,
            watch_project: args.common.watch_project,
            pin_dir: Some(&args.pin.pin_dir),
        }),
        Commands::Run(args) => linger(args.linger).and_then(|linger| {
            let outputs = Outputs {
                json: args.common.json,
                rules: args.common.rules.as_deref(),
                alerts_file: args.alerts.as_deref(),
                trace: None,
                enforce: args.enforce.enforce,
                watch_project: args.common.watch_project,
                pin_dir: None,
            };
            live::run_command(&outputs, &args.command, linger)
        }),
        Commands::Record(args) => linger(args.linger).and_then(|linger| {
            let outputs = Outputs {
                json: args.common.json,
                rules: args.common.rules.as_deref(),
                alerts_file: args.alerts.as_deref(),
                trace: Some(&args.output),
                enforce: args.enforce.enforce,
                watch_project: args.common.watch_project,
                pin_dir: Some(&args.pin.pin_dir),
            };
            if args.command.is_empty() {
                live::watch_machine(&outputs)
            } else {
                live::run_command(&outputs, &args.command, linger)
            }
        }),
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
                },
            )
        }),
        Commands::Stop(args) => stop(&args.pin_dir),
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
            eprintln!("credwatch: nothing is pinned in {shown}: no kernel programs to detach");
        }
        sensor::pins::Stopped::Detached { agent } => {
            if let Some(pid) = agent {
                eprintln!("credwatch: stopped the agent (pid {pid})");
            }
            eprintln!("credwatch: detached the kernel programs pinned in {shown}");
        }
    }
    Ok(ExitCode::SUCCESS)
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
    fn pin_dir_is_on_watch_record_and_stop_with_a_default() {
        let cli = Cli::try_parse_from(["credwatch", "stop"]).unwrap();
        let Commands::Stop(args) = cli.command else { panic!("not stop") };
        assert_eq!(args.pin_dir, Path::new(sensor::pins::DEFAULT_PIN_DIR));
        let cli = Cli::try_parse_from(["credwatch", "watch", "--pin-dir", "/sys/fs/bpf/x"]).unwrap();
        let Commands::Watch(args) = cli.command else { panic!("not watch") };
        assert_eq!(args.pin.pin_dir, Path::new("/sys/fs/bpf/x"));
        assert!(Cli::try_parse_from(["credwatch", "record", "-o", "t", "--pin-dir", "/sys/fs/bpf/x"]).is_ok());
        assert!(Cli::try_parse_from(["credwatch", "run", "--pin-dir", "/sys/fs/bpf/x", "--", "true"]).is_err());
    }

    #[test]
    fn bails_without_a_command() {
        assert!(Cli::try_parse_from(["credwatch", "run"]).is_err());
    }
}
