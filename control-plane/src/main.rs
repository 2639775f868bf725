//! `istiod-lite`: serve (CA + ADS + monitoring), replay (a recorded config dump), token,
//! vm-bundle.
//!
//! Every flag can also come from the environment as `ISTIOD_LITE_<FLAG>` (upper case, `-` → `_`).
//! `serve` logs (to stderr) one line per listener once it is bound, in this exact form:
//! `listening name=<grpc|secure-grpc|monitoring> addr=<ip:port>`; so does `replay`.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::builder::TypedValueParser;
use clap::{Args, Parser, Subcommand};
use control_plane::{BundleInputs, GRPC_CAPS, Running, ServerSettings, Settings, TokenIssuer};
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(
    name = "istiod-lite",
    version,
    about = "A minimal Istio CA and ADS server"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The flags `serve` and `replay` share: the CA directory, the listeners, the serving
/// certificate's names and the token clock skew.
#[derive(Args, Debug)]
struct ServerArgs {
    #[arg(long, env = "ISTIOD_LITE_CA_DIR")]
    ca_dir: PathBuf,
    #[arg(
        long,
        env = "ISTIOD_LITE_TRUST_DOMAIN",
        default_value = "cluster.local"
    )]
    trust_domain: String,
    #[arg(long, env = "ISTIOD_LITE_GRPC_ADDR", default_value = "127.0.0.1:15010")]
    grpc_addr: SocketAddr,
    #[arg(
        long,
        env = "ISTIOD_LITE_SECURE_GRPC_ADDR",
        default_value = "127.0.0.1:15012"
    )]
    secure_grpc_addr: SocketAddr,
    #[arg(
        long,
        env = "ISTIOD_LITE_MONITORING_ADDR",
        default_value = "127.0.0.1:15014"
    )]
    monitoring_addr: SocketAddr,
    /// Extra DNS names for the secure port's serving certificate (repeatable; env: comma list).
    #[arg(long = "san", env = "ISTIOD_LITE_SAN", value_delimiter = ',')]
    sans: Vec<String>,
    /// Clock skew between hosts allowed on a token's `exp` and `nbf` (whole seconds count).
    #[arg(long, env = "ISTIOD_LITE_TOKEN_CLOCK_SKEW", default_value = "60s", value_parser = go_syntax::parse_duration)]
    token_clock_skew: Duration,
    /// Connections the two gRPC ports hold at once, together (lowered to fit the open-file
    /// limit).
    #[arg(long, env = "ISTIOD_LITE_MAX_CONNECTIONS", default_value_t = GRPC_CAPS.total,
        value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    max_connections: usize,
    /// Connections the two gRPC ports hold at once from one IP address (raise it when a remote
    /// cluster's proxies come through one east-west gateway).
    #[arg(long, env = "ISTIOD_LITE_MAX_CONNECTIONS_PER_IP", default_value_t = GRPC_CAPS.per_peer,
        value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    max_connections_per_ip: usize,
}

impl From<ServerArgs> for ServerSettings {
    fn from(a: ServerArgs) -> Self {
        ServerSettings {
            ca_dir: a.ca_dir,
            trust_domain: a.trust_domain,
            grpc_addr: a.grpc_addr,
            secure_grpc_addr: a.secure_grpc_addr,
            monitoring_addr: a.monitoring_addr,
            sans: a.sans,
            token_clock_skew: a.token_clock_skew,
            conn_caps: proto::listen::Caps {
                total: a.max_connections,
                per_peer: a.max_connections_per_ip,
            },
        }
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve ADS on the plaintext gRPC port, CA and ADS on the TLS gRPC port, plus monitoring.
    Serve {
        #[arg(long, env = "ISTIOD_LITE_CONFIG_DIR")]
        config_dir: PathBuf,
        /// MeshConfig YAML (rootNamespace, trustDomain, outboundTrafficPolicy.mode).
        #[arg(long, env = "ISTIOD_LITE_MESH")]
        mesh: Option<PathBuf>,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Serve the dynamic resources of a recorded Envoy config dump (`/config_dump`, or
    /// `istioctl proxy-config all -o json|yaml`) over ADS to every proxy, with the CA.
    Replay {
        /// The dump (JSON or YAML).
        #[arg(long, env = "ISTIOD_LITE_CONFIG_DUMP")]
        config_dump: PathBuf,
        /// Remove the extensions only Istio's Envoy build implements (each removal is logged),
        /// so that upstream Envoy accepts the rest.
        #[arg(long, env = "ISTIOD_LITE_STRIP_ISTIO_EXTENSIONS")]
        strip_istio_extensions: bool,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Print a service-account token (JWT) that the CA accepts.
    Token {
        #[arg(long, env = "ISTIOD_LITE_CA_DIR")]
        ca_dir: PathBuf,
        #[arg(long, env = "ISTIOD_LITE_NAMESPACE")]
        namespace: String,
        #[arg(long, env = "ISTIOD_LITE_SERVICE_ACCOUNT")]
        service_account: String,
        #[arg(long, env = "ISTIOD_LITE_AUDIENCE", default_value = "istio-ca")]
        audience: String,
        #[arg(long, env = "ISTIOD_LITE_TTL", default_value = "12h", value_parser = go_syntax::parse_duration)]
        ttl: Duration,
    },
    /// Write the VM onboarding files (cluster.env, mesh.yaml, hosts, root-cert.pem, istio-token).
    VmBundle {
        #[arg(long, env = "ISTIOD_LITE_CA_DIR")]
        ca_dir: PathBuf,
        #[arg(long, env = "ISTIOD_LITE_NAMESPACE")]
        namespace: String,
        #[arg(long, env = "ISTIOD_LITE_SERVICE_ACCOUNT")]
        service_account: String,
        #[arg(long, env = "ISTIOD_LITE_NAME")]
        name: String,
        #[arg(long, env = "ISTIOD_LITE_DISCOVERY_ADDRESS")]
        discovery_address: String,
        #[arg(long, env = "ISTIOD_LITE_OUTPUT")]
        output: PathBuf,
        #[arg(long, env = "ISTIOD_LITE_CLUSTER_ID", default_value = "Kubernetes")]
        cluster_id: String,
        #[arg(
            long,
            env = "ISTIOD_LITE_TRUST_DOMAIN",
            default_value = "cluster.local"
        )]
        trust_domain: String,
        /// Lifetime of the token written (istioctl's `--tokenDuration`, 1h by default).
        #[arg(long, env = "ISTIOD_LITE_TOKEN_DURATION", default_value = "1h", value_parser = go_syntax::parse_duration)]
        token_duration: Duration,
    },
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

async fn shutdown_signal(cancel: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot install signal handlers; stop with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
    cancel.cancel();
}

/// Logs the bound listeners, then serves until SIGTERM/SIGINT, or until a component stops on
/// its own (an error: the exit status is non-zero).
async fn run(running: Running, cancel: CancellationToken) -> anyhow::Result<()> {
    tracing::info!("listening name=grpc addr={}", running.grpc_addr);
    tracing::info!(
        "listening name=secure-grpc addr={}",
        running.secure_grpc_addr
    );
    tracing::info!("listening name=monitoring addr={}", running.monitoring_addr);
    tokio::spawn(shutdown_signal(cancel));
    Ok(running.wait().await?)
}

/// The settings tree, logged once at start (also served on `/debug/config_dump`).
fn log_settings(settings: &Settings) {
    tracing::info!(config = %settings.dump(), "istiod-lite configuration");
}

/// `serve`: the xDS and CA servers of a config directory, until shutdown.
async fn serve(settings: Settings) -> anyhow::Result<()> {
    log_settings(&settings);
    let cancel = CancellationToken::new();
    let running = control_plane::serve(settings, cancel.clone()).await?;
    run(running, cancel).await
}

/// `replay`: a recorded config dump served as it is, until shutdown.
async fn serve_replay(settings: Settings) -> anyhow::Result<()> {
    log_settings(&settings);
    let cancel = CancellationToken::new();
    let running = control_plane::serve_replay(settings, cancel.clone()).await?;
    run(running, cancel).await
}

#[tokio::main]
#[allow(clippy::disallowed_methods)] // main reads the environment once and passes a map down
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve {
            config_dir,
            mesh,
            server,
        } => {
            init_logging();
            let env: HashMap<String, String> = std::env::vars().collect();
            let settings = Settings::serve(config_dir, mesh, server.into(), &env)
                .context("istiod-lite serve")?;
            serve(settings).await.context("istiod-lite serve")
        }
        Command::Replay {
            config_dump,
            strip_istio_extensions,
            server,
        } => {
            init_logging();
            let env: HashMap<String, String> = std::env::vars().collect();
            let settings =
                Settings::replay(config_dump, strip_istio_extensions, server.into(), &env)
                    .context("istiod-lite replay")?;
            serve_replay(settings).await.context("istiod-lite replay")
        }
        Command::Token {
            ca_dir,
            namespace,
            service_account,
            audience,
            ttl,
        } => {
            let issuer = TokenIssuer::load_or_create(&ca_dir).context("loading the issuer key")?;
            println!(
                "{}",
                issuer.issue(&namespace, &service_account, &audience, ttl)
            );
            Ok(())
        }
        Command::VmBundle {
            ca_dir,
            namespace,
            service_account,
            name,
            discovery_address,
            output,
            cluster_id,
            trust_domain,
            token_duration,
        } => {
            control_plane::write_bundle(&BundleInputs {
                ca_dir,
                namespace,
                service_account,
                name,
                discovery_address,
                output: output.clone(),
                cluster_id,
                trust_domain,
                token_ttl: token_duration,
            })
            .context("writing the VM bundle")?;
            eprintln!(
                "wrote cluster.env, mesh.yaml, hosts, root-cert.pem, istio-token to {}",
                output.display()
            );
            Ok(())
        }
    }
}
