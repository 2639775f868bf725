#!/usr/bin/env bash
# Our pilot-agent and Istio's Go pilot-agent side by side, same scenario, same run (issue 27).
# Usage: PEER_AGENT=<Istio's pilot-agent> scripts/bench-side-by-side.sh [our-pilot-agent] [rounds]
#   our pilot-agent: default target/dist/pilot-agent (scripts/build-dist.sh), else target/release/pilot-agent;
#   ISTIOD_LITE (default target/release/istiod-lite), ENVOY_BIN (default .tools/bin/envoy);
#   EDS_HOSTS (default 2000): endpoints of the ServiceEntry pushed for the EDS memory figure.
# Each round starts a fresh istiod-lite and, one after the other in the same round, each agent
# with real Envoy (the agent starts Envoy from PROXY_CONFIG's binaryPath, as in a pod), the DNS
# proxy on, the same token, root, environment and Istio's own bootstrap template. Per agent it
# prints:
#   ready_ms   agent exec -> Envoy's /healthz/ready 200 (through xDS, SDS, NDS);
#   cert_ms    agent exec -> the workload certificate in Envoy's /certs;
#   rss5/rss35 agent VmRSS after 5 s and 35 s idle with Envoy connected (KiB), peak = VmHWM;
#   resync_ms  istiod-lite SIGKILLed, started again at once: its /ready -> Envoy's connection
#              SYNCED again in its /debug/syncz (Istio's agent closes Envoy's stream, Envoy
#              reconnects on its own backoff; ours keeps it and replays);
#   eds_kib    agent VmRSS (and VmHWM) once a ServiceEntry with EDS_HOSTS endpoints is acked;
#   dns        DNS table hits: DNS_NAMES (200) ServiceEntries in NDS, dnsperf (4 clients, 64
#              outstanding, DNS_SECONDS) against the agent's DNS proxy: q/s and agent CPU per
#              query (utime + stime of the agent process; Envoy is a separate process).
# Then the ratios ours / Istio's with the issue's goals. Nothing leaves 127.0.0.1.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
peer="${PEER_AGENT:-}"
[ -n "$peer" ] || { echo "set PEER_AGENT to the pilot-agent of Istio (e.g. $ISTIO_GO_BIN/pilot-agent)" >&2; exit 2; }
ours="${1:-}"
if [ -z "$ours" ]; then
  ours="$repo/target/dist/pilot-agent"
  [ -x "$ours" ] || ours="$repo/target/release/pilot-agent"
fi
rounds="${2:-3}"
istiod="${ISTIOD_LITE:-$repo/target/release/istiod-lite}"
envoy="${ENVOY_BIN:-$repo/.tools/bin/envoy}"
template="${ISTIO_BOOTSTRAP_TEMPLATE:-$repo/../shared/conformance/istio-bootstrap/envoy_bootstrap.json}"
eds_hosts="${EDS_HOSTS:-2000}"
for f in "$ours" "$peer" "$istiod" "$envoy" "$template"; do
  [ -e "$f" ] || { echo "missing: $f" >&2; exit 1; }
done
ours="$(realpath "$ours")" peer="$(realpath "$peer")" istiod="$(realpath "$istiod")"
envoy="$(realpath "$envoy")" template="$(realpath "$template")"
work="$(mktemp -d)"
groups=()
cleanup() {
  for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
status_kib() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }

start_istiod() { # $1: work dir
  setsid env RUST_LOG=warn "$istiod" serve --config-dir "$1/config" --ca-dir "$1/ca" \
    --grpc-addr 127.0.0.1:37010 --secure-grpc-addr 127.0.0.1:37012 --monitoring-addr 127.0.0.1:37014 \
    >>"$1/istiod.log" 2>&1 &
  istiod_pid=$!
  groups+=("$istiod_pid")
  until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 http://127.0.0.1:37014/ready)" = 200 ]; do
    sleep 0.005
  done
}

# SYNCED for the proxy bench.demo in istiod-lite's /debug/syncz: CDS and LDS acked, nothing stale.
synced() {
  curl -s --max-time 1 http://127.0.0.1:37014/debug/syncz | python3 -c '
import json, sys
rows = [r for r in json.load(sys.stdin) if "bench.demo" in r.get("proxy", "")]
ok = len(rows) == 1 and all(
    t.get("status") == "SYNCED" or (k not in ("CDS", "LDS") and t.get("status") == "NOT SENT")
    for k, t in rows[0]["types"].items())
sys.exit(0 if ok else 1)' 2>/dev/null
}

eds_config() { # ServiceEntry with $eds_hosts static endpoints
  python3 - "$eds_hosts" <<'EOF'
import sys
n = int(sys.argv[1])
print("apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: { name: big, namespace: demo }\nspec:")
print("  hosts: [big.demo.svc.cluster.local]\n  addresses: [198.19.1.1]")
print("  ports: [{ number: 8080, name: http, protocol: HTTP }]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  endpoints:")
for i in range(n):
    print("  - { address: 198.18.%d.%d }" % (10 + i // 250, 1 + i % 250))
EOF
}

dns_names="${DNS_NAMES:-200}"
dns_secs="${DNS_SECONDS:-5}"
dns_config() { # $dns_names ServiceEntries with one address each, for the NDS table
  python3 - "$dns_names" <<'EOF'
import sys
for i in range(int(sys.argv[1])):
    print("---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry")
    print("metadata: { name: svc-%d, namespace: demo }\nspec:" % i)
    print("  hosts: [svc-%d.demo.svc.cluster.local]\n  addresses: [198.19.%d.%d]" % (i, 2 + i // 250, 1 + i % 250))
    print("  ports: [{ number: 80, name: http, protocol: HTTP }]\n  location: MESH_INTERNAL\n  resolution: STATIC")
    print("  endpoints: [{ address: 198.18.200.%d }]" % (1 + i % 250))
EOF
}

run_one() { # $1: label, $2: agent binary
  local label="$1" bin="$2" w="$work/$1"
  rm -rf "$w"
  mkdir -p "$w/ca" "$w/config" "$w/pod/var/run/secrets/tokens" "$w/pod/var/run/secrets/istio" \
    "$w/pod/var/lib/istio/envoy"
  start_istiod "$w"
  "$istiod" token --ca-dir "$w/ca" --namespace demo --service-account sa \
    >"$w/pod/var/run/secrets/tokens/istio-token"
  cp "$w/ca/root-cert.pem" "$w/pod/var/run/secrets/istio/"
  cp "$template" "$w/pod/var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
  cd "$w/pod"
  local start; start=$(now_ms)
  setsid env -i PATH="$PATH" POD_NAME=bench POD_NAMESPACE=demo SERVICE_ACCOUNT=sa INSTANCE_IP=127.0.0.1 \
    ISTIOD_SAN=istiod.istio-system.svc ECC_SIGNATURE_ALGORITHM=ECDSA \
    ISTIO_META_DNS_CAPTURE=true DNS_PROXY_ADDR=127.0.0.1:37053 \
    ENVOY_STATUS_PORT=37021 ENVOY_PROMETHEUS_PORT=37090 \
    PROXY_CONFIG="{\"binaryPath\":\"$envoy\",\"discoveryAddress\":\"127.0.0.1:37012\",\"proxyAdminPort\":37000,\"statusPort\":37020,\"terminationDrainDuration\":\"1s\"}" \
    RUST_LOG=warn "$bin" proxy sidecar >"$w/agent.log" 2>&1 &
  local agent=$!
  groups+=("$agent")
  cd "$repo"
  local ready_ms="" cert_ms=""
  while [ -z "$ready_ms" ] || [ -z "$cert_ms" ]; do
    local t=$(( $(now_ms) - start ))
    if [ "$t" -gt 30000 ]; then echo "$label: not ready in 30 s" >&2; tail -20 "$w/agent.log" >&2; exit 1; fi
    if [ -z "$cert_ms" ] && curl -s --max-time 1 http://127.0.0.1:37000/certs 2>/dev/null | grep -q 'spiffe://cluster.local/ns/demo/sa/sa'; then
      cert_ms=$t
    fi
    if [ -z "$ready_ms" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 http://127.0.0.1:37021/healthz/ready)" = 200 ]; then
      ready_ms=$t
    fi
    sleep 0.005
  done
  sleep 5
  local rss5 rss35 peak
  rss5=$(status_kib "$agent" VmRSS)
  sleep 30
  rss35=$(status_kib "$agent" VmRSS)
  peak=$(status_kib "$agent" VmHWM)
  # istiod-lite SIGKILLed and started again at once.
  kill -KILL -- "-$istiod_pid"
  wait "$istiod_pid" 2>/dev/null || true
  start_istiod "$w"
  local back; back=$(now_ms)
  until synced; do
    if [ $(( $(now_ms) - back )) -gt 60000 ]; then echo "$label: not SYNCED 60 s after the restart" >&2; exit 1; fi
    sleep 0.005
  done
  local resync_ms=$(( $(now_ms) - back ))
  # 2,000-host EDS.
  eds_config >"$w/config/big.yaml"
  local pushed; pushed=$(now_ms)
  until curl -s --max-time 2 "http://127.0.0.1:37000/clusters" | grep -c '^outbound|8080||big.demo.svc.cluster.local::198.18.*::health_flags' \
      | grep -qx "$eds_hosts"; do
    if [ $(( $(now_ms) - pushed )) -gt 60000 ]; then echo "$label: EDS not in Envoy in 60 s" >&2; exit 1; fi
    sleep 0.05
  done
  until synced; do sleep 0.01; done
  sleep 2
  local eds_rss eds_peak
  eds_rss=$(status_kib "$agent" VmRSS)
  eds_peak=$(status_kib "$agent" VmHWM)
  # DNS table hits: DNS_NAMES ServiceEntries in NDS, dnsperf against the agent's DNS proxy,
  # the agent's CPU (utime + stime) over the run. Only names in the table are asked: nothing is
  # forwarded.
  dns_config >"$w/config/dns.yaml"
  local last="svc-$((dns_names - 1)).demo.svc.cluster.local" pushed2; pushed2=$(now_ms)
  until [ -n "$(dig +short +tries=1 +time=1 -p 37053 @127.0.0.1 "$last")" ]; do
    if [ $(( $(now_ms) - pushed2 )) -gt 60000 ]; then echo "$label: $last not in NDS in 60 s" >&2; exit 1; fi
    sleep 0.05
  done
  for i in $(seq 0 $((dns_names - 1))); do echo "svc-$i.demo.svc.cluster.local A"; done >"$w/queries"
  local cpu0 cpu1 qps
  cpu0=$(awk '{print $14 + $15}' "/proc/$agent/stat")
  qps=$(dnsperf -s 127.0.0.1 -p 37053 -d "$w/queries" -l "$dns_secs" -c 4 -q 64 -n 1000000 2>/dev/null \
    | awk '/Queries per second/ {print int($4)}')
  cpu1=$(awk '{print $14 + $15}' "/proc/$agent/stat")
  local ticks; ticks=$(getconf CLK_TCK)
  local dns_cpu_ns=$(( (cpu1 - cpu0) * 1000000000 / ticks / (qps * dns_secs) ))
  echo "$label ready_ms=$ready_ms cert_ms=$cert_ms rss5_kib=$rss5 rss35_kib=$rss35 start_peak_kib=$peak resync_ms=$resync_ms eds_rss_kib=$eds_rss eds_peak_kib=$eds_peak dns_qps=$qps dns_cpu_ns_per_query=$dns_cpu_ns"
  kill -KILL -- "-$agent" "-$istiod_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  sleep 1
}

results="$work/results"
for r in $(seq "$rounds"); do
  # Alternate who goes first.
  if [ $((r % 2)) -eq 1 ]; then order="ours peer"; else order="peer ours"; fi
  for who in $order; do
    if [ "$who" = ours ]; then run_one ours "$ours"; else run_one istio "$peer"; fi >>"$results"
    tail -1 "$results"
  done
done

python3 - "$results" <<'EOF'
import sys, re
rows = {"ours": [], "istio": []}
for line in open(sys.argv[1]):
    label, *kv = line.split()
    rows[label].append({k: int(v) for k, v in (x.split("=") for x in kv)})
def rng(xs):
    xs = sorted(xs)
    return f"{xs[0]}" if xs[0] == xs[-1] else f"{xs[0]}–{xs[-1]}"
def med(xs):
    xs = sorted(xs); return xs[len(xs) // 2]
goals = {"dns_qps": 3, "dns_cpu_ns_per_query": 0.3, "rss5_kib": 0.25, "rss35_kib": 0.25, "start_peak_kib": 0.25, "ready_ms": 0.5,
         "resync_ms": 0.2, "cert_ms": None, "eds_rss_kib": None, "eds_peak_kib": None}
print(f"{'figure':16} {'ours':>16} {'Istio agent':>16} {'ratio (medians)':>16}  goal")
for k, goal in goals.items():
    a = [r[k] for r in rows["ours"]]; b = [r[k] for r in rows["istio"]]
    ratio = med(a) / med(b) if med(b) else float("inf")
    if k == "dns_qps":
        g = f">= {goal}x {'met' if ratio >= goal else 'NOT met'}"
    else:
        g = f"<= {goal}x {'met' if ratio <= goal else 'NOT met'}" if goal else ""
    print(f"{k:16} {rng(a):>16} {rng(b):>16} {ratio:>16.2f}  {g}")
EOF

