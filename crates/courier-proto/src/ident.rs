//! Identifier and account-name rules (`docs/protocol.md#identifiers`).

use crate::limits::MAX_IDENTIFIER_BYTES;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IdentError {
    #[error("is empty")]
    Empty,
    #[error("is longer than 256 bytes")]
    TooLong,
    #[error("contains a control character")]
    ControlCharacter,
    #[error("contains '/', '\\' or ':'")]
    ForbiddenCharacter,
    #[error("is '.' or '..'")]
    DotName,
    #[error("account names must not begin with off1")]
    AddressPrefix,
}

/// The character rules every identifier follows: 1..=256 UTF-8 bytes, no ASCII control
/// characters, none of `/ \ :`, not `.` or `..`.
pub fn validate_identifier(s: &str) -> Result<(), IdentError> {
    if s.is_empty() {
        return Err(IdentError::Empty);
    }
    if s.len() > MAX_IDENTIFIER_BYTES {
        return Err(IdentError::TooLong);
    }
    if s.chars().any(|c| c.is_ascii_control()) {
        return Err(IdentError::ControlCharacter);
    }
    if s.contains(['/', '\\', ':']) {
        return Err(IdentError::ForbiddenCharacter);
    }
    if s == "." || s == ".." {
        return Err(IdentError::DotName);
    }
    Ok(())
}

/// An account name is an identifier that does not begin with `off1` (that prefix names an address).
pub fn validate_account_name(s: &str) -> Result<(), IdentError> {
    validate_identifier(s)?;
    if is_address_form(s) {
        return Err(IdentError::AddressPrefix);
    }
    Ok(())
}

/// Whether an identifier is to be read as an `off1` address rather than an account name.
pub fn is_address_form(s: &str) -> bool {
    s.starts_with("off1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifier_rules() {
        assert_eq!(validate_identifier(""), Err(IdentError::Empty));
        assert_eq!(
            validate_identifier(&"a".repeat(257)),
            Err(IdentError::TooLong)
        );
        assert!(validate_identifier(&"a".repeat(256)).is_ok());
        assert_eq!(
            validate_identifier("a\nb"),
            Err(IdentError::ControlCharacter)
        );
        assert_eq!(
            validate_identifier("a/b"),
            Err(IdentError::ForbiddenCharacter)
        );
        assert_eq!(
            validate_identifier("a:b"),
            Err(IdentError::ForbiddenCharacter)
        );
        assert_eq!(validate_identifier(".."), Err(IdentError::DotName));
        assert!(validate_identifier("zoë").is_ok());
        assert_eq!(
            validate_account_name("off1abc"),
            Err(IdentError::AddressPrefix)
        );
        assert!(validate_account_name("alice").is_ok());
    }
}
