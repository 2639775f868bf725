#!/usr/bin/env bash
# Builds the shipped binaries, pilot-agent and istio-iptables, as the image ships them, into
# target/dist/ (the Dockerfile runs this; the benches read target/dist/).
#   usage: scripts/build-dist.sh [extra cargo flags, e.g. --locked]
# Both are linked statically and not position-independent (the [profile.dist] build with
# `+crt-static` and `relocation-model=static`): no dynamic loader, no relocations applied at
# start, and only the parts of glibc they call. For pilot-agent that is ~1.1 MiB less start
# peak RSS than the dynamic PIE build (agent/benches/start-peak.py: VmHWM 9.2–9.6 MiB against
# 10.4–10.9): libc.so's pages the agent's start maps (~1.5 MiB), the 0.4 MB of relocations the
# loader reads and the 0.3 MB of relocated read-only data it copies, less the static glibc code. Names still resolve: glibc's static `getaddrinfo` has
# `files` and `dns` built in (what the image's nsswitch.conf names, and what Istio's Go agent
# does in Go); only another NSS module would need a matching glibc's shared libraries.
# RUSTFLAGS apply to the target only (hence --target): build scripts and proc macros stay
# dynamic.
# pilot-agent is also linked with agent/link/start-order.ld: the functions its start runs first
# in the text segment, one contiguous run of pages (VmHWM 9.2–9.6 -> 7.5–7.7 MiB; regenerate it
# with agent/benches/start-order.sh). START_ORDER_MAP=<file> writes the link map there.
# pilot-agent keeps its symbol table (`-C strip=debuginfo` over the profile's `strip = true`): the
# names its CPU profiles carry (/debug/pprof/profile, agent/src/cpu_profile/symbols.rs). The table
# is not loaded (no RSS); it is ~2.4 MB of the file (docs/differences.md#pprof-go-runtime).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
triple="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static"
cargo build --profile dist "$@" -p iptables-init --bin istio-iptables --target "$triple"
# Linked from a copy named by its hash: cargo relinks when the arguments change, not the file.
order="target/start-order-$(sha256sum agent/link/start-order.ld | cut -c1-16).ld"
[[ -f $order ]] || cp agent/link/start-order.ld "$order"
link=(-C "link-arg=-Wl,-T,$repo/$order" -C strip=debuginfo)
[[ -n ${START_ORDER_MAP:-} ]] && link+=(-C "link-arg=-Wl,-Map=$START_ORDER_MAP")
cargo rustc --profile dist "$@" -p agent --bin pilot-agent --target "$triple" -- "${link[@]}"
mkdir -p target/dist
# New files, not writes into the old ones (a target dir hard-linked from another checkout).
rm -f target/dist/pilot-agent target/dist/istio-iptables
cp "target/$triple/dist/pilot-agent" "target/$triple/dist/istio-iptables" target/dist/
