//! What the fuzz targets share: the whole public path of an importer, from bytes to the
//! engine's alerts and their rendering, as `credwatch replay --keep-going` takes it.

use std::{cell::RefCell, io::Cursor};

use credwatch_core::{
    alert::Alert,
    engine::{Engine, EngineOptions},
    event::Event,
    import::{self, EventSource, Format, ImportOptions},
    output,
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

/// Ends the input: the engine's pending alerts come out.
pub fn flush() {
    ENGINE.with_borrow_mut(|engine| engine.flush()).iter().for_each(render);
}

/// Renders `alert` as the sinks do. What the monitored system wrote reaches a terminal escaped:
/// the plain rendering holds no control character but its line breaks.
fn render(alert: &Alert) {
    let text = output::render(alert, false);
    assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "unescaped control character in {text:?}");
    let _ = output::render(alert, true);
    serde_json::to_string(alert).expect("alerts serialise");
}

/// Reads `source` to its end, going on after recoverable errors, every event through the engine.
pub fn drain(mut source: Box<dyn EventSource>) {
    let _ = (source.name(), source.format(), source.host());
    loop {
        match source.next_event() {
            Ok(Some(event)) => handle(&event),
            Ok(None) => break,
            Err(error) => {
                let _ = error.to_string();
                if !error.recoverable {
                    break;
                }
            }
        }
    }
    flush();
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
