//! Identifier and account-name rules (`docs/protocol.md#identifiers`).

use unicode_normalization::is_nfc;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

use crate::limits::MAX_IDENTIFIER_BYTES;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IdentError {
    #[error("is empty")]
    Empty,
    #[error("is longer than 256 bytes")]
    TooLong,
    #[error("contains a control character")]
    ControlCharacter,
    #[error("contains an invisible Unicode format or separator character")]
    InvisibleCharacter,
    #[error("contains '/', '\\' or ':'")]
    ForbiddenCharacter,
    #[error("is '.' or '..'")]
    DotName,
    #[error("account names must not begin with off1")]
    AddressPrefix,
    #[error("account names must be in Unicode normalization form C")]
    NotNfc,
}

/// Characters that change how the text around them reads, or are not seen at all: format
/// characters (bidi overrides and isolates, zero-width spaces and joiners, the byte-order mark)
/// and line and paragraph separators. In a name compared byte-wise they let two names that
/// display alike, or a name that displays as another, be different identifiers.
pub(crate) fn is_invisible(c: char) -> bool {
    matches!(
        c.general_category(),
        GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    )
}

/// The character rules every identifier follows: 1..=256 UTF-8 bytes, no control characters
/// (Unicode `Cc`), no format or separator characters (`Cf`, `Zl`, `Zp`), none of `/ \ :`, not
/// `.` or `..`.
pub fn validate_identifier(s: &str) -> Result<(), IdentError> {
    if s.is_empty() {
        return Err(IdentError::Empty);
    }
    if s.len() > MAX_IDENTIFIER_BYTES {
        return Err(IdentError::TooLong);
    }
    if s.chars().any(char::is_control) {
        return Err(IdentError::ControlCharacter);
    }
    if s.chars().any(is_invisible) {
        return Err(IdentError::InvisibleCharacter);
    }
    if s.contains(['/', '\\', ':']) {
        return Err(IdentError::ForbiddenCharacter);
    }
    if s == "." || s == ".." {
        return Err(IdentError::DotName);
    }
    Ok(())
}

/// An account name is an identifier that does not begin with `off1` (that prefix names an
/// address) and is in NFC. Names are compared byte-wise, so a decomposed `zoë` would be another
/// account that displays as the same one; it is refused, never normalized, because a name
/// changed in passing would address someone the sender did not name.
pub fn validate_account_name(s: &str) -> Result<(), IdentError> {
    validate_identifier(s)?;
    if is_address_form(s) {
        return Err(IdentError::AddressPrefix);
    }
    if !is_nfc(s) {
        return Err(IdentError::NotNfc);
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

    #[test]
    fn a_bidi_override_cannot_disguise_an_account_name() {
        // "alice\u{202E}gnp.exe" displays as "aliceexe.png".
        for disguised in [
            "alice\u{202E}gnp.exe",
            "alice\u{2066}x\u{2069}",
            "\u{200F}alice",
            "alice\u{061C}",
        ] {
            assert_eq!(
                validate_account_name(disguised),
                Err(IdentError::InvisibleCharacter),
                "{disguised:?}"
            );
        }
    }

    #[test]
    fn a_zero_width_character_cannot_make_a_second_account_that_looks_like_the_first() {
        for lookalike in [
            "al\u{200B}ice",
            "al\u{200C}ice",
            "al\u{200D}ice",
            "\u{FEFF}alice",
            "alice\u{2060}",
            "alice\u{00AD}",
            "alice\u{E0041}",
            "alice\u{2028}",
            "alice\u{2029}",
        ] {
            assert_eq!(
                validate_identifier(lookalike),
                Err(IdentError::InvisibleCharacter),
                "{lookalike:?}"
            );
        }
    }

    #[test]
    fn a_c1_control_character_is_refused_like_an_ascii_one() {
        assert_eq!(
            validate_identifier("alice\u{0085}"),
            Err(IdentError::ControlCharacter)
        );
        assert_eq!(
            validate_identifier("alice\u{009B}"),
            Err(IdentError::ControlCharacter)
        );
    }

    #[test]
    fn a_decomposed_spelling_cannot_register_a_second_account_that_looks_like_the_first() {
        assert!(validate_account_name("zo\u{00EB}").is_ok());
        assert_eq!(
            validate_account_name("zoe\u{0308}"),
            Err(IdentError::NotNfc)
        );
        // Other identifiers are opaque ids and are not held to a normalization form.
        assert!(validate_identifier("zoe\u{0308}").is_ok());
    }

    #[test]
    fn names_in_any_script_remain_valid() {
        for name in [
            "zoë",
            "Łukasz",
            "مریم",
            "李小龙",
            "Дарья",
            "🦀crab",
            "ana maria",
        ] {
            assert!(validate_account_name(name).is_ok(), "{name:?}");
        }
    }
}
