//! Which endpoint a status-port request reaches, and whether its peer may use it: the routing
//! apart from the I/O, so it is tested (and fuzzed: `fuzz/fuzz_targets/status_request.rs`) on
//! its own. Lifecycle and debug endpoints answer only peers inside the pod ([`super::conn::is_local`]);
//! `/quitquitquit` and `/drain` only `POST`; `/debug/pprof/` exists only with `--profiling`.

use http::Method;

use super::pprof::{self, Page};

/// The settings routing depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    /// `METRICS_LOCALHOST_ACCESS_ONLY`: merged metrics for peers inside the pod only.
    pub metrics_localhost_only: bool,
    /// `--profiling`: `/debug/pprof/` is served.
    pub profiling: bool,
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    Ready,
    /// `/stats/prometheus` or `/metrics`: the merged metrics.
    Stats,
    Quit,
    Drain,
    Ndsz,
    ConfigDump,
    /// A page under `/debug/pprof/`.
    Pprof(Page),
    /// `/debug/pprof` without its slash: Go's mux redirects (301) to the subtree.
    PprofRedirect,
    /// An app probe's path (`/app-health/…`, `/app-lifecycle/…`), unescaped.
    App(String),
    /// Refused with this status: 403 (not from inside the pod), 405 (not `POST`).
    Refused(u16),
    NotFound,
}

/// The route of a request for `raw_path` (as sent: `%XX` escapes are decoded here, as Go's
/// `URL.Path`) by `method`, from a peer inside the pod or not.
pub(crate) fn route(raw_path: &str, method: &Method, local: bool, rules: Rules) -> Route {
    let path = unescape_path(raw_path);
    let local_only = |r: Route| if local { r } else { Route::Refused(403) };
    let post_only = |r: Route| {
        if !local {
            Route::Refused(403)
        } else if method != Method::POST {
            Route::Refused(405)
        } else {
            r
        }
    };
    match path.as_str() {
        "/healthz/ready" => Route::Ready,
        "/stats/prometheus" | "/metrics" if rules.metrics_localhost_only => {
            local_only(Route::Stats)
        }
        "/stats/prometheus" | "/metrics" => Route::Stats,
        "/quitquitquit" => post_only(Route::Quit),
        "/drain" => post_only(Route::Drain),
        "/debug/ndsz" => local_only(Route::Ndsz),
        "/debug/config_dump" => local_only(Route::ConfigDump),
        "/debug/pprof" if rules.profiling => Route::PprofRedirect,
        p if rules.profiling && p.starts_with("/debug/pprof/") => {
            local_only(Route::Pprof(pprof::page(&p["/debug/pprof/".len()..])))
        }
        p if p.starts_with("/app-health/") || p.starts_with("/app-lifecycle/") => Route::App(path),
        _ => Route::NotFound,
    }
}

/// Decodes `%XX` escapes, as Go's `URL.Path` (an invalid escape is kept as is).
pub(super) fn unescape_path(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The fuzz target's check: `data` is a flags byte (bit 0: the peer is inside the pod, bit 1:
/// metrics for local peers only, bits 2–3: GET, POST, HEAD or PUT, bit 4: `--profiling`), then a request target line
/// and `name: value` header lines; the rest after an empty line is a metrics text as an app or
/// Envoy might answer a scrape. Whatever it is, nothing panics, a privileged endpoint is reached
/// only from inside the pod (and by `POST` where asked), `/debug/pprof/` only with
/// `--profiling`, an app probe only on its paths, the
/// headers passed on to an app never carry hop-by-hop ones, a `Host` naming the status port
/// names the app's, the scrape timeout stays under an hour and merged metrics text ends with a
/// newline and carries no `# EOF`.
#[cfg(feature = "fuzzing")]
pub fn check_request(data: &[u8]) {
    use http::{HeaderMap, HeaderName, HeaderValue, Uri};

    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let local = flags & 1 != 0;
    let rules = Rules {
        metrics_localhost_only: flags & 2 != 0,
        profiling: flags & 16 != 0,
    };
    let method =
        [Method::GET, Method::POST, Method::HEAD, Method::PUT][usize::from(flags >> 2 & 3)].clone();
    let text = String::from_utf8_lossy(rest);
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let Ok(uri) = lines.next().unwrap_or("/").parse::<Uri>() else {
        return; // hyper answers 400 before any routing
    };
    let mut headers = HeaderMap::new();
    for line in lines {
        if let Some((n, v)) = line.split_once(':')
            && let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(n.trim().as_bytes()),
                HeaderValue::from_str(v.trim()),
            )
        {
            headers.append(n, v);
        }
    }

    check_route(&uri, &method, local, rules);
    check_forwarded(&uri, &headers);

    if let Some(q) = uri.query() {
        assert!(pprof::seconds(Some(q)) > 0);
    }
    assert!(super::stats::scrape_timeout(&headers) < std::time::Duration::from_secs(3600));
    let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    assert!(
        format!("/stats/prometheus{query}").parse::<Uri>().is_ok(),
        "the query passed on to Envoy: {query:?}"
    );
    let merged = super::stats::normalise(body.as_bytes().to_vec());
    assert!(merged.is_empty() || merged.ends_with(b"\n"));
    assert!(!merged.starts_with(b"# EOF") && !merged.windows(6).any(|w| w == b"\n# EOF"));
}

/// A privileged route is reached only from inside the pod (and by `POST` where asked), pprof
/// only with `--profiling`, an app probe only on its paths.
#[cfg(feature = "fuzzing")]
fn check_route(uri: &http::Uri, method: &Method, local: bool, rules: Rules) {
    match route(uri.path(), method, local, rules) {
        Route::Quit | Route::Drain => assert!(local && *method == Method::POST, "{uri}"),
        Route::Ndsz | Route::ConfigDump => assert!(local, "{uri}"),
        Route::Pprof(_) => assert!(local && rules.profiling, "{uri}"),
        Route::PprofRedirect => assert!(rules.profiling, "{uri}"),
        Route::Stats => assert!(local || !rules.metrics_localhost_only, "{uri}"),
        Route::App(p) => {
            assert!(
                p.starts_with("/app-health/") || p.starts_with("/app-lifecycle/"),
                "{p}"
            )
        }
        Route::Ready | Route::Refused(_) | Route::NotFound => {}
    }
}

/// The headers passed on to an app carry no hop-by-hop ones, and a `Host` naming the status
/// port names the app's.
#[cfg(feature = "fuzzing")]
fn check_forwarded(uri: &http::Uri, headers: &http::HeaderMap) {
    use http::{HeaderValue, header};

    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()));
    let kubelet = super::probe::KubeletRequest {
        headers,
        host,
        status_port: 15020,
    };
    let (forwarded, app_host) = super::probe::forwarded(&kubelet, 8080);
    for h in [
        header::HOST,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::TRAILER,
    ] {
        assert!(!forwarded.contains_key(&h), "{h} passed on");
    }
    if let Some(h) = &app_host {
        assert!(!h.is_empty() && HeaderValue::from_str(h).is_ok(), "{h:?}");
        // As Go's `net.SplitHostPort` reads it (`a:b:15020` has too many colons: kept as is).
        let names_status_port = host
            .and_then(super::probe::split_host_port)
            .is_some_and(|(_, p)| p.parse::<u32>() == Ok(15020));
        if names_status_port {
            assert!(h.ends_with(":8080"), "{host:?} -> {h}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISTIO: Rules = Rules {
        metrics_localhost_only: false,
        profiling: true,
    };

    #[test]
    fn lifecycle_and_debug_only_from_inside_and_by_post() {
        let r = |p: &str, m: Method, local: bool| route(p, &m, local, ISTIO);
        assert_eq!(r("/quitquitquit", Method::POST, true), Route::Quit);
        assert_eq!(r("/quitquitquit", Method::GET, true), Route::Refused(405));
        assert_eq!(r("/quitquitquit", Method::POST, false), Route::Refused(403));
        assert_eq!(
            r("/%64rain", Method::POST, true),
            Route::Drain,
            "escapes decoded"
        );
        assert_eq!(r("/debug/ndsz", Method::GET, false), Route::Refused(403));
        assert_eq!(
            r("/debug/config_dump", Method::GET, true),
            Route::ConfigDump
        );
        assert_eq!(r("/healthz/ready", Method::GET, false), Route::Ready);
        assert_eq!(r("/metrics", Method::GET, false), Route::Stats);
        let local_metrics = Rules {
            metrics_localhost_only: true,
            ..ISTIO
        };
        assert_eq!(
            route("/metrics", &Method::GET, false, local_metrics),
            Route::Refused(403)
        );
        assert_eq!(
            r("/app-health/c/livez", Method::GET, false),
            Route::App("/app-health/c/livez".into())
        );
        assert_eq!(r("/app-healthz", Method::GET, true), Route::NotFound);
        assert_eq!(r("/%zz", Method::GET, true), Route::NotFound);
    }

    #[test]
    fn pprof_only_with_profiling_and_from_inside() {
        let r = |p: &str, local: bool, profiling: bool| {
            route(p, &Method::GET, local, Rules { profiling, ..ISTIO })
        };
        assert_eq!(
            r("/debug/pprof/profile", true, true),
            Route::Pprof(Page::Profile)
        );
        assert_eq!(r("/debug/pprof/", true, true), Route::Pprof(Page::Index));
        assert_eq!(
            r("/debug/pprof/%63mdline", true, true),
            Route::Pprof(Page::Cmdline)
        );
        assert_eq!(
            r("/debug/pprof/whatever", true, true),
            Route::Pprof(Page::Unknown)
        );
        assert!(matches!(
            r("/debug/pprof/heap", true, true),
            Route::Pprof(Page::GoOnly(_))
        ));
        // A peer outside the pod: 403 for every page, as Istio's handlers.
        for p in ["/debug/pprof/", "/debug/pprof/profile", "/debug/pprof/heap"] {
            assert_eq!(r(p, false, true), Route::Refused(403), "{p}");
        }
        // Go's mux redirects the bare prefix before any handler runs.
        assert_eq!(r("/debug/pprof", false, true), Route::PprofRedirect);
        // `--profiling=false`: nothing is registered.
        for p in ["/debug/pprof", "/debug/pprof/", "/debug/pprof/profile"] {
            assert_eq!(r(p, true, false), Route::NotFound, "{p}");
            assert_eq!(r(p, false, false), Route::NotFound, "{p}");
        }
    }
}
