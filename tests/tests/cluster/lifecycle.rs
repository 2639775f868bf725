//! Lifecycle on the real cluster, with a steady client calling through the sidecars meanwhile:
//! a pod deleted, a rollout restart, istiod's pod replaced, a certificate rotated in place.
//! Each runs for both proxy images; a failed request with our agent fails the test.

use std::process::Child;
use std::time::{Duration, Instant};

use harness::assert_eventually_result;
use harness::cluster::{Agent, Cluster};

use crate::scenario::Scenario;

/// Requests the steady client sends (at 10 per second) while a change happens.
const STEADY_REQUESTS: u32 = 60;

/// The echo client calling the Service at 10 q/s, `count` requests, started now.
fn steady_client(s: &Scenario, count: u32) -> (Child, u32) {
    // The client's --timeout bounds the whole set of requests, not each one.
    let child = s.spawn_call(&[
        "http://echo/",
        "--count",
        &count.to_string(),
        "--qps",
        "10",
        "--timeout",
        &format!("{}s", count / 10 + 20),
    ]);
    (child, count)
}

/// Waits for the steady client and fails unless every request was answered with 200.
fn no_failed_request((client, count): (Child, u32)) -> Result<(), String> {
    let out = client
        .wait_with_output()
        .map_err(|e| format!("steady client: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let ok = text
        .lines()
        .filter(|l| l.ends_with("StatusCode=200"))
        .count();
    if ok == count as usize {
        Ok(())
    } else {
        Err(format!(
            "{ok} of {count} requests answered with 200 ({}):\n{}",
            out.status,
            format!("{}{}", text, String::from_utf8_lossy(&out.stderr))
                .lines()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
                .join("\n")
        ))
    }
}

fn both(check: fn(&Cluster, &Scenario) -> Result<(), String>) {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    for agent in [Agent::Ours, Agent::Istio] {
        let s = Scenario::deploy(&cluster, agent);
        if let Err(e) = check(&cluster, &s) {
            s.dump_logs();
            panic!("with {agent:?}: {e}");
        }
        eprintln!("cluster [{}] passed", agent.word());
    }
}

/// `kubectl delete pod` of one echo pod: it drains and is gone within its grace period, and
/// the steady client sees no failed request.
#[test]
fn pod_deleted_under_load() {
    both(|c, s| {
        let client = steady_client(s, STEADY_REQUESTS);
        std::thread::sleep(Duration::from_secs(1));
        let pod = s.pod_of("app=echo,version=v1")?;
        let t0 = Instant::now();
        c.kubectl(&["delete", "pod", "-n", s.ns(), &pod, "--timeout=60s"])?;
        let gone = t0.elapsed();
        eprintln!(
            "FIGURE cluster pod deletion ({}): gone after {gone:?}",
            s.agent_word()
        );
        if gone > Duration::from_secs(30) {
            return Err(format!(
                "{pod} took {gone:?}, longer than its 30 s grace period"
            ));
        }
        no_failed_request(client)?;
        c.wait_available(s.ns(), Duration::from_secs(120))
            .map(|_| ())
    });
}

/// `kubectl rollout restart` of both echo versions with the steady client running.
#[test]
fn rollout_restart_under_load() {
    both(|c, s| {
        let client = steady_client(s, STEADY_REQUESTS);
        std::thread::sleep(Duration::from_secs(1));
        c.kubectl(&[
            "rollout",
            "restart",
            "-n",
            s.ns(),
            "deployment/echo-v1",
            "deployment/echo-v2",
        ])?;
        c.kubectl(&[
            "rollout",
            "status",
            "-n",
            s.ns(),
            "deployment/echo-v1",
            "--timeout=120s",
        ])?;
        c.kubectl(&[
            "rollout",
            "status",
            "-n",
            s.ns(),
            "deployment/echo-v2",
            "--timeout=120s",
        ])?;
        no_failed_request(client)
    });
}

/// istiod's pod deleted and replaced by its Deployment: no failed request meanwhile, and every
/// proxy SYNCED with the new istiod.
#[test]
fn istiod_replaced() {
    both(|c, s| {
        let client = steady_client(s, STEADY_REQUESTS);
        let old = c.pods("istio-system", "app=istiod")?;
        c.kubectl(&[
            "delete",
            "pod",
            "-n",
            "istio-system",
            "-l",
            "app=istiod",
            "--wait=false",
        ])?;
        let t0 = Instant::now();
        assert_eventually_result(Duration::from_secs(120), || {
            let now = c.pods("istio-system", "app=istiod")?;
            if now.iter().any(|p| old.contains(p)) || now.is_empty() {
                return Err(format!("istiod pods {now:?} (old {old:?})"));
            }
            c.kubectl(&[
                "wait",
                "-n",
                "istio-system",
                "--for=condition=Ready",
                "pod",
                "-l",
                "app=istiod",
                "--timeout=1s",
            ])?;
            s.all_synced_with(&now[0])
        })?;
        eprintln!(
            "FIGURE cluster istiod replaced ({}): every proxy SYNCED with the new istiod {:?} after the delete",
            s.agent_word(),
            t0.elapsed()
        );
        no_failed_request(client)
    });
}

/// The client's certificate (SECRET_TTL of 40 s in echo.yaml's client) is replaced in Envoy
/// before it expires, with no failed request.
#[test]
fn certificate_rotated_in_place() {
    both(|_, s| {
        let first = s.client_cert_serial()?;
        // 40 s of requests: the rotation (at half the 40 s lifetime) falls inside them.
        let client = steady_client(s, 400);
        let rotated = assert_eventually_result(Duration::from_secs(60), || {
            let now = s.client_cert_serial()?;
            (now != first)
                .then_some(now)
                .ok_or(format!("serial still {first}"))
        })?;
        eprintln!(
            "cluster [{}] certificate {first} -> {rotated}",
            s.agent_word()
        );
        no_failed_request(client)
    });
}
