//! The flag table and a pflag-compatible command-line parser: `--name value`, `--name=value`,
//! `-x value`, `-x=value`, `-xvalue`; boolean flags take no separate value (`--name` or
//! `--name=false`); `--` ends the flags.

use std::collections::HashMap;
use std::ffi::OsString;

use super::Error;

/// Whether a flag takes a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagKind {
    Bool,
    Value,
}

/// What a flag's value is, which decides how it is read into the [`Config`](super::Config)
/// and which errors are usage errors (Istio's typed flags: bool, uint16, duration, klog's
/// level).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    Bool,
    /// A port in 1-65535.
    Port,
    /// `--iptables-probe-port`: a uint16 flag in Istio (0-65535 on the command line), a port
    /// in 1-65535 once read.
    ProbePort,
    /// User or group ids or names.
    Ids,
    /// One of a few words.
    Choice,
    /// `""`, `*` or a port list.
    InboundPorts,
    /// A port list.
    Ports,
    Interfaces,
    /// A CIDR list, or `*`.
    CidrsOrAll,
    /// A CIDR list.
    Cidrs,
    /// An unsigned 32-bit number as `strtoul` reads it (a mark, a routing table).
    Number,
    /// A Go duration.
    Duration,
    /// A decimal 32-bit integer (klog's level).
    Int,
    Text,
}

/// One flag: long name, shorthand, environment twin(s), value type and default.
#[derive(Debug, Clone, Copy)]
pub struct FlagSpec {
    pub long: &'static str,
    pub short: Option<char>,
    pub env: Option<&'static str>,
    pub alt_env: Option<&'static str>,
    pub value: ValueType,
    pub default: &'static str,
    pub help: &'static str,
}

impl FlagSpec {
    /// Whether the flag takes a value.
    pub fn kind(&self) -> FlagKind {
        if self.value == Bool {
            FlagKind::Bool
        } else {
            FlagKind::Value
        }
    }
}

const fn f(
    long: &'static str,
    short: Option<char>,
    env: Option<&'static str>,
    alt_env: Option<&'static str>,
    value: ValueType,
    default: &'static str,
    help: &'static str,
) -> FlagSpec {
    FlagSpec {
        long,
        short,
        env,
        alt_env,
        value,
        default,
        help,
    }
}

use ValueType::{
    Bool, Choice, Cidrs, CidrsOrAll, Duration, Ids, InboundPorts, Int, Interfaces, Number, Port,
    Ports, ProbePort, Text,
};

/// Every flag of Istio's `istio-iptables` (plus pilot-agent's logging flags).
pub const FLAGS: &[FlagSpec] = &[
    f(
        "envoy-port",
        Some('p'),
        None,
        None,
        Port,
        "15001",
        "Specify the envoy port to which redirect all TCP traffic.",
    ),
    f(
        "inbound-capture-port",
        Some('z'),
        Some("INBOUND_CAPTURE_PORT"),
        None,
        Port,
        "15006",
        "Port to which all inbound TCP traffic to the pod/VM should be redirected to.",
    ),
    f(
        "inbound-tunnel-port",
        Some('e'),
        Some("INBOUND_TUNNEL_PORT"),
        None,
        Port,
        "15008",
        "Specify the istio tunnel port for inbound tcp traffic.",
    ),
    f(
        "proxy-uid",
        Some('u'),
        Some("PROXY_UID"),
        None,
        Ids,
        "",
        "Specify the UID of the user for which the redirection is not applied.",
    ),
    f(
        "proxy-gid",
        Some('g'),
        Some("PROXY_GID"),
        None,
        Ids,
        "",
        "Specify the GID of the user for which the redirection is not applied (same default value as -u param).",
    ),
    f(
        "istio-inbound-interception-mode",
        Some('m'),
        Some("ISTIO_INBOUND_INTERCEPTION_MODE"),
        None,
        Choice,
        "",
        "The mode used to redirect inbound connections to Envoy, either \"REDIRECT\" or \"TPROXY\".",
    ),
    f(
        "istio-inbound-ports",
        Some('b'),
        Some("ISTIO_INBOUND_PORTS"),
        None,
        InboundPorts,
        "",
        "Comma separated list of inbound ports for which traffic is to be redirected to Envoy; \"*\" = all.",
    ),
    f(
        "istio-local-exclude-ports",
        Some('d'),
        Some("ISTIO_LOCAL_EXCLUDE_PORTS"),
        None,
        Ports,
        "",
        "Comma separated list of inbound ports to be excluded from redirection to Envoy.",
    ),
    f(
        "istio-exclude-interfaces",
        Some('c'),
        Some("ISTIO_EXCLUDE_INTERFACES"),
        None,
        Interfaces,
        "",
        "Comma separated list of NIC. Neither inbound nor outbound traffic will be captured.",
    ),
    f(
        "istio-service-cidr",
        Some('i'),
        Some("ISTIO_SERVICE_CIDR"),
        None,
        CidrsOrAll,
        "",
        "Comma separated list of IP ranges in CIDR form to redirect to envoy; \"*\" = all.",
    ),
    f(
        "istio-service-exclude-cidr",
        Some('x'),
        Some("ISTIO_SERVICE_EXCLUDE_CIDR"),
        None,
        Cidrs,
        "",
        "Comma separated list of IP ranges in CIDR form to be excluded from redirection.",
    ),
    f(
        "istio-outbound-ports",
        Some('q'),
        Some("ISTIO_OUTBOUND_PORTS"),
        None,
        Ports,
        "",
        "Comma separated list of outbound ports to be explicitly included for redirection to Envoy.",
    ),
    f(
        "istio-local-outbound-ports-exclude",
        Some('o'),
        Some("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE"),
        None,
        Ports,
        "",
        "Comma separated list of outbound ports to be excluded from redirection to Envoy.",
    ),
    f(
        "kube-virt-interfaces",
        Some('k'),
        Some("KUBE_VIRT_INTERFACES"),
        None,
        Interfaces,
        "",
        "Comma separated list of virtual interfaces whose inbound traffic will be treated as outbound.",
    ),
    f(
        "istio-inbound-tproxy-mark",
        Some('t'),
        Some("ISTIO_INBOUND_TPROXY_MARK"),
        None,
        Number,
        "1337",
        "TPROXY mark.",
    ),
    f(
        "istio-inbound-tproxy-route-table",
        Some('r'),
        Some("ISTIO_INBOUND_TPROXY_ROUTE_TABLE"),
        None,
        Number,
        "133",
        "TPROXY route table.",
    ),
    f(
        "dry-run",
        Some('n'),
        Some("DRY_RUN"),
        None,
        Bool,
        "false",
        "Do not call any external dependencies like iptables.",
    ),
    f(
        "iptables-probe-port",
        None,
        Some("IPTABLES_PROBE_PORT"),
        None,
        ProbePort,
        "15002",
        "Set listen port for failure detection.",
    ),
    f(
        "probe-timeout",
        None,
        Some("PROBE_TIMEOUT"),
        None,
        Duration,
        "5s",
        "Failure detection timeout.",
    ),
    f(
        "skip-rule-apply",
        None,
        Some("SKIP_RULE_APPLY"),
        None,
        Bool,
        "false",
        "Skip iptables apply.",
    ),
    f(
        "run-validation",
        None,
        Some("RUN_VALIDATION"),
        None,
        Bool,
        "false",
        "Validate iptables.",
    ),
    f(
        "redirect-dns",
        None,
        Some("REDIRECT_DNS"),
        Some("ISTIO_META_DNS_CAPTURE"),
        Bool,
        "false",
        "Enable capture of dns traffic by istio-agent.",
    ),
    f(
        "drop-invalid",
        None,
        Some("DROP_INVALID"),
        Some("INVALID_DROP"),
        Bool,
        "false",
        "Enable invalid drop in the iptables rules.",
    ),
    f(
        "dual-stack",
        None,
        Some("DUAL_STACK"),
        Some("ISTIO_DUAL_STACK"),
        Bool,
        "false",
        "Enable ipv4/ipv6 redirects for dual-stack.",
    ),
    f(
        "capture-all-dns",
        None,
        Some("CAPTURE_ALL_DNS"),
        None,
        Bool,
        "false",
        "Capture all DNS traffic at port 53, not only traffic to the resolv.conf servers.",
    ),
    f(
        "network-namespace",
        None,
        Some("NETWORK_NAMESPACE"),
        None,
        Text,
        "",
        "The network namespace that iptables rules should be applied to.",
    ),
    f(
        "cni-mode",
        None,
        Some("CNI_MODE"),
        None,
        Bool,
        "false",
        "Whether to run as CNI plugin.",
    ),
    f(
        "reconcile",
        None,
        Some("RECONCILE"),
        None,
        Bool,
        "false",
        "Reconcile pre-existing and incompatible iptables rules instead of failing if drift is detected.",
    ),
    f(
        "cleanup-only",
        None,
        Some("CLEANUP_ONLY"),
        None,
        Bool,
        "false",
        "Perform a forced cleanup without creating new iptables chains or rules.",
    ),
    f(
        "force-apply",
        None,
        Some("FORCE_APPLY"),
        None,
        Bool,
        "false",
        "Apply iptables changes even if they appear to already be in place.",
    ),
    f(
        "native-nftables",
        None,
        Some("NATIVE_NFTABLES"),
        None,
        Bool,
        "false",
        "Use native nftables (one atomic nf_tables transaction over netlink; no nft binary) instead of iptables rules.",
    ),
    f(
        "force-iptables-binary",
        None,
        Some("FORCE_IPTABLES_BINARY"),
        None,
        Choice,
        "",
        "Break glass option to choose which iptables binary to use: legacy or nft.",
    ),
    // pilot-agent logging flags (accepted; only the level and JSON switch are used).
    f(
        "log_output_level",
        None,
        None,
        None,
        Text,
        "",
        "Comma-separated minimum per-scope logging level, e.g. default:info.",
    ),
    f(
        "log_as_json",
        None,
        None,
        None,
        Bool,
        "false",
        "Whether to format output as JSON.",
    ),
    f(
        "vklog",
        None,
        None,
        None,
        Int,
        "0",
        "Number for the log level verbosity of Kubernetes client libraries, like -v (accepted, ignored: no Kubernetes client here).",
    ),
    f(
        "log_caller",
        None,
        None,
        None,
        Text,
        "",
        "Scopes for which to include caller information (accepted, ignored).",
    ),
    f(
        "log_stacktrace_level",
        None,
        None,
        None,
        Text,
        "",
        "Per-scope stack trace level (accepted, ignored).",
    ),
    f(
        "log_target",
        None,
        None,
        None,
        Text,
        "",
        "Output path for logs: stdout, stderr (the default here: stdout carries the --dry-run stream) or a file.",
    ),
];

fn by_long(name: &str) -> Option<&'static FlagSpec> {
    FLAGS.iter().find(|f| f.long == name)
}

fn by_short(c: char) -> Option<&'static FlagSpec> {
    FLAGS.iter().find(|f| f.short == Some(c))
}

/// The command line: values keyed by long flag name, and the positional arguments.
pub(super) struct Args {
    pub values: HashMap<&'static str, String>,
    /// Positional arguments: accepted and ignored, as cobra's root command does (Istio's VM
    /// `istio-start.sh init` passes `init` through).
    pub positional: Vec<String>,
}

/// Parses the command line; `None` means `--help` (given anywhere before `--`, once every
/// flag parsed). Flags and positional arguments may be interspersed; everything after `--` is
/// positional.
pub(super) fn parse_args<I>(args: I) -> Result<Option<Args>, Error>
where
    I: IntoIterator<Item = OsString>,
{
    let mut out = HashMap::new();
    let mut positional = Vec::new();
    let mut help = false;
    let mut it = args.into_iter().map(|a| {
        a.into_string()
            .map_err(|a| Error::NotUtf8(a.to_string_lossy().into_owned()))
    });
    while let Some(arg) = it.next() {
        let arg = arg?;
        if arg == "--" {
            for extra in it.by_ref() {
                positional.push(extra?);
            }
            break;
        }
        if arg == "-h" || arg == "--help" {
            // Usage, once the rest of the command line parsed (cobra parses flags first).
            help = true;
            continue;
        }
        let (spec, inline, shown) = if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let spec = by_long(name).ok_or_else(|| Error::UnknownFlag(format!("--{name}")))?;
            (spec, inline, format!("--{name}"))
        } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            let mut chars = short.chars();
            let c = chars.next().unwrap_or('-');
            let rest = chars.as_str();
            let spec =
                by_short(c).ok_or_else(|| Error::UnknownFlag(format!("-{c} (in {arg:?})")))?;
            // pflag: `-x=v` gives `v`, but a bare `-x=` gives the value "=" (it only strips
            // the '=' when something follows it).
            let inline = if rest == "=" && spec.kind() == FlagKind::Value {
                Some(rest.to_string())
            } else if let Some(v) = rest.strip_prefix('=') {
                Some(v.to_string())
            } else if rest.is_empty() {
                None
            } else if spec.kind() == FlagKind::Bool {
                return Err(Error::UnknownFlag(format!("-{rest} (in {arg:?})")));
            } else {
                Some(rest.to_string())
            };
            (spec, inline, format!("-{c}"))
        } else {
            positional.push(arg);
            continue;
        };
        let value = match (spec.kind(), inline) {
            (_, Some(v)) => v,
            (FlagKind::Bool, None) => "true".to_string(),
            (FlagKind::Value, None) => match it.next() {
                Some(v) => v?,
                None => return Err(Error::MissingValue(shown)),
            },
        };
        out.insert(spec.long, value);
    }
    if help {
        check_typed(&out)?;
        return Ok(None);
    }
    Ok(Some(Args {
        values: out,
        positional,
    }))
}

/// Rejects, before anything else is looked at, a command-line value that Istio's typed flags
/// (booleans, `--iptables-probe-port` as uint16, `--probe-timeout` as a Go duration) cannot
/// parse: cobra fails the command line as a whole, so these win over every other error.
pub(super) fn check_typed(values: &HashMap<&'static str, String>) -> Result<(), Error> {
    let bad = |flag: &str, value: &str, expected: &str| Error::InvalidArgument {
        flag: format!("--{flag}"),
        value: value.to_string(),
        expected: expected.to_string(),
    };
    for f in FLAGS {
        let Some(v) = values.get(f.long) else {
            continue;
        };
        let expected = match f.value {
            ProbePort if v.parse::<u16>().is_err() => "a port number in 0-65535",
            Int if v.parse::<i32>().is_err() => "an integer",
            Duration if super::parse_go_duration(v).is_none() => "a duration such as 5s or 500ms",
            Bool if go_syntax::parse_bool(v).is_err() => "true or false",
            _ => continue,
        };
        return Err(bad(f.long, v, expected));
    }
    Ok(())
}

fn env_value<'a>(
    env: &'a HashMap<String, String>,
    name: Option<&str>,
) -> Option<(&'a str, String)> {
    let name = name?;
    let (k, v) = env.get_key_value(name)?;
    (!v.is_empty()).then(|| (k.as_str(), v.clone()))
}

/// A flag's environment value: the alternate twin (`ISTIO_META_DNS_CAPTURE`, `INVALID_DROP`,
/// `ISTIO_DUAL_STACK`) wins over the primary when both are set, as Istio applies it last.
fn env_twin<'a>(env: &'a HashMap<String, String>, spec: &FlagSpec) -> Option<(&'a str, String)> {
    env_value(env, spec.alt_env).or_else(|| env_value(env, spec.env))
}

/// The effective value of a flag: command line, else environment (the alternate twin, then
/// the primary), else the default; `None` when all are empty.
pub(super) fn resolve(
    name: &str,
    values: &HashMap<&'static str, String>,
    env: &HashMap<String, String>,
) -> Option<String> {
    if let Some(v) = values.get(name) {
        return Some(v.clone());
    }
    let spec = by_long(name)?;
    if let Some((_, v)) = env_twin(env, spec) {
        return Some(v);
    }
    (!spec.default.is_empty()).then(|| spec.default.to_string())
}

/// Where a flag's effective value came from, for error messages.
pub(super) fn source_name(
    name: &str,
    values: &HashMap<&'static str, String>,
    env: &HashMap<String, String>,
) -> String {
    if values.contains_key(name) {
        return format!("--{name}");
    }
    if let Some(spec) = by_long(name)
        && let Some((k, _)) = env_twin(env, spec)
    {
        return format!("environment variable {k} (--{name})");
    }
    format!("--{name}")
}

/// Help text listing every flag.
pub fn usage() -> String {
    let mut s = String::from(
        "istio-iptables is responsible for setting up port forwarding for Istio Sidecar.\n\nUsage:\n  istio-iptables [flags]\n\nFlags:\n",
    );
    for f in FLAGS {
        let short = f.short.map(|c| format!("-{c}, ")).unwrap_or_default();
        let env = match (f.env, f.alt_env) {
            (Some(e), Some(a)) => format!(" [env {e}, {a}]"),
            (Some(e), None) => format!(" [env {e}]"),
            _ => String::new(),
        };
        let default = if f.default.is_empty() || f.default == "false" {
            String::new()
        } else {
            format!(" (default {})", f.default)
        };
        s.push_str(&format!(
            "  {short}--{}  {}{default}{env}\n",
            f.long, f.help
        ));
    }
    s.push_str("  -h, --help  help for istio-iptables\n");
    s
}
