//! The Ed25519 identity key (`docs/protocol.md#identity-key`): it derives the address, signs
//! control frames and both address proofs. Pure Ed25519 (RFC 8032, no prehash, no context),
//! verified strictly.

use std::fmt;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use rand_core::{OsRng, RngCore};
use zeroize::Zeroize;

use crate::address::Address;
use crate::encoding::{b64_decode_fixed, b64_encode};

pub const SEED_LEN: usize = 32;
pub const PUBLIC_KEY_LEN: usize = 32;
pub const SIGNATURE_LEN: usize = 64;

/// A profile's identity key. The secret is wiped from memory when the key is dropped; `Debug`
/// shows only the address.
#[derive(Clone)]
pub struct IdentityKey {
    signing: SigningKey,
}

/// The operating system's random source could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the operating system's random source failed: {0}")]
pub struct KeyGenError(String);

impl IdentityKey {
    /// A fresh key from the OS CSPRNG. Fails instead of panicking when the OS refuses randomness.
    pub fn generate() -> Result<Self, KeyGenError> {
        let mut seed = [0u8; SEED_LEN];
        OsRng
            .try_fill_bytes(&mut seed)
            .map_err(|e| KeyGenError(e.to_string()))?;
        let key = Self::from_seed(seed);
        seed.zeroize();
        Ok(key)
    }

    /// The key a persisted 32-byte seed stands for (RFC 8032 private key).
    pub fn from_seed(seed: [u8; SEED_LEN]) -> Self {
        let mut seed = seed;
        let signing = SigningKey::from_bytes(&seed);
        seed.zeroize();
        Self { signing }
    }

    /// The 32-byte seed, for the store to seal and persist. The caller owns the copy and should
    /// wipe it once sealed.
    pub fn seed(&self) -> [u8; SEED_LEN] {
        self.signing.to_bytes()
    }

    pub fn public_key(&self) -> [u8; PUBLIC_KEY_LEN] {
        self.signing.verifying_key().to_bytes()
    }

    /// The public key as it travels (`__ctrl_pk`, `public_key`): base64, 44 characters.
    pub fn public_key_base64(&self) -> String {
        b64_encode(&self.public_key())
    }

    pub fn address(&self) -> Address {
        Address::from_public_key(&self.public_key())
    }

    /// Signs `payload` as is (callers build it with [`crate::signing::payload`]).
    pub fn sign(&self, payload: &[u8]) -> [u8; SIGNATURE_LEN] {
        self.signing.sign(payload).to_bytes()
    }

    /// [`Self::sign`], base64-encoded (88 characters).
    pub fn sign_base64(&self, payload: &[u8]) -> String {
        b64_encode(&self.sign(payload))
    }
}

impl fmt::Debug for IdentityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentityKey")
            .field("address", &self.address().to_string())
            .finish_non_exhaustive()
    }
}

/// Strict Ed25519 verification (`docs/protocol.md#identity-key`): refuses S ≥ L, a public key or R
/// of small order (ed25519-dalek's `verify_strict`), and a public key that is not the canonical
/// encoding of its point. Never panics; any bad input is simply `false`.
pub fn verify_strict(
    public_key: &[u8; PUBLIC_KEY_LEN],
    payload: &[u8],
    signature: &[u8; SIGNATURE_LEN],
) -> bool {
    let Ok(key) = VerifyingKey::from_bytes(public_key) else {
        return false;
    };
    if key.to_edwards().compress().to_bytes() != *public_key {
        return false;
    }
    key.verify_strict(payload, &Signature::from_bytes(signature))
        .is_ok()
}

/// Decodes a wire public key: base64 of exactly 32 bytes.
pub fn decode_public_key(b64: &str) -> Option<[u8; PUBLIC_KEY_LEN]> {
    b64_decode_fixed(b64)
}

/// Decodes a wire signature: base64 of exactly 64 bytes.
pub fn decode_signature(b64: &str) -> Option<[u8; SIGNATURE_LEN]> {
    b64_decode_fixed(b64)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    pub(crate) fn k1() -> IdentityKey {
        let seed = hex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60");
        IdentityKey::from_seed(seed.try_into().unwrap())
    }

    #[test]
    fn k1_vector() {
        let k = k1();
        assert_eq!(
            k.public_key().to_vec(),
            hex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
        );
        assert_eq!(
            k.public_key_base64(),
            "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="
        );
        assert_eq!(
            k.address().to_string(),
            "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn"
        );
        assert_eq!(
            IdentityKey::from_seed(k.seed()).public_key(),
            k.public_key()
        );
        // RFC 8032 §7.1 test 1: the empty message.
        assert_eq!(
            k.sign(b"").to_vec(),
            hex(
                "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155\
                 5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
            )
        );
        assert!(format!("{k:?}").contains("off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn"));
        assert!(!format!("{k:?}").contains("9d61"));
    }

    #[test]
    fn generated_keys_differ_and_round_trip() {
        let a = IdentityKey::generate().unwrap();
        let b = IdentityKey::generate().unwrap();
        assert_ne!(a.public_key(), b.public_key());
        let sig = a.sign(b"payload");
        assert!(verify_strict(&a.public_key(), b"payload", &sig));
        assert!(!verify_strict(&b.public_key(), b"payload", &sig));
        assert!(!verify_strict(&a.public_key(), b"payloaD", &sig));
        assert_eq!(IdentityKey::from_seed(a.seed()).address(), a.address());
    }

    #[test]
    fn strict_verification_refuses_malleable_and_weak_inputs() {
        let k = k1();
        let pk = k.public_key();
        let sig = k.sign(b"m");
        assert!(verify_strict(&pk, b"m", &sig));

        // S + L: the same signature in non-canonical form.
        const L: [u8; 32] = [
            0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9,
            0xde, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ];
        let mut malleated = sig;
        let mut carry = 0u16;
        for i in 0..32 {
            let v = malleated[32 + i] as u16 + L[i] as u16 + carry;
            malleated[32 + i] = v as u8;
            carry = v >> 8;
        }
        assert_eq!(carry, 0);
        assert!(!verify_strict(&pk, b"m", &malleated));

        // Small-order public key (the identity point) with a small-order R: a "signature" that
        // lax verification accepts for every message.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let mut forged = [0u8; 64];
        forged[..32].copy_from_slice(&identity);
        assert!(!verify_strict(&identity, b"anything", &forged));
        // Not a point at all, and a non-canonical encoding of a point (y = p + 1 ≡ 1).
        assert!(!verify_strict(&[0xffu8; 32], b"m", &sig));
        let mut non_canonical = [0xffu8; 32];
        non_canonical[0] = 0xee;
        non_canonical[31] = 0x7f;
        assert!(!verify_strict(&non_canonical, b"m", &sig));
        assert!(!verify_strict(&pk, b"m", &[0u8; 64]));
        assert!(!verify_strict(&pk, b"m", &[0xffu8; 64]));
    }

    #[test]
    fn wire_decoding_checks_lengths() {
        let k = k1();
        assert_eq!(
            decode_public_key(&k.public_key_base64()),
            Some(k.public_key())
        );
        assert_eq!(decode_public_key(&k.sign_base64(b"x")), None);
        assert_eq!(decode_signature(&k.public_key_base64()), None);
        assert_eq!(decode_signature(&k.sign_base64(b"x")), Some(k.sign(b"x")));
        assert_eq!(decode_signature("not base64"), None);
    }
}
