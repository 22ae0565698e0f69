//! Each account's mailbox counters — `last_seq`, `msg_count`, `byte_count`, columns of its
//! `accounts` row — as the store thread keeps them: read once, changed in memory by every append
//! and release, and written back once per account just before the transaction commits. A
//! delivered message costs two appends and two releases; each used to read and rewrite the
//! account's row, now a group commit rewrites it once. A request that fails is undone here as its
//! savepoint undoes it in the database; a transaction that fails forgets everything cached.

use std::collections::{HashMap, HashSet};

use rusqlite::{params, Connection, OptionalExtension};

/// Cached accounts kept across commits; past this the clean ones are dropped.
const KEEP_CACHED: usize = 65_536;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Counters {
    pub last_seq: i64,
    pub msg_count: i64,
    pub byte_count: i64,
}

#[derive(Default)]
pub(super) struct Mailboxes {
    known: HashMap<String, Counters>,
    /// Changed in this transaction: written back before it commits.
    dirty: HashSet<String>,
    /// What the running request replaced, oldest first: the account, its previous counters (if
    /// cached) and whether they were dirty already.
    undo: Vec<(String, Option<Counters>, bool)>,
}

impl Mailboxes {
    /// The account's counters, or `None` when it has no row.
    pub fn get(&mut self, conn: &Connection, account: &str) -> rusqlite::Result<Option<Counters>> {
        if let Some(counters) = self.known.get(account) {
            return Ok(Some(*counters));
        }
        let read = conn
            .prepare_cached("SELECT last_seq, msg_count, byte_count FROM accounts WHERE name = ?1")?
            .query_row([account], |r| {
                Ok(Counters {
                    last_seq: r.get(0)?,
                    msg_count: r.get(1)?,
                    byte_count: r.get(2)?,
                })
            })
            .optional()?;
        if let Some(counters) = read {
            // As committed (requests never write counters themselves): nothing to undo.
            self.known.insert(account.to_owned(), counters);
        }
        Ok(read)
    }

    /// Replaces the counters of an account [`Mailboxes::get`] found.
    pub fn set(&mut self, account: &str, counters: Counters) {
        let previous = self.known.insert(account.to_owned(), counters);
        let was_dirty = !self.dirty.insert(account.to_owned());
        self.undo.push((account.to_owned(), previous, was_dirty));
    }

    /// The running request succeeded: its changes stay.
    pub fn keep(&mut self) {
        self.undo.clear();
    }

    /// The running request failed and its savepoint was rolled back: so are its changes here.
    pub fn undo(&mut self) {
        while let Some((account, previous, was_dirty)) = self.undo.pop() {
            if !was_dirty {
                self.dirty.remove(&account);
            }
            match previous {
                Some(counters) => self.known.insert(account, counters),
                None => self.known.remove(&account),
            };
        }
    }

    /// Writes every changed account's counters, inside the transaction about to commit.
    pub fn write_back(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        let mut update = conn.prepare_cached(
            "UPDATE accounts SET last_seq = ?2, msg_count = ?3, byte_count = ?4 WHERE name = ?1",
        )?;
        for account in &self.dirty {
            let c = self.known[account];
            update.execute(params![account, c.last_seq, c.msg_count, c.byte_count])?;
        }
        Ok(())
    }

    /// The transaction committed: what was written back is what the database holds.
    pub fn committed(&mut self) {
        self.dirty.clear();
        if self.known.len() > KEEP_CACHED {
            self.known.clear();
        }
    }

    /// The transaction did not commit: nothing cached can be trusted.
    pub fn forget(&mut self) {
        self.known.clear();
        self.dirty.clear();
        self.undo.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE accounts (name TEXT PRIMARY KEY, last_seq INTEGER NOT NULL,
                                    msg_count INTEGER NOT NULL, byte_count INTEGER NOT NULL);
             INSERT INTO accounts VALUES ('bob', 7, 2, 20);",
        )
        .unwrap();
        conn
    }

    fn stored(conn: &Connection) -> Counters {
        conn.query_row(
            "SELECT last_seq, msg_count, byte_count FROM accounts WHERE name = 'bob'",
            [],
            |r| {
                Ok(Counters {
                    last_seq: r.get(0)?,
                    msg_count: r.get(1)?,
                    byte_count: r.get(2)?,
                })
            },
        )
        .unwrap()
    }

    const BUMPED: Counters = Counters {
        last_seq: 8,
        msg_count: 3,
        byte_count: 30,
    };

    #[test]
    fn changes_are_written_once_before_the_commit_and_unknown_accounts_stay_unknown() {
        let conn = db();
        let mut m = Mailboxes::default();
        assert_eq!(m.get(&conn, "nobody").unwrap(), None);
        let before = m.get(&conn, "bob").unwrap().unwrap();
        m.set("bob", BUMPED);
        m.keep();
        assert_eq!(
            stored(&conn),
            before,
            "nothing written before the write-back"
        );
        assert_eq!(m.get(&conn, "bob").unwrap(), Some(BUMPED));
        m.write_back(&conn).unwrap();
        m.committed();
        assert_eq!(stored(&conn), BUMPED);
    }

    #[test]
    fn a_failed_request_is_undone_and_a_failed_commit_forgets_the_cache() {
        let conn = db();
        let mut m = Mailboxes::default();
        let before = m.get(&conn, "bob").unwrap().unwrap();
        m.set("bob", BUMPED);
        m.set(
            "bob",
            Counters {
                last_seq: 9,
                ..BUMPED
            },
        );
        m.undo();
        assert_eq!(m.get(&conn, "bob").unwrap(), Some(before));
        assert!(m.dirty.is_empty(), "an undone change is not written back");

        m.set("bob", BUMPED);
        m.keep();
        m.forget();
        assert_eq!(
            m.get(&conn, "bob").unwrap(),
            Some(before),
            "read again from the database"
        );
    }
}
