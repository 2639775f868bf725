#!/usr/bin/env bash
# Builds target/debian/istio-sidecar.deb, a drop-in for Istio's istio-sidecar.deb (the same
# paths and postinst): our pilot-agent and istio-iptables, upstream Envoy (.tools/bin/envoy from
# scripts/setup.sh), Istio's bootstrap template, and docs/vm's unit, start script, sidecar.env
# and postinst.
# Usage: scripts/build-deb.sh [BIN_DIR]   (or BIN_DIR=…; default target/debug)
#        OUT=… writes the package elsewhere than target/debian/istio-sidecar.deb.
set -euo pipefail
cd "$(dirname "$0")/.."

bin_dir=${1:-${BIN_DIR:-target/debug}}
envoy=${ENVOY_BIN:-.tools/bin/envoy}
# shellcheck source=cluster/versions.env
source scripts/cluster/versions.env
# scripts/cluster/setup.sh puts Go here when the machine has none new enough.
[[ -x /usr/local/go-$GO_VERSION/bin/go ]] && export PATH=/usr/local/go-$GO_VERSION/bin:$PATH
# The pinned istio module's folder in Go's module cache (wherever GOMODCACHE puts it).
istio=${ISTIO_SRC:-$(go mod download -json "$ISTIO_MODULE@$ISTIO_VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')}
template=$istio/tools/packaging/common/envoy_bootstrap.json
out=${OUT:-target/debian/istio-sidecar.deb}

for f in "$bin_dir/pilot-agent" "$bin_dir/istio-iptables" "$envoy" "$template"; do
  [[ -f $f ]] || { echo "build-deb: missing $f" >&2; exit 1; }
done
command -v dpkg-deb >/dev/null || { echo "build-deb: dpkg-deb is missing (scripts/vm/setup.sh)" >&2; exit 1; }

root=$(mktemp -d)
chmod 0755 "$root"
trap 'rm -rf "$root"' EXIT INT TERM
install -d "$root/DEBIAN" "$root/usr/local/bin" "$root/lib/systemd/system" \
  "$root/var/lib/istio/envoy" "$root/usr/share/doc/istio-sidecar"
install -m 0755 "$bin_dir/pilot-agent" "$bin_dir/istio-iptables" "$root/usr/local/bin/"
install -m 0755 "$(readlink -f "$envoy")" "$root/usr/local/bin/envoy"
install -m 0755 docs/vm/istio-start.sh "$root/usr/local/bin/istio-start.sh"
install -m 0644 docs/vm/istio.service "$root/lib/systemd/system/istio.service"
install -m 0644 docs/vm/sidecar.env "$root/var/lib/istio/envoy/sidecar.env"
install -m 0644 "$template" "$root/var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
install -m 0755 docs/vm/postinst "$root/DEBIAN/postinst"
printf '%s\n' /var/lib/istio/envoy/sidecar.env /var/lib/istio/envoy/envoy_bootstrap_tmpl.json \
  >"$root/DEBIAN/conffiles"
cat >"$root/usr/share/doc/istio-sidecar/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/

Files: *
Copyright: the mesh-agent authors; Envoy: the Envoy authors; envoy_bootstrap_tmpl.json: the Istio authors
License: Apache-2.0
 pilot-agent, istio-iptables and the packaging files: this project. Envoy: the Envoy
 authors. envoy_bootstrap_tmpl.json: the Istio authors.
 .
 On Debian systems the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
COPYRIGHT
chmod 0644 "$root/usr/share/doc/istio-sidecar/copyright"

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: istio-sidecar
Version: $version
Architecture: $(dpkg --print-architecture)
Maintainer: mesh-agent maintainers <mesh-agent@example.org>
Installed-Size: $size
Depends: libc6, iproute2, iptables
Section: net
Priority: optional
Homepage: https://istio.io/latest/docs/setup/install/virtual-machine/
Description: Istio sidecar for virtual machines (pilot-agent, Envoy, istio-iptables)
 A drop-in for Istio's istio-sidecar package: pilot-agent and istio-iptables
 rewritten in Rust, upstream Envoy, the istio systemd unit and istio-start.sh,
 at the paths Istio's package uses.
CONTROL

printf 'istio-sidecar (%s) unstable; urgency=medium\n\n  * Built from %s.\n\n -- mesh-agent maintainers <mesh-agent@example.org>  %s\n' \
  "$version" "$(git rev-parse --short HEAD 2>/dev/null || echo source)" "$(date -R)" |
  gzip -9n >"$root/usr/share/doc/istio-sidecar/changelog.gz"
chmod 0644 "$root/usr/share/doc/istio-sidecar/changelog.gz"
mkdir -p "$(dirname "$out")"
dpkg-deb --root-owner-group -Zgzip --build "$root" "$out" >/dev/null
echo "build-deb: $out ($(du -h "$out" | cut -f1), version $version, from $bin_dir)"
