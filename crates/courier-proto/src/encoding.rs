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
}
