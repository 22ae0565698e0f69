//! A `MessageReceived` from an addressed carrier on its way to the engine: the end-to-end
//! message decoded and attributed to the identity the carrier stamped. What its content may be
//! is the engine's to judge (`docs/protocol.md#client-processing-order`).

use courier_engine::{Carrier, InboundOrigin, Input};
use courier_proto::{validate_identifier, Message};

/// What the carrier stamped on the frame.
pub struct Stamp {
    pub carrier: Carrier,
    pub sender: String,
    pub sender_account: Option<String>,
    pub seq: Option<u64>,
}

/// The engine input for the frame, or why it is dropped (for a diagnostic).
pub fn inbound_input(stamp: Stamp, content: &str) -> Result<Input, String> {
    let Stamp {
        carrier,
        sender,
        sender_account,
        seq,
    } = stamp;
    // The stamp names the peer in events and storage: it follows the identifier rules
    // (`docs/protocol.md#identifiers`), or the frame is dropped without quoting it.
    for (field, value) in [
        ("sender", Some(&sender)),
        ("sender_account", sender_account.as_ref()),
    ] {
        if let Some(Err(e)) = value.map(|v| validate_identifier(v)) {
            return Err(format!("dropped inbound frame: stamped {field} {e}"));
        }
    }
    let message = Message::decode(content)
        .map_err(|e| format!("dropped inbound frame from {sender}: {e}"))?;
    Ok(Input::Inbound {
        message: Box::new(message),
        origin: InboundOrigin {
            carrier,
            stamped_sender: sender,
            sender_account,
            seq,
            sealed_by: None,
        },
    })
}
