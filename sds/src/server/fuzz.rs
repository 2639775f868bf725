//! The fuzz target's entry point (`fuzz/fuzz_targets/sds_requests.rs`): SDS requests in any
//! order through the loop every SDS stream runs ([`super::stream::serve`]), SotW or Delta, with
//! unknown and file resource names, stale nonces, ACKs and NACKs. The manager serves files
//! only (no CA is reached; `default` and `ROOTCA` stay pending, as for a workload socket owned
//! by SPIRE), so every run is local and quick.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use prost::Message;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::Sds;
use super::stream::{self, Delta, Sotw};
use crate::{Config, Metrics, SecretManager};

/// Responses one run may produce at most (a request answers its names at most once each).
const MAX_RESPONSES: usize = 4096;

struct World {
    sds: Sds,
    runtime: tokio::runtime::Runtime,
    _dir: std::path::PathBuf,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("sds-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("fuzz dir");
        // A certificate and key the `file-cert:c.pem~k.pem` seed names (any bytes: a bad file
        // is the file path's business).
        std::fs::write(
            dir.join("c.pem"),
            b"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
        )
        .expect("c.pem");
        std::fs::write(
            dir.join("k.pem"),
            b"-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n",
        )
        .expect("k.pem");
        let config = Config {
            serve_only_files: true,
            ..Config::defaults(&dir)
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let manager = {
            let _guard = runtime.enter();
            let mut registry = prometheus_client::registry::Registry::default();
            SecretManager::new(Arc::new(config), Arc::new(Metrics::new(&mut registry)))
                .expect("files-only manager")
        };
        let sds = Sds {
            manager,
            shutdown: CancellationToken::new(),
            counter: Arc::new(AtomicU64::new(0)),
        };
        World {
            sds,
            runtime,
            _dir: dir,
        }
    })
}

/// Splits `data` into requests: each a 2-byte little-endian length and that many bytes.
fn frames(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while let [lo, hi, rest @ ..] = data {
        let n = usize::from(u16::from_le_bytes([*lo, *hi])).min(rest.len());
        out.push(&rest[..n]);
        data = &rest[n..];
    }
    out
}

fn decoded<T: Message + Default>(bytes: &[u8]) -> Result<T, Status> {
    T::decode(bytes).map_err(|e| Status::internal(format!("cannot decode the SDS request: {e}")))
}

/// Serves `requests` on one stream of `protocol` and drains its responses.
async fn one_stream<P: stream::Protocol>(sds: Sds, protocol: P, requests: &[&[u8]]) {
    let reqs: Vec<Result<P::Request, Status>> = requests.iter().map(|b| decoded(b)).collect();
    let (tx, mut rx) = mpsc::channel(16);
    let drain = async {
        let mut n = 0usize;
        while rx.recv().await.is_some() {
            n += 1;
            assert!(
                n <= MAX_RESPONSES,
                "one stream sent over {MAX_RESPONSES} responses"
            );
        }
    };
    tokio::join!(
        stream::serve(sds, protocol, futures::stream::iter(reqs), tx),
        drain
    );
}

/// One stream: the first byte picks SotW (even) or Delta (odd); the rest is framed requests,
/// each decoded as tonic would (an undecodable one ends the stream). Never panics; the stream
/// ends when its requests do, with at most `MAX_RESPONSES` (4096) responses.
pub fn fuzz_sds_requests(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let world = world();
    let requests = frames(rest);
    let sds = world.sds.clone();
    world.runtime.block_on(async {
        if mode & 1 == 0 {
            one_stream(sds, Sotw::default(), &requests).await;
        } else {
            one_stream(sds, Delta::default(), &requests).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::envoy::service::discovery::v3::DiscoveryRequest;

    #[test]
    fn samples_run_to_the_end() {
        let sotw = |names: &[&str], nonce: &str| {
            DiscoveryRequest {
                type_url: proto::type_url::SECRET.into(),
                resource_names: names.iter().map(|n| n.to_string()).collect(),
                response_nonce: nonce.into(),
                ..Default::default()
            }
            .encode_to_vec()
        };
        let mut input = vec![0u8];
        for r in [
            sotw(&["file-cert:c.pem~k.pem", "default"], ""),
            sotw(&["file-root:c.pem", "nope"], "1"),
            sotw(&[], "stale"),
            vec![0xff, 0xff],
        ] {
            input.extend_from_slice(&(r.len() as u16).to_le_bytes());
            input.extend_from_slice(&r);
        }
        fuzz_sds_requests(&input);
        input[0] = 1;
        fuzz_sds_requests(&input);
        fuzz_sds_requests(&[]);
    }
}
