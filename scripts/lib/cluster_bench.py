#!/usr/bin/env python3
"""Pod figures on the local cluster (scripts/cluster.sh), both proxy images in one run.

For each image (ours: proxyv2, Istio's Go agent: proxyv2-istio), in a namespace of its own:
  - pod created → Ready: PODS pods one after another (each created, awaited, deleted), then PODS
    pods created at once; the time from `kubectl create` returning to the watch seeing Ready;
  - per pod memory at idle: the agent's RSS and the istio-proxy container's cgroup memory
    (agent + Envoy), read from the node's /proc and cgroups;
  - istiod's CPU (its container's cpuacct) to bring the PODS pods created at once to Ready.
With --services N, N Services (no endpoints) are created first in a namespace of their own, so
istiod sends every proxy N more clusters. Prints one table; --json writes the raw figures.
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
KUBECTL = [f"{STATE}/bin/kubectl", "--kubeconfig", f"{STATE}/kubeconfig"]
CGROUP = "/sys/fs/cgroup"


def kubectl(*args: str, stdin: str | None = None) -> str:
    out = subprocess.run([*KUBECTL, *args], input=stdin, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"cluster_bench: kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def pod_yaml(ns: str, name: str, proxy: str, app: str) -> str:
    return f"""apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
  labels: {{app: bench}}
  annotations: {{sidecar.istio.io/proxyImage: "{proxy}"}}
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
    kubectl("create", "namespace", "bench-services")
    docs = "".join(
        f"apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bench-services}}\n"
        f"spec: {{ports: [{{name: http, port: 80}}], selector: {{app: none-{i}}}}}\n---\n"
        for i in range(n))
    kubectl("apply", "-f", "-", stdin=docs)


def run_image(word: str, proxy: str, app: str, pods: int) -> dict:
    ns = f"bench-{word}"
    kubectl("create", "namespace", ns)
    kubectl("label", "namespace", ns, "istio-injection=enabled")
    watch = ReadyWatch(ns)
    one_by_one = []
    for i in range(pods):
        name = f"seq-{i}"
        kubectl("create", "-f", "-", stdin=pod_yaml(ns, name, proxy, app))
        t0 = time.monotonic()
        one_by_one.append(watch.wait([name], 300)[name] - t0)
        kubectl("delete", "pod", "-n", ns, name, "--wait=false")
    cpu0 = istiod_cpu_seconds()
    names = [f"burst-{i}" for i in range(pods)]
    kubectl("create", "-f", "-", stdin="".join(pod_yaml(ns, n, proxy, app) for n in names))
    t0 = time.monotonic()
    at_once = [t - t0 for t in watch.wait(names, 600).values()]
    cpu = istiod_cpu_seconds() - cpu0
    time.sleep(10)  # idle
    memory = [proxy_memory(ns, n) for n in names]
    watch.stop()
    kubectl("delete", "namespace", ns, "--wait=false")
    return {"one_by_one_s": one_by_one, "at_once_s": at_once, "istiod_cpu_s": cpu,
            "agent_rss_mib": [m[0] for m in memory], "proxy_container_mib": [m[1] for m in memory]}


def p90(xs: list[float]) -> float:
    return sorted(xs)[max(0, int(round(0.9 * len(xs))) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument("--services", type=int, default=0)
    ap.add_argument("--hub", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--json")
    args = ap.parse_args()
    app = f"{args.hub}/app:{args.tag}"
    services(args.services)
    results = {}
    for word, image in (("ours", "proxyv2"), ("istio", "proxyv2-istio")):
        results[word] = run_image(word, f"{args.hub}/{image}:{args.tag}", app, args.pods)
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
    print(f"| with {args.services} extra Services | ours | Istio's agent | ratio |")
    print("|---|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a:.2f} | {b:.2f} | {a / b if b else float('nan'):.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"services": args.services, "pods": args.pods, **results}, f, indent=1)


if __name__ == "__main__":
    main()
