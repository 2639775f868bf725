#!/usr/bin/env bash
# Pod figures on the real cluster, our proxy image beside Istio's Go agent in one run
# (scripts/lib/cluster_bench.py): pod created → Ready one at a time and PODS at once, the agent's
# RSS and the istio-proxy container's memory at idle, istiod's CPU for the burst.
#   usage: scripts/bench-cluster.sh [--pods N] [--services N] [--istiod-delay-ms D] [--json FILE]
# Needs the cluster up (scripts/cluster.sh up with MESH_AGENT_BIN=target/dist for the shipped
# build); it leaves the cluster as it found it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=cluster/versions.env
source "$repo/scripts/cluster/versions.env"
"$repo/scripts/cluster.sh" status >/dev/null 2>&1 || { echo "bench-cluster: the cluster is not up (scripts/cluster.sh up)" >&2; exit 2; }
echo "bench-cluster: $(date -u +%F) commit $(git -C "$repo" rev-parse --short HEAD), $(nproc) cores, kernel $(uname -r)"
exec python3 "$repo/scripts/lib/cluster_bench.py" --hub "$IMAGE_HUB" --tag "$IMAGE_TAG" "$@"
