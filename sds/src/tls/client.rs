//! The TLS side of istiod channels: one rustls client config built from [`ChannelInputs`] (the
//! root, the client identity and the `COMPLIANCE_POLICY`), and the connector that dials TCP and
//! runs the handshake under it. tonic's own TLS cannot narrow suites or groups, so channels are
//! built over this connector instead.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::BufReader;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::{ChannelInputs, RootSource};

/// Reads from istiod go through a buffer this large, below TLS: rustls reads at most one record
/// (16 KiB) per call, so without it a 1.8 MB push costs a `recv` (and an ACK, a wakeup of
/// istiod) per record; with it each `recv` takes up to four records.
pub(super) const READ_BUFFER: usize = 64 << 10;

/// Why the TLS config of a channel cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("TLS policy {policy:?}: {source}")]
    Policy {
        policy: crate::Compliance,
        #[source]
        source: rustls::Error,
    },
    #[error("no usable certificate in the system trust store")]
    NoSystemRoots,
    #[error("cannot read the root certificate {}: {source}", path.display())]
    ReadRoot {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `what`: "inline PEM" or "root file <path>".
    #[error("no certificate in {what}")]
    NoRoot { what: String },
    #[error("a certificate in {what}: {source}")]
    BadRoot {
        what: String,
        #[source]
        source: rustls::Error,
    },
    #[error("no certificate in the client certificate chain")]
    NoClientChain,
    #[error("client key: {0}")]
    ClientKey(#[source] rustls::pki_types::pem::Error),
    #[error("client certificate: {0}")]
    ClientCert(#[source] rustls::Error),
    #[error("TLS server name {name:?}: {source}")]
    ServerName {
        name: String,
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
}

/// The rustls config of a TLS channel: the policy's provider and versions, the root of
/// `inputs`, its client identity and ALPN `h2`. The error says what is wrong.
pub fn client_config(inputs: &ChannelInputs) -> Result<ClientConfig, Error> {
    let builder = ClientConfig::builder_with_provider(inputs.compliance.provider())
        .with_protocol_versions(inputs.compliance.versions())
        .map_err(|source| Error::Policy {
            policy: inputs.compliance,
            source,
        })?;
    let mut roots = rustls::RootCertStore::empty();
    match &inputs.root {
        RootSource::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(Error::NoSystemRoots);
            }
        }
        RootSource::Pem(pem) => add_pem_roots(&mut roots, pem, "inline PEM")?,
        RootSource::File(path) => {
            let pem = std::fs::read(path).map_err(|source| Error::ReadRoot {
                path: path.clone(),
                source,
            })?;
            add_pem_roots(&mut roots, &pem, &format!("root file {}", path.display()))?;
        }
    }
    let builder = builder.with_root_certificates(roots);
    let mut config = match &inputs.client_identity {
        Some((chain, key)) => {
            let certs: Vec<CertificateDer<'static>> = crate::pem::parse_certs(chain)
                .into_iter()
                .map(CertificateDer::from)
                .collect();
            if certs.is_empty() {
                return Err(Error::NoClientChain);
            }
            let key = private_key(key)?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(Error::ClientCert)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

fn add_pem_roots(roots: &mut rustls::RootCertStore, pem: &[u8], what: &str) -> Result<(), Error> {
    let certs = crate::pem::parse_certs(pem);
    if certs.is_empty() {
        return Err(Error::NoRoot { what: what.into() });
    }
    for der in certs {
        roots
            .add(CertificateDer::from(der))
            .map_err(|source| Error::BadRoot {
                what: what.into(),
                source,
            })?;
    }
    Ok(())
}

fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, Error> {
    use rustls::pki_types::pem::PemObject;
    PrivateKeyDer::from_pem_slice(pem).map_err(Error::ClientKey)
}

/// The name the server certificate must carry: `server_name`, else the host of `authority`.
pub fn server_name(inputs: &ChannelInputs, authority: &str) -> Result<ServerName<'static>, Error> {
    let name = if inputs.server_name.is_empty() {
        host_of(authority)
    } else {
        inputs.server_name.as_str()
    };
    ServerName::try_from(name.to_string()).map_err(|source| Error::ServerName {
        name: name.to_string(),
        source,
    })
}

/// The host of `host:port`, `[v6]:port` or a URI's authority.
fn host_of(authority: &str) -> &str {
    let a = authority.rsplit("://").next().unwrap_or(authority);
    let a = a.split('/').next().unwrap_or(a);
    if let Some(rest) = a.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match a.rsplit_once(':') {
        Some((h, _)) => h,
        None => a,
    }
}

/// The stream a TLS channel runs over.
pub type Io = TokioIo<TlsStream<BufReader<TcpStream>>>;

/// A connector for tonic: TCP to `addr` (or, when `None`, to the host and port of the URI the
/// channel asks for), TCP_NODELAY, reads buffered ([`READ_BUFFER`]), then the TLS handshake with
/// `config` for `name`.
pub fn connector(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    addr: Option<SocketAddr>,
) -> impl tower::Service<
    tonic::codegen::http::Uri,
    Response = Io,
    Error = std::io::Error,
    Future = impl Send,
> + Send
+ Clone
+ 'static {
    let tls = tokio_rustls::TlsConnector::from(config);
    tower::service_fn(move |uri: tonic::codegen::http::Uri| {
        let tls = tls.clone();
        let name = name.clone();
        async move {
            let tcp = match addr {
                Some(addr) => TcpStream::connect(addr).await?,
                None => {
                    let host = uri.host().unwrap_or_default();
                    let host = host.trim_start_matches('[').trim_end_matches(']');
                    let port = uri.port_u16().unwrap_or(443);
                    TcpStream::connect((host, port)).await?
                }
            };
            tcp.set_nodelay(true)?;
            let io = BufReader::with_capacity(READ_BUFFER, tcp);
            Ok(TokioIo::new(tls.connect(name, io).await?))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn host_of_authorities() {
        assert_eq!(
            host_of("istiod.istio-system.svc:15012"),
            "istiod.istio-system.svc"
        );
        assert_eq!(host_of("https://istiod:15012"), "istiod");
        assert_eq!(host_of("[fd00::1]:15012"), "fd00::1");
        assert_eq!(host_of("istiod"), "istiod");
    }
}
