#![no_main]
// The input is split into tls.crt, tls.key and (optionally) ca.crt at 0xff bytes.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut fields = data.split(|b| *b == 0xff);
    let tls_crt = fields.next().unwrap_or_default();
    let tls_key = fields.next().unwrap_or_default();
    podca_fuzz::edge_targets::secret_contents(tls_crt, tls_key, fields.next());
});
