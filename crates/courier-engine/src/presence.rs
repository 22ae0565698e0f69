//! The presence watchlist (`docs/delivery.md#presence-watchlist`; on the wire
//! `docs/protocol.md#presence`).
//!
//! The watchlist holds the recipients the parking bookkeeping says to watch: those with parked
//! entries (unreachable or in relay custody, probing or resting) and those that just got a
//! verdict (until their next reachability edge); and the recipients whose messages wait in the
//! pre-session queue, whose coming online is a reason to set their session up again. An outbox entry that is merely queued is not
//! watched: it waits for a carrier, and presence arrives over the same relay connection whose
//! coming up already flushes it. With nothing stranded (`docs/delivery.md#invariant-2`), the parked
//! entries are the only ones not awaiting an ACK that presence can help.
//!
//! `poll_presence` reports changes of the watchlist itself — `Watch` when a peer enters it,
//! `Unwatch` when it leaves — whatever the connection: the runtime keeps the set, tells each new
//! relay connection all of it (watches are per connection) and polls what the relay's cap of
//! 1024 watches leaves over. Changes are coalesced until polled: a peer that enters and leaves
//! between two polls produces nothing, so the runtime never sees a peer watched or unwatched
//! twice in a row, and the pending changes are bounded by the number of distinct peers.
//!
//! The last reported status of each watched peer is kept so that `online: true` is a
//! reachability edge only when it is news: the first report on a connection, or a change from
//! offline. The polling fallback (`CheckPresence` every 20 s) therefore does not re-drive an
//! online peer on every poll. An unreachable verdict for the peer forgets its status (the relay
//! just said otherwise), so the next `online: true` is an edge again; so does the end of the
//! relay connection.

use std::collections::{BTreeMap, BTreeSet};

use crate::io::PresenceChange;

#[derive(Debug, Default)]
pub(crate) struct Presence {
    wanted: BTreeSet<String>,
    /// Net changes not yet polled, by peer: `true` = Watch, `false` = Unwatch.
    pending: BTreeMap<String, bool>,
    /// The last reported status of watched peers (`true` = online), on this connection.
    status: BTreeMap<String, bool>,
}

impl Presence {
    pub(crate) fn set_wanted(&mut self, peer: &str, wanted: bool) {
        let changed = if wanted {
            self.wanted.insert(peer.to_owned())
        } else {
            self.status.remove(peer);
            self.wanted.remove(peer)
        };
        if changed {
            self.announce(peer, wanted);
        }
    }

    /// The relay connection ended: statuses reported on it are history.
    pub(crate) fn disconnect(&mut self) {
        self.status.clear();
    }

    /// A `PresenceStatus`: returns whether it is a reachability edge (online, and news).
    pub(crate) fn report(&mut self, peer: &str, online: bool) -> bool {
        let before = if self.wanted.contains(peer) {
            self.status.insert(peer.to_owned(), online)
        } else {
            None
        };
        online && before != Some(true)
    }

    /// The relay's verdict contradicts a remembered `online`.
    pub(crate) fn forget_status(&mut self, peer: &str) {
        self.status.remove(peer);
    }

    pub(crate) fn poll(&mut self) -> Option<PresenceChange> {
        let (peer, watch) = self.pending.pop_first()?;
        Some(if watch {
            PresenceChange::Watch(peer)
        } else {
            PresenceChange::Unwatch(peer)
        })
    }

    pub(crate) fn wanted(&self) -> Vec<String> {
        self.wanted.iter().cloned().collect()
    }

    /// Queues a change, cancelling an opposite one the runtime has not seen yet. `set_wanted`
    /// announces only changes, so a change still pending for the peer is always the opposite.
    fn announce(&mut self, peer: &str, watch: bool) {
        if self.pending.remove(peer).is_none() {
            self.pending.insert(peer.to_owned(), watch);
        }
    }

    #[cfg(test)]
    pub(crate) fn is_wanted(&self, peer: &str) -> bool {
        self.wanted.contains(peer)
    }

    #[cfg(test)]
    pub(crate) fn check(&self) {
        assert!(self.status.keys().all(|peer| self.wanted.contains(peer)));
        for (peer, watch) in &self.pending {
            assert_eq!(*watch, self.wanted.contains(peer), "stale pending change");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_and_its_undoing_between_two_polls_cancel_out() {
        let mut presence = Presence::default();
        presence.set_wanted("bob", true);
        presence.set_wanted("bob", false);
        assert_eq!(presence.poll(), None);

        presence.set_wanted("bob", true);
        assert_eq!(presence.poll(), Some(PresenceChange::Watch("bob".into())));
        presence.set_wanted("bob", false);
        presence.set_wanted("bob", true);
        assert_eq!(presence.poll(), None, "still watched, as the runtime knows");
        presence.set_wanted("bob", false);
        assert_eq!(presence.poll(), Some(PresenceChange::Unwatch("bob".into())));
    }
}
