//! 2,000 simulated proxies reconnect at once: one unpaced burst of 2,000 ADS connections (one
//! TCP + HTTP/2 connection and one SotW stream per proxy, as many Envoys would open after an
//! istiod restart) against a real `istiod-lite serve` process on loopback. Every proxy must get
//! its first CDS and LDS response on its first connection attempt.
//!
//! `cargo nextest run -p control-plane --test grpc --no-capture reconnect_burst::` prints a
//! `FIGURE reconnect_burst ...` line with the time until the last proxy had both responses.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use proto::envoy::service::discovery::v3::DiscoveryRequest;
use proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::type_url::{CLUSTER, LISTENER};
use tokio::sync::{Barrier, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::common::{Istiod, node};

const PROXIES: usize = 2000;
/// Everything (spawn, burst, convergence) must finish within this; the burst itself takes a few
/// seconds in a debug build on a loaded 2-core machine.
const BUDGET: Duration = Duration::from_secs(40);

/// How far each proxy got.
#[derive(Default)]
struct Progress {
    connected: AtomicUsize,
    streams: AtomicUsize,
    cds: AtomicUsize,
    converged: AtomicUsize,
    errors: std::sync::Mutex<Vec<String>>,
}

impl Progress {
    /// `connected=<n> streams=<n> cds=<n>`: how many proxies reached each stage so far.
    fn stages(&self) -> String {
        format!(
            "connected={} streams={} cds={}",
            self.connected.load(Ordering::Relaxed),
            self.streams.load(Ordering::Relaxed),
            self.cds.load(Ordering::Relaxed),
        )
    }
}

/// Raises the soft open-file limit to the hard limit: 2,000 client sockets live in this process
/// and 2,000 server sockets in the child, which inherits the limit.
#[allow(unsafe_code)] // getrlimit(2), setrlimit(2)
fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        }
    }
    lim.rlim_cur
}

/// One proxy: connect (once, no retry), open a SotW stream, ask for CDS, ACK it and ask for LDS
/// like Envoy does, and wait for the LDS response.
async fn proxy(addr: SocketAddr, i: usize, go: Arc<Barrier>, p: Arc<Progress>) {
    go.wait().await;
    let fail = |stage: &str, e: String| {
        p.errors
            .lock()
            .expect("errors")
            .push(format!("proxy {i}: {stage}: {e}"));
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("uri")
        .local_address(Some(crate::common::source(i)))
        .connect()
        .await;
    let mut client = match channel {
        Ok(c) => AggregatedDiscoveryServiceClient::new(c),
        Err(e) => return fail("connect", format!("{e:?}")),
    };
    p.connected.fetch_add(1, Ordering::Relaxed);
    let req = |t: &str, nonce: &str| DiscoveryRequest {
        node: Some(node(i)),
        type_url: t.into(),
        response_nonce: nonce.into(),
        ..Default::default()
    };
    let (tx, rx) = mpsc::channel(4);
    let _ = tx.send(req(CLUSTER, "")).await;
    let mut stream = match client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(e) => return fail("open stream", e.to_string()),
    };
    p.streams.fetch_add(1, Ordering::Relaxed);
    let mut got_cds = false;
    loop {
        let r = match stream.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return fail("stream", "closed by the server".into()),
            Err(e) => return fail("stream", e.to_string()),
        };
        if r.type_url == CLUSTER && !got_cds {
            got_cds = true;
            p.cds.fetch_add(1, Ordering::Relaxed);
            let _ = tx.send(req(CLUSTER, &r.nonce)).await;
            let _ = tx.send(req(LISTENER, "")).await;
        } else if r.type_url == LISTENER && got_cds {
            let _ = tx.send(req(LISTENER, &r.nonce)).await;
            p.converged.fetch_add(1, Ordering::Relaxed);
            // Stay connected like a proxy until the test ends.
            let _ = stream.message().await;
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_proxies_reconnecting_at_once_all_get_cds_and_lds() {
    let nofile = raise_nofile();
    assert!(
        nofile >= 2 * PROXIES as u64 + 200,
        "RLIMIT_NOFILE hard limit {nofile} is below the {} this test needs",
        2 * PROXIES + 200
    );
    let config = tempfile::tempdir().expect("tempdir");
    let ca = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        config.path().join("mesh.yaml"),
        "kind: ServiceEntry\nmetadata: {name: api, namespace: web}\nspec: {hosts: [api.example.com], addresses: [198.18.10.1], ports: [{number: 80, name: http, protocol: HTTP}], resolution: STATIC, endpoints: [{address: 198.18.1.1}]}\n",
    )
    .expect("write config");
    let server = Istiod::start(
        config.path(),
        ca.path(),
        "warn,control_plane=info,istiod_lite=info",
    );
    let addr = server.grpc;

    let progress = Arc::new(Progress::default());
    // Every proxy task is spawned and parked first, then all are released at once: one burst
    // of 2,000 connects with no pacing.
    let go = Arc::new(Barrier::new(PROXIES + 1));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..PROXIES {
        tasks.spawn(proxy(addr, i, go.clone(), progress.clone()));
    }
    go.wait().await;
    let t0 = Instant::now();
    let mut last_report = Instant::now();
    loop {
        let converged = progress.converged.load(Ordering::Relaxed);
        let failed = progress.errors.lock().expect("errors").len();
        if converged + failed >= PROXIES || t0.elapsed() > BUDGET {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            last_report = Instant::now();
            eprintln!(
                "after {:?}: {} converged={converged} failed={failed}",
                t0.elapsed(),
                progress.stages(),
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = t0.elapsed();
    let converged = progress.converged.load(Ordering::Relaxed);
    let errors = progress.errors.lock().expect("errors").clone();
    println!(
        "FIGURE reconnect_burst proxies={PROXIES} converged={converged} failed={} {} all_cds_lds_in={elapsed:?}",
        errors.len(),
        progress.stages(),
    );
    tasks.abort_all();
    drop(server);
    assert!(
        errors.is_empty(),
        "{} proxies failed on their first attempt; first few: {:#?}",
        errors.len(),
        &errors[..errors.len().min(10)]
    );
    assert_eq!(
        converged, PROXIES,
        "only {converged} of {PROXIES} proxies had CDS and LDS within {BUDGET:?}"
    );
}

/// The root cause, pinned without timing: tokio's `TcpListener::bind` listens with a backlog of
/// 1024, so with nobody accepting, connection 1,026 and later never completes its handshake (its
/// SYN is dropped). Our listeners queue as many as `net.core.somaxconn` allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_queue_more_than_1024_pending_connections() {
    const PENDING: usize = 1500;
    let nofile = raise_nofile();
    let Some(backlog) = control_plane::effective_backlog() else {
        eprintln!("SKIP: /proc/sys/net/core/somaxconn unreadable");
        return;
    };
    if (backlog as usize) < PENDING + 10 || nofile < PENDING as u64 + 100 {
        eprintln!(
            "SKIP: needs net.core.somaxconn >= {} (is {backlog}) and {} open files (limit {nofile})",
            PENDING + 10,
            PENDING + 100
        );
        return;
    }
    let listener = control_plane::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut connects = tokio::task::JoinSet::new();
    for _ in 0..PENDING {
        connects.spawn(tokio::time::timeout(
            // A dropped SYN is retried after 1 s, 3 s, 7 s: with the old backlog the 1,026th
            // connect would still be pending here however long we waited.
            Duration::from_secs(20),
            tokio::net::TcpStream::connect(addr),
        ));
    }
    let mut streams = Vec::new();
    while let Some(r) = connects.join_next().await {
        match r.expect("task") {
            Ok(Ok(s)) => streams.push(s),
            Ok(Err(e)) => panic!("connect failed: {e}"),
            Err(_) => panic!(
                "a connect never completed ({} had when this one gave up): the listen backlog is too small",
                streams.len()
            ),
        }
    }
    assert_eq!(streams.len(), PENDING);
    drop(listener);
}
