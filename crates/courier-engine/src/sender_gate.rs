//! Who sent an inbound message, checked before anything else looks at it
//! (`docs/delivery.md#sender-attribution`). Over the relay or a gateway a message must claim the
//! identity the carrier authenticated (the stamped sender, or the sender's account); a frame
//! whose content starts with a reserved internal prefix (data-plane exclusions aside) must also
//! come from the stamped identity itself and carry a valid, fresh control signature
//! (`docs/delivery.md#control-frames`, verification in `docs/protocol.md#control-signatures`).
//! A message that arrived sealed must claim the address its session credential names. Anything
//! else is dropped before dedup (so it can neither reach the app nor spend another
//! sender's id), never given a delivery ACK, and reported once per (peer, code).

use std::collections::HashSet;

use courier_proto::security::{SENDER_ADDRESS_MISMATCH, TRANSPORT_IDENTITY_MISMATCH};
use courier_proto::{is_signature_gated, verify_control, Address, Message};

use crate::event::{DiagnosticLevel, Event};
use crate::io::{InboundOrigin, Millis};

/// Distinct (peer, code) pairs remembered for throttling; past it the memory starts over.
const MAX_WARNED: usize = 1024;

pub(crate) enum Verdict {
    /// A message from the sender it claims, not a control frame: the ordinary inbound path.
    NotControl,
    /// A verified control frame (no control verbs are consumed yet).
    Verified,
    /// Refused: drop it; the events (if any) say why.
    Refused(Vec<Event>),
}

#[derive(Debug, Default)]
pub(crate) struct SenderGate {
    accept_legacy_v1: bool,
    warned: HashSet<(String, &'static str)>,
}

impl SenderGate {
    pub(crate) fn new(accept_legacy_v1: bool) -> Self {
        Self {
            accept_legacy_v1,
            warned: HashSet::new(),
        }
    }

    pub(crate) fn check(
        &mut self,
        message: &Message,
        origin: &InboundOrigin,
        now: Millis,
    ) -> Verdict {
        if !vouched_for(message, origin) {
            // The culprit is whoever authenticated it, not the identity it claimed.
            let (peer, code, by) = match &origin.sealed_by {
                Some(sealer) => (sealer.clone(), SENDER_ADDRESS_MISMATCH, "its session"),
                None => (
                    origin.stamped_sender.clone(),
                    TRANSPORT_IDENTITY_MISMATCH,
                    "the carrier",
                ),
            };
            let text = format!(
                "dropped {} claiming {}: {by} authenticated {peer}",
                message.id, message.sender
            );
            return self.refuse(peer, code, text);
        }
        if !is_signature_gated(&message.content) {
            return Verdict::NotControl;
        }
        let code = if origin.stamped_sender != message.sender {
            TRANSPORT_IDENTITY_MISMATCH
        } else {
            match verify_control(message, now, self.accept_legacy_v1) {
                Ok(()) => return Verdict::Verified,
                Err(e) => e.code(),
            }
        };
        // The claimed sender, or nothing when it is not even an address
        // (`docs/protocol.md#security-warnings`).
        let peer = Address::parse(&message.sender)
            .map(|a| a.to_string())
            .unwrap_or_default();
        let text = format!(
            "dropped control frame {} from {}: {code}",
            message.id, message.sender
        );
        self.refuse(peer, code, text)
    }

    /// A refusal: a warning diagnostic, and a `security_warning` the first time for (peer, code).
    fn refuse(&mut self, peer: String, code: &'static str, text: String) -> Verdict {
        let mut events = vec![Event::Diagnostic {
            level: DiagnosticLevel::Warn,
            message: text,
        }];
        if self.warned.len() >= MAX_WARNED {
            self.warned.clear();
        }
        if self.warned.insert((peer.clone(), code)) {
            events.push(Event::SecurityWarning {
                peer_id: peer,
                reason_code: code,
                reason: "a message failed its sender check and was dropped".into(),
            });
        }
        Verdict::Refused(events)
    }
}

/// Whether the sender `message` claims is the one authenticated: the credential of the session
/// it was sealed in, else — over the relay or a gateway — the identity the carrier stamped or the
/// account the sending connection authenticated as. An app carrier's peer id vouches for nothing
/// (`docs/delivery.md#sender-attribution`).
pub(crate) fn vouched_for(message: &Message, origin: &InboundOrigin) -> bool {
    match &origin.sealed_by {
        Some(sealer) => message.sender == *sealer,
        None => {
            !origin.carrier.is_addressed()
                || message.sender == origin.stamped_sender
                || origin.sender_account.as_deref() == Some(message.sender.as_str())
        }
    }
}
