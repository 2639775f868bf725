//! Command line and environment: Istio's `istio-iptables` flags, their environment twins and
//! defaults (precedence flag > environment > default), parsed once into a validated [`Config`].

mod flags;
mod host;
mod lists;
mod userdb;

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use flags::usage;
pub use host::{HostInputs, detect_ipv6, parse_resolv_conf};
pub use lists::{Cidr, InboundPorts, IpRanges, OwnerGroups, Port, Ranges};

/// Why the command line, the environment or the host state cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown flag: {0}")]
    UnknownFlag(String),
    #[error("flag needs an argument: {0}")]
    MissingValue(String),
    #[error("argument {0:?} is not valid UTF-8")]
    NotUtf8(String),
    /// A typed flag's command-line value that does not parse (Istio's flag parser rejects it
    /// before the command runs: exit status 255, like any other usage error).
    #[error("invalid argument {value:?} for \"{flag}\" flag: expected {expected}")]
    InvalidArgument {
        flag: String,
        value: String,
        expected: String,
    },
    #[error("invalid value {value:?} for {source_name}: expected {expected}")]
    Invalid {
        source_name: String,
        value: String,
        expected: String,
    },
    #[error("no valid local IP address found")]
    NoLocalIp,
    #[error("failed to list local addresses: {0}")]
    Addresses(String),
    #[error("failed to load {path}: {error}")]
    ResolvConf { path: PathBuf, error: String },
}

/// Exit status of a usage error (unknown flag, missing or unparsable flag value): Istio's
/// `pilot-agent` exits with -1 when its command line does not parse.
pub const USAGE_ERROR_CODE: i32 = 255;

impl Error {
    /// The process exit status for this error: [`USAGE_ERROR_CODE`] when the command line
    /// itself does not parse, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::UnknownFlag(_)
            | Error::MissingValue(_)
            | Error::NotUtf8(_)
            | Error::InvalidArgument { .. } => USAGE_ERROR_CODE,
            _ => 1,
        }
    }

    fn invalid(source_name: &str, value: &str, expected: impl Into<String>) -> Self {
        Error::Invalid {
            source_name: source_name.to_string(),
            value: value.to_string(),
            expected: expected.into(),
        }
    }
}

/// Inbound interception mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterceptionMode {
    Redirect,
    Tproxy,
}

/// Which iptables variant to force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForcedBinary {
    Legacy,
    Nft,
}

/// The fully resolved configuration. List-valued settings are parsed once into typed lists
/// (`config/lists.rs`); a port prints as it was given, because that is what Istio's rules
/// print.
#[derive(Debug, Clone)]
pub struct Config {
    pub proxy_port: u16,
    pub inbound_capture_port: u16,
    pub inbound_tunnel_port: u16,
    /// The proxy's users (`-u`; the uid of `ENVOY_USER` when empty), as given.
    pub proxy_uids: Vec<String>,
    /// The proxy's groups (`-g`; the users when empty), as given.
    pub proxy_gids: Vec<String>,
    pub inbound_interception_mode: InterceptionMode,
    pub inbound_tproxy_mark: u32,
    pub inbound_tproxy_route_table: u32,
    pub inbound_ports_include: InboundPorts,
    pub inbound_ports_exclude: Vec<Port>,
    pub owner_groups: OwnerGroups,
    pub outbound_ports_include: Vec<Port>,
    pub outbound_ports_exclude: Vec<Port>,
    pub outbound_ip_ranges_include: IpRanges,
    pub outbound_ip_ranges_exclude: IpRanges,
    pub reroute_virtual_interfaces: Vec<String>,
    pub exclude_interfaces: Vec<String>,
    pub iptables_probe_port: u16,
    pub probe_timeout: Duration,
    pub dry_run: bool,
    pub skip_rule_apply: bool,
    pub run_validation: bool,
    pub redirect_dns: bool,
    pub drop_invalid: bool,
    pub capture_all_dns: bool,
    pub dual_stack: bool,
    pub network_namespace: String,
    pub cni_mode: bool,
    pub reconcile: bool,
    pub cleanup_only: bool,
    pub force_apply: bool,
    pub force_iptables_binary: Option<ForcedBinary>,
    /// `--native-nftables`: program Istio's `inet` nftables tables instead of iptables.
    pub native_nftables: bool,
    pub host_ipv4_loopback_cidr: String,
    pub log_output_level: String,
    pub log_as_json: bool,
    /// `--log_target`: `stdout`, `stderr` or a file; empty: stderr (stdout carries the
    /// `--dry-run` stream).
    pub log_target: String,
    /// Positional arguments, ignored as Istio's (cobra) command ignores them.
    pub positional: Vec<String>,
    /// Where `--dry-run` writes the command stream (`DRY_RUN_FILE_PATH`).
    pub dry_run_file_path: Option<PathBuf>,
    /// Derived from host addresses: the first usable local address.
    pub host_ip: Option<IpAddr>,
    /// Derived from host addresses: whether the IPv6 rule set is produced.
    pub enable_ipv6: bool,
    /// Nameservers from resolv.conf (canonical text), only read with `--redirect-dns`.
    pub dns_servers_v4: Vec<String>,
    pub dns_servers_v6: Vec<String>,
}

/// Outcome of parsing the command line.
#[derive(Debug)]
pub enum Parsed {
    Help,
    Run(Box<Config>),
}

/// Splits a comma-separated list, dropping empty items (Istio's `config.Split`).
pub fn split(s: &str) -> Vec<&str> {
    s.split(',').filter(|x| !x.is_empty()).collect()
}

/// Parses arguments (without the program name) and the environment into a validated config,
/// reading host state (user database) through `host`. Settings are read in the order their
/// errors are reported.
pub fn parse<I>(args: I, env: &HashMap<String, String>, host: &HostInputs) -> Result<Parsed, Error>
where
    I: IntoIterator<Item = OsString>,
{
    let Some(flags::Args { values, positional }) = flags::parse_args(args)? else {
        return Ok(Parsed::Help);
    };
    flags::check_typed(&values)?;
    let r = Reader {
        values: &values,
        env,
    };
    let inbound_interception_mode = r.choice("istio-inbound-interception-mode", MODES)?;
    let force_iptables_binary = r.choice("force-iptables-binary", BINARIES)?;
    let probe_timeout = r.duration("probe-timeout")?;
    r.probe_port_is_uint16()?;
    let env_only = EnvOnly::read(env)?;
    let (proxy_uids, proxy_gids) = r.proxy_ids(env, host)?;

    let cfg = Config {
        proxy_port: r.port("envoy-port")?,
        inbound_capture_port: r.port("inbound-capture-port")?,
        inbound_tunnel_port: r.port("inbound-tunnel-port")?,
        proxy_uids,
        proxy_gids,
        inbound_interception_mode,
        inbound_tproxy_mark: r.number("istio-inbound-tproxy-mark")?,
        inbound_tproxy_route_table: r.number("istio-inbound-tproxy-route-table")?,
        inbound_ports_include: r.inbound_ports("istio-inbound-ports")?,
        inbound_ports_exclude: r.ports("istio-local-exclude-ports")?,
        owner_groups: env_only.owner_groups,
        outbound_ports_include: r.ports("istio-outbound-ports")?,
        outbound_ports_exclude: r.ports("istio-local-outbound-ports-exclude")?,
        outbound_ip_ranges_include: r.ranges("istio-service-cidr", true)?,
        outbound_ip_ranges_exclude: r.ranges("istio-service-exclude-cidr", false)?,
        iptables_probe_port: r.port("iptables-probe-port")?,
        probe_timeout,
        dry_run: r.boolean("dry-run")?,
        skip_rule_apply: r.boolean("skip-rule-apply")?,
        run_validation: r.boolean("run-validation")?,
        redirect_dns: r.boolean("redirect-dns")?,
        drop_invalid: r.boolean("drop-invalid")?,
        capture_all_dns: r.boolean("capture-all-dns")?,
        dual_stack: r.boolean("dual-stack")?,
        network_namespace: r.text("network-namespace"),
        cni_mode: r.boolean("cni-mode")?,
        reconcile: r.boolean("reconcile")?,
        cleanup_only: r.boolean("cleanup-only")?,
        force_apply: r.boolean("force-apply")?,
        force_iptables_binary,
        native_nftables: r.boolean("native-nftables")?,
        host_ipv4_loopback_cidr: env_only.host_ipv4_loopback_cidr,
        log_output_level: r.text("log_output_level"),
        log_as_json: r.boolean("log_as_json")?,
        log_target: r.text("log_target"),
        positional,
        dry_run_file_path: env
            .get("DRY_RUN_FILE_PATH")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from),
        host_ip: None,
        enable_ipv6: false,
        dns_servers_v4: Vec::new(),
        dns_servers_v6: Vec::new(),
        exclude_interfaces: r.interfaces("istio-exclude-interfaces")?,
        reroute_virtual_interfaces: r.interfaces("kube-virt-interfaces")?,
    };
    Ok(Parsed::Run(Box::new(cfg)))
}

/// The words a [`ValueType::Choice`] flag takes.
struct Choices<T: 'static> {
    words: &'static [(&'static str, T)],
    expected: &'static str,
}

const MODES: Choices<InterceptionMode> = Choices {
    words: &[
        ("TPROXY", InterceptionMode::Tproxy),
        ("", InterceptionMode::Redirect),
        ("REDIRECT", InterceptionMode::Redirect),
    ],
    expected: "REDIRECT or TPROXY",
};

const BINARIES: Choices<Option<ForcedBinary>> = Choices {
    words: &[
        ("", None),
        ("legacy", Some(ForcedBinary::Legacy)),
        ("nft", Some(ForcedBinary::Nft)),
    ],
    expected: "legacy or nft",
};

/// Reads each flag's effective value (command line, environment, default: [`flags::resolve`])
/// as the type the flag table gives it.
struct Reader<'a> {
    values: &'a HashMap<&'static str, String>,
    env: &'a HashMap<String, String>,
}

impl Reader<'_> {
    fn text(&self, name: &str) -> String {
        flags::resolve(name, self.values, self.env).unwrap_or_default()
    }

    /// Where the value came from, for error messages.
    fn source(&self, name: &str) -> String {
        flags::source_name(name, self.values, self.env)
    }

    /// Istio's typed flags (bool, uint16, duration) reject an unparsable command-line value
    /// as a usage error; the same value from the environment is a configuration error.
    fn typed_error(&self, name: &str, value: &str, expected: &str) -> Error {
        if self.values.contains_key(name) {
            Error::InvalidArgument {
                flag: format!("--{name}"),
                value: value.to_string(),
                expected: expected.to_string(),
            }
        } else {
            Error::invalid(&self.source(name), value, expected)
        }
    }

    fn boolean(&self, name: &str) -> Result<bool, Error> {
        match flags::resolve(name, self.values, self.env) {
            None => Ok(false),
            Some(v) => {
                go_syntax::parse_bool(&v).map_err(|_| self.typed_error(name, &v, "true or false"))
            }
        }
    }

    fn port(&self, name: &str) -> Result<u16, Error> {
        parse_port(&self.source(name), &self.text(name))
    }

    /// `--iptables-probe-port` is a uint16 flag: a value outside 0-65535 is a usage error
    /// before any other setting is looked at.
    fn probe_port_is_uint16(&self) -> Result<(), Error> {
        const NAME: &str = "iptables-probe-port";
        let v = self.text(NAME);
        match v.parse::<u16>() {
            Ok(_) => Ok(()),
            Err(_) => Err(self.typed_error(NAME, &v, "a port number in 1-65535")),
        }
    }

    fn number(&self, name: &str) -> Result<u32, Error> {
        let v = self.text(name);
        parse_c_u32(&v).ok_or_else(|| {
            Error::invalid(
                &self.source(name),
                &v,
                "an unsigned 32-bit integer (decimal, 0x hexadecimal or 0 octal)",
            )
        })
    }

    fn duration(&self, name: &str) -> Result<Duration, Error> {
        let v = self.text(name);
        parse_go_duration(&v)
            .ok_or_else(|| self.typed_error(name, &v, "a duration such as 5s or 500ms"))
    }

    fn choice<T: Copy>(&self, name: &str, choices: Choices<T>) -> Result<T, Error> {
        let v = self.text(name);
        choices
            .words
            .iter()
            .find(|(w, _)| *w == v)
            .map(|(_, t)| *t)
            .ok_or_else(|| Error::invalid(&self.source(name), &v, choices.expected))
    }

    fn inbound_ports(&self, name: &str) -> Result<InboundPorts, Error> {
        InboundPorts::parse(&self.source(name), &self.text(name))
    }

    fn ports(&self, name: &str) -> Result<Vec<Port>, Error> {
        lists::ports(&self.source(name), &self.text(name))
    }

    fn ranges(&self, name: &str, allow_wildcard: bool) -> Result<IpRanges, Error> {
        IpRanges::parse(&self.source(name), &self.text(name), allow_wildcard)
    }

    fn interfaces(&self, name: &str) -> Result<Vec<String>, Error> {
        lists::interfaces(&self.source(name), &self.text(name))
    }

    /// `-u` empty means the uid of `ENVOY_USER` (default istio-proxy), else 1337; `-g` empty
    /// means the same ids as the users.
    fn proxy_ids(
        &self,
        env: &HashMap<String, String>,
        host: &HostInputs,
    ) -> Result<(Vec<String>, Vec<String>), Error> {
        let uid_text = self.text("proxy-uid");
        let uids = if uid_text.is_empty() {
            let user = env.get("ENVOY_USER").map_or("istio-proxy", String::as_str);
            let uid = host
                .lookup_uid(user)
                .map_or_else(|| "1337".to_string(), |u| u.to_string());
            vec![uid]
        } else {
            lists::ids(
                &self.source("proxy-uid"),
                &uid_text,
                |n| host.lookup_uid(n).is_some(),
                "a comma-separated list of numeric UIDs or existing user names",
            )?
        };
        let gid_text = self.text("proxy-gid");
        let gids = if gid_text.is_empty() {
            uids.clone()
        } else {
            lists::ids(
                &self.source("proxy-gid"),
                &gid_text,
                |n| host.lookup_gid(n).is_some(),
                "a comma-separated list of numeric GIDs or existing group names",
            )?
        };
        Ok((uids, gids))
    }
}

/// The settings read from the environment only.
struct EnvOnly {
    owner_groups: OwnerGroups,
    host_ipv4_loopback_cidr: String,
}

impl EnvOnly {
    fn read(env: &HashMap<String, String>) -> Result<EnvOnly, Error> {
        let owner_groups = OwnerGroups::parse(
            env.get("ISTIO_OUTBOUND_OWNER_GROUPS")
                .map_or("*", String::as_str),
            env.get("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE")
                .map_or("", String::as_str),
        )?;
        let host_ipv4_loopback_cidr = env
            .get("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR")
            .cloned()
            .unwrap_or_else(|| "127.0.0.1/32".to_string());
        validate_loopback_cidr(&host_ipv4_loopback_cidr)?;
        Ok(EnvOnly {
            owner_groups,
            host_ipv4_loopback_cidr,
        })
    }
}

impl Config {
    /// Fills the host-derived fields: IPv6 enablement from local addresses and, with
    /// `--redirect-dns` (and not `--capture-all-dns`), the nameservers from resolv.conf.
    pub fn detect_host(&mut self, host: &HostInputs) -> Result<(), Error> {
        let addrs = host.addresses()?;
        let (ip, ipv6) = detect_ipv6(&addrs, self.dual_stack)?;
        self.host_ip = Some(ip);
        self.enable_ipv6 = ipv6;
        if self.redirect_dns && !self.capture_all_dns {
            let text =
                std::fs::read_to_string(&host.resolv_conf).map_err(|e| Error::ResolvConf {
                    path: host.resolv_conf.clone(),
                    error: e.to_string(),
                })?;
            let (v4, v6) = parse_resolv_conf(&text);
            self.dns_servers_v4 = v4;
            self.dns_servers_v6 = v6;
        }
        Ok(())
    }
}

/// A port; spaces around it are dropped (Istio copies `15001 ` into the rules, where
/// iptables-restore and nft read past them).
fn parse_port(source: &str, v: &str) -> Result<u16, Error> {
    match v.trim().parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(Error::invalid(source, v, "a port number in 1-65535")),
    }
}

fn validate_loopback_cidr(cidr: &str) -> Result<(), Error> {
    const NAME: &str = "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR";
    let Some(Cidr { addr: ip, bits }) = Cidr::parse(cidr) else {
        return Err(Error::invalid(
            NAME,
            cidr,
            "an IPv4 loopback CIDR such as 127.0.0.1/32",
        ));
    };
    match ip {
        IpAddr::V4(v4) if v4.is_loopback() => {}
        _ => {
            return Err(Error::invalid(
                NAME,
                cidr,
                "an IPv4 loopback address (127.0.0.0/8) in the CIDR",
            ));
        }
    }
    if !(8..=32).contains(&bits) {
        return Err(Error::invalid(
            NAME,
            cidr,
            "a mask length in the range [8, 32]",
        ));
    }
    Ok(())
}

/// Parses a Go `time.Duration` string ("5s", "1m30s", "500ms", "0") with the reader every crate
/// shares ([`go_syntax::parse_duration`]).
/// An unsigned 32-bit number as iptables, nft and `ip rule` read a mark or a table: decimal,
/// `0x` hexadecimal or `0` octal (C's `strtoul` with base 0).
pub fn parse_c_u32(s: &str) -> Option<u32> {
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return u32::from_str_radix(hex, 16)
            .ok()
            .filter(|_| !hex.starts_with('+'));
    }
    if s.len() > 1
        && let Some(oct) = s.strip_prefix('0')
    {
        return u32::from_str_radix(oct, 8)
            .ok()
            .filter(|_| !oct.starts_with('+'));
    }
    s.parse::<u32>().ok().filter(|_| !s.starts_with('+'))
}

pub fn parse_go_duration(s: &str) -> Option<Duration> {
    match go_syntax::parse_duration(s) {
        Ok(d) => Some(d),
        // Go's flag takes a negative duration; as a probe timeout it means no wait at all.
        Err(go_syntax::SyntaxError::Negative) => Some(Duration::ZERO),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::flags::{FLAGS, ValueType};
    use super::*;

    fn host() -> HostInputs {
        HostInputs {
            addresses: Some(vec!["10.0.0.1".parse().unwrap()]),
            resolv_conf: PathBuf::from("/nonexistent/resolv.conf"),
            users: Some(HashMap::from([("istio-proxy".to_string(), 1234)])),
            groups: Some(HashMap::new()),
        }
    }

    /// Spaces around ports, as Istio accepts them (found by the differential suite).
    #[test]
    fn ports_with_spaces_are_accepted() {
        let c = run(&["-p", "15001 ", "-b", "80, 443", "-q", " 3306"], &[]).unwrap();
        assert_eq!(c.proxy_port, 15001);
        let texts = |ports: &[Port]| -> Vec<String> { ports.iter().map(Port::to_string).collect() };
        let InboundPorts::Only(inbound) = &c.inbound_ports_include else {
            panic!("{:?}", c.inbound_ports_include)
        };
        assert_eq!(texts(inbound), ["80", " 443"]);
        assert_eq!(texts(&c.outbound_ports_include), [" 3306"]);
        assert!(run(&["-b", "80, x"], &[]).is_err());
    }

    #[test]
    fn marks_and_tables_read_as_strtoul_does() {
        for (text, want) in [
            ("1337", Some(1337)),
            ("0x539", Some(1337)),
            ("0X539", Some(1337)),
            ("02471", Some(1337)),
            ("0", Some(0)),
            ("4294967295", Some(u32::MAX)),
            ("4294967296", None),
            ("", None),
            ("abc", None),
            ("+1", None),
            ("0x", None),
            ("08", None),
        ] {
            assert_eq!(parse_c_u32(text), want, "{text:?}");
        }
    }

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Config, Error> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match parse(args.iter().map(OsString::from), &env, &host())? {
            Parsed::Run(c) => Ok(*c),
            Parsed::Help => panic!("unexpected help"),
        }
    }

    #[test]
    fn owner_groups_cannot_inject_rules() {
        for var in [
            "ISTIO_OUTBOUND_OWNER_GROUPS",
            "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE",
        ] {
            for bad in [
                "java\n-A ISTIO_OUTPUT -j ACCEPT",
                "java -j ACCEPT",
                "1337; flush ruleset",
                "\"quoted\"",
                "-x",
                "a$b",
                &"g".repeat(33),
            ] {
                let err = run(&[], &[(var, bad)]).unwrap_err().to_string();
                assert!(err.contains(var) && err.contains("group names"), "{err}");
            }
            let ok = run(&[], &[(var, "java,1001,www-data,svc_user.1,machine$")]);
            assert!(ok.is_ok(), "{ok:?}");
        }
        assert!(run(&[], &[("ISTIO_OUTBOUND_OWNER_GROUPS", "*")]).is_ok());
    }

    #[test]
    fn defaults() {
        let c = run(&[], &[]).unwrap();
        assert_eq!(c.proxy_port, 15001);
        assert_eq!(c.inbound_capture_port, 15006);
        assert_eq!(c.inbound_tunnel_port, 15008);
        assert_eq!(c.inbound_tproxy_mark, 1337);
        assert_eq!(c.inbound_tproxy_route_table, 133);
        assert_eq!(c.iptables_probe_port, 15002);
        assert_eq!(c.probe_timeout, Duration::from_secs(5));
        assert_eq!(c.owner_groups.include, None);
        assert_eq!(c.host_ipv4_loopback_cidr, "127.0.0.1/32");
        // -u empty: uid of ENVOY_USER (istio-proxy here), gid = uid.
        assert_eq!(c.proxy_uids, ["1234"]);
        assert_eq!(c.proxy_gids, ["1234"]);
        assert_eq!(c.inbound_interception_mode, InterceptionMode::Redirect);
    }

    #[test]
    fn envoy_user_unknown_falls_back_to_1337() {
        let c = run(&[], &[("ENVOY_USER", "nobody-here")]).unwrap();
        assert_eq!(c.proxy_uids, ["1337"]);
    }

    #[test]
    fn short_long_equals_and_env_precedence() {
        let c = run(
            &[
                "-p",
                "15101",
                "--inbound-capture-port=15106",
                "-m",
                "TPROXY",
                "-b*",
                "-n",
            ],
            &[
                ("INBOUND_CAPTURE_PORT", "1"),
                ("ISTIO_INBOUND_PORTS", "80"),
                ("INBOUND_TUNNEL_PORT", "15208"),
            ],
        )
        .unwrap();
        assert_eq!(c.proxy_port, 15101);
        assert_eq!(c.inbound_capture_port, 15106, "flag beats env");
        assert_eq!(c.inbound_tunnel_port, 15208, "env beats default");
        assert_eq!(c.inbound_ports_include, InboundPorts::All);
        assert_eq!(c.inbound_interception_mode, InterceptionMode::Tproxy);
        assert!(c.dry_run);
    }

    #[test]
    fn alternate_env_names() {
        let c = run(
            &[],
            &[
                ("ISTIO_META_DNS_CAPTURE", "true"),
                ("INVALID_DROP", "1"),
                ("ISTIO_DUAL_STACK", "true"),
            ],
        )
        .unwrap();
        assert!(c.redirect_dns && c.drop_invalid && c.dual_stack);
        let c = run(&["--redirect-dns=false"], &[("REDIRECT_DNS", "true")]).unwrap();
        assert!(!c.redirect_dns);
    }

    #[test]
    fn envoy_port_has_no_env_twin() {
        let c = run(&[], &[("ENVOY_PORT", "1")]).unwrap();
        assert_eq!(c.proxy_port, 15001);
    }

    #[test]
    fn logging_flags_accepted() {
        let c = run(&["--log_output_level=default:debug", "--log_as_json"], &[]).unwrap();
        assert_eq!(c.log_output_level, "default:debug");
        assert!(c.log_as_json);
    }

    /// Istio's VM `istio-start.sh init -p 15001 ...` runs `pilot-agent istio-iptables init -p
    /// 15001 ... [--cleanup-only]`: cobra accepts and ignores positional arguments anywhere,
    /// and everything after `--`. pilot-agent's `--vklog` (klog verbosity) is accepted too.
    #[test]
    fn positional_arguments_and_vklog_are_accepted_and_ignored() {
        let plain = run(&["-p", "15001", "-m", "TPROXY", "--cleanup-only"], &[]).unwrap();
        let with = run(
            &[
                "init",
                "-p",
                "15001",
                "extra",
                "-m",
                "TPROXY",
                "--vklog=9",
                "--cleanup-only",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(with.positional, ["init", "extra"]);
        let (mut a, mut b) = (format!("{plain:?}"), format!("{with:?}"));
        for s in [&mut a, &mut b] {
            let at = s.find("positional").expect("field");
            let end = at + s[at..].find(']').expect("end");
            s.replace_range(at..=end, "");
        }
        assert_eq!(a, b, "positional arguments changed the configuration");
        let c = run(&["--vklog", "3", "--", "-p", "1"], &[]).unwrap();
        assert_eq!(c.positional, ["-p", "1"]);
        assert_eq!(c.proxy_port, 15001, "after --, -p is positional");
    }

    fn err(args: &[&str], env: &[(&str, &str)]) -> String {
        run(args, env).expect_err("must fail").to_string()
    }

    #[test]
    fn bad_input_names_flag_value_and_expectation() {
        let e = err(&["-p", "70000"], &[]);
        assert!(
            e.contains("--envoy-port") && e.contains("70000") && e.contains("1-65535"),
            "{e}"
        );
        let e = err(&["--istio-service-cidr=10.0.0.0/33"], &[]);
        assert!(
            e.contains("--istio-service-cidr") && e.contains("10.0.0.0/33"),
            "{e}"
        );
        let e = err(&["-m", "tproxy"], &[]);
        assert!(
            e.contains("--istio-inbound-interception-mode") && e.contains("REDIRECT or TPROXY"),
            "{e}"
        );
        let e = err(&["-u", "no-such-user-xyz"], &[]);
        assert!(
            e.contains("--proxy-uid") && e.contains("no-such-user-xyz"),
            "{e}"
        );
        let e = err(&[], &[("INBOUND_CAPTURE_PORT", "abc")]);
        assert!(
            e.contains("INBOUND_CAPTURE_PORT") && e.contains("abc"),
            "{e}"
        );
        let e = err(&["--istio-service-exclude-cidr=*"], &[]);
        assert!(e.contains("--istio-service-exclude-cidr"), "{e}");
        let e = err(&["--bogus"], &[]);
        assert!(e.contains("unknown flag: --bogus"), "{e}");
        let e = err(&["-p"], &[]);
        assert!(e.contains("needs an argument"), "{e}");
        let e = err(&["--dry-run=maybe"], &[]);
        assert!(e.contains("--dry-run") && e.contains("maybe"), "{e}");
        let e = err(&["-b", "80,x"], &[]);
        assert!(e.contains("--istio-inbound-ports"), "{e}");
        let e = err(&[], &[("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "10.0.0.1/32")]);
        assert!(e.contains("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR"), "{e}");
        let e = err(&[], &[("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/7")]);
        assert!(e.contains("[8, 32]"), "{e}");
        let e = err(&["--force-iptables-binary=foo"], &[]);
        assert!(e.contains("legacy or nft"), "{e}");
        let e = err(&["--probe-timeout=5x"], &[]);
        assert!(e.contains("--probe-timeout"), "{e}");
    }

    /// Every typed flag of the table is read as its type: a bad value fails, naming the flag.
    #[test]
    fn every_flag_is_read_as_the_table_types_it() {
        for f in FLAGS {
            let bad = match f.value {
                ValueType::Bool => "maybe",
                ValueType::Port => "0",
                ValueType::ProbePort => "70000",
                ValueType::Ids => "no-such-user-xyz",
                ValueType::Choice => "bogus",
                ValueType::InboundPorts | ValueType::Ports => "80,x",
                ValueType::Interfaces => "a/b",
                ValueType::CidrsOrAll => "10.0.0.0/33",
                ValueType::Cidrs => "*",
                ValueType::Number => "abc",
                ValueType::Duration => "5x",
                ValueType::Int => "x",
                ValueType::Text => continue,
            };
            let arg = format!("--{}={bad}", f.long);
            let e = err(&[&arg], &[]);
            assert!(e.contains(&format!("--{}", f.long)), "{arg}: {e}");
        }
    }

    #[test]
    fn trailing_commas_and_empty_values() {
        let c = run(
            &[
                "--istio-local-exclude-ports=6000,7000,",
                "--istio-inbound-ports=",
            ],
            &[],
        )
        .unwrap();
        let exclude: Vec<&str> = c.inbound_ports_exclude.iter().map(Port::as_str).collect();
        assert_eq!(exclude, ["6000", "7000"]);
        assert_eq!(c.inbound_ports_include, InboundPorts::Off);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_go_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("5"), None);
        // The one table every crate's duration settings follow, except that a negative
        // duration (Go's flag takes it) is no wait at all here.
        for (text, want) in go_syntax::DURATION_CASES {
            let got = parse_go_duration(text).map(|d| d.as_nanos() as u64);
            let want = match go_syntax::parse_duration(text) {
                Err(go_syntax::SyntaxError::Negative) => Some(0),
                _ => *want,
            };
            assert_eq!(got, want, "{text:?}");
        }
        assert_eq!(parse_go_duration("-1s"), Some(Duration::ZERO));
    }

    #[test]
    fn prefixes_like_go() {
        assert!(Cidr::parse("10.1.2.3/8").is_some());
        assert!(Cidr::parse("2001:db8::/32").is_some());
        assert!(Cidr::parse("10.0.0.0").is_none());
        assert!(Cidr::parse("10.0.0.0/33").is_none());
        assert!(Cidr::parse("10.0.0.0/08").is_none());
    }
}
