//! The VM sidecar as Istio ships it, ours: the systemd unit and istio-start.sh (`docs/vm/`),
//! the package `scripts/build-deb.sh` builds, and a Debian 12 VM with systemd as PID 1
//! (`scripts/vm.sh`, systemd-nspawn) onboarded with that package against istiod-lite.
//!
//! `cargo nextest run -p tests --test vm` (root; the `systemd::` test needs
//! `scripts/vm/setup.sh` and boots the one VM a machine has, `mesh-vm`).

mod package;
mod start_script;
mod systemd;
mod unit;
