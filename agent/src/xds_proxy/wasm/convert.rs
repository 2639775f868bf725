//! The ECDS rewrite (Istio's `MaybeConvertWasmExtensionConfig`): each resource that is a Wasm
//! HTTP or network filter with remote code gets its module from the cache and local code in
//! its place, or, when the module cannot be had, the RBAC filter its failure policy names.
//! Other resources pass unchanged. An error (a resource that does not decode, or Wasm with
//! neither remote nor local code) fails the whole response: the relay NACKs it.

use std::time::Duration;

use prost::Message;
use proto::envoy::config::core::v3::{
    AsyncDataSource, DataSource, TypedExtensionConfig, async_data_source, data_source,
};
use proto::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use proto::envoy::extensions::filters::http::wasm::v3::Wasm as HttpWasm;
use proto::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use proto::envoy::extensions::filters::network::wasm::v3::Wasm as NetworkWasm;
use proto::envoy::extensions::wasm::v3::{FailurePolicy, PluginConfig, plugin_config};
use proto::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse};
use proto::google::protobuf::Any;

use super::Cache;
use super::cache::{PullPolicy, Request};
use super::metrics;

const HTTP_WASM: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const NETWORK_WASM: &str = "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm";
const HTTP_RBAC: &str = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC";
const NETWORK_RBAC: &str = "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC";

const SECRET_ENV: &str = "ISTIO_META_WASM_IMAGE_PULL_SECRET";
const POLICY_ENV: &str = "ISTIO_META_WASM_IMAGE_PULL_POLICY";
const VERSION_ENV: &str = "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION";

/// The stat prefixes of Istio's fallback filters.
pub const ALLOW_PREFIX: &str = "wasm-default-allow";
pub const DENY_PREFIX: &str = "wasm-default-deny";

/// Why an ECDS response is NACKed: it does not decode, or (`Resources`) some of its
/// resources are not valid extension configs.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Response(#[from] prost::DecodeError),
    #[error("{}", join(.0))]
    Resources(Vec<ConvertError>),
    #[error("failed to unmarshal extension config resource: {0}")]
    Resource(#[source] prost::DecodeError),
    #[error("typed extension config {name} does not contain any typed config")]
    NoTypedConfig { name: String },
    #[error("failed to unmarshal extension config resource into Wasm HTTP filter: {0}")]
    HttpWasm(#[source] prost::DecodeError),
    #[error("failed to unmarshal extension config resource into Wasm Network filter: {0}")]
    NetworkWasm(#[source] prost::DecodeError),
    #[error("Wasm filter {name} has no config")]
    NoConfig { name: String },
    #[error("no remote and local load found in Wasm filter {name}")]
    NoCode { name: String },
}

fn join(errors: &[ConvertError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Rewrites a SotW ECDS response; `Ok(None)` when nothing changed.
pub async fn convert_sotw(
    bytes: &[u8],
    cache: &Cache,
) -> Result<Option<bytes::Bytes>, ConvertError> {
    let mut resp = DiscoveryResponse::decode(bytes)?;
    let changed = convert_all(resp.resources.iter_mut().collect(), cache).await?;
    Ok(changed.then(|| resp.encode_to_vec().into()))
}

/// Rewrites a Delta ECDS response; `Ok(None)` when nothing changed.
pub async fn convert_delta(
    bytes: &[u8],
    cache: &Cache,
) -> Result<Option<bytes::Bytes>, ConvertError> {
    let mut resp = DeltaDiscoveryResponse::decode(bytes)?;
    let anys = resp
        .resources
        .iter_mut()
        .filter_map(|r| r.resource.as_mut())
        .collect();
    let changed = convert_all(anys, cache).await?;
    Ok(changed.then(|| resp.encode_to_vec().into()))
}

/// Converts every resource at once; every resource's error is named.
async fn convert_all(resources: Vec<&mut Any>, cache: &Cache) -> Result<bool, ConvertError> {
    let start = std::time::Instant::now();
    let results =
        futures::future::join_all(resources.into_iter().map(|r| convert_one(r, cache))).await;
    cache
        .metrics()
        .conversion_duration
        .observe(start.elapsed().as_secs_f64() * 1000.0);
    let mut changed = false;
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(c) => changed |= c,
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(changed)
    } else {
        Err(ConvertError::Resources(errors))
    }
}

/// The filter's Wasm config, HTTP or network.
enum Filter {
    Http(HttpWasm),
    Network(NetworkWasm),
}

impl Filter {
    fn config(&mut self) -> Option<&mut PluginConfig> {
        match self {
            Filter::Http(w) => w.config.as_mut(),
            Filter::Network(w) => w.config.as_mut(),
        }
    }

    fn encode(&self) -> Any {
        match self {
            Filter::Http(w) => Any {
                type_url: HTTP_WASM.into(),
                value: w.encode_to_vec(),
            },
            Filter::Network(w) => Any {
                type_url: NETWORK_WASM.into(),
                value: w.encode_to_vec(),
            },
        }
    }

    /// Istio's fallback: no rules allow all, empty rules deny all.
    fn fallback(&self, fail_open: bool) -> Any {
        let rules = (!fail_open).then(Default::default);
        let prefix = if fail_open { ALLOW_PREFIX } else { DENY_PREFIX };
        match self {
            Filter::Http(_) => Any {
                type_url: HTTP_RBAC.into(),
                value: HttpRbac {
                    rules,
                    rules_stat_prefix: prefix.into(),
                    ..Default::default()
                }
                .encode_to_vec(),
            },
            Filter::Network(_) => Any {
                type_url: NETWORK_RBAC.into(),
                value: NetworkRbac {
                    rules,
                    stat_prefix: prefix.into(),
                    ..Default::default()
                }
                .encode_to_vec(),
            },
        }
    }
}

/// Fail open: `failure_policy` when set (only `FAIL_OPEN` opens), else the deprecated
/// `fail_open`.
fn fail_open(c: &PluginConfig) -> bool {
    #[allow(deprecated)]
    let legacy = c.fail_open;
    match FailurePolicy::try_from(c.failure_policy) {
        Ok(FailurePolicy::Unspecified) | Err(_) => legacy,
        Ok(p) => p == FailurePolicy::FailOpen,
    }
}

/// Converts one resource; `Ok(true)` when it was rewritten.
async fn convert_one(resource: &mut Any, cache: &Cache) -> Result<bool, ConvertError> {
    let m = cache.metrics();
    let result = convert_inner(resource, cache).await;
    m.conversion(match &result {
        Ok(Converted::Unchanged) => metrics::NO_REMOTE_LOAD,
        Ok(Converted::Local) => metrics::CONVERSION_SUCCESS,
        Ok(Converted::Fallback(r)) => r,
        Err(_) => metrics::UNMARSHAL_FAILURE,
    });
    result.map(|c| !matches!(c, Converted::Unchanged))
}

/// What became of a resource.
enum Converted {
    /// Not Wasm, or Wasm with local code.
    Unchanged,
    /// Remote code made local.
    Local,
    /// The module could not be had: the RBAC fallback, with the conversion's result label.
    Fallback(&'static str),
}

async fn convert_inner(resource: &mut Any, cache: &Cache) -> Result<Converted, ConvertError> {
    let mut ec =
        TypedExtensionConfig::decode(&resource.value[..]).map_err(ConvertError::Resource)?;
    let Some(typed) = ec.typed_config.as_ref() else {
        return Err(ConvertError::NoTypedConfig { name: ec.name });
    };
    let mut filter = match typed.type_url.as_str() {
        HTTP_WASM => {
            Filter::Http(HttpWasm::decode(&typed.value[..]).map_err(ConvertError::HttpWasm)?)
        }
        NETWORK_WASM => Filter::Network(
            NetworkWasm::decode(&typed.value[..]).map_err(ConvertError::NetworkWasm)?,
        ),
        // Not Wasm (TypedStruct-wrapped Wasm included: istiod sends Wasm typed).
        _ => return Ok(Converted::Unchanged),
    };
    let Some(config) = filter.config() else {
        return Err(ConvertError::NoConfig { name: ec.name });
    };
    let vm = match config.vm.as_mut() {
        Some(plugin_config::Vm::VmConfig(vm)) => vm,
        None => {
            return Err(ConvertError::NoCode { name: ec.name });
        }
    };
    match vm.code.as_ref().and_then(|c| c.specifier.as_ref()) {
        Some(async_data_source::Specifier::Remote(_)) => {}
        Some(async_data_source::Specifier::Local(_)) => return Ok(Converted::Unchanged),
        None => {
            return Err(ConvertError::NoCode { name: ec.name });
        }
    }
    let open = fail_open(config);
    let plugin = config.name.clone();
    let fetched = rewrite_vm(&ec.name, &plugin, config, cache).await;
    let (new_typed, converted) = match fetched {
        Ok(()) => (filter.encode(), Converted::Local),
        Err((result, e)) => {
            tracing::error!(resource = %ec.name, error = %e,
                rbac = if open { "allow" } else { "deny" },
                "error in converting the wasm config to local; applying the RBAC filter");
            (filter.fallback(open), Converted::Fallback(result))
        }
    };
    ec.typed_config = Some(new_typed);
    resource.value = ec.encode_to_vec();
    Ok(converted)
}

/// Istio's `rewriteVMConfig`: reads and drops the `ISTIO_META_*` VM variables, fetches the
/// module and points the VM at the local file.
async fn rewrite_vm(
    resource: &str,
    plugin: &str,
    config: &mut PluginConfig,
    cache: &Cache,
) -> Result<(), (&'static str, String)> {
    let fetch_failure = |e: String| (metrics::FETCH_FAILURE, e);
    let Some(plugin_config::Vm::VmConfig(vm)) = config.vm.as_mut() else {
        return Err(fetch_failure("no VM config".into()));
    };
    let mut policy = PullPolicy::Unspecified;
    let mut version = String::new();
    if let Some(env) = vm.environment_variables.as_mut() {
        if let Some(secret) = env.key_values.get(SECRET_ENV)
            && secret.is_empty()
        {
            return Err(fetch_failure(format!(
                "cannot fetch Wasm module {plugin}: missing image pulling secret"
            )));
        }
        if let Some(p) = env.key_values.get(POLICY_ENV) {
            policy = PullPolicy::parse(p);
        }
        version = env.key_values.get(VERSION_ENV).cloned().unwrap_or_default();
        env.key_values.retain(|k, _| !k.starts_with("ISTIO_META_"));
        if env.key_values.is_empty() && env.host_env_keys.is_empty() {
            vm.environment_variables = None;
        }
    }
    let Some(async_data_source::Specifier::Remote(remote)) =
        vm.code.as_ref().and_then(|c| c.specifier.as_ref())
    else {
        return Err(fetch_failure("no remote code".into()));
    };
    let Some(uri) = remote.http_uri.as_ref() else {
        return Err((
            metrics::MISS_REMOTE_FETCH_HINT,
            format!("wasm remote fetch does not have httpUri specified for config {plugin}"),
        ));
    };
    let checksum = if remote.sha256 == "nil" {
        String::new()
    } else {
        remote.sha256.to_ascii_lowercase()
    };
    let timeout = uri
        .timeout
        .as_ref()
        .and_then(|d| {
            Some(Duration::new(
                u64::try_from(d.seconds).ok()?,
                u32::try_from(d.nanos).ok()?,
            ))
        })
        .filter(|d| !d.is_zero())
        .unwrap_or(Duration::from_secs(5));
    let req = Request {
        checksum,
        resource_name: resource.to_string(),
        resource_version: version,
        timeout,
        pull_policy: policy,
    };
    let path = cache
        .get(&uri.uri, &req)
        .await
        .map_err(|e| fetch_failure(format!("cannot fetch Wasm module {}: {e}", uri.uri)))?;
    vm.code = Some(AsyncDataSource {
        specifier: Some(async_data_source::Specifier::Local(DataSource {
            specifier: Some(data_source::Specifier::Filename(path.display().to_string())),
            ..Default::default()
        })),
    });
    Ok(())
}
