//! SDS server on a Unix socket.

use std::path::Path;

use tokio_util::sync::CancellationToken;

use crate::{Error, SecretManager};

pub struct SdsServer {
    #[allow(dead_code)]
    manager: SecretManager,
}

impl SdsServer {
    pub async fn bind(_socket_path: &Path, manager: SecretManager) -> Result<SdsServer, Error> {
        Ok(SdsServer { manager })
    }
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        shutdown.cancelled().await;
        Ok(())
    }
}
