//! Conformance suite shared by every backend.
