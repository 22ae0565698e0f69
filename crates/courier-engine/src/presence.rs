//! The presence watchlist (`relay-protocol.md` §10, `delivery.md` item 9).
//!
//! *Wanted* are the recipients the parking bookkeeping says to watch: those with parked entries
//! (unreachable or in relay custody, probing or resting) and those that just got a verdict. An
//! outbox entry that is merely queued is not watched: it waits for a carrier, and presence
//! arrives over the same relay connection whose coming up already flushes it; with nothing
//! left "stranded" (invariant 2) that is all of the spec's "not awaiting an ACK".
//!
//! *Watched* are the wanted peers announced on the current relay connection, at most
//! [`MAX_WATCHED`] (the relay's per-connection cap); the rest wait for room, oldest name first.
//! Watches belong to a connection, so nothing is announced while the Internet carrier is down,
//! and its coming up announces the watched set afresh. Changes are coalesced until the runtime
//! polls them: a peer that enters and leaves between two polls produces nothing, and no peer is
//! ever watched or unwatched twice in a row.
//!
//! The last reported status of each wanted peer is kept so that `online: true` is a
//! reachability edge only when it is news: the first report after the peer was (re)watched, or a
//! change from offline. The polling fallback (`CheckPresence` every 20 s) therefore does not
//! re-drive an online peer on every poll. An unreachable verdict for the peer forgets its
//! status (the relay just said otherwise), so the next `online: true` is an edge again.

use std::collections::{BTreeMap, BTreeSet};

use crate::io::PresenceChange;

/// The relay's per-connection watch cap.
pub(crate) const MAX_WATCHED: usize = 1024;

#[derive(Debug, Default)]
pub(crate) struct Presence {
    wanted: BTreeSet<String>,
    watched: BTreeSet<String>,
    waiting: BTreeSet<String>,
    /// Net changes not yet polled, by peer: `true` = Watch, `false` = Unwatch.
    pending: BTreeMap<String, bool>,
    /// The last reported status of wanted peers (`true` = online).
    status: BTreeMap<String, bool>,
    connected: bool,
}

impl Presence {
    pub(crate) fn set_wanted(&mut self, peer: &str, wanted: bool) {
        if wanted {
            if self.wanted.insert(peer.to_owned()) {
                self.waiting.insert(peer.to_owned());
                self.fill();
            }
        } else if self.wanted.remove(peer) {
            self.status.remove(peer);
            if self.watched.remove(peer) {
                self.announce(peer, false);
                self.fill();
            } else {
                self.waiting.remove(peer);
            }
        }
    }

    /// The relay connection is up: announce the watched set on it.
    pub(crate) fn connect(&mut self) {
        if !self.connected {
            self.connected = true;
            self.fill();
        }
    }

    /// The relay connection is gone, and its watches with it.
    pub(crate) fn disconnect(&mut self) {
        self.connected = false;
        self.pending.clear();
        self.status.clear();
        let watched = std::mem::take(&mut self.watched);
        self.waiting.extend(watched);
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

    #[cfg(test)]
    pub(crate) fn is_wanted(&self, peer: &str) -> bool {
        self.wanted.contains(peer)
    }

    fn fill(&mut self) {
        while self.connected && self.watched.len() < MAX_WATCHED {
            let Some(peer) = self.waiting.pop_first() else {
                break;
            };
            self.announce(&peer, true);
            self.watched.insert(peer);
        }
    }

    /// Queues a change, cancelling an opposite one the runtime has not seen yet.
    fn announce(&mut self, peer: &str, watch: bool) {
        match self.pending.get(peer) {
            Some(pending) if *pending != watch => {
                self.pending.remove(peer);
            }
            _ => {
                self.pending.insert(peer.to_owned(), watch);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn check(&self) {
        assert!(self.watched.len() <= MAX_WATCHED);
        assert!(self.watched.is_subset(&self.wanted));
        assert!(self.waiting.is_subset(&self.wanted));
        assert!(self.watched.is_disjoint(&self.waiting));
        assert_eq!(self.watched.len() + self.waiting.len(), self.wanted.len());
        assert!(self.status.keys().all(|peer| self.wanted.contains(peer)));
        if self.connected {
            assert!(self.waiting.is_empty() || self.watched.len() == MAX_WATCHED);
        } else {
            assert!(self.watched.is_empty() && self.pending.is_empty());
        }
    }
}
