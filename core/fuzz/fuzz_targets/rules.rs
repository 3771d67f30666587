//! The rule loader on one fuzzed file, alone and after the default managers (so rules naming
//! npm or pip get past validation). A small set that loads has its samples replayed through the
//! engine, as `credwatch rules check` does: replaying every sample of a whole seed file ran at
//! 14 inputs/s, a few rules' worth keeps the loader fuzzed at speed.
#![no_main]

use credwatch_core::{rules::RuleSet, samples};
use libfuzzer_sys::fuzz_target;

const MANAGERS: &str = include_str!("../../../rules/managers.yaml");

/// Most rules whose samples are replayed for one input.
const MAX_REPLAYED: usize = 4;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data).into_owned();
    let alone = vec![("fuzz.yaml".to_owned(), text.clone())];
    let with_managers = vec![("managers.yaml".to_owned(), MANAGERS.to_owned()), ("fuzz.yaml".to_owned(), text)];
    for sources in [alone, with_managers] {
        match RuleSet::from_sources(sources) {
            Ok(set) => {
                let _ = set.digest();
                if set.rules().len() <= MAX_REPLAYED {
                    let _ = samples::failures(&set);
                }
            }
            Err(error) => {
                let _ = error.to_string();
            }
        }
    }
});
