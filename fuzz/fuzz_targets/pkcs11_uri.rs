#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        podca_fuzz::signer_targets::pkcs11_uri(text);
    }
});
