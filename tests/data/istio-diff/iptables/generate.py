#!/usr/bin/env python3
"""Seeded input generator for the `iptables` differential suite (issue #26).

Writes cases.jsonl next to this file: one JSON object per line,
  {"id": "i0001", "host": "v4", "resolv": "r4", "args": [...], "env": {...}}
Every case runs `istio-iptables` with --dry-run (or -n); `host` and `resolv` name the network
namespace state the case runs in (see README.md). The same seed always gives the same file:

    python3 tests/data/istio-diff/iptables/generate.py [--seed 26] [--count 1500]

Coverage: every flag of Istio's `pilot-agent istio-iptables` (tools/istio-iptables/pkg/cmd/root.go),
every environment variable bound to one (flag name upper-cased, '-' -> '_', plus the
ISTIO_META_DNS_CAPTURE / INVALID_DROP / ISTIO_DUAL_STACK aliases), the env-only variables
(ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR, ISTIO_OUTBOUND_OWNER_GROUPS(_EXCLUDE), ENVOY_USER), and the
pilot-agent logging flags the subcommand inherits; valid and invalid values, both backends.
"""

import argparse
import json
import os
import random

PORTS = ["15001", "15006", "15008", "8080", "1", "65535", "0", "65536", "-1", "abc", "", "15001 "]
UIDS = ["1337", "0", "1000", "65534", "4294967295", "abc", "", "1337,1338", "-1"]
MODES = ["REDIRECT", "TPROXY", "", "redirect", "tproxy", "Tproxy", "NONE", "foo"]
PORT_LISTS = [
    "*", "", "80", "80,443", "80,,443", ",80", "9080,9090,15090", "1", "65535", "0", "65536",
    "abc", "80, 443", "8000-9000", "*,80", "22,*",
]
EXCLUDE_PORTS = ["15090,15021,15020", "", "22", "15020", "15090,15021,15020,8080", "abc", "*", "0"]
INTERFACES = ["eth0", "eth0,eth1", "", "veth+", "lo", "eth0,,eth1", "a-very-long-interface-name0"]
CIDRS = [
    "*", "", "10.0.0.0/8", "10.0.0.0/8,172.16.0.0/12", "10.96.0.0/12,192.168.0.0/16",
    "fd00::/8", "10.0.0.0/8,fd00::/8", "2001:db8::/32,10.1.0.0/16", "10.0.0.1/32",
    "10.0.0.1", "bad", "10.0.0.0/33", "127.0.0.1/32", "::1/128", "0.0.0.0/0", "::/0",
    "10.0.0.0/8,,192.168.1.0/24", "10.0.0.5/8", "*,10.0.0.0/8",
]
EXCLUDE_CIDRS = CIDRS + ["169.254.169.254/32", "10.0.0.0/8,127.0.0.0/8"]
OUT_PORTS = ["", "3306", "80,443", "abc", "*", "0", "65535", "3306,,5432"]
MARKS = ["1337", "0", "1", "4294967295", "4294967296", "abc", "", "0x539"]
TABLES = ["133", "0", "1", "255", "abc", "", "100000"]
BOOLS = ["true", "false", "1", "0", "t", "f", "T", "F", "TRUE", "False", "yes", "", "2"]
PROBE_PORTS = ["15002", "0", "65535", "65536", "-1", "abc", ""]
TIMEOUTS = ["5s", "100ms", "1s", "0s", "abc", "1", "-1s", ""]
NETNS = ["", "/var/run/netns/does-not-exist", "relative"]
IPT_BINARIES = ["", "legacy", "nft", "random", "LEGACY"]
LOOPBACK_CIDRS = [
    "127.0.0.1/32", "127.0.0.0/8", "127.1.2.3/16", "10.0.0.0/8", "127.0.0.1/7",
    "127.0.0.1/33", "bad", "::1/128", "", "127.0.0.1",
]
GROUPS = ["*", "", "1000", "1000,2000", "java", "java,1000", ",1000", "1000,,2000",
          ",".join(str(i) for i in range(64)), ",".join(str(i) for i in range(65))]
GROUPS_EXCLUDE = ["", "1000", "1000,2000", "java", "1000,java", "*"]
ENVOY_USERS = ["root", "no-such-user-here", ""]
LOG_FLAGS = [
    ["--log_output_level=default:debug"], ["--log_output_level=all:warn"],
    ["--log_output_level", "default:info"], ["--log_as_json"], ["--log_caller=default"],
    ["--log_stacktrace_level=default:none"], ["--vklog=2"], ["--log_rotate_max_age=3"],
]

# (flag, short, env, values, kind) -- kind "bool" flags may be given bare.
OPTIONS = [
    ("envoy-port", "p", None, PORTS, "str"),  # Bind, not BindEnv: ENVOY_PORT is not read
    ("inbound-capture-port", "z", "INBOUND_CAPTURE_PORT", PORTS, "str"),
    ("inbound-tunnel-port", "e", "INBOUND_TUNNEL_PORT", PORTS, "str"),
    ("proxy-uid", "u", "PROXY_UID", UIDS, "str"),
    ("proxy-gid", "g", "PROXY_GID", UIDS, "str"),
    ("istio-inbound-interception-mode", "m", "ISTIO_INBOUND_INTERCEPTION_MODE", MODES, "str"),
    ("istio-inbound-ports", "b", "ISTIO_INBOUND_PORTS", PORT_LISTS, "str"),
    ("istio-local-exclude-ports", "d", "ISTIO_LOCAL_EXCLUDE_PORTS", EXCLUDE_PORTS, "str"),
    ("istio-exclude-interfaces", "c", "ISTIO_EXCLUDE_INTERFACES", INTERFACES, "str"),
    ("istio-service-cidr", "i", "ISTIO_SERVICE_CIDR", CIDRS, "str"),
    ("istio-service-exclude-cidr", "x", "ISTIO_SERVICE_EXCLUDE_CIDR", EXCLUDE_CIDRS, "str"),
    ("istio-outbound-ports", "q", "ISTIO_OUTBOUND_PORTS", OUT_PORTS, "str"),
    ("istio-local-outbound-ports-exclude", "o", "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE", OUT_PORTS, "str"),
    ("kube-virt-interfaces", "k", "KUBE_VIRT_INTERFACES", INTERFACES, "str"),
    ("istio-inbound-tproxy-mark", "t", "ISTIO_INBOUND_TPROXY_MARK", MARKS, "str"),
    ("istio-inbound-tproxy-route-table", "r", "ISTIO_INBOUND_TPROXY_ROUTE_TABLE", TABLES, "str"),
    ("iptables-probe-port", None, "IPTABLES_PROBE_PORT", PROBE_PORTS, "uint16"),
    ("probe-timeout", None, "PROBE_TIMEOUT", TIMEOUTS, "duration"),
    ("skip-rule-apply", None, "SKIP_RULE_APPLY", BOOLS, "bool"),
    ("redirect-dns", None, "REDIRECT_DNS", BOOLS, "bool"),
    ("drop-invalid", None, "DROP_INVALID", BOOLS, "bool"),
    ("dual-stack", None, "DUAL_STACK", BOOLS, "bool"),
    ("capture-all-dns", None, "CAPTURE_ALL_DNS", BOOLS, "bool"),
    ("network-namespace", None, "NETWORK_NAMESPACE", NETNS, "str"),
    ("cni-mode", None, "CNI_MODE", BOOLS, "bool"),
    ("reconcile", None, "RECONCILE", BOOLS, "bool"),
    ("cleanup-only", None, "CLEANUP_ONLY", BOOLS, "bool"),
    ("force-apply", None, "FORCE_APPLY", BOOLS, "bool"),
    ("force-iptables-binary", None, "FORCE_IPTABLES_BINARY", IPT_BINARIES, "str"),
]
ALIASES = {"redirect-dns": "ISTIO_META_DNS_CAPTURE", "drop-invalid": "INVALID_DROP",
           "dual-stack": "ISTIO_DUAL_STACK"}
ENV_ONLY = [
    ("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", LOOPBACK_CIDRS),
    ("ISTIO_OUTBOUND_OWNER_GROUPS", GROUPS),
    ("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", GROUPS_EXCLUDE),
    ("ENVOY_USER", ENVOY_USERS),
    ("ENVOY_PORT", ["15009", "abc"]),  # not bound to --envoy-port: must change nothing
    ("INBOUND_INTERCEPTION_MODE", ["TPROXY"]),  # registered but unused by istio-iptables
    ("INBOUND_TPROXY_MARK", ["7"]),  # registered but unused by istio-iptables
]
HOSTS = ["v4"] * 6 + ["v6"] * 2 + ["dual"] * 2 + ["none"]
RESOLVS = ["r4", "r6", "r46", "empty"]


def flag_arg(rng, name, short, value, kind):
    """One way of writing --name=value on a command line."""
    forms = ["eq", "sep"]
    if short:
        forms += ["short-sep", "short-eq", "short-glued"]
    if kind == "bool" and value == "true":
        forms += ["bare", "bare"]
    if value == "":
        forms = [f for f in forms if f not in ("sep", "short-sep", "short-glued")] or ["eq"]
    form = rng.choice(forms)
    if form == "eq":
        return [f"--{name}={value}"]
    if form == "sep":
        return [f"--{name}", value]
    if form == "short-sep":
        return [f"-{short}", value]
    if form == "short-eq":
        return [f"-{short}={value}"]
    if form == "short-glued":
        return [f"-{short}{value}"]
    return [f"--{name}"]


def realistic(rng):
    """A sidecar-injector-like command line, mutated a little."""
    mode = rng.choice(["REDIRECT", "REDIRECT", "TPROXY"])
    args = ["-p", "15001", "-z", "15006", "-u", "1337", "-m", mode, "-i", rng.choice(CIDRS[:10]),
            "-x", rng.choice(["", "10.0.0.1/32", "169.254.169.254/32"]), "-b", rng.choice(["*", "80,443", ""]),
            "-d", "15090,15021,15020"]
    if rng.random() < 0.3:
        args += ["--log_output_level=default:info"]
    return args


def case(rng, n):
    args = []
    env = {}
    nft = rng.random() < 0.5
    dry = rng.choice([["--dry-run"], ["-n"], ["--dry-run=true"]])
    if rng.random() < 0.35:
        args += realistic(rng)
    budget = rng.choice([1, 2, 3, 4, 6, 8, 12])
    for name, short, envname, values, kind in rng.sample(OPTIONS, budget):
        value = rng.choice(values)
        # Keep validation probes short: a failing validation waits the probe timeout.
        if name == "probe-timeout" and value in ("5s", "1s", "1", "abc", ""):
            value = "100ms"
        where = rng.random()
        if envname and where < 0.3:
            env[envname] = value
        elif envname and name in ALIASES and where < 0.4:
            env[ALIASES[name]] = value
        else:
            args += flag_arg(rng, name, short, value, kind)
        if name in ALIASES and rng.random() < 0.1:
            env[ALIASES[name]] = rng.choice(BOOLS)
    for envname, values in ENV_ONLY:
        if rng.random() < 0.12:
            env[envname] = rng.choice(values)
    if rng.random() < 0.06:
        env["ENVOY_USER"] = rng.choice(ENVOY_USERS)
    if rng.random() < 0.04:
        # run-validation with dry-run: Istio's validator runs for real; keep the wait short.
        args += ["--run-validation", "--probe-timeout=100ms"]
    if rng.random() < 0.1:
        args += rng.choice(LOG_FLAGS)
    if rng.random() < 0.02:
        args += [rng.choice(["--no-such-flag", "-Z", "--no-such-flag=1"])]
    if rng.random() < 0.02:
        args += ["positional"]
    if nft:
        if rng.random() < 0.8:
            args.append(rng.choice(["--native-nftables", "--native-nftables=true"]))
        else:
            env["NATIVE_NFTABLES"] = "true"
    elif rng.random() < 0.05:
        args.append("--native-nftables=false")
    # First or last: in the middle it could be taken as the value of a flag before it.
    args = dry + args if rng.random() < 0.5 else args + dry
    return {
        "id": f"i{n:04d}",
        "host": rng.choice(HOSTS),
        "resolv": rng.choice(RESOLVS),
        "args": args,
        "env": dict(sorted(env.items())),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--count", type=int, default=1500)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases.jsonl"))
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with open(a.out, "w") as f:
        for n in range(1, a.count + 1):
            f.write(json.dumps(case(rng, n), separators=(",", ":")) + "\n")
    print(f"wrote {a.count} cases to {a.out}")


if __name__ == "__main__":
    main()
