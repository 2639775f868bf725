//! `scripts/build-deb.sh`: Istio's istio-sidecar.deb paths, our binaries, Istio's postinst steps.

use harness::{repo_root, workspace_bin};
use std::process::Command;

/// Builds the package from the workspace's binaries into `dir`; `None` (after saying why) when
/// dpkg-deb or Envoy is missing.
pub fn build(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    if !harness::prereq::require_bin("dpkg-deb") {
        return None;
    }
    let envoy = harness::envoy_bin()?;
    let out = dir.join("istio-sidecar.deb");
    let bins = workspace_bin("pilot-agent");
    let result = Command::new(repo_root().join("scripts/build-deb.sh"))
        .arg(bins.parent().expect("target dir"))
        .env("OUT", &out)
        .env("ENVOY_BIN", envoy)
        .output()
        .expect("scripts/build-deb.sh");
    assert!(
        result.status.success(),
        "build-deb.sh: {}",
        String::from_utf8_lossy(&result.stderr)
    );
    Some(out)
}

fn dpkg_deb(args: &[&str], deb: &std::path::Path) -> String {
    let out = Command::new("dpkg-deb")
        .args(args)
        .arg(deb)
        .output()
        .expect("dpkg-deb");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_package_has_istios_paths_and_postinst() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(deb) = build(dir.path()) else { return };
    let list = dpkg_deb(&["--contents"], &deb);
    for (path, mode) in [
        ("./usr/local/bin/pilot-agent", "-rwxr-xr-x"),
        ("./usr/local/bin/envoy", "-rwxr-xr-x"),
        ("./usr/local/bin/istio-start.sh", "-rwxr-xr-x"),
        ("./usr/local/bin/istio-iptables", "-rwxr-xr-x"),
        ("./lib/systemd/system/istio.service", "-rw-r--r--"),
        ("./var/lib/istio/envoy/sidecar.env", "-rw-r--r--"),
        (
            "./var/lib/istio/envoy/envoy_bootstrap_tmpl.json",
            "-rw-r--r--",
        ),
    ] {
        let line = list
            .lines()
            .find(|l| l.ends_with(path))
            .unwrap_or_else(|| panic!("{path} missing from the package:\n{list}"));
        assert!(
            line.starts_with(mode) && line.contains("root/root"),
            "{line}"
        );
    }
    let info = dpkg_deb(&["--info"], &deb);
    assert!(info.contains("Package: istio-sidecar"), "{info}");
    assert!(
        info.contains("Depends: libc6, iproute2, iptables"),
        "{info}"
    );
    let ctl = tempfile::tempdir().expect("tempdir");
    let out = Command::new("dpkg-deb")
        .arg("--control")
        .arg(&deb)
        .arg(ctl.path())
        .status()
        .expect("dpkg-deb --control");
    assert!(out.success());
    let conffiles = std::fs::read_to_string(ctl.path().join("conffiles")).expect("conffiles");
    assert!(conffiles.contains("/var/lib/istio/envoy/sidecar.env"));
    assert!(conffiles.contains("/var/lib/istio/envoy/envoy_bootstrap_tmpl.json"));
    let postinst = std::fs::read_to_string(ctl.path().join("postinst")).expect("postinst");
    for step in [
        "useradd --system --gid istio-proxy --home-dir /var/lib/istio",
        "ln -s /var/lib/istio /etc/istio",
        "touch /var/lib/istio/config/mesh",
        "chmod 2755 /usr/local/bin/envoy /usr/local/bin/pilot-agent",
    ] {
        assert!(postinst.contains(step), "postinst lacks {step:?}");
    }
}
