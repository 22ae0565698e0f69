//! Canonical signing payloads and the domain registry (`docs/protocol.md#signing-payloads`).
//!
//! `payload(domain, f1 … fn) = domain ‖ u32be(len f1) ‖ f1 ‖ … ‖ u32be(len fn) ‖ fn`. The domain
//! carries no length, so no registered domain may be a prefix of another: a first field could
//! otherwise supply the missing domain bytes and a signature would verify in a context it was never
//! made for. The unit test below enforces it over [`DOMAINS`]; every new domain goes into that list.

/// Published control signature; verified only with legacy acceptance on, never emitted.
pub const DOMAIN_CTRL_V1: &str = "offline-ctrl-v1";
/// Our control signature \[ext\]: adds `signed_at`.
pub const DOMAIN_CTRL_V2: &str = "offline-ctrl-v2";
/// Relay address proof: account, then the 32-byte challenge without length prefix.
pub const DOMAIN_RELAY_ADDR_V1: &str = "offline-relay-addr-v1";
/// Gateway address proof: address, then the 32-byte challenge without length prefix.
pub const DOMAIN_GATEWAY_ADDR_V1: &str = "offline-gateway-addr-v1";
/// Reserved by the published contract; unused, registered so nothing collides.
pub const DOMAIN_DISC_V1: &str = "offline-disc-v1";
/// Reserved by the published contract; unused, registered so nothing collides.
pub const DOMAIN_INVITE_V1: &str = "offline-invite-v1";

/// Every registered domain. While `offline-ctrl-v1` is here there can be no `offline-ctrl-v10`.
pub const DOMAINS: &[&str] = &[
    DOMAIN_CTRL_V1,
    DOMAIN_CTRL_V2,
    DOMAIN_RELAY_ADDR_V1,
    DOMAIN_GATEWAY_ADDR_V1,
    DOMAIN_DISC_V1,
    DOMAIN_INVITE_V1,
];

/// The canonical payload: the domain bytes, then each field behind its u32 big-endian byte length.
///
/// Fields come from frames of at most 1 MiB; one of 4 GiB or more cannot be framed and would
/// make this panic rather than sign an ambiguous length.
pub fn payload(domain: &str, fields: &[&[u8]]) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(domain.len() + fields.iter().map(|f| 4 + f.len()).sum::<usize>());
    out.extend_from_slice(domain.as_bytes());
    for field in fields {
        push_field(&mut out, field);
    }
    out
}

/// Appends `u32be(len field) ‖ field`.
pub(crate) fn push_field(out: &mut Vec<u8>, field: &[u8]) {
    let len = u32::try_from(field.len()).expect("a signed field is shorter than 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(field);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_registered_domain_is_a_prefix_of_another() {
        for (i, a) in DOMAINS.iter().enumerate() {
            for (j, b) in DOMAINS.iter().enumerate() {
                if i != j {
                    assert!(!b.starts_with(a), "{a:?} is a prefix of {b:?}");
                }
            }
        }
        // The check itself would catch the tempting next name.
        assert!("offline-ctrl-v10".starts_with(DOMAIN_CTRL_V1));
    }

    #[test]
    fn registry_lists_each_domain_once() {
        assert_eq!(DOMAINS.len(), 6);
        let mut sorted = DOMAINS.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), DOMAINS.len());
    }

    #[test]
    fn the_documented_example_payload() {
        assert_eq!(
            payload("d", &[b"", b"xy"]),
            [0x64, 0, 0, 0, 0, 0, 0, 0, 2, 0x78, 0x79]
        );
        assert_eq!(payload("d", &[]), b"d");
    }
}
