#!/usr/bin/env bash
# The node's mount namespace: run by scripts/cluster.sh under `unshare -m --propagation private`
# inside the node's network namespace. It lays the node's own directories over the fixed paths
# containerd, the shims, the CNI plugins and kubelet use, makes the three kernel settings kubelet
# checks read as it expects (here only, never on the host), then holds the namespace open.
#   usage: node.sh <state dir> <cni bin dir>
set -euo pipefail
state=$1 cni_bin=$2
root=$state/node
mkdir -p "$root"/{run,var-lib,var-log,etc-cni,etc-kubernetes} "$state/sysctl"
mount --bind "$root/run" /run
mount --bind "$root/var-lib" /var/lib
mount --bind "$root/var-log" /var/log
mkdir -p /etc/cni/net.d /opt/cni/bin "$root/opt-cni-bin"
mount --bind "$root/etc-cni" /etc/cni/net.d
# The node's own copy: Istio's CNI installer adds its plugin there.
cp -a "$cni_bin/." "$root/opt-cni-bin/"
mount --bind "$root/opt-cni-bin" /opt/cni/bin
mount --bind "$state/node-resolv.conf" /etc/resolv.conf
mount --bind "$state/node-hosts" /etc/hosts
# kubelet (protectKernelDefaults) refuses to start unless these read 1 / 10 / 1.
for setting in vm/overcommit_memory=1 kernel/panic=10 kernel/panic_on_oops=1; do
  file=$state/sysctl/${setting%%=*}
  mkdir -p "$(dirname "$file")" && echo "${setting#*=}" >"$file"
  mount --bind "$file" "/proc/sys/${setting%%=*}"
done
touch "$state/node.ready"
exec sleep infinity
