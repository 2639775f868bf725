#!/usr/bin/env bash
# Under CI=true the clone is new each run, so its cargo build directories (target/ and
# fuzz/target/) become links into the machine's cache, beside the pinned components' builds: a
# warm machine compiles only what changed. scripts/test.sh runs it and turns incremental
# compilation off to keep the cache small; above MESH_CARGO_CACHE_MAX_GB (default 40) the cache
# is emptied first. A build directory the clone already has is left as it is.
set -euo pipefail
cd "$(dirname "$0")/../.."
cache=${MESH_CACHE:-/var/cache/mesh-agent}/cargo
max_gb=${MESH_CARGO_CACHE_MAX_GB:-40}
mkdir -p "$cache"
used_gb=$(du -s --block-size=1G "$cache" | cut -f1)
if ((used_gb > max_gb)); then
  echo "cargo-cache: $cache holds $used_gb GB, over $max_gb: emptied" >&2
  rm -rf "${cache:?}/target" "${cache:?}/fuzz-target"
fi
link() {
  if [[ -e $1 && ! -L $1 ]]; then
    echo "cargo-cache: $1 exists in the clone: built there, not in $cache" >&2
    return
  fi
  mkdir -p "$cache/$2"
  ln -sfn "$cache/$2" "$1"
  echo "cargo-cache: $1 -> $cache/$2 ($used_gb GB cached)" >&2
}
link target target
link fuzz/target fuzz-target
