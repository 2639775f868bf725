#!/usr/bin/env bash
# Regenerates agent/link/start-order.ld, the order of pilot-agent's code in the shipped build
# (scripts/build-dist.sh links with it). Why: the kernel maps a binary's code 64 KiB around each
# first touch (fault-around); the agent's start runs ~2.6 MB of functions spread over all of its
# 7 MB of text, so nearly every 64 KiB window was mapped within 100 ms (the start peak RSS).
# Listed first, those functions are one contiguous run instead.
# How: an unstripped shipped build with its link map, the start scenario of
# agent/benches/start-peak.py (istiod-lite, real Envoy, first xDS and certificate, 10 s) run once
# under valgrind's callgrind, then agent/benches/start_order.py turns the functions that ran into
# hash-free section patterns, and the shipped build is made again with them.
# Usage: agent/benches/start-order.sh   (needs valgrind, target/release/istiod-lite, Envoy)
# Rerun it when the start path changes much; a stale list only costs RSS (patterns that match
# nothing are ignored), never correctness. Then compare with agent/benches/start-peak.py.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
command -v valgrind >/dev/null || { echo "start-order: needs valgrind" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
triple="$(rustc -vV | sed -n 's/^host: //p')"
CARGO_PROFILE_DIST_STRIP=false START_ORDER_MAP="$work/map.txt" scripts/build-dist.sh
cp "target/$triple/dist/pilot-agent" "$work/pilot-agent"
python3 agent/benches/start-peak.py "$work/pilot-agent" --runs 1 \
  --wrap "valgrind --tool=callgrind --demangle=no --callgrind-out-file=$work/callgrind.out"
python3 agent/benches/start_order.py "$work/callgrind.out" "$work/pilot-agent" "$work/map.txt" \
  agent/link/start-order.ld
scripts/build-dist.sh
