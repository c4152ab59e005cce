//! The Kubernetes API emulator and end-to-end test support for podca.
