//! Accounts and the per-account journal in SQLite (`relay-protocol.md` §2.1, §7.1, §8), each
//! account's last_seen (§10), so presence survives a relay restart, and the address bindings
//! (§4.2, §5): `off1` address → the account that last declared it.
//!
//! One thread owns the connection and is the only writer. It takes every request queued since
//! its last commit and runs them in one transaction (group commit), each inside its own
//! savepoint so one failing request does not undo the others. Nobody hears an answer before
//! the transaction is durable (`synchronous=FULL`): not the sender (MessageSent), not the
//! recipient (the frame is offered to its queue only after the commit), not a drain read.
//!
//! Counters per account (`last_seq`, `msg_count`, `byte_count`) live in the `accounts` row and
//! change in the same transaction as the journal, so `seq` is never reused (it does not depend
//! on which rows still exist) and the mailbox limits are checked without scanning the journal.
//!
//! Everything that depends on an address binding is decided on this thread, in commit order:
//! a frame named by address is resolved inside its append's transaction (it belongs to the
//! account the address named at acceptance), and both a new binding's effect on presence
//! watches and the registration of watches on addresses happen after their commits, in commit
//! order. A watch therefore either sees a binding in its resolution or is moved by it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use courier_proto::Disposition;
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::{mpsc, oneshot};

use crate::config::{MailboxLimits, Storage};
use crate::mailbox::Envelope;
use crate::presence::Watchlist;
use crate::router::Router;
use crate::RelayError;

/// Requests waiting for the store thread; senders wait for room beyond this.
const QUEUE: usize = 4096;
/// Requests per transaction.
const MAX_BATCH: usize = 512;
/// One journal read returns at most this many frames / content bytes (at least one frame).
const FETCH_FRAMES: i64 = 64;
const FETCH_BYTES: usize = 4 * 1024 * 1024;
/// WAL checkpoints run when the store is idle after this many write transactions, and
/// regardless after the second figure so a never-idle relay still bounds its WAL.
const CHECKPOINT_IDLE: u32 = 64;
const CHECKPOINT_FORCED: u32 = 4096;

/// 1: accounts and journal. 2: `accounts.last_seen_ms`. 3: `addresses`.
const SCHEMA_VERSION: i64 = 3;
const SCHEMA: &str = "
CREATE TABLE accounts (
    name TEXT PRIMARY KEY NOT NULL,
    created_ms INTEGER NOT NULL,
    last_seq INTEGER NOT NULL DEFAULT 0,
    msg_count INTEGER NOT NULL DEFAULT 0,
    byte_count INTEGER NOT NULL DEFAULT 0,
    last_seen_ms INTEGER
);
CREATE TABLE journal (
    id INTEGER PRIMARY KEY,
    account TEXT NOT NULL,
    seq INTEGER NOT NULL,
    sender TEXT NOT NULL,
    sender_account TEXT NOT NULL,
    message_id TEXT NOT NULL,
    content TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    reply_to_msg TEXT,
    accepted_ms INTEGER NOT NULL,
    UNIQUE (account, seq),
    UNIQUE (account, sender, message_id)
);
CREATE INDEX journal_accepted ON journal (accepted_ms);
CREATE TABLE addresses (
    address TEXT PRIMARY KEY NOT NULL,
    account TEXT NOT NULL,
    bound_ms INTEGER NOT NULL
);
";
/// Upgrades a version-1 database to version 2 in place.
const MIGRATE_1_TO_2: &str = "ALTER TABLE accounts ADD COLUMN last_seen_ms INTEGER;";
/// Upgrades a version-2 database to version 3 in place. Addresses are keyed by their
/// canonical string, which names exactly one address (identity.md §2 rule 6).
const MIGRATE_2_TO_3: &str = "
CREATE TABLE addresses (
    address TEXT PRIMARY KEY NOT NULL,
    account TEXT NOT NULL,
    bound_ms INTEGER NOT NULL
);
";

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("the relay store is closed")]
    Closed,
    #[error("relay store: {0}")]
    Sqlite(String),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sqlite(e.to_string())
    }
}

/// What acks release (§7.1).
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

/// A recipient or watched identifier as the store resolves it (§5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    /// An account name: stands for itself (whether it exists is the journal's answer).
    Account(String),
    /// A canonical `off1` address: resolves through its binding, unknown without one.
    Address(String),
}

enum Op {
    EnsureAccount {
        name: String,
        now_ms: u64,
    },
    AccountExists {
        name: String,
    },
    Append {
        recipient: Named,
        envelope: Envelope,
        limits: MailboxLimits,
    },
    BindAddress {
        address: String,
        account: String,
        now_ms: u64,
    },
    ResolveAddress {
        address: String,
    },
    Watch {
        watchlist: Arc<Watchlist>,
        targets: Vec<(String, Option<Named>)>,
    },
    HighestSeq {
        account: String,
    },
    Fetch {
        account: String,
        after: u64,
        up_to: u64,
        not_before_ms: u64,
    },
    Release {
        account: String,
        release: Release,
    },
    Purge {
        older_than_ms: u64,
    },
    RecordLastSeen {
        account: String,
        ms: u64,
    },
    LastSeen {
        accounts: Vec<String>,
    },
}

impl Op {
    fn writes(&self) -> bool {
        matches!(
            self,
            Op::EnsureAccount { .. }
                | Op::Append { .. }
                | Op::BindAddress { .. }
                | Op::Release { .. }
                | Op::Purge { .. }
                | Op::RecordLastSeen { .. }
        )
    }
}

enum Done {
    Unit,
    Bool(bool),
    Count(u64),
    Frames(Vec<Arc<Envelope>>),
    Append(AppendOutcome),
    LastSeen(HashMap<String, u64>),
    Account(Option<String>),
}

struct Job {
    op: Op,
    reply: oneshot::Sender<Result<Done, StoreError>>,
}

enum Msg {
    Job(Job),
    Shutdown(oneshot::Sender<()>),
}

#[derive(Default)]
struct Counters {
    accounts: AtomicU64,
    frames: AtomicU64,
}

/// Handle to the store thread. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    tx: mpsc::Sender<Msg>,
    counters: Arc<Counters>,
}

fn to_sql(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn from_sql(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl Store {
    /// Opens (creating if needed) the database and starts the store thread. Blocking.
    pub fn open(storage: &Storage, router: Arc<Router>) -> Result<Self, RelayError> {
        let (conn, file_backed) = match storage {
            Storage::Path(path) => (Connection::open(path)?, true),
            Storage::Memory => (Connection::open_in_memory()?, false),
        };
        if file_backed {
            let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(RelayError::Config(format!(
                    "the database could not be switched to WAL mode (it is {mode})"
                )));
            }
            // MessageSent promises the frame survives a crash, not only a process kill.
            conn.execute_batch("PRAGMA synchronous=FULL; PRAGMA wal_autocheckpoint=0;")?;
        }
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        match version {
            0 => conn.execute_batch(&format!(
                "BEGIN; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            ))?,
            1 => conn.execute_batch(&format!(
                "BEGIN; {MIGRATE_1_TO_2} {MIGRATE_2_TO_3} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            ))?,
            2 => conn.execute_batch(&format!(
                "BEGIN; {MIGRATE_2_TO_3} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            ))?,
            SCHEMA_VERSION => {}
            other => {
                return Err(RelayError::Config(format!(
                    "the database has schema version {other}; this relay knows {SCHEMA_VERSION}"
                )))
            }
        }
        let accounts: i64 = conn.query_row("SELECT COUNT(*) FROM accounts", [], |r| r.get(0))?;
        let frames: i64 = conn.query_row("SELECT COUNT(*) FROM journal", [], |r| r.get(0))?;
        let counters = Arc::new(Counters {
            accounts: AtomicU64::new(from_sql(accounts)),
            frames: AtomicU64::new(from_sql(frames)),
        });

        let (tx, rx) = mpsc::channel(QUEUE);
        let worker = Worker {
            conn,
            router,
            counters: Arc::clone(&counters),
            file_backed,
            writes_since_checkpoint: 0,
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

    async fn call(&self, op: Op) -> Result<Done, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Msg::Job(Job { op, reply }))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Persists the account at its first successful authentication (§2.1).
    pub async fn ensure_account(&self, name: &str, now_ms: u64) -> Result<(), StoreError> {
        self.call(Op::EnsureAccount {
            name: name.to_owned(),
            now_ms,
        })
        .await
        .map(drop)
    }

    pub async fn account_exists(&self, name: &str) -> Result<bool, StoreError> {
        match self
            .call(Op::AccountExists {
                name: name.to_owned(),
            })
            .await?
        {
            Done::Bool(b) => Ok(b),
            _ => Err(mismatch()),
        }
    }

    /// Journals `envelope` for the account `recipient` names (an address is resolved in the
    /// same transaction; its `seq` is assigned here) and, once durable, offers it to that
    /// account's connection.
    pub async fn append(
        &self,
        recipient: Named,
        envelope: Envelope,
        limits: MailboxLimits,
    ) -> Result<AppendOutcome, StoreError> {
        let op = Op::Append {
            recipient,
            envelope,
            limits,
        };
        match self.call(op).await? {
            Done::Append(outcome) => Ok(outcome),
            _ => Err(mismatch()),
        }
    }

    /// The account's highest journaled seq: the drain bound S (§8).
    pub async fn highest_seq(&self, account: &str) -> Result<u64, StoreError> {
        match self
            .call(Op::HighestSeq {
                account: account.to_owned(),
            })
            .await?
        {
            Done::Count(n) => Ok(n),
            _ => Err(mismatch()),
        }
    }

    /// Unexpired journal frames with `after < seq ≤ up_to`, in seq order, one bounded batch.
    pub async fn fetch(
        &self,
        account: &str,
        after: u64,
        up_to: u64,
        not_before_ms: u64,
    ) -> Result<Vec<Arc<Envelope>>, StoreError> {
        let op = Op::Fetch {
            account: account.to_owned(),
            after,
            up_to,
            not_before_ms,
        };
        match self.call(op).await? {
            Done::Frames(frames) => Ok(frames),
            _ => Err(mismatch()),
        }
    }

    pub async fn release(&self, account: &str, release: Release) -> Result<(), StoreError> {
        self.call(Op::Release {
            account: account.to_owned(),
            release,
        })
        .await
        .map(drop)
    }

    /// Deletes frames accepted before `older_than_ms`; returns how many.
    pub async fn purge(&self, older_than_ms: u64) -> Result<u64, StoreError> {
        match self.call(Op::Purge { older_than_ms }).await? {
            Done::Count(n) => Ok(n),
            _ => Err(mismatch()),
        }
    }

    /// Records that the account's last connection ended at `ms`. Never moves last_seen back,
    /// so records committed out of order keep the latest.
    pub async fn record_last_seen(&self, account: &str, ms: u64) -> Result<(), StoreError> {
        self.call(Op::RecordLastSeen {
            account: account.to_owned(),
            ms,
        })
        .await
        .map(drop)
    }

    /// The persisted last_seen of each account that has one.
    pub async fn last_seen(
        &self,
        accounts: Vec<String>,
    ) -> Result<HashMap<String, u64>, StoreError> {
        match self.call(Op::LastSeen { accounts }).await? {
            Done::LastSeen(found) => Ok(found),
            _ => Err(mismatch()),
        }
    }

    /// Binds `address` (canonical) to `account`, replacing any earlier binding (the latest
    /// successful declaration wins, §4.2). Once durable, watches on the address follow it.
    pub async fn bind_address(
        &self,
        address: &str,
        account: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.call(Op::BindAddress {
            address: address.to_owned(),
            account: account.to_owned(),
            now_ms,
        })
        .await
        .map(drop)
    }

    /// The account `address` (canonical) is bound to, if any connection ever declared it.
    pub async fn resolve_address(&self, address: &str) -> Result<Option<String>, StoreError> {
        match self
            .call(Op::ResolveAddress {
                address: address.to_owned(),
            })
            .await?
        {
            Done::Account(account) => Ok(account),
            _ => Err(mismatch()),
        }
    }

    /// Resolves each watched identifier (`None`: names nothing) and, in commit order with
    /// respect to bindings, registers the watches on `watchlist` with their first statuses.
    pub async fn watch(
        &self,
        watchlist: Arc<Watchlist>,
        targets: Vec<(String, Option<Named>)>,
    ) -> Result<(), StoreError> {
        self.call(Op::Watch { watchlist, targets }).await.map(drop)
    }

    /// Finishes queued requests, checkpoints and closes the database.
    pub async fn shutdown(&self) {
        let (done, finished) = oneshot::channel();
        if self.tx.send(Msg::Shutdown(done)).await.is_ok() {
            let _ = finished.await;
        }
    }
}

fn mismatch() -> StoreError {
    StoreError::Sqlite("the store answered a different request".into())
}

#[derive(Default)]
struct Delta {
    accounts: i64,
    frames: i64,
}

/// What an append leaves to do once the commit is durable.
enum Route {
    None,
    /// Offer the newly journaled frame to the recipient's connection.
    Offer(String, Arc<Envelope>),
    /// A duplicate: only say whether the recipient is connected.
    Disposition(String),
    /// An address now names this account: move the watches on it.
    Rebind {
        address: String,
        account: String,
    },
    /// Register resolved watches: (identifier, account) and last_seen values read here.
    Watch {
        watchlist: Arc<Watchlist>,
        targets: Vec<(String, Option<String>)>,
        persisted: HashMap<String, u64>,
    },
}

struct Applied {
    done: Done,
    delta: Delta,
    route: Route,
}

impl Applied {
    fn done(done: Done) -> Self {
        Self {
            done,
            delta: Delta::default(),
            route: Route::None,
        }
    }
}

struct Worker {
    conn: Connection,
    router: Arc<Router>,
    counters: Arc<Counters>,
    file_backed: bool,
    writes_since_checkpoint: u32,
}

impl Worker {
    fn run(mut self, mut rx: mpsc::Receiver<Msg>) {
        let mut jobs = Vec::with_capacity(MAX_BATCH);
        loop {
            let Some(first) = rx.blocking_recv() else {
                self.close();
                return;
            };
            let mut shutdown = None;
            match first {
                Msg::Job(job) => jobs.push(job),
                Msg::Shutdown(done) => shutdown = Some(done),
            }
            while shutdown.is_none() && jobs.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(Msg::Job(job)) => jobs.push(job),
                    Ok(Msg::Shutdown(done)) => shutdown = Some(done),
                    Err(_) => break,
                }
            }
            if !jobs.is_empty() {
                self.execute(&mut jobs);
            }
            if let Some(done) = shutdown {
                // Requests still queued are dropped; their callers see `Closed`.
                rx.close();
                self.close();
                // Only now: `stop()` promises the database is closed when it returns.
                let _ = done.send(());
                return;
            }
            let idle = rx.is_empty();
            if (idle && self.writes_since_checkpoint >= CHECKPOINT_IDLE)
                || self.writes_since_checkpoint >= CHECKPOINT_FORCED
            {
                self.checkpoint("PASSIVE");
            }
        }
    }

    fn checkpoint(&mut self, mode: &str) {
        self.writes_since_checkpoint = 0;
        if !self.file_backed {
            return;
        }
        let sql = format!("PRAGMA wal_checkpoint({mode})");
        if let Err(e) = self.conn.query_row(&sql, [], |_| Ok(())) {
            tracing::warn!(error = %e, "WAL checkpoint failed");
        }
    }

    /// Folds the WAL into the database and closes the connection.
    fn close(mut self) {
        self.checkpoint("TRUNCATE");
        if let Err((_, e)) = self.conn.close() {
            tracing::warn!(error = %e, "closing the database failed");
        }
    }

    fn execute(&mut self, jobs: &mut Vec<Job>) {
        let writes = jobs.iter().any(|j| j.op.writes());
        let mut tx = match self.conn.transaction() {
            Ok(tx) => tx,
            Err(e) => {
                let err = StoreError::from(e);
                tracing::error!(error = %err, "cannot begin a journal transaction");
                for job in jobs.drain(..) {
                    let _ = job.reply.send(Err(err.clone()));
                }
                return;
            }
        };
        let mut results = Vec::with_capacity(jobs.len());
        for job in jobs.drain(..) {
            let applied = match tx.savepoint() {
                Ok(mut sp) => match apply(&sp, job.op) {
                    Ok(applied) => sp.commit().map(|()| applied),
                    Err(e) => {
                        let _ = sp.rollback();
                        Err(e)
                    }
                },
                Err(e) => Err(e),
            };
            if let Err(e) = &applied {
                tracing::error!(error = %e, "journal request failed");
            }
            results.push((job.reply, applied.map_err(StoreError::from)));
        }
        if let Err(e) = tx.commit() {
            let err = StoreError::from(e);
            tracing::error!(error = %err, "journal commit failed");
            for (reply, _) in results {
                let _ = reply.send(Err(err.clone()));
            }
            return;
        }
        if writes {
            self.writes_since_checkpoint += 1;
        }
        // Durable from here on: answers and offers may go out, in commit order.
        for (reply, result) in results {
            let result = result.map(|applied| self.after_commit(applied));
            let _ = reply.send(result);
        }
    }

    fn after_commit(&self, applied: Applied) -> Done {
        let Applied { done, delta, route } = applied;
        add(&self.counters.accounts, delta.accounts);
        add(&self.counters.frames, delta.frames);
        let disposition = |live: bool| {
            if live {
                Disposition::Live
            } else {
                Disposition::Stored
            }
        };
        match (done, route) {
            (
                Done::Append(AppendOutcome::Accepted { seq, .. }),
                Route::Offer(recipient, envelope),
            ) => {
                let live = self.router.offer_journaled(&recipient, &envelope);
                Done::Append(AppendOutcome::Accepted {
                    seq,
                    disposition: disposition(live),
                })
            }
            (Done::Append(AppendOutcome::Duplicate { .. }), Route::Disposition(recipient)) => {
                Done::Append(AppendOutcome::Duplicate {
                    disposition: disposition(self.router.is_connected(&recipient)),
                })
            }
            (done, Route::Rebind { address, account }) => {
                self.router.rebind(&address, &account);
                done
            }
            (
                done,
                Route::Watch {
                    watchlist,
                    targets,
                    persisted,
                },
            ) => {
                self.router.watch(&watchlist, targets, &persisted);
                done
            }
            (done, _) => done,
        }
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

fn apply(conn: &Connection, op: Op) -> rusqlite::Result<Applied> {
    match op {
        Op::EnsureAccount { name, now_ms } => {
            let created = conn
                .prepare_cached(
                    "INSERT OR IGNORE INTO accounts (name, created_ms) VALUES (?1, ?2)",
                )?
                .execute(params![name, to_sql(now_ms)])?;
            Ok(Applied {
                done: Done::Unit,
                delta: Delta {
                    accounts: i64::from(created > 0),
                    frames: 0,
                },
                route: Route::None,
            })
        }
        Op::AccountExists { name } => {
            let found = conn
                .prepare_cached("SELECT 1 FROM accounts WHERE name = ?1")?
                .query_row([name], |_| Ok(()))
                .optional()?;
            Ok(Applied::done(Done::Bool(found.is_some())))
        }
        Op::HighestSeq { account } => {
            let seq: Option<i64> = conn
                .prepare_cached("SELECT last_seq FROM accounts WHERE name = ?1")?
                .query_row([account], |r| r.get(0))
                .optional()?;
            Ok(Applied::done(Done::Count(seq.map_or(0, from_sql))))
        }
        Op::Append {
            recipient,
            envelope,
            limits,
        } => {
            let account = match recipient {
                Named::Account(account) => account,
                Named::Address(address) => match bound_account(conn, &address)? {
                    Some(account) => account,
                    None => {
                        return Ok(Applied::done(Done::Append(AppendOutcome::UnknownRecipient)))
                    }
                },
            };
            append(conn, account, envelope, &limits)
        }
        Op::BindAddress {
            address,
            account,
            now_ms,
        } => {
            let previous = bound_account(conn, &address)?;
            conn.prepare_cached(
                "INSERT INTO addresses (address, account, bound_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (address) DO UPDATE SET account = excluded.account,
                                                     bound_ms = excluded.bound_ms",
            )?
            .execute(params![address, account, to_sql(now_ms)])?;
            let route = if previous.as_deref() == Some(account.as_str()) {
                Route::None
            } else {
                Route::Rebind { address, account }
            };
            Ok(Applied {
                done: Done::Unit,
                delta: Delta::default(),
                route,
            })
        }
        Op::ResolveAddress { address } => {
            Ok(Applied::done(Done::Account(bound_account(conn, &address)?)))
        }
        Op::Watch { watchlist, targets } => {
            let mut resolved = Vec::with_capacity(targets.len());
            let mut persisted = HashMap::new();
            for (identifier, named) in targets {
                let account = match named {
                    Some(Named::Account(account)) => Some(account),
                    Some(Named::Address(address)) => bound_account(conn, &address)?,
                    None => None,
                };
                if let Some(account) = &account {
                    if !persisted.contains_key(account) {
                        if let Some(ms) = last_seen(conn, account)? {
                            persisted.insert(account.clone(), ms);
                        }
                    }
                }
                resolved.push((identifier, account));
            }
            Ok(Applied {
                done: Done::Unit,
                delta: Delta::default(),
                route: Route::Watch {
                    watchlist,
                    targets: resolved,
                    persisted,
                },
            })
        }
        Op::Fetch {
            account,
            after,
            up_to,
            not_before_ms,
        } => {
            let mut stmt = conn.prepare_cached(
                "SELECT seq, sender, sender_account, message_id, content, reply_to_msg, accepted_ms
                 FROM journal
                 WHERE account = ?1 AND seq > ?2 AND seq <= ?3 AND accepted_ms >= ?4
                 ORDER BY seq LIMIT ?5",
            )?;
            let rows = stmt.query_map(
                params![
                    account,
                    to_sql(after),
                    to_sql(up_to),
                    to_sql(not_before_ms),
                    FETCH_FRAMES
                ],
                |r| {
                    Ok(Envelope {
                        seq: Some(from_sql(r.get(0)?)),
                        sender: r.get(1)?,
                        sender_account: r.get(2)?,
                        message_id: r.get(3)?,
                        content: r.get(4)?,
                        reply_to_msg: r.get(5)?,
                        accepted_ms: from_sql(r.get(6)?),
                    })
                },
            )?;
            let mut frames = Vec::new();
            let mut bytes = 0usize;
            for row in rows {
                let envelope = row?;
                bytes += envelope.content.len();
                frames.push(Arc::new(envelope));
                if bytes >= FETCH_BYTES {
                    break;
                }
            }
            Ok(Applied::done(Done::Frames(frames)))
        }
        Op::Release { account, release } => {
            let (sql, seq) = match release {
                Release::One(seq) => (
                    "DELETE FROM journal WHERE account = ?1 AND seq = ?2 RETURNING bytes",
                    seq,
                ),
                Release::UpTo(seq) => (
                    "DELETE FROM journal WHERE account = ?1 AND seq <= ?2 RETURNING bytes",
                    seq,
                ),
            };
            let mut stmt = conn.prepare_cached(sql)?;
            let mut count = 0i64;
            let mut bytes = 0i64;
            let mut rows = stmt.query(params![account, to_sql(seq)])?;
            while let Some(row) = rows.next()? {
                count += 1;
                bytes += row.get::<_, i64>(0)?;
            }
            drop(rows);
            uncount(conn, &account, count, bytes)?;
            Ok(Applied {
                done: Done::Unit,
                delta: Delta {
                    accounts: 0,
                    frames: -count,
                },
                route: Route::None,
            })
        }
        Op::RecordLastSeen { account, ms } => {
            conn.prepare_cached(
                "UPDATE accounts SET last_seen_ms = MAX(COALESCE(last_seen_ms, 0), ?2)
                 WHERE name = ?1",
            )?
            .execute(params![account, to_sql(ms)])?;
            Ok(Applied::done(Done::Unit))
        }
        Op::LastSeen { accounts } => {
            let mut found = HashMap::new();
            for account in accounts {
                if let Some(ms) = last_seen(conn, &account)? {
                    found.insert(account, ms);
                }
            }
            Ok(Applied::done(Done::LastSeen(found)))
        }
        Op::Purge { older_than_ms } => {
            let mut per_account: HashMap<String, (i64, i64)> = HashMap::new();
            {
                let mut stmt = conn.prepare_cached(
                    "DELETE FROM journal WHERE accepted_ms < ?1 RETURNING account, bytes",
                )?;
                let mut rows = stmt.query([to_sql(older_than_ms)])?;
                while let Some(row) = rows.next()? {
                    let entry = per_account.entry(row.get(0)?).or_default();
                    entry.0 += 1;
                    entry.1 += row.get::<_, i64>(1)?;
                }
            }
            let mut total = 0i64;
            for (account, (count, bytes)) in &per_account {
                uncount(conn, account, *count, *bytes)?;
                total += count;
            }
            Ok(Applied {
                done: Done::Count(from_sql(total)),
                delta: Delta {
                    accounts: 0,
                    frames: -total,
                },
                route: Route::None,
            })
        }
    }
}

/// The account `address` is bound to.
fn bound_account(conn: &Connection, address: &str) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT account FROM addresses WHERE address = ?1")?
        .query_row([address], |r| r.get(0))
        .optional()
}

fn last_seen(conn: &Connection, account: &str) -> rusqlite::Result<Option<u64>> {
    let ms: Option<i64> = conn
        .prepare_cached(
            "SELECT last_seen_ms FROM accounts WHERE name = ?1 AND last_seen_ms IS NOT NULL",
        )?
        .query_row([account], |r| r.get(0))
        .optional()?;
    Ok(ms.map(from_sql))
}

fn uncount(conn: &Connection, account: &str, count: i64, bytes: i64) -> rusqlite::Result<()> {
    if count == 0 {
        return Ok(());
    }
    conn.prepare_cached(
        "UPDATE accounts SET msg_count = MAX(msg_count - ?2, 0), byte_count = MAX(byte_count - ?3, 0)
         WHERE name = ?1",
    )?
    .execute(params![account, count, bytes])?;
    Ok(())
}

fn append(
    conn: &Connection,
    recipient: String,
    mut envelope: Envelope,
    limits: &MailboxLimits,
) -> rusqlite::Result<Applied> {
    let account: Option<(i64, i64, i64)> = conn
        .prepare_cached("SELECT last_seq, msg_count, byte_count FROM accounts WHERE name = ?1")?
        .query_row([&recipient], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let Some((last_seq, msg_count, byte_count)) = account else {
        return Ok(Applied::done(Done::Append(AppendOutcome::UnknownRecipient)));
    };
    let duplicate = conn
        .prepare_cached(
            "SELECT 1 FROM journal WHERE account = ?1 AND sender = ?2 AND message_id = ?3",
        )?
        .query_row(
            params![recipient, envelope.sender, envelope.message_id],
            |_| Ok(()),
        )
        .optional()?;
    if duplicate.is_some() {
        // The disposition is filled in after the commit, when the router is consulted.
        return Ok(Applied {
            done: Done::Append(AppendOutcome::Duplicate {
                disposition: Disposition::Stored,
            }),
            delta: Delta::default(),
            route: Route::Disposition(recipient),
        });
    }
    let bytes = to_sql(envelope.content.len() as u64);
    let over_count = from_sql(msg_count).saturating_add(1) > limits.max_messages;
    let over_bytes = from_sql(byte_count).saturating_add(from_sql(bytes)) > limits.max_bytes;
    if over_count || over_bytes {
        return Ok(Applied::done(Done::Append(AppendOutcome::MailboxFull)));
    }
    let seq = last_seq + 1;
    conn.prepare_cached(
        "INSERT INTO journal (account, seq, sender, sender_account, message_id, content, bytes,
                              reply_to_msg, accepted_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?
    .execute(params![
        recipient,
        seq,
        envelope.sender,
        envelope.sender_account,
        envelope.message_id,
        envelope.content,
        bytes,
        envelope.reply_to_msg,
        to_sql(envelope.accepted_ms),
    ])?;
    conn.prepare_cached(
        "UPDATE accounts SET last_seq = ?2, msg_count = msg_count + 1, byte_count = byte_count + ?3
         WHERE name = ?1",
    )?
    .execute(params![recipient, seq, bytes])?;
    envelope.seq = Some(from_sql(seq));
    Ok(Applied {
        done: Done::Append(AppendOutcome::Accepted {
            seq: from_sql(seq),
            disposition: Disposition::Stored,
        }),
        delta: Delta {
            accounts: 0,
            frames: 1,
        },
        route: Route::Offer(recipient, Arc::new(envelope)),
    })
}
