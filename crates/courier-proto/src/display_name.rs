//! Display names — a group's name and other text shown as a label rather than compared as an
//! identifier (`docs/protocol.md#display-names`): stored and shown in NFC, without characters
//! that reorder or hide the text around them.

use unicode_normalization::UnicodeNormalization;

use crate::ident::is_invisible;

/// Joiners that scripts (Persian, Indic) and emoji sequences need; every other format character
/// is refused.
const JOINERS: [char; 2] = ['\u{200C}', '\u{200D}'];

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DisplayNameError {
    #[error("is empty")]
    Empty,
    #[error("is longer than {max} bytes")]
    TooLong { max: usize },
    #[error("contains a control character")]
    ControlCharacter,
    #[error("contains a bidi control or an invisible Unicode format character")]
    InvisibleCharacter,
}

fn refused(c: char) -> Option<DisplayNameError> {
    if c.is_control() {
        Some(DisplayNameError::ControlCharacter)
    } else if is_invisible(c) && !JOINERS.contains(&c) {
        Some(DisplayNameError::InvisibleCharacter)
    } else {
        None
    }
}

/// A display name as this device names it: `raw` in NFC, 1..=`max_bytes` bytes once normalized,
/// or refused when it holds a control, bidi or invisible format character.
pub fn display_name(raw: &str, max_bytes: usize) -> Result<String, DisplayNameError> {
    if let Some(e) = raw.chars().find_map(refused) {
        return Err(e);
    }
    let name: String = raw.nfc().collect();
    if name.is_empty() {
        return Err(DisplayNameError::Empty);
    }
    if name.len() > max_bytes {
        return Err(DisplayNameError::TooLong { max: max_bytes });
    }
    Ok(name)
}

/// A display name another party chose: shown as far as it can be shown safely, in NFC with the
/// characters [`display_name`] refuses left out.
pub fn received_display_name(raw: &str) -> String {
    raw.chars()
        .filter(|&c| refused(c).is_none())
        .nfc()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bidi_override_cannot_disguise_a_group_name() {
        assert_eq!(
            display_name("Team \u{202E}nimda", 256),
            Err(DisplayNameError::InvisibleCharacter)
        );
        assert_eq!(
            display_name("Team\u{2067}x", 256),
            Err(DisplayNameError::InvisibleCharacter)
        );
        assert_eq!(
            display_name("Team\u{0007}", 256),
            Err(DisplayNameError::ControlCharacter)
        );
        assert_eq!(received_display_name("Team \u{202E}nimda"), "Team nimda");
        assert_eq!(received_display_name("\u{200B}\u{FEFF}"), "");
    }

    #[test]
    fn names_that_look_alike_are_stored_alike() {
        assert_eq!(display_name("Zoe\u{0308}", 256).unwrap(), "Zo\u{00EB}");
        assert_eq!(received_display_name("Zoe\u{0308}"), "Zo\u{00EB}");
    }

    #[test]
    fn joiners_that_scripts_and_emoji_need_are_kept() {
        let family = "\u{1F468}\u{200D}\u{1F469}\u{200D}\u{1F467} home";
        assert_eq!(display_name(family, 256).unwrap(), family);
        assert_eq!(
            display_name("می\u{200C}خواهم", 256).unwrap(),
            "می\u{200C}خواهم"
        );
    }

    #[test]
    fn the_bound_applies_to_the_normalized_name() {
        assert_eq!(display_name("", 4), Err(DisplayNameError::Empty));
        assert_eq!(display_name("abcd", 4).unwrap(), "abcd");
        assert_eq!(
            display_name("abcde", 4),
            Err(DisplayNameError::TooLong { max: 4 })
        );
    }
}
