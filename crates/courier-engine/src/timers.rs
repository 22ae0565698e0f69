//! Every entry's pending work, indexed by time: the retry queue, the probe queue of parked
//! entries, ACK deadlines, lifetime expiries, and the entries handed to a carrier. `arm`/`disarm`
//! derive membership from the entry's phase (and its parked flag) alone, so the indexes cannot
//! disagree with the phases they mirror.
//!
//! Parked entries due for a probe sit in their own queue so that a send budget which holds them
//! back (`edgeDrivenUnreachableDm`) never holds back the ordinary retries behind them, and so an
//! idle engine's next deadline is exactly its earliest due probe.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use courier_proto::Priority;

use crate::io::Millis;
use crate::outbox::{Key, Phase};
use crate::retry_queue::RetryQueue;

#[derive(Debug, Default, PartialEq)]
pub(crate) struct Timers {
    queue: RetryQueue,
    probes: RetryQueue,
    acks: Deadlines,
    expiries: Deadlines,
    /// App carrier sends that must report by then.
    send_deadlines: Deadlines,
    handed: BTreeSet<Key>,
    /// Parked entries waiting (queued for a probe, or resting): counted here so `stats()`
    /// stays O(1).
    parked: usize,
}

/// Which queued entries may go now.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gate {
    /// `false` while the send budget of parked entries is empty.
    pub probes: bool,
}

impl Timers {
    pub(crate) fn arm(&mut self, key: Key, priority: Priority, parked: bool, phase: &Phase) {
        match *phase {
            Phase::Queued { at, expires_at } => {
                self.queue_for(parked).insert(at, priority, key);
                self.expiries.insert(expires_at, key);
                self.parked += usize::from(parked);
            }
            Phase::Resting { expires_at } => {
                self.expiries.insert(expires_at, key);
                self.parked += 1;
            }
            Phase::Handed { deadline, .. } => {
                self.handed.insert(key);
                if let Some(deadline) = deadline {
                    self.send_deadlines.insert(deadline, key);
                }
            }
            Phase::AwaitingAck { deadline, .. } => self.acks.insert(deadline, key),
        }
    }

    pub(crate) fn disarm(&mut self, key: Key, priority: Priority, parked: bool, phase: &Phase) {
        match *phase {
            Phase::Queued { at, expires_at } => {
                self.queue_for(parked).remove(at, priority, key);
                self.expiries.remove(expires_at, key);
                self.parked = self.parked.saturating_sub(usize::from(parked));
            }
            Phase::Resting { expires_at } => {
                self.expiries.remove(expires_at, key);
                self.parked = self.parked.saturating_sub(1);
            }
            Phase::Handed { deadline, .. } => {
                self.handed.remove(&key);
                if let Some(deadline) = deadline {
                    self.send_deadlines.remove(deadline, key);
                }
            }
            Phase::AwaitingAck { deadline, .. } => self.acks.remove(deadline, key),
        }
    }

    fn queue_for(&mut self, parked: bool) -> &mut RetryQueue {
        if parked {
            &mut self.probes
        } else {
            &mut self.queue
        }
    }

    /// Handed to a carrier or awaiting an ACK: what `max_pending_acks` bounds.
    pub(crate) fn in_flight(&self) -> usize {
        self.handed.len() + self.acks.len()
    }

    pub(crate) fn handed(&self) -> Vec<Key> {
        self.handed.iter().copied().collect()
    }

    /// Queued entries that are not parked: the retry queue of `stats()`.
    pub(crate) fn retry_queue(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn parked(&self) -> usize {
        self.parked
    }

    /// The next entry to send at `now` in retry-queue order (time, then priority, then age)
    /// across both queues, as far as `gate` lets probes go.
    pub(crate) fn first_due_send(&self, now: Millis, gate: Gate) -> Option<Key> {
        let ordinary = self.queue.first().filter(|(at, _, _)| *at <= now);
        let probe = self
            .probes
            .first()
            .filter(|(at, _, _)| gate.probes && *at <= now);
        [ordinary, probe]
            .into_iter()
            .flatten()
            .min()
            .map(|(_, _, key)| key)
    }

    /// Every queued entry (both queues) not due yet at `now`: what a flush brings forward.
    pub(crate) fn queued_later_than(&self, now: Millis) -> Vec<Key> {
        let mut keys = self.queue.later_than(now);
        keys.extend(self.probes.later_than(now));
        keys
    }

    pub(crate) fn due_acks(&self, now: Millis) -> Vec<Key> {
        self.acks.due(now)
    }

    /// App carrier sends still unreported at their deadline.
    pub(crate) fn due_send_deadlines(&self, now: Millis) -> Vec<Key> {
        self.send_deadlines.due(now)
    }

    pub(crate) fn due_expiries(&self, now: Millis) -> Vec<Key> {
        self.expiries.due(now)
    }

    /// ACK deadlines, app carrier send deadlines and lifetime expiries: due whatever the
    /// carriers.
    pub(crate) fn next_fixed_deadline(&self) -> Option<Millis> {
        [
            self.acks.first(),
            self.send_deadlines.first(),
            self.expiries.first(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The earliest queued send, with probes not before `probes_from` (the send budget).
    pub(crate) fn next_send(&self, probes_from: Millis) -> Option<Millis> {
        let probe = self.probes.next_at().map(|at| at.max(probes_from));
        [self.queue.next_at(), probe].into_iter().flatten().min()
    }
}

/// A retry-queue position, ordered as the queue is.
pub(crate) type Slot = (Millis, Reverse<Priority>, Key);

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
