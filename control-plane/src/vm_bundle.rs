//! `istiod-lite vm-bundle`: the files `istioctl x workload entry configure` writes for a VM
//! (`cluster.env`, `mesh.yaml`, `hosts`, `root-cert.pem`, `istio-token`), all mode 0744.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ca::{Ca, TokenIssuer};

/// Inputs of [`write_bundle`].
#[derive(Clone, Debug)]
pub struct BundleInputs {
    pub ca_dir: PathBuf,
    pub namespace: String,
    pub service_account: String,
    /// The WorkloadGroup name (used as the app and canonical service name).
    pub name: String,
    /// `HOST:PORT` of istiod-lite's secure gRPC port.
    pub discovery_address: String,
    pub output: PathBuf,
    pub cluster_id: String,
    pub trust_domain: String,
    pub token_ttl: Duration,
}

/// Errors writing the bundle.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--discovery-address {0:?}: expected HOST:PORT")]
    DiscoveryAddress(String),
    #[error(transparent)]
    Ca(#[from] crate::ca::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Shell single-quoting as `cluster.env` uses it.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

const ISTIOD_HOST: &str = "istiod.istio-system.svc";

fn write(dir: &Path, name: &str, contents: &str) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    let io = |source| Error::Io {
        path: path.clone(),
        source,
    };
    std::fs::write(&path, contents).map_err(io)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o744)).map_err(io)
}

/// The `cluster.env` and `mesh.yaml` contents (pure, for tests).
pub fn render(inputs: &BundleInputs) -> Result<(String, String, String), Error> {
    let (host, port) = inputs
        .discovery_address
        .rsplit_once(':')
        .filter(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
        .ok_or_else(|| Error::DiscoveryAddress(inputs.discovery_address.clone()))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    // An IP address goes to `hosts`, and the proxy dials istiod by name so TLS verification works.
    let (discovery, hosts) = match host.parse::<IpAddr>() {
        Ok(ip) => (
            format!("{ISTIOD_HOST}:{port}"),
            format!("{ip} {ISTIOD_HOST}\n"),
        ),
        Err(_) => (format!("{host}:{port}"), String::new()),
    };
    let labels = serde_json::json!({
        "app": inputs.name,
        "service.istio.io/canonical-name": inputs.name,
        "service.istio.io/canonical-revision": "latest",
    });
    let mut meta: BTreeMap<&str, String> = BTreeMap::new();
    meta.insert("CANONICAL_REVISION", "latest".into());
    meta.insert("CANONICAL_SERVICE", inputs.name.clone());
    meta.insert("ISTIO_META_CLUSTER_ID", inputs.cluster_id.clone());
    meta.insert("ISTIO_META_DNS_CAPTURE", "true".into());
    meta.insert("ISTIO_META_MESH_ID", inputs.trust_domain.clone());
    meta.insert("ISTIO_META_NETWORK", String::new());
    meta.insert("ISTIO_META_WORKLOAD_NAME", inputs.name.clone());
    meta.insert("ISTIO_METAJSON_LABELS", labels.to_string());
    meta.insert("POD_NAMESPACE", inputs.namespace.clone());
    meta.insert("SERVICE_ACCOUNT", inputs.service_account.clone());
    meta.insert("TRUST_DOMAIN", inputs.trust_domain.clone());

    let mut env = meta.clone();
    env.insert("ISTIO_INBOUND_PORTS", "*".into());
    env.insert("ISTIO_LOCAL_EXCLUDE_PORTS", "22,15090,15021,15020".into());
    env.insert("ISTIO_NAMESPACE", inputs.namespace.clone());
    env.insert(
        "ISTIO_SERVICE",
        format!("{}.{}", inputs.name, inputs.namespace),
    );
    env.insert("ISTIO_SERVICE_CIDR", "*".into());
    if discovery != format!("{ISTIOD_HOST}:15012") {
        env.insert("CA_ADDR", discovery.clone());
    }
    let cluster_env: String = env
        .iter()
        .map(|(k, v)| format!("{k}={}\n", shell_quote(v)))
        .collect();
    let mesh = serde_json::json!({
        "defaultConfig": {
            "discoveryAddress": discovery,
            "meshId": inputs.trust_domain,
            "proxyMetadata": meta,
        }
    });
    let mesh_yaml = serde_yaml::to_string(&mesh).unwrap_or_default();
    Ok((cluster_env, mesh_yaml, hosts))
}

/// Writes the bundle into `inputs.output` (created if needed).
pub fn write_bundle(inputs: &BundleInputs) -> Result<(), Error> {
    let (cluster_env, mesh_yaml, hosts) = render(inputs)?;
    let ca = Ca::load_or_create(&inputs.ca_dir)?;
    let tokens = TokenIssuer::load_or_create(&inputs.ca_dir)?;
    let token = tokens.issue(
        &inputs.namespace,
        &inputs.service_account,
        "istio-ca",
        inputs.token_ttl,
    );
    std::fs::create_dir_all(&inputs.output).map_err(|source| Error::Io {
        path: inputs.output.clone(),
        source,
    })?;
    write(&inputs.output, "cluster.env", &cluster_env)?;
    write(&inputs.output, "mesh.yaml", &mesh_yaml)?;
    write(&inputs.output, "hosts", &hosts)?;
    write(&inputs.output, "root-cert.pem", &ca.trust_bundle_pem())?;
    write(&inputs.output, "istio-token", &token)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(addr: &str) -> BundleInputs {
        BundleInputs {
            ca_dir: PathBuf::new(),
            namespace: "vm-ns".into(),
            service_account: "vm-sa".into(),
            name: "vm1".into(),
            discovery_address: addr.into(),
            output: PathBuf::new(),
            cluster_id: "Kubernetes".into(),
            trust_domain: "cluster.local".into(),
            token_ttl: Duration::from_secs(3600),
        }
    }

    #[test]
    fn ip_discovery_address_goes_to_hosts_and_ca_addr() {
        let (env, mesh, hosts) = render(&inputs("198.18.0.1:15012")).expect("render");
        assert_eq!(hosts, "198.18.0.1 istiod.istio-system.svc\n");
        assert!(
            !env.contains("CA_ADDR"),
            "default address needs no CA_ADDR: {env}"
        );
        assert!(env.contains("ISTIO_SERVICE='vm1.vm-ns'\n"), "{env}");
        assert!(env.contains("SERVICE_ACCOUNT='vm-sa'\n"), "{env}");
        let lines: Vec<&str> = env.lines().collect();
        let mut sorted = lines.clone();
        sorted.sort();
        assert_eq!(lines, sorted, "cluster.env lines are sorted");
        assert!(
            mesh.contains("discoveryAddress: istiod.istio-system.svc:15012"),
            "{mesh}"
        );
    }

    #[test]
    fn named_address_and_custom_port_set_ca_addr() {
        let (env, _, hosts) = render(&inputs("cp.example:4000")).expect("render");
        assert_eq!(hosts, "");
        assert!(env.contains("CA_ADDR='cp.example:4000'\n"), "{env}");
        assert!(render(&inputs("nope")).is_err());
    }

    #[test]
    fn quoting_escapes_single_quotes() {
        assert_eq!(shell_quote("a'b"), r"'a'\''b'");
    }
}
