//! `pilot-agent` command line, parsed like Istio's cobra/pflag setup: long flags as `--f=v` or
//! `--f v`, booleans as `--f` or `--f=false`, and unknown flags accepted and ignored (an unknown
//! `--f v` consumes `v` when it does not start with `-`, as pflag does).

use std::time::Duration;

use crate::config::{NodeType, ProxyFlags};

/// Command-line errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("flag --{0} needs a value")]
    MissingValue(String),
    /// A flag the command does not have (only `proxy` and the root ignore unknown flags, as
    /// Istio's cobra commands allow them there for backward compatibility).
    #[error("unknown flag: {0}")]
    UnknownFlag(String),
    #[error("invalid value {value:?} for --{flag}: expected {expected}")]
    Value {
        flag: String,
        value: String,
        expected: &'static str,
    },
    #[error(
        "unknown command {0:?}: expected proxy, wait, request, version, istio-iptables, bootstrap or completion"
    )]
    Command(String),
    #[error("{0}")]
    Usage(String),
}

/// Logging flags shared by every command.
#[derive(Debug, Clone)]
pub struct LogFlags {
    pub output_level: String,
    pub as_json: bool,
    /// `--log_target` (repeatable): `stdout`, `stderr` or a file path; empty when not given
    /// (Istio's default, `stdout`, for `proxy`; the other commands keep their stdout for
    /// their output and log to stderr).
    pub target: Vec<String>,
}

impl Default for LogFlags {
    fn default() -> Self {
        LogFlags {
            output_level: "default:info,grpc:none".into(),
            as_json: false,
            target: Vec::new(),
        }
    }
}

/// `pilot-agent wait`.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitArgs {
    pub timeout: Duration,
    pub request_timeout: Duration,
    pub period: Duration,
    pub url: String,
}

/// `pilot-agent request`.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestArgs {
    pub debug_port: u16,
    pub method: String,
    pub path: String,
    pub body: Option<String>,
}

/// A parsed command.
#[derive(Debug, Clone)]
pub enum Command {
    Proxy {
        node_type: NodeType,
        flags: ProxyFlags,
    },
    /// Writes the bootstrap for an externally run Envoy and exits.
    Bootstrap {
        node_type: NodeType,
        flags: ProxyFlags,
        output: Option<String>,
    },
    Wait(WaitArgs),
    Request(RequestArgs),
    Version {
        short: bool,
        output: String,
    },
    /// Everything after `istio-iptables`, for iptables-init.
    Iptables(Vec<String>),
    /// `completion <shell>`: a completion script for the shell (None: an unknown or no shell,
    /// answered with usage, as cobra does).
    Completion(Option<Shell>),
    Help,
}

/// The shells `pilot-agent completion` writes a script for (cobra's four).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
    Powershell,
}

impl Shell {
    fn parse(name: &str) -> Option<Shell> {
        match name {
            "bash" => Some(Shell::Bash),
            "zsh" => Some(Shell::Zsh),
            "fish" => Some(Shell::Fish),
            "powershell" => Some(Shell::Powershell),
            _ => None,
        }
    }
}

/// The subcommands a completion script offers.
const SUBCOMMANDS: [&str; 8] = [
    "bootstrap",
    "completion",
    "help",
    "istio-iptables",
    "proxy",
    "request",
    "version",
    "wait",
];

/// `pilot-agent completion <shell>`: completes the subcommands.
pub fn completion_script(shell: Shell) -> String {
    let words = SUBCOMMANDS.join(" ");
    match shell {
        Shell::Bash => {
            format!("# bash completion for pilot-agent\ncomplete -W \"{words}\" pilot-agent\n")
        }
        Shell::Zsh => format!("#compdef pilot-agent\n_arguments '1: :({words})'\n"),
        Shell::Fish => {
            format!("complete -c pilot-agent -f -n '__fish_use_subcommand' -a '{words}'\n")
        }
        Shell::Powershell => format!(
            "Register-ArgumentCompleter -Native -CommandName pilot-agent -ScriptBlock {{\n    param($wordToComplete)\n    '{}' -split ' ' | Where-Object {{ $_ -like \"$wordToComplete*\" }}\n}}\n",
            words
        ),
    }
}

/// A parsed command line.
#[derive(Debug, Clone)]
pub struct Cli {
    pub log: LogFlags,
    pub command: Command,
}

/// Exit status of a command line that does not parse, as Istio's `pilot-agent` (`os.Exit(-1)`).
pub const USAGE_ERROR_CODE: i32 = 255;

impl Error {
    /// Whether the flags themselves do not parse (unknown, missing or mistyped value): such a
    /// command line fails even with `--help`, as cobra parses flags before it looks at help.
    fn is_flag_error(&self) -> bool {
        matches!(
            self,
            Error::MissingValue(_) | Error::UnknownFlag(_) | Error::Value { .. }
        )
    }
}

/// Flags a command knows: name → takes a value (false: boolean). `strict`: an unknown flag is
/// an error (every command but the root and `proxy`).
struct Spec<'a> {
    flags: &'a [(&'a str, bool)],
    shorts: &'a [(char, &'a str)],
    strict: bool,
}

/// Splits args into known flag values and positionals.
/// Known `(flag, value)` pairs and positionals.
type Scanned = (Vec<(String, String)>, Vec<String>);

/// [`scan`] for a subcommand that has no short flags and refuses unknown ones (cobra's rule for
/// every command but the root and `proxy`).
fn scan_strict(args: &[String], flags: &[(&str, bool)]) -> Result<Scanned, Error> {
    scan(
        args,
        &Spec {
            flags,
            shorts: &[],
            strict: true,
        },
    )
}

fn scan(args: &[String], spec: &Spec<'_>) -> Result<Scanned, Error> {
    let mut known = Vec::new();
    let mut positional = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            positional.extend(args[i..].iter().cloned());
            break;
        }
        let (name, inline) = if let Some(long) = arg.strip_prefix("--") {
            match long.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (long.to_string(), None),
            }
        } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            let mut chars = short.chars();
            let c = chars.next().unwrap_or_default();
            let rest: String = chars.collect();
            match spec.shorts.iter().find(|(s, _)| *s == c) {
                Some((_, long)) => {
                    let inline =
                        rest.strip_prefix('=')
                            .map(str::to_string)
                            .or(if rest.is_empty() {
                                None
                            } else {
                                Some(rest.clone())
                            });
                    (long.to_string(), inline)
                }
                None if c == 'h' => ("help".to_string(), None),
                None if spec.strict => return Err(Error::UnknownFlag(format!("-{c}"))),
                None => {
                    // Unknown shorthand: ignore it (and its value, as pflag would).
                    if rest.is_empty() && i < args.len() && !args[i].starts_with('-') {
                        i += 1;
                    }
                    continue;
                }
            }
        } else {
            positional.push(arg.clone());
            continue;
        };
        match spec.flags.iter().find(|(n, _)| *n == name) {
            Some((_, true)) => {
                let value = match inline {
                    Some(v) => v,
                    None => {
                        if i >= args.len() {
                            return Err(Error::MissingValue(name));
                        }
                        i += 1;
                        args[i - 1].clone()
                    }
                };
                known.push((name, value));
            }
            Some((_, false)) => {
                known.push((name, inline.unwrap_or_else(|| "true".into())));
            }
            None if name == "help" => {}
            None if spec.strict => return Err(Error::UnknownFlag(format!("--{name}"))),
            None => {
                tracing::debug!(flag = %name, "ignoring unknown flag");
                if inline.is_none() && i < args.len() && !args[i].starts_with('-') {
                    i += 1;
                }
            }
        }
    }
    Ok((known, positional))
}

fn flag_bool(flag: &str, v: &str) -> Result<bool, Error> {
    go_syntax::parse_bool(v).ok().ok_or_else(|| Error::Value {
        flag: flag.into(),
        value: v.into(),
        expected: "true or false",
    })
}

/// Go's `strconv.ParseInt(v, 0, 64)`, as pflag reads an `int` flag: an optional sign, then
/// decimal, `0x` hexadecimal, `0o`/`0` octal or `0b` binary.
fn go_int(v: &str) -> Option<i64> {
    let (negative, body) = match v.as_bytes().first() {
        Some(b'-') => (true, &v[1..]),
        Some(b'+') => (false, &v[1..]),
        _ => (false, v),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    if digits.is_empty() || digits.starts_with(['+', '-']) {
        return None;
    }
    let magnitude = i128::from_str_radix(digits, radix).ok()?;
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}

/// An `int` flag: a value Go cannot parse is a flag error; one out of `T`'s range is refused
/// when the command runs (after `--help` had its say), as Istio checks ranges there.
fn flag_int<T: TryFrom<i64>>(flag: &str, v: &str, expected: &'static str) -> Result<T, Error> {
    let n = go_int(v).ok_or_else(|| Error::Value {
        flag: flag.into(),
        value: v.into(),
        expected: "an integer",
    })?;
    T::try_from(n).map_err(|_| {
        Error::Usage(format!(
            "invalid value {v:?} for --{flag}: expected {expected}"
        ))
    })
}

const LOG_FLAGS: [(&str, bool); 6] = [
    ("log_target", true),
    ("log_as_json", false),
    ("log_output_level", true),
    ("log_stacktrace_level", true),
    ("log_caller", true),
    ("vklog", true),
];

fn apply_log(log: &mut LogFlags, name: &str, value: &str) -> Result<bool, Error> {
    match name {
        "log_output_level" => log.output_level = value.to_string(),
        "log_as_json" => log.as_json = flag_bool(name, value)?,
        // klog's Level: a decimal 32-bit integer.
        "vklog" => {
            value.parse::<i32>().map_err(|_| Error::Value {
                flag: name.into(),
                value: value.into(),
                expected: "an integer",
            })?;
        }
        "log_target" => log.target.push(value.to_string()),
        "log_stacktrace_level" | "log_caller" => {}
        _ => return Ok(false),
    }
    Ok(true)
}

fn with_log<'a>(flags: &[(&'a str, bool)]) -> Vec<(&'a str, bool)> {
    let mut all = LOG_FLAGS.to_vec();
    all.extend_from_slice(flags);
    all
}

fn proxy_flags(
    args: &[String],
    log: &mut LogFlags,
) -> Result<(ProxyFlags, Vec<String>, Option<String>), Error> {
    let flags = with_log(&[
        ("domain", true),
        ("meshConfig", true),
        ("stsPort", true),
        ("tokenManagerPlugin", true),
        ("serviceCluster", true),
        ("proxyLogLevel", true),
        ("concurrency", true),
        ("proxyComponentLogLevel", true),
        ("templateFile", true),
        ("outlierLogPath", true),
        ("profiling", false),
        ("external-envoy", false),
        ("output", true),
    ]);
    let (known, positional) = scan(
        args,
        &Spec {
            flags: &flags,
            shorts: &[],
            strict: false,
        },
    )?;
    let mut p = ProxyFlags::default();
    let mut output = None;
    for (name, v) in known {
        if apply_log(log, &name, &v)? {
            if name == "log_as_json" {
                p.log_as_json = log.as_json;
            }
            continue;
        }
        match name.as_str() {
            "domain" => p.domain = v,
            "meshConfig" => p.mesh_config = v,
            "stsPort" => p.sts_port = flag_int(&name, &v, "a port 0-65535")?,
            "serviceCluster" => p.service_cluster = v,
            "proxyLogLevel" => p.proxy_log_level = v,
            "concurrency" => p.concurrency = flag_int(&name, &v, "a non-negative integer")?,
            "proxyComponentLogLevel" => p.proxy_component_log_level = v,
            "templateFile" => p.template_file = v,
            "outlierLogPath" => p.outlier_log_path = v,
            "external-envoy" => p.external_envoy = flag_bool(&name, &v)?,
            "profiling" => p.profiling = flag_bool(&name, &v)?,
            "output" => output = Some(v),
            _ => {}
        }
    }
    Ok((p, positional, output))
}

fn node_type(positional: &[String]) -> Result<NodeType, Error> {
    match positional.first() {
        None => Ok(NodeType::Sidecar),
        Some(t) => NodeType::parse(t).map_err(|e| Error::Usage(e.to_string())),
    }
}

/// The subcommand is the first argument that is neither a root flag nor the separate value of
/// one (`pilot-agent --log_output_level default:debug proxy sidecar`, as cobra parses it).
/// Unknown root flags are taken as booleans.
fn subcommand_position(args: &[String]) -> Option<usize> {
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            return Some(i);
        };
        let takes_value = !flag.contains('=')
            && LOG_FLAGS
                .iter()
                .any(|(name, value)| *value && *name == flag);
        i += if takes_value { 2 } else { 1 };
    }
    None
}

/// Parses `argv[1..]`.
pub fn parse(args: &[String]) -> Result<Cli, Error> {
    let mut log = LogFlags::default();
    let pos = subcommand_position(args);
    let root_flags = &args[..pos.unwrap_or(args.len())];
    let (known, _) = scan(
        root_flags,
        &Spec {
            flags: &LOG_FLAGS,
            shorts: &[],
            strict: false,
        },
    )?;
    for (n, v) in known {
        apply_log(&mut log, &n, &v)?;
    }
    let Some(pos) = pos.filter(|_| !root_flags.iter().any(|a| a == "--help" || a == "-h")) else {
        return Ok(Cli {
            log,
            command: Command::Help,
        });
    };
    let rest = &args[pos + 1..];
    // `--help`/`-h` anywhere before `--` asks for usage once the flags parse (as cobra does):
    // never run a command for it, but still refuse flags that do not parse. istio-iptables
    // prints its own usage.
    let wants_help = rest
        .iter()
        .take_while(|a| *a != "--")
        .any(|a| a == "--help" || a == "-h");
    let command = command(&args[pos], rest, &mut log);
    if wants_help && args[pos] != "istio-iptables" {
        return match command {
            Err(e) if e.is_flag_error() => Err(e),
            _ => Ok(Cli {
                log,
                command: Command::Help,
            }),
        };
    }
    Ok(Cli {
        log,
        command: command?,
    })
}

/// The subcommand `name` with its arguments `rest`.
fn command(name: &str, rest: &[String], log: &mut LogFlags) -> Result<Command, Error> {
    Ok(match name {
        "proxy" => {
            let (flags, positional, _) = proxy_flags(rest, log)?;
            Command::Proxy {
                node_type: node_type(&positional)?,
                flags,
            }
        }
        "bootstrap" => {
            let (flags, positional, output) = proxy_flags(rest, log)?;
            Command::Bootstrap {
                node_type: node_type(&positional)?,
                flags,
                output,
            }
        }
        "wait" => Command::Wait(wait_args(rest, log)?),
        "request" => Command::Request(request_args(rest, log)?),
        "version" => version_args(rest, log)?,
        "istio-iptables" => Command::Iptables(rest.to_vec()),
        "help" => Command::Help,
        "completion" => Command::Completion(completion_args(rest, log)?),
        other => return Err(Error::Command(other.to_string())),
    })
}

/// `wait`'s flags, with Istio's defaults.
fn wait_args(rest: &[String], log: &mut LogFlags) -> Result<WaitArgs, Error> {
    let flags = with_log(&[
        ("timeoutSeconds", true),
        ("requestTimeoutMillis", true),
        ("periodMillis", true),
        ("url", true),
    ]);
    let (known, _) = scan_strict(rest, &flags)?;
    let mut w = WaitArgs {
        timeout: Duration::from_secs(60),
        request_timeout: Duration::from_millis(500),
        period: Duration::from_millis(500),
        url: "http://localhost:15021/healthz/ready".into(),
    };
    for (n, v) in known {
        if apply_log(log, &n, &v)? {
            continue;
        }
        match n.as_str() {
            "timeoutSeconds" => {
                w.timeout =
                    Duration::from_secs(flag_int(&n, &v, "a non-negative number of seconds")?)
            }
            "requestTimeoutMillis" => {
                w.request_timeout =
                    Duration::from_millis(flag_int(&n, &v, "non-negative milliseconds")?)
            }
            "periodMillis" => {
                w.period = Duration::from_millis(flag_int(&n, &v, "non-negative milliseconds")?)
            }
            "url" => w.url = v,
            _ => {}
        }
    }
    Ok(w)
}

/// `request <method> <path> [<body>]` and `--debug-port`.
fn request_args(rest: &[String], log: &mut LogFlags) -> Result<RequestArgs, Error> {
    let flags = with_log(&[("debug-port", true)]);
    let (known, positional) = scan_strict(rest, &flags)?;
    let mut debug_port = 15000i64;
    for (n, v) in known {
        if apply_log(log, &n, &v)? {
            continue;
        }
        if n == "debug-port" {
            debug_port = flag_int::<i64>(&n, &v, "an integer")?;
        }
    }
    // Istio checks the port when the command runs, after the flags parsed.
    let debug_port = match u16::try_from(debug_port) {
        Ok(p @ (15000 | 15020 | 15021 | 15004)) => p,
        _ => {
            return Err(Error::Usage(format!(
                "invalid value \"{debug_port}\" for --debug-port: expected one of 15000, 15020, 15021, 15004"
            )));
        }
    };
    if positional.len() < 2 || positional.len() > 3 {
        return Err(Error::Usage(
            "usage: pilot-agent request <method> <path> [<body>]".into(),
        ));
    }
    Ok(RequestArgs {
        debug_port,
        method: positional[0].clone(),
        path: positional[1].clone(),
        body: positional.get(2).cloned(),
    })
}

/// `version`'s `--short` and `--output`.
fn version_args(rest: &[String], log: &mut LogFlags) -> Result<Command, Error> {
    let flags = with_log(&[("short", false), ("output", true)]);
    let (known, _) = scan(
        rest,
        &Spec {
            flags: &flags,
            shorts: &[('s', "short"), ('o', "output")],
            strict: true,
        },
    )?;
    let mut short = false;
    let mut output = String::new();
    for (n, v) in known {
        match n.as_str() {
            "short" => short = flag_bool(&n, &v)?,
            "output" => output = v,
            _ => {
                apply_log(log, &n, &v)?;
            }
        }
    }
    Ok(Command::Version { short, output })
}

/// `completion [<shell>]`.
fn completion_args(rest: &[String], log: &mut LogFlags) -> Result<Option<Shell>, Error> {
    // The shell is a subcommand of `completion`; only the shells have
    // --no-descriptions (accepted; our scripts carry no descriptions).
    let shell = rest
        .iter()
        .find(|a| !a.starts_with('-'))
        .and_then(|a| Shell::parse(a));
    let own: &[(&str, bool)] = if shell.is_some() {
        &[("no-descriptions", false)]
    } else {
        &[]
    };
    let flags = with_log(own);
    let (known, _) = scan_strict(rest, &flags)?;
    for (n, v) in known {
        if !apply_log(log, &n, &v)? {
            flag_bool(&n, &v)?;
        }
    }
    Ok(shell)
}

/// `pilot-agent version` output, in Istio's formats: `client version: version.BuildInfo{...}`,
/// `-s` just `client version: <version>`, `-o json|yaml` the `clientVersion` object. The
/// version is the Istio release this build targets (what istiod sees); `tag` is ours.
pub fn version_text(short: bool, output: &str) -> Result<String, Error> {
    let info = [
        ("version", crate::bootstrap::ISTIO_RELEASE),
        ("revision", option_env!("GIT_REVISION").unwrap_or("unknown")),
        ("golang_version", "n/a (Rust pilot-agent)"),
        ("status", "Clean"),
        ("tag", crate::bootstrap::VERSION),
    ];
    Ok(match output {
        "" if short => format!("client version: {}\n", info[0].1),
        "" => format!(
            "client version: version.BuildInfo{{Version:{:?}, GitRevision:{:?}, GolangVersion:{:?}, BuildStatus:{:?}, GitTag:{:?}}}\n",
            info[0].1, info[1].1, info[2].1, info[3].1, info[4].1
        ),
        "json" => {
            let fields: Vec<String> = info
                .iter()
                .map(|(k, v)| format!("    \"{k}\": {}", serde_json::Value::from(*v)))
                .collect();
            format!(
                "{{\n  \"clientVersion\": {{\n{}\n  }}\n}}\n",
                fields.join(",\n")
            )
        }
        "yaml" => {
            let mut sorted = info;
            sorted.sort();
            let fields: String = sorted
                .iter()
                .map(|(k, v)| format!("  {k}: {v}\n"))
                .collect();
            format!("clientVersion:\n{fields}\n")
        }
        _ => return Err(Error::Usage("--output must be 'yaml' or 'json'".into())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    /// `--log_target` is kept (repeatable, as Istio's string array); none given is empty (the
    /// binary then logs `proxy` to stdout, Istio's default).
    #[test]
    fn log_target_is_kept() {
        let cli = parse(&argv("--log_target stderr proxy sidecar")).unwrap();
        assert_eq!(cli.log.target, ["stderr"]);
        let cli = parse(&argv(
            "proxy sidecar --log_target=/tmp/a.log --log_target stdout",
        ))
        .unwrap();
        assert_eq!(cli.log.target, ["/tmp/a.log", "stdout"]);
        let cli = parse(&argv("proxy sidecar")).unwrap();
        assert!(cli.log.target.is_empty());
    }

    #[test]
    fn help_after_a_subcommand_runs_nothing() {
        for line in [
            "proxy --help",
            "proxy sidecar -h",
            "bootstrap --help",
            "wait --help",
        ] {
            let cli = parse(&argv(line)).unwrap();
            assert!(matches!(cli.command, Command::Help), "{line}");
        }
        let cli = parse(&argv("istio-iptables --help")).unwrap();
        assert!(matches!(cli.command, Command::Iptables(a) if a == ["--help"]));
        let cli = parse(&argv("request GET stats -- --help")).unwrap();
        assert!(matches!(cli.command, Command::Request(_)));
    }

    /// As cobra: flags parse before `--help` is looked at; only the root and `proxy` ignore
    /// unknown flags; a value checked when the command runs does not fail `--help`.
    #[test]
    fn help_waits_for_the_flags_to_parse() {
        for line in [
            "proxy --concurrency=abc --help",
            "proxy --help --concurrency",
            "wait --no-such-flag --help",
            "version -Z --help",
            "--vklog=abc --help",
            "--help --log_caller",
            "completion bash --no-descriptions=maybe --help",
            "completion --no-descriptions --help",
        ] {
            let err = parse(&argv(line)).unwrap_err();
            assert!(err.is_flag_error(), "{line}: {err}");
        }
        for line in [
            "proxy --no-such-flag --help",
            "--no-such-flag version -s",
            "request --debug-port=8 --help",
            "proxy bogus-node-type --help",
            "--help extra-positional",
            "completion bash --no-descriptions --help",
        ] {
            let cli = parse(&argv(line)).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert!(
                matches!(cli.command, Command::Help | Command::Version { .. }),
                "{line}"
            );
        }
        assert!(parse(&argv("wait --no-such-flag")).is_err());
        assert!(parse(&argv("request --debug-port=8 GET /x")).is_err());
    }

    #[test]
    fn ints_read_as_go_does() {
        assert_eq!(go_int("8"), Some(8));
        assert_eq!(go_int("-1"), Some(-1));
        assert_eq!(go_int("0x10"), Some(16));
        assert_eq!(go_int("010"), Some(8));
        assert_eq!(go_int("0b11"), Some(3));
        assert_eq!(go_int("1.5"), None);
        assert_eq!(go_int("abc"), None);
        assert_eq!(go_int(""), None);
        assert_eq!(go_int("99999999999999999999"), None);
    }

    #[test]
    fn completion_for_each_shell() {
        for shell in ["bash", "zsh", "fish", "powershell"] {
            let cli = parse(&argv(&format!("completion {shell}"))).unwrap();
            let Command::Completion(Some(s)) = cli.command else {
                panic!("{shell}")
            };
            assert!(completion_script(s).contains("istio-iptables"), "{shell}");
        }
        let cli = parse(&argv("completion bogus")).unwrap();
        assert!(matches!(cli.command, Command::Completion(None)));
    }

    #[test]
    fn injection_argv_verbatim() {
        let cli = parse(&argv(
            "proxy sidecar --domain ns1.svc.cluster.local --proxyLogLevel=warning --proxyComponentLogLevel=misc:error --log_output_level=default:info",
        ))
        .unwrap();
        let Command::Proxy { node_type, flags } = cli.command else {
            panic!("not proxy")
        };
        assert_eq!(node_type, NodeType::Sidecar);
        assert_eq!(flags.domain, "ns1.svc.cluster.local");
        assert_eq!(flags.proxy_log_level, "warning");
        assert_eq!(flags.proxy_component_log_level, "misc:error");
        assert_eq!(cli.log.output_level, "default:info");
    }

    #[test]
    fn root_flags_before_the_subcommand() {
        for line in [
            "--log_output_level default:debug proxy waypoint",
            "--log_output_level=default:debug proxy waypoint",
            "--log_as_json --log_output_level default:debug proxy waypoint --domain d",
        ] {
            let cli = parse(&argv(line)).unwrap();
            let Command::Proxy { node_type, .. } = cli.command else {
                panic!("{line}: not proxy")
            };
            assert_eq!(node_type, NodeType::Waypoint, "{line}");
            assert_eq!(cli.log.output_level, "default:debug", "{line}");
        }
        let err = parse(&argv("proxy gateway")).unwrap_err().to_string();
        assert!(err.contains("sidecar, router or waypoint"), "{err}");
    }

    #[test]
    fn unknown_flags_are_accepted() {
        let cli = parse(&argv(
            "proxy --unknownA=1 --unknownB value router --profiling --log_as_json --stsPort 15463",
        ))
        .unwrap();
        let Command::Proxy { node_type, flags } = cli.command else {
            panic!("not proxy")
        };
        assert_eq!(node_type, NodeType::Router);
        assert!(flags.log_as_json);
        assert_eq!(flags.sts_port, 15463);
        assert!(flags.profiling);
        assert!(parse(&argv("proxy gateway")).is_err());
        assert!(
            parse(&argv("proxy --concurrency=x"))
                .unwrap_err()
                .to_string()
                .contains("concurrency")
        );
    }

    #[test]
    fn profiling_is_on_unless_turned_off() {
        let profiling = |line: &str| match parse(&argv(line)).unwrap().command {
            Command::Proxy { flags, .. } => flags.profiling,
            _ => panic!("not proxy"),
        };
        assert!(profiling("proxy sidecar"));
        assert!(profiling("proxy sidecar --profiling=true"));
        assert!(!profiling("proxy sidecar --profiling=false"));
        assert!(!profiling("proxy --profiling=0 router"));
        assert!(parse(&argv("proxy --profiling=maybe")).is_err());
    }

    #[test]
    fn wait_request_version() {
        let Command::Wait(w) = parse(&argv("wait --timeoutSeconds 3 --url=http://x/y"))
            .unwrap()
            .command
        else {
            panic!()
        };
        assert_eq!(w.timeout, Duration::from_secs(3));
        assert_eq!(w.url, "http://x/y");
        let Command::Request(r) = parse(&argv("request --debug-port=15020 POST drain"))
            .unwrap()
            .command
        else {
            panic!()
        };
        assert_eq!(
            (r.debug_port, r.method.as_str(), r.path.as_str()),
            (15020, "POST", "drain")
        );
        assert!(parse(&argv("request --debug-port=1 GET x")).is_err());
        assert!(parse(&argv("request GET")).is_err());
        let Command::Version { short, output } =
            parse(&argv("version -s -o json")).unwrap().command
        else {
            panic!()
        };
        assert!(short);
        assert_eq!(output, "json");
        let Command::Iptables(rest) = parse(&argv("istio-iptables -p 15001 --dry-run"))
            .unwrap()
            .command
        else {
            panic!()
        };
        assert_eq!(rest, argv("-p 15001 --dry-run"));
        assert!(parse(&argv("frobnicate")).is_err());
    }

    /// Istio's `pkg/version` output: the long form, `-s`, and `-o json|yaml` with the
    /// `clientVersion` fields; the version is the targeted Istio release, the tag ours.
    #[test]
    fn version_output_as_istio() {
        let rel = crate::bootstrap::ISTIO_RELEASE;
        let ours = crate::bootstrap::VERSION;
        assert_eq!(
            version_text(true, "").unwrap(),
            format!("client version: {rel}\n")
        );
        let long = version_text(false, "").unwrap();
        assert!(
            long.starts_with(&format!(
                "client version: version.BuildInfo{{Version:\"{rel}\", GitRevision:"
            )),
            "{long}"
        );
        assert!(long.ends_with(&format!("GitTag:\"{ours}\"}}\n")), "{long}");
        let json: serde_json::Value =
            serde_json::from_str(&version_text(false, "json").unwrap()).unwrap();
        let client = json["clientVersion"].as_object().unwrap();
        let keys: Vec<&str> = client.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            ["golang_version", "revision", "status", "tag", "version"]
        );
        assert_eq!(client["version"], rel);
        assert_eq!(client["tag"], ours);
        // `-s` does not change the structured forms (as upstream).
        assert_eq!(
            version_text(true, "json").unwrap(),
            version_text(false, "json").unwrap()
        );
        let yaml: serde_json::Value =
            serde_yaml::from_str(&version_text(false, "yaml").unwrap()).unwrap();
        assert_eq!(yaml, json);
        assert!(
            version_text(false, "yaml")
                .unwrap()
                .starts_with("clientVersion:\n  golang_version: ")
        );
        let err = version_text(false, "xml").unwrap_err().to_string();
        assert!(err.contains("--output must be 'yaml' or 'json'"), "{err}");
    }
}
