//! Outbox entries: what an accepted message carries through its life, its phase, the two
//! capacity classes and the lifetime arithmetic.

use std::collections::{BTreeSet, HashMap};

use courier_proto::message::META_GROUP_MESSAGE;
use courier_proto::{ContentType, Message};

use crate::config::Config;
use crate::io::{Carrier, EntryState, Millis, OutboxRecord};
use crate::parking::Park;

/// When an entry accepted at `created_at` with its window opened at `window_start` expires:
/// the sliding window, never past the absolute cap.
pub(crate) fn expires_at(created_at: Millis, window_start: Millis, config: &Config) -> Millis {
    let sliding = window_start.saturating_add(config.outbox_max_lifetime_ms);
    sliding.min(absolute_cap(created_at, config))
}

pub(crate) fn absolute_cap(created_at: Millis, config: &Config) -> Millis {
    created_at.saturating_add(config.absolute_lifetime_ms())
}

/// An entry's place in acceptance order. Keys only grow, so the oldest entry of a class is its
/// smallest key (capacity eviction) and ties in the retry queue break towards older entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Key(u64);

/// Capacity class: file chunks have their own, smaller bound so media cannot crowd out text.
/// A group message's per-member copies are outside both: the group message counts once among
/// the regular entries (`docs/delivery.md#group-sends`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    Regular,
    Media,
    GroupCopy,
}

impl Class {
    pub(crate) fn of(content_type: ContentType) -> Self {
        match content_type {
            ContentType::FileChunk => Self::Media,
            _ => Self::Regular,
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Regular => 0,
            Self::Media => 1,
            Self::GroupCopy => 2,
        }
    }

    /// A zero bound would leave no room for the message being accepted; it behaves as one.
    pub(crate) fn capacity(self, config: &Config) -> usize {
        let configured = match self {
            Self::Regular => config.outbox_max_entries,
            Self::Media => config.outbox_max_media_entries,
            // Bounded by their group messages: roster size times the regular bound.
            Self::GroupCopy => usize::MAX,
        };
        configured.max(1)
    }
}

/// Where an entry is. Each variant carries what moves it on, so "queued but forgotten" or
/// "awaiting an ACK without a deadline" cannot be expressed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Phase {
    /// In the retry queue, due at `at`; it goes once a carrier and an in-flight slot are free.
    /// Dropped at `expires_at` if still here (an entry only expires while nothing is pending).
    Queued { at: Millis, expires_at: Millis },
    /// Handed to `carrier`: the runtime owes `Input::Written` or `Input::SendFailed`, or the
    /// carrier goes down and takes the attempt with it. An app carrier's send must report by
    /// `deadline` or counts as failed (`docs/delivery.md#app-carrier-send-deadline`): it runs
    /// app code the engine cannot otherwise bound. The relay and gateway carriers bound their
    /// own writes and answers, so theirs is `None`.
    Handed {
        send_seq: u64,
        carrier: Carrier,
        deadline: Option<Millis>,
    },
    /// Written; the end-to-end ACK is due by `deadline`.
    AwaitingAck { send_seq: u64, deadline: Millis },
    /// Parked and quiet (`edgeDrivenUnreachableDm` after its bounded timed probes): no send
    /// timer, only the lifetime; a reachability edge moves it.
    Resting { expires_at: Millis },
}

#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Built once at accept, under the app's id; every transmission sends exactly this, under
    /// `wire_id`.
    pub message: Message,
    /// The id the message travels under (`docs/protocol.md#message-ids`), derived from the app's
    /// id; the runtime's reports and the recipient's ACK name it.
    pub wire_id: String,
    pub created_at: Millis,
    pub window_start: Millis,
    pub ack_attempts: u32,
    pub transport_retries: u32,
    pub first_sent_at: Option<Millis>,
    pub last_sent_at: Option<Millis>,
    /// Parked (unreachable verdict) or in relay custody ("stored"): paced by probes and edges
    /// instead of the ACK ladder until a "live" answer, a direct-link write or the ACK.
    pub park: Option<Park>,
    /// Timed probes scheduled in this park episode (bounded under `edgeDrivenUnreachableDm`;
    /// an edge starts a new episode). Not persisted: a restart is an edge.
    pub timed_probes: u8,
    pub phase: Phase,
}

impl Entry {
    pub(crate) fn class(&self) -> Class {
        if self.message.metadata.contains_key(META_GROUP_MESSAGE) {
            Class::GroupCopy
        } else {
            Class::of(self.message.content_type)
        }
    }

    /// The message as it goes on the wire.
    pub(crate) fn wire_message(&self) -> Message {
        let mut message = self.message.clone();
        message.id.clone_from(&self.wire_id);
        message
    }

    pub(crate) fn expires_at(&self, config: &Config) -> Millis {
        expires_at(self.created_at, self.window_start, config)
    }

    pub(crate) fn state(&self) -> EntryState {
        match self.phase {
            Phase::Queued { .. } if self.park.is_some() => EntryState::Parked,
            Phase::Resting { .. } => EntryState::Parked,
            Phase::Queued { .. } => EntryState::Queued,
            Phase::Handed { .. } | Phase::AwaitingAck { .. } => EntryState::InFlight,
        }
    }

    /// The attempt a runtime report may refer to.
    pub(crate) fn current_send_seq(&self) -> Option<u64> {
        match self.phase {
            Phase::Queued { .. } | Phase::Resting { .. } => None,
            Phase::Handed { send_seq, .. } | Phase::AwaitingAck { send_seq, .. } => Some(send_seq),
        }
    }

    pub(crate) fn record(&self) -> OutboxRecord {
        let next_at = match self.phase {
            Phase::Queued { at, .. } => Some(at),
            Phase::Handed { .. } | Phase::Resting { .. } => None,
            Phase::AwaitingAck { deadline, .. } => Some(deadline),
        };
        OutboxRecord {
            message: self.message.clone(),
            state: self.state(),
            created_at: self.created_at,
            window_start: self.window_start,
            ack_attempts: self.ack_attempts,
            transport_retries: self.transport_retries,
            next_at,
            first_sent_at: self.first_sent_at,
            last_sent_at: self.last_sent_at,
        }
    }
}

/// The live entries, by key, by id and by recipient, with each class's keys in age order for
/// eviction. Order
/// lives in the small key indexes (here and in the timers), so the large entries sit in a hash
/// map and are never moved around by ordered-tree rebalancing.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    entries: HashMap<Key, Entry>,
    /// By the app's id: sends, status, settlement.
    ids: HashMap<String, Key>,
    /// By the wire id: the runtime's reports and the recipient's ACK.
    wire_ids: HashMap<String, Key>,
    /// Every entry of each recipient (edges, the neighbor flush, parking bookkeeping).
    recipients: HashMap<String, BTreeSet<Key>>,
    classes: [BTreeSet<Key>; 3],
    next_key: u64,
}

impl Outbox {
    /// The entry the app named `id`.
    pub(crate) fn key_of(&self, id: &str) -> Option<Key> {
        self.ids.get(id).copied()
    }

    /// The entry that travels as `wire_id`.
    pub(crate) fn key_of_wire(&self, wire_id: &str) -> Option<Key> {
        self.wire_ids.get(wire_id).copied()
    }

    pub(crate) fn get(&self, key: Key) -> Option<&Entry> {
        self.entries.get(&key)
    }

    pub(crate) fn get_mut(&mut self, key: Key) -> Option<&mut Entry> {
        self.entries.get_mut(&key)
    }

    /// The next key in acceptance order, for something accepted beside the entries (a group
    /// message, which counts against the same bound).
    pub(crate) fn next_key(&mut self) -> Key {
        let key = Key(self.next_key);
        self.next_key += 1;
        key
    }

    /// The caller has checked that the id is new.
    pub(crate) fn insert(&mut self, entry: Entry) -> Key {
        let key = self.next_key();
        self.ids.insert(entry.message.id.clone(), key);
        self.wire_ids.insert(entry.wire_id.clone(), key);
        self.recipients
            .entry(entry.message.recipient.clone())
            .or_default()
            .insert(key);
        self.classes[entry.class().index()].insert(key);
        self.entries.insert(key, entry);
        key
    }

    pub(crate) fn remove(&mut self, key: Key) -> Option<Entry> {
        let entry = self.entries.remove(&key)?;
        self.ids.remove(&entry.message.id);
        self.wire_ids.remove(&entry.wire_id);
        if let Some(keys) = self.recipients.get_mut(&entry.message.recipient) {
            keys.remove(&key);
            if keys.is_empty() {
                self.recipients.remove(&entry.message.recipient);
            }
        }
        self.classes[entry.class().index()].remove(&key);
        Some(entry)
    }

    /// The entries addressed to `recipient`, oldest first.
    pub(crate) fn keys_to(&self, recipient: &str) -> Vec<Key> {
        self.recipients
            .get(recipient)
            .map(|keys| keys.iter().copied().collect())
            .unwrap_or_default()
    }

    pub(crate) fn has_recipient(&self, recipient: &str) -> bool {
        self.recipients.contains_key(recipient)
    }

    pub(crate) fn oldest(&self, class: Class) -> Option<Key> {
        self.classes[class.index()].first().copied()
    }

    pub(crate) fn count(&self, class: Class) -> usize {
        self.classes[class.index()].len()
    }

    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Key, &Entry)> {
        self.entries.iter().map(|(key, entry)| (*key, entry))
    }

    #[cfg(test)]
    pub(crate) fn check(&self) {
        assert_eq!(self.ids.len(), self.entries.len(), "id index out of step");
        assert_eq!(
            self.wire_ids.len(),
            self.entries.len(),
            "wire id index out of step"
        );
        for (key, entry) in &self.entries {
            assert_eq!(
                self.ids.get(&entry.message.id),
                Some(key),
                "id index out of step"
            );
            assert_eq!(
                self.wire_ids.get(&entry.wire_id),
                Some(key),
                "wire id index out of step"
            );
            assert!(
                self.classes[entry.class().index()].contains(key),
                "class index out of step"
            );
            assert!(
                self.recipients
                    .get(&entry.message.recipient)
                    .is_some_and(|keys| keys.contains(key)),
                "recipient index out of step"
            );
        }
        assert_eq!(
            self.recipients.values().map(BTreeSet::len).sum::<usize>(),
            self.entries.len(),
            "recipient index out of step"
        );
        assert_eq!(
            self.classes.iter().map(BTreeSet::len).sum::<usize>(),
            self.entries.len()
        );
    }
}
