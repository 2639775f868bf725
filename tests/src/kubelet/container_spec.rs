//! What the kubelet asks the runtime for, per container: the pod's name and labels as its
//! controller makes them, the environment (`value`, `fieldRef`, `resourceFieldRef` with
//! divisor, `$(VAR)` expansion, the service-link variables), the entrypoint and arguments, the
//! identity (uid/gid/groups, capabilities, `no_new_privs`, `runAsNonRoot`), the mounts and the
//! image's files.

use super::container::{Launch, Mount, capability_set};
use super::pod::{CONTAINER_NOFILE, Node, Sandbox};
use super::probe;
use super::spec::{Container, PodManifest};
use super::volumes;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub(crate) fn random_suffix(n: usize) -> String {
    // The alphabet Kubernetes' name generator uses.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        ^ (u64::from(std::process::id()) << 32);
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ALPHABET[(seed % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

/// The pod's name and labels as its controller makes them.
pub(crate) fn identity(m: &PodManifest) -> (String, BTreeMap<String, String>) {
    let mut labels = m.metadata.labels.clone();
    let base = m.workload.clone();
    let name = match m.kind.as_str() {
        "Pod" => m.metadata.name.clone().unwrap_or(base),
        "Deployment" => {
            let hash = random_suffix(10);
            labels.insert("pod-template-hash".into(), hash.clone());
            format!("{base}-{hash}-{}", random_suffix(5))
        }
        "Job" => {
            let uid = format!("{}-{}", random_suffix(8), random_suffix(4));
            for (k, v) in [
                ("batch.kubernetes.io/controller-uid", uid.as_str()),
                ("batch.kubernetes.io/job-name", base.as_str()),
                ("controller-uid", uid.as_str()),
                ("job-name", base.as_str()),
            ] {
                labels.insert(k.into(), v.into());
            }
            format!("{base}-{}", random_suffix(5))
        }
        "StatefulSet" => format!("{base}-0"),
        _ => format!("{base}-{}", random_suffix(5)),
    };
    (name, labels)
}

/// `$(VAR)` expansion as Kubernetes does it: defined names are replaced, `$$` escapes,
/// anything else is left as written.
pub fn expand(s: &str, vars: &[(String, String)]) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() {
            if b[i + 1] == b'$' {
                out.push('$');
                i += 2;
                continue;
            }
            if b[i + 1] == b'('
                && let Some(end) = s[i + 2..].find(')')
            {
                let name = &s[i + 2..i + 2 + end];
                if let Some((_, v)) = vars.iter().rev().find(|(k, _)| k == name) {
                    out.push_str(v);
                    i += end + 3;
                    continue;
                }
            }
        }
        let c = s[i..].chars().next().expect("char");
        out.push(c);
        i += c.len_utf8();
    }
    out
}

fn is_proxy_image(image: &str) -> bool {
    image.contains("proxyv2")
}

/// The node's allocatable resources (limits default to them).
fn node_capacity(resource: &str) -> f64 {
    if resource.ends_with("cpu") {
        std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
    } else {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            })
            .map_or(1e9, |kb| kb * 1024.0)
    }
}

pub(crate) struct Ctx<'a> {
    pub(crate) node: &'a Node,
    pub(crate) m: &'a PodManifest,
    pub(crate) name: &'a str,
    pub(crate) sandbox: &'a Sandbox,
    pub(crate) dir: &'a Path,
    pub(crate) vols: &'a BTreeMap<String, volumes::SetUp>,
    pub(crate) annotations: &'a BTreeMap<String, String>,
}

/// Files placed in the image: (path in the image, file on the node).
type ImageFiles = Vec<(String, PathBuf)>;

impl Ctx<'_> {
    pub(crate) fn env(&self, c: &Container) -> Result<Vec<(String, String)>, String> {
        let proxy = is_proxy_image(&c.image);
        let mut env: Vec<(String, String)> = vec![
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("HOSTNAME".into(), self.name.into()),
        ];
        if proxy {
            env.push(("HOME".into(), "/home/istio-proxy".into()));
        } else {
            env.push(("HOME".into(), "/root".into()));
        }
        // Service links: the `kubernetes` Service of the default namespace.
        for (k, v) in [
            ("KUBERNETES_SERVICE_HOST", "198.19.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://198.19.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://198.19.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "198.19.0.1"),
        ] {
            env.push((k.into(), v.into()));
        }
        let mut spec_env: Vec<(String, String)> = Vec::new();
        for e in &c.env {
            let value = match (&e.value, &e.value_from) {
                (Some(v), None) => expand(v, &spec_env),
                (None, None) => String::new(),
                (None, Some(from)) => self
                    .value_from(c, from)
                    .map_err(|err| format!("container {:?}: env {}: {err}", c.name, e.name))?,
                (Some(_), Some(_)) => {
                    return Err(format!(
                        "container {:?}: env {}: value and valueFrom both set",
                        c.name, e.name
                    ));
                }
            };
            spec_env.push((e.name.clone(), value));
        }
        env.retain(|(k, _)| !spec_env.iter().any(|(s, _)| s == k));
        env.extend(spec_env);
        Ok(env)
    }

    fn value_from(
        &self,
        c: &Container,
        from: &super::spec::EnvVarSource,
    ) -> Result<String, String> {
        if let Some(f) = &from.field_ref {
            return Ok(match f.field_path.as_str() {
                "metadata.name" => self.name.to_string(),
                "metadata.namespace" => self.m.namespace().to_string(),
                "metadata.uid" => format!("{}-uid", self.name),
                "spec.serviceAccountName" => self.m.service_account().to_string(),
                "spec.nodeName" => self.node.node_name.clone(),
                "status.podIP" | "status.podIPs" => self.sandbox.ip.clone(),
                "status.hostIP" | "status.hostIPs" => self.sandbox.host_ip.clone(),
                p if p.starts_with("metadata.labels['") => {
                    let key = &p["metadata.labels['".len()..p.len() - 2];
                    self.m.metadata.labels.get(key).cloned().unwrap_or_default()
                }
                p if p.starts_with("metadata.annotations['") => {
                    let key = &p["metadata.annotations['".len()..p.len() - 2];
                    self.annotations.get(key).cloned().unwrap_or_default()
                }
                other => return Err(format!("fieldRef.fieldPath {other:?} is not supported")),
            });
        }
        if let Some(r) = &from.resource_field_ref {
            let target = match &r.container_name {
                Some(n) => self
                    .m
                    .all_containers()
                    .find(|x| &x.name == n)
                    .ok_or_else(|| {
                        format!("resourceFieldRef.containerName {n:?}: no such container")
                    })?,
                None => c,
            };
            let (kind, res) = r
                .resource
                .split_once('.')
                .ok_or_else(|| format!("resourceFieldRef.resource {:?}", r.resource))?;
            let map = match kind {
                "limits" => &target.resources.limits,
                "requests" => &target.resources.requests,
                _ => return Err(format!("resourceFieldRef.resource {:?}", r.resource)),
            };
            let value = match map.get(res) {
                Some(q) => q.value()?,
                // Unset limits are the node's allocatable; unset requests are 0 (cpu) or the
                // limit.
                None if kind == "limits" => node_capacity(res),
                None => target
                    .resources
                    .limits
                    .get(res)
                    .map(|q| q.value())
                    .transpose()?
                    .unwrap_or(0.0),
            };
            let divisor = r
                .divisor
                .as_ref()
                .map(|d| d.value())
                .transpose()?
                .unwrap_or(1.0);
            if divisor <= 0.0 {
                return Err("resourceFieldRef.divisor must be positive".into());
            }
            return Ok(format!(
                "{}",
                (value / divisor - 1e-9).ceil().max(0.0) as u64
            ));
        }
        Err("valueFrom: only fieldRef and resourceFieldRef are supported".into())
    }

    pub(crate) fn launch(&self, c: &Container) -> Result<Launch, String> {
        let pod_sc = self.m.spec.security_context.clone().unwrap_or_default();
        let sc = c.security_context.clone().unwrap_or_default();
        let proxy = is_proxy_image(&c.image);
        let image_user = if proxy { 1337 } else { 0 };
        let uid = sc.run_as_user.or(pod_sc.run_as_user).unwrap_or(image_user);
        let gid = sc
            .run_as_group
            .or(pod_sc.run_as_group)
            .unwrap_or(image_user);
        if sc.run_as_non_root.or(pod_sc.run_as_non_root) == Some(true) && uid == 0 {
            return Err(format!(
                "container {:?}: runAsNonRoot is set and the container would run as root",
                c.name
            ));
        }
        let mut groups = vec![gid];
        groups.extend(pod_sc.fs_group);
        groups.extend(pod_sc.supplemental_groups.iter().copied());
        groups.dedup();
        let caps = sc.capabilities.clone().unwrap_or_default();
        let privileged = sc.privileged == Some(true);
        let capabilities = capability_set(&caps.add, &caps.drop, privileged)
            .map_err(|e| format!("container {:?}: securityContext.capabilities: {e}", c.name))?;
        let env = self.env(c)?;
        let (entrypoint, cmd): (Vec<String>, Vec<String>) = if proxy {
            (vec!["/usr/local/bin/pilot-agent".into()], vec![])
        } else {
            (vec!["/usr/local/bin/pod-app".into()], self.app_args(c))
        };
        let mut argv: Vec<String> = match (&c.command, &c.args) {
            (Some(command), Some(args)) => command.iter().chain(args).cloned().collect(),
            (Some(command), None) => command.clone(),
            (None, Some(args)) => entrypoint.iter().chain(args).cloned().collect(),
            (None, None) => entrypoint.into_iter().chain(cmd).collect(),
        };
        argv = argv.iter().map(|a| expand(a, &env)).collect();
        let state_dir = self.dir.join("containers").join(&c.name);
        std::fs::create_dir_all(&state_dir).map_err(|e| format!("state dir: {e}"))?;
        let mut mounts = self.volume_mounts(c)?;
        let term_log = state_dir.join("termination-log");
        std::fs::write(&term_log, "").map_err(|e| format!("termination log: {e}"))?;
        for (target, source) in [
            ("/etc/hosts", self.dir.join("etc-hosts")),
            ("/etc/resolv.conf", self.dir.join("resolv.conf")),
            ("/etc/hostname", self.dir.join("hostname")),
        ] {
            mounts.push(Mount {
                source,
                target: target.into(),
                read_only: false,
            });
        }
        mounts.push(Mount {
            source: term_log,
            target: c
                .termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".into()),
            read_only: false,
        });
        let (image_binds, image_copies) = self.image_files(proxy);
        Ok(Launch {
            netns: PathBuf::from("/run/netns").join(self.sandbox.ns.name()),
            state_dir,
            image_binds,
            image_copies,
            mounts,
            read_only_root: sc.read_only_root_filesystem == Some(true),
            hostname: self.name.to_string(),
            uid,
            gid,
            groups,
            capabilities,
            no_new_privs: sc.allow_privilege_escalation == Some(false) && !privileged,
            nofile: CONTAINER_NOFILE,
            working_dir: c.working_dir.clone().unwrap_or_else(|| "/".into()),
            env,
            argv,
        })
    }

    /// The container's volume mounts, a mount point made in the outer volume for a mount inside
    /// another.
    fn volume_mounts(&self, c: &Container) -> Result<Vec<Mount>, String> {
        let mut mounts = Vec::new();
        for vm in &c.volume_mounts {
            let v = self.vols.get(&vm.name).ok_or_else(|| {
                format!(
                    "container {:?}: volumeMount {:?}: no such volume",
                    c.name, vm.name
                )
            })?;
            mounts.push(Mount {
                source: v.path.clone(),
                target: vm.mount_path.trim_end_matches('/').to_string(),
                read_only: vm.read_only == Some(true) || v.read_only,
            });
        }
        // A mount inside another: its mount point is made in the outer volume.
        for i in 0..mounts.len() {
            for j in 0..i {
                if let Some(rel) = mounts[i]
                    .target
                    .strip_prefix(&format!("{}/", mounts[j].target))
                {
                    let p = mounts[j].source.join(rel);
                    std::fs::create_dir_all(&p)
                        .map_err(|e| format!("mount point {}: {e}", p.display()))?;
                }
            }
        }
        Ok(mounts)
    }

    /// The image's files: the binaries bound in, and the files copied in (a proxy's
    /// `/etc/passwd` and bootstrap template).
    fn image_files(&self, proxy: bool) -> (ImageFiles, ImageFiles) {
        let bin = |n: &str| self.node.bin_dir.join(n);
        if proxy {
            let mut copies = vec![("/etc/passwd".to_string(), self.dir.join("image-passwd"))];
            if let Some(t) = &self.node.bootstrap_template {
                copies.push((
                    "/var/lib/istio/envoy/envoy_bootstrap_tmpl.json".into(),
                    t.clone(),
                ));
            }
            (
                vec![
                    ("/usr/local/bin/pilot-agent".into(), bin("pilot-agent")),
                    ("/usr/local/bin/envoy".into(), bin("envoy")),
                ],
                copies,
            )
        } else {
            (
                vec![("/usr/local/bin/pod-app".into(), bin("pod-app"))],
                vec![],
            )
        }
    }

    /// The test app's arguments: every container port, and every port a probe of this
    /// container targets (for rewritten probes, the originals in the proxy's
    /// `ISTIO_KUBE_APP_PROBERS`).
    fn app_args(&self, c: &Container) -> Vec<String> {
        let mut http = std::collections::BTreeSet::new();
        let mut https = std::collections::BTreeSet::new();
        for p in &c.ports {
            if p.protocol.as_deref().unwrap_or("TCP") == "TCP" {
                http.insert(p.container_port);
            }
        }
        // The container's own probes, unless rewritten to a port another container serves
        // (the agent's status port): then their targets are in ISTIO_KUBE_APP_PROBERS.
        let others: std::collections::BTreeSet<u16> = self
            .m
            .all_containers()
            .filter(|x| x.name != c.name)
            .flat_map(|x| x.ports.iter().map(|p| p.container_port))
            .chain([15020, 15021])
            .collect();
        let own = [&c.readiness_probe, &c.liveness_probe, &c.startup_probe];
        for p in own.into_iter().flatten() {
            if let Some(h) = &p.http_get
                && let Ok(port) = probe::port(c, &h.port)
                    .map(Some)
                    .map(|p| p.filter(|p| !others.contains(p)))
            {
                let Some(port) = port else { continue };
                if h.scheme.as_deref() == Some("HTTPS") {
                    https.insert(port);
                } else {
                    http.insert(port);
                }
            }
            if let Some(t) = &p.tcp_socket {
                http.extend(probe::port(c, &t.port).ok().filter(|p| !others.contains(p)));
            }
        }
        let probers = self
            .m
            .all_containers()
            .flat_map(|x| &x.env)
            .find(|e| e.name == "ISTIO_KUBE_APP_PROBERS")
            .and_then(|e| e.value.clone())
            .and_then(|v| serde_json::from_str::<serde_json::Value>(&v).ok());
        if let Some(serde_json::Value::Object(map)) = probers {
            for (path, p) in map {
                let owner = path.split('/').nth(2).unwrap_or_default();
                if owner != c.name {
                    continue;
                }
                let port_of = |k: &str| p.get(k)?.get("port")?.as_u64().map(|n| n as u16);
                if let Some(port) = port_of("httpGet") {
                    let scheme = p["httpGet"].get("scheme").and_then(|s| s.as_str());
                    if scheme == Some("HTTPS") {
                        https.insert(port);
                    } else {
                        http.insert(port);
                    }
                }
                http.extend(port_of("tcpSocket"));
            }
        }
        let mut args = vec!["--name".to_string(), c.name.clone()];
        args.extend(
            self.node
                .app_extra_args
                .get(&c.name)
                .cloned()
                .unwrap_or_default(),
        );
        for p in &https {
            http.remove(p);
            args.extend(["--https".into(), p.to_string()]);
        }
        for p in http {
            args.extend(["--http".into(), p.to_string()]);
        }
        args
    }
}
