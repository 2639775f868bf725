#!/usr/bin/env bash
# A long istiod outage under traffic (tests/tests/mesh/outage.rs): two injected sidecars (real
# Envoy, real iptables, istiod-lite) carrying steady mTLS traffic while istiod-lite is down for
# DURATION, with certificates short enough that their rotation falls due half way through the
# outage. Fails on any failed request, on a certificate changing while the CA is down, or on the
# rotation not following within one backoff cap of istiod-lite's return. CI runs the same test
# with a 15 s outage (the default when OUTAGE_SECONDS is unset).
#
# Usage: sudo scripts/outage.sh DURATION     e.g. 90 (seconds), 90s, 10m
# Through scripts/long-run.sh: builds what the test needs if it is out of date, runs it with OUTAGE_SECONDS set, keeps the full
# log in target/outage/ and prints the FIGURE lines.
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 DURATION   (seconds, or a number with s, m or h)" >&2; exit 2; }
exec "$(dirname "$0")/long-run.sh" outage outage OUTAGE_SECONDS 5 "$1"
