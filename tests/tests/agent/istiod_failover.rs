//! Several istiod addresses (issue 16): two istiod-lite sharing one CA directory and one config
//! directory, on 127.0.0.2 and 127.0.0.3 (one port), given to the agent as a comma-separated
//! `discoveryAddress`, or as one name that resolves to both IPs (Istio's form: a Service name
//! with several istiod pods behind a headless Service, or a DNS name with several A records);
//! the CA address follows it. With real Envoy (the local harness), the one
//! in use is SIGKILLed: Envoy is SYNCED via the other within a bound, its ADS stream to the agent
//! is never re-opened, and the next certificate rotation is signed by the other CA.

use harness::local::{
    HTTPBIN_HOST, Ports, Unprivileged, agent_env, httpbin_config, listen_addr, start_envoy,
    write_bootstrap, write_file,
};
use harness::{Child, assert_eventually, envoy_bin, http_get, workspace_bin};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::xds_reconnect::{ads_streams, synced};

const SERVICE_ACCOUNT: &str = "failover-sa";

/// One istiod-lite with every listener on `ip`, port 0.
struct Istiod {
    child: Child,
    secure: SocketAddr,
    monitoring: SocketAddr,
}

impl Istiod {
    /// Listens on `ip`, its secure gRPC port `secure_port` (0: any).
    fn start(ip: &str, secure_port: u16, config_dir: &Path, ca_dir: &Path) -> Istiod {
        let any = format!("{ip}:0");
        let secure = format!("{ip}:{secure_port}");
        let mut cmd = Command::new(workspace_bin("istiod-lite"));
        cmd.arg("serve")
            .arg("--config-dir")
            .arg(config_dir)
            .arg("--ca-dir")
            .arg(ca_dir)
            .args(["--grpc-addr", &any, "--secure-grpc-addr", &secure])
            .args(["--monitoring-addr", &any])
            .env("RUST_LOG", "info");
        let child = Child::spawn(&format!("istiod-lite@{ip}"), cmd);
        let secure = listen_addr(&child, "secure-grpc");
        let monitoring = listen_addr(&child, "monitoring");
        harness::local::wait_ready(monitoring);
        Istiod {
            child,
            secure,
            monitoring,
        }
    }

    /// Certificates this istiod-lite signed so far (its `issued certificate` log lines).
    fn issued(&self) -> usize {
        self.child
            .output()
            .iter()
            .filter(|l| l.contains("issued certificate"))
            .count()
    }
}

/// How the agent is given the two istiods.
#[derive(Clone, Copy, Debug)]
enum Address {
    /// `discoveryAddress: "127.0.0.2:<port>,127.0.0.3:<port>"` (our extension).
    List,
    /// `discoveryAddress: "istiod.failover.test:<port>"`, one name with both IPs (in the
    /// agent's own `/etc/hosts`, bind-mounted in a private mount namespace), Istio's form.
    Name,
}

/// The name of [`Address::Name`].
const MULTI_IP_NAME: &str = "istiod.failover.test";

#[test]
fn agent_fails_over_to_the_other_istiod() {
    fails_over(Address::List);
}

#[test]
fn agent_fails_over_between_the_ips_of_one_name() {
    fails_over(Address::Name);
}

/// `cmd` run in a mount namespace of its own whose `/etc/hosts` is `hosts`.
fn with_hosts_file(cmd: &Command, hosts: &Path) -> Command {
    let mut wrapped = Command::new("unshare");
    wrapped
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"mount --bind "$0" /etc/hosts && exec "$@""#)
        .arg(hosts)
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .env_clear();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            wrapped.env(k, v);
        }
    }
    if let Some(dir) = cmd.get_current_dir() {
        wrapped.current_dir(dir);
    }
    wrapped
}

#[expect(
    clippy::too_many_lines,
    reason = "one failover scenario told in order: two istiod-lites behind one name, the agent's one killed, Envoy synced through the other, the next rotation from the other CA; each step starts from the state the last one left"
)]
fn fails_over(form: Address) {
    let Some(envoy) = envoy_bin() else {
        return;
    };
    let scratch_dir = tempfile::Builder::new()
        .prefix("fo-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let scratch = scratch_dir.path();
    let config_dir = tempfile::tempdir().expect("tempdir");
    let ca_dir = tempfile::tempdir().expect("tempdir");
    write_file(&config_dir.path().join("mesh.yaml"), &httpbin_config());
    // The first creates the CA; the second loads it.
    let mut istiods = vec![Istiod::start(
        "127.0.0.2",
        0,
        config_dir.path(),
        ca_dir.path(),
    )];
    // Both on one port, so that one name with two IPs reaches either.
    let port = istiods[0].secure.port();
    istiods.push(Istiod::start(
        "127.0.0.3",
        port,
        config_dir.path(),
        ca_dir.path(),
    ));
    harness::local::provision(ca_dir.path(), scratch, SERVICE_ACCOUNT);

    let user = Unprivileged::new(scratch, &envoy);
    let ports = Ports::free();
    let bootstrap = write_bootstrap(&user, scratch, istiods[0].secure, SERVICE_ACCOUNT, &ports);
    let mut cmd = user.command("pilot-agent");
    cmd.args(["proxy", "sidecar", "--external-envoy"])
        .current_dir(scratch);
    agent_env(&mut cmd, istiods[0].secure, SERVICE_ACCOUNT, &ports);
    let address = match form {
        Address::List => format!("{},{}", istiods[0].secure, istiods[1].secure),
        Address::Name => format!("{MULTI_IP_NAME}:{port}"),
    };
    cmd.env(
        "PROXY_CONFIG",
        format!(
            r#"{{"discoveryAddress":"{address}","statusPort":{},"proxyAdminPort":{}}}"#,
            ports.status, ports.admin
        ),
    )
    // Short certificates: one rotation every few seconds (grace ratio 0.5).
    .env("SECRET_TTL", "8s");
    let hosts = scratch.join("hosts");
    write_file(
        &hosts,
        &format!("127.0.0.1 localhost\n127.0.0.2 {MULTI_IP_NAME}\n127.0.0.3 {MULTI_IP_NAME}\n"),
    );
    let cmd = match form {
        Address::List => cmd,
        Address::Name => with_hosts_file(&cmd, &hosts),
    };
    let agent = Child::spawn("agent", cmd);
    agent.wait_for_line("agent listeners bound", Duration::from_secs(20));
    let _envoy = start_envoy(&user, &bootstrap, scratch);
    let admin: SocketAddr = format!("127.0.0.1:{}", ports.admin).parse().expect("addr");

    // Which istiod-lite the agent is on.
    let in_use = assert_eventually(Duration::from_secs(30), || {
        istiods
            .iter()
            .position(|i| synced(i.monitoring).is_ok())
            .ok_or_else(|| "not SYNCED on either istiod-lite".to_string())
    });
    assert_eventually(Duration::from_secs(30), || {
        let (code, dump) = http_get(admin, "/config_dump?resource=dynamic_active_clusters")?;
        let want = format!("outbound|80||{HTTPBIN_HOST}");
        (code == 200 && dump.contains(&want))
            .then_some(())
            .ok_or(format!("Envoy lacks {want} ({code})"))
    });
    let streams = ads_streams(admin);
    let mut dead = istiods.remove(in_use);
    let other = &istiods[0];
    let issued_before = other.issued();

    let killed = Instant::now();
    dead.child.signal(nix::sys::signal::Signal::SIGKILL);
    assert_eventually(Duration::from_secs(20), || synced(other.monitoring));
    let on_other = killed.elapsed();
    assert!(
        dead.child.wait_timeout(Duration::from_secs(10)).is_some(),
        "istiod-lite did not exit after SIGKILL"
    );
    eprintln!(
        "FIGURE istiod_failover ({form:?}): Envoy SYNCED via the other istiod-lite {on_other:?} after SIGKILL of the one in use"
    );
    // Goal 1 s; the margin absorbs a loaded 2-core CI host.
    assert!(
        on_other <= Duration::from_millis(2000),
        "Envoy SYNCED via the other istiod-lite only {on_other:?} after the kill"
    );
    assert_eq!(
        ads_streams(admin),
        streams,
        "Envoy re-opened its ADS stream to the agent"
    );

    // The next rotation goes to the other CA, and Envoy gets that certificate.
    let spiffe = format!("spiffe://cluster.local/ns/demo/sa/{SERVICE_ACCOUNT}");
    let serials_before =
        harness::envoy::cert_serials(http_get(admin, "/certs").unwrap_or_default(), &spiffe)
            .unwrap_or_default();
    assert_eventually(Duration::from_secs(30), || {
        let issued = other.issued();
        if issued > issued_before {
            Ok(())
        } else {
            Err(format!(
                "the other istiod-lite signed {issued} certificates"
            ))
        }
    });
    let rotated = killed.elapsed();
    assert_eventually(Duration::from_secs(20), || {
        let serials = harness::envoy::cert_serials(http_get(admin, "/certs")?, &spiffe)?;
        serials
            .iter()
            .any(|s| !serials_before.contains(s))
            .then_some(())
            .ok_or(format!("Envoy still has {serials:?}"))
    });
    eprintln!(
        "FIGURE istiod_failover ({form:?}): certificate rotated via the other CA {rotated:?} after the kill (SECRET_TTL 8s)"
    );
    assert_eq!(ads_streams(admin), streams);
}
