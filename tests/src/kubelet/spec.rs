//! The part of Kubernetes' Pod API the runner honours, parsed strictly: a field the runner does
//! not know is an error naming it (serde's `deny_unknown_fields`), never silently skipped.
//! Field names and defaults are Kubernetes' (`k8s.io/api/core/v1`).

use serde::Deserialize;
use std::collections::BTreeMap;

/// A manifest's top level: `kind` picks where the pod template is.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Object {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: serde_yaml::Value,
    #[serde(default)]
    pub status: serde_yaml::Value,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectMeta {
    pub name: Option<String>,
    pub generate_name: Option<String>,
    pub namespace: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    pub creation_timestamp: Option<serde_yaml::Value>,
}

/// `spec.template` of a workload.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodTemplate {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: PodSpec,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodSpec {
    pub containers: Vec<Container>,
    #[serde(default)]
    pub init_containers: Vec<Container>,
    #[serde(default)]
    pub volumes: Vec<Volume>,
    pub restart_policy: Option<String>,
    pub security_context: Option<PodSecurityContext>,
    pub service_account_name: Option<String>,
    pub service_account: Option<String>,
    pub automount_service_account_token: Option<bool>,
    pub termination_grace_period_seconds: Option<u64>,
    pub node_name: Option<String>,
    pub dns_policy: Option<String>,
    pub enable_service_links: Option<bool>,
    pub share_process_namespace: Option<bool>,
    pub host_network: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodSecurityContext {
    pub run_as_user: Option<u32>,
    pub run_as_group: Option<u32>,
    pub run_as_non_root: Option<bool>,
    pub fs_group: Option<u32>,
    #[serde(default)]
    pub supplemental_groups: Vec<u32>,
    #[serde(default)]
    pub sysctls: Vec<Sysctl>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sysctl {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Container {
    pub name: String,
    pub image: String,
    pub command: Option<Vec<String>>,
    pub args: Option<Vec<String>>,
    pub working_dir: Option<String>,
    #[serde(default)]
    pub env: Vec<EnvVar>,
    #[serde(default)]
    pub ports: Vec<ContainerPort>,
    #[serde(default)]
    pub volume_mounts: Vec<VolumeMount>,
    pub security_context: Option<SecurityContext>,
    pub readiness_probe: Option<Probe>,
    pub liveness_probe: Option<Probe>,
    pub startup_probe: Option<Probe>,
    pub lifecycle: Option<Lifecycle>,
    /// `Always` on an init container makes it a native sidecar.
    pub restart_policy: Option<String>,
    #[serde(default)]
    pub resources: Resources,
    pub image_pull_policy: Option<String>,
    pub termination_message_path: Option<String>,
    pub termination_message_policy: Option<String>,
}

impl Container {
    /// A native sidecar: an init container with `restartPolicy: Always`.
    pub fn is_sidecar(&self) -> bool {
        self.restart_policy.as_deref() == Some("Always")
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    #[serde(default)]
    pub limits: BTreeMap<String, Quantity>,
    #[serde(default)]
    pub requests: BTreeMap<String, Quantity>,
}

/// A resource quantity as written (`"2"`, `100m`, `1Gi`, or a bare number).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Quantity {
    Text(String),
    Number(f64),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvVar {
    pub name: String,
    pub value: Option<String>,
    pub value_from: Option<EnvVarSource>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvVarSource {
    pub field_ref: Option<FieldRef>,
    pub resource_field_ref: Option<ResourceFieldRef>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FieldRef {
    pub field_path: String,
    pub api_version: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceFieldRef {
    pub resource: String,
    pub container_name: Option<String>,
    pub divisor: Option<Quantity>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerPort {
    pub container_port: u16,
    pub name: Option<String>,
    pub protocol: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeMount {
    pub name: String,
    pub mount_path: String,
    pub read_only: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecurityContext {
    pub run_as_user: Option<u32>,
    pub run_as_group: Option<u32>,
    pub run_as_non_root: Option<bool>,
    pub read_only_root_filesystem: Option<bool>,
    pub allow_privilege_escalation: Option<bool>,
    pub privileged: Option<bool>,
    pub capabilities: Option<Capabilities>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    #[serde(default)]
    pub add: Vec<String>,
    #[serde(default)]
    pub drop: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Probe {
    pub http_get: Option<HttpGet>,
    pub tcp_socket: Option<TcpSocket>,
    pub exec: Option<ExecAction>,
    pub grpc: Option<GrpcAction>,
    pub initial_delay_seconds: Option<u64>,
    pub timeout_seconds: Option<u64>,
    pub period_seconds: Option<u64>,
    pub success_threshold: Option<u32>,
    pub failure_threshold: Option<u32>,
    pub termination_grace_period_seconds: Option<u64>,
}

/// A port by number or by the name of one of the container's ports.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum IntOrString {
    Int(u16),
    Name(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpGet {
    pub path: Option<String>,
    pub port: IntOrString,
    pub host: Option<String>,
    pub scheme: Option<String>,
    #[serde(default)]
    pub http_headers: Vec<HttpHeader>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpHeader {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpSocket {
    pub port: IntOrString,
    pub host: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecAction {
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcAction {
    pub port: u16,
    pub service: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Lifecycle {
    pub post_start: Option<Handler>,
    pub pre_stop: Option<Handler>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Handler {
    pub exec: Option<ExecAction>,
    pub http_get: Option<HttpGet>,
    pub tcp_socket: Option<TcpSocket>,
    pub sleep: Option<SleepAction>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SleepAction {
    pub seconds: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Volume {
    pub name: String,
    pub empty_dir: Option<EmptyDir>,
    #[serde(rename = "downwardAPI")]
    pub downward_api: Option<DownwardApi>,
    pub config_map: Option<ConfigMapVolume>,
    pub projected: Option<Projected>,
    pub csi: Option<Csi>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EmptyDir {
    pub medium: Option<String>,
    pub size_limit: Option<Quantity>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DownwardApi {
    #[serde(default)]
    pub items: Vec<DownwardApiItem>,
    pub default_mode: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DownwardApiItem {
    pub path: String,
    pub field_ref: Option<FieldRef>,
    pub resource_field_ref: Option<ResourceFieldRef>,
    pub mode: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigMapVolume {
    pub name: String,
    pub optional: Option<bool>,
    pub default_mode: Option<u32>,
    #[serde(default)]
    pub items: Vec<KeyToPath>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyToPath {
    pub key: String,
    pub path: String,
    pub mode: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Projected {
    pub sources: Vec<ProjectedSource>,
    pub default_mode: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProjectedSource {
    pub service_account_token: Option<ServiceAccountToken>,
    pub config_map: Option<ConfigMapVolume>,
    #[serde(rename = "downwardAPI")]
    pub downward_api: Option<DownwardApi>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceAccountToken {
    pub audience: Option<String>,
    pub expiration_seconds: Option<u64>,
    pub path: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Csi {
    pub driver: String,
    pub read_only: Option<bool>,
    #[serde(default)]
    pub volume_attributes: BTreeMap<String, String>,
}

/// A pod to run: its metadata as the API server and controllers give it, and its spec.
#[derive(Debug, Clone)]
pub struct PodManifest {
    /// The workload kind the template came from (`Pod`, `Deployment`, `Job`, ...).
    pub kind: String,
    /// The workload's name (the pod's for `kind: Pod`).
    pub workload: String,
    pub metadata: ObjectMeta,
    pub spec: PodSpec,
}

impl PodManifest {
    /// Parses the first document of `yaml` that holds a pod: a `Pod`, or a workload's
    /// `spec.template` (`Deployment`, `ReplicaSet`, `StatefulSet`, `DaemonSet`, `Job`) or a
    /// `CronJob`'s `spec.jobTemplate.spec.template`. Errors name the field.
    pub fn parse(yaml: &str) -> Result<PodManifest, String> {
        use serde::Deserialize as _;
        for doc in serde_yaml::Deserializer::from_str(yaml) {
            let value = serde_yaml::Value::deserialize(doc).map_err(|e| format!("YAML: {e}"))?;
            if value.is_null() {
                continue;
            }
            let obj: Object = serde_yaml::from_value(value).map_err(|e| format!("{e}"))?;
            let workload = obj.metadata.name.clone().unwrap_or_default();
            let template = match obj.kind.as_str() {
                "Pod" => {
                    let wrapped: serde_yaml::Value =
                        serde_yaml::from_str("spec: {}").expect("static YAML");
                    let mut wrapped = wrapped;
                    wrapped["spec"] = obj.spec.clone();
                    required_images(&wrapped, &format!("Pod {workload:?}: spec"))?;
                    let spec: PodSpec = serde_yaml::from_value(obj.spec)
                        .map_err(|e| format!("Pod {workload:?}: spec: {e}"))?;
                    return Ok(PodManifest {
                        kind: obj.kind,
                        workload,
                        metadata: obj.metadata,
                        spec,
                    });
                }
                "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet" | "Job" => {
                    obj.spec.get("template").cloned()
                }
                "CronJob" => obj
                    .spec
                    .get("jobTemplate")
                    .and_then(|j| j.get("spec"))
                    .and_then(|s| s.get("template"))
                    .cloned(),
                other => {
                    return Err(format!(
                        "kind {other:?}: the runner takes Pod, Deployment, ReplicaSet, \
                         StatefulSet, DaemonSet, Job or CronJob"
                    ));
                }
            };
            let template = template
                .ok_or_else(|| format!("{} {workload:?}: spec.template is missing", obj.kind))?;
            required_images(
                &template,
                &format!("{} {workload:?}: spec.template.spec", obj.kind),
            )?;
            let template: PodTemplate = serde_yaml::from_value(template)
                .map_err(|e| format!("{} {workload:?}: spec.template: {e}", obj.kind))?;
            let mut metadata = template.metadata;
            metadata.namespace = metadata.namespace.or(obj.metadata.namespace);
            return Ok(PodManifest {
                kind: obj.kind,
                workload,
                metadata,
                spec: template.spec,
            });
        }
        Err("no document with a pod in it".into())
    }

    /// The namespace (Kubernetes' default: `default`).
    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or("default")
    }

    /// The service account (`default` when unset).
    pub fn service_account(&self) -> &str {
        self.spec
            .service_account_name
            .as_deref()
            .or(self.spec.service_account.as_deref())
            .unwrap_or("default")
    }

    /// Every container: init containers first, then the app containers.
    pub fn all_containers(&self) -> impl Iterator<Item = &Container> {
        self.spec
            .init_containers
            .iter()
            .chain(self.spec.containers.iter())
    }
}

/// The API server's validation of container images: `image` is required (a container with a
/// name only, such as a strategic-merge stub left in a spec, is rejected at admission).
fn required_images(template: &serde_yaml::Value, at: &str) -> Result<(), String> {
    for list in ["initContainers", "containers"] {
        let Some(seq) = template["spec"][list].as_sequence() else {
            continue;
        };
        for (i, c) in seq.iter().enumerate() {
            if c.get("image")
                .and_then(|v| v.as_str())
                .is_none_or(str::is_empty)
            {
                let name = c.get("name").and_then(|v| v.as_str()).unwrap_or("?");
                return Err(format!(
                    "{at}.{list}[{i}] ({name}): image: Required value (the API server rejects this pod)"
                ));
            }
        }
    }
    Ok(())
}

impl Quantity {
    /// The value in base units (cores for CPU, bytes for memory): `100m` = 0.1, `1Gi` = 2^30.
    pub fn value(&self) -> Result<f64, String> {
        let s = match self {
            Quantity::Number(n) => return Ok(*n),
            Quantity::Text(s) => s.trim(),
        };
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
            .unwrap_or(s.len());
        let (num, suffix) = s.split_at(split);
        let num: f64 = num
            .parse()
            .map_err(|_| format!("quantity {s:?}: expected a number with a suffix"))?;
        let mult = match suffix {
            "" => 1.0,
            "m" => 1e-3,
            "k" => 1e3,
            "M" => 1e6,
            "G" => 1e9,
            "T" => 1e12,
            "Ki" => 1024.0,
            "Mi" => 1024.0 * 1024.0,
            "Gi" => 1024.0 * 1024.0 * 1024.0,
            "Ti" => 1024.0_f64.powi(4),
            other => return Err(format!("quantity {s:?}: unknown suffix {other:?}")),
        };
        Ok(num * mult)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        let q = |s: &str| Quantity::Text(s.into()).value().unwrap();
        assert_eq!(q("2"), 2.0);
        assert!((q("100m") - 0.1).abs() < 1e-9);
        assert_eq!(q("1Gi"), 1073741824.0);
        assert_eq!(q("128Mi"), 134217728.0);
        assert!(Quantity::Text("1Zi".into()).value().is_err());
    }

    #[test]
    fn unknown_fields_are_named() {
        let yaml = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: a\n    image: x\n    stdinOnce: true\n";
        let err = PodManifest::parse(yaml).unwrap_err();
        assert!(err.contains("stdinOnce"), "{err}");
    }

    #[test]
    fn workload_templates() {
        let yaml = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  template:\n    metadata: {labels: {a: b}}\n    spec:\n      restartPolicy: Never\n      containers: [{name: c, image: i}]\n";
        let m = PodManifest::parse(yaml).unwrap();
        assert_eq!((m.kind.as_str(), m.workload.as_str()), ("Job", "j"));
        assert_eq!(m.namespace(), "default");
        assert_eq!(m.service_account(), "default");
        assert_eq!(m.metadata.labels["a"], "b");
        let stub = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - {name: a, image: x}\n  - {name: istio-proxy}\n";
        let err = PodManifest::parse(stub).unwrap_err();
        assert!(
            err.contains("containers[1] (istio-proxy): image: Required value"),
            "{err}"
        );
        let err =
            PodManifest::parse("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n").unwrap_err();
        assert!(err.contains("Service"), "{err}");
    }
}
