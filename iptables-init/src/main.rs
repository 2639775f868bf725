//! `istio-iptables`: Istio's init binary; all logic lives in the library.

fn main() {
    let env: std::collections::HashMap<String, String> = std::env::vars().collect();
    let code = iptables_init::run_cli(std::env::args_os().skip(1), &env);
    std::process::exit(code);
}
