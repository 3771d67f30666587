//! The rule loader on one fuzzed file, alone and after the default managers (so rules naming
//! npm or pip get past validation); rules that load have their samples replayed through the
//! engine, as `credwatch rules check` does.
#![no_main]

use credwatch_core::{rules::RuleSet, samples};
use libfuzzer_sys::fuzz_target;

const MANAGERS: &str = include_str!("../../../rules/managers.yaml");

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data).into_owned();
    let alone = vec![("fuzz.yaml".to_owned(), text.clone())];
    let with_managers = vec![("managers.yaml".to_owned(), MANAGERS.to_owned()), ("fuzz.yaml".to_owned(), text)];
    for sources in [alone, with_managers] {
        match RuleSet::from_sources(sources) {
            Ok(set) => {
                let _ = set.digest();
                let _ = samples::failures(&set);
            }
            Err(error) => {
                let _ = error.to_string();
            }
        }
    }
});
