//! In-process fake Istio CA for tests and benches: a real tonic server on `127.0.0.1:0` over
//! TLS (test-generated root, serving cert for `istiod.istio-system.svc` and `localhost`),
//! running on its own thread and runtime so tests on paused tokio time can call it. Tests set
//! its next answers and read back what it received. A client certificate signed by its first
//! signing root is verified when presented (optional, as on istiod's 15012).

/// The crate's PEM and JWT readers, for end-to-end tests that check what the agent served.
pub use crate::pem::parse_certs;
pub use crate::token::jwt_expiry;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::istio::ca::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use proto::istio::ca::{IstioCertificateRequest, IstioCertificateResponse};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

/// What the fake CA does with the next request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Sign the CSR with the current signing root.
    Sign,
    /// Fail with this gRPC code.
    Fail(tonic::Code),
    /// Answer with a chain of one element (Istio's "invalid empty CertChain").
    ShortChain,
    /// Sign the CSR with a leaf that expired an hour ago (a CA whose clock is wrong).
    Expired,
}

/// A request as the fake CA received it.
#[derive(Clone, Debug)]
pub struct Received {
    pub csr_pem: String,
    pub validity_duration: i64,
    pub cert_signer: Option<String>,
    /// gRPC metadata as (lowercase key, value).
    pub headers: Vec<(String, String)>,
    /// Whether the caller presented a client certificate (verified against the first signing
    /// root, as istiod verifies `PROV_CERT` and the agent's own certificate).
    pub client_cert: bool,
}

impl Received {
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

struct SigningRoot {
    key: KeyPair,
    params: CertificateParams,
    pem: String,
}

fn new_root(cn: &str) -> SigningRoot {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("generate CA key");
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "cluster.local");
    dn.push(DnType::CommonName, cn);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(365);
    let cert = params.self_signed(&key).expect("self-sign CA");
    SigningRoot {
        pem: cert.pem(),
        key,
        params,
    }
}

struct State {
    count: tokio::sync::watch::Sender<usize>,
    answers: VecDeque<Answer>,
    default_answer: Answer,
    received: Vec<Received>,
    root: SigningRoot,
    ttl_override: Option<Duration>,
}

/// Handle to a running fake CA; stops when dropped.
pub struct FakeCa {
    pub addr: SocketAddr,
    /// Root that verifies the CA's TLS serving certificate (write it as the agent's root file).
    pub tls_root_pem: String,
    state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Clone)]
struct Svc {
    state: Arc<Mutex<State>>,
}

fn lock(s: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

#[tonic::async_trait]
impl IstioCertificateService for Svc {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let headers = request
            .metadata()
            .iter()
            .filter_map(|kv| match kv {
                tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                    Some((k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
                }
                _ => None,
            })
            .collect();
        let client_cert = request.peer_certs().is_some_and(|c| !c.is_empty());
        let req = request.into_inner();
        let cert_signer = req
            .metadata
            .as_ref()
            .and_then(|m| m.fields.get("CertSigner"))
            .and_then(|v| match &v.kind {
                Some(proto::google::protobuf::value::Kind::StringValue(s)) => Some(s.clone()),
                _ => None,
            });
        let mut st = lock(&self.state);
        st.received.push(Received {
            csr_pem: req.csr.clone(),
            validity_duration: req.validity_duration,
            cert_signer,
            headers,
            client_cert,
        });
        let n = st.received.len();
        st.count.send_replace(n);
        let answer = st
            .answers
            .pop_front()
            .unwrap_or_else(|| st.default_answer.clone());
        match answer {
            Answer::Fail(code) => Err(Status::new(code, "fake CA told to fail")),
            Answer::ShortChain => Ok(Response::new(IstioCertificateResponse {
                cert_chain: vec![st.root.pem.clone()],
                ..Default::default()
            })),
            Answer::Sign | Answer::Expired => {
                let validity = st
                    .ttl_override
                    .unwrap_or(Duration::from_secs(req.validity_duration.max(1) as u64));
                let mut csr = CertificateSigningRequestParams::from_pem(&req.csr)
                    .map_err(|e| Status::invalid_argument(format!("bad CSR: {e}")))?;
                let mut now = time::OffsetDateTime::now_utc();
                if answer == Answer::Expired {
                    now -= time::Duration::seconds(validity.as_secs() as i64 + 3600);
                }
                csr.params.not_before = now - time::Duration::seconds(1);
                csr.params.not_after = now + time::Duration::seconds(validity.as_secs() as i64);
                csr.params.serial_number =
                    Some(SerialNumber::from_slice(&rand::random::<[u8; 16]>()[..]));
                csr.params.use_authority_key_identifier_extension = true;
                csr.params.key_usages = vec![
                    KeyUsagePurpose::DigitalSignature,
                    KeyUsagePurpose::KeyEncipherment,
                ];
                csr.params.extended_key_usages = vec![
                    rcgen::ExtendedKeyUsagePurpose::ServerAuth,
                    rcgen::ExtendedKeyUsagePurpose::ClientAuth,
                ];
                let issuer = Issuer::from_params(&st.root.params, &st.root.key);
                let cert = csr
                    .signed_by(&issuer)
                    .map_err(|e| Status::internal(format!("sign: {e}")))?;
                Ok(Response::new(IstioCertificateResponse {
                    cert_chain: vec![cert.pem(), st.root.pem.clone()],
                    ..Default::default()
                }))
            }
        }
    }
}

impl FakeCa {
    /// Starts a TLS fake CA that signs every request.
    pub fn start() -> FakeCa {
        Self::start_inner(true)
    }

    /// Starts a plaintext fake CA (as Istio's `:15010`).
    pub fn start_plaintext() -> FakeCa {
        Self::start_inner(false)
    }

    fn start_inner(tls: bool) -> FakeCa {
        let root = new_root("fake-istio-ca");
        // TLS serving cert for the CA, signed by the first root (kept even if the signing root rotates).
        let server_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("server key");
        let mut sp = CertificateParams::new(vec![
            "istiod.istio-system.svc".to_string(),
            "localhost".to_string(),
        ])
        .expect("server params");
        sp.subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        let now = time::OffsetDateTime::now_utc();
        sp.not_before = now - time::Duration::hours(1);
        sp.not_after = now + time::Duration::days(30);
        let server_cert = sp
            .signed_by(&server_key, &Issuer::from_params(&root.params, &root.key))
            .expect("server cert");
        let identity = Identity::from_pem(server_cert.pem(), server_key.serialize_pem());
        let tls_root_pem = root.pem.clone();
        let client_root = tonic::transport::Certificate::from_pem(root.pem.clone());

        let state = Arc::new(Mutex::new(State {
            count: tokio::sync::watch::channel(0).0,
            answers: VecDeque::new(),
            default_answer: Answer::Sign,
            received: Vec::new(),
            root,
            ttl_override: None,
        }));
        let svc = Svc {
            state: state.clone(),
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                let _ = addr_tx.send(listener.local_addr().expect("addr"));
                // Nagle on the accepted side would add ~40 ms (delayed ACK) to every answer.
                let incoming = tokio_stream::StreamExt::map(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    |s| s.and_then(|s| s.set_nodelay(true).map(|()| s)),
                );
                let mut b = Server::builder();
                if tls {
                    b = b
                        .tls_config(
                            ServerTlsConfig::new()
                                .identity(identity)
                                .client_ca_root(client_root)
                                .client_auth_optional(true),
                        )
                        .expect("tls config");
                }
                let _ = b
                    .add_service(IstioCertificateServiceServer::new(svc))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stop_rx.await;
                    })
                    .await;
            });
        });
        let addr = addr_rx.recv().expect("fake CA bound");
        FakeCa {
            addr,
            tls_root_pem,
            state,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// Queues answers for the next requests (then back to the default).
    pub fn push_answers(&self, answers: impl IntoIterator<Item = Answer>) {
        lock(&self.state).answers.extend(answers);
    }

    /// Answer used when the queue is empty.
    pub fn set_default_answer(&self, answer: Answer) {
        lock(&self.state).default_answer = answer;
    }

    /// Issue certificates with this lifetime instead of the requested one.
    pub fn set_ttl(&self, ttl: Option<Duration>) {
        lock(&self.state).ttl_override = ttl;
    }

    /// Replaces the signing root (a root rotation); returns the new root PEM.
    pub fn rotate_signing_root(&self) -> String {
        let root = new_root("fake-istio-ca-2");
        let pem = root.pem.clone();
        lock(&self.state).root = root;
        pem
    }

    /// PEM of the root that signs workload certificates.
    pub fn signing_root_pem(&self) -> String {
        lock(&self.state).root.pem.clone()
    }

    /// Every request received so far.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.state).received.clone()
    }

    /// Waits (without timers, so it is safe on paused tokio time) until `n` requests arrived.
    pub async fn wait_received(&self, n: usize) {
        let mut rx = lock(&self.state).count.subscribe();
        let _ = rx.wait_for(|c| *c >= n).await;
    }

    /// `host:port` to use as `CA_ADDR`.
    pub fn ca_addr(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for FakeCa {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        // The thread ends once open connections close; it is not joined so a client still
        // holding a connection cannot block the test.
        drop(self.thread.take());
    }
}
