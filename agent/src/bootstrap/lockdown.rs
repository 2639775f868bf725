//! `PROXY_LIFECYCLE_LOCKDOWN`: Envoy's admin API listens on a Unix socket in the proxy's
//! directory instead of localhost TCP, so no other process in the pod can reach it (it stops
//! Envoy, and `/config_dump` lists the secrets' metadata). The socket's mode is 0600: only
//! Envoy's uid (and root) may connect. The `prometheus_stats` cluster, behind Envoy's 15090
//! listener, follows it there.
//!
//! Applied to the rendered bootstrap, built-in or from a template alike; without lockdown the
//! bootstrap is left byte for byte as it was.

use serde_json::{Value, json};

/// The admin socket's mode: read and write for its owner only.
pub const MODE: u32 = 0o600;

/// The pipe address Envoy binds (`path` is relative to Envoy's working directory).
fn pipe(path: &str) -> Value {
    json!({ "pipe": { "path": path, "mode": MODE } })
}

/// Moves `admin.address` to the pipe at `path` and points `prometheus_stats` at it.
pub fn apply(bootstrap: &mut Value, path: &str) -> Result<(), &'static str> {
    let admin = bootstrap
        .get_mut("admin")
        .and_then(Value::as_object_mut)
        .ok_or("the bootstrap has no admin section")?;
    admin.insert("address".into(), pipe(path));
    let clusters = bootstrap
        .pointer_mut("/static_resources/clusters")
        .and_then(Value::as_array_mut);
    for c in clusters.into_iter().flatten() {
        if c.get("name").and_then(Value::as_str) != Some("prometheus_stats") {
            continue;
        }
        let endpoints = c
            .pointer_mut("/load_assignment/endpoints")
            .and_then(Value::as_array_mut);
        for e in endpoints.into_iter().flatten() {
            let lbs = e.get_mut("lb_endpoints").and_then(Value::as_array_mut);
            for lb in lbs.into_iter().flatten() {
                if let Some(ep) = lb.get_mut("endpoint").and_then(Value::as_object_mut) {
                    ep.insert("address".into(), pipe(path));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_and_prometheus_stats_move_to_the_pipe() {
        let mut b = json!({
            "admin": { "profile_path": "/p", "address": { "socket_address": { "address": "127.0.0.1", "port_value": 15000 } } },
            "static_resources": { "clusters": [
                { "name": "prometheus_stats", "load_assignment": { "cluster_name": "prometheus_stats", "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": 15000 } } } }] }] } },
                { "name": "agent", "load_assignment": { "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": { "socket_address": { "port_value": 15020 } } } }] }] } }
            ] }
        });
        apply(&mut b, "./etc/istio/proxy/admin.sock").unwrap();
        let want = json!({ "pipe": { "path": "./etc/istio/proxy/admin.sock", "mode": 384 } });
        assert_eq!(b["admin"]["address"], want);
        assert_eq!(b["admin"]["profile_path"], "/p");
        let c = &b["static_resources"]["clusters"];
        assert_eq!(
            c[0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"],
            want
        );
        assert_eq!(
            c[1]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
                ["port_value"],
            15020
        );
    }

    #[test]
    fn a_bootstrap_without_admin_is_an_error() {
        assert!(apply(&mut json!({}), "x").is_err());
    }
}
