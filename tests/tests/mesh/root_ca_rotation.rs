//! Issue 9, root CA changed: the plug-in cacerts of a running istiod-lite are replaced by a CA
//! under a new root, the way Istio documents it (step 1: `root-cert.pem` holds the old and the
//! new root, the old intermediate still signs; step 2: the new intermediate signs, `root-cert.pem`
//! holds the new and the old root). The pods' `root-cert.pem` (Kubernetes' `istio-ca-root-cert`
//! ConfigMap, here written by the test as the kubelet would) follows each step.
//!
//! Shown: istiod-lite switches CA without a restart; each agent re-issues as soon as its root
//! file changes; Envoy gets ROOTCA with both roots, then (step 2) shows the new root as its CA
//! certificate and holds a certificate from the new intermediate; requests between the two
//! sidecars (STRICT mTLS) keep succeeding throughout, with 0 failures.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use harness::assert_eventually;
use harness::mesh::{HTTPBIN, Load, Mesh, Pod, httpbin_service, istio_mutual, strict_mtls};
use harness::netns::sh;

/// Root serials, so Envoy's `/certs` tells the roots apart.
const ROOT_A_SERIAL: &str = "1a2b3c4d5e";
const ROOT_B_SERIAL: &str = "2b3c4d5e6f";

struct CaSet {
    root: String,
    int: String,
    int_key: String,
}

fn openssl(dir: &Path, args: &[&str]) {
    sh(Command::new("openssl").current_dir(dir).args(args));
}

/// A root (P-256, serial `root_serial`) and an intermediate signed by it.
fn make_ca(dir: &Path, name: &str, root_serial: &str) -> CaSet {
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::write(
        dir.join("ca.ext"),
        "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign,digitalSignature\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n",
    )
    .expect("ext");
    let serial = format!("0x{root_serial}");
    let root_subj = format!("/O=cluster.local/CN={name}");
    let int_subj = format!("/O=cluster.local/CN={name} intermediate");
    #[rustfmt::skip]
    openssl(dir, &["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", "root-key.pem", "-out", "root.pem", "-days", "3650",
        "-subj", &root_subj, "-set_serial", &serial,
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
    #[rustfmt::skip]
    openssl(dir, &["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", "int-key.pem", "-out", "int.csr", "-subj", &int_subj]);
    #[rustfmt::skip]
    openssl(dir, &["x509", "-req", "-in", "int.csr", "-CA", "root.pem", "-CAkey", "root-key.pem",
        "-set_serial", "0x77", "-days", "365", "-extfile", "ca.ext", "-out", "int.pem"]);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("read");
    CaSet {
        root: read("root.pem"),
        int: read("int.pem"),
        int_key: read("int-key.pem"),
    }
}

/// Writes istiod-lite's plug-in cacerts: `signer` signs, `root-cert.pem` holds `roots`.
fn write_cacerts(ca_dir: &Path, signer: &CaSet, roots: &[&CaSet]) {
    let roots: String = roots.iter().map(|c| c.root.as_str()).collect();
    std::fs::write(ca_dir.join("ca-cert.pem"), &signer.int).expect("ca-cert");
    std::fs::write(ca_dir.join("ca-key.pem"), &signer.int_key).expect("ca-key");
    std::fs::write(
        ca_dir.join("cert-chain.pem"),
        format!("{}{}", signer.int, signer.root),
    )
    .expect("cert-chain");
    std::fs::write(ca_dir.join("root-cert.pem"), roots).expect("root-cert");
}

/// What the kubelet does when the root ConfigMap changes: the pod's root file, atomically.
fn kubelet_update_root(pod: &Pod, roots: &[&CaSet]) {
    let dir = pod.dir.join("var/run/secrets/istio");
    let tmp = dir.join(".root-cert.pem.tmp");
    let roots: String = roots.iter().map(|c| c.root.as_str()).collect();
    std::fs::write(&tmp, roots).expect("write root");
    std::os::unix::fs::chown(&tmp, Some(1337), Some(1337)).expect("chown");
    std::fs::rename(&tmp, dir.join("root-cert.pem")).expect("rename");
}

/// Standard base64 (Envoy's `inline_bytes` in the config dump).
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u32, 0);
    for v in s.bytes().filter_map(val) {
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// The base64 text of `pem` without armour lines or line breaks, for containment checks.
fn body(pem: &str) -> String {
    pem.lines()
        .filter(|l| !l.starts_with("-----"))
        .collect::<String>()
}

/// Envoy's active SDS secrets: (name, PEM text of the certificate chain or trusted CA).
fn envoy_secrets(pod: &Pod) -> Result<Vec<(String, String)>, String> {
    let (status, dump) = pod.envoy_admin("/config_dump?resource=dynamic_active_secrets")?;
    if status != 200 {
        return Err(format!("config_dump: {status}"));
    }
    let v: serde_json::Value = serde_json::from_str(&dump).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for c in v["configs"].as_array().cloned().unwrap_or_default() {
        let name = c["name"].as_str().unwrap_or_default().to_string();
        let s = &c["secret"];
        let bytes = s["tls_certificate"]["certificate_chain"]["inline_bytes"]
            .as_str()
            .or_else(|| s["validation_context"]["trusted_ca"]["inline_bytes"].as_str())
            .unwrap_or_default();
        let pem = String::from_utf8_lossy(&base64_decode(bytes)).into_owned();
        out.push((name, pem));
    }
    Ok(out)
}

fn secret(pod: &Pod, name: &str) -> Result<String, String> {
    envoy_secrets(pod)?
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, pem)| pem)
        .ok_or_else(|| format!("{}: no active secret {name}", pod.name))
}

/// Serials of the CA certificates Envoy's `/certs` shows, per TLS context (in trust-bundle
/// order), without duplicate contexts.
fn envoy_ca_serials(pod: &Pod) -> Result<Vec<Vec<String>>, String> {
    let (_, certs) = pod.envoy_admin("/certs")?;
    let v: serde_json::Value = serde_json::from_str(&certs).map_err(|e| e.to_string())?;
    let mut contexts = Vec::new();
    for c in v["certificates"].as_array().cloned().unwrap_or_default() {
        let serials: Vec<String> = c["ca_cert"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|ca| ca["serial_number"].as_str())
            .map(|s| s.to_ascii_lowercase())
            .collect();
        if !contexts.contains(&serials) {
            contexts.push(serials);
        }
    }
    Ok(contexts)
}

/// Connections the client's Envoy opened to the server (each one an mTLS handshake).
fn upstream_connections(client: &Pod) -> u64 {
    let (_, clusters) = client.envoy_admin("/clusters").expect("/clusters");
    clusters
        .lines()
        .filter(|l| {
            l.starts_with(&format!(
                "outbound|80||{HTTPBIN}::198.18.2.2:8080::cx_total::"
            ))
        })
        .filter_map(|l| l.rsplit("::").next()?.parse::<u64>().ok())
        .sum()
}

fn replacements(mesh: &Mesh) -> usize {
    mesh.istiod
        .as_ref()
        .map(|c| {
            c.output()
                .iter()
                .filter(|l| l.contains("plug-in cacerts replaced"))
                .count()
        })
        .unwrap_or(0)
}

/// One step of the change: istiod-lite's cacerts become `signer` with `roots`, and once it has
/// logged its `n`th replacement, each pod's root file becomes `roots` (as the kubelet would).
/// Returns how long istiod-lite took to take the cacerts.
fn replace_ca(
    mesh: &Mesh,
    pods: [&Pod; 2],
    n: usize,
    signer: &CaSet,
    roots: &[&CaSet],
) -> Duration {
    let t = Instant::now();
    write_cacerts(&mesh.ca_dir(), signer, roots);
    assert_eventually(Duration::from_secs(10), || match replacements(mesh) {
        m if m == n => Ok(()),
        m => Err(format!("{m} CA replacements logged")),
    });
    let reload = t.elapsed();
    for pod in pods {
        kubelet_update_root(pod, roots);
    }
    reload
}

#[test]
fn root_ca_replaced_while_serving_traffic_costs_nothing() {
    if !harness::mesh::prerequisites(&["openssl"]) {
        return;
    }
    let work = tempfile::tempdir().expect("tempdir");
    let a = make_ca(&work.path().join("a"), "Root A", ROOT_A_SERIAL);
    let b = make_ca(&work.path().join("b"), "Root B", ROOT_B_SERIAL);

    // Port 80 as TCP: the client's Envoy opens a new upstream connection (a new mTLS handshake,
    // with the certificates and roots it holds at that moment) for every request.
    let config = httpbin_service("198.18.2.2").replace(
        "{ number: 80, name: http, protocol: HTTP, targetPort: 8080 }",
        "{ number: 80, name: tcp, protocol: TCP, targetPort: 8080 }",
    ) + &strict_mtls()
        + &istio_mutual();
    assert!(config.contains("protocol: TCP"), "{config}");
    let mut mesh = Mesh::new(&config);
    write_cacerts(&mesh.ca_dir(), &a, &[&a]);
    mesh.start_istiod();
    let mut client = mesh.pod("client", "sleep");
    let mut server = mesh.pod("server", "httpbin");
    mesh.start_app(&mut server, "0.0.0.0:8080", "httpbin-v1");
    mesh.inject(&mut server);
    mesh.inject(&mut client);
    mesh.wait_ready(&server, Duration::from_secs(30));
    mesh.wait_ready(&client, Duration::from_secs(30));
    assert_eventually(Duration::from_secs(15), || {
        let (ok, out) = client.curl(&format!("http://{HTTPBIN}/"));
        if ok && out.contains("hello from httpbin-v1") {
            Ok(())
        } else {
            Err(out)
        }
    });
    for pod in [&client, &server] {
        assert_eq!(
            envoy_ca_serials(pod).expect("/certs"),
            vec![vec![ROOT_A_SERIAL]],
            "{}",
            pod.name
        );
    }

    // Steady traffic (client → server, STRICT mTLS) across both steps.
    let cx_start = upstream_connections(&client);
    let load = Load::start(
        &client,
        &format!("http://{HTTPBIN}/"),
        "hello from httpbin-v1",
        Duration::from_millis(50),
    );

    // Step 1: both roots trusted, the old intermediate still signs.
    let t1 = Instant::now();
    let reload1 = replace_ca(&mesh, [&client, &server], 1, &a, &[&a, &b]);
    for pod in [&client, &server] {
        assert_eventually(Duration::from_secs(15), || {
            let root = body(&secret(pod, "ROOTCA")?);
            let chain = body(&secret(pod, "default")?);
            if !root.contains(&body(&b.root)) || !root.contains(&body(&a.root)) {
                return Err(format!("{}: ROOTCA lacks a root: {root}", pod.name));
            }
            if !chain.contains(&body(&a.int)) {
                return Err(format!("{}: not signed by intermediate A", pod.name));
            }
            Ok(())
        });
    }
    let step1 = t1.elapsed();

    // Step 2: the new intermediate signs; the new root comes first in the bundle.
    let t2 = Instant::now();
    let reload2 = replace_ca(&mesh, [&client, &server], 2, &b, &[&b, &a]);
    for pod in [&client, &server] {
        assert_eventually(Duration::from_secs(15), || {
            let chain = body(&secret(pod, "default")?);
            if !chain.contains(&body(&b.int)) {
                return Err(format!("{}: not yet re-issued by intermediate B", pod.name));
            }
            let serials = envoy_ca_serials(pod)?;
            // The new root first, the old one kept for the overlap.
            if serials != vec![vec![ROOT_B_SERIAL, ROOT_A_SERIAL]] {
                let certs = pod.envoy_admin("/certs")?.1;
                return Err(format!(
                    "{}: /certs CA serials {serials:?}: {certs}",
                    pod.name
                ));
            }
            Ok(())
        });
        let root = body(&secret(pod, "ROOTCA").expect("ROOTCA"));
        assert!(
            root.contains(&body(&a.root)),
            "{}: the old root left the bundle during the overlap",
            pod.name
        );
    }
    let step2 = t2.elapsed();
    // More requests with both sides on the new certificates only.
    let cx_new_ca = upstream_connections(&client);
    std::thread::sleep(Duration::from_secs(1));
    let (ok, failed) = load.stop();
    let cx_end = upstream_connections(&client);
    println!(
        "FIGURE root_ca_rotation istiod_reload_step1={reload1:?} both_envoys_trust_new_root={step1:?} istiod_reload_step2={reload2:?} both_envoys_on_new_ca={step2:?} requests_ok={ok} failed={} mtls_connections_opened={} of_them_on_new_ca={}",
        failed.len(),
        cx_end - cx_start,
        cx_end - cx_new_ca,
    );
    assert!(ok > 20, "too few requests across the rotation: {ok}");
    assert!(
        cx_end > cx_new_ca,
        "no new mTLS connection was made with both sidecars on the new CA"
    );
    assert!(
        failed.is_empty(),
        "requests failed across the root CA change: {failed:?}"
    );
}
