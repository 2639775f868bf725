//! A real Envoy, started from a YAML config, inside a namespace or on the host.

use crate::netns::Netns;
use crate::process::Child;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A running Envoy; killed on drop.
pub struct Envoy {
    pub child: Child,
    admin: SocketAddr,
    ns: Option<String>,
    _dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts `envoy` with `config_yaml` (which must configure `admin` on port 0 or a fixed
    /// port) inside `ns` (or on the host), waits until the admin address is known.
    pub fn start(envoy: &Path, ns: Option<&Netns>, config_yaml: &str) -> Envoy {
        Self::start_with_args(envoy, ns, config_yaml, &[])
    }

    /// Like [`Envoy::start`] with extra Envoy arguments.
    pub fn start_with_args(
        envoy: &Path,
        ns: Option<&Netns>,
        config_yaml: &str,
        extra: &[&str],
    ) -> Envoy {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = dir.path().join("envoy.yaml");
        std::fs::write(&cfg, config_yaml).expect("write envoy config");
        let admin_path = dir.path().join("admin-address");
        let mut cmd = match ns {
            Some(ns) => ns.cmd(envoy),
            None => Command::new(envoy),
        };
        cmd.arg("-c")
            .arg(&cfg)
            .arg("--admin-address-path")
            .arg(&admin_path)
            .args(["--disable-hot-restart", "--log-level", "warning"])
            .args(["--concurrency", "1"])
            .args(extra);
        let child = Child::spawn("envoy", cmd);
        let admin = read_admin_address(&admin_path);
        Envoy {
            child,
            admin,
            ns: ns.map(|n| n.name().to_string()),
            _dir: dir,
        }
    }

    /// The admin address (inside the namespace when Envoy runs in one).
    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// GET an admin path, from inside Envoy's namespace.
    pub fn admin_get(&self, path: &str) -> Result<(u16, String), String> {
        let addr = self.admin;
        let path = path.to_string();
        match &self.ns {
            Some(ns) => {
                let file = PathBuf::from("/run/netns").join(ns);
                std::thread::spawn(move || {
                    let fd = std::fs::File::open(&file).map_err(|e| e.to_string())?;
                    nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(|e| e.to_string())?;
                    crate::http::http_get(addr, &path)
                })
                .join()
                .map_err(|_| "admin request thread panicked".to_string())?
            }
            None => crate::http::http_get(addr, &path),
        }
    }

    /// Waits until `/ready` answers 200 (Envoy has its initial config).
    pub fn wait_ready(&self, timeout: Duration) {
        crate::assert_eventually(timeout, || match self.admin_get("/ready") {
            Ok((200, _)) => Ok(()),
            Ok((s, b)) => Err(format!("/ready {s}: {b}")),
            Err(e) => Err(e),
        });
    }
}

/// Serials of the certificates for `spiffe_id` (a URI SAN) in Envoy's answer to `/certs`
/// (status, body), each once, in Envoy's order. An error when the answer is not 200 JSON or
/// holds no such certificate yet.
pub fn cert_serials(certs: (u16, String), spiffe_id: &str) -> Result<Vec<String>, String> {
    let (code, body) = certs;
    if code != 200 {
        return Err(format!("/certs {code}: {body}"));
    }
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    let mut out: Vec<String> = Vec::new();
    for c in v["certificates"].as_array().into_iter().flatten() {
        for cert in c["cert_chain"].as_array().into_iter().flatten() {
            let ours = cert["subject_alt_names"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["uri"].as_str() == Some(spiffe_id));
            if ours
                && let Some(serial) = cert["serial_number"].as_str()
                && !out.iter().any(|s| s == serial)
            {
                out.push(serial.to_string());
            }
        }
    }
    if out.is_empty() {
        return Err(format!("no certificate for {spiffe_id} yet"));
    }
    Ok(out)
}

fn read_admin_address(path: &Path) -> SocketAddr {
    crate::assert_eventually(Duration::from_secs(20), || {
        let s = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        s.trim()
            .parse()
            .map_err(|e| format!("admin address {s:?}: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::cert_serials;

    const ID: &str = "spiffe://cluster.local/ns/demo/sa/a";

    fn leaf(serial: &str, uri: &str) -> String {
        format!(r#"{{"serial_number":"{serial}","subject_alt_names":[{{"uri":"{uri}"}}]}}"#)
    }

    #[test]
    fn cert_serials_lists_ours_once_in_order() {
        let other = "spiffe://cluster.local/ns/demo/sa/b";
        let body = format!(
            r#"{{"certificates":[
                {{"ca_cert":[{{"serial_number":"r1"}}],"cert_chain":[]}},
                {{"cert_chain":[{},{}]}},
                {{"cert_chain":[{},{}]}}]}}"#,
            leaf("s2", ID),
            leaf("x", other),
            leaf("s1", ID),
            leaf("s2", ID),
        );
        assert_eq!(
            cert_serials((200, body), ID),
            Ok(vec!["s2".into(), "s1".into()])
        );
    }

    #[test]
    fn cert_serials_errs_without_our_certificate_or_a_good_answer() {
        let none = format!(
            r#"{{"certificates":[{{"cert_chain":[{}]}}]}}"#,
            leaf("x", "u")
        );
        let no_id = cert_serials((200, none), ID).expect_err("no certificate for the id");
        assert!(no_id.contains(ID), "{no_id}");
        let empty = r#"{"certificates":[]}"#.to_string();
        assert!(cert_serials((200, empty), ID).is_err());
        let status = cert_serials((503, "down".into()), ID).expect_err("503");
        assert!(status.contains("503"), "{status}");
        assert!(cert_serials((200, "not json".into()), ID).is_err());
    }
}
