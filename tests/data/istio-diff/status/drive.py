#!/usr/bin/env python3
"""Drives one pilot-agent's status server through the `status` differential suite (issue #26).

The same program serves both sides: `record.py` runs it with Istio's Go pilot-agent and writes
recorded.jsonl; the Rust test (tests/tests/agent/istio_diff_status.rs) runs it with ours and
compares. So both agents get the same inputs, byte for byte, by construction.

    drive.py --agent <pilot-agent> --out <answers.jsonl> [run-id...]

For every run of cases.jsonl (one agent start), in a fresh network namespace (loopback plus a
veth `eth0` with the pod IP 198.18.0.5/24):
  - the apps on the pod IP's ports: HTTP 8080, HTTPS 8443 (self-signed), a TCP listener 7070,
    gRPC health 9090 (grpcio), a metrics app 9100 (HTTP); port 7071 stays closed;
  - a stand-in Envoy: `binaryPath` is a shell script that logs the signal it gets, and Envoy's
    admin port 15000 and Prometheus port 15090 are served by this program, which answers
    deterministically (the run says which state Envoy is in) and records every call;
  - `pilot-agent proxy sidecar` with ISTIO_KUBE_APP_PROBERS, ISTIO_PROMETHEUS_ANNOTATIONS and
    PROXY_CONFIG from the run;
  - the run's requests to the status port 15020, one at a time, each written as a kubelet or
    Prometheus writes it; for each, one answer line: status code, content-type, body
    (normalised: see README.md) and what the apps and the stand-in Envoy saw.
Needs root (ip netns) and python3 with grpcio (PY_GRPC_DIR, default <repo>/.tools/py-grpc).
"""

import argparse
import concurrent.futures
import gzip
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "../../../.."))
POD_IP = "198.18.0.5"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STATUS_PORT = 15020
PORTS = {"http": 8080, "https": 8443, "tcp": 7070, "grpc": 9090, "metrics": 9100}

# The stand-in Envoy's metrics (Prometheus port 15090) and the metrics app's, as text and as
# OpenMetrics. Every family the suite compares starts with `envoy_` or `app_`.
ENVOY_METRICS = (
    "# TYPE envoy_cluster_upstream_cx_total counter\n"
    'envoy_cluster_upstream_cx_total{cluster_name="xds-grpc"} 3\n'
    "# TYPE envoy_server_live gauge\n"
    "envoy_server_live 1\n"
)
APP_TEXT = (
    "# HELP app_requests_total Requests served.\n"
    "# TYPE app_requests_total counter\n"
    'app_requests_total{code="200"} 1027\n'
    'app_requests_total{code="503"} 3\n'
    "# TYPE app_temperature_celsius gauge\n"
    "app_temperature_celsius 21.5\n"
)
APP_OPENMETRICS = (
    "# HELP app_requests Requests served.\n"
    "# TYPE app_requests counter\n"
    'app_requests_total{code="200"} 1027\n'
    "# TYPE app_build info\n"
    'app_build_info{version="1.2.3"} 1\n'
    "# EOF\n"
)
CT_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CT_OM = "application/openmetrics-text; version=1.0.0; charset=utf-8"


# ---------------------------------------------------------------------------------------------
# The apps and the stand-in Envoy: small HTTP/1.1 servers that record what they saw.


class World:
    """Everything the servers share: the run's behaviour tables and what they saw."""

    def __init__(self, run):
        self.lock = threading.Lock()
        self.routes = run.get("routes", {})  # path -> {status, body, location, delay, headers}
        self.envoy = "live"
        self.envoy_stats = "up"
        self.metrics = "text"
        self.seen = {}

    def log(self, who, what):
        with self.lock:
            self.seen.setdefault(who, []).append(what)

    def take(self):
        with self.lock:
            s, self.seen = self.seen, {}
        return s


def read_head(f):
    """The request line and header lines of one HTTP/1.1 request, or None at EOF."""
    line = f.readline()
    if not line:
        return None
    method, target, _ = (line.decode("latin-1").rstrip("\r\n").split(" ", 2) + ["", ""])[:3]
    headers = []
    while True:
        h = f.readline()
        if not h or h in (b"\r\n", b"\n"):
            break
        name, _, value = h.decode("latin-1").rstrip("\r\n").partition(":")
        headers.append([name.strip().lower(), value.strip()])
    return method, target, headers


def respond(conn, status, body=b"", headers=()):
    reason = {200: "OK", 301: "Moved Permanently", 302: "Found", 307: "Temporary Redirect",
              404: "Not Found", 500: "Internal Server Error", 503: "Service Unavailable"}.get(status, "X")
    out = f"HTTP/1.1 {status} {reason}\r\n"
    for k, v in headers:
        out += f"{k}: {v}\r\n"
    out += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    try:
        conn.sendall(out.encode("latin-1") + body)
    except OSError:
        pass


def serve(listener, handler, wrap=None):
    def one(conn, peer):
        try:
            if wrap:
                conn = wrap(conn)
            conn.settimeout(10)
            f = conn.makefile("rb")
            req = read_head(f)
            if req:
                handler(conn, peer, *req)
        except (OSError, ssl.SSLError):
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def loop():
        while True:
            try:
                conn, peer = listener.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(conn, peer), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()


def listen(port, addr="0.0.0.0"):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(64)
    return s


def start_apps(world, cert_dir):
    def app(name):
        def handler(conn, peer, method, target, headers):
            world.log(name, {"method": method, "target": target, "peer": peer[0],
                             "headers": sorted(headers)})
            r = world.routes.get(target.split("?")[0], {"status": 404, "body": "no such route\n"})
            time.sleep(r.get("delay", 0))
            hs = list(r.get("headers", {}).items())
            if "location" in r:
                hs.append(("Location", r["location"]))
            respond(conn, r["status"], r.get("body", "").encode(), hs)
        return handler

    serve(listen(PORTS["http"]), app("http"))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.path.join(cert_dir, "cert.pem"), os.path.join(cert_dir, "key.pem"))
    serve(listen(PORTS["https"]), app("https"), wrap=lambda c: ctx.wrap_socket(c, server_side=True))

    tcp = listen(PORTS["tcp"])

    def tcp_loop():
        while True:
            try:
                conn, peer = tcp.accept()
            except OSError:
                return
            world.log("tcp", {"peer": peer[0]})
            conn.close()

    threading.Thread(target=tcp_loop, daemon=True).start()

    def metrics(conn, peer, method, target, headers):
        world.log("metrics", {"method": method, "target": target, "peer": peer[0],
                              "headers": sorted(headers)})
        mode = world.metrics
        if mode == "slow":
            time.sleep(2.5)
            mode = "text"
        if mode == "text":
            respond(conn, 200, APP_TEXT.encode(), [("Content-Type", CT_TEXT)])
        elif mode == "text-no-ct":
            respond(conn, 200, APP_TEXT.encode())
        elif mode == "openmetrics":
            respond(conn, 200, APP_OPENMETRICS.encode(), [("Content-Type", CT_OM)])
        elif mode == "openmetrics-0.0.1":
            respond(conn, 200, APP_OPENMETRICS.encode(),
                    [("Content-Type", "application/openmetrics-text; version=0.0.1; charset=utf-8")])
        else:  # "error"
            respond(conn, 500, b"metrics broke\n")

    serve(listen(PORTS["metrics"]), metrics)
    start_grpc(world)


def start_grpc(world):
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    statuses = {"": health_pb2.HealthCheckResponse.SERVING,
                "svc-serving": health_pb2.HealthCheckResponse.SERVING,
                "svc-not-serving": health_pb2.HealthCheckResponse.NOT_SERVING,
                "svc-unknown-status": health_pb2.HealthCheckResponse.SERVICE_UNKNOWN}

    class Health(health_pb2_grpc.HealthServicer):
        def Check(self, request, context):
            ua = dict(context.invocation_metadata()).get("user-agent", "")
            # The gRPC library names itself after the kubelet's User-Agent: that part is the
            # client library's, not the probe's.
            world.log("grpc", {"service": request.service, "user_agent": ua.split(" ")[0],
                               "peer": context.peer().rsplit(":", 1)[0]})
            if request.service == "svc-slow":
                time.sleep(2.5)
            elif request.service not in statuses:
                context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
            return health_pb2.HealthCheckResponse(status=statuses.get(request.service, 1))

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(8))
    health_pb2_grpc.add_HealthServicer_to_server(Health(), server)
    server.add_insecure_port(f"0.0.0.0:{PORTS['grpc']}")
    server.start()
    world.grpc = server


# Envoy's admin stats for each state the run can put the stand-in in.
ENVOY_STATES = {
    "live": {"server.state": 0, "listener_manager.workers_started": 1,
             "cluster_manager.cds.update_success": 1, "cluster_manager.cds.update_rejected": 0,
             "listener_manager.lds.update_success": 1, "listener_manager.lds.update_rejected": 0},
    "no-config": {"server.state": 2, "listener_manager.workers_started": 0,
                  "cluster_manager.cds.update_success": 0, "cluster_manager.cds.update_rejected": 0,
                  "listener_manager.lds.update_success": 0, "listener_manager.lds.update_rejected": 0},
    "cds-only": {"server.state": 2, "listener_manager.workers_started": 0,
                 "cluster_manager.cds.update_success": 1, "cluster_manager.cds.update_rejected": 0,
                 "listener_manager.lds.update_success": 0, "listener_manager.lds.update_rejected": 0},
    "lds-rejected": {"server.state": 2, "listener_manager.workers_started": 0,
                     "cluster_manager.cds.update_success": 1, "cluster_manager.cds.update_rejected": 0,
                     "listener_manager.lds.update_success": 0, "listener_manager.lds.update_rejected": 2},
    "initializing": {"server.state": 3, "listener_manager.workers_started": 0,
                     "cluster_manager.cds.update_success": 1, "cluster_manager.cds.update_rejected": 0,
                     "listener_manager.lds.update_success": 1, "listener_manager.lds.update_rejected": 0},
    "no-workers": {"server.state": 0, "listener_manager.workers_started": 0,
                   "cluster_manager.cds.update_success": 1, "cluster_manager.cds.update_rejected": 0,
                   "listener_manager.lds.update_success": 1, "listener_manager.lds.update_rejected": 0},
    "draining": {"server.state": 1, "listener_manager.workers_started": 1,
                 "cluster_manager.cds.update_success": 1, "cluster_manager.cds.update_rejected": 0,
                 "listener_manager.lds.update_success": 1, "listener_manager.lds.update_rejected": 0},
    # Envoy answers but has none of the stats asked for.
    "stats-missing": {},
}


def start_envoy_standin(world):
    def admin(conn, peer, method, target, headers):
        world.log("admin", {"method": method, "target": target})
        if world.envoy == "admin-error":
            respond(conn, 500, b"admin broke\n")
            return
        path, _, query = target.partition("?")
        if path == "/stats":
            m = re.search(r"(?:^|&)filter=([^&]*)", query)
            pattern = m.group(1) if m else ""
            try:
                rx = re.compile(pattern.replace("%5E", "^").replace("%24", "$").replace("%7C", "|")
                                .replace("%28", "(").replace("%29", ")").replace("%5C", "\\"))
            except re.error:
                rx = re.compile("$^")
            stats = ENVOY_STATES[world.envoy]
            body = "".join(f"{k}: {v}\n" for k, v in sorted(stats.items()) if rx.search(k))
            respond(conn, 200, body.encode(), [("Content-Type", "text/plain; charset=UTF-8")])
        elif path in ("/drain_listeners", "/quitquitquit") and method == "POST":
            respond(conn, 200, b"OK\n", [("Content-Type", "text/plain; charset=UTF-8")])
        elif path == "/ready":
            live = ENVOY_STATES[world.envoy].get("server.state") == 0
            respond(conn, 200 if live else 503, b"LIVE\n" if live else b"PRE_INITIALIZING\n")
        else:
            respond(conn, 404, b"invalid path\n")

    def prometheus(conn, peer, method, target, headers):
        world.log("envoy_prometheus", {"method": method, "target": target,
                                       "headers": sorted(headers)})
        if world.envoy_stats == "error":
            respond(conn, 503, b"no stats\n")
        else:
            respond(conn, 200, ENVOY_METRICS.encode(), [("Content-Type", CT_TEXT)])

    serve(listen(15000, "127.0.0.1"), admin)
    serve(listen(15090), prometheus)


# ---------------------------------------------------------------------------------------------
# The requests: written by hand as the kubelet (Go's net/http) and Prometheus write them.


def send(req):
    """One request to the status port; returns (status, content-type, body) or an error."""
    host = req.get("dial", "127.0.0.1")
    src = req.get("source")
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(20)
    if src:
        s.bind((src, 0))
    s.connect((host, STATUS_PORT))
    head = f"{req['method']} {req['target']} HTTP/1.1\r\n"
    for k, v in req["headers"]:
        head += f"{k}: {v}\r\n"
    head += "Connection: close\r\n\r\n"
    s.sendall(head.encode("latin-1"))
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        if not chunk:
            break
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1]) if lines and lines[0].startswith("HTTP/") else 0
    hdrs = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    if hdrs.get("transfer-encoding", "").lower() == "chunked":
        body = dechunk(body)
    encoding = hdrs.get("content-encoding")
    if encoding == "gzip":
        body = gzip.decompress(body)
    return status, hdrs.get("content-type"), encoding, body.decode("utf-8", "replace")


def dechunk(b):
    out = b""
    while b:
        size, _, rest = b.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        out += rest[:n]
        b = rest[n + 2:]
    return out


def metric_name(line):
    if line.startswith("# "):
        parts = line.split(" ")
        return parts[2] if len(parts) > 2 else ""
    return re.split(r"[{ ]", line, 1)[0]


def normalise_metrics(body):
    """Keeps the families the stand-in Envoy and the app exposed (`envoy_*`, `app_*`) and the
    OpenMetrics `# EOF`, in order; the agent's own metrics (process, runtime, agent counters)
    legitimately differ between a Go and a Rust agent and are dropped."""
    keep = [l for l in body.split("\n")
            if l == "# EOF" or metric_name(l).startswith(("envoy_", "app_"))]
    return "\n".join(keep)


def answer(req, status, ctype, encoding, body):
    if req["target"].startswith(("/stats/prometheus", "/metrics")) and status == 200:
        body = normalise_metrics(body)
    return {"status": status, "content_type": ctype, "content_encoding": encoding, "body": body}


def unescape(s):
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), s)


def normalise_seen(seen):
    """Names of one thing spelled two ways: an admin call's query with or without percent
    escapes (Envoy decodes them), and a scrape's Host `localhost:<port>` or `127.0.0.1:<port>`
    (the same loopback address; Go dials `localhost`). No probe here sends `localhost`."""
    for call in seen.get("admin", []):
        call["target"] = unescape(call["target"])
    for requests in seen.values():
        for r in requests:
            if "headers" in r:
                r["headers"] = sorted([k, re.sub(r"^localhost:", "127.0.0.1:", v) if k == "host" else v]
                                      for k, v in r["headers"])
    return seen


def settle(world, names, quiet=0.3, limit=3.0):
    """Waits until nothing new was seen for `quiet` seconds (asynchronous admin calls)."""
    deadline = time.time() + limit
    last = None
    while time.time() < deadline:
        with world.lock:
            n = sum(len(world.seen.get(k, [])) for k in names)
        if n == last:
            return
        last = n
        time.sleep(quiet)


def inner(args):
    run = json.load(open(args.run))
    scratch = args.scratch
    world = World(run)
    start_apps(world, scratch)
    start_envoy_standin(world)
    signals = os.path.join(scratch, "envoy-signals")
    standin = os.path.join(scratch, "envoy-standin")
    with open(standin, "w") as f:
        f.write("#!/bin/sh\n# stand-in Envoy: logs that it started and the signal that ends it\n"
                f"echo started >> {signals}\n"
                f"trap 'echo TERM >> {signals}; exit 0' TERM\n"
                f"trap 'echo INT >> {signals}; exit 0' INT\n"
                "while :; do sleep 0.1; done\n")
    os.chmod(standin, 0o755)
    os.makedirs(os.path.join(scratch, "etc/istio/proxy"), exist_ok=True)
    env = {
        "PATH": PATH, "CLOUD_PLATFORM": "none", "POD_NAME": "status-diff-0",
        "POD_NAMESPACE": "default", "INSTANCE_IP": POD_IP, "SERVICE_ACCOUNT": "default",
        "ISTIO_BOOTSTRAP": args.template,
        "PROXY_CONFIG": json.dumps({"binaryPath": standin,
                                    "configPath": os.path.join(scratch, "etc/istio/proxy"),
                                    "discoveryAddress": "127.0.0.1:15012",
                                    "terminationDrainDuration": "2s"}, sort_keys=True),
    }
    if run.get("probers") is not None:
        env["ISTIO_KUBE_APP_PROBERS"] = json.dumps(run["probers"], sort_keys=True, separators=(",", ":"))
    if run.get("prometheus") is not None:
        env["ISTIO_PROMETHEUS_ANNOTATIONS"] = json.dumps(run["prometheus"], separators=(",", ":"))
    env.update(run.get("env", {}))
    log = open(os.path.join(scratch, "agent.log"), "w")
    agent = subprocess.Popen([args.agent, "proxy", "sidecar"], cwd=scratch, env=env,
                             stdout=log, stderr=subprocess.STDOUT)
    out = []
    try:
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", STATUS_PORT), timeout=1).close()
                break
            except OSError:
                if agent.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"{run['id']}: the agent's status port never opened "
                                     f"(exit {agent.poll()}); see {scratch}/agent.log")
                time.sleep(0.1)
        deadline = time.time() + 15
        while not os.path.exists(signals) and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        world.take()
        for req in run["requests"]:
            world.envoy = req.get("envoy", "live")
            world.envoy_stats = req.get("envoy_stats", "up")
            world.metrics = req.get("metrics", "text")
            try:
                status, ctype, encoding, body = send(req)
            except OSError as e:
                status, ctype, encoding, body = 0, None, None, f"connection failed: {e.__class__.__name__}"
            result = {"id": req["id"], **answer(req, status, ctype, encoding, body)}
            prober = (run.get("probers") or {}).get(req["target"].split("?")[0], {})
            if status == 200 and prober.get("tcpSocket", {}).get("port") == PORTS["tcp"]:
                # The TCP app logs after accept(); the agent's connect returns before that.
                deadline = time.time() + 5
                while "tcp" not in world.seen and time.time() < deadline:
                    time.sleep(0.02)
            if req["target"] in ("/drain", "/quitquitquit") and status == 200:
                settle(world, ["admin"])
            if req.get("last"):
                try:
                    result["agent_exit"] = agent.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    result["agent_exit"] = "still running after 20s"
                time.sleep(0.3)
                with open(signals) as f:
                    result["envoy_signals"] = f.read().split()[1:]
            seen = world.take()
            result["seen"] = normalise_seen(seen)
            out.append(result)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        log.close()
    with open(args.out, "w") as f:
        for r in out:
            f.write(json.dumps(r, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------
# The outer loop: one network namespace per run.


def one_run(args, run, root, certs):
    scratch = tempfile.mkdtemp(prefix=f"idiff-st-{run['id']}-", dir="/tmp")
    for f in ("cert.pem", "key.pem", "root-cert.pem"):
        shutil.copy(os.path.join(certs, f), scratch)
    os.makedirs(os.path.join(scratch, "var/run/secrets/istio"))
    shutil.copy(os.path.join(certs, "root-cert.pem"), os.path.join(scratch, "var/run/secrets/istio"))
    run_file = os.path.join(scratch, "run.json")
    with open(run_file, "w") as f:
        json.dump(run, f)
    ns = f"idiff-st-{os.getpid()}-{run['id']}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for cmd in (["link", "set", "lo", "up"], ["link", "add", "eth0", "type", "veth", "peer", "name", "peer0"],
                    ["addr", "add", f"{POD_IP}/24", "dev", "eth0"], ["link", "set", "eth0", "up"]):
            subprocess.run(["ip", "-n", ns] + cmd, check=True)
        out = os.path.join(scratch, "answers.jsonl")
        env = dict(os.environ, PYTHONPATH=args.py_grpc, PYTHONUNBUFFERED="1")
        p = subprocess.run(["ip", "netns", "exec", ns, sys.executable, os.path.abspath(__file__),
                            "--inner", "--agent", args.agent, "--run", run_file, "--out", out,
                            "--scratch", scratch, "--template", args.template],
                           env=env, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"run {run['id']} failed: {p.stderr[-2000:]}")
        with open(out) as f:
            answers = [json.loads(l) for l in f]
    finally:
        subprocess.run(["ip", "netns", "del", ns])
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return answers


def outer(args):
    if os.geteuid() != 0:
        print("drive.py needs root (ip netns)", file=sys.stderr)
        sys.exit(2)
    with open(os.path.join(HERE, "cases.jsonl")) as f:
        runs = [json.loads(l) for l in f]
    only = set(args.ids)
    runs = [r for r in runs if not only or r["id"] in only]
    certs = tempfile.mkdtemp(prefix="idiff-st-certs-", dir="/tmp")
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-nodes", "-keyout", os.path.join(certs, "key.pem"), "-out",
                        os.path.join(certs, "cert.pem"), "-subj", "/CN=status-diff app", "-days", "3650",
                        "-addext", f"subjectAltName=IP:{POD_IP}"], check=True, capture_output=True)
        shutil.copy(os.path.join(certs, "cert.pem"), os.path.join(certs, "root-cert.pem"))
        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            results = list(pool.map(lambda r: one_run(args, r, REPO, certs), runs))
    finally:
        shutil.rmtree(certs, ignore_errors=True)
    with open(args.out, "w") as f:
        for answers in results:
            for a in answers:
                f.write(json.dumps(a, sort_keys=True, separators=(",", ":")) + "\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--agent", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--inner", action="store_true")
    p.add_argument("--run")
    p.add_argument("--scratch")
    p.add_argument("--keep", action="store_true", help="keep each run's scratch directory")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--template", required=True,
                   help="Istio's envoy_bootstrap.json (the release module's, in Go's module cache)")
    p.add_argument("--py-grpc", default=os.environ.get("PY_GRPC_DIR") or os.path.join(REPO, ".tools/py-grpc"))
    p.add_argument("ids", nargs="*")
    args = p.parse_args()
    args.template = os.path.abspath(args.template)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.inner:
        inner(args)
    else:
        outer(args)


if __name__ == "__main__":
    main()
