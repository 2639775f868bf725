//! Request-path tests.
