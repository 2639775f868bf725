//! The workload identity as Istio's agent settles it when it starts serving (its `Run`), not
//! while it reads its configuration: whether a live SDS server (SPIRE's agent, say) already
//! owns the configured workload socket, whether one serves the credential socket, and so where
//! the agent's own SDS server listens and whether it needs a CA client.
//!
//! Istio's rules: a live server on the configured socket is left alone and the agent serves
//! file certificates only, on the files socket, never calling the CA; a socket file nobody
//! answers on is removed; a non-default `WORKLOAD_IDENTITY_SOCKET_FILE` with no live server
//! there is an error (nobody would serve the workload certificate); a `CA_PROVIDER` with no CA
//! client is an error only when a CA client is needed.

use std::path::PathBuf;

use sds::{CHECK_TIMEOUT, SocketCheck, check_socket};

use crate::config::Config;
use crate::config::identity::WorkloadSocket;

/// What stops the identity from being settled.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "agent configured for non-default SDS socket path: {path} but no socket found (WORKLOAD_IDENTITY_SOCKET_FILE={file:?} names a socket that an external SDS server such as SPIRE's agent must serve before pilot-agent starts; unset it to use pilot-agent's own SDS server)"
    )]
    NoExternalSocket { path: PathBuf, file: String },
    #[error("{0}")]
    Socket(sds::Error),
    #[error(
        "CA provider {0:?} not registered (CA_PROVIDER: Citadel, Istio's CA, is the one CA client; GoogleCA is chosen by a CA_ADDR under googleapis.com; GkeWorkloadCertificate reads mounted files)"
    )]
    CaProviderNotRegistered(String),
}

/// Who serves the workload identity sockets, as found when the agent binds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sockets {
    /// A live SDS server already answers on the configured workload socket: the agent serves
    /// file certificates only, on the files socket, and never calls the CA (Istio's
    /// `ServeOnlyFiles`; node metadata `file-credential`).
    pub external: bool,
    /// A live server answers on the credential socket (Istio's `CredentialSocketExists`; node
    /// metadata `credential`).
    pub credential: bool,
}

/// The identity as settled: who serves the sockets, and the secret manager's and SDS server's
/// settings that follow from it.
#[derive(Debug, Clone)]
pub struct Settled {
    pub sockets: Sockets,
    /// `config.identity`, on the files socket and serving files only when `sockets.external`.
    pub identity: sds::Config,
}

/// Probes the workload and credential sockets ([`check_socket`]: a live HTTP/2 server, or a
/// stale file, which is removed). Blocks up to [`CHECK_TIMEOUT`] per socket.
pub fn sockets(socket: &WorkloadSocket) -> Result<Sockets, Error> {
    let external = match check_socket(&socket.configured, CHECK_TIMEOUT).map_err(Error::Socket)? {
        SocketCheck::Healthy => true,
        SocketCheck::RemovedStale => {
            tracing::debug!(path = %socket.configured.display(), "removed an SDS socket nobody answers on");
            false
        }
        SocketCheck::Absent => false,
    };
    if !external && !socket.is_default() {
        return Err(Error::NoExternalSocket {
            path: socket.configured.clone(),
            file: socket.file.clone(),
        });
    }
    let credential = check_socket(&socket.credential, CHECK_TIMEOUT).map_err(Error::Socket)?
        == SocketCheck::Healthy;
    Ok(Sockets {
        external,
        credential,
    })
}

/// Settles the identity for `config` ([`sockets`], then the CA client's requirement).
pub fn settle(config: &Config) -> Result<Settled, Error> {
    let sockets = sockets(&config.workload_socket)?;
    // A CA client is made only without mounted certificates or an external SDS server.
    if config.identity.file_mounted_certs.is_none()
        && !sockets.external
        && let Some(name) = config.ca_provider.unregistered()
    {
        return Err(Error::CaProviderNotRegistered(name.to_string()));
    }
    let identity = if sockets.external {
        sds::Config {
            socket_path: config.workload_socket.files.clone(),
            serve_only_files: true,
            ..config.identity.clone()
        }
    } else {
        config.identity.clone()
    };
    Ok(Settled { sockets, identity })
}

#[cfg(test)]
pub(crate) mod tests;
