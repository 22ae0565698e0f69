//! Token checks (`docs/protocol.md#token`): HS256 only, `exp` and `iat` required with no leeway,
//! `exp − iat` capped, `nbf` honoured, `aud` and `iss` pinned when configured, `sub` a valid
//! account name.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use courier_proto::proof::CHALLENGE_LEN;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::config::{AuthPolicy, MIN_SECRET_BYTES};
use crate::{now_ms, RelayError};

/// How far ahead of the relay's clock a token's `iat` may be: the issuer's clock may run a
/// little ahead, but a token issued in the future would outlive the lifetime cap.
const IAT_SKEW_SECS: u64 = 60;

/// `AuthError.reason` values (`docs/protocol.md#errors-and-reasons`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    NotAuthenticated,
    AuthTimeout,
    InvalidToken,
    TokenExpired,
    TokenNotYetValid,
    InvalidAccount,
    /// `exp − iat` is over the relay's cap.
    TokenLifetimeTooLong,
    /// The operator's deny list revokes the account's tokens issued before a time.
    TokenRevoked,
    /// The source address is over its `Authenticate` limit.
    TooManyAttempts,
    /// The account is over its limit of authentications.
    TooManyLogins,
    /// The account is over its limit of logins that displace its live connection.
    TooManyDisplacements,
}

impl AuthFailure {
    pub fn reason(self) -> &'static str {
        match self {
            Self::NotAuthenticated => "not_authenticated",
            Self::AuthTimeout => "auth_timeout",
            Self::InvalidToken => "invalid_token",
            Self::TokenExpired => "token_expired",
            Self::TokenNotYetValid => "token_not_yet_valid",
            Self::InvalidAccount => "invalid_account",
            Self::TokenLifetimeTooLong => "token_lifetime_too_long",
            Self::TokenRevoked => "token_revoked",
            Self::TooManyAttempts => "too_many_attempts",
            Self::TooManyLogins => "too_many_logins",
            Self::TooManyDisplacements => "too_many_displacements",
        }
    }
}

#[derive(Deserialize)]
struct Claims {
    // Read loosely so a missing or non-string `sub` is reported, not a JSON error.
    #[serde(default)]
    sub: Option<serde_json::Value>,
    // jsonwebtoken has checked `exp` is present and a number.
    exp: serde_json::Value,
    #[serde(default)]
    iat: Option<serde_json::Value>,
}

/// A claim holding seconds since the epoch, as a non-negative number.
fn seconds(value: &serde_json::Value) -> Option<u64> {
    value.as_u64().or_else(|| {
        value
            .as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(|f| f as u64)
    })
}

/// What a valid token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub account: String,
    /// When it was issued, in seconds since the epoch: what revocation compares.
    pub issued_at: u64,
}

#[derive(Serialize)]
struct IssuedClaims<'a> {
    sub: &'a str,
    exp: u64,
    iat: u64,
}

/// Verifies tokens against one secret; built once per relay.
pub struct TokenVerifier {
    key: DecodingKey,
    validation: Validation,
    max_lifetime_secs: u64,
}

impl TokenVerifier {
    pub fn new(secret: &[u8], policy: &AuthPolicy) -> Result<Self, RelayError> {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 0;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        let mut required = vec!["exp"];
        // Without a configured audience an `aud` is ignored: it must not make a valid token fail.
        validation.validate_aud = policy.audience.is_some();
        if let Some(audience) = &policy.audience {
            validation.set_audience(&[audience]);
            required.push("aud");
        }
        if let Some(issuer) = &policy.issuer {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        validation.set_required_spec_claims(&required);
        Ok(Self {
            key: DecodingKey::from_secret(secret)?,
            validation,
            max_lifetime_secs: policy.max_token_lifetime.as_secs(),
        })
    }

    /// The account the token authenticates, and when it was issued.
    pub fn verify(&self, token: &str) -> Result<Verified, AuthFailure> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(
            |e| match e.kind() {
                ErrorKind::ExpiredSignature => AuthFailure::TokenExpired,
                ErrorKind::ImmatureSignature => AuthFailure::TokenNotYetValid,
                _ => AuthFailure::InvalidToken,
            },
        )?;
        let claims = data.claims;
        let (Some(exp), Some(issued_at)) =
            (seconds(&claims.exp), claims.iat.as_ref().and_then(seconds))
        else {
            return Err(AuthFailure::InvalidToken);
        };
        if issued_at > (now_ms() / 1000).saturating_add(IAT_SKEW_SECS) {
            return Err(AuthFailure::TokenNotYetValid);
        }
        if exp.saturating_sub(issued_at) > self.max_lifetime_secs {
            return Err(AuthFailure::TokenLifetimeTooLong);
        }
        let Some(serde_json::Value::String(sub)) = claims.sub else {
            return Err(AuthFailure::InvalidAccount);
        };
        courier_proto::validate_account_name(&sub).map_err(|_| AuthFailure::InvalidAccount)?;
        // Another spelling of an address names no one (`docs/protocol.md#identifiers`): as an
        // account it could never be reached, and it would read as an address it does not own.
        if crate::send::spells_an_address(&sub) {
            return Err(AuthFailure::InvalidAccount);
        }
        Ok(Verified {
            account: sub,
            issued_at,
        })
    }
}

/// An HS256 token `{sub, exp, iat}` for `account`, valid for `expires_in_sec` seconds.
pub fn issue_token(
    secret: &[u8],
    account: &str,
    expires_in_sec: u64,
) -> Result<String, RelayError> {
    if secret.len() < MIN_SECRET_BYTES {
        return Err(RelayError::Config(format!(
            "the token secret must be at least {MIN_SECRET_BYTES} bytes"
        )));
    }
    courier_proto::validate_account_name(account)
        .map_err(|e| RelayError::Config(format!("account name {account:?} {e}")))?;
    if crate::send::spells_an_address(account) {
        return Err(RelayError::Config(format!(
            "account name {account:?} spells an off1 address"
        )));
    }
    let iat = now_ms() / 1000;
    let claims = IssuedClaims {
        sub: account,
        exp: iat.saturating_add(expires_in_sec),
        iat,
    };
    Ok(jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret)?,
    )?)
}

/// 32 fresh CSPRNG bytes for `Authenticated.address_challenge`.
pub fn new_challenge() -> Option<[u8; CHALLENGE_LEN]> {
    let mut bytes = [0u8; CHALLENGE_LEN];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .ok()?;
    Some(bytes)
}

/// The challenge as `Authenticated.address_challenge` carries it: base64, 44 characters.
pub fn encode_challenge(challenge: &[u8; CHALLENGE_LEN]) -> String {
    STANDARD.encode(challenge)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn verifier() -> TokenVerifier {
        TokenVerifier::new(SECRET, &AuthPolicy::default()).unwrap()
    }

    fn sign(claims: serde_json::Value) -> String {
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET).unwrap(),
        )
        .unwrap()
    }

    fn now_s() -> u64 {
        now_ms() / 1000
    }

    #[test]
    fn issued_tokens_verify_and_wrong_secrets_do_not() {
        let token = issue_token(SECRET, "alice", 60).unwrap();
        assert_eq!(
            verifier().verify(&token).map(|v| v.account),
            Ok("alice".to_owned())
        );
        let other = TokenVerifier::new(
            b"another secret of at least 32 bytes",
            &AuthPolicy::default(),
        );
        assert_eq!(
            other.unwrap().verify(&token),
            Err(AuthFailure::InvalidToken)
        );
        assert!(issue_token(SECRET, "off1x", 60).is_err());
        let upper_name = "OFF1QYQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQN8ANTF";
        assert!(issue_token(SECRET, upper_name, 60).is_err());
        let upper = sign(json!({"sub": upper_name, "exp": now_s() + 60, "iat": now_s()}));
        assert_eq!(
            verifier().verify(&upper),
            Err(AuthFailure::InvalidAccount),
            "the uppercase spelling of an address is no account name"
        );
        let office = issue_token(SECRET, "Off1ce", 60).unwrap();
        assert_eq!(
            verifier().verify(&office).map(|v| v.account),
            Ok("Off1ce".to_owned())
        );
    }

    #[test]
    fn a_short_secret_cannot_issue_tokens() {
        assert!(issue_token(b"", "alice", 60).is_err());
        assert!(issue_token(b"secret", "alice", 60).is_err());
        assert!(issue_token(&SECRET[..31], "alice", 60).is_err());
        assert!(issue_token(SECRET, "alice", 60).is_ok());
    }

    #[test]
    fn issued_tokens_carry_iat() {
        let token = issue_token(SECRET, "alice", 60).unwrap();
        let verified = verifier().verify(&token).unwrap();
        assert!(verified.issued_at.abs_diff(now_s()) <= 1);
    }

    #[test]
    fn a_token_without_iat_cannot_authenticate() {
        let token = sign(json!({"sub": "alice", "exp": now_s() + 60}));
        assert_eq!(verifier().verify(&token), Err(AuthFailure::InvalidToken));
        let token = sign(json!({"sub": "alice", "exp": now_s() + 60, "iat": "yesterday"}));
        assert_eq!(verifier().verify(&token), Err(AuthFailure::InvalidToken));
    }

    #[test]
    fn a_token_living_longer_than_the_cap_cannot_authenticate() {
        let now = now_s();
        let day = sign(json!({"sub": "alice", "exp": now + 86_400, "iat": now}));
        assert!(verifier().verify(&day).is_ok());
        let year = sign(json!({"sub": "alice", "exp": now + 365 * 86_400, "iat": now}));
        assert_eq!(
            verifier().verify(&year),
            Err(AuthFailure::TokenLifetimeTooLong)
        );
        let policy = AuthPolicy {
            max_token_lifetime: Duration::from_secs(60),
            ..AuthPolicy::default()
        };
        let hour = sign(json!({"sub": "alice", "exp": now + 3600, "iat": now}));
        assert_eq!(
            TokenVerifier::new(SECRET, &policy).unwrap().verify(&hour),
            Err(AuthFailure::TokenLifetimeTooLong)
        );
    }

    #[test]
    fn a_token_issued_in_the_future_cannot_outlive_the_cap() {
        let later = now_s() + 300 * 86_400;
        let token = sign(json!({"sub": "alice", "exp": later + 60, "iat": later}));
        assert_eq!(
            verifier().verify(&token),
            Err(AuthFailure::TokenNotYetValid)
        );
    }

    #[test]
    fn a_token_for_another_audience_or_issuer_cannot_authenticate() {
        let policy = AuthPolicy {
            audience: Some("courier".into()),
            issuer: Some("https://auth.example".into()),
            ..AuthPolicy::default()
        };
        let pinned = TokenVerifier::new(SECRET, &policy).unwrap();
        let (now, exp) = (now_s(), now_s() + 60);
        let good = sign(
            json!({"sub": "alice", "exp": exp, "iat": now, "aud": "courier", "iss": "https://auth.example"}),
        );
        assert_eq!(pinned.verify(&good).map(|v| v.account), Ok("alice".into()));
        let in_list = sign(
            json!({"sub": "alice", "exp": exp, "iat": now, "aud": ["x", "courier"], "iss": "https://auth.example"}),
        );
        assert!(pinned.verify(&in_list).is_ok());
        for claims in [
            json!({"sub": "alice", "exp": exp, "iat": now, "aud": "other", "iss": "https://auth.example"}),
            json!({"sub": "alice", "exp": exp, "iat": now, "iss": "https://auth.example"}),
            json!({"sub": "alice", "exp": exp, "iat": now, "aud": "courier", "iss": "https://evil.example"}),
            json!({"sub": "alice", "exp": exp, "iat": now, "aud": "courier"}),
        ] {
            assert_eq!(
                pinned.verify(&sign(claims.clone())),
                Err(AuthFailure::InvalidToken),
                "{claims}"
            );
        }
        assert!(
            verifier().verify(&good).is_ok(),
            "without pinning, aud and iss are ignored"
        );
    }

    #[test]
    fn challenges_are_32_bytes_and_fresh() {
        let a = encode_challenge(&new_challenge().unwrap());
        let b = encode_challenge(&new_challenge().unwrap());
        assert_eq!(a.len(), 44);
        assert_eq!(STANDARD.decode(&a).unwrap().len(), 32);
        assert_ne!(a, b);
    }
}
