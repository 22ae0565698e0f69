//! Parking and relay custody: the per-recipient pacing shared by both (`docs/delivery.md#parking`).
//!
//! An entry is *parked* when the relay answered its current attempt with the unreachable
//! verdict ([`Park::Unreachable`]) or took custody of it ([`Park::Custody`], "stored"). Both
//! kinds leave the ACK ladder and are paced the same way:
//!
//! - **Probe ladder, per recipient.** Each park of any message to a recipient climbs that
//!   recipient's escalation counter once; the probe is scheduled `15 s × 2^(counter−1)` out,
//!   capped at 600 s. The counter is per recipient while the probes are per message, so a burst
//!   to one absent peer climbs one shared ladder.
//! - **Reachability edges reset it**: the relay coming up (reconnect), `restore`
//!   (start), the peer discovered as a neighbor on a local carrier, the peer reported online by
//!   presence, the delivery of one of the peer's messages, and an inbound message carried by the
//!   peer (`docs/delivery.md#edge-driven-mode` counts on returning peers that send an inbound
//!   frame).
//! - **The verdict flag** (`docs/glossary.md#verdict`): the recipient got an unreachable verdict
//!   since its last edge. While it holds, an entry that exhausts its ACK budget (a probe the relay
//!   accepted but nobody acknowledged) re-parks instead of failing. Custody alone does not set it:
//!   a relay that stored the message and later wrote it to the recipient's live socket says the
//!   recipient is reachable, so the ordinary ladder decides.
//!
//! A recipient's record lives while it has parked entries, a climbed counter or the verdict
//! flag, and goes with its last outbox entry, so the map is bounded by the outbox. Every entry
//! parked since the recipient's last edge (its *episode*: parked now, resting, or a probe the
//! relay accepted that now climbs the ACK ladder) has a record to find it by, since its park
//! climbed the counter and only an edge resets it.
//!
//! The escalation is not persisted: a restart is itself a reachability edge.

use std::collections::{BTreeSet, HashMap};

use crate::outbox::Key;

pub(crate) const FIRST_PROBE_MS: u64 = 15_000;
pub(crate) const MAX_PROBE_MS: u64 = 600_000;

/// Why an entry is parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Park {
    /// The relay's `recipient_unreachable` verdict for the entry's attempt.
    Unreachable,
    /// The relay's mailbox holds it (`disposition: "stored"`).
    Custody,
}

#[derive(Debug, Default)]
pub(crate) struct Parking {
    peers: HashMap<String, ProbeLadder>,
    /// Recipients whose watch status may have changed during the current call.
    touched: BTreeSet<String>,
}

#[derive(Debug, Default)]
struct ProbeLadder {
    parked: BTreeSet<Key>,
    /// Parks since the last reachability edge.
    escalation: u32,
    /// An unreachable verdict since the last reachability edge.
    verdict: bool,
}

impl ProbeLadder {
    fn idle(&self) -> bool {
        self.parked.is_empty() && self.escalation == 0 && !self.verdict
    }

    fn watched(&self) -> bool {
        self.verdict || !self.parked.is_empty()
    }
}

impl Parking {
    pub(crate) fn hold(&mut self, recipient: &str, key: Key) {
        self.change(recipient, |l| {
            l.parked.insert(key);
        });
    }

    /// `key` left `recipient`'s park (its ACK, a live answer, settlement).
    pub(crate) fn unhold(&mut self, recipient: &str, key: Key) {
        self.change(recipient, |l| {
            l.parked.remove(&key);
        });
    }

    /// One park of a message to `recipient`: the delay before its probe, climbing the ladder.
    pub(crate) fn climb(&mut self, recipient: &str) -> u64 {
        let mut delay = FIRST_PROBE_MS;
        self.change(recipient, |l| {
            l.escalation = l.escalation.saturating_add(1);
            delay = probe_delay(l.escalation);
        });
        delay
    }

    pub(crate) fn set_verdict(&mut self, recipient: &str) {
        self.change(recipient, |l| l.verdict = true);
    }

    /// Whether the recipient holds a verdict (`docs/glossary.md#verdict`): an unreachable verdict
    /// since the last edge.
    pub(crate) fn has_verdict(&self, recipient: &str) -> bool {
        self.peers.get(recipient).is_some_and(|l| l.verdict)
    }

    /// The escalation counter of `recipient` (parks since its last edge).
    #[cfg(test)]
    pub(crate) fn counter(&self, recipient: &str) -> u32 {
        self.peers.get(recipient).map_or(0, |l| l.escalation)
    }

    /// A reachability edge for one recipient: its ladder and verdict reset. Returns whether it
    /// had a record — i.e. whether any of its entries parked since its last edge.
    pub(crate) fn edge(&mut self, recipient: &str) -> bool {
        if !self.peers.contains_key(recipient) {
            return false;
        }
        self.change(recipient, |l| {
            l.escalation = 0;
            l.verdict = false;
        });
        true
    }

    /// The recipients with a record (an edge for everyone visits these).
    pub(crate) fn recipients(&self) -> Vec<String> {
        self.peers.keys().cloned().collect()
    }

    /// `recipient` has no outbox entry left: nothing to pace or watch.
    pub(crate) fn forget(&mut self, recipient: &str) {
        if let Some(ladder) = self.peers.remove(recipient) {
            if ladder.watched() {
                self.touched.insert(recipient.to_owned());
            }
        }
    }

    /// Whether `recipient` belongs on the presence watchlist
    /// (`docs/delivery.md#presence-watchlist`): it has parked entries, or it just got a verdict.
    pub(crate) fn watched(&self, recipient: &str) -> bool {
        self.peers.get(recipient).is_some_and(ProbeLadder::watched)
    }

    /// Recipients whose `watched` value changed since the last call.
    pub(crate) fn take_touched(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.touched)
    }

    /// Applies `f` to the recipient's record (created on demand, dropped when idle) and notes a
    /// change of its watch status.
    fn change(&mut self, recipient: &str, f: impl FnOnce(&mut ProbeLadder)) {
        let (before, idle, after) = match self.peers.get_mut(recipient) {
            Some(ladder) => {
                let before = ladder.watched();
                f(ladder);
                (before, ladder.idle(), ladder.watched())
            }
            None => {
                let mut ladder = ProbeLadder::default();
                f(&mut ladder);
                let (idle, after) = (ladder.idle(), ladder.watched());
                if !idle {
                    self.peers.insert(recipient.to_owned(), ladder);
                }
                (false, idle, after)
            }
        };
        if idle {
            self.peers.remove(recipient);
        }
        if before != after {
            self.touched.insert(recipient.to_owned());
        }
    }

    #[cfg(test)]
    pub(crate) fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.peers.values().flat_map(|l| l.parked.iter().copied())
    }
}

/// Under `edgeDrivenUnreachableDm`: timed probes scheduled per park episode (from a park to the
/// next reachability edge) before the entry rests until an edge.
pub(crate) const EDGE_DRIVEN_PROBES: u8 = 3;
/// Under `edgeDrivenUnreachableDm`: sends of parked entries (probes and edge re-drives, every
/// carrier) are funded by a token bucket of this many sends…
pub(crate) const RESEND_BURST: u64 = 20;
/// …refilled continuously at this many per second, half the published relay's 10/s, so a large
/// unreachable backlog re-driven by one edge drains at a pace that leaves the client's relay
/// budget to live traffic. A send the bucket cannot fund waits (stays due), never dropped.
pub(crate) const RESEND_PER_SEC: u64 = 5;

/// The token bucket of [`RESEND_BURST`] / [`RESEND_PER_SEC`], in milli-sends so the refill is
/// exact integer arithmetic on virtual milliseconds (`RESEND_PER_SEC` milli-sends per ms).
#[derive(Debug)]
pub(crate) struct ResendBudget {
    milli: u64,
    at: u64,
}

const MILLI: u64 = 1000;

impl Default for ResendBudget {
    fn default() -> Self {
        Self {
            milli: RESEND_BURST * MILLI,
            at: 0,
        }
    }
}

impl ResendBudget {
    fn level(&self, now: u64) -> u64 {
        let refill = now.saturating_sub(self.at).saturating_mul(RESEND_PER_SEC);
        self.milli.saturating_add(refill).min(RESEND_BURST * MILLI)
    }

    pub(crate) fn available(&self, now: u64) -> bool {
        self.level(now) >= MILLI
    }

    pub(crate) fn take(&mut self, now: u64) -> bool {
        let level = self.level(now);
        // Time never runs backwards for the engine, but a stale `now` must not mint tokens.
        self.at = self.at.max(now);
        self.milli = level;
        if level < MILLI {
            return false;
        }
        self.milli -= MILLI;
        true
    }

    /// When the next send can be funded.
    pub(crate) fn ready_at(&self) -> u64 {
        if self.milli >= MILLI {
            return self.at;
        }
        let missing = MILLI - self.milli;
        self.at.saturating_add(missing.div_ceil(RESEND_PER_SEC))
    }
}

/// The probe delay after the `escalation`-th park since the last edge (1 → 15 s).
pub(crate) fn probe_delay(escalation: u32) -> u64 {
    let steps = escalation.saturating_sub(1);
    let factor = 1u64.checked_shl(steps).unwrap_or(u64::MAX);
    FIRST_PROBE_MS.saturating_mul(factor).min(MAX_PROBE_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_ladder_doubles_to_the_cap() {
        let ladder: Vec<u64> = (1..10).map(|e| probe_delay(e) / 1000).collect();
        assert_eq!(ladder, [15, 30, 60, 120, 240, 480, 600, 600, 600]);
        assert_eq!(probe_delay(0), FIRST_PROBE_MS);
        assert_eq!(probe_delay(u32::MAX), MAX_PROBE_MS);
    }

    #[test]
    fn the_resend_budget_funds_a_burst_then_its_rate() {
        let mut budget = ResendBudget::default();
        for _ in 0..RESEND_BURST {
            assert!(budget.take(1000));
        }
        assert!(!budget.available(1000));
        assert_eq!(budget.ready_at(), 1000 + 1000 / RESEND_PER_SEC);
        assert!(!budget.take(1199));
        assert_eq!(
            budget.ready_at(),
            1200,
            "a partly refilled bucket waits only for the rest"
        );
        assert!(budget.take(1200));
        // A long pause refills to the burst, no further.
        assert!(budget.available(1_000_000));
        assert_eq!(budget.level(1_000_000), RESEND_BURST * MILLI);
    }
}
