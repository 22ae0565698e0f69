//! Control-frame signatures (`docs/protocol.md#control-signatures`).
//!
//! A Message whose `content` starts with a reserved internal prefix is a control frame and must be
//! signed by the key its `sender` address derives from, except the data-plane prefixes, which are
//! authenticated by decryption. We emit `offline-ctrl-v2` (it signs a timestamp, so a receiver can
//! refuse stale frames) and verify the published `offline-ctrl-v1` only when asked to.

use crate::address::Address;
use crate::encoding::b64_encode;
use crate::identity_key::{decode_public_key, decode_signature, verify_strict, IdentityKey};
use crate::limits::RESERVED_PREFIXES;
use crate::message::Message;
use crate::security;
use crate::signing::{payload, push_field, DOMAIN_CTRL_V1, DOMAIN_CTRL_V2};

/// Metadata key: base64 signature.
pub const META_CTRL_SIG: &str = "__ctrl_sig";
/// Metadata key: base64 public key.
pub const META_CTRL_PK: &str = "__ctrl_pk";
/// Metadata key \[ext\]: `signed_at`, ms, in canonical decimal.
pub const META_CTRL_TS: &str = "__ctrl_ts";

/// Reserved prefixes that are data plane, not control: never signature-gated. Any other reserved
/// prefix, including one added later, is gated.
pub const DATA_PLANE_PREFIXES: &[&str] = &["__MLS_ENC__", "__MLS_GROUP__", "__GROUP_MSG__"];

/// Oldest `signed_at` a receiver accepts: 30 days before its clock.
pub const CONTROL_MAX_AGE_MS: u64 = 2_592_000_000;
/// Furthest `signed_at` a receiver accepts ahead of its clock: 24 h of skew.
pub const CONTROL_MAX_FUTURE_SKEW_MS: u64 = 86_400_000;
/// How long after processing a verified control frame a receiver keeps its dedup key, whatever
/// else it processes meanwhile: a frame signed up to 24 h ahead of the clock stays fresh, and so
/// replayable, until 30 days after it was signed (`docs/delivery.md#control-frames`).
pub const CONTROL_REPLAY_WINDOW_MS: u64 = CONTROL_MAX_AGE_MS + CONTROL_MAX_FUTURE_SKEW_MS;

/// Whether a Message with this content must carry a valid control signature. Application text and
/// end-to-end ACKs (empty content) are not gated.
pub fn is_signature_gated(content: &str) -> bool {
    RESERVED_PREFIXES.iter().any(|p| content.starts_with(p))
        && !DATA_PLANE_PREFIXES.iter().any(|p| content.starts_with(p))
}

/// Why a control frame is refused; `code()` is its `security_warning` reason code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("control frame is not signed")]
    Unsigned,
    #[error("control signature is invalid")]
    Invalid,
    #[error("control signature key does not derive the sender address")]
    SenderMismatch,
    #[error("control signature is outside the freshness window")]
    Stale,
}

impl ControlError {
    pub fn code(self) -> &'static str {
        match self {
            Self::Unsigned => security::UNSIGNED_CONTROL_REJECTED,
            Self::Invalid => security::CONTROL_SIGNATURE_INVALID,
            Self::SenderMismatch => security::SENDER_ADDRESS_MISMATCH,
            Self::Stale => security::CONTROL_SIGNATURE_STALE,
        }
    }
}

/// `"offline-ctrl-v1" ‖ u32be|sender ‖ u32be|id ‖ u32be|recipient ‖ u32be|content`.
pub fn control_v1_payload(message: &Message) -> Vec<u8> {
    payload(DOMAIN_CTRL_V1, &signed_fields(message))
}

/// The v1 layout under `offline-ctrl-v2`, then `00000008 ‖ u64be(signed_at_ms)`.
pub fn control_v2_payload(message: &Message, signed_at_ms: u64) -> Vec<u8> {
    let mut out = payload(DOMAIN_CTRL_V2, &signed_fields(message));
    push_field(&mut out, &signed_at_ms.to_be_bytes());
    out
}

fn signed_fields(m: &Message) -> [&[u8]; 4] {
    [
        m.sender.as_bytes(),
        m.id.as_bytes(),
        m.recipient.as_bytes(),
        m.content.as_bytes(),
    ]
}

/// Hops a control frame may travel, like any message the engine sends.
const CONTROL_FRAME_TTL: u8 = 10;

/// The unsigned control frame `id` of app `app_id` from `sender` to `recipient` with `content`,
/// made at `at`, as the engine would build it from the same send: the fields a control signature
/// covers are the ones the engine puts on the wire.
pub fn control_frame(
    id: String,
    app_id: &str,
    sender: &str,
    recipient: &str,
    content: String,
    at: u64,
) -> Message {
    Message {
        id,
        sender: sender.to_owned(),
        recipient: recipient.to_owned(),
        app_id: app_id.to_owned(),
        priority: crate::Priority::High,
        ttl: CONTROL_FRAME_TTL,
        hop_count: 0,
        timestamp: at,
        lamport_clock: 0,
        content_type: crate::ContentType::Text,
        content,
        metadata: std::collections::BTreeMap::new(),
        requires_ack: true,
        reply_to_msg: None,
        rich: None,
        binary_content: None,
        media_metadata: None,
        forwarded_from: None,
        reply_context: None,
        encrypted: None,
    }
}

/// Signs `message` with `offline-ctrl-v2` at `signed_at_ms` (the sender's wall clock at first
/// dispatch), setting `__ctrl_sig`, `__ctrl_pk` and `__ctrl_ts`. The message's `sender` must be
/// `key`'s address for a receiver to accept it. A retransmission keeps the original three keys:
/// call this once per message, never again on retry.
pub fn sign_control(message: &mut Message, key: &IdentityKey, signed_at_ms: u64) {
    let signature = key.sign(&control_v2_payload(message, signed_at_ms));
    let metadata = &mut message.metadata;
    metadata.insert(META_CTRL_SIG.to_owned(), b64_encode(&signature));
    metadata.insert(META_CTRL_PK.to_owned(), key.public_key_base64());
    metadata.insert(META_CTRL_TS.to_owned(), signed_at_ms.to_string());
}

/// Verifies a received control frame (`docs/protocol.md#control-signatures`, verification steps 1–5
/// in order). `now_ms` is the receiver's wall clock; `accept_legacy_v1` is the profile's
/// `acceptLegacyControlV1`.
pub fn verify_control(
    message: &Message,
    now_ms: u64,
    accept_legacy_v1: bool,
) -> Result<(), ControlError> {
    let meta = &message.metadata;
    let sig = meta.get(META_CTRL_SIG);
    let pk = meta.get(META_CTRL_PK);
    let ts = meta.get(META_CTRL_TS);
    // Steps 1 and 2: which signature, if any, the key set announces.
    let (sig, pk, signed_at) = match (sig, pk, ts) {
        (None, None, None) => return Err(ControlError::Unsigned),
        (Some(sig), Some(pk), Some(ts)) => {
            let signed_at = parse_signed_at(ts).ok_or(ControlError::Invalid)?;
            (sig, pk, Some(signed_at))
        }
        (Some(sig), Some(pk), None) if accept_legacy_v1 => (sig, pk, None),
        (Some(_), Some(_), None) => return Err(ControlError::Stale),
        _ => return Err(ControlError::Invalid),
    };
    let public_key = decode_public_key(pk).ok_or(ControlError::Invalid)?;
    let signature = decode_signature(sig).ok_or(ControlError::Invalid)?;
    // Step 3: rebuild the payload from the frame as received; strict verification.
    let signed = match signed_at {
        Some(t) => control_v2_payload(message, t),
        None => control_v1_payload(message),
    };
    if !verify_strict(&public_key, &signed, &signature) {
        return Err(ControlError::Invalid);
    }
    // Step 4: the key must derive the claimed sender.
    match Address::parse(&message.sender) {
        Ok(sender) if sender == Address::from_public_key(&public_key) => {}
        _ => return Err(ControlError::SenderMismatch),
    }
    // Step 5: v2 freshness.
    if let Some(signed_at) = signed_at {
        let too_old = now_ms.saturating_sub(signed_at) > CONTROL_MAX_AGE_MS;
        let too_new = signed_at.saturating_sub(now_ms) > CONTROL_MAX_FUTURE_SKEW_MS;
        if too_old || too_new {
            return Err(ControlError::Stale);
        }
    }
    Ok(())
}

/// `__ctrl_ts` as a number: ASCII digits only, no sign, no leading zero unless `0`, within u64.
fn parse_signed_at(s: &str) -> Option<u64> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if !canonical {
        return None;
    }
    s.parse().ok()
}

/// The `signed_at` of a message this engine signed, if it carries a well-formed `__ctrl_ts`.
pub fn control_signed_at(message: &Message) -> Option<u64> {
    message
        .metadata
        .get(META_CTRL_TS)
        .and_then(|t| parse_signed_at(t))
}

/// Whether a signed control frame has aged out of the receivers' window
/// (`docs/protocol.md#control-signatures`, v2 freshness): the engine settles it as failed ("Control
/// signature expired") instead of transmitting it once `now − signed_at ≥ 30 d`.
pub fn control_signature_expired(message: &Message, now_ms: u64) -> bool {
    control_signed_at(message)
        .is_some_and(|signed_at| now_ms.saturating_sub(signed_at) >= CONTROL_MAX_AGE_MS)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use sha2::{Digest, Sha256};

    use super::*;
    use crate::identity_key::tests::{hex, k1};
    use crate::message::{ContentType, Priority};

    const SIGNED_AT: u64 = 1_767_225_600_000;
    const V1_SIG: &str =
        "pTmkXN9IZEhJm0I1tsgh//yJVDhlcduqxdxjYMi2roymBPri0gu5xnMZqYVvS93PliZ1GFw82U5J4fgOLQb3AA==";
    const V2_SIG: &str =
        "4UEV+30CbH1nEuaLtNsDJV05FMwMtnURd+/hwcyl3YPqyTO3XLlrJ8PGvrrMZ998EesVEbjwOCFFP2gitAh8Dg==";
    const DAY: u64 = 86_400_000;

    fn vector_message() -> Message {
        Message {
            id: "00000000-0000-4000-8000-000000000001".into(),
            sender: k1().address().to_string(),
            recipient: "off1qyqqzqsrqszsvpcgpy9qkrqdpc83qygjzvpgkpr5".into(),
            app_id: "chat".into(),
            priority: Priority::High,
            ttl: 8,
            hop_count: 0,
            timestamp: SIGNED_AT,
            lamport_clock: 1,
            content_type: ContentType::Text,
            content: "__CONN_REQ__{}".into(),
            metadata: BTreeMap::new(),
            requires_ack: true,
            reply_to_msg: None,
            rich: None,
            binary_content: None,
            media_metadata: None,
            forwarded_from: None,
            reply_context: None,
            encrypted: None,
        }
    }

    fn signed() -> Message {
        let mut m = vector_message();
        sign_control(&mut m, &k1(), SIGNED_AT);
        m
    }

    fn v1_signed() -> Message {
        let mut m = vector_message();
        m.metadata.insert(META_CTRL_SIG.into(), V1_SIG.into());
        m.metadata
            .insert(META_CTRL_PK.into(), k1().public_key_base64());
        m
    }

    fn sha256_hex(bytes: &[u8]) -> String {
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    #[test]
    fn v1_vectors() {
        let p = control_v1_payload(&vector_message());
        assert_eq!(p.len(), 169);
        assert_eq!(
            sha256_hex(&p),
            "97d7b9f503d804a8c141879076526f723a51fe286f2eccf0a87fc1b611f4b070"
        );
        assert_eq!(b64_encode(&k1().sign(&p)), V1_SIG);
    }

    #[test]
    fn v2_vectors() {
        let m = vector_message();
        let p = control_v2_payload(&m, SIGNED_AT);
        assert_eq!(p.len(), 181);
        assert_eq!(p[169..], hex("00000008 0000019b76daa800")[..]);
        assert_eq!(p[..15], *DOMAIN_CTRL_V2.as_bytes());
        assert_eq!(p[15..169], control_v1_payload(&m)[15..]);
        assert_eq!(
            sha256_hex(&p),
            "9007bce8655b3aeb71922f9cdc2d501e6e339af374c824bbfc60365a3bebdce4"
        );
        let s = signed();
        assert_eq!(s.metadata[META_CTRL_SIG], V2_SIG);
        assert_eq!(
            s.metadata[META_CTRL_PK],
            "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="
        );
        assert_eq!(s.metadata[META_CTRL_TS], "1767225600000");
    }

    #[test]
    fn gating_is_an_exclusion_list() {
        for gated in [
            "__CONN_REQ__{}",
            "__CTRL_x",
            "__GRP_x",
            "__GROUP_INVITE__",
            "__MLS_WELCOME__",
            "__FILE_x",
            "__ACK_x",
            "__USER_GROUPS__",
        ] {
            assert!(is_signature_gated(gated), "{gated}");
        }
        for open in [
            "",
            "hello",
            "__MLS_ENC__abc",
            "__GROUP_MSG__x",
            "__MLS_GROUP__x",
            "_CONN_",
            "x__CONN_",
        ] {
            assert!(!is_signature_gated(open), "{open}");
        }
        // Every data-plane exclusion is itself reserved: the exclusion list only narrows.
        for p in DATA_PLANE_PREFIXES {
            assert!(crate::limits::is_reserved_content(p));
        }
    }

    #[test]
    fn good_frames_verify_and_survive_the_wire() {
        let m = signed();
        assert_eq!(verify_control(&m, SIGNED_AT, false), Ok(()));
        // Carriers rewrite unsigned fields.
        let mut rewritten = Message::decode(&m.encode()).unwrap();
        rewritten.hop_count = 3;
        rewritten.timestamp = 1;
        rewritten.metadata.insert("app_key".into(), "v".into());
        assert_eq!(verify_control(&rewritten, SIGNED_AT + DAY, false), Ok(()));
        // v1 with legacy acceptance on proves no freshness: any clock passes.
        assert_eq!(verify_control(&v1_signed(), u64::MAX, true), Ok(()));
        assert_eq!(verify_control(&v1_signed(), 0, true), Ok(()));
    }

    #[test]
    fn freshness_window_edges() {
        let m = signed();
        assert_eq!(verify_control(&m, SIGNED_AT + 30 * DAY, false), Ok(()));
        assert_eq!(
            verify_control(&m, SIGNED_AT + 30 * DAY + 1, false),
            Err(ControlError::Stale)
        );
        assert_eq!(verify_control(&m, SIGNED_AT - DAY, false), Ok(()));
        assert_eq!(
            verify_control(&m, SIGNED_AT - DAY - 1, false),
            Err(ControlError::Stale)
        );
        assert_eq!(verify_control(&m, 0, false), Err(ControlError::Stale));
        assert_eq!(
            verify_control(&m, u64::MAX, false),
            Err(ControlError::Stale)
        );
        assert_eq!(ControlError::Stale.code(), "CONTROL_SIGNATURE_STALE");

        assert!(!control_signature_expired(&m, SIGNED_AT + 30 * DAY - 1));
        assert!(control_signature_expired(&m, SIGNED_AT + 30 * DAY));
        assert!(!control_signature_expired(&vector_message(), u64::MAX));
        assert_eq!(control_signed_at(&m), Some(SIGNED_AT));
    }

    #[test]
    fn unsigned_and_v1_refusals() {
        let e = verify_control(&vector_message(), SIGNED_AT, true).unwrap_err();
        assert_eq!(e, ControlError::Unsigned);
        assert_eq!(e.code(), "UNSIGNED_CONTROL_REJECTED");
        // v1 refused unless enabled, and refused as stale.
        assert_eq!(
            verify_control(&v1_signed(), SIGNED_AT, false),
            Err(ControlError::Stale)
        );
        // Stripping __ctrl_ts does not downgrade a v2 frame: the v1 domain differs.
        let mut stripped = signed();
        stripped.metadata.remove(META_CTRL_TS);
        assert_eq!(
            verify_control(&stripped, SIGNED_AT, false),
            Err(ControlError::Stale)
        );
        assert_eq!(
            verify_control(&stripped, SIGNED_AT, true),
            Err(ControlError::Invalid)
        );
        // Nor does adding one upgrade a v1 frame.
        let mut upgraded = v1_signed();
        upgraded
            .metadata
            .insert(META_CTRL_TS.into(), SIGNED_AT.to_string());
        assert_eq!(
            verify_control(&upgraded, SIGNED_AT, true),
            Err(ControlError::Invalid)
        );
    }

    #[test]
    fn tampered_fields_are_invalid() {
        let cases: [fn(&mut Message); 6] = [
            |m| m.id.push('2'),
            |m| m.recipient = "off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqn8antf".into(),
            |m| m.content.push(' '),
            |m| {
                m.metadata
                    .insert(META_CTRL_TS.into(), (SIGNED_AT + 1).to_string());
            },
            |m| {
                m.metadata.insert(META_CTRL_SIG.into(), V1_SIG.into());
            },
            |m| {
                m.metadata.insert(
                    META_CTRL_PK.into(),
                    IdentityKey::from_seed([5; 32]).public_key_base64(),
                );
            },
        ];
        for (i, tamper) in cases.iter().enumerate() {
            let mut m = signed();
            tamper(&mut m);
            assert_eq!(
                verify_control(&m, SIGNED_AT, true),
                Err(ControlError::Invalid),
                "case {i}"
            );
        }
        // Changing the sender breaks the signature first (step 3 precedes step 4).
        let mut m = signed();
        m.sender = IdentityKey::from_seed([5; 32]).address().to_string();
        assert_eq!(
            verify_control(&m, SIGNED_AT, false),
            Err(ControlError::Invalid)
        );
    }

    #[test]
    fn key_not_deriving_the_sender_is_a_mismatch() {
        // Validly signed by another key over a sender it does not own.
        let other = IdentityKey::from_seed([5; 32]);
        let mut m = vector_message();
        sign_control(&mut m, &other, SIGNED_AT);
        let e = verify_control(&m, SIGNED_AT, false).unwrap_err();
        assert_eq!(e, ControlError::SenderMismatch);
        assert_eq!(e.code(), "SENDER_ADDRESS_MISMATCH");
        // An account name (or a non-canonical spelling) as sender is a mismatch too.
        for sender in [
            "alice".to_owned(),
            k1().address().to_string().to_uppercase(),
        ] {
            let mut m = vector_message();
            m.sender = sender;
            sign_control(&mut m, &k1(), SIGNED_AT);
            assert_eq!(
                verify_control(&m, SIGNED_AT, false),
                Err(ControlError::SenderMismatch)
            );
        }
    }

    #[test]
    fn malformed_key_sets_and_encodings_are_invalid() {
        let base = signed();
        let sig = base.metadata[META_CTRL_SIG].clone();
        let pk = base.metadata[META_CTRL_PK].clone();
        let ts = base.metadata[META_CTRL_TS].clone();
        let with = |entries: &[(&str, &str)]| {
            let mut m = vector_message();
            for (k, v) in entries {
                m.metadata.insert((*k).into(), (*v).into());
            }
            verify_control(&m, SIGNED_AT, true)
        };
        // Any combination other than {sig, pk, ts} or {sig, pk}.
        for set in [
            vec![(META_CTRL_SIG, sig.as_str())],
            vec![(META_CTRL_PK, pk.as_str())],
            vec![(META_CTRL_TS, ts.as_str())],
            vec![(META_CTRL_SIG, sig.as_str()), (META_CTRL_TS, ts.as_str())],
            vec![(META_CTRL_PK, pk.as_str()), (META_CTRL_TS, ts.as_str())],
        ] {
            assert_eq!(with(&set), Err(ControlError::Invalid), "{set:?}");
        }
        let long_key = b64_encode(&[1u8; 33]);
        let short_sig = b64_encode(&[1u8; 63]);
        let unpadded_sig = sig.trim_end_matches('=').to_owned();
        for (s, p, t) in [
            ("%%%", pk.as_str(), ts.as_str()),
            (sig.as_str(), "not base64!", ts.as_str()),
            (sig.as_str(), long_key.as_str(), ts.as_str()),
            (sig.as_str(), &pk[..40], ts.as_str()),
            (short_sig.as_str(), pk.as_str(), ts.as_str()),
            (unpadded_sig.as_str(), pk.as_str(), ts.as_str()),
            (sig.as_str(), pk.as_str(), ""),
            (sig.as_str(), pk.as_str(), "+1767225600000"),
            (sig.as_str(), pk.as_str(), "01767225600000"),
            (sig.as_str(), pk.as_str(), "1767225600000.0"),
            (sig.as_str(), pk.as_str(), " 1767225600000"),
            (sig.as_str(), pk.as_str(), "-1"),
            (sig.as_str(), pk.as_str(), "18446744073709551616"),
            (sig.as_str(), pk.as_str(), "１"),
        ] {
            assert_eq!(
                with(&[(META_CTRL_SIG, s), (META_CTRL_PK, p), (META_CTRL_TS, t)]),
                Err(ControlError::Invalid),
                "{s} {p} {t}"
            );
        }
        assert_eq!(parse_signed_at("0"), Some(0));
        assert_eq!(parse_signed_at("00"), None);
        assert_eq!(parse_signed_at("18446744073709551615"), Some(u64::MAX));
        assert_eq!(ControlError::Invalid.code(), "CONTROL_SIGNATURE_INVALID");
    }

    #[test]
    fn signing_at_zero_and_max_round_trips() {
        for t in [0, u64::MAX] {
            let mut m = vector_message();
            sign_control(&mut m, &k1(), t);
            assert_eq!(verify_control(&m, t, false), Ok(()));
        }
    }
}
