//! `/debug/pprof/`: the agent's profiles, where Istio's agent serves Go's (`--profiling`,
//! default true; only to peers inside the pod, as the other debug endpoints).
//!
//! Served: the index, `cmdline` (the command line, arguments separated by NUL bytes) and
//! `profile` (a CPU profile of `seconds`, default 30, in pprof's format: what
//! `go tool pprof http://localhost:15020/debug/pprof/profile` reads). The endpoints of Go's
//! runtime (its heap and goroutine profiles, the execution trace, symbol lookup) have no
//! counterpart in this Rust program: they answer 501 with the reason, in the form
//! `go tool pprof` prints (`server response: 501 Not Implemented - <reason>`). Answers and
//! errors are otherwise Go's `net/http/pprof`'s: its headers, its 500 for a second CPU profile
//! while one runs, its 404 "Unknown profile".

use std::pin::Pin;
use std::time::Duration;

use super::{Body, full};
use crate::cpu_profile;

/// What a path under `/debug/pprof/` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Page {
    Index,
    Cmdline,
    Profile,
    /// One of Go's runtime endpoints: its reason.
    GoOnly(&'static str),
    Unknown,
}

/// `seconds` when the query gives none (or none that is a positive integer), as Go.
const DEFAULT_SECONDS: u64 = 30;

const HEAP: &str = "not served: pilot-agent is a Rust program on glibc's malloc, which \
    samples no allocations (a heap profile would cost every allocation a check); \
    /debug/pprof/profile serves a CPU profile";
const GO_RUNTIME: &str = "not served: a profile of Go's runtime, and pilot-agent is a Rust \
    program (tokio tasks, no goroutines); /debug/pprof/profile serves a CPU profile";
const TRACE: &str = "not served: Go's execution tracer (go tool trace), and pilot-agent is a \
    Rust program; /debug/pprof/profile serves a CPU profile";
const SYMBOL: &str = "not served: the CPU profiles here name their functions themselves (from \
    the binaries' symbol tables), so go tool pprof has no address to look up";

/// Go's endpoints that have no counterpart here, with the reason each answers.
const GO_ONLY: &[(&str, &str)] = &[
    ("allocs", HEAP),
    ("block", GO_RUNTIME),
    ("goroutine", GO_RUNTIME),
    ("goroutineleak", GO_RUNTIME),
    ("heap", HEAP),
    ("mutex", GO_RUNTIME),
    ("symbol", SYMBOL),
    ("threadcreate", GO_RUNTIME),
    ("trace", TRACE),
];

/// The page `name` (the path after `/debug/pprof/`) asks for.
#[cold]
pub(crate) fn page(name: &str) -> Page {
    match name {
        "" => Page::Index,
        "cmdline" => Page::Cmdline,
        "profile" => Page::Profile,
        _ => GO_ONLY
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(Page::Unknown, |(_, why)| Page::GoOnly(why)),
    }
}

/// Answers `page` for a request with `query`. Boxed and dynamic: the profile's code is not
/// inlined into the status server's handler, which every probe runs (nor its state into every
/// request's).
pub(crate) fn serve(
    page: Page,
    query: Option<&str>,
) -> Pin<Box<dyn Future<Output = http::Response<Body>> + Send + '_>> {
    Box::pin(async move {
        match page {
            Page::Index => typed(full(200, index()), "text/html; charset=utf-8"),
            Page::Cmdline => typed(full(200, cmdline()), "text/plain; charset=utf-8"),
            Page::Profile => profile(seconds(query)).await,
            Page::GoOnly(why) => error(501, why),
            Page::Unknown => error(404, "Unknown profile"),
        }
    })
}

async fn profile(seconds: u64) -> http::Response<Body> {
    match cpu_profile::run(Duration::from_secs(seconds)).await {
        Ok(gz) => {
            let mut r = typed(full(200, gz), "application/octet-stream");
            r.headers_mut().insert(
                http::header::CONTENT_DISPOSITION,
                http::HeaderValue::from_static("attachment; filename=\"profile\""),
            );
            r
        }
        Err(e @ (cpu_profile::Error::InUse | cpu_profile::Error::Start(_))) => {
            tracing::warn!(error = %e, "CPU profile refused");
            error(500, &format!("Could not enable CPU profiling: {e}"))
        }
        Err(e) => {
            tracing::warn!(error = %e, "CPU profile failed");
            error(500, &format!("Could not write the CPU profile: {e}"))
        }
    }
}

/// `r` with Go's headers for a pprof answer of `content_type`.
fn typed(mut r: http::Response<Body>, content_type: &'static str) -> http::Response<Body> {
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    h.insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        http::HeaderValue::from_static("nosniff"),
    );
    r
}

/// An error as Go's pprof handlers give it: plain text and `X-Go-Pprof`, which tells
/// `go tool pprof` to print the body.
fn error(status: u16, text: &str) -> http::Response<Body> {
    let mut r = typed(
        full(status, format!("{text}\n")),
        "text/plain; charset=utf-8",
    );
    r.headers_mut()
        .insert("x-go-pprof", http::HeaderValue::from_static("1"));
    r
}

/// The process's arguments, NUL-separated (Go's `os.Args` joined the same way).
fn cmdline() -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let args: Vec<_> = std::env::args_os().collect();
    args.iter()
        .map(|a| a.as_bytes())
        .collect::<Vec<_>>()
        .join(&0u8)
}

/// The `seconds` query parameter as Go's handler reads it (the first one; not a positive
/// integer: the default).
pub(crate) fn seconds(query: Option<&str>) -> u64 {
    let first = query.unwrap_or("").split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (unescape_query(k) == "seconds").then(|| unescape_query(v))
    });
    match first.and_then(|v| v.parse::<i64>().ok()) {
        Some(s) if s > 0 => s.unsigned_abs(),
        _ => DEFAULT_SECONDS,
    }
}

/// A query component unescaped: `+` is a space, then `%XX` escapes.
fn unescape_query(s: &str) -> String {
    super::route::unescape_path(&s.replace('+', " "))
}

/// The index: what is served here, and what of Go's is not, with why.
fn index() -> String {
    let mut page = String::from(
        "<html>\n<head>\n<title>/debug/pprof/</title>\n</head>\n<body>\n/debug/pprof/ \
         (pilot-agent, a Rust program)\n<br>\n<p>Served:</p>\n<ul>\n\
         <li><a href=\"cmdline\">cmdline</a>: the command line, arguments separated by NUL \
         bytes</li>\n\
         <li><a href=\"profile\">profile</a>: a CPU profile of the agent in pprof's format, \
         sampled at 100 Hz for <code>seconds</code> (default 30): \
         <code>go tool pprof http://localhost:15020/debug/pprof/profile?seconds=30</code>; \
         one at a time</li>\n</ul>\n<p>Not served (501, with the reason):</p>\n<ul>\n",
    );
    for (name, why) in GO_ONLY {
        page.push_str(&format!("<li>{name}: {why}</li>\n"));
    }
    page.push_str("</ul>\n</body>\n</html>\n");
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_as_go_reads_them() {
        for (query, want) in [
            (None, 30),
            (Some("seconds=5"), 5),
            (Some("debug=1&seconds=%32"), 2),
            (Some("seconds=%2B3"), 3),
            // `+` is a space in a query: " 3" is no integer.
            (Some("seconds=+3"), 30),
            (Some("seconds=7&seconds=9"), 7),
            (Some("seconds=0"), 30),
            (Some("seconds=-4"), 30),
            (Some("seconds=1.5"), 30),
            (Some("seconds="), 30),
            (Some("seconds"), 30),
        ] {
            assert_eq!(seconds(query), want, "{query:?}");
        }
    }

    #[test]
    fn pages() {
        assert_eq!(page(""), Page::Index);
        assert_eq!(page("profile"), Page::Profile);
        assert_eq!(page("cmdline"), Page::Cmdline);
        assert_eq!(page("heap"), Page::GoOnly(HEAP));
        assert_eq!(page("trace"), Page::GoOnly(TRACE));
        assert_eq!(page("goroutine"), Page::GoOnly(GO_RUNTIME));
        assert_eq!(page("nothing"), Page::Unknown);
        assert_eq!(page("profile/"), Page::Unknown);
        for (_, why) in GO_ONLY {
            assert!(!why.contains('\n'), "one line: {why}");
        }
    }

    #[test]
    fn cmdline_is_the_arguments_separated_by_nul() {
        let args: Vec<String> = std::env::args().collect();
        assert_eq!(String::from_utf8(cmdline()).unwrap(), args.join("\0"));
    }
}
