//! `istio-iptables`: Istio's init binary; all logic lives in the library.

#![forbid(unsafe_code)]

#[allow(clippy::disallowed_methods)] // main reads the environment once and passes a map down
fn main() {
    let env: std::collections::HashMap<String, String> = std::env::vars().collect();
    let code = iptables_init::run_cli(std::env::args_os().skip(1), &env);
    std::process::exit(code);
}
