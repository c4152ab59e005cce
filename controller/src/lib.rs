//! podca and the Kubernetes API.
