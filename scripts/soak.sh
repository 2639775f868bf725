#!/usr/bin/env bash
# Long soak of the pod in a box (tests/tests/mesh/soak.rs): two injected sidecars (real Envoy,
# real iptables, istiod-lite) carrying steady mTLS traffic while config is pushed every 3 s,
# certificates rotate every ~5 s (SECRET_TTL=10s) and istiod-lite is SIGKILLed and restarted once
# half way. Fails on any failed request, on a proxy not resyncing, or on agent memory or file
# descriptors growing between the first and the last quarter of the run. CI runs the same test
# for 20 s (the default when SOAK_SECONDS is unset).
#
# Usage: sudo scripts/soak.sh DURATION     e.g. 90 (seconds), 90s, 30m, 2h
# Through scripts/long-run.sh: builds what the test needs if it is out of date, runs it with SOAK_SECONDS set, keeps the full
# log (every agent, Envoy and istiod-lite line) in target/soak/ and prints the FIGURE lines.
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 DURATION   (seconds, or a number with s, m or h)" >&2; exit 2; }
exec "$(dirname "$0")/long-run.sh" soak soak SOAK_SECONDS 8 "$1"
