#!/usr/bin/env bash
# What scripts/vm.sh needs on the host: debootstrap (the guest's Debian 12 root), systemd-nspawn
# (systemd-container: boots it with systemd as PID 1), dpkg-deb and lintian (the package).
# Debian's systemd-container pulls the host's systemd packages at their exact version; on a host
# whose init is not systemd nothing running changes. Idempotent; needs root.
set -euo pipefail
PACKAGES=(debootstrap systemd-container dpkg-dev lintian iproute2)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  [[ $(id -u) == 0 ]] || { echo "vm/setup: run as root to install: ${missing[*]}" >&2; exit 1; }
  echo "vm/setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "vm/setup: $(systemd-nspawn --version | head -1), debootstrap $(dpkg-query -W -f='${Version}' debootstrap)"
