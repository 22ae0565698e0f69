//! Fixed protocol constants (`docs/protocol.md#constants`) and the send limits of
//! `docs/delivery.md#send-validation`.

/// Largest WebSocket message either side sends or accepts, after reassembly.
pub const MAX_FRAME_BYTES: usize = 1_048_576;
/// Largest application content `sendMessage` accepts. Leaves room under the frame cap for
/// encryption expansion and the JSON envelope, so anything accepted can be delivered.
pub const MAX_CONTENT_BYTES: usize = 256 * 1024;
/// Identifier fields (`recipient`, `username`, `message_id`, …) are 1..=256 UTF-8 bytes.
pub const MAX_IDENTIFIER_BYTES: usize = 256;
/// Capability tokens a client keeps from one `Authenticated`, and the longest it keeps.
pub const MAX_CAPABILITIES: usize = 64;
pub const MAX_CAPABILITY_BYTES: usize = 128;
/// A frame's text buys one rate token per started `RATE_TOKEN_BYTES` (`docs/protocol.md#rate-limiting`):
/// a chat message costs one, a 256 KiB file chunk (base64 in JSON) about 86, so one account's
/// burst of large frames
/// cannot take the relay's journal for itself.
pub const RATE_TOKEN_BYTES: usize = 4096;

/// The rate tokens a frame of `len` bytes of text costs, at least one.
pub fn rate_cost(len: usize) -> u32 {
    u32::try_from(len.div_ceil(RATE_TOKEN_BYTES).max(1)).unwrap_or(u32::MAX)
}

/// Malformed frames a relay tolerates on one connection; the 16th closes it with 4002.
pub const MAX_MALFORMED_FRAMES: u32 = 16;
/// Largest key package, decoded, and the most one `PublishKeyPackages` carries
/// (`docs/protocol.md#key-package-directory`).
pub const MAX_KEY_PACKAGE_BYTES: usize = 16 * 1024;
pub const MAX_KEY_PACKAGES_PER_FRAME: usize = 100;

/// Capability tokens (`docs/protocol.md#capabilities`).
pub const CAP_ADDRESS_ROUTING: &str = "address_routing_v1";
pub const CAP_GROUP_DELIVERY: &str = "group_delivery_v3";
pub const CAP_KEY_DIRECTORY: &str = "key_directory_v1";
pub const CAP_MAILBOX: &str = "mailbox_v1";
pub const CAP_PRESENCE_WATCH: &str = "presence_watch_v1";

/// The prefix of a `DeliveryError.reason` that is the unreachable verdict.
pub const RECIPIENT_UNREACHABLE: &str = "recipient_unreachable";

/// Close codes (`docs/protocol.md#close-codes`).
pub mod close {
    pub const NORMAL: u16 = 1000;
    pub const GOING_AWAY: u16 = 1001;
    pub const INVALID_UTF8: u16 = 1007;
    pub const TOO_BIG: u16 = 1009;
    pub const INTERNAL: u16 = 1011;
    pub const SUPERSEDED: u16 = 4000;
    pub const AUTH_FAILED: u16 = 4001;
    pub const TOO_MANY_MALFORMED: u16 = 4002;
    pub const KEEPALIVE_TIMEOUT: u16 = 4008;
}

/// Content prefixes the engine reserves for itself; an application may not send them.
pub const RESERVED_PREFIXES: &[&str] = &[
    "__MLS_",
    "__GRP_",
    "__GROUP_",
    "__CTRL_",
    "__FILE_",
    "__ACK_",
    "__CONN_",
    "__USER_GROUPS__",
];

/// Whether `content` starts with a prefix reserved for the engine.
pub fn is_reserved_content(content: &str) -> bool {
    RESERVED_PREFIXES.iter().any(|p| content.starts_with(p))
}

/// What a relay answers to group requests; such content never travels in the message plane.
pub const RELAY_ANSWER_PREFIXES: &[&str] = &[
    "__GROUP_CREATED__",
    "__GROUP_MSG__",
    "__GROUP_MEMBER_ADDED__",
    "__GROUP_MEMBER_REMOVED__",
    "__GROUP_INFO__",
    "__USER_GROUPS__",
    "__GROUP_ERROR__",
];

/// Whether `content` is a relay's answer, which no sender may put in a message.
pub fn is_relay_answer(content: &str) -> bool {
    RELAY_ANSWER_PREFIXES.iter().any(|p| content.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_costs_one_token_per_started_4_kib() {
        assert_eq!(rate_cost(0), 1);
        assert_eq!(rate_cost(1), 1);
        assert_eq!(rate_cost(4096), 1);
        assert_eq!(rate_cost(4097), 2);
        assert_eq!(rate_cost(MAX_FRAME_BYTES), 256);
    }
}
