//! Our agent against Istio's own istiod: `pilot-discovery discovery` from `ISTIO_GO_BIN` (the
//! pinned istio module's build, `scripts/cluster/build.sh istio`) outside a cluster as
//! docs/istiod.md says: the file config source, the CA plugged in from istiod-lite's cacerts
//! folder, and a real API server with no nodes (`harness::kube_api`: etcd and kube-apiserver
//! from the pinned builds), which issues the service-account tokens and judges them for istiod
//! through TokenReview.
//! With upstream Envoy through `pilot-agent proxy sidecar --external-envoy`:
//! - the workload certificate comes from istiod's CA (CSR API) and reaches Envoy over SDS;
//! - every xDS type istiod sends is accepted once the two Istio-only extensions upstream Envoy
//!   lacks are turned off in istiod (`PILOT_ENABLE_METADATA_EXCHANGE=false`,
//!   `PILOT_ENABLE_ALPN_FILTER=false`; with them on, Envoy NACKs CDS and LDS, checked first);
//! - NDS: istiod's ServiceEntries resolve through our DNS proxy;
//! - istiod SIGKILLed and started again: Envoy's ADS stream to the agent is kept, the agent
//!   replays its subscriptions, and Envoy is SYNCED again (the time is printed; the 1 s goal is
//!   checked by `scripts/bench-side-by-side.sh`, not here);
//! - two istiods on the same files (CA root and key, config folder) as a comma-separated
//!   `discoveryAddress`, the one in use SIGKILLed: Envoy is SYNCED via the other within 2 s (goal
//!   1 s, printed as `FIGURE`), its ADS stream to the agent never re-opened, and the next
//!   certificate signed by the other's CA (`live_istiods_failover`);
//! - warm start (`XDS_PROXY_PREFETCH`, Envoy started by the agent behind a gate): a NACK of the
//!   prefetched CDS is recorded by istiod with Envoy's error, and a change istiod pushes before
//!   Envoy asks is what Envoy gets (`live_istiod_warm_start`).
//!
//! The test command builds Istio's binaries first and sets `ISTIO_GO_BIN`; without them these
//! tests skip, and fail under `CI=true`.

use harness::kube_api::ApiServer;
use harness::local::{Ports, Unprivileged, agent_env, free_port, start_envoy, write_file};
use harness::{Child, assert_eventually, envoy_bin, http_get, istio_go_bin, repo_root};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const SERVICE_ACCOUNT: &str = "live-sa";

/// Istio's pilot-discovery on loopback.
struct Istiod {
    child: Option<Child>,
    bin: PathBuf,
    dir: PathBuf,
    kubeconfig: PathBuf,
    istio_extensions: bool,
    http: SocketAddr,
    secure_grpc: SocketAddr,
    monitoring: SocketAddr,
}

impl Istiod {
    /// Writes its files under `dir` (cacerts from `ca_dir`) and starts it.
    fn start(go_bin: &Path, dir: &Path, ca_dir: &Path, api: &ApiServer) -> Istiod {
        write_files(dir, ca_dir);
        Istiod::start_on(go_bin, dir, api, true)
    }

    /// Starts one on the files [`write_files`] wrote under `dir` (several may share them), on
    /// fresh loopback ports.
    fn start_on(go_bin: &Path, dir: &Path, api: &ApiServer, istio_extensions: bool) -> Istiod {
        let mut istiod = Istiod {
            child: None,
            bin: go_bin.join("pilot-discovery"),
            dir: dir.to_path_buf(),
            kubeconfig: api.kubeconfig().to_path_buf(),
            istio_extensions,
            http: loopback(free_port()),
            secure_grpc: loopback(free_port()),
            monitoring: loopback(free_port()),
        };
        istiod.spawn();
        istiod
    }

    fn spawn(&mut self) {
        let d = &self.dir;
        let mut cmd = Command::new(&self.bin);
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("POD_NAMESPACE", "istio-system")
            .env("ROOT_CA_DIR", d.join("cacerts"))
            .arg("discovery")
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--configDir={}", d.join("config").display()))
            .arg(format!("--meshConfig={}", d.join("mesh.yaml").display()))
            .arg(format!(
                "--networksConfig={}",
                d.join("meshNetworks").display()
            ))
            .arg(format!("--httpAddr={}", self.http))
            .arg(format!("--secureGRPCAddr={}", self.secure_grpc))
            .arg(format!("--grpcAddr={}", loopback(free_port())))
            .arg(format!("--httpsAddr={}", loopback(free_port())))
            .arg(format!("--monitoringAddr={}", self.monitoring))
            .args(["--ctrlz_port=0", "--log_output_level=default:warn"]);
        if !self.istio_extensions {
            cmd.env("PILOT_ENABLE_METADATA_EXCHANGE", "false")
                .env("PILOT_ENABLE_ALPN_FILTER", "false");
        }
        self.child = Some(Child::spawn("istiod", cmd));
        self.wait_ready();
    }

    fn wait_ready(&self) {
        assert_eventually(Duration::from_secs(60), || {
            match http_get(self.http, "/ready") {
                Ok((200, _)) => Ok(()),
                other => Err(format!("istiod /ready: {other:?}")),
            }
        });
    }

    /// SIGKILL, waits for the exit.
    fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        child.signal(nix::sys::signal::Signal::SIGKILL);
        assert!(child.wait_timeout(Duration::from_secs(10)).is_some());
    }

    /// Certificates its CA signed so far (`citadel_server_success_cert_issuance_count` on the
    /// monitoring port).
    fn issued(&self) -> Result<u64, String> {
        let (code, body) = http_get(self.monitoring, "/metrics")?;
        if code != 200 {
            return Err(format!("/metrics {code}"));
        }
        Ok(body
            .lines()
            .filter(|l| l.starts_with("citadel_server_success_cert_issuance_count"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64)
    }

    /// `/debug/syncz` for our proxy: Ok when CDS, LDS, RDS and EDS were sent and the last of
    /// each acked; the error says which is not.
    fn synced(&self) -> Result<(), String> {
        let row = &syncz_row(self)?;
        for ty in ["cluster", "listener", "route", "endpoint"] {
            let sent = row[format!("{ty}_sent")].as_str().unwrap_or_default();
            let acked = row[format!("{ty}_acked")].as_str().unwrap_or_default();
            if sent.is_empty() || sent != acked {
                return Err(format!("{ty}: sent {sent:?}, acked {acked:?}"));
            }
        }
        Ok(())
    }
}

/// istiod's files under `dir`: the config folder, mesh config and cacerts (from `ca_dir`).
fn write_files(dir: &Path, ca_dir: &Path) {
    let data = repo_root().join("tests/data/live-istiod");
    std::fs::create_dir_all(dir.join("config")).expect("mkdir");
    std::fs::create_dir_all(dir.join("cacerts")).expect("mkdir");
    for f in ["services.yaml", "policy.yaml"] {
        std::fs::copy(data.join("config").join(f), dir.join("config").join(f)).expect("copy");
    }
    std::fs::copy(data.join("mesh.yaml"), dir.join("mesh.yaml")).expect("copy mesh");
    write_file(&dir.join("meshNetworks"), "");
    for f in [
        "ca-cert.pem",
        "ca-key.pem",
        "root-cert.pem",
        "cert-chain.pem",
    ] {
        std::fs::copy(ca_dir.join(f), dir.join("cacerts").join(f)).expect("copy cacerts");
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The agent and Envoy in a scratch folder, against `istiods` (several: a comma-separated
/// `discoveryAddress`, in this order).
struct Sidecar {
    agent: Child,
    envoy: Child,
    admin: SocketAddr,
    status: SocketAddr,
    dns: SocketAddr,
}

fn start_sidecar(
    scratch: &Path,
    envoy_path: &Path,
    istiods: &[&Istiod],
    token: &str,
    extra_env: &[(&str, &str)],
) -> Sidecar {
    let istiod = istiods[0];
    write_file(&scratch.join("var/run/secrets/tokens/istio-token"), token);
    write_file(
        &scratch.join("var/run/secrets/istio/root-cert.pem"),
        &std::fs::read_to_string(istiod.dir.join("cacerts/root-cert.pem")).expect("root"),
    );
    let user = Unprivileged::new(scratch, envoy_path);
    let ports = Ports::free();
    let dns = loopback(free_port());
    let env = |cmd: &mut Command| {
        agent_env(cmd, istiod.secure_grpc, SERVICE_ACCOUNT, &ports);
        let discovery: Vec<String> = istiods.iter().map(|i| i.secure_grpc.to_string()).collect();
        cmd.env(
            "PROXY_CONFIG",
            format!(
                r#"{{"discoveryAddress":"{}","statusPort":{},"proxyAdminPort":{}}}"#,
                discovery.join(","),
                ports.status,
                ports.admin
            ),
        )
        .env("ISTIO_META_DNS_CAPTURE", "true")
        .env("DNS_PROXY_ADDR", dns.to_string())
        .envs(extra_env.iter().copied());
    };
    let mut boot = user.command("pilot-agent");
    boot.args(["bootstrap", "sidecar"]).current_dir(scratch);
    env(&mut boot);
    let out = boot.output().expect("pilot-agent bootstrap");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bootstrap = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let mut cmd = user.command("pilot-agent");
    cmd.args(["proxy", "sidecar", "--external-envoy"])
        .current_dir(scratch);
    env(&mut cmd);
    let agent = Child::spawn("agent", cmd);
    agent.wait_for_line("agent listeners bound", Duration::from_secs(20));
    let envoy = start_envoy(&user, &bootstrap, scratch);
    Sidecar {
        agent,
        envoy,
        admin: loopback(ports.admin),
        status: loopback(ports.status),
        dns,
    }
}

impl Sidecar {
    fn ready(&self) -> Result<(), String> {
        match http_get(self.status, "/healthz/ready")? {
            (200, _) => Ok(()),
            (code, body) => Err(format!("/healthz/ready {code}: {body}")),
        }
    }

    fn admin(&self, path: &str) -> String {
        let (code, body) = http_get(self.admin, path).expect(path);
        assert_eq!(code, 200, "{path}: {body}");
        body
    }

    /// `dig +short` through the DNS proxy.
    fn dig(&self, name: &str) -> String {
        let out = Command::new("dig")
            .args(["+short", "+tries=1", "+time=2", "-p"])
            .arg(self.dns.port().to_string())
            .arg(format!("@{}", self.dns.ip()))
            .arg(name)
            .output()
            .expect("dig");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// Lines of a child's output that contain `needle`.
fn lines(child: &Child, needle: &str) -> Vec<String> {
    child
        .output()
        .into_iter()
        .filter(|l| l.contains(needle))
        .collect()
}

/// What each test here starts from: Istio's Go binaries, Envoy, a scratch folder under /tmp,
/// an istiod-lite for its CA folder (Istio's cacerts layout; istiod plugs it in) and the API
/// server.
struct Live {
    go_bin: PathBuf,
    envoy_path: PathBuf,
    work: tempfile::TempDir,
    lite: harness::local::LocalIstiod,
    api: ApiServer,
}

/// [`Live`], its scratch folder named `prefix…`; `None` (outside CI) without Istio's
/// binaries, Envoy or one of `bins`.
fn live(prefix: &str, bins: &[&str]) -> Option<Live> {
    let go_bin = istio_go_bin()?;
    let envoy_path = envoy_bin()?;
    if !bins.iter().all(|b| harness::require_bin(b)) {
        return None;
    }
    let work = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .expect("tempdir");
    let lite = harness::local::LocalIstiod::start("");
    let api = ApiServer::start(&work.path().join("apiserver"))?;
    // istiod's own namespace, where it keeps its leader-election leases.
    api.kubectl(&["create", "namespace", "istio-system"])
        .expect("istio-system");
    Some(Live {
        go_bin,
        envoy_path,
        work,
        lite,
        api,
    })
}

#[test]
fn live_istiod_certificate_xds_nds_and_restart() {
    let Some(l) = live("live-istiod-", &["dig"]) else {
        return;
    };
    let Live {
        go_bin,
        envoy_path,
        work,
        lite,
        api,
    } = l;
    let ca_dir = lite.ca_dir.path().to_path_buf();
    let mut istiod = Istiod::start(&go_bin, &work.path().join("istiod"), &ca_dir, &api);
    let token = api.token("demo", SERVICE_ACCOUNT);

    // 1. With Istio's defaults, upstream Envoy rejects the Istio-only extensions in CDS and LDS.
    {
        let scratch = work.path().join("defaults");
        let sidecar = start_sidecar(&scratch, &envoy_path, &[&istiod], &token, &[]);
        let nacks = assert_eventually(Duration::from_secs(30), || {
            let nacks = lines(&sidecar.agent, "Envoy rejected an xDS response");
            let cds = nacks.iter().any(|l| {
                l.contains("envoy.config.cluster.v3.Cluster")
                    && l.contains("envoy.tcp.metadataexchange.config.MetadataExchange")
            });
            let lds = nacks.iter().any(|l| {
                l.contains("envoy.config.listener.v3.Listener")
                    && l.contains("io.istio.http.peer_metadata.Config")
            });
            if cds && lds {
                Ok(nacks)
            } else {
                Err(format!(
                    "want CDS and LDS NACKs for metadata exchange: {nacks:?}"
                ))
            }
        });
        eprintln!("with Istio's defaults, Envoy NACKed: {nacks:#?}");
        drop(sidecar);
    }

    // 2. Without them, everything istiod sends is accepted.
    istiod.kill();
    istiod.istio_extensions = false;
    istiod.spawn();
    // 10 s certificates: the agent rotates at half their life, against istiod's CA.
    let scratch = work.path().join("sidecar");
    let sidecar = start_sidecar(
        &scratch,
        &envoy_path,
        &[&istiod],
        &token,
        &[("SECRET_TTL", "10s")],
    );
    assert_eventually(Duration::from_secs(30), || sidecar.ready());
    assert_eventually(Duration::from_secs(30), || istiod.synced());
    let nacks = lines(&sidecar.agent, "Envoy rejected an xDS response");
    assert!(nacks.is_empty(), "Envoy NACKed: {nacks:#?}");

    // The workload certificate was signed by istiod's CA (the plugged-in root) and reached
    // Envoy over SDS.
    let spiffe = format!("spiffe://cluster.local/ns/demo/sa/{SERVICE_ACCOUNT}");
    let issued = lines(&sidecar.agent, "workload certificate issued");
    assert!(
        issued.iter().any(|l| l.contains(&spiffe)),
        "no certificate for {spiffe}: {issued:?}"
    );
    let certs = sidecar.admin("/certs");
    assert!(certs.contains(&spiffe), "Envoy lacks {spiffe}: {certs}");
    let root_serial = root_serial(&ca_dir.join("root-cert.pem"));
    assert!(
        certs.to_lowercase().contains(&root_serial),
        "Envoy's CA certificate is not the plugged-in root (serial {root_serial}): {certs}"
    );

    // Rotation: a second certificate from istiod's CA, in Envoy (the serial changes).
    let first = harness::envoy::cert_serials((200, certs.clone()), &spiffe).expect("serials");
    assert_eventually(Duration::from_secs(30), || {
        let now = harness::envoy::cert_serials((200, sidecar.admin("/certs")), &spiffe)?;
        if now != first && !now.is_empty() {
            Ok(())
        } else {
            Err(format!("Envoy still has {first:?}"))
        }
    });
    let issued = lines(&sidecar.agent, "workload certificate issued");
    assert!(issued.len() >= 2, "no rotation: {issued:?}");

    // xDS: the clusters of the ServiceEntries, the WorkloadEntry's endpoint, the
    // DestinationRule's mTLS.
    let clusters = sidecar.admin("/clusters");
    for c in [
        "outbound|31080||httpbin.demo.svc.cluster.local::198.18.0.5:8080",
        "outbound|31980||reviews.demo.svc.cluster.local::198.18.0.7:31980",
    ] {
        assert!(clusters.contains(c), "Envoy lacks {c}");
    }
    // The DestinationRule's connection pool (maxConnections: 100) on httpbin's cluster.
    let dump = sidecar.admin("/config_dump?resource=dynamic_active_clusters");
    assert!(
        dump.contains("\"max_connections\": 100"),
        "the DestinationRule's connection pool is not in CDS"
    );

    // NDS: the ServiceEntries resolve through our DNS proxy.
    assert_eventually(Duration::from_secs(10), || {
        match sidecar.dig("httpbin.demo.svc.cluster.local") {
            a if a == "198.19.0.10" => Ok(()),
            a => Err(format!("httpbin: {a:?}")),
        }
    });
    assert_eq!(sidecar.dig("reviews.demo.svc.cluster.local"), "198.19.0.11");

    // 3. istiod SIGKILLed and back: same ADS stream, SYNCED again.
    let streams = super::xds_reconnect::ads_streams(sidecar.admin);
    istiod.kill();
    istiod.spawn();
    let back = Instant::now();
    assert_eventually(Duration::from_secs(30), || istiod.synced());
    eprintln!(
        "SYNCED {} ms after istiod answered /ready again",
        back.elapsed().as_millis()
    );
    assert_eq!(
        super::xds_reconnect::ads_streams(sidecar.admin),
        streams,
        "Envoy re-opened its ADS stream"
    );
    assert_eventually(Duration::from_secs(10), || sidecar.ready());
    let nacks = lines(&sidecar.agent, "Envoy rejected an xDS response");
    assert!(
        nacks.is_empty(),
        "Envoy NACKed after the restart: {nacks:#?}"
    );
    drop(sidecar.envoy);
}

/// Two istiods on one set of files (the same plugged-in CA root and key, the same config
/// folder), given to the agent as a comma-separated `discoveryAddress`; the one in use is
/// SIGKILLed. Envoy is SYNCED via the other within the bound, its ADS stream to the agent is
/// never re-opened, and the next certificate is signed by the other's CA.
#[test]
fn live_istiods_failover() {
    let Some(l) = live("live-istiods-", &[]) else {
        return;
    };
    let Live {
        go_bin,
        envoy_path,
        work,
        lite,
        api,
    } = l;
    let files = work.path().join("istiod");
    write_files(&files, lite.ca_dir.path());
    let mut istiods = vec![
        Istiod::start_on(&go_bin, &files, &api, false),
        Istiod::start_on(&go_bin, &files, &api, false),
    ];
    let token = api.token("demo", SERVICE_ACCOUNT);
    // 8 s certificates: a rotation every 4 s (grace ratio 0.5).
    let sidecar = start_sidecar(
        &work.path().join("sidecar"),
        &envoy_path,
        &[&istiods[0], &istiods[1]],
        &token,
        &[("SECRET_TTL", "8s")],
    );
    assert_eventually(Duration::from_secs(30), || sidecar.ready());
    let in_use = assert_eventually(Duration::from_secs(30), || {
        istiods
            .iter()
            .position(|i| i.synced().is_ok())
            .ok_or_else(|| "not SYNCED on either istiod".to_string())
    });
    let streams = super::xds_reconnect::ads_streams(sidecar.admin);
    let mut dead = istiods.remove(in_use);
    let other = &istiods[0];
    assert!(
        other.synced().is_err(),
        "the other istiod already has our proxy"
    );
    // Both connections (ADS and CA) take the addresses in order: until the kill, the one in use
    // signed every certificate.
    let issued_before = other.issued().expect("the other istiod's /metrics");
    let signed_by_dead = dead.issued().expect("/metrics of the istiod in use");
    assert!(
        signed_by_dead >= 1 && issued_before == 0,
        "before the kill the istiod in use signed {signed_by_dead}, the other {issued_before}"
    );

    // Timed from the signal (the exit is awaited after), as the istiod-lite version does.
    let killed = Instant::now();
    let mut dead = dead.child.take().expect("running");
    dead.signal(nix::sys::signal::Signal::SIGKILL);
    assert_eventually(Duration::from_secs(20), || other.synced());
    let on_other = killed.elapsed();
    assert!(
        dead.wait_timeout(Duration::from_secs(10)).is_some(),
        "istiod did not exit after SIGKILL"
    );
    eprintln!(
        "FIGURE live_istiods_failover: Envoy SYNCED via the other istiod {on_other:?} after SIGKILL of the one in use"
    );
    // Goal 1 s; the margin absorbs a loaded 2-core host (as tests/tests/agent/istiod_failover.rs).
    assert!(
        on_other <= Duration::from_millis(2000),
        "Envoy SYNCED via the other istiod only {on_other:?} after the kill"
    );
    assert_eq!(
        super::xds_reconnect::ads_streams(sidecar.admin),
        streams,
        "Envoy re-opened its ADS stream to the agent"
    );

    // The next certificate is signed by the other istiod's CA and reaches Envoy.
    let spiffe = format!("spiffe://cluster.local/ns/demo/sa/{SERVICE_ACCOUNT}");
    let serials_before =
        harness::envoy::cert_serials((200, sidecar.admin("/certs")), &spiffe).expect("serials");
    assert_eventually(Duration::from_secs(30), || {
        let issued = other.issued()?;
        (issued > issued_before)
            .then_some(())
            .ok_or(format!("the other istiod signed {issued} certificates"))
    });
    let rotated = killed.elapsed();
    assert_eventually(Duration::from_secs(20), || {
        let serials = harness::envoy::cert_serials((200, sidecar.admin("/certs")), &spiffe)?;
        serials
            .iter()
            .any(|s| !serials_before.contains(s))
            .then_some(())
            .ok_or(format!("Envoy still has {serials:?}"))
    });
    eprintln!(
        "FIGURE live_istiods_failover: certificate signed by the other istiod {rotated:?} after the kill (SECRET_TTL 8s)"
    );
    assert_eq!(
        super::xds_reconnect::ads_streams(sidecar.admin),
        streams,
        "Envoy re-opened its ADS stream to the agent"
    );
    assert_eventually(Duration::from_secs(10), || sidecar.ready());
    let nacks = lines(&sidecar.agent, "Envoy rejected an xDS response");
    assert!(nacks.is_empty(), "Envoy NACKed: {nacks:#?}");
    drop(sidecar.envoy);
}

/// The serial of the first certificate in `path`, lower-case hex as Envoy's `/certs` prints it.
fn root_serial(path: &Path) -> String {
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-serial", "-in"])
        .arg(path)
        .output()
        .expect("openssl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("serial=")
        .to_lowercase()
}

/// Our proxy's row of Istio's `/debug/syncz`; an error unless there is exactly one.
fn syncz_row(istiod: &Istiod) -> Result<serde_json::Value, String> {
    let (code, body) = http_get(istiod.http, "/debug/syncz")?;
    if code != 200 {
        return Err(format!("/debug/syncz {code}: {body}"));
    }
    let rows: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    let rows: Vec<&serde_json::Value> = rows
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["proxy"].as_str() == Some("local.demo"))
        .collect();
    match rows[..] {
        [row] => Ok(row.clone()),
        _ => Err(format!("want one connection of our proxy: {body}")),
    }
}

fn cluster_sent(istiod: &Istiod) -> Result<String, String> {
    let row = syncz_row(istiod)?;
    row["cluster_sent"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .ok_or_else(|| format!("no CDS sent yet: {row}"))
}

/// Warm start (`XDS_PROXY_PREFETCH`) against Istio's istiod, Envoy started by the agent behind
/// a gate (`warm_start::start_gated`):
/// - with Istio's defaults, istiod sends CDS to the agent's node before Envoy runs; upstream
///   Envoy rejects that prefetched CDS (Istio-only metadata exchange), and istiod records
///   Envoy's error for it (`/debug/syncz`, `resources.<CDS>.lastError`);
/// - without Istio's extensions: a ServiceEntry added while Envoy is held back makes istiod push
///   a second CDS before Envoy asks (istiod, unlike istiod-lite, does not wait for an ACK);
///   Envoy gets the newest (the new cluster), one connection SYNCED, Envoy's first responses
///   from the agent's prefetch.
#[test]
fn live_istiod_warm_start() {
    use crate::warm_start::{SERVICE_ACCOUNT as WARM_SA, envoy_has_cluster, start_gated};
    let Some(l) = live("live-warm-", &[]) else {
        return;
    };
    let Live {
        go_bin,
        envoy_path,
        work,
        lite,
        api,
    } = l;
    let ca_dir = lite.ca_dir.path().to_path_buf();
    let mut istiod = Istiod::start(&go_bin, &work.path().join("istiod"), &ca_dir, &api);
    let token = api.token("demo", WARM_SA);
    let root = std::fs::read_to_string(istiod.dir.join("cacerts/root-cert.pem")).expect("root");
    let provision = |d: &Path| {
        write_file(&d.join("var/run/secrets/tokens/istio-token"), &token);
        write_file(&d.join("var/run/secrets/istio/root-cert.pem"), &root);
    };
    let served = |g: &crate::warm_start::Gated| {
        g.agent_counter("istio_agent_xds_proxy_prefetch_served_total")
            .unwrap_or(0.0)
    };

    // 1. A NACK of the prefetched CDS reaches istiod with Envoy's error.
    {
        let g = start_gated(&envoy_path, istiod.secure_grpc, provision, &[]);
        let sent = assert_eventually(Duration::from_secs(30), || cluster_sent(&istiod));
        assert!(g.envoy_ready().is_err(), "Envoy is behind its gate");
        g.open();
        let error = assert_eventually(Duration::from_secs(30), || {
            let row = syncz_row(&istiod)?;
            row["resources"][CLUSTER_URL]["lastError"]
                .as_str()
                .filter(|e| !e.is_empty())
                .map(str::to_string)
                .ok_or_else(|| format!("no CDS error recorded yet: {row}"))
        });
        assert!(
            error.contains("envoy.tcp.metadataexchange.config.MetadataExchange"),
            "istiod has Envoy's error for the prefetched CDS: {error}"
        );
        let row = syncz_row(&istiod).expect("syncz");
        assert_eq!(
            row["cluster_sent"].as_str(),
            Some(sent.as_str()),
            "the NACK answered the prefetched push: {row}"
        );
        assert!(served(&g) >= 1.0, "CDS came from the prefetch");
    }

    // 2. A change between the prefetch and Envoy's request is what Envoy gets.
    istiod.kill();
    istiod.istio_extensions = false;
    istiod.spawn();
    let g = start_gated(&envoy_path, istiod.secure_grpc, provision, &[]);
    let first = assert_eventually(Duration::from_secs(30), || cluster_sent(&istiod));
    write_file(
        &istiod.dir.join("config/late.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\n\
         metadata: { name: late, namespace: demo }\n\
         spec:\n  hosts: [late.demo.svc.cluster.local]\n  addresses: [198.19.0.12]\n  \
         ports: [{ number: 31081, name: http, protocol: HTTP, targetPort: 8080 }]\n  \
         location: MESH_INTERNAL\n  resolution: STATIC\n  endpoints: [{ address: 198.18.0.6 }]\n",
    );
    assert_eventually(Duration::from_secs(30), || {
        let now = cluster_sent(&istiod)?;
        (now != first)
            .then_some(())
            .ok_or_else(|| format!("istiod has not pushed the change yet ({now})"))
    });
    g.open();
    assert_eventually(Duration::from_secs(30), || {
        envoy_has_cluster(g.envoy_admin, "outbound|31081||late.demo.svc.cluster.local")
    });
    assert_eventually(Duration::from_secs(30), || istiod.synced());
    let nacks = lines(&g.agent, "Envoy rejected an xDS response");
    assert!(nacks.is_empty(), "Envoy NACKed: {nacks:#?}");
    let n = served(&g);
    eprintln!("responses served from the prefetch: {n}");
    assert!(
        n >= 2.0,
        "Envoy's first CDS and LDS came from the prefetch: {n}"
    );
}

const CLUSTER_URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
