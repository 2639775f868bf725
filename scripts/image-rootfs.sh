#!/usr/bin/env bash
# Lays out the image's root filesystem like Istio's proxyv2 image. The Dockerfile's final stage
# copies exactly this tree to /, and tests/tests/agent/image.rs builds and runs it, so a broken path
# fails CI even where no Docker engine runs.
#   usage: scripts/image-rootfs.sh <dir with pilot-agent and istio-iptables> <envoy binary> <out>
set -euo pipefail
bin_dir=$1 envoy=$2 out=$3
install -d -m 0755 "$out/usr/local/bin"
install -m 0755 "$bin_dir/pilot-agent" "$out/usr/local/bin/pilot-agent"
install -m 0755 "$bin_dir/istio-iptables" "$out/usr/local/bin/istio-iptables"
install -m 0755 "$(readlink -f "$envoy")" "$out/usr/local/bin/envoy"
# Istio's writable locations (owned by istio-proxy, uid 1337, in the image).
install -d -m 0755 "$out/etc/istio/proxy" "$out/etc/istio/config" "$out/etc/istio/pod" \
  "$out/var/lib/istio/envoy" "$out/var/lib/istio/data" "$out/var/lib/istio/config" \
  "$out/var/run/secrets/istio" "$out/var/run/secrets/tokens" "$out/etc/certs"
