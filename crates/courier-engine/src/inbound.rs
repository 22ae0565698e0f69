//! Stateless rules for messages arriving on a carrier: who may settle an outbox entry and what
//! an ACK reports.

use courier_proto::message::META_ACK_HOP_COUNT;
use courier_proto::{ack_id, verify_control, Message};

use crate::io::{InboundOrigin, Millis};

/// Only the recipient settles (`docs/delivery.md#ack-attribution`). With sessions required the ACK
/// must have been sealed in the recipient's session, or — when it could not be — signed by the
/// recipient's identity key: a relay or anyone on the path can forge any frame but those. Otherwise the connection that carried the ACK must be the recipient
/// (stamped identity or authenticated account). Either way the ACK must claim to come from the
/// recipient too.
pub(crate) fn attributed(
    recipient: &str,
    origin: &InboundOrigin,
    ack: &Message,
    sealed_required: bool,
    now: Millis,
) -> bool {
    let from_recipient = match &origin.sealed_by {
        Some(sealer) => sealer == recipient,
        None if sealed_required => signed(ack, now),
        None => {
            origin.stamped_sender == recipient
                || origin.sender_account.as_deref() == Some(recipient)
        }
    };
    from_recipient && ack.sender == recipient
}

/// An ACK that could not travel sealed — the recipient has no session with us yet, as for a
/// connection request — settles only under the recipient's control signature. The signature
/// covers the ACK's id, which is derived from the acknowledged id, so it cannot be moved to
/// another message (`docs/delivery.md#ack-attribution`).
fn signed(ack: &Message, now: Millis) -> bool {
    ack.ack_for()
        .is_some_and(|acked| ack.id == ack_id(&ack.recipient, acked))
        && verify_control(ack, now, false).is_ok()
}

/// Hops the acknowledged message travelled, as the ACK reports it; an unreadable value is 0.
pub(crate) fn ack_hop_count(ack: &Message) -> u32 {
    ack.metadata
        .get(META_ACK_HOP_COUNT)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
