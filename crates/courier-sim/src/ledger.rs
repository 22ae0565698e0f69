//! The oracle: what every device committed, dispatched and transmitted, kept outside the
//! devices so it survives their crashes, and the invariants checked against it. A violation
//! panics with [`VIOLATION`] in its message; the runner turns that into a failing seed.

use std::collections::{BTreeMap, BTreeSet};

use courier_engine::{GroupSendRecord, InboundKey, Millis, Settlement};
use courier_proto::message::META_GROUP_ID;
use courier_proto::{group_copy_id, Message, SessionFrame, MLS_ENC_PREFIX};

use crate::relay::group_key;
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

/// One group message at its sender (`docs/delivery.md#group-sends`).
#[derive(Debug)]
pub struct GroupMessage {
    pub group: String,
    pub wire_id: String,
    /// Who it was sealed for: the roster of its epoch, the sender excluded.
    pub roster: BTreeSet<String>,
    /// Its tracker row is committed: the accept is durable.
    pub durable: bool,
    /// Its tracker row is marked done.
    pub done: bool,
    /// Sent into the quiet honest world: every member must be reached.
    pub probe: bool,
}

/// A group message's per-member copy at its sender: an outbox entry of its own.
#[derive(Debug)]
pub struct Copy {
    /// The group message's id at its sender.
    pub group_message: String,
    pub member: String,
    pub settled: Option<Settlement>,
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
    /// (device, peer, acknowledged id) of delivery ACKs the device failed to decrypt → when last.
    undecryptable_acks: BTreeMap<(String, String, String), Millis>,
    /// (device, peer) → when the device first kept its own session over a Welcome from the peer
    /// (both had started one at once, and the device's address is the lower).
    outranked: BTreeMap<(String, String), Millis>,
    /// (device, peer) → when the device last joined a session from a Welcome of the peer.
    joined: BTreeMap<(String, String), Millis>,
    /// (sender, id) → group message.
    pub groups: BTreeMap<(String, String), GroupMessage>,
    /// (sender, wire id) → the group message's id.
    group_ids: BTreeMap<(String, String), String>,
    /// (sender, copy id) → copy.
    copies: BTreeMap<(String, String), Copy>,
    /// Copy id → the dedup key of its group message at its member (what an ACK of it stands for).
    copy_keys: BTreeMap<String, InboundKey>,
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
    /// A session Welcome its sender sent ahead of its messages (keyed by the peer it is for):
    /// the sealed messages behind it may still find room in the peer's mailbox, and not open.
    Welcome,
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
        self.check_addressee(peer, message);
        let rec = self
            .inbound
            .entry((peer.to_owned(), key.clone()))
            .or_default();
        rec.dispatched += 1;
        if rec.dispatched > 1 {
            violated(format!("{key:?} reached {peer}'s application twice"));
        }
    }

    /// `message` may reach `peer`'s application: it is addressed to it, or a group message
    /// sealed for a roster `peer` is in.
    pub fn check_addressee(&self, peer: &str, message: &Message) {
        if let Some(group) = message.metadata.get(META_GROUP_ID) {
            let key = (message.sender.clone(), message.id.clone());
            let Some(sent) = self.group_ids.get(&key).and_then(|id| {
                self.groups
                    .get(&(message.sender.clone(), id.clone()))
                    .filter(|g| g.group == *group)
            }) else {
                violated(format!(
                    "{peer}'s application got {}'s group message {} in {group}, which nobody sent",
                    message.sender, message.id
                ));
            };
            if !sent.roster.contains(peer) {
                violated(format!(
                    "{}'s group message {} reached the application of {peer}, who is not in its roster {:?}",
                    message.sender, message.id, sent.roster
                ));
            }
            return;
        }
        if message.recipient != peer {
            violated(format!(
                "{}'s message {} for {} reached the application of {peer}",
                message.sender, message.id, message.recipient
            ));
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
        let key = group_key(&message.sender, message)
            .or_else(|| data.then(|| key_of(&message.sender, &message.id)));
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
        match what {
            Undecryptable::Data => {
                let key = (device.to_owned(), sender.to_owned(), id.to_owned());
                self.undecryptable.insert(key, at);
            }
            Undecryptable::Ack => {
                let acked = self.sealed[&(sender.to_owned(), id.to_owned())]
                    .ack_for
                    .clone()
                    .expect("an ACK");
                let key = (device.to_owned(), sender.to_owned(), acked);
                self.undecryptable_acks.insert(key, at);
            }
            Undecryptable::Carried => {}
        }
        what
    }

    /// When `device` last failed to decrypt `peer`'s ACK of `acked`.
    pub fn ack_undecryptable_at(&self, device: &str, peer: &str, acked: &str) -> Option<Millis> {
        let key = (device.to_owned(), peer.to_owned(), acked.to_owned());
        self.undecryptable_acks.get(&key).copied()
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

    /// The app of `sender` sends group message `id` (wire id `wire_id`) to `group`, sealed for
    /// `roster` (the sender excluded).
    pub fn on_group_send(
        &mut self,
        sender: &str,
        id: &str,
        group: &str,
        wire_id: &str,
        roster: BTreeSet<String>,
        probe: bool,
    ) {
        for member in &roster {
            let key = InboundKey {
                chat: group.to_owned(),
                sender: sender.to_owned(),
                message_id: wire_id.to_owned(),
            };
            self.copy_keys.insert(group_copy_id(wire_id, member), key);
        }
        self.group_ids
            .insert((sender.to_owned(), wire_id.to_owned()), id.to_owned());
        let message = GroupMessage {
            group: group.to_owned(),
            wire_id: wire_id.to_owned(),
            roster,
            durable: false,
            done: false,
            probe,
        };
        if self
            .groups
            .insert((sender.to_owned(), id.to_owned()), message)
            .is_some()
        {
            violated(format!("{sender} sent group message {id} twice"));
        }
    }

    /// `sender` committed the tracker row of a group message.
    pub fn on_group_put(&mut self, sender: &str, record: &GroupSendRecord) {
        let id = &record.id;
        let Some(sent) = self.groups.get_mut(&(sender.to_owned(), id.clone())) else {
            violated(format!(
                "{sender} wrote group message {id}, which its app never sent"
            ));
        };
        if sent.done {
            violated(format!(
                "{sender} wrote group message {id} after it was done"
            ));
        }
        let members: BTreeSet<String> = record.members.keys().cloned().collect();
        if members != sent.roster {
            violated(format!(
                "{sender}'s group message {id} tracks {members:?}, but was sealed for {:?}",
                sent.roster
            ));
        }
        sent.durable = true;
    }

    /// `sender` marked group message `id` done.
    pub fn on_group_done(&mut self, sender: &str, id: &str) {
        let Some(sent) = self.groups.get_mut(&(sender.to_owned(), id.to_owned())) else {
            violated(format!(
                "{sender} marked group message {id} done, which it never sent"
            ));
        };
        if !sent.durable || sent.done {
            violated(format!(
                "{sender} marked group message {id} done {}",
                if sent.done {
                    "twice"
                } else {
                    "without its row"
                }
            ));
        }
        sent.done = true;
    }

    /// The group message of `sender` with wire id `wire_id`: (its id, record).
    pub fn group_of_wire(&self, sender: &str, wire_id: &str) -> Option<(&str, &GroupMessage)> {
        let id = self
            .group_ids
            .get(&(sender.to_owned(), wire_id.to_owned()))?;
        let sent = self.groups.get(&(sender.to_owned(), id.clone()))?;
        Some((id, sent))
    }

    /// `sender` committed the outbox row of copy `copy_id` of its group message `wire_id` for
    /// `member`.
    pub fn on_copy_put(&mut self, sender: &str, copy_id: &str, member: &str, wire_id: &str) {
        let Some((id, sent)) = self.group_of_wire(sender, wire_id) else {
            violated(format!(
                "{sender} wrote copy {copy_id} of group message {wire_id}, which it never sent"
            ));
        };
        if !sent.roster.contains(member) || group_copy_id(wire_id, member) != copy_id {
            violated(format!(
                "{sender} wrote copy {copy_id} of {id} for {member}, who is not in its roster {:?} or whose copy id differs",
                sent.roster
            ));
        }
        let id = id.to_owned();
        let key = (sender.to_owned(), copy_id.to_owned());
        if let Some(copy) = self.copies.get(&key) {
            if copy.settled.is_some() {
                violated(format!(
                    "{sender} admitted copy {copy_id} of {id} for {member} again after it settled"
                ));
            }
            return;
        }
        let copy = Copy {
            group_message: id,
            member: member.to_owned(),
            settled: None,
        };
        self.copies.insert(key, copy);
    }

    pub fn copy(&self, sender: &str, copy_id: &str) -> Option<&Copy> {
        self.copies.get(&(sender.to_owned(), copy_id.to_owned()))
    }

    /// `sender` settled copy `copy_id`: once.
    pub fn on_copy_settle(&mut self, sender: &str, copy_id: &str, settlement: &Settlement) {
        let Some(copy) = self
            .copies
            .get_mut(&(sender.to_owned(), copy_id.to_owned()))
        else {
            violated(format!(
                "{sender} settled copy {copy_id}, which it never wrote"
            ));
        };
        if let Some(before) = &copy.settled {
            violated(format!(
                "{sender} settled copy {copy_id} of {} for {} twice ({before:?}, then {settlement:?})",
                copy.group_message, copy.member
            ));
        }
        copy.settled = Some(settlement.clone());
    }

    /// The dedup key at its member of the group message copy `copy_id` stands for.
    pub fn copy_key(&self, copy_id: &str) -> Option<&InboundKey> {
        self.copy_keys.get(copy_id)
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
