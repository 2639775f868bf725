#!/usr/bin/env bash
# Long soak of the pod in a box (tests/tests/mesh/soak.rs): two injected sidecars (real Envoy,
# real iptables, istiod-lite) carrying steady mTLS traffic while config is pushed every 3 s,
# certificates rotate every ~5 s (SECRET_TTL=10s) and istiod-lite is SIGKILLed and restarted once
# half way. Fails on any failed request, on a proxy not resyncing, or on agent memory or file
# descriptors growing between the first and the last quarter of the run. CI runs the same test
# for 20 s (the default when SOAK_SECONDS is unset).
#
# Usage: sudo scripts/soak.sh DURATION     e.g. 90 (seconds), 90s, 30m, 2h
# Builds what the test needs if it is out of date, runs it with SOAK_SECONDS set, keeps the full
# log (every agent, Envoy and istiod-lite line) in target/soak/ and prints the FIGURE lines.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

usage() { echo "usage: $0 DURATION   (seconds, or a number with s, m or h: 90, 90s, 30m, 2h)" >&2; exit 2; }
[[ $# -eq 1 ]] || usage
if [[ $1 =~ ^([0-9]+)([smh]?)$ ]]; then
  n=${BASH_REMATCH[1]}
  case ${BASH_REMATCH[2]} in
    h) secs=$((n * 3600)) ;;
    m) secs=$((n * 60)) ;;
    *) secs=$n ;;
  esac
else
  usage
fi
if ((secs < 8)); then
  echo "soak: DURATION must be at least 8 s (the run is cut in quarters after a warm-up)" >&2
  exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "soak: run as root (the test creates network namespaces and programs iptables)" >&2
  exit 2
fi

echo "==> building (pilot-agent, istio-iptables, istiod-lite, mesh-app, the soak test)"
cargo build --quiet --bins -p agent -p control-plane -p iptables-init -p tests
cargo test --quiet -p tests --test mesh --no-run

mkdir -p target/soak
log="target/soak/soak-$(date -u +%Y%m%dT%H%M%SZ)-${secs}s.log"
echo "==> soaking for ${secs} s (log: $log)"
# cargo test rather than nextest: nextest's slow-timeout would end a long run. The soak is the
# `soak::` module of the `mesh` end-to-end binary; the filter runs it and nothing else.
status=0
SOAK_SECONDS=$secs cargo test --quiet -p tests --test mesh -- soak:: --nocapture --test-threads=1 \
  >"$log" 2>&1 || status=$?
grep -E '^(FIGURE|soak:)' "$log" || true
if ((status != 0)); then
  echo "==> soak FAILED (exit $status); the end of the log:" >&2
  grep -v '^\[' "$log" | tail -40 >&2
  exit "$status"
fi
echo "==> soak passed"
