//! Pod volumes as the kubelet lays them out under `/var/lib/kubelet/pods/<uid>/volumes/`:
//!
//! - `emptyDir`: a directory owned by root, mode 0777 (`medium: Memory`: a tmpfs, whose root
//!   keeps tmpfs' 1777); a volume with no source at all is an emptyDir (the API's defaulting).
//! - `configMap`, `downwardAPI`, `projected`: the atomic writer's layout: the payload in a
//!   `..<timestamp>` directory (0755), a `..data` symlink to it, and one symlink per top-level
//!   entry (`root-cert.pem -> ..data/root-cert.pem`); files 0644 unless a mode says otherwise;
//!   mounted read-only. A projected service-account token is 0600 and owned by the pods' common
//!   `runAsUser` when `fsGroup` or such a user is set (Kubernetes 1.19+), otherwise 0644.
//! - `downwardAPI` labels and annotations: one `key="value"` line per entry, keys sorted,
//!   values quoted as Go's `%q`, no trailing newline (the kubelet's `fieldpath.FormatMap`).
//!
//! ConfigMaps the runner knows: `istio-ca-root-cert` (`root-cert.pem`: the root of
//! istiod-lite's CA, as istiod publishes it in every namespace). Any other is missing: an error
//! unless `optional`, then an empty volume. CSI: `csi.spiffe.io` is served by the runner's
//! stand-in for SPIRE's agent (a directory holding its Workload API socket).

use super::spec::{ConfigMapVolume, DownwardApiItem, PodManifest, Volume};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What the kubelet knows when it sets up volumes.
pub struct Inputs<'a> {
    pub pod: &'a PodManifest,
    pub pod_name: &'a str,
    pub pod_ip: &'a str,
    pub host_ip: &'a str,
    pub node_name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub annotations: &'a BTreeMap<String, String>,
    /// The root certificate istiod-lite's CA publishes.
    pub root_cert: &'a str,
    /// Issues a service-account token: (audience, expiration seconds) → JWT.
    pub token: &'a dyn Fn(&str, u64) -> Result<String, String>,
    /// The directory of the SPIRE stand-in's socket, for `csi.spiffe.io`.
    pub spire_dir: Option<&'a Path>,
}

/// One set-up volume.
#[derive(Debug, Clone)]
pub struct SetUp {
    pub path: PathBuf,
    /// The kubelet mounts configMap, secret, downwardAPI and projected volumes read-only.
    pub read_only: bool,
    /// A tmpfs to unmount at teardown.
    pub tmpfs: bool,
}

/// Sets up every volume of the pod under `dir`; returns them by name.
pub fn set_up(dir: &Path, inputs: &Inputs) -> Result<BTreeMap<String, SetUp>, String> {
    let mut out = BTreeMap::new();
    for v in &inputs.pod.spec.volumes {
        let s = set_up_one(dir, v, inputs).map_err(|e| format!("volume {:?}: {e}", v.name))?;
        out.insert(v.name.clone(), s);
    }
    Ok(out)
}

fn sources(v: &Volume) -> usize {
    [
        v.empty_dir.is_some(),
        v.downward_api.is_some(),
        v.config_map.is_some(),
        v.projected.is_some(),
        v.csi.is_some(),
    ]
    .iter()
    .filter(|x| **x)
    .count()
}

fn set_up_one(dir: &Path, v: &Volume, inputs: &Inputs) -> Result<SetUp, String> {
    if sources(v) > 1 {
        return Err("more than one volume source".into());
    }
    let plugin_dir = |plugin: &str| dir.join(format!("kubernetes.io~{plugin}")).join(&v.name);
    if let Some(csi) = &v.csi {
        if csi.driver != "csi.spiffe.io" {
            return Err(format!(
                "csi driver {:?}: the runner serves only csi.spiffe.io",
                csi.driver
            ));
        }
        let spire = inputs
            .spire_dir
            .ok_or("csi.spiffe.io needs the SPIRE stand-in, which this run did not start")?;
        return Ok(SetUp {
            path: spire.to_path_buf(),
            read_only: csi.read_only.unwrap_or(false),
            tmpfs: false,
        });
    }
    if let Some(cm) = &v.config_map {
        let path = plugin_dir("configmap");
        empty_dir(&path, false)?;
        let payload = config_map_payload(cm, inputs)?;
        atomic_write(&path, &payload)?;
        return Ok(SetUp {
            path,
            read_only: true,
            tmpfs: false,
        });
    }
    if let Some(d) = &v.downward_api {
        let path = plugin_dir("downward-api");
        empty_dir(&path, false)?;
        let mut payload = Payload::new();
        for item in &d.items {
            let mode = item.mode.or(d.default_mode).unwrap_or(0o644);
            payload.insert(item.path.clone(), (downward(item, inputs)?, mode, None));
        }
        atomic_write(&path, &payload)?;
        return Ok(SetUp {
            path,
            read_only: true,
            tmpfs: false,
        });
    }
    if let Some(p) = &v.projected {
        let path = plugin_dir("projected");
        empty_dir(&path, true)?;
        let default_mode = p.default_mode.unwrap_or(0o644);
        let mut payload = Payload::new();
        for s in &p.sources {
            if let Some(t) = &s.service_account_token {
                let audience = t.audience.as_deref().unwrap_or("kubernetes");
                let ttl = t.expiration_seconds.unwrap_or(3600);
                let jwt = (inputs.token)(audience, ttl)?;
                let (mode, owner) = match token_owner(inputs.pod) {
                    Some(owner) => (0o600, Some(owner)),
                    None => (default_mode, None),
                };
                payload.insert(t.path.clone(), (jwt, mode, owner));
            } else if let Some(cm) = &s.config_map {
                for (k, (data, mode, _)) in config_map_payload(cm, inputs)? {
                    payload.insert(k, (data, p.default_mode.map_or(mode, |d| d), None));
                }
            } else if let Some(d) = &s.downward_api {
                for item in &d.items {
                    let mode = item.mode.unwrap_or(default_mode);
                    payload.insert(item.path.clone(), (downward(item, inputs)?, mode, None));
                }
            } else {
                return Err("a projected source with nothing in it".into());
            }
        }
        atomic_write(&path, &payload)?;
        return Ok(SetUp {
            path,
            read_only: true,
            tmpfs: true,
        });
    }
    let memory = match v.empty_dir.as_ref().and_then(|e| e.medium.as_deref()) {
        None | Some("") => false,
        Some("Memory") => true,
        Some(other) => {
            return Err(format!(
                "emptyDir.medium {other:?}: expected \"\" or Memory"
            ));
        }
    };
    let path = plugin_dir("empty-dir");
    empty_dir(&path, memory)?;
    Ok(SetUp {
        path,
        read_only: false,
        tmpfs: memory,
    })
}

/// The owner the kubelet gives a projected token: the pod's one `runAsUser` when every
/// container runs as the same user (Kubernetes' `FsUserFrom`), when there is one.
fn token_owner(pod: &PodManifest) -> Option<u32> {
    let pod_user = pod
        .spec
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_user);
    let mut users = pod.all_containers().map(|c| {
        c.security_context
            .as_ref()
            .and_then(|s| s.run_as_user)
            .or(pod_user)
    });
    let first = users.next()??;
    users.all(|u| u == Some(first)).then_some(first)
}

/// An emptyDir: root-owned 0777 on disk; a tmpfs (1777) for `medium: Memory`.
fn empty_dir(path: &Path, memory: bool) -> Result<(), String> {
    fs::create_dir_all(path).map_err(|e| format!("mkdir {}: {e}", path.display()))?;
    if memory {
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(path)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount tmpfs on {}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    } else {
        fs::set_permissions(path, fs::Permissions::from_mode(0o777))
            .map_err(|e| format!("chmod {}: {e}", path.display()))?;
    }
    Ok(())
}

/// File name → (content, mode, owner uid).
type Payload = BTreeMap<String, (String, u32, Option<u32>)>;

fn config_map_payload(cm: &ConfigMapVolume, inputs: &Inputs) -> Result<Payload, String> {
    let data: BTreeMap<String, String> = match cm.name.as_str() {
        "istio-ca-root-cert" => [("root-cert.pem".to_string(), inputs.root_cert.to_string())]
            .into_iter()
            .collect(),
        _ if cm.optional == Some(true) => BTreeMap::new(),
        other => {
            return Err(format!(
                "configmap {other:?} not found (the runner has only istio-ca-root-cert); \
                 mark it optional or drop it"
            ));
        }
    };
    let mode = cm.default_mode.unwrap_or(0o644);
    if cm.items.is_empty() {
        return Ok(data
            .into_iter()
            .map(|(k, v)| (k, (v, mode, None)))
            .collect());
    }
    let mut out = Payload::new();
    for item in &cm.items {
        match data.get(&item.key) {
            Some(v) => {
                out.insert(
                    item.path.clone(),
                    (v.clone(), item.mode.unwrap_or(mode), None),
                );
            }
            None if cm.optional == Some(true) => {}
            None => return Err(format!("configmap {:?} has no key {:?}", cm.name, item.key)),
        }
    }
    Ok(out)
}

fn downward(item: &DownwardApiItem, inputs: &Inputs) -> Result<String, String> {
    let Some(f) = &item.field_ref else {
        return Err(format!(
            "item {:?}: only fieldRef items are supported in downwardAPI volumes",
            item.path
        ));
    };
    Ok(match f.field_path.as_str() {
        "metadata.labels" => format_map(inputs.labels),
        "metadata.annotations" => format_map(inputs.annotations),
        "metadata.name" => inputs.pod_name.to_string(),
        "metadata.namespace" => inputs.pod.namespace().to_string(),
        "spec.serviceAccountName" => inputs.pod.service_account().to_string(),
        "spec.nodeName" => inputs.node_name.to_string(),
        "status.podIP" => inputs.pod_ip.to_string(),
        "status.hostIP" => inputs.host_ip.to_string(),
        other => return Err(format!("fieldRef.fieldPath {other:?} is not supported")),
    })
}

/// The kubelet's `fieldpath.FormatMap`: `key="value"` lines, sorted, Go-quoted, no final
/// newline.
pub fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Go's `strconv.Quote` (what `%q` prints) for valid UTF-8.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            ' '..='~' => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() || c.is_whitespace() => {
                if (c as u32) < 0x10000 {
                    out.push_str(&format!("\\u{:04x}", c as u32));
                } else {
                    out.push_str(&format!("\\U{:08x}", c as u32));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The kubelet's atomic writer: the payload in a fresh `..<timestamp>` directory, `..data`
/// pointing at it, a symlink per top-level entry.
fn atomic_write(dir: &Path, payload: &Payload) -> Result<(), String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let ts = dir.join(format!(
        "..{}.{}",
        utc_stamp(now.as_secs()),
        now.subsec_nanos() % 1_000_000_000
    ));
    let err = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    fs::create_dir(&ts).map_err(|e| err("mkdir", &ts, e))?;
    fs::set_permissions(&ts, fs::Permissions::from_mode(0o755))
        .map_err(|e| err("chmod", &ts, e))?;
    let mut top = std::collections::BTreeSet::new();
    for (name, (data, mode, owner)) in payload {
        let rel = Path::new(name);
        if rel.is_absolute() || rel.components().any(|c| c.as_os_str() == "..") {
            return Err(format!("path {name:?}: must be relative without '..'"));
        }
        let p = ts.join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).map_err(|e| err("mkdir", parent, e))?;
        }
        fs::write(&p, data).map_err(|e| err("write", &p, e))?;
        fs::set_permissions(&p, fs::Permissions::from_mode(*mode))
            .map_err(|e| err("chmod", &p, e))?;
        if let Some(uid) = owner {
            std::os::unix::fs::chown(&p, Some(*uid), None).map_err(|e| err("chown", &p, e))?;
        }
        if let Some(first) = rel.components().next() {
            top.insert(first.as_os_str().to_string_lossy().into_owned());
        }
    }
    let tmp = dir.join("..data_tmp");
    let ts_name = ts.file_name().expect("timestamp dir name");
    std::os::unix::fs::symlink(ts_name, &tmp).map_err(|e| err("symlink", &tmp, e))?;
    fs::rename(&tmp, dir.join("..data")).map_err(|e| err("rename", &tmp, e))?;
    for name in top {
        let link = dir.join(&name);
        std::os::unix::fs::symlink(Path::new("..data").join(&name), &link)
            .map_err(|e| err("symlink", &link, e))?;
    }
    Ok(())
}

/// `2006_01_02_15_04_05` for a Unix time (UTC).
pub(crate) fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}_{m:02}_{d:02}_{:02}_{:02}_{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_quote_matches_go() {
        assert_eq!(go_quote("plain"), "\"plain\"");
        assert_eq!(go_quote(r#"{"a":"b"}"#), r#""{\"a\":\"b\"}""#);
        assert_eq!(go_quote("a\nb\tc\\"), "\"a\\nb\\tc\\\\\"");
        assert_eq!(go_quote("\u{1}é\u{a0}"), "\"\\x01é\\u00a0\"");
    }

    #[test]
    fn format_map_sorts_and_has_no_final_newline() {
        let m: BTreeMap<String, String> = [("b", "2"), ("a", "x\"y")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(format_map(&m), "a=\"x\\\"y\"\nb=\"2\"");
    }

    #[test]
    fn timestamps() {
        assert_eq!(utc_stamp(0), "1970_01_01_00_00_00");
        assert_eq!(utc_stamp(1_796_270_400), "2026_12_03_04_00_00");
    }

    #[test]
    fn atomic_writer_layout() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Payload::new();
        p.insert("root-cert.pem".into(), ("PEM".into(), 0o644, None));
        p.insert("sub/x".into(), ("X".into(), 0o600, None));
        atomic_write(dir.path(), &p).unwrap();
        let data = fs::read_link(dir.path().join("..data")).unwrap();
        assert!(data.to_string_lossy().starts_with(".."), "{data:?}");
        assert_eq!(
            fs::read_link(dir.path().join("root-cert.pem")).unwrap(),
            Path::new("..data/root-cert.pem")
        );
        assert_eq!(fs::read_to_string(dir.path().join("sub/x")).unwrap(), "X");
        let mode = fs::metadata(dir.path().join("sub/x"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
