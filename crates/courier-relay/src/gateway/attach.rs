//! The gateway side of the attach (`docs/protocol.md#gateway-attach`): what a connection owes
//! before it is bound, and the checks a `DeclareAddress` must pass.
//!
//! No challenge is remembered once its connection ends. Each connection gets 32 fresh CSPRNG
//! bytes and binds at most once, so a proof only ever verifies on the connection it was made
//! for: replayed on another, it meets another challenge and fails as `bad_signature`.

use courier_proto::proof::CHALLENGE_LEN;
use courier_proto::{verify_gateway_declaration, Address, AddressDeclError};
use serde_json::Value;

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

/// Request methods a browser (or any HTTP client) starts a request line with. A page can make a
/// browser send a POST whose body holds a valid `Identify` line: a connection whose first bytes
/// are an HTTP request is closed before any of its lines is taken as a frame.
const HTTP_METHODS: [&[u8]; 9] = [
    b"GET ",
    b"POST ",
    b"PUT ",
    b"HEAD ",
    b"DELETE ",
    b"OPTIONS ",
    b"PATCH ",
    b"CONNECT ",
    b"TRACE ",
];

/// Whether `line` reads like an HTTP request line (HTTP/2's preface included).
pub fn looks_like_http(line: &[u8]) -> bool {
    HTTP_METHODS.iter().any(|method| line.starts_with(method)) || line.starts_with(b"PRI * HTTP/")
}

/// The `device_id` of an `Identify` line; `None` when it has none (the line is then ignored).
/// `protocol_version` is not checked: a gateway answers whatever version it is offered.
pub fn identify_device_id(frame: &Value) -> Option<String> {
    frame.get("device_id")?.as_str().map(str::to_owned)
}

/// The checks before `AddressDeclared`, in order: the three fields present as strings, key 32
/// bytes, signature 64, address canonical; the key derives the address; the signature verifies
/// strictly over `gateway_proof_payload(address, challenge)`; the address is the
/// `Identify.device_id`. Returns the address to bind, or the `AddressError.reason`.
pub fn check_declaration(
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
    verify_gateway_declaration(device_id, challenge, address, public_key, signature)
        .map_err(AddressDeclError::reason)
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
    fn accepts_and_refuses_in_order() {
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
            assert_eq!(check_declaration(&me, &c, &bad), Err("malformed"));
        }
        // Device id mismatch.
        let other_id = other.address().to_string();
        assert_eq!(
            check_declaration(&other_id, &c, &good),
            Err("device_id_mismatch")
        );
        // Another challenge.
        assert_eq!(
            check_declaration(&me, &[6; 32], &good),
            Err("bad_signature")
        );
        assert_eq!(check_declaration(&me, &c, &good), Ok(key.address()));
        assert_eq!(identify_device_id(&json!({"device_id": me})), Some(me));
        assert_eq!(identify_device_id(&json!({"device_id": 3})), None);
    }

    #[test]
    fn request_lines_read_as_http() {
        for line in [
            &b"GET / HTTP/1.1\r"[..],
            b"POST /x HTTP/1.1",
            b"OPTIONS * HTTP/1.1",
            b"PRI * HTTP/2.0\r",
        ] {
            assert!(looks_like_http(line), "{line:?}");
        }
        for line in [
            &b"{\"type\":\"Identify\"}"[..],
            b"GET",
            b"get / HTTP/1.1",
            b"",
        ] {
            assert!(!looks_like_http(line), "{line:?}");
        }
    }
}
