#!/usr/bin/env bash
# Builds the cluster's images as OCI archives (no registry, no container engine), named
# $IMAGE_HUB/<name>:$IMAGE_TAG as the Istio chart's global.hub/global.tag point at them:
#   pause, coredns           the node's sandbox and cluster DNS
#   pilot                    istiod (pilot-discovery from the pinned istio module)
#   app                      Istio's echo server and client, the app of Istio's own tests
#   proxyv2                  this project's pilot-agent and istio-iptables, upstream Envoy and
#                            release-1.31's bootstrap template, laid out by scripts/image-rootfs.sh
#                            exactly as the Dockerfile lays them out
#   proxyv2-istio            the same image with Istio's Go pilot-agent instead of ours: the control
#   install-cni              Istio's CNI installer and plugin (its `cni` chart's image)
#   ext-authz, jwt-server    the servers Istio's security suites deploy (its samples)
# and with --vm only the images of Istio's VM echo workloads (Istio's tests run them as pods):
#   app_sidecar_debian_12    Debian 12 with the packages of Istio's app_sidecar_base, our
#                            istio-sidecar.deb (scripts/build-deb.sh) installed by dpkg, Istio's
#                            echo server and client, its test certificates, a sudoers for the
#                            app's user, app-sidecar/echo-start.sh as the entrypoint
#   app_sidecar_debian_12:$IMAGE_TAG_ISTIO   the same with Istio's Go pilot-agent in the package
#   usage: scripts/cluster/images.sh [--vm] <dir with our pilot-agent and istio-iptables> <out dir>
#          scripts/cluster/images.sh --base   (only the Debian base layer; prints its path)
# Archives whose inputs did not change are kept (the name carries a hash of the inputs).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
CACHE=${MESH_CACHE:-/var/cache/mesh-agent}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bin() { "$here/build.sh" --dir "$1"; }
istio_src=$(go mod download -json "$ISTIO_MODULE@$ISTIO_VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
envoy=${ENVOY_BIN:-$repo/.tools/bin/envoy}

# Debian bookworm with PACKAGES and USERS (name:uid…), built once per package and user list.
# Without arguments: what Istio's proxy base has (iptables, nftables, iproute2, CA roots) and its
# users, the base layer of proxyv2, proxyv2-istio, app and install-cni.
base_layer() {
  local packages=${1:-iptables,nftables,iproute2,ca-certificates,curl,procps}
  local users=${2:-istio-proxy:1337 application:1338} user
  local tar="$CACHE/rootfs/debian-bookworm-$(echo "$packages" | sha256sum | cut -c1-12).tar"
  [[ $# == 0 ]] || tar="$CACHE/rootfs/debian-bookworm-$(echo "$packages $users" | sha256sum | cut -c1-12).tar"
  if [[ ! -f $tar ]]; then
    mkdir -p "$CACHE/rootfs" "$CACHE/logs"
    local root="$work/base" log="$CACHE/logs/rootfs-$(basename "$tar" .tar).log"
    echo "images: debootstrap bookworm (log: $log)" >&2
    debootstrap --variant=minbase --include="$packages" bookworm "$root" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$log" 2>&1 ||
      { echo "images: debootstrap failed; its log: $log" >&2; tail -n 20 "$log" >&2; exit 1; }
    for user in $users; do chroot "$root" useradd -m --uid "${user#*:}" --user-group "${user%%:*}"; done
    rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/dev/* "$root"/proc/* "$root"/sys/*
    tar --numeric-owner -C "$root" -cf "$tar.partial" . && mv "$tar.partial" "$tar"
    rm -rf "$root"
  fi
  echo "$tar"
}

# A root holding only what a static Go binary needs: users, /tmp, CA roots.
scratch_layer() {
  local dir=$1
  install -d -m 0755 "$dir/etc/ssl/certs" "$dir/usr/local/bin"
  install -d -m 1777 "$dir/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nistio-proxy:x:1337:1337::/tmp:/sbin/nologin\n' >"$dir/etc/passwd"
  printf 'root:x:0:\nistio-proxy:x:1337:\n' >"$dir/etc/group"
  cp /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/"
}

# image NAME[=REFERENCE] HASH-INPUTS… -- OCI.PY-ARGS…: writes $out/NAME.tar, the image named
# REFERENCE (default $IMAGE_HUB/NAME:$IMAGE_TAG), unless its inputs are unchanged.
image() {
  local name=${1%%=*} ref=$IMAGE_HUB/${1%%=*}:$IMAGE_TAG key
  [[ $1 == *=* ]] && ref=${1#*=}
  shift
  local inputs=()
  while [[ $1 != -- ]]; do inputs+=("$1"); shift; done
  shift
  key=$( (echo "$ref"; sha256sum "$here/oci.py"; cat "${inputs[@]}" | sha256sum) | sha256sum | cut -c1-16)
  if [[ -f $out/$name.tar && $(cat "$out/$name.key" 2>/dev/null) == "$key" ]]; then return 0; fi
  python3 "$here/oci.py" --name "$ref" "$@" -o "$out/$name.tar" >&2
  echo "$key" >"$out/$name.key"
}

# vm_image NAME TAG AGENT_DIR: Istio's app_sidecar image for Debian 12 (its
# Dockerfile.app_sidecar over app_sidecar_base_debian_12) with the package built from AGENT_DIR's
# pilot-agent and istio-iptables. The base is one layer, and what the certificates, dpkg and the
# app add is the second.
vm_image() {
  local name=$1 tag=$2 agent_dir=$3 key
  [[ -x $envoy ]] || { echo "images: no Envoy at $envoy (scripts/setup.sh installs it)" >&2; exit 1; }
  local certs=$istio_src/tests/testdata/certs root=$work/$name-root
  local inputs=("$agent_dir/pilot-agent" "$agent_dir/istio-iptables" "$envoy" "$repo/scripts/build-deb.sh"
    "$istio_src/tools/packaging/common/envoy_bootstrap.json" "$repo"/docs/vm/* "$here"/app-sidecar/*
    "$(bin istio)/server" "$(bin istio)/client" "$0")
  mapfile -t -O "${#inputs[@]}" inputs < <(find "$certs" -type f | sort)
  key=$( (echo "$tag $vm_base"; sha256sum "$here/oci.py"; cat "${inputs[@]}" | sha256sum) | sha256sum | cut -c1-16)
  if [[ -f $out/$name.tar && $(cat "$out/$name.key" 2>/dev/null) == "$key" ]]; then return 0; fi
  local log="$CACHE/logs/image-$name.log"
  mkdir -p "$root" "$CACHE/logs"
  tar -C "$root" -xf "$vm_base"
  touch "$work/$name.stamp"
  OUT=$root/tmp/istio-sidecar.deb "$repo/scripts/build-deb.sh" "$agent_dir" >"$log" 2>&1 &&
    chroot "$root" dpkg -i /tmp/istio-sidecar.deb >>"$log" 2>&1 ||
    { echo "images: $name: building or installing istio-sidecar.deb failed; its log: $log" >&2; exit 1; }
  rm "$root/tmp/istio-sidecar.deb"
  # Istio's test certificates: the echo server's (cert.crt, cert.key) and the ones every VM image
  # starts with in the sidecar's secrets directory.
  cp -r "$certs/." "$root/var/lib/istio/"
  # /var/run/secrets/istio: /var/run is a link to /run, which must not resolve on this host.
  install -d "$root/run/secrets/istio"
  cp "$certs/default/"* "$root/run/secrets/istio/"
  chmod -R u+w,go-w "$root/var/lib/istio" "$root/run/secrets/istio"
  install -m 0440 "$here/app-sidecar/sudoers" "$root/etc/sudoers"
  install -m 0755 "$here/app-sidecar/echo-start.sh" "$(bin istio)/server" "$(bin istio)/client" "$root/usr/local/bin/"
  # The second layer: what changed since the base was unpacked, with its owners (the package's
  # istio-proxy user is made by its postinst). Nothing is removed from the base.
  # (/dev is the runtime's: what the package's scripts wrote to an empty /dev is left out.)
  (cd "$root" && find . -cnewer "$work/$name.stamp" ! -path . ! -path './dev/*' | sort) >"$work/$name.files"
  tar --numeric-owner --no-recursion -C "$root" -T "$work/$name.files" -cf "$work/$name.layer.tar"
  python3 "$here/oci.py" --name "$IMAGE_HUB/app_sidecar_debian_12:$tag" --layer "$vm_base" \
    --layer "$work/$name.layer.tar" --workdir / --entrypoint /usr/local/bin/echo-start.sh -o "$out/$name.tar" >&2
  echo "$key" >"$out/$name.key"
  rm -rf "$root"
}

if [[ ${1:-} == --base ]]; then base_layer; exit 0; fi
vm=0
[[ ${1:-} == --vm ]] && { vm=1; shift; }
agent_bin=$(cd "$1" && pwd) out=$2
mkdir -p "$out"
if ((vm)); then
  # Istio's app_sidecar_base_debian_12: its packages (and procps: the framework's pod script waits
  # for Envoy with pgrep), its app user (istio-proxy comes with the package). iptables is the
  # nftables variant, Debian 12's default, as there.
  vm_base=$(base_layer ca-certificates,curl,iptables,iproute2,iputils-ping,knot-dnsutils,netcat-openbsd,tcpdump,conntrack,bsdmainutils,net-tools,lsof,sudo,procps \
    application:1338)
  vm_image app_sidecar_debian_12 "$IMAGE_TAG" "$agent_bin"
  mkdir -p "$work/istio-agent"
  cp "$(bin istio)/pilot-agent" "$agent_bin/istio-iptables" "$work/istio-agent/"
  vm_image app_sidecar_debian_12-istio "$IMAGE_TAG_ISTIO" "$work/istio-agent"
  ls "$out"/app_sidecar_*.tar
  exit 0
fi
base=$(base_layer)

mkdir -p "$work/pause"
install -D -m 0755 "$(bin pause)/pause" "$work/pause/pause"
image pause "$work/pause/pause" -- --layer "$work/pause" --entrypoint /pause

mkdir -p "$work/coredns" && scratch_layer "$work/coredns"
install -m 0755 "$(bin coredns)/coredns" "$work/coredns/coredns"
image coredns "$work/coredns/coredns" -- --layer "$work/coredns" --entrypoint /coredns

mkdir -p "$work/pilot" && scratch_layer "$work/pilot"
install -m 0755 "$(bin istio)/pilot-discovery" "$work/pilot/usr/local/bin/"
image pilot "$work/pilot/usr/local/bin/pilot-discovery" -- --layer "$work/pilot" \
  --user 1337:1337 --entrypoint /usr/local/bin/pilot-discovery

mkdir -p "$work/app/usr/local/bin"
install -m 0755 "$(bin istio)/server" "$(bin istio)/client" "$work/app/usr/local/bin/"
install -m 0644 "$istio_src/tests/testdata/certs/dns/cert-chain.pem" "$work/app/cert.crt"
install -m 0644 "$istio_src/tests/testdata/certs/dns/key.pem" "$work/app/cert.key"
image app "$base" "$work/app/usr/local/bin/server" "$work/app/usr/local/bin/client" -- \
  --layer "$base" --layer "$work/app" --user 1338 --entrypoint /usr/local/bin/server

# proxyv2: the Dockerfile's final stage is scripts/image-rootfs.sh's tree over a Debian base with
# the istio-proxy user; the same script lays out this image, with Istio's release template.
mkdir -p "$work/template"
cp "$istio_src/tools/packaging/common/envoy_bootstrap.json" "$work/template/envoy_bootstrap_tmpl.json"
# ISTIO_META_ISTIO_PROXY_SHA as Istio's build of the module sets it: the PROXY_REPO_SHA of its
# istio.deps (tools/docker-builder passes it to Dockerfile.proxyv2 as proxy_version).
proxy_sha=$(python3 -c 'import json, sys
print(next(d["lastStableSHA"] for d in json.load(open(sys.argv[1])) if d["name"] == "PROXY_REPO_SHA"))' \
  "$istio_src/istio.deps")
proxy_image() {
  local name=$1 agent_dir=$2
  [[ -x $envoy ]] || { echo "images: no Envoy at $envoy (scripts/setup.sh installs it)" >&2; exit 1; }
  "$repo/scripts/image-rootfs.sh" "$agent_dir" "$envoy" "$work/$name" "$work/template"
  image "$name" "$base" "$work/$name/usr/local/bin/pilot-agent" "$work/$name/usr/local/bin/istio-iptables" \
    "$envoy" "$work/template/envoy_bootstrap_tmpl.json" "$repo/scripts/image-rootfs.sh" \
    "$istio_src/istio.deps" -- \
    --layer "$base" --layer "$work/$name" \
    --owner /etc/istio=1337:1337 --owner /var/lib/istio=1337:1337 --owner /etc/certs=1337:1337 \
    --env "ISTIO_META_ISTIO_VERSION=$ISTIO_BUILD_VERSION" \
    --env "ISTIO_META_ISTIO_PROXY_SHA=$proxy_sha" --user 1337:1337 --workdir / \
    --entrypoint /usr/local/bin/pilot-agent
}
proxy_image proxyv2 "$agent_bin"
# The control: Istio's Go pilot-agent, everything else the same. Istio's injected istio-init runs
# `pilot-agent istio-iptables`, so the separate istio-iptables binary image-rootfs.sh installs
# (ours) is never run in this image.
mkdir -p "$work/istio-agent"
cp "$(bin istio)/pilot-agent" "$agent_bin/istio-iptables" "$work/istio-agent/"
proxy_image proxyv2-istio "$work/istio-agent"

mkdir -p "$work/install-cni/opt/cni/bin"
install -D -m 0755 "$(bin istio)/install-cni" "$work/install-cni/usr/local/bin/install-cni"
install -m 0755 "$(bin istio)/istio-cni" "$work/install-cni/opt/cni/bin/istio-cni"
image install-cni "$base" "$work/install-cni/usr/local/bin/install-cni" -- \
  --layer "$base" --layer "$work/install-cni" --entrypoint /usr/local/bin/install-cni

# The servers of Istio's security suites: ext-authz under the hub and tag the framework asks for,
# the JWT server under the reference of the module's samples/jwt-server/jwt-server.yaml
# (IfNotPresent: the imported image is used).
servers=$(bin istio-test-servers)
mkdir -p "$work/ext-authz" && scratch_layer "$work/ext-authz"
install -m 0755 "$servers/extauthz" "$work/ext-authz/usr/local/bin/"
image ext-authz "$work/ext-authz/usr/local/bin/extauthz" -- --layer "$work/ext-authz" \
  --entrypoint /usr/local/bin/extauthz
jwt_ref=$(sed -n 's/^ *- image: *\(.*jwt-server:.*\)$/\1/p' "$istio_src/samples/jwt-server/jwt-server.yaml")
mkdir -p "$work/jwt-server/bin" && scratch_layer "$work/jwt-server"
install -m 0755 "$servers/jwt-server" "$work/jwt-server/bin/"
image "jwt-server=$jwt_ref" "$work/jwt-server/bin/jwt-server" -- --layer "$work/jwt-server" \
  --workdir /bin --entrypoint /bin/jwt-server

ls "$out"/*.tar
