use std::collections::HashMap;
use std::path::Path;

use super::*;

/// A socket file nobody answers on at the default workload socket path under `dir`, as an
/// earlier agent leaves it.
pub(crate) fn stale_workload_socket(dir: &Path) -> PathBuf {
    let socket = dir.join("var/run/secrets/workload-spiffe-uds/socket");
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    socket
}

fn config(dir: &Path, pairs: &[(&str, &str)]) -> Config {
    let env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::sidecar_for_test(dir, &env).unwrap()
}

/// An HTTP/2 server on `path` as SPIRE's agent would be: our SDS server on its own runtime.
fn external_sds(path: &Path) -> (tokio::runtime::Runtime, tokio_util::sync::CancellationToken) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let base = path.parent().unwrap();
    let manager = sds::SecretManager::new(
        std::sync::Arc::new(sds::Config::defaults(base)),
        std::sync::Arc::new(sds::Metrics::new(&mut Default::default())),
    )
    .unwrap();
    let server = rt.block_on(sds::SdsServer::bind(path, manager)).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    rt.spawn(server.run(stop.clone()));
    (rt, stop)
}

/// Istio's SPIRE contract, at bind: a live server on the configured workload socket is left
/// alone, the agent's SDS server moves to the file-only socket and never calls the CA. A
/// non-default socket file with nobody there is an error naming the path.
#[test]
fn a_live_workload_socket_is_an_external_server() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("var/run/secrets/workload-spiffe-uds");
    let c = config(
        dir.path(),
        &[("WORKLOAD_IDENTITY_SOCKET_FILE", "spire.sock")],
    );

    let err = settle(&c).unwrap_err().to_string();
    assert!(
        err.contains("non-default SDS socket path")
            && err.contains(&uds.join("spire.sock").display().to_string())
            && err.contains("WORKLOAD_IDENTITY_SOCKET_FILE=\"spire.sock\""),
        "{err}"
    );

    let (_rt, stop) = external_sds(&uds.join("spire.sock"));
    let s = settle(&c).unwrap();
    assert_eq!(
        s.sockets,
        Sockets {
            external: true,
            credential: false
        }
    );
    assert!(s.identity.serve_only_files);
    assert_eq!(
        s.identity.socket_path,
        dir.path()
            .join("var/run/secrets/credential-uds/files-socket")
    );
    assert!(
        uds.join("spire.sock").exists(),
        "the external socket was touched"
    );
    // The node metadata these give: bootstrap::tests::workload_socket_keys.
    stop.cancel();

    // The same at the default path; and a credential socket is found too.
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("var/run/secrets/workload-spiffe-uds");
    let (_rt1, stop1) = external_sds(&uds.join("socket"));
    let (_rt2, stop2) = external_sds(&dir.path().join("var/run/secrets/credential-uds/socket"));
    let s = settle(&config(dir.path(), &[])).unwrap();
    assert_eq!(
        s.sockets,
        Sockets {
            external: true,
            credential: true
        }
    );
    stop1.cancel();
    stop2.cancel();
}

/// A leftover socket file (an earlier agent's) at the default path is removed when the agent
/// binds, and the agent's own SDS server takes the configured socket.
#[test]
fn a_stale_workload_socket_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = stale_workload_socket(dir.path());
    let c = config(dir.path(), &[]);
    assert!(socket.exists(), "loading the configuration touched it");
    let s = settle(&c).unwrap();
    assert!(!socket.exists(), "the leftover socket file was not removed");
    assert_eq!(s.sockets, Sockets::default());
    assert!(!s.identity.serve_only_files);
    assert_eq!(s.identity.socket_path, socket);
}

/// A `CA_PROVIDER` with no CA client stops the start only when a CA client is needed: not with
/// mounted certificates, nor with an external SDS server (Istio makes none then).
#[test]
fn an_unregistered_ca_provider_is_refused_only_when_a_client_is_needed() {
    let dir = tempfile::tempdir().unwrap();
    for (k, v, name) in [
        ("CA_PROVIDER", "Vault", "\"Vault\""),
        ("CA_ADDR", "meshca.googleapis.com:443", "\"GoogleCA\""),
    ] {
        let err = settle(&config(dir.path(), &[(k, v)]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("CA provider {name} not registered")),
            "{k}={v}: {err}"
        );
    }
    // (istiod in plain text: the xDS connection then needs no mounted root of its own.)
    let mounted = config(
        dir.path(),
        &[
            ("CA_PROVIDER", "Vault"),
            ("FILE_MOUNTED_CERTS", "true"),
            (
                "PROXY_CONFIG",
                r#"{"discoveryAddress":"istiod.istio-system.svc:15010"}"#,
            ),
        ],
    );
    assert!(settle(&mounted).is_ok());
    let uds = dir.path().join("var/run/secrets/workload-spiffe-uds");
    let (_rt, stop) = external_sds(&uds.join("socket"));
    let s = settle(&config(dir.path(), &[("CA_PROVIDER", "Vault")])).unwrap();
    assert!(s.sockets.external && s.identity.serve_only_files);
    stop.cancel();
}
