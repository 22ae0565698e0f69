//! Accounts and the per-account journal in SQLite, each account's last_seen, the address
//! bindings (`off1` address → the account that last declared it), the key-package directory and
//! groups; see `docs/protocol.md#authentication`, `docs/protocol.md#inbound-delivery`,
//! `docs/protocol.md#mailbox-and-drain`, `docs/protocol.md#presence`,
//! `docs/protocol.md#address-declaration`, `docs/protocol.md#key-package-directory` and
//! `docs/protocol.md#group-frames`.
//!
//! [`Store`] is the handle the connection tasks call; every call is one request to the store
//! thread (`worker.rs`), which commits requests in groups and answers none before its commit is
//! durable (`synchronous=FULL`): not the sender (MessageSent), not the recipient (the frame is
//! offered to its queue only after the commit), not a drain read. The work of each request is
//! one function in the module that owns its tables: `accounts.rs`, `journal.rs`,
//! `addresses.rs`, `key_packages.rs`, `groups.rs`; `schema.rs` brings any older database up to
//! date at open.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use courier_proto::{Address, Disposition, KeyPackage, KeyPackageBatch};
use prometheus_client::metrics::histogram::Histogram;
use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use crate::config::MailboxLimits;
use crate::fanout::FannedOut;
use crate::group::{Actor, GroupRefusal};
use crate::mailbox::{Envelope, GroupTag};
use crate::router::Router;
use crate::RelayError;

mod accounts;
mod addresses;
mod contacts;
mod groups;
mod journal;
mod key_packages;
pub(crate) use key_packages::MAX_HELD as MAX_HELD_KEY_PACKAGES;
mod mailboxes;
mod schema;
mod worker;

use groups::Broadcast;
use worker::{Delta, Msg, Op, Reply, Worker};

/// Requests waiting for the store thread; senders wait for room beyond this.
const QUEUE: usize = 4096;

/// Rows one purge request deletes at most, of each kind: a purge of a large backlog (a relay
/// that was down for a week) is many requests, and the store thread serves the requests queued
/// meanwhile between them.
const PURGE_BATCH: i64 = 1000;

/// Bytes a WAL file is truncated back to after a checkpoint (`docs/operating-the-relay.md`).
const WAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// Opens the database file at `path`, created if missing. The path is a file name and only
/// that: a `file:` path with `?mode=memory` or `?vfs=` must not turn the journal into something
/// that does not survive a restart. Opening without `SQLITE_OPEN_URI` is not enough, as the
/// bundled SQLite is built to read URIs regardless; a relative path is therefore opened as
/// `./path`, which never starts with `file:`.
fn open_file(path: &std::path::Path) -> rusqlite::Result<Connection> {
    use rusqlite::OpenFlags;
    let path = if path.is_relative() {
        std::path::Path::new(".").join(path)
    } else {
        path.to_owned()
    };
    Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("the relay store is closed")]
    Closed,
    #[error("relay store: {0}")]
    Sqlite(String),
    #[error("relay cluster store: {0}")]
    Cluster(#[from] crate::cluster::ClusterError),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sqlite(e.to_string())
    }
}

/// What acks release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    One(u64),
    UpTo(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendOutcome {
    Accepted {
        seq: u64,
        disposition: Disposition,
    },
    /// The recipient's journal already holds this (sender, message_id) unacked.
    Duplicate {
        disposition: Disposition,
    },
    UnknownRecipient,
    MailboxFull,
}

/// What the directory holds for an address after a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyPackagesHeld {
    /// One-time packages.
    pub available: u32,
    /// Whether a last-resort package is held.
    pub last_resort: bool,
}

/// A package a fetch took: a one-time one, now deleted, or the last-resort one, which stays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenKeyPackage {
    pub package: KeyPackage,
    pub last_resort: bool,
}

/// A recipient or watched identifier as the store resolves it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Named {
    /// An account name: stands for itself (whether it exists is the journal's answer).
    Account(String),
    /// A canonical `off1` address: resolves through its binding, unknown without one.
    Address(String),
}

/// Figures for monitoring, kept by the store thread after each commit.
#[derive(Default)]
struct Counters {
    accounts: AtomicU64,
    frames: AtomicU64,
    /// Bytes of the journal's frames (whole rows).
    bytes: AtomicU64,
}

impl Counters {
    fn add(&self, delta: Delta) {
        add(&self.accounts, delta.accounts);
        add(&self.frames, delta.frames);
        add(&self.bytes, delta.bytes);
    }
}

fn add(counter: &AtomicU64, delta: i64) {
    if delta >= 0 {
        counter.fetch_add(delta.unsigned_abs(), Ordering::Relaxed);
    } else {
        let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(delta.unsigned_abs()))
        });
    }
}

fn to_sql(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn from_sql(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A queued request's answer, which comes once the transaction that carried it is durable.
pub struct Pending<T>(oneshot::Receiver<Result<T, StoreError>>);

impl<T> Pending<T> {
    /// An answer known already.
    pub fn ready(answer: Result<T, StoreError>) -> Self {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(answer);
        Self(rx)
    }

    /// An answer to come through the sender.
    pub fn channel() -> (oneshot::Sender<Result<T, StoreError>>, Self) {
        let (tx, rx) = oneshot::channel();
        (tx, Self(rx))
    }

    pub async fn answer(self) -> Result<T, StoreError> {
        self.0.await.map_err(|_| StoreError::Closed)?
    }
}

/// Handle to the store thread. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    tx: mpsc::Sender<Msg>,
    counters: Arc<Counters>,
}

impl Store {
    /// Opens (creating or upgrading if needed) the database file at `path`, or a private one
    /// in memory without, and starts the store thread. Blocking.
    pub fn open(
        path: Option<&std::path::Path>,
        router: Arc<Router>,
        commit_seconds: Histogram,
    ) -> Result<Self, RelayError> {
        let (mut conn, file_backed) = match path {
            Some(path) => (open_file(path)?, true),
            None => (Connection::open_in_memory()?, false),
        };
        if file_backed {
            let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(RelayError::Config(format!(
                    "the database could not be switched to WAL mode (it is {mode})"
                )));
            }
            // MessageSent promises the frame survives a crash, not only a process kill; on
            // macOS only F_FULLFSYNC reaches the disk rather than its cache. A checkpointed WAL
            // is truncated back to WAL_SIZE_LIMIT, so one burst does not keep its size forever.
            conn.execute_batch(&format!(
                "PRAGMA synchronous=FULL; PRAGMA fullfsync=ON; PRAGMA wal_autocheckpoint=0;
                 PRAGMA journal_size_limit={WAL_SIZE_LIMIT};"
            ))?;
        }
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        schema::migrate(&mut conn)?;
        let accounts: i64 = conn.query_row("SELECT COUNT(*) FROM accounts", [], |r| r.get(0))?;
        let frames: i64 = conn.query_row("SELECT COUNT(*) FROM journal", [], |r| r.get(0))?;
        // Kept per account with the journal (journal.rs), so no scan of the journal.
        let bytes: i64 = conn.query_row(
            "SELECT COALESCE(SUM(byte_count), 0) FROM accounts",
            [],
            |r| r.get(0),
        )?;
        // Presence is answered from memory (router.rs): it starts from what is persisted.
        router.load(addresses::load(&conn)?, accounts::load_last_seen(&conn)?);
        router.contacts.load(contacts::load(&conn)?);
        let counters = Arc::new(Counters {
            accounts: AtomicU64::new(from_sql(accounts)),
            frames: AtomicU64::new(from_sql(frames)),
            bytes: AtomicU64::new(from_sql(bytes)),
        });

        let (tx, rx) = mpsc::channel(QUEUE);
        let worker = Worker {
            conn,
            router,
            counters: Arc::clone(&counters),
            commit_seconds,
            file_backed,
            writes_since_checkpoint: 0,
            mailboxes: mailboxes::Mailboxes::default(),
        };
        std::thread::Builder::new()
            .name("courier-relay-store".into())
            .spawn(move || worker.run(rx))
            .map_err(RelayError::StorageThread)?;
        Ok(Self { tx, counters })
    }

    pub fn accounts(&self) -> u64 {
        self.counters.accounts.load(Ordering::Relaxed)
    }

    pub fn stored_frames(&self) -> u64 {
        self.counters.frames.load(Ordering::Relaxed)
    }

    /// Bytes of the journal's frames, counted as the mailbox limits count them (whole rows).
    pub fn stored_bytes(&self) -> u64 {
        self.counters.bytes.load(Ordering::Relaxed)
    }

    /// Whether the store thread still takes requests (it ends only at `shutdown`, or if it
    /// failed).
    pub fn is_open(&self) -> bool {
        !self.tx.is_closed()
    }

    /// Queues the request `op` builds around its reply channel, waiting only for room: requests
    /// are taken in the order they were queued.
    async fn queue<T>(&self, op: impl FnOnce(Reply<T>) -> Op) -> Result<Pending<T>, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Msg::Op(op(reply)))
            .await
            .map_err(|_| StoreError::Closed)?;
        Ok(Pending(answer))
    }

    /// Queues the request `op` builds and waits for its answer.
    async fn call<T>(&self, op: impl FnOnce(Reply<T>) -> Op) -> Result<T, StoreError> {
        self.queue(op).await?.answer().await
    }

    /// Persists the account at its first successful authentication.
    pub async fn ensure_account(&self, name: &str, now_ms: u64) -> Result<(), StoreError> {
        let name = name.to_owned();
        self.call(|reply| Op::EnsureAccount {
            name,
            now_ms,
            reply,
        })
        .await
    }

    pub async fn account_exists(&self, name: &str) -> Result<bool, StoreError> {
        let name = name.to_owned();
        self.call(|reply| Op::AccountExists { name, reply }).await
    }

    /// Queues the journaling of `envelope` for the account `recipient` names (an address is
    /// resolved in the same transaction; its `seq` is assigned there) which, once durable,
    /// offers it to that account's connection. Returns once queued: a connection queues its
    /// frames in the order it read them and keeps reading while their group commits.
    pub async fn queue_append(
        &self,
        recipient: Named,
        envelope: Envelope,
        limits: MailboxLimits,
    ) -> Result<Pending<AppendOutcome>, StoreError> {
        self.queue(|reply| Op::Append {
            recipient,
            envelope: Box::new(envelope),
            limits,
            reply,
        })
        .await
    }

    /// The account's highest journaled seq: the drain bound S.
    pub async fn highest_seq(&self, account: &str) -> Result<u64, StoreError> {
        let account = account.to_owned();
        self.call(|reply| Op::HighestSeq { account, reply }).await
    }

    /// Unexpired journal frames with `after < seq ≤ up_to`, in seq order, one bounded batch.
    pub async fn fetch(
        &self,
        account: &str,
        after: u64,
        up_to: u64,
        not_before_ms: u64,
    ) -> Result<Vec<Arc<Envelope>>, StoreError> {
        let account = account.to_owned();
        self.call(|reply| Op::Fetch {
            account,
            after,
            up_to,
            not_before_ms,
            reply,
        })
        .await
    }

    /// Queues the deletion of what an ack releases; returns once queued, like
    /// [`Store::queue_append`].
    pub async fn queue_release(
        &self,
        account: &str,
        release: Release,
    ) -> Result<Pending<()>, StoreError> {
        let account = account.to_owned();
        self.queue(|reply| Op::Release {
            account,
            release,
            reply,
        })
        .await
    }

    /// Deletes frames accepted before `older_than_ms`; returns how many.
    pub async fn purge(&self, older_than_ms: u64) -> Result<u64, StoreError> {
        self.purge_in_batches(|reply| Op::Purge {
            older_than_ms,
            reply,
        })
        .await
    }

    /// Runs the purge request `op` builds until a batch comes back short of [`PURGE_BATCH`];
    /// returns the rows deleted.
    async fn purge_in_batches(&self, op: impl Fn(Reply<u64>) -> Op) -> Result<u64, StoreError> {
        let mut purged = 0;
        loop {
            let batch = self.call(&op).await?;
            purged += batch;
            if batch < PURGE_BATCH as u64 {
                return Ok(purged);
            }
        }
    }

    /// Records that the account's last connection ended at `ms`. Never moves last_seen back,
    /// so records committed out of order keep the latest.
    pub async fn record_last_seen(&self, account: &str, ms: u64) -> Result<(), StoreError> {
        let account = account.to_owned();
        self.call(|reply| Op::RecordLastSeen { account, ms, reply })
            .await
    }

    /// Records that `a` and `b` exchanged a message (`docs/protocol.md#presence-visibility`).
    pub async fn record_contact(&self, a: &str, b: &str) -> Result<(), StoreError> {
        let (a, b) = (a.to_owned(), b.to_owned());
        self.call(|reply| Op::RecordContact { a, b, reply }).await
    }

    /// Every member identifier of the groups any of `identities` is a member of.
    pub async fn group_peers(&self, identities: Vec<String>) -> Result<Vec<String>, StoreError> {
        self.call(|reply| Op::GroupPeers { identities, reply })
            .await
    }

    /// Binds `address` (canonical) to `account`, replacing any earlier binding (the latest
    /// successful declaration wins), and drops the account's least recently declared bindings
    /// past `max_per_account`. Once durable, watches on the address follow it.
    pub async fn bind_address(
        &self,
        address: &str,
        account: &str,
        max_per_account: u32,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let (address, account) = (address.to_owned(), account.to_owned());
        self.call(|reply| Op::BindAddress {
            address,
            account,
            max_per_account,
            now_ms,
            reply,
        })
        .await
    }

    /// Deletes bindings last declared before `older_than_ms`; returns how many.
    pub async fn purge_addresses(&self, older_than_ms: u64) -> Result<u64, StoreError> {
        self.purge_in_batches(|reply| Op::PurgeAddresses {
            older_than_ms,
            reply,
        })
        .await
    }

    /// The account `address` (canonical) is bound to, if any connection ever declared it.
    pub async fn resolve_address(&self, address: &str) -> Result<Option<String>, StoreError> {
        let address = address.to_owned();
        self.call(|reply| Op::ResolveAddress { address, reply })
            .await
    }

    /// Stores key packages for `address`: `packages` appended (the oldest dropped beyond the
    /// per-address cap), `last_resort` replacing the previous one; answers what is held now.
    pub async fn publish_key_packages(
        &self,
        address: &Address,
        packages: KeyPackageBatch,
        last_resort: Option<KeyPackage>,
        now_ms: u64,
    ) -> Result<KeyPackagesHeld, StoreError> {
        let address = address.to_string();
        self.call(|reply| Op::PublishKeyPackages {
            address,
            packages,
            last_resort,
            now_ms,
            reply,
        })
        .await
    }

    /// Takes the oldest one-time package of `address`, deleted in the same transaction, or else
    /// its last-resort package, which stays; `None` when it has neither.
    pub async fn take_key_package(
        &self,
        address: &Address,
    ) -> Result<Option<TakenKeyPackage>, StoreError> {
        let address = address.to_string();
        self.call(|reply| Op::TakeKeyPackage { address, reply })
            .await
    }

    /// Registers a group with `actor` as admin and first member (`docs/protocol.md#group-frames`).
    pub async fn create_group(
        &self,
        group_id: &str,
        name: &str,
        actor: Actor,
        now_ms: u64,
    ) -> Result<Result<(), GroupRefusal>, StoreError> {
        let (group_id, name) = (group_id.to_owned(), name.to_owned());
        self.call(|reply| Op::CreateGroup {
            group_id,
            name,
            actor,
            now_ms,
            reply,
        })
        .await
    }

    /// Adds `member` to the group, for its admin, within `max_members`.
    pub async fn add_group_member(
        &self,
        group_id: &str,
        member: &str,
        actor: Actor,
        max_members: u32,
        now_ms: u64,
    ) -> Result<Result<(), GroupRefusal>, StoreError> {
        let (group_id, member) = (group_id.to_owned(), member.to_owned());
        self.call(|reply| Op::AddGroupMember {
            group_id,
            member,
            actor,
            max_members,
            now_ms,
            reply,
        })
        .await
    }

    /// Removes `member` from the group, for its admin.
    pub async fn remove_group_member(
        &self,
        group_id: &str,
        member: &str,
        actor: Actor,
    ) -> Result<Result<(), GroupRefusal>, StoreError> {
        let (group_id, member) = (group_id.to_owned(), member.to_owned());
        self.call(|reply| Op::RemoveGroupMember {
            group_id,
            member,
            actor,
            reply,
        })
        .await
    }

    /// Removes the actor's own registration; answers the identifier it was registered under.
    pub async fn leave_group(
        &self,
        group_id: &str,
        actor: Actor,
    ) -> Result<Result<String, GroupRefusal>, StoreError> {
        let group_id = group_id.to_owned();
        self.call(|reply| Op::LeaveGroup {
            group_id,
            actor,
            reply,
        })
        .await
    }

    /// Journals `message` once for every member of the group `tag` names but the ones `actor`
    /// acts for (without a mailbox, `mailbox` is `None` and nothing is journaled); answers each
    /// member's placement once durable. Copies recorded since `dedup_since_ms` for a repeat of
    /// the same (sender, group, message) are not journaled again.
    pub async fn broadcast(
        &self,
        actor: Actor,
        message: Envelope,
        tag: GroupTag,
        mailbox: Option<MailboxLimits>,
        dedup_since_ms: u64,
    ) -> Result<Result<FannedOut, GroupRefusal>, StoreError> {
        let broadcast = Box::new(Broadcast {
            actor,
            message,
            tag,
            mailbox,
            dedup_since_ms,
        });
        self.call(|reply| Op::Broadcast { broadcast, reply }).await
    }

    /// Keeps an encoded report for the account's next connection (at most `keep` of them, the
    /// newest).
    pub async fn hold_report(
        &self,
        account: &str,
        report: String,
        now_ms: u64,
        keep: u32,
    ) -> Result<(), StoreError> {
        let account = account.to_owned();
        self.call(|reply| Op::HoldReport {
            account,
            report,
            now_ms,
            keep,
            reply,
        })
        .await
    }

    /// The account's reports held since `not_before_ms`, oldest first, with the ids that
    /// [`Store::drop_held_reports`] takes once they are written.
    pub async fn held_reports(
        &self,
        account: &str,
        not_before_ms: u64,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let account = account.to_owned();
        self.call(|reply| Op::HeldReports {
            account,
            not_before_ms,
            reply,
        })
        .await
    }

    pub async fn drop_held_reports(&self, ids: Vec<i64>) -> Result<(), StoreError> {
        self.call(|reply| Op::DropHeldReports { ids, reply }).await
    }

    /// Forgets broadcast copy records and held reports from before `older_than_ms`.
    pub async fn purge_groups(&self, older_than_ms: u64) -> Result<u64, StoreError> {
        self.purge_in_batches(|reply| Op::PurgeGroups {
            older_than_ms,
            reply,
        })
        .await
    }

    /// Finishes queued requests, checkpoints and closes the database.
    pub async fn shutdown(&self) {
        let (done, finished) = oneshot::channel();
        if self.tx.send(Msg::Shutdown(done)).await.is_ok() {
            let _ = finished.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path that SQLite would read as a URI names a file: it cannot ask for a database in
    /// memory, which would lose every stored frame at the next restart.
    #[test]
    fn a_uri_shaped_database_path_never_opens_a_database_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let uri = format!("file:{}?mode=memory", dir.path().join("relay.db").display());
        // As a plain file name it is relative, under a directory `file:` that does not exist.
        if let Ok(conn) = open_file(std::path::Path::new(&uri)) {
            let name = conn.path().unwrap_or_default().to_owned();
            assert!(!name.is_empty(), "opened a database in memory");
        }
    }
}
