#!/usr/bin/env bash
# A one-node Kubernetes cluster with Istio's own istiod, on this machine, in a network namespace
# of its own: nothing listens on the host's addresses, and node, pod and service addresses come
# from 198.18.0.0/15, never routed beyond the machine.
#   scripts/cluster.sh up       build what is missing (scripts/cluster/build.sh, images.sh), start
#                               etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
#                               containerd + runc + CNI, kubelet, kube-proxy, CoreDNS, then install
#                               Istio from the pinned module's charts; exits 0 once the node and
#                               istiod are Ready and prints the kubeconfig path
#   scripts/cluster.sh down     stop and remove everything `up` made, by the ids it recorded
#   scripts/cluster.sh status   what runs
#   scripts/cluster.sh env      `export KUBECONFIG=… PATH=…` (kubectl and istioctl that reach the
#                               cluster's namespace)
#   scripts/cluster.sh load TAR…           import more OCI archives into the running node
#   scripts/cluster.sh tag IMAGE NAME      give an image of the node a second name
# Environment: MESH_AGENT_BIN (our pilot-agent and istio-iptables for the proxyv2 image; default
# target/debug), MESH_CLUSTER_DIR (state; default /var/tmp/mesh-cluster), MESH_CACHE (builds).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
here=$repo/scripts/cluster
# shellcheck source=cluster/versions.env
source "$here/versions.env"
CACHE=${MESH_CACHE:-/var/cache/mesh-agent}
STATE=${MESH_CLUSTER_DIR:-/var/tmp/mesh-cluster}
NETNS=mesh-node
NODE=mesh-node
NODE_IP=198.18.0.1
POD_CIDR=198.18.16.0/20
POD_GW=198.18.16.1
SVC_CIDR=198.19.0.0/16
KUBERNETES_SVC_IP=198.19.0.1
DNS_IP=198.19.0.10
CGROUP_ROOT=mesh-node
# scripts/cluster/registry.py, on the node's loopback: what containerd resolves `localhost/...` to.
REGISTRY=127.0.0.1:5000
# Components in start order; `down` stops them in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd registry kubelet kube-proxy)

log() { echo "cluster: $*" >&2; }
die() { log "$*"; exit 1; }
bin() { "$here/build.sh" --dir "$1"; }
holder() { cat "$STATE/pids/holder" 2>/dev/null; }
alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }
# Runs a command in the node's network and mount namespaces.
in_node() { nsenter -t "$(holder)" -m -n -- "$@"; }
kubectl_() { in_node "$(bin kubernetes)/kubectl" --kubeconfig "$STATE/pki/admin.kubeconfig" "$@"; }

# wait_for WHAT SECONDS COMMAND…: polls COMMAND every 0.5 s; on timeout names WHAT.
wait_for() {
  local what=$1 limit=$2 t0=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS - t0 < limit)) || { log "$what not ready after ${limit} s"; return 1; }
    sleep 0.5
  done
  log "$what ready ($((SECONDS - t0)) s)"
}

# start NAME COMMAND…: a component in the node's namespaces, in a session of its own, its pid
# recorded; its output in $STATE/logs/NAME.log.
start() {
  local name=$1
  shift
  setsid nsenter -t "$(holder)" -m -n -- "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$STATE/pids/$name"
}

# Every process in the node's mount namespace: the components, containerd's shims.
node_pids() {
  local ns
  ns=$(readlink "/proc/$(holder)/ns/mnt" 2>/dev/null) || return 0
  # `mnt:[4026532239]`: the brackets are literal, not a -lname character class.
  ns=$(sed 's/[][]/\\&/g' <<<"$ns")
  find /proc -mindepth 3 -maxdepth 3 -path '/proc/[0-9]*/ns/mnt' -lname "$ns" 2>/dev/null |
    cut -d/ -f3 | grep -vx "$(holder)" || true
}

cgroup_dirs() { find /sys/fs/cgroup -mindepth 2 -maxdepth 2 -type d -name "$CGROUP_ROOT" 2>/dev/null; }
# Every process in the node's cgroups: the pods' containers (each in namespaces of its own).
cgroup_pids() {
  local dir
  for dir in $(cgroup_dirs); do find "$dir" -name cgroup.procs -exec cat {} + 2>/dev/null; done | sort -u
}

down() {
  local name pid i
  # kubelet first, so nothing restarts the pods while they stop.
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    name=${COMPONENTS[i]}
    pid=$(cat "$STATE/pids/$name" 2>/dev/null) || continue
    alive "$pid" && kill -TERM "$pid" 2>/dev/null
    [[ $name == kubelet ]] && sleep 0.5
  done
  if alive "$(holder)"; then
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      [[ -z $(node_pids) ]] && break
      sleep 0.5
    done
    for pid in $(node_pids); do kill -KILL "$pid" 2>/dev/null || true; done
  fi
  for pid in "$STATE"/pids/*; do
    [[ -f $pid ]] && kill -KILL "$(cat "$pid")" 2>/dev/null || true
  done
  # The containers outlive their shims: end them by the node's cgroups.
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    local left
    left=$(cgroup_pids)
    [[ -z $left ]] && break
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null || true
    sleep 0.2
  done
  # Pods' cgroups, deepest first (their processes are gone with the node's namespace).
  local dir
  for dir in $(cgroup_dirs); do
    find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [[ -d $dir ]] && log "cgroup $dir still has processes"
  done
  ip netns del "$NETNS" 2>/dev/null || true
  if [[ -d $STATE ]]; then
    if [[ ${KEEP_LOGS:-} == 1 ]]; then
      find "$STATE" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} +
    else
      rm -rf "$STATE"
    fi
  fi
  return 0
}

network() {
  ip netns add "$NETNS"
  local n=(ip -n "$NETNS")
  "${n[@]}" link set lo up
  # The node's address on node0, one end of a veth pair whose other end, up with no address,
  # drops what reaches it (the kernel here has no dummy links). Service addresses and anything
  # else leave through node0, so the node's own processes can connect to ClusterIPs that
  # kube-proxy rewrites; nothing goes further.
  "${n[@]}" link add node0 type veth peer name node0-end
  "${n[@]}" addr add "$NODE_IP/32" dev node0
  "${n[@]}" link set node0 up
  "${n[@]}" link set node0-end up
  "${n[@]}" route add default dev node0
  echo "nameserver $DNS_IP" >"$STATE/pod-resolv.conf"
  echo "nameserver 127.0.0.1" >"$STATE/node-resolv.conf"
  printf '127.0.0.1 localhost\n%s %s\n' "$NODE_IP" "$NODE" >"$STATE/node-hosts"
}

cgroups() {
  local ctrl dir
  for ctrl in /sys/fs/cgroup/*/; do
    [[ -e $ctrl/cgroup.procs ]] || continue
    dir=$ctrl$CGROUP_ROOT
    mkdir -p "$dir"
    if [[ -e $ctrl/cpuset.cpus ]]; then
      cat "$ctrl/cpuset.cpus" >"$dir/cpuset.cpus"
      cat "$ctrl/cpuset.mems" >"$dir/cpuset.mems"
    fi
  done
}

configs() {
  local cni=$STATE/node/etc-cni
  mkdir -p "$cni"
  cat >"$cni/10-mesh.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "mesh", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GW"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  cat >"$STATE/containerd.toml" <<EOF
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$IMAGE_HUB/pause:$IMAGE_TAG"
  # Pulls (imagePullPolicy: Always) of `localhost/...` go to scripts/cluster/registry.py.
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$STATE/node/certs.d"
[plugins.'io.containerd.cri.v1.runtime']
  # root here lacks CAP_SYS_RESOURCE: runc cannot lower a container's oom_score_adj.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = "$(bin runc)/runc"
    SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
EOF
  mkdir -p "$STATE/node/certs.d/localhost"
  cat >"$STATE/node/certs.d/localhost/hosts.toml" <<EOF
server = "http://$REGISTRY"
[host."http://$REGISTRY"]
  capabilities = ["pull", "resolve"]
EOF
  cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization: {mode: Webhook}
address: $NODE_IP
tlsCertFile: $STATE/pki/kubelet-serving.crt
tlsPrivateKeyFile: $STATE/pki/kubelet-serving.key
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
failCgroupV1: false
failSwapOn: false
# Checked, never written: node.sh makes them read as kubelet expects inside the node only.
protectKernelDefaults: true
oomScoreAdj: 0
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
resolvConf: $STATE/pod-resolv.conf
staticPodPath: ""
maxPods: 110
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
syncFrequency: 10s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
serializeImagePulls: false
EOF
  cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/pki/kube-proxy.kubeconfig}
hostnameOverride: $NODE
mode: iptables
clusterCIDR: $POD_CIDR
# Pods share one bridge without br_netfilter: service traffic is masqueraded so replies come back
# through the node, where the connection's translation is undone.
iptables: {masqueradeAll: true}
# Zeros: kube-proxy leaves the kernel's conntrack settings as they are (they are the host's).
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
EOF
}

start_control_plane() {
  local k8s pki=$STATE/pki
  k8s=$(bin kubernetes)
  start etcd "$(bin etcd)/etcd" --data-dir "$STATE/etcd" --unsafe-no-fsync \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381
  start kube-apiserver "$k8s/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
    --advertise-address "$NODE_IP" --bind-address 0.0.0.0 --secure-port 6443 \
    --service-cluster-ip-range "$SVC_CIDR" --allow-privileged \
    --client-ca-file "$pki/ca.crt" --tls-cert-file "$pki/apiserver.crt" \
    --tls-private-key-file "$pki/apiserver.key" \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$pki/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --api-audiences https://kubernetes.default.svc.cluster.local,istio-ca \
    --authorization-mode Node,RBAC --enable-aggregator-routing=true \
    --kubelet-preferred-address-types InternalIP
  wait_for kube-apiserver 90 kubectl_ get --raw /readyz
  start kube-controller-manager "$k8s/kube-controller-manager" \
    --kubeconfig "$pki/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$pki/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$pki/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false --use-service-account-credentials \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key"
  start kube-scheduler "$k8s/kube-scheduler" --kubeconfig "$pki/scheduler.kubeconfig" \
    --authentication-kubeconfig "$pki/scheduler.kubeconfig" \
    --authorization-kubeconfig "$pki/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false
  sed "s|@HUB@|$IMAGE_HUB|; s|@TAG@|$IMAGE_TAG|; s|@DNS_IP@|$DNS_IP|" "$here/manifests/node-rbac.yaml" |
    kubectl_ apply -f - >/dev/null
}

start_node() {
  local shim_path
  shim_path="$(bin containerd):$(bin runc):/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  start containerd env PATH="$shim_path" "$(bin containerd)/containerd" --config "$STATE/containerd.toml"
  wait_for containerd 30 in_node test -S /run/containerd/containerd.sock
  local tar
  for tar in "$STATE"/images/*.tar; do
    in_node "$(bin containerd)/ctr" -n k8s.io images import "$tar" >>"$STATE/logs/images.log" 2>&1 ||
      die "importing $tar into containerd failed"
  done
  start registry python3 "$here/registry.py" --listen "$REGISTRY" "$STATE/images"
  wait_for registry 30 in_node curl -sf "http://$REGISTRY/v2/"
  start kubelet env PATH="$shim_path" "$(bin kubernetes)/kubelet" --config "$STATE/kubelet.yaml" \
    --kubeconfig "$STATE/pki/kubelet.kubeconfig" --node-ip "$NODE_IP" --hostname-override "$NODE"
  start kube-proxy "$(bin kubernetes)/kube-proxy" --config "$STATE/kube-proxy.yaml"
  wait_for "node $NODE" 120 kubectl_ wait --for=condition=Ready "node/$NODE" --timeout=1s
}

start_dns() {
  sed "s|@HUB@|$IMAGE_HUB|; s|@TAG@|$IMAGE_TAG|; s|@DNS_IP@|$DNS_IP|" "$here/manifests/coredns.yaml" |
    kubectl_ apply -f - >/dev/null
}

# Istio as a user installs it: the CRDs and istiod from the module's own charts (istioctl's
# embedded copy of them), only the images and what upstream Envoy needs changed (docs/cluster.md).
install_istio() {
  local manifest=$STATE/istio.yaml
  in_node "$(bin istio)/istioctl" manifest generate --kubeconfig "$STATE/pki/admin.kubeconfig" \
    -f "$here/manifests/istio-operator.yaml" --set hub="$IMAGE_HUB" --set tag="$IMAGE_TAG" \
    >"$manifest" 2>"$STATE/logs/istioctl.log" || die "istioctl manifest generate failed; its log: $STATE/logs/istioctl.log"
  kubectl_ create namespace istio-system >/dev/null
  kubectl_ apply --server-side --force-conflicts -f "$manifest" >"$STATE/logs/istio-apply.log" 2>&1 ||
    die "applying Istio's manifest failed; its log: $STATE/logs/istio-apply.log"
  wait_for istiod 180 kubectl_ -n istio-system wait --for=condition=Available deployment/istiod --timeout=1s
  wait_for "istiod's injection webhook" 60 webhook_ready
  in_node "$(bin istio)/istioctl" manifest generate -f "$here/manifests/istio-cni.yaml" \
    --set hub="$IMAGE_HUB" --set tag="$IMAGE_TAG" >"$STATE/istio-cni.yaml" 2>>"$STATE/logs/istioctl.log" ||
    die "istioctl manifest generate (CNI) failed; its log: $STATE/logs/istioctl.log"
  kubectl_ apply --server-side -f "$STATE/istio-cni.yaml" >>"$STATE/logs/istio-apply.log" 2>&1 ||
    die "applying Istio's CNI manifest failed; its log: $STATE/logs/istio-apply.log"
  wait_for "Istio's CNI node agent" 120 kubectl_ -n kube-system rollout status daemonset/istio-cni-node --timeout=1s
}

# The injector's CA bundle is patched in by istiod once it runs.
webhook_ready() {
  [[ -n $(kubectl_ get mutatingwebhookconfiguration istio-sidecar-injector \
    -o jsonpath='{.webhooks[0].clientConfig.caBundle}') ]]
}

write_env() {
  mkdir -p "$STATE/bin"
  local tool
  for tool in kubectl istioctl; do
    local real
    real=$(bin "$([[ $tool == kubectl ]] && echo kubernetes || echo istio)")/$tool
    printf '#!/bin/sh\n# %s in the cluster'"'"'s network namespace.\nexec nsenter --net=/run/netns/%s -- %s "$@"\n' \
      "$tool" "$NETNS" "$real" >"$STATE/bin/$tool"
    chmod +x "$STATE/bin/$tool"
  done
  cp "$STATE/pki/admin.kubeconfig" "$STATE/kubeconfig"
}

up() {
  [[ $(id -u) == 0 ]] || die "up needs root (network namespace, mounts, cgroups)"
  if [[ -e $STATE || -e /run/netns/$NETNS ]] || [[ -n $(cgroup_dirs) ]]; then
    log "removing what an earlier run left"
    down
  fi
  local t0=$SECONDS
  "$here/setup.sh"
  "$here/build.sh"
  local agent_bin=${MESH_AGENT_BIN:-$repo/target/debug}
  [[ -x $agent_bin/pilot-agent && -x $agent_bin/istio-iptables ]] ||
    die "no pilot-agent and istio-iptables in $agent_bin (cargo build, or set MESH_AGENT_BIN)"
  mkdir -p "$STATE"/{pids,logs}
  "$here/images.sh" "$agent_bin" "$CACHE/images" >/dev/null
  mkdir -p "$STATE/images" && ln -s "$CACHE"/images/*.tar "$STATE/images/"
  trap 'log "up failed: logs in $STATE/logs; removing what was started"; KEEP_LOGS=1 down' ERR
  "$here/pki.sh" "$STATE/pki" "$NODE" "$NODE_IP" "$KUBERNETES_SVC_IP"
  network
  cgroups
  configs
  setsid nsenter --net="/run/netns/$NETNS" unshare -m --propagation private \
    "$here/node.sh" "$STATE" "$(bin cni)" >"$STATE/logs/node.log" 2>&1 </dev/null &
  echo $! >"$STATE/pids/holder"
  wait_for "node namespace" 10 test -e "$STATE/node.ready"
  start_control_plane
  start_node
  start_dns
  install_istio
  write_env
  trap - ERR
  log "up in $((SECONDS - t0)) s; kubeconfig: $STATE/kubeconfig"
  echo "$STATE/kubeconfig"
}

# Images `up` does not load (scripts/cluster/images.sh --vm), into the running node.
load() {
  alive "$(holder)" || die "the cluster is not up"
  local tar
  for tar in "$@"; do
    in_node "$(bin containerd)/ctr" -n k8s.io images import "$tar" >>"$STATE/logs/images.log" 2>&1 ||
      die "importing $tar into containerd failed; its log: $STATE/logs/images.log"
  done
}

tag() {
  alive "$(holder)" || die "the cluster is not up"
  in_node "$(bin containerd)/ctr" -n k8s.io images tag --force "$1" "$2" >>"$STATE/logs/images.log" 2>&1 ||
    die "naming $1 $2 failed; its log: $STATE/logs/images.log"
}

status() {
  alive "$(holder)" || { echo "cluster: down"; return 1; }
  local name pid
  for name in "${COMPONENTS[@]}"; do
    pid=$(cat "$STATE/pids/$name" 2>/dev/null || true)
    printf '%-24s %s\n' "$name" "$(alive "$pid" && echo "running (pid $pid)" || echo "not running")"
  done
  kubectl_ get nodes,pods -A -o wide
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  env) echo "export KUBECONFIG=$STATE/kubeconfig PATH=$STATE/bin:\$PATH" ;;
  load) shift; load "$@" ;;
  tag) (($# == 3)) || die "usage: $0 tag IMAGE NAME"; tag "$2" "$3" ;;
  *) echo "usage: $0 up|down|status|env|load TAR…|tag IMAGE NAME" >&2; exit 2 ;;
esac
