//! The gateway side of the attach (`docs/protocol.md#gateway-attach`): what a connection owes
//! before it is bound, and the checks a `DeclareAddress` must pass.

use std::collections::HashSet;
use std::sync::Mutex;

use courier_proto::proof::CHALLENGE_LEN;
use courier_proto::{verify_gateway_declaration, Address, AddressDeclError};
use serde_json::Value;

/// `AddressError.reason` for a declaration over a challenge that was already accepted once.
pub const CHALLENGE_REUSED: &str = "challenge_reused";

/// Where a connection is in the attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attach {
    /// Connected; nothing happens until `Identify`.
    AwaitIdentify,
    /// `Challenge` sent; `DeclareAddress` must follow within the deadline.
    AwaitDeclare {
        device_id: String,
        challenge: [u8; CHALLENGE_LEN],
    },
    /// `AddressDeclared` sent: the connection is a recipient under this address.
    Bound(Address),
}

/// Every challenge this gateway ever accepted: a challenge is good for one binding only.
#[derive(Debug, Default)]
pub struct SpentChallenges(Mutex<HashSet<[u8; CHALLENGE_LEN]>>);

impl SpentChallenges {
    /// Marks `challenge` accepted; false when it already was.
    fn spend(&self, challenge: &[u8; CHALLENGE_LEN]) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(*challenge)
    }
}

/// The `device_id` of an `Identify` line; `None` when it has none (the line is then ignored).
/// `protocol_version` is not checked: a gateway answers whatever version it is offered.
pub fn identify_device_id(frame: &Value) -> Option<String> {
    frame.get("device_id")?.as_str().map(str::to_owned)
}

/// The checks before `AddressDeclared`, in order: the three fields present as strings, key 32
/// bytes, signature 64, address canonical; the key derives the address; the signature verifies
/// strictly over `gateway_proof_payload(address, challenge)`; the address is the
/// `Identify.device_id`; the challenge was never accepted before. Returns the address to bind,
/// or the `AddressError.reason`.
pub fn check_declaration(
    spent: &SpentChallenges,
    device_id: &str,
    challenge: &[u8; CHALLENGE_LEN],
    frame: &Value,
) -> Result<Address, &'static str> {
    let field = |name: &str| frame.get(name).and_then(Value::as_str);
    let (Some(address), Some(public_key), Some(signature)) =
        (field("address"), field("public_key"), field("signature"))
    else {
        return Err(AddressDeclError::Malformed.reason());
    };
    let bound = verify_gateway_declaration(device_id, challenge, address, public_key, signature)
        .map_err(AddressDeclError::reason)?;
    if !spent.spend(challenge) {
        return Err(CHALLENGE_REUSED);
    }
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use courier_proto::{gateway_declaration, IdentityKey};
    use serde_json::json;

    fn declaration(key: &IdentityKey, challenge: &[u8; 32]) -> Value {
        let d = gateway_declaration(key, challenge);
        json!({"type": "DeclareAddress", "address": d.address, "public_key": d.public_key, "signature": d.signature})
    }

    #[test]
    fn accepts_once_and_refuses_in_order() {
        let spent = SpentChallenges::default();
        let key = IdentityKey::from_seed([7; 32]);
        let other = IdentityKey::from_seed([8; 32]);
        let me = key.address().to_string();
        let c = [5; 32];
        let good = declaration(&key, &c);

        // Missing or mistyped fields.
        for bad in [
            json!({"type": "DeclareAddress"}),
            json!({"type": "DeclareAddress", "address": me, "public_key": 1, "signature": "x"}),
        ] {
            assert_eq!(check_declaration(&spent, &me, &c, &bad), Err("malformed"));
        }
        // Device id mismatch.
        let other_id = other.address().to_string();
        assert_eq!(
            check_declaration(&spent, &other_id, &c, &good),
            Err("device_id_mismatch")
        );
        // Another challenge.
        assert_eq!(
            check_declaration(&spent, &me, &[6; 32], &good),
            Err("bad_signature")
        );
        // None of the refusals spent the challenge.
        assert_eq!(check_declaration(&spent, &me, &c, &good), Ok(key.address()));
        assert_eq!(
            check_declaration(&spent, &me, &c, &good),
            Err(CHALLENGE_REUSED)
        );
        assert_eq!(identify_device_id(&json!({"device_id": me})), Some(me));
        assert_eq!(identify_device_id(&json!({"device_id": 3})), None);
    }
}
