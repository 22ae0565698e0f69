//! The engine's own consistency checks, run by the test harness after every call.

use super::*;
use crate::OutboxRecord;

impl Engine {
    /// The id of the batch with the durability hook, if one is.
    pub(crate) fn batch_with_hook(&self) -> Option<u64> {
        self.hook.as_ref().and_then(HookPipeline::with_hook)
    }

    /// The engine's own consistency: indexes match phases, the in-flight cap holds, parked
    /// entries always have a probe timer or rest by the edge-driven rule, the watchlist follows
    /// the parking bookkeeping, no Put is left unemitted between calls.
    pub(crate) fn check_invariants(&self) {
        self.outbox.check();
        self.presence.check();
        self.presession.check();
        self.groups.check();
        for (_, entry) in self.outbox.iter() {
            if entry.class() == Class::GroupCopy {
                assert!(
                    self.groups.copy_owner(&entry.message.id).is_some(),
                    "group copy {} belongs to no group message",
                    entry.message.id
                );
            }
        }
        if let Some(hook) = &self.hook {
            hook.check();
        }
        let mut expected = Timers::default();
        let mut held = BTreeSet::new();
        let records: BTreeSet<String> = self.parking.recipients().into_iter().collect();
        for (key, entry) in self.outbox.iter() {
            let parked = entry.park.is_some();
            if parked || entry.timed_probes > 0 {
                assert!(
                    records.contains(&entry.message.recipient),
                    "{} of a park episode its next edge cannot find",
                    entry.message.id
                );
            }
            expected.arm(key, entry.message.priority, parked, &entry.phase);
            if parked {
                held.insert(key);
            }
            match entry.phase {
                Phase::Queued { expires_at, .. } => assert_eq!(
                    expires_at,
                    entry.expires_at(&self.config),
                    "expiry of {}",
                    entry.message.id
                ),
                Phase::Resting { expires_at } => {
                    assert_eq!(expires_at, entry.expires_at(&self.config));
                    assert!(
                        parked
                            && self.config.edge_driven_unreachable_dm
                            && entry.timed_probes >= EDGE_DRIVEN_PROBES,
                        "{} rests outside the edge-driven rule",
                        entry.message.id
                    );
                }
                Phase::Handed { .. } | Phase::AwaitingAck { .. } => {}
            }
        }
        assert_eq!(
            expected, self.timers,
            "timer indexes out of step with entry phases"
        );
        assert_eq!(
            held,
            self.parking.keys().collect::<BTreeSet<_>>(),
            "parking index out of step"
        );
        for recipient in &self.parking.recipients() {
            assert!(
                !self.outbox.keys_to(recipient).is_empty(),
                "parking record of {recipient} outlived its entries"
            );
            assert_eq!(
                self.presence.is_wanted(recipient),
                self.parking.watched(recipient) || self.presession.waits_for(recipient),
                "watchlist out of step for {recipient}"
            );
        }
        for recipient in self.presession.recipients() {
            assert!(
                self.presence.is_wanted(recipient),
                "{recipient} waits for a session unwatched"
            );
        }
        for peer in self.presence.wanted() {
            assert!(
                self.parking.watched(&peer) || self.presession.waits_for(&peer),
                "{peer} watched for nothing"
            );
        }
        assert!(
            self.timers.in_flight() <= self.config.max_pending_acks.max(1),
            "in-flight cap"
        );
        assert!(self.dirty.is_empty());
    }

    /// The keys of the buffered inbound rows the engine holds.
    pub(crate) fn inbound_keys(&self) -> BTreeSet<InboundKey> {
        self.hook
            .iter()
            .flat_map(|hook| hook.keys().cloned())
            .collect()
    }

    pub(crate) fn park_counter(&self, recipient: &str) -> u32 {
        self.parking.counter(recipient)
    }

    pub(crate) fn is_neighbor(&self, peer: &str) -> bool {
        self.neighbors.link_to(peer).is_some()
    }

    /// The rows storage should hold: the outbox's and the pre-session queue's.
    pub(crate) fn records(&self) -> Vec<OutboxRecord> {
        self.outbox
            .iter()
            .map(|(_, entry)| entry.record())
            .chain(self.presession.records(&self.config))
            .collect()
    }
}
