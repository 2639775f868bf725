#!/usr/bin/env bash
# Lays out the image's root filesystem like Istio's proxyv2 image. The Dockerfile's final stage
# copies exactly this tree to /, and tests/tests/agent/image.rs builds and runs it, so a broken path
# fails CI even where no Docker engine runs.
#   usage: scripts/image-rootfs.sh <dir with pilot-agent and istio-iptables> <envoy binary> <out>
#            [<Istio's /var/lib/istio/envoy dir>]
# The Envoy is Istio's (from its proxyv2 image, with the 4th argument: its bootstrap templates,
# installed at the same path) or upstream's (no 4th argument, or a directory that does not exist:
# then the agent's built-in bootstrap is used).
set -euo pipefail
bin_dir=$1 envoy=$2 out=$3 istio_envoy_dir=${4:-}
install -d -m 0755 "$out/usr/local/bin"
install -m 0755 "$bin_dir/pilot-agent" "$out/usr/local/bin/pilot-agent"
install -m 0755 "$bin_dir/istio-iptables" "$out/usr/local/bin/istio-iptables"
install -m 0755 "$(readlink -f "$envoy")" "$out/usr/local/bin/envoy"
# Istio's writable locations (owned by istio-proxy, uid 1337, in the image).
install -d -m 0755 "$out/etc/istio/proxy" "$out/etc/istio/config" "$out/etc/istio/pod" \
  "$out/var/lib/istio/envoy" "$out/var/lib/istio/data" "$out/var/lib/istio/config" \
  "$out/var/run/secrets/istio" "$out/var/run/secrets/tokens" "$out/etc/certs"
# Istio's bootstrap templates (envoy_bootstrap_tmpl.json, ...), where Istio's image has them.
if [[ -n $istio_envoy_dir && -d $istio_envoy_dir ]]; then
  for f in "$istio_envoy_dir"/*; do
    [[ -f $f ]] && install -m 0644 "$f" "$out/var/lib/istio/envoy/$(basename "$f")"
  done
  [[ -f $out/var/lib/istio/envoy/envoy_bootstrap_tmpl.json ]] || {
    echo "image-rootfs: $istio_envoy_dir has no envoy_bootstrap_tmpl.json" >&2
    exit 1
  }
fi
