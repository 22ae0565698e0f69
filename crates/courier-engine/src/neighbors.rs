//! App carriers and their current neighbors (`docs/glossary.md#app-carrier`,
//! `docs/glossary.md#neighbor`): the app registers a carrier with `registerTransport` and reports
//! `neighborDiscovered` / `neighborLost` (`js/index.d.ts`). An app carrier reaches only its
//! current neighbors; a recipient that is one has a direct link, which carrier choice prefers over
//! the relay.

use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Default)]
pub(crate) struct Neighbors {
    /// Registered local carriers and the neighbors each reaches now.
    by_carrier: BTreeMap<String, BTreeSet<String>>,
    /// The carriers each neighbor is reachable on.
    by_peer: BTreeMap<String, BTreeSet<String>>,
}

impl Neighbors {
    pub(crate) fn register(&mut self, carrier: &str) {
        self.by_carrier.entry(carrier.to_owned()).or_default();
    }

    pub(crate) fn is_registered(&self, carrier: &str) -> bool {
        self.by_carrier.contains_key(carrier)
    }

    /// The carrier is gone with all its links; returns the neighbors it reached.
    pub(crate) fn unregister(&mut self, carrier: &str) -> Vec<String> {
        let peers: Vec<String> = self
            .by_carrier
            .remove(carrier)
            .map(|peers| peers.into_iter().collect())
            .unwrap_or_default();
        for peer in &peers {
            self.unlink(carrier, peer);
        }
        peers
    }

    /// Returns whether the link is new. The carrier must be registered.
    pub(crate) fn discover(&mut self, carrier: &str, peer: &str) -> bool {
        let Some(peers) = self.by_carrier.get_mut(carrier) else {
            return false;
        };
        if !peers.insert(peer.to_owned()) {
            return false;
        }
        self.by_peer
            .entry(peer.to_owned())
            .or_default()
            .insert(carrier.to_owned());
        true
    }

    /// Returns whether the link existed.
    pub(crate) fn lose(&mut self, carrier: &str, peer: &str) -> bool {
        let removed = self
            .by_carrier
            .get_mut(carrier)
            .is_some_and(|peers| peers.remove(peer));
        if removed {
            self.unlink(carrier, peer);
        }
        removed
    }

    /// Whether `peer` is a current neighbor on `carrier`.
    pub(crate) fn links(&self, carrier: &str, peer: &str) -> bool {
        self.by_carrier
            .get(carrier)
            .is_some_and(|peers| peers.contains(peer))
    }

    /// The carrier of a direct link to `peer`, if it is a neighbor (first by name).
    pub(crate) fn link_to(&self, peer: &str) -> Option<&str> {
        self.by_peer
            .get(peer)
            .and_then(|carriers| carriers.first())
            .map(String::as_str)
    }

    /// Every current neighbor once, with the carrier that reaches it (first by name).
    pub(crate) fn each(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.by_peer.iter().filter_map(|(peer, carriers)| {
            carriers
                .first()
                .map(|carrier| (carrier.as_str(), peer.as_str()))
        })
    }

    pub(crate) fn peers(&self) -> impl Iterator<Item = &str> + '_ {
        self.by_peer.keys().map(String::as_str)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_peer.is_empty()
    }

    fn unlink(&mut self, carrier: &str, peer: &str) {
        if let Some(carriers) = self.by_peer.get_mut(peer) {
            carriers.remove(carrier);
            if carriers.is_empty() {
                self.by_peer.remove(peer);
            }
        }
    }
}
