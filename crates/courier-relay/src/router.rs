//! Who is connected: one authenticated connection per account
//! (`docs/protocol.md#session-displacement`), its delivery queue, and presence
//! (`docs/protocol.md#presence`): when each account was last seen and which connections watch it.
//!
//! Locks, always taken in this order: `presence` (transitions, watches, last_seen), then
//! `peers` (the routing map, also read by the store thread after every commit), then a
//! connection's watchlist. Holding `presence` across an account's transition and the
//! notification of its watchers is what keeps every watcher's statuses in order; the routing
//! map is never held while watchers are notified.
//!
//! Watched `off1` identifiers are also indexed by address, so a new binding
//! (`docs/protocol.md#relay-checks`, applied by the store thread after its commit) moves their
//! watches to the account it names.
//!
//! Presence is answered from memory alone: every address binding and every persisted last_seen
//! is loaded when the store opens, and both change only here (a binding after its commit, a
//! last_seen when a connection ends), so a look-up, however many identifiers it names, never
//! waits for the store thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use courier_proto::ident::is_address_form;
use tokio::sync::{oneshot, Notify};

use crate::cluster::{Change, Record};
use crate::contacts::Contacts;
use crate::lock;
use crate::mailbox::{DeliveryQueue, Envelope};
use crate::presence::{Status, Unwatched, Watchlist};
use crate::remote::Remote;
use crate::store::Named;

/// Handed to a displaced connection; it answers once it has stopped reading and written its
/// SessionSuperseded and Close 4000.
pub type SupersedeAck = oneshot::Sender<()>;

/// The part of a connection that other tasks reach: its queue, its watches and its
/// displacement signal.
pub struct Peer {
    pub id: u64,
    pub account: String,
    pub queue: DeliveryQueue,
    pub watchlist: Arc<Watchlist>,
    /// A group report was held for the account (`docs/protocol.md#group-frames`): a writer past
    /// its drain writes it now rather than on the account's next connection.
    pub reports: Notify,
    supersede: Mutex<Option<oneshot::Sender<SupersedeAck>>>,
    /// In a cluster, the revision of this connection's presence record; `u64::MAX` until it
    /// is written, so no record read before then displaces it (`Router::settle` checks).
    presence_revision: AtomicU64,
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
            watchlist: Arc::new(Watchlist::new(id)),
            reports: Notify::new(),
            supersede: Mutex::new(Some(tx)),
            presence_revision: AtomicU64::new(u64::MAX),
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
struct Presence {
    /// When each offline account's last connection ended: the database's values at start,
    /// then every disconnect.
    last_seen: HashMap<String, u64>,
    /// Address → the account it is bound to, as committed.
    bindings: HashMap<String, String>,
    /// Watched account → the watching connections, by connection id.
    watchers: HashMap<String, HashMap<u64, Arc<Watchlist>>>,
    /// Watched identifier of `off1` form → the watching connections, whatever the identifier
    /// resolves to (nothing, until some connection declares it).
    address_watchers: HashMap<String, HashMap<u64, Arc<Watchlist>>>,
    /// What the other nodes of a cluster hold.
    remote: Remote,
}

impl Presence {
    fn notify(&self, account: &str, status: Status) {
        if let Some(watchers) = self.watchers.get(account) {
            for watchlist in watchers.values() {
                watchlist.push(account, status);
            }
        }
    }

    fn drop_watcher(&mut self, account: &str, connection: u64) {
        drop_from(&mut self.watchers, account, connection);
    }

    fn drop_address_watcher(&mut self, address: &str, connection: u64) {
        drop_from(&mut self.address_watchers, address, connection);
    }
}

fn drop_from(map: &mut HashMap<String, HashMap<u64, Arc<Watchlist>>>, key: &str, connection: u64) {
    if let Some(watchers) = map.get_mut(key) {
        watchers.remove(&connection);
        if watchers.is_empty() {
            map.remove(key);
        }
    }
}

#[derive(Default)]
pub struct Router {
    presence: Mutex<Presence>,
    peers: Mutex<HashMap<String, Arc<Peer>>>,
    /// Identifiers watched, summed over connections.
    watches: AtomicU64,
    /// Who may see whose presence under `--presence-visibility contacts` (a leaf lock).
    pub contacts: Contacts,
}

/// Whose presence a watching connection may see (`docs/protocol.md#presence-visibility`).
pub enum Sight<'a> {
    Everyone,
    /// Only the accounts this says yes to. A watch of any other reads as naming nobody, and a
    /// watched address stays on the account it named when watched: following a binding could
    /// reveal an account that is no contact.
    Only(&'a dyn Fn(&str) -> bool),
}

impl Router {
    /// Makes `peer` the account's connection and returns the one it displaces.
    ///
    /// Watchers hear `online:true` only when the account had no connection. A displacement
    /// replaces the old connection with the new one in a single step, so the account never
    /// reads as offline and its watchers see no offline→online flap.
    pub fn register(&self, peer: Arc<Peer>) -> Option<Arc<Peer>> {
        let mut presence = lock(&self.presence);
        let account = peer.account.clone();
        let was = self.status_locked(&presence, &account);
        let displaced = lock(&self.peers).insert(account.clone(), peer);
        presence.last_seen.remove(&account);
        if !was.online {
            presence.notify(&account, Status::ONLINE);
        }
        displaced
    }

    /// Ends the connection's watches, and removes it if it is still the account's current
    /// connection. Returns whether the account went offline (then `now_ms` is its last_seen,
    /// which the caller persists).
    pub fn unregister(&self, peer: &Peer, now_ms: u64) -> bool {
        let mut presence = lock(&self.presence);
        let closed = peer.watchlist.close();
        for account in &closed.accounts {
            presence.drop_watcher(account, peer.id);
        }
        for address in &closed.addresses {
            presence.drop_address_watcher(address, peer.id);
        }
        self.watches
            .fetch_sub(closed.count as u64, Ordering::Relaxed);
        let went_offline = {
            let mut peers = lock(&self.peers);
            let current = peers.get(&peer.account).is_some_and(|p| p.id == peer.id);
            if current {
                peers.remove(&peer.account);
            }
            current
        };
        if went_offline {
            presence.last_seen.insert(peer.account.clone(), now_ms);
            // In a cluster a newer connection through another node keeps it online.
            let status = self.status_locked(&presence, &peer.account);
            if !status.online {
                presence.notify(&peer.account, status);
            }
        }
        went_offline
    }

    /// Serves as relay node `node` of a cluster: presence then also follows other nodes'
    /// records (`docs/cluster.md#presence`).
    pub fn serve_as(&self, node: &str) {
        lock(&self.presence).remote.serve_as(node);
    }

    /// Takes in another node's (or this node's) newer presence record of an account. Answers
    /// the connection here it displaces: a record of a connection through another node,
    /// written after this one's.
    pub fn observe(&self, change: &Change) -> Option<Arc<Peer>> {
        let mut presence = lock(&self.presence);
        let was = self.status_locked(&presence, &change.account);
        if !presence.remote.record(change) {
            return None;
        }
        let local = self.get(&change.account);
        if local.is_none() {
            if let Record::Offline { last_seen_ms } = change.record {
                let last_seen = presence
                    .last_seen
                    .entry(change.account.clone())
                    .or_default();
                *last_seen = (*last_seen).max(last_seen_ms);
            }
        }
        let now = self.status_locked(&presence, &change.account);
        if now != was {
            presence.notify(&change.account, now);
        }
        local.filter(|peer| {
            let revision = peer.presence_revision.load(Ordering::SeqCst);
            presence.remote.displaced_since(&change.account, revision)
        })
    }

    /// `peer`'s presence record was written with `revision`. Answers whether a record of a
    /// newer connection through another node was read before it was: then it is displaced.
    pub fn settle(&self, peer: &Peer, revision: u64) -> bool {
        let presence = lock(&self.presence);
        peer.presence_revision.store(revision, Ordering::SeqCst);
        presence.remote.displaced_since(&peer.account, revision)
    }

    /// `node`'s heartbeat is current: its connections count as present.
    pub fn node_up(&self, node: &str) {
        let mut presence = lock(&self.presence);
        // Every beat of a live node comes here: only a node coming back changes anything.
        if presence.remote.is_live(node) {
            return;
        }
        let accounts = presence.remote.accounts_on(node);
        let was: Vec<Status> = accounts
            .iter()
            .map(|a| self.status_locked(&presence, a))
            .collect();
        presence.remote.node_up(node);
        for (account, was) in accounts.iter().zip(was) {
            let now = self.status_locked(&presence, account);
            if now != was {
                presence.notify(account, now);
            }
        }
    }

    /// `node` stopped beating: its connections went offline at `now_ms`.
    pub fn node_down(&self, node: &str, now_ms: u64) {
        let mut presence = lock(&self.presence);
        for account in presence.remote.node_down(node) {
            if self.is_connected(&account) {
                continue;
            }
            presence.last_seen.insert(account.clone(), now_ms);
            let status = self.status_locked(&presence, &account);
            presence.notify(&account, status);
        }
    }

    pub fn get(&self, account: &str) -> Option<Arc<Peer>> {
        lock(&self.peers).get(account).cloned()
    }

    pub fn is_connected(&self, account: &str) -> bool {
        lock(&self.peers).contains_key(account)
    }

    /// Offers a committed frame to the account's connection, and returns that connection;
    /// `None` when none is connected.
    pub fn offer_journaled(&self, account: &str, envelope: &Arc<Envelope>) -> Option<Arc<Peer>> {
        let peers = lock(&self.peers);
        let peer = peers.get(account)?;
        peer.queue.offer_journaled(Arc::clone(envelope));
        Some(Arc::clone(peer))
    }

    /// Takes in what the database holds at start: every binding and every last_seen.
    pub fn load(&self, bindings: HashMap<String, String>, last_seen: HashMap<String, u64>) {
        let mut presence = lock(&self.presence);
        presence.bindings = bindings;
        presence.last_seen = last_seen;
    }

    /// The account `named` names now: an account name itself, an address through its binding.
    pub fn resolve(&self, named: Named) -> Option<String> {
        let presence = lock(&self.presence);
        Self::resolve_locked(&presence, named)
    }

    fn resolve_locked(presence: &Presence, named: Named) -> Option<String> {
        match named {
            Named::Account(account) => Some(account),
            Named::Address(address) => presence.bindings.get(&address).cloned(),
        }
    }

    /// The account's presence now.
    pub fn status(&self, account: &str) -> Status {
        let presence = lock(&self.presence);
        self.status_locked(&presence, account)
    }

    fn status_locked(&self, presence: &Presence, account: &str) -> Status {
        if self.is_connected(account) || presence.remote.online(account) {
            return Status::ONLINE;
        }
        Status::offline(presence.last_seen.get(account).copied())
    }

    /// Watches each identifier on the connection (`None`: it names nothing), resolved here,
    /// queueing its first status; identifiers it already watches are left alone. Atomic with
    /// respect to account transitions and bindings: a change either precedes the first status
    /// (and is reflected in it) or follows it as a push or a move.
    pub fn watch(
        &self,
        watchlist: &Arc<Watchlist>,
        targets: Vec<(String, Option<Named>)>,
        sight: Sight<'_>,
    ) {
        let mut presence = lock(&self.presence);
        for (identifier, named) in targets {
            let mut account = named.and_then(|named| Self::resolve_locked(&presence, named));
            if let Sight::Only(sees) = sight {
                account = account.filter(|account| sees(account));
            }
            let status = match &account {
                Some(account) => self.status_locked(&presence, account),
                None => Status::offline(None),
            };
            let address_form = is_address_form(&identifier) && matches!(sight, Sight::Everyone);
            if !watchlist.add(identifier.clone(), account.clone(), status) {
                continue;
            }
            self.watches.fetch_add(1, Ordering::Relaxed);
            if address_form {
                presence
                    .address_watchers
                    .entry(identifier)
                    .or_default()
                    .insert(watchlist.connection(), Arc::clone(watchlist));
            }
            if let Some(account) = account {
                presence
                    .watchers
                    .entry(account)
                    .or_default()
                    .insert(watchlist.connection(), Arc::clone(watchlist));
            }
        }
    }

    /// Stops watching each identifier; nothing more is queued for it from here on.
    pub fn unwatch(&self, watchlist: &Watchlist, identifiers: &[String]) {
        let mut presence = lock(&self.presence);
        for identifier in identifiers {
            match watchlist.remove(identifier) {
                Unwatched::NotWatched => continue,
                Unwatched::Removed => {}
                Unwatched::LastOfAccount(account) => {
                    presence.drop_watcher(&account, watchlist.connection());
                }
            }
            if is_address_form(identifier) {
                presence.drop_address_watcher(identifier, watchlist.connection());
            }
            self.watches.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// `address` is now bound to `account` (its commit is durable): every watch on the
    /// address follows it to that account, each hearing the account's status if its `online`
    /// value differs from what the watch last said. Called by the store thread in commit order.
    pub fn rebind(&self, address: &str, account: &str) {
        let mut presence = lock(&self.presence);
        presence
            .bindings
            .insert(address.to_owned(), account.to_owned());
        let status = self.status_locked(&presence, account);
        Self::move_address_watches(&mut presence, address, Some(account), status);
    }

    /// `address`'s binding to `account` was deleted (its commit is durable): the address names
    /// nobody from now on, and its watches say so (`online:false` without `last_seen`) if they
    /// said otherwise. Called by the store thread in commit order.
    pub fn unbind(&self, address: &str, account: &str) {
        let mut presence = lock(&self.presence);
        if presence.bindings.get(address).map(String::as_str) != Some(account) {
            return;
        }
        presence.bindings.remove(address);
        Self::move_address_watches(&mut presence, address, None, Status::offline(None));
    }

    /// Moves every watch on `address` to `account`, whose presence is `status`.
    fn move_address_watches(
        presence: &mut Presence,
        address: &str,
        account: Option<&str>,
        status: Status,
    ) {
        let Some(watchers) = presence.address_watchers.get(address) else {
            return;
        };
        let watchers: Vec<Arc<Watchlist>> = watchers.values().cloned().collect();
        for watchlist in watchers {
            let Some(rebound) = watchlist.rebind(address, account, status) else {
                continue;
            };
            if let Some(left) = rebound.left {
                presence.drop_watcher(&left, watchlist.connection());
            }
            if let Some(account) = account {
                presence
                    .watchers
                    .entry(account.to_owned())
                    .or_default()
                    .insert(watchlist.connection(), watchlist);
            }
        }
    }

    pub fn connections(&self) -> usize {
        lock(&self.peers).len()
    }

    /// Identifiers watched, summed over connections.
    pub fn watches(&self) -> usize {
        usize::try_from(self.watches.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
    }

    /// Accounts with at least one watcher.
    #[cfg(test)]
    fn watched_accounts(&self) -> usize {
        lock(&self.presence).watchers.len()
    }

    /// Addresses with at least one watcher.
    #[cfg(test)]
    fn watched_addresses(&self) -> usize {
        lock(&self.presence).address_watchers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(name: &str) -> Option<Named> {
        Some(Named::Account(name.into()))
    }

    fn address(address: &str) -> Option<Named> {
        Some(Named::Address(address.into()))
    }

    fn peer(id: u64, account: &str) -> Arc<Peer> {
        let (queue, _rx) = DeliveryQueue::new();
        Arc::new(Peer::new(id, account.into(), queue).0)
    }

    fn online_flags(watchlist: &Watchlist) -> Vec<bool> {
        watchlist
            .take()
            .into_iter()
            .map(|f| match f {
                courier_proto::RelayFrame::PresenceStatus { online, .. } => online,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn only_watchers_of_the_account_hear_its_changes() {
        let router = Router::default();
        let alice = peer(1, "alice");
        let carol = peer(2, "carol");
        router.watch(
            &alice.watchlist,
            vec![("bob".into(), account("bob"))],
            Sight::Everyone,
        );
        router.watch(
            &carol.watchlist,
            vec![("dave".into(), account("dave"))],
            Sight::Everyone,
        );
        assert_eq!(online_flags(&alice.watchlist), vec![false]);
        assert_eq!(online_flags(&carol.watchlist), vec![false]);
        router.register(peer(3, "bob"));
        assert_eq!(online_flags(&alice.watchlist), vec![true]);
        assert!(carol.watchlist.take().is_empty());
    }

    #[test]
    fn a_displacement_is_no_flap_and_the_last_disconnect_is() {
        let router = Router::default();
        let alice = peer(1, "alice");
        router.watch(
            &alice.watchlist,
            vec![("bob".into(), account("bob"))],
            Sight::Everyone,
        );
        let old = peer(2, "bob");
        router.register(Arc::clone(&old));
        assert_eq!(online_flags(&alice.watchlist), vec![false, true]);
        let new = peer(3, "bob");
        assert!(router.register(Arc::clone(&new)).is_some());
        assert!(
            !router.unregister(&old, 10),
            "the old one is no longer current"
        );
        assert!(alice.watchlist.take().is_empty());
        assert!(router.unregister(&new, 20));
        assert_eq!(router.status("bob"), Status::offline(Some(20)));
        assert_eq!(online_flags(&alice.watchlist), vec![false]);
    }

    #[test]
    fn the_index_is_cleaned_up_by_unwatch_and_by_the_connection_ending() {
        let router = Router::default();
        let alice = peer(1, "alice");
        router.register(Arc::clone(&alice));
        let targets = vec![
            ("bob".into(), account("bob")),
            ("carol".into(), account("carol")),
            ("off1x".into(), None),
        ];
        router.watch(&alice.watchlist, targets, Sight::Everyone);
        assert_eq!((router.watches(), router.watched_accounts()), (3, 2));
        router.unwatch(&alice.watchlist, &["bob".into(), "bob".into()]);
        assert_eq!((router.watches(), router.watched_accounts()), (2, 1));
        router.unregister(&alice, 5);
        assert_eq!((router.watches(), router.watched_accounts()), (0, 0));
        // A watch arriving after the end is not added.
        router.watch(
            &alice.watchlist,
            vec![("bob".into(), account("bob"))],
            Sight::Everyone,
        );
        assert_eq!((router.watches(), router.watched_accounts()), (0, 0));
    }

    #[test]
    fn a_watched_address_follows_its_binding() {
        const X: &str = "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn";
        let router = Router::default();
        let alice = peer(1, "alice");
        router.register(Arc::clone(&alice));
        // Watched before anyone declared it: offline, resolving to nothing.
        router.watch(
            &alice.watchlist,
            vec![(X.into(), address(X))],
            Sight::Everyone,
        );
        assert_eq!(online_flags(&alice.watchlist), vec![false]);
        assert_eq!(
            (router.watched_accounts(), router.watched_addresses()),
            (0, 1)
        );
        // Bound to bob, online: the watch hears online at once.
        let bob = peer(2, "bob");
        router.register(Arc::clone(&bob));
        router.rebind(X, "bob");
        assert_eq!(online_flags(&alice.watchlist), vec![true]);
        router.rebind(X, "bob");
        assert!(
            alice.watchlist.take().is_empty(),
            "same binding, nothing new"
        );
        // Re-bound to carol, online too: no change of `online`, so nothing is sent, but the
        // watch now follows carol and not bob.
        let carol = peer(3, "carol");
        router.register(Arc::clone(&carol));
        router.rebind(X, "carol");
        assert!(alice.watchlist.take().is_empty());
        assert_eq!(router.watched_accounts(), 1);
        router.unregister(&bob, 10);
        assert!(alice.watchlist.take().is_empty(), "bob is no longer X");
        router.unregister(&carol, 20);
        assert_eq!(online_flags(&alice.watchlist), vec![false]);
        // Re-bound to bob, offline: still offline, nothing to say.
        router.rebind(X, "bob");
        assert!(alice.watchlist.take().is_empty());
        let bob2 = peer(4, "bob");
        router.register(Arc::clone(&bob2));
        assert_eq!(online_flags(&alice.watchlist), vec![true]);
        // Unwatching removes it from both indexes.
        router.unwatch(&alice.watchlist, &[X.into()]);
        assert_eq!(
            (router.watched_accounts(), router.watched_addresses()),
            (0, 0)
        );
        router.watch(
            &alice.watchlist,
            vec![(X.into(), address(X))],
            Sight::Everyone,
        );
        assert_eq!(
            (router.watched_accounts(), router.watched_addresses()),
            (1, 1)
        );
        // And the connection ending clears both.
        router.unregister(&alice, 30);
        assert_eq!(
            (router.watched_accounts(), router.watched_addresses()),
            (0, 0)
        );
        assert_eq!(router.watches(), 0);
    }

    #[test]
    fn a_watch_on_an_account_and_on_its_address_are_separate_entries() {
        const X: &str = "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn";
        let router = Router::default();
        router.rebind(X, "bob");
        let alice = peer(1, "alice");
        router.watch(
            &alice.watchlist,
            vec![("bob".into(), account("bob")), (X.into(), address(X))],
            Sight::Everyone,
        );
        assert_eq!(online_flags(&alice.watchlist), vec![false, false]);
        // X moves to carol: alice still watches bob through his name.
        router.rebind(X, "carol");
        assert!(alice.watchlist.take().is_empty());
        assert_eq!(router.watched_accounts(), 2);
        let bob = peer(2, "bob");
        router.register(Arc::clone(&bob));
        let statuses = alice.watchlist.take();
        assert_eq!(statuses.len(), 1, "{statuses:?}");
        assert!(matches!(
            &statuses[0],
            courier_proto::RelayFrame::PresenceStatus { user_id, online: true, .. } if user_id == "bob"
        ));
        let carol = peer(3, "carol");
        router.register(Arc::clone(&carol));
        let statuses = alice.watchlist.take();
        assert!(matches!(
            &statuses[..],
            [courier_proto::RelayFrame::PresenceStatus { user_id, online: true, .. }] if user_id == X
        ));
    }

    #[test]
    fn presence_is_answered_from_what_was_loaded_and_what_happened_since_and_a_deleted_binding_names_nobody(
    ) {
        const X: &str = "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn";
        let router = Router::default();
        router.load(
            [(X.to_owned(), "bob".to_owned())].into(),
            [("bob".to_owned(), 7), ("carol".to_owned(), 9)].into(),
        );
        assert_eq!(router.resolve(Named::Address(X.into())), Some("bob".into()));
        assert_eq!(router.status("carol"), Status::offline(Some(9)));
        let bob = peer(1, "bob");
        router.register(Arc::clone(&bob));
        router.unregister(&bob, 50);
        assert_eq!(router.status("bob"), Status::offline(Some(50)));
        router.unbind(X, "carol");
        assert_eq!(
            router.resolve(Named::Address(X.into())),
            Some("bob".into()),
            "not carol's"
        );
        // A watch on the address hears that it names nobody any more.
        let alice = peer(2, "alice");
        let carol = peer(3, "carol");
        router.register(Arc::clone(&carol));
        router.rebind(X, "carol");
        router.watch(
            &alice.watchlist,
            vec![(X.into(), address(X))],
            Sight::Everyone,
        );
        assert_eq!(online_flags(&alice.watchlist), vec![true]);
        router.unbind(X, "carol");
        assert_eq!(router.resolve(Named::Address(X.into())), None);
        assert_eq!(online_flags(&alice.watchlist), vec![false]);
        assert_eq!(router.watched_accounts(), 0);
        router.unregister(&carol, 60);
        assert!(alice.watchlist.take().is_empty(), "carol is no longer X");
    }
}
