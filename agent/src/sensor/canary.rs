//! Notices detached programs: every [`CANARY_INTERVAL`] the agent forks a canary child, marks
//! it, and lets it make an `openat` and a (failing) `renameat2` and exit. Records of all three
//! (open, rename and exit programs) must come back; when one does not while no record was
//! lost, programs were detached (or the kernel stopped running them) and the sensor reports
//! it. Querying the links would miss a program removed in ways that leave its link (the
//! tracepoint itself disabled); the canary proves records still flow end to end.

use std::{
    io,
    time::{Duration, Instant},
};

use credwatch_core::event::EventData;

/// How often a canary runs: one fork and three syscalls, and the agent woken for its records.
/// The fork of the agent is ~0.7 ms (perf trace), some 40% of an idle agent's CPU, which stays
/// well under the 0.1% target (`cargo xtask bench --only idle`); kept at 5 s although idle:
/// detached programs see nothing, so an idle-looking machine is exactly where a longer
/// interval would hide them longer.
pub const CANARY_INTERVAL: Duration = Duration::from_secs(5);
/// How long a canary's records may take before their absence counts.
pub const CANARY_TIMEOUT: Duration = Duration::from_secs(2);

/// What the canary does, by raw syscalls only (the child of a threaded process may only make
/// async-signal-safe calls). The rename's source does not exist, so it fails harmlessly.
const OPEN_PATH: &std::ffi::CStr = c"/";
const RENAME_FROM: &std::ffi::CStr = c"/nonexistent-credwatch-canary";
const RENAME_TO: &std::ffi::CStr = c"/nonexistent-credwatch-canary-2";

/// A canary in flight.
#[derive(Debug)]
pub struct Canary {
    pub pid: u32,
    started: Instant,
    /// Writing a byte here lets the child go (once it is marked).
    release: libc::c_int,
    open: bool,
    rename: bool,
    exit: bool,
    /// Bulk records lost when it started: a loss since makes a missing record inconclusive.
    lost_at_start: u64,
}

/// How a finished canary went.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Alive,
    /// The programs whose records did not come back.
    Missing(Vec<&'static str>),
    /// Records were lost meanwhile: nothing can be concluded.
    Inconclusive,
}

impl Canary {
    /// Forks the canary; it waits until [`Canary::release`].
    pub fn spawn(lost_now: u64) -> io::Result<Canary> {
        let mut pipe = [0 as libc::c_int; 2];
        // SAFETY: pipe is a valid array of two ints.
        if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the child only calls async-signal-safe functions and _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: raw syscalls on valid, NUL-terminated paths and our own pipe.
            unsafe {
                let mut byte = 0u8;
                libc::close(pipe[1]);
                if libc::read(pipe[0], (&raw mut byte).cast(), 1) == 1 {
                    let fd = libc::openat(libc::AT_FDCWD, OPEN_PATH.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
                    if fd >= 0 {
                        libc::close(fd);
                    }
                    libc::renameat2(libc::AT_FDCWD, RENAME_FROM.as_ptr(), libc::AT_FDCWD, RENAME_TO.as_ptr(), 0);
                }
                libc::_exit(0);
            }
        }
        // SAFETY: closing our copy of the read end.
        unsafe { libc::close(pipe[0]) };
        if pid < 0 {
            let error = io::Error::last_os_error();
            // SAFETY: our write end.
            unsafe { libc::close(pipe[1]) };
            return Err(error);
        }
        Ok(Canary {
            pid: pid as u32,
            started: Instant::now(),
            release: pipe[1],
            open: false,
            rename: false,
            exit: false,
            lost_at_start: lost_now,
        })
    }

    /// Lets the (now marked) child run.
    pub fn release(&mut self) {
        // SAFETY: our write end of the pipe; closed once.
        unsafe {
            libc::write(self.release, [1u8].as_ptr().cast(), 1);
            libc::close(self.release);
        }
        self.release = -1;
        self.started = Instant::now();
    }

    /// Takes note of one of the canary's own events.
    pub fn saw(&mut self, data: &EventData) {
        match data {
            EventData::Open(_) => self.open = true,
            EventData::Rename(_) => self.rename = true,
            EventData::Exit(_) => self.exit = true,
            _ => {}
        }
    }

    /// When its records' absence counts (see [`Canary::verdict`]).
    pub fn timeout_at(&self) -> Instant {
        self.started + CANARY_TIMEOUT
    }

    /// The verdict once all records are in or the time is up; `None` while waiting.
    pub fn verdict(&self, lost_now: u64) -> Option<Verdict> {
        if self.open && self.rename && self.exit {
            return Some(Verdict::Alive);
        }
        if self.started.elapsed() < CANARY_TIMEOUT {
            return None;
        }
        if lost_now != self.lost_at_start {
            return Some(Verdict::Inconclusive);
        }
        let missing = [(self.open, "open"), (self.rename, "rename"), (self.exit, "exit")]
            .into_iter()
            .filter_map(|(seen, name)| (!seen).then_some(name))
            .collect();
        Some(Verdict::Missing(missing))
    }

    /// Reaps the child (it has exited, or is killed now).
    pub fn finish(self) {
        // SAFETY: our own child; a release fd still open is ours.
        unsafe {
            if self.release >= 0 {
                libc::close(self.release);
            }
            libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
            libc::waitpid(self.pid as libc::pid_t, std::ptr::null_mut(), 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use credwatch_core::event::{Exit, Open, Rename};

    fn canary(started: Instant) -> Canary {
        Canary { pid: 0, started, release: -1, open: false, rename: false, exit: false, lost_at_start: 3 }
    }

    #[test]
    fn judges_by_what_came_back() {
        let mut fresh = canary(Instant::now());
        assert_eq!(fresh.verdict(3), None);
        fresh.saw(&EventData::Open(Open::default()));
        fresh.saw(&EventData::Rename(Rename::default()));
        fresh.saw(&EventData::Exit(Exit::default()));
        assert_eq!(fresh.verdict(3), Some(Verdict::Alive));

        let mut old = canary(Instant::now() - CANARY_TIMEOUT);
        old.saw(&EventData::Exit(Exit::default()));
        assert_eq!(old.verdict(3), Some(Verdict::Missing(vec!["open", "rename"])));
        assert_eq!(old.verdict(4), Some(Verdict::Inconclusive));
    }
}
