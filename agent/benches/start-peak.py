#!/usr/bin/env python3
"""The agent's start peak RSS, sampled: what issue 27's "start peak" (VmHWM) is made of.

Usage: agent/benches/start-peak.py [pilot-agent ...] [--runs N] [--idle] [--wrap "CMD ..."]
  Each binary (default target/dist/pilot-agent) runs N times (3), one after the other, in the
  scenario of `run_one` in scripts/bench-side-by-side.sh: a fresh istiod-lite
  (ISTIOD_LITE, default target/release/istiod-lite), the agent starting real Envoy (ENVOY_BIN,
  default .tools/bin/envoy) from PROXY_CONFIG, the DNS proxy on, Istio's bootstrap template.
  Ports 41000-41090 on 127.0.0.1, so it can run beside the side-by-side bench (37xxx).
Per run it prints: ready_ms (exec -> Envoy's /healthz/ready 200); the largest VmRSS sampled
every 2 ms over the first 3 s with its file-backed / anonymous split and when it was seen;
VmHWM 10 s after exec; with --idle, VmRSS 5 s and 35 s after ready, as the bench reads them.
--wrap runs the agent under a command (agent/benches/start-order.sh: valgrind's callgrind) and
ends it with SIGINT, so the wrapper can write its output; its figures are then the wrapper's.
Nothing leaves 127.0.0.1.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
ISTIOD = os.environ.get("ISTIOD_LITE", f"{REPO}/target/release/istiod-lite")
ENVOY = os.path.realpath(os.environ.get("ENVOY_BIN", f"{REPO}/.tools/bin/envoy"))
TEMPLATE = f"{REPO}/../shared/conformance/istio-bootstrap/envoy_bootstrap.json"


def http_code(url):
    try:
        return urllib.request.urlopen(url, timeout=1).status
    except Exception as e:  # refused, timed out, or an HTTP error with its code
        return getattr(e, "code", 0)


def status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def run_one(agent, idle, wrap):
    work = tempfile.mkdtemp()
    procs = []
    try:
        for d in ("ca", "config", "pod/var/run/secrets/tokens", "pod/var/run/secrets/istio",
                  "pod/var/lib/istio/envoy"):
            os.makedirs(f"{work}/{d}")
        procs.append(subprocess.Popen(
            [ISTIOD, "serve", "--config-dir", f"{work}/config", "--ca-dir", f"{work}/ca",
             "--grpc-addr", "127.0.0.1:41010", "--secure-grpc-addr", "127.0.0.1:41012",
             "--monitoring-addr", "127.0.0.1:41014"],
            env={"RUST_LOG": "warn", "PATH": os.environ["PATH"]},
            stdout=open(f"{work}/istiod.log", "w"), stderr=subprocess.STDOUT,
            start_new_session=True))
        deadline = time.monotonic() + 30
        while http_code("http://127.0.0.1:41014/ready") != 200:
            if time.monotonic() > deadline:
                sys.exit("istiod-lite not ready in 30 s")
            time.sleep(0.005)
        token = subprocess.check_output([ISTIOD, "token", "--ca-dir", f"{work}/ca", "--namespace",
                                         "demo", "--service-account", "sa"])
        with open(f"{work}/pod/var/run/secrets/tokens/istio-token", "wb") as f:
            f.write(token)
        shutil.copy(f"{work}/ca/root-cert.pem", f"{work}/pod/var/run/secrets/istio/")
        shutil.copy(TEMPLATE, f"{work}/pod/var/lib/istio/envoy/envoy_bootstrap_tmpl.json")
        env = {
            "PATH": os.environ["PATH"], "POD_NAME": "bench", "POD_NAMESPACE": "demo", "CLOUD_PLATFORM": "none",
            "SERVICE_ACCOUNT": "sa", "INSTANCE_IP": "127.0.0.1",
            "ISTIOD_SAN": "istiod.istio-system.svc", "ECC_SIGNATURE_ALGORITHM": "ECDSA",
            "ISTIO_META_DNS_CAPTURE": "true", "DNS_PROXY_ADDR": "127.0.0.1:41053",
            "ENVOY_STATUS_PORT": "41021", "ENVOY_PROMETHEUS_PORT": "41090",
            "PROXY_CONFIG": json.dumps({
                "binaryPath": ENVOY, "discoveryAddress": "127.0.0.1:41012",
                "proxyAdminPort": 41000, "statusPort": 41020,
                "terminationDrainDuration": "1s"}),
            "RUST_LOG": "warn",
        }
        ready = []
        t0 = time.monotonic()

        def watch_ready():
            while time.monotonic() - t0 < 30:
                if http_code("http://127.0.0.1:41021/healthz/ready") == 200:
                    ready.append(round((time.monotonic() - t0) * 1000))
                    return
                time.sleep(0.005)

        threading.Thread(target=watch_ready, daemon=True).start()
        agent_proc = subprocess.Popen(wrap + [agent, "proxy", "sidecar"], cwd=f"{work}/pod", env=env,
                                      stdout=open(f"{work}/agent.log", "w"),
                                      stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(agent_proc)
        pid = agent_proc.pid
        peak, peak_ms = {}, 0
        while time.monotonic() - t0 < 3:
            s = status(pid)
            if s.get("VmRSS", 0) > peak.get("VmRSS", 0):
                peak, peak_ms = s, round((time.monotonic() - t0) * 1000)
            time.sleep(0.002)
        while not ready and time.monotonic() - t0 < 30:
            time.sleep(0.01)
        if not ready:
            sys.exit(f"{agent}: not ready in 30 s; see {work}/agent.log")
        time.sleep(max(0.0, 10 - (time.monotonic() - t0)))
        row = {"ready_ms": ready[0], "sampled_peak_kib": peak.get("VmRSS"),
               "file_kib": peak.get("RssFile"), "anon_kib": peak.get("RssAnon"),
               "at_ms": peak_ms, "hwm10_kib": status(pid).get("VmHWM")}
        if idle:
            time.sleep(max(0.0, ready[0] / 1000 + 5 - (time.monotonic() - t0)))
            row["rss5_kib"] = status(pid).get("VmRSS")
            time.sleep(max(0.0, ready[0] / 1000 + 35 - (time.monotonic() - t0)))
            row["rss35_kib"] = status(pid).get("VmRSS")
            row["hwm35_kib"] = status(pid).get("VmHWM")
        return row
    finally:
        if wrap and len(procs) == 2:  # the agent shuts down on SIGINT; the wrapper then exits
            os.kill(procs[1].pid, signal.SIGINT)
            try:
                procs[1].wait(60)
            except subprocess.TimeoutExpired:
                pass
        for p in procs:  # Envoy is in the agent's process group
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


def main():
    args = sys.argv[1:]
    runs, idle, wrap, agents = 3, False, [], []
    while args:
        a = args.pop(0)
        if a == "--runs":
            runs = int(args.pop(0))
        elif a == "--idle":
            idle = True
        elif a == "--wrap":
            wrap = args.pop(0).split()
        else:
            agents.append(os.path.realpath(a))
    agents = agents or [f"{REPO}/target/dist/pilot-agent"]
    for f in agents + [ISTIOD, ENVOY, TEMPLATE]:
        if not os.path.exists(f):
            sys.exit(f"missing: {f}")
    for r in range(runs):
        for agent in agents:
            print(json.dumps({"agent": agent, "run": r + 1, **run_one(agent, idle, wrap)}), flush=True)


if __name__ == "__main__":
    main()
