#!/usr/bin/env python3
"""What the cloud platform's discovery adds to the agent's start when there is no metadata server:
agent exec -> Envoy exec, CLOUD_PLATFORM unset (discovered) against CLOUD_PLATFORM=none, for our
agent and Istio's Go agent, in network namespaces this script makes.

Usage (root: ip netns): sudo python3 agent/benches/platform-start.py [--agent PATH] [--istio PATH]
                        [--runs N] [--template PATH]
  --agent: ours, default target/dist/pilot-agent, else target/release/, else target/debug/.
  --istio: Istio's Go pilot-agent, default the pinned build under /var/cache/mesh-agent/bin/
           (scripts/cluster/build.sh); missing: only ours is measured.
  --template: Istio's envoy_bootstrap.json, default the pinned module's in Go's module cache.

Worlds (each a fresh network namespace, nothing leaves it):
  no-route     loopback only: every metadata request and DNS lookup fails at once.
  blackhole route
               a default route to a peer namespace, and a `blackhole` route for the metadata
               addresses (169.254.169.254, fd00:ec2::254) in the namespace itself: the kernel
               refuses those connections at once (EINVAL); DNS goes to the peer, which refuses
               it (ICMP port unreachable: nothing listens there).
  black-hole   a default route (IPv4 and IPv6) into a peer namespace that drops everything
               silently (a `blackhole` route there): connections to 169.254.169.254 and the
               DNS server of /etc/resolv.conf are never answered.
  black-hole, DNS refused
               the same, with the namespace's resolv.conf (/etc/netns/<ns>/resolv.conf) naming
               127.0.0.1, where nothing listens: DNS fails at once, as a pod's cluster DNS
               answers at once; only the metadata address is silent.
Each run starts `pilot-agent proxy sidecar` in a scratch directory laid out as a pod's (Istio's
relative paths, a root certificate, the mesh config naming a stand-in Envoy as binaryPath and
ISTIO_BOOTSTRAP the template); the stand-in writes bash's $EPOCHREALTIME when exec'd and exits,
and the agent with it. Prints per world and agent the median ms of agent exec -> Envoy exec over
--runs runs (default 5) for `none` and unset, and the difference: the start delay discovery adds.
"""
import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sh(*args):
    subprocess.run(args, check=True, capture_output=True)


def default_agent():
    triple = subprocess.run(["rustc", "-vV"], capture_output=True, text=True).stdout
    triple = next((l.split()[1] for l in triple.splitlines() if l.startswith("host:")), "")
    for p in [f"{REPO}/target/dist/pilot-agent", f"{REPO}/target/{triple}/dist/pilot-agent",
              f"{REPO}/target/release/pilot-agent", f"{REPO}/target/debug/pilot-agent"]:
        if os.path.isfile(p):
            return p
    sys.exit("no pilot-agent build: cargo build -p agent --bin pilot-agent")


def default_istio():
    found = sorted(glob.glob("/var/cache/mesh-agent/bin/istio-*/pilot-agent"))
    return found[-1] if found else None


def default_template():
    gomod = os.environ.get("GOMODCACHE") or subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True).stdout.strip()
    found = sorted(glob.glob(f"{gomod}/istio.io/istio@*/tools/packaging/common/envoy_bootstrap.json"))
    return found[-1] if found else None


class World:
    """A network namespace (and for the black holes its peer), removed on exit."""

    def __init__(self, kind, n):
        self.kind, self.ns = kind, f"plat-{os.getpid()}-{n}"
        self.peer = self.ns + "-p"
        self.netns_etc = f"/etc/netns/{self.ns}"
        sh("ip", "netns", "add", self.ns)
        sh("ip", "-n", self.ns, "link", "set", "lo", "up")
        if kind == "no-route":
            return
        sh("ip", "netns", "add", self.peer)
        sh("ip", "-n", self.peer, "link", "set", "lo", "up")
        sh("ip", "-n", self.ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0",
           "netns", self.peer)
        for ns, v4, v6 in [(self.ns, "198.18.0.1/30", "fd00:18::1/64"),
                           (self.peer, "198.18.0.2/30", "fd00:18::2/64")]:
            sh("ip", "-n", ns, "addr", "add", v4, "dev", "eth0")
            sh("ip", "-n", ns, "addr", "add", v6, "dev", "eth0", "nodad")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", self.ns, "route", "add", "default", "via", "198.18.0.2")
        sh("ip", "-n", self.ns, "-6", "route", "add", "default", "via", "fd00:18::2")
        sh("ip", "netns", "exec", self.peer, "sysctl", "-qw", "net.ipv4.ip_forward=1",
           "net.ipv6.conf.all.forwarding=1")
        sh("ip", "-n", self.peer, "route", "add", "blackhole", "default")
        sh("ip", "-n", self.peer, "-6", "route", "add", "blackhole", "default")
        if kind == "blackhole route":
            sh("ip", "-n", self.ns, "route", "add", "blackhole", "169.254.169.254/32")
            sh("ip", "-n", self.ns, "-6", "route", "add", "blackhole", "fd00:ec2::254/128")
            os.makedirs(self.netns_etc, exist_ok=True)
            with open(f"{self.netns_etc}/resolv.conf", "w") as f:
                f.write("nameserver 198.18.0.2\n")
        if kind == "black-hole, DNS refused":
            os.makedirs(self.netns_etc, exist_ok=True)
            with open(f"{self.netns_etc}/resolv.conf", "w") as f:
                f.write("nameserver 127.0.0.1\n")

    def close(self):
        for ns in [self.ns, self.peer]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(self.netns_etc, ignore_errors=True)


def lay_out(d, root_cert, standin):
    for sub in ["etc/istio/proxy", "etc/istio/pod", "etc/istio/config", "var/run/secrets/istio"]:
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    with open(os.path.join(d, "etc/istio/config/mesh"), "w") as f:
        f.write(f"defaultConfig:\n  binaryPath: {standin}\n  configPath: {d}/etc/istio/proxy\n")
    with open(os.path.join(d, "var/run/secrets/istio/root-cert.pem"), "w") as f:
        f.write(root_cert)


def one_run(world, agent, cloud, template, root_cert):
    """ms from agent exec to Envoy exec, or None when Envoy was not started within 30 s."""
    d = tempfile.mkdtemp(prefix="plat-")
    mark = os.path.join(d, "envoy-exec")
    standin = os.path.join(d, "envoy")
    with open(standin, "w") as f:
        f.write(f'#!/bin/bash\necho "$EPOCHREALTIME" > {mark}\nexit 0\n')
    os.chmod(standin, 0o755)
    lay_out(d, root_cert, standin)
    env = {"PATH": PATH, "POD_NAME": "bench", "POD_NAMESPACE": "default",
           "INSTANCE_IP": "198.18.0.1", "ISTIO_BOOTSTRAP": template}
    if cloud:
        env["CLOUD_PLATFORM"] = cloud
    start = time.time()
    try:
        subprocess.run(["ip", "netns", "exec", world.ns, agent, "proxy", "sidecar"], env=env,
                       cwd=d, capture_output=True, timeout=30)
    except subprocess.TimeoutExpired:
        pass
    try:
        with open(mark) as f:
            return (float(f.read().strip()) - start) * 1000
    except (OSError, ValueError):
        return None
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", default=None)
    ap.add_argument("--istio", default=None)
    ap.add_argument("--template", default=None)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("platform-start: needs root (ip netns)")
    agents = [("ours", os.path.realpath(a.agent or default_agent()))]
    istio = a.istio or default_istio()
    if istio and os.path.isfile(istio):
        agents.append(("istio", istio))
    else:
        print("platform-start: no Istio pilot-agent found; ours only", file=sys.stderr)
    template = a.template or default_template()
    if not template or not os.path.isfile(template):
        sys.exit("platform-start: no envoy_bootstrap.json (--template)")
    root_cert = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", "/dev/null", "-subj", "/CN=platform-start", "-days", "1"],
        check=True, capture_output=True, text=True).stdout
    for name, path in agents:
        print(f"# {name}: {path}")
    print(f"# runs: {a.runs}; ms from agent exec to Envoy exec, median (min-max)")
    print(f"{'world':26} {'agent':6} {'CLOUD_PLATFORM=none':>22} {'unset':>22} {'added':>8}")
    worlds = ["no-route", "blackhole route", "black-hole", "black-hole, DNS refused"]
    for n, kind in enumerate(worlds):
        world = World(kind, n)
        try:
            for name, path in agents:
                runs = {"none": [], "": []}
                for _ in range(a.runs):
                    for cloud in runs:  # alternated, so drift hits both alike
                        runs[cloud].append(one_run(world, path, cloud, template, root_cert))
                cells = []
                for cloud in ["none", ""]:
                    ok = [r for r in runs[cloud] if r is not None]
                    if not ok:
                        cells.append((None, "no Envoy"))
                        continue
                    m = statistics.median(ok)
                    cells.append((m, f"{m:.0f} ({min(ok):.0f}-{max(ok):.0f})"))
                added = (f"{cells[1][0] - cells[0][0]:+.0f}"
                         if cells[0][0] is not None and cells[1][0] is not None else "-")
                print(f"{kind:26} {name:6} {cells[0][1]:>22} {cells[1][1]:>22} {added:>8}",
                      flush=True)
        finally:
            world.close()


if __name__ == "__main__":
    main()
