//! Generated gRPC code.
