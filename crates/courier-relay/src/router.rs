//! Who is connected: one authenticated connection per account (§12), its delivery queue, and
//! when each account was last seen (§10).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::mailbox::{DeliveryQueue, Envelope};

/// Handed to a displaced connection; it answers once it has stopped reading and written its
/// SessionSuperseded and Close 4000.
pub type SupersedeAck = oneshot::Sender<()>;

/// The part of a connection that other tasks reach: its queue and its displacement signal.
pub struct Peer {
    pub id: u64,
    pub account: String,
    pub queue: DeliveryQueue,
    supersede: Mutex<Option<oneshot::Sender<SupersedeAck>>>,
}

impl Peer {
    pub fn new(
        id: u64,
        account: String,
        queue: DeliveryQueue,
    ) -> (Self, oneshot::Receiver<SupersedeAck>) {
        let (tx, rx) = oneshot::channel();
        let peer = Self {
            id,
            account,
            queue,
            supersede: Mutex::new(Some(tx)),
        };
        (peer, rx)
    }

    /// Tells the connection it is displaced; `None` if it is already gone or was told before.
    pub fn supersede(&self) -> Option<oneshot::Receiver<()>> {
        let signal = lock(&self.supersede).take()?;
        let (ack, done) = oneshot::channel();
        signal.send(ack).ok()?;
        Some(done)
    }
}

#[derive(Default)]
pub struct Router {
    peers: Mutex<HashMap<String, Arc<Peer>>>,
    last_seen: Mutex<HashMap<String, u64>>,
}

/// A poisoned lock only means another task panicked mid-update of a plain map; the map itself
/// is still consistent, so keep serving rather than take the whole relay down.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Router {
    /// Makes `peer` the account's connection and returns the one it displaces.
    pub fn register(&self, peer: Arc<Peer>) -> Option<Arc<Peer>> {
        lock(&self.last_seen).remove(&peer.account);
        lock(&self.peers).insert(peer.account.clone(), peer)
    }

    /// Removes the connection if it is still the account's current one.
    pub fn unregister(&self, peer: &Peer, now_ms: u64) {
        let mut peers = lock(&self.peers);
        if peers.get(&peer.account).is_some_and(|p| p.id == peer.id) {
            peers.remove(&peer.account);
            lock(&self.last_seen).insert(peer.account.clone(), now_ms);
        }
    }

    pub fn get(&self, account: &str) -> Option<Arc<Peer>> {
        lock(&self.peers).get(account).cloned()
    }

    pub fn is_connected(&self, account: &str) -> bool {
        lock(&self.peers).contains_key(account)
    }

    /// Offers a committed frame to the account's connection; false when none is connected.
    pub fn offer_journaled(&self, account: &str, envelope: &Arc<Envelope>) -> bool {
        let peers = lock(&self.peers);
        match peers.get(account) {
            Some(peer) => {
                peer.queue.offer_journaled(Arc::clone(envelope));
                true
            }
            None => false,
        }
    }

    /// `(online, last_seen_ms)`.
    pub fn presence(&self, account: &str) -> (bool, Option<u64>) {
        if self.is_connected(account) {
            return (true, None);
        }
        (false, lock(&self.last_seen).get(account).copied())
    }

    pub fn connections(&self) -> usize {
        lock(&self.peers).len()
    }
}
