//! The real path of the script a `#!` exec ran ([`credwatch_core::event::Exec::script`]). By
//! the exec tracepoint the kernel has closed the script's file and holds the interpreter's, and
//! the engine reads no files, so the sensor resolves the given path while the exec is fresh.
//! `npx` runs a bin through a link in its cache: whether that bin is the project's own depends
//! on where the link leads.

use std::{fs, path::Path};

use credwatch_core::rules::manager::basename;

/// The real path of `filename` (as given to execve, relative to `cwd`) when it is a script
/// run through its `#!` line, not the `executable` itself; only when the process `pid` has the
/// agent's root (a path in another root would name another file here).
pub fn for_exec(pid: u32, filename: &str, executable: &str, cwd: &str) -> Option<String> {
    if filename.is_empty() || basename(filename) == basename(executable) {
        return None;
    }
    let given = if filename.starts_with('/') {
        Path::new(filename).to_path_buf()
    } else if cwd.starts_with('/') {
        Path::new(cwd).join(filename)
    } else {
        return None;
    };
    if fs::read_link(format!("/proc/{pid}/root")).ok()? != Path::new("/") {
        return None;
    }
    let real = fs::canonicalize(given).ok()?.into_os_string().into_string().ok()?;
    (real != executable).then_some(real)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn a_linked_script_resolves_to_the_file_the_link_leads_to() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("app");
        let bins = dir.path().join("cache/node_modules/.bin");
        fs::create_dir_all(&project).unwrap();
        fs::create_dir_all(&bins).unwrap();
        fs::write(project.join("cli.js"), "#!/usr/bin/env node\n").unwrap();
        symlink(project.join("cli.js"), bins.join("app-cli")).unwrap();
        let me = std::process::id();
        let cwd = dir.path().to_str().unwrap();
        let real = project.join("cli.js").canonicalize().unwrap();
        let linked = bins.join("app-cli");
        assert_eq!(for_exec(me, linked.to_str().unwrap(), "/usr/bin/node", "/"), real.to_str().map(str::to_owned));
        // Given relative to the working directory.
        assert_eq!(
            for_exec(me, "cache/node_modules/.bin/app-cli", "/usr/bin/node", cwd),
            real.to_str().map(str::to_owned)
        );
        // A binary run as itself, or through a link to it, is no script.
        assert_eq!(for_exec(me, "/usr/bin/node", "/usr/bin/node", "/"), None);
        let node = fs::canonicalize("/proc/self/exe").unwrap();
        symlink(&node, dir.path().join("n")).unwrap();
        assert_eq!(for_exec(me, dir.path().join("n").to_str().unwrap(), node.to_str().unwrap(), "/"), None);
        // Gone, or no process of that pid.
        assert_eq!(for_exec(me, "/nonexistent/x", "/usr/bin/node", "/"), None);
        assert_eq!(for_exec(u32::MAX, linked.to_str().unwrap(), "/usr/bin/node", "/"), None);
    }
}
