//! Readiness of a proxyless gRPC pod (`DISABLE_ENVOY`), as Istio's gRPC readiness check: ready
//! once the gRPC xDS bootstrap exists and parses and every file its `file_watcher` certificate
//! providers name (the `OUTPUT_CERTS` chain, key and root) exists.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use proto::lifecycle::ReadyGuard;

/// The provider files a `file_watcher` plugin reads.
const PROVIDER_FILES: [&str; 3] = [
    "certificate_file",
    "private_key_file",
    "ca_certificate_file",
];

/// What a proxyless gRPC pod still misses.
#[derive(Debug, thiserror::Error)]
pub enum Pending {
    #[error("gRPC xDS bootstrap {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("gRPC xDS bootstrap {} is not JSON: {source}", path.display())]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// `key`: one of the `file_watcher` provider's file keys (`certificate_file`, ...).
    #[error("certificate provider {provider:?}: {key} {file} does not exist yet")]
    Missing {
        provider: String,
        key: &'static str,
        file: String,
    },
}

/// `Ok` when the bootstrap and its certificate files are in place; else what is missing.
pub fn check(bootstrap: &Path) -> Result<(), Pending> {
    let text = std::fs::read_to_string(bootstrap).map_err(|source| Pending::Read {
        path: bootstrap.into(),
        source,
    })?;
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|source| Pending::Parse {
        path: bootstrap.into(),
        source,
    })?;
    let providers = doc["certificate_providers"]
        .as_object()
        .into_iter()
        .flatten();
    for (name, provider) in providers.filter(|(_, p)| p["plugin_name"] == "file_watcher") {
        for key in PROVIDER_FILES {
            if let Some(file) = provider["config"][key].as_str()
                && !Path::new(file).is_file()
            {
                return Err(Pending::Missing {
                    provider: name.clone(),
                    key,
                    file: file.into(),
                });
            }
        }
    }
    Ok(())
}

/// Polls [`check`] until it passes, then marks `guard` ready (or stops with `token`).
pub async fn wait(bootstrap: PathBuf, guard: ReadyGuard, token: CancellationToken) {
    loop {
        match check(&bootstrap) {
            Ok(()) => {
                tracing::info!(bootstrap = %bootstrap.display(), "gRPC xDS bootstrap and certificates ready");
                guard.ready();
                return;
            }
            Err(e) => tracing::debug!(reason = %e, "gRPC readiness pending"),
        }
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::lifecycle::Readiness;

    fn bootstrap(dir: &Path, with_certs: bool) -> PathBuf {
        let mut doc = serde_json::json!({ "xds_servers": [] });
        if with_certs {
            doc["certificate_providers"] = serde_json::json!({
                "default": { "plugin_name": "file_watcher", "config": {
                    "certificate_file": dir.join("cert-chain.pem"),
                    "private_key_file": dir.join("key.pem"),
                    "ca_certificate_file": dir.join("root-cert.pem"),
                }}
            });
        }
        let p = dir.join("grpc-bootstrap.json");
        std::fs::write(&p, doc.to_string()).unwrap();
        p
    }

    #[test]
    fn waits_for_the_bootstrap_and_each_certificate_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("grpc-bootstrap.json");
        assert!(
            check(&missing)
                .unwrap_err()
                .to_string()
                .contains("gRPC xDS bootstrap")
        );
        std::fs::write(&missing, "{").unwrap();
        assert!(
            check(&missing)
                .unwrap_err()
                .to_string()
                .contains("not JSON")
        );
        let p = bootstrap(dir.path(), true);
        for f in ["cert-chain.pem", "key.pem"] {
            assert!(check(&p).is_err());
            std::fs::write(dir.path().join(f), "x").unwrap();
        }
        let err = check(&p).unwrap_err().to_string();
        assert!(err.contains("ca_certificate_file"), "{err}");
        std::fs::write(dir.path().join("root-cert.pem"), "x").unwrap();
        check(&p).expect("every file in place");
        // Without OUTPUT_CERTS the bootstrap names no files: the bootstrap alone suffices.
        let plain = tempfile::tempdir().unwrap();
        check(&bootstrap(plain.path(), false)).expect("no file_watcher provider");
    }

    #[tokio::test]
    async fn guard_turns_ready_once_everything_exists() {
        let dir = tempfile::tempdir().unwrap();
        let readiness = Readiness::default();
        let guard = readiness.register(
            "grpc",
            "gRPC xDS bootstrap or its certificates are not written yet",
        );
        let task = tokio::spawn(wait(
            dir.path().join("grpc-bootstrap.json"),
            guard,
            CancellationToken::new(),
        ));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(readiness.pending(), ["grpc"]);
        bootstrap(dir.path(), false);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("wait returns")
            .unwrap();
        assert!(readiness.pending().is_empty());
    }
}
