//! istio-iptables' command line and environment (Istio's flags, env twins, host detection)
//! through to the rule set and the dry-run stream: bad input is an error, never a panic.
//!
//! Input: NUL-separated items; items up to the first empty one are arguments, the rest are
//! `KEY=VALUE` environment entries.
#![no_main]

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::OnceLock;

use iptables_init::HostInputs;

/// Injected host state: both address families, a resolv.conf with both families' nameservers,
/// a fixed user and group database (no system lookups while fuzzing).
fn host() -> &'static HostInputs {
    static HOST: OnceLock<HostInputs> = OnceLock::new();
    HOST.get_or_init(|| {
        let resolv: PathBuf = std::env::temp_dir().join(format!(
            "iptables-flags-fuzz-resolv-{}.conf",
            std::process::id()
        ));
        std::fs::write(
            &resolv,
            "nameserver 198.18.0.53\nnameserver fd00::53\nsearch svc.cluster.local\n",
        )
        .expect("write resolv.conf");
        let addrs: Vec<IpAddr> = ["198.18.0.240", "fd00::240"]
            .iter()
            .filter_map(|a| a.parse().ok())
            .collect();
        HostInputs {
            addresses: Some(addrs),
            resolv_conf: resolv,
            users: Some(HashMap::from([("istio-proxy".to_string(), 1337)])),
            groups: Some(HashMap::from([("istio-proxy".to_string(), 1337)])),
        }
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut items = text.split('\0');
    let args: Vec<OsString> = items
        .by_ref()
        .take_while(|s| !s.is_empty())
        .take(64)
        .map(OsString::from)
        .collect();
    let env: HashMap<String, String> = items
        .take(32)
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    iptables_init::fuzzing::fuzz_flags(args, &env, host());
});
