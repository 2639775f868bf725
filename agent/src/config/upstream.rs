//! The xDS upstream sub-config: how the xDS proxy reaches istiod (address, TLS, root of trust,
//! ServerName, client identity, extra gRPC metadata, token).

use std::path::{Path, PathBuf};
use std::time::Duration;

use sds::CertDir;
use sds::RootSource;

use super::identity::{is_plaintext_addr, istiod_server_name};
use super::{AuthPolicy, Error, env::Env, resolve};

/// The connection to istiod for the xDS proxy.
#[derive(Debug, Clone, serde::Serialize)]
pub struct XdsUpstream {
    /// ProxyConfig `discoveryAddress`: Istio's `host:port`, or (not Istio) a comma-separated
    /// list of them. Every address is resolved to all its IPs and the proxy fails over between
    /// them ([`sds::Failover`]).
    pub address: String,
    /// No TLS: `controlPlaneAuthPolicy: NONE` or a `:15010` address.
    pub plaintext: bool,
    /// Root istiod's serving certificate is verified against (Istio's `FindRootCAForXDS`).
    pub root: RootSource,
    /// TLS ServerName (`ISTIOD_SAN`, else the address' host; `localhost` maps to istiod's name).
    pub server_name: String,
    /// `PROV_CERT`: the client certificate, offered when it parses and is unexpired (the same
    /// policy and files as the CA client's).
    pub prov_cert: Option<CertDir>,
    /// gRPC metadata on every stream: `ClusterID`, then `XDS_HEADER_<K>` sorted by key.
    pub metadata: Vec<(String, String)>,
    /// The bearer token, re-read for every stream.
    pub token_path: PathBuf,
    /// `CA_ALLOW_PLAINTEXT_TOKEN`, as for the CA client: without it no token is sent on a
    /// `plaintext` connection (an observer could replay it at istiod's TLS CA port).
    pub allow_plaintext_token: bool,
    /// `XDS_PROXY_RECONNECT` (default true; not in Istio): on upstream loss the proxy keeps
    /// Envoy's stream open, reconnects and replays Envoy's subscriptions. `false` restores
    /// Istio's behaviour (Envoy's stream ends with the upstream's).
    pub reconnect: bool,
    /// HTTP/2 keepalive (interval, timeout) on the upstream connection: a stalled istiod is
    /// replaced within interval + timeout. Istio's `GRPC_KEEPALIVE_INTERVAL` (30s, at least
    /// 10s) and `GRPC_KEEPALIVE_TIMEOUT` (10s); `XDS_PROXY_KEEPALIVE_INTERVAL` (not in Istio,
    /// at least 100ms) overrides the interval, the timeout then at most half of it.
    pub keepalive: (Duration, Duration),
    /// `XDS_PROXY_MULTI_STREAM` (not in Istio; default true for proxyless gRPC, false with
    /// Envoy): every stream on the XDS socket is served with its own upstream stream, up to
    /// `xds_proxy::MAX_STREAMS` at once (gRPC-Go 1.66+ opens one per channel target,
    /// istio#53532). `false` is Istio's one stream at a time: a new stream ends the previous.
    pub multi_stream: bool,
    /// `XDS_PROXY_PREFETCH` (default true; not in Istio): when Envoy's bootstrap is written,
    /// the xDS proxy opens the upstream stream with its node and fetches CDS and LDS while
    /// Envoy starts; Envoy's first stream takes it over (`xds_proxy::warm`). `false`: the
    /// upstream stream opens when Envoy connects, as Istio's.
    pub prefetch: bool,
    /// `COMPLIANCE_POLICY`: the TLS versions, suites and groups of the connection (the CA
    /// client's policy).
    pub compliance: sds::Compliance,
    /// `PROXY_CONFIG_XDS_AGENT` (false): subscribe to ProxyConfig over xDS (PCDS) and merge its
    /// `caCertificatesPem` into the trust bundle served as `ROOTCA`.
    pub proxy_config_xds: bool,
    /// `ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION` (default true) with the `WASM_*`
    /// settings: ECDS Wasm filters with remote code are rewritten to a fetched local module.
    pub wasm: Option<crate::xds_proxy::wasm::Options>,
}

/// What the upstream settings depend on besides the environment.
pub struct Inputs<'a> {
    pub env: Env<'a>,
    pub base_dir: &'a Path,
    pub discovery_address: &'a str,
    pub auth_policy: AuthPolicy,
    pub cluster_id: &'a str,
    pub prov_cert: Option<&'a CertDir>,
    pub istiod_san: Option<&'a str>,
    /// The identity config's `CA_ALLOW_PLAINTEXT_TOKEN`.
    pub allow_plaintext_token: bool,
    /// Proxyless gRPC (`DISABLE_ENVOY=true` or `ISTIO_META_GENERATOR=grpc`): the default of
    /// `XDS_PROXY_MULTI_STREAM`.
    pub proxyless: bool,
    /// With `FILE_MOUNTED_CERTS`, the ProxyConfig's `proxyMetadata`: its
    /// `ISTIO_META_TLS_CLIENT_ROOT_CERT`, `_CERT_CHAIN` and `_KEY` are the xDS connection's root
    /// and client certificate (Istio's `FindRootCAForXDS`, `GetKeyCertsForXDS`).
    pub file_mounted: Option<&'a std::collections::BTreeMap<String, String>>,
    /// `COMPLIANCE_POLICY`, parsed once for every connection to istiod.
    pub compliance: sds::Compliance,
    /// `GRPC_KEEPALIVE_*` (interval, timeout) as a gRPC client uses them.
    pub grpc_keepalive: (Duration, Duration),
}

/// The ProxyConfig metadata keys of the xDS connection's files under `FILE_MOUNTED_CERTS`.
const CLIENT_ROOT: &str = "ISTIO_META_TLS_CLIENT_ROOT_CERT";
const CLIENT_CHAIN: &str = "ISTIO_META_TLS_CLIENT_CERT_CHAIN";
const CLIENT_KEY: &str = "ISTIO_META_TLS_CLIENT_KEY";

/// Builds the upstream config.
pub fn load(i: Inputs<'_>) -> Result<XdsUpstream, Error> {
    let address = i.discovery_address.to_string();
    let plaintext = i.auth_policy == AuthPolicy::None || is_plaintext_addr(&address);
    sds::Failover::new(&address, plaintext).map_err(|expected| Error::ProxyConfigField {
        field: "discoveryAddress".into(),
        value: address.clone(),
        expected: expected.to_string(),
    })?;
    let root = if plaintext {
        RootSource::System
    } else {
        xds_root(&i)?
    };
    let prov_cert = client_cert(&i, &root);
    let mut metadata = Vec::new();
    if !i.cluster_id.is_empty() {
        metadata.push(("ClusterID".to_string(), i.cluster_id.to_string()));
    }
    metadata.extend(i.env.prefixed("XDS_HEADER_"));
    // Istio's `GRPC_KEEPALIVE_*`, unless `XDS_PROXY_KEEPALIVE_INTERVAL` (ours, for a faster
    // failover than gRPC-Go's 10s floor allows) sets the interval; its timeout is then at most
    // half of it.
    let keepalive = match i.env.get("XDS_PROXY_KEEPALIVE_INTERVAL") {
        None => i.grpc_keepalive,
        Some(_) => {
            let interval = i.env.duration(
                "XDS_PROXY_KEEPALIVE_INTERVAL",
                i.grpc_keepalive.0,
                Duration::from_millis(100),
            )?;
            (interval, i.grpc_keepalive.1.min(interval / 2))
        }
    };
    let wasm = if i
        .env
        .bool("ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION", true)?
    {
        Some(wasm_options(&i)?)
    } else {
        None
    };
    Ok(XdsUpstream {
        wasm,
        reconnect: i.env.bool("XDS_PROXY_RECONNECT", true)?,
        multi_stream: i.env.bool("XDS_PROXY_MULTI_STREAM", i.proxyless)?,
        prefetch: i.env.bool("XDS_PROXY_PREFETCH", true)?,
        keepalive,
        server_name: istiod_server_name(&address, i.istiod_san),
        address,
        plaintext,
        root,
        prov_cert,
        metadata,
        token_path: i.base_dir.join(sds::paths::TOKEN),
        allow_plaintext_token: i.allow_plaintext_token,
        compliance: i.compliance,
        proxy_config_xds: i.env.bool("PROXY_CONFIG_XDS_AGENT", false)?,
    })
}

/// The Wasm cache's settings (Istio's `WASM_*` variables; modules in Istio's data directory).
fn wasm_options(i: &Inputs<'_>) -> Result<crate::xds_proxy::wasm::Options, Error> {
    let mut o = crate::xds_proxy::wasm::Options::new(resolve(i.base_dir, "./var/lib/istio/data"));
    o.insecure_registries = i
        .env
        .str("WASM_INSECURE_REGISTRIES", "")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let min = Duration::from_millis(1);
    o.module_expiry = i.env.duration("WASM_MODULE_EXPIRY", o.module_expiry, min)?;
    o.purge_interval = i
        .env
        .duration("WASM_PURGE_INTERVAL", o.purge_interval, min)?;
    o.http_timeout = i
        .env
        .duration("WASM_HTTP_REQUEST_TIMEOUT", o.http_timeout, min)?;
    o.http_max_retries = i
        .env
        .u32("WASM_HTTP_REQUEST_MAX_RETRIES", o.http_max_retries)?;
    o.max_binary_size = i.env.parse(
        "ISTIO_WASM_MAX_BINARY_SIZE_BYTES",
        o.max_binary_size,
        "a positive number of bytes",
        |v| v.parse::<u64>().ok().filter(|n| *n > 0),
    )?;
    o.plain_http_registries = i
        .env
        .str("WASM_PLAIN_HTTP_REGISTRIES", "")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    o.max_cache_bytes = i.env.parse(
        "WASM_CACHE_MAX_BYTES",
        o.max_cache_bytes,
        "a positive number of bytes",
        |v| v.parse::<u64>().ok().filter(|n| *n > 0),
    )?;
    o.max_cache_entries = i.env.parse(
        "WASM_CACHE_MAX_ENTRIES",
        o.max_cache_entries,
        "a positive number of modules",
        |v| v.parse::<usize>().ok().filter(|n| *n > 0),
    )?;
    for cidr in i
        .env
        .str("BLOCKED_CIDRS_IN_WASM_FETCH", "")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let parsed = cidr.split_once('/').and_then(|(ip, bits)| {
            let ip: std::net::IpAddr = ip.parse().ok()?;
            let bits: u8 = bits.parse().ok()?;
            (bits <= if ip.is_ipv4() { 32 } else { 128 }).then_some((ip, bits))
        });
        o.blocked_cidrs.push(parsed.ok_or_else(|| {
            i.env.invalid(
                "BLOCKED_CIDRS_IN_WASM_FETCH",
                cidr,
                "comma-separated CIDRs (10.0.0.0/8)",
            )
        })?);
    }
    Ok(o)
}

/// The client certificate offered to istiod: `PROV_CERT`'s, else with `FILE_MOUNTED_CERTS`
/// the files the ProxyConfig metadata names (both chain and key, or none).
fn client_cert(i: &Inputs<'_>, root: &RootSource) -> Option<CertDir> {
    if let Some(dir) = i.prov_cert {
        return Some(dir.clone());
    }
    let meta = i.file_mounted?;
    let file = |k: &str| {
        meta.get(k)
            .filter(|v| !v.is_empty())
            .map(|v| resolve(i.base_dir, v))
    };
    Some(CertDir {
        cert_chain: file(CLIENT_CHAIN)?,
        key: file(CLIENT_KEY)?,
        root: match root {
            RootSource::File(p) => p.clone(),
            _ => file(CLIENT_ROOT)?,
        },
    })
}

/// The XDS root of trust, as Istio's `FindRootCAForXDS`: `XDS_ROOT_CA` (`SYSTEM` for the OS
/// bundle), else `./etc/certs/root-cert.pem` when present, else the `PROV_CERT` root, else
/// Istio's mounted root (not with `PILOT_CERT_PROVIDER=none`).
fn xds_root(i: &Inputs<'_>) -> Result<RootSource, Error> {
    if let Some(v) = i.env.get("XDS_ROOT_CA") {
        if v.eq_ignore_ascii_case("SYSTEM") {
            return Ok(RootSource::System);
        }
        return Ok(RootSource::File(resolve(i.base_dir, v)));
    }
    let etc = i.base_dir.join("etc/certs/root-cert.pem");
    if etc.exists() {
        return Ok(RootSource::File(etc));
    }
    if let Some(dir) = i.prov_cert {
        return Ok(RootSource::File(dir.root.clone()));
    }
    if let Some(meta) = i.file_mounted {
        let path = meta.get(CLIENT_ROOT).map(String::as_str).unwrap_or("");
        let file = resolve(i.base_dir, path);
        if path.is_empty() || !file.is_file() {
            return Err(Error::ProxyConfigField {
                field: format!("proxyMetadata.{CLIENT_ROOT}"),
                value: format!("{path:?}"),
                expected:
                    "the root certificate file for XDS (FILE_MOUNTED_CERTS=true): it does not exist"
                        .into(),
            });
        }
        return Ok(RootSource::File(file));
    }
    if i.env.get("PILOT_CERT_PROVIDER") == Some("none") {
        return Err(i.env.invalid(
            "PILOT_CERT_PROVIDER",
            "none",
            "a root for istiod's certificate: set XDS_ROOT_CA (or use a provider with a root)",
        ));
    }
    Ok(RootSource::File(i.base_dir.join(sds::paths::ISTIO_ROOT)))
}
