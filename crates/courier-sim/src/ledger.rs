//! The oracle: what every device committed, dispatched and transmitted, kept outside the
//! devices so it survives their crashes, and the invariants checked against it. A violation
//! panics with [`VIOLATION`] in its message; the runner turns that into a failing seed.

use std::collections::{BTreeMap, BTreeSet};

use courier_engine::{InboundKey, Settlement};
use courier_proto::Message;

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
    /// Terminal events the app saw.
    pub terminal_events: u32,
    /// A crash after the commit of its settlement swallowed its terminal event.
    pub terminal_lost: bool,
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
    /// The dedup key at the recipient, for a data message; `None` for an end-to-end ACK.
    pub key: Option<InboundKey>,
}

#[derive(Debug, Default)]
pub struct Ledger {
    /// (sender, id) → record.
    pub outbound: BTreeMap<(String, String), Outbound>,
    /// (recipient, key) → record.
    pub inbound: BTreeMap<(String, InboundKey), Inbound>,
    /// (account, seq) → what it carried.
    seqs: BTreeMap<(String, u64), SeqInfo>,
}

impl Ledger {
    pub fn on_put(&mut self, peer: &str, id: &str, recipient: &str) {
        let rec = self
            .outbound
            .entry((peer.to_owned(), id.to_owned()))
            .or_default();
        match &rec.settled {
            Some(Settlement::Delivered) => {
                violated(format!("{peer} accepted {id} again after it was delivered"))
            }
            Some(Settlement::Failed(_)) => {
                // A new message under a failed id.
                *rec = Outbound::default();
            }
            None => {}
        }
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

    pub fn on_terminal_event(&mut self, peer: &str, id: &str, delivered: bool) {
        let Some(rec) = self.outbound.get_mut(&(peer.to_owned(), id.to_owned())) else {
            violated(format!(
                "terminal event at {peer} for {id}, which it never accepted"
            ));
        };
        rec.terminal_events += 1;
        if rec.terminal_events > 1 {
            violated(format!("second terminal event at {peer} for {id}"));
        }
        let matches = match &rec.settled {
            Some(Settlement::Delivered) => delivered,
            Some(Settlement::Failed(_)) => !delivered,
            None => false,
        };
        if !matches {
            violated(format!(
                "{peer}'s terminal event for {id} (delivered: {delivered}) is not its committed settlement {:?}",
                rec.settled
            ));
        }
    }

    pub fn on_terminal_lost(&mut self, peer: &str, id: &str) {
        if let Some(rec) = self.outbound.get_mut(&(peer.to_owned(), id.to_owned())) {
            rec.terminal_lost = true;
        }
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

    pub fn inbound(&self, peer: &str, key: &InboundKey) -> Option<&Inbound> {
        self.inbound.get(&(peer.to_owned(), key.clone()))
    }

    /// The relay wrote journal frame `seq` of `account`.
    pub fn note_seq(&mut self, account: &str, seq: u64, message: &Message) {
        let key = message
            .ack_for()
            .is_none()
            .then(|| key_of(&message.sender, &message.id));
        self.seqs.insert((account.to_owned(), seq), SeqInfo { key });
    }

    pub fn seq(&self, account: &str, seq: u64) -> Option<&SeqInfo> {
        self.seqs.get(&(account.to_owned(), seq))
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
