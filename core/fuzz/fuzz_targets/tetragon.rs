//! The tetragon importer: as given and detected, every event through the engine.
#![no_main]

use credwatch_core::import::Format;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| credwatch_core_fuzz::import(data, Format::Tetragon));
