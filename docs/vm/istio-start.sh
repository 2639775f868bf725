#!/bin/bash
# Starts the Istio sidecar on a VM (installed as /usr/local/bin/istio-start.sh; run by
# istio.service as root). It reads the settings Istio's istio-start.sh reads, with its defaults:
#   sidecar.env then cluster.env (ISTIO_SIDECAR_CONFIG, ISTIO_CLUSTER_CONFIG; shell syntax,
#     every variable exported), ISTIO_BIN_BASE, ISTIO_NAMESPACE, ISTIO_SERVICE,
#     ISTIO_SYSTEM_NAMESPACE, ISTIO_CP_AUTH, ISTIO_SVC_IP, POD_NAME, ISTIO_CUSTOM_IP_TABLES,
#     ISTIO_INBOUND_INTERCEPTION_MODE (TPROXY runs the agent as root), EXEC_USER, PILOT_ADDRESS,
#     ISTIO_PILOT_PORT, CA_ADDR, PROV_CERT, OUTPUT_CERTS, PROXY_CONFIG, ISTIO_AGENT_FLAGS,
#     ISTIO_LOG_DIR; every other variable of the files reaches pilot-agent and istio-iptables.
# Arguments, as Istio's: none (capture, then the agent), `clean` (capture off; istio.service's
# ExecStopPost=), `init` or `-p …` (capture only, arguments passed to istio-iptables), `run`
# (the agent without touching the capture).
# A file the shell cannot read is an error naming the file, the line and the variable.
set -euo pipefail

die() {
  echo "istio-start.sh: $*" >&2
  exit 1
}

# bad MESSAGE: prints it and fails (the caller decides whether that stops the start).
bad() {
  echo "istio-start.sh: $*" >&2
  return 1
}

# check_env FILE: what bash accepts (Istio sources the file) is accepted; otherwise the first
# line that does not parse on its own, or an assignment to a name that is not a variable, is
# named with its key.
check_env() {
  local file=$1 err n=0 line key
  err=$(bash -n "$file" 2>&1) || {
    while IFS= read -r line || [[ -n $line ]]; do
      n=$((n + 1))
      if ! bash -n <<<"$line" 2>/dev/null; then
        key=${line%%=*}
        key=${key#export }
        bad "$file line $n (${key// /}): not a shell assignment KEY=value: $line"
        return
      fi
    done <"$file"
    bad "$file: ${err//$'\n'/ }"
    return
  }
  while IFS= read -r line || [[ -n $line ]]; do
    n=$((n + 1))
    [[ $line =~ ^[[:space:]]*(export[[:space:]]+)?([^[:space:]=\'\"\$\`\#]+)= ]] || continue
    key=${BASH_REMATCH[2]}
    [[ $key =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] ||
      { bad "$file line $n ($key): not a variable name (letters, digits and _)"; return; }
  done <"$file"
}

load_env() {
  local file=$1
  [[ -r $file ]] || return 0
  if ! check_env "$file"; then
    # Taking the capture off must not depend on the files: it is what makes a broken start safe.
    [[ $mode == clean ]] || exit 1
    return 0
  fi
  set -a
  # shellcheck disable=SC1090
  . "$file"
  set +a
}

mode=${1-}
load_env "${ISTIO_SIDECAR_CONFIG:-./var/lib/istio/envoy/sidecar.env}"
load_env "${ISTIO_CLUSTER_CONFIG:-./var/lib/istio/envoy/cluster.env}"

ISTIO_BIN_BASE=${ISTIO_BIN_BASE:-/usr/local/bin}
NS=${ISTIO_NAMESPACE:-default}
SVC=${ISTIO_SERVICE:-rawvm}
ISTIO_SYSTEM_NAMESPACE=${ISTIO_SYSTEM_NAMESPACE:-istio-system}
CONTROL_PLANE_AUTH_POLICY=${ISTIO_CP_AUTH:-MUTUAL_TLS}
ISTIO_CUSTOM_IP_TABLES=${ISTIO_CUSTOM_IP_TABLES:-false}

capture() {
  "$ISTIO_BIN_BASE/pilot-agent" istio-iptables "$@"
}

case $mode in
clean)
  [[ $ISTIO_CUSTOM_IP_TABLES == true ]] || capture --cleanup-only
  exit 0
  ;;
init | -p)
  # `init [flags…]` and `-p PORT …`: the capture alone, with istio-iptables flags.
  [[ $mode == init ]] && shift
  if [[ $ISTIO_CUSTOM_IP_TABLES != true ]]; then
    capture "$@" --cleanup-only
    capture "$@"
  fi
  exit 0
  ;;
run) ;;
"")
  if [[ $ISTIO_CUSTOM_IP_TABLES != true ]]; then
    capture --cleanup-only
    capture
  fi
  ;;
*) die "unknown argument $mode (expected clean, init, -p, run or none)" ;;
esac

if [[ -z ${ISTIO_SVC_IP:-} ]]; then
  ISTIO_SVC_IP=$(hostname --all-ip-addresses | cut -d ' ' -f 1)
fi
POD_NAME=${POD_NAME:-$(hostname -s)}

EXEC_USER=${EXEC_USER:-istio-proxy}
# TPROXY keeps the original destination with a transparent socket: CAP_NET_ADMIN, so root. The
# package makes pilot-agent and envoy setgid istio-proxy, which istio-iptables exempts.
[[ ${ISTIO_INBOUND_INTERCEPTION_MODE:-} == TPROXY ]] && EXEC_USER=root

# CA_ADDR > PILOT_ADDRESS > ISTIO_PILOT_PORT > istiod.<system namespace>.svc:15012
CUSTOM_PILOT_ADDRESS=${PILOT_ADDRESS:-}
if [[ -z $CUSTOM_PILOT_ADDRESS && -n ${ISTIO_PILOT_PORT:-} ]]; then
  CUSTOM_PILOT_ADDRESS=istiod.$ISTIO_SYSTEM_NAMESPACE.svc:$ISTIO_PILOT_PORT
fi
export CA_ADDR=${CA_ADDR:-${CUSTOM_PILOT_ADDRESS:-istiod.$ISTIO_SYSTEM_NAMESPACE.svc:15012}}
export PROV_CERT=${PROV_CERT-./etc/certs}
export OUTPUT_CERTS=${OUTPUT_CERTS-./etc/certs}

# PROXY_CONFIG > PILOT_ADDRESS > ISTIO_PILOT_PORT. Istio's script replaces its default with the
# discovery address alone when one is given; here the address is added to the default.
PROXY_CONFIG=${PROXY_CONFIG:-"serviceCluster: $SVC
controlPlaneAuthPolicy: $CONTROL_PLANE_AUTH_POLICY
"}
if [[ -n $CUSTOM_PILOT_ADDRESS ]]; then
  PROXY_CONFIG="$PROXY_CONFIG
discoveryAddress: $CUSTOM_PILOT_ADDRESS
"
fi
export PROXY_CONFIG

# ISTIO_AGENT_FLAGS, split on spaces: `router` for a VM gateway, `--proxyLogLevel debug`, ...
read -r -a agent_flags <<<"${ISTIO_AGENT_FLAGS:-}"

export INSTANCE_IP=$ISTIO_SVC_IP POD_NAME POD_NAMESPACE=$NS
agent=("$ISTIO_BIN_BASE/pilot-agent" proxy "${agent_flags[@]}")
if [[ -n ${ISTIO_LOG_DIR:-} ]]; then
  # As Istio's script: the logs in files (without ISTIO_LOG_DIR they go to the journal).
  exec >>"$ISTIO_LOG_DIR/istio.log" 2>>"$ISTIO_LOG_DIR/istio.err.log"
elif [[ -S /dev/stdout ]]; then
  # The journal's stream is a socket, which open(2) refuses (ENXIO): Envoy's access log at
  # /dev/stdout (`accessLogFile`, the `envoy` Telemetry provider) would fail and Envoy reject
  # every listener. A pipe to the journal can be opened, by its owner: the agent's user makes
  # it, then becomes the agent (still the service's main process).
  agent=(bash -c 'exec > >(exec cat); exec "$@"' istio-start.sh "${agent[@]}")
fi
if [[ $EXEC_USER == "$(id -un)" ]]; then
  exec "${agent[@]}"
fi
# The service's main process stays the agent (KillMode=mixed signals it alone). EXEC_USER is a
# user name, or a uid (then its group has the same number and there are no other groups).
if id -u "$EXEC_USER" >/dev/null 2>&1; then
  exec setpriv --reuid="$EXEC_USER" --regid="$(id -g "$EXEC_USER")" --init-groups -- "${agent[@]}"
fi
[[ $EXEC_USER =~ ^[0-9]+$ ]] || die "EXEC_USER=$EXEC_USER: no such user"
exec setpriv --reuid="$EXEC_USER" --regid="$EXEC_USER" --clear-groups -- "${agent[@]}"
