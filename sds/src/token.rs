//! The bearer token's own expiry, read locally so an expired token gives a clear error naming
//! the file and the time instead of only the CA's `UNAUTHENTICATED`.
//!
//! The payload is decoded without verifying the signature: the CA verifies; the agent only
//! wants `exp` to explain a failure and to avoid sending a credential it knows is dead.

use std::path::Path;
use std::time::{Duration, SystemTime};

use base64::Engine;

use crate::Error;

/// `exp` of a JWT (`header.payload.signature`, base64url), or `None` when `token` is not a JWT
/// or has no numeric `exp` (opaque tokens are sent as they are).
pub fn jwt_expiry(token: &str) -> Option<SystemTime> {
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_f64()?;
    if !exp.is_finite() || exp < 0.0 {
        return None;
    }
    SystemTime::UNIX_EPOCH.checked_add(Duration::try_from_secs_f64(exp).ok()?)
}

/// Fails with [`Error::TokenExpired`] when `token` (read from `path`) is a JWT whose `exp` is
/// not after `now`; `client_cert` says why no client certificate can stand in for it.
pub fn check_not_expired(
    path: &Path,
    token: &str,
    now: SystemTime,
    client_cert: &str,
) -> Result<(), Error> {
    match jwt_expiry(token) {
        Some(exp) if exp <= now => Err(Error::TokenExpired {
            path: path.display().to_string(),
            expired_at: crate::timestamp::rfc3339(exp),
            ago: now.duration_since(exp).unwrap_or_default().as_secs(),
            client_cert: client_cert.to_string(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(payload: &str) -> String {
        let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.sig",
            e.encode(r#"{"alg":"ES256","typ":"JWT"}"#),
            e.encode(payload)
        )
    }

    #[test]
    fn reads_exp_of_a_jwt() {
        let t = jwt(r#"{"sub":"system:serviceaccount:a:b","exp":1800000000}"#);
        assert_eq!(
            jwt_expiry(&t),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000))
        );
        // Padded base64url is accepted too.
        let padded = {
            let e = base64::engine::general_purpose::URL_SAFE;
            format!("h.{}.s", e.encode(r#"{"exp":12}"#))
        };
        assert_eq!(
            jwt_expiry(&padded),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(12))
        );
    }

    #[test]
    fn opaque_or_malformed_tokens_have_no_expiry() {
        for t in [
            "",
            "opaque-token",
            "a.b",
            "a.b.c.d",
            "h.!!!.s",
            &jwt("not json"),
            &jwt(r#"{"sub":"x"}"#),
            &jwt(r#"{"exp":"tomorrow"}"#),
            &jwt(r#"{"exp":-5}"#),
            &jwt(r#"{"exp":1e400}"#),
            &jwt(r#"[1,2]"#),
        ] {
            assert_eq!(jwt_expiry(t), None, "{t:?}");
        }
    }

    #[test]
    fn expired_token_error_names_path_and_time() {
        let path = Path::new("/var/run/secrets/tokens/istio-token");
        let t = jwt(r#"{"exp":1800000000}"#);
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert!(
            check_not_expired(
                path,
                &t,
                at - Duration::from_secs(1),
                "PROV_CERT is not set"
            )
            .is_ok()
        );
        let e = check_not_expired(
            path,
            &t,
            at + Duration::from_secs(90),
            "PROV_CERT is not set",
        )
        .expect_err("expired");
        let msg = e.to_string();
        assert!(
            msg.contains("/var/run/secrets/tokens/istio-token")
                && msg.contains("expired at 2027-01-15T08:00:00Z")
                && msg.contains("90s ago")
                && msg.contains("PROV_CERT is not set"),
            "{msg}"
        );
        // Exactly at `exp` the token is expired (the CA accepts no leeway either).
        assert!(check_not_expired(path, &t, at, "").is_err());
        // Opaque tokens are never refused locally.
        assert!(check_not_expired(path, "opaque", at, "").is_ok());
    }
}
