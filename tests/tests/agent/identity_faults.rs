//! Identity faults with the real pieces: istiod-lite on loopback, `pilot-agent proxy
//! --external-envoy` and a local Envoy started from the agent's bootstrap (no namespaces; run as
//! uid 1000 when the test runs as root). Short certificate lifetimes (`SECRET_TTL`) bring the
//! rotation at the grace ratio (50 %) within seconds.
//!
//! 1. The CA goes away before a rotation is due and stays away past it: Envoy keeps the same
//!    certificate, the agent retries with backoff (bounded attempts), and once istiod-lite is
//!    back (same CA directory, same ports) the certificate rotates within one backoff cap; the
//!    SDS connection from Envoy to the agent is never dropped.
//! 2. The token file is replaced before the first token expires: the rotation succeeds with the
//!    new one (the old one has expired by then, and the CA allows no leeway). Then the new token
//!    expires too, with no replacement: the agent names the file and the expiry time, counts
//!    `csr_failures_total{reason="token_expired"}`, backs off, and never sends the dead token.
//!
//! `--no-capture` prints `FIGURE` lines (docs/reliability.md).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use harness::envoy::cert_serials;
use harness::local::{
    LocalIstiod, Ports, Unprivileged, agent_env, httpbin_config, start_envoy, write_bootstrap,
};
use harness::{Child, assert_eventually, envoy_bin, http_get};

const SERVICE_ACCOUNT: &str = "faults-sa";
const TOKEN: &str = "var/run/secrets/tokens/istio-token";

/// istiod-lite, the agent and Envoy, running.
struct Sidecar {
    istiod: LocalIstiod,
    agent: Child,
    _envoy: Child,
    ports: Ports,
    scratch: tempfile::TempDir,
    _user: Unprivileged,
    /// When the agent logged its first issued certificate.
    issued: Instant,
    /// Serial of the certificate Envoy got first.
    serial: String,
}

impl Sidecar {
    /// Starts everything with `SECRET_TTL=secret_ttl` and the token from `token` (given the
    /// control plane, so it can be signed by its issuer key); waits until Envoy has the
    /// certificate.
    fn start(secret_ttl: &str, token: impl FnOnce(&LocalIstiod) -> String) -> Option<Sidecar> {
        let envoy = envoy_bin()?;
        // Short path: the bootstrap names the sockets relative to this dir (UDS path limit).
        let scratch = tempfile::Builder::new()
            .prefix("idf-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let istiod = LocalIstiod::start(&httpbin_config());
        istiod.provision(scratch.path(), SERVICE_ACCOUNT);
        write_atomic(&scratch.path().join(TOKEN), &token(&istiod));
        let user = Unprivileged::new(scratch.path(), &envoy);
        let ports = Ports::free();

        let bootstrap = write_bootstrap(
            &user,
            scratch.path(),
            istiod.secure,
            SERVICE_ACCOUNT,
            &ports,
        );

        let mut cmd = user.command("pilot-agent");
        cmd.args(["proxy", "sidecar", "--external-envoy"])
            .current_dir(scratch.path());
        agent_env(&mut cmd, istiod.secure, SERVICE_ACCOUNT, &ports);
        cmd.env("SECRET_TTL", secret_ttl);
        let agent = Child::spawn("agent", cmd);
        agent.wait_for_line("workload certificate issued", Duration::from_secs(20));
        let issued = Instant::now();

        let envoy = start_envoy(&user, &bootstrap, scratch.path());
        let mut sidecar = Sidecar {
            istiod,
            agent,
            _envoy: envoy,
            ports,
            scratch,
            _user: user,
            issued,
            serial: String::new(),
        };
        sidecar.serial = assert_eventually(Duration::from_secs(20), || {
            match sidecar.serials()?.as_slice() {
                [one] => Ok(one.clone()),
                other => Err(format!("Envoy's workload certificates: {other:?}")),
            }
        });
        Some(sidecar)
    }

    fn admin(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports.admin))
    }

    /// Serials of the certificates with our SPIFFE id that Envoy holds (`/certs`).
    fn serials(&self) -> Result<Vec<String>, String> {
        let id = format!("spiffe://cluster.local/ns/demo/sa/{SERVICE_ACCOUNT}");
        cert_serials(http_get(self.admin(), "/certs")?, &id)
    }

    /// The agent's metrics (`/stats/prometheus` on the status port).
    fn agent_metrics(&self) -> String {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.ports.status));
        match http_get(addr, "/stats/prometheus") {
            Ok((200, body)) => body,
            other => panic!("agent /stats/prometheus: {other:?}"),
        }
    }

    fn agent_metric(&self, series: &str) -> f64 {
        metric(&self.agent_metrics(), series)
    }

    fn istiod_metric(&self, series: &str) -> f64 {
        match http_get(self.istiod.monitoring, "/metrics") {
            Ok((200, body)) => metric(&body, series),
            other => panic!("istiod-lite /metrics: {other:?}"),
        }
    }

    /// Envoy's per-host counter `name` of the `sds-grpc` cluster, from `/clusters` (host
    /// statistics are kept whatever the bootstrap's stats inclusion list, which leaves
    /// `cluster.sds-grpc.*` out as Istio's does).
    fn sds_host_stat(&self, name: &str) -> u64 {
        let (_, body) = http_get(self.admin(), "/clusters").expect("Envoy /clusters");
        let suffix = format!("::{name}::");
        body.lines()
            .filter(|l| l.starts_with("sds-grpc::"))
            .find_map(|l| l.split_once(&suffix).map(|(_, v)| v.trim().to_string()))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no sds-grpc {name} in Envoy's /clusters:\n{body}"))
    }

    /// The SDS connection from Envoy to the agent: opened once, still open.
    fn assert_sds_connection_kept(&self, when: &str) {
        let (total, active) = (
            self.sds_host_stat("cx_total"),
            self.sds_host_stat("cx_active"),
        );
        assert_eq!(
            (total, active),
            (1, 1),
            "{when}: Envoy's SDS connection to the agent was re-established \
             (cx_total {total}, cx_active {active})"
        );
    }

    fn count_agent_lines(&self, needle: &str) -> usize {
        self.agent
            .output()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }
}

/// Sum of the samples of `series` (`name` or `name{labels}`; `name` alone sums every label
/// set) in a Prometheus text body; 0 when absent.
fn metric(body: &str, series: &str) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(series)?;
            let rest = if series.ends_with('}') {
                rest
            } else if let Some(r) = rest.strip_prefix('{') {
                r.split_once('}')?.1
            } else {
                rest
            };
            if !rest.starts_with(' ') {
                return None;
            }
            rest.split_whitespace().next()?.parse::<f64>().ok()
        })
        .sum()
}

/// Replaces `path` atomically (temporary file + rename), readable by the agent's user.
fn write_atomic(path: &Path, contents: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).expect("write token");
    std::fs::rename(&tmp, path).expect("rename token");
}

fn jwt_exp(token: &str) -> SystemTime {
    sds::testing::jwt_expiry(token).expect("istiod-lite tokens are JWTs with exp")
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

const REQUESTS: &str = r#"istio_agent_num_outgoing_requests_total{request_type="csr"}"#;
const FAILED: &str = r#"istio_agent_num_failed_outgoing_requests_total{request_type="csr"}"#;
const RETRIES: &str = r#"istio_agent_num_outgoing_retries_total{request_type="csr"}"#;
const UNAVAILABLE: &str = r#"istio_agent_csr_failures_total{reason="unavailable"}"#;
const TOKEN_EXPIRED: &str = r#"istio_agent_csr_failures_total{reason="token_expired"}"#;
const ISSUED: &str = "citadel_server_success_cert_issuance_count_total";
const CSR_ERRORS: &str = "citadel_server_csr_error_count_total";
const CSRS: &str = "citadel_server_csr_count_total";

#[test]
fn ca_down_across_a_rotation_keeps_the_cert_then_rotates_once_back() {
    // 30 s certificates: rotation due ~15 s after issuance; the rotation backoff is capped at a
    // tenth of the lifetime (3 s), each failed round is 5 tries over ~1.5 s.
    const TTL: Duration = Duration::from_secs(30);
    const CAP: Duration = Duration::from_secs(3);
    let Some(mut s) = Sidecar::start("30s", |istiod| istiod.token(SERVICE_ACCOUNT, None)) else {
        return;
    };
    let serial = s.serial.clone();
    s.assert_sds_connection_kept("before the outage");

    // The CA goes away well before the rotation is due.
    let due = s.issued + TTL / 2;
    assert!(
        Instant::now() + Duration::from_secs(3) < due,
        "setup took too long: the rotation is due in less than 3 s"
    );
    s.istiod.kill();
    let stopped = Instant::now();
    let (req0, failed0, retries0) = (
        s.agent_metric(REQUESTS),
        s.agent_metric(FAILED),
        s.agent_metric(RETRIES),
    );
    assert_eq!(s.agent_metric(UNAVAILABLE), 0.0);

    // Down past the rotation point: wait for two failed rounds, checking all along that Envoy
    // keeps the same certificate.
    let mut first_failure: Option<Instant> = None;
    let deadline = s.issued + TTL - Duration::from_secs(8);
    loop {
        assert_eq!(
            s.serials().expect("Envoy /certs"),
            std::slice::from_ref(&serial),
            "Envoy's certificate changed while the CA was down"
        );
        let rounds = s.agent_metric(UNAVAILABLE);
        if rounds >= 1.0 && first_failure.is_none() {
            first_failure = Some(Instant::now());
        }
        if rounds >= 2.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "fewer than 2 failed rotation rounds {} after issuance",
            secs(s.issued.elapsed())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let first_failure = first_failure.expect("a failure was seen");
    assert!(
        first_failure + Duration::from_secs(1) >= due,
        "the agent called the CA {} before the rotation was due",
        secs(due - first_failure)
    );
    let outage = stopped.elapsed();
    let since_due = due.elapsed();
    let rounds = s.agent_metric(UNAVAILABLE);
    let attempts = s.agent_metric(REQUESTS) - req0;
    let failed = s.agent_metric(FAILED) - failed0;
    let retries = s.agent_metric(RETRIES) - retries0;
    println!(
        "FIGURE ca_outage: down {}, {} past the rotation point: {rounds} failed rounds, \
         {attempts} CSR attempts ({retries} retries, {failed} failed)",
        secs(outage),
        secs(since_due)
    );
    assert_eq!(
        failed, attempts,
        "every attempt failed while the CA was down"
    );
    assert!(retries >= 4.0, "the agent retried each round: {retries}");
    // Not a hot loop: at most 5 tries per round, and rounds at least ~1 s apart (plus the
    // ~1.5 s of tries in each).
    assert!(
        attempts <= 5.0 * (rounds + 1.0),
        "{attempts} attempts in {rounds} rounds"
    );
    assert!(
        rounds <= since_due.as_secs_f64() / 2.0 + 2.0,
        "{rounds} rounds in {} past the rotation point",
        secs(since_due)
    );
    assert!(
        s.count_agent_lines("certificate rotation failed; still serving the current certificate")
            >= 2,
        "the agent did not log its failed rotations"
    );
    let expiry = s.agent_metric(r#"istio_agent_cert_expiry_seconds{resource_name="default"}"#);
    assert!(
        expiry > 0.0,
        "the served certificate is still valid: {expiry}"
    );
    s.assert_sds_connection_kept("during the outage");

    // The CA comes back: same CA directory, same ports.
    s.istiod.restart();
    let back = Instant::now();
    let new = assert_eventually(CAP + Duration::from_secs(10), || {
        let serials = s.serials()?;
        match serials.iter().find(|x| **x != serial) {
            Some(n) => Ok(n.clone()),
            None => Err(format!("Envoy still has only {serials:?}")),
        }
    });
    let recovery = back.elapsed();
    let attempts_total = s.agent_metric(REQUESTS) - req0;
    println!(
        "FIGURE ca_outage: CA ready again -> new certificate in Envoy: {} (backoff cap {}); \
         serial {serial} -> {new}; {attempts_total} CSR attempts from the kill to the rotation",
        secs(recovery),
        secs(CAP)
    );
    assert!(
        recovery <= CAP + Duration::from_secs(6),
        "rotation took {} after the CA came back (cap {} + 1.5 s of tries + slack)",
        secs(recovery),
        secs(CAP)
    );
    assert!(
        s.istiod_metric(ISSUED) >= 1.0,
        "the restarted istiod-lite issued the certificate"
    );
    s.assert_sds_connection_kept("after the rotation");
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one token file told in order: token A, its replacement B, A expired before the first rotation, B expired before the second and the clear failure after it; each step is timed from the one before"
)]
fn token_rotated_then_expired_uses_the_new_one_then_fails_clearly() {
    // 20 s certificates: rotations ~10 s and ~20 s after the first issuance. The first token
    // lives 6 s (expired at the first rotation); the second is written right away and lives
    // until ~15 s (valid at the first rotation, expired at the second).
    const TTL: Duration = Duration::from_secs(20);
    let mut token_a = String::new();
    let Some(s) = Sidecar::start("20s", |istiod| {
        token_a = istiod.token(SERVICE_ACCOUNT, Some("6s"));
        token_a.clone()
    }) else {
        return;
    };
    let exp_a = jwt_exp(&token_a);
    let token_path = s.scratch.path().join(TOKEN);

    // Token B, expiring ~15 s after the first issuance, replaces A atomically.
    let until = (s.issued + Duration::from_secs(15)).saturating_duration_since(Instant::now());
    let token_b = s
        .istiod
        .token(SERVICE_ACCOUNT, Some(&format!("{}s", until.as_secs())));
    assert_ne!(token_a, token_b);
    write_atomic(&token_path, &token_b);
    let exp_b = jwt_exp(&token_b);

    // A expires before the rotation: Envoy must still have the first certificate then, so the
    // next CSR cannot have carried A (the CA refuses an expired token, with no leeway).
    while SystemTime::now() <= exp_a {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        s.serials().expect("Envoy /certs"),
        std::slice::from_ref(&s.serial),
        "the rotation came before token A expired ({} after issuance): the proof needs it after",
        secs(s.issued.elapsed())
    );
    let (issued0, errors0) = (s.istiod_metric(ISSUED), s.istiod_metric(CSR_ERRORS));
    let rotated = assert_eventually(Duration::from_secs(12), || {
        let serials = s.serials()?;
        match serials.iter().find(|x| **x != s.serial) {
            Some(n) => Ok(n.clone()),
            None => Err(format!("Envoy still has only {serials:?}")),
        }
    });
    let rotated_at = s.issued.elapsed();
    let a_expired_before = SystemTime::now().duration_since(exp_a).unwrap_or_default();
    assert!(
        SystemTime::now() < exp_b,
        "token B expired before the rotation was seen"
    );
    assert_eq!(
        (
            s.istiod_metric(ISSUED) - issued0,
            s.istiod_metric(CSR_ERRORS) - errors0
        ),
        (1.0, 0.0),
        "one certificate issued with token B, no CSR refused (A was never sent)"
    );
    assert_eq!(s.agent_metric(TOKEN_EXPIRED), 0.0);
    println!(
        "FIGURE token_rotation: rotation seen {} after issuance, with the replaced token \
         (token A had expired {} before); serial {} -> {rotated}",
        secs(rotated_at),
        secs(a_expired_before),
        s.serial
    );

    // B expires with no replacement; the next rotation (~20 s) finds it expired.
    let (csrs0, req0) = (s.istiod_metric(CSRS), s.agent_metric(REQUESTS));
    let mut first_failure: Option<Instant> = None;
    let deadline = s.issued + TTL + Duration::from_secs(10);
    loop {
        let n = s.agent_metric(TOKEN_EXPIRED);
        if n >= 1.0 && first_failure.is_none() {
            first_failure = Some(Instant::now());
            assert!(SystemTime::now() >= exp_b, "token B reported expired early");
        }
        if n >= 3.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "fewer than 3 token_expired failures {} after issuance",
            secs(s.issued.elapsed())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let first_failure = first_failure.expect("a failure was seen");
    let window = first_failure.elapsed();
    let failures = s.agent_metric(TOKEN_EXPIRED);

    // The error names the file and the expiry time (RFC 3339, UTC).
    let exp_secs = exp_b
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after epoch")
        .as_secs();
    let hms = format!(
        "T{:02}:{:02}:{:02}Z",
        (exp_secs % 86400) / 3600,
        (exp_secs % 3600) / 60,
        exp_secs % 60
    );
    let line = s
        .agent
        .output()
        .into_iter()
        .find(|l| l.contains("expired at "))
        .expect("the agent logged the expired token");
    assert!(
        line.contains("token at ") && line.contains(TOKEN),
        "the log line names the token file: {line}"
    );
    assert!(
        line.contains(&hms),
        "the log line gives the expiry time ({hms}): {line}"
    );
    println!("FIGURE token_expired: log line: {line}");

    // Bounded: backoff 1 s, then the 2 s cap (a tenth of 20 s); nothing sent to the CA.
    assert!(
        failures <= window.as_secs_f64() / 0.9 + 2.0,
        "{failures} failures in {}: a hot loop",
        secs(window)
    );
    assert_eq!(
        s.istiod_metric(CSRS) - csrs0,
        0.0,
        "the expired token was sent to the CA"
    );
    assert_eq!(s.agent_metric(REQUESTS) - req0, 0.0);
    assert_eq!(
        s.serials().expect("Envoy /certs"),
        std::slice::from_ref(&rotated),
        "Envoy keeps the last certificate"
    );
    s.assert_sds_connection_kept("after the token expired");
    println!(
        "FIGURE token_expired: {failures} failed rounds in {} after the first \
         (csr_failures_total{{reason=\"token_expired\"}}), 0 CSRs sent to the CA",
        secs(window)
    );
}

#[cfg(test)]
mod tests {
    use super::metric;

    #[test]
    fn metric_reads_one_series_or_sums_a_family() {
        let body = "# HELP x_total x\n\
                    x_total{reason=\"a\"} 2\n\
                    x_total{reason=\"b\"} 3\n\
                    x_total_other 9\n\
                    y 1.5\n";
        assert_eq!(metric(body, "x_total{reason=\"a\"}"), 2.0);
        assert_eq!(metric(body, "x_total"), 5.0);
        assert_eq!(metric(body, "y"), 1.5);
        assert_eq!(metric(body, "z"), 0.0);
    }
}
