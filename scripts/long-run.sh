#!/usr/bin/env bash
# Shared driver of the long pod-in-a-box runs (scripts/soak.sh, scripts/outage.sh): parses a
# DURATION, checks for root, builds what the test needs, runs one `mesh` test module with its
# duration variable set (cargo test rather than nextest: nextest's slow-timeout would end a long
# run), keeps the full log in target/<name>/ and prints the FIGURE lines.
# Usage (from the wrappers): long-run.sh NAME MODULE ENV_VAR MIN_SECONDS DURATION
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
[[ $# -eq 5 ]] || { echo "usage: $0 NAME MODULE ENV_VAR MIN_SECONDS DURATION" >&2; exit 2; }
name=$1 module=$2 var=$3 min=$4 duration=$5

usage() { echo "usage: scripts/$name.sh DURATION   (seconds, or a number with s, m or h: 90, 90s, 10m, 2h)" >&2; exit 2; }
if [[ $duration =~ ^([0-9]+)([smh]?)$ ]]; then
  n=${BASH_REMATCH[1]}
  case ${BASH_REMATCH[2]} in
    h) secs=$((n * 3600)) ;;
    m) secs=$((n * 60)) ;;
    *) secs=$n ;;
  esac
else
  usage
fi
if ((secs < min)); then
  echo "$name: DURATION must be at least $min s" >&2
  exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "$name: run as root (the test creates network namespaces and programs iptables)" >&2
  exit 2
fi

echo "==> building (pilot-agent, istio-iptables, istiod-lite, mesh-app, the $name test)"
cargo build --quiet --bins -p agent -p control-plane -p iptables-init -p tests
cargo test --quiet -p tests --test mesh --no-run

mkdir -p "target/$name"
log="target/$name/$name-$(date -u +%Y%m%dT%H%M%SZ)-${secs}s.log"
echo "==> $name for ${secs} s (log: $log)"
status=0
env "$var=$secs" cargo test --quiet -p tests --test mesh -- "$module::" --nocapture \
  --test-threads=1 >"$log" 2>&1 || status=$?
grep -E "^(FIGURE|$name:)" "$log" || true
if ((status != 0)); then
  echo "==> $name FAILED (exit $status); the end of the log:" >&2
  grep -v '^\[' "$log" | tail -40 >&2
  exit "$status"
fi
echo "==> $name passed"
