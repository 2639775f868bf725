#!/bin/bash
# The entrypoint of the app_sidecar images (Istio's "VM" echo workloads): the sidecar as a VM
# runs it (the package's istio-start.sh: capture, then pilot-agent and Envoy) in the background,
# and Istio's echo server in front with the arguments of ECHO_ARGS (split on spaces).
# A package left at /tmp/istio-sidecar.deb is installed first.
set -euo pipefail
if [[ -f /tmp/istio-sidecar.deb ]]; then
  dpkg -i /tmp/istio-sidecar.deb
  rm /tmp/istio-sidecar.deb
fi
read -r -a echo_args <<<"${ECHO_ARGS:-}"
/usr/local/bin/istio-start.sh &
exec /usr/local/bin/server "${echo_args[@]}"
