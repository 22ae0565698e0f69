//! Inbound dedup (`docs/delivery.md#inbound-dedup`): the `(chat, sender, messageId)` of processed
//! messages, remembered for the retention period and bounded by count, so a redelivery — the relay
//! leg is at-least-once — is re-acknowledged without reaching the application twice.

use std::collections::{HashMap, VecDeque};

use crate::io::{InboundKey, Millis, ProcessedKey};

#[derive(Debug)]
pub(crate) struct Dedup {
    max_entries: usize,
    retention_ms: u64,
    seen: HashMap<InboundKey, Millis>,
    /// Processing order, oldest first: what count and age pruning drop.
    order: VecDeque<(Millis, InboundKey)>,
}

impl Dedup {
    pub(crate) fn new(max_entries: usize, retention_ms: u64) -> Self {
        Self {
            max_entries,
            retention_ms,
            seen: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    pub(crate) fn restore(&mut self, mut keys: Vec<ProcessedKey>, now: Millis) {
        keys.sort_by_key(|key| key.at);
        for ProcessedKey { key, at } in keys {
            self.insert(key, at);
        }
        self.prune(now);
    }

    /// Records `key` as processed at `now`; false when it already was.
    pub(crate) fn first_sighting(&mut self, key: &InboundKey, now: Millis) -> bool {
        self.prune(now);
        if self.seen.contains_key(key) {
            return false;
        }
        self.insert(key.clone(), now);
        true
    }

    /// Whether `key` was processed within the retention (hook mode: the hook's commit records it).
    pub(crate) fn contains(&mut self, key: &InboundKey, now: Millis) -> bool {
        self.prune(now);
        self.seen.contains_key(key)
    }

    /// Records `key` as processed at `now` (the durability hook committed it).
    pub(crate) fn record(&mut self, key: InboundKey, now: Millis) {
        self.prune(now);
        self.insert(key, now);
    }

    fn insert(&mut self, key: InboundKey, at: Millis) {
        if self.max_entries == 0 || self.seen.contains_key(&key) {
            return;
        }
        while self.order.len() >= self.max_entries {
            self.pop_oldest();
        }
        self.seen.insert(key.clone(), at);
        self.order.push_back((at, key));
    }

    fn prune(&mut self, now: Millis) {
        while let Some((at, _)) = self.order.front() {
            if at.saturating_add(self.retention_ms) > now {
                break;
            }
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some((_, key)) = self.order.pop_front() {
            self.seen.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> InboundKey {
        InboundKey {
            chat: "bob".into(),
            sender: "bob".into(),
            message_id: id.into(),
        }
    }

    #[test]
    fn remembers_within_retention_and_count() {
        let mut dedup = Dedup::new(2, 1000);
        assert!(dedup.first_sighting(&key("a"), 0));
        assert!(!dedup.first_sighting(&key("a"), 999));
        assert!(
            dedup.first_sighting(&key("a"), 1000),
            "forgotten after the retention"
        );
        assert!(dedup.first_sighting(&key("b"), 1001));
        assert!(dedup.first_sighting(&key("c"), 1002));
        assert!(
            dedup.first_sighting(&key("a"), 1003),
            "the oldest goes at the count bound"
        );
        assert!(!dedup.first_sighting(&key("c"), 1004));
    }

    #[test]
    fn a_key_recorded_twice_counts_once_against_the_bound() {
        let mut dedup = Dedup::new(2, 1000);
        dedup.record(key("a"), 0);
        dedup.record(key("a"), 1);
        dedup.record(key("b"), 2);
        assert!(
            dedup.contains(&key("a"), 3),
            "a holds one of the two places"
        );
        assert!(dedup.contains(&key("b"), 3));
    }

    #[test]
    fn a_zero_bound_remembers_nothing() {
        let mut dedup = Dedup::new(0, 1000);
        assert!(dedup.first_sighting(&key("a"), 0));
        assert!(dedup.first_sighting(&key("a"), 1));
    }
}
