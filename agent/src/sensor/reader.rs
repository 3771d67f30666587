//! The ring reader: waits on the ring buffers, decodes their records into events in time
//! order, and does what falls due between records (rescans, the canary, the heartbeat, losses).

use std::{
    io::{self, Read as _},
    os::{
        fd::{AsFd, AsRawFd},
        unix::net::UnixStream,
    },
    path::Path,
    time::{Duration, Instant},
};

use credwatch_common::{lost_index, mark_flag, Mark, FAIL_CLOSED_AFTER_NS, MAX_EXEC_RECORD, NO_MANAGER};
use credwatch_core::event::{AgentGap, Event, EventData, Lost};

use super::{
    blind, boot_ns,
    canary::{Canary, Verdict, CANARY_INTERVAL},
    credentials::{DirWatch, MIN_RESCAN_GAP, RESCAN_AFTER_CHANGE},
    lost_source, map_err,
    pins::{Pins, FORK_RECORD},
    project, script, Sensor, SensorError,
};

/// Shortest time between two reads of the bulk ring buffer while records flow. Its fd polls
/// readable whenever it holds a record, so reading it as soon as it is would take the records a
/// few at a time, at a few syscalls each; meanwhile only the priority ring is waited on. At
/// 600k opens/s, 10 ms of records fill a quarter of the 4 MiB ring. Once a read finds the bulk
/// ring empty, both rings are waited on until the next timer: the kernel wakes the agent on
/// the first record after it caught up, so an idle agent sleeps.
pub(super) const BATCH_INTERVAL: Duration = Duration::from_millis(10);

/// The bulk records one drain's first read of the bulk ring takes at most, once it has taken
/// every bulk record older than the priority records it took. Under a flood the ring refills as
/// fast as it is read: a drain that read until it found it empty held the flood's events all at
/// once (a million opens in the bench's `footprint` section: 84 to 390 MB resident at the peak,
/// against 32). The rest waits in the ring for the next drain, which follows at once.
pub(super) const DRAIN_BOUND: usize = 8192;

/// How often the agent writes `HEARTBEAT` (after a drain, and so at least this often while
/// idle): the kernel fails closed under `--enforce` when it is older than
/// `FAIL_CLOSED_AFTER_NS`, 5 of these.
pub(super) const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// Two drains further apart than this on the monotonic clock (a suspend is not a gap): the
/// agent was stopped (SIGSTOP, a freezer, a hung disk, a long swap-in), and says so with an
/// `AgentGap { stopped }` before what waited. The same as the kernel's fail-closed delay, so
/// that every act the kernel refused for want of an agent falls in a reported gap.
pub(super) const STOPPED_GAP: Duration = Duration::from_nanos(FAIL_CLOSED_AFTER_NS);

/// Which ring buffers [`Sensor::wait`] waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rings {
    PriorityOnly,
    Both,
}

/// Why [`Sensor::wait`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wake {
    /// Records are waiting, or the slice passed.
    Ready,
    /// A signal handler ran (on this thread, or wrote to the waker on another).
    Signal,
}

impl Sensor {
    /// Makes [`Sensor::poll`] return when `waker` becomes readable, as it does when a signal
    /// handler runs on its own thread: a signal of the process may run its handler on another
    /// thread (the outputs' runtime), which would leave the poll asleep. The signal handlers
    /// write to the other end (`signal_hook::low_level::pipe`); what they wrote is read here.
    pub fn wake_on(&mut self, waker: UnixStream) -> io::Result<()> {
        waker.set_nonblocking(true)?;
        self.waker = Some(waker);
        Ok(())
    }

    /// From now on a stop of the agent is a gap (see [`STOPPED_GAP`]), as if the rings had just
    /// been read: `watch` says so once it is watching, before its first read, so that an agent
    /// stopped right after start-up still reports the stop.
    pub fn count_stops_from_now(&mut self) {
        self.last_read = Some((Instant::now(), boot_ns()));
    }

    /// Now in the events' clock (their `time_ns`: boot time as wall-clock time).
    pub fn now_ns(&self) -> u64 {
        self.decoder.wall_ns(boot_ns())
    }

    /// Waits up to `timeout` for records and appends their events to `out`, returning as soon
    /// as some arrived or a signal handler ran; appends a `Lost` event when a loss counter grew.
    /// Between records it sleeps until its next timer (a rescan, the canary, the heartbeat) or
    /// `timeout`, whichever comes first.
    pub fn poll(&mut self, timeout: Duration, out: &mut Vec<Event>) -> Result<(), SensorError> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.credentials.as_ref().is_some_and(|(_, next)| Instant::now() >= *next) {
                self.rescan()?;
            }
            let now = Instant::now();
            let mut signalled = false;
            if now < deadline {
                // While bulk records flow, only the priority ring is waited on until the bulk
                // one is due (see BATCH_INTERVAL); after, both, and the bulk ring's fd is
                // readable as soon as a record is in, or wakes us at the first one.
                let (until, rings) = match self.last_drain.map(|last| last + BATCH_INTERVAL) {
                    Some(due) if now < due => (due, Rings::PriorityOnly),
                    _ => (self.next_timer().unwrap_or(deadline), Rings::Both),
                };
                // The caller may be waiting for the signal (SIGCHLD from `run`'s command).
                signalled = self.wait(until.min(deadline).saturating_duration_since(now), rings)? == Wake::Signal;
            }
            let before = out.len();
            let gap_end_ns = self.report_stop(out).max(std::mem::take(&mut self.adopted_gap_end_ns));
            self.drain(out, gap_end_ns);
            self.beat()?;
            self.check_lost(out)?;
            self.tend_canary(out)?;
            if let Some(pins) = &mut self.pins {
                pins.tick([self.stats.lost, self.stats.priority_lost, self.stats.marks_full])?;
            }
            if signalled || out.len() > before || Instant::now() >= deadline {
                return Ok(());
            }
        }
    }

    /// When the sensor has something to do without a record: a rescan, the canary's start or
    /// verdict, the heartbeat.
    fn next_timer(&self) -> Option<Instant> {
        let rescan = self.credentials.as_ref().map(|(_, next)| *next);
        let canary = Some(self.canary.as_ref().map_or(self.next_canary, Canary::timeout_at));
        let heartbeat = self.pins.as_ref().map(Pins::next_heartbeat);
        [rescan, canary, heartbeat, Some(self.next_beat)].into_iter().flatten().min()
    }

    /// An `AgentGap { stopped }` when the last drain is more than [`STOPPED_GAP`] ago on the
    /// monotonic clock (this agent did not run, or did not read): before the records that
    /// waited. Its ends are `CLOCK_BOOTTIME` readings converted now, so a wall clock stepped
    /// meanwhile changes neither its length nor where it lies among the records. Returns its
    /// end.
    fn report_stop(&mut self, out: &mut Vec<Event>) -> u64 {
        let Some((drained, drained_ns)) = self.last_read else { return 0 };
        if drained.elapsed() <= STOPPED_GAP {
            return 0;
        }
        let (since_ns, until_ns) = blind::window(&self.decoder, drained_ns, boot_ns());
        let data = EventData::AgentGap(AgentGap { since_ns, clean_stop: false, stopped: true });
        out.push(Event { time_ns: until_ns, pid: 0, data });
        until_ns
    }

    /// After a drain: `HEARTBEAT` when one is due (one map write), and the drain's time.
    fn beat(&mut self) -> Result<(), SensorError> {
        let now = Instant::now();
        let now_ns = boot_ns();
        self.last_read = Some((now, now_ns));
        if now >= self.next_beat {
            self.heartbeat.set(0, now_ns, 0).map_err(map_err("HEARTBEAT"))?;
            self.next_beat = now + HEARTBEAT_EVERY;
        }
        Ok(())
    }

    /// Reads the priority ring buffer first, then the bulk one, then the priority one again,
    /// and puts what it read in time order: a priority record made before a bulk record just
    /// read (an open before its process's exit) is then in the same batch, before it. A bulk
    /// read cut short at [`DRAIN_BOUND`] (once past the priority records read first) leaves
    /// records in the ring, and the second priority read may take records newer than some of
    /// them (an exec left in the ring, then the new program's open): the bulk ring is then read
    /// again up to the newest priority record, so that the next batch has no bulk record older
    /// than one of this batch. That second read takes at most what the ring held when the
    /// priority ring was read. Nor is a bulk read cut before `gap_end_ns`: the engine holds a
    /// tree's gap alert until the batch that has the gap's records is over, and names the
    /// packages that ran in it.
    fn drain(&mut self, out: &mut Vec<Event>, gap_end_ns: u64) {
        let before = out.len();
        let mut bulk = 0;
        let (mut newest_priority_ns, mut newest_bulk_ns, mut cut) = (gap_end_ns, 0, false);
        let Sensor { events, priority, decoder, stats, credentials, canary, pins, last_scan, .. } = self;
        let mut homes = Vec::new();
        let mut unconfirmed = false;
        {
            let table = credentials.as_ref().map(|(table, _)| table);
            let cred_path = |index: u32| table.and_then(|t| t.path(index)).map(str::to_owned);
            // Priority, bulk, priority, and bulk again after a cut.
            for pass in 0..4 {
                let is_bulk = pass % 2 == 1;
                if pass == 3 && !(cut && newest_priority_ns > newest_bulk_ns) {
                    break;
                }
                // The second bulk read takes the records older than a priority record, however
                // many.
                let bound = if pass == 1 { DRAIN_BOUND } else { 0 };
                let mut taken = 0;
                let ring = if is_bulk { &mut *events } else { &mut *priority };
                if is_bulk {
                    // Set again if this read ends before the ring's end.
                    cut = false;
                }
                while let Some(item) = ring.next() {
                    bulk += usize::from(is_bulk);
                    taken += 1;
                    match decoder.decode(&item, &cred_path) {
                        Ok(mut event) => {
                            let time_ns = event.time_ns;
                            if let Some(canary) = canary.as_mut().filter(|c| c.pid == event.pid) {
                                canary.saw(&event.data);
                                continue;
                            }
                            if let Some(pins) = pins.as_mut() {
                                keep(pins, &item, &event);
                            }
                            if let EventData::Exec(exec) = &mut event.data {
                                homes.extend(exec.env.get("HOME").cloned());
                                exec.project = project::for_exec(&exec.executable, &exec.args, &exec.cwd);
                                exec.script = script::for_exec(event.pid, &exec.filename, &exec.executable, &exec.cwd);
                            }
                            // A hit on an inode the table no longer describes is not that file,
                            // and the table is out of date.
                            if let (EventData::Open(open), Some(table)) = (&mut event.data, table) {
                                unconfirmed |= !table.confirm(open);
                            }
                            stats.events += 1;
                            out.push(event);
                            if !is_bulk {
                                newest_priority_ns = newest_priority_ns.max(time_ns);
                            } else {
                                newest_bulk_ns = newest_bulk_ns.max(time_ns);
                                if bulk_read_done(taken, bound, time_ns, newest_priority_ns) {
                                    cut = true;
                                    break;
                                }
                            }
                        }
                        Err(_) => stats.malformed += 1,
                    }
                }
            }
        }
        out[before..].sort_by_key(|event| event.time_ns);
        // A home first seen now is scanned at the next poll.
        if let Some((table, next)) = credentials {
            if unconfirmed {
                *next = (*next).min((Instant::now() + RESCAN_AFTER_CHANGE).max(*last_scan + MIN_RESCAN_GAP));
            }
            for home in homes {
                if table.add_home(Path::new(&home)) {
                    *next = Instant::now();
                }
            }
        }
        // Cut short, the bulk ring still holds records: the next drain reads them at once.
        self.last_drain = (bulk > 0 && !cut).then(Instant::now);
    }

    /// Sleeps until the programs wake the reader (a record after it caught up, the bulk
    /// watermark), a signal, a change in a watched credential directory, or `slice` passes.
    fn wait(&mut self, slice: Duration, rings: Rings) -> Result<Wake, SensorError> {
        let no_fd = |fd: Option<std::os::fd::BorrowedFd>| fd.map_or(-1, |fd| fd.as_raw_fd());
        // A negative fd is skipped by poll(2).
        let mut fds = [
            libc::pollfd { fd: self.priority.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: no_fd(self.waker.as_ref().map(AsFd::as_fd)), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: no_fd(self.dir_watch.as_ref().map(AsFd::as_fd)), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: self.events.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        let count = if rings == Rings::Both { 4 } else { 3 };
        let timeout = slice.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: fds holds `count` valid pollfds for the duration of the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), count, timeout) };
        if rc < 0 {
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(SensorError::Poll(error));
            }
            self.empty_waker();
            return Ok(Wake::Signal);
        }
        if fds[2].revents != 0 && self.dir_watch.as_mut().is_some_and(DirWatch::changed) {
            if let Some((_, next)) = &mut self.credentials {
                let soon = (Instant::now() + RESCAN_AFTER_CHANGE).max(self.last_scan + MIN_RESCAN_GAP);
                *next = (*next).min(soon);
            }
        }
        if fds[1].revents != 0 {
            self.empty_waker();
            return Ok(Wake::Signal);
        }
        Ok(Wake::Ready)
    }

    /// Reads what the signal handlers wrote: the signal is answered now.
    fn empty_waker(&mut self) {
        let Some(waker) = &mut self.waker else { return };
        let mut bytes = [0u8; 64];
        loop {
            match waker.read(&mut bytes) {
                Ok(0) => {
                    // Its other end closed: it would poll readable for ever.
                    self.waker = None;
                    return;
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    }

    /// Judges the canary in flight, or starts one when it is time.
    fn tend_canary(&mut self, out: &mut Vec<Event>) -> Result<(), SensorError> {
        if let Some(verdict) = self.canary.as_ref().and_then(|canary| canary.verdict(self.stats.lost)) {
            if let Some(canary) = self.canary.take() {
                // The exit program removes the mark, unless it is the one detached. Before the
                // child is reaped: then its pid may be reused, and must not carry the mark.
                let _ = self.marks.remove(&canary.pid);
                canary.finish();
            }
            if let Verdict::Missing(_) = verdict {
                self.stats.detached += 1;
                out.push(Event {
                    time_ns: self.decoder.wall_ns(boot_ns()),
                    pid: 0,
                    data: EventData::Lost(Lost { source: lost_source::DETACHED.to_owned(), count: 1 }),
                });
            }
            self.next_canary = Instant::now() + CANARY_INTERVAL;
            return Ok(());
        }
        if self.canary.is_some() || Instant::now() < self.next_canary {
            return Ok(());
        }
        let Ok(mut canary) = Canary::spawn(self.stats.lost) else {
            // fork fails only transiently (EAGAIN, ENOMEM): the next interval tries again.
            self.next_canary = Instant::now() + CANARY_INTERVAL;
            return Ok(());
        };
        let mark = Mark { root_pid: canary.pid, depth: 0, manager: NO_MANAGER, flags: mark_flag::BY_AGENT };
        if self.marks.insert(canary.pid, mark, 0).is_err() || self.task_marks.mark(canary.pid).is_err() {
            // MARKS full (package code can fill it: that is a blind spot of its own, reported
            // with its tree), or no room for its task storage: the next interval tries again.
            let _ = self.marks.remove(&canary.pid);
            canary.finish();
            self.next_canary = Instant::now() + CANARY_INTERVAL;
            return Ok(());
        }
        canary.release();
        self.canary = Some(canary);
        Ok(())
    }

    fn lost_total(&self, index: u32) -> Result<u64, SensorError> {
        let values = self.lost.get(&index, 0).map_err(map_err("LOST"))?;
        Ok(values.iter().sum())
    }

    /// A `Lost` event per counter of `LOST` that grew, then the blind spots of the trees they
    /// were lost from (see [`blind`]).
    fn check_lost(&mut self, out: &mut Vec<Event>) -> Result<(), SensorError> {
        let mut moved = [0u64; 3];
        for (index, source) in [
            (lost_index::PRIORITY, lost_source::PRIORITY),
            (lost_index::EVENTS, lost_source::EVENTS),
            (lost_index::MARKS_FULL, lost_source::MARKS),
        ] {
            let total = self.lost_total(index)?;
            let seen = match index {
                lost_index::EVENTS => &mut self.stats.lost,
                lost_index::PRIORITY => &mut self.stats.priority_lost,
                _ => &mut self.stats.marks_full,
            };
            if total > *seen {
                out.push(Event {
                    time_ns: self.decoder.wall_ns(boot_ns()),
                    pid: 0,
                    data: EventData::Lost(Lost { source: source.to_owned(), count: total - *seen }),
                });
                moved[index as usize] = total - *seen;
                *seen = total;
            }
        }
        if moved.iter().any(|&count| count > 0) {
            let [events, marks, priority] =
                [lost_index::EVENTS, lost_index::MARKS_FULL, lost_index::PRIORITY].map(|index| moved[index as usize]);
            self.tree_losses.report([priority, events, marks], &self.decoder, out);
        }
        Ok(())
    }
}

/// Keeps the exec and fork records of live tree members in the pinned set, for the agent after
/// this one (see [`pins`]); drops them at the exit. Best effort: a full map costs only the
/// attribution of that process's actions after a restart.
fn keep(pins: &mut Pins, record: &[u8], event: &Event) {
    match &event.data {
        EventData::Exec(_) => {
            let mut value = Box::new([0u8; MAX_EXEC_RECORD]);
            let size = record.len().min(MAX_EXEC_RECORD);
            value[..size].copy_from_slice(&record[..size]);
            let _ = pins.execs.insert(event.pid, value, 0);
        }
        EventData::Fork(fork) => {
            let mut value = [0u8; FORK_RECORD];
            let size = record.len().min(FORK_RECORD);
            value[..size].copy_from_slice(&record[..size]);
            let _ = pins.forks.insert(fork.child_pid, value, 0);
        }
        EventData::Exit(_) => {
            let _ = pins.execs.remove(&event.pid);
            let _ = pins.forks.remove(&event.pid);
        }
        _ => {}
    }
}

/// A drain's bulk read ends after the record it read `taken`-th, made at `time_ns`, when it has
/// `bound` records and none older than the newest priority record read before it.
fn bulk_read_done(taken: usize, bound: usize, time_ns: u64, newest_priority_ns: u64) -> bool {
    taken >= bound && time_ns >= newest_priority_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bulk_read_ends_at_the_bound_once_past_the_priority_records() {
        assert!(!bulk_read_done(DRAIN_BOUND - 1, DRAIN_BOUND, 500, 0));
        assert!(bulk_read_done(DRAIN_BOUND, DRAIN_BOUND, 500, 0));
        assert!(bulk_read_done(DRAIN_BOUND, DRAIN_BOUND, 500, 500));
        // Bulk records older than a priority record read before are read in the same batch,
        // bound or not.
        assert!(!bulk_read_done(DRAIN_BOUND * 4, DRAIN_BOUND, 499, 500));
        // The second bulk read, unbounded, ends at the first record past the priority records.
        assert!(!bulk_read_done(1, 0, 499, 500));
        assert!(bulk_read_done(1, 0, 500, 500));
    }
}
