//! Embeds the eBPF object built by `cargo xtask build`, which makes the binary self-contained
//! (the default rules come embedded in credwatch-core).
//!
//! Without the object (a fresh clone, stable Rust alone) an empty stand-in is embedded, with a
//! warning, so that `cargo check` and `cargo clippy` work; such a binary refuses every command
//! that loads the kernel programs (see `sensor::kernel_object`). `cargo xtask build` sets
//! `CREDWATCH_EBPF_REQUIRED`, which makes a missing object an error: it never ships a stand-in.

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

/// Where `cargo xtask build` leaves the kernel programs without their DWARF (the loader reads
/// BTF; with DWARF the object is 3.4 MB, not 0.5); the unstripped object is beside it.
fn ebpf_object(workspace: &Path) -> PathBuf {
    println!("cargo:rerun-if-env-changed=CREDWATCH_EBPF_OBJECT");
    env::var_os("CREDWATCH_EBPF_OBJECT")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target/bpf/bpfel-unknown-none/release/credwatch.stripped"))
}

fn embed_ebpf(workspace: &Path, out_dir: &Path) -> Result<(), String> {
    let object = ebpf_object(workspace);
    let embedded = out_dir.join("credwatch.bpf.o");
    println!("cargo:rerun-if-changed={}", object.display());
    println!("cargo:rerun-if-env-changed=CREDWATCH_EBPF_REQUIRED");
    if !object.is_file() {
        let how = "build everything with `cargo xtask build` (it sets up the eBPF toolchain too), or point \
                   CREDWATCH_EBPF_OBJECT at one";
        if env::var_os("CREDWATCH_EBPF_REQUIRED").is_some() {
            return Err(format!("the eBPF object {} is missing; {how}", object.display()));
        }
        println!(
            "cargo:warning=the eBPF object {} is missing: this credwatch embeds an empty stand-in and refuses \
             every command that loads the kernel programs; {how}",
            object.display()
        );
        return fs::write(&embedded, []).map_err(|e| format!("writing {}: {e}", embedded.display()));
    }
    fs::copy(&object, &embedded).map(drop).map_err(|e| format!("copying {}: {e}", object.display()))
}
