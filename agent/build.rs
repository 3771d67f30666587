//! Embeds the two things that make the binary self-contained: the eBPF object built by
//! `cargo xtask build`, and the default rules in `rules/`.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::ExitCode,
};

fn main() -> ExitCode {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let workspace = manifest_dir.parent().expect("agent/ lives in the workspace");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));

    if let Err(message) = embed_ebpf(workspace, &out_dir).and_then(|()| embed_rules(workspace, &out_dir)) {
        eprintln!("error: {message}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Where `cargo xtask build` leaves the kernel programs.
fn ebpf_object(workspace: &Path) -> PathBuf {
    println!("cargo:rerun-if-env-changed=CREDWATCH_EBPF_OBJECT");
    env::var_os("CREDWATCH_EBPF_OBJECT")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target/bpf/bpfel-unknown-none/release/credwatch"))
}

fn embed_ebpf(workspace: &Path, out_dir: &Path) -> Result<(), String> {
    let object = ebpf_object(workspace);
    println!("cargo:rerun-if-changed={}", object.display());
    if !object.is_file() {
        return Err(format!(
            "the eBPF object {} is missing; build everything with `cargo xtask build` \
             (it sets up the eBPF toolchain too), or point CREDWATCH_EBPF_OBJECT at one",
            object.display()
        ));
    }
    fs::copy(&object, out_dir.join("credwatch.bpf.o"))
        .map(drop)
        .map_err(|e| format!("copying {}: {e}", object.display()))
}

/// Writes `default_rules.rs`: `DEFAULT_RULES`, the (file name, text) of every `rules/*.yaml`.
fn embed_rules(workspace: &Path, out_dir: &Path) -> Result<(), String> {
    let rules_dir = workspace.join("rules");
    println!("cargo:rerun-if-changed={}", rules_dir.display());
    let mut files: Vec<PathBuf> = fs::read_dir(&rules_dir)
        .map_err(|e| format!("reading {}: {e}", rules_dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml" || ext == "yml"))
        .collect();
    files.sort();
    let mut source = String::from("pub const DEFAULT_RULES: &[(&str, &str)] = &[\n");
    for path in &files {
        println!("cargo:rerun-if-changed={}", path.display());
        let name = path.file_name().expect("read_dir entries have names").to_string_lossy();
        source.push_str(&format!("    ({:?}, include_str!({:?})),\n", format!("rules/{name}"), path));
    }
    source.push_str("];\n");
    fs::write(out_dir.join("default_rules.rs"), source).map_err(|e| format!("writing default_rules.rs: {e}"))
}
