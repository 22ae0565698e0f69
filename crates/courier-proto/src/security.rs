//! `security_warning` reason codes (`docs/protocol.md#security-warnings`). A warning carries one of
//! these, the peer it concerns and a fixed local reason; remote text never reaches it.

pub const UNSIGNED_CONTROL_REJECTED: &str = "UNSIGNED_CONTROL_REJECTED";
pub const CONTROL_SIGNATURE_INVALID: &str = "CONTROL_SIGNATURE_INVALID";
pub const SENDER_ADDRESS_MISMATCH: &str = "SENDER_ADDRESS_MISMATCH";
pub const CONTROL_SIGNATURE_STALE: &str = "CONTROL_SIGNATURE_STALE";
/// The relay-stamped sender of a gated control frame differs from `Message.sender`
/// (`docs/protocol.md#control-signatures`, verification step 1).
pub const TRANSPORT_IDENTITY_MISMATCH: &str = "TRANSPORT_IDENTITY_MISMATCH";
pub const RELAY_ADDRESS_BINDING_MISMATCH: &str = "RELAY_ADDRESS_BINDING_MISMATCH";
pub const RELAY_ADDRESS_DECLARATION_REFUSED: &str = "RELAY_ADDRESS_DECLARATION_REFUSED";
/// Another connection authenticated as this device's account and the relay displaced this one
/// (`docs/protocol.md#session-displacement`): someone else may hold the account's token.
pub const RELAY_SESSION_SUPERSEDED: &str = "RELAY_SESSION_SUPERSEDED";
pub const GATEWAY_ADDRESS_BINDING_MISMATCH: &str = "GATEWAY_ADDRESS_BINDING_MISMATCH";
pub const GATEWAY_ADDRESS_DECLARATION_REFUSED: &str = "GATEWAY_ADDRESS_DECLARATION_REFUSED";

/// Every code, for exhaustive checks.
pub const SECURITY_WARNING_CODES: &[&str] = &[
    UNSIGNED_CONTROL_REJECTED,
    CONTROL_SIGNATURE_INVALID,
    SENDER_ADDRESS_MISMATCH,
    CONTROL_SIGNATURE_STALE,
    TRANSPORT_IDENTITY_MISMATCH,
    RELAY_ADDRESS_BINDING_MISMATCH,
    RELAY_ADDRESS_DECLARATION_REFUSED,
    RELAY_SESSION_SUPERSEDED,
    GATEWAY_ADDRESS_BINDING_MISMATCH,
    GATEWAY_ADDRESS_DECLARATION_REFUSED,
];
