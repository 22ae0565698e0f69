//! Text a peer or a relay controls, made fit to quote in an error, a diagnostic or a log line:
//! cut to a fixed size, so a line never grows with a hostile input, and stripped of control
//! and bidirectional-override characters, so it cannot forge line breaks, terminal escapes or
//! reorder what surrounds it (`docs/protocol.md#quoting-peer-text`).

/// The most bytes of peer text quoted.
pub const MAX_QUOTED_BYTES: usize = 128;

/// `text` without control or bidirectional-formatting characters, cut to at most
/// [`MAX_QUOTED_BYTES`] on a character boundary.
pub fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_QUOTED_BYTES));
    for c in text.chars().filter(|&c| !hidden(c)) {
        if out.len() + c.len_utf8() > MAX_QUOTED_BYTES {
            break;
        }
        out.push(c);
    }
    out
}

/// Characters that change how the text around them reads rather than showing themselves.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_megabyte_of_peer_text_is_quoted_in_a_bounded_line() {
        let huge = "é".repeat(512 * 1024);
        let q = quoted(&huge);
        assert!(q.len() <= MAX_QUOTED_BYTES);
        assert_eq!(q, "é".repeat(MAX_QUOTED_BYTES / 2));
    }

    #[test]
    fn peer_text_cannot_forge_lines_escapes_or_reorder_a_diagnostic() {
        let forged = "bad token\n2026-01-01 ERROR fake line\r\u{1b}[31mred\u{7}\u{202E}txet";
        assert_eq!(
            quoted(forged),
            "bad token2026-01-01 ERROR fake line[31mredtxet"
        );
        assert_eq!(quoted("plain reason"), "plain reason");
    }
}
