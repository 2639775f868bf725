//! `kubelet`: runs one pod spec as Istio's injector emits it, the way a kubelet and containerd
//! would, against an istiod-lite it starts (see `harness::kubelet`).
//!
//! ```text
//! kubelet run <spec.yaml> [--for <seconds>] [--config <istiod-lite YAML>]
//! ```
//!
//! Prints each step (containers started and exited, probes, ready, termination) and exits 0
//! only if every container started, every probe passed, the pod stayed healthy `--for` that long
//! (default 10 s) and then terminated cleanly within its grace period. A Job's pod must instead
//! complete: its app containers exit 0, then its sidecars stop. Needs root.
//!
//! `kubelet __container <launch.json>` and `kubelet __exec <launch.json>` are the runtime's
//! halves the runner itself starts.

#![forbid(unsafe_code)]

use harness::kubelet::Cluster;
use harness::kubelet::container::{Launch, container_main, exec_main};
use std::time::Duration;

fn read_launch(path: Option<&String>) -> Launch {
    let path = path.unwrap_or_else(|| {
        eprintln!("kubelet: missing the launch file");
        std::process::exit(2)
    });
    let text = std::fs::read(path).unwrap_or_else(|e| {
        eprintln!("kubelet: {path}: {e}");
        std::process::exit(2)
    });
    serde_json::from_slice(&text).unwrap_or_else(|e| {
        eprintln!("kubelet: {path}: {e}");
        std::process::exit(2)
    })
}

fn usage() -> ! {
    eprintln!("usage: kubelet run <spec.yaml> [--for <seconds>] [--config <istiod-lite YAML>]");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("__container") => container_main(&read_launch(args.get(1))),
        Some("__exec") => exec_main(&read_launch(args.get(1))),
        Some("run") => {}
        _ => usage(),
    }
    let Some(spec) = args.get(1) else { usage() };
    let (mut hold, mut config) = (Duration::from_secs(10), String::new());
    let mut it = args[2..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--for" => {
                let v = it
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or_else(|| usage());
                hold = Duration::from_secs_f64(v);
            }
            "--config" => {
                let p = it.next().unwrap_or_else(|| usage());
                config = std::fs::read_to_string(p).unwrap_or_else(|e| {
                    eprintln!("kubelet: {p}: {e}");
                    std::process::exit(2)
                });
            }
            _ => usage(),
        }
    }
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("kubelet: needs root (network namespaces, mounts, other uids)");
        std::process::exit(1);
    }
    let manifest = std::fs::read_to_string(spec)
        .map_err(|e| format!("{spec}: {e}"))
        .and_then(|y| harness::kubelet::spec::PodManifest::parse(&y))
        .unwrap_or_else(|e| {
            println!("FAIL {spec}: {e}");
            std::process::exit(1)
        });
    let mut cluster = Cluster::for_spec(&config, &manifest);
    let code = match harness::kubelet::run_to_end(&mut cluster, std::path::Path::new(spec), hold) {
        Ok(summary) => {
            println!("PASS {spec}: {summary}");
            0
        }
        Err(e) => {
            println!("FAIL {spec}: {e}");
            1
        }
    };
    drop(cluster);
    std::process::exit(code);
}
