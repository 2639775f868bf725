//! End-to-end harness.
