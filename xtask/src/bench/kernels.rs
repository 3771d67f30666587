//! Section "kernels": the two sensor backends side by side inside one qemu guest, the 6.12
//! cloud kernel booted with `lsm=bpf` (`cargo xtask kernels --run`): nothing attached, `credwatch
//! watch --sensor tracepoint`, `credwatch watch --sensor fentry`, each under the unmarked
//! open+close and getppid loops of xtask/bench/loop.c, and the open loop marked (`credwatch run
//! --sensor ... -- loop`), and the floor of any fentry/fexit hook on the open: an empty fexit
//! program on `__x64_sys_openat` (xtask/bench/floor.c). Every ratio is between figures of the
//! same guest run: TCG makes the absolute figures many times the host's, not comparable with
//! section 1.

use std::{
    collections::BTreeMap,
    env,
    io::{BufRead, BufReader, Read},
    path::Path,
    process::{Command, Stdio},
    thread,
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::syscalls::nan_null;
use super::{fmt, median, say, Ctx, Section};

/// The guest the issue's targets are about.
const KERNEL: &str = "6.12";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Config {
    Nothing,
    /// Nothing attached again, measured at its own place in the rotation: the ratio of the two
    /// "nothing"s of a round is the noise floor the other ratios are read against.
    Again,
    Tracepoint,
    Fentry,
    /// An empty fexit program on `__x64_sys_openat`: what any program on the open costs.
    Floor,
}

const CONFIGS: &[Config] = &[Config::Nothing, Config::Again, Config::Tracepoint, Config::Fentry, Config::Floor];

impl Config {
    /// As the guest script names it (and `--sensor` for the backends).
    fn name(self) -> &'static str {
        match self {
            Config::Nothing => "nothing",
            Config::Again => "again",
            Config::Tracepoint => "tracepoint",
            Config::Fentry => "fentry",
            Config::Floor => "floor",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Config::Nothing => "(a) nothing attached",
            Config::Again => "(a') nothing attached, again (the noise floor)",
            Config::Tracepoint => "(b) credwatch --sensor tracepoint",
            // The LSM hooks attach only under `--enforce`: not here.
            Config::Fentry => "(c) credwatch --sensor fentry",
            Config::Floor => "(d) an empty fexit program on __x64_sys_openat (the floor)",
        }
    }
}

/// The loops: unmarked open+close and getppid under `watch` (or nothing), the open loop marked by
/// `credwatch run`, and, under the fentry backend, marked again with `--kernel-log debug`.
const OPEN: &str = "open";
const GETPPID: &str = "getppid";
const MARKED: &str = "marked";
const MARKED_LOG: &str = "marked-log";

/// The script the guest runs: `rounds` rounds, the configurations' order rotating each round;
/// each measurement is one `RESULT ROUND CONFIG KIND ns_per_op W cpu_ns_per_op C` line.
fn guest_script(looper: &Path, floor: &Path, credwatch: &Path, open: u64, getppid: u64, rounds: usize) -> String {
    format!(
        r#"set -eu
loop={looper}
floor={floor}
cw={credwatch}
file=/tmp/bench-open-target
echo harmless > $file
measure() {{
    kind=$1
    shift
    out=$("$@" 2> /tmp/measure.err) || {{ echo "$kind under $config failed:" >&2; cat /tmp/measure.err >&2; exit 1; }}
    echo "RESULT $round $config $kind $(echo "$out" | tr '\n' ' ')"
}}
start_watch() {{
    pins=/sys/fs/bpf/bench-$1
    "$cw" watch --sensor "$1" --pin-dir $pins > /dev/null 2> /tmp/watch.err &
    watch=$!
    tries=0
    until grep -q watching /tmp/watch.err 2> /dev/null; do
        tries=$((tries + 1))
        if [ $tries -gt 6000 ] || ! kill -0 $watch 2> /dev/null; then
            echo "credwatch watch --sensor $1 did not start:" >&2; cat /tmp/watch.err >&2; exit 1
        fi
        sleep 0.1
    done
}}
# `watch` leaves its programs attached through its pins when it ends: `stop` also detaches them,
# or they would go on costing the configurations measured after this one.
stop_watch() {{
    "$cw" stop --pin-dir $pins > /tmp/stop.err 2>&1 || {{ cat /tmp/stop.err >&2; exit 1; }}
    wait $watch || true
    if [ -e $pins ]; then echo "credwatch stop left $pins" >&2; exit 1; fi
    gone
}}
# The kernel frees an fentry trampoline seconds after its last link closed (RCU tasks grace
# periods, long under TCG): until then every open still pays it, so each credwatch's programs
# must be gone from the syscall functions before the next measurement.
gone() {{
    tries=0
    while grep -q __x64_sys_ /sys/kernel/tracing/enabled_functions; do
        tries=$((tries + 1))
        if [ $tries -gt 600 ]; then echo "fentry trampolines still attached after 60 s" >&2; exit 1; fi
        sleep 0.1
    done
}}
start_floor() {{
    "$floor" fexit:__x64_sys_openat > /tmp/floor.out 2> /tmp/floor.err &
    floor_pid=$!
    tries=0
    until grep -q attached /tmp/floor.out 2> /dev/null; do
        tries=$((tries + 1))
        if [ $tries -gt 600 ] || ! kill -0 $floor_pid 2> /dev/null; then
            echo "the empty fexit program did not attach:" >&2; cat /tmp/floor.err >&2; exit 1
        fi
        sleep 0.1
    done
}}
stop_floor() {{
    kill $floor_pid
    wait $floor_pid || true
    gone
}}
# Warm-up, not measured: TCG translates each code block on its first run.
$loop open {open} $file > /dev/null
$loop getppid {getppid} > /dev/null
configs="nothing again tracepoint fentry floor"
for round in $(seq {rounds}); do
    # Rotate: no configuration always runs first.
    set -- $configs
    configs="$2 $3 $4 $5 $1"
    for config in $configs; do
        case $config in nothing|again) ;; floor) start_floor ;; *) start_watch $config ;; esac
        measure open $loop open {open} $file
        measure getppid $loop getppid {getppid}
        case $config in nothing|again) continue ;; floor) stop_floor; continue ;; esac
        stop_watch
        if [ $config = fentry ] && [ $((round % 2)) = 0 ]; then
            measure marked-log "$cw" run --sensor $config --kernel-log debug -- $loop open {open} $file
            gone
        fi
        measure marked "$cw" run --sensor $config -- $loop open {open} $file
        gone
        if [ $config = fentry ] && [ $((round % 2)) = 1 ]; then
            measure marked-log "$cw" run --sensor $config --kernel-log debug -- $loop open {open} $file
            gone
        fi
    done
done
"#,
        looper = looper.display(),
        floor = floor.display(),
        credwatch = credwatch.display(),
    )
}

/// One measurement, ns per op of the loop; in the `--icount` guest a ns is an instruction.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Sample {
    round: usize,
    /// The guest's clock: every instruction the guest ran meanwhile (the agent's too).
    wall: f64,
    /// The loop's own user+system time: its own instructions, in the kernel included.
    cpu: f64,
}

/// Which figure of a [`Sample`] a ratio is taken on.
type Pick = fn(&Sample) -> f64;
const CPU: Pick = |s| s.cpu;
const WALL: Pick = |s| s.wall;

/// (config, kind) -> the rounds' samples, from the guest's output.
type Figures = BTreeMap<(String, String), Vec<Sample>>;

fn parse_results(output: &str) -> Result<Figures> {
    let mut figures = Figures::new();
    for line in output.lines().filter_map(|line| line.trim().strip_prefix("RESULT ")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let value = |key: &str| -> Result<f64> {
            let at = words.iter().position(|w| *w == key).with_context(|| format!("no {key} in `RESULT {line}`"))?;
            let text = words.get(at + 1).with_context(|| format!("no value after {key} in `RESULT {line}`"))?;
            text.parse().with_context(|| format!("{key} {text} in `RESULT {line}`"))
        };
        let [round, config, kind, ..] = words[..] else { bail!("a short result line: `RESULT {line}`") };
        let round = round.parse().with_context(|| format!("round {round} in `RESULT {line}`"))?;
        let sample = Sample { round, wall: value("ns_per_op")?, cpu: value("cpu_ns_per_op")? };
        figures.entry((config.to_owned(), kind.to_owned())).or_default().push(sample);
    }
    if figures.is_empty() {
        bail!("the guest printed no RESULT line");
    }
    Ok(figures)
}

/// A ratio measured once per round (both figures from the same round), summarised.
#[derive(Clone, Debug, PartialEq)]
struct Ratio {
    per_round: Vec<f64>,
    median: f64,
    low: f64,
    high: f64,
}

impl Ratio {
    fn text(&self) -> String {
        if self.per_round.is_empty() {
            return "n/a".into();
        }
        format!("{} ({}–{})", fmt(self.median, 3), fmt(self.low, 3), fmt(self.high, 3))
    }

    fn json(&self) -> Value {
        json!({"median": nan_null(self.median), "low": nan_null(self.low), "high": nan_null(self.high), "rounds": self.per_round})
    }

    /// How far the furthest round is from 1 (the noise floor, for the A/A ratio).
    fn reach(&self) -> f64 {
        self.per_round.iter().map(|r| (r - 1.0).abs()).fold(f64::NAN, f64::max)
    }
}

/// `top / bottom` of each round that measured both, on the figure `pick` takes.
fn ratio(figures: &Figures, top: (&str, &str), bottom: (&str, &str), pick: Pick) -> Ratio {
    let get = |(config, kind): (&str, &str)| figures.get(&(config.to_owned(), kind.to_owned()));
    let per_round: Vec<f64> = match (get(top), get(bottom)) {
        (Some(tops), Some(bottoms)) => tops
            .iter()
            .filter_map(|t| bottoms.iter().find(|b| b.round == t.round).map(|b| pick(t) / pick(b)))
            .filter(|r| r.is_finite())
            .collect(),
        _ => Vec::new(),
    };
    summarise(per_round)
}

/// What `top` adds to `base` over what `bottom` adds to it, `(top - base) / (bottom - base)`, in
/// each round that measured all three.
fn added_ratio(figures: &Figures, top: (&str, &str), bottom: (&str, &str), base: (&str, &str), pick: Pick) -> Ratio {
    let get = |(config, kind): (&str, &str)| figures.get(&(config.to_owned(), kind.to_owned()));
    let per_round: Vec<f64> = match (get(top), get(bottom), get(base)) {
        (Some(tops), Some(bottoms), Some(bases)) => tops
            .iter()
            .filter_map(|t| {
                let b = bottoms.iter().find(|b| b.round == t.round)?;
                let a = bases.iter().find(|a| a.round == t.round)?;
                Some((pick(t) - pick(a)) / (pick(b) - pick(a)))
            })
            .filter(|r| r.is_finite())
            .collect(),
        _ => Vec::new(),
    };
    summarise(per_round)
}

fn summarise(per_round: Vec<f64>) -> Ratio {
    let (low, high) = per_round.iter().fold((f64::NAN, f64::NAN), |(l, h), v| (l.min(*v), h.max(*v)));
    Ratio { median: median(&per_round), low, high, per_round }
}

pub fn run(ctx: &mut Ctx) -> Result<Section> {
    // TCG runs a syscall some 10-20 times slower than the host: smaller loops than section 1's.
    // Counted in instructions, identical loops repeat to within 0.1%: a few rounds suffice, and
    // each costs mostly the sensor's start-ups (verifying its programs under TCG).
    let (open, getppid) = if ctx.quick { (5_000, 50_000) } else { (20_000, 200_000) };
    // Two rounds even with --quick: the noise floor needs a spread.
    let rounds = ctx.rounds(3).max(2);
    let script = guest_script(&ctx.bin.join("loop"), &ctx.bin.join("floor"), &ctx.credwatch, open, getppid, rounds);
    say(&format!("bench: kernels: {rounds} round(s) in the {KERNEL} guest (lsm=bpf)"));
    let xtask = env::current_exe().context("finding the xtask executable")?;
    let mut guest = Command::new(&xtask)
        .args(["kernels", "--kernel", KERNEL, "--lsm", "--icount", "--timeout", "3600", "--add"])
        .arg(&ctx.bin)
        .arg("--run")
        .arg(&script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running `cargo xtask kernels --run` for the guest bench")?;
    let mut stderr = guest.stderr.take().context("the guest's stderr")?;
    let stderr = thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut stdout = String::new();
    for line in BufReader::new(guest.stdout.take().context("the guest's stdout")?).lines() {
        let line = line.context("reading the guest's output")?;
        if line.trim_start().starts_with("RESULT ") {
            // The figures as they come: a run takes a quarter of an hour.
            say(&format!("bench: kernels: {}", line.trim()));
        }
        stdout += &line;
        stdout.push('\n');
    }
    let status = guest.wait().context("waiting for the guest")?;
    let stderr = stderr.join().unwrap_or_default();
    if !status.success() {
        bail!("the {KERNEL} guest's bench failed ({status}):\n{}\n{}", stdout.trim(), stderr.trim());
    }
    let figures = parse_results(&stdout)?;
    Ok(section(ctx, &figures, open, getppid, rounds))
}

/// The table of one figure (`pick`) for every configuration, and its JSON.
fn table(figures: &Figures, title: &str, pick: Pick) -> (Section, Value) {
    let median_of = |config: Config, kind: &str| -> f64 {
        figures
            .get(&(config.name().to_owned(), kind.to_owned()))
            .map_or(f64::NAN, |samples| median(&samples.iter().map(pick).collect::<Vec<_>>()))
    };
    let nothing = Config::Nothing.name();
    let mut section = Section::new(
        "kernels",
        title,
        &["configuration", "open+close", "× (a)", "getppid", "× (a)", "marked open+close", "× (b)"],
    );
    let mut json = serde_json::Map::new();
    for config in CONFIGS {
        let name = config.name();
        let open_ratio = ratio(figures, (name, OPEN), (nothing, OPEN), pick);
        let getppid_ratio = ratio(figures, (name, GETPPID), (nothing, GETPPID), pick);
        let marked_ratio = ratio(figures, (name, MARKED), (Config::Tracepoint.name(), MARKED), pick);
        let backend = matches!(config, Config::Tracepoint | Config::Fentry);
        section.rows.push(vec![
            config.label().to_owned(),
            fmt(median_of(*config, OPEN), 0),
            if *config == Config::Nothing { "1".into() } else { open_ratio.text() },
            fmt(median_of(*config, GETPPID), 0),
            if *config == Config::Nothing { "1".into() } else { getppid_ratio.text() },
            if backend { fmt(median_of(*config, MARKED), 0) } else { String::new() },
            if backend { marked_ratio.text() } else { String::new() },
        ]);
        json.insert(
            name.to_owned(),
            json!({
                "open_close_ns": nan_null(median_of(*config, OPEN)),
                "getppid_ns": nan_null(median_of(*config, GETPPID)),
                "marked_open_close_ns": nan_null(median_of(*config, MARKED)),
                "marked_kernel_log_debug_open_close_ns": nan_null(median_of(*config, MARKED_LOG)),
                "open_ratio_to_a": open_ratio.json(),
                "getppid_ratio_to_a": getppid_ratio.json(),
                "marked_ratio_to_b": marked_ratio.json(),
            }),
        );
    }
    (section, Value::Object(json))
}

fn section(ctx: &mut Ctx, figures: &Figures, open: u64, getppid: u64, rounds: usize) -> Section {
    let (mut section, cpu_json) = table(
        figures,
        &format!("Backends side by side in the {KERNEL} guest with lsm=bpf (instructions per op: the loop's own CPU time with the guest's clock counting instructions; median of rounds; ratios: median of the rounds' own ratios, lowest–highest)"),
        CPU,
    );
    let (wall, wall_json) = table(
        figures,
        "The same loops by the guest's clock: every instruction the guest ran meanwhile (for the marked loop, the agent's reading of its events too)",
        WALL,
    );
    let (nothing, again, fentry, tracepoint) =
        (Config::Nothing.name(), Config::Again.name(), Config::Fentry.name(), Config::Tracepoint.name());
    let log_ratio = ratio(figures, (fentry, MARKED_LOG), (fentry, MARKED), CPU);
    let noise_open = ratio(figures, (again, OPEN), (nothing, OPEN), CPU);
    let noise_getppid = ratio(figures, (again, GETPPID), (nothing, GETPPID), CPU);
    let samples: serde_json::Map<_, _> = figures
        .iter()
        .map(|((config, kind), samples)| {
            let samples: Vec<Value> =
                samples.iter().map(|s| json!({"round": s.round, "wall_ns": s.wall, "cpu_ns": s.cpu})).collect();
            (format!("{config} {kind}"), json!(samples))
        })
        .collect();
    section.json = json!({
        "cpu": cpu_json,
        "wall": wall_json,
        "noise_open_ratio": noise_open.json(),
        "noise_getppid_ratio": noise_getppid.json(),
        "kernel_log_debug_over_off_marked_fentry": log_ratio.json(),
        "samples": samples,
        "sizes": {"open": open, "getppid": getppid, "rounds": rounds, "kernel": KERNEL},
    });
    section.notes.push(format!(
        "One boot of Debian's {KERNEL} cloud kernel under qemu TCG (no KVM on these VMs) with lsm=lockdown,capability,yama,bpf, one vCPU and `-icount shift=0`: the guest's clock advances 1 ns per instruction executed, so a process's CPU time is the instructions it ran, whatever the machine's other guests and builds take from qemu (identical loops repeat to within 0.1%, where the host's own time spread over ±40% on this shared machine). Inside it, {rounds} round(s) of: open+close of a file {open} times and getppid {getppid} times under each configuration, their order rotated each round. (b) and (c) run these unmarked loops under `credwatch watch --sensor ...` (then `credwatch stop` detaches its pinned programs before the next configuration), then the open loop marked, under `credwatch run --sensor ... -- loop`. Each ratio is taken within a round, then the rounds' ratios are summarised. An instruction count weighs every instruction the same: a trampoline's indirect calls, a helper call through the speculation mitigations or a cache miss cost more than that on hardware, so read these ratios as the work added, not as hardware time.",
    ));
    section.notes.push(format!(
        "Noise floor, (a') over (a), nothing measured twice a round: open+close {}, getppid {}.",
        noise_open.text(),
        noise_getppid.text(),
    ));
    section.notes.push(format!(
        "Kernel log (aya-log): the marked open under the fentry backend with `--kernel-log debug` over the same with it off (the default), back to back in each round (order alternating): {}. At `debug` every log call stays in the programs, and a marked open that goes well reaches their level tests and emits nothing; off, the level is a read-only global set before load and the verifier removes the calls as dead code.",
        log_ratio.text()
    ));
    section.tables.push(wall);

    let open_ratio = ratio(figures, (fentry, OPEN), (nothing, OPEN), CPU);
    ctx.target(
        "fentry/LSM, unmarked open+close vs nothing (6.12 guest, instructions)",
        format!("{:+.2}% (rounds {})", (open_ratio.median - 1.0) * 100.0, open_ratio.text()),
        "≤ +2%",
        finite(open_ratio.median).map(|r| r <= 1.02),
    );
    let floor = Config::Floor.name();
    let early_exit = added_ratio(figures, (fentry, OPEN), (floor, OPEN), (nothing, OPEN), CPU);
    ctx.target(
        "fentry/LSM early exit within 1.25x the empty fexit program: unmarked open+close, (c) - (a) over (d) - (a) (6.12 guest, instructions)",
        format!("× {}", early_exit.text()),
        "≤ 1.25×",
        finite(early_exit.median).map(|r| r <= 1.25),
    );
    section.json["early_exit_over_floor"] = early_exit.json();
    let getppid_ratio = ratio(figures, (fentry, GETPPID), (nothing, GETPPID), CPU);
    within_noise(
        ctx,
        "fentry/LSM, getppid vs nothing (6.12 guest, instructions)",
        &getppid_ratio,
        &noise_getppid,
        "within the noise",
    );
    let marked = ratio(figures, (fentry, MARKED), (tracepoint, MARKED), CPU);
    ctx.target(
        "fentry/LSM marked open+close cheaper than the tracepoint backend's (6.12 guest, instructions)",
        format!("× {}", marked.text()),
        "(c) < (b)",
        finite(marked.median).map(|r| r < 1.0),
    );
    within_noise(
        ctx,
        "kernel log off costs nothing measurable: marked open, `--kernel-log debug` over off (6.12 guest, instructions)",
        &log_ratio,
        &noise_open,
        "debug within the noise of off",
    );
    section
}

/// A figure a verdict can rest on (a configuration that measured nothing gives NaN).
fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// A target that holds when `ratio` is as close to 1 as the A/A ratio `noise` reaches (0.5% at
/// least: a count that repeats exactly would otherwise allow nothing).
fn within_noise(ctx: &mut Ctx, what: &str, ratio: &Ratio, noise: &Ratio, limit: &str) {
    let floor = noise.reach();
    ctx.target(
        what,
        format!(
            "{:+.2}% (rounds {}; noise: (a') vs (a) up to ±{:.2}%)",
            (ratio.median - 1.0) * 100.0,
            ratio.text(),
            floor * 100.0
        ),
        limit,
        finite(ratio.median).zip(finite(floor)).map(|(r, noise)| (r - 1.0).abs() <= noise.max(0.005)),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_guests_result_lines_among_its_other_output() {
        let output = "booting\nRESULT 1 nothing open ns_per_op 1200.50 cpu_ns_per_op 1190.25 \n\
                      credwatch: 10 events\nRESULT 2 nothing open ns_per_op 1300 cpu_ns_per_op 1290\n\
                      RESULT 1 fentry marked ns_per_op 2000 cpu_ns_per_op 1900\n";
        let figures = parse_results(output).unwrap();
        assert_eq!(
            figures[&("nothing".into(), "open".into())],
            [Sample { round: 1, wall: 1200.5, cpu: 1190.25 }, Sample { round: 2, wall: 1300.0, cpu: 1290.0 }]
        );
        assert_eq!(figures[&("fentry".into(), "marked".into())], [Sample { round: 1, wall: 2000.0, cpu: 1900.0 }]);
        assert_eq!(figures.len(), 2);
    }

    #[test]
    fn a_result_line_without_figures_is_an_error_naming_it() {
        let parse = parse_results;
        let error = parse("RESULT 1 nothing open \n").unwrap_err();
        assert!(format!("{error:#}").contains("no ns_per_op in `RESULT 1 nothing open`"), "{error:#}");
        let error = parse("RESULT x nothing open ns_per_op 1 cpu_ns_per_op 1\n").unwrap_err();
        assert!(format!("{error:#}").contains("round x in"), "{error:#}");
        assert!(parse("no results\n").is_err());
    }

    #[test]
    fn ratios_are_taken_within_each_round_then_summarised() {
        let output = "RESULT 1 nothing open ns_per_op 0 cpu_ns_per_op 100\n\
                      RESULT 1 fentry open ns_per_op 0 cpu_ns_per_op 102\n\
                      RESULT 2 nothing open ns_per_op 0 cpu_ns_per_op 200\n\
                      RESULT 2 fentry open ns_per_op 0 cpu_ns_per_op 200\n\
                      RESULT 3 nothing open ns_per_op 0 cpu_ns_per_op 100\n\
                      RESULT 3 fentry open ns_per_op 0 cpu_ns_per_op 99\n\
                      RESULT 4 fentry open ns_per_op 0 cpu_ns_per_op 500\n";
        let figures = parse_results(output).unwrap();
        let r = ratio(&figures, ("fentry", "open"), ("nothing", "open"), CPU);
        // Round 4 has no "nothing" to compare with: left out.
        assert_eq!(r.per_round, [1.02, 1.0, 0.99]);
        assert_eq!((r.median, r.low, r.high), (1.0, 0.99, 1.02));
        assert!((r.reach() - 0.02).abs() < 1e-9);
        assert_eq!(r.text(), "1.000 (0.990–1.020)");
        assert_eq!(ratio(&figures, ("tracepoint", "open"), ("nothing", "open"), CPU).text(), "n/a");
        assert_eq!(ratio(&figures, ("fentry", "open"), ("nothing", "open"), WALL).text(), "n/a");
    }

    #[test]
    fn an_added_ratio_compares_what_two_configurations_add_to_the_base_in_each_round() {
        let output = "RESULT 1 nothing open ns_per_op 0 cpu_ns_per_op 1000\n\
                      RESULT 1 fentry open ns_per_op 0 cpu_ns_per_op 1300\n\
                      RESULT 1 floor open ns_per_op 0 cpu_ns_per_op 1200\n\
                      RESULT 2 nothing open ns_per_op 0 cpu_ns_per_op 2000\n\
                      RESULT 2 fentry open ns_per_op 0 cpu_ns_per_op 2200\n\
                      RESULT 2 floor open ns_per_op 0 cpu_ns_per_op 2200\n\
                      RESULT 3 fentry open ns_per_op 0 cpu_ns_per_op 9000\n";
        let figures = parse_results(output).unwrap();
        let r = added_ratio(&figures, ("fentry", "open"), ("floor", "open"), ("nothing", "open"), CPU);
        // Round 3 has neither base nor floor: left out.
        assert_eq!(r.per_round, [1.5, 1.0]);
        assert_eq!((r.median, r.low, r.high), (1.25, 1.0, 1.5));
    }

    #[test]
    fn the_guest_script_runs_every_configuration_and_the_marked_loops_under_each_backend() {
        let script = guest_script(Path::new("/b/loop"), Path::new("/b/floor"), Path::new("/t/credwatch"), 10, 20, 3);
        assert!(script.contains("for round in $(seq 3)"), "{script}");
        assert!(script.contains("configs=\"nothing again tracepoint fentry floor\""), "{script}");
        assert!(script.contains("configs=\"$2 $3 $4 $5 $1\""), "{script}");
        assert!(script.contains("\"$floor\" fexit:__x64_sys_openat"), "{script}");
        assert!(script.contains("floor) stop_floor; continue"), "{script}");
        assert!(script.contains("measure open $loop open 10 $file"), "{script}");
        assert!(script.contains("measure getppid $loop getppid 20"), "{script}");
        assert!(script.contains("measure marked \"$cw\" run --sensor $config -- $loop open 10 $file"), "{script}");
        assert!(
            script
                .contains("measure marked-log \"$cw\" run --sensor $config --kernel-log debug -- $loop open 10 $file"),
            "{script}"
        );
        assert!(script.contains("\"$cw\" watch --sensor \"$1\""), "{script}");
        // The watch's pinned programs are detached before the next configuration, and gone.
        assert!(script.contains("\"$cw\" stop --pin-dir $pins"), "{script}");
        assert!(script.contains("while grep -q __x64_sys_ /sys/kernel/tracing/enabled_functions"), "{script}");
        assert!(script.contains("echo \"RESULT $round $config $kind $(echo \"$out\" | tr '\\n' ' ')\""), "{script}");
    }
}
