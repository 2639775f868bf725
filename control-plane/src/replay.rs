//! `istiod-lite replay --config-dump FILE`: serves the dynamic listeners, clusters, routes and
//! endpoints of a config dump recorded from a real proxy (Envoy's `/config_dump`, or `istioctl
//! proxy-config all -o json|yaml`) to every proxy that connects, over the same ADS server (SotW
//! and Delta) and beside the same CA as `serve`. So a production sidecar's config can be
//! reproduced on a laptop with pilot-agent and a local Envoy.
//!
//! - Only dynamic resources are served: static ones and the bootstrap come from the agent's own
//!   bootstrap, secrets from its SDS server. A dump with no dynamic resource at all (bootstrap-
//!   or secrets-only) is refused with an error that lists its sections.
//! - `--strip-istio-extensions` removes what only Istio's Envoy build implements (see
//!   [`strip`]), logging each removal, so upstream Envoy accepts the rest. Without it the dump
//!   is served as recorded and upstream Envoy NACKs it (shown in `/debug/syncz`).
//! - A proxy without traffic capture (`INTERCEPTION_MODE` `NONE`) gets the listeners with
//!   `bind_to_port: false`, as `serve` does for its own: a laptop's ports stay free.

mod dump;
mod encode;
mod strip;

pub use strip::Removal;

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigStatus};
use crate::model::{MeshSettings, ProxyView, Snapshot};
use crate::server::{self, Running, Sources};
use crate::settings::{Settings, Source};
use crate::xds::{FixedResources, Resource, Resources, XdsType};

/// Errors loading a dump or starting the replay.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("config dump {path}: cannot read it: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config dump {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("config dump {path}: {field}: {reason}")]
    Shape {
        path: PathBuf,
        field: String,
        reason: String,
    },
    #[error(
        "config dump {path}: holds no dynamic listeners, clusters, routes or endpoints (sections: {sections}); nothing to replay"
    )]
    Empty { path: PathBuf, sections: String },
    #[error("`replay` needs a config dump; a config directory is served by `serve`")]
    NotConfigDump,
    #[error(transparent)]
    Server(#[from] server::Error),
}

/// A loaded dump, ready to serve.
pub struct Replay {
    by_type: BTreeMap<XdsType, Arc<Resources>>,
    /// The listeners with `bind_to_port: false`, for proxies without capture.
    unbound_listeners: Arc<Resources>,
    /// What `--strip-istio-extensions` removed.
    pub removals: Vec<Removal>,
    /// Section types of the dump (after `envoy.admin.v3.`).
    pub sections: Vec<String>,
}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay")
            .field("counts", &self.counts())
            .field("removals", &self.removals.len())
            .finish()
    }
}

impl FixedResources for Replay {
    fn resources(&self, view: &ProxyView, ty: XdsType) -> Arc<Resources> {
        if ty == XdsType::Lds && !view.capture {
            return self.unbound_listeners.clone();
        }
        self.by_type.get(&ty).cloned().unwrap_or_default()
    }
}

fn resource(name: String, any: proto::google::protobuf::Any) -> Resource {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    any.type_url.hash(&mut h);
    any.value.hash(&mut h);
    Resource {
        name,
        any,
        hash: h.finish(),
    }
}

/// `bind_to_port: false` on a listener that has a socket address (internal listeners have none).
fn unbound(listener: &Value) -> Value {
    let mut l = listener.clone();
    if l.pointer("/address/socket_address").is_some()
        && let Some(o) = l.as_object_mut()
    {
        o.insert("bind_to_port".into(), Value::Bool(false));
    }
    l
}

fn label(ty: XdsType, name: &str) -> String {
    let kind = match ty {
        XdsType::Lds => "listener",
        XdsType::Cds => "cluster",
        XdsType::Rds => "route",
        XdsType::Eds => "endpoints",
        XdsType::Nds => "name table",
    };
    format!("{kind} {name}")
}

impl Replay {
    /// Reads and encodes `path`; with `strip`, removes Istio-only extensions first.
    pub fn load(path: &Path, strip: bool) -> Result<Replay, Error> {
        let doc = dump::read(path)?;
        let parsed = dump::parse(path, &doc)?;
        if parsed.items.is_empty() {
            return Err(Error::Empty {
                path: path.to_path_buf(),
                sections: if parsed.sections.is_empty() {
                    "none".into()
                } else {
                    parsed.sections.join(", ")
                },
            });
        }
        let mut by_type: BTreeMap<XdsType, Resources> = BTreeMap::new();
        let mut unbound_listeners = Resources::new();
        let mut removals = Vec::new();
        for mut item in parsed.items {
            let have = by_type.entry(item.ty).or_default();
            if have.iter().any(|r| r.name == item.name) {
                // A warming copy of an active resource: the active one wins.
                continue;
            }
            if strip {
                removals.extend(strip::strip(&mut item.json, &label(item.ty, &item.name)));
            }
            let encode = |json: &Value| {
                encode::encode(item.ty.type_url(), json).map_err(|reason| Error::Shape {
                    path: path.to_path_buf(),
                    field: item.path.clone(),
                    reason: format!(
                        "{} {reason}{}",
                        label(item.ty, &item.name),
                        if strip {
                            ""
                        } else {
                            " (--strip-istio-extensions removes types upstream Envoy lacks)"
                        }
                    ),
                })
            };
            let any = encode(&item.json)?;
            if item.ty == XdsType::Lds {
                let any = encode(&unbound(&item.json))?;
                unbound_listeners.push(resource(item.name.clone(), any));
            }
            have.push(resource(item.name, any));
        }
        unbound_listeners.sort_by(|a, b| a.name.cmp(&b.name));
        let by_type = by_type
            .into_iter()
            .map(|(ty, mut r)| {
                r.sort_by(|a, b| a.name.cmp(&b.name));
                (ty, Arc::new(r))
            })
            .collect();
        Ok(Replay {
            by_type,
            unbound_listeners: Arc::new(unbound_listeners),
            removals,
            sections: parsed.sections,
        })
    }

    /// Resources per type, e.g. `{LDS: 27, CDS: 0, ...}` (only types the dump has).
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        self.by_type
            .iter()
            .map(|(t, r)| (t.short(), r.len()))
            .collect()
    }

    /// Names of the served resources of one type.
    #[cfg(test)]
    pub(crate) fn names(&self, ty: XdsType) -> Vec<String> {
        self.by_type
            .get(&ty)
            .map(|r| r.iter().map(|r| r.name.clone()).collect())
            .unwrap_or_default()
    }
}

/// Loads the dump named by `settings` (a `Source::ConfigDump`), then serves it with the CA
/// and monitoring; returns once every listener is bound.
pub async fn serve(settings: Settings, cancel: CancellationToken) -> Result<Running, Error> {
    let Source::ConfigDump {
        config_dump,
        strip_istio_extensions,
    } = &settings.source
    else {
        return Err(Error::NotConfigDump);
    };
    let replay = Replay::load(config_dump, *strip_istio_extensions)?;
    for r in &replay.removals {
        tracing::info!(resource = %r.resource, path = %r.path, name = r.name.as_deref().unwrap_or(""),
            type_url = %r.type_url, "removed an Istio-only extension");
    }
    let counts = replay.counts();
    tracing::info!(config_dump = %config_dump.display(), sections = %replay.sections.join(","),
        resources = ?counts, removed = replay.removals.len(), strip = strip_istio_extensions,
        "replaying a recorded config dump");
    let objects = counts.values().sum();
    let mesh = Arc::new(MeshSettings {
        trust_domain: settings.server.trust_domain.clone(),
        ..Default::default()
    });
    // An empty config snapshot (versions, push timing); the resources come from the dump.
    let snap = Arc::new(Snapshot::new(Arc::new(Config::default()), mesh, 1));
    let fixed: Arc<dyn FixedResources> = Arc::new(replay);
    let status = Arc::new(ConfigStatus {
        version: snap.version.clone(),
        objects,
        errors: Vec::new(),
    });
    // The senders live as long as the server: a closed channel would end every stream.
    let (snap_tx, snapshots) = tokio::sync::watch::channel(snap);
    let (status_tx, config_status) = tokio::sync::watch::channel(status);
    let running = server::serve_sources(
        &settings,
        Sources {
            snapshots,
            config_status,
            fixed: Some(fixed),
        },
        cancel.clone(),
    )
    .await?;
    tokio::spawn(async move {
        cancel.cancelled().await;
        drop((snap_tx, status_tx));
    });
    Ok(running)
}

#[cfg(test)]
mod tests;
