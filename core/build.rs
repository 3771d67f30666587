//! Embeds the default rules in `rules/`, so that the engine works with no file around it.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::ExitCode,
};

fn main() -> ExitCode {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let workspace = manifest_dir.parent().expect("core/ lives in the workspace");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));

    if let Err(message) = embed_rules(workspace, &out_dir) {
        eprintln!("error: {message}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
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
