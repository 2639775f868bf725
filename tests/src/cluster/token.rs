//! Service-account tokens judged by the cluster's own API server. TokenRequest refuses a
//! lifetime under 10 minutes, so a test that needs an expired token signs one with the
//! cluster's service-account key and the claims TokenRequest writes (issuer, audience, the
//! account's name and uid), and the API server's TokenReview says whether it authenticates:
//! an expired one is refused there exactly as one that aged there.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::Cluster;

/// What the API server's TokenReview said of a token.
#[derive(Debug)]
pub struct Review {
    pub authenticated: bool,
    /// The username when authenticated (`system:serviceaccount:<ns>:<name>`).
    pub user: String,
    /// The API server's reason when not.
    pub error: String,
}

/// Base64url without padding of stdin, with the JWS signing input and key, in one shell step.
const SIGN: &str = r#"set -euo pipefail
b64() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
kid=$(openssl pkey -in "$KEY" -pubout -outform DER | openssl dgst -sha256 -binary | b64)
head=$(printf '{"alg":"RS256","kid":"%s"}' "$kid" | b64)
body=$(printf '%s' "$CLAIMS" | b64)
sig=$(printf '%s.%s' "$head" "$body" | openssl dgst -sha256 -sign "$KEY" -binary | b64)
printf '%s.%s.%s' "$head" "$body" "$sig""#;

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Cluster {
    /// A token for service account `ns/name` with audience `audience`, valid from `issued` for
    /// `lifetime`, signed with the cluster's service-account key (`pki/sa.key`).
    pub fn sign_token(
        &self,
        ns: &str,
        name: &str,
        audience: &str,
        issued: SystemTime,
        lifetime: Duration,
    ) -> Result<String, String> {
        let discovery = self.kubectl(&["get", "--raw", "/.well-known/openid-configuration"])?;
        let discovery: serde_json::Value = serde_json::from_str(&discovery)
            .map_err(|e| format!("the API server's OIDC discovery: {e}"))?;
        let issuer = discovery["issuer"]
            .as_str()
            .ok_or("no issuer in the API server's OIDC discovery")?;
        let uid = self.kubectl(&[
            "get",
            "serviceaccount",
            "-n",
            ns,
            name,
            "-o",
            "jsonpath={.metadata.uid}",
        ])?;
        let iat = unix(issued);
        let claims = serde_json::json!({
            "aud": [audience],
            "exp": iat + lifetime.as_secs(),
            "iat": iat,
            "nbf": iat,
            "iss": issuer,
            "sub": format!("system:serviceaccount:{ns}:{name}"),
            "kubernetes.io": {
                "namespace": ns,
                "serviceaccount": {"name": name, "uid": uid.trim()},
            },
        });
        let out = std::process::Command::new("bash")
            .args(["-c", SIGN])
            .env("KEY", self.state.join("pki/sa.key"))
            .env("CLAIMS", claims.to_string())
            .output()
            .map_err(|e| format!("bash: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "signing a token with openssl: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The API server's TokenReview of `token` for `audience`.
    pub fn review_token(&self, token: &str, audience: &str) -> Result<Review, String> {
        let review = serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [audience]},
        });
        let out = self.create(&review.to_string())?;
        let out: serde_json::Value =
            serde_json::from_str(&out).map_err(|e| format!("TokenReview: not JSON: {e}"))?;
        let status = &out["status"];
        Ok(Review {
            authenticated: status["authenticated"].as_bool().unwrap_or(false),
            user: status["user"]["username"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            error: status["error"].as_str().unwrap_or_default().to_string(),
        })
    }
}
