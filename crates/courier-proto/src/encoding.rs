//! Base64 as the wire uses it: RFC 4648 §4, standard alphabet, padded, canonical.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

pub(crate) fn b64_encode(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// Decodes exactly `N` bytes, or nothing. The length is checked before decoding, so a hostile
/// string costs no allocation; the standard engine refuses missing padding and non-zero trailing
/// bits, so each byte string has exactly one accepted spelling.
pub(crate) fn b64_decode_fixed<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != N.div_ceil(3) * 4 {
        return None;
    }
    let mut out = [0u8; N];
    match STANDARD.decode_slice(s, &mut out) {
        Ok(n) if n == N => Some(out),
        _ => None,
    }
}

/// Decodes at most `max` bytes, or nothing. The length is checked before decoding too, so an
/// over-long string costs no allocation; the spelling must be canonical, as for
/// [`b64_decode_fixed`].
pub(crate) fn b64_decode_at_most(s: &str, max: usize) -> Option<Vec<u8>> {
    if s.len() > max.div_ceil(3) * 4 {
        return None;
    }
    STANDARD.decode(s).ok().filter(|bytes| bytes.len() <= max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_decoding_is_strict() {
        let k = b64_encode(&[7u8; 32]);
        assert_eq!(k.len(), 44);
        assert_eq!(b64_decode_fixed::<32>(&k), Some([7u8; 32]));
        assert_eq!(b64_decode_fixed::<32>(&k[..43]), None);
        assert_eq!(b64_decode_fixed::<64>(&k), None);
        assert_eq!(b64_decode_fixed::<32>(&b64_encode(&[7u8; 31])), None);
        // 32 bytes leave two spare bits in the last character: a non-zero spare bit is refused.
        let mut bad = k.clone().into_bytes();
        bad[42] = b'd'; // 'c' → 'd' sets a trailing bit
        let bad = String::from_utf8(bad).unwrap();
        assert_eq!(b64_decode_fixed::<32>(&bad), None);
        assert_eq!(b64_decode_fixed::<32>(&"*".repeat(44)), None);
        assert_eq!(b64_decode_fixed::<32>("é"), None);
    }

    #[test]
    fn bounded_decoding_is_strict_and_checks_the_length_first() {
        for n in [0, 1, 2, 3, 16] {
            let s = b64_encode(&vec![9u8; n]);
            assert_eq!(b64_decode_at_most(&s, 16), Some(vec![9u8; n]));
        }
        // 17 and 18 bytes take the 24 characters 16 bytes take: refused after decoding.
        assert_eq!(b64_decode_at_most(&b64_encode(&[9u8; 17]), 16), None);
        assert_eq!(b64_decode_at_most(&b64_encode(&[9u8; 18]), 16), None);
        assert_eq!(b64_decode_at_most(&b64_encode(&[9u8; 19]), 16), None);
        assert_eq!(b64_decode_at_most("AAA", 16), None, "padding is required");
        assert_eq!(b64_decode_at_most("AB==", 16), None, "stray trailing bits");
        assert_eq!(b64_decode_at_most("AA-_", 16), None, "URL-safe alphabet");
        assert_eq!(b64_decode_at_most("AA==\n", 16), None);
    }
}
