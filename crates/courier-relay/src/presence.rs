//! Presence watches (`docs/protocol.md#presence`, `presence_watch_v1`): one [`Watchlist`] per
//! connection, holding what it watches and the statuses waiting for its writer.
//!
//! The router decides every presence fact under one lock (its presence lock): an account's
//! transitions (first connection registered, last one gone), a watch's first status, and an
//! unwatch. A watchlist is only changed under that lock, so a newly watched identifier's first
//! status and every later change are queued in the order they happened, and nothing is queued
//! for an identifier once its UnwatchPresence has been handled. An unwatch also drops what the
//! identifier still had queued (its first status included, if the writer had not taken it):
//! the client has said it no longer cares.
//!
//! The writer takes queued statuses ahead of the answers to later frames, so a watch's first
//! statuses reach the client before the answer to anything it sent after the WatchPresence.
//!
//! An identifier that is an `off1` address follows its binding: when a declaration binds it to
//! another account, the router moves the watch to that account (`rebind`), and when the binding
//! is deleted the watch resolves to nobody. Each entry remembers
//! the `online` value of the last status queued for it, so a move queues a status only if the
//! new account's value differs from what the client was last told, and no identifier is ever
//! sent the same `online` value twice in a row.
//!
//! Memory stays bounded when a client stops reading: at most two statuses wait per identifier.
//! A third change folds the queue into the latest status alone. Each queued status differs from
//! the one before it, so folding never loses the edge away from what the client last saw. A
//! flap back to that value stays two frames and is never dropped.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use courier_proto::RelayFrame;
use tokio::sync::Notify;

/// Identifiers one connection may watch at once (`docs/protocol.md#constants`).
pub const MAX_WATCHES: usize = 1024;

/// Entries one WatchPresence / UnwatchPresence may list; longer lists are `invalid_frame`.
/// Four times the cap, so a client may send a watchlist longer than the cap in one frame (the
/// entries past the cap get `limit_exceeded`), while the work per frame stays bounded.
pub const MAX_WATCH_LIST: usize = 4 * MAX_WATCHES;

/// One presence fact about an account, as PresenceStatus carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub online: bool,
    /// When the account's last connection ended; `None` while online or never seen.
    pub last_seen: Option<u64>,
}

impl Status {
    pub const ONLINE: Self = Self {
        online: true,
        last_seen: None,
    };

    pub fn offline(last_seen: Option<u64>) -> Self {
        Self {
            online: false,
            last_seen,
        }
    }

    /// `user_id` echoes the identifier exactly as the client named it.
    pub fn frame(self, user_id: String) -> RelayFrame {
        RelayFrame::PresenceStatus {
            user_id,
            online: self.online,
            last_seen: self.last_seen.map(serde_json::Value::from),
        }
    }
}

/// What removing one identifier did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unwatched {
    NotWatched,
    Removed,
    /// Removed, and it was this connection's last identifier for that account: the router
    /// drops the connection from the account's watchers.
    LastOfAccount(String),
}

struct Entry {
    /// The account the identifier resolves to; `None` for an identifier that names no account
    /// (an `off1` address nobody declared, an invalid name).
    account: Option<String>,
    /// `online` of the last status queued for the identifier.
    online: bool,
    /// Statuses not yet taken by the writer, oldest first; at most two.
    queued: Vec<Status>,
    /// Key in `dirty` while `queued` is not empty.
    stamp: Option<u64>,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Account → the identifiers resolving to it (usually one).
    by_account: HashMap<String, Vec<String>>,
    /// Identifiers with queued statuses, in the order they got something to send.
    dirty: BTreeMap<u64, String>,
    next_stamp: u64,
    /// The connection ended: nothing is added any more.
    closed: bool,
}

impl State {
    fn enqueue(&mut self, identifier: &str, status: Status) {
        let Some(entry) = self.entries.get_mut(identifier) else {
            return;
        };
        entry.online = status.online;
        fold(&mut entry.queued, status);
        if entry.stamp.is_none() {
            let stamp = self.next_stamp;
            self.next_stamp += 1;
            entry.stamp = Some(stamp);
            self.dirty.insert(stamp, identifier.to_owned());
        }
    }
}

/// What the connection's watches were when it ended.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Closed {
    /// Accounts it watched (through any identifier).
    pub accounts: Vec<String>,
    /// Identifiers of `off1` form it watched.
    pub addresses: Vec<String>,
    /// Identifiers it watched.
    pub count: usize,
}

/// What moving an address's watch to another account did (see [`Watchlist::rebind`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Rebound {
    /// The account the identifier resolved to before, when no other identifier of this
    /// connection resolves to it any more: the router drops the connection from its watchers.
    pub left: Option<String>,
}

/// Appends `status`, keeping at most two queued statuses that each differ from the one before.
fn fold(queued: &mut Vec<Status>, status: Status) {
    let len = queued.len();
    match queued.last_mut() {
        // Same value as the last queued one: only its details may have changed.
        Some(last) if last.online == status.online => *last = status,
        // [a, b] + s with s.online == a.online: the net change is a → s.
        Some(_) if len >= 2 => {
            queued.clear();
            queued.push(status);
        }
        _ => queued.push(status),
    }
}

/// One connection's watches and its queued PresenceStatus frames.
pub struct Watchlist {
    connection: u64,
    state: Mutex<State>,
    ready: Notify,
}

impl Watchlist {
    pub fn new(connection: u64) -> Self {
        Self {
            connection,
            state: Mutex::default(),
            ready: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn connection(&self) -> u64 {
        self.connection
    }

    /// Identifiers watched now.
    pub fn len(&self) -> usize {
        self.state().entries.len()
    }

    pub fn contains(&self, identifier: &str) -> bool {
        self.state().entries.contains_key(identifier)
    }

    /// Watches a new identifier and queues its first status. False if it is already watched
    /// or the connection has ended. Called by the router under its presence lock.
    pub(crate) fn add(&self, identifier: String, account: Option<String>, first: Status) -> bool {
        let mut state = self.state();
        if state.closed || state.entries.contains_key(&identifier) {
            return false;
        }
        if let Some(account) = &account {
            state
                .by_account
                .entry(account.clone())
                .or_default()
                .push(identifier.clone());
        }
        state.entries.insert(
            identifier.clone(),
            Entry {
                account,
                online: first.online,
                queued: Vec::with_capacity(2),
                stamp: None,
            },
        );
        state.enqueue(&identifier, first);
        drop(state);
        self.ready.notify_one();
        true
    }

    /// Stops watching `identifier` and drops whatever it had queued. Called by the router
    /// under its presence lock.
    pub(crate) fn remove(&self, identifier: &str) -> Unwatched {
        let mut state = self.state();
        let Some(entry) = state.entries.remove(identifier) else {
            return Unwatched::NotWatched;
        };
        if let Some(stamp) = entry.stamp {
            state.dirty.remove(&stamp);
        }
        let Some(account) = entry.account else {
            return Unwatched::Removed;
        };
        let Some(identifiers) = state.by_account.get_mut(&account) else {
            return Unwatched::Removed;
        };
        identifiers.retain(|i| i != identifier);
        if identifiers.is_empty() {
            state.by_account.remove(&account);
            return Unwatched::LastOfAccount(account);
        }
        Unwatched::Removed
    }

    /// Queues `status` for every identifier that resolves to `account` and was last told the
    /// other `online` value. Called by the router under its presence lock when the account's
    /// `online` value changes.
    pub(crate) fn push(&self, account: &str, status: Status) {
        let mut state = self.state();
        let Some(identifiers) = state.by_account.get(account).cloned() else {
            return;
        };
        let mut queued = false;
        for identifier in &identifiers {
            if state
                .entries
                .get(identifier)
                .is_some_and(|e| e.online != status.online)
            {
                state.enqueue(identifier, status);
                queued = true;
            }
        }
        drop(state);
        if queued {
            self.ready.notify_one();
        }
    }

    /// `identifier` (an address) now resolves to `account` (`None`: to nobody, its binding was
    /// deleted), whose presence is `status`: the watch follows, and `status` is queued if its
    /// `online` value differs from the last one queued for the identifier. `None` if the
    /// identifier is not watched or already resolves to `account`. Called by the router under
    /// its presence lock.
    pub(crate) fn rebind(
        &self,
        identifier: &str,
        account: Option<&str>,
        status: Status,
    ) -> Option<Rebound> {
        let mut state = self.state();
        let entry = state.entries.get_mut(identifier)?;
        if entry.account.as_deref() == account {
            return None;
        }
        let previous = std::mem::replace(&mut entry.account, account.map(str::to_owned));
        let changed = entry.online != status.online;
        let mut left = None;
        if let Some(previous) = previous {
            if let Some(identifiers) = state.by_account.get_mut(&previous) {
                identifiers.retain(|i| i != identifier);
                if identifiers.is_empty() {
                    state.by_account.remove(&previous);
                    left = Some(previous);
                }
            }
        }
        if let Some(account) = account {
            state
                .by_account
                .entry(account.to_owned())
                .or_default()
                .push(identifier.to_owned());
        }
        if changed {
            state.enqueue(identifier, status);
        }
        drop(state);
        if changed {
            self.ready.notify_one();
        }
        Some(Rebound { left })
    }

    /// The connection ended: forgets every watch and says what they were. Nothing can be added
    /// afterwards.
    pub(crate) fn close(&self) -> Closed {
        let mut state = self.state();
        state.closed = true;
        let count = state.entries.len();
        let accounts = state
            .by_account
            .drain()
            .map(|(account, _)| account)
            .collect();
        let addresses = state
            .entries
            .drain()
            .map(|(identifier, _)| identifier)
            .filter(|identifier| courier_proto::ident::is_address_form(identifier))
            .collect();
        state.dirty.clear();
        Closed {
            accounts,
            addresses,
            count,
        }
    }

    /// Takes every queued status as frames, in the order identifiers got something to send.
    pub fn take(&self) -> Vec<RelayFrame> {
        let mut state = self.state();
        let dirty = std::mem::take(&mut state.dirty);
        let mut frames = Vec::new();
        for identifier in dirty.into_values() {
            if let Some(entry) = state.entries.get_mut(&identifier) {
                entry.stamp = None;
                for status in entry.queued.drain(..) {
                    frames.push(status.frame(identifier.clone()));
                }
            }
        }
        frames
    }

    /// Resolves once statuses may be waiting (spuriously too; `take` may find nothing).
    pub async fn ready(&self) {
        self.ready.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn off(ms: u64) -> Status {
        Status::offline(Some(ms))
    }

    fn statuses(w: &Watchlist) -> Vec<(String, bool, Option<u64>)> {
        w.take()
            .into_iter()
            .map(|f| match f {
                RelayFrame::PresenceStatus {
                    user_id,
                    online,
                    last_seen,
                } => (user_id, online, last_seen.and_then(|v| v.as_u64())),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn first_status_then_changes_in_order() {
        let w = Watchlist::new(1);
        assert!(w.add("bob".into(), Some("bob".into()), off(5)));
        assert!(!w.add("bob".into(), Some("bob".into()), off(5)), "once");
        w.push("bob", Status::ONLINE);
        assert_eq!(
            statuses(&w),
            vec![("bob".into(), false, Some(5)), ("bob".into(), true, None)]
        );
        assert!(w.take().is_empty());
        w.push("bob", off(9));
        assert_eq!(statuses(&w), vec![("bob".into(), false, Some(9))]);
    }

    #[test]
    fn a_slow_reader_gets_at_most_two_statuses_and_never_loses_the_latest() {
        let w = Watchlist::new(1);
        w.add("bob".into(), Some("bob".into()), off(1));
        w.take();
        // The client saw offline. Online, offline, online: the net change is one edge.
        w.push("bob", Status::ONLINE);
        w.push("bob", off(2));
        w.push("bob", Status::ONLINE);
        assert_eq!(statuses(&w), vec![("bob".into(), true, None)]);
        // Offline then back online: the flap is kept.
        w.push("bob", off(3));
        w.push("bob", Status::ONLINE);
        assert_eq!(
            statuses(&w),
            vec![("bob".into(), false, Some(3)), ("bob".into(), true, None)]
        );
    }

    #[test]
    fn unwatching_drops_queued_statuses_and_reports_the_last_identifier() {
        let w = Watchlist::new(1);
        w.add("bob".into(), Some("bob".into()), off(1));
        w.add("nobody/".into(), None, Status::offline(None));
        assert_eq!(w.remove("bob"), Unwatched::LastOfAccount("bob".into()));
        assert_eq!(w.remove("bob"), Unwatched::NotWatched);
        assert_eq!(w.remove("nobody/"), Unwatched::Removed);
        assert!(w.take().is_empty());
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn two_identifiers_of_one_account_each_get_the_change() {
        let w = Watchlist::new(1);
        w.add("bob".into(), Some("bob".into()), off(1));
        w.add("alias".into(), Some("bob".into()), off(1));
        w.take();
        w.push("bob", Status::ONLINE);
        let got = statuses(&w);
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|(_, online, _)| *online));
        assert_eq!(w.remove("bob"), Unwatched::Removed);
        assert_eq!(w.remove("alias"), Unwatched::LastOfAccount("bob".into()));
    }

    #[test]
    fn nothing_is_added_after_close() {
        let w = Watchlist::new(1);
        w.add("bob".into(), Some("bob".into()), off(1));
        let closed = w.close();
        assert_eq!((closed.accounts, closed.count), (vec!["bob".to_owned()], 1));
        assert!(!w.add("carol".into(), Some("carol".into()), off(1)));
        assert!(w.take().is_empty());
    }
}
