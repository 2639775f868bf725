//! The test app the kubelet runner runs for every image that is not the proxy's: it serves
//! each port it is given (HTTP/1.1 answering `hello from <name>`, or HTTPS with a self-signed
//! certificate), creates `/tmp/healthy` (for exec probes such as `cat /tmp/healthy`), and as
//! PID 1 of its container exits on SIGTERM.
//!
//! `pod-app --name N [--http PORT]... [--https PORT]...
//!          [--after-term-get HOST:PORT/PATH --after-term-seconds S]`
//!
//! With `--after-term-get`, SIGTERM does not end it at once: for S seconds it keeps sending
//! GETs to that address (through the pod's capture, as an app finishing its work would), on
//! one keep-alive connection re-opened when closed, then prints
//! `after-term: <ok> ok, <failed> failed, <closed> connection-close` and exits.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static TERM: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    TERM.store(true, Ordering::SeqCst);
}

fn tls_config() -> Arc<rustls::ServerConfig> {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("self-signed");
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .expect("server config"),
    )
}

/// One GET on `conn` (opened when missing); Ok(true) when the answer said `connection: close`.
fn get(conn: &mut Option<BufReader<TcpStream>>, addr: &str, path: &str) -> Result<bool, String> {
    if conn.is_none() {
        let s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok();
        *conn = Some(BufReader::new(s));
    }
    let r = conn.as_mut().expect("connection");
    write!(r.get_mut(), "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let (mut status, mut len, mut close) = (String::new(), 0usize, false);
    r.read_line(&mut status).map_err(|e| e.to_string())?;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).map_err(|e| e.to_string())?;
        let l = line.trim().to_ascii_lowercase();
        if l.is_empty() {
            break;
        }
        if let Some(v) = l.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if l == "connection: close" {
            close = true;
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).map_err(|e| e.to_string())?;
    if close {
        *conn = None;
    }
    if status.split_whitespace().nth(1) == Some("200") {
        Ok(close)
    } else {
        Err(format!("status {}", status.trim()))
    }
}

fn main() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut name, mut http, mut https) = ("app".to_string(), Vec::new(), Vec::new());
    let (mut after_get, mut after_secs) = (None, 10u64);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_default();
        match a.as_str() {
            "--name" => name = val(),
            "--http" => http.push(val()),
            "--https" => https.push(val()),
            "--after-term-get" => after_get = Some(val()),
            "--after-term-seconds" => after_secs = val().parse().unwrap_or(10),
            other => {
                eprintln!("pod-app: unknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }
    #[allow(unsafe_code)] // signal(2): SIGTERM and SIGINT set a flag the app polls
    // SAFETY: `on_term` is an extern "C" handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_term as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_term as *const () as libc::sighandler_t);
    }
    let _ = std::fs::write("/tmp/healthy", "ok\n");
    let tls = (!https.is_empty()).then(tls_config);
    for (port, secure) in http
        .iter()
        .map(|p| (p, false))
        .chain(https.iter().map(|p| (p, true)))
    {
        let listener = match TcpListener::bind(format!("0.0.0.0:{port}")) {
            Ok(l) => l,
            // Containers share the pod's network: another container may serve the port already
            // (Istio's specs give two stand-in apps the same port); the pod serves it either way.
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                eprintln!("pod-app {name}: port {port} is served by another container of the pod");
                continue;
            }
            Err(e) => {
                eprintln!("pod-app {name}: bind {port}: {e}");
                std::process::exit(1);
            }
        };
        eprintln!(
            "pod-app {name} listening on {port}{}",
            if secure { " (https)" } else { "" }
        );
        let (name, tls) = (name.clone(), tls.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (name, tls) = (name.clone(), tls.clone());
                std::thread::spawn(move || {
                    let peer = stream
                        .peer_addr()
                        .map(|p| p.to_string())
                        .unwrap_or_default();
                    match (secure, tls) {
                        (true, Some(cfg)) => {
                            if let Ok(conn) = rustls::ServerConnection::new(cfg) {
                                harness::app::serve(
                                    rustls::StreamOwned::new(conn, stream),
                                    &name,
                                    &peer,
                                );
                            }
                        }
                        _ => harness::app::serve(stream, &name, &peer),
                    }
                });
            }
        });
    }
    eprintln!("pod-app {name} ready");
    while !TERM.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("pod-app {name}: SIGTERM");
    if let Some(target) = after_get {
        let (addr, path) = match target.split_once('/') {
            Some((a, p)) => (a.to_string(), format!("/{p}")),
            None => (target.clone(), "/".to_string()),
        };
        let end = Instant::now() + Duration::from_secs(after_secs);
        let (mut ok, mut failed, mut closed) = (0u32, 0u32, 0u32);
        let mut conn = None;
        while Instant::now() < end {
            match get(&mut conn, &addr, &path) {
                Ok(c) => {
                    ok += 1;
                    closed += u32::from(c);
                }
                Err(e) => {
                    failed += 1;
                    conn = None;
                    eprintln!("pod-app {name}: after SIGTERM: {e}");
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        println!("after-term: {ok} ok, {failed} failed, {closed} connection-close");
    }
    std::process::exit(0);
}
