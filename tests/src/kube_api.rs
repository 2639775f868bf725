//! A real Kubernetes API server on loopback for tests that run Istio's istiod outside a cluster:
//! etcd and `kube-apiserver` from the pinned builds (`prereq::kube_bins`), an admin token, a
//! service-account issuer whose tokens istiod checks through TokenReview (audience `istio-ca`
//! among the API audiences), and `kubectl` against it. Both processes are killed on drop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::local::{free_port, write_file};
use crate::{Child, assert_eventually};

const ADMIN_TOKEN: &str = "mesh-agent-tests-admin";

pub struct ApiServer {
    _etcd: Child,
    _apiserver: Child,
    kubectl: PathBuf,
    kubeconfig: PathBuf,
    pub addr: SocketAddr,
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

impl ApiServer {
    /// Starts etcd and kube-apiserver with their state under `dir`; `None` (outside CI) when
    /// the binaries are missing. Returns once `/readyz` answers.
    pub fn start(dir: &Path) -> Option<ApiServer> {
        let (kube, etcd_dir) = crate::prereq::kube_bins()?;
        std::fs::create_dir_all(dir).expect("mkdir api dir");
        let etcd = start_etcd(&etcd_dir, dir);
        let addr = loopback(free_port());
        write_keys(dir);
        let apiserver = start_apiserver(&kube, dir, addr, &etcd.1);
        let kubeconfig = dir.join("kubeconfig");
        write_file(
            &kubeconfig,
            &format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: local, cluster: {{server: \"https://{addr}\", insecure-skip-tls-verify: true}}}}]\nusers: [{{name: admin, user: {{token: {ADMIN_TOKEN}}}}}]\ncontexts: [{{name: local, context: {{cluster: local, user: admin}}}}]\ncurrent-context: local\n"
            ),
        );
        let api = ApiServer {
            _etcd: etcd.0,
            _apiserver: apiserver,
            kubectl: kube.join("kubectl"),
            kubeconfig,
            addr,
        };
        assert_eventually(Duration::from_secs(90), || {
            api.kubectl(&["get", "--raw", "/readyz"])
        });
        Some(api)
    }

    /// The kubeconfig of the admin user (a static token, every permission).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `kubectl <args>` against this server: its stdout, or its stderr as the error.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(&self.kubectl)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .output()
            .map_err(|e| format!("kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// A service-account token for `namespace/name` with audience `istio-ca` from TokenRequest
    /// (the namespace and account made first when missing).
    pub fn token(&self, namespace: &str, name: &str) -> String {
        let manifest = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {namespace}}}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {name}, namespace: {namespace}}}\n"
        );
        let path = self
            .kubeconfig
            .with_file_name(format!("sa-{namespace}-{name}.yaml"));
        write_file(&path, &manifest);
        let apply = ["apply", "-f", path.to_str().expect("utf-8 path")];
        assert_eventually(Duration::from_secs(30), || self.kubectl(&apply).map(|_| ()));
        let token = [
            "create",
            "token",
            name,
            "-n",
            namespace,
            "--audience",
            "istio-ca",
        ];
        assert_eventually(Duration::from_secs(30), || self.kubectl(&token))
            .trim()
            .to_string()
    }
}

/// etcd on two loopback ports, its data under `dir/etcd`; the child and its client URL.
fn start_etcd(bin: &Path, dir: &Path) -> (Child, String) {
    let client = format!("http://{}", loopback(free_port()));
    let peer = format!("http://{}", loopback(free_port()));
    let mut cmd = Command::new(bin.join("etcd"));
    cmd.arg("--name=tests")
        .arg(format!("--data-dir={}", dir.join("etcd").display()))
        .arg(format!("--listen-client-urls={client}"))
        .arg(format!("--advertise-client-urls={client}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster=tests={peer}"))
        .args(["--unsafe-no-fsync", "--log-level=warn"]);
    (Child::spawn("etcd", cmd), client)
}

/// The service-account signing key and the admin's static token.
fn write_keys(dir: &Path) {
    let key = dir.join("sa.key");
    let ok = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&key)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "openssl genpkey for the service-account key failed");
    write_file(
        &dir.join("tokens.csv"),
        &format!("{ADMIN_TOKEN},admin,admin,system:masters\n"),
    );
}

fn start_apiserver(bin: &Path, dir: &Path, addr: SocketAddr, etcd: &str) -> Child {
    let issuer = "https://kubernetes.default.svc.cluster.local";
    let mut cmd = Command::new(bin.join("kube-apiserver"));
    cmd.arg(format!("--etcd-servers={etcd}"))
        .arg(format!("--bind-address={}", addr.ip()))
        // In a namespace with no default route it cannot pick an address of its own.
        .arg(format!("--advertise-address={}", addr.ip()))
        .arg(format!("--secure-port={}", addr.port()))
        .arg(format!("--cert-dir={}", dir.join("certs").display()))
        .arg(format!(
            "--token-auth-file={}",
            dir.join("tokens.csv").display()
        ))
        .arg(format!(
            "--service-account-key-file={}",
            dir.join("sa.key").display()
        ))
        .arg(format!(
            "--service-account-signing-key-file={}",
            dir.join("sa.key").display()
        ))
        .arg(format!("--service-account-issuer={issuer}"))
        .arg(format!("--api-audiences={issuer},istio-ca"))
        .args([
            "--authorization-mode=RBAC",
            "--service-cluster-ip-range=198.19.0.0/16",
            "--endpoint-reconciler-type=none",
            "--enable-priority-and-fairness=false",
            "--v=0",
        ]);
    Child::spawn("kube-apiserver", cmd)
}
