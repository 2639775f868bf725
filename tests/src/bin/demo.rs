//! The README's first command: the mesh in a box, step by step.
//!
//! As root: a node namespace runs istiod-lite, two pods get Istio's injection (istio-iptables,
//! then pilot-agent with real Envoy as uid 1337), and the client app calls the server through
//! DNS answered by the agent, both Envoys and mTLS. Without root: a developer's local Envoy
//! (istiod-lite on loopback, `pilot-agent --external-envoy`, `envoy -c` on the bootstrap that
//! `pilot-agent bootstrap` writes). `--keep` leaves everything running until Enter is pressed.

#![forbid(unsafe_code)]

use harness::mesh::{HTTPBIN, HTTPBIN_VIP as VIP, Mesh, pod_in_a_box_config};
use std::time::{Duration, Instant};

const HOST: &str = HTTPBIN;

fn config() -> String {
    pod_in_a_box_config("198.18.2.2")
}

fn step(n: u32, what: &str) {
    println!("\n\x1b[1m[{n}] {what}\x1b[0m");
}

#[expect(
    clippy::too_many_lines,
    reason = "the demo's numbered steps, printed as they run, read in the order they are shown"
)]
fn main() {
    let keep = std::env::args().any(|a| a == "--keep");
    if !nix::unistd::geteuid().is_root() {
        println!(
            "not root: running a local Envoy with a file bootstrap (as root: the pod in a box)"
        );
        std::process::exit(local(keep));
    }
    // Child logs are echoed to stderr; the demo's story goes to stdout.
    let started = Instant::now();

    step(1, "control plane: istiod-lite in the `node` namespace");
    let mut mesh = Mesh::new(&config());
    mesh.start_istiod();
    println!(
        "    config dir {}  (ServiceEntry {HOST} -> VIP {VIP}, WorkloadEntry, STRICT mTLS)",
        mesh.config_dir().display()
    );
    println!(
        "    CA root    {}",
        mesh.ca_dir().join("root-cert.pem").display()
    );

    step(
        2,
        "pods: `client` (sa sleep) and `server` (sa httpbin), joined to the node by veth",
    );
    let mut client = mesh.pod("client", "sleep");
    let mut server = mesh.pod("server", "httpbin");
    mesh.start_app(&mut server, "0.0.0.0:8080", "httpbin-v1");
    println!(
        "    client {}  server {} (app on :8080 as uid 1000)",
        client.ip, server.ip
    );

    step(
        3,
        "injection: istio-iptables (init container), then pilot-agent + Envoy as uid 1337",
    );
    mesh.inject(&mut server);
    mesh.inject(&mut client);
    let quoted: Vec<String> = harness::mesh::INIT_ARGS
        .iter()
        .map(|a| {
            if a.is_empty() || a.contains('*') {
                format!("'{a}'")
            } else {
                a.to_string()
            }
        })
        .collect();
    println!("    istio-iptables {}", quoted.join(" "));
    println!("    pilot-agent {}", harness::mesh::proxy_args().join(" "));
    mesh.wait_ready(&server, Duration::from_secs(60));
    mesh.wait_ready(&client, Duration::from_secs(60));
    println!(
        "    both sidecars ready (/healthz/ready on :15021) after {:?}",
        started.elapsed()
    );

    step(
        4,
        "identity: certificates issued by istiod-lite's CA, served to Envoy over SDS",
    );
    for pod in [&client, &server] {
        let (_, certs) = pod.envoy_admin("/certs").unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&certs).unwrap_or_default();
        let mut seen = std::collections::HashSet::new();
        for c in v["certificates"].as_array().into_iter().flatten() {
            for cc in c["cert_chain"].as_array().into_iter().flatten() {
                let uri = cc["subject_alt_names"][0]["uri"].as_str().unwrap_or("");
                if !seen.insert(cc["serial_number"].to_string()) {
                    continue;
                }
                println!(
                    "    {:<7} {uri}  serial {}  expires {}",
                    pod.name,
                    cc["serial_number"].as_str().unwrap_or("?"),
                    cc["expiration_time"].as_str().unwrap_or("?")
                );
            }
        }
    }

    step(5, "config: every proxy synced (istiod-lite /debug/syncz)");
    let (_, syncz) = mesh.monitoring_get("/debug/syncz").unwrap_or_default();
    let syncz: serde_json::Value = serde_json::from_str(&syncz).unwrap_or_default();
    for p in syncz.as_array().into_iter().flatten() {
        let types: Vec<String> = p["types"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(t, s)| format!("{t}={}", s["status"].as_str().unwrap_or("?")))
            .collect();
        println!(
            "    {}  ({} ADS)  {}",
            p["proxy"].as_str().unwrap_or("?"),
            p["stream"].as_str().unwrap_or("?"),
            types.join(" ")
        );
    }

    step(
        6,
        "DNS: the app's query to the pod's nameserver is captured and answered by the agent from NDS",
    );
    println!("    dig {HOST} -> {}", client.dig(HOST).trim());
    println!(
        "    dig httpbin (search list) -> {}",
        client.dig("httpbin").trim()
    );

    step(
        7,
        "the request: client app (uid 1000) -> 15001 -> Envoy -> mTLS -> Envoy 15006 -> app",
    );
    let (ok, body) = client.curl(&format!("http://{HOST}/"));
    println!(
        "    curl http://{HOST}/ -> {}",
        if ok { "OK" } else { "FAILED" }
    );
    println!("    {}", body.trim().replace('\n', "\n    "));

    step(
        8,
        "STRICT mTLS: a pod without a sidecar sending plaintext to the server is refused",
    );
    let outsider = mesh.pod("outsider", "default");
    let (ok2, out) = outsider.curl(&format!("http://{}:8080/", server.ip));
    println!(
        "    curl http://{}:8080/ -> {}",
        server.ip,
        if ok2 && out.contains("hello") {
            "ACCEPTED (unexpected)"
        } else {
            "refused"
        }
    );

    println!(
        "\nwhere to look: `ip netns` lists the namespaces; in a pod: `ip netns exec <ns> curl localhost:15000/config_dump` (Envoy), `curl localhost:15020/debug/ndsz` (agent DNS table), `iptables-save`."
    );
    if keep {
        println!("running; press Enter to tear everything down");
        let _ = std::io::stdin().read_line(&mut String::new());
    }
    if !ok || (ok2 && out.contains("hello")) {
        std::process::exit(1);
    }
    println!("\ndemo finished in {:?}", started.elapsed());
}

/// The unprivileged demo: istiod-lite, the agent and an Envoy started by hand, on loopback.
#[expect(
    clippy::too_many_lines,
    reason = "the unprivileged demo's steps, printed as they run, read in the order they are shown"
)]
fn local(keep: bool) -> i32 {
    use harness::local::{LocalIstiod, Ports, Unprivileged, agent_env, free_port};
    let started = Instant::now();
    let Some(envoy) = harness::envoy_bin() else {
        return 1;
    };
    step(
        1,
        "control plane: istiod-lite on 127.0.0.1 (every listener on a free port)",
    );
    let yaml = config().replace(
        "  workloadSelector: { labels: { app: httpbin } }\n",
        "  endpoints: [{ address: 198.18.0.5 }]\n",
    );
    let istiod = LocalIstiod::start(&yaml);
    println!(
        "    CA + ADS (TLS) on {}, monitoring on {}",
        istiod.secure, istiod.monitoring
    );

    step(
        2,
        "a scratch directory laid out like the istio-proxy container",
    );
    let scratch = tempfile::Builder::new()
        .prefix("mesh-local-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let dir = scratch.path();
    istiod.provision(dir, "local-sa");
    println!(
        "    {}/var/run/secrets/tokens/istio-token (from `istiod-lite token`)",
        dir.display()
    );
    println!("    {}/var/run/secrets/istio/root-cert.pem", dir.display());
    let user = Unprivileged::new(dir, &envoy);
    let ports = Ports::free();
    let dns_port = free_port();
    let env = |cmd: &mut std::process::Command| {
        agent_env(cmd, istiod.secure, "local-sa", &ports);
        cmd.env("ISTIO_META_DNS_CAPTURE", "true")
            .env("DNS_PROXY_ADDR", format!("127.0.0.1:{dns_port}"));
    };

    step(
        3,
        "`pilot-agent bootstrap` writes Envoy's bootstrap; the agent runs with --external-envoy",
    );
    let mut cmd = user.command("pilot-agent");
    cmd.args(["bootstrap", "sidecar"]).current_dir(dir);
    env(&mut cmd);
    let out = cmd.output().expect("pilot-agent bootstrap");
    if !out.status.success() {
        eprintln!(
            "pilot-agent bootstrap failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return 1;
    }
    let bootstrap = String::from_utf8_lossy(&out.stdout).trim().to_string();
    println!("    bootstrap: {bootstrap}");
    let mut cmd = user.command("pilot-agent");
    cmd.args(["proxy", "sidecar", "--external-envoy"])
        .current_dir(dir);
    env(&mut cmd);
    let agent = harness::Child::spawn("agent", cmd);
    agent.wait_for_line("agent listeners bound", Duration::from_secs(30));
    println!(
        "    agent: SDS and xDS sockets under {}, status :{}, DNS :{dns_port}",
        dir.display(),
        ports.status
    );

    step(4, "you start Envoy: envoy -c <bootstrap>");
    let mut cmd = user.command("envoy");
    cmd.arg("-c")
        .arg(&bootstrap)
        .args([
            "--disable-hot-restart",
            "--log-level",
            "warning",
            "--concurrency",
            "1",
        ])
        .current_dir(dir);
    let _envoy = harness::Child::spawn("envoy", cmd);
    let admin: std::net::SocketAddr = format!("127.0.0.1:{}", ports.admin).parse().expect("addr");
    let want = "spiffe://cluster.local/ns/demo/sa/local-sa";
    let certs = harness::assert_eventually(Duration::from_secs(30), || {
        let (status, certs) = harness::http_get(admin, "/certs")?;
        if status == 200 && certs.contains(want) {
            Ok(certs)
        } else {
            Err(certs)
        }
    });
    let v: serde_json::Value = serde_json::from_str(&certs).unwrap_or_default();
    let leaf = &v["certificates"][0]["cert_chain"][0];
    println!(
        "    certificate over SDS: {}  serial {}  expires {}",
        leaf["subject_alt_names"][0]["uri"].as_str().unwrap_or(want),
        leaf["serial_number"].as_str().unwrap_or("?"),
        leaf["expiration_time"].as_str().unwrap_or("?")
    );
    let dump = harness::assert_eventually(Duration::from_secs(30), || {
        let (_, body) = harness::http_get(admin, "/config_dump")?;
        if body.contains(&format!("outbound|80||{HOST}")) {
            Ok(body)
        } else {
            Err("no config yet".into())
        }
    });
    let v: serde_json::Value = serde_json::from_str(&dump).unwrap_or_default();
    for c in v["configs"].as_array().into_iter().flatten() {
        for l in c["dynamic_listeners"].as_array().into_iter().flatten() {
            println!(
                "    listener over xDS: {}",
                l["name"].as_str().unwrap_or("?")
            );
        }
        for cl in c["dynamic_active_clusters"]
            .as_array()
            .into_iter()
            .flatten()
        {
            println!(
                "    cluster over xDS:  {}",
                cl["cluster"]["name"].as_str().unwrap_or("?")
            );
        }
    }

    step(
        5,
        "DNS: the agent answers mesh names from the name table istiod-lite pushes (NDS)",
    );
    let answer = harness::assert_eventually(Duration::from_secs(15), || {
        let out = std::process::Command::new("dig")
            .args([
                "+short",
                "+time=1",
                "+tries=1",
                "-p",
                &dns_port.to_string(),
                "@127.0.0.1",
                HOST,
            ])
            .output()
            .map_err(|e| format!("dig: {e}"))?;
        let a = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if a == VIP {
            Ok(a)
        } else {
            Err(format!("dig: {a:?}"))
        }
    });
    println!("    dig @127.0.0.1 -p {dns_port} {HOST} -> {answer}");

    println!(
        "\nwhere to look: Envoy admin http://{admin}/ (config_dump, certs), agent http://127.0.0.1:{}/debug/ndsz, istiod-lite http://{}/debug/syncz",
        ports.status, istiod.monitoring
    );
    if keep {
        println!("running; press Enter to tear everything down");
        let _ = std::io::stdin().read_line(&mut String::new());
    }
    println!("\ndemo finished in {:?}", started.elapsed());
    0
}
