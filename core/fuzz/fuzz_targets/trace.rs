//! credwatch's own trace: the reader alone, and the importer's credwatch source (as given and
//! detected) through the engine. Some inputs are also compressed, so the gzip and zstd paths
//! meet fuzzed content and not only fuzzed compressed streams.
#![no_main]

use std::io::{Cursor, Write};

use credwatch_core::{import::Format, trace::TraceReader};
use libfuzzer_sys::fuzz_target;

fn read(data: Vec<u8>) {
    match TraceReader::new("fuzz.trace".into(), Box::new(Cursor::new(data))) {
        Ok(mut reader) => {
            let _ = (reader.header(), reader.name());
            loop {
                match reader.next_event() {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    // Like the importer: a bad line is skipped, anything else ends the input.
                    Err(credwatch_core::trace::TraceError::BadLine { .. }) => {}
                    Err(credwatch_core::trace::TraceError::Input(error)) if error.recoverable => {}
                    Err(error) => {
                        let _ = error.to_string();
                        break;
                    }
                }
            }
        }
        Err(error) => {
            let _ = error.to_string();
        }
    }
}

fuzz_target!(|data: &[u8]| {
    read(data.to_vec());
    // A third of the inputs, chosen by length so a finding reproduces, compressed each way.
    match data.len() % 3 {
        1 => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(data).expect("in memory");
            read(gz.finish().expect("in memory"));
        }
        2 => read(zstd::encode_all(data, 1).expect("in memory")),
        _ => {}
    }
    credwatch_core_fuzz::import(data, Format::Credwatch);
});
