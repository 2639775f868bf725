//! A stand-in for one cloud's metadata server on 127.0.0.1: the paths, headers and answers the
//! real one has (AWS's IMDSv2 token and its check, Google's `Metadata-Flavor`, Azure's
//! `Metadata: true` and API versions), or a server that accepts connections and never answers.
//! It runs on its own thread and runtime, so a busy test cannot make it miss AWS's 100 ms.
//! [`config`] gives the agent's configuration with every metadata endpoint on loopback.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;

use crate::config::{Config, Inputs, NodeType, ProxyFlags};

/// What the stand-in serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    /// AWS's IMDS; `tokens: false` refuses IMDSv2 tokens (IMDSv1 only).
    Aws { tokens: bool },
    /// AWS's IMDS with IMDSv2 required, answering the token after 50 ms.
    AwsLateToken,
    /// Google's metadata server and Compute API; `vm`: a GCE instance outside GKE (no cluster
    /// attributes, an instance template, labels in the Compute API).
    Gcp { vm: bool },
    /// Azure's IMDS.
    Azure,
    /// Accepts, reads nothing, never answers.
    Hang,
}

pub const AWS_TOKEN: &str = "imds-token-1";
pub const GCP_TOKEN: &str = "gce-token-1";
/// The Azure API version the stand-in names as newest.
pub const AZURE_VERSION: &str = "2023-07-01";

/// A running stand-in; stopped when dropped.
pub struct StandIn {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl StandIn {
    pub fn start(serve: Serve) -> StandIn {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let log = seen.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                tokio::select! {
                    _ = accept(listener, serve, log) => {}
                    _ = stopped => {}
                }
            });
        });
        StandIn {
            addr,
            seen,
            _stop: stop,
        }
    }

    /// `host:port`, as the overrides take it.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// The requests seen: `METHOD path?query`.
    pub fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

async fn accept(listener: tokio::net::TcpListener, serve: Serve, seen: Arc<Mutex<Vec<String>>>) {
    let mut held = Vec::new();
    while let Ok((tcp, _)) = listener.accept().await {
        if serve == Serve::Hang {
            seen.lock().unwrap().push("(held)".into());
            held.push(tcp);
            continue;
        }
        let seen = seen.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                seen.lock()
                    .unwrap()
                    .push(format!("{} {}", req.method(), req.uri()));
                async move {
                    if serve == Serve::AwsLateToken && req.method() == http::Method::PUT {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                    Ok::<_, Infallible>(answer(serve, &req))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                .await;
        });
    }
}

fn reply(status: u16, body: &str) -> http::Response<Full<Bytes>> {
    let mut r = http::Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
    r
}

fn header<'a>(req: &'a http::Request<Incoming>, name: &str) -> &'a str {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn answer(serve: Serve, req: &http::Request<Incoming>) -> http::Response<Full<Bytes>> {
    match serve {
        Serve::Aws { tokens } => aws(tokens, req),
        Serve::AwsLateToken => aws(true, req),
        Serve::Gcp { vm } => gcp(vm, req),
        Serve::Azure => azure(req),
        Serve::Hang => reply(500, ""),
    }
}

fn aws(tokens: bool, req: &http::Request<Incoming>) -> http::Response<Full<Bytes>> {
    let path = req.uri().path();
    if path == "/latest/api/token" {
        let asked = req.method() == http::Method::PUT
            && header(req, "x-aws-ec2-metadata-token-ttl-seconds") == "60";
        return match (tokens, asked) {
            (true, true) => reply(200, AWS_TOKEN),
            (true, false) => reply(400, ""),
            (false, _) => reply(403, ""),
        };
    }
    // IMDSv2 required when tokens are served (the hardened setting): no token, 401.
    if tokens && header(req, "x-aws-ec2-metadata-token") != AWS_TOKEN {
        return reply(401, "");
    }
    match path.strip_prefix("/latest/meta-data/").unwrap_or("") {
        "iam/info" => reply(
            200,
            r#"{"Code":"Success","InstanceProfileArn":"arn:aws:iam::123456789012:instance-profile/node","InstanceProfileId":"AIPA"}"#,
        ),
        "placement/region" => reply(200, "us-west-2"),
        "placement/availability-zone" => reply(200, "us-west-2b"),
        "instance-id" => reply(200, "i-0123456789abcdef0"),
        _ => reply(404, ""),
    }
}

fn gcp(vm: bool, req: &http::Request<Incoming>) -> http::Response<Full<Bytes>> {
    let path = req.uri().path();
    if let Some(rest) = path.strip_prefix("/compute/v1/") {
        let ok = rest == "projects/test-proj/zones/us-central1-c/instances/vm-1"
            && header(req, "authorization") == format!("Bearer {GCP_TOKEN}");
        return if ok {
            reply(
                200,
                r#"{"name":"vm-1","labels":{"env":"prod","team":"mesh"}}"#,
            )
        } else {
            reply(403, r#"{"error":{"code":403}}"#)
        };
    }
    if path == "/" {
        let mut r = reply(200, "computeMetadata/\n");
        r.headers_mut()
            .insert("Metadata-Flavor", http::HeaderValue::from_static("Google"));
        return r;
    }
    if header(req, "metadata-flavor") != "Google" {
        return reply(403, "missing Metadata-Flavor");
    }
    let Some(suffix) = path.strip_prefix("/computeMetadata/v1/") else {
        return reply(404, "");
    };
    let body = match (suffix, vm) {
        ("project/project-id", _) => "test-proj",
        ("project/numeric-project-id", _) => "123456789\n",
        ("instance/name", _) => "vm-1",
        ("instance/id", _) => "4242",
        ("instance/zone", _) => "projects/123456789/zones/us-central1-c",
        ("instance/attributes/cluster-name", false) => "test-cluster",
        ("instance/attributes/cluster-location", false) => "us-central1",
        ("instance/attributes/instance-template", true) => "tmpl-1",
        ("instance/service-accounts/default/token", _)
            if req
                .uri()
                .query()
                .is_some_and(|q| q.contains("compute.readonly")) =>
        {
            return reply(
                200,
                &format!(
                    r#"{{"access_token":"{GCP_TOKEN}","expires_in":3599,"token_type":"Bearer"}}"#
                ),
            );
        }
        _ => return reply(404, ""),
    };
    reply(200, body)
}

fn azure(req: &http::Request<Incoming>) -> http::Response<Full<Bytes>> {
    if !header(req, "metadata").eq_ignore_ascii_case("true") {
        return reply(
            400,
            r#"{"error":"Bad request. Required metadata header not specified"}"#,
        );
    }
    if req.uri().path() != "/metadata/instance" {
        return reply(404, "");
    }
    let version = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("api-version="));
    match version {
        None => reply(
            400,
            &format!(
                r#"{{"error":"Bad request. api-version was not specified in the request","newest-versions":["{AZURE_VERSION}","2021-12-13","2019-08-15"]}}"#
            ),
        ),
        Some(AZURE_VERSION) => reply(
            200,
            r#"{"compute":{"location":"centralus","name":"negasonic","vmId":"13f56399-bd52-4150-9748-7190aae1ff21","zone":"1",
               "tagsList":[{"name":"Department","value":"IT"},{"name":"Role","value":"WorkerRole; OtherWorker"}]},
               "network":{"interface":[]}}"#,
        ),
        Some(_) => reply(400, r#"{"error":"Bad request. api-version is invalid"}"#),
    }
}

/// A loopback port nothing listens on: a connection to it is refused at once.
fn closed_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// A sidecar's configuration (pod `p` in `ns` at 10.0.0.5) with `pairs` added to its
/// environment. Every metadata endpoint the environment does not move is a closed loopback
/// port, Google's DNS name is `localhost`, the DMI folder and resolv.conf are under `dir`
/// (absent unless the test writes them): no test reaches a real metadata server or DNS (each
/// endpoint is checked to be on loopback).
pub fn config(dir: &Path, pairs: &[(&str, &str)]) -> Config {
    let closed = closed_port();
    let mut env: HashMap<String, String> = [
        ("POD_NAME", "p"),
        ("POD_NAMESPACE", "ns"),
        ("INSTANCE_IP", "10.0.0.5"),
        ("CLOUD_PLATFORM_AWS_METADATA_HOST", closed.as_str()),
        ("CLOUD_PLATFORM_AZURE_METADATA_HOST", closed.as_str()),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    env.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut c = Config::load(Inputs {
        node_type: NodeType::Sidecar,
        flags: ProxyFlags::default(),
        env: &env,
        base_dir: dir.to_path_buf(),
        interface_ips: vec![],
        is_root: false,
        cgroup_memory_limit: None,
    })
    .unwrap();
    let e = &mut c.platform.endpoints;
    if !e.gcp_host_set {
        e.gcp = closed.clone();
    }
    e.gcp_dns_name = "localhost".into();
    e.gcp_compute = format!("http://{closed}");
    e.dmi_dir = dir.join("dmi");
    e.resolv_conf = dir.join("resolv.conf");
    for host in [&e.aws, &e.azure, &e.gcp] {
        assert!(host.starts_with("127.0.0.1:"), "{host} is not loopback");
    }
    c
}
