//! Generated gRPC code: podca's own API (`podca.v1`), the SPIFFE Workload API, the Istio CA
//! API (`istio.v1.auth`) and Kubernetes' external token signer API (`v1.ExternalJWTSigner`).
//!
//! The .proto files live in `proto/proto/`; `build.rs` compiles them with protox and
//! tonic-prost-build.

/// podca's own API.
pub mod podca {
    /// Version 1.
    #[allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        missing_debug_implementations
    )]
    pub mod v1 {
        tonic::include_proto!("podca.v1");
    }
}

/// The Istio CA API (`istio.v1.auth.IstioCertificateService`), written for podca from Istio's
/// public contract.
pub mod istio {
    /// Version 1.
    pub mod v1 {
        /// The CA service.
        #[allow(
            missing_docs,
            clippy::all,
            clippy::pedantic,
            missing_debug_implementations
        )]
        pub mod auth {
            tonic::include_proto!("istio.v1.auth");
        }
    }
}

/// Kubernetes' external service-account token signer API (KEP-740), which kube-apiserver calls
/// on `--service-account-signing-endpoint`. Its protobuf package is plain `v1`, so the RPC paths
/// are `/v1.ExternalJWTSigner/<Method>`.
pub mod externaljwt {
    /// Version 1.
    #[allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        missing_debug_implementations
    )]
    pub mod v1 {
        tonic::include_proto!("v1");
    }
}

/// The SPIFFE Workload API. The upstream proto declares no package, so the RPC paths are
/// `/SpiffeWorkloadAPI/<Method>` and prost names the generated file `_.rs`.
#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations
)]
pub mod workload {
    include!(concat!(env!("OUT_DIR"), "/_.rs"));
}

/// The prost the generated code uses (to encode an SDS `Secret` into its `Any`).
pub use prost;

/// The encoded `FileDescriptorSet` of the APIs and their imports (protox, at build time), for
/// gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/podca_descriptor.bin"));

/// Envoy's xDS API as far as the Secret Discovery Service needs it, generated from the
/// vendored upstream `.proto` files (`proto/proto/README.md`). The modules follow the protobuf
/// packages: `envoy_api::envoy::service::secret::v3` (the service),
/// `envoy_api::envoy::extensions::transport_sockets::tls::v3` (the `Secret` resource),
/// `envoy_api::envoy::service::discovery::v3`, `envoy_api::google::rpc`, …
#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations
)]
pub mod envoy_api {
    include!(concat!(env!("OUT_DIR"), "/envoy/mod.rs"));
}
