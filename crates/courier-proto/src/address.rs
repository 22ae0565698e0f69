//! `off1` addresses (`docs/protocol.md#addresses`): bech32m over
//! `0x01 ‖ SHA-256(public key)[0..20]`.
//!
//! Exactly one string names each address. The parser refuses everything a lenient bech32 decoder
//! would also accept (all-uppercase, the bech32 checksum, non-zero padding, over-long data), since
//! two spellings of one address would split every map, set and dedup keyed by the string.

use std::fmt;
use std::str::FromStr;

use bech32::primitives::decode::UncheckedHrpstring;
use bech32::{Bech32, Bech32m, Hrp};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

/// Human-readable part of every address.
pub const ADDRESS_HRP: &str = "off";
/// The only version byte defined.
pub const ADDRESS_VERSION: u8 = 0x01;
/// Bytes of the key hash an address carries.
pub const ADDRESS_HASH_LEN: usize = 20;
/// Length of the canonical rendering: `off`, `1`, 34 data characters, 6 checksum characters.
pub const ADDRESS_STR_LEN: usize = 44;

const HRP: Hrp = Hrp::parse_unchecked(ADDRESS_HRP);
/// BIP-173's bound on a bech32 string; anything longer is refused before decoding.
const MAX_BECH32_LEN: usize = 90;

/// An identity's address: the 20 hash bytes. Equality, ordering and hashing are by those bytes
/// (the rendered strings do not sort like them); `Display` renders the canonical string.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Address([u8; ADDRESS_HASH_LEN]);

/// Why a string is not an address. Each of the six rules of `docs/protocol.md#addresses` has its
/// variant; `Malformed` covers strings that are not bech32 at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("not a bech32 string")]
    Malformed,
    #[error("contains an uppercase character")]
    Uppercase,
    #[error("carries a bech32 checksum, not bech32m")]
    Bech32Checksum,
    #[error("checksum does not verify")]
    BadChecksum,
    #[error("human-readable part is not \"off\"")]
    WrongHrp,
    #[error("unknown address version")]
    WrongVersion,
    #[error("payload is not 21 bytes")]
    WrongLength,
    #[error("not the canonical encoding")]
    NonCanonical,
}

impl Address {
    /// The address a 32-byte Ed25519 public key derives.
    pub fn from_public_key(public_key: &[u8; 32]) -> Self {
        let digest = Sha256::digest(public_key);
        let mut hash = [0u8; ADDRESS_HASH_LEN];
        hash.copy_from_slice(&digest[..ADDRESS_HASH_LEN]);
        Self(hash)
    }

    pub fn from_hash(hash: [u8; ADDRESS_HASH_LEN]) -> Self {
        Self(hash)
    }

    pub fn hash_bytes(&self) -> &[u8; ADDRESS_HASH_LEN] {
        &self.0
    }

    /// The 21 payload bytes: version, then hash.
    fn payload(&self) -> [u8; ADDRESS_HASH_LEN + 1] {
        let mut p = [0u8; ADDRESS_HASH_LEN + 1];
        p[0] = ADDRESS_VERSION;
        p[1..].copy_from_slice(&self.0);
        p
    }

    /// Strict parse: accepts only the canonical lowercase bech32m rendering.
    pub fn parse(s: &str) -> Result<Self, AddressError> {
        if s.len() > MAX_BECH32_LEN {
            return Err(AddressError::Malformed);
        }
        // Rule 1, checked first: the bech32 decoder would accept an all-uppercase string.
        if s.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(AddressError::Uppercase);
        }
        let unchecked = UncheckedHrpstring::new(s).map_err(|_| AddressError::Malformed)?;
        // Rule 2.
        if !unchecked.has_valid_checksum::<Bech32m>() {
            return Err(if unchecked.has_valid_checksum::<Bech32>() {
                AddressError::Bech32Checksum
            } else {
                AddressError::BadChecksum
            });
        }
        // Rule 3.
        if unchecked.hrp() != HRP {
            return Err(AddressError::WrongHrp);
        }
        let checked = unchecked.remove_checksum::<Bech32m>();
        let mut payload = [0u8; ADDRESS_HASH_LEN + 1];
        let mut len = 0usize;
        for byte in checked.byte_iter() {
            if len < payload.len() {
                payload[len] = byte;
            }
            len += 1;
        }
        // Rule 4, then rule 5.
        if len > 0 && payload[0] != ADDRESS_VERSION {
            return Err(AddressError::WrongVersion);
        }
        if len != payload.len() {
            return Err(AddressError::WrongLength);
        }
        let mut hash = [0u8; ADDRESS_HASH_LEN];
        hash.copy_from_slice(&payload[1..]);
        let address = Self(hash);
        // Rule 6: padding bits and over-long data parts vanish in decoding; re-encoding shows them.
        if address.to_string() != s {
            return Err(AddressError::NonCanonical);
        }
        Ok(address)
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        bech32::encode_lower_to_fmt::<Bech32m, _>(f, HRP, &self.payload()).map_err(|_| fmt::Error)
    }
}

impl fmt::Debug for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Address({self})")
    }
}

impl FromStr for Address {
    type Err = AddressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for Address {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Address {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity_key::tests::{hex, k1};

    fn hash(h: &str) -> [u8; 20] {
        hex(h).try_into().unwrap()
    }

    #[test]
    fn derivation_vectors() {
        let k1_address = Address::from_public_key(&k1().public_key());
        assert_eq!(
            k1_address.hash_bytes(),
            &hash("21fe31dfa154a261626bf854046fd2271b7bed4b")
        );
        let mut seq = [0u8; 20];
        for (i, b) in seq.iter_mut().enumerate() {
            *b = i as u8;
        }
        for (address, s) in [
            (k1_address, "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn"),
            (
                Address::from_hash([0; 20]),
                "off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqn8antf",
            ),
            (
                Address::from_hash([0xff; 20]),
                "off1q8llllllllllllllllllllllllllllllluvweh4p",
            ),
            (
                Address::from_hash(seq),
                "off1qyqqzqsrqszsvpcgpy9qkrqdpc83qygjzvpgkpr5",
            ),
        ] {
            assert_eq!(address.to_string(), s);
            assert_eq!(s.len(), ADDRESS_STR_LEN);
            assert_eq!(Address::parse(s), Ok(address));
            assert_eq!(s.parse::<Address>(), Ok(address));
        }
    }

    #[test]
    fn must_reject_vectors() {
        use AddressError::*;
        for (s, error) in [
            ("OFF1QYQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQN8ANTF", Uppercase),
            (
                "off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqxmdlwt",
                Bech32Checksum,
            ),
            ("ofg1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqpxdptr", WrongHrp),
            ("off1qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqkynkkv", WrongVersion),
            ("off1qgqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqquz0u9x", WrongVersion),
            ("off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqxfx3pw", WrongLength),
            (
                "off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqkev2nx",
                WrongLength,
            ),
            ("off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqra5g99k", NonCanonical),
        ] {
            assert_eq!(Address::parse(s), Err(error), "{s}");
        }
    }

    #[test]
    fn other_bad_strings_never_parse() {
        let good = "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn";
        // One mixed-case character.
        assert_eq!(
            Address::parse(&good.replacen('q', "Q", 1)),
            Err(AddressError::Uppercase)
        );
        // A flipped data character breaks the checksum.
        let mut flipped = good.to_owned().into_bytes();
        flipped[10] = if flipped[10] == b'q' { b'p' } else { b'q' };
        assert_eq!(
            Address::parse(std::str::from_utf8(&flipped).unwrap()),
            Err(AddressError::BadChecksum)
        );
        for s in [
            "",
            "off1",
            "off",
            "alice",
            "off1b",
            "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvnë",
            " off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn",
        ] {
            assert!(Address::parse(s).is_err(), "{s:?}");
        }
        assert_eq!(
            Address::parse(&"q".repeat(10_000)),
            Err(AddressError::Malformed)
        );
        // Over-long data part: 35 data characters carry 7 padding bits over 21 bytes. Build one
        // with a valid bech32m checksum and check that only canonicality catches it.
        let hrp = Hrp::parse("off").unwrap();
        let fes: Vec<bech32::Fe32> = "qysluvwl5922yctzd0u9gpr06gn3k7ldfvq"
            .chars()
            .map(|c| bech32::Fe32::from_char(c).unwrap())
            .collect();
        use bech32::primitives::iter::Fe32IterExt;
        let long: String = fes
            .iter()
            .copied()
            .with_checksum::<Bech32m>(&hrp)
            .chars()
            .collect();
        assert_eq!(long.len(), 45);
        assert_eq!(Address::parse(&long), Err(AddressError::NonCanonical));
    }

    #[test]
    fn round_trip_and_single_character_edits() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200 {
            let hash: [u8; 20] = std::array::from_fn(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                (state >> 56) as u8
            });
            let a = Address::from_hash(hash);
            let s = a.to_string();
            assert_eq!(s.len(), ADDRESS_STR_LEN);
            assert_eq!(Address::parse(&s), Ok(a));
        }
        // No one-character substitution, deletion or insertion of a valid address is accepted
        // (bech32m detects them), and none panics.
        let good = "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn";
        let alphabet: Vec<char> = "qpzry9x8gf2tvdw0s3jn54khce6mua7lQPZ1oOb!é"
            .chars()
            .collect();
        for i in 0..good.len() {
            let mut deleted = good.to_owned();
            deleted.remove(i);
            assert!(Address::parse(&deleted).is_err(), "{deleted}");
            for &c in &alphabet {
                let mut edited = good.to_owned();
                edited.replace_range(i..i + 1, c.encode_utf8(&mut [0; 4]));
                if edited != good {
                    assert!(Address::parse(&edited).is_err(), "{edited}");
                }
                let mut inserted = good.to_owned();
                inserted.insert(i, c);
                assert!(Address::parse(&inserted).is_err(), "{inserted}");
            }
        }
    }

    #[test]
    fn ordering_is_by_hash_bytes_and_serde_uses_the_string() {
        let a = Address::from_hash([0; 20]);
        let b = Address::from_hash([0xff; 20]);
        assert!(a < b);
        // The bech32 alphabet puts 'l' (31) before 'q' (0) in ASCII: strings sort the other way.
        assert!(b.to_string() < a.to_string());
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, "\"off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqn8antf\"");
        assert_eq!(serde_json::from_str::<Address>(&json).unwrap(), a);
        assert!(serde_json::from_str::<Address>(
            "\"OFF1QYQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQN8ANTF\""
        )
        .is_err());
    }
}
