//! Embeds the eBPF object built by `cargo xtask build`, which makes the binary self-contained
//! (the default rules come embedded in credwatch-core).

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::ExitCode,
};

fn main() -> ExitCode {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let workspace = manifest_dir.parent().expect("agent/ lives in the workspace");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));

    if let Err(message) = embed_ebpf(workspace, &out_dir) {
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
