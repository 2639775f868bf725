//! In-process fake CA.
