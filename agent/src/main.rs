//! `pilot-agent`: Istio's sidecar agent.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::ffi::OsString;

use agent::{Command, LogFlags, Shutdown, USAGE_ERROR_CODE};

/// Logging from `--log_output_level` (Istio's scopes, `agent::log_filter`) unless `RUST_LOG`
/// is set, in Istio's line layout (`agent::istio_format`). A level Istio refuses stops `proxy`,
/// as Istio's agent (whose other commands do not read the flag; here they log at `info`).
#[allow(clippy::disallowed_methods)] // RUST_LOG, as tracing's EnvFilter reads it, before the rest
fn init_logging(log: &LogFlags, proxy: bool) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(f) => f,
        Err(_) => match agent::log_filter(&log.output_level) {
            Ok(f) => f,
            Err(e) if proxy => {
                eprintln!("Error: --log_output_level: {e}");
                std::process::exit(USAGE_ERROR_CODE);
            }
            Err(_) => "info".to_string(),
        },
    };
    // `--log_target`: the first target (Istio's default for `proxy` is stdout).
    let target =
        log.target
            .first()
            .map(String::as_str)
            .unwrap_or(if proxy { "stdout" } else { "stderr" });
    let writer = go_syntax::istio_log::writer(target);
    // Istio's line layout, text or `--log_as_json`; never coloured.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(writer)
        .with_ansi(false)
        .event_format(agent::istio_format(log.as_json))
        .init();
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(agent::build_runtime()?)
}

/// SIGTERM and SIGINT, caught from before the configuration is read: a signal during startup
/// shuts the agent down cleanly (exit 0, Envoy never started or stopped) instead of killing it.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers; needs the runtime entered.
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Triggers `shutdown` on the first signal.
    fn watch(mut self, shutdown: Shutdown) {
        tokio::spawn(async move {
            tokio::select! {
                _ = self.term.recv() => tracing::info!("received SIGTERM, shutting down"),
                _ = self.int.recv() => tracing::info!("received SIGINT, shutting down"),
            }
            shutdown.trigger();
        });
    }
}

async fn run_proxy(config: agent::Config, signals: Signals) -> anyhow::Result<i32> {
    let shutdown = Shutdown::default();
    signals.watch(shutdown.clone());
    agent::proxy(config, shutdown).await
}

#[allow(clippy::disallowed_methods)] // main reads the environment once and passes a map down
fn main() {
    agent::tune_malloc();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let env: HashMap<String, String> = std::env::vars().collect();
    let cli = match agent::parse_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("Error: {e}");
            std::process::exit(USAGE_ERROR_CODE);
        }
    };
    if !matches!(cli.command, Command::Iptables(_)) {
        init_logging(&cli.log, matches!(cli.command, Command::Proxy { .. }));
    }
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let code = match run(cli.command, &env) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

fn run(command: Command, env: &HashMap<String, String>) -> anyhow::Result<i32> {
    let base_dir = std::env::current_dir()?;
    match command {
        Command::Help => {
            println!(
                "pilot-agent: Istio sidecar agent\n\nUsage: pilot-agent <command>\n\nCommands:\n  proxy [sidecar|router]  run the agent and Envoy\n  bootstrap [sidecar|router] [--output FILE]  write Envoy's bootstrap for --external-envoy\n  wait                    wait until Envoy is ready\n  request <method> <path> [<body>]  call a local debug port\n  version                 print the version\n  istio-iptables          program traffic capture\n  completion <shell>      a completion script for bash, zsh, fish or powershell"
            );
            Ok(0)
        }
        Command::Completion(Some(shell)) => {
            print!("{}", agent::completion_script(shell));
            Ok(0)
        }
        Command::Completion(None) => {
            println!(
                "Generate the autocompletion script for pilot-agent for the specified shell.\n\nUsage:\n  pilot-agent completion [bash|zsh|fish|powershell]"
            );
            Ok(0)
        }
        Command::Version { short, output } => {
            print!("{}", agent::version_text(short, &output)?);
            Ok(0)
        }
        Command::Iptables(args) => Ok(iptables_init::run_cli(
            args.into_iter().map(OsString::from),
            env,
        )),
        Command::Wait(w) => {
            let rt = runtime()?;
            match rt.block_on(agent::wait(&w)) {
                Ok(()) => {
                    tracing::info!("Envoy is ready");
                    Ok(0)
                }
                Err(e) => {
                    eprintln!("Error: {e}");
                    Ok(1)
                }
            }
        }
        Command::Request(r) => {
            let rt = runtime()?;
            match rt.block_on(agent::request(&r)) {
                Ok(body) => {
                    print!("{body}");
                    Ok(0)
                }
                Err(e) => {
                    eprintln!("Error: {e}");
                    Ok(1)
                }
            }
        }
        Command::Bootstrap {
            node_type,
            flags,
            output,
        } => bootstrap(node_type, flags, output, env, base_dir),
        Command::Proxy { node_type, flags } => proxy(node_type, flags, env, base_dir),
    }
}

/// `pilot-agent bootstrap`: writes Envoy's bootstrap for an externally run Envoy.
fn bootstrap(
    node_type: agent::NodeType,
    flags: agent::ProxyFlags,
    output: Option<String>,
    env: &HashMap<String, String>,
    base_dir: std::path::PathBuf,
) -> anyhow::Result<i32> {
    let config = agent::load_config(node_type, flags, env, base_dir)?;
    let out = output.map(|o| config.path(&o));
    let rt = runtime()?;
    let platform = rt.block_on(agent::discover_platform(&config));
    // A DNS lookup still running must not hold the exit.
    rt.shutdown_background();
    let written = agent::write_bootstrap(&config, &platform, out.as_deref())?;
    println!("{}", written.display());
    Ok(0)
}

/// `pilot-agent proxy`: runs the agent and Envoy until shutdown.
fn proxy(
    node_type: agent::NodeType,
    flags: agent::ProxyFlags,
    env: &HashMap<String, String>,
    base_dir: std::path::PathBuf,
) -> anyhow::Result<i32> {
    let rt = runtime()?;
    let signals = {
        let _entered = rt.enter();
        Signals::install()?
    };
    // After the handlers: from its first log line on, the agent handles SIGTERM.
    agent::raise_open_file_limit();
    let config = agent::load_config(node_type, flags, env, base_dir)?;
    let code = rt.block_on(run_proxy(config, signals));
    // A blocking task (a DNS lookup, a file read) must not hold the exit.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}
