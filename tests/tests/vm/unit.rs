//! `docs/vm/istio.service` has what Istio's unit has; systemd accepts it.

use harness::mesh::vm::Unit;
use harness::repo_root;
use std::process::Command;

pub fn unit() -> Unit {
    let path = repo_root().join("docs/vm/istio.service");
    let text = std::fs::read_to_string(&path).expect("docs/vm/istio.service");
    Unit::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_unit_has_istios_settings_and_systemd_accepts_it() {
    let u = unit();
    let s = |k| u.get("Service", k);
    assert_eq!(s("ExecStart"), Some("/usr/local/bin/istio-start.sh"));
    assert_eq!(
        u.all("Service", "ExecStartPre"),
        vec!["+/usr/bin/install -d -o istio-proxy -m 0755 /var/run/secrets"],
        "/var/run is a fresh tmpfs after a reboot"
    );
    assert_eq!(
        s("ExecStopPost"),
        Some("/usr/local/bin/istio-start.sh clean")
    );
    assert_eq!(s("KillMode"), Some("mixed"), "the agent drains Envoy");
    assert_eq!(s("Restart"), Some("always"));
    assert_eq!(s("RestartSec"), Some("10"));
    assert_eq!(s("TimeoutStopSec"), Some("30s"));
    assert_eq!(s("User"), None, "istio-start.sh starts as root");
    assert_eq!(u.get("Unit", "StartLimitIntervalSec"), Some("0"));
    assert_eq!(u.get("Install", "WantedBy"), Some("multi-user.target"));

    let Some(analyze) = harness::prereq::find_bin("systemd-analyze") else {
        harness::prereq::missing("systemd-analyze", "run scripts/vm/setup.sh (systemd)");
        return;
    };
    // systemd's own verdict on a copy whose programs exist on this host.
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("istio-start.sh");
    std::fs::copy(repo_root().join("docs/vm/istio-start.sh"), &script).expect("copy");
    let text = std::fs::read_to_string(repo_root().join("docs/vm/istio.service"))
        .expect("unit")
        .replace("/usr/local/bin", &dir.path().display().to_string())
        .replace("-o istio-proxy ", "");
    let copy = dir.path().join("istio.service");
    std::fs::write(&copy, text).expect("write copy");
    let out = Command::new(analyze)
        .arg("verify")
        .arg(&copy)
        .current_dir(dir.path())
        .output()
        .expect("systemd-analyze verify");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {}{stderr}",
        out.status
    );
}
