//! Issue 13, point 4: the kernel programs' own diagnostics reach the agent's log at the level
//! `--kernel-log` names, and not at all by default.

use std::{fs, path::PathBuf};

use credwatch_e2e::{require_root, Sandbox};

/// Directories below the work directory: more than the kernel's `MAX_PATH_COMPONENTS` (64), so
/// that the walk of the opened file's path is cut short.
const DEPTH: usize = 70;

/// A file `DEPTH` directories deep in the sandbox's work directory, relative to it.
fn deep_file(sandbox: &Sandbox) -> String {
    let relative: PathBuf = std::iter::repeat_n("d", DEPTH).collect();
    fs::create_dir_all(sandbox.work().join(&relative)).unwrap();
    let file = relative.join("f");
    fs::write(sandbox.work().join(&file), "x").unwrap();
    file.to_str().unwrap().to_owned()
}

/// The agent's log lines that came from the kernel programs.
fn kernel_lines(stderr: &str) -> Vec<&str> {
    let marks = ["kernel: ", "kernel info: ", "kernel debug: ", "kernel trace: "];
    stderr.lines().filter(|line| marks.iter().any(|mark| line.contains(mark))).collect()
}

#[test]
fn a_walk_cut_short_is_logged_with_kernel_log_warn() {
    require_root();
    let sandbox = Sandbox::new();
    let file = deep_file(&sandbox);
    let run = sandbox.run_with(&sandbox.work(), &["--kernel-log", "warn"], &["cat", &file], &[]);
    assert_eq!(run.status.and_then(|status| status.code()), Some(0), "{}", run.stderr);
    let lines = kernel_lines(&run.stderr);
    assert!(
        lines.iter().any(|line| line.starts_with("credwatch: warning: kernel: credwatch::path: path walk cut short")
            && line.contains("MAX_PATH_COMPONENTS (64)")),
        "no kernel line about the path walk in:\n{}",
        run.stderr
    );
    // Debug lines (a root marked) are below the level asked for.
    assert!(!lines.iter().any(|line| line.contains("kernel debug")), "{}", run.stderr);
}

#[test]
fn the_kernel_log_is_off_by_default() {
    require_root();
    let sandbox = Sandbox::new();
    let file = deep_file(&sandbox);
    let run = sandbox.run_with(&sandbox.work(), &[], &["cat", &file], &[]);
    assert_eq!(run.status.and_then(|status| status.code()), Some(0), "{}", run.stderr);
    assert_eq!(kernel_lines(&run.stderr), Vec::<&str>::new(), "{}", run.stderr);
}
