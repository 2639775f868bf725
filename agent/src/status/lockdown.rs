//! `PROXY_LIFECYCLE_LOCKDOWN`: the status server's mutating endpoints (`/quitquitquit`,
//! `/drain`) answer only the proxy's own processes. A loopback peer is known by the uid that
//! owns its socket ([`crate::sock_diag`]); root and the proxy's uids pass, any other process in
//! the pod (the app, or whatever an SSRF in it reaches) gets 403.

use std::net::SocketAddr;

/// The uids allowed to stop or drain the proxy (root always is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lockdown {
    /// The agent's effective uid, and Envoy's when it runs as another.
    pub proxy_uids: Vec<u32>,
}

/// Why a peer was refused (the 403's body says it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The peer's socket belongs to a uid outside the proxy.
    #[error(
        "forbidden: PROXY_LIFECYCLE_LOCKDOWN is on and uid {0} is not the proxy's; \
         only the proxy's own processes or root may call this endpoint"
    )]
    Uid(u32),
    /// The peer's uid could not be found (the lookup's error, as text: the refusal is compared
    /// and cloned).
    #[error("forbidden: PROXY_LIFECYCLE_LOCKDOWN is on and the caller's uid is unknown ({0})")]
    Unknown(String),
}

impl Lockdown {
    /// The decision for a peer whose uid lookup gave `uid`: unknown is refused.
    pub fn decide<E: std::fmt::Display>(&self, uid: Result<u32, E>) -> Result<(), Refusal> {
        match uid {
            Ok(0) => Ok(()),
            Ok(u) if self.proxy_uids.contains(&u) => Ok(()),
            Ok(u) => Err(Refusal::Uid(u)),
            Err(e) => Err(Refusal::Unknown(e.to_string())),
        }
    }

    /// Looks the peer of a connection to `local` up and decides.
    pub fn check(&self, peer: SocketAddr, local: SocketAddr) -> Result<(), Refusal> {
        self.decide(crate::sock_diag::peer_uid(peer, local))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_table() {
        let agent_and_envoy = Lockdown {
            proxy_uids: vec![0, 1337],
        };
        let agent_only = Lockdown {
            proxy_uids: vec![1337],
        };
        let e = |s: &'static str| Err::<u32, &str>(s);
        type Case<'a> = (&'a Lockdown, Result<u32, &'a str>, Result<(), Refusal>);
        let cases: Vec<Case> = vec![
            (&agent_only, Ok(1337), Ok(())),
            (&agent_only, Ok(0), Ok(())),
            (&agent_only, Ok(1000), Err(Refusal::Uid(1000))),
            (&agent_only, Ok(65534), Err(Refusal::Uid(65534))),
            (&agent_and_envoy, Ok(1337), Ok(())),
            (&agent_and_envoy, Ok(1000), Err(Refusal::Uid(1000))),
            (
                &agent_only,
                e("no socket"),
                Err(Refusal::Unknown("no socket".into())),
            ),
        ];
        for (lockdown, uid, want) in cases {
            assert_eq!(lockdown.decide(uid), want, "{lockdown:?} {uid:?}");
        }
    }

    #[test]
    fn refusals_say_why() {
        let body = Refusal::Uid(1000).to_string();
        assert!(
            body.contains("PROXY_LIFECYCLE_LOCKDOWN") && body.contains("1000"),
            "{body}"
        );
        let body = Refusal::Unknown("gone".into()).to_string();
        assert!(body.contains("unknown (gone)"), "{body}");
    }

    #[test]
    fn our_own_connection_passes_and_others_uid_would_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, peer) = listener.accept().unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let local = server.local_addr().unwrap();
        let ours = Lockdown {
            proxy_uids: vec![me],
        };
        assert_eq!(ours.check(peer, local), Ok(()));
        if me != 0 {
            // Not root: the same connection fails a lockdown that does not list our uid.
            let other = Lockdown {
                proxy_uids: vec![me + 1],
            };
            assert_eq!(other.check(peer, local), Err(Refusal::Uid(me)));
        }
    }
}
