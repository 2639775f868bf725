//! Envoy's bootstrap (`<configPath>/envoy-rev.json`) and node metadata, as Istio's agent writes
//! them: rendered from a template (`ISTIO_BOOTSTRAP`, `--templateFile`, ProxyConfig
//! `proxyBootstrapTemplatePath`; Istio's image ships its `envoy_bootstrap_tmpl.json`) or, without
//! one, built in with the same content; plus the gRPC xDS bootstrap for proxyless clients.
//!
//! Parts: [`options`] computes every setting once (node [`metadata`], [`stats`],
//! [`telemetry`]); [`builtin`] lays them out with [`clusters`] and [`listeners`];
//! [`template_data`] hands them to the Go [`template`] engine; [`grpc`] writes the gRPC bootstrap.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::config::{Config, NodeType};
use crate::identity::Sockets;
use crate::platform::Platform;

mod builtin;
mod clusters;
mod grpc;
mod listeners;
mod lockdown;
pub(crate) mod metadata;
mod options;
pub mod overload;
mod stats;
mod telemetry;
pub mod template;
mod template_data;

pub use grpc::write_grpc_bootstrap;
pub use options::LIGHTSTEP_TOKEN_FILE;

/// Bootstrap errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid {var}={value:?}: expected {expected}")]
    MetaValue {
        var: String,
        value: String,
        expected: String,
    },
    #[error("invalid ProxyConfig field {field}: value {value}, expected {expected}")]
    ProxyConfig {
        field: String,
        value: String,
        expected: String,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read bootstrap template {path}: {source}")]
    Template {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot render bootstrap template {path}")]
    Render {
        path: PathBuf,
        source: template::Error,
    },
    #[error(
        "PROXY_LIFECYCLE_LOCKDOWN: cannot move Envoy's admin to its socket in bootstrap {path}: {reason}"
    )]
    Lockdown { path: PathBuf, reason: String },
}

/// What is only known once the agent is bound: the status port (the status server may use
/// port 0 in tests) and who serves the workload identity sockets.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bound {
    pub status: u16,
    pub sockets: Sockets,
}

/// The agent's own version (this crate).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The Istio release this build targets: reported as `ISTIO_VERSION` node metadata unless
/// `ISTIO_META_ISTIO_VERSION` sets one, so istiod enables the features of that release. The
/// Dockerfile's `ISTIO_VERSION` build argument (the proxyv2 image Envoy and the bootstrap
/// template come from) defaults to the same value.
pub const ISTIO_RELEASE: &str = "1.31.0";

/// Envoy's `--local-address-ip-version`: v6 only if every node IP is v6.
pub fn local_address_ip_version(config: &Config) -> &'static str {
    if !config.node.ips.is_empty() && config.node.ips.iter().all(IpAddr::is_ipv6) {
        "v6"
    } else {
        "v4"
    }
}

/// Renders the built-in bootstrap as JSON.
#[cfg(test)]
pub fn render(config: &Config, bound: Bound, platform: &Platform) -> Result<Value, Error> {
    builtin::render(&options::Options::new(config, bound, platform)?)
}

/// The data a template is rendered with (Istio's template parameters).
#[cfg(test)]
pub fn template_data(config: &Config, bound: Bound, platform: &Platform) -> Result<Value, Error> {
    Ok(template_data::template_data(
        config,
        &options::Options::new(config, bound, platform)?,
    ))
}

/// Whether this node type drains only inbound listeners.
pub fn inbound_only(node_type: NodeType) -> bool {
    node_type == NodeType::Sidecar
}

/// The admin socket's file name in the proxy's directory (`proxy.config_path`), with
/// `PROXY_LIFECYCLE_LOCKDOWN`.
pub const ADMIN_SOCKET: &str = "admin.sock";

/// Envoy's admin socket as the bootstrap names it: in the proxy's directory, relative to Envoy's
/// working directory as the XDS socket is.
fn admin_pipe(config: &Config) -> String {
    format!(
        "{}/{}",
        config.proxy.config_path.trim_end_matches('/'),
        ADMIN_SOCKET
    )
}

/// What Envoy is started with.
#[derive(Debug, Clone)]
pub struct Written {
    pub path: PathBuf,
    /// Whether the agent created the file (and so deletes it when Envoy exits).
    pub generated: bool,
}

/// Where Istio's image ships its bootstrap template (relative to the working directory).
pub const DEFAULT_TEMPLATE: &str = "./var/lib/istio/envoy/envoy_bootstrap_tmpl.json";

/// The template to render: `ISTIO_BOOTSTRAP` > `--templateFile` > ProxyConfig
/// `proxyBootstrapTemplatePath` > Istio's template at [`DEFAULT_TEMPLATE`] when it exists.
fn template_path(config: &Config) -> Option<PathBuf> {
    [
        &config.bootstrap.template,
        &config.flags.template_file,
        &config.proxy.proxy_bootstrap_template_path,
    ]
    .into_iter()
    .find(|p| !p.is_empty())
    .map(|p| config.path(p))
    .or_else(|| Some(config.path(DEFAULT_TEMPLATE)).filter(|p| p.is_file()))
}

fn write_file(path: &Path, text: &str) -> Result<(), Error> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| Error::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    std::fs::write(path, text).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes the bootstrap for Envoy on `platform`: `customConfigFile` as is, or a rendered
/// template (see [`template_path`]), or the built-in bootstrap, into
/// `<configPath>/envoy-rev.json` (or `out`). A Lightstep tracer's access token goes to
/// `<configPath>/lightstep_access_token.txt` first.
pub fn write(
    config: &Config,
    bound: Bound,
    platform: &Platform,
    out: Option<&Path>,
) -> Result<Written, Error> {
    if !config.proxy.custom_config_file.is_empty() && out.is_none() {
        return Ok(Written {
            path: config.path(&config.proxy.custom_config_file),
            generated: false,
        });
    }
    let opts = options::Options::new(config, bound, platform)?;
    if let Some(telemetry::Tracer::Lightstep { access_token, .. }) = &opts.telemetry.tracer {
        let token = config
            .path(&config.proxy.config_path)
            .join(LIGHTSTEP_TOKEN_FILE);
        write_file(&token, access_token)?;
    }
    let (text, ext) = match template_path(config) {
        Some(t) => {
            let text = std::fs::read_to_string(&t).map_err(|source| Error::Template {
                path: t.clone(),
                source,
            })?;
            let name = t.to_string_lossy();
            let ext = if name.ends_with(".yaml") || name.ends_with(".yaml.tmpl") {
                "yaml"
            } else {
                "json"
            };
            let data = template_data::template_data(config, &opts);
            let rendered = template::render(&text, &data).map_err(|source| Error::Render {
                path: t.clone(),
                source,
            })?;
            if config.envoy.lifecycle_lockdown {
                // YAML is a superset of JSON: either template reads the same way.
                let fail = |reason: String| Error::Lockdown {
                    path: t.clone(),
                    reason,
                };
                let mut v: Value =
                    serde_yaml::from_str(&rendered).map_err(|e| fail(e.to_string()))?;
                lockdown::apply(&mut v, &admin_pipe(config)).map_err(|r| fail(r.into()))?;
                (serde_json::to_string_pretty(&v).unwrap_or_default(), "json")
            } else {
                (rendered, ext)
            }
        }
        None => {
            let mut v = builtin::render(&opts)?;
            if config.envoy.lifecycle_lockdown {
                lockdown::apply(&mut v, &admin_pipe(config)).map_err(|r| Error::Lockdown {
                    path: PathBuf::from("(built in)"),
                    reason: r.into(),
                })?;
            }
            (serde_json::to_string_pretty(&v).unwrap_or_default(), "json")
        }
    };
    let path = match out {
        Some(p) => p.to_path_buf(),
        None => config
            .path(&config.proxy.config_path)
            .join(format!("envoy-rev.{ext}")),
    };
    write_file(&path, &text)?;
    Ok(Written {
        path,
        generated: true,
    })
}

#[cfg(test)]
mod tests;
