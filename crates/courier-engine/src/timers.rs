//! Every entry's pending work, indexed by time: the retry queue, ACK deadlines, lifetime
//! expiries, and the entries handed to a carrier. `arm`/`disarm` derive membership from the
//! entry's phase (and custody flag, for the parked count) alone, so the indexes cannot disagree
//! with the phases they mirror.

use std::collections::BTreeSet;

use courier_proto::Priority;

use crate::io::Millis;
use crate::outbox::{Key, Phase};
use crate::retry_queue::RetryQueue;

#[derive(Debug, Default, PartialEq)]
pub(crate) struct Timers {
    queue: RetryQueue,
    acks: Deadlines,
    expiries: Deadlines,
    handed: BTreeSet<Key>,
    /// Queued entries in relay custody: counted here so `stats()` stays O(1).
    parked: usize,
}

impl Timers {
    pub(crate) fn arm(&mut self, key: Key, priority: Priority, custody: bool, phase: &Phase) {
        match *phase {
            Phase::Queued { at, expires_at } => {
                self.queue.insert(at, priority, key);
                self.expiries.insert(expires_at, key);
                self.parked += usize::from(custody);
            }
            Phase::Handed { .. } => {
                self.handed.insert(key);
            }
            Phase::AwaitingAck { deadline, .. } => self.acks.insert(deadline, key),
        }
    }

    pub(crate) fn disarm(&mut self, key: Key, priority: Priority, custody: bool, phase: &Phase) {
        match *phase {
            Phase::Queued { at, expires_at } => {
                self.queue.remove(at, priority, key);
                self.expiries.remove(expires_at, key);
                self.parked = self.parked.saturating_sub(usize::from(custody));
            }
            Phase::Handed { .. } => {
                self.handed.remove(&key);
            }
            Phase::AwaitingAck { deadline, .. } => self.acks.remove(deadline, key),
        }
    }

    /// Handed to a carrier or awaiting an ACK: what `max_pending_acks` bounds.
    pub(crate) fn in_flight(&self) -> usize {
        self.handed.len() + self.acks.len()
    }

    pub(crate) fn handed(&self) -> Vec<Key> {
        self.handed.iter().copied().collect()
    }

    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn parked(&self) -> usize {
        self.parked
    }

    pub(crate) fn first_due_send(&self, now: Millis) -> Option<Key> {
        self.queue.first_due(now)
    }

    pub(crate) fn queued_later_than(&self, now: Millis) -> Vec<Key> {
        self.queue.later_than(now)
    }

    pub(crate) fn due_acks(&self, now: Millis) -> Vec<Key> {
        self.acks.due(now)
    }

    pub(crate) fn due_expiries(&self, now: Millis) -> Vec<Key> {
        self.expiries.due(now)
    }

    /// Queued sends only count when they can go (`sending`): while no carrier is up or every
    /// in-flight slot is taken they wait for that edge, and reporting their time would make
    /// the runtime spin on work it cannot do.
    pub(crate) fn next_deadline(&self, sending: bool) -> Option<Millis> {
        let sends = if sending { self.queue.next_at() } else { None };
        [self.acks.first(), self.expiries.first(), sends]
            .into_iter()
            .flatten()
            .min()
    }
}

#[derive(Debug, Default, PartialEq)]
struct Deadlines(BTreeSet<(Millis, Key)>);

impl Deadlines {
    fn insert(&mut self, at: Millis, key: Key) {
        self.0.insert((at, key));
    }

    fn remove(&mut self, at: Millis, key: Key) {
        self.0.remove(&(at, key));
    }

    fn first(&self) -> Option<Millis> {
        self.0.first().map(|(at, _)| *at)
    }

    fn due(&self, now: Millis) -> Vec<Key> {
        self.0
            .iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, key)| *key)
            .collect()
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}
