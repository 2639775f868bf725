//! Log lines laid out as Istio's `pkg/log` lays them out, for every binary that stands in for
//! one of Istio's (`pilot-agent`, `istio-iptables`), so the tools that read Istio's logs
//! (`istioctl bug-report`, log pipelines keyed on its fields) read ours.
//!
//! - Text: `<time>\t<level>\t<scope>\t<message>`, with the event's fields appended to the
//!   message after a tab as `key=value` pairs separated by spaces (Istio's scope labels). The
//!   `default` scope has no column, as in Istio.
//! - JSON (`--log_as_json`): one object per line with `level`, `time`, `scope` (left out for
//!   `default`), `msg`, then the fields.
//!
//! The time is RFC 3339 in UTC with microseconds (`2026-12-07T01:02:03.456789Z`); levels are
//! `debug`, `info`, `warn` and `error` (tracing's `trace` is written `debug`, Istio has none
//! finer). The scope is the Istio scope whose modules log the event: the binary names it from
//! the event's target ([`IstioFormat::scope`]; `pilot-agent`'s `agent::log_scopes`).
//! No line carries ANSI colour: Istio's encoder has none, and a terminal reads them as well.

use std::fmt::{self, Write as _};
use std::time::SystemTime;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::timestamp;

/// The scope that has no column (text) and no `scope` key (JSON), as in Istio.
pub const DEFAULT_SCOPE: &str = "default";

/// Istio's line layout, text or JSON.
#[derive(Debug, Clone, Copy)]
pub struct IstioFormat {
    /// `--log_as_json`.
    pub json: bool,
    /// The Istio scope of an event's target (its module path).
    pub scope: fn(&str) -> &'static str,
}

impl IstioFormat {
    /// Every event in the [`DEFAULT_SCOPE`] (a binary whose Istio counterpart logs in no other).
    pub fn default_scope(json: bool) -> IstioFormat {
        IstioFormat {
            json,
            scope: |_| DEFAULT_SCOPE,
        }
    }
}

/// Istio's name of a level.
pub fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        Level::DEBUG | Level::TRACE => "debug",
    }
}

/// A field's value: JSON keeps numbers and booleans typed.
enum Value {
    Text(String),
    Json(serde_json::Value),
}

impl Value {
    fn text(&self) -> String {
        match self {
            Value::Text(s) => s.clone(),
            Value::Json(v) => v.to_string(),
        }
    }
    fn json(&self) -> serde_json::Value {
        match self {
            Value::Text(s) => serde_json::Value::String(s.clone()),
            Value::Json(v) => v.clone(),
        }
    }
}

/// The event's message and its other fields, in the order written.
#[derive(Default)]
struct Fields {
    message: String,
    fields: Vec<(&'static str, Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.message = value.text();
        } else {
            self.fields.push((field.name(), value));
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::Text(value.to_string()));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Json(value.into()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::Json(value.into()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::Json(value.into()));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::Json(value.into()));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::Text(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::Text(format!("{value:?}")));
    }
}

impl IstioFormat {
    /// One line (without its newline) for an event at `time`.
    fn line(&self, time: SystemTime, level: &Level, target: &str, event: &Event<'_>) -> String {
        let mut f = Fields::default();
        event.record(&mut f);
        let time = timestamp::rfc3339_micros(time);
        let level = level_name(level);
        let scope = (self.scope)(target);
        if self.json {
            let mut out = String::with_capacity(96 + f.message.len());
            out.push_str("{\"level\":");
            out.push_str(&serde_json::Value::from(level).to_string());
            out.push_str(",\"time\":");
            out.push_str(&serde_json::Value::from(time).to_string());
            if scope != DEFAULT_SCOPE {
                out.push_str(",\"scope\":");
                out.push_str(&serde_json::Value::from(scope).to_string());
            }
            out.push_str(",\"msg\":");
            out.push_str(&serde_json::Value::from(f.message).to_string());
            for (k, v) in &f.fields {
                // Istio's own keys are not overwritten by a field of the same name.
                if matches!(*k, "level" | "time" | "scope" | "msg") {
                    continue;
                }
                let _ = write!(out, ",{}:{}", serde_json::Value::from(*k), v.json());
            }
            out.push('}');
            out
        } else {
            let mut out = String::with_capacity(64 + f.message.len());
            out.push_str(&time);
            out.push('\t');
            out.push_str(level);
            if scope != DEFAULT_SCOPE {
                out.push('\t');
                out.push_str(scope);
            }
            out.push('\t');
            out.push_str(&f.message);
            for (i, (k, v)) in f.fields.iter().enumerate() {
                out.push(if i == 0 { '\t' } else { ' ' });
                let _ = write!(out, "{k}={}", v.text());
            }
            out
        }
    }
}

impl<S, N> FormatEvent<S, N> for IstioFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let line = self.line(SystemTime::now(), meta.level(), meta.target(), event);
        writeln!(writer, "{line}")
    }
}

/// Where `--log_target` sends the lines: `stdout`, `stderr`, or a file opened for appending
/// (one that cannot be opened is said on stderr, and stderr is used).
pub fn writer(target: &str) -> BoxMakeWriter {
    match target {
        "stdout" => BoxMakeWriter::new(std::io::stdout),
        "stderr" => BoxMakeWriter::new(std::io::stderr),
        path => match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            Ok(file) => BoxMakeWriter::new(std::sync::Mutex::new(file)),
            Err(e) => {
                eprintln!("--log_target {path}: {e}; logging to stderr");
                BoxMakeWriter::new(std::io::stderr)
            }
        },
    }
}

/// What the tests of every binary that logs this way read its lines with: a subscriber that
/// collects them, and Istio's own reader of a text line.
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use std::sync::{Arc, Mutex};

    use super::IstioFormat;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("sink").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The lines `emit` logs through a subscriber with `format`, at every level to `debug`.
    pub fn lines(format: IstioFormat, emit: impl FnOnce()) -> Vec<String> {
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("debug"))
            .with_writer(move || writer.clone())
            .event_format(format)
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let out = String::from_utf8(sink.0.lock().expect("sink").clone()).expect("UTF-8 log");
        out.lines().map(str::to_string).collect()
    }

    /// An RFC 3339 UTC time with exactly six fractional digits, as Istio's `formatDate`.
    pub fn is_istio_time(t: &str) -> bool {
        let b = t.as_bytes();
        b.len() == 27
            && b.iter().enumerate().all(|(i, c)| match i {
                4 | 7 => *c == b'-',
                10 => *c == b'T',
                13 | 16 => *c == b':',
                19 => *c == b'.',
                26 => *c == b'Z',
                _ => c.is_ascii_digit(),
            })
    }

    /// Istio's `bug-report` reader (`processlog.processPlainLog`): split on tabs, a time, a
    /// level it knows, the rest is the text. `(time, level, text)`.
    pub fn parse_plain(line: &str) -> Option<(String, String, String)> {
        let parts: Vec<&str> = line.split('\t').collect();
        if parts.len() < 3 || !is_istio_time(parts[0]) {
            return None;
        }
        let level = parts[1].to_ascii_lowercase();
        if !matches!(
            level.as_str(),
            "fatal" | "error" | "warn" | "info" | "debug" | "trace"
        ) {
            return None;
        }
        Some((parts[0].into(), parts[1].into(), parts[2..].join("\t")))
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{is_istio_time, lines, parse_plain};
    use super::*;

    #[test]
    fn default_scope_text_has_no_scope_column() {
        let out = lines(IstioFormat::default_scope(false), || {
            tracing::info!(target: "iptables_init::apply", "Running iptables-restore");
            tracing::error!(target: "x", code = 1, "failed");
            tracing::debug!("fine");
        });
        assert_eq!(out.len(), 3, "{out:?}");
        let cols: Vec<&str> = out[0].split('\t').collect();
        assert!(is_istio_time(cols[0]), "{out:?}");
        assert_eq!(cols[1..], ["info", "Running iptables-restore"]);
        let (_, level, text) = parse_plain(&out[1]).expect("Istio's reader takes it");
        assert_eq!((level.as_str(), text.as_str()), ("error", "failed\tcode=1"));
        assert_eq!(out[2].split('\t').nth(1), Some("debug"));
        assert_eq!(level_name(&Level::TRACE), "debug");
    }

    #[test]
    fn scopes_name_a_column_and_a_json_key() {
        let format = IstioFormat {
            json: true,
            scope: |t| {
                if t.starts_with("sds") {
                    "cache"
                } else {
                    DEFAULT_SCOPE
                }
            },
        };
        let out = lines(format, || {
            tracing::warn!(target: "sds::manager", retry = true, "slow");
            tracing::info!(target: "agent", "up");
        });
        let v: serde_json::Value = serde_json::from_str(&out[0]).expect("JSON line");
        assert_eq!(v["scope"], "cache");
        assert_eq!(
            (v["level"].as_str(), v["msg"].as_str()),
            (Some("warn"), Some("slow"))
        );
        assert_eq!(v["retry"], true);
        assert!(is_istio_time(v["time"].as_str().expect("time")));
        let v: serde_json::Value = serde_json::from_str(&out[1]).expect("JSON line");
        assert!(v.get("scope").is_none(), "{v}");
    }
}
