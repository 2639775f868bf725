//! An HTTP/1 server connection held to a header timeout and an idle timeout, whatever the peer
//! does (the status port's and istiod-lite's monitoring port's):
//! - a request's headers must arrive within [`Timeouts::header`] (from the connection's start, or
//!   from its previous response once a byte of the next request has arrived): a slowloris peer
//!   trickling its headers is closed;
//! - a keep-alive connection idle for [`Timeouts::idle`] between requests is closed; a response
//!   the peer does not read counts as idle;
//! - a request being handled is never cut.
//!
//! Three parts share one [`Activity`]: [`Watched`] wraps the connection's I/O and records reads,
//! the service holds a [`RequestGuard`] ([`Activity::request`]) while it handles a request, and
//! the connection's task races it against [`Activity::expired`]. The check runs at least every
//! half header timeout, so a connection goes within 1.5x its timeout.
//!
//! A server that must make room for newcomers asks [`Activity::standing`] what a connection is
//! doing: fresh (no request yet), idle between requests, running requests that may be cut
//! ([`RequestGuard::preemptible`]: a metrics scrape) or running one that may not (a probe).

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// The bounds of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// From the connection's start, or its last response once the next request began, to the
    /// end of a request's headers.
    pub header: Duration,
    /// Between two requests of a keep-alive connection.
    pub idle: Duration,
}

#[derive(Debug)]
struct State {
    /// The connection's start or its last response.
    since: Instant,
    /// A byte arrived since `since`.
    read: bool,
    /// No request was complete yet.
    first: bool,
    /// Requests being handled.
    in_flight: usize,
    /// Of those, the ones marked [`RequestGuard::preemptible`].
    preemptible: usize,
    /// When the running requests began (the first of them, while one runs).
    busy_since: Instant,
}

/// What a connection is doing, for a server choosing which one makes room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Accepted, no request begun yet; since its start.
    Fresh(Instant),
    /// Between two requests; since its last response.
    Idle(Instant),
    /// Running requests that may all be cut ([`RequestGuard::preemptible`]); since the first
    /// began.
    Preemptible(Instant),
    /// Running a request that may not be cut.
    Busy,
}

/// What a connection did last, shared by its I/O, its requests and its watchdog.
#[derive(Debug, Clone)]
pub struct Activity(Arc<Mutex<State>>);

impl Activity {
    pub fn new() -> Self {
        Activity(Arc::new(Mutex::new(State {
            since: Instant::now(),
            read: false,
            first: true,
            in_flight: 0,
            preemptible: 0,
            busy_since: Instant::now(),
        })))
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A request's headers are in; the returned guard marks its end when dropped.
    pub fn request(&self) -> RequestGuard {
        self.with(|s| {
            if s.in_flight == 0 {
                s.busy_since = Instant::now();
            }
            s.in_flight += 1;
            s.first = false;
        });
        RequestGuard {
            activity: self.clone(),
            preemptible: false,
        }
    }

    /// What the connection is doing now.
    pub fn standing(&self) -> Standing {
        self.with(|s| {
            if s.in_flight == 0 {
                if s.first {
                    Standing::Fresh(s.since)
                } else {
                    Standing::Idle(s.since)
                }
            } else if s.preemptible == s.in_flight {
                Standing::Preemptible(s.busy_since)
            } else {
                Standing::Busy
            }
        })
    }

    /// Since when the connection has had no request running (`None`: one is running).
    pub fn idle_since(&self) -> Option<Instant> {
        self.with(|s| (s.in_flight == 0).then_some(s.since))
    }

    /// When the connection is to be closed if nothing changes (`None`: a request is running).
    fn deadline(&self, limits: &Timeouts) -> Option<Instant> {
        self.with(|s| {
            if s.in_flight > 0 {
                None
            } else if s.read || s.first {
                Some(s.since + limits.header)
            } else {
                Some(s.since + limits.idle)
            }
        })
    }

    /// Returns once the connection is past its deadline.
    pub async fn expired(&self, limits: &Timeouts) {
        let step = (limits.header / 2).max(Duration::from_millis(1));
        loop {
            let now = Instant::now();
            match self.deadline(limits) {
                Some(d) if d <= now => return,
                Some(d) => tokio::time::sleep_until(d.min(now + step)).await,
                None => tokio::time::sleep(step).await,
            }
        }
    }
}

impl Default for Activity {
    fn default() -> Self {
        Activity::new()
    }
}

/// Ends a request (see [`Activity::request`]).
pub struct RequestGuard {
    activity: Activity,
    preemptible: bool,
}

impl RequestGuard {
    /// Marks the request as one the server may cut to make room for a newcomer (a metrics
    /// scrape, which its client retries, unlike a probe), until it ends.
    pub fn preemptible(&mut self) {
        if !self.preemptible {
            self.preemptible = true;
            self.activity.with(|s| s.preemptible += 1);
        }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let preemptible = self.preemptible;
        self.activity.with(|s| {
            s.in_flight = s.in_flight.saturating_sub(1);
            if preemptible {
                s.preemptible = s.preemptible.saturating_sub(1);
            }
            s.since = Instant::now();
            s.read = false;
        });
    }
}

/// A connection whose reads are recorded in its [`Activity`].
pub struct Watched<S> {
    inner: S,
    activity: Activity,
}

impl<S> Watched<S> {
    pub fn new(inner: S, activity: Activity) -> Self {
        Watched { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.with(|s| s.read = true);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Timeouts {
        Timeouts {
            header: Duration::from_secs(10),
            idle: Duration::from_secs(60),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_gets_the_header_timeout() {
        let a = Activity::new();
        let start = Instant::now();
        a.expired(&limits()).await;
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn between_requests_idle_then_a_started_request_gets_the_header_timeout() {
        let a = Activity::new();
        drop(a.request());
        let start = Instant::now();
        a.expired(&limits()).await;
        assert_eq!(start.elapsed(), Duration::from_secs(60), "idle");
        drop(a.request());
        let start = Instant::now();
        tokio::time::sleep(Duration::from_secs(2)).await;
        a.with(|s| s.read = true);
        a.expired(&limits()).await;
        // The first byte came 2 s into the wait; the headers had 10 s from the last response.
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn standing_says_fresh_idle_preemptible_or_busy() {
        let a = Activity::new();
        let start = Instant::now();
        assert_eq!(a.standing(), Standing::Fresh(start));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut scrape = a.request();
        assert_eq!(a.standing(), Standing::Busy, "not marked yet");
        scrape.preemptible();
        scrape.preemptible();
        let began = start + Duration::from_secs(1);
        assert_eq!(a.standing(), Standing::Preemptible(began));
        // HTTP/2: a probe beside the scrape makes the connection one not to cut.
        let probe = a.request();
        assert_eq!(a.standing(), Standing::Busy);
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(probe);
        assert_eq!(a.standing(), Standing::Preemptible(began));
        drop(scrape);
        assert_eq!(a.standing(), Standing::Idle(began + Duration::from_secs(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_running_request_is_never_cut() {
        let a = Activity::new();
        let guard = a.request();
        let expired = tokio::time::timeout(Duration::from_secs(600), a.expired(&limits())).await;
        assert!(expired.is_err(), "no deadline while a request runs");
        drop(guard);
        let start = Instant::now();
        a.expired(&limits()).await;
        assert_eq!(start.elapsed(), Duration::from_secs(60));
    }
}
