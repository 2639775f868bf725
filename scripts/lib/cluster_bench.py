#!/usr/bin/env python3
"""Pod figures on the local cluster (scripts/cluster.sh), both proxy images in one run.

For each image (ours: proxyv2, Istio's Go agent: proxyv2-istio), in a namespace of its own:
  - pod created → Ready: PODS pods one after another (each created, awaited, deleted; the two
    images alternating), then PODS pods created at once; the time from `kubectl create` returning
    to the watch seeing Ready;
  - per pod memory at idle: the agent's RSS and the istio-proxy container's cgroup memory
    (agent + Envoy), read from the node's /proc and cgroups;
  - istiod's CPU (its container's cpuacct) to bring the PODS pods created at once to Ready.
With --services N, N Services (no endpoints) are created first in a namespace of their own, so
istiod sends every proxy N more clusters. With --istiod-delay-ms D the proxies reach istiod
(xDS and CA) through scripts/lib/delay_relay.py on the node's address, each chunk held D ms each
way (this kernel has no netem): the pods' `proxy.istio.io/config` names the relay as
discoveryAddress and ISTIOD_SAN keeps istiod's certificate name. Prints one table; --json writes
the raw figures.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

STATE = os.environ.get("MESH_CLUSTER_DIR", "/var/tmp/mesh-cluster")
NODE_NETNS = "/run/netns/mesh-node"
NODE_IP = "198.18.0.1"
RELAY_PORT = 15112
KUBECTL = [f"{STATE}/bin/kubectl", "--kubeconfig", f"{STATE}/kubeconfig"]
CGROUP = "/sys/fs/cgroup"


def kubectl(*args: str, stdin: str | None = None) -> str:
    out = subprocess.run([*KUBECTL, *args], input=stdin, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"cluster_bench: kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def fresh_namespace(name: str) -> None:
    """Creates NAME once an earlier run's namespace of that name (deleted without waiting) is gone."""
    subprocess.run([*KUBECTL, "wait", "--for=delete", f"namespace/{name}", "--timeout=300s"],
                   capture_output=True)
    kubectl("create", "namespace", name)


def pod_yaml(ns: str, name: str, proxy: str, app: str, relay: bool) -> str:
    config = ""
    if relay:
        config = (f', proxy.istio.io/config: "{{discoveryAddress: {NODE_IP}:{RELAY_PORT}, '
                  'proxyMetadata: {ISTIOD_SAN: istiod.istio-system.svc}}"')
    return f"""apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
  labels: {{app: bench}}
  annotations: {{sidecar.istio.io/proxyImage: "{proxy}"{config}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {app}
    imagePullPolicy: Never
    args: [--port, "8080"]
    readinessProbe: {{httpGet: {{path: /, port: 8080}}, periodSeconds: 1}}
    resources: {{requests: {{cpu: 10m, memory: 16Mi}}}}
---
"""


class ReadyWatch:
    """`kubectl get pods -w` in a thread: the moment each pod of the namespace was seen Ready."""

    def __init__(self, ns: str):
        self.ready: dict[str, float] = {}
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(
            [*KUBECTL, "get", "pods", "-n", ns, "-w", "--output-watch-events", "-o",
             "jsonpath={.object.metadata.name} {.object.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}"],
            stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            parts = line.split()
            if len(parts) == 2 and parts[1] == "True":
                with self.cond:
                    self.ready.setdefault(parts[0], time.monotonic())
                    self.cond.notify_all()

    def wait(self, names: list[str], timeout: float) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(n in self.ready for n in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [n for n in names if n not in self.ready]
                    sys.exit(f"cluster_bench: not Ready within {timeout} s: {missing}")
                self.cond.wait(left)
            return {n: self.ready[n] for n in names}

    def stop(self) -> None:
        self.proc.terminate()


def container_cgroup(container_id: str, controller: str) -> str | None:
    for root, dirs, _ in os.walk(f"{CGROUP}/{controller}/mesh-node"):
        if container_id in dirs:
            return os.path.join(root, container_id)
    return None


def proxy_memory(ns: str, pod: str) -> tuple[float, float]:
    """(agent RSS MiB, istio-proxy container cgroup memory MiB) of one pod."""
    status = json.loads(kubectl("get", "pod", "-n", ns, pod, "-o", "json"))["status"]
    statuses = status.get("initContainerStatuses", []) + status.get("containerStatuses", [])
    cid = next(s["containerID"].split("://")[1] for s in statuses if s["name"] == "istio-proxy")
    cg = container_cgroup(cid, "memory")
    if cg is None:
        sys.exit(f"cluster_bench: no memory cgroup for {pod}'s istio-proxy ({cid})")
    with open(f"{cg}/memory.usage_in_bytes") as f:
        usage = int(f.read())
    with open(f"{cg}/memory.stat") as f:
        stat = dict(line.split() for line in f)
    working = usage - int(stat.get("total_inactive_file", 0))
    rss = 0
    with open(f"{cg}/cgroup.procs") as f:
        for pid in f.read().split():
            try:
                with open(f"/proc/{pid}/comm") as c:
                    if c.read().strip() != "pilot-agent":
                        continue
                with open(f"/proc/{pid}/status") as s:
                    rss = next(int(l.split()[1]) for l in s if l.startswith("VmRSS:"))
            except OSError:
                continue
    return rss / 1024, working / (1 << 20)


def istiod_cpu_seconds() -> float:
    pod = json.loads(kubectl("get", "pods", "-n", "istio-system", "-l", "app=istiod", "-o", "json"))["items"][0]
    cid = next(s["containerID"].split("://")[1] for s in pod["status"]["containerStatuses"] if s["name"] == "discovery")
    cg = container_cgroup(cid, "cpuacct")
    with open(f"{cg}/cpuacct.usage") as f:
        return int(f.read()) / 1e9


def services(n: int) -> None:
    if n <= 0:
        return
    fresh_namespace("bench-services")
    docs = "".join(
        f"apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bench-services}}\n"
        f"spec: {{ports: [{{name: http, port: 80}}], selector: {{app: none-{i}}}}}\n---\n"
        for i in range(n))
    kubectl("apply", "-f", "-", stdin=docs)


def start_relay(delay_ms: int) -> subprocess.Popen:
    """The delay relay in the node's network namespace, in front of istiod's Service."""
    ip = kubectl("get", "service", "-n", "istio-system", "istiod", "-o", "jsonpath={.spec.clusterIP}")
    relay = subprocess.Popen(
        ["nsenter", f"--net={NODE_NETNS}", "--", sys.executable,
         os.path.join(os.path.dirname(os.path.abspath(__file__)), "delay_relay.py"),
         f"{NODE_IP}:{RELAY_PORT}", f"{ip}:15012", str(delay_ms)],
        stdout=subprocess.PIPE, text=True)
    if relay.stdout.readline().strip() != "ready":
        relay.kill()
        sys.exit("cluster_bench: the delay relay did not start")
    return relay


class Image:
    """One proxy image's namespace, its Ready watch and its figures."""

    def __init__(self, word: str, proxy: str, app: str, relay: bool):
        self.ns, self.proxy, self.app, self.relay = f"bench-{word}", proxy, app, relay
        fresh_namespace(self.ns)
        kubectl("label", "namespace", self.ns, "istio-injection=enabled")
        self.watch = ReadyWatch(self.ns)
        self.figures: dict = {"one_by_one_s": []}

    def create(self, names: list[str]) -> float:
        docs = "".join(pod_yaml(self.ns, n, self.proxy, self.app, self.relay) for n in names)
        kubectl("create", "-f", "-", stdin=docs)
        return time.monotonic()

    def one(self, name: str) -> None:
        t0 = self.create([name])
        self.figures["one_by_one_s"].append(self.watch.wait([name], 300)[name] - t0)
        kubectl("delete", "pod", "-n", self.ns, name, "--wait=false")

    def burst(self, pods: int) -> None:
        cpu0 = istiod_cpu_seconds()
        names = [f"burst-{i}" for i in range(pods)]
        t0 = self.create(names)
        self.figures["at_once_s"] = [t - t0 for t in self.watch.wait(names, 600).values()]
        self.figures["istiod_cpu_s"] = istiod_cpu_seconds() - cpu0
        time.sleep(10)  # idle
        memory = [proxy_memory(self.ns, n) for n in names]
        self.figures["agent_rss_mib"] = [m[0] for m in memory]
        self.figures["proxy_container_mib"] = [m[1] for m in memory]

    def close(self) -> None:
        self.watch.stop()
        kubectl("delete", "namespace", self.ns, "--wait=false")


def run(images: dict[str, Image], pods: int) -> dict:
    """One at a time, the images alternating pod by pod (so load from elsewhere falls on both
    alike); then each image's burst."""
    for i in range(pods):
        for image in images.values():
            image.one(f"seq-{i}")
    for image in images.values():
        image.burst(pods)
        image.close()
    return {word: image.figures for word, image in images.items()}


def p90(xs: list[float]) -> float:
    return sorted(xs)[max(0, int(round(0.9 * len(xs))) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument("--services", type=int, default=0)
    ap.add_argument("--hub", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--istiod-delay-ms", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    app = f"{args.hub}/app:{args.tag}"
    services(args.services)
    relay = start_relay(args.istiod_delay_ms) if args.istiod_delay_ms else None
    try:
        images = {word: Image(word, f"{args.hub}/{image}:{args.tag}", app, relay is not None)
                  for word, image in (("ours", "proxyv2"), ("istio", "proxyv2-istio"))}
        results = run(images, args.pods)
    finally:
        if relay:
            relay.kill()
    if args.services:
        kubectl("delete", "namespace", "bench-services", "--wait=false")
    o, i = results["ours"], results["istio"]
    rows = [
        ("pod created → Ready, one at a time, median (s)", statistics.median(o["one_by_one_s"]), statistics.median(i["one_by_one_s"])),
        ("pod created → Ready, one at a time, p90 (s)", p90(o["one_by_one_s"]), p90(i["one_by_one_s"])),
        (f"{args.pods} pods at once → each Ready, median (s)", statistics.median(o["at_once_s"]), statistics.median(i["at_once_s"])),
        (f"{args.pods} pods at once → each Ready, p90 (s)", p90(o["at_once_s"]), p90(i["at_once_s"])),
        ("agent RSS at idle, median (MiB)", statistics.median(o["agent_rss_mib"]), statistics.median(i["agent_rss_mib"])),
        ("istio-proxy container memory (agent + Envoy), median (MiB)", statistics.median(o["proxy_container_mib"]), statistics.median(i["proxy_container_mib"])),
        (f"istiod CPU to bring {args.pods} pods to Ready (s)", o["istiod_cpu_s"], i["istiod_cpu_s"]),
    ]
    print(f"| with {args.services} extra Services, istiod {args.istiod_delay_ms} ms away | ours | Istio's agent | ratio |")
    print("|---|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a:.2f} | {b:.2f} | {a / b if b else float('nan'):.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"services": args.services, "pods": args.pods,
                       "istiod_delay_ms": args.istiod_delay_ms, **results}, f, indent=1)


if __name__ == "__main__":
    main()
