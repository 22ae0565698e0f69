//! Schema versions and migrations, tracked in `PRAGMA user_version`.
//!
//! `MIGRATIONS[i]` takes a database from version `i` to `i + 1`; version 0 is an empty file.
//! A new version is one function appended to the list. The rules every migration follows:
//! - it runs inside the one transaction that also bumps `user_version`: a crash mid-migration
//!   leaves the old version intact;
//! - it never drops a pending outbox row. `migrate` enforces this: if the outbox holds fewer
//!   rows after the migration than before, the transaction is rolled back and the open fails;
//! - a database whose version is newer than this build knows is refused with
//!   `StoreError::NewerSchema` and never written to (an older build cannot know what a newer
//!   schema means, and "fixing" it would lose data the newer build relies on).

use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::StoreError;

/// One migration step: from version `i` to `i + 1` (its index in `MIGRATIONS`).
pub(crate) type Migration = fn(&Transaction<'_>) -> rusqlite::Result<()>;

pub(crate) const MIGRATIONS: &[Migration] = &[
    v1_initial,
    v2_pending_inbound,
    v3_identity,
    v4_sealed_identity,
    v5_unreported_settlements,
    v6_sessions,
    v7_sealed_inbound,
    v8_connections,
    v9_groups,
    v10_received,
    v11_media,
    v12_processed_controls,
    v13_ledger,
    v14_ledger_log,
];

/// The schema version this build writes and understands.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// The first version that keeps the message ledger.
pub(crate) const LEDGER_VERSION: u32 = 13;

/// Version 1: outbox, settled outcomes, processed inbound keys.
fn v1_initial(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE outbox (
             id                TEXT    PRIMARY KEY NOT NULL,
             recipient         TEXT    NOT NULL,
             state             TEXT    NOT NULL CHECK (state IN ('queued', 'in_flight', 'parked')),
             created_at        INTEGER NOT NULL,
             window_start      INTEGER NOT NULL,
             ack_attempts      INTEGER NOT NULL CHECK (ack_attempts >= 0),
             transport_retries INTEGER NOT NULL CHECK (transport_retries >= 0),
             next_at           INTEGER NULL,
             first_sent_at     INTEGER NULL,
             last_sent_at      INTEGER NULL,
             is_media          INTEGER NOT NULL CHECK (is_media IN (0, 1)),
             message_json      TEXT    NOT NULL
         );
         CREATE INDEX outbox_by_created_at ON outbox (created_at);

         CREATE TABLE settled (
             id        TEXT    PRIMARY KEY NOT NULL,
             recipient TEXT    NOT NULL,
             outcome   TEXT    NOT NULL CHECK (outcome IN ('delivered', 'failed')),
             reason    TEXT    NULL,
             at        INTEGER NOT NULL,
             CHECK ((outcome = 'delivered') = (reason IS NULL))
         ) WITHOUT ROWID;
         CREATE INDEX settled_by_at ON settled (at);

         CREATE TABLE processed (
             chat       TEXT    NOT NULL,
             sender     TEXT    NOT NULL,
             message_id TEXT    NOT NULL,
             at         INTEGER NOT NULL,
             PRIMARY KEY (chat, sender, message_id)
         ) WITHOUT ROWID;
         CREATE INDEX processed_by_at ON processed (at);",
    )
}

/// Version 2: the durability buffer for inbound messages. A buffered copy is written before the
/// application's durability hook sees the message and deleted once the hook committed it (or
/// after retention). `carrier` is `"internet"` or the local carrier's registered name.
fn v2_pending_inbound(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE pending_inbound (
             chat           TEXT    NOT NULL,
             sender         TEXT    NOT NULL,
             message_id     TEXT    NOT NULL,
             message_json   TEXT    NOT NULL,
             carrier        TEXT    NOT NULL,
             stamped_sender TEXT    NOT NULL,
             received_at    INTEGER NOT NULL,
             PRIMARY KEY (chat, sender, message_id)
         );
         CREATE INDEX pending_inbound_by_received_at ON pending_inbound (received_at);",
    )
}

/// Version 3: this profile's identity key (`docs/protocol.md#identity-key`). One row; the 32-byte
/// Ed25519 seed is written before the key is used for anything and never replaced.
fn v3_identity(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE identity (
             id         INTEGER PRIMARY KEY CHECK (id = 1),
             seed       BLOB    NOT NULL CHECK (length(seed) = 32),
             created_at INTEGER NOT NULL
         );",
    )
}

/// Version 4: the identity seed sealed at rest (`docs/protocol.md#identity-key`). `sealed_by` names
/// the key that opens `seed`: `app_key` (the app's `storage.identitySealKey`), `key_file` (the key
/// file beside the database), or `none` — a seed written by version 3, which the next start seals
/// in place.
fn v4_sealed_identity(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE identity_sealed (
             id         INTEGER PRIMARY KEY CHECK (id = 1),
             sealed_by  TEXT    NOT NULL CHECK (sealed_by IN ('none', 'app_key', 'key_file')),
             nonce      BLOB    NULL,
             seed       BLOB    NOT NULL,
             created_at INTEGER NOT NULL,
             CHECK ((sealed_by = 'none') = (nonce IS NULL))
         );
         INSERT INTO identity_sealed (id, sealed_by, nonce, seed, created_at)
             SELECT id, 'none', NULL, seed, created_at FROM identity;
         DROP TABLE identity;
         ALTER TABLE identity_sealed RENAME TO identity;",
    )
}

/// Version 5: a settlement's terminal event, kept until it has been dispatched, so one a crash
/// cut off between the commit and the dispatch is emitted again at the next start.
fn v5_unreported_settlements(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch("ALTER TABLE settled ADD COLUMN unreported_event TEXT NULL;")
}

/// Version 6: end-to-end sessions. The outbox takes rows of the pre-session queue (state
/// `awaiting_session`, `docs/delivery.md#pre-session-queue`): SQLite cannot change a CHECK in
/// place, so the table is rebuilt with every row copied. `mls_state` holds the MLS state as
/// sealed key-value rows (`store/mls.rs`).
fn v6_sessions(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE outbox_v6 (
             id                TEXT    PRIMARY KEY NOT NULL,
             recipient         TEXT    NOT NULL,
             state             TEXT    NOT NULL
                 CHECK (state IN ('queued', 'in_flight', 'parked', 'awaiting_session')),
             created_at        INTEGER NOT NULL,
             window_start      INTEGER NOT NULL,
             ack_attempts      INTEGER NOT NULL CHECK (ack_attempts >= 0),
             transport_retries INTEGER NOT NULL CHECK (transport_retries >= 0),
             next_at           INTEGER NULL,
             first_sent_at     INTEGER NULL,
             last_sent_at      INTEGER NULL,
             is_media          INTEGER NOT NULL CHECK (is_media IN (0, 1)),
             message_json      TEXT    NOT NULL
         );
         INSERT INTO outbox_v6 (id, recipient, state, created_at, window_start, ack_attempts,
                 transport_retries, next_at, first_sent_at, last_sent_at, is_media, message_json)
             SELECT id, recipient, state, created_at, window_start, ack_attempts,
                 transport_retries, next_at, first_sent_at, last_sent_at, is_media, message_json
             FROM outbox;
         DROP TABLE outbox;
         ALTER TABLE outbox_v6 RENAME TO outbox;
         CREATE INDEX outbox_by_created_at ON outbox (created_at);

         CREATE TABLE mls_state (
             key   BLOB PRIMARY KEY NOT NULL,
             nonce BLOB NOT NULL,
             value BLOB NOT NULL
         ) WITHOUT ROWID;",
    )
}

/// Version 7: a buffered inbound message remembers whether it arrived sealed in a session, for
/// the `encrypted` mark of its `message_received`.
fn v7_sealed_inbound(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch("ALTER TABLE pending_inbound ADD COLUMN encrypted INTEGER NOT NULL DEFAULT 0;")
}

/// Version 8: contacts and connection requests (`docs/delivery.md#connection-requests`).
fn v8_connections(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE contacts (
             peer  TEXT    PRIMARY KEY NOT NULL,
             since INTEGER NOT NULL
         ) WITHOUT ROWID;

         CREATE TABLE connection_requests (
             id          TEXT    PRIMARY KEY NOT NULL,
             peer        TEXT    NOT NULL,
             incoming    INTEGER NOT NULL CHECK (incoming IN (0, 1)),
             note        TEXT    NULL,
             key_package BLOB    NULL,
             at          INTEGER NOT NULL
         ) WITHOUT ROWID;",
    )
}

/// `PRAGMA user_version`. The first read of a file, so a non-database fails here.
pub(crate) fn read_version(conn: &Connection) -> rusqlite::Result<u32> {
    let v: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
    // user_version is a signed 32-bit header field; a negative one was not written by us and
    // is certainly not a version we support.
    Ok(u32::try_from(v).unwrap_or(u32::MAX))
}

/// Refuses a database newer than `supported` without touching it.
pub(crate) fn check_not_newer(found: u32, supported: u32) -> Result<(), StoreError> {
    if found > supported {
        return Err(StoreError::NewerSchema { found, supported });
    }
    Ok(())
}

/// Brings the database to `SCHEMA_VERSION`.
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    migrate_with(conn, MIGRATIONS)
}

/// Brings the database to `migrations.len()`, all pending steps in one transaction.
pub(crate) fn migrate_with(
    conn: &mut Connection,
    migrations: &[Migration],
) -> Result<(), StoreError> {
    let supported = migrations.len() as u32;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Read again under the write lock: the version cannot change between here and commit.
    let found = read_version(&tx)?;
    check_not_newer(found, supported)?;
    if found == supported {
        return Ok(()); // dropping `tx` rolls back an empty transaction
    }
    let pending_before = if found >= 1 { outbox_rows(&tx)? } else { 0 };
    for (index, step) in migrations.iter().enumerate().skip(found as usize) {
        step(&tx).map_err(|e| StoreError::Migration {
            to: index as u32 + 1,
            message: e.to_string(),
        })?;
    }
    tx.pragma_update(None, "user_version", i64::from(supported))?;
    let pending_after = outbox_rows(&tx)?;
    if pending_after < pending_before {
        return Err(StoreError::Migration {
            to: supported,
            message: format!(
                "would drop pending outbox rows ({pending_before} before, {pending_after} after); rolled back"
            ),
        });
    }
    tx.commit()?;
    Ok(())
}

/// Version 9: chat groups (`docs/delivery.md#group-sends`) — the groups this device is in, what
/// the relay confirmed of each one's registration, and each group message's tracker with its
/// members' states (kept after it is done, for status, until pruned).
fn v9_groups(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE chat_groups (
             group_id     TEXT    PRIMARY KEY NOT NULL,
             name         TEXT    NOT NULL,
             admin        TEXT    NOT NULL,
             members_json TEXT    NOT NULL,
             created_at   INTEGER NOT NULL
         ) WITHOUT ROWID;

         CREATE TABLE group_registration (
             group_id TEXT NOT NULL,
             member   TEXT NOT NULL,
             PRIMARY KEY (group_id, member)
         ) WITHOUT ROWID;

         CREATE TABLE group_sends (
             id           TEXT    PRIMARY KEY NOT NULL,
             group_id     TEXT    NOT NULL,
             created_at   INTEGER NOT NULL,
             path_json    TEXT    NOT NULL,
             message_json TEXT    NOT NULL,
             done         INTEGER NOT NULL CHECK (done IN (0, 1))
         ) WITHOUT ROWID;
         CREATE INDEX group_sends_by_done ON group_sends (done, created_at);

         CREATE TABLE group_send_members (
             id     TEXT NOT NULL,
             member TEXT NOT NULL,
             state  TEXT NOT NULL CHECK (state IN ('pending', 'stored', 'delivered', 'failed')),
             PRIMARY KEY (id, member)
         ) WITHOUT ROWID;",
    )
}

/// Version 10: received messages, kept for `forwardMessage` (`docs/delivery.md#received-messages`).
/// A rowid table: rows hold whole messages, up to the content cap. Found by the message id the
/// application saw; pruned oldest first, by count and by `bytes` (the JSON's length).
fn v10_received(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE received_messages (
             chat         TEXT    NOT NULL,
             sender       TEXT    NOT NULL,
             message_id   TEXT    NOT NULL,
             received_at  INTEGER NOT NULL,
             bytes        INTEGER NOT NULL CHECK (bytes >= 0),
             message_json TEXT    NOT NULL,
             UNIQUE (chat, sender, message_id)
         );
         CREATE INDEX received_messages_by_id ON received_messages (message_id, received_at);
         CREATE INDEX received_messages_by_received_at ON received_messages (received_at);",
    )
}

/// Version 11: file transfer manifests, outgoing and incoming.
fn v11_media(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE media_out (
             file_id    TEXT    PRIMARY KEY NOT NULL,
             state      TEXT    NOT NULL CHECK (state IN ('active', 'done', 'failed')),
             row_json   TEXT    NOT NULL,
             updated_at INTEGER NOT NULL
         ) WITHOUT ROWID;

         CREATE TABLE media_in (
             sender     TEXT    NOT NULL,
             file_id    TEXT    NOT NULL,
             state      TEXT    NOT NULL CHECK (state IN ('active', 'done', 'failed')),
             row_json   TEXT    NOT NULL,
             updated_at INTEGER NOT NULL,
             PRIMARY KEY (sender, file_id)
         ) WITHOUT ROWID;",
    )
}

/// Version 12: the dedup keys of verified control frames, apart from `processed` so its count
/// bound cannot evict them; pruned only by age, after the control replay window
/// (`docs/delivery.md#control-frames`).
fn v12_processed_controls(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE processed_controls (
             chat       TEXT    NOT NULL,
             sender     TEXT    NOT NULL,
             message_id TEXT    NOT NULL,
             at         INTEGER NOT NULL,
             PRIMARY KEY (chat, sender, message_id)
         ) WITHOUT ROWID;
         CREATE INDEX processed_controls_by_at ON processed_controls (at);",
    )
}

/// Version 13: the message ledger (`docs/delivery.md#a-messages-life`): entries numbered by
/// `ledger_seq` and clustered under their message's anchor (version 14 keys them by `seq`
/// alone), bounded per message by `ledger::PER_MESSAGE` and pruned with the settled outcomes.
fn v13_ledger(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE ledger (
             anchor     INTEGER NOT NULL,
             seq        INTEGER NOT NULL,
             at         INTEGER NOT NULL,
             direction  TEXT    NOT NULL,
             message_id TEXT    NOT NULL,
             peer       TEXT    NOT NULL,
             detail     TEXT    NOT NULL,
             PRIMARY KEY (anchor, seq)
         ) WITHOUT ROWID;
         CREATE TABLE ledger_seq (next INTEGER NOT NULL);
         INSERT INTO ledger_seq (next) VALUES (0);",
    )
}

/// Version 14: the ledger keyed by `seq` alone, which SQLite assigns past the highest, so every
/// row is appended at the end of the table (no counter of its own to write each step); version 13
/// clustered a message's rows under an anchor, and an entry for an old message split a page in
/// the middle of the table.
fn v14_ledger_log(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE ledger_v14 (
             seq        INTEGER PRIMARY KEY,
             at         INTEGER NOT NULL,
             direction  TEXT    NOT NULL,
             message_id TEXT    NOT NULL,
             peer       TEXT    NOT NULL,
             detail     TEXT    NOT NULL
         );
         INSERT INTO ledger_v14 (seq, at, direction, message_id, peer, detail)
             SELECT seq, at, direction, message_id, peer, detail FROM ledger;
         DROP TABLE ledger;
         DROP TABLE ledger_seq;
         ALTER TABLE ledger_v14 RENAME TO ledger;",
    )
}

fn outbox_rows(conn: &Connection) -> rusqlite::Result<u64> {
    let n: i64 = conn.query_row("SELECT COUNT(*) FROM outbox", [], |row| row.get(0))?;
    Ok(n as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2_add_column(tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch("ALTER TABLE outbox ADD COLUMN note TEXT NULL")
    }

    fn v2_drops_rows(tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch("DELETE FROM outbox")
    }

    fn v2_broken(tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch("ALTER TABLE outbox ADD COLUMN note TEXT NULL; SELECT * FROM nope")
    }

    fn insert_row(conn: &Connection) {
        conn.execute(
            "INSERT INTO outbox (id, recipient, state, created_at, window_start, ack_attempts,
                                 transport_retries, is_media, message_json)
             VALUES ('m1', 'bob', 'queued', 1, 1, 0, 0, 0, '{}')",
            [],
        )
        .unwrap();
    }

    #[test]
    fn fresh_database_reaches_the_supported_version() {
        let mut conn = Connection::open_in_memory().unwrap();
        assert_eq!(read_version(&conn).unwrap(), 0);
        migrate(&mut conn).unwrap();
        assert_eq!(read_version(&conn).unwrap(), SCHEMA_VERSION);
        // Idempotent.
        migrate(&mut conn).unwrap();
        assert_eq!(read_version(&conn).unwrap(), SCHEMA_VERSION);
    }

    #[test]
    fn a_second_version_is_one_function_and_keeps_rows() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate_with(&mut conn, &[v1_initial]).unwrap();
        insert_row(&conn);
        migrate_with(&mut conn, &[v1_initial, v2_add_column]).unwrap();
        assert_eq!(read_version(&conn).unwrap(), 2);
        assert_eq!(outbox_rows(&conn).unwrap(), 1);
        let note: Option<String> = conn
            .query_row("SELECT note FROM outbox WHERE id = 'm1'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(note, None);
    }

    #[test]
    fn version_14_keys_the_ledger_by_its_counter_and_keeps_every_row() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate_with(&mut conn, &MIGRATIONS[..13]).unwrap();
        // Version 13 clustered rows under their message's anchor: out of seq order on disk.
        conn.execute_batch(
            "INSERT INTO ledger VALUES (0, 0, 10, 'outbound', 'm1', 'bob', '{\"kind\":\"accepted\"}');
             INSERT INTO ledger VALUES (0, 2, 12, 'outbound', 'm1', 'bob', '{\"kind\":\"expired\"}');
             INSERT INTO ledger VALUES (1, 1, 11, 'inbound', 'm2', 'carol', '{\"kind\":\"expired\"}');",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let rows: Vec<(i64, i64, String)> = conn
            .prepare("SELECT seq, at, message_id FROM ledger ORDER BY rowid")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            rows,
            [
                (0, 10, "m1".into()),
                (1, 11, "m2".into()),
                (2, 12, "m1".into())
            ]
        );
    }

    #[test]
    fn a_migration_that_drops_pending_rows_is_rolled_back() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate_with(&mut conn, &[v1_initial]).unwrap();
        insert_row(&conn);
        let err = migrate_with(&mut conn, &[v1_initial, v2_drops_rows]).unwrap_err();
        assert!(matches!(err, StoreError::Migration { to: 2, .. }), "{err}");
        assert_eq!(read_version(&conn).unwrap(), 1);
        assert_eq!(outbox_rows(&conn).unwrap(), 1);
    }

    #[test]
    fn a_failing_migration_leaves_the_old_version() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate_with(&mut conn, &[v1_initial]).unwrap();
        insert_row(&conn);
        let err = migrate_with(&mut conn, &[v1_initial, v2_broken]).unwrap_err();
        assert!(err.to_string().contains("no such table"), "{err}");
        assert_eq!(read_version(&conn).unwrap(), 1);
        // The column added before the failure was rolled back with it.
        assert!(conn.prepare("SELECT note FROM outbox").is_err());
    }

    #[test]
    fn newer_versions_are_refused() {
        let newer = SCHEMA_VERSION + 1;
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "user_version", newer).unwrap();
        let err = migrate(&mut conn).unwrap_err();
        assert!(matches!(
            err,
            StoreError::NewerSchema {
                found,
                supported: SCHEMA_VERSION
            } if found == newer
        ));
        assert_eq!(read_version(&conn).unwrap(), newer);
    }
}
