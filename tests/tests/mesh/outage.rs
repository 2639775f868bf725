//! A long istiod outage under traffic (issue 16): two injected sidecars (pod in a box) carry
//! steady mTLS traffic, HTTP and plain TCP (every TCP connection is a new mTLS handshake), while
//! istiod-lite is down for `OUTAGE_SECONDS` (default 15, what CI runs; `scripts/outage.sh 10m`
//! for the long run).
//!
//! The certificates are short and timed so that their rotation falls due in the middle of the
//! outage: istiod-lite is killed `lead` after the first certificate, with
//! `SECRET_TTL = 2 × lead + outage` (rotation at half of it), so the served certificate stays
//! valid `lead` past the CA's return. It asserts 0 failed requests, rotation attempts failing
//! during the outage (the CA is down) without a new certificate, and a new certificate in both
//! Envoys within one rotation backoff cap (a tenth of the lifetime, at most 60 s, +10% jitter)
//! of istiod-lite being ready again, with both proxies synced again.

use harness::assert_eventually;
use harness::mesh::{Load, Mesh, Pod};
use std::time::{Duration, Instant};

use super::soak::{agent_counter, base_config, envoy_serial, istiod_version, request, synced_at};

/// Outage length when `OUTAGE_SECONDS` is not set: short enough for CI.
const DEFAULT_SECONDS: u64 = 15;

fn outage_seconds() -> u64 {
    match harness::prereq::setting("OUTAGE_SECONDS") {
        None => DEFAULT_SECONDS,
        Some(v) => match v.trim().parse::<u64>() {
            Ok(s) if s >= 5 => s,
            _ => panic!("OUTAGE_SECONDS={v:?}: expected a whole number of seconds, at least 5"),
        },
    }
}

/// The rotation backoff cap of a certificate of `lifetime` (sds' `rotation_backoff_cap` with
/// the default 60 s maximum).
fn backoff_cap(lifetime: Duration) -> Duration {
    (lifetime / 10).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

fn serials(pods: [&Pod; 2]) -> [Option<String>; 2] {
    pods.map(envoy_serial)
}

#[test]
fn long_istiod_outage_with_rotation_due_keeps_traffic_and_rotates_on_return() {
    if !harness::mesh::prerequisites(&[]) {
        return;
    }
    let outage = Duration::from_secs(outage_seconds());
    // The served certificate outlives the outage by `lead`: more than one backoff cap, so the
    // rotation after the return comes before the expiry.
    let lead = Duration::from_secs(10) + (outage / 5).min(Duration::from_secs(70));
    let ttl = 2 * lead + outage;
    let cap = backoff_cap(ttl);
    assert!(
        lead > cap + cap / 10,
        "lead {lead:?} within the backoff cap {cap:?}"
    );

    let mut mesh = Mesh::new(&base_config("198.18.2.2"));
    mesh.start_istiod();
    let mut client = mesh.pod("client", "sleep");
    let mut server = mesh.pod("server", "httpbin");
    mesh.start_app(&mut server, "0.0.0.0:8080", "httpbin-v1");
    mesh.start_app(&mut server, "0.0.0.0:8081", "echo-tcp");
    let env = [("SECRET_TTL", format!("{}s", ttl.as_secs()))];
    let injected = Instant::now();
    mesh.inject_with(&mut server, &env);
    mesh.inject_with(&mut client, &env);
    mesh.wait_ready(&server, Duration::from_secs(30));
    mesh.wait_ready(&client, Duration::from_secs(30));
    for tcp in [false, true] {
        assert_eventually(Duration::from_secs(20), || {
            client.ns.run(move || request(tcp))
        });
    }
    let first = assert_eventually(Duration::from_secs(20), || {
        match serials([&client, &server]) {
            [Some(c), Some(s)] => Ok([c, s]),
            other => Err(format!("serials {other:?}")),
        }
    });
    let csr_failures = "num_failed_outgoing_requests_total{request_type=\"csr\"}";
    let failures_before = [&client, &server].map(|p| agent_counter(p, csr_failures).unwrap_or(0.0));

    let start = Instant::now();
    let [http, tcp] = [false, true].map(|tcp| {
        Load::run_in(&client, Duration::from_millis(100), move || {
            request(tcp).map_err(|e| format!("{:.1}s: {e}", start.elapsed().as_secs_f64()))
        })
    });
    // The certificates were issued after `injected`: the kill comes `lead` after that, so
    // their rotation (at half of `ttl`) is due half way through the outage or a little after.
    std::thread::sleep((injected + lead).saturating_duration_since(Instant::now()));
    let killed = Instant::now();
    mesh.stop_istiod();
    eprintln!(
        "outage: istiod-lite killed {:.1} s after the sidecars were injected; down for {outage:?} (SECRET_TTL {ttl:?}, backoff cap {cap:?})",
        (killed - injected).as_secs_f64()
    );
    let mut last_report = Instant::now();
    while killed.elapsed() < outage {
        std::thread::sleep(Duration::from_millis(200));
        if last_report.elapsed() >= Duration::from_secs(60) {
            last_report = Instant::now();
            eprintln!("outage: {:.0} s down", killed.elapsed().as_secs_f64());
        }
    }
    let during = serials([&client, &server]);
    let failures_during = [&client, &server].map(|p| agent_counter(p, csr_failures).unwrap_or(0.0));
    let back_at = Instant::now();
    mesh.start_istiod();
    let ready = Instant::now();
    let version = istiod_version(&mesh).expect("version after the return");
    assert_eventually(Duration::from_secs(30), || {
        synced_at(&mesh, &[&client, &server], &version)
    });
    let synced = ready.elapsed();
    let rotated = assert_eventually(cap * 2 + Duration::from_secs(10), || {
        match serials([&client, &server]) {
            [Some(c), Some(s)] if c != first[0] && s != first[1] => Ok(ready.elapsed()),
            other => Err(format!("serials {other:?}, before the outage {first:?}")),
        }
    });
    // Traffic a little longer on the new certificates.
    std::thread::sleep(Duration::from_secs(2));
    let ((http_ok, mut failed), (tcp_ok, tcp_failed)) = (http.stop(), tcp.stop());
    failed.extend(tcp_failed);
    let requests = http_ok + tcp_ok + failed.len();

    eprintln!(
        "FIGURE outage: istiod-lite down {:.1} s under traffic: {requests} requests ({http_ok} HTTP, {tcp_ok} TCP = new mTLS handshakes), {} failed",
        (back_at - killed).as_secs_f64(),
        failed.len()
    );
    eprintln!(
        "FIGURE outage: SECRET_TTL {}s, rotation due during the outage: failed CSR calls during it client {}, server {}; new certificate in both Envoys {:.2} s after istiod-lite was ready again (it took {:.2} s to start; backoff cap {cap:?}); both proxies synced {:.2} s after it was ready",
        ttl.as_secs(),
        failures_during[0] - failures_before[0],
        failures_during[1] - failures_before[1],
        rotated.as_secs_f64(),
        (ready - back_at).as_secs_f64(),
        synced.as_secs_f64()
    );
    assert!(failed.is_empty(), "failed requests: {failed:#?}");
    assert!(
        requests as u64 >= outage.as_secs() * 5,
        "too few requests: {requests}"
    );
    assert_eq!(
        during,
        first.clone().map(Some),
        "a certificate changed while the CA was down"
    );
    for (i, name) in ["client", "server"].into_iter().enumerate() {
        assert!(
            failures_during[i] > failures_before[i],
            "{name}: no rotation attempt failed during the outage (was the rotation due?)"
        );
    }
    // One cap (+10% jitter), plus a second for the CSR, SDS push and the /certs poll.
    assert!(
        rotated <= cap + cap / 10 + Duration::from_secs(1),
        "rotation {rotated:?} after the CA's return; the backoff cap is {cap:?}"
    );
    for pod in [&mut client, &mut server] {
        assert!(
            pod.agent.as_mut().expect("agent").try_wait().is_none(),
            "{} agent exited",
            pod.name
        );
    }
}
