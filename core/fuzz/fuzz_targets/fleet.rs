//! The fleet report on a fuzzed alert file (or a stream's messages, one a line): each line
//! through `FleetReport::add_json`, as `credwatch fleet report --keep-going` takes them, then the
//! report rendered. What the hosts sent reaches a terminal escaped.
#![no_main]

use credwatch_core::fleet::FleetReport;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut report = FleetReport::default();
    for line in data.split(|&b| b == b'\n') {
        if let Err(error) = report.add_json(line) {
            let _ = error.to_string();
        }
    }
    for text in [report.to_text(), report.to_markdown()] {
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "unescaped control character in {text:?}");
    }
    serde_json::to_string(&report).expect("the report serialises");
});
