//! Probes and lifecycle handlers as the kubelet runs them: HTTP(S) GET and TCP connects from
//! the node to the pod's IP (`httpGet.host` defaults to it), exec inside the container.
//!
//! HTTP: `User-Agent: kube-probe/<version>`, `Accept: */*`, the spec's headers, a new
//! connection each time; 200 ≤ status < 400 passes; HTTPS is not verified. Defaults:
//! `timeoutSeconds` 1, `periodSeconds` 10, `failureThreshold` 3, `successThreshold` 1.

use super::spec::{Container, HttpGet, IntOrString, Probe, TcpSocket};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The kubelet version the probes announce.
pub const KUBE_PROBE_AGENT: &str = "kube-probe/1.34";

/// What a probe or handler does, resolved against its container.
#[derive(Debug, Clone)]
pub enum Action {
    Http {
        scheme: String,
        host: String,
        port: u16,
        path: String,
        headers: Vec<(String, String)>,
    },
    Tcp {
        host: String,
        port: u16,
    },
    Exec(Vec<String>),
    Sleep(Duration),
}

/// Resolves a named port against the container's ports.
pub fn port(c: &Container, p: &IntOrString) -> Result<u16, String> {
    match p {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::Name(name) => match name.parse::<u16>() {
            Ok(n) => Ok(n),
            Err(_) => c
                .ports
                .iter()
                .find(|cp| cp.name.as_deref() == Some(name))
                .map(|cp| cp.container_port)
                .ok_or_else(|| format!("port {name:?} is not a port of container {:?}", c.name)),
        },
    }
}

fn http(c: &Container, h: &HttpGet, pod_ip: &str) -> Result<Action, String> {
    let scheme = h.scheme.clone().unwrap_or_else(|| "HTTP".into());
    if scheme != "HTTP" && scheme != "HTTPS" {
        return Err(format!("httpGet.scheme {scheme:?}: expected HTTP or HTTPS"));
    }
    Ok(Action::Http {
        scheme,
        host: h.host.clone().unwrap_or_else(|| pod_ip.to_string()),
        port: port(c, &h.port)?,
        path: h.path.clone().unwrap_or_else(|| "/".into()),
        headers: h
            .http_headers
            .iter()
            .map(|x| (x.name.clone(), x.value.clone()))
            .collect(),
    })
}

fn tcp(c: &Container, t: &TcpSocket, pod_ip: &str) -> Result<Action, String> {
    Ok(Action::Tcp {
        host: t.host.clone().unwrap_or_else(|| pod_ip.to_string()),
        port: port(c, &t.port)?,
    })
}

/// The action of a probe.
pub fn probe_action(c: &Container, p: &Probe, pod_ip: &str) -> Result<Action, String> {
    match (&p.http_get, &p.tcp_socket, &p.exec, &p.grpc) {
        (Some(h), None, None, None) => http(c, h, pod_ip),
        (None, Some(t), None, None) => tcp(c, t, pod_ip),
        (None, None, Some(e), None) => Ok(Action::Exec(e.command.clone())),
        (None, None, None, Some(_)) => Err(format!(
            "container {:?}: grpc probes are not supported by the runner",
            c.name
        )),
        _ => Err(format!(
            "container {:?}: a probe must have exactly one of httpGet, tcpSocket, exec, grpc",
            c.name
        )),
    }
}

/// The action of a lifecycle handler (`tcpSocket` is not supported by the kubelet as a
/// handler and fails at run time there; here it is an error up front).
pub fn handler_action(
    c: &Container,
    h: &super::spec::Handler,
    pod_ip: &str,
) -> Result<Action, String> {
    match (&h.exec, &h.http_get, &h.tcp_socket, &h.sleep) {
        (Some(e), None, None, None) => Ok(Action::Exec(e.command.clone())),
        (None, Some(g), None, None) => http(c, g, pod_ip),
        (None, None, Some(_), None) => Err(format!(
            "container {:?}: a tcpSocket lifecycle handler is not supported (as in Kubernetes)",
            c.name
        )),
        (None, None, None, Some(s)) => Ok(Action::Sleep(Duration::from_secs(s.seconds))),
        _ => Err(format!(
            "container {:?}: a handler must have exactly one of exec, httpGet, sleep",
            c.name
        )),
    }
}

/// Probe timing with Kubernetes' defaults.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub initial_delay: Duration,
    pub timeout: Duration,
    pub period: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl Timing {
    pub fn of(p: &Probe) -> Timing {
        Timing {
            initial_delay: Duration::from_secs(p.initial_delay_seconds.unwrap_or(0)),
            timeout: Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1)),
            period: Duration::from_secs(p.period_seconds.unwrap_or(10).max(1)),
            success_threshold: p.success_threshold.unwrap_or(1).max(1),
            failure_threshold: p.failure_threshold.unwrap_or(3).max(1),
        }
    }
}

/// Runs a network action from the calling thread's network namespace (the node's).
pub fn run_network(action: &Action, timeout: Duration) -> Result<String, String> {
    match action {
        Action::Tcp { host, port } => {
            let addr: SocketAddr = format!("{host}:{port}")
                .parse()
                .map_err(|e| format!("{host}:{port}: {e}"))?;
            TcpStream::connect_timeout(&addr, timeout)
                .map(|_| format!("tcp {addr} connected"))
                .map_err(|e| format!("tcp {addr}: {e}"))
        }
        Action::Http {
            scheme,
            host,
            port,
            path,
            headers,
        } => {
            let url = format!("{}://{host}:{port}{path}", scheme.to_ascii_lowercase());
            let mut cmd = std::process::Command::new("curl");
            cmd.args(["-sS", "-k", "-o", "/dev/null", "-w", "%{http_code}"])
                .args(["--max-time", &format!("{:.3}", timeout.as_secs_f64())])
                .args(["-H", &format!("User-Agent: {KUBE_PROBE_AGENT}")])
                .args(["-H", "Accept: */*"]);
            for (k, v) in headers {
                cmd.args(["-H", &format!("{k}: {v}")]);
            }
            let out = cmd.arg(&url).output().map_err(|e| format!("curl: {e}"))?;
            let code: u16 = String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .unwrap_or(0);
            if (200..400).contains(&code) {
                Ok(format!("GET {url}: {code}"))
            } else {
                Err(format!(
                    "GET {url}: {}",
                    if code == 0 {
                        String::from_utf8_lossy(&out.stderr).trim().to_string()
                    } else {
                        format!("HTTP {code}")
                    }
                ))
            }
        }
        Action::Sleep(d) => {
            std::thread::sleep(*d);
            Ok(format!("slept {d:?}"))
        }
        Action::Exec(_) => Err("exec is not a network action".into()),
    }
}
