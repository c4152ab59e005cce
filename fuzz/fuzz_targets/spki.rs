#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| podca_fuzz::signer_targets::spki(data));
