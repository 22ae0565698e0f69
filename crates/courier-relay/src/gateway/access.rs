//! Who may attach (`docs/operating-the-relay.md#the-gateway`): anyone who reaches the port, or
//! only devices that present the gateway's shared token in `Identify`. Without a token the
//! gateway listens on loopback only, unless the operator says in so many words that anyone who
//! can reach it may attach.

use std::fmt;
use std::net::SocketAddr;

use serde_json::Value;

/// Shortest token accepted: anything shorter is guessable over the network.
pub const MIN_TOKEN_LEN: usize = 16;

/// `AddressError.reason` for an `Identify` without a `token` on a gateway that requires one.
pub const TOKEN_REQUIRED: &str = "token_required";
/// `AddressError.reason` for an `Identify` whose `token` is not the gateway's.
pub const BAD_TOKEN: &str = "bad_token";

/// The attach credential: a shared secret, compared in constant time.
#[derive(Clone, PartialEq, Eq)]
pub struct GatewayToken(String);

impl GatewayToken {
    /// The token with surrounding whitespace (a file's trailing newline) removed; refused when
    /// shorter than [`MIN_TOKEN_LEN`] bytes.
    pub fn new(token: &str) -> Result<Self, String> {
        let token = token.trim();
        if token.len() < MIN_TOKEN_LEN {
            return Err(format!("must hold at least {MIN_TOKEN_LEN} bytes"));
        }
        Ok(Self(token.to_owned()))
    }

    /// Whether `offered` is this token. Takes as long whatever the bytes (its length aside), so
    /// timing tells an attacker nothing about how much of a guess was right.
    fn matches(&self, offered: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), offered.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
    }
}

impl fmt::Debug for GatewayToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GatewayToken(<redacted>)")
    }
}

/// Who may attach.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GatewayAccess {
    /// Anyone who can connect; the gateway listens on loopback only.
    #[default]
    Loopback,
    /// Anyone who can connect, on any address: the operator chose this explicitly
    /// (`--allow-public-without-token`).
    Public,
    /// Devices whose `Identify` carries this token, on any address.
    Token(GatewayToken),
}

impl GatewayAccess {
    /// Refuses to listen beyond loopback without a token unless told to.
    pub(crate) fn check_listen(&self, listen: SocketAddr) -> Result<(), String> {
        match self {
            Self::Loopback if !listen.ip().is_loopback() => Err(format!(
                "refusing to listen on {listen} without an attach token: anyone who can reach \
                 it could attach; set --require-token-file, or --allow-public-without-token"
            )),
            _ => Ok(()),
        }
    }

    /// Checks an `Identify`'s `token`: `Err` is the `AddressError.reason`.
    pub(crate) fn admit(&self, identify: &Value) -> Result<(), &'static str> {
        let Self::Token(token) = self else {
            return Ok(());
        };
        match identify.get("token").and_then(Value::as_str) {
            None => Err(TOKEN_REQUIRED),
            Some(offered) if token.matches(offered) => Ok(()),
            Some(_) => Err(BAD_TOKEN),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_token_admits_only_itself() {
        assert!(GatewayToken::new("short").is_err());
        let token = GatewayToken::new("  0123456789abcdef\n").unwrap();
        assert_eq!(format!("{token:?}"), "GatewayToken(<redacted>)");
        let access = GatewayAccess::Token(token);
        assert_eq!(access.admit(&json!({"token": "0123456789abcdef"})), Ok(()));
        assert_eq!(access.admit(&json!({})), Err(TOKEN_REQUIRED));
        assert_eq!(access.admit(&json!({"token": 1})), Err(TOKEN_REQUIRED));
        for wrong in ["0123456789abcdeF", "0123456789abcde", "0123456789abcdef0"] {
            assert_eq!(access.admit(&json!({"token": wrong})), Err(BAD_TOKEN));
        }
        assert_eq!(GatewayAccess::Loopback.admit(&json!({})), Ok(()));
    }

    #[test]
    fn only_a_token_or_the_explicit_choice_listens_beyond_loopback() {
        let public: SocketAddr = "0.0.0.0:4242".parse().unwrap();
        let local: SocketAddr = "[::1]:4242".parse().unwrap();
        assert!(GatewayAccess::Loopback.check_listen(local).is_ok());
        assert!(GatewayAccess::Loopback.check_listen(public).is_err());
        assert!(GatewayAccess::Public.check_listen(public).is_ok());
        let token = GatewayToken::new("0123456789abcdef").unwrap();
        assert!(GatewayAccess::Token(token).check_listen(public).is_ok());
    }
}
