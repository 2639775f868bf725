//! A Debian 12 VM with systemd as PID 1 (`scripts/vm.sh`: systemd-nspawn --boot in the network
//! namespace `mesh-vm`), our istio-sidecar.deb installed with `dpkg -i`, onboarded as Istio's VM
//! guide onboards one with the files `istiod-lite vm-bundle` writes (a short-lived token), and
//! `systemctl enable --now istio`; istiod-lite (CA and xDS) runs in a namespace of the test's,
//! joined to the VM as the cluster's node would be. Then what a person would otherwise do by
//! hand: reboot, a broken start, the token's expiry, a restart after it, `systemctl stop`, and
//! `ISTIO_CUSTOM_IP_TABLES=true`.

use harness::netns::{Netns, sh};
use harness::process::Child;
use harness::vm::{exec, vm_sh};
use harness::{assert_eventually, workspace_bin};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

/// The token's lifetime: past it, everything runs on the agent's own certificate.
const TOKEN_LIFETIME: Duration = Duration::from_secs(90);
/// The workload certificate's (SECRET_TTL): renewed every ~30 s (grace ratio 0.5).
const SECRET_TTL: &str = "60s";

/// Tears the VM down (every process, mount, namespace and file `vm.sh up` made), even when the
/// test fails.
struct Vm;

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = vm_sh().arg("down").status();
    }
}

fn ready() -> Result<(), String> {
    let (_, code) =
        exec("curl -s -o /dev/null -w '%{http_code}' http://localhost:15021/healthz/ready");
    if code.trim() == "200" {
        Ok(())
    } else {
        Err(format!("/healthz/ready: {code:?}"))
    }
}

/// The capture rules in the VM (both iptables back ends).
fn capture() -> String {
    exec("iptables-save 2>/dev/null; iptables-legacy-save 2>/dev/null; true")
        .1
        .lines()
        .filter(|l| l.contains("ISTIO"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `ActiveState=… SubState=… Result=… ExecMainStatus=…` of istio.service.
fn unit_state() -> String {
    exec("systemctl show -p ActiveState -p SubState -p Result -p ExecMainStatus istio")
        .1
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn running(state: &str) -> bool {
    state.contains("ActiveState=active") && state.contains("SubState=running")
}

fn cert_chain() -> String {
    exec("cat /etc/certs/cert-chain.pem 2>/dev/null").1
}

fn prerequisites() -> bool {
    if !harness::prereq::require_root() {
        return false;
    }
    for bin in ["systemd-nspawn", "dpkg-deb", "nsenter"] {
        if !harness::prereq::require_bin(bin) {
            return false;
        }
    }
    if !Path::new("/var/cache/mesh-agent/rootfs/bookworm").is_dir()
        && harness::prereq::find_bin("debootstrap").is_none()
    {
        harness::prereq::missing(
            "debootstrap (or the cached root /var/cache/mesh-agent/rootfs/bookworm)",
            "run scripts/vm/setup.sh",
        );
        return false;
    }
    if Path::new("/run/mesh-vm").exists() {
        harness::prereq::missing(
            "a free VM slot: /run/mesh-vm exists (a VM is up)",
            "scripts/vm.sh down",
        );
        return false;
    }
    true
}

/// istiod-lite serving CA and xDS on 0.0.0.0:15012 in `ns`, tokens checked without clock skew.
fn istiod(ns: &Netns, root: &Path) -> Child {
    let bin = root.join("istiod-lite");
    std::fs::copy(workspace_bin("istiod-lite"), &bin).expect("copy istiod-lite");
    std::fs::create_dir_all(root.join("config")).expect("config");
    let mut cmd = ns.cmd(&bin);
    cmd.arg("serve")
        .arg("--config-dir")
        .arg(root.join("config"))
        .arg("--ca-dir")
        .arg(root.join("ca"))
        .args(["--grpc-addr", "127.0.0.1:15010"])
        .args(["--secure-grpc-addr", "0.0.0.0:15012"])
        .args(["--monitoring-addr", "127.0.0.1:15014"])
        .args(["--token-clock-skew", "0s"])
        .env("RUST_LOG", "info");
    let child = Child::spawn("istiod-lite", cmd);
    child.wait_for_line("listening name=monitoring", Duration::from_secs(30));
    child
}

/// The onboarding files for `vm/vm-sa`, istiod at the peer address; SECRET_TTL added.
fn bundle(root: &Path) -> PathBuf {
    let out = root.join("bundle");
    sh(Command::new(root.join("istiod-lite"))
        .arg("vm-bundle")
        .arg("--ca-dir")
        .arg(root.join("ca"))
        .args([
            "--namespace",
            "vm",
            "--service-account",
            "vm-sa",
            "--name",
            "vm",
        ])
        .args(["--discovery-address", "198.18.32.1:15012"])
        .arg("--token-duration")
        .arg(format!("{}s", TOKEN_LIFETIME.as_secs()))
        .arg("--output")
        .arg(&out));
    let env = out.join("cluster.env");
    let text = std::fs::read_to_string(&env).expect("cluster.env");
    std::fs::write(&env, format!("{text}SECRET_TTL='{SECRET_TTL}'\n")).expect("cluster.env");
    out
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one VM's life told in order (onboarding, reboot, token expiry, clean stop); each step depends on the state the last one left"
)]
fn an_onboarded_vm_reboots_outlives_its_token_and_stops_cleanly() {
    if !prerequisites() {
        return;
    }
    let work = tempfile::tempdir().expect("tempdir");
    let Some(deb) = super::package::build(work.path()) else {
        return;
    };
    let cp = Netns::new("vmcp");
    let _istiod = istiod(&cp, work.path());
    let files = bundle(work.path());
    let token_expires = SystemTime::now() + TOKEN_LIFETIME;

    // Boot, dpkg -i, onboarding files, systemctl enable --now istio.
    let _vm = Vm;
    let t0 = Instant::now();
    let up = vm_sh()
        .args([
            "up",
            "--namespace",
            "vm",
            "--group",
            "vm",
            "--peer",
            cp.name(),
        ])
        .arg("--files")
        .arg(&files)
        .arg("--deb")
        .arg(&deb)
        .output()
        .expect("vm.sh up");
    assert!(
        up.status.success(),
        "vm.sh up: {}{}",
        String::from_utf8_lossy(&up.stdout),
        String::from_utf8_lossy(&up.stderr)
    );
    let onboarded = t0.elapsed();
    assert_eventually(Duration::from_secs(60), ready);
    let first_ready = t0.elapsed();
    println!(
        "FIGURE vm up (boot, dpkg -i, onboarding) {:.1} s; enable --now -> agent ready {:.1} s",
        onboarded.as_secs_f64(),
        (first_ready - onboarded).as_secs_f64()
    );
    let (_, certs) = exec("curl -s http://localhost:15000/certs");
    assert!(
        certs.contains("spiffe://cluster.local/ns/vm/sa/vm-sa"),
        "{certs}"
    );
    assert!(cert_chain().contains("BEGIN CERTIFICATE"), "OUTPUT_CERTS");
    assert!(capture().contains("ISTIO_REDIRECT"), "capture installed");
    let (_, uids) = exec("ps -o uid= -C pilot-agent; id -u istio-proxy");
    let uids: Vec<&str> = uids.split_whitespace().collect();
    assert!(
        uids.len() == 2 && uids[0] == uids[1],
        "agent uid, istio-proxy uid: {uids:?}"
    );

    // A reboot: /run is empty (no token), iptables state gone, nobody logs in.
    let boots = || std::fs::read_to_string("/run/mesh-vm/boots").unwrap_or_default();
    let _ = exec("systemctl reboot");
    let t1 = Instant::now();
    assert_eventually(Duration::from_secs(60), || {
        if boots().trim() == "1" {
            Ok(())
        } else {
            Err(format!("boots {:?}", boots()))
        }
    });
    // Until the agent is back, no rule may send traffic to ports nobody serves.
    let mut samples = 0;
    let back = assert_eventually(Duration::from_secs(90), || {
        let rules = capture();
        let state = unit_state();
        if !rules.is_empty() && !running(&state) {
            return Ok(Err(format!("capture while istio is {state}: {rules}")));
        }
        samples += 1;
        ready().map(|()| Ok(t1.elapsed()))
    });
    let back = back.unwrap_or_else(|e| panic!("{e}"));
    println!(
        "FIGURE systemctl reboot -> agent ready again {:.1} s ({samples} samples of the capture while down)",
        back.as_secs_f64()
    );
    let (_, token) = exec("ls /var/run/secrets/tokens/ 2>&1");
    assert!(
        !token.contains("istio-token"),
        "the token survived: {token}"
    );

    // A start that cannot work takes the capture off: a cluster.env line the shell refuses
    // (named in the journal), then an agent that exits after the capture was installed (an
    // unparsable SECRET_TTL, an error only under ISTIO_AGENT_STRICT_ENV: by default the agent
    // warns and uses the default, as Istio's does).
    let env_file = "/var/lib/istio/envoy/cluster.env";
    let (ok, _) = exec(&format!(
        "cp {env_file} /root/cluster.env.good && echo \"BROKEN='oops\" >>{env_file} && systemctl restart istio"
    ));
    assert!(ok);
    assert_eventually(Duration::from_secs(30), || {
        let (_, log) = exec("journalctl -u istio --no-pager -n 50");
        if log.contains(&format!("{env_file} line")) && log.contains("(BROKEN)") {
            Ok(())
        } else {
            Err(log)
        }
    });
    assert_eq!(capture(), "", "capture left by a start that failed");
    let (ok, _) = exec(&format!(
        "cp /root/cluster.env.good {env_file} && echo \"SECRET_TTL='forever'\" >>{env_file} && echo ISTIO_AGENT_STRICT_ENV=true >>{env_file} && systemctl restart istio"
    ));
    assert!(ok);
    assert_eventually(Duration::from_secs(30), || {
        let (_, log) = exec("journalctl -u istio --no-pager -n 80");
        let state = unit_state();
        if log.contains("SECRET_TTL") && !state.contains("ActiveState=active") {
            Ok(())
        } else {
            Err(format!("{state}: {log}"))
        }
    });
    assert_eq!(capture(), "", "capture left by an agent that exited");
    let (ok, _) = exec(&format!(
        "cp /root/cluster.env.good {env_file} && systemctl restart istio"
    ));
    assert!(ok);
    assert_eventually(Duration::from_secs(60), ready);

    // The token expires (the expired file put back, as an operator's copy would be): the
    // renewals keep coming, over mTLS with the agent's own certificate.
    let wait = token_expires
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    std::thread::sleep(wait + Duration::from_secs(1));
    let token = std::fs::read_to_string(files.join("istio-token")).expect("token");
    let (ok, out) = exec(&format!(
        "install -D -m 0640 -o istio-proxy /dev/stdin /var/run/secrets/tokens/istio-token <<'EOF'\n{token}\nEOF"
    ));
    assert!(ok, "{out}");
    let before = cert_chain();
    let t2 = Instant::now();
    assert_eventually(Duration::from_secs(60), || {
        let now = cert_chain();
        if now.contains("BEGIN CERTIFICATE") && now != before {
            Ok(())
        } else {
            Err("no renewal yet".to_string())
        }
    });
    println!(
        "FIGURE renewal after the token expired: {:.1} s after expiry + 1 s (SECRET_TTL {SECRET_TTL})",
        t2.elapsed().as_secs_f64()
    );
    // And a restart after expiry still gets a certificate.
    let before = cert_chain();
    let (ok, out) = exec("systemctl restart istio");
    assert!(ok, "{out}");
    assert_eventually(Duration::from_secs(60), ready);
    assert_eventually(Duration::from_secs(30), || {
        if cert_chain() != before {
            Ok(())
        } else {
            Err("no new certificate after the restart".into())
        }
    });

    // systemctl stop: SIGTERM to the agent alone, which drains Envoy and exits 0 within
    // TimeoutStopSec; then the capture is gone.
    let t3 = Instant::now();
    let (ok, out) = exec("systemctl stop istio");
    let stop = t3.elapsed();
    assert!(ok, "{out}");
    assert!(stop < Duration::from_secs(30), "stop took {stop:?}");
    let state = unit_state();
    assert!(
        state.contains("ActiveState=inactive") && state.contains("Result=success"),
        "{state}"
    );
    let (_, left) = exec("pgrep -l envoy; pgrep -l pilot-agent; true");
    assert!(left.trim().is_empty(), "left running: {left}");
    assert_eq!(capture(), "", "capture left after stop");
    println!("FIGURE systemctl stop istio {:.1} s", stop.as_secs_f64());

    // ISTIO_CUSTOM_IP_TABLES=true: the sidecar runs, the capture is the operator's business.
    let (ok, out) = exec(&format!(
        "echo ISTIO_CUSTOM_IP_TABLES=true >>{env_file} && systemctl start istio"
    ));
    assert!(ok, "{out}");
    assert_eventually(Duration::from_secs(60), ready);
    assert_eq!(
        capture(),
        "",
        "ISTIO_CUSTOM_IP_TABLES=true installed a capture"
    );
    let (ok, out) = exec("systemctl stop istio");
    assert!(ok, "{out}");
}
