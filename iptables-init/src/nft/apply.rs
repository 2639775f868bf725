//! Applying the nftables ruleset from this process: the transaction script (the one
//! `--dry-run` prints) sent to the kernel as one netlink batch (see [`super::program`]), so
//! all of it takes effect or none, with no `nft` binary; what the iptables backend left is
//! removed after the new rules are in (so a switch of backends never leaves a pod
//! unredirected); TPROXY's policy routes as with iptables.
//!
//! No capability probe runs before the apply: the transaction is atomic, so a missing or
//! unusable nf_tables is found by the apply itself, with nothing changed, and the kernel's
//! answer names the change it refused.

use super::NftRuleBuilder;
use super::compile::Names;
use super::{kernel, program};
use crate::apply::ExecEnv;
use crate::config::{Config, HostInputs};

/// Why the nftables ruleset could not be applied or removed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}; nothing was applied")]
    Script(#[from] program::Error),
    #[error(transparent)]
    Kernel(#[from] kernel::Error),
    #[error("removing the iptables rules of an earlier run: {0}")]
    Iptables(crate::apply::Error),
    #[error("the nftables rules are in; setting up the policy routes failed: {0}")]
    Routes(crate::apply::Error),
}

impl Names for HostInputs {
    fn uid(&self, name: &str) -> Option<u32> {
        self.lookup_uid(name)
    }
    fn gid(&self, name: &str) -> Option<u32> {
        self.lookup_gid(name)
    }
}

/// Sequence number of each batch's begin message (one socket per batch, so any will do).
const FIRST_SEQ: u32 = 1;

/// Sends `script` to the kernel as one transaction: all of it takes effect, or none.
pub fn apply(script: &str, names: &dyn Names) -> Result<(), Error> {
    tracing::debug!(script, "applying the nftables transaction over netlink");
    let (bytes, changes) = program::batch(script, names, FIRST_SEQ)?.finish();
    kernel::commit(&bytes, FIRST_SEQ, &changes)?;
    Ok(())
}

/// Removes Istio's nftables tables (no-op for missing ones).
pub fn remove_tables() -> Result<(), Error> {
    apply(&super::cleanup_script(), &HostInputs::system())
}

/// Whether the iptables backend may have left rules: legacy x_tables tables exist, or an
/// nf_tables chain (of `chains`, every chain as dumped) of the ip/ip6 families carries an
/// iptables `ISTIO_*` name (iptables-nft).
fn iptables_leftovers(chains: Option<&[(u8, String, String)]>) -> bool {
    use crate::netlink::{NFPROTO_IPV4, NFPROTO_IPV6};
    let legacy = ["/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"]
        .iter()
        .any(|p| std::fs::read_to_string(p).is_ok_and(|s| !s.trim().is_empty()));
    legacy
        || chains.is_some_and(|chains| {
            chains.iter().any(|(family, _, chain)| {
                (*family == NFPROTO_IPV4 || *family == NFPROTO_IPV6) && chain.starts_with("ISTIO_")
            })
        })
}

/// Whether TPROXY's policy rule is in place (over netlink; `ip rule` when that fails).
fn tproxy_rule_present(cfg: &Config) -> bool {
    crate::netlink::fwmark_rule_present(cfg.inbound_tproxy_mark, cfg.inbound_tproxy_route_table)
        .unwrap_or_else(|| crate::apply::tproxy_rule_present(cfg))
}

/// Applies the nftables ruleset for `cfg` (or with `--cleanup-only` removes it), then removes
/// what the iptables backend left and sets up (or removes) TPROXY's policy routes.
pub fn run(
    cfg: &Config,
    rules: &NftRuleBuilder,
    env: &ExecEnv,
    names: &dyn Names,
) -> Result<(), Error> {
    // Every chain, read once: Istio's tables' shape and what the other backend left.
    let chains = crate::netlink::nft_chains();
    let mut script = if cfg.cleanup_only {
        super::cleanup_script()
    } else {
        let existing = chains.as_deref().and_then(|c| {
            Some(super::Existing::from_dumps(
                crate::netlink::nft_tables()?,
                c,
            ))
        });
        super::apply_script(rules, existing.as_ref())
    };
    // What the other backend or an earlier TPROXY run left, read before the change.
    let leftovers = iptables_leftovers(chains.as_deref());
    let stale_routes =
        (cfg.cleanup_only || !crate::apply::tproxy_routes_wanted(cfg)) && tproxy_rule_present(cfg);
    let mut applied = apply(&script, names);
    if applied.is_err() && !cfg.cleanup_only {
        // The state changed under us (a chain to remove went away): once more, freshly read.
        let again = super::apply_script(rules, super::Existing::read().as_ref());
        if again != script {
            tracing::info!("nftables state changed during the run; retrying with a fresh view");
            script = again;
            applied = apply(&script, names);
        }
    }
    applied?;
    tracing::info!(
        tables = script
            .lines()
            .filter(|l| l.starts_with("add table"))
            .count(),
        cleanup = cfg.cleanup_only,
        "nftables transaction applied"
    );
    if leftovers {
        let iptables_rules = crate::capture::build(cfg);
        let removed =
            crate::apply::remove_istio_rules(cfg, &iptables_rules, env).map_err(Error::Iptables)?;
        tracing::info!(?removed, "removed iptables rules of an earlier run");
    }
    if stale_routes {
        crate::apply::cleanup_routes(cfg);
    }
    if !cfg.cleanup_only {
        crate::apply::configure_routes(cfg).map_err(Error::Routes)?;
    }
    Ok(())
}
