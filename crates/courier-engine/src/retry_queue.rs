//! The retry queue: entries waiting to be sent. Earliest time first; on equal times the higher
//! priority; then the older entry, so that the order is deterministic
//! (`docs/delivery.md#retry-order`).

use std::cmp::Reverse;
use std::collections::BTreeSet;

use courier_proto::Priority;

use crate::io::Millis;
use crate::outbox::Key;

#[derive(Debug, Default, PartialEq)]
pub(crate) struct RetryQueue {
    slots: BTreeSet<(Millis, Reverse<Priority>, Key)>,
}

impl RetryQueue {
    pub(crate) fn insert(&mut self, at: Millis, priority: Priority, key: Key) {
        self.slots.insert((at, Reverse(priority), key));
    }

    pub(crate) fn remove(&mut self, at: Millis, priority: Priority, key: Key) {
        self.slots.remove(&(at, Reverse(priority), key));
    }

    pub(crate) fn next_at(&self) -> Option<Millis> {
        self.slots.first().map(|(at, _, _)| *at)
    }

    pub(crate) fn first(&self) -> Option<(Millis, Reverse<Priority>, Key)> {
        self.slots.first().copied()
    }

    /// Entries whose time has not come yet (what a flush brings forward).
    pub(crate) fn later_than(&self, now: Millis) -> Vec<Key> {
        self.slots
            .iter()
            .skip_while(|(at, _, _)| *at <= now)
            .map(|(_, _, key)| *key)
            .collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }
}
