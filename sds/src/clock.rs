//! Wall-clock time for certificate deadlines.
//!
//! A certificate's NotAfter is a wall-clock fact, and the monotonic clock that tokio's timers
//! use stops while the host is suspended (a laptop lid, a paused VM or kind node). A rotation
//! scheduled as "sleep 12 h" on that clock wakes 12 h of *running* time later, long after the
//! certificate expired (istio#38081; Istio's Go timers and ztunnel's `sleep_until(Instant)` do
//! the same). So deadlines are kept as [`SystemTime`] and re-checked against [`Clock::now`] at
//! least every [`WALL_CLOCK_RECHECK`]: after a resume past the rotation point the certificate is
//! renewed within that period.

use std::time::{Duration, SystemTime};

/// How often a pending certificate deadline is re-checked against the wall clock.
pub const WALL_CLOCK_RECHECK: Duration = Duration::from_secs(5);

/// The wall clock certificate deadlines are measured on.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> SystemTime;
}

/// The system's real-time clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A wall clock for tests: moves with tokio's (possibly paused) clock, and can jump ahead
/// without it, as the wall clock does across a host suspend or an NTP step.
#[cfg(test)]
#[derive(Debug)]
pub struct JumpClock {
    base: SystemTime,
    start: tokio::time::Instant,
    jumped: std::sync::Mutex<Duration>,
}

#[cfg(test)]
impl JumpClock {
    /// Starts at the system's current time.
    pub fn new() -> JumpClock {
        JumpClock {
            base: SystemTime::now(),
            start: tokio::time::Instant::now(),
            jumped: std::sync::Mutex::new(Duration::ZERO),
        }
    }

    /// Moves the wall clock `d` ahead while the monotonic clock stands still (a suspend).
    pub fn jump(&self, d: Duration) {
        *self.jumped.lock().unwrap_or_else(|e| e.into_inner()) += d;
    }
}

#[cfg(test)]
impl Default for JumpClock {
    fn default() -> Self {
        JumpClock::new()
    }
}

#[cfg(test)]
impl Clock for JumpClock {
    fn now(&self) -> SystemTime {
        let jumped = *self.jumped.lock().unwrap_or_else(|e| e.into_inner());
        self.base + self.start.elapsed() + jumped
    }
}
