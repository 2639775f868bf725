//! The configuration tree of `istiod-lite serve` and `replay`: the command line (flags and
//! their `ISTIOD_LITE_*` twins), the `PILOT_*` environment (an injected map) and the mesh file,
//! read once in `main` into one typed [`Settings`]. It is logged at start and served on the
//! monitoring port's `/debug/config_dump` ([`Settings::dump`]); nothing below reads the
//! environment or the mesh file again.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::model::MeshSettings;

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{var}={value:?}: {expected}")]
    Env {
        var: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("mesh config {path}: {source}")]
    MeshRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mesh config {path}: {source}")]
    MeshYaml {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
    #[error(
        "mesh config {path}: outboundTrafficPolicy.mode {mode:?}: expected ALLOW_ANY or REGISTRY_ONLY"
    )]
    MeshMode { path: PathBuf, mode: String },
}

/// The whole tree.
#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    pub server: ServerSettings,
    pub tunables: Tunables,
    pub source: Source,
}

/// What every flavour of the server shares (`serve`, `replay`): the CA directory, the
/// listeners, the serving certificate's names and the token clock skew.
#[derive(Clone, Debug, Serialize)]
pub struct ServerSettings {
    pub ca_dir: PathBuf,
    pub trust_domain: String,
    pub grpc_addr: SocketAddr,
    pub secure_grpc_addr: SocketAddr,
    pub monitoring_addr: SocketAddr,
    /// Extra DNS names for the serving certificate.
    pub sans: Vec<String>,
    /// Clock skew allowed when verifying a token's `exp` and `nbf`
    /// ([`crate::ca::DEFAULT_TOKEN_CLOCK_SKEW`] unless configured).
    pub token_clock_skew: Duration,
    /// Connection caps of the two gRPC ports together ([`crate::listen::GRPC_CAPS`] unless
    /// configured; the total is lowered to fit the open-file limit).
    #[serde(serialize_with = "caps")]
    pub conn_caps: proto::listen::Caps,
}

fn caps<S: serde::Serializer>(c: &proto::listen::Caps, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Shown {
        total: usize,
        per_peer: usize,
    }
    Shown {
        total: c.total,
        per_peer: c.per_peer,
    }
    .serialize(s)
}

/// Where the proxies' configuration comes from.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// `serve`: the watched config directory, under the mesh settings.
    ConfigDir {
        config_dir: PathBuf,
        mesh_file: Option<PathBuf>,
        mesh: MeshSettings,
    },
    /// `replay`: a recorded config dump.
    ConfigDump {
        config_dump: PathBuf,
        strip_istio_extensions: bool,
    },
}

/// Settings read from the environment (Istio's names).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tunables {
    /// `PILOT_DEBOUNCE_AFTER`
    pub debounce_after: Duration,
    /// `PILOT_DEBOUNCE_MAX`
    pub debounce_max: Duration,
    /// `PILOT_PUSH_THROTTLE`
    pub push_throttle: usize,
    /// `PILOT_ENABLE_IP_AUTOALLOCATE`
    pub ip_autoallocate: bool,
}

impl Tunables {
    pub fn from_env(env: &HashMap<String, String>) -> Result<Tunables, Error> {
        Ok(Tunables {
            debounce_after: duration(env, "PILOT_DEBOUNCE_AFTER", Duration::from_millis(100))?,
            debounce_max: duration(env, "PILOT_DEBOUNCE_MAX", Duration::from_secs(10))?,
            push_throttle: push_throttle(env)?,
            ip_autoallocate: ip_autoallocate(env)?,
        })
    }
}

fn duration(
    env: &HashMap<String, String>,
    var: &'static str,
    default: Duration,
) -> Result<Duration, Error> {
    match env.get(var) {
        None => Ok(default),
        Some(v) => go_syntax::parse_duration(v).map_err(|_| Error::Env {
            var,
            value: v.clone(),
            expected: "a duration such as 100ms or 10s",
        }),
    }
}

fn push_throttle(env: &HashMap<String, String>) -> Result<usize, Error> {
    const VAR: &str = "PILOT_PUSH_THROTTLE";
    match env.get(VAR) {
        None => Ok(100),
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| Error::Env {
                var: VAR,
                value: v.clone(),
                expected: "a positive integer",
            }),
    }
}

fn ip_autoallocate(env: &HashMap<String, String>) -> Result<bool, Error> {
    const VAR: &str = "PILOT_ENABLE_IP_AUTOALLOCATE";
    match env.get(VAR).map(String::as_str) {
        None | Some("true" | "1") => Ok(true),
        Some("false" | "0") => Ok(false),
        Some(v) => Err(Error::Env {
            var: VAR,
            value: v.to_string(),
            expected: "true or false",
        }),
    }
}

impl Settings {
    /// `istiod-lite serve`: the config directory, the mesh file (read here, once) and the
    /// environment.
    pub fn serve(
        config_dir: PathBuf,
        mesh_file: Option<PathBuf>,
        server: ServerSettings,
        env: &HashMap<String, String>,
    ) -> Result<Settings, Error> {
        let tunables = Tunables::from_env(env)?;
        let mesh = load_mesh(
            mesh_file.as_ref(),
            &server.trust_domain,
            tunables.ip_autoallocate,
        )?;
        Ok(Settings {
            server,
            tunables,
            source: Source::ConfigDir {
                config_dir,
                mesh_file,
                mesh,
            },
        })
    }

    /// `istiod-lite replay`: the dump and the environment.
    pub fn replay(
        config_dump: PathBuf,
        strip_istio_extensions: bool,
        server: ServerSettings,
        env: &HashMap<String, String>,
    ) -> Result<Settings, Error> {
        Ok(Settings {
            server,
            tunables: Tunables::from_env(env)?,
            source: Source::ConfigDump {
                config_dump,
                strip_istio_extensions,
            },
        })
    }

    /// The tree as JSON, as logged at start and served on `/debug/config_dump` (it holds no
    /// credential: paths, addresses, names and numbers).
    pub fn dump(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

/// Reads the few MeshConfig fields istiod-lite uses.
fn load_mesh(
    path: Option<&PathBuf>,
    trust_domain: &str,
    ip_autoallocate: bool,
) -> Result<MeshSettings, Error> {
    let mut mesh = MeshSettings {
        trust_domain: trust_domain.to_string(),
        ip_autoallocate,
        ..Default::default()
    };
    let Some(path) = path else { return Ok(mesh) };
    let text = std::fs::read_to_string(path).map_err(|source| Error::MeshRead {
        path: path.clone(),
        source,
    })?;
    let v: serde_yaml::Value = serde_yaml::from_str(&text).map_err(|source| Error::MeshYaml {
        path: path.clone(),
        source,
    })?;
    if let Some(ns) = v.get("rootNamespace").and_then(|x| x.as_str()) {
        mesh.root_namespace = ns.to_string();
    }
    if let Some(td) = v.get("trustDomain").and_then(|x| x.as_str()) {
        mesh.trust_domain = td.to_string();
    }
    if let Some(mode) = v
        .get("outboundTrafficPolicy")
        .and_then(|o| o.get("mode"))
        .and_then(|m| m.as_str())
    {
        mesh.allow_any = match mode {
            "ALLOW_ANY" => true,
            "REGISTRY_ONLY" => false,
            other => {
                return Err(Error::MeshMode {
                    path: path.clone(),
                    mode: other.to_string(),
                });
            }
        };
    }
    Ok(mesh)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> ServerSettings {
        ServerSettings {
            ca_dir: "/ca".into(),
            trust_domain: "cluster.local".into(),
            grpc_addr: "127.0.0.1:15010".parse().expect("addr"),
            secure_grpc_addr: "127.0.0.1:15012".parse().expect("addr"),
            monitoring_addr: "127.0.0.1:15014".parse().expect("addr"),
            sans: vec!["istiod.example".into()],
            token_clock_skew: Duration::from_secs(60),
            conn_caps: crate::listen::GRPC_CAPS,
        }
    }

    #[test]
    fn one_tree_from_flags_environment_and_mesh_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mesh = dir.path().join("mesh.yaml");
        std::fs::write(
            &mesh,
            "rootNamespace: istio-config\noutboundTrafficPolicy:\n  mode: REGISTRY_ONLY\n",
        )
        .expect("write");
        let env = HashMap::from([
            ("PILOT_PUSH_THROTTLE".to_string(), "7".to_string()),
            (
                "PILOT_ENABLE_IP_AUTOALLOCATE".to_string(),
                "false".to_string(),
            ),
        ]);
        let s = Settings::serve("/config".into(), Some(mesh), server(), &env).expect("settings");
        assert_eq!(s.tunables.push_throttle, 7);
        let dump = s.dump();
        assert_eq!(dump["tunables"]["push_throttle"], 7);
        assert_eq!(
            dump["server"]["conn_caps"]["total"],
            crate::listen::GRPC_CAPS.total
        );
        let source = &dump["source"]["config_dir"];
        assert_eq!(source["config_dir"], "/config");
        assert_eq!(source["mesh"]["root_namespace"], "istio-config");
        assert_eq!(source["mesh"]["allow_any"], false);
        assert_eq!(source["mesh"]["ip_autoallocate"], false);
    }

    #[test]
    fn bad_values_name_the_variable_or_file_and_the_expectation() {
        let env = HashMap::from([("PILOT_DEBOUNCE_MAX".to_string(), "10".to_string())]);
        let e = Settings::serve("/c".into(), None, server(), &env)
            .expect_err("must fail")
            .to_string();
        assert!(
            e.contains("PILOT_DEBOUNCE_MAX") && e.contains("\"10\"") && e.contains("duration"),
            "{e}"
        );
        let env = HashMap::from([("PILOT_PUSH_THROTTLE".to_string(), "0".to_string())]);
        let e = Settings::replay("/d".into(), false, server(), &env)
            .expect_err("must fail")
            .to_string();
        assert!(
            e.contains("PILOT_PUSH_THROTTLE") && e.contains("positive"),
            "{e}"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let mesh = dir.path().join("mesh.yaml");
        std::fs::write(&mesh, "outboundTrafficPolicy: {mode: SOMETIMES}\n").expect("write");
        let e = Settings::serve("/c".into(), Some(mesh), server(), &HashMap::new())
            .expect_err("must fail")
            .to_string();
        assert!(
            e.contains("SOMETIMES") && e.contains("ALLOW_ANY or REGISTRY_ONLY"),
            "{e}"
        );
    }
}
