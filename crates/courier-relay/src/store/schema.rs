//! Schema versions and migrations, tracked in `PRAGMA user_version`.
//!
//! `MIGRATIONS[i]` takes a database from version `i` to `i + 1`; version 0 is an empty file.
//! A new version is one function appended to the list, never an edit of an earlier one: every
//! database, whatever version it was left at, takes the same steps. Each step runs in its own
//! transaction together with the `user_version` it reaches, so a crash mid-upgrade leaves the
//! database at the last version it completed. A database newer than this build is refused and
//! never written to: an older relay cannot know what a newer schema means.

use rusqlite::{Connection, Transaction, TransactionBehavior};

use crate::RelayError;

/// One migration step: from version `i` to `i + 1` (its index in `MIGRATIONS`).
type Migration = fn(&Transaction<'_>) -> rusqlite::Result<()>;

/// The schema version this build writes and understands is `MIGRATIONS.len()`.
const MIGRATIONS: &[Migration] = &[
    v1_journal,
    v2_last_seen,
    v3_addresses,
    v4_key_packages,
    v5_groups,
    v6_limits,
    v7_contacts,
];

/// Version 1: accounts with their journal counters, and the journal.
fn v1_journal(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE accounts (
             name TEXT PRIMARY KEY NOT NULL,
             created_ms INTEGER NOT NULL,
             last_seq INTEGER NOT NULL DEFAULT 0,
             msg_count INTEGER NOT NULL DEFAULT 0,
             byte_count INTEGER NOT NULL DEFAULT 0
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
         CREATE INDEX journal_accepted ON journal (accepted_ms);",
    )
}

/// Version 2: when each account's last connection ended, so presence survives a restart.
fn v2_last_seen(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch("ALTER TABLE accounts ADD COLUMN last_seen_ms INTEGER;")
}

/// Version 3: address bindings. An address is keyed by its canonical string, which names
/// exactly one address (`docs/glossary.md#address`).
fn v3_addresses(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE addresses (
             address TEXT PRIMARY KEY NOT NULL,
             account TEXT NOT NULL,
             bound_ms INTEGER NOT NULL
         );",
    )
}

/// Version 4: the key-package directory (`docs/protocol.md#key-package-directory`), keyed by
/// canonical address like the bindings. One-time packages are taken in `id` order, which is
/// publish order: without AUTOINCREMENT a new row's id is one past the largest in the table.
/// An address holds at most one last-resort package, hence its own table keyed by address.
fn v4_key_packages(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE key_packages (
             id INTEGER PRIMARY KEY,
             address TEXT NOT NULL,
             package BLOB NOT NULL,
             published_ms INTEGER NOT NULL
         );
         CREATE INDEX key_packages_address ON key_packages (address, id);
         CREATE TABLE last_resort_key_packages (
             address TEXT PRIMARY KEY NOT NULL,
             package BLOB NOT NULL,
             published_ms INTEGER NOT NULL
         );",
    )
}

/// Version 5: groups (`docs/protocol.md#group-frames`).
///
/// The journal is rebuilt to hold group copies (`group_id`, `forward_info`): a sender's group
/// message and its direct message may share a `message_id`, so the duplicate rule of
/// `docs/protocol.md#relay-side-dedup` becomes a partial index over direct frames only. Group
/// copies are deduplicated by `group_copies` instead, which outlives their release (a repeat
/// within 24 h journals no second copy even for a member that released the first), and names
/// the journal row each member's copy is.
///
/// `held_reports` keeps the encoded GroupMessageSent of a sender whose connection ended before
/// its report settled.
fn v5_groups(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE journal_v5 (
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
             group_id TEXT,
             forward_info TEXT,
             UNIQUE (account, seq)
         );
         INSERT INTO journal_v5 (id, account, seq, sender, sender_account, message_id, content,
                                 bytes, reply_to_msg, accepted_ms)
             SELECT id, account, seq, sender, sender_account, message_id, content, bytes,
                    reply_to_msg, accepted_ms
             FROM journal;
         DROP TABLE journal;
         ALTER TABLE journal_v5 RENAME TO journal;
         CREATE INDEX journal_accepted ON journal (accepted_ms);
         CREATE UNIQUE INDEX journal_direct ON journal (account, sender, message_id)
             WHERE group_id IS NULL;
         CREATE TABLE groups (
             group_id TEXT PRIMARY KEY NOT NULL,
             name TEXT NOT NULL,
             admin TEXT NOT NULL,
             created_ms INTEGER NOT NULL
         );
         CREATE TABLE group_members (
             group_id TEXT NOT NULL,
             member TEXT NOT NULL,
             added_ms INTEGER NOT NULL,
             PRIMARY KEY (group_id, member)
         ) WITHOUT ROWID;
         CREATE TABLE group_copies (
             sender TEXT NOT NULL,
             group_id TEXT NOT NULL,
             message_id TEXT NOT NULL,
             member TEXT NOT NULL,
             account TEXT NOT NULL,
             seq INTEGER NOT NULL,
             accepted_ms INTEGER NOT NULL,
             PRIMARY KEY (sender, group_id, message_id, member)
         ) WITHOUT ROWID;
         CREATE INDEX group_copies_accepted ON group_copies (accepted_ms);
         CREATE TABLE held_reports (
             id INTEGER PRIMARY KEY,
             account TEXT NOT NULL,
             report TEXT NOT NULL,
             held_ms INTEGER NOT NULL
         );
         CREATE INDEX held_reports_account ON held_reports (account, id);
         CREATE INDEX held_reports_held ON held_reports (held_ms);",
    )
}

/// Version 6: the limits of `docs/protocol.md#mailbox-limits` and of address bindings.
///
/// A frame's `bytes` becomes the size of its whole row, as `mailbox::row_bytes` computes it
/// (every text field plus 64 bytes), and each account's `byte_count` their sum. Each sender's
/// share of a mailbox is read by (account, sender_account), and an account's bindings by account,
/// oldest first.
fn v6_limits(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "UPDATE journal SET bytes =
             length(CAST(content AS BLOB)) + length(CAST(sender AS BLOB))
             + length(CAST(sender_account AS BLOB)) + length(CAST(message_id AS BLOB))
             + COALESCE(length(CAST(reply_to_msg AS BLOB)), 0)
             + COALESCE(length(CAST(group_id AS BLOB)), 0)
             + COALESCE(length(CAST(forward_info AS BLOB)), 0)
             + 64;
         UPDATE accounts SET byte_count =
             COALESCE((SELECT SUM(bytes) FROM journal WHERE journal.account = accounts.name), 0);
         CREATE INDEX journal_sender ON journal (account, sender_account);
         CREATE INDEX addresses_account ON addresses (account, bound_ms);
         CREATE INDEX addresses_bound ON addresses (bound_ms);",
    )
}

/// Version 7: pairs of accounts that exchanged a message, for `--presence-visibility contacts`
/// (`docs/protocol.md#presence-visibility`); each pair once, its smaller name first.
fn v7_contacts(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE contacts (
             a TEXT NOT NULL,
             b TEXT NOT NULL,
             PRIMARY KEY (a, b)
         ) WITHOUT ROWID;
         CREATE INDEX group_members_member ON group_members (member);",
    )
}

/// `PRAGMA user_version`. The first read of a file, so a non-database fails here.
fn read_version(conn: &Connection) -> rusqlite::Result<u32> {
    let v: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
    // user_version is a signed 32-bit header field; a negative one was not written by us and
    // is certainly not a version we support.
    Ok(u32::try_from(v).unwrap_or(u32::MAX))
}

/// Brings the database to the version this build writes.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), RelayError> {
    migrate_with(conn, MIGRATIONS)
}

/// Brings the database to `migrations.len()`, one transaction per step.
fn migrate_with(conn: &mut Connection, migrations: &[Migration]) -> Result<(), RelayError> {
    let supported = migrations.len() as u32;
    loop {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Read under the write lock: the version cannot change between here and the commit.
        let found = read_version(&tx)?;
        if found > supported {
            return Err(RelayError::NewerSchema { found, supported });
        }
        let Some(step) = migrations.get(found as usize) else {
            return Ok(()); // up to date; dropping `tx` rolls back an empty transaction
        };
        step(&tx)?;
        tx.pragma_update(None, "user_version", i64::from(found + 1))?;
        tx.commit()?;
        tracing::info!(version = found + 1, "database schema migrated");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

    fn tables(conn: &Connection) -> Vec<String> {
        let mut stmt = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .unwrap();
        let names = stmt.query_map([], |r| r.get(0)).unwrap();
        names.collect::<Result<_, _>>().unwrap()
    }

    fn columns(conn: &Connection, table: &str) -> Vec<String> {
        let mut stmt = conn
            .prepare(&format!("PRAGMA table_info({table})"))
            .unwrap();
        let names = stmt.query_map([], |r| r.get(1)).unwrap();
        names.collect::<Result<_, _>>().unwrap()
    }

    #[test]
    fn a_fresh_database_reaches_the_supported_version_and_stays_there() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        assert_eq!(read_version(&conn).unwrap(), SCHEMA_VERSION);
        assert_eq!(
            tables(&conn),
            [
                "accounts",
                "addresses",
                "contacts",
                "group_copies",
                "group_members",
                "groups",
                "held_reports",
                "journal",
                "key_packages",
                "last_resort_key_packages"
            ]
        );
        migrate(&mut conn).unwrap();
        assert_eq!(read_version(&conn).unwrap(), SCHEMA_VERSION);
    }

    /// Version 5 keeps the journal's rows, and its duplicate rule now covers direct frames
    /// only: a group copy may share a direct frame's (account, sender, message_id).
    #[test]
    fn version_5_keeps_the_journal_and_narrows_its_duplicate_rule() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate_with(&mut conn, &MIGRATIONS[..4]).unwrap();
        conn.execute_batch(
            "INSERT INTO journal (account, seq, sender, sender_account, message_id, content,
                                  bytes, accepted_ms)
                 VALUES ('bob', 1, 'alice', 'alice', 'm1', 'hi', 2, 5);",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let kept: (i64, String, Option<String>) = conn
            .query_row(
                "SELECT seq, content, group_id FROM journal WHERE message_id = 'm1'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!(kept, (1, "hi".to_owned(), None));
        let insert = |seq: i64, group: Option<&str>| {
            conn.execute(
                "INSERT INTO journal (account, seq, sender, sender_account, message_id, content,
                                      bytes, accepted_ms, group_id)
                     VALUES ('bob', ?1, 'alice', 'alice', 'm1', 'hi', 2, 5, ?2)",
                rusqlite::params![seq, group],
            )
        };
        insert(2, Some("g")).expect("a group copy beside the direct frame");
        insert(3, None).expect_err("a second direct frame is a duplicate");
    }

    /// Version 6 counts the rows written before it as a new frame is counted: whole rows.
    #[test]
    fn version_6_counts_earlier_frames_as_whole_rows() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate_with(&mut conn, &MIGRATIONS[..5]).unwrap();
        conn.execute_batch(
            "INSERT INTO accounts (name, created_ms, last_seq, msg_count, byte_count)
                 VALUES ('bob', 1, 1, 1, 2);
             INSERT INTO journal (account, seq, sender, sender_account, message_id, content,
                                  bytes, reply_to_msg, accepted_ms, group_id, forward_info)
                 VALUES ('bob', 1, 'alice', 'alice', 'm1', 'hé', 3, 'm0', 5, 'g', '{}');",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let envelope = crate::mailbox::Envelope {
            seq: None,
            sender: "alice".into(),
            sender_account: "alice".into(),
            message_id: "m1".into(),
            content: "hé".to_owned().into(),
            reply_to_msg: Some("m0".into()),
            accepted_ms: 5,
            group: Some(crate::mailbox::GroupTag {
                group_id: "g".into(),
                forward_info: None,
            }),
        };
        let expected = crate::mailbox::row_bytes(&envelope, Some("{}")) as i64;
        let (bytes, byte_count): (i64, i64) = conn
            .query_row(
                "SELECT bytes, byte_count FROM journal, accounts WHERE name = account",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((bytes, byte_count), (expected, expected));
    }

    /// Each step is its own transaction: a version reached is kept even if a later step fails,
    /// and the failing step leaves nothing behind.
    #[test]
    fn a_failing_step_leaves_the_last_version_reached() {
        fn broken(tx: &Transaction<'_>) -> rusqlite::Result<()> {
            tx.execute_batch("ALTER TABLE accounts ADD COLUMN note TEXT; SELECT * FROM nope")
        }
        let mut conn = Connection::open_in_memory().unwrap();
        let steps: &[Migration] = &[v1_journal, v2_last_seen, broken];
        let err = migrate_with(&mut conn, steps).unwrap_err();
        assert!(err.to_string().contains("no such table"), "{err}");
        assert_eq!(read_version(&conn).unwrap(), 2);
        assert!(!columns(&conn, "accounts").contains(&"note".to_owned()));
    }

    #[test]
    fn a_newer_database_is_refused_untouched() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        let err = migrate(&mut conn).unwrap_err();
        assert!(
            matches!(err, RelayError::NewerSchema { found, supported: SCHEMA_VERSION } if found == SCHEMA_VERSION + 1),
            "{err}"
        );
        assert_eq!(read_version(&conn).unwrap(), SCHEMA_VERSION + 1);
        assert!(tables(&conn).is_empty());
    }
}
