//! The kernel ring-buffer record decoder: any bytes a (buggy or hostile) kernel program could
//! submit. A decoded record goes on to the engine, as live events do.
#![no_main]

use credwatch_core::record::Decoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let decoder = Decoder::new();
    let cred_path = |index: u32| index.is_multiple_of(2).then(|| format!("/home/u/.ssh/id_{index}"));
    for lookup in [&(|_| None) as &dyn Fn(u32) -> Option<String>, &cred_path] {
        match decoder.decode(data, lookup) {
            Ok(event) => credwatch_core_fuzz::handle(&event),
            Err(error) => {
                let _ = error.to_string();
            }
        }
    }
});
