#!/usr/bin/env python3
"""Agent start -> Envoy ready with and without the xDS prefetch (XDS_PROXY_PREFETCH), side by side.

Usage: agent/benches/warm-start.py [pilot-agent] [--rounds N] [--delays MS,MS,...]
  pilot-agent: default target/dist/pilot-agent, else target/release/pilot-agent.
  Each round, for each delay, runs the agent twice, prefetch on and off (which goes first
  alternates by round), in the scenario of agent/benches/start-peak.py: a fresh istiod-lite
  (ISTIOD_LITE, default target/release/istiod-lite) with one ServiceEntry, the agent starting
  real Envoy (ENVOY_BIN, default .tools/bin/envoy) from PROXY_CONFIG, the DNS proxy on, Istio's
  bootstrap template (Delta xDS, as Istio's default). With a delay, the agent reaches istiod-lite
  (xDS and CA alike) through a TCP relay on loopback that holds every chunk that many ms in each
  direction (istiod that far away; the relay is this script, in its own thread).
Per run it prints a JSON row: ready_ms, agent exec -> Envoy's /healthz/ready 200 (certificate,
CDS, EDS, LDS, RDS in Envoy); served, the responses the agent handed Envoy from its prefetch
(istio_agent_xds_proxy_prefetch_served_total). Then, per delay, the medians side by side and
their ratio. Ports 42000-42090 on 127.0.0.1, so it can run beside the other benches.
Nothing leaves 127.0.0.1.
"""
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "scripts", "lib"))
from delay_relay import pipe  # noqa: E402: the relay's delaying pipe, shared with the cluster bench
ISTIOD = os.environ.get("ISTIOD_LITE", f"{REPO}/target/release/istiod-lite")
ENVOY = os.path.realpath(os.environ.get("ENVOY_BIN", f"{REPO}/.tools/bin/envoy"))
TEMPLATE = f"{REPO}/../shared/conformance/istio-bootstrap/envoy_bootstrap.json"
SECURE = 42012
RELAY = 42013

SERVICE = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: httpbin, namespace: demo }
spec:
  hosts: [httpbin.demo.svc.cluster.local]
  addresses: [198.19.0.10]
  ports: [{ number: 80, name: http, protocol: HTTP, targetPort: 8080 }]
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints: [{ address: 198.18.0.5 }]
"""


def http_get(url):
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status, r.read().decode()
    except Exception as e:  # refused, timed out, or an HTTP error with its code
        return getattr(e, "code", 0), ""


class Relay:
    """A TCP relay on 127.0.0.1:RELAY to 127.0.0.1:SECURE holding each chunk `delay_ms` in each
    direction, in order."""

    def __init__(self, delay_ms):
        self.delay = delay_ms / 1000
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(5)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._conn, "127.0.0.1", RELAY, reuse_address=True))
        self.server = server
        self.ready.set()
        self.loop.run_forever()

    async def _pipe(self, reader, writer):
        await pipe(reader, writer, self.delay)

    async def _conn(self, reader, writer):
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", SECURE)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer),
                             return_exceptions=True)

    def close(self):
        async def stop():
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.loop.stop()
        asyncio.run_coroutine_threadsafe(stop(), self.loop)
        self.thread.join(5)
        self.loop.close()


def run_one(agent, prefetch, delay_ms):
    work = tempfile.mkdtemp()
    procs = []
    relay = None
    try:
        for d in ("ca", "config", "pod/var/run/secrets/tokens", "pod/var/run/secrets/istio",
                  "pod/var/lib/istio/envoy"):
            os.makedirs(f"{work}/{d}")
        with open(f"{work}/config/httpbin.yaml", "w") as f:
            f.write(SERVICE)
        procs.append(subprocess.Popen(
            [ISTIOD, "serve", "--config-dir", f"{work}/config", "--ca-dir", f"{work}/ca",
             "--grpc-addr", "127.0.0.1:42010", "--secure-grpc-addr", f"127.0.0.1:{SECURE}",
             "--monitoring-addr", "127.0.0.1:42014"],
            env={"RUST_LOG": "warn", "PATH": os.environ["PATH"]},
            stdout=open(f"{work}/istiod.log", "w"), stderr=subprocess.STDOUT,
            start_new_session=True))
        deadline = time.monotonic() + 30
        while http_get("http://127.0.0.1:42014/ready")[0] != 200:
            if time.monotonic() > deadline:
                sys.exit("istiod-lite not ready in 30 s")
            time.sleep(0.005)
        token = subprocess.check_output([ISTIOD, "token", "--ca-dir", f"{work}/ca", "--namespace",
                                         "demo", "--service-account", "sa"])
        with open(f"{work}/pod/var/run/secrets/tokens/istio-token", "wb") as f:
            f.write(token)
        shutil.copy(f"{work}/ca/root-cert.pem", f"{work}/pod/var/run/secrets/istio/")
        shutil.copy(TEMPLATE, f"{work}/pod/var/lib/istio/envoy/envoy_bootstrap_tmpl.json")
        port = SECURE
        if delay_ms:
            relay = Relay(delay_ms)
            port = RELAY
        env = {
            "PATH": os.environ["PATH"], "POD_NAME": "bench", "POD_NAMESPACE": "demo", "CLOUD_PLATFORM": "none",
            "SERVICE_ACCOUNT": "sa", "INSTANCE_IP": "127.0.0.1",
            "ISTIOD_SAN": "istiod.istio-system.svc", "ECC_SIGNATURE_ALGORITHM": "ECDSA",
            "ISTIO_META_DNS_CAPTURE": "true", "DNS_PROXY_ADDR": "127.0.0.1:42053",
            "ENVOY_STATUS_PORT": "42021", "ENVOY_PROMETHEUS_PORT": "42090",
            "XDS_PROXY_PREFETCH": "true" if prefetch else "false",
            "PROXY_CONFIG": json.dumps({
                "binaryPath": ENVOY, "discoveryAddress": f"127.0.0.1:{port}",
                "proxyAdminPort": 42000, "statusPort": 42020,
                "terminationDrainDuration": "1s"}),
            "RUST_LOG": "warn",
        }
        t0 = time.monotonic()
        agent_proc = subprocess.Popen([agent, "proxy", "sidecar"], cwd=f"{work}/pod", env=env,
                                      stdout=open(f"{work}/agent.log", "w"),
                                      stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(agent_proc)
        ready = None
        while time.monotonic() - t0 < 30:
            if http_get("http://127.0.0.1:42021/healthz/ready")[0] == 200:
                ready = round((time.monotonic() - t0) * 1000)
                break
            time.sleep(0.002)
        if ready is None:
            sys.exit(f"{agent}: not ready in 30 s; see {work}/agent.log")
        served = 0
        for line in http_get("http://127.0.0.1:42020/stats/prometheus")[1].splitlines():
            if line.startswith("istio_agent_xds_proxy_prefetch_served_total "):
                served = int(float(line.split()[1]))
        return {"prefetch": prefetch, "delay_ms": delay_ms, "ready_ms": ready, "served": served}
    finally:
        for p in procs:  # Envoy is in the agent's process group
            try:
                os.killpg(p.pid, 9)
            except OSError:
                pass
            p.wait()
        if relay:
            relay.close()
        shutil.rmtree(work, ignore_errors=True)


def main():
    args = sys.argv[1:]
    rounds, delays, agent = 5, [0, 5], None
    while args:
        a = args.pop(0)
        if a == "--rounds":
            rounds = int(args.pop(0))
        elif a == "--delays":
            delays = [int(d) for d in args.pop(0).split(",")]
        else:
            agent = os.path.realpath(a)
    if agent is None:
        agent = f"{REPO}/target/dist/pilot-agent"
        if not os.path.exists(agent):
            agent = f"{REPO}/target/release/pilot-agent"
    for f in [agent, ISTIOD, ENVOY, TEMPLATE]:
        if not os.path.exists(f):
            sys.exit(f"missing: {f}")
    rows = []
    for r in range(rounds):
        for delay in delays:
            order = [True, False] if r % 2 == 0 else [False, True]
            for prefetch in order:
                row = {"run": r + 1, **run_one(agent, prefetch, delay)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\nagent start -> Envoy ready, median of {rounds} ({agent}):")
    print("delay each way | prefetch on | prefetch off | on / off")
    for delay in delays:
        on = statistics.median(x["ready_ms"] for x in rows if x["delay_ms"] == delay and x["prefetch"])
        off = statistics.median(x["ready_ms"] for x in rows if x["delay_ms"] == delay and not x["prefetch"])
        print(f"{delay} ms | {on} ms | {off} ms | {on / off:.2f}")


if __name__ == "__main__":
    main()
