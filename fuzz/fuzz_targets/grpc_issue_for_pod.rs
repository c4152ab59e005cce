#![no_main]
// Decoding and conversion only: no CA, so no signing (a fuzzer finds decoder bugs faster).
libfuzzer_sys::fuzz_target!(|data: &[u8]| podca_fuzz::edge_targets::grpc_issue_for_pod(data, None));
