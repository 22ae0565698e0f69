//! The oracle: what every device committed, dispatched and transmitted, kept outside the
//! devices so it survives their crashes, and the invariants checked against it. A violation
//! panics with [`VIOLATION`] in its message; the runner turns that into a failing seed.

use std::collections::{BTreeMap, BTreeSet};

use courier_engine::{InboundKey, Millis, Settlement};
use courier_proto::{Message, SessionFrame, MLS_ENC_PREFIX};

use crate::store::key_of;

/// The prefix of every invariant violation's panic message.
pub const VIOLATION: &str = "invariant violated: ";

/// Stops the run: an invariant does not hold.
#[track_caller]
pub fn violated(what: String) -> ! {
    panic!("{VIOLATION}{what}")
}

/// One accepted message at its sender, per generation (an id whose entry failed may be accepted
/// again as a new message).
#[derive(Debug, Default)]
pub struct Outbound {
    pub recipient: String,
    /// A `Put` of it is committed: the accept is durable.
    pub durable: bool,
    pub settled: Option<Settlement>,
    /// Terminal events the app saw, replayed ones included.
    pub terminal_events: u32,
    /// `sendMessage` resolved for it.
    pub resolved: bool,
}

/// One data message at a recipient.
#[derive(Debug, Default)]
pub struct Inbound {
    /// `message_received` dispatched to the app.
    pub dispatched: u32,
    /// A crash after its processing was committed swallowed its `message_received`.
    pub dispatch_lost: bool,
    /// Offers to the durability hook, and how many the app's key dedup absorbed.
    pub offers: u32,
    pub expired: bool,
}

/// What a relay journal `seq` carried.
#[derive(Debug, Clone)]
pub struct SeqInfo {
    /// The dedup key at the recipient, for a data message; `None` for an end-to-end ACK or a
    /// session frame.
    pub key: Option<InboundKey>,
}

#[derive(Debug, Default)]
pub struct Ledger {
    /// (sender, id) → record of its latest generation.
    pub outbound: BTreeMap<(String, String), Outbound>,
    /// (sender, id) → its earlier generations, oldest first: each failed, and the app accepted
    /// the id again.
    retired: BTreeMap<(String, String), Vec<Outbound>>,
    /// (recipient, key) → record.
    pub inbound: BTreeMap<(String, InboundKey), Inbound>,
    /// (account, seq) → what it carried.
    seqs: BTreeMap<(String, u64), SeqInfo>,
    /// (what, sender, wire id) → when the relay last refused it.
    refusals: BTreeMap<(Refused, String, String), u64>,
    /// (sealing address, envelope id) → what is inside. Only the oracle can see through an
    /// envelope: a device opens each once.
    sealed: BTreeMap<(String, String), Sealed>,
    /// (account, seq) of relay frames a device released without processing them, because the
    /// sealed copy they carried did not open or was a spent repeat.
    unopened: BTreeSet<(String, u64)>,
    /// (recipient, sender, wire id) of data messages that failed to decrypt → when last.
    undecryptable: BTreeMap<(String, String, String), Millis>,
    /// (device, peer) → when the device first kept its own session over a Welcome from the peer
    /// (both had started one at once, and the device's address is the lower).
    outranked: BTreeMap<(String, String), Millis>,
    /// (device, peer) → when the device last joined a session from a Welcome of the peer.
    joined: BTreeMap<(String, String), Millis>,
}

/// What a sealed envelope holds, as far as the checks need it.
#[derive(Debug)]
struct Sealed {
    recipient: String,
    /// The id it acknowledges, for a delivery ACK.
    ack_for: Option<String>,
}

/// Who a decryption failure was about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undecryptable {
    /// A data message addressed to the device that failed to open it.
    Data,
    /// A delivery ACK: the sender's retry is acknowledged again, the liveness rules see to it.
    Ack,
    /// A copy the device only carries for another (`docs/delivery.md#carried-copies`): sealed
    /// for its recipient, it can never open here.
    Carried,
}

/// What of a message the relay refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refused {
    /// An attempt, answered "unreachable".
    Attempt,
    /// An end-to-end ACK of it (the sender's mailbox full, or the sender offline without a
    /// mailbox): that ACK is lost.
    Ack,
}

impl Ledger {
    pub fn on_put(&mut self, peer: &str, id: &str, recipient: &str) {
        let key = (peer.to_owned(), id.to_owned());
        if let Some(rec) = self.outbound.get_mut(&key) {
            match &rec.settled {
                Some(Settlement::Delivered) => {
                    violated(format!("{peer} accepted {id} again after it was delivered"))
                }
                Some(Settlement::Failed(_)) => {
                    // A new message under a failed id.
                    let old = std::mem::take(rec);
                    self.retired.entry(key.clone()).or_default().push(old);
                }
                None => {}
            }
        }
        let rec = self.outbound.entry(key).or_default();
        rec.recipient = recipient.to_owned();
        rec.durable = true;
    }

    pub fn on_settle(&mut self, peer: &str, id: &str, settlement: &Settlement, had_row: bool) {
        let Some(rec) = self.outbound.get_mut(&(peer.to_owned(), id.to_owned())) else {
            violated(format!("{peer} settled {id}, which it never accepted"));
        };
        if !had_row {
            violated(format!("{peer} settled {id}, which has no outbox row"));
        }
        if let Some(before) = &rec.settled {
            violated(format!(
                "{peer} settled {id} twice ({before:?}, then {settlement:?})"
            ));
        }
        rec.settled = Some(settlement.clone());
    }

    /// A terminal event at `peer` reporting `reported` for `id`; `replayed`: emitted again by a
    /// start because its dispatch was never recorded. Returns whether it was the generation's
    /// first terminal event.
    pub fn on_terminal_event(
        &mut self,
        peer: &str,
        id: &str,
        reported: &Settlement,
        replayed: bool,
    ) -> bool {
        let key = (peer.to_owned(), id.to_owned());
        let Some(current) = self.outbound.get_mut(&key) else {
            violated(format!(
                "terminal event at {peer} for {id}, which it never accepted"
            ));
        };
        // A replay was held with a settlement; the app may have accepted the id again (a new,
        // unsettled generation) in the very step that replays it.
        let rec = match self.retired.get_mut(&key) {
            Some(earlier) if replayed && current.settled.is_none() => {
                earlier.last_mut().expect("a retired generation")
            }
            _ => current,
        };
        rec.terminal_events += 1;
        if rec.terminal_events > 1 && !replayed {
            violated(format!(
                "second terminal event at {peer} for {id}, not flagged replayed"
            ));
        }
        if rec.settled.as_ref() != Some(reported) {
            violated(format!(
                "{peer}'s terminal event for {id} ({reported:?}, replayed: {replayed}) is not its committed settlement {:?}",
                rec.settled
            ));
        }
        rec.terminal_events == 1
    }

    pub fn on_resolved(&mut self, peer: &str, id: &str, durable: bool) {
        if !durable {
            violated(format!(
                "{peer}'s sendMessage resolved {id} before it was durable"
            ));
        }
        if let Some(rec) = self.outbound.get_mut(&(peer.to_owned(), id.to_owned())) {
            rec.resolved = true;
        }
    }

    /// `message_received` at `peer`.
    pub fn on_received(&mut self, peer: &str, key: &InboundKey, message: &Message) {
        if message.recipient != peer {
            violated(format!(
                "{}'s message {} for {} reached the application of {peer}",
                message.sender, message.id, message.recipient
            ));
        }
        let rec = self
            .inbound
            .entry((peer.to_owned(), key.clone()))
            .or_default();
        rec.dispatched += 1;
        if rec.dispatched > 1 {
            violated(format!("{key:?} reached {peer}'s application twice"));
        }
    }

    pub fn on_received_lost(&mut self, peer: &str, key: &InboundKey) {
        self.inbound
            .entry((peer.to_owned(), key.clone()))
            .or_default()
            .dispatch_lost = true;
    }

    pub fn on_offered(&mut self, peer: &str, key: &InboundKey) {
        self.inbound
            .entry((peer.to_owned(), key.clone()))
            .or_default()
            .offers += 1;
    }

    pub fn on_expired(&mut self, peer: &str, key: &InboundKey) {
        self.inbound
            .entry((peer.to_owned(), key.clone()))
            .or_default()
            .expired = true;
    }

    pub fn on_refused(&mut self, what: Refused, sender: &str, wire_id: &str, at: u64) {
        let key = (what, sender.to_owned(), wire_id.to_owned());
        self.refusals.insert(key, at);
    }

    /// When the relay last refused `what` of `sender`'s `wire_id`.
    pub fn refused(&self, what: Refused, sender: &str, wire_id: &str) -> Option<u64> {
        let key = (what, sender.to_owned(), wire_id.to_owned());
        self.refusals.get(&key).copied()
    }

    pub fn inbound(&self, peer: &str, key: &InboundKey) -> Option<&Inbound> {
        self.inbound.get(&(peer.to_owned(), key.clone()))
    }

    /// The relay wrote journal frame `seq` of `account`.
    pub fn note_seq(&mut self, account: &str, seq: u64, message: &Message) {
        // A session frame is processed like a data message, but never the application's.
        let data =
            self.ack_for(message).is_none() && SessionFrame::parse(&message.content).is_none();
        let key = data.then(|| key_of(&message.sender, &message.id));
        self.seqs.insert((account.to_owned(), seq), SeqInfo { key });
    }

    /// `sealer` sealed `inner` into an envelope (which keeps its id).
    pub fn on_sealed(&mut self, sealer: &str, inner: &Message) {
        let sealed = Sealed {
            recipient: inner.recipient.clone(),
            ack_for: inner.ack_for().map(str::to_owned),
        };
        self.sealed
            .insert((sealer.to_owned(), inner.id.clone()), sealed);
    }

    /// The id `message` acknowledges, when it is a delivery ACK, sealed or not.
    pub fn ack_for<'m>(&'m self, message: &'m Message) -> Option<&'m str> {
        if !message.content.starts_with(MLS_ENC_PREFIX) {
            return message.ack_for();
        }
        let key = (message.sender.clone(), message.id.clone());
        self.sealed.get(&key).and_then(|s| s.ack_for.as_deref())
    }

    /// `account` released relay frame `seq` without processing what it carried.
    pub fn on_unopened(&mut self, account: &str, seq: u64) {
        self.unopened.insert((account.to_owned(), seq));
    }

    pub fn was_unopened(&self, account: &str, seq: u64) -> bool {
        self.unopened.contains(&(account.to_owned(), seq))
    }

    /// `message_decryption_failed` at `device` for `sender`'s envelope `id`: what it was about.
    pub fn on_decryption_failed(
        &mut self,
        device: &str,
        sender: &str,
        id: &str,
        at: Millis,
    ) -> Undecryptable {
        let what = match self.sealed.get(&(sender.to_owned(), id.to_owned())) {
            Some(sealed) if sealed.recipient != device => Undecryptable::Carried,
            Some(Sealed {
                ack_for: Some(_), ..
            }) => Undecryptable::Ack,
            _ => Undecryptable::Data,
        };
        if what == Undecryptable::Data {
            let key = (device.to_owned(), sender.to_owned(), id.to_owned());
            self.undecryptable.insert(key, at);
        }
        what
    }

    /// When `recipient` last failed to decrypt `sender`'s data message `wire_id`.
    pub fn decryption_failed_at(
        &self,
        recipient: &str,
        sender: &str,
        wire_id: &str,
    ) -> Option<Millis> {
        let key = (recipient.to_owned(), sender.to_owned(), wire_id.to_owned());
        self.undecryptable.get(&key).copied()
    }

    /// `device` kept its own session over `peer`'s Welcome (`outranked`), or joined `peer`'s.
    pub fn on_welcome(&mut self, device: &str, peer: &str, outranked: bool, at: Millis) {
        let key = (device.to_owned(), peer.to_owned());
        if outranked {
            // The first time counts: later ones are the loser's Welcomes still on their way.
            self.outranked.entry(key).or_insert(at);
        } else {
            self.joined.insert(key, at);
        }
    }

    /// When `sender` gave up a session it had started with `recipient` for the recipient's own
    /// (they started at once, and the recipient won the tie): the recipient had kept its own
    /// first, then the sender joined it.
    pub fn lost_tie(&self, sender: &str, recipient: &str) -> Option<Millis> {
        let kept = self
            .outranked
            .get(&(recipient.to_owned(), sender.to_owned()))?;
        let joined = self
            .joined
            .get(&(sender.to_owned(), recipient.to_owned()))?;
        (kept <= joined).then_some(*joined)
    }

    /// Every data message that failed to decrypt: (recipient, sender, wire id).
    pub fn undecryptable(&self) -> impl Iterator<Item = &(String, String, String)> {
        self.undecryptable.keys()
    }

    pub fn seq(&self, account: &str, seq: u64) -> Option<&SeqInfo> {
        self.seqs.get(&(account.to_owned(), seq))
    }

    /// Every generation of every accepted message, earlier generations first.
    pub fn generations(&self) -> impl Iterator<Item = (&(String, String), &Outbound)> {
        let retired = self
            .retired
            .iter()
            .flat_map(|(key, recs)| recs.iter().map(move |rec| (key, rec)));
        retired.chain(&self.outbound)
    }

    /// Ids of `peer` whose accept is durable and that have not settled.
    pub fn unsettled(&self) -> BTreeSet<(String, String)> {
        self.outbound
            .iter()
            .filter(|(_, rec)| rec.durable && rec.settled.is_none())
            .map(|(k, _)| k.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::panic::{catch_unwind, AssertUnwindSafe};

    use courier_engine::FailReason;

    use super::*;

    const FAILED: Settlement = Settlement::Failed(FailReason::OutboxCapacityExceeded);

    fn violation(f: impl FnOnce()) -> String {
        let payload = catch_unwind(AssertUnwindSafe(f)).expect_err("an invariant is violated");
        payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default()
    }

    #[test]
    fn a_replay_counts_for_the_failed_generation_the_app_accepted_again_in_its_step() {
        let mut ledger = Ledger::default();
        ledger.on_put("a", "x", "b");
        ledger.on_settle("a", "x", &FAILED, true);
        // The start that replays x's message_failed also re-sends x.
        ledger.on_put("a", "x", "b");
        assert!(ledger.on_terminal_event("a", "x", &FAILED, true));
        let counts: Vec<u32> = ledger
            .generations()
            .map(|(_, r)| r.terminal_events)
            .collect();
        assert_eq!(counts, [1, 0]);
    }

    #[test]
    fn a_second_terminal_event_passes_only_flagged_replayed_and_as_the_settlement() {
        let mut ledger = Ledger::default();
        ledger.on_put("a", "x", "b");
        ledger.on_settle("a", "x", &Settlement::Delivered, true);
        assert!(ledger.on_terminal_event("a", "x", &Settlement::Delivered, false));
        assert!(!ledger.on_terminal_event("a", "x", &Settlement::Delivered, true));
        let unflagged = violation(|| {
            ledger.on_terminal_event("a", "x", &Settlement::Delivered, false);
        });
        assert!(unflagged.contains("not flagged replayed"), "{unflagged}");
        let mut ledger = Ledger::default();
        ledger.on_put("a", "x", "b");
        ledger.on_settle("a", "x", &Settlement::Delivered, true);
        let contrary = violation(|| {
            ledger.on_terminal_event("a", "x", &FAILED, true);
        });
        assert!(
            contrary.contains("not its committed settlement"),
            "{contrary}"
        );
    }
}
