//! Stateless rules for messages arriving on a carrier: who may settle an outbox entry, the id of
//! the ACK we send back, and what an ACK reports.

use courier_proto::limits::MAX_IDENTIFIER_BYTES;
use courier_proto::message::META_ACK_HOP_COUNT;
use courier_proto::Message;

use crate::io::InboundOrigin;

const ACK_ID_PREFIX: &str = "ack-";

/// `relay-protocol.md` §9.2: only the recipient settles. The connection that carried the ACK
/// must be the recipient (stamped identity or authenticated account), and the ACK must claim to
/// come from it too. A third party that saw the frame knows its id, but not how to be stamped
/// as the recipient.
pub(crate) fn attributed(recipient: &str, origin: &InboundOrigin, ack: &Message) -> bool {
    let carried_by_recipient =
        origin.stamped_sender == recipient || origin.sender_account.as_deref() == Some(recipient);
    carried_by_recipient && ack.sender == recipient
}

/// The id of the ACK for `message_id`: `"ack-"` + the id, cut to the 256-byte identifier limit at
/// a character boundary. Deterministic on purpose: a re-ACK of a redelivered message reuses the
/// id, so the relay holds one copy while the first is unacked, and no id state has to survive a
/// restart. (`:` would read better but is not an identifier character.)
pub(crate) fn ack_id(message_id: &str) -> String {
    let mut id = String::with_capacity(ACK_ID_PREFIX.len() + message_id.len());
    id.push_str(ACK_ID_PREFIX);
    id.push_str(message_id);
    let mut end = id.len().min(MAX_IDENTIFIER_BYTES);
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    id.truncate(end);
    id
}

/// Hops the acknowledged message travelled, as the ACK reports it; an unreadable value is 0.
pub(crate) fn ack_hop_count(ack: &Message) -> u32 {
    ack.metadata
        .get(META_ACK_HOP_COUNT)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use courier_proto::validate_identifier;

    #[test]
    fn ack_ids_are_identifiers() {
        assert_eq!(ack_id("m1"), "ack-m1");
        // "ack-x" + 127 two-byte characters = 259 bytes; byte 256 falls inside a character.
        let long = format!("x{}", "é".repeat(127));
        let id = ack_id(&long);
        assert!(validate_identifier(&id).is_ok());
        assert_eq!(id.len(), 255, "cut at the last whole character");
    }
}
