#!/usr/bin/env bash
# A long istiod outage under traffic (tests/tests/mesh/outage.rs): two injected sidecars (real
# Envoy, real iptables, istiod-lite) carrying steady mTLS traffic while istiod-lite is down for
# DURATION, with certificates short enough that their rotation falls due half way through the
# outage. Fails on any failed request, on a certificate changing while the CA is down, or on the
# rotation not following within one backoff cap of istiod-lite's return. CI runs the same test
# with a 15 s outage (the default when OUTAGE_SECONDS is unset).
#
# Usage: sudo scripts/outage.sh DURATION     e.g. 90 (seconds), 90s, 10m
# Builds what the test needs if it is out of date, runs it with OUTAGE_SECONDS set, keeps the full
# log in target/outage/ and prints the FIGURE lines.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

usage() { echo "usage: $0 DURATION   (seconds, or a number with s, m or h: 90, 90s, 10m)" >&2; exit 2; }
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
if ((secs < 5)); then
  echo "outage: DURATION must be at least 5 s" >&2
  exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "outage: run as root (the test creates network namespaces and programs iptables)" >&2
  exit 2
fi

echo "==> building (pilot-agent, istio-iptables, istiod-lite, mesh-app, the outage test)"
cargo build --quiet --bins -p agent -p control-plane -p iptables-init -p tests
cargo test --quiet -p tests --test mesh --no-run

mkdir -p target/outage
log="target/outage/outage-$(date -u +%Y%m%dT%H%M%SZ)-${secs}s.log"
echo "==> istiod-lite down for ${secs} s under traffic (log: $log)"
# cargo test rather than nextest: nextest's slow-timeout would end a long run.
status=0
OUTAGE_SECONDS=$secs cargo test --quiet -p tests --test mesh -- outage:: --nocapture --test-threads=1 \
  >"$log" 2>&1 || status=$?
grep -E '^(FIGURE|outage:)' "$log" || true
if ((status != 0)); then
  echo "==> outage run FAILED (exit $status); the end of the log:" >&2
  grep -v '^\[' "$log" | tail -40 >&2
  exit "$status"
fi
echo "==> outage run passed"
