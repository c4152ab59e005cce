//! The runtime's components that need no Kubernetes and no gRPC: the CA source, the ledger and
//! the JWT keys of a data directory. Each takes `&mut Runtime`, decides its own mode once from
//! the configuration, registers its metrics and readiness and spawns its tasks there. The gRPC
//! API, OIDC discovery and the credential-bundle keeper are `podca_grpc::component`'s; the PCR
//! controller and the Secret-held CA and keys are `podca_controller`'s.

pub mod ca;
pub mod jwt;
pub mod ledger;
