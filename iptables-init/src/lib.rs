//! istio-iptables: programs a pod's traffic redirection with Istio's flags and rule sets.
//!
//! Entry points: [`run_cli`] (the binary and `pilot-agent istio-iptables` call it with the
//! process arguments and environment) and [`run_cli_with`] (same, with injected
//! [`HostInputs`]). The modules are private; feature `fuzzing` adds `fuzzing`, the fuzz
//! target's entry point.

// unsafe only where a module allows it: the netlink dumps (netlink.rs).
#![deny(unsafe_code)]

mod apply;
mod builder;
mod capture;
mod config;
mod dryrun;
#[cfg(test)]
mod floors;
mod netlink;
mod nft;
mod validation;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;

use config::Config;
pub use config::HostInputs;

/// Entry point of the fuzz target (`fuzz/fuzz_targets/iptables_flags.rs`); not part of the
/// stable API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use std::collections::HashMap;
    use std::ffi::OsString;

    use crate::config::{self, HostInputs, Parsed};

    /// A command line and environment through parsing, host detection, the rule set and the
    /// dry-run stream (what `--dry-run` prints); nothing is applied.
    pub fn fuzz_flags(args: Vec<OsString>, env: &HashMap<String, String>, host: &HostInputs) {
        if let Ok(Parsed::Run(mut cfg)) = config::parse(args, env, host)
            && cfg.detect_host(host).is_ok()
        {
            let rules = crate::capture::build(&cfg);
            let _ = crate::dryrun::stream(&cfg, &rules);
        }
    }
}

/// Runs `istio-iptables` with `args` (without the program name) and `env`, on the running
/// host. Returns the process exit status: 0 on success, 255 when the command line does not
/// parse (as Istio's `pilot-agent`), 1 on any other error (nothing applied when the input is
/// invalid), 126 when `--run-validation` fails.
pub fn run_cli<I: IntoIterator<Item = OsString>>(args: I, env: &HashMap<String, String>) -> i32 {
    run_cli_with(args, env, &HostInputs::system())
}

/// [`run_cli`] with injected host state (addresses, resolv.conf, user database).
pub fn run_cli_with<I: IntoIterator<Item = OsString>>(
    args: I,
    env: &HashMap<String, String>,
    host: &HostInputs,
) -> i32 {
    let mut cfg = match config::parse(args, env, host) {
        Ok(config::Parsed::Help) => {
            print!("{}", config::usage());
            return 0;
        }
        Ok(config::Parsed::Run(cfg)) => cfg,
        Err(e) => {
            eprintln!("error: {e}");
            return e.exit_code();
        }
    };
    init_logging(&cfg);
    if !cfg.positional.is_empty() {
        tracing::debug!(args = ?cfg.positional, "ignoring positional arguments, as Istio's istio-iptables does");
    }
    if !cfg.network_namespace.is_empty() && !cfg.dry_run {
        // Enter the namespace on a dedicated thread; children spawned from it inherit it and
        // the caller's threads are left alone.
        let ns = cfg.network_namespace.clone();
        return std::thread::scope(|s| {
            s.spawn(move || match enter_netns(&ns) {
                Ok(()) => run_config(&mut cfg, host, env),
                Err(e) => {
                    tracing::error!("failed to enter network namespace {ns}: {e}");
                    1
                }
            })
            .join()
            .unwrap_or(1)
        });
    }
    run_config(&mut cfg, host, env)
}

/// Why the network namespace cannot be entered.
#[derive(Debug, thiserror::Error)]
enum NetnsError {
    #[error(transparent)]
    Open(#[from] std::io::Error),
    #[error(transparent)]
    Setns(#[from] nix::Error),
}

fn enter_netns(path: &str) -> Result<(), NetnsError> {
    let f = std::fs::File::open(path)?;
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)?;
    Ok(())
}

fn run_config(cfg: &mut Config, host: &HostInputs, env: &HashMap<String, String>) -> i32 {
    if let Err(e) = cfg.detect_host(host) {
        tracing::error!("{e}");
        return 1;
    }
    tracing::info!(config = ?cfg, "istio-iptables configuration");
    let backend = if cfg.native_nftables {
        "nftables"
    } else {
        "iptables"
    };
    if cfg.skip_rule_apply {
        tracing::info!("--skip-rule-apply: not touching {backend}");
    } else {
        let exec_env = apply::ExecEnv {
            path: env.get("PATH").cloned(),
            xtables_lockfile: (cfg.cni_mode && !cfg.network_namespace.is_empty())
                .then(|| cfg.network_namespace.clone()),
        };
        let result = if cfg.native_nftables {
            run_nftables(cfg, &exec_env, host)
        } else {
            run_iptables(cfg, &exec_env)
        };
        if let Err(code) = result {
            return code;
        }
    }
    if cfg.run_validation
        && let Err(e) = validation::run(cfg)
    {
        tracing::error!(
            "{backend} validation failed; workload is not ready for Istio: {e}. When using Istio CNI, this can occur if a pod is scheduled before the node is ready."
        );
        return validation::VALIDATION_ERROR_CODE;
    }
    0
}

/// `--dry-run`: writes `text` to `DRY_RUN_FILE_PATH` (when set) and stdout.
fn write_dry_run(cfg: &Config, text: &str) -> Result<(), i32> {
    tracing::info!("running in dry-run mode, no rule changes will be made");
    if let Some(path) = &cfg.dry_run_file_path
        && let Err(e) = std::fs::write(path, text)
    {
        tracing::error!(
            "unable to write dry run output file {}: {e}",
            path.display()
        );
        return Err(1);
    }
    print!("{text}");
    std::io::stdout().flush().map_err(|_| 1)
}

fn run_iptables(cfg: &Config, exec_env: &apply::ExecEnv) -> Result<(), i32> {
    let rules = capture::build(cfg);
    if cfg.dry_run {
        return write_dry_run(cfg, &dryrun::stream(cfg, &rules));
    }
    if let Err(e) = apply::run(cfg, &rules, exec_env) {
        tracing::error!("{e}");
        return Err(1);
    }
    // Did an earlier --native-nftables run leave its tables? (Read over netlink: no process.)
    if nft::istio_tables_present() {
        if let Err(e) = nft::apply::remove_tables() {
            tracing::error!(
                "removing the nftables tables of an earlier --native-nftables run: {e}"
            );
            return Err(1);
        }
        tracing::info!("removed the nftables tables of an earlier --native-nftables run");
        if !apply::tproxy_routes_wanted(cfg) {
            // That run may have been in TPROXY mode; these rules do not mark.
            apply::cleanup_routes(cfg);
        }
    }
    Ok(())
}

fn run_nftables(cfg: &Config, exec_env: &apply::ExecEnv, host: &HostInputs) -> Result<(), i32> {
    let rules = nft::build(cfg);
    if cfg.dry_run {
        return write_dry_run(cfg, &nft::dry_run_script(cfg, &rules));
    }
    nft::run(cfg, &rules, exec_env, host).map_err(|e| {
        tracing::error!("{e}");
        1
    })
}

/// Maps Istio's `--log_output_level` (`default:debug`, `all:warn`, `info`) onto a tracing
/// filter; lines in Istio's layout (`<time>\t<level>\t<message>`, or `--log_as_json`), the
/// agent's own (`go_syntax::istio_log`), every event in Istio's `default` scope as Istio's
/// `istio-iptables` logs them. Logs go to `--log_target`, by default stderr so stdout carries
/// only the dry-run stream.
fn init_logging(cfg: &Config) {
    let level = cfg
        .log_output_level
        .split(',')
        .filter_map(|part| match part.split_once(':') {
            Some(("default" | "all", l)) => Some(l),
            Some(_) => None,
            None => Some(part),
        })
        .next_back()
        .filter(|l| !l.is_empty())
        .unwrap_or("info");
    let level = match level {
        "none" => "off",
        "warning" => "warn",
        "fatal" => "error",
        other => other,
    };
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A host process (pilot-agent) may already have a subscriber; keep it.
    let target = match cfg.log_target.as_str() {
        "" => "stderr",
        t => t,
    };
    let _ = tracing_subscriber::fmt()
        .with_writer(go_syntax::istio_log::writer(target))
        .with_ansi(false)
        .with_env_filter(filter)
        .event_format(go_syntax::istio_log::IstioFormat::default_scope(
            cfg.log_as_json,
        ))
        .try_init();
}
