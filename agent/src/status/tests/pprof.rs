//! `/debug/pprof/` through the status server: who may ask, what each page answers, and one
//! CPU profile at a time.

use std::io::Read;

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::cpu_profile::tests::ONE_AT_A_TIME;

/// One response as sent: status, header block (lowercase), body.
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `GET path` from `src` (127.0.0.6 stands for a peer outside the pod).
async fn fetch(src: &str, addr: SocketAddr, path: &str) -> Answer {
    let mut s = connect_from(src, addr).await;
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
        .await
        .expect("answered")
        .unwrap();
    let end = out.windows(4).position(|w| w == b"\r\n\r\n").expect("head");
    let head = String::from_utf8_lossy(&out[..end]).into_owned();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    Answer {
        status,
        head,
        body: out[end + 4..].to_vec(),
    }
}

#[tokio::test]
async fn pprof_answers_peers_inside_the_pod_only() {
    let s = setup(CONFIG_OK, LIVE, None).await;
    for path in [
        "/debug/pprof/",
        "/debug/pprof/cmdline",
        "/debug/pprof/profile?seconds=1",
        "/debug/pprof/heap",
    ] {
        let a = fetch("127.0.0.6", s.addr, path).await;
        assert_eq!(
            (a.status, a.text().as_str()),
            (403, "Only requests from localhost are allowed\n"),
            "{path}"
        );
    }

    let index = fetch("127.0.0.1", s.addr, "/debug/pprof/").await;
    assert_eq!(index.status, 200);
    assert_eq!(
        index.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    for listed in ["href=\"profile\"", "href=\"cmdline\"", "heap: not served"] {
        assert!(index.text().contains(listed), "{listed}: {}", index.text());
    }

    let cmdline = fetch("127.0.0.1", s.addr, "/debug/pprof/cmdline").await;
    assert_eq!(cmdline.status, 200);
    let args: Vec<String> = std::env::args().collect();
    assert_eq!(cmdline.text(), args.join("\0"), "NUL-separated, as Go");
    assert_eq!(cmdline.header("x-content-type-options"), Some("nosniff"));

    // Go's runtime endpoints: 501 with the reason, in the form go tool pprof prints.
    for name in ["heap", "allocs", "goroutine", "trace", "symbol", "mutex"] {
        let a = fetch("127.0.0.1", s.addr, &format!("/debug/pprof/{name}")).await;
        assert_eq!(a.status, 501, "{name}");
        assert_eq!(a.header("x-go-pprof"), Some("1"), "{name}");
        assert_eq!(a.header("content-type"), Some("text/plain; charset=utf-8"));
        let text = a.text();
        assert!(
            text.starts_with("not served: ") && text.ends_with('\n'),
            "{text}"
        );
        assert_eq!(text.lines().count(), 1, "{text}");
    }
    let unknown = fetch("127.0.0.1", s.addr, "/debug/pprof/nothing").await;
    assert_eq!(
        (unknown.status, unknown.text().as_str()),
        (404, "Unknown profile\n")
    );

    // The bare prefix is redirected, as Go's mux does.
    let bare = fetch("127.0.0.1", s.addr, "/debug/pprof").await;
    assert_eq!(
        (bare.status, bare.header("location")),
        (301, Some("/debug/pprof/"))
    );
}

#[tokio::test]
async fn without_profiling_nothing_of_pprof_is_served() {
    let s = setup_locked(
        CONFIG_OK,
        LIVE,
        None,
        conn::Limits::default(),
        None,
        None,
        false,
    )
    .await;
    for path in [
        "/debug/pprof",
        "/debug/pprof/",
        "/debug/pprof/profile",
        "/debug/pprof/cmdline",
    ] {
        let a = fetch("127.0.0.1", s.addr, path).await;
        assert_eq!(
            (a.status, a.text().as_str()),
            (404, "404 page not found\n"),
            "{path}"
        );
    }
}

#[tokio::test]
#[allow(
    clippy::await_holding_lock,
    reason = "the lock keeps this process's other profiling tests out for the whole test"
)]
async fn a_second_cpu_profile_while_one_runs_is_refused_as_go_refuses_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let s = setup(CONFIG_OK, LIVE, None).await;
    let path = "/debug/pprof/profile?seconds=1";
    let busy = std::thread::spawn(|| crate::cpu_profile::tests::spin(Duration::from_millis(500)));
    let (a, b) = tokio::join!(
        fetch("127.0.0.1", s.addr, path),
        fetch("127.0.0.1", s.addr, path)
    );
    busy.join().unwrap();
    let (served, refused) = if a.status == 200 { (a, b) } else { (b, a) };

    assert_eq!(refused.status, 500, "{}", refused.text());
    assert_eq!(
        refused.text(),
        "Could not enable CPU profiling: cpu profiling already in use\n"
    );
    assert_eq!(refused.header("x-go-pprof"), Some("1"));
    assert_eq!(
        refused.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(refused.header("content-disposition"), None);

    assert_eq!(served.status, 200);
    assert_eq!(
        served.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(
        served.header("content-disposition"),
        Some("attachment; filename=\"profile\"")
    );
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&served.body[..])
        .read_to_end(&mut raw)
        .expect("gzip, as Go serves it");
    let profile = proto::perftools::profiles::Profile::decode(&raw[..]).expect("a pprof profile");
    assert_eq!(profile.period, 10_000_000);
    assert!(
        profile.duration_nanos >= 1_000_000_000,
        "{}",
        profile.duration_nanos
    );

    // Once it is done, the next one may run.
    let next = fetch("127.0.0.1", s.addr, path).await;
    assert_eq!(next.status, 200);
}
