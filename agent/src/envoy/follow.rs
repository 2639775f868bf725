//! Termination that follows the app (`DRAIN_FOLLOWS_APP`, on by default for sidecars;
//! istio#51855, #60649).
//!
//! Istio's agent, SIGTERMed without an earlier `/drain` (a sidecar that is a regular container,
//! whose SIGTERM comes at the same moment as the app's), drains and stops Envoy after the fixed
//! `terminationDrainDuration` (5 s) whatever the app is still doing: an app that finishes its
//! work with outbound calls after its own SIGTERM sees them refused once Envoy is gone (the
//! capture still sends them to port 15001). Here Envoy keeps serving while the app's captured
//! outbound connections are open and stops once none has been open for
//! `terminationDrainDuration`; the pod's grace period (the kubelet's SIGKILL) is the bound.
//!
//! The app's outbound connections are read from the kernel, not from Envoy's stats (Istio's
//! bootstrap keeps no per-listener connection gauge unless `EXIT_ON_ZERO_ACTIVE_CONNECTIONS` is
//! set): every established TCP socket of the pod's network namespace whose local port is the
//! outbound capture port is Envoy's end of a connection the app opened through the mesh.

use std::time::Duration;

/// Envoy's outbound capture port (`istio-iptables -p`, `virtualOutbound`).
pub const OUTBOUND_CAPTURE_PORT: u16 = 15001;

/// How often the kernel's socket tables are read while waiting.
pub const POLL: Duration = Duration::from_millis(100);

/// The pod's kernel socket tables, as `/proc/net/tcp` and `/proc/net/tcp6` give them.
const TABLES: [&str; 2] = ["/proc/net/tcp", "/proc/net/tcp6"];

/// Established connections whose local port is `port`, in one `/proc/net/tcp{,6}` text.
pub fn established_on(table: &str, port: u16) -> usize {
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let mut f = l.split_whitespace();
            let local = f.nth(1);
            let state = f.nth(1);
            // State 01 is TCP_ESTABLISHED; the local address ends in `:PPPP` (hex port).
            state == Some("01")
                && local
                    .and_then(|a| a.rsplit_once(':'))
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
                    == Some(port)
        })
        .count()
}

/// The app's captured outbound connections now (0 when the tables cannot be read: the wait
/// then ends after its quiet window, as Istio's fixed drain would).
pub fn captured_outbound() -> usize {
    TABLES
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|t| established_on(&t, OUTBOUND_CAPTURE_PORT))
        .sum()
}

/// Waits until `open()` has counted no connection for `quiet` in a row, polling every
/// [`POLL`]; returns how long it waited.
pub async fn until_quiet(mut open: impl FnMut() -> usize, quiet: Duration) -> Duration {
    let start = tokio::time::Instant::now();
    let mut last_seen = start;
    let mut logged = None;
    loop {
        let now = tokio::time::Instant::now();
        let n = open();
        if n > 0 {
            last_seen = now;
            if logged != Some(n) {
                tracing::info!(
                    connections = n,
                    "the app's outbound connections are open: Envoy keeps serving them"
                );
                logged = Some(n);
            }
        } else if now.duration_since(last_seen) >= quiet {
            return now.duration_since(start);
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:3A99 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1337        0 101 1 0 100 0 0 10 0
   1: 0100007F:3A99 0A1213C6:D431 01 00000000:00000000 00:00000000 00000000  1337        0 102 1 0 20 4 30 10 -1
   2: 0A1213C6:3A99 0A1213C6:D432 01 00000000:00000000 00:00000000 00000000  1337        0 103 1 0 20 4 30 10 -1
   3: 0A1213C6:3A99 0A1213C6:D433 06 00000000:00000000 03:00000000 00000000     0        0 0 3 0
   4: 0A1213C6:3A9E 0A1213C6:D434 01 00000000:00000000 00:00000000 00000000  1337        0 104 1 0 20 4 30 10 -1
   5: 0A1213C6:D431 0A0213C6:0050 01 00000000:00000000 00:00000000 00000000     0        0 105 1 0 20 4 30 10 -1
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:3A99 00000000000000000000000001000000:A001 01 00000000:00000000 00:00000000 00000000  1337        0 201 1 0 20 4 30 10 -1
   1: 00000000000000000000000001000000:3A99 00000000000000000000000001000000:A002 08 00000000:00000000 00:00000000 00000000  1337        0 202 1 0 20 4 30 10 -1
";

    #[test]
    fn counts_established_sockets_on_the_capture_port_only() {
        // The listener (0A), TIME_WAIT (06), the inbound port 15006 (3A9E) and the app's own
        // end (local port D431) are not counted.
        assert_eq!(established_on(TCP, OUTBOUND_CAPTURE_PORT), 2);
        // CLOSE_WAIT (08): the app has closed its end.
        assert_eq!(established_on(TCP6, OUTBOUND_CAPTURE_PORT), 1);
        assert_eq!(established_on(TCP, 15006), 1);
        assert_eq!(established_on("", OUTBOUND_CAPTURE_PORT), 0);
        assert_eq!(established_on("header\ngarbage line\n", 1), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn waits_for_the_last_connection_then_the_quiet_window() {
        let start = tokio::time::Instant::now();
        // Open for 3 s, a gap of 1 s, open again until 7 s, then gone.
        let open = move || {
            let t = start.elapsed();
            usize::from(
                t < Duration::from_secs(3)
                    || (t >= Duration::from_secs(4) && t < Duration::from_secs(7)),
            )
        };
        let waited = until_quiet(open, Duration::from_secs(5)).await;
        assert!(
            // The last poll that saw it open was at 6.9 s.
            waited >= Duration::from_millis(11_900) && waited < Duration::from_millis(12_100),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_connections_it_waits_the_quiet_window_as_istio() {
        let waited = until_quiet(|| 0, Duration::from_secs(5)).await;
        assert!(
            waited >= Duration::from_secs(5) && waited < Duration::from_millis(5_200),
            "{waited:?}"
        );
    }
}
