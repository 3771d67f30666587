//! The box's side doors: the sockets through which package code would borrow what the hidden
//! files hold (the docker socket, ssh-agent, gpg-agent, the session bus, the user's systemd
//! manager, X11 and Wayland) and the Kerberos caches, as `credwatch_core::doors` finds them from
//! rules/doors.yaml. Each is covered by an empty file (over a socket or a cache: `connect()` to
//! a regular file fails with ECONNREFUSED) or an empty directory (over a directory of sockets),
//! from the box's staging tmpfs, read-only. The box also leaves the caller's session keyring for
//! a fresh one.

use std::{
    ffi::{CString, OsString},
    path::{Path, PathBuf},
};

use anyhow::Result;
use credwatch_core::{
    doors::{self, Door, DoorScope},
    exposure::display_path,
    import::passwd::Account,
    rules::RuleSet,
};
use tracing::{debug, info, warn};

use super::{c_path, check, count, Failure};

/// Failure steps of the doors: the door's index past this.
const STEP_DOORS: u32 = 1 << 30;
/// Joining a fresh session keyring.
pub(super) const STEP_KEYRING: u32 = STEP_DOORS - 1;

/// The doors found, and what the child binds over each.
pub(super) struct Doors {
    /// Sorted, as the finder gives them.
    found: Vec<Door>,
    /// Each door's path, in the order of `found`.
    targets: Vec<CString>,
    /// Where the search stopped at a limit: doors past it are not shut.
    cut: Vec<String>,
    /// The empty file and directory bound over the doors, in the staging tmpfs.
    empty_file: CString,
    empty_dir: CString,
}

impl Doors {
    /// The doors of the user whose `home` and environment `env` are given and, for root, those
    /// of every other account with a home or a runtime directory: root's package code can
    /// connect to any user's agent (ssh-agent lets root in).
    pub(super) fn prepare(
        rules: &RuleSet,
        staging: &Path,
        home: &Path,
        uid: u32,
        env: &[(OsString, OsString)],
        accounts: &[Account],
    ) -> Result<Doors> {
        let scope = |home: &Path, uid: u32, runtime_dir: PathBuf, env: Vec<(OsString, OsString)>| DoorScope {
            home: home.to_owned(),
            uid,
            runtime_dir,
            env,
            system_root: Some(PathBuf::from("/")),
        };
        let runtime_dir = (env.iter())
            .find(|(name, value)| name == "XDG_RUNTIME_DIR" && !value.is_empty())
            .map_or_else(|| doors::runtime_dir_of(uid), |(_, value)| PathBuf::from(value));
        let mut scopes = vec![scope(home, uid, runtime_dir, env.to_vec())];
        if uid == 0 {
            let others = accounts.iter().filter(|account| account.uid != uid).filter(|account| {
                doors::runtime_dir_of(account.uid).is_dir()
                    || (account.home != "/" && Path::new(&account.home).is_dir())
            });
            scopes.extend(others.map(|account| {
                scope(Path::new(&account.home), account.uid, doors::runtime_dir_of(account.uid), Vec::new())
            }));
        }
        let (mut found, mut cut) = (Vec::new(), Vec::new());
        for scope in &scopes {
            let search = doors::search(rules, scope);
            found.extend(search.doors);
            cut.extend(search.cut);
        }
        // One per path, and none inside a directory door: it would not exist in the empty one.
        let found = doors::tidy(found);
        let targets = found.iter().map(|door| c_path(&door.path)).collect::<Result<_>>()?;
        Ok(Doors {
            found,
            targets,
            cut,
            empty_file: c_path(&staging.join("door"))?,
            empty_dir: c_path(&staging.join("directory"))?,
        })
    }

    /// The doors' paths as a connect names them: each resolved path, and under `/var/run`
    /// too for one in `/run` (the same directory by a link on every current distribution).
    pub(super) fn paths(&self) -> impl Iterator<Item = String> + '_ {
        self.found.iter().flat_map(|door| {
            let path = door.path.to_string_lossy().into_owned();
            let alias = path.strip_prefix("/run/").map(|rest| format!("/var/run/{rest}"));
            std::iter::once(path).chain(alias)
        })
    }

    /// The variables of `env` that name a door, to withhold.
    pub(super) fn variables(&self, rules: &RuleSet, env: &[(OsString, OsString)]) -> Vec<String> {
        doors::withheld_variables(rules, env, &self.found)
    }

    /// Says which doors the box shuts: their names; their paths at debug level.
    pub(super) fn say(&self) {
        let mut names: Vec<&str> = Vec::new();
        for door in &self.found {
            if !names.contains(&door.name.as_str()) {
                names.push(&door.name);
            }
        }
        if !self.found.is_empty() {
            info!("contained: shut {} ({})", count(self.found.len(), "door"), names.join(", "));
        }
        for door in &self.found {
            debug!("contained: shutting {} ({})", display_path(&door.path), door.name);
        }
        if !self.cut.is_empty() {
            warn!("contained: the search for doors was cut short ({}); some may not be shut", self.cut.join("; "));
        }
    }

    /// In the child, in the staging tmpfs before it is made read-only: the empty file and
    /// directory. The file's mode lets anyone write, so that `connect()` passes its check of
    /// write permission and fails on the file's type with ECONNREFUSED, as at a socket no one
    /// listens on (not EACCES); the mount is read-only, so no write lands.
    ///
    /// # Safety
    /// Only system calls (async-signal-safe); the staging tmpfs is mounted.
    pub(super) unsafe fn make_empties(&self, step: u32) -> Result<(), Failure> {
        let fd = libc::open(self.empty_file.as_ptr(), libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC, 0o666);
        check(fd, step)?;
        // Past the umask.
        let mode = libc::fchmod(fd, 0o666);
        libc::close(fd);
        check(mode, step)?;
        check(libc::mkdir(self.empty_dir.as_ptr(), 0o555), step)
    }

    /// In the child, after the hidden files: the empty file over each door that is not a
    /// directory, the empty directory over the others. A door gone since it was found is shut
    /// already.
    ///
    /// # Safety
    /// Only system calls (async-signal-safe); the staging tmpfs is mounted, read-only.
    pub(super) unsafe fn shut(&self) -> Result<(), Failure> {
        let null = std::ptr::null::<libc::c_char>();
        for (index, (door, target)) in self.found.iter().zip(&self.targets).enumerate() {
            let source = if door.directory { self.empty_dir.as_ptr() } else { self.empty_file.as_ptr() };
            let bound = check(
                libc::mount(source, target.as_ptr(), null, libc::MS_BIND, null.cast()),
                STEP_DOORS + index as u32,
            );
            if let Err(failure) = bound {
                if failure.errno != libc::ENOENT {
                    return Err(failure);
                }
            }
        }
        Ok(())
    }

    /// What a failed step of the doors was, if it was one.
    pub(super) fn explain(&self, step: u32) -> Option<String> {
        if step == STEP_KEYRING {
            return Some("joining a fresh session keyring".to_owned());
        }
        let door = self.found.get(step.checked_sub(STEP_DOORS)? as usize)?;
        Some(format!("shutting {} ({})", display_path(&door.path), door.name))
    }
}

/// In the child: leaves the caller's session keyring for a new, empty one, so that no key of
/// the caller's (a Kerberos ticket, an ecryptfs or a cached passphrase) is in reach by
/// `@s`.
///
/// # Safety
/// A system call alone (async-signal-safe).
pub(super) unsafe fn join_fresh_session_keyring() -> Result<(), Failure> {
    // A null name: a new anonymous keyring.
    let joined = libc::syscall(
        libc::SYS_keyctl,
        libc::KEYCTL_JOIN_SESSION_KEYRING as libc::c_long,
        std::ptr::null::<libc::c_char>(),
    );
    check(if joined < 0 { -1 } else { 0 }, STEP_KEYRING)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_step_names_the_door_or_the_keyring() {
        let door = Door {
            path: PathBuf::from("/run/docker.sock"),
            kind: "docker".into(),
            name: "the docker socket".into(),
            category: "containers".into(),
            directory: false,
            from_variable: None,
            probe: None,
        };
        let doors = Doors {
            targets: vec![CString::new("/run/docker.sock").unwrap()],
            found: vec![door],
            cut: Vec::new(),
            empty_file: CString::new("/staging/door").unwrap(),
            empty_dir: CString::new("/staging/directory").unwrap(),
        };
        assert_eq!(doors.explain(STEP_DOORS).as_deref(), Some("shutting /run/docker.sock (the docker socket)"));
        assert_eq!(doors.explain(STEP_KEYRING).as_deref(), Some("joining a fresh session keyring"));
        // Past the doors, and the hidden files' indexes: not a door's.
        assert_eq!(doors.explain(STEP_DOORS + 1), None);
        assert_eq!(doors.explain(3), None);
    }
}
