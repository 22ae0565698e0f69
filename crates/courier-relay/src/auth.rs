//! Token checks (`docs/protocol.md#token`): HS256 only, `exp` required with no leeway, `nbf`
//! honoured, `sub` a valid account name.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use courier_proto::proof::CHALLENGE_LEN;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::{now_ms, RelayError};

/// `AuthError.reason` values (`docs/protocol.md#errors-and-reasons`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    NotAuthenticated,
    AuthTimeout,
    InvalidToken,
    TokenExpired,
    TokenNotYetValid,
    InvalidAccount,
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
        }
    }
}

#[derive(Deserialize)]
struct Claims {
    // Read loosely so a missing or non-string `sub` is reported, not a JSON error.
    #[serde(default)]
    sub: Option<serde_json::Value>,
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
}

impl TokenVerifier {
    pub fn new(secret: &[u8]) -> Result<Self, RelayError> {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 0;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        // Other claims are ignored (`docs/protocol.md#token`); an `aud` must not make a valid token
        // fail.
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["exp"]);
        Ok(Self {
            key: DecodingKey::from_secret(secret)?,
            validation,
        })
    }

    /// The account name the token authenticates.
    pub fn verify(&self, token: &str) -> Result<String, AuthFailure> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(
            |e| match e.kind() {
                ErrorKind::ExpiredSignature => AuthFailure::TokenExpired,
                ErrorKind::ImmatureSignature => AuthFailure::TokenNotYetValid,
                _ => AuthFailure::InvalidToken,
            },
        )?;
        let Some(serde_json::Value::String(sub)) = data.claims.sub else {
            return Err(AuthFailure::InvalidAccount);
        };
        courier_proto::validate_account_name(&sub).map_err(|_| AuthFailure::InvalidAccount)?;
        // Another spelling of an address names no one (`docs/protocol.md#identifiers`): as an
        // account it could never be reached, and it would read as an address it does not own.
        if crate::send::spells_an_address(&sub) {
            return Err(AuthFailure::InvalidAccount);
        }
        Ok(sub)
    }
}

/// An HS256 token `{sub, exp, iat}` for `account`, valid for `expires_in_sec` seconds.
pub fn issue_token(
    secret: &[u8],
    account: &str,
    expires_in_sec: u64,
) -> Result<String, RelayError> {
    if secret.is_empty() {
        return Err(RelayError::Config(
            "the token secret must not be empty".into(),
        ));
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
    use super::*;

    #[test]
    fn issued_tokens_verify_and_wrong_secrets_do_not() {
        let token = issue_token(b"secret", "alice", 60).unwrap();
        assert_eq!(
            TokenVerifier::new(b"secret").unwrap().verify(&token),
            Ok("alice".to_owned())
        );
        assert_eq!(
            TokenVerifier::new(b"other").unwrap().verify(&token),
            Err(AuthFailure::InvalidToken)
        );
        assert!(issue_token(b"secret", "off1x", 60).is_err());
        let upper_name = "OFF1QYQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQN8ANTF";
        assert!(issue_token(b"secret", upper_name, 60).is_err());
        let upper = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &IssuedClaims {
                sub: upper_name,
                exp: now_ms() / 1000 + 60,
                iat: 0,
            },
            &EncodingKey::from_secret(b"secret").unwrap(),
        )
        .unwrap();
        assert_eq!(
            TokenVerifier::new(b"secret").unwrap().verify(&upper),
            Err(AuthFailure::InvalidAccount),
            "the uppercase spelling of an address is no account name"
        );
        let office = issue_token(b"secret", "Off1ce", 60).unwrap();
        assert_eq!(
            TokenVerifier::new(b"secret").unwrap().verify(&office),
            Ok("Off1ce".to_owned())
        );
        assert!(issue_token(b"", "alice", 60).is_err());
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
