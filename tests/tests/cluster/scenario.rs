//! The scenario: echo v1 and v2 behind a Service and a client, injected by istiod's webhook,
//! in a namespace of their own per proxy image, and the checks run against it.

use std::time::Duration;

use harness::assert_eventually_result;
use harness::cluster::{Agent, Cluster};

/// Checks that fail with Istio's agent and pass with ours, each a row of docs/differences.md.
pub const ISTIO_DIFFERS: &[&str] = &[];

/// The namespace of the plain-text caller (no sidecar), shared by both images' scenarios.
const PLAIN_NS: &str = "mesh-plain";
/// How long a change of config may take to reach every proxy.
const PROPAGATION: Duration = Duration::from_secs(60);

pub struct Scenario<'a> {
    cluster: &'a Cluster,
    agent: Agent,
    ns: String,
}

type Check = fn(&Scenario) -> Result<(), String>;

impl<'a> Scenario<'a> {
    /// Creates (or brings back to its start) the scenario's namespace and waits for its pods.
    pub fn deploy(cluster: &'a Cluster, agent: Agent) -> Scenario<'a> {
        Self::deploy_in(cluster, agent, format!("mesh-{}", agent.word()))
    }

    /// [`Scenario::deploy`] into the namespace `ns`.
    pub fn deploy_in(cluster: &'a Cluster, agent: Agent, ns: String) -> Scenario<'a> {
        let s = Scenario { cluster, agent, ns };
        let c = s.cluster;
        c.apply(&namespace(&s.ns, true)).expect("namespace");
        let _ = c.kubectl(&[
            "delete",
            "-n",
            &s.ns,
            "peerauthentication,authorizationpolicy,virtualservice,destinationrule",
            "--all",
        ]);
        c.apply(&s.fill(include_str!("../../data/cluster/echo.yaml")))
            .expect("the echo scenario applies");
        c.apply(&namespace(PLAIN_NS, false)).expect("namespace");
        c.apply(
            &s.fill(include_str!("../../data/cluster/plain.yaml"))
                .replace(&s.ns, PLAIN_NS),
        )
        .expect("the plain caller applies");
        for ns in [s.ns.as_str(), PLAIN_NS] {
            if let Err(e) = c.wait_available(ns, Duration::from_secs(300)) {
                s.dump_logs();
                panic!("the scenario's pods in {ns} did not become available: {e}");
            }
        }
        s
    }

    fn fill(&self, yaml: &str) -> String {
        yaml.replace("@NS@", &self.ns)
            .replace("@APP@", &self.cluster.image("app"))
            .replace("@PROXY@", &self.cluster.image(self.agent.image_name()))
    }

    /// Every check, in order (the later ones change the namespace's policy).
    pub fn run_checks(&self) -> Vec<(&'static str, Result<(), String>)> {
        const CHECKS: &[(&str, Check)] = &[
            ("injected by istiod's webhook", injected),
            ("workload certificate from istiod's CA", certificate),
            ("HTTP through both sidecars over mTLS", http),
            ("gRPC", grpc),
            ("TCP", tcp),
            (
                "DNS: a ServiceEntry host from the sidecar's DNS proxy",
                dns_mesh_name,
            ),
            ("DNS: a name only CoreDNS knows, forwarded", dns_forwarded),
            ("istioctl proxy-status: every proxy SYNCED", proxy_status),
            ("istioctl proxy-config clusters and listeners", proxy_config),
            ("STRICT mTLS refuses plain text", strict_mtls),
            ("AuthorizationPolicy denies a path (403)", authorization),
            ("VirtualService weight moves traffic", weights),
        ];
        CHECKS
            .iter()
            .map(|(name, check)| (*name, check(self)))
            .collect()
    }

    fn pod(&self, app: &str) -> Result<String, String> {
        self.pod_of(&format!("app={app}"))
    }

    /// The first running pod of the scenario matching a label selector.
    pub fn pod_of(&self, selector: &str) -> Result<String, String> {
        self.cluster
            .pods(&self.ns, selector)?
            .into_iter()
            .next()
            .ok_or_else(|| format!("no pod {selector} in {}", self.ns))
    }

    /// The scenario's namespace.
    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// `ours` or `istio`, for messages and figures.
    pub fn agent_word(&self) -> &'static str {
        self.agent.word()
    }

    /// Starts Istio's echo client in the client pod's app container, output captured.
    pub fn spawn_call(&self, args: &[&str]) -> std::process::Child {
        let pod = self.pod("client").expect("a client pod");
        let mut cmd = vec![
            "exec",
            "-n",
            &self.ns,
            &pod,
            "-c",
            "app",
            "--",
            "/usr/local/bin/client",
        ];
        cmd.extend_from_slice(args);
        self.cluster
            .kubectl_command(&cmd)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl exec")
    }

    /// Ok when every proxy of the scenario is SYNCED for CDS, LDS, EDS and RDS with `istiod`.
    pub fn all_synced_with(&self, istiod: &str) -> Result<(), String> {
        let out = self
            .cluster
            .istioctl(&["proxy-status", "-v", "1", "-n", &self.ns])?;
        let rows: Vec<&str> = out.lines().filter(|l| l.contains(&self.ns)).collect();
        if rows.len() < 3 {
            return Err(format!("fewer than 3 proxies of {} in:\n{out}", self.ns));
        }
        match rows
            .iter()
            .find(|r| r.matches("SYNCED").count() < 4 || !r.contains(istiod))
        {
            None => Ok(()),
            Some(r) => Err(format!(
                "not SYNCED with {istiod} for CDS, LDS, EDS and RDS: {r}"
            )),
        }
    }

    /// The serial number of the workload certificate Envoy holds in the client pod.
    pub fn client_cert_serial(&self) -> Result<String, String> {
        let pod = self.pod("client")?;
        let certs = self.cluster.exec(
            &self.ns,
            &pod,
            "istio-proxy",
            &["curl", "-sf", "http://127.0.0.1:15000/certs"],
        )?;
        let certs: serde_json::Value =
            serde_json::from_str(&certs).map_err(|e| format!("/certs: {e}"))?;
        certs["certificates"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["cert_chain"].as_array().cloned().unwrap_or_default())
            .find(|c| {
                c["subject_alt_names"].as_array().is_some_and(|sans| {
                    sans.iter()
                        .any(|s| s["uri"].as_str().is_some_and(|u| u.contains("/sa/client")))
                })
            })
            .and_then(|c| c["serial_number"].as_str().map(str::to_string))
            .ok_or_else(|| format!("no workload certificate in Envoy's /certs of {pod}"))
    }

    /// Runs Istio's echo client in the client pod's app container.
    fn call(&self, args: &[&str]) -> Result<String, String> {
        let pod = self.pod("client")?;
        let mut cmd = vec!["/usr/local/bin/client"];
        cmd.extend_from_slice(args);
        self.cluster.exec(&self.ns, &pod, "app", &cmd)
    }

    /// Prints the sidecars' recent logs and the pods' state, for a failed check.
    pub fn dump_logs(&self) {
        if let Ok(out) = self.cluster.kubectl(&["get", "pods", "-A", "-o", "wide"]) {
            eprintln!("{out}");
        }
        for app in ["client", "echo"] {
            if let Ok(pod) = self.pod(app) {
                eprintln!("--- {}/{pod} istio-proxy:", self.ns);
                eprintln!("{}", self.cluster.logs(&self.ns, &pod, "istio-proxy"));
            }
        }
    }
}

fn namespace(name: &str, injected: bool) -> String {
    let label = if injected {
        "istio-injection: enabled"
    } else {
        "mesh-test: plain"
    };
    format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels:\n    {label}\n")
}

/// Counts `StatusCode=<code>` lines of the echo client's output.
fn count_status(out: &str, code: u16) -> usize {
    out.lines()
        .filter(|l| l.ends_with(&format!("StatusCode={code}")))
        .count()
}

fn expect_ok(out: &str, n: usize) -> Result<(), String> {
    if count_status(out, 200) == n {
        Ok(())
    } else {
        Err(format!("expected {n} answers with status 200, got:\n{out}"))
    }
}

fn injected(s: &Scenario) -> Result<(), String> {
    let pods = s.cluster.get_json(&["pods", "-n", &s.ns])?;
    let want = s.cluster.image(s.agent.image_name());
    for pod in pods["items"].as_array().into_iter().flatten() {
        let name = pod["metadata"]["name"].as_str().unwrap_or("?");
        if pod["metadata"]["annotations"]["sidecar.istio.io/status"].is_null() {
            return Err(format!("{name} has no sidecar.istio.io/status annotation"));
        }
        let inits = pod["spec"]["initContainers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let find = |n: &str| inits.iter().find(|c| c["name"] == n).cloned();
        let init = find("istio-init").ok_or(format!("{name} has no istio-init"))?;
        let proxy = find("istio-proxy").ok_or(format!(
            "{name} has no istio-proxy init container (native sidecar)"
        ))?;
        if proxy["restartPolicy"] != "Always" {
            return Err(format!(
                "{name}: istio-proxy is not a native sidecar: {proxy}"
            ));
        }
        for c in [&init, &proxy] {
            if c["image"] != want.as_str() {
                return Err(format!(
                    "{name}: {} runs {}, not {want}",
                    c["name"], c["image"]
                ));
            }
        }
    }
    Ok(())
}

pub fn certificate(s: &Scenario) -> Result<(), String> {
    let pod = s.pod("client")?;
    let want = format!("spiffe://cluster.local/ns/{}/sa/client", s.ns);
    assert_eventually_result(PROPAGATION, || {
        let certs = s.cluster.exec(
            &s.ns,
            &pod,
            "istio-proxy",
            &["curl", "-sf", "http://127.0.0.1:15000/certs"],
        )?;
        let certs: serde_json::Value =
            serde_json::from_str(&certs).map_err(|e| format!("/certs: {e}"))?;
        let sans: Vec<String> = certs["certificates"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["cert_chain"].as_array().cloned().unwrap_or_default())
            .flat_map(|c| {
                c["subject_alt_names"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|san| san["uri"].as_str().map(str::to_string))
            .collect();
        if sans.contains(&want) {
            Ok(())
        } else {
            Err(format!("Envoy holds no certificate for {want}: {sans:?}"))
        }
    })
}

pub fn http(s: &Scenario) -> Result<(), String> {
    let out = s.call(&["http://echo/", "--count", "10"])?;
    expect_ok(&out, 10)?;
    // The server's sidecar hands the app the caller's verified identity.
    let client = format!("URI=spiffe://cluster.local/ns/{}/sa/client", s.ns);
    if !out.contains(&client) {
        return Err(format!(
            "no X-Forwarded-Client-Cert naming {client}:\n{out}"
        ));
    }
    Ok(())
}

fn grpc(s: &Scenario) -> Result<(), String> {
    expect_ok(&s.call(&["grpc://echo:7070", "--count", "5"])?, 5)
}

pub fn tcp(s: &Scenario) -> Result<(), String> {
    expect_ok(&s.call(&["tcp://echo:9090", "--count", "5"])?, 5)
}

fn resolve(s: &Scenario, name: &str) -> Result<String, String> {
    let pod = s.pod("client")?;
    s.cluster
        .exec(&s.ns, &pod, "app", &["getent", "ahostsv4", name])
}

fn dns_mesh_name(s: &Scenario) -> Result<(), String> {
    assert_eventually_result(PROPAGATION, || {
        let out = resolve(s, "mesh-only.example.test")?;
        out.contains("198.19.250.10")
            .then_some(())
            .ok_or(format!("mesh-only.example.test resolved to {out}"))
    })
}

fn dns_forwarded(s: &Scenario) -> Result<(), String> {
    let out = resolve(s, "only-coredns.mesh.test")?;
    out.contains("198.18.99.9")
        .then_some(())
        .ok_or(format!("only-coredns.mesh.test resolved to {out}"))
}

fn proxy_status(s: &Scenario) -> Result<(), String> {
    let istiod = s
        .cluster
        .pods("istio-system", "app=istiod")?
        .into_iter()
        .next()
        .ok_or("no istiod pod")?;
    assert_eventually_result(PROPAGATION, || s.all_synced_with(&istiod))
}

fn proxy_config(s: &Scenario) -> Result<(), String> {
    let pod = format!("{}.{}", s.pod("client")?, s.ns);
    let clusters = s.cluster.istioctl(&["proxy-config", "clusters", &pod])?;
    let host = format!("echo.{}.svc.cluster.local", s.ns);
    if !clusters.contains(&host) {
        return Err(format!("no cluster for {host} in:\n{clusters}"));
    }
    let listeners = s.cluster.istioctl(&["proxy-config", "listeners", &pod])?;
    if !listeners.contains("virtualOutbound") && !listeners.contains("15001") {
        return Err(format!("no outbound capture listener in:\n{listeners}"));
    }
    Ok(())
}

fn strict_mtls(s: &Scenario) -> Result<(), String> {
    s.cluster.apply(&format!(
        "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\n\
         metadata: {{name: default, namespace: {}}}\nspec: {{mtls: {{mode: STRICT}}}}\n",
        s.ns
    ))?;
    let plain = s
        .cluster
        .pods(PLAIN_NS, "app=plain")?
        .into_iter()
        .next()
        .ok_or("no plain pod")?;
    let url = format!("http://echo.{}/", s.ns);
    assert_eventually_result(PROPAGATION, || {
        let refused = match s.cluster.exec(
            PLAIN_NS,
            &plain,
            "app",
            &["/usr/local/bin/client", &url, "--timeout", "3s"],
        ) {
            Ok(out) => count_status(&out, 200) == 0,
            Err(_) => true,
        };
        refused
            .then_some(())
            .ok_or(format!("plain text to {url} was answered with STRICT mTLS"))
    })?;
    // The mesh client still gets through.
    expect_ok(&s.call(&["http://echo/", "--count", "3"])?, 3)
}

fn authorization(s: &Scenario) -> Result<(), String> {
    s.cluster.apply(&format!(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
         metadata: {{name: deny-admin, namespace: {}}}\n\
         spec:\n  selector: {{matchLabels: {{app: echo}}}}\n  action: DENY\n  \
         rules: [{{to: [{{operation: {{paths: [/admin]}}}}]}}]\n",
        s.ns
    ))?;
    assert_eventually_result(PROPAGATION, || {
        let denied = s
            .call(&["http://echo/admin", "--count", "2"])
            .unwrap_or_else(|e| e);
        if count_status(&denied, 403) != 2 {
            return Err(format!("/admin was not refused with 403:\n{denied}"));
        }
        expect_ok(&s.call(&["http://echo/public", "--count", "2"])?, 2)
    })
}

fn weights(s: &Scenario) -> Result<(), String> {
    s.cluster.apply(&format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\n\
         metadata: {{name: echo, namespace: {ns}}}\n\
         spec:\n  host: echo\n  subsets:\n  - {{name: v1, labels: {{version: v1}}}}\n  \
         - {{name: v2, labels: {{version: v2}}}}\n---\n\
         apiVersion: networking.istio.io/v1\nkind: VirtualService\n\
         metadata: {{name: echo, namespace: {ns}}}\n\
         spec:\n  hosts: [echo]\n  http:\n  - route:\n    \
         - {{destination: {{host: echo, subset: v1}}, weight: 0}}\n    \
         - {{destination: {{host: echo, subset: v2}}, weight: 100}}\n",
        ns = s.ns
    ))?;
    assert_eventually_result(PROPAGATION, || {
        let out = s.call(&["http://echo/", "--count", "10"])?;
        expect_ok(&out, 10)?;
        let v2 = out
            .lines()
            .filter(|l| l.ends_with("ServiceVersion=v2"))
            .count();
        (v2 == 10).then_some(()).ok_or(format!(
            "{v2} of 10 answers from v2 with weight 100:\n{out}"
        ))
    })
}
