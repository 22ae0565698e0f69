//! Inbound dedup (`docs/delivery.md#inbound-dedup`): the `(chat, sender, messageId)` of processed
//! messages, remembered for the retention period and bounded by count, so a redelivery — the relay
//! leg is at-least-once — is re-acknowledged without reaching the application twice.
//!
//! The keys of verified control frames are kept apart, for as long as a replay of the frame would
//! still pass its freshness check, and no count evicts them: a flood of distinct messages must not
//! make room for a control frame to be processed again (`docs/delivery.md#control-frames`). Only
//! age bounds them: each is a frame its carrier's sender signed, admitted through that carrier's
//! own limits.

use std::collections::{HashMap, VecDeque};

use courier_proto::CONTROL_REPLAY_WINDOW_MS;

use crate::io::{InboundKey, Millis, ProcessedKey};

#[derive(Debug)]
pub(crate) struct Dedup {
    data: Remembered,
    control: Remembered,
}

impl Dedup {
    pub(crate) fn new(max_entries: usize, retention_ms: u64) -> Self {
        Self {
            data: Remembered::new(Some(max_entries), retention_ms),
            control: Remembered::new(None, CONTROL_REPLAY_WINDOW_MS),
        }
    }

    pub(crate) fn restore(
        &mut self,
        processed: Vec<ProcessedKey>,
        controls: Vec<ProcessedKey>,
        now: Millis,
    ) {
        self.data.restore(processed, now);
        self.control.restore(controls, now);
    }

    /// Records `key` as processed at `now`; false when it already was.
    pub(crate) fn first_sighting(&mut self, key: &InboundKey, now: Millis) -> bool {
        if self.contains(key, now) {
            return false;
        }
        self.data.insert(key.clone(), now);
        true
    }

    /// Records the key of a verified control frame as processed at `now`, kept for the replay
    /// window; false when it already was processed.
    pub(crate) fn first_control_sighting(&mut self, key: &InboundKey, now: Millis) -> bool {
        if self.contains(key, now) {
            return false;
        }
        self.control.insert(key.clone(), now);
        true
    }

    /// Whether `key` was processed within the retention (hook mode: the hook's commit records it).
    pub(crate) fn contains(&mut self, key: &InboundKey, now: Millis) -> bool {
        self.data.contains(key, now) || self.control.contains(key, now)
    }

    /// Records `key` as processed at `now` (the durability hook committed it).
    pub(crate) fn record(&mut self, key: InboundKey, now: Millis) {
        self.data.prune(now);
        self.data.insert(key, now);
    }
}

/// Keys processed within `retention_ms`, the oldest dropped past `max_entries` when there is one.
#[derive(Debug)]
struct Remembered {
    max_entries: Option<usize>,
    retention_ms: u64,
    seen: HashMap<InboundKey, Millis>,
    /// Processing order, oldest first: what count and age pruning drop.
    order: VecDeque<(Millis, InboundKey)>,
}

impl Remembered {
    fn new(max_entries: Option<usize>, retention_ms: u64) -> Self {
        Self {
            max_entries,
            retention_ms,
            seen: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn restore(&mut self, mut keys: Vec<ProcessedKey>, now: Millis) {
        keys.sort_by_key(|key| key.at);
        for ProcessedKey { key, at } in keys {
            self.insert(key, at);
        }
        self.prune(now);
    }

    fn contains(&mut self, key: &InboundKey, now: Millis) -> bool {
        self.prune(now);
        self.seen.contains_key(key)
    }

    fn insert(&mut self, key: InboundKey, at: Millis) {
        if self.max_entries == Some(0) || self.seen.contains_key(&key) {
            return;
        }
        if let Some(max) = self.max_entries {
            while self.order.len() >= max {
                self.pop_oldest();
            }
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
    fn a_flood_of_messages_cannot_evict_a_control_frame_before_its_signature_expires() {
        let mut dedup = Dedup::new(2, 1000);
        assert!(dedup.first_control_sighting(&key("welcome"), 0));
        for (i, id) in ["a", "b", "c", "d"].into_iter().enumerate() {
            assert!(dedup.first_sighting(&key(id), 1 + i as u64));
        }
        assert!(!dedup.first_control_sighting(&key("welcome"), 5));
        assert!(
            !dedup.first_control_sighting(&key("welcome"), CONTROL_REPLAY_WINDOW_MS - 1),
            "kept past the data retention, for as long as the signature is fresh"
        );
        assert!(dedup.first_control_sighting(&key("welcome"), CONTROL_REPLAY_WINDOW_MS));
    }

    #[test]
    fn restored_control_keys_are_kept_apart_from_the_count_bound() {
        let mut dedup = Dedup::new(1, 1000);
        let at = |id: &str, at| ProcessedKey { key: key(id), at };
        dedup.restore(vec![at("a", 10), at("b", 11)], vec![at("welcome", 0)], 12);
        assert!(!dedup.first_control_sighting(&key("welcome"), 13));
        assert!(dedup.contains(&key("b"), 13));
        assert!(!dedup.contains(&key("a"), 13), "the data bound still holds");
    }

    #[test]
    fn a_zero_bound_remembers_nothing() {
        let mut dedup = Dedup::new(0, 1000);
        assert!(dedup.first_sighting(&key("a"), 0));
        assert!(dedup.first_sighting(&key("a"), 1));
    }
}
