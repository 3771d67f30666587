//! `run --contain`: CMD's tree in a mount namespace of its own where the catalogue's credential
//! files are empty (see `credwatch_core::contain`), entered between fork and exec.
//!
//! The namespaces, and why each:
//! - root: a private mount namespace owned by the machine's user namespace, where an empty
//!   file is bound read-only over each hidden one; then a user namespace (uid 0 mapped to 0, every id) with a
//!   mount namespace of its own. Copied into a less privileged namespace, those mounts are
//!   locked: root in the box cannot unmount, remount or move them, and without
//!   `CAP_SYS_PTRACE` over the machine's namespace it cannot reach around them through
//!   `/proc/<pid>/root` of a process outside.
//! - another user: a user namespace mapping only its own ids, owning the mount namespace; its
//!   code has no capability there after exec, and `/proc/<pid>/root` of its processes outside
//!   is refused for the same reason.
//!
//! The empty file comes from a read-only tmpfs mounted in the box (and detached once bound),
//! so nothing outside can write into it. The same tmpfs gives the empty file and directory
//! bound over the side doors, the agents' and daemons' sockets ([`doors`]).

mod doors;
mod home;

pub mod net;
mod proxy;

use std::{
    collections::BTreeSet,
    ffi::{CString, OsString},
    io,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use credwatch_core::{
    contain::{self, Plan},
    exposure::{display_path, Identity, Limits, Scope},
    import::passwd,
    rules::RuleSet,
};
use tracing::{debug, info, warn};

/// Where the box's steps failed, sent to credwatch before the child gives up (the child may
/// not format or allocate): a step, or the index of a hidden path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    pub step: u32,
    pub errno: i32,
}

/// Steps of [`Containment::enter`] before the hidden paths, whose indexes are theirs.
const STEP_UNSHARE: u32 = u32::MAX - 1;
const STEP_PRIVATE: u32 = u32::MAX - 2;
const STEP_EMPTIES: u32 = u32::MAX - 3;
const STEP_LOCK: u32 = u32::MAX - 4;
/// No failure.
pub const STEP_NONE: u32 = u32::MAX;

/// A copy of a manager's configuration in the box's tmpfs: its path there, and its bytes.
type SettingsCopy = (CString, Vec<u8>);

pub struct Containment {
    plan: Plan,
    root: bool,
    uid: u32,
    gid: u32,
    /// `--contain-net`: the network namespace the box joins.
    network: Option<net::Joined>,
    /// Mounted over in the box only, for the empty file; removed when dropped.
    _staging: tempfile::TempDir,
    /// The hidden paths, each with what replaces it: a copy of its settings, else the empty file.
    targets: Vec<(CString, Option<SettingsCopy>)>,
    doors: doors::Doors,
    /// The home: read-only or an overlay, but the project and the managers' caches.
    home: home::HomeBox,
    staging_path: CString,
    empty_file: CString,
}

impl Containment {
    /// Finds what to hide from a command run by this user with `env` (its environment).
    pub fn prepare(rules: &RuleSet, env: &[(OsString, OsString)]) -> Result<Containment> {
        // SAFETY: these calls cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let root = uid == 0;
        let accounts = std::fs::read("/etc/passwd")
            .ok()
            .and_then(|text| passwd::accounts("/etc/passwd", &String::from_utf8_lossy(&text)).ok())
            .unwrap_or_default();
        let home = (env.iter())
            .find(|(name, _)| name == "HOME")
            .map(|(_, value)| PathBuf::from(value))
            .or_else(|| accounts.iter().find(|a| a.uid == uid).map(|a| PathBuf::from(&a.home)))
            .context("--contain: no HOME, and this user is not in /etc/passwd")?;
        // Root's package code could read every home; another user's, what it can read anywhere.
        let scope =
            Scope { home: home.clone(), system_root: Some(PathBuf::from("/")), other_homes: crate::homes(&accounts) };
        let who = Identity { name: None, uid, gids: crate::own_groups()? };
        let mut plan = contain::plan(
            rules,
            &who,
            &scope,
            Limits::default(),
            env.iter().map(|(name, value)| (name.as_os_str(), value.as_os_str())),
        );
        let staging =
            tempfile::Builder::new().prefix("credwatch-contain-").tempdir().context("--contain: a temp dir")?;
        let doors = doors::Doors::prepare(rules, staging.path(), &home, uid, env, &accounts)?;
        let home = home::HomeBox::prepare(rules, env, &home, root, &accounts)?;
        plan.withhold_door_variables(doors.variables(rules, env));
        let mut targets = Vec::with_capacity(plan.hidden.len());
        for (index, hidden) in plan.hidden.iter().enumerate() {
            // Unreadable (gone since the search): the empty file will do.
            let settings = hidden.keep_settings.then(|| std::fs::read(&hidden.path).ok()).flatten();
            let copy = match settings {
                Some(text) => Some((c_path(&staging.path().join(index.to_string()))?, contain::keep_settings(&text))),
                None => None,
            };
            targets.push((c_path(&hidden.path)?, copy));
        }
        Ok(Containment {
            root,
            uid,
            gid,
            network: None,
            targets,
            doors,
            home,
            staging_path: c_path(staging.path())?,
            empty_file: c_path(&staging.path().join("file"))?,
            _staging: staging,
            plan,
        })
    }

    /// `--contain-writes overlay`: the home is an overlay, its changes listed after the run and
    /// dropped, or kept (`keep`) but for persistence paths.
    pub fn overlay_home(&mut self, keep: bool) -> Result<()> {
        self.home.use_overlay(keep)
    }

    /// After CMD's tree has exited: what the box wrote in an overlaid home.
    pub fn after_run(&self) -> Result<()> {
        self.home.after_run()
    }

    /// Whether credwatch runs as root (else the box is a user namespace, and unwatched here).
    pub fn as_root(&self) -> bool {
        self.root
    }

    /// The hidden files and the shut doors, as alerts name them.
    pub fn hidden_paths(&self) -> BTreeSet<String> {
        let files = self.plan.hidden.iter().map(|hidden| hidden.path.to_string_lossy().into_owned());
        files.chain(self.doors.paths()).collect()
    }

    /// The environment variables to remove from the command's.
    pub fn withheld(&self) -> &[String] {
        &self.plan.withheld
    }

    /// Says what the box hides, and which registry credentials are not passed.
    pub fn say(&self, command: &str) {
        info!(
            "contained: {} hidden from {command}'s tree ({}); {} withheld{}",
            count(self.plan.hidden.len(), "credential path"),
            self.plan.categories(),
            count(self.plan.withheld.len(), "environment variable"),
            if self.plan.withheld.is_empty() { String::new() } else { format!(" ({})", self.plan.withheld.join(", ")) },
        );
        for hidden in &self.plan.hidden {
            debug!("contained: hiding {} ({})", display_path(&hidden.path), hidden.rules.join(", "));
        }
        self.doors.say();
        self.home.say();
        if self.plan.walk.truncated {
            warn!("contained: the search for credential files was cut short; some may not be hidden");
        }
        let registry = self.plan.registry_credentials();
        if !registry.is_empty() {
            warn!(
                "contained: not passed to the package manager: {}. Package code runs as the same user as the \
                 manager and can read back whatever the manager can (its files, its environment), so no way \
                 exists to hand it the token alone; an install that needs one fails (401, 403 or 404). \
                 Install from a private registry outside --contain.",
                registry.join(", ")
            );
        }
    }

    /// In the child, between fork and exec: enters the box, with only system calls and no
    /// allocation (async-signal-safe). As root the box is whole after it; another user's needs
    /// its ids mapped by credwatch ([`Containment::map_ids`]) and then [`Containment::fill`]:
    /// files are created in the box's tmpfs only by an id mapped in its user namespace.
    pub fn enter(&self) -> Result<(), Failure> {
        // SAFETY: unshare(2) takes no pointer.
        unsafe {
            doors::join_fresh_session_keyring()?;
            if !self.root {
                return check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS), STEP_UNSHARE);
            }
            check(libc::unshare(libc::CLONE_NEWNS), STEP_UNSHARE)?;
            self.fill()?;
            self.join_network()?;
            check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS), STEP_LOCK)
        }
    }

    /// Whether the child waits for [`Containment::map_ids`] before [`Containment::fill`].
    pub fn maps_first(&self) -> bool {
        !self.root
    }

    /// In the child's mount namespace: the empty file over every hidden path.
    pub fn fill(&self) -> Result<(), Failure> {
        let null = std::ptr::null::<libc::c_char>();
        let sealed = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        let staging = self.staging_path.as_ptr();
        // SAFETY: every pointer is null or a NUL-terminated string that lives as long as `self`.
        unsafe {
            // Nothing mounted in the box shows outside; the machine's mounts still show inside.
            check(libc::mount(null, c"/".as_ptr(), null, libc::MS_REC | libc::MS_SLAVE, null.cast()), STEP_PRIVATE)?;
            self.home.fill()?;
            let options = c"size=4m,mode=0755".as_ptr().cast();
            check(libc::mount(c"credwatch".as_ptr(), staging, c"tmpfs".as_ptr(), sealed, options), STEP_EMPTIES)?;
            let create = libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC;
            let fd = libc::open(self.empty_file.as_ptr(), create, 0o444);
            check(fd, STEP_EMPTIES)?;
            libc::close(fd);
            self.doors.make_empties(STEP_EMPTIES)?;
            for (index, (_, copy)) in self.targets.iter().enumerate() {
                let Some((path, text)) = copy else { continue };
                let fd = libc::open(path.as_ptr(), create, 0o444);
                check(fd, index as u32)?;
                let written = libc::write(fd, text.as_ptr().cast(), text.len());
                libc::close(fd);
                if written != text.len() as isize {
                    return Err(Failure { step: index as u32, errno: libc::EIO });
                }
            }
            // Binds of a read-only mount are read-only. The mount, not the tmpfs: on a read-only
            // file system connect() fails with EROFS before it sees that a door is no socket.
            let read_only = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | sealed;
            check(libc::mount(null, staging, null, read_only, null.cast()), STEP_EMPTIES)?;
            for (index, (target, copy)) in self.targets.iter().enumerate() {
                let source = copy.as_ref().map_or(self.empty_file.as_ptr(), |(path, _)| path.as_ptr());
                check(libc::mount(source, target.as_ptr(), null, libc::MS_BIND, null.cast()), index as u32)?;
            }
            self.doors.shut()?;
            // Last: persistence paths inside writable places, whatever was bound there before.
            self.home.seal()?;
            check(libc::umount2(staging, libc::MNT_DETACH), STEP_EMPTIES)
        }
    }

    /// What a [`Failure`] of the child means.
    pub fn explain(&self, failure: Failure) -> anyhow::Error {
        let error = io::Error::from_raw_os_error(failure.errno);
        let what = match failure.step {
            STEP_UNSHARE if self.root => "creating a mount namespace".to_owned(),
            STEP_UNSHARE => "creating a user namespace (are unprivileged user namespaces allowed? \
                             `sysctl user.max_user_namespaces`, and AppArmor's \
                             `kernel.apparmor_restrict_unprivileged_userns`)"
                .to_owned(),
            STEP_PRIVATE => "making the mounts private".to_owned(),
            STEP_EMPTIES => "mounting the empty file".to_owned(),
            STEP_LOCK => "creating the user namespace that locks the box".to_owned(),
            net::STEP_NET => "joining the box's network namespace (--contain-net)".to_owned(),
            index => match self.plan.hidden.get(index as usize) {
                Some(hidden) => format!("hiding {}", display_path(&hidden.path)),
                None => (self.doors.explain(index))
                    .or_else(|| self.home.explain(index))
                    .unwrap_or_else(|| format!("step {index}")),
            },
        };
        anyhow::Error::from(error).context(format!("--contain: {what}"))
    }

    /// Maps the ids of the child's user namespace, from outside it (only a process of the
    /// parent namespace may map more than its own id).
    pub fn map_ids(&self, pid: u32) -> Result<()> {
        let write = |file: &str, text: &str| {
            std::fs::write(format!("/proc/{pid}/{file}"), text).with_context(|| format!("--contain: writing {file}"))
        };
        if self.root {
            write("uid_map", "0 0 4294967295\n")?;
            write("gid_map", "0 0 4294967295\n")
        } else {
            // An unprivileged map of the group needs setgroups(2) refused first.
            write("setgroups", "deny\n")?;
            write("uid_map", &format!("{0} {0} 1\n", self.uid))?;
            write("gid_map", &format!("{0} {0} 1\n", self.gid))
        }
    }
}

/// `path` for a system call of the box, whose failure names it.
fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).with_context(|| format!("--contain: {}", display_path(path)))
}

/// A system call's result: negative is a failure at `step`, with errno.
fn check(result: libc::c_int, step: u32) -> Result<(), Failure> {
    if result >= 0 {
        Ok(())
    } else {
        Err(Failure { step, errno: io::Error::last_os_error().raw_os_error().unwrap_or(0) })
    }
}

fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
