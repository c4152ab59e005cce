#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| podca_fuzz::edge_targets::history(data));
