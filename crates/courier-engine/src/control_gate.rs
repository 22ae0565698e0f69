//! The gate for signature-gated control frames on the way in (`docs/delivery.md#control-frames`,
//! verification in `docs/protocol.md#control-signatures`). A frame whose content starts with a
//! reserved internal prefix (data-plane exclusions aside) must come from the identity its carrier
//! vouches for and carry a valid, fresh control signature; anything else is dropped before dedup,
//! never given a delivery ACK, and reported once per (peer, code).

use std::collections::HashSet;

use courier_proto::security::TRANSPORT_IDENTITY_MISMATCH;
use courier_proto::{is_signature_gated, verify_control, Address, Message};

use crate::event::{DiagnosticLevel, Event};
use crate::io::{InboundOrigin, Millis};

/// Distinct (peer, code) pairs remembered for throttling; past it the memory starts over.
const MAX_WARNED: usize = 1024;

pub(crate) enum Verdict {
    /// Not a control frame: the ordinary inbound path applies.
    NotControl,
    /// A verified control frame (no control verbs are consumed yet).
    Verified,
    /// Refused: drop it; the events (if any) say why.
    Refused(Vec<Event>),
}

#[derive(Debug, Default)]
pub(crate) struct ControlGate {
    accept_legacy_v1: bool,
    warned: HashSet<(String, &'static str)>,
}

impl ControlGate {
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
        let mut events = vec![Event::Diagnostic {
            level: DiagnosticLevel::Warn,
            message: format!(
                "dropped control frame {} from {}: {code}",
                message.id, message.sender
            ),
        }];
        if self.warned.len() >= MAX_WARNED {
            self.warned.clear();
        }
        if self.warned.insert((peer.clone(), code)) {
            events.push(Event::SecurityWarning {
                peer_id: peer,
                reason_code: code,
                reason: "a control frame failed its identity check and was dropped".into(),
            });
        }
        Verdict::Refused(events)
    }
}
