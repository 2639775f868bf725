//! RFC 3339 timestamps for logs and error messages, as Go's `time.Format` writes them in UTC,
//! without a date library: the secret cache's and token check's messages (`sds`) and Istio's
//! log lines ([`crate::istio_log`]).

use std::time::SystemTime;

/// RFC 3339 UTC timestamp (seconds precision); times before the epoch print as the epoch.
pub fn rfc3339(t: SystemTime) -> String {
    let (secs, _) = since_epoch(t);
    civil(secs, "Z")
}

/// RFC 3339 UTC timestamp with microseconds, as Istio's logs write it
/// (`2026-12-07T01:02:03.456789Z`); times before the epoch print as the epoch.
pub fn rfc3339_micros(t: SystemTime) -> String {
    let (secs, micros) = since_epoch(t);
    civil(secs, &format!(".{micros:06}Z"))
}

/// Whole seconds and microseconds since the epoch (zero before it).
fn since_epoch(t: SystemTime) -> (i64, u32) {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| (d.as_secs() as i64, d.subsec_micros()))
        .unwrap_or((0, 0))
}

/// `YYYY-MM-DDTHH:MM:SS` of `secs` since the epoch, then `suffix`.
fn civil(secs: i64, suffix: &str) -> String {
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{suffix}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn formats_utc_seconds() {
        let at = |s: u64| rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(1_800_000_000), "2027-01-15T08:00:00Z");
        // 2024-02-29 (a leap day) 23:59:59.
        assert_eq!(at(1_709_251_199), "2024-02-29T23:59:59Z");
        assert_eq!(
            rfc3339(SystemTime::UNIX_EPOCH - Duration::from_secs(5)),
            "1970-01-01T00:00:00Z"
        );
    }

    #[test]
    fn formats_utc_microseconds() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_796_605_323_456_789_999);
        assert_eq!(rfc3339_micros(t), "2026-12-07T01:02:03.456789Z");
        assert_eq!(
            rfc3339_micros(SystemTime::UNIX_EPOCH + Duration::from_micros(7)),
            "1970-01-01T00:00:00.000007Z"
        );
    }
}
