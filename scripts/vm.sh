#!/usr/bin/env bash
# A Debian 12 VM with systemd as PID 1 (systemd-nspawn --boot), onboarded into the mesh with
# our istio-sidecar.deb as Istio's VM guide onboards one.
#
#   scripts/vm.sh up [--namespace NS] [--group NAME] [--files DIR] [--deb FILE] [--peer NETNS]
#   scripts/vm.sh up --cluster [--namespace NS] [--group NAME] [--service-account SA]
#                    [--ports NAME=PORT,…] [--probe PORT/PATH] [--workloadgroup FILE]
#                    [--token-duration SECONDS] [--env KEY=VALUE]… [--deb FILE]
#   scripts/vm.sh exec CMD…      (a command inside the VM, as root; stdin and exit status pass)
#   scripts/vm.sh down
#
# The VM lives in the network namespace mesh-vm (198.18.32.2/24, veth vm0), joined to --peer
# (default mesh-node, the cluster's node: 198.18.32.1 there) when that namespace exists, with
# routes to the node (198.18.0.0/20), the pods (198.18.16.0/20) and the Services
# (198.19.0.0/16) through it; no route leaves the machine. Without the peer it boots standalone.
# --files DIR holds what `istioctl x workload entry configure` writes (cluster.env, mesh.yaml,
# root-cert.pem, istio-token, hosts): installed where the VM guide puts them, then
# `systemctl enable --now istio`. --env KEY=VALUE (repeatable) adds a line to cluster.env, as
# an operator edits it (SECRET_TTL=60s, ISTIO_AGENT_FLAGS=router, …). --deb: the package (default target/debian/istio-sidecar.deb).
# --cluster: the cluster `scripts/cluster.sh up` runs (kubectl and istioctl from its state
# directory, MESH_CLUSTER_DIR): the namespace and service account when missing, the
# WorkloadGroup (--workloadgroup FILE, or one made with `istioctl x workload group create` from
# --ports and --probe), the files from `istioctl x workload entry configure --autoregister`
# (istiod's ClusterIP as the address of istiod.istio-system.svc, reached through the node's
# kube-proxy), the cluster's DNS as the VM's resolver; `down` deletes the WorkloadGroup (and
# the namespace when `up` created it). The files stay in /run/mesh-vm/files.
# A reboot inside (`systemctl reboot`) boots again in a fresh network namespace, as a machine
# loses its iptables state; `poweroff` ends it. Prerequisites: scripts/vm/setup.sh, root.
# The Debian root is made once per machine under $MESH_CACHE/rootfs/ (default /var/cache/mesh-agent; debootstrap,
# ~35 s); each VM writes to an overlay above it, removed by `down` with everything else.
set -euo pipefail
cd "$(dirname "$0")/.."

NAME=mesh-vm
CACHE=${MESH_CACHE:-/var/cache/mesh-agent}/rootfs
LOWER=$CACHE/bookworm
STATE=/var/lib/$NAME # overlay upper, work dir and merged root: the VM's disk
RUN=/run/$NAME       # pids, boot log
VM_IP=198.18.32.2
PEER_IP=198.18.32.1
ROUTES=(198.18.0.0/20 198.18.16.0/20 198.19.0.0/16)
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CLUSTER_DIR=${MESH_CLUSTER_DIR:-/var/tmp/mesh-cluster}
CLUSTER_DNS=198.19.0.10

die() {
  echo "vm.sh: $*" >&2
  exit 1
}

[[ $(id -u) == 0 ]] || die "needs root"

rootfs() {
  [[ -d $LOWER ]] && return
  command -v debootstrap >/dev/null || die "debootstrap is missing: run scripts/vm/setup.sh"
  echo "vm.sh: making the Debian 12 root in $LOWER (once per machine)"
  mkdir -p "$CACHE"
  rm -rf "$LOWER.partial"
  debootstrap --variant=minbase \
    --include=systemd,systemd-sysv,dbus,iproute2,iptables,curl,procps,hostname \
    bookworm "$LOWER.partial" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
    die "debootstrap failed: $CACHE/debootstrap.log"
  mv "$LOWER.partial" "$LOWER"
}

# The guest's init: the child of the current nspawn.
guest_pid() {
  local nspawn
  nspawn=$(cat "$RUN/nspawn.pid" 2>/dev/null) || return 1
  pgrep -P "$nspawn" | head -1
}

vm_exec() {
  local pid
  pid=$(guest_pid) || die "the VM is not running"
  [[ -n $pid ]] || die "the VM is not running"
  nsenter -t "$pid" -a -- /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root TERM=dumb SYSTEMD_PAGER= "$@"
}

# One boot's network: a fresh namespace, the veth to the peer when it exists.
network() {
  local peer=$1
  ip netns del "$NAME" 2>/dev/null || true
  ip netns add "$NAME"
  ip -n "$NAME" link set lo up
  if ip netns list | grep -qw "^$peer"; then
    ip -n "$peer" link del "$NAME" 2>/dev/null || true
    ip link add vm0 netns "$NAME" type veth peer name "$NAME" netns "$peer"
    ip -n "$peer" addr add "$PEER_IP/24" dev "$NAME"
    ip -n "$peer" link set "$NAME" up
    ip -n "$NAME" addr add "$VM_IP/24" dev vm0
    ip -n "$NAME" link set vm0 up
    for r in "${ROUTES[@]}"; do
      ip -n "$NAME" route add "$r" via "$PEER_IP"
    done
  fi
}

# kubectl and istioctl of scripts/cluster.sh (they enter the node's network namespace).
kubectl_() { KUBECONFIG=$CLUSTER_DIR/kubeconfig "$CLUSTER_DIR/bin/kubectl" --request-timeout=30s "$@"; }
istioctl_() { KUBECONFIG=$CLUSTER_DIR/kubeconfig "$CLUSTER_DIR/bin/istioctl" "$@"; }

# The cluster's side of onboarding, as Istio's VM guide: namespace, service account,
# WorkloadGroup, then the five files from `istioctl x workload entry configure` in $RUN/files.
cluster_files() {
  local ns=$1 group=$2 sa=$3 ports=$4 probe=$5 wg=$6 duration=$7 out=$RUN/files i
  [[ -x $CLUSTER_DIR/bin/istioctl && -f $CLUSTER_DIR/kubeconfig ]] ||
    die "no cluster in $CLUSTER_DIR: run scripts/cluster.sh up"
  # A namespace an earlier `down` deleted may still be going.
  for i in $(seq 1 240); do
    [[ $(kubectl_ get namespace "$ns" -o jsonpath='{.status.phase}' 2>/dev/null) == Terminating ]] || break
    ((i < 240)) || die "namespace $ns is still terminating after 120 s"
    sleep 0.5
  done
  if ! kubectl_ get namespace "$ns" >/dev/null 2>&1; then
    kubectl_ create namespace "$ns" >/dev/null
    echo "$ns" >"$RUN/created-namespace"
  fi
  kubectl_ -n "$ns" get serviceaccount "$sa" >/dev/null 2>&1 ||
    kubectl_ -n "$ns" create serviceaccount "$sa" >/dev/null
  if [[ -z $wg ]]; then
    wg=$RUN/workloadgroup.yaml
    istioctl_ x workload group create --name "$group" --namespace "$ns" --labels "app=$group" \
      --serviceAccount "$sa" ${ports:+--ports "$ports"} >"$wg"
    if [[ -n $probe ]]; then
      local path=/
      [[ $probe == */* ]] && path=/${probe#*/}
      printf '  probe:\n    periodSeconds: 2\n    httpGet:\n      port: %s\n      path: %s\n' \
        "${probe%%/*}" "$path" >>"$wg"
    fi
  fi
  kubectl_ apply -f "$wg" >/dev/null
  cp "$wg" "$RUN/applied-workloadgroup.yaml"
  # istiod writes its root certificate into every namespace; istioctl reads it from there.
  for i in $(seq 1 100); do
    kubectl_ -n "$ns" get configmap istio-ca-root-cert >/dev/null 2>&1 && break
    ((i < 100)) || die "no istio-ca-root-cert in namespace $ns after 50 s: is istiod running?"
    sleep 0.5
  done
  local ip id
  ip=$(kubectl_ -n istio-system get service istiod -o jsonpath='{.spec.clusterIP}')
  id=$(kubectl_ -n istio-system get deployment istiod \
    -o jsonpath='{.spec.template.spec.containers[0].env[?(@.name=="CLUSTER_ID")].value}')
  mkdir -p "$out"
  istioctl_ x workload entry configure -f "$wg" -o "$out" --clusterID "${id:-Kubernetes}" \
    --autoregister --tokenDuration "$duration" --ingressIP "$ip" >"$RUN/istioctl.log" 2>&1 ||
    die "istioctl x workload entry configure failed: $(cat "$RUN/istioctl.log")"
  echo "vm.sh: WorkloadGroup $ns/$group applied; istiod $ip, cluster ${id:-Kubernetes}; files in $out"
}

# Boots the VM again while the guest asks for a reboot (nspawn exits 133). Runs in the
# background from `up`, in a cgroup of its own (nspawn --keep-unit uses the caller's).
boot_loop() {
  local peer=$1 group=$2 rc
  for c in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified; do
    [[ -d $c ]] || continue
    mkdir -p "$c/$NAME"
    echo "$BASHPID" >"$c/$NAME/cgroup.procs"
  done
  while :; do
    network "$peer"
    rc=0
    systemd-nspawn -D "$STATE/root" --boot --register=no --keep-unit -M "$NAME" \
      --hostname="$group" --network-namespace-path="/run/netns/$NAME" \
      --capability=CAP_NET_ADMIN --console=read-only --resolv-conf="$RESOLV" >>"$RUN/console.log" 2>&1 &
    echo $! >"$RUN/nspawn.pid"
    wait $! || rc=$?
    echo "vm.sh: nspawn exited $rc at $(date -u +%T.%N)" >>"$RUN/console.log"
    [[ $rc == 133 && ! -e $RUN/stopping ]] || break
    echo $(($(cat "$RUN/boots") + 1)) >"$RUN/boots"
  done
  rm -f "$RUN/nspawn.pid"
}

wait_running() {
  local i state
  for i in $(seq 1 300); do
    if guest_pid >/dev/null 2>&1 && [[ -n $(guest_pid) ]]; then
      state=$(vm_exec systemctl is-system-running 2>/dev/null || true)
      [[ $state == running || $state == degraded ]] && return 0
    fi
    [[ -e $RUN/loop.pid ]] && kill -0 "$(cat "$RUN/loop.pid")" 2>/dev/null ||
      die "the VM did not boot: $RUN/console.log"
    sleep 0.1
  done
  die "the VM did not reach running in 30 s: $RUN/console.log"
}

# Installs the onboarding files where Istio's VM guide puts them, then starts the sidecar.
onboard() {
  local files=$1 ns=$2 f
  shift 2
  for f in cluster.env mesh.yaml root-cert.pem istio-token hosts; do
    [[ -f $files/$f ]] || die "--files $files has no $f (istioctl x workload entry configure writes it)"
  done
  local want
  want=$(sed -n "s/^ISTIO_NAMESPACE=['\"]\{0,1\}\([^'\"]*\).*/\1/p" "$files/cluster.env")
  [[ -z $want || $want == "$ns" ]] ||
    echo "vm.sh: note: cluster.env is for namespace $want, not --namespace $ns" >&2
  mkdir -p "$STATE/root/root/onboard"
  cp "$files"/{cluster.env,mesh.yaml,root-cert.pem,istio-token,hosts} "$STATE/root/root/onboard/"
  local q="'\\''" v
  for f in "$@"; do
    v=${f#*=}
    printf "%s='%s'\n" "${f%%=*}" "${v//\'/$q}" >>"$STATE/root/root/onboard/cluster.env"
  done
  vm_exec /bin/sh -euc '
    cd /root/onboard
    install -D -m 0644 cluster.env /var/lib/istio/envoy/cluster.env
    install -D -m 0644 mesh.yaml /etc/istio/config/mesh
    install -D -m 0644 root-cert.pem /etc/certs/root-cert.pem
    install -d -o istio-proxy -m 0755 /var/run/secrets
    install -D -m 0640 -o istio-proxy -g istio-proxy istio-token /var/run/secrets/tokens/istio-token
    cat hosts >>/etc/hosts
    mkdir -p /etc/istio/proxy
    chown -R istio-proxy:istio-proxy /var/lib/istio /etc/certs /etc/istio/proxy \
      /etc/istio/config /var/run/secrets
    systemctl enable --now istio'
}

up() {
  local ns=vm group=vm files="" deb=target/debian/istio-sidecar.deb peer=mesh-node
  local cluster=false sa="" ports="" probe="" wg="" duration=3600 resolv=auto env=()
  while (($#)); do
    case $1 in
    --cluster) cluster=true; shift ;;
    --service-account) sa=$2; shift 2 ;;
    --ports) ports=$2; shift 2 ;;
    --probe) probe=$2; shift 2 ;;
    --workloadgroup) wg=$2; shift 2 ;;
    --token-duration) duration=$2; shift 2 ;;
    --env)
      [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]] || die "--env wants KEY=VALUE, not $2"
      env+=("$2"); shift 2 ;;
    --namespace) ns=$2; shift 2 ;;
    --group) group=$2; shift 2 ;;
    --files) files=$2; shift 2 ;;
    --deb) deb=$2; shift 2 ;;
    --peer) peer=$2; shift 2 ;;
    *) die "unknown argument $1" ;;
    esac
  done
  [[ ! -e $RUN/loop.pid ]] || die "a VM is already up ($RUN); run: scripts/vm.sh down"
  [[ -f $deb ]] || die "no package $deb: run scripts/build-deb.sh"
  command -v systemd-nspawn >/dev/null || die "systemd-nspawn is missing: run scripts/vm/setup.sh"
  if $cluster; then
    [[ -z $files ]] || die "--cluster makes the files itself; --files is for another control plane"
    ip netns list | grep -qw "^$peer" || die "no network namespace $peer: is the cluster up?"
  fi
  rootfs
  mkdir -p "$RUN" "$STATE"/{upper,work,root}
  [[ -d /run/systemd/nspawn ]] || touch "$RUN/own-nspawn-dir"
  echo 0 >"$RUN/boots"
  if $cluster; then
    cluster_files "$ns" "$group" "${sa:-$group}" "$ports" "$probe" "$wg" "$duration"
    files=$RUN/files
    resolv=off
  fi
  mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=$STATE/upper,workdir=$STATE/work" "$STATE/root"
  # On the cluster's network the VM's resolver is the cluster's DNS (the agent forwards to it
  # what it does not answer itself).
  if $cluster; then
    rm -f "$STATE/root/etc/resolv.conf"
    echo "nameserver $CLUSTER_DNS" >"$STATE/root/etc/resolv.conf"
  fi
  cp "$deb" "$STATE/root/root/istio-sidecar.deb"
  setsid bash -c "$(declare -f network boot_loop); NAME=$NAME RUN=$RUN STATE=$STATE \
    VM_IP=$VM_IP PEER_IP=$PEER_IP RESOLV=$resolv; ROUTES=(${ROUTES[*]}); boot_loop $peer $group" \
    </dev/null >/dev/null 2>&1 &
  echo $! >"$RUN/loop.pid"
  local t0=$SECONDS
  wait_running
  echo "vm.sh: $NAME running ($((SECONDS - t0)) s); peer $(ip netns list | grep -qw "^$peer" && echo "$peer" || echo "none (standalone)")"
  vm_exec dpkg -i /root/istio-sidecar.deb >"$RUN/dpkg.log" 2>&1 || die "dpkg -i failed: $RUN/dpkg.log"
  if [[ -n $files ]]; then
    onboard "$files" "$ns" "${env[@]}"
    echo "vm.sh: onboarded ($ns/$group); istio.service started"
  fi
}

down() {
  local pid i
  if [[ -e $RUN/loop.pid ]]; then
    touch "$RUN/stopping"
    if pid=$(cat "$RUN/nspawn.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true # nspawn: an orderly poweroff of the guest
      for i in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
    pid=$(cat "$RUN/loop.pid")
    for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  # Whatever is left in the VM's cgroup (it held the loop, nspawn and the guest).
  for c in /sys/fs/cgroup/systemd/$NAME /sys/fs/cgroup/unified/$NAME; do
    [[ -d $c ]] || continue
    find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    for i in $(seq 1 50); do
      [[ -z $(find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null) ]] && break
      sleep 0.1
    done
    find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  ip netns del "$NAME" 2>/dev/null || true
  # What `up --cluster` made in the cluster (the WorkloadEntries go with their WorkloadGroup).
  if [[ -e $RUN/applied-workloadgroup.yaml ]]; then
    kubectl_ delete -f "$RUN/applied-workloadgroup.yaml" --ignore-not-found --wait=false >/dev/null 2>&1 ||
      echo "vm.sh: could not delete the WorkloadGroup ($RUN/applied-workloadgroup.yaml)" >&2
  fi
  if [[ -e $RUN/created-namespace ]]; then
    kubectl_ delete namespace "$(cat "$RUN/created-namespace")" --ignore-not-found --wait=false >/dev/null 2>&1 ||
      echo "vm.sh: could not delete namespace $(cat "$RUN/created-namespace")" >&2
  fi
  if mountpoint -q "$STATE/root"; then umount "$STATE/root" || umount -l "$STATE/root"; fi
  rm -rf "$STATE"
  if [[ -e $RUN/own-nspawn-dir ]]; then rm -rf /run/systemd/nspawn; fi
  rm -rf "$RUN"
  echo "vm.sh: $NAME down"
}

case ${1:-} in
up) shift; up "$@" ;;
exec) shift; (($#)) || die "exec needs a command"; vm_exec "$@" ;;
down) down ;;
*) die "usage: $0 up [--cluster] [--namespace NS] [--group NAME] [--service-account SA] [--ports N=P,…] [--probe PORT/PATH] [--workloadgroup FILE] [--token-duration S] [--env K=V]… [--files DIR] [--deb FILE] [--peer NETNS] | exec CMD… | down" ;;
esac
