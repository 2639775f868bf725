//! Command line and environment: Istio's `istio-iptables` flags, their environment twins and
//! defaults (precedence flag > environment > default), parsed once into a validated [`Config`].

mod flags;
mod host;
mod userdb;

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use flags::{FLAGS, FlagKind, FlagSpec, usage};
pub use host::{HostInputs, detect_ipv6, parse_resolv_conf, system_addresses};

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

/// The fully resolved configuration. List-valued settings keep Istio's comma-separated text
/// (validated), because that is what the rules print.
#[derive(Debug, Clone)]
pub struct Config {
    pub proxy_port: u16,
    pub inbound_capture_port: u16,
    pub inbound_tunnel_port: u16,
    pub proxy_uid: String,
    pub proxy_gid: String,
    pub inbound_interception_mode: InterceptionMode,
    pub inbound_tproxy_mark: u32,
    pub inbound_tproxy_route_table: u32,
    pub inbound_ports_include: String,
    pub inbound_ports_exclude: String,
    pub owner_groups_include: String,
    pub owner_groups_exclude: String,
    pub outbound_ports_include: String,
    pub outbound_ports_exclude: String,
    pub outbound_ip_ranges_include: String,
    pub outbound_ip_ranges_exclude: String,
    pub reroute_virtual_interfaces: String,
    pub exclude_interfaces: String,
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
/// reading host state (addresses, resolv.conf, user database) through `host`.
pub fn parse<I>(args: I, env: &HashMap<String, String>, host: &HostInputs) -> Result<Parsed, Error>
where
    I: IntoIterator<Item = OsString>,
{
    let Some(flags::Args { values, positional }) = flags::parse_args(args)? else {
        return Ok(Parsed::Help);
    };
    flags::check_typed(&values)?;
    let get = |name: &str| -> Option<String> { flags::resolve(name, &values, env) };
    let string = |name: &str| get(name).unwrap_or_default();
    // Istio's typed flags (bool, uint16, duration) reject an unparsable command-line value
    // as a usage error; the same value from the environment is a configuration error here.
    let typed = |name: &str, v: &str, expected: &str| -> Error {
        if values.contains_key(name) {
            Error::InvalidArgument {
                flag: format!("--{name}"),
                value: v.to_string(),
                expected: expected.to_string(),
            }
        } else {
            Error::invalid(&flags::source_name(name, &values, env), v, expected)
        }
    };
    let boolean = |name: &str| -> Result<bool, Error> {
        match get(name) {
            None => Ok(false),
            Some(v) => go_syntax::parse_bool(&v).map_err(|_| typed(name, &v, "true or false")),
        }
    };
    let port = |name: &str| -> Result<u16, Error> {
        let v = string(name);
        parse_port(&flags::source_name(name, &values, env), &v)
    };
    let number = |name: &str| -> Result<u32, Error> {
        let v = string(name);
        parse_c_u32(&v).ok_or_else(|| {
            Error::invalid(
                &flags::source_name(name, &values, env),
                &v,
                "an unsigned 32-bit integer (decimal, 0x hexadecimal or 0 octal)",
            )
        })
    };
    let port_list = |name: &str, allow_wildcard: bool| -> Result<String, Error> {
        let v = string(name);
        validate_port_list(&flags::source_name(name, &values, env), &v, allow_wildcard)?;
        Ok(v)
    };
    let cidr_list = |name: &str, allow_wildcard: bool| -> Result<String, Error> {
        let v = string(name);
        validate_cidr_list(&flags::source_name(name, &values, env), &v, allow_wildcard)?;
        Ok(v)
    };

    let mode_text = string("istio-inbound-interception-mode");
    let inbound_interception_mode = match mode_text.as_str() {
        "TPROXY" => InterceptionMode::Tproxy,
        "" | "REDIRECT" => InterceptionMode::Redirect,
        other => {
            return Err(Error::invalid(
                &flags::source_name("istio-inbound-interception-mode", &values, env),
                other,
                "REDIRECT or TPROXY",
            ));
        }
    };

    let force_iptables_binary = match string("force-iptables-binary").as_str() {
        "" => None,
        "legacy" => Some(ForcedBinary::Legacy),
        "nft" => Some(ForcedBinary::Nft),
        other => {
            return Err(Error::invalid(
                &flags::source_name("force-iptables-binary", &values, env),
                other,
                "legacy or nft",
            ));
        }
    };

    let probe_timeout_text = string("probe-timeout");
    let probe_timeout = parse_go_duration(&probe_timeout_text).ok_or_else(|| {
        typed(
            "probe-timeout",
            &probe_timeout_text,
            "a duration such as 5s or 500ms",
        )
    })?;
    let probe_port_text = string("iptables-probe-port");
    if probe_port_text.parse::<u16>().is_err() {
        return Err(typed(
            "iptables-probe-port",
            &probe_port_text,
            "a port number in 1-65535",
        ));
    }

    // Env-only settings.
    let owner_groups_include = env
        .get("ISTIO_OUTBOUND_OWNER_GROUPS")
        .cloned()
        .unwrap_or_else(|| "*".to_string());
    let owner_groups_exclude = env
        .get("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE")
        .cloned()
        .unwrap_or_default();
    let host_ipv4_loopback_cidr = env
        .get("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR")
        .cloned()
        .unwrap_or_else(|| "127.0.0.1/32".to_string());
    validate_owner_groups(&owner_groups_include)?;
    validate_group_names("ISTIO_OUTBOUND_OWNER_GROUPS", &owner_groups_include)?;
    validate_group_names("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", &owner_groups_exclude)?;
    validate_loopback_cidr(&host_ipv4_loopback_cidr)?;

    // Proxy uid/gid: -u empty means the uid of ENVOY_USER (default istio-proxy), else 1337.
    let mut proxy_uid = string("proxy-uid");
    if proxy_uid.is_empty() {
        let user = env
            .get("ENVOY_USER")
            .cloned()
            .unwrap_or_else(|| "istio-proxy".to_string());
        proxy_uid = host
            .lookup_uid(&user)
            .map(|u| u.to_string())
            .unwrap_or_else(|| "1337".to_string());
    } else {
        validate_ids(
            &flags::source_name("proxy-uid", &values, env),
            &proxy_uid,
            |n| host.lookup_uid(n).is_some(),
            "a comma-separated list of numeric UIDs or existing user names",
        )?;
    }
    let mut proxy_gid = string("proxy-gid");
    if proxy_gid.is_empty() {
        proxy_gid = proxy_uid.clone();
    } else {
        validate_ids(
            &flags::source_name("proxy-gid", &values, env),
            &proxy_gid,
            |n| host.lookup_gid(n).is_some(),
            "a comma-separated list of numeric GIDs or existing group names",
        )?;
    }

    let cfg = Config {
        proxy_port: port("envoy-port")?,
        inbound_capture_port: port("inbound-capture-port")?,
        inbound_tunnel_port: port("inbound-tunnel-port")?,
        proxy_uid,
        proxy_gid,
        inbound_interception_mode,
        inbound_tproxy_mark: number("istio-inbound-tproxy-mark")?,
        inbound_tproxy_route_table: number("istio-inbound-tproxy-route-table")?,
        inbound_ports_include: port_list("istio-inbound-ports", true)?,
        inbound_ports_exclude: port_list("istio-local-exclude-ports", false)?,
        owner_groups_include,
        owner_groups_exclude,
        outbound_ports_include: port_list("istio-outbound-ports", false)?,
        outbound_ports_exclude: port_list("istio-local-outbound-ports-exclude", false)?,
        outbound_ip_ranges_include: cidr_list("istio-service-cidr", true)?,
        outbound_ip_ranges_exclude: cidr_list("istio-service-exclude-cidr", false)?,
        reroute_virtual_interfaces: string("kube-virt-interfaces"),
        exclude_interfaces: string("istio-exclude-interfaces"),
        iptables_probe_port: port("iptables-probe-port")?,
        probe_timeout,
        dry_run: boolean("dry-run")?,
        skip_rule_apply: boolean("skip-rule-apply")?,
        run_validation: boolean("run-validation")?,
        redirect_dns: boolean("redirect-dns")?,
        drop_invalid: boolean("drop-invalid")?,
        capture_all_dns: boolean("capture-all-dns")?,
        dual_stack: boolean("dual-stack")?,
        network_namespace: string("network-namespace"),
        cni_mode: boolean("cni-mode")?,
        reconcile: boolean("reconcile")?,
        cleanup_only: boolean("cleanup-only")?,
        force_apply: boolean("force-apply")?,
        force_iptables_binary,
        native_nftables: boolean("native-nftables")?,
        host_ipv4_loopback_cidr,
        log_output_level: string("log_output_level"),
        log_as_json: boolean("log_as_json")?,
        positional,
        dry_run_file_path: env
            .get("DRY_RUN_FILE_PATH")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from),
        host_ip: None,
        enable_ipv6: false,
        dns_servers_v4: Vec::new(),
        dns_servers_v6: Vec::new(),
    };
    for (name, list) in [
        ("istio-exclude-interfaces", &cfg.exclude_interfaces),
        ("kube-virt-interfaces", &cfg.reroute_virtual_interfaces),
    ] {
        validate_interfaces(&flags::source_name(name, &values, env), list)?;
    }
    Ok(Parsed::Run(Box::new(cfg)))
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

fn valid_port_item(item: &str) -> bool {
    let ok = |p: &str| {
        matches!(p.parse::<u16>(), Ok(n) if n > 0) && p.bytes().all(|b| b.is_ascii_digit())
    };
    // `80, 443`: the space is copied into the rules as Istio does; iptables-restore and nft
    // read past it.
    let item = item.trim();
    match item.split_once(':') {
        Some((a, b)) => ok(a) && ok(b),
        None => ok(item),
    }
}

fn validate_port_list(source: &str, v: &str, allow_wildcard: bool) -> Result<(), Error> {
    if allow_wildcard && v == "*" {
        return Ok(());
    }
    if split(v).into_iter().all(valid_port_item) {
        Ok(())
    } else {
        let expected = if allow_wildcard {
            "\"*\" or a comma-separated list of ports (1-65535) or port ranges (a:b)"
        } else {
            "a comma-separated list of ports (1-65535) or port ranges (a:b)"
        };
        Err(Error::invalid(source, v, expected))
    }
}

/// Parses a CIDR the way Go's `netip.ParsePrefix` does (address not masked).
pub fn parse_prefix(s: &str) -> Option<(IpAddr, u8)> {
    let (addr, bits) = s.split_once('/')?;
    if bits.is_empty() || bits.len() > 3 || !bits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if bits.len() > 1 && bits.starts_with('0') {
        return None;
    }
    let ip: IpAddr = addr.parse().ok()?;
    let bits: u8 = bits.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (bits <= max).then_some((ip, bits))
}

fn validate_cidr_list(source: &str, v: &str, allow_wildcard: bool) -> Result<(), Error> {
    if v == "*" {
        if allow_wildcard {
            return Ok(());
        }
        return Err(Error::invalid(
            source,
            v,
            "a comma-separated list of CIDRs (the wildcard \"*\" is not allowed for exclusions)",
        ));
    }
    for item in split(v) {
        if parse_prefix(item).is_none() {
            return Err(Error::invalid(
                source,
                v,
                format!("a comma-separated list of CIDRs such as 10.0.0.0/8; {item:?} is not one"),
            ));
        }
    }
    Ok(())
}

fn validate_ids(
    source: &str,
    v: &str,
    exists: impl Fn(&str) -> bool,
    expected: &str,
) -> Result<(), Error> {
    for item in split(v) {
        let numeric = item.bytes().all(|b| b.is_ascii_digit()) && item.parse::<u32>().is_ok();
        if !numeric && !exists(item) {
            return Err(Error::invalid(source, item, expected));
        }
    }
    Ok(())
}

fn validate_interfaces(source: &str, v: &str) -> Result<(), Error> {
    for item in split(v) {
        let ok = item.len() < 16
            && item
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
        if !ok {
            return Err(Error::invalid(
                source,
                item,
                "interface names (at most 15 printable characters, no '/' or ':')",
            ));
        }
    }
    Ok(())
}

const MAX_OWNER_GROUPS_INCLUDE: usize = 64;

fn validate_owner_groups(include: &str) -> Result<(), Error> {
    if include != "*" {
        let n = split(include).len();
        if n > MAX_OWNER_GROUPS_INCLUDE {
            return Err(Error::invalid(
                "ISTIO_OUTBOUND_OWNER_GROUPS",
                include,
                format!("at most {MAX_OWNER_GROUPS_INCLUDE} groups, got {n}"),
            ));
        }
    }
    Ok(())
}

/// Every group in an owner-group list must be a group name or gid: they become words of
/// iptables-restore and `nft -f` input, where a space, newline, quote or `;` would add words,
/// rules or whole lines of the caller's choosing. Names follow `useradd`'s rule: letters,
/// digits, `.`, `_`, `-` (not first), an optional trailing `$`, at most 32 characters.
fn validate_group_names(var: &str, list: &str) -> Result<(), Error> {
    if list == "*" {
        return Ok(());
    }
    for group in split(list) {
        let body = group.strip_suffix('$').unwrap_or(group);
        let valid = group.len() <= 32
            && !body.is_empty()
            && !body.starts_with('-')
            && body
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
        if !valid {
            return Err(Error::invalid(
                var,
                list,
                format!(
                    "comma-separated group names or gids (letters, digits, '.', '_', '-'; \
                     at most 32 characters); {group:?} is not one"
                ),
            ));
        }
    }
    Ok(())
}

fn validate_loopback_cidr(cidr: &str) -> Result<(), Error> {
    const NAME: &str = "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR";
    let Some((ip, bits)) = parse_prefix(cidr) else {
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
        assert_eq!(c.inbound_ports_include, "80, 443");
        assert_eq!(c.outbound_ports_include, " 3306");
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
        assert_eq!(c.owner_groups_include, "*");
        assert_eq!(c.host_ipv4_loopback_cidr, "127.0.0.1/32");
        // -u empty: uid of ENVOY_USER (istio-proxy here), gid = uid.
        assert_eq!(c.proxy_uid, "1234");
        assert_eq!(c.proxy_gid, "1234");
        assert_eq!(c.inbound_interception_mode, InterceptionMode::Redirect);
    }

    #[test]
    fn envoy_user_unknown_falls_back_to_1337() {
        let c = run(&[], &[("ENVOY_USER", "nobody-here")]).unwrap();
        assert_eq!(c.proxy_uid, "1337");
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
        assert_eq!(c.inbound_ports_include, "*");
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
        assert_eq!(split(&c.inbound_ports_exclude), ["6000", "7000"]);
        assert_eq!(c.inbound_ports_include, "");
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
        assert!(parse_prefix("10.1.2.3/8").is_some());
        assert!(parse_prefix("2001:db8::/32").is_some());
        assert!(parse_prefix("10.0.0.0").is_none());
        assert!(parse_prefix("10.0.0.0/33").is_none());
        assert!(parse_prefix("10.0.0.0/08").is_none());
    }
}
