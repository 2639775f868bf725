//! One status-port connection, bounded whatever the peer does.
//!
//! The status port is excluded from capture: anything on the pod network reaches it without
//! mTLS or policy. So (Istio's Go server has none of these):
//! - connection caps ([`Limits::remote`]): overall and per peer IP address for remote peers
//!   (127.0.0.6, Envoy's inbound passthrough source, counts as remote); local peers (the
//!   app, Envoy forwarding its 15021 readiness checks) have their own overall cap, so remote
//!   peers cannot lock them out;
//! - when the remote connections are all taken, a new one takes the slot of another remote
//!   connection, which is closed ([`Counts::admit`]), in this order: the one idle the longest
//!   (no request running) among those idle for at least [`NEWCOMER_GRACE`]; else the one running
//!   the oldest metrics scrape (a scrape is cut, its client retries; a probe being answered
//!   never is); else the one idle the longest. So peers holding idle connections, or stalled
//!   scrapes, from many addresses of the pod network cannot keep the kubelet's probes out. The
//!   kubelet's address is not known for sure (the node's `status.hostIP`, or a CNI's tunnel or
//!   host-endpoint address), so no slot is reserved for it; a probe's connection, the newest,
//!   is the last in line, and its request begins within a round trip (the grace keeps it from
//!   being taken for the next newcomer while scrapes run);
//! - a request's headers must arrive within [`Limits::header_timeout`] (from the connection's
//!   start, or from its previous response once a byte of the next request has arrived);
//! - a keep-alive connection idle for [`Limits::idle_timeout`] between requests is closed; a
//!   response the peer does not read counts as idle.
//!
//! The watchdog checks at least every half header timeout, so a connection goes within 1.5×
//! its timeout. The kubelet and Prometheus speak HTTP/1.1; an HTTP/2 client's control frames
//! between requests (WINDOW_UPDATE, PING) count as a request begun, so its connection goes
//! after the header timeout rather than the idle one.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use proto::listen::activity::{Activity, Standing, Timeouts, Watched};
use proto::listen::{Caps, ConnCaps, Permit, Refused};
use tokio_util::sync::CancellationToken;

/// Envoy's inbound passthrough source address: a remote peer when 15020 is captured.
pub const INBOUND_PASSTHROUGH: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6));

/// The status server's bounds (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections from remote peers: 1024 in all, 64 per peer IP (the kubelet probes a
    /// pod's containers from one node address, a few connections at a time; Prometheus
    /// scrapes over one).
    pub remote: Caps,
    /// Connections from the pod itself (loopback but 127.0.0.6): 1024.
    pub local_total: usize,
    /// 10 s: the kubelet and Prometheus send a request at once.
    pub header_timeout: Duration,
    /// 60 s between two requests on a keep-alive connection.
    pub idle_timeout: Duration,
}

impl Limits {
    /// The header and idle timeouts a connection's [`Activity`] is held to.
    pub fn timeouts(&self) -> Timeouts {
        Timeouts {
            header: self.header_timeout,
            idle: self.idle_timeout,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            remote: Caps {
                total: 1024,
                per_peer: 64,
            },
            local_total: 1024,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// True for a peer inside the pod: loopback, except Envoy's inbound passthrough source.
pub fn is_local(ip: IpAddr) -> bool {
    let ip = proto::listen::canonical(ip);
    ip.is_loopback() && ip != INBOUND_PASSTHROUGH
}

/// How long a connection without a request running is spared when a running scrape can make
/// room instead: a new connection's request arrives within a round trip.
pub const NEWCOMER_GRACE: Duration = Duration::from_secs(1);

/// Remote connections told to go whose slots are already given to newcomers, at most: how far
/// past [`Limits::remote`]'s total the open connections may be while the evicted ones close.
pub const MAX_EVICTING: usize = 64;

/// The counts every listener of one status server shares.
#[derive(Debug, Clone)]
pub struct Counts {
    remote: ConnCaps,
    local: ConnCaps,
    remote_conns: Arc<Mutex<RemoteConns>>,
}

/// The open remote connections, for eviction.
#[derive(Debug, Default)]
struct RemoteConns {
    next_id: u64,
    live: HashMap<u64, Remote>,
    /// Evicted, not closed yet.
    evicting: usize,
}

#[derive(Debug)]
struct Remote {
    activity: Activity,
    evict: CancellationToken,
}

/// An admitted connection's place: its slot, and for a remote one, the signal to go.
#[derive(Debug)]
pub struct Admitted {
    _permit: Permit,
    remote: Option<RemoteSlot>,
}

impl Admitted {
    /// Completes when the connection is to close to make room for a newer one (never for a
    /// local connection).
    pub async fn evicted(&self) {
        match &self.remote {
            Some(slot) => slot.evict.cancelled().await,
            None => std::future::pending().await,
        }
    }
}

#[derive(Debug)]
struct RemoteSlot {
    id: u64,
    evict: CancellationToken,
    conns: Arc<Mutex<RemoteConns>>,
}

impl Drop for RemoteSlot {
    fn drop(&mut self) {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns.live.remove(&self.id);
        if self.evict.is_cancelled() {
            conns.evicting = conns.evicting.saturating_sub(1);
        }
    }
}

impl Counts {
    pub fn new(limits: &Limits) -> Self {
        Counts {
            remote: ConnCaps::new(limits.remote),
            local: ConnCaps::new(Caps {
                total: limits.local_total,
                per_peer: limits.local_total,
            }),
            remote_conns: Arc::default(),
        }
    }

    /// A slot for a connection from `ip` whose requests `activity` records, or why there is
    /// none. When the remote connections are all taken, one is told to go
    /// ([`Admitted::evicted`]; which one: the module docs) and this one takes its slot; with
    /// every one running a request that is not a scrape (or [`MAX_EVICTING`] still closing)
    /// the connection is refused.
    pub fn admit(&self, ip: IpAddr, activity: &Activity) -> Result<Admitted, Refused> {
        let ip = proto::listen::canonical(ip);
        if is_local(ip) {
            return Ok(Admitted {
                _permit: self.local.admit(None)?,
                remote: None,
            });
        }
        let permit = match self.remote.admit(Some(ip)) {
            Err(Refused::Total(n)) => {
                if !self.evict_one() {
                    return Err(Refused::Total(n));
                }
                self.remote.admit_replacing(Some(ip))?
            }
            other => other?,
        };
        let mut conns = self.remote_conns.lock().unwrap_or_else(|p| p.into_inner());
        let id = conns.next_id;
        conns.next_id += 1;
        let evict = CancellationToken::new();
        conns.live.insert(
            id,
            Remote {
                activity: activity.clone(),
                evict: evict.clone(),
            },
        );
        Ok(Admitted {
            _permit: permit,
            remote: Some(RemoteSlot {
                id,
                evict,
                conns: self.remote_conns.clone(),
            }),
        })
    }

    /// Tells one remote connection to go (which: the module docs); false when none can.
    fn evict_one(&self) -> bool {
        let mut conns = self.remote_conns.lock().unwrap_or_else(|p| p.into_inner());
        if conns.evicting >= MAX_EVICTING {
            return false;
        }
        let now = tokio::time::Instant::now();
        // Lowest rank first, then the earliest instant; of two alike, the one accepted first.
        let rank = |standing: Standing| match standing {
            Standing::Fresh(since) | Standing::Idle(since) if since + NEWCOMER_GRACE <= now => {
                Some((0, since))
            }
            Standing::Preemptible(since) => Some((1, since)),
            Standing::Fresh(since) | Standing::Idle(since) => Some((2, since)),
            Standing::Busy => None,
        };
        let oldest = conns
            .live
            .iter()
            .filter(|(_, r)| !r.evict.is_cancelled())
            .filter_map(|(id, r)| Some(((rank(r.activity.standing())?, *id), r)))
            .min_by_key(|(key, _)| *key)
            .map(|(_, r)| r.evict.clone());
        match oldest {
            Some(evict) => {
                evict.cancel();
                conns.evicting += 1;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_port_timeouts_are_its_limits() {
        let t = Limits::default().timeouts();
        assert_eq!(
            (t.header, t.idle),
            (Duration::from_secs(10), Duration::from_secs(60))
        );
    }

    #[test]
    fn passthrough_source_counts_as_remote() {
        assert!(is_local("127.0.0.1".parse().unwrap()));
        assert!(is_local("::1".parse().unwrap()));
        assert!(is_local("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!is_local(INBOUND_PASSTHROUGH));
        assert!(!is_local("::ffff:127.0.0.6".parse().unwrap()));
        assert!(!is_local("10.1.2.3".parse().unwrap()));
        let counts = Counts::new(&Limits {
            remote: Caps {
                total: 10,
                per_peer: 1,
            },
            local_total: 2,
            ..Limits::default()
        });
        let a = Activity::new();
        let _p = counts.admit(INBOUND_PASSTHROUGH, &a).unwrap();
        assert!(counts.admit(INBOUND_PASSTHROUGH, &a).is_err(), "per peer");
        let _l1 = counts.admit("127.0.0.1".parse().unwrap(), &a).unwrap();
        let _l2 = counts.admit("127.0.0.1".parse().unwrap(), &a).unwrap();
        assert!(
            counts.admit("::1".parse().unwrap(), &a).is_err(),
            "local total"
        );
        let _r = counts.admit("10.0.0.1".parse().unwrap(), &a).unwrap();
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    fn is_evicted(a: &Admitted) -> bool {
        a.remote.as_ref().is_some_and(|r| r.evict.is_cancelled())
    }

    #[tokio::test(start_paused = true)]
    async fn when_full_the_longest_idle_remote_connection_makes_room() {
        let counts = Counts::new(&Limits {
            remote: Caps {
                total: 3,
                per_peer: 3,
            },
            ..Limits::default()
        });
        let tick = || tokio::time::sleep(Duration::from_secs(1));
        let acts: Vec<Activity> = (0..6).map(|_| Activity::new()).collect();
        let first = counts.admit(ip(1), &acts[0]).unwrap();
        tick().await;
        let second = counts.admit(ip(2), &acts[1]).unwrap();
        tick().await;
        let third = counts.admit(ip(3), &acts[2]).unwrap();
        // The oldest is answering a request: the next oldest idle one goes.
        let running = acts[0].request();
        tick().await;
        let fourth = counts.admit(ip(4), &acts[3]).unwrap();
        assert!(!is_evicted(&first) && is_evicted(&second) && !is_evicted(&third));
        // Its request ended just now: it is the newest idle one; the third goes next.
        drop(running);
        tick().await;
        let fifth = counts.admit(ip(5), &acts[4]).unwrap();
        assert!(is_evicted(&third) && !is_evicted(&first) && !is_evicted(&fourth));
        assert_eq!(counts.remote.open(), 5, "the evicted two still close");
        drop((second, third));
        assert_eq!(counts.remote.open(), 3);
        // Every connection busy: refused.
        let busy: Vec<_> = [&acts[0], &acts[3], &acts[4]]
            .into_iter()
            .map(Activity::request)
            .collect();
        assert!(matches!(
            counts.admit(ip(6), &acts[5]),
            Err(Refused::Total(3))
        ));
        drop(busy);
        // The cap per peer still holds when evicting.
        let many = Counts::new(&Limits {
            remote: Caps {
                total: 2,
                per_peer: 1,
            },
            ..Limits::default()
        });
        let _one = many.admit(ip(1), &acts[0]).unwrap();
        let _two = many.admit(ip(2), &acts[1]).unwrap();
        assert!(matches!(many.admit(ip(1), &acts[2]), Err(Refused::Peer(1))));
        drop((first, fourth, fifth));
    }

    #[tokio::test(start_paused = true)]
    async fn running_scrapes_make_room_before_new_connections() {
        let counts = Counts::new(&Limits {
            remote: Caps {
                total: 3,
                per_peer: 3,
            },
            ..Limits::default()
        });
        // Each connection's activity begins at its accept.
        let mut acts: Vec<Activity> = vec![Activity::new()];
        let scrape = |a: &Activity| {
            let mut g = a.request();
            g.preemptible();
            g
        };
        let first = counts.admit(ip(1), &acts[0]).unwrap();
        let _s1 = scrape(&acts[0]);
        tokio::time::sleep(Duration::from_secs(1)).await;
        acts.extend([Activity::new(), Activity::new(), Activity::new()]);
        let second = counts.admit(ip(2), &acts[1]).unwrap();
        let _s2 = scrape(&acts[1]);
        let third = counts.admit(ip(3), &acts[2]).unwrap();
        let _probe = acts[2].request();
        // Full: a probe's connection takes the oldest scrape's slot, never the probe's.
        let fourth = counts.admit(ip(4), &acts[3]).unwrap();
        assert!(is_evicted(&first) && !is_evicted(&second) && !is_evicted(&third));
        drop(first);
        acts.push(Activity::new());
        // The next newcomer takes the other scrape's slot, not the new connection's, whose
        // request has not come yet.
        let fifth = counts.admit(ip(5), &acts[4]).unwrap();
        assert!(is_evicted(&second) && !is_evicted(&fourth));
        drop(second);
        // Past the grace a silent connection goes first.
        tokio::time::sleep(NEWCOMER_GRACE).await;
        let _s5 = scrape(&acts[4]);
        acts.push(Activity::new());
        let _sixth = counts.admit(ip(6), &acts[5]).unwrap();
        assert!(is_evicted(&fourth) && !is_evicted(&fifth) && !is_evicted(&third));
    }

    #[tokio::test(start_paused = true)]
    async fn evictions_still_closing_are_bounded() {
        let counts = Counts::new(&Limits {
            remote: Caps {
                total: 1,
                per_peer: 1,
            },
            ..Limits::default()
        });
        let act = Activity::new();
        let mut held = vec![counts.admit(ip(0), &act).unwrap()];
        for i in 1..=u8::try_from(MAX_EVICTING).unwrap() {
            // Each evicts the previous, which never closes here.
            held.push(counts.admit(ip(i), &act).unwrap());
        }
        assert!(held[..MAX_EVICTING].iter().all(is_evicted));
        assert!(matches!(
            counts.admit(ip(200), &act),
            Err(Refused::Total(_))
        ));
        assert_eq!(counts.remote.open(), 1 + MAX_EVICTING);
        held.remove(0);
        assert!(
            counts.admit(ip(200), &act).is_ok(),
            "one closed: room again"
        );
    }
}
