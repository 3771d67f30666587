//! What the fuzz targets share: the whole public path of an importer, from bytes through the
//! pipeline and the engine to rendered alerts and the responder's report, as
//! `credwatch replay --keep-going --report` takes it.

use std::{cell::RefCell, io::Cursor};

use credwatch_core::{
    alert::Alert,
    engine::{Engine, EngineOptions},
    event::Event,
    import::{self, EventSource, Format, ImportError, ImportOptions},
    output,
    pipeline::{self, Control, Sink, SinkError},
    report::Report,
    rules::RuleSet,
};

thread_local! {
    /// One engine per fuzzing process, fed every input's events: a fresh one per input (cloning
    /// the default rules) would cost more than 20 times the input itself. Inputs then meet the
    /// state earlier ones left, as a long `watch` does; the engine's state is bounded.
    static ENGINE: RefCell<Engine> = RefCell::new(Engine::new(
        RuleSet::defaults().expect("the built-in rules load"),
        EngineOptions { host_name: "fuzz".into(), ..EngineOptions::default() },
    ));
}

/// Feeds `event` to the engine and renders what it raises, as a terminal and as JSON would.
pub fn handle(event: &Event) {
    ENGINE.with_borrow_mut(|engine| engine.handle(event)).iter().for_each(render);
}

/// Renders `alert` as the sinks do. What the monitored system wrote reaches a terminal escaped:
/// the plain rendering holds no control character but its line breaks.
fn render(alert: &Alert) {
    let text = output::render(alert, false);
    assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "unescaped control character in {text:?}");
    let _ = output::render(alert, true);
    serde_json::to_string(alert).expect("alerts serialise");
}

/// A sink rendering alerts as the terminal and JSON sinks do (without writing them anywhere).
struct Rendered;

impl Sink for Rendered {
    fn event(&mut self, _: &Engine, _: &Event, alerts: &[Alert]) -> Result<(), SinkError> {
        alerts.iter().for_each(render);
        Ok(())
    }

    fn released(&mut self, _: &Engine, alerts: &[Alert]) -> Result<(), SinkError> {
        alerts.iter().for_each(render);
        Ok(())
    }

    fn end(&mut self, alerts: &[Alert]) -> Result<(), SinkError> {
        alerts.iter().for_each(render);
        Ok(())
    }
}

/// Drives `source` to its end through the engine as `credwatch replay --keep-going --report`
/// does: bad lines skipped, alerts rendered, the responder's report written. The report's
/// terminal text, like an alert's, holds no control character but line breaks.
pub fn drain(mut source: Box<dyn EventSource>) {
    let _ = (source.name(), source.format(), source.host());
    let mut report = Report::default();
    let mut skip = |error: &ImportError| {
        let _ = error.to_string();
    };
    let result = ENGINE.with_borrow_mut(|engine| {
        pipeline::drive(&mut *source, engine, &mut [&mut Rendered, &mut report], Some(&mut skip), |_, _| {
            Control::Continue
        })
    });
    if let Err(error) = result {
        let _ = error.to_string();
    }
    let text = report.to_text();
    assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "unescaped control character in {text:?}");
    let _ = report.to_markdown();
}

/// `data` imported as `format` and as whatever it is detected as, each through the engine.
pub fn import(data: &[u8], format: Format) {
    for from in [Some(format), None] {
        let options = ImportOptions::default();
        match import::open_reader("fuzz.input", Box::new(Cursor::new(data.to_vec())), from, &options) {
            Ok(source) => drain(source),
            Err(error) => {
                let _ = error.to_string();
            }
        }
    }
}
