//! podca PKI core.
