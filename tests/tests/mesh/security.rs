//! Issue 9, hostile input: what a full pod-in-a-box run leaves exposed. After one injected
//! client pod is ready and holds its workload certificate: the SDS socket and its directory
//! are closed to others, no private key was written under the pod's working directory
//! (`OUTPUT_CERTS` unset), and Envoy's admin port and the agent's debug endpoints answer on
//! loopback only, while the readiness ports answer the node.

use harness::assert_eventually;
use harness::mesh::{Mesh, NAMESPACE, pod_in_a_box_config};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn prerequisites() -> bool {
    harness::mesh::prerequisites(&["ss"])
}

/// Every regular file under `dir`, recursively (symlinks not followed).
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.expect("dir entry");
        let kind = entry.file_type().expect("file type");
        if kind.is_dir() {
            files_under(&entry.path(), out);
        } else if kind.is_file() {
            out.push(entry.path());
        }
    }
}

#[test]
fn pod_exposes_no_key_socket_or_debug_endpoint() {
    if !prerequisites() {
        return;
    }
    let mut mesh = Mesh::new(&pod_in_a_box_config("198.18.2.2"));
    mesh.start_istiod();
    let mut client = mesh.pod("client", "sleep");
    mesh.inject(&mut client);
    mesh.wait_ready(&client, Duration::from_secs(30));
    // The workload key exists (in Envoy's memory): the certificate reached Envoy over SDS.
    let want = format!("spiffe://cluster.local/ns/{NAMESPACE}/sa/sleep");
    assert_eventually(Duration::from_secs(20), || {
        match client.envoy_admin("/certs") {
            Ok((200, certs)) if certs.contains(&want) => Ok(()),
            other => Err(format!("/certs lacks {want}: {other:?}")),
        }
    });

    // SDS socket: its directory is the kubelet's emptyDir, left as the kubelet made it (root,
    // 0777); the socket has no bits for others.
    let uds_dir = client.dir.join("var/run/secrets/workload-spiffe-uds");
    let meta = std::fs::metadata(&uds_dir).expect("SDS socket directory");
    let dir_mode = meta.permissions().mode();
    assert_eq!(dir_mode & 0o777, 0o777, "{}", uds_dir.display());
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta),
        0,
        "the emptyDir stays root's"
    );
    let sock = std::fs::symlink_metadata(uds_dir.join("socket")).expect("SDS socket");
    assert!(sock.file_type().is_socket(), "not a socket: {sock:?}");
    let sock_mode = sock.permissions().mode();
    assert_eq!(sock_mode & 0o007, 0, "socket mode {:o}", sock_mode & 0o777);
    println!(
        "FIGURE sds dir mode {:o}, socket mode {:o}",
        dir_mode & 0o777,
        sock_mode & 0o777
    );

    // No private key anywhere under the pod's working directory.
    let mut files = Vec::new();
    files_under(&client.dir, &mut files);
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(
            !String::from_utf8_lossy(&bytes).contains("PRIVATE KEY"),
            "private key on disk without OUTPUT_CERTS: {}",
            f.display()
        );
    }
    println!(
        "FIGURE {} files under the pod directory, 0 hold a private key",
        files.len()
    );

    // Envoy's admin port listens on loopback only, and the node cannot reach it.
    let ss = client
        .ns
        .cmd("ss")
        .args(["-Hltn", "sport = :15000"])
        .output()
        .expect("ss");
    let listeners = String::from_utf8_lossy(&ss.stdout).to_string();
    let locals: Vec<&str> = listeners
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .collect();
    assert!(
        !locals.is_empty(),
        "nothing listens on 15000: {listeners:?}"
    );
    for local in &locals {
        assert!(
            local.starts_with("127.0.0.1:") || local.starts_with("[::1]:"),
            "admin port bound beyond loopback: {local} in {listeners:?}"
        );
    }
    let admin_from_node = mesh.probe(&client, 15000, "/server_info");
    assert!(
        !matches!(admin_from_node, Ok((200, _))),
        "Envoy admin answered the node: {admin_from_node:?}"
    );
    // The agent's debug endpoint refuses the node and answers loopback.
    let ndsz_from_node = mesh.probe(&client, 15020, "/debug/ndsz");
    assert!(
        matches!(ndsz_from_node, Ok((403, _))),
        "/debug/ndsz from the node: {ndsz_from_node:?}"
    );
    let ndsz_local = client.get("127.0.0.1:15020".parse().expect("addr"), "/debug/ndsz");
    assert!(
        matches!(ndsz_local, Ok((200, _)) | Ok((404, _))),
        "/debug/ndsz on loopback: {ndsz_local:?}"
    );
    let (status, _) = client
        .envoy_admin("/server_info")
        .expect("admin on loopback");
    assert_eq!(status, 200, "admin on loopback");

    // Readiness answers the node on both the Envoy (15021) and the agent (15020) ports.
    for port in [15021, 15020] {
        let r = mesh.probe(&client, port, "/healthz/ready");
        assert!(matches!(r, Ok((200, _))), "{port} /healthz/ready: {r:?}");
    }
    println!(
        "FIGURE from the node: admin 15000 {admin_from_node:?}, /debug/ndsz {:?}; 15021/15020 ready 200",
        ndsz_from_node.map(|(s, _)| s)
    );
}
