#!/usr/bin/env bash
# Records the differential suites of tests/data/istio-diff/ against Istio's Go pilot-agent built
# from the pinned module (scripts/cluster/versions.env: ISTIO_MODULE@ISTIO_VERSION), replacing
# their recordings; each suite's oracle.json then names that module version. Builds the
# binaries first when this machine has none (scripts/cluster/build.sh istio, cached outside the
# clone). Run as root (the suites run Istio's agent in network namespaces), with what the suites'
# tests need (scripts/setup.sh --test-tools: Envoy, dnsmasq, grpcio, Istio's release module).
# About five minutes on two cores.
#   usage: scripts/istio-diff-record.sh [suite…]   (default: bootstrap cli dns iptables status)
# ISTIO_GO_BIN set in the environment records another build instead (its oracle.json says
# which; the tests accept only the pinned module version).
set -euo pipefail
cd "$(dirname "$0")/.."
suites=("$@")
[[ ${#suites[@]} -gt 0 ]] || suites=(bootstrap cli dns iptables status)
if [[ -z ${ISTIO_GO_BIN:-} ]]; then
  scripts/cluster/build.sh istio >&2
  ISTIO_GO_BIN=$(scripts/cluster/build.sh --dir istio)
fi
export ISTIO_GO_BIN
# The dns recorder is the dns test binary's ignored `record` test: build it before timing.
for s in "${suites[@]}"; do [[ $s == dns ]] && cargo nextest run -p tests --test dns --no-run; done
for s in "${suites[@]}"; do
  [[ -f tests/data/istio-diff/$s/record.py ]] || { echo "no suite $s" >&2; exit 2; }
  echo "==> $s: recording $ISTIO_GO_BIN/pilot-agent" >&2
  t=$SECONDS
  python3 "tests/data/istio-diff/$s/record.py"
  echo "==> $s: done in $((SECONDS - t))s" >&2
done
