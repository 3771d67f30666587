//! The box's home, as `credwatch_core::contain::home` plans it: read-only (a recursive bind made
//! read-only with `mount_setattr`, submounts included), or an overlay whose upper directory
//! credwatch makes outside the box and reads after the run; the project and the managers'
//! caches bound through writable, from views of them taken before; as root, the other users'
//! homes read-only too; last, the persistence paths inside those writable places (and, as
//! root, outside every home) read-only.
//!
//! The overlay's changes are listed after the run and dropped, or with `--keep` copied into
//! the real home, persistence paths excepted.

use std::{
    ffi::{CString, OsString},
    fs, io,
    os::unix::fs::{FileTypeExt as _, MetadataExt as _},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use credwatch_core::{
    contain::home::{self, HomePlan, PersistenceRules, Writes},
    exposure::display_path,
    import::passwd::Account,
    rules::RuleSet,
};
use tracing::{debug, info, warn};

use super::{c_path, check, count, Failure};

/// Failure steps of the home: `STEP_HOME | kind << 24 | index`.
const STEP_HOME: u32 = 0xA000_0000;
const KIND_VIEW: u32 = 0;
const KIND_OVERLAY: u32 = 1;
const KIND_READ_ONLY: u32 = 2;
const KIND_WRITABLE: u32 = 3;
const KIND_PERSISTENCE: u32 = 4;

/// First uid of people's accounts (`UID_MIN` of login.defs); below are system accounts, whose
/// "homes" are /bin, /usr/sbin, /var/www.
const FIRST_PERSON_UID: u32 = 1000;
/// `nobody`.
const NOBODY: u32 = 65534;
/// Where the mount points of the writable places' views go while the box is made.
const STAGE_PARENT: &str = "/tmp";
/// Where the overlay's upper directory goes: a disk file system that keeps the xattrs overlayfs
/// needs, not a tmpfs (user xattrs on tmpfs need Linux 6.6), and outside every home.
const OVERLAY_PARENT: &str = "/var/tmp";

/// `mount_setattr(2)`'s argument (linux/mount.h).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}
const MOUNT_ATTR_RDONLY: u64 = 0x1;
/// `AT_RECURSIVE` (linux/fcntl.h): the mount and every mount below it.
const AT_RECURSIVE: libc::c_int = 0x8000;
/// `statvfs`'s `f_flag` bits (linux/statfs.h) and the mount flags they stand for: a remount
/// must repeat them (in a user namespace the kernel refuses one that would drop them).
const KEPT_FLAGS: &[(libc::c_ulong, libc::c_ulong)] = &[
    (2, libc::MS_NOSUID),
    (4, libc::MS_NODEV),
    (8, libc::MS_NOEXEC),
    (1024, libc::MS_NOATIME),
    (2048, libc::MS_NODIRATIME),
    (4096, libc::MS_RELATIME),
];

/// A place bound read-only: its path, as a C string, and the flags a remount repeats.
struct Bound {
    path: PathBuf,
    c_path: CString,
    flags: libc::c_ulong,
}

impl Bound {
    fn new(path: &Path) -> Result<Bound> {
        let c_path = c_path(path)?;
        Ok(Bound { flags: kept_flags(&c_path), c_path, path: path.to_path_buf() })
    }
}

/// The overlay over the home.
struct Overlay {
    /// Holds `upper` and `work`; removed when dropped.
    dir: tempfile::TempDir,
    options: CString,
    keep: bool,
}

pub(super) struct HomeBox {
    plan: HomePlan,
    /// What `--keep` never copies out of the overlay.
    persistence_rules: PersistenceRules,
    root: bool,
    /// The mount points of the writable places' own views while the box is made.
    _stage: tempfile::TempDir,
    home: CString,
    /// The homes made read-only: the user's (unless an overlay) and, as root, the others.
    read_only: Vec<Bound>,
    /// Each writable place, and the mount point of its view.
    writable: Vec<(CString, CString)>,
    persistence: Vec<Bound>,
    /// The kernel has `mount_setattr` (5.12+); else each read-only bind is remounted alone,
    /// with its flags, and submounts stay writable.
    setattr: bool,
    overlay: Option<Overlay>,
}

impl HomeBox {
    /// Plans the box's home of a command run with `env` in this process's working directory,
    /// and creates the managers' missing directories (as the home's owner).
    pub(super) fn prepare(
        rules: &RuleSet,
        env: &[(OsString, OsString)],
        home: &Path,
        root: bool,
        accounts: &[Account],
    ) -> Result<HomeBox> {
        let cwd = std::env::current_dir().context("--contain: the working directory")?;
        let path: Vec<PathBuf> = (env.iter())
            .find(|(name, _)| name == "PATH")
            .map(|(_, value)| std::env::split_paths(value).collect())
            .unwrap_or_default();
        // Root's package code could write any home; people's homes are kept from it.
        let other_homes: Vec<PathBuf> = (accounts.iter())
            .filter(|account| root && account.uid >= FIRST_PERSON_UID && account.uid != NOBODY)
            .map(|account| PathBuf::from(&account.home))
            .filter(|other| other != Path::new("/") && other.is_dir())
            .collect();
        let plan = home::plan(&home::Input {
            rules,
            home,
            cwd: &cwd,
            other_homes: &other_homes,
            system_root: root.then_some(Path::new("/")),
            writes: Writes::ReadOnly,
            path: &path,
        });
        // A daemon's HOME of `/`, or one that does not exist: no home to keep anything out of.
        let has_home = home::is_home(&plan.home);
        if !has_home {
            warn!("contained: the home {} is not a home directory: it stays as it is", display_path(&plan.home));
        }
        create_as_owner(&plan.home, &plan.create)?;
        // Outside every home, whatever TMPDIR says: a view mounted inside the home would be made
        // read-only with it.
        let stage = tempfile::Builder::new()
            .prefix("credwatch-home-")
            .tempdir_in(STAGE_PARENT)
            .with_context(|| format!("--contain: a temp dir in {STAGE_PARENT}"))?;
        let mut writable = Vec::with_capacity(plan.writable.len());
        for (index, place) in plan.writable.iter().enumerate() {
            let view = stage.path().join(index.to_string());
            // A mount point is of its source's kind.
            if place.is_dir() { fs::create_dir(&view) } else { fs::write(&view, "") }
                .with_context(|| format!("--contain: creating {}", view.display()))?;
            writable.push((c_path(place)?, c_path(&view)?));
        }
        let read_only: Vec<Bound> = (has_home.then_some(&plan.home).into_iter())
            .chain(&plan.other_homes)
            .map(|p| Bound::new(p))
            .collect::<Result<_>>()?;
        let persistence: Vec<Bound> = plan.persistence.iter().map(|p| Bound::new(p)).collect::<Result<_>>()?;
        let setattr = has_mount_setattr();
        if !setattr {
            warn!(
                "contained: this kernel has no mount_setattr (Linux 5.12): the home is remounted read-only alone, \
                 and file systems mounted below it stay writable"
            );
        }
        Ok(HomeBox {
            home: c_path(&plan.home)?,
            read_only,
            writable,
            persistence,
            setattr,
            _stage: stage,
            persistence_rules: PersistenceRules::of(rules),
            root,
            overlay: None,
            plan,
        })
    }

    /// `--contain-writes overlay`: the home becomes an overlay over itself whose changes are
    /// listed after the run, and kept (but for persistence paths) with `keep`.
    pub(super) fn use_overlay(&mut self, keep: bool) -> Result<()> {
        anyhow::ensure!(
            self.read_only.first().is_some_and(|bound| bound.path == self.plan.home),
            "--contain-writes overlay: the home {} is not a home directory",
            display_path(&self.plan.home)
        );
        let home = self.plan.home.to_str().filter(|home| !home.contains([',', ':', '\\']));
        let home = home.with_context(|| {
            format!(
                "--contain-writes overlay: the home's path {} holds a comma, a colon or a backslash, which \
                 overlayfs options cannot carry; use --contain-writes read-only",
                display_path(&self.plan.home)
            )
        })?;
        let dir = tempfile::Builder::new()
            .prefix("credwatch-overlay-")
            .tempdir_in(OVERLAY_PARENT)
            .with_context(|| format!("--contain-writes overlay: a temp dir in {OVERLAY_PARENT}"))?;
        for sub in ["upper", "work"] {
            fs::create_dir(dir.path().join(sub)).context("--contain-writes overlay: the upper directory")?;
        }
        let at = dir.path().to_str().context("--contain-writes overlay: the temp dir's path is not UTF-8")?;
        // In a user namespace (not root), overlayfs keeps its marks in user.* xattrs.
        let userxattr = if self.root { "" } else { ",userxattr" };
        let options = format!("lowerdir={home},upperdir={at}/upper,workdir={at}/work{userxattr}");
        self.overlay = Some(Overlay { options: CString::new(options)?, dir, keep });
        self.plan.writes = Writes::Overlay;
        self.read_only.retain(|bound| bound.path != self.plan.home);
        Ok(())
    }

    pub(super) fn say(&self) {
        let how = match self.plan.writes {
            Writes::ReadOnly => "read-only",
            Writes::Overlay => "an overlay, listed after the run,",
        };
        let home = &self.plan.home;
        if !self.read_only.iter().any(|bound| bound.path == *home) && self.overlay.is_none() {
            info!("contained: {} read-only", count(self.plan.persistence.len(), "persistence path"));
            return;
        }
        let project = self.plan.project.as_ref();
        let caches = self.plan.writable.iter().filter(|place| Some(*place) != project).count();
        let project = project.map(|project| format!("the project {} and ", tilde(home, project)));
        info!(
            "contained: the home {} is {how} but for {}the managers' caches ({caches}); {} read-only{}",
            display_path(home),
            project.unwrap_or_default(),
            count(self.plan.persistence.len(), "persistence path"),
            if self.plan.other_homes.is_empty() {
                String::new()
            } else {
                format!(", and {}", count(self.plan.other_homes.len(), "other home"))
            },
        );
        if let Some(overlay) = &self.overlay {
            info!(
                "contained: the box's writes to the home go to {} until the run ends",
                display_path(overlay.dir.path())
            );
        }
        for place in &self.plan.writable {
            debug!("contained: writable: {}", display_path(place));
        }
        for path in &self.plan.persistence {
            debug!("contained: read-only: {}", display_path(path));
        }
        for created in &self.plan.create {
            debug!("contained: created {} (a manager's directory) to be written through", display_path(created));
        }
        if self.plan.truncated {
            warn!("contained: the search for persistence paths was cut short; some may stay writable");
        }
    }

    /// In the child, first of the box's mounts (no allocation): the views of the writable
    /// places, the home read-only or overlaid (and the other homes read-only), the places
    /// bound back through it.
    pub(super) fn fill(&self) -> Result<(), Failure> {
        let null = std::ptr::null::<libc::c_char>();
        let bind = libc::MS_BIND | libc::MS_REC;
        // SAFETY: every pointer is null or a NUL-terminated string that lives as long as `self`,
        // and `read_only`'s struct lives through its call.
        unsafe {
            for (index, (place, view)) in self.writable.iter().enumerate() {
                check(libc::mount(place.as_ptr(), view.as_ptr(), null, bind, null.cast()), step(KIND_VIEW, index))?;
            }
            if let Some(overlay) = &self.overlay {
                let options = overlay.options.as_ptr().cast();
                let mounted = libc::mount(c"credwatch".as_ptr(), self.home.as_ptr(), c"overlay".as_ptr(), 0, options);
                check(mounted, step(KIND_OVERLAY, 0))?;
            }
            for (index, Bound { c_path: area, flags, .. }) in self.read_only.iter().enumerate() {
                check(libc::mount(area.as_ptr(), area.as_ptr(), null, bind, null.cast()), step(KIND_READ_ONLY, index))?;
                check(self.read_only(area, *flags), step(KIND_READ_ONLY, index))?;
            }
            for (index, (place, view)) in self.writable.iter().enumerate() {
                check(libc::mount(view.as_ptr(), place.as_ptr(), null, bind, null.cast()), step(KIND_WRITABLE, index))?;
                check(libc::umount2(view.as_ptr(), libc::MNT_DETACH), step(KIND_WRITABLE, index))?;
            }
        }
        Ok(())
    }

    /// In the child, last of the box's mounts: the persistence paths read-only.
    pub(super) fn seal(&self) -> Result<(), Failure> {
        let null = std::ptr::null::<libc::c_char>();
        // SAFETY: as in `fill`.
        unsafe {
            for (index, Bound { c_path: path, flags, .. }) in self.persistence.iter().enumerate() {
                let bind = libc::MS_BIND | libc::MS_REC;
                check(
                    libc::mount(path.as_ptr(), path.as_ptr(), null, bind, null.cast()),
                    step(KIND_PERSISTENCE, index),
                )?;
                check(self.read_only(path, *flags), step(KIND_PERSISTENCE, index))?;
            }
        }
        Ok(())
    }

    /// Makes the bind at `path` read-only: with every mount below it where the kernel can
    /// (`mount_setattr`), else alone, with its `flags`.
    ///
    /// # Safety
    /// `path` is a NUL-terminated string.
    unsafe fn read_only(&self, path: &CString, flags: libc::c_ulong) -> libc::c_int {
        if self.setattr {
            let attr = MountAttr { attr_set: MOUNT_ATTR_RDONLY, attr_clr: 0, propagation: 0, userns_fd: 0 };
            let size = std::mem::size_of::<MountAttr>();
            return libc::syscall(libc::SYS_mount_setattr, libc::AT_FDCWD, path.as_ptr(), AT_RECURSIVE, &attr, size)
                as libc::c_int;
        }
        let remount = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | flags;
        let null = std::ptr::null::<libc::c_char>();
        libc::mount(null, path.as_ptr(), null, remount, null.cast())
    }

    /// What a failed step of the home was, if it is one.
    pub(super) fn explain(&self, step: u32) -> Option<String> {
        let (kind, index) = (step.checked_sub(STEP_HOME)? >> 24, (step & 0x00FF_FFFF) as usize);
        let place = |index: usize| self.plan.writable.get(index).map(|p| display_path(p)).unwrap_or_default();
        let area = |index: usize| self.read_only.get(index).map(|bound| display_path(&bound.path)).unwrap_or_default();
        Some(match kind {
            KIND_VIEW => format!("taking a view of {} to write through", place(index)),
            KIND_OVERLAY if self.root => {
                format!("mounting the overlay over the home {}", display_path(&self.plan.home))
            }
            KIND_OVERLAY => format!(
                "mounting the overlay over the home {} (an overlay in a user namespace needs Linux 5.11 or later; \
                 or use --contain-writes read-only)",
                display_path(&self.plan.home)
            ),
            KIND_READ_ONLY => format!("making {} read-only", area(index)),
            KIND_WRITABLE => format!("binding {} writable", place(index)),
            KIND_PERSISTENCE => format!(
                "making the persistence path {} read-only",
                self.plan.persistence.get(index).map(|p| display_path(p)).unwrap_or_default()
            ),
            _ => return None,
        })
    }

    /// After CMD's tree has exited: lists what it wrote in the overlay, then drops it or
    /// (`--keep`) copies it into the real home, persistence paths excepted.
    pub(super) fn after_run(&self) -> Result<()> {
        let Some(overlay) = &self.overlay else { return Ok(()) };
        let upper = overlay.dir.path().join("upper");
        let changes = changes(&upper, &self.plan.home).context("reading what the box wrote")?;
        // The overlay's own work directory is left mode 000 by the kernel: open it to removal.
        let _ = fs::set_permissions(
            overlay.dir.path().join("work/work"),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        );
        if changes.is_empty() {
            info!("the box wrote nothing in the home");
            return Ok(());
        }
        let listed: Vec<String> = changes.iter().map(|change| change.describe(&self.plan.home)).collect();
        info!("the box wrote: {}", listed.join(", "));
        if !overlay.keep {
            info!("dropped: what the box wrote in the home (--keep copies it, persistence paths excepted)");
            return Ok(());
        }
        let mut kept = Vec::new();
        for change in &changes {
            let shown = tilde(&self.plan.home, &change.real);
            if self.persistence_rules.matches(&change.real, &self.plan.home, change.is_dir()) {
                warn!("not kept: {shown} (a persistence path)");
                continue;
            }
            change.apply(self.root).with_context(|| format!("keeping {shown}"))?;
            kept.push(change.describe(&self.plan.home));
        }
        if !kept.is_empty() {
            info!("kept: {}", kept.join(", "));
        }
        Ok(())
    }
}

fn step(kind: u32, index: usize) -> u32 {
    STEP_HOME | kind << 24 | (index as u32 & 0x00FF_FFFF)
}

/// Whether the kernel has `mount_setattr(2)`: asked with a bad descriptor, it says EBADF.
fn has_mount_setattr() -> bool {
    // SAFETY: no pointer is dereferenced for a bad descriptor.
    let result = unsafe { libc::syscall(libc::SYS_mount_setattr, -1, std::ptr::null::<libc::c_char>(), 0, 0, 0) };
    !(result < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS))
}

/// The mount flags of the file system at `path` that a remount must repeat.
fn kept_flags(path: &CString) -> libc::c_ulong {
    // SAFETY: statvfs writes into the zeroed struct it is given; `path` is NUL-terminated.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return 0;
    }
    KEPT_FLAGS.iter().filter(|(bit, _)| stat.f_flag & bit != 0).fold(0, |all, (_, flag)| all | flag)
}

/// Creates `dirs` (and their missing parents) under `home`, owned by the home's owner when
/// credwatch runs as root for another user's home.
fn create_as_owner(home: &Path, dirs: &[PathBuf]) -> Result<()> {
    let owner = fs::metadata(home).with_context(|| format!("--contain: the home {}", display_path(home)))?;
    for dir in dirs {
        let missing: Vec<&Path> = dir.ancestors().take_while(|at| *at != home && !at.exists()).collect();
        fs::create_dir_all(dir).with_context(|| format!("--contain: creating {}", display_path(dir)))?;
        for created in missing {
            std::os::unix::fs::lchown(created, Some(owner.uid()), Some(owner.gid()))
                .with_context(|| format!("--contain: giving {} to the home's owner", display_path(created)))?;
        }
    }
    Ok(())
}

/// `~/rel` for a path in `home`, escaped.
fn tilde(home: &Path, path: &Path) -> String {
    match path.strip_prefix(home) {
        Ok(rel) => format!("~/{}", display_path(rel)),
        Err(_) => display_path(path),
    }
}

/// One change the box made in the overlay.
#[derive(Debug)]
struct Change {
    /// Where it is in the real home.
    real: PathBuf,
    /// Where it is in the upper directory.
    upper: PathBuf,
    what: What,
}

#[derive(Debug)]
enum What {
    NewFile { bytes: u64 },
    Changed { lines_before: usize, lines_after: usize, bytes: u64 },
    NewDir,
    NewLink { to: PathBuf },
    Deleted,
}

impl Change {
    fn is_dir(&self) -> bool {
        matches!(self.what, What::NewDir) || (matches!(self.what, What::Deleted) && self.real.is_dir())
    }

    fn describe(&self, home: &Path) -> String {
        let shown = tilde(home, &self.real);
        let what = match &self.what {
            What::NewFile { bytes } => format!("new, {}", count(*bytes as usize, "byte")),
            What::Changed { lines_before, lines_after, bytes } => match lines_after.cmp(lines_before) {
                std::cmp::Ordering::Greater => format!("+{}", count(lines_after - lines_before, "line")),
                std::cmp::Ordering::Less => format!("-{}", count(lines_before - lines_after, "line")),
                std::cmp::Ordering::Equal => format!("changed, {}", count(*bytes as usize, "byte")),
            },
            What::NewDir => "new directory".to_owned(),
            What::NewLink { to } => format!("new link to {}", display_path(to)),
            What::Deleted => "deleted".to_owned(),
        };
        format!("{shown} ({what})")
    }

    /// Does the change in the real home.
    fn apply(&self, root: bool) -> io::Result<()> {
        if let Some(parent) = self.real.parent() {
            fs::create_dir_all(parent)?;
        }
        match &self.what {
            What::NewFile { .. } | What::Changed { .. } => {
                fs::copy(&self.upper, &self.real)?;
            }
            What::NewDir => {
                fs::create_dir_all(&self.real)?;
                fs::set_permissions(&self.real, fs::metadata(&self.upper)?.permissions())?;
            }
            What::NewLink { to } => {
                if fs::symlink_metadata(&self.real).is_ok() {
                    fs::remove_file(&self.real)?;
                }
                std::os::unix::fs::symlink(to, &self.real)?;
            }
            What::Deleted => {
                return match fs::symlink_metadata(&self.real) {
                    Ok(meta) if meta.is_dir() => fs::remove_dir_all(&self.real),
                    Ok(_) => fs::remove_file(&self.real),
                    Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
                    Err(error) => Err(error),
                };
            }
        }
        if root {
            // As the box wrote it: root's writes in another user's home stay root's.
            let meta = fs::symlink_metadata(&self.upper)?;
            std::os::unix::fs::lchown(&self.real, Some(meta.uid()), Some(meta.gid()))?;
        }
        Ok(())
    }
}

/// What the overlay's `upper` directory holds over `home`: new and changed files, new
/// directories (those with nothing new inside: the others show through their files), new
/// links and deletions (overlayfs's whiteouts, character devices 0/0). A file copied up
/// without a change of content (opened for writing, nothing written) is left out.
fn changes(upper: &Path, home: &Path) -> io::Result<Vec<Change>> {
    let mut found = Vec::new();
    let mut stack = vec![upper.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let rel = path.strip_prefix(upper).expect("under upper");
            let real = home.join(rel);
            let meta = entry.metadata()?;
            let kind = meta.file_type();
            let what = if kind.is_char_device() && meta.rdev() == 0 {
                What::Deleted
            } else if kind.is_dir() {
                let empty = fs::read_dir(&path)?.next().is_none();
                stack.push(path.clone());
                if real.is_dir() || !empty {
                    continue;
                }
                What::NewDir
            } else if kind.is_symlink() {
                What::NewLink { to: fs::read_link(&path)? }
            } else if kind.is_file() {
                match fs::read(&real) {
                    Ok(before) => {
                        let after = fs::read(&path)?;
                        if before == after {
                            continue;
                        }
                        let lines = |text: &[u8]| text.iter().filter(|b| **b == b'\n').count();
                        What::Changed { lines_before: lines(&before), lines_after: lines(&after), bytes: meta.len() }
                    }
                    Err(_) => What::NewFile { bytes: meta.len() },
                }
            } else {
                continue;
            };
            found.push(Change { real, upper: path, what });
        }
    }
    found.sort_by(|a, b| a.real.cmp(&b.real));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overlays_changes_are_listed_against_the_real_home() {
        let dir = tempfile::tempdir().unwrap();
        let (home, upper) = (dir.path().join("home"), dir.path().join("upper"));
        fs::create_dir_all(home.join(".config")).unwrap();
        fs::write(home.join(".bashrc"), "a\n").unwrap();
        fs::write(home.join("same"), "x").unwrap();
        fs::create_dir_all(upper.join(".config/systemd/user")).unwrap();
        fs::create_dir_all(upper.join("empty\u{1b}[2J")).unwrap();
        fs::write(upper.join(".bashrc"), "a\nb\n").unwrap();
        fs::write(upper.join("same"), "x").unwrap();
        fs::write(upper.join(".config/systemd/user/evil.service"), "[Unit]\n").unwrap();
        std::os::unix::fs::symlink("/tmp/x", upper.join("link")).unwrap();
        let listed: Vec<String> = changes(&upper, &home).unwrap().iter().map(|c| c.describe(&home)).collect();
        assert_eq!(
            listed,
            [
                "~/.bashrc (+1 line)",
                "~/.config/systemd/user/evil.service (new, 7 bytes)",
                "~/empty\\u{1b}[2J (new directory)",
                "~/link (new link to /tmp/x)",
            ]
        );
    }
}
