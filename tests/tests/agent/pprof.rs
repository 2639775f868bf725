//! The agent's `/debug/pprof/` from a running sidecar (the local harness: istiod-lite, the
//! agent as an unprivileged user, real Envoy; no namespaces): a one-second CPU profile taken
//! while Prometheus-style scrapes keep the agent busy is served as Go serves its own (gzip,
//! `application/octet-stream`), decodes as pprof's `Profile` with Go's CPU sample types and
//! names the agent's functions; `go tool pprof` reads it from the URL as a user would
//! (`go` missing: a skip, or a failure under `CI=true`); `cmdline` is the agent's argv.

use harness::local::{
    LocalIstiod, Ports, Unprivileged, agent_env, httpbin_config, start_envoy, write_bootstrap,
};
use harness::{Child, assert_eventually, envoy_bin, http_get};
use prost::Message;
use proto::perftools::profiles::Profile;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const SERVICE_ACCOUNT: &str = "pprof-sa";

/// One `GET` answered in full: status, header block, body bytes.
fn fetch(addr: SocketAddr, path: &str) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("read");
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP head");
    let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    (status, head, out[end + 4..].to_vec())
}

#[test]
fn cpu_profile_of_a_running_sidecar_reads_as_go_pprof() {
    let Some(envoy) = envoy_bin() else {
        return;
    };
    let scratch_dir = tempfile::Builder::new()
        .prefix("pprof-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let scratch = scratch_dir.path();
    let istiod = LocalIstiod::start(&httpbin_config());
    istiod.provision(scratch, SERVICE_ACCOUNT);
    let user = Unprivileged::new(scratch, &envoy);
    let ports = Ports::free();
    let bootstrap = write_bootstrap(&user, scratch, istiod.secure, SERVICE_ACCOUNT, &ports);
    let mut cmd = user.command("pilot-agent");
    cmd.args(["proxy", "sidecar", "--external-envoy"])
        .current_dir(scratch);
    agent_env(&mut cmd, istiod.secure, SERVICE_ACCOUNT, &ports);
    let agent = Child::spawn("agent", cmd);
    agent.wait_for_line("agent listeners bound", Duration::from_secs(20));
    let _envoy = start_envoy(&user, &bootstrap, scratch);
    let status: SocketAddr = format!("127.0.0.1:{}", ports.status).parse().expect("addr");
    assert_eventually(Duration::from_secs(30), || {
        match http_get(status, "/healthz/ready") {
            Ok((200, _)) => Ok(()),
            other => Err(format!("/healthz/ready: {other:?}")),
        }
    });

    // Work for the agent while it is profiled: merged scrapes (Envoy's stats through it).
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = http_get(status, "/stats/prometheus");
            }
        })
    };
    let (code, head, body) = fetch(status, "/debug/pprof/profile?seconds=1");
    assert_eq!(code, 200, "{head}\n{}", String::from_utf8_lossy(&body));
    assert!(
        head.contains("content-type: application/octet-stream"),
        "{head}"
    );
    assert!(
        head.contains("content-disposition: attachment; filename=\"profile\""),
        "{head}"
    );
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&body[..])
        .read_to_end(&mut raw)
        .expect("gzip-compressed, as Go serves it");
    let profile = Profile::decode(&raw[..]).expect("a perftools.profiles.Profile");
    check_profile(&profile);

    if let Some(go) = harness::prereq::require_go() {
        go_tool_pprof_reads_it(&go, status);
    }
    stop.store(true, Ordering::Relaxed);
    scraper.join().expect("scraper");

    let (code, _, cmdline) = fetch(status, "/debug/pprof/cmdline");
    assert_eq!(code, 200);
    let cmdline = String::from_utf8(cmdline).expect("utf-8");
    let args: Vec<&str> = cmdline.split('\0').collect();
    assert!(args[0].ends_with("pilot-agent"), "{args:?}");
    assert_eq!(args[1..], ["proxy", "sidecar", "--external-envoy"]);
    assert!(
        agent
            .output()
            .iter()
            .any(|l| l.contains("CPU profile done")),
        "the agent logs the profile"
    );
}

/// Go's CPU profile layout, samples taken, the agent's functions named.
fn check_profile(p: &Profile) {
    let s = |i: i64| p.string_table[i as usize].as_str();
    let types: Vec<_> = p
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    assert_eq!(p.period, 10_000_000, "100 Hz, as Go");
    assert!(
        (1_000_000_000..5_000_000_000).contains(&p.duration_nanos),
        "{}",
        p.duration_nanos
    );
    let exe = p.mapping.first().expect("the executable's mapping");
    assert!(
        s(exe.filename).ends_with("pilot-agent"),
        "{}",
        s(exe.filename)
    );
    assert!(exe.has_functions, "a dev build carries its symbol table");
    let samples: i64 = p.sample.iter().map(|x| x.value[0]).sum();
    assert!(samples > 0, "no samples while the agent served scrapes");
    let names: Vec<&str> = p.function.iter().map(|f| s(f.name)).collect();
    assert!(
        names.iter().any(|n| n.starts_with("agent::")),
        "no function of the agent named: {names:?}"
    );
}

/// `go tool pprof -top` on the URL, as a user runs it (the copy it saves goes to a temporary
/// folder).
fn go_tool_pprof_reads_it(go: &std::path::Path, status: SocketAddr) {
    let saved = tempfile::tempdir().expect("tempdir");
    let out = Command::new(go)
        .args(["tool", "pprof", "-top"])
        .arg(format!("http://{status}/debug/pprof/profile?seconds=1"))
        .env("PPROF_TMPDIR", saved.path())
        .output()
        .expect("go tool pprof");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "go tool pprof: {stderr}\n{stdout}");
    assert!(stdout.contains("Type: cpu"), "{stdout}\n{stderr}");
    assert!(stdout.contains("Duration: 1"), "{stdout}\n{stderr}");
    eprintln!("go tool pprof -top:\n{stdout}{stderr}");
}
