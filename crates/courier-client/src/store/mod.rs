//! The SQLite store: the durable outbox, settled outcomes, processed inbound keys, the
//! durability buffer of inbound messages awaiting the application's hook (`pending_inbound`)
//! and the received messages kept for forwarding (`received_messages`).
//!
//! # Durability promise
//! A file store runs in WAL mode with `synchronous=FULL`: every `commit` fsyncs the WAL before
//! it returns (and `fullfsync` is on, which makes that an `F_FULLFSYNC` on Apple platforms,
//! where a plain `fsync` does not reach stable storage). So once `commit` has returned — and
//! therefore once `sendMessage` has resolved — the write survives a process kill **and** an OS
//! crash or power loss, provided the disk honours flushes. `synchronous=NORMAL` would only
//! survive a process kill; the fsync it saves is amortised by group commit instead: the runtime
//! commits every op of a step in one transaction, which costs one fsync however many messages
//! it carries.
//!
//! # Checkpoints
//! SQLite's automatic checkpoint would run inside whichever commit crosses 1000 WAL pages and
//! add two fsyncs to it. It is off (`wal_autocheckpoint=0`); a WAL hook counts the pages
//! instead and the runtime calls [`Store::maybe_checkpoint`] off the commit path, which runs a
//! `PASSIVE` checkpoint once the WAL exceeds [`WAL_CHECKPOINT_PAGES`].
//!
//! # One writer
//! `open` holds an exclusive lock on `<db path>.lock` for the store's lifetime (see
//! `lock.rs`): a second `open` of the same file, in this process or another, fails with
//! [`StoreError::Locked`].

mod connections;
mod dedup;
mod groups;
mod identity;
mod inbound;
mod ledger;
mod lock;
pub mod media;
mod mls;
mod outbox;
mod received;
mod schema;

use std::os::raw::c_int;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use courier_engine::io::{
    EntryState, GroupSendRecord, Millis, OutboxRecord, PendingInbound, ProcessedKey, Settlement,
    StoreOp,
};
use courier_proto::CONTROL_REPLAY_WINDOW_MS;
use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior};

pub use connections::{ConnectionChange, PendingRequest};
use courier_crypto::{Change, RowKey};
pub use groups::{GroupChange, GroupRow, GroupSendStatus};
pub use identity::KeyFileProblem;
use identity::SealKeys;
pub use ledger::read_recent as read_recent_ledgers;
use lock::LockFile;
pub use received::{Received, ReceivedMessage};
pub use schema::SCHEMA_VERSION;
use zeroize::Zeroizing;

/// WAL size, in pages, above which `maybe_checkpoint` checkpoints (SQLite's own default).
pub const WAL_CHECKPOINT_PAGES: u32 = 1000;

/// How long a statement waits for a SQLite lock held by someone else. We are the only writer
/// (the lock file guarantees it); this only covers an external reader such as a backup tool.
const BUSY_TIMEOUT: Duration = Duration::from_millis(200);

/// After a checkpoint lets the WAL restart, SQLite truncates the file to this size, so one
/// burst does not leave a large WAL on disk forever.
const JOURNAL_SIZE_LIMIT_BYTES: i64 = 8 * 1024 * 1024;

/// Prepared statements kept per connection; the commit path uses a handful.
const STATEMENT_CACHE: usize = 32;

/// What the runtime changed in a step besides the engine's store ops.
#[derive(Debug, Default, Clone, Copy)]
pub struct RuntimeChanges<'a> {
    pub sessions: &'a [Change],
    pub connections: &'a [ConnectionChange],
    pub groups: &'a [GroupChange],
    pub media: &'a [media::MediaChange],
    /// The messages the step processed (delivered to the app, or committed by its hook).
    pub received: &'a [Received<'a>],
    /// When the step ran: the received messages' time.
    pub now: Millis,
    /// The step's message ledger entries (`crate::ledger`).
    pub ledger: &'a [crate::ledger::Entry],
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another `Store` (in this process or another) has this database open.
    #[error("storage {} is locked: another Protocol in this or another process is using it", .0.display())]
    Locked(PathBuf),
    /// A SQLite failure; the message is SQLite's reason (disk full, read-only, I/O error…).
    #[error("SQLite error: {0}")]
    Sqlite(rusqlite::Error),
    /// The file is not a database, is damaged, or holds rows this build cannot read.
    #[error("storage is corrupt: {0}")]
    Corrupt(String),
    #[error("storage I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The identity seed cannot be opened (a missing or different seal key). The stored identity
    /// is left untouched and never replaced (`docs/protocol.md#identity-key`).
    #[error("{0}")]
    Identity(String),
    /// The identity key file could have been replaced or read by someone else: it is not used,
    /// and the identity is left untouched (`docs/protocol.md#identity-key`).
    #[error(
        "the identity key file {} {problem}; the identity is kept and not replaced",
        path.display()
    )]
    UnsafeKeyFile {
        path: PathBuf,
        problem: identity::KeyFileProblem,
    },
    /// The identity row is in the clear in a file store whose identity was sealed (its key
    /// file exists): someone wrote an identity of their choosing into the database.
    #[error(
        "the identity seed is stored in the clear, yet this store sealed it before: the row was \
         replaced from outside and is refused; the identity is kept and not replaced"
    )]
    CleartextIdentity,
    /// The database was written by a newer build; it is left untouched.
    #[error(
        "storage schema version {found} is newer than this build supports ({supported}); \
         the file was left untouched"
    )]
    NewerSchema { found: u32, supported: u32 },
    /// Session state was read or written before the identity that seals it was loaded.
    #[error("the end-to-end session state needs the identity, which is not loaded yet")]
    NoIdentity,
    /// A schema migration failed or would have lost data; it was rolled back.
    #[error("storage migration to schema version {to} failed: {message}")]
    Migration { to: u32, message: String },
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
                Self::Corrupt(e.to_string())
            }
            _ => Self::Sqlite(e),
        }
    }
}

/// How a settled message ended, kept for `getMessageStatus` and idempotent client ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettledRecord {
    pub outcome: Settlement,
    pub at: Millis,
    pub recipient: String,
}

/// Terminal-event bookkeeping for one commit (see [`Store::commit_step`]).
#[derive(Debug, Default)]
pub struct Reports {
    /// `(message id, event JSON)` of this step's terminal events, about to be dispatched.
    pub held: Vec<(String, String)>,
    /// Ids whose terminal events were dispatched since the last commit.
    pub done: Vec<String>,
}

/// What storage knows about a message id (`getMessageStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageStatus {
    Queued,
    InFlight,
    Parked,
    Delivered,
    Failed,
    Unknown,
}

impl MessageStatus {
    /// The API string: `'queued' | 'in_flight' | 'parked' | 'delivered' | 'failed' | 'unknown'`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::InFlight => "in_flight",
            Self::Parked => "parked",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
        }
    }
}

impl From<EntryState> for MessageStatus {
    fn from(s: EntryState) -> Self {
        match s {
            EntryState::Queued => Self::Queued,
            EntryState::InFlight => Self::InFlight,
            EntryState::Parked => Self::Parked,
            // Waiting for its session is waiting to be sent: `'queued'` in the API.
            EntryState::AwaitingSession => Self::Queued,
        }
    }
}

pub struct Store {
    // Field order is drop order: the connection closes (and SQLite runs its final checkpoint)
    // before the lock is released, so the next owner never sees a half-closed database.
    conn: Connection,
    /// Frames in the WAL after the last commit, as reported by the WAL hook.
    wal_pages: Arc<AtomicU32>,
    path: Option<PathBuf>,
    /// Seals the session rows; known once the identity is loaded.
    rest_key: Option<mls::RestKey>,
    _lock: Option<LockFile>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .field("lock", &self._lock.as_ref().map(LockFile::path))
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating if missing) the database at `path`, takes the one-writer lock, and
    /// migrates it to [`SCHEMA_VERSION`]. See the module docs for the durability settings.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let lock = LockFile::acquire(path)?;
        Self::open_locked(path, lock).map_err(|e| match e {
            StoreError::Corrupt(msg) => StoreError::Corrupt(format!("{}: {msg}", path.display())),
            other => other,
        })
    }

    fn open_locked(path: &Path, lock: LockFile) -> Result<Store, StoreError> {
        // No SQLITE_OPEN_URI: the path is a file name, never a `file:` URI with parameters.
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let created = !path.exists();
        let mut conn = Connection::open_with_flags(path, flags)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;

        // The first read of the file: a non-database fails here, and a newer schema is refused
        // before anything (even the journal mode, which lives in the header) is written.
        let found = schema::read_version(&conn)?;
        schema::check_not_newer(found, SCHEMA_VERSION)?;

        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Io(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                format!(
                    "{}: the file system does not support SQLite's WAL mode (journal mode stayed {mode:?})",
                    path.display()
                ),
            )));
        }
        conn.execute_batch(&format!(
            "PRAGMA synchronous = FULL;
             PRAGMA fullfsync = ON;
             PRAGMA wal_autocheckpoint = 0;
             PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT_BYTES};
             PRAGMA foreign_keys = ON;"
        ))?;

        // Registered after `wal_autocheckpoint = 0`, which would replace it.
        let wal_pages = Arc::new(AtomicU32::new(0));
        let counter = Arc::clone(&wal_pages);
        conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: c_int| {
            counter.store(u32::try_from(pages).unwrap_or(0), Ordering::Relaxed);
            Ok(())
        }))?;

        let store = Self::finish(conn, wal_pages, Some(path.to_path_buf()), Some(lock))?;
        if created {
            // SQLite syncs the WAL's directory entry, not the new database file's: make the
            // file itself survive a power cut before the first `sendMessage` can resolve.
            sync_parent_dir(path)?;
        }
        Ok(store)
    }

    /// An in-memory store (`storage.memory: true`): same schema and semantics, nothing survives
    /// the `Store`. No lock: nobody else can reach it.
    pub fn open_memory() -> Result<Store, StoreError> {
        let conn = Connection::open_in_memory()?;
        conn.execute_batch("PRAGMA foreign_keys = ON;")?;
        Self::finish(conn, Arc::new(AtomicU32::new(0)), None, None)
    }

    fn finish(
        mut conn: Connection,
        wal_pages: Arc<AtomicU32>,
        path: Option<PathBuf>,
        lock: Option<LockFile>,
    ) -> Result<Store, StoreError> {
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        schema::migrate(&mut conn)?;
        Ok(Store {
            conn,
            wal_pages,
            path,
            rest_key: None,
            _lock: lock,
        })
    }

    /// The database file, `None` for an in-memory store.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// `PRAGMA user_version`.
    pub fn schema_version(&self) -> Result<u32, StoreError> {
        Ok(schema::read_version(&self.conn)?)
    }

    /// Every outbox entry, oldest accepted first.
    pub fn load_outbox(&self) -> Result<Vec<OutboxRecord>, StoreError> {
        outbox::load(&self.conn)
    }

    /// This profile's identity seed: the stored one, or — on the first start only — `generate()`'s,
    /// committed before it is returned so a key is never used before it is durable. A store that
    /// cannot be read, or a seal that does not open, fails here rather than minting a
    /// replacement. At rest the seed is sealed under `app_key` (`storage.identitySealKey`) when
    /// the app supplies one, else under the key file beside the database (see `identity.rs`).
    pub fn load_or_create_identity(
        &mut self,
        now: Millis,
        app_key: Option<Zeroizing<[u8; 32]>>,
        generate: impl FnOnce() -> Result<[u8; 32], String>,
    ) -> Result<[u8; 32], StoreError> {
        let keys = SealKeys {
            app: app_key,
            key_file: self.path.as_deref().map(SealKeys::key_file_for),
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let seed = identity::load_or_create(&tx, &keys, to_db(now), generate)?;
        tx.commit()?;
        self.rest_key = Some(mls::RestKey::from_seed(&seed));
        Ok(seed)
    }

    /// The end-to-end session state as last committed, opened; the identity must be loaded.
    pub fn load_sessions(&self) -> Result<Vec<(RowKey, Vec<u8>)>, StoreError> {
        let rest = self.rest_key.as_ref().ok_or(StoreError::NoIdentity)?;
        mls::load(&self.conn, rest)
    }

    /// Every buffered inbound message (`pending_inbound`), oldest received first: the batch the
    /// engine offers the durability hook again after a restart.
    pub fn load_pending_inbound(&self) -> Result<Vec<PendingInbound>, StoreError> {
        inbound::load(&self.conn)
    }

    /// Prunes processed keys older than `now - retention_ms` and the oldest beyond `max`, then
    /// returns the rest, oldest first.
    pub fn load_processed(
        &mut self,
        now: Millis,
        retention_ms: u64,
        max: usize,
    ) -> Result<Vec<ProcessedKey>, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        dedup::prune(&tx, now.saturating_sub(retention_ms), max)?;
        let keys = dedup::load(&tx)?;
        tx.commit()?;
        Ok(keys)
    }

    /// Prunes the keys of verified control frames processed `CONTROL_REPLAY_WINDOW_MS` before
    /// `now`, then returns the rest, oldest first (`docs/delivery.md#control-frames`).
    pub fn load_processed_controls(
        &mut self,
        now: Millis,
    ) -> Result<Vec<ProcessedKey>, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        dedup::prune_controls(&tx, now.saturating_sub(CONTROL_REPLAY_WINDOW_MS))?;
        let keys = dedup::load_controls(&tx)?;
        tx.commit()?;
        Ok(keys)
    }

    /// Deletes the keys of verified control frames processed before `older_than`; returns how
    /// many were deleted. No count bound applies to them.
    pub fn prune_processed_controls(&mut self, older_than: Millis) -> Result<usize, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = dedup::prune_controls(&tx, older_than)?;
        tx.commit()?;
        Ok(n)
    }

    /// Deletes processed keys older than `older_than` and the oldest beyond `max`; returns how
    /// many were deleted. For periodic trimming while running (`load_processed` does it at start).
    pub fn prune_processed(&mut self, older_than: Millis, max: usize) -> Result<usize, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = dedup::prune(&tx, older_than, max)?;
        tx.commit()?;
        Ok(n)
    }

    /// Applies `ops` in order, all in one transaction (group commit: one fsync for the batch).
    /// On error nothing of the batch is applied.
    ///
    /// - `Put`: upsert the outbox row (and forget a previous settlement of the same id);
    /// - `Settle`: delete the outbox row, upsert the outcome into `settled`;
    /// - `MarkProcessed`: insert the key unless present (first processing time kept);
    /// - `BufferInbound`: insert each message into `pending_inbound` unless its key is there
    ///   (the first copy is kept);
    /// - `CommitInbound`: delete the keys' buffered rows and mark each processed at `at`;
    /// - `ExpireInbound`: delete the keys' buffered rows.
    pub fn commit(&mut self, ops: &[StoreOp]) -> Result<(), StoreError> {
        self.commit_step(ops, &Reports::default())
    }

    /// [`commit`](Self::commit), plus the bookkeeping of terminal events in the same
    /// transaction: `reports.held` keeps each settlement's event until `reports.done` says it
    /// was dispatched. What is still held at a start is emitted again ([`Store::unreported`]):
    /// a terminal event is never lost to a crash between its commit and its dispatch.
    pub fn commit_step(&mut self, ops: &[StoreOp], reports: &Reports) -> Result<(), StoreError> {
        self.commit_with(ops, reports, &RuntimeChanges::default())
    }

    /// [`commit_step`](Self::commit_step), with what the runtime changed in the step in the same
    /// transaction: a ratchet step commits with what it sealed or opened, a connection request
    /// with the frame that brought or sent it.
    pub fn commit_with(
        &mut self,
        ops: &[StoreOp],
        reports: &Reports,
        runtime: &RuntimeChanges<'_>,
    ) -> Result<(), StoreError> {
        let RuntimeChanges {
            sessions,
            connections,
            groups,
            media,
            received,
            now,
            ledger: ledger_entries,
        } = *runtime;
        if ops.is_empty()
            && reports.held.is_empty()
            && reports.done.is_empty()
            && sessions.is_empty()
            && connections.is_empty()
            && groups.is_empty()
            && media.is_empty()
            && received.is_empty()
            && ledger_entries.is_empty()
        {
            return Ok(());
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        if !sessions.is_empty() {
            let rest = self.rest_key.as_ref().ok_or(StoreError::NoIdentity)?;
            mls::apply(&tx, rest, sessions)?;
        }
        connections::apply(&tx, connections)?;
        groups::apply(&tx, groups)?;
        media::apply(&tx, media, now)?;
        for message in received {
            received::keep(&tx, message, now)?;
        }
        for op in ops {
            match op {
                StoreOp::Put(record) => outbox::put(&tx, record)?,
                StoreOp::Settle {
                    id,
                    recipient,
                    settlement,
                    at,
                } => outbox::settle(&tx, id, recipient, settlement, *at)?,
                StoreOp::MarkProcessed(ProcessedKey { key, at }) => dedup::mark(&tx, key, *at)?,
                StoreOp::MarkControl(ProcessedKey { key, at }) => {
                    dedup::mark_control(&tx, key, *at)?
                }
                StoreOp::BufferInbound(batch) => inbound::buffer(&tx, batch)?,
                StoreOp::CommitInbound { keys, at } => inbound::commit(&tx, keys, *at)?,
                StoreOp::ExpireInbound { keys } => inbound::delete(&tx, keys)?,
                StoreOp::PutGroupSend(record) => groups::put_send(&tx, record)?,
                StoreOp::GroupMember { id, member, state } => {
                    groups::set_member(&tx, id, member, *state)?
                }
                StoreOp::GroupSendDone { id } => groups::mark_done(&tx, id)?,
            }
        }
        ledger::write(&tx, ledger_entries)?;
        for id in &reports.done {
            outbox::mark_reported(&tx, id)?;
        }
        for (id, event) in &reports.held {
            outbox::hold_event(&tx, id, event)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The message received as `message_id` (the id `message_received` named it by), while it
    /// is kept.
    pub fn received(&self, message_id: &str) -> Result<Option<ReceivedMessage>, StoreError> {
        received::find(&self.conn, message_id)
    }

    /// Bounds the received messages: the oldest beyond `max_messages`, then the oldest until
    /// the rest fit `max_bytes`, are deleted. Returns how many.
    pub fn prune_received(
        &mut self,
        max_messages: usize,
        max_bytes: u64,
    ) -> Result<usize, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = received::prune(&tx, max_messages, max_bytes)?;
        tx.commit()?;
        Ok(n)
    }

    /// The groups this device is in, each with the members the relay confirmed.
    pub fn load_groups(&self) -> Result<Vec<(GroupRow, Vec<String>)>, StoreError> {
        groups::load(&self.conn)
    }

    /// The group messages with something left to deliver, oldest first.
    pub fn load_media(
        &self,
    ) -> Result<(Vec<media::OutgoingRow>, Vec<media::IncomingRow>), StoreError> {
        Ok((
            media::load_outgoing(&self.conn)?,
            media::load_incoming(&self.conn)?,
        ))
    }

    /// Forgets the manifests of transfers that ended before `older_than`.
    pub fn prune_media(&mut self, older_than: Millis) -> Result<usize, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = media::prune(&tx, older_than)?;
        tx.commit()?;
        Ok(n)
    }

    pub fn load_group_sends(&self) -> Result<Vec<GroupSendRecord>, StoreError> {
        groups::load_active(&self.conn)
    }

    /// `getGroupMessageStatus` from storage: each member's state, during and after delivery.
    pub fn group_send_status(&self, id: &str) -> Result<Option<GroupSendStatus>, StoreError> {
        groups::status(&self.conn, id)
    }

    /// Forgets done group messages sent before `older_than`; returns how many.
    pub fn prune_group_sends(&mut self, older_than: Millis) -> Result<usize, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = groups::prune_done(&tx, older_than)?;
        tx.commit()?;
        Ok(n)
    }

    /// The peers this device talks with.
    pub fn load_contacts(&self) -> Result<Vec<String>, StoreError> {
        connections::load_contacts(&self.conn)
    }

    /// The connection requests waiting for an answer, oldest first.
    pub fn load_connection_requests(&self) -> Result<Vec<PendingRequest>, StoreError> {
        connections::load_pending(&self.conn)
    }

    /// Terminal events whose settlement committed but whose dispatch was never recorded, as
    /// `(message id, event JSON)`, oldest first.
    pub fn unreported(&self) -> Result<Vec<(String, String)>, StoreError> {
        outbox::unreported(&self.conn)
    }

    /// How `id` settled, if it did (and has not been pruned or re-sent since).
    pub fn settled(&self, id: &str) -> Result<Option<SettledRecord>, StoreError> {
        outbox::settled(&self.conn, id)
    }

    /// `getMessageStatus` from storage: the live outbox row wins, then the settled outcome.
    pub fn status(&self, id: &str) -> Result<MessageStatus, StoreError> {
        if let Some(state) = outbox::state_of(&self.conn, id)? {
            return Ok(state.into());
        }
        Ok(match self.settled(id)? {
            Some(SettledRecord {
                outcome: Settlement::Delivered,
                ..
            }) => MessageStatus::Delivered,
            Some(SettledRecord {
                outcome: Settlement::Failed(_),
                ..
            }) => MessageStatus::Failed,
            None => MessageStatus::Unknown,
        })
    }

    /// The ledger of message `id` (`docs/delivery.md#a-messages-life`), while it is kept.
    pub fn history(&self, id: &str) -> Result<Option<crate::ledger::History>, StoreError> {
        ledger::history(&self.conn, id)
    }

    /// The outbox row of `id`, while it is live.
    pub fn outbox_record(&self, id: &str) -> Result<Option<OutboxRecord>, StoreError> {
        outbox::record_of(&self.conn, id)
    }

    /// Forgets the ledgers of settled messages last changed before `older_than`, then the
    /// oldest beyond `max` messages. Returns how many messages.
    pub fn prune_ledger(&mut self, older_than: Millis, max: usize) -> Result<usize, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = ledger::prune(&tx, older_than, max)?;
        tx.commit()?;
        Ok(n)
    }

    /// Bounds the settled table: deletes outcomes recorded before `older_than`, then the oldest
    /// beyond `max`. Returns how many rows were deleted.
    pub fn prune_settled(&mut self, older_than: Millis, max: usize) -> Result<usize, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = outbox::prune_settled(&tx, older_than, max)?;
        tx.commit()?;
        Ok(n)
    }

    /// Test hook (feature `test-hooks`): caps the database at its current size plus
    /// `extra_pages`, the way a full disk would (SQLITE_FULL on the next commit that needs
    /// more), for fault-injection tests.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn cap_size_for_faults(&self, extra_pages: u32) -> Result<(), StoreError> {
        let pages: u32 = self.conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
        self.conn.query_row(
            &format!("PRAGMA max_page_count = {}", pages + extra_pages),
            [],
            |_| Ok(()),
        )?;
        Ok(())
    }

    /// Frames in the WAL after the last commit (0 for an in-memory store).
    pub fn wal_pages(&self) -> u32 {
        self.wal_pages.load(Ordering::Relaxed)
    }

    /// Runs a `PASSIVE` checkpoint when the WAL holds more than [`WAL_CHECKPOINT_PAGES`]
    /// pages; otherwise returns at once. Call it off the commit path (after the events of a
    /// step were dispatched, or from an idle moment): the checkpoint costs up to two fsyncs.
    pub fn maybe_checkpoint(&mut self) -> Result<(), StoreError> {
        if self.path.is_none() || self.wal_pages() <= WAL_CHECKPOINT_PAGES {
            return Ok(());
        }
        let (busy, log, done): (i64, i64, i64) =
            self.conn
                .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                })?;
        if busy == 0 && log == done {
            // Everything is in the database file: the next commit restarts the WAL, and the
            // hook will report its new size.
            self.wal_pages.store(0, Ordering::Relaxed);
        }
        // Otherwise a reader pinned part of the WAL; the next call tries again.
        Ok(())
    }
}

#[cfg(unix)]
fn sync_parent_dir(path: &Path) -> Result<(), StoreError> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::File::open(parent)?.sync_all()?;
    Ok(())
}

#[cfg(not(unix))]
fn sync_parent_dir(_path: &Path) -> Result<(), StoreError> {
    // Windows has no directory fsync; NTFS journals the directory entry itself.
    Ok(())
}

/// Times and counters are `u64` in the engine and `INTEGER` (i64) in SQLite. Real values are
/// far below `i64::MAX` (epoch milliseconds reach it in 292 million years); larger ones are
/// clamped rather than wrapped, so ordering by time stays correct.
pub(crate) fn to_db(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn from_db_u64(v: i64) -> Option<u64> {
    u64::try_from(v).ok()
}

pub(crate) fn from_db_u32(v: i64) -> Option<u32> {
    u32::try_from(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pragma_i64(store: &Store, name: &str) -> i64 {
        store
            .conn
            .pragma_query_value(None, name, |row| row.get(0))
            .unwrap()
    }

    #[test]
    fn file_store_settings() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let mode: String = store
            .conn
            .pragma_query_value(None, "journal_mode", |row| row.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        assert_eq!(pragma_i64(&store, "synchronous"), 2, "FULL");
        assert_eq!(pragma_i64(&store, "wal_autocheckpoint"), 0);
        assert_eq!(pragma_i64(&store, "foreign_keys"), 1);
        assert_eq!(pragma_i64(&store, "busy_timeout"), 200);
        assert_eq!(
            pragma_i64(&store, "journal_size_limit"),
            JOURNAL_SIZE_LIMIT_BYTES
        );
    }

    #[test]
    fn store_moves_to_the_driver_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<Store>();
        assert_send::<StoreError>();
    }

    #[test]
    fn parent_directory_sync_handles_bare_names() {
        // `sync_parent_dir` on a bare file name syncs ".".
        let dir = tempfile::tempdir().unwrap();
        sync_parent_dir(&dir.path().join("x.db")).unwrap();
        sync_parent_dir(Path::new("x.db")).unwrap();
    }

    #[test]
    fn memory_store_settings() {
        let store = Store::open_memory().unwrap();
        assert_eq!(pragma_i64(&store, "foreign_keys"), 1);
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(store.path(), None);
    }

    #[test]
    fn a_failing_batch_changes_nothing() {
        use courier_proto::{ContentType, Message, Priority};
        let mut store = Store::open_memory().unwrap();
        // Make the second op of the batch fail inside SQLite.
        store
            .conn
            .execute_batch(
                "CREATE TRIGGER refuse BEFORE INSERT ON processed
                 BEGIN SELECT RAISE(ABORT, 'disk on fire'); END;",
            )
            .unwrap();
        let message = Message {
            id: "m1".into(),
            sender: "alice".into(),
            recipient: "bob".into(),
            app_id: "chat".into(),
            priority: Priority::Medium,
            ttl: 8,
            hop_count: 0,
            timestamp: 1,
            lamport_clock: 1,
            content_type: ContentType::Text,
            content: "hi".into(),
            metadata: Default::default(),
            requires_ack: true,
            reply_to_msg: None,
            rich: None,
            binary_content: None,
            media_metadata: None,
            forwarded_from: None,
            reply_context: None,
            encrypted: None,
        };
        let put = StoreOp::Put(OutboxRecord {
            message,
            state: EntryState::Queued,
            created_at: 1,
            window_start: 1,
            ack_attempts: 0,
            transport_retries: 0,
            next_at: None,
            first_sent_at: None,
            last_sent_at: None,
        });
        let mark = StoreOp::MarkProcessed(ProcessedKey {
            key: courier_engine::InboundKey {
                chat: "dm".into(),
                sender: "bob".into(),
                message_id: "x".into(),
            },
            at: 1,
        });
        let err = store.commit(&[put.clone(), mark]).unwrap_err();
        assert!(matches!(err, StoreError::Sqlite(_)), "{err:?}");
        assert!(err.to_string().contains("disk on fire"), "{err}");
        assert!(store.load_outbox().unwrap().is_empty());
        // The store is usable afterwards.
        store.commit(&[put]).unwrap();
        assert_eq!(store.load_outbox().unwrap().len(), 1);
    }

    #[test]
    fn time_conversion_clamps_instead_of_wrapping() {
        assert_eq!(to_db(0), 0);
        assert_eq!(to_db(i64::MAX as u64), i64::MAX);
        assert_eq!(to_db(u64::MAX), i64::MAX);
        assert_eq!(from_db_u64(-1), None);
        assert_eq!(from_db_u32(i64::from(u32::MAX) + 1), None);
    }
}
