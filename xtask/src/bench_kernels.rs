//! Section "kernels": the two sensor backends side by side inside one qemu guest, the 6.12
//! cloud kernel booted with `lsm=bpf` (`cargo xtask kernels --run`): nothing attached, `credwatch
//! watch --sensor tracepoint`, `credwatch watch --sensor fentry`, each under the unmarked
//! open+close and getppid loops of xtask/bench/loop.c, and the open loop marked (`credwatch run
//! --sensor ... -- loop`). Every ratio is between figures of the same guest run: TCG makes the
//! absolute figures many times the host's, not comparable with section 1.

use std::{collections::BTreeMap, env, path::Path, process::Command};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::bench::{fmt, median, say, Ctx, Section};
use crate::bench_syscalls::nan_null;

/// The guest the issue's targets are about.
const KERNEL: &str = "6.12";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Config {
    Nothing,
    Tracepoint,
    Fentry,
}

const CONFIGS: &[Config] = &[Config::Nothing, Config::Tracepoint, Config::Fentry];

impl Config {
    /// As the guest script names it (and `--sensor` for the backends).
    fn name(self) -> &'static str {
        match self {
            Config::Nothing => "nothing",
            Config::Tracepoint => "tracepoint",
            Config::Fentry => "fentry",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Config::Nothing => "(a) nothing attached",
            Config::Tracepoint => "(b) credwatch watch --sensor tracepoint",
            Config::Fentry => "(c) credwatch watch --sensor fentry (fentry + BPF LSM)",
        }
    }
}

/// The loops each configuration runs: unmarked open+close, unmarked getppid, and the open loop
/// marked by `credwatch run` (not for "nothing").
const KINDS: &[&str] = &["open", "getppid", "marked"];

/// The script the guest runs: `rounds` rounds, the configurations' order rotating each round;
/// each measurement is one `RESULT ROUND CONFIG KIND ns_per_op W cpu_ns_per_op C` line.
fn guest_script(looper: &Path, credwatch: &Path, open: u64, getppid: u64, rounds: usize) -> String {
    format!(
        r#"set -eu
loop={looper}
cw={credwatch}
file=/tmp/bench-open-target
echo harmless > $file
say() {{ echo "RESULT $round $config $1 $(tr '\n' ' ')"; }}
start_watch() {{
    "$cw" watch --sensor "$1" --pin-dir "/sys/fs/bpf/bench-$1" > /dev/null 2> /tmp/watch.err &
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
stop_watch() {{ kill -TERM $watch; wait $watch || true; }}
# Warm-up, not measured: TCG translates each code block on its first run.
$loop open {open} $file > /dev/null
$loop getppid {getppid} > /dev/null
configs="nothing tracepoint fentry"
for round in $(seq {rounds}); do
    # Rotate: no configuration always runs first.
    set -- $configs
    configs="$2 $3 $1"
    for config in $configs; do
        if [ $config != nothing ]; then start_watch $config; fi
        $loop open {open} $file | say open
        $loop getppid {getppid} | say getppid
        if [ $config != nothing ]; then
            stop_watch
            "$cw" run --sensor $config -- $loop open {open} $file 2> /dev/null | say marked
        fi
    done
done
"#,
        looper = looper.display(),
        credwatch = credwatch.display(),
    )
}

/// (config, kind) -> the rounds' (wall, CPU) ns per op, from the guest's output.
type Figures = BTreeMap<(String, String), Vec<(f64, f64)>>;

fn parse_results(output: &str) -> Result<Figures> {
    let mut figures = Figures::new();
    for line in output.lines().filter_map(|line| line.trim().strip_prefix("RESULT ")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let value = |key: &str| -> Result<f64> {
            let at = words.iter().position(|w| *w == key).with_context(|| format!("no {key} in `RESULT {line}`"))?;
            let text = words.get(at + 1).with_context(|| format!("no value after {key} in `RESULT {line}`"))?;
            text.parse().with_context(|| format!("{key} {text} in `RESULT {line}`"))
        };
        let [_, config, kind, ..] = words[..] else { bail!("a short result line: `RESULT {line}`") };
        let sample = (value("ns_per_op")?, value("cpu_ns_per_op")?);
        figures.entry((config.to_owned(), kind.to_owned())).or_default().push(sample);
    }
    if figures.is_empty() {
        bail!("the guest printed no RESULT line");
    }
    Ok(figures)
}

pub fn run(ctx: &mut Ctx) -> Result<Section> {
    // TCG runs a syscall some 10-20 times slower than the host: smaller loops than section 1's.
    let (open, getppid) = if ctx.quick { (50_000, 200_000) } else { (200_000, 1_000_000) };
    // Two rounds even with --quick: the noise floor needs a spread.
    let rounds = ctx.rounds(5).max(2);
    let script = guest_script(&ctx.bin.join("loop"), &ctx.credwatch, open, getppid, rounds);
    say(&format!("bench: kernels: {rounds} round(s) in the {KERNEL} guest (lsm=bpf)"));
    let xtask = env::current_exe().context("finding the xtask executable")?;
    let output = Command::new(&xtask)
        .args(["kernels", "--kernel", KERNEL, "--lsm", "--timeout", "3600", "--add"])
        .arg(&ctx.bin)
        .arg("--run")
        .arg(&script)
        .output()
        .context("running `cargo xtask kernels --run` for the guest bench")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "the {KERNEL} guest's bench failed ({}):\n{}\n{}",
            output.status,
            stdout.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let figures = parse_results(&stdout)?;
    let cpu = |config: Config, kind: &str| -> f64 {
        let kind = if config == Config::Nothing && kind == "marked" { "open" } else { kind };
        figures
            .get(&(config.name().to_owned(), kind.to_owned()))
            .map_or(f64::NAN, |rounds| median(&rounds.iter().map(|(_, cpu)| *cpu).collect::<Vec<_>>()))
    };

    let mut section = Section::new(
        "kernels",
        &format!("Backends side by side in the {KERNEL} guest with lsm=bpf (CPU ns per op, median of rounds)"),
        &["configuration", "open+close", "× (a)", "getppid", "× (a)", "marked open+close", "× (b)"],
    );
    let mut json = serde_json::Map::new();
    for config in CONFIGS {
        let (o, g, m) = (cpu(*config, "open"), cpu(*config, "getppid"), cpu(*config, "marked"));
        let (o_a, g_a, m_b) = (
            o / cpu(Config::Nothing, "open"),
            g / cpu(Config::Nothing, "getppid"),
            m / cpu(Config::Tracepoint, "marked"),
        );
        let marked = if *config == Config::Nothing { "(= unmarked)".to_owned() } else { fmt(m, 0) };
        section.rows.push(vec![
            config.label().to_owned(),
            fmt(o, 0),
            fmt(o_a, 3),
            fmt(g, 0),
            fmt(g_a, 3),
            marked,
            fmt(m_b, 3),
        ]);
        let rounds = |kind: &str| -> Value {
            json!(figures.get(&(config.name().to_owned(), kind.to_owned())).cloned().unwrap_or_default())
        };
        json.insert(
            config.name().to_owned(),
            json!({
                "open_close_cpu_ns": nan_null(o), "getppid_cpu_ns": nan_null(g), "marked_open_close_cpu_ns": nan_null(m),
                "open_ratio_to_a": nan_null(o_a), "getppid_ratio_to_a": nan_null(g_a), "marked_ratio_to_b": nan_null(m_b),
                "rounds_wall_cpu_ns": KINDS.iter().map(|k| (k.to_string(), rounds(k))).collect::<serde_json::Map<_, _>>(),
            }),
        );
    }
    // The noise floor: how far apart the rounds of the same loop with nothing attached are.
    let spread = |kind: &str| -> f64 {
        let rounds: Vec<f64> = figures
            .get(&("nothing".to_owned(), kind.to_owned()))
            .map(|r| r.iter().map(|(_, cpu)| *cpu).collect())
            .unwrap_or_default();
        if rounds.len() < 2 {
            // One round has no spread to measure.
            return f64::NAN;
        }
        let (low, high) = rounds.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| (l.min(*v), h.max(*v)));
        (high - low) / median(&rounds)
    };
    let getppid_noise = spread("getppid");
    json.insert("getppid_noise".into(), nan_null(getppid_noise));
    json.insert("sizes".into(), json!({"open": open, "getppid": getppid, "rounds": rounds, "kernel": KERNEL}));
    section.json = Value::Object(json);
    section.notes.push(format!(
        "One boot of Debian's {KERNEL} cloud kernel under qemu TCG (no KVM on these VMs) with lsm=lockdown,capability,yama,bpf; inside it, {rounds} round(s) of: open+close of a file {open} times, getppid {getppid} times, with the configurations' order rotated each round; the marked loop runs under `credwatch run --sensor ...` after the watch stopped. CPU = the loop's own user+system time. TCG emulates every instruction, the eBPF programs' JIT code included: the ratios are the figures to read, not the nanoseconds.",
    ));
    section.notes.push(format!(
        "Noise: the rounds of getppid with nothing attached spread over {:.1}% of their median.",
        getppid_noise * 100.0
    ));

    let finite = |v: f64| v.is_finite().then_some(v);
    let open_ratio = cpu(Config::Fentry, "open") / cpu(Config::Nothing, "open");
    ctx.target(
        "fentry/LSM, unmarked open+close vs nothing (6.12 guest, CPU)",
        format!("{:+.1}%", (open_ratio - 1.0) * 100.0),
        "≤ +2%",
        finite(open_ratio).map(|r| r <= 1.02),
    );
    let getppid_ratio = cpu(Config::Fentry, "getppid") / cpu(Config::Nothing, "getppid");
    ctx.target(
        "fentry/LSM, getppid vs nothing (6.12 guest, CPU)",
        format!("{:+.1}% (noise ±{:.1}%)", (getppid_ratio - 1.0) * 100.0, getppid_noise * 100.0),
        "within the noise",
        finite(getppid_ratio).zip(finite(getppid_noise)).map(|(r, noise)| (r - 1.0).abs() <= noise.max(0.01)),
    );
    let (marked_fentry, marked_tracepoint) = (cpu(Config::Fentry, "marked"), cpu(Config::Tracepoint, "marked"));
    ctx.target(
        "fentry/LSM marked open+close cheaper than the tracepoint backend's (6.12 guest, CPU)",
        format!("{} vs {} ns", fmt(marked_fentry, 0), fmt(marked_tracepoint, 0)),
        "(c) < (b)",
        finite(marked_fentry).zip(finite(marked_tracepoint)).map(|(f, t)| f < t),
    );
    Ok(section)
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
        assert_eq!(figures[&("nothing".into(), "open".into())], [(1200.5, 1190.25), (1300.0, 1290.0)]);
        assert_eq!(figures[&("fentry".into(), "marked".into())], [(2000.0, 1900.0)]);
        assert_eq!(figures.len(), 2);
    }

    #[test]
    fn a_result_line_without_figures_is_an_error_naming_it() {
        let error = parse_results("RESULT 1 nothing open \n").unwrap_err();
        assert!(format!("{error:#}").contains("no ns_per_op in `RESULT 1 nothing open`"), "{error:#}");
        assert!(parse_results("no results\n").is_err());
    }

    #[test]
    fn the_guest_script_runs_every_configuration_and_the_marked_loop_under_each_backend() {
        let script = guest_script(Path::new("/b/loop"), Path::new("/t/credwatch"), 10, 20, 3);
        assert!(script.contains("for round in $(seq 3)"), "{script}");
        assert!(script.contains("configs=\"nothing tracepoint fentry\""), "{script}");
        assert!(script.contains("$loop open 10 $file | say open"), "{script}");
        assert!(script.contains("$loop getppid 20 | say getppid"), "{script}");
        assert!(script.contains("\"$cw\" run --sensor $config -- $loop open 10 $file"), "{script}");
        assert!(script.contains("\"$cw\" watch --sensor \"$1\""), "{script}");
    }
}
