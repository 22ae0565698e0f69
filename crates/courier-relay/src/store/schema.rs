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
const MIGRATIONS: &[Migration] = &[v1_journal, v2_last_seen, v3_addresses, v4_key_packages];

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
                "journal",
                "key_packages",
                "last_resort_key_packages"
            ]
        );
        migrate(&mut conn).unwrap();
        assert_eq!(read_version(&conn).unwrap(), SCHEMA_VERSION);
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
