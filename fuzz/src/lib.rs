//! The fuzz targets' shared bodies. `cargo +nightly fuzz run <target>` (see
//! `docs/security.md`, "Fuzzing"); the same functions run on stable in `cargo test` as
//! property tests.

pub mod edge_targets;
pub mod signer_targets;
