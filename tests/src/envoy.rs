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

fn read_admin_address(path: &Path) -> SocketAddr {
    crate::assert_eventually(Duration::from_secs(20), || {
        let s = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        s.trim()
            .parse()
            .map_err(|e| format!("admin address {s:?}: {e}"))
    })
}
