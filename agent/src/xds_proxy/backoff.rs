//! The wait between upstream attempts: a jittered exponential backoff, cut short when a
//! restarted istiod is seen listening again.
//!
//! Istio's agent ends Envoy's stream when istiod goes away and lets Envoy reconnect on its own
//! backoff; ours keeps Envoy's stream and reconnects itself, so how soon it notices istiod back
//! is the resync time. Full attempts (TCP, TLS, a stream with the token, the replay) follow the
//! backoff, so a dead control plane is not hammered with handshakes. In between, for the first
//! [`WATCH_WINDOW`] of an outage, the address last used is knocked on with a bare TCP connect
//! every [`KNOCK_EVERY`] (in the outage's first wait, from [`KNOCK_FIRST`] doubling up to it, so
//! an istiod restarted in place is seen within milliseconds): once it has refused and then
//! accepts, istiod's listener is back and the wait ends at once. A knock that is accepted from the start (istiod there but failing the
//! stream, or stalled) never cuts the wait: that is what the backoff is for.

use std::time::Duration;

use tokio::time::Instant;

use super::Knock;

/// Jittered exponential backoff between upstream attempts: from [`START`] doubling up to
/// [`CAP`], each delay drawn in `[d/2, d]`.
#[derive(Debug, Default)]
pub(super) struct Backoff {
    attempts: u32,
    /// When the current outage began (`None`: connected).
    outage: Option<Instant>,
}

const START: Duration = Duration::from_millis(100);
const CAP: Duration = Duration::from_secs(1);

/// How long into an outage the address is knocked on between attempts.
pub(super) const WATCH_WINDOW: Duration = Duration::from_secs(30);

/// How often the address is knocked on while watching.
pub(super) const KNOCK_EVERY: Duration = Duration::from_millis(50);

/// The first interval between knocks in an outage's first wait (then doubling to
/// [`KNOCK_EVERY`]: knocks at 0, 10, 30, 70, 120 ms ... one more than at a steady 50 ms).
pub(super) const KNOCK_FIRST: Duration = Duration::from_millis(10);

impl Backoff {
    /// The next delay.
    pub(super) fn next(&mut self) -> Duration {
        let d = START.saturating_mul(1 << self.attempts.min(16)).min(CAP);
        self.attempts = self.attempts.saturating_add(1);
        self.outage.get_or_insert_with(Instant::now);
        d.mul_f64(rand::random_range(0.5..=1.0))
    }

    /// A stream was established: the next outage starts from the shortest delay.
    pub(super) fn reset(&mut self) {
        *self = Self::default();
    }

    /// How many delays this outage has had (for logging once per outage).
    pub(super) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// True while the outage is young enough to watch for istiod's return.
    fn watching(&self) -> bool {
        self.outage.is_some_and(|t| t.elapsed() < WATCH_WINDOW)
    }

    /// Waits `delay`, or less: while watching, until the knocked address goes from refusing to
    /// accepting connections.
    pub(super) async fn pause(&self, delay: Duration, knock: Option<&Knock>) {
        let deadline = Instant::now() + delay;
        let Some(knock) = knock.filter(|_| self.watching()) else {
            return tokio::time::sleep_until(deadline).await;
        };
        // The first knock at once: right after an attempt that found nobody listening it is
        // refused too, so istiod coming back before the next knock is seen.
        let mut refused = knock().await == Some(false);
        let mut every = if self.attempts <= 1 {
            KNOCK_FIRST
        } else {
            KNOCK_EVERY
        };
        loop {
            let next = Instant::now() + every;
            every = (every * 2).min(KNOCK_EVERY);
            if next >= deadline {
                return tokio::time::sleep_until(deadline).await;
            }
            tokio::time::sleep_until(next).await;
            match knock().await {
                Some(false) => refused = true,
                Some(true) if refused => {
                    tracing::debug!("istiod's address accepts connections again; reconnecting now");
                    return;
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A knock whose answers are `script`, then the last one forever.
    fn scripted(script: &'static [Option<bool>]) -> (Knock, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let knock: Knock = Arc::new(move || {
            let i = c.fetch_add(1, Ordering::SeqCst);
            let answer = script[i.min(script.len() - 1)];
            Box::pin(async move { answer })
        });
        (knock, calls)
    }

    #[test]
    fn delays_double_up_to_the_cap_with_jitter() {
        let mut b = Backoff::default();
        for expected in [100u64, 200, 400, 800, 1000, 1000] {
            let d = b.next();
            let max = Duration::from_millis(expected);
            assert!(
                d >= max / 2 && d <= max,
                "{d:?} not in [{:?}, {max:?}]",
                max / 2
            );
        }
        b.reset();
        assert!(b.next() <= START);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_then_accepting_address_ends_the_wait() {
        let mut b = Backoff::default();
        b.next();
        b.next();
        let (knock, calls) = scripted(&[Some(false), Some(false), Some(true)]);
        let start = Instant::now();
        b.pause(Duration::from_secs(1), Some(&knock)).await;
        assert_eq!(
            start.elapsed(),
            KNOCK_EVERY * 2,
            "ended at the first accept (the first knock is at once)"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // Back before the first timed knock: seen at that knock.
        let (knock, _) = scripted(&[Some(false), Some(true)]);
        let start = Instant::now();
        b.pause(Duration::from_secs(1), Some(&knock)).await;
        assert_eq!(start.elapsed(), KNOCK_EVERY);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_wait_of_an_outage_knocks_sooner() {
        // Knocks at 0, 10, 30, 70, 120 ms: istiod back at 75 ms is seen at 120 ms, one back at
        // 5 ms at 10 ms.
        let mut b = Backoff::default();
        b.next();
        let (knock, calls) = scripted(&[
            Some(false),
            Some(false),
            Some(false),
            Some(false),
            Some(true),
        ]);
        let start = Instant::now();
        b.pause(Duration::from_secs(1), Some(&knock)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(120));
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        let (knock, _) = scripted(&[Some(false), Some(true)]);
        let start = Instant::now();
        b.pause(Duration::from_secs(1), Some(&knock)).await;
        assert_eq!(start.elapsed(), KNOCK_FIRST);
    }

    #[tokio::test(start_paused = true)]
    async fn an_address_that_always_accepts_waits_the_whole_delay() {
        // Istiod there but failing the stream, or stalled: the backoff holds.
        let mut b = Backoff::default();
        b.next();
        let (knock, _) = scripted(&[Some(true)]);
        let start = Instant::now();
        b.pause(Duration::from_millis(800), Some(&knock)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(800));
        // And an unknown answer (timeout, no address) after a refusal does not cut it either.
        let (knock, _) = scripted(&[Some(false), None]);
        let start = Instant::now();
        b.pause(Duration::from_millis(800), Some(&knock)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(800));
    }

    #[tokio::test(start_paused = true)]
    async fn no_knocks_past_the_watch_window() {
        let mut b = Backoff::default();
        b.next();
        tokio::time::advance(WATCH_WINDOW).await;
        let (knock, calls) = scripted(&[Some(false), Some(true)]);
        let start = Instant::now();
        b.pause(Duration::from_secs(1), Some(&knock)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }
}
