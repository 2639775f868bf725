#!/usr/bin/env python3
"""Generates cases.jsonl for the `status` differential suite (issue #26): seed 26.

One line per run (one agent start): the pod's ISTIO_KUBE_APP_PROBERS (as the injector writes
it: Go's json.Marshal of the probes, ports resolved to numbers), ISTIO_PROMETHEUS_ANNOTATIONS,
the HTTP apps' routes (status, body, redirect, delay) and the requests to the status port, each
one case with the state the stand-in Envoy and the metrics app are in when it is sent.
"""

import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 26
RUNS = 14
POD = "198.18.0.5"
KUBELET = [["Host", f"{POD}:15020"], ["User-Agent", "kube-probe/1.34"], ["Accept", "*/*"]]
CONTAINERS = ["web", "api-server", "worker-1", "c", "sidecar-helper", "metrics-exporter"]

# The HTTP apps' behaviours a probe path can have.
BEHAVIOURS = [
    {"status": 200, "body": "ok\n"},
    {"status": 200, "body": ""},
    {"status": 200, "body": '{"status":"UP"}', "headers": {"Content-Type": "application/json"}},
    {"status": 204},
    {"status": 302, "location": "/healthz-ok"},
    {"status": 301, "location": "/healthz-down"},
    {"status": 307, "location": "http://198.18.0.77:8080/elsewhere"},
    {"status": 302, "location": "/loop"},
    {"status": 302},
    {"status": 404, "body": "not here\n"},
    {"status": 500, "body": "boom\n"},
    {"status": 503, "body": "not ready: warming up\n"},
    {"status": 200, "body": "slow but fine\n", "delay": 1.5},
    {"status": 200, "body": "x" * 12000},
    {"status": 418, "body": "teapot\n"},
]
FIXED_ROUTES = {
    "/healthz-ok": {"status": 200, "body": "ok after redirect\n"},
    "/healthz-down": {"status": 503, "body": "down after redirect\n"},
    "/loop": {"status": 302, "location": "/loop"},
    "/app-metrics": {"status": 200, "body": "# TYPE app_second_target gauge\napp_second_target 7\n",
                     "headers": {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}},
}
GRPC_SERVICES = [None, None, "svc-serving", "svc-not-serving", "svc-unknown-status", "nosuch", "svc-slow"]
READY_STATES = ["no-config", "cds-only", "lds-rejected", "initializing", "no-workers", "draining",
                "stats-missing", "admin-error"]
PROM3 = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
         "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
ACCEPTS = [
    PROM3,
    "text/plain;version=0.0.4;q=1,*/*;q=0.1",
    "*/*",
    None,
    "application/json",
    "application/*",
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,"
    "text/plain;version=0.0.4;q=0.3",
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.6,*/*;q=0.1",
    ";;;",
]
METRIC_MODES = ["text", "text", "openmetrics", "openmetrics", "openmetrics-0.0.1", "text-no-ct", "error", "slow"]


def probe_path(rng):
    p = rng.choice(["/healthz", "/ready", "/live", "/status/health", "healthz", "/q/health/ready",
                    "/health check", "/ünïcode"])
    if rng.random() < 0.35:
        p += rng.choice(["?full=1", "?a=1&b=two", "?x=a%20b", "?"])
    return p


def http_prober(rng, routes, used):
    path = probe_path(rng)
    # Each probe path gets its own behaviour (unique route key).
    key_base = path.split("?")[0]
    if not key_base.startswith("/"):
        key_base = "/" + key_base
    key = key_base
    n = 0
    while key in used:
        n += 1
        key = f"{key_base}-{n}"
    used.add(key)
    path = key + (path[len(path.split("?")[0]):] if "?" in path else "")
    if not path.split("?")[0].lstrip("/") == path.split("?")[0] and rng.random() < 0.2:
        path = path.lstrip("/")
    b = dict(rng.choice(BEHAVIOURS))
    routes[key.replace(" ", "%20").replace("ü", "%C3%BC").replace("ï", "%C3%AF")] = b
    get = {"path": path, "port": 8080, "scheme": "HTTP"}
    if rng.random() < 0.3:
        get["port"], get["scheme"] = 8443, "HTTPS"
    if rng.random() < 0.1:
        get["port"] = 7071  # nobody listens
    headers = []
    if rng.random() < 0.5:
        for _ in range(rng.randint(1, 3)):
            headers.append(rng.choice([
                {"name": "X-Probe", "value": "kubelet"},
                {"name": "Host", "value": rng.choice(["example.com", "app.internal:8080", "Example.COM"])},
                {"name": "Authorization", "value": "Bearer probe-token"},
                {"name": "X-Multi", "value": "a, b"},
                {"name": "User-Agent", "value": "custom-probe/2"},
                {"name": "Accept", "value": "application/json"},
                {"name": "x-lower", "value": "v"},
            ]))
        # The injector keeps the order; duplicates by name are kept as the pod spec has them.
        get["httpHeaders"] = headers
    return {"httpGet": get, "timeoutSeconds": rng.choice([1, 1, 2])}, headers


def make_run(rng, i):
    routes = dict(FIXED_ROUTES)
    used = set(FIXED_ROUTES)
    probers = {}
    probe_headers = {}
    containers = rng.sample(CONTAINERS, rng.randint(1, 3))
    for c in containers:
        for kind in ["readyz", "livez", "startupz"]:
            if rng.random() < 0.2:
                continue
            t = rng.choice(["http", "http", "http", "tcp", "grpc", "grpc"])
            path = f"/app-health/{c}/{kind}"
            if t == "http":
                probers[path], probe_headers[path] = http_prober(rng, routes, used)
            elif t == "tcp":
                probers[path] = {"tcpSocket": {"port": rng.choice([7070, 7070, 7071])},
                                 "timeoutSeconds": 1}
            else:
                probers[path] = {"grpc": {"port": rng.choice([9090, 9090, 9090, 7071]),
                                          "service": rng.choice(GRPC_SERVICES)},
                                 "timeoutSeconds": 1}
        if rng.random() < 0.3:
            path = f"/app-lifecycle/{c}/{rng.choice(['prestopz', 'poststartz'])}"
            probers[path], probe_headers[path] = http_prober(rng, routes, used)

    prom = rng.choice([
        None,
        {"scrape": "true", "path": "/metrics", "port": "9100"},
        {"scrape": "true", "path": "/metrics", "port": "9100"},
        {"scrape": "true", "port": "9100"},
        {"scrape": "true", "path": "/metrics", "port": "7071"},
        {"scrape": "false", "path": "/metrics", "port": "9100"},
        {"scrape": "true", "targets": [{"port": "9100", "path": "/metrics"},
                                       {"port": "8080", "path": "/app-metrics"}]},
    ])
    if i == 1:
        prom = None
    if i == 0:
        prom = {"scrape": "true", "path": "/metrics", "port": "9100"}

    reqs = []

    def req(target, method="GET", headers=None, **kw):
        r = {"method": method, "target": target,
             "headers": headers if headers is not None else KUBELET}
        r.update(kw)
        reqs.append(r)

    # Readiness: states before Envoy is first ready, then ready, then a few after (cached).
    seq = rng.sample(READY_STATES, rng.randint(1, 4)) + ["live"] + rng.sample(READY_STATES, 2)
    ready_reqs = [("/healthz/ready", s) for s in seq]

    probe_reqs = []
    for path in sorted(probers):
        hs = [h for h in KUBELET if not any(x["name"].lower() == h[0].lower() for x in probe_headers.get(path, []))]
        # The kubelet sends one Host: the first the probe names (Go's Request.Host).
        own = probe_headers.get(path, [])
        hosts = [x["value"] for x in own if x["name"].lower() == "host"]
        hs = ([["Host", hosts[0]]] if hosts else []) + \
            [[x["name"], x["value"]] for x in own if x["name"].lower() != "host"] + hs
        probe_reqs.append((path, hs))
        if rng.random() < 0.3:
            probe_reqs.append((path + rng.choice(["?kubelet=1", "/", "%2F"]), hs))
    for c in containers[:1] + ["nosuch"]:
        probe_reqs.append((f"/app-health/{c}/{rng.choice(['readyz', 'notaprobe', 'livez/extra'])}", KUBELET))

    stats_reqs = []
    for _ in range(rng.randint(3, 6)):
        hs = []
        acc = rng.choice(ACCEPTS)
        if acc is not None:
            hs.append(["Accept", acc])
        hs.append(["User-Agent", rng.choice(["Prometheus/3.5.0", "Prometheus/2.53.0", "curl/8.5.0"])])
        mode = rng.choice(METRIC_MODES)
        if rng.random() < 0.6:
            hs.append(["X-Prometheus-Scrape-Timeout-Seconds",
                       "1.5" if mode == "slow" else rng.choice(["10", "10", "abc", "2.5"])])
        if rng.random() < 0.3:
            hs.append(["Accept-Encoding", "gzip"])
        target = rng.choice(["/stats/prometheus", "/stats/prometheus", "/metrics",
                             "/stats/prometheus?usedonly", "/stats/prometheus?filter=cluster&usedonly"])
        stats_reqs.append((target, [["Host", f"{POD}:15020"]] + hs, mode,
                           "error" if rng.random() < 0.1 else "up"))

    misc = [
        ("GET", "/", KUBELET, {}), ("GET", "/nothing-here", KUBELET, {}),
        ("GET", "/healthz", KUBELET, {}), ("GET", "/app-healthz", KUBELET, {}),
        ("GET", "/stats", KUBELET, {}), ("GET", "/quitquitquit", KUBELET, {}),
        ("GET", "/drain", KUBELET, {}), ("PUT", "/drain", KUBELET, {}),
        ("POST", "/healthz/ready", KUBELET, {"envoy": "live"}),
        ("HEAD", "/healthz/ready", KUBELET, {"envoy": "live"}),
        ("POST", "/quitquitquit", [["Host", f"{POD}:15020"]], {"source": POD, "dial": POD}),
        ("POST", "/drain", [["Host", f"{POD}:15020"]], {"source": POD, "dial": POD}),
        ("GET", "/healthz/ready", KUBELET, {"source": POD, "dial": POD}),
        ("DELETE", "/app-health/x/readyz", KUBELET, {}),
        ("HEAD", "/stats/prometheus", [["Host", f"{POD}:15020"], ["Accept-Encoding", "gzip"]], {}),
        ("POST", "/drain", [["Host", "localhost:15020"]], {"dial": "127.0.0.1"}),
    ]
    mixed = []
    for path, state in ready_reqs:
        mixed.append(("ready", path, state))
    rng.shuffle(probe_reqs)
    picked_misc = rng.sample(misc, rng.randint(3, 6))
    # Keep the readiness sequence in order; put the rest around it.
    others = [("probe", p, h) for p, h in probe_reqs] + [("stats",) + s for s in stats_reqs] + \
             [("misc",) + m for m in picked_misc]
    rng.shuffle(others)
    out = []
    ready_iter = iter(mixed)
    for o in others:
        out.append(o)
        if rng.random() < 0.35:
            nxt = next(ready_iter, None)
            if nxt:
                out.append(nxt)
    out.extend(ready_iter)
    for o in out:
        if o[0] == "ready":
            req(o[1], envoy=o[2])
        elif o[0] == "probe":
            req(o[1], headers=o[2])
        elif o[0] == "stats":
            req(o[1], headers=o[2], metrics=o[3], envoy_stats=o[4])
        else:
            req(o[2], method=o[1], headers=o[3], **o[4])

    ending = ["drain-quit", "quit", "none"][i % 3]
    if ending == "drain-quit":
        req("/drain", method="POST", headers=[["Host", "localhost:15020"], ["User-Agent", "curl/8.5.0"]])
    if ending in ("drain-quit", "quit"):
        req("/quitquitquit", method="POST",
            headers=[["Host", "localhost:15020"], ["User-Agent", "curl/8.5.0"], ["Content-Length", "0"]],
            last=True)
    run_id = f"s{i:02d}"
    for n, r in enumerate(reqs):
        r["id"] = f"{run_id}-{n:02d}"
    return {"id": run_id, "probers": probers or None, "prometheus": prom, "routes": routes,
            "requests": reqs}


def main():
    rng = random.Random(SEED)
    with open(os.path.join(HERE, "cases.jsonl"), "w") as f:
        for i in range(RUNS):
            f.write(json.dumps(make_run(rng, i), sort_keys=True, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
