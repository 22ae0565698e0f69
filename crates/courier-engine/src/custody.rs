//! Relay custody pacing (`delivery.md` item 8). When the relay answers "stored" its mailbox
//! holds the message, so re-sending on the ACK ladder would only burn budget against a
//! recipient who is away. The entry is instead probed at the parked cadence: 15 s doubling to a
//! 600 s cap. The escalation is per recipient, so a burst of messages to one absent peer climbs
//! one shared ladder, and it resets on a reachability edge (carrier up, or a delivery from that
//! recipient, which also re-drives its other held messages at once).

use std::collections::{BTreeSet, HashMap};

use crate::outbox::Key;

const FIRST_PROBE_MS: u64 = 15_000;
const MAX_PROBE_MS: u64 = 600_000;

#[derive(Debug, Default)]
pub(crate) struct Custody {
    by_recipient: HashMap<String, Held>,
}

#[derive(Debug, Default)]
struct Held {
    keys: BTreeSet<Key>,
    /// Consecutive "stored" answers (or unanswered probes) since the last reachability edge.
    escalation: u32,
}

impl Custody {
    pub(crate) fn hold(&mut self, recipient: &str, key: Key) {
        self.by_recipient
            .entry(recipient.to_owned())
            .or_default()
            .keys
            .insert(key);
    }

    /// The escalation goes with the last held message: a recipient with nothing in custody has
    /// nothing to pace.
    pub(crate) fn release(&mut self, recipient: &str, key: Key) {
        if let Some(held) = self.by_recipient.get_mut(recipient) {
            held.keys.remove(&key);
            if held.keys.is_empty() {
                self.by_recipient.remove(recipient);
            }
        }
    }

    /// The delay before the next probe to `recipient`, climbing its ladder one step.
    pub(crate) fn next_probe_delay(&mut self, recipient: &str) -> u64 {
        let Some(held) = self.by_recipient.get_mut(recipient) else {
            return FIRST_PROBE_MS;
        };
        let delay = probe_delay(held.escalation);
        held.escalation = held.escalation.saturating_add(1);
        delay
    }

    pub(crate) fn reset_escalation(&mut self) {
        for held in self.by_recipient.values_mut() {
            held.escalation = 0;
        }
    }

    /// A reachability edge for one recipient: its ladder restarts and its held messages are
    /// returned for an immediate re-drive.
    pub(crate) fn redrive(&mut self, recipient: &str) -> Vec<Key> {
        match self.by_recipient.get_mut(recipient) {
            Some(held) => {
                held.escalation = 0;
                held.keys.iter().copied().collect()
            }
            None => Vec::new(),
        }
    }

    #[cfg(test)]
    pub(crate) fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.by_recipient
            .values()
            .flat_map(|held| held.keys.iter().copied())
    }
}

fn probe_delay(escalation: u32) -> u64 {
    let factor = 1u64.checked_shl(escalation).unwrap_or(u64::MAX);
    FIRST_PROBE_MS.saturating_mul(factor).min(MAX_PROBE_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_ladder_doubles_to_the_cap() {
        let ladder: Vec<u64> = (0..9).map(|e| probe_delay(e) / 1000).collect();
        assert_eq!(ladder, [15, 30, 60, 120, 240, 480, 600, 600, 600]);
        assert_eq!(probe_delay(u32::MAX), MAX_PROBE_MS);
    }
}
