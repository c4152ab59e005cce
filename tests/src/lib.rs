//! The Kubernetes API emulator and end-to-end test support for podca.
//!
//! * [`emulator`]: an in-process HTTP server that speaks the parts of the
//!   Kubernetes API a PodCertificateRequest signer uses, enforcing the
//!   rules of `spec/pod-certificates-api.md` with kube-apiserver's answers.
//! * [`kubelet`]: a kubelet simulator that files PCRs and checks the result.
//! * [`cluster`]: the emulator set up for podca (identity, signer grants, kubeconfig) and
//!   PCRs filed by hand.
//! * [`process`]: the real `podca serve` and `podca dev` as child processes.
//! * [`istio`]: a ztunnel-like client of the Istio CA API.
//! * [`tls`]: TLS clients of podca serve's gRPC listener, trusting only given anchors.
//! * [`bench`]: the set-up the gRPC benchmarks share.
//! * [`softhsm`]: SoftHSM2 tokens and `pkcs11-tool` for the PKCS#11 tests.
//! * [`verify`]: `openssl verify`, the independent check of every issued chain.

pub mod bench;
pub mod client;
pub mod cluster;
pub mod emulator;
pub mod istio;
pub mod kubelet;
pub mod otlp;
pub mod postgres;
pub mod process;
pub mod sim;
pub mod softhsm;
pub mod testca;
pub mod tls;
pub mod verify;

pub use emulator::{Emulator, EmulatorConfig};
