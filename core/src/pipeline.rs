//! One pipeline for every mode: [`drive`] takes events from a [`Source`] through the
//! [`Engine`] to the [`Sink`]s, for `watch`, `run` and `record` (the live sensor) as for `replay`
//! (a credwatch trace or another tool's).
//!
//! A source hands over events in batches. A live source may have nothing yet (its wait ran out:
//! an empty batch, [`Pulled::More`]); a file says [`Pulled::End`] once it is read. Between
//! batches the caller's control decides whether to go on: that is where the live modes stop on
//! Ctrl-C or when `run`'s command is done. At the end, stopped or ended, the engine's
//! end-of-stream alerts ([`Engine::flush`]) go to the sinks.
//!
//! The sinks see every event after the engine handled it, with the alerts it fired, in the order
//! given: alert output, trace recorder, the responder's report, and whatever the agent adds
//! (`--enforce`'s verdict on a held connect, the warning when the kernel programs stopped).

use std::{io, sync::Mutex};

use crate::{
    alert::Alert,
    engine::Engine,
    event::Event,
    import::{EventSource, ImportError},
    output::AlertSink,
    report::Report,
    trace::{TraceError, TraceWriter},
};

/// What a [`Source::pull`] brought.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pulled {
    /// Events were appended, or none yet (a live source's wait ran out): pull again.
    More,
    /// The stream ended (a file read to its end); events may have been appended before.
    End,
}

/// Where events come from: the live sensor, a credwatch trace, an importer.
pub trait Source {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Appends the next events to `batch`, in order. After an error that
    /// [`Source::recoverable`] accepts, pulling again goes on past it; after any other, the
    /// source is finished.
    fn pull(&mut self, batch: &mut Vec<Event>) -> Result<Pulled, Self::Error>;

    /// Whether reading can go on after `error` (a bad line: `--keep-going` skips those).
    fn recoverable(&self, error: &Self::Error) -> bool {
        let _ = error;
        false
    }

    /// A live source's clock, in the events' time: every event still to come is later (its
    /// records' own delay allowed for). After each batch the engine releases the alerts it held
    /// for a window that closed before it ([`Engine::tick`]). A file has none: its events'
    /// times alone release them, which is what the clock ticking between events does live.
    fn clock_ns(&self) -> Option<u64> {
        None
    }
}

/// Files (credwatch traces and every importer) read one event at a time: a bad line's error
/// then comes after the events before it, and the engine's memory is the only state.
impl<S: EventSource + ?Sized> Source for S {
    type Error = ImportError;

    fn pull(&mut self, batch: &mut Vec<Event>) -> Result<Pulled, ImportError> {
        Ok(match self.next_event()? {
            Some(event) => {
                batch.push(event);
                Pulled::More
            }
            None => Pulled::End,
        })
    }

    fn recoverable(&self, error: &ImportError) -> bool {
        error.recoverable
    }
}

/// Where events and alerts go.
pub trait Sink {
    /// One event, after the engine handled it, with the alerts it fired (often none), held
    /// ones it released first.
    fn event(&mut self, engine: &Engine, event: &Event, alerts: &[Alert]) -> Result<(), SinkError>;

    /// Held alerts that the source's clock released with no event ([`Engine::tick`]).
    fn released(&mut self, engine: &Engine, alerts: &[Alert]) -> Result<(), SinkError>;

    /// The end of the stream: the engine's last alerts ([`Engine::flush`]: alerts still held,
    /// then the sweeps' final summaries), often none.
    fn end(&mut self, alerts: &[Alert]) -> Result<(), SinkError> {
        let _ = alerts;
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("writing an alert")]
    Alert(#[source] io::Error),
    #[error(transparent)]
    Trace(#[from] TraceError),
}

#[derive(Debug, thiserror::Error)]
pub enum DriveError<E> {
    /// The source failed (and was not skipped): the input's error as it is.
    #[error(transparent)]
    Source(E),
    #[error(transparent)]
    Sink(#[from] SinkError),
}

/// What the driver does after a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    Continue,
    /// Stop pulling: the end of the stream for the engine and the sinks.
    Stop,
    /// Return to the caller without ending the stream (no end-of-stream alerts), so that it
    /// can change the engine or the sinks (a reload) and drive again from where it was.
    Pause,
}

/// Told of each error skipped under `--keep-going`.
pub type Skip<'a, E> = &'a mut dyn FnMut(&E);

/// Drives `source` through `engine` to `sinks` until the source ends or `control` (asked after
/// each batch, with the source so that it may change how the source waits) says stop; then
/// hands the engine's end-of-stream alerts to the sinks.
///
/// With `skip` (`--keep-going`), errors the source calls recoverable are handed to it and
/// reading goes on; any other error, or a sink's, ends the drive at once, without the
/// end-of-stream alerts.
///
/// Returns [`Control::Pause`] when `control` paused it, else [`Control::Stop`] (the stream
/// ended).
pub fn drive<S: Source + ?Sized>(
    source: &mut S,
    engine: &mut Engine,
    sinks: &mut [&mut dyn Sink],
    mut skip: Option<Skip<'_, S::Error>>,
    mut control: impl FnMut(&mut S, &Engine) -> Control,
) -> Result<Control, DriveError<S::Error>> {
    let mut batch = Vec::new();
    loop {
        let pulled = match source.pull(&mut batch) {
            Ok(pulled) => pulled,
            Err(error) => match skip.as_mut() {
                Some(skip) if source.recoverable(&error) => {
                    skip(&error);
                    Pulled::More
                }
                _ => return Err(DriveError::Source(error)),
            },
        };
        for event in batch.drain(..) {
            let alerts = engine.handle(&event);
            for sink in sinks.iter_mut() {
                sink.event(engine, &event, &alerts)?;
            }
        }
        if let Some(now_ns) = source.clock_ns() {
            let alerts = engine.tick(now_ns);
            if !alerts.is_empty() {
                for sink in sinks.iter_mut() {
                    sink.released(engine, &alerts)?;
                }
            }
        }
        if pulled == Pulled::End {
            break;
        }
        match control(source, engine) {
            Control::Continue => {}
            Control::Stop => break,
            Control::Pause => return Ok(Control::Pause),
        }
    }
    let alerts = engine.flush();
    for sink in sinks.iter_mut() {
        sink.end(&alerts)?;
    }
    Ok(Control::Stop)
}

impl Sink for AlertSink {
    fn event(&mut self, _: &Engine, _: &Event, alerts: &[Alert]) -> Result<(), SinkError> {
        write_alerts(self, alerts)
    }

    fn released(&mut self, _: &Engine, alerts: &[Alert]) -> Result<(), SinkError> {
        write_alerts(self, alerts)
    }

    fn end(&mut self, alerts: &[Alert]) -> Result<(), SinkError> {
        write_alerts(self, alerts)
    }
}

/// One output shared by several drives (replay's worker threads): locked only to write alerts.
impl Sink for &Mutex<AlertSink> {
    fn event(&mut self, _: &Engine, _: &Event, alerts: &[Alert]) -> Result<(), SinkError> {
        write_shared(self, alerts)
    }

    fn released(&mut self, _: &Engine, alerts: &[Alert]) -> Result<(), SinkError> {
        write_shared(self, alerts)
    }

    fn end(&mut self, alerts: &[Alert]) -> Result<(), SinkError> {
        write_shared(self, alerts)
    }
}

fn write_alerts(sink: &mut AlertSink, alerts: &[Alert]) -> Result<(), SinkError> {
    alerts.iter().try_for_each(|alert| sink.write(alert).map_err(SinkError::Alert))
}

fn write_shared(sink: &Mutex<AlertSink>, alerts: &[Alert]) -> Result<(), SinkError> {
    if alerts.is_empty() {
        return Ok(());
    }
    // A thread that panicked holding the lock left at worst a half-written line, and its own
    // error ends the replay anyway.
    write_alerts(&mut sink.lock().unwrap_or_else(|poisoned| poisoned.into_inner()), alerts)
}

/// The recorder: every event, whatever it fired. Released alerts are no events: a replay of
/// the trace releases them again from the events' times.
impl Sink for TraceWriter {
    fn event(&mut self, _: &Engine, event: &Event, _: &[Alert]) -> Result<(), SinkError> {
        Ok(self.write(event)?)
    }

    fn released(&mut self, _: &Engine, _: &[Alert]) -> Result<(), SinkError> {
        Ok(())
    }
}

/// The responder's report takes in each event and its alerts, and the alerts released without
/// one. It leaves out the end-of-stream summaries: they restate sweeps it already holds as
/// incidents.
impl Sink for Report {
    fn event(&mut self, engine: &Engine, event: &Event, alerts: &[Alert]) -> Result<(), SinkError> {
        self.observe(engine, event, alerts);
        Ok(())
    }

    fn released(&mut self, _: &Engine, alerts: &[Alert]) -> Result<(), SinkError> {
        self.observe_alerts(alerts);
        Ok(())
    }

    fn end(&mut self, alerts: &[Alert]) -> Result<(), SinkError> {
        let held: Vec<Alert> = alerts
            .iter()
            .filter(|alert| !alert.credwatch.sweep.as_ref().is_some_and(|sweep| sweep.is_final))
            .cloned()
            .collect();
        self.observe_alerts(&held);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::{
        engine::EngineOptions,
        event::{EventData, Exec, Fork, Open},
        rules::RuleSet,
    };

    /// A scripted source: each step is one pull's batch (empty: nothing yet) or error; past the
    /// last, the end.
    struct Scripted {
        steps: VecDeque<Result<Vec<Event>, ImportError>>,
        pulls: usize,
        /// The clock after each pull (none: a file's).
        clocks: Vec<u64>,
    }

    impl Scripted {
        fn new(steps: Vec<Result<Vec<Event>, ImportError>>) -> Scripted {
            Scripted { steps: steps.into(), pulls: 0, clocks: Vec::new() }
        }
    }

    impl Source for Scripted {
        type Error = ImportError;
        fn pull(&mut self, batch: &mut Vec<Event>) -> Result<Pulled, ImportError> {
            self.pulls += 1;
            match self.steps.pop_front() {
                Some(step) => {
                    batch.extend(step?);
                    Ok(Pulled::More)
                }
                None => Ok(Pulled::End),
            }
        }
        fn recoverable(&self, error: &ImportError) -> bool {
            error.recoverable
        }
        fn clock_ns(&self) -> Option<u64> {
            self.clocks.get(self.pulls.checked_sub(1)?).copied()
        }
    }

    /// A sink that keeps what it was given: per event its pid and the ids of its alerts, and the
    /// end-of-stream alerts' ids (None until the end).
    #[derive(Default)]
    struct Kept {
        events: Vec<(u32, Vec<String>)>,
        released: Vec<Vec<String>>,
        end: Option<Vec<String>>,
    }

    fn ids(alerts: &[Alert]) -> Vec<String> {
        alerts.iter().map(|alert| alert.rule.id.clone()).collect()
    }

    impl Sink for Kept {
        fn event(&mut self, engine: &Engine, event: &Event, alerts: &[Alert]) -> Result<(), SinkError> {
            assert_eq!(engine.stats().events, self.events.len() as u64 + 1, "after the engine, once each");
            self.events.push((event.pid, ids(alerts)));
            Ok(())
        }
        fn released(&mut self, _: &Engine, alerts: &[Alert]) -> Result<(), SinkError> {
            self.released.push(ids(alerts));
            Ok(())
        }
        fn end(&mut self, alerts: &[Alert]) -> Result<(), SinkError> {
            assert!(self.end.is_none(), "one end");
            self.end = Some(ids(alerts));
            Ok(())
        }
    }

    fn engine() -> Engine {
        Engine::new(RuleSet::defaults().unwrap(), EngineOptions::default())
    }

    fn event(time: u64, pid: u32, data: EventData) -> Event {
        Event { time_ns: 1_700_000_000_000_000_000 + time * 1_000, pid, data }
    }

    fn exec(time: u64, pid: u32, ppid: u32, args: &[&str], env: &[(&str, &str)]) -> Event {
        let data = EventData::Exec(Exec {
            ppid,
            filename: args[0].into(),
            executable: args[0].into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            cwd: "/home/alice/app".into(),
            uid: 1000,
            env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            ..Exec::default()
        });
        event(time, pid, data)
    }

    fn open(time: u64, pid: u32, path: &str) -> Event {
        let data = EventData::Open(Open {
            tid: pid,
            syscall: "openat".into(),
            dirfd: -100,
            flags: 0o2000000,
            path: path.into(),
            abs_path: Some(path.into()),
            ret: 3,
            ..Open::default()
        });
        event(time, pid, data)
    }

    /// `npm install` whose postinstall (pid 101) is running.
    fn npm_postinstall() -> Vec<Event> {
        let postinstall = [("npm_package_name", "evil-pkg"), ("npm_lifecycle_event", "postinstall")];
        vec![
            exec(1, 100, 1, &["npm", "install"], &[]),
            event(2, 100, EventData::Fork(Fork { child_pid: 101 })),
            exec(3, 101, 100, &["node", "x.js"], &postinstall),
        ]
    }

    fn bad_line(line: u64) -> ImportError {
        ImportError::bad_line("t.jsonl", line, "not JSON")
    }

    #[test]
    fn every_sink_sees_every_event_with_its_alerts_then_the_end_of_stream_alerts() {
        // Three credential categories make a sweep; the fourth is folded into it, so its
        // final summary is due at the end of the stream (the tree is still running).
        let mut events = npm_postinstall();
        for (time, path) in (4..).zip([
            "/home/alice/.pypirc",
            "/home/alice/.aws/credentials",
            "/home/alice/.ssh/id_rsa",
            "/home/alice/.pgpass",
        ]) {
            events.push(open(time, 101, path));
        }
        let mut source = Scripted::new(vec![Ok(events[..3].to_vec()), Ok(Vec::new()), Ok(events[3..].to_vec())]);
        let (mut first, mut second) = (Kept::default(), Kept::default());
        let mut controls = 0;
        drive(&mut source, &mut engine(), &mut [&mut first, &mut second], None, |_, _| {
            controls += 1;
            Control::Continue
        })
        .unwrap();
        assert_eq!(first.events.iter().map(|(pid, _)| *pid).collect::<Vec<_>>(), [100, 100, 101, 101, 101, 101, 101]);
        let alerts: Vec<&[String]> = first.events.iter().map(|(_, ids)| ids.as_slice()).collect();
        assert_eq!(alerts[..4], [&[] as &[String], &[], &[], &["pypi-token".to_owned()]]);
        assert_eq!(alerts[4], ["aws-credentials"]);
        assert_eq!(alerts[5], ["credential-sweep"]);
        assert!(alerts[6].is_empty(), "folded");
        assert_eq!(first.end.as_deref(), Some(&["credential-sweep".to_owned()][..]));
        assert_eq!((first.events, first.end), (second.events, second.end));
        // After each of the three batches, the empty one ("nothing yet") included; not after the end.
        assert_eq!((controls, source.pulls), (3, 4));
    }

    #[test]
    fn held_alerts_go_out_when_a_live_sources_clock_passes_their_window_or_at_a_files_end() {
        // A postinstall reads the project's .npmrc alone: held for npm's configuration chain.
        let mut events = npm_postinstall();
        events.push(open(4, 101, "/home/alice/app/.npmrc"));
        let (read_ns, window_ns) = (events[3].time_ns, 50_000_000);
        let mut live = Scripted::new(vec![Ok(events.clone()), Ok(Vec::new()), Ok(Vec::new()), Ok(Vec::new())]);
        live.clocks = vec![read_ns + 1, read_ns + window_ns, read_ns + window_ns + 1, read_ns + 2 * window_ns];
        let (mut kept, mut report) = (Kept::default(), Report::default());
        drive(&mut live, &mut engine(), &mut [&mut kept, &mut report], None, |_, _| Control::Continue).unwrap();
        assert!(kept.events.iter().all(|(_, ids)| ids.is_empty()), "{:?}", kept.events);
        assert_eq!(kept.released, [["npm-registry-token"]], "once, when the clock is past the window");
        assert_eq!(kept.end, Some(Vec::new()));
        assert_eq!(report.alerts, 1);

        // The same events from a file: the end of the stream releases it, in the report too.
        let (mut kept, mut report) = (Kept::default(), Report::default());
        drive(&mut Scripted::new(vec![Ok(events)]), &mut engine(), &mut [&mut kept, &mut report], None, |_, _| {
            Control::Continue
        })
        .unwrap();
        assert!(kept.released.is_empty());
        assert_eq!(kept.end.as_deref(), Some(&["npm-registry-token".to_owned()][..]));
        assert_eq!(report.alerts, 1);
    }

    #[test]
    fn stopping_ends_the_stream_for_the_engine_and_the_sinks() {
        let mut source = Scripted::new(vec![Ok(npm_postinstall()), Ok(vec![open(4, 101, "/home/alice/.pypirc")])]);
        let mut kept = Kept::default();
        drive(&mut source, &mut engine(), &mut [&mut kept], None, |_, engine| {
            assert_eq!(engine.stats().events, 3);
            Control::Stop
        })
        .unwrap();
        assert_eq!((kept.events.len(), kept.end, source.pulls), (3, Some(Vec::new()), 1));
    }

    #[test]
    fn a_pause_keeps_the_stream_open_and_driving_again_goes_on() {
        let mut source = Scripted::new(vec![Ok(npm_postinstall()), Ok(vec![open(4, 101, "/home/alice/.pypirc")])]);
        let (mut engine, mut kept) = (engine(), Kept::default());
        let paused = drive(&mut source, &mut engine, &mut [&mut kept], None, |_, _| Control::Pause).unwrap();
        assert_eq!((paused, kept.events.len(), kept.end.is_none()), (Control::Pause, 3, true));
        let ended = drive(&mut source, &mut engine, &mut [&mut kept], None, |_, _| Control::Continue).unwrap();
        assert_eq!(ended, Control::Stop);
        // The second drive's open belongs to the tree the first one saw.
        assert_eq!(kept.events[3].1, ["pypi-token"]);
        assert_eq!(kept.end, Some(Vec::new()));
    }

    #[test]
    fn control_may_change_the_source_between_batches() {
        let mut source = Scripted::new(vec![Ok(Vec::new()), Ok(Vec::new()), Ok(npm_postinstall())]);
        let mut kept = Kept::default();
        drive(&mut source, &mut engine(), &mut [&mut kept], None, |source, _| {
            // Like `run` once its tree is gone: one more read, without waiting.
            source.steps.truncate(1);
            Control::Continue
        })
        .unwrap();
        assert_eq!((kept.events.len(), source.pulls), (0, 3));
    }

    #[test]
    fn recoverable_errors_are_skipped_only_when_keeping_going() {
        let steps = || {
            let events = npm_postinstall();
            vec![
                Ok(events[..1].to_vec()),
                Err(bad_line(2)),
                Ok(events[1..].to_vec()),
                Err(bad_line(5)),
                Ok(vec![open(6, 101, "/home/alice/.pypirc")]),
            ]
        };
        let mut skipped = Vec::new();
        let mut kept = Kept::default();
        let mut skip = |error: &ImportError| skipped.push(error.line);
        drive(&mut Scripted::new(steps()), &mut engine(), &mut [&mut kept], Some(&mut skip), |_, _| Control::Continue)
            .unwrap();
        assert_eq!(skipped, [Some(2), Some(5)]);
        assert_eq!(kept.events.len(), 4);
        assert_eq!(kept.events[3].1, ["pypi-token"]);

        let mut kept = Kept::default();
        let error = drive(&mut Scripted::new(steps()), &mut engine(), &mut [&mut kept], None, |_, _| Control::Continue)
            .unwrap_err();
        assert_eq!(error.to_string(), "t.jsonl:2: not JSON");
        assert!(matches!(error, DriveError::Source(ImportError { line: Some(2), .. })));
        assert_eq!((kept.events.len(), kept.end), (1, None), "no end-of-stream alerts after a failure");
    }

    #[test]
    fn an_unrecoverable_error_ends_the_drive_even_when_keeping_going() {
        let fatal = ImportError::fatal("t.jsonl", "unexpected end of gzip stream");
        let mut source = Scripted::new(vec![Ok(npm_postinstall()), Err(fatal), Ok(npm_postinstall())]);
        let mut skip = |_: &ImportError| panic!("not skippable");
        let mut kept = Kept::default();
        let error =
            drive(&mut source, &mut engine(), &mut [&mut kept], Some(&mut skip), |_, _| Control::Continue).unwrap_err();
        assert_eq!(error.to_string(), "t.jsonl: unexpected end of gzip stream");
        assert_eq!((kept.events.len(), source.pulls), (3, 2));
    }

    #[test]
    fn drives_share_one_alert_output() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("alerts.jsonl");
        let output = Mutex::new(AlertSink::new(true, Some(&path), true).unwrap());
        for _ in 0..2 {
            let mut events = npm_postinstall();
            events.push(open(4, 101, "/home/alice/.pypirc"));
            let mut shared = &output;
            drive(&mut Scripted::new(vec![Ok(events)]), &mut engine(), &mut [&mut shared], None, |_, _| {
                Control::Continue
            })
            .unwrap();
        }
        assert_eq!(output.lock().unwrap().written(), 2);
        let written = std::fs::read_to_string(&path).unwrap();
        assert_eq!(written.lines().filter(|line| line.contains("\"pypi-token\"")).count(), 2, "{written}");
    }

    /// A file source through the same driver: every importer and credwatch's own trace.
    struct Lines(VecDeque<Result<Option<Event>, ImportError>>);

    impl EventSource for Lines {
        fn next_event(&mut self) -> Result<Option<Event>, ImportError> {
            self.0.pop_front().unwrap_or(Ok(None))
        }
        fn name(&self) -> &str {
            "t.jsonl"
        }
        fn format(&self) -> crate::import::Format {
            crate::import::Format::Credwatch
        }
        fn consumed(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
            std::sync::Arc::default()
        }
    }

    #[test]
    fn a_file_source_goes_one_event_at_a_time_and_ends_at_its_end() {
        let mut lines: VecDeque<_> = npm_postinstall().into_iter().map(|e| Ok(Some(e))).collect();
        lines.insert(1, Err(bad_line(2)));
        lines.push_back(Ok(Some(open(4, 101, "/home/alice/.pypirc"))));
        let mut source: Box<dyn EventSource> = Box::new(Lines(lines));
        let (mut kept, mut skipped, mut batches) = (Kept::default(), 0, 0);
        let mut skip = |_: &ImportError| skipped += 1;
        drive(&mut *source, &mut engine(), &mut [&mut kept], Some(&mut skip), |_, _| {
            batches += 1;
            Control::Continue
        })
        .unwrap();
        assert_eq!((kept.events.len(), skipped, batches), (4, 1, 5));
        assert_eq!(kept.events[3].1, ["pypi-token"]);
        assert_eq!(kept.end, Some(Vec::new()));
    }

    /// Fails its second event.
    struct Failing(u32);

    impl Sink for Failing {
        fn event(&mut self, _: &Engine, _: &Event, _: &[Alert]) -> Result<(), SinkError> {
            self.0 += 1;
            match self.0 {
                2 => Err(SinkError::Alert(io::Error::other("disk full"))),
                _ => Ok(()),
            }
        }
        fn released(&mut self, _: &Engine, _: &[Alert]) -> Result<(), SinkError> {
            Ok(())
        }
    }

    #[test]
    fn a_sink_error_ends_the_drive_naming_the_sink() {
        let mut failing = Failing(0);
        let mut kept = Kept::default();
        let error = drive(
            &mut Scripted::new(vec![Ok(npm_postinstall())]),
            &mut engine(),
            &mut [&mut kept, &mut failing],
            None,
            |_, _| Control::Continue,
        )
        .unwrap_err();
        let chain: Vec<String> = std::iter::successors(Some(&error as &dyn std::error::Error), |e| e.source())
            .map(|e| e.to_string())
            .collect();
        assert_eq!(chain, ["writing an alert", "disk full"]);
        assert_eq!((kept.events.len(), kept.end), (2, None));
    }

    #[test]
    fn the_recorder_writes_every_event_and_the_report_sees_each_with_its_alerts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let header = crate::trace::TraceHeader {
            credwatch_trace: crate::trace::TRACE_SCHEMA,
            credwatch_version: "0".into(),
            host: "box".into(),
            host_id: None,
            kernel: String::new(),
            start_time: String::new(),
            rules_digest: String::new(),
            scope: "machine".into(),
            command: Vec::new(),
        };
        let mut recorder = TraceWriter::create(&path, &header).unwrap();
        let mut report = Report::default();
        let mut events = npm_postinstall();
        events.push(open(4, 101, "/home/alice/.pypirc"));
        let mut source = Scripted::new(vec![Ok(events.clone())]);
        drive(&mut source, &mut engine(), &mut [&mut recorder, &mut report], None, |_, _| Control::Continue).unwrap();
        recorder.finish().unwrap();
        let mut reader = crate::trace::TraceReader::open(&path).unwrap();
        let recorded: Vec<Event> = std::iter::from_fn(|| reader.next_event().unwrap()).collect();
        assert_eq!(recorded, events);
        assert_eq!((report.events, report.alerts), (4, 1));
    }
}
