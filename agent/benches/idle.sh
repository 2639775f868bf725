#!/usr/bin/env bash
# Agent idle footprint and start-to-ready time, against a local istiod-lite and real Envoy.
# Usage: agent/benches/idle.sh [pilot-agent-dir]   (default target/dist, the shipped build; build
#   first: scripts/build-dist.sh
#          cargo build --release -p control-plane --bin istiod-lite)
# Prints: ms from agent exec to /healthz/ready 200 on Envoy's 15021 listener (through the xDS
# proxy, SDS and NDS); the agent's RSS after 5 s idle with Envoy connected (anon/file split), and
# again 30 s later (after the first 30 s HTTP/2 keepalive to istiod: the steady idle figure).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
bin="$(cd "${1:-$repo/target/dist}" && pwd)"
istiod="${ISTIOD_LITE:-$repo/target/release/istiod-lite}"
envoy="${ENVOY_BIN:-$repo/.tools/bin/envoy}"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/ca" "$work/config" "$work/pod/var/run/secrets/tokens" "$work/pod/var/run/secrets/istio"
RUST_LOG=warn "$istiod" serve --config-dir "$work/config" --ca-dir "$work/ca" \
  --grpc-addr 127.0.0.1:35010 --secure-grpc-addr 127.0.0.1:35012 --monitoring-addr 127.0.0.1:35014 \
  >"$work/istiod.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/ca/root-cert.pem" ] && break; sleep 0.05; done
"$istiod" token --ca-dir "$work/ca" --namespace demo --service-account sa \
  >"$work/pod/var/run/secrets/tokens/istio-token"
cp "$work/ca/root-cert.pem" "$work/pod/var/run/secrets/istio/"
cd "$work/pod"
start=$(date +%s%N)
env -i PATH="$PATH" CLOUD_PLATFORM=none POD_NAME=bench POD_NAMESPACE=demo SERVICE_ACCOUNT=sa INSTANCE_IP=127.0.0.1 \
  ISTIOD_SAN=istiod.istio-system.svc ECC_SIGNATURE_ALGORITHM=ECDSA \
  ISTIO_META_DNS_CAPTURE=true DNS_PROXY_ADDR=127.0.0.1:35053 \
  ENVOY_STATUS_PORT=35021 ENVOY_PROMETHEUS_PORT=35090 \
  PROXY_CONFIG="{\"binaryPath\":\"$envoy\",\"discoveryAddress\":\"127.0.0.1:35012\",\"proxyAdminPort\":35000,\"statusPort\":35020,\"terminationDrainDuration\":\"1s\"}" \
  RUST_LOG=warn "$bin/pilot-agent" proxy sidecar >"$work/agent.log" 2>&1 &
agent=$!
pids+=($agent)
until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 http://127.0.0.1:35021/healthz/ready)" = 200 ]; do
  if [ $(( ($(date +%s%N) - start) / 1000000 )) -gt 30000 ]; then echo "not ready in 30s"; cat "$work/agent.log"; exit 1; fi
  sleep 0.005
done
ready_ms=$(( ($(date +%s%N) - start) / 1000000 ))
sleep 5
rss_kb=$(awk '/VmRSS/ {print $2}' "/proc/$agent/status")
hwm_kb=$(awk '/VmHWM/ {print $2}' "/proc/$agent/status")
anon_kb=$(awk '/RssAnon/ {print $2}' "/proc/$agent/status")
file_kb=$(awk '/RssFile/ {print $2}' "/proc/$agent/status")
threads=$(awk '/Threads/ {print $2}' "/proc/$agent/status")
echo "start_to_ready_ms=$ready_ms agent_rss_kib=$rss_kb agent_peak_rss_kib=$hwm_kb (anon $anon_kb, file-backed $file_kb: binary text and libc; $threads threads)"
sleep 30
echo "after 35 s idle: agent_rss_kib=$(awk '/VmRSS/ {print $2}' "/proc/$agent/status") agent_peak_rss_kib=$(awk '/VmHWM/ {print $2}' "/proc/$agent/status")"
