//! Address proofs: the relay declaration (`docs/protocol.md#address-declaration`, its bytes in
//! `docs/protocol.md#proof-bytes`) and the gateway attach (`docs/protocol.md#gateway-attach`). Both
//! sign `domain ‖ u32be(len s) ‖ s ‖ challenge(32)`, over the relay-resolved account name and over
//! the device's own address respectively, each under its own domain so a proof harvested by one
//! kind of peer never replays against the other.

use crate::address::Address;
use crate::encoding::b64_decode_fixed;
use crate::frame::ClientFrame;
use crate::identity_key::{decode_public_key, decode_signature, verify_strict, IdentityKey};
use crate::limits::CAP_ADDRESS_ROUTING;
use crate::signing::{push_field, DOMAIN_GATEWAY_ADDR_V1, DOMAIN_RELAY_ADDR_V1};

/// Bytes of an address challenge (relay `address_challenge`, gateway `Challenge.challenge`).
pub const CHALLENGE_LEN: usize = 32;

/// `"offline-relay-addr-v1" ‖ u32be(len account) ‖ account ‖ challenge`: the account's UTF-8
/// bytes counted in bytes, the challenge appended without a length prefix.
pub fn relay_proof_payload(account: &str, challenge: &[u8; CHALLENGE_LEN]) -> Vec<u8> {
    proof_payload(DOMAIN_RELAY_ADDR_V1, account, challenge)
}

/// `"offline-gateway-addr-v1" ‖ u32be(len address) ‖ address ‖ challenge`, over the canonical
/// address string.
pub fn gateway_proof_payload(address: &Address, challenge: &[u8; CHALLENGE_LEN]) -> Vec<u8> {
    proof_payload(DOMAIN_GATEWAY_ADDR_V1, &address.to_string(), challenge)
}

fn proof_payload(domain: &str, subject: &str, challenge: &[u8; CHALLENGE_LEN]) -> Vec<u8> {
    let mut out = Vec::with_capacity(domain.len() + 4 + subject.len() + CHALLENGE_LEN);
    out.extend_from_slice(domain.as_bytes());
    push_field(&mut out, subject.as_bytes());
    out.extend_from_slice(challenge);
    out
}

/// Decodes a challenge as sent on the wire: base64 of exactly 32 bytes.
pub fn decode_challenge(b64: &str) -> Option<[u8; CHALLENGE_LEN]> {
    b64_decode_fixed(b64)
}

/// Why a client does not declare its address on a connection
/// (`docs/protocol.md#client-declaration`): each is a silent skip with this one diagnostic reason.
/// The last three are for the client's own steps (loading the key, signing, writing the frame);
/// nothing in this crate returns them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DeclareError {
    #[error("capability_absent")]
    CapabilityAbsent,
    #[error("challenge_absent")]
    ChallengeAbsent,
    #[error("challenge_malformed")]
    ChallengeMalformed,
    #[error("account_absent")]
    AccountAbsent,
    #[error("address_unavailable")]
    AddressUnavailable,
    #[error("signing_failed")]
    SigningFailed,
    #[error("frame_unserializable")]
    FrameUnserializable,
}

impl DeclareError {
    /// The diagnostic reason, as `docs/protocol.md#client-declaration` spells it.
    pub fn reason(self) -> &'static str {
        match self {
            Self::CapabilityAbsent => "capability_absent",
            Self::ChallengeAbsent => "challenge_absent",
            Self::ChallengeMalformed => "challenge_malformed",
            Self::AccountAbsent => "account_absent",
            Self::AddressUnavailable => "address_unavailable",
            Self::SigningFailed => "signing_failed",
            Self::FrameUnserializable => "frame_unserializable",
        }
    }
}

/// The complete `DeclareAddress` for one connection. `account` is `Authenticated.username` (never
/// a local substitute) and `challenge_b64` its `address_challenge`; absent or empty account,
/// absent challenge, or a challenge that is not base64 of exactly 32 bytes is refused with its
/// gate reason.
pub fn declare_address_frame(
    key: &IdentityKey,
    account: Option<&str>,
    challenge_b64: Option<&str>,
) -> Result<ClientFrame, DeclareError> {
    let challenge_b64 = challenge_b64.ok_or(DeclareError::ChallengeAbsent)?;
    let challenge = decode_challenge(challenge_b64).ok_or(DeclareError::ChallengeMalformed)?;
    let account = account
        .filter(|a| !a.is_empty())
        .ok_or(DeclareError::AccountAbsent)?;
    Ok(ClientFrame::DeclareAddress {
        address: key.address().to_string(),
        public_key: key.public_key_base64(),
        signature: key.sign_base64(&relay_proof_payload(account, &challenge)),
    })
}

/// The whole client gate (`docs/protocol.md#client-declaration`) over the fields of one
/// `Authenticated`: the relay must advertise `address_routing_v1` (compared byte for byte), then as
/// [`declare_address_frame`].
pub fn declare_address_after_auth(
    key: &IdentityKey,
    capabilities: &[String],
    account: Option<&str>,
    challenge_b64: Option<&str>,
) -> Result<ClientFrame, DeclareError> {
    if !capabilities.iter().any(|c| c == CAP_ADDRESS_ROUTING) {
        return Err(DeclareError::CapabilityAbsent);
    }
    declare_address_frame(key, account, challenge_b64)
}

/// Why a peer refuses a declaration; `reason()` is the `AddressError.reason` the relay sends
/// (`docs/protocol.md#errors-and-reasons`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AddressDeclError {
    /// Key not 32 bytes, signature not 64 bytes, or address not canonical.
    #[error("malformed")]
    Malformed,
    /// The key does not derive the declared address.
    #[error("address_key_mismatch")]
    AddressKeyMismatch,
    /// The signature does not verify strictly over this connection's proof bytes.
    #[error("bad_signature")]
    BadSignature,
    /// A second declaration on one connection; the relay tracks this itself, the verifiers here
    /// never return it.
    #[error("already_declared")]
    AlreadyDeclared,
    /// Gateway only: the declared address is not the one `Identify.device_id` named.
    #[error("device_id_mismatch")]
    DeviceIdMismatch,
}

impl AddressDeclError {
    pub fn reason(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::AddressKeyMismatch => "address_key_mismatch",
            Self::BadSignature => "bad_signature",
            Self::AlreadyDeclared => "already_declared",
            Self::DeviceIdMismatch => "device_id_mismatch",
        }
    }
}

/// The relay's checks 1–3 of `docs/protocol.md#relay-checks`, in order, for a `DeclareAddress` read
/// on a connection authenticated as `account` that was sent `challenge`. Returns the address to
/// bind. Refusing a second declaration (step 4) is the caller's.
pub fn verify_declaration(
    account: &str,
    challenge: &[u8; CHALLENGE_LEN],
    address: &str,
    public_key_b64: &str,
    signature_b64: &str,
) -> Result<Address, AddressDeclError> {
    verify_proof(address, public_key_b64, signature_b64, |_| {
        relay_proof_payload(account, challenge)
    })
}

/// The gateway's checks before `AddressDeclared` (`docs/protocol.md#gateway-attach`): the relay's
/// three, over the gateway proof bytes with the challenge minted for this connection, then the
/// address must be the `Identify.device_id`. That the challenge was never accepted before is the
/// caller's.
pub fn verify_gateway_declaration(
    device_id: &str,
    challenge: &[u8; CHALLENGE_LEN],
    address: &str,
    public_key_b64: &str,
    signature_b64: &str,
) -> Result<Address, AddressDeclError> {
    let bound = verify_proof(address, public_key_b64, signature_b64, |a| {
        gateway_proof_payload(a, challenge)
    })?;
    if device_id != address {
        return Err(AddressDeclError::DeviceIdMismatch);
    }
    Ok(bound)
}

fn verify_proof(
    address: &str,
    public_key_b64: &str,
    signature_b64: &str,
    proof: impl FnOnce(&Address) -> Vec<u8>,
) -> Result<Address, AddressDeclError> {
    let (Some(public_key), Some(signature), Ok(declared)) = (
        decode_public_key(public_key_b64),
        decode_signature(signature_b64),
        Address::parse(address),
    ) else {
        return Err(AddressDeclError::Malformed);
    };
    if Address::from_public_key(&public_key) != declared {
        return Err(AddressDeclError::AddressKeyMismatch);
    }
    if !verify_strict(&public_key, &proof(&declared), &signature) {
        return Err(AddressDeclError::BadSignature);
    }
    Ok(declared)
}

/// What a device sends in the gateway `DeclareAddress` line (`docs/protocol.md#gateway-attach`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayDeclaration {
    pub address: String,
    pub public_key: String,
    pub signature: String,
}

/// The device's gateway declaration for the 32-byte challenge the gateway sent.
pub fn gateway_declaration(
    key: &IdentityKey,
    challenge: &[u8; CHALLENGE_LEN],
) -> GatewayDeclaration {
    let address = key.address();
    GatewayDeclaration {
        address: address.to_string(),
        public_key: key.public_key_base64(),
        signature: key.sign_base64(&gateway_proof_payload(&address, challenge)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoding::b64_encode;
    use crate::identity_key::tests::{hex, k1};

    fn seq_challenge() -> [u8; 32] {
        std::array::from_fn(|i| i as u8)
    }

    const K1_ADDRESS: &str = "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn";
    const K1_PK: &str = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
    const K1_ALICE_SIG: &str =
        "YdIY8ZLo3zcDLOKUtxQQw/IT8h0Y6x6lxlLV3RFBK/eJbrMs1e3/WFUppT3XF9T2gdhdLXvUolPquQbL4cVJAg==";
    const SEQ_CHALLENGE_B64: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    #[test]
    fn relay_proof_vectors() {
        assert_eq!(
            relay_proof_payload("alice", &seq_challenge()),
            hex(
                "6f66666c696e652d72656c61792d616464722d7631 00000005 616c696365
                 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
            )
        );
        let zoe = relay_proof_payload("zoë", &seq_challenge());
        let domain_len = DOMAIN_RELAY_ADDR_V1.len();
        assert_eq!(
            zoe[domain_len..domain_len + 8],
            hex("00000004 7a6fc3ab")[..]
        );
        assert_eq!(zoe.len(), domain_len + 4 + 4 + 32);
        // Never the bare challenge.
        assert_ne!(relay_proof_payload("", &seq_challenge()), seq_challenge());
    }

    #[test]
    fn k1_declare_address_frame_vector() {
        assert_eq!(decode_challenge(SEQ_CHALLENGE_B64), Some(seq_challenge()));
        let frame = declare_address_frame(&k1(), Some("alice"), Some(SEQ_CHALLENGE_B64)).unwrap();
        assert_eq!(
            frame,
            ClientFrame::DeclareAddress {
                address: K1_ADDRESS.into(),
                public_key: K1_PK.into(),
                signature: K1_ALICE_SIG.into(),
            }
        );
        assert_eq!(
            frame.encode(),
            format!(
                r#"{{"type":"DeclareAddress","address":"{K1_ADDRESS}","public_key":"{K1_PK}","signature":"{K1_ALICE_SIG}"}}"#
            )
        );
        // The relay side accepts the very same frame.
        assert_eq!(
            verify_declaration("alice", &seq_challenge(), K1_ADDRESS, K1_PK, K1_ALICE_SIG),
            Ok(k1().address())
        );
    }

    #[test]
    fn client_gate_reasons() {
        let k = k1();
        let caps = vec!["mailbox_v1".to_owned(), CAP_ADDRESS_ROUTING.to_owned()];
        let ok = Some(SEQ_CHALLENGE_B64);
        assert!(declare_address_after_auth(&k, &caps, Some("alice"), ok).is_ok());
        for (caps, account, challenge, error) in [
            (vec![], Some("alice"), ok, DeclareError::CapabilityAbsent),
            (
                vec!["ADDRESS_ROUTING_V1".to_owned()],
                Some("alice"),
                ok,
                DeclareError::CapabilityAbsent,
            ),
            (
                caps.clone(),
                Some("alice"),
                None,
                DeclareError::ChallengeAbsent,
            ),
            (
                caps.clone(),
                Some("alice"),
                Some(""),
                DeclareError::ChallengeMalformed,
            ),
            (
                caps.clone(),
                Some("alice"),
                Some("AAEC"),
                DeclareError::ChallengeMalformed,
            ),
            (
                caps.clone(),
                Some("alice"),
                Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"),
                DeclareError::ChallengeMalformed,
            ),
            (
                caps.clone(),
                Some("alice"),
                Some("!!"),
                DeclareError::ChallengeMalformed,
            ),
            (caps.clone(), None, ok, DeclareError::AccountAbsent),
            (caps.clone(), Some(""), ok, DeclareError::AccountAbsent),
        ] {
            assert_eq!(
                declare_address_after_auth(&k, &caps, account, challenge),
                Err(error)
            );
        }
        let long = b64_encode(&[0u8; 33]);
        assert_eq!(
            declare_address_frame(&k, Some("alice"), Some(&long)),
            Err(DeclareError::ChallengeMalformed)
        );
        assert_eq!(DeclareError::AccountAbsent.reason(), "account_absent");
        assert_eq!(
            DeclareError::ChallengeAbsent.to_string(),
            "challenge_absent"
        );
    }

    #[test]
    fn relay_refusals() {
        let k = k1();
        let c = seq_challenge();
        let other = IdentityKey::from_seed([9; 32]);
        use AddressDeclError::*;
        let check = |account: &str, address: &str, pk: &str, sig: &str| {
            verify_declaration(account, &c, address, pk, sig)
        };
        // Step 1: malformed.
        assert_eq!(
            check("alice", K1_ADDRESS, &K1_PK[..43], K1_ALICE_SIG),
            Err(Malformed)
        );
        assert_eq!(
            check("alice", K1_ADDRESS, &b64_encode(&[1; 33]), K1_ALICE_SIG),
            Err(Malformed)
        );
        assert_eq!(
            check("alice", K1_ADDRESS, K1_PK, &b64_encode(&[1; 63])),
            Err(Malformed)
        );
        assert_eq!(check("alice", K1_ADDRESS, K1_PK, "bad"), Err(Malformed));
        assert_eq!(
            check("alice", &K1_ADDRESS.to_uppercase(), K1_PK, K1_ALICE_SIG),
            Err(Malformed)
        );
        assert_eq!(check("alice", "alice", K1_PK, K1_ALICE_SIG), Err(Malformed));
        // Step 2: the key does not derive the address.
        assert_eq!(
            check(
                "alice",
                K1_ADDRESS,
                &other.public_key_base64(),
                K1_ALICE_SIG
            ),
            Err(AddressKeyMismatch)
        );
        assert_eq!(
            check("alice", &other.address().to_string(), K1_PK, K1_ALICE_SIG),
            Err(AddressKeyMismatch)
        );
        // Step 3: another account, the bare challenge, another challenge, another key.
        assert_eq!(
            check("bob", K1_ADDRESS, K1_PK, K1_ALICE_SIG),
            Err(BadSignature)
        );
        let bare = k.sign_base64(&c);
        assert_eq!(check("alice", K1_ADDRESS, K1_PK, &bare), Err(BadSignature));
        assert_eq!(
            verify_declaration("alice", &[0; 32], K1_ADDRESS, K1_PK, K1_ALICE_SIG),
            Err(BadSignature)
        );
        let by_other = other.sign_base64(&relay_proof_payload("alice", &c));
        assert_eq!(
            check("alice", K1_ADDRESS, K1_PK, &by_other),
            Err(BadSignature)
        );
        // A gateway proof never passes as a relay proof (and the other way round).
        let gw = gateway_declaration(&k, &c);
        assert_eq!(
            check(K1_ADDRESS, K1_ADDRESS, K1_PK, &gw.signature),
            Err(BadSignature)
        );
        assert_eq!(
            verify_gateway_declaration(K1_ADDRESS, &c, K1_ADDRESS, K1_PK, K1_ALICE_SIG),
            Err(BadSignature)
        );
        assert_eq!(AddressKeyMismatch.reason(), "address_key_mismatch");
        assert_eq!(AlreadyDeclared.reason(), "already_declared");
    }

    #[test]
    fn gateway_proof_vector() {
        let c = seq_challenge();
        let mut expected = hex("6f66666c696e652d676174657761792d616464722d7631 0000002c");
        expected.extend_from_slice(K1_ADDRESS.as_bytes());
        expected.extend_from_slice(&c);
        assert_eq!(gateway_proof_payload(&k1().address(), &c), expected);
        let d = gateway_declaration(&k1(), &c);
        assert_eq!(
            d.signature,
            "8waOMgghTC6I7ByeboeoNp1lTbUUFsp4yPjVxVeVMZlY7JZoQ/sKEhVGIgFcy6yZEZx1V4uHVmJphHUOCKOfDw=="
        );
        assert_eq!(d.address, K1_ADDRESS);
        assert_eq!(d.public_key, K1_PK);
        assert_eq!(
            verify_gateway_declaration(K1_ADDRESS, &c, &d.address, &d.public_key, &d.signature),
            Ok(k1().address())
        );
        let other = IdentityKey::from_seed([3; 32]).address().to_string();
        assert_eq!(
            verify_gateway_declaration(&other, &c, &d.address, &d.public_key, &d.signature),
            Err(AddressDeclError::DeviceIdMismatch)
        );
        assert_eq!(
            verify_gateway_declaration(
                K1_ADDRESS,
                &[1; 32],
                &d.address,
                &d.public_key,
                &d.signature
            ),
            Err(AddressDeclError::BadSignature)
        );
    }
}
