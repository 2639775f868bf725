#!/usr/bin/env bash
# Our pilot-agent and Istio's Go pilot-agent side by side, same scenario, same run (issue 27).
# Usage: PEER_AGENT=<Istio's pilot-agent> scripts/bench-side-by-side.sh [our-pilot-agent] [rounds]
#   our pilot-agent: default target/dist/pilot-agent (scripts/build-dist.sh), else target/release/pilot-agent;
#   ISTIOD_LITE (default target/release/istiod-lite), ENVOY_BIN (default .tools/bin/envoy);
#   EDS_HOSTS (default 2000): endpoints of the ServiceEntry pushed for the EDS memory figure;
#   AGENT_LOG: RUST_LOG for our agent (default warn); KEEP_WORK=1 keeps the logs and files;
#   CONTROL_PLANE: istiod-lite (default) or istiod: Istio's own pilot-discovery from
#   ISTIO_GO_BIN, outside a cluster as docs/istiod.md says (a real API server with no nodes,
#   scripts/lib/kube-api.sh, issues the token and judges it for istiod through TokenReview;
#   istiod's CA is plugged in with istiod-lite's root; istiod's Istio-only extensions are
#   switched off for upstream Envoy).
# Each round starts a fresh control plane and, one after the other in the same round, each agent
# with real Envoy (the agent starts Envoy from PROXY_CONFIG's binaryPath, as in a pod), the DNS
# proxy on, the same token, root, environment and Istio's own bootstrap template. Per agent it
# prints:
#   ready_ms   agent exec -> Envoy's /healthz/ready 200 (through xDS, SDS, NDS);
#   cert_ms    agent exec -> the workload certificate in Envoy's /certs;
#   rss5/rss35 agent VmRSS after 5 s and 35 s idle with Envoy connected (KiB), peak = VmHWM;
#   resync_ms  the control plane SIGKILLed, started again at once: its /ready -> the proxy's
#              connection synced again in its /debug/syncz (Istio's agent closes Envoy's stream,
#              Envoy reconnects on its own backoff; ours keeps it and replays);
#   eds_kib    agent VmRSS (and VmHWM) once a ServiceEntry with EDS_HOSTS endpoints is acked;
#   dns        DNS table hits: DNS_NAMES (200) ServiceEntries in NDS, dnsperf (4 clients, 64
#              outstanding, DNS_SECONDS) against the agent's DNS proxy: q/s and agent CPU per
#              query (utime + stime of the agent process; Envoy is a separate process), and the
#              user-space part alone (utime); dnsperf's own CPU (per cent of a core) shows
#              whether the agent or the load generator is what limits the q/s;
#   fwd        the same for DNS_NAMES names only the upstream (dnsmasq on 127.0.0.1:53, the
#              namespace's resolv.conf) knows: every query forwarded (our answer cache is off).
# Timed intervals are polled every 2 ms by scripts/lib/side_by_side_poll.py, started before the
# interval begins, so no process start falls inside one.
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
control_plane="${CONTROL_PLANE:-istiod-lite}"
poll="$repo/scripts/lib/side_by_side_poll.py"
case "$control_plane" in
  istiod-lite) ;;
  istiod)
    [ -n "${ISTIO_GO_BIN:-}" ] || { echo "CONTROL_PLANE=istiod needs ISTIO_GO_BIN (Istio's pilot-discovery)" >&2; exit 2; }
    discovery="$ISTIO_GO_BIN/pilot-discovery"
    [ -x "$discovery" ] || { echo "missing: $discovery" >&2; exit 1; } ;;
  *) echo "CONTROL_PLANE: istiod-lite or istiod, not $control_plane" >&2; exit 2 ;;
esac
for f in "$ours" "$peer" "$istiod" "$envoy" "$template"; do
  [ -e "$f" ] || { echo "missing: $f" >&2; exit 1; }
done
# Everything runs in a network and mount namespace of its own: loopback only, nothing else's ports,
# and a resolv.conf that sends both agents' forwarded queries to the upstream started below on
# 127.0.0.1:53 (Istio's agent reads /etc/resolv.conf and forwards to port 53).
if [ -z "${SIDE_BY_SIDE_NS:-}" ]; then
  [ "$(id -u)" = 0 ] || { echo "needs root: the bench runs in a network and mount namespace of its own" >&2; exit 2; }
  exec unshare --net --mount --propagation private env SIDE_BY_SIDE_NS=1 bash "$0" "$@"
fi
ip link set lo up
# The fixed ports below (37000-37021) out of this namespace's ephemeral range: a poll of a port
# nobody listens on yet must not connect to itself and hold the port Envoy is about to bind.
sysctl -qw net.ipv4.ip_local_port_range="40000 60999"
ours="$(realpath "$ours")" peer="$(realpath "$peer")" istiod="$(realpath "$istiod")"
envoy="$(realpath "$envoy")" template="$(realpath "$template")"
work="$(mktemp -d)"
groups=()
cleanup() {
  for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "work dir kept: $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
echo "nameserver 127.0.0.1" >"$work/resolv.conf"
mount --bind "$work/resolv.conf" /etc/resolv.conf

# The forwarding upstream: dnsmasq on 127.0.0.1:53 answering fwd-N.fwd.test from a hosts file,
# pinned to no core (as the agents and dnsperf).
dns_names="${DNS_NAMES:-200}"
for i in $(seq 0 $((dns_names - 1))); do
  echo "198.18.$((100 + i / 250)).$((1 + i % 250)) fwd-$i.fwd.test"
done >"$work/fwd-hosts"
setsid dnsmasq --keep-in-foreground --no-resolv --no-hosts --conf-file=/dev/null --pid-file= \
  --user=root --bind-interfaces --listen-address=127.0.0.1 --port=53 \
  --addn-hosts="$work/fwd-hosts" --local-ttl=30 --cache-size=10000 >"$work/dnsmasq.log" 2>&1 &
groups+=("$!")
until [ -n "$(dig +short +tries=1 +time=1 @127.0.0.1 fwd-0.fwd.test)" ]; do sleep 0.05; done

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
status_kib() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }

# The control plane's addresses. istiod-lite: ready and syncz on its monitoring port; istiod:
# on --httpAddr.
xds_addr=127.0.0.1:37012
if [ "$control_plane" = istiod ]; then cp_http=127.0.0.1:37015; else cp_http=127.0.0.1:37014; fi

start_lite() { # $1: work dir
  setsid env RUST_LOG=warn "$istiod" serve --config-dir "$1/config" --ca-dir "$1/ca" \
    --grpc-addr 127.0.0.1:37010 --secure-grpc-addr "$xds_addr" --monitoring-addr 127.0.0.1:37014 \
    >>"$1/istiod.log" 2>&1 &
  cp_pid=$!
  groups+=("$cp_pid")
}

start_live() { # $1: work dir
  setsid env -i PATH=/usr/bin:/bin POD_NAMESPACE=istio-system ROOT_CA_DIR="$1/cacerts" \
    PILOT_ENABLE_METADATA_EXCHANGE=false PILOT_ENABLE_ALPN_FILTER=false \
    "$discovery" discovery --kubeconfig="$work/api/kubeconfig" --configDir="$1/config" \
    --meshConfig="$repo/tests/data/live-istiod/mesh.yaml" --networksConfig="$1/meshNetworks" \
    --httpAddr="$cp_http" --grpcAddr=127.0.0.1:37010 --secureGRPCAddr="$xds_addr" \
    --httpsAddr=127.0.0.1:37017 --monitoringAddr=127.0.0.1:37014 --ctrlz_port=0 \
    --log_output_level=default:warn >>"$1/istiod.log" 2>&1 &
  cp_pid=$!
  groups+=("$cp_pid")
}

start_cp() { # $1: work dir; returns once the control plane's /ready answers 200
  if [ "$control_plane" = istiod ]; then start_live "$1"; else start_lite "$1"; fi
  local t0; t0=$(now_ms)
  until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://$cp_http/ready")" = 200 ]; do
    if [ $(( $(now_ms) - t0 )) -gt 60000 ]; then echo "control plane not ready in 60 s" >&2; tail -20 "$1/istiod.log" >&2; exit 1; fi
    sleep 0.005
  done
}

# Connections of the proxy bench.demo synced in the control plane's /debug/syncz.
synced() {
  local kind=lite; [ "$control_plane" = istiod ] && kind=istiod
  curl -s --max-time 1 "http://$cp_http/debug/syncz" | python3 -c '
import json, sys
sys.path.insert(0, sys.argv[2])
from side_by_side_poll import synced
sys.exit(0 if synced(sys.argv[1], sys.stdin.read(), "bench.demo") else 1)' "$kind" "$repo/scripts/lib" 2>/dev/null
}

# istiod: a real API server with no nodes (and the token issuer), once for the whole run.
if [ "$control_plane" = istiod ]; then
  # shellcheck source=lib/kube-api.sh
  source "$repo/scripts/lib/kube-api.sh"
  kube_api_start "$work/api" 37030
fi

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

# dnsperf with the queries in $1 against the agent's DNS proxy for DNS_SECONDS; sets dns_qps,
# dns_cpu and dns_user (the agent's CPU, and its user-space part, per query, ns) and dns_client
# (dnsperf's own CPU, per cent of one core: near 100, dnsperf is what limits the q/s).
dns_run() {
  local cpu0 cpu1 user0 user1 ticks
  ticks=$(getconf CLK_TCK)
  cpu0=$(awk '{print $14 + $15}' "/proc/$agent/stat")
  user0=$(awk '{print $14}' "/proc/$agent/stat")
  dns_qps=$(/usr/bin/time -f '%U %S' -o "$w/dnsperf-cpu" \
    dnsperf -s 127.0.0.1 -p 37053 -d "$1" -l "$dns_secs" -c 4 -q 64 -n 1000000 2>/dev/null \
    | awk '/Queries per second/ {print int($4)}')
  cpu1=$(awk '{print $14 + $15}' "/proc/$agent/stat")
  user1=$(awk '{print $14}' "/proc/$agent/stat")
  [ "${dns_qps:-0}" -gt 0 ] || { echo "$label: dnsperf got no answers for $1" >&2; exit 1; }
  dns_cpu=$(( (cpu1 - cpu0) * 1000000000 / ticks / (dns_qps * dns_secs) ))
  dns_user=$(( (user1 - user0) * 1000000000 / ticks / (dns_qps * dns_secs) ))
  dns_client=$(awk -v s="$dns_secs" '{printf "%d", ($1 + $2) * 100 / s}' "$w/dnsperf-cpu")
}

run_one() { # $1: label, $2: agent binary
  local label="$1" bin="$2" w="$work/$1"
  rm -rf "$w"
  mkdir -p "$w/ca" "$w/config" "$w/pod/var/run/secrets/tokens" "$w/pod/var/run/secrets/istio" \
    "$w/pod/var/lib/istio/envoy"
  if [ "$control_plane" = istiod ]; then
    # istiod-lite makes the root and signing key istiod's CA is plugged in with, then stops.
    start_lite "$w"
    until [ -s "$w/ca/cert-chain.pem" ]; do sleep 0.01; done
    kill -KILL -- "-$cp_pid"; wait "$cp_pid" 2>/dev/null || true
    mkdir -p "$w/cacerts"
    cp "$w/ca/ca-cert.pem" "$w/ca/ca-key.pem" "$w/ca/root-cert.pem" "$w/ca/cert-chain.pem" "$w/cacerts/"
    : >"$w/meshNetworks"
    start_cp "$w"
    kube_api_token "$work/api" demo sa >"$w/pod/var/run/secrets/tokens/istio-token"
  else
    start_cp "$w"
    "$istiod" token --ca-dir "$w/ca" --namespace demo --service-account sa \
      >"$w/pod/var/run/secrets/tokens/istio-token"
  fi
  cp "$w/ca/root-cert.pem" "$w/pod/var/run/secrets/istio/"
  cp "$template" "$w/pod/var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
  python3 "$poll" start "$w/go" 127.0.0.1:37000 127.0.0.1:37021 spiffe://cluster.local/ns/demo/sa/sa \
    >"$w/start.txt" &
  local poller=$!
  cd "$w/pod"
  echo "$(date +%s%N)" >"$w/go"
  setsid env -i PATH="$PATH" POD_NAME=bench POD_NAMESPACE=demo SERVICE_ACCOUNT=sa INSTANCE_IP=127.0.0.1 \
    ISTIOD_SAN=istiod.istio-system.svc ECC_SIGNATURE_ALGORITHM=ECDSA \
    ISTIO_META_DNS_CAPTURE=true DNS_PROXY_ADDR=127.0.0.1:37053 DNS_PROXY_CACHE=false \
    ENVOY_STATUS_PORT=37021 ENVOY_PROMETHEUS_PORT=37090 \
    PROXY_CONFIG="{\"binaryPath\":\"$envoy\",\"discoveryAddress\":\"$xds_addr\",\"proxyAdminPort\":37000,\"statusPort\":37020,\"terminationDrainDuration\":\"1s\"}" \
    RUST_LOG="${AGENT_LOG:-warn}" "$bin" proxy sidecar >"$w/agent.log" 2>&1 &
  local agent=$!
  groups+=("$agent")
  cd "$repo"
  if ! wait "$poller"; then echo "$label: not ready" >&2; tail -20 "$w/agent.log" >&2; exit 1; fi
  local ready_ms cert_ms
  ready_ms=$(sed -n 's/.*ready_ms=\([0-9]*\).*/\1/p' "$w/start.txt")
  cert_ms=$(sed -n 's/.*cert_ms=\([0-9]*\).*/\1/p' "$w/start.txt")
  sleep 5
  local rss5 rss35 peak
  rss5=$(status_kib "$agent" VmRSS)
  sleep 30
  rss35=$(status_kib "$agent" VmRSS)
  peak=$(status_kib "$agent" VmHWM)
  # The control plane SIGKILLed and started again at once; the poller is polling before the kill.
  local kind=lite; [ "$control_plane" = istiod ] && kind=istiod
  rm -f "$w/armed"
  python3 "$poll" resync "$w/armed" "$cp_http" "$cp_http" "$kind" bench.demo >"$w/resync.txt" &
  local poller=$!
  until [ -e "$w/armed" ]; do sleep 0.005; done
  kill -KILL -- "-$cp_pid"
  wait "$cp_pid" 2>/dev/null || true
  start_cp "$w"
  if ! wait "$poller"; then echo "$label: not synced again after the restart" >&2; exit 1; fi
  local resync_ms; resync_ms=$(sed -n 's/resync_ms=//p' "$w/resync.txt")
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
  # Forwarded: names only the upstream knows. Ours runs with its answer cache off
  # (DNS_PROXY_CACHE=false above; Istio's agent has none), so every query is forwarded.
  for i in $(seq 0 $((dns_names - 1))); do echo "fwd-$i.fwd.test A"; done >"$w/queries-fwd"
  dns_run "$w/queries"
  local qps=$dns_qps dns_cpu_ns=$dns_cpu dns_user_ns=$dns_user client_pct=$dns_client
  dns_run "$w/queries-fwd"
  local fwd_qps=$dns_qps fwd_cpu_ns=$dns_cpu fwd_client_pct=$dns_client
  echo "$label ready_ms=$ready_ms cert_ms=$cert_ms rss5_kib=$rss5 rss35_kib=$rss35 start_peak_kib=$peak resync_ms=$resync_ms eds_rss_kib=$eds_rss eds_peak_kib=$eds_peak dns_qps=$qps dns_cpu_ns_per_query=$dns_cpu_ns dns_user_ns_per_query=$dns_user_ns dnsperf_cpu_pct=$client_pct fwd_qps=$fwd_qps fwd_cpu_ns_per_query=$fwd_cpu_ns fwd_dnsperf_cpu_pct=$fwd_client_pct"
  kill -KILL -- "-$agent" "-$cp_pid" 2>/dev/null || true
  wait "$agent" "$cp_pid" 2>/dev/null || true
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

echo "control plane: $control_plane"
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
         "resync_ms": 0.2, "cert_ms": None, "eds_rss_kib": None, "eds_peak_kib": None,
         "dns_user_ns_per_query": None, "dnsperf_cpu_pct": None,
         "fwd_qps": 3, "fwd_cpu_ns_per_query": 0.3, "fwd_dnsperf_cpu_pct": None}
print(f"{'figure':16} {'ours':>16} {'Istio agent':>16} {'ratio (medians)':>16}  goal")
for k, goal in goals.items():
    a = [r[k] for r in rows["ours"]]; b = [r[k] for r in rows["istio"]]
    ratio = med(a) / med(b) if med(b) else float("inf")
    if k in ("dns_qps", "fwd_qps"):
        g = f">= {goal}x {'met' if ratio >= goal else 'NOT met'}"
    else:
        g = f"<= {goal}x {'met' if ratio <= goal else 'NOT met'}" if goal else ""
    print(f"{k:16} {rng(a):>16} {rng(b):>16} {ratio:>16.2f}  {g}")
EOF

