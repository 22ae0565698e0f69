//! Stateless rules for messages arriving on a carrier: who may settle an outbox entry and what
//! an ACK reports.

use courier_proto::message::META_ACK_HOP_COUNT;
use courier_proto::Message;

use crate::io::InboundOrigin;

/// Only the recipient settles (`docs/delivery.md#ack-attribution`). The connection that carried the
/// ACK must be the recipient (stamped identity or authenticated account), and the ACK must claim to
/// come from it too. A third party that saw the frame knows its id, but not how to be stamped
/// as the recipient.
pub(crate) fn attributed(recipient: &str, origin: &InboundOrigin, ack: &Message) -> bool {
    let carried_by_recipient =
        origin.stamped_sender == recipient || origin.sender_account.as_deref() == Some(recipient);
    carried_by_recipient && ack.sender == recipient
}

/// Hops the acknowledged message travelled, as the ACK reports it; an unreadable value is 0.
pub(crate) fn ack_hop_count(ack: &Message) -> u32 {
    ack.metadata
        .get(META_ACK_HOP_COUNT)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
