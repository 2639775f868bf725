//! Tests' view of what the agent logs: a writer a test's `tracing` subscriber writes to, and
//! the text it got.

use std::sync::{Arc, Mutex};

/// A cloneable in-memory log writer; every clone appends to the same buffer.
#[derive(Clone, Default)]
pub(crate) struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Sink {
    /// A `tracing_subscriber::fmt` writer for this sink.
    pub(crate) fn make_writer(&self) -> impl Fn() -> Sink + Send + Sync + 'static {
        let sink = self.clone();
        move || sink.clone()
    }

    /// What was written so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}
