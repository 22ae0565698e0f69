//! Each account's mailbox counters — `last_seq`, `msg_count`, `byte_count`, columns of its
//! `accounts` row — as the store thread keeps them: read once, changed in memory by every append
//! and release, and written back once per account just before the transaction commits. A
//! delivered message costs two appends and two releases; each used to read and rewrite the
//! account's row, now a group commit rewrites it once. A request that fails is undone here as the
//! database undoes it (its savepoint, or its one failing statement); a transaction that fails forgets everything cached.
//!
//! Beside them, for the mailbox limits of `docs/protocol.md#mailbox-limits`: each sender's share
//! of a mailbox (frames and bytes one sending account holds in it), read from the journal once
//! and then kept like the counters but never written (the journal is their truth), and the bytes
//! of the whole journal, the sum of every account's `byte_count`.

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

/// What one sending account holds in one mailbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Share {
    pub msg_count: i64,
    pub byte_count: i64,
}

/// (recipient account, sending account).
type ShareKey = (String, String);

/// What a change replaced, for [`Mailboxes::undo`].
enum Replaced {
    /// The account, its previous counters (if cached) and whether they were dirty already.
    Counters(String, Option<Counters>, bool),
    Share(ShareKey, Option<Share>),
    JournalBytes(Option<i64>),
}

#[derive(Default)]
pub(super) struct Mailboxes {
    known: HashMap<String, Counters>,
    /// Changed in this transaction: written back before it commits.
    dirty: HashSet<String>,
    shares: HashMap<ShareKey, Share>,
    /// Bytes of the whole journal; `None` until read.
    journal_bytes: Option<i64>,
    /// What the running request replaced, oldest first.
    undo: Vec<Replaced>,
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

    /// Replaces the counters of an account [`Mailboxes::get`] found; the journal's bytes
    /// follow.
    pub fn set(
        &mut self,
        conn: &Connection,
        account: &str,
        counters: Counters,
    ) -> rusqlite::Result<()> {
        let total = self.journal_bytes(conn)?;
        let previous = self.known.insert(account.to_owned(), counters);
        let was_dirty = !self.dirty.insert(account.to_owned());
        self.undo
            .push(Replaced::Counters(account.to_owned(), previous, was_dirty));
        let before = previous.map_or(0, |c| c.byte_count);
        self.undo.push(Replaced::JournalBytes(self.journal_bytes));
        self.journal_bytes = Some(total - before + counters.byte_count);
        Ok(())
    }

    /// What `sender` holds in `account`'s mailbox.
    pub fn share(
        &mut self,
        conn: &Connection,
        account: &str,
        sender: &str,
    ) -> rusqlite::Result<Share> {
        let key = (account.to_owned(), sender.to_owned());
        if let Some(share) = self.shares.get(&key) {
            return Ok(*share);
        }
        // The journal as this transaction sees it: every change to it so far is in it.
        let share = conn
            .prepare_cached(
                "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM journal
                 WHERE account = ?1 AND sender_account = ?2",
            )?
            .query_row([account, sender], |r| {
                Ok(Share {
                    msg_count: r.get(0)?,
                    byte_count: r.get(1)?,
                })
            })?;
        // Read inside the running request: undone with it.
        self.undo.push(Replaced::Share(key.clone(), None));
        self.shares.insert(key, share);
        Ok(share)
    }

    /// Adds `msg_count` frames of `byte_count` bytes (negative: removes them) to what `sender`
    /// holds in `account`'s mailbox, if that is cached; otherwise the journal tells when asked.
    pub fn add_to_share(&mut self, account: &str, sender: &str, msg_count: i64, byte_count: i64) {
        let key = (account.to_owned(), sender.to_owned());
        let Some(share) = self.shares.get_mut(&key) else {
            return;
        };
        let previous = *share;
        share.msg_count = (share.msg_count + msg_count).max(0);
        share.byte_count = (share.byte_count + byte_count).max(0);
        self.undo.push(Replaced::Share(key, Some(previous)));
    }

    /// Bytes of the whole journal.
    pub fn journal_bytes(&mut self, conn: &Connection) -> rusqlite::Result<i64> {
        if let Some(total) = self.journal_bytes {
            return Ok(total);
        }
        let stored: i64 = conn
            .prepare_cached("SELECT COALESCE(SUM(byte_count), 0) FROM accounts")?
            .query_row([], |r| r.get(0))?;
        // The rows hold what was committed; this transaction's changes are in memory.
        let pending: i64 = self
            .dirty
            .iter()
            .map(|account| self.known[account].byte_count)
            .sum::<i64>()
            - self.committed_bytes_of_dirty(conn)?;
        let total = stored + pending;
        self.undo.push(Replaced::JournalBytes(None));
        self.journal_bytes = Some(total);
        Ok(total)
    }

    fn committed_bytes_of_dirty(&self, conn: &Connection) -> rusqlite::Result<i64> {
        let mut read = conn.prepare_cached("SELECT byte_count FROM accounts WHERE name = ?1")?;
        let mut sum = 0;
        for account in &self.dirty {
            sum += read
                .query_row([account], |r| r.get::<_, i64>(0))
                .optional()?
                .unwrap_or(0);
        }
        Ok(sum)
    }

    /// The running request succeeded: its changes stay.
    pub fn keep(&mut self) {
        self.undo.clear();
    }

    /// The running request failed and the database undid it: so are its changes here.
    pub fn undo(&mut self) {
        while let Some(replaced) = self.undo.pop() {
            match replaced {
                Replaced::Counters(account, previous, was_dirty) => {
                    if !was_dirty {
                        self.dirty.remove(&account);
                    }
                    match previous {
                        Some(counters) => self.known.insert(account, counters),
                        None => self.known.remove(&account),
                    };
                }
                Replaced::Share(key, previous) => {
                    match previous {
                        Some(share) => self.shares.insert(key, share),
                        None => self.shares.remove(&key),
                    };
                }
                Replaced::JournalBytes(previous) => self.journal_bytes = previous,
            }
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
        if self.shares.len() > KEEP_CACHED {
            self.shares.clear();
        }
    }

    /// The transaction did not commit: nothing cached can be trusted.
    pub fn forget(&mut self) {
        self.known.clear();
        self.dirty.clear();
        self.shares.clear();
        self.journal_bytes = None;
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
        m.set(&conn, "bob", BUMPED).unwrap();
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
        m.set(&conn, "bob", BUMPED).unwrap();
        m.set(
            &conn,
            "bob",
            Counters {
                last_seq: 9,
                ..BUMPED
            },
        )
        .unwrap();
        m.undo();
        assert_eq!(m.get(&conn, "bob").unwrap(), Some(before));
        assert!(m.dirty.is_empty(), "an undone change is not written back");

        m.set(&conn, "bob", BUMPED).unwrap();
        m.keep();
        m.forget();
        assert_eq!(
            m.get(&conn, "bob").unwrap(),
            Some(before),
            "read again from the database"
        );
    }

    #[test]
    fn shares_and_the_journal_total_follow_changes_and_are_undone_with_their_request() {
        let conn = db();
        conn.execute_batch(
            "CREATE TABLE journal (account TEXT, sender_account TEXT, bytes INTEGER);
             INSERT INTO journal VALUES ('bob', 'alice', 12), ('bob', 'carol', 8);",
        )
        .unwrap();
        let mut m = Mailboxes::default();
        let alice = Share {
            msg_count: 1,
            byte_count: 12,
        };
        assert_eq!(m.share(&conn, "bob", "alice").unwrap(), alice);
        assert_eq!(m.journal_bytes(&conn).unwrap(), 20);
        m.keep();

        // A request adds a frame of alice's, then fails: as if it never ran.
        m.get(&conn, "bob").unwrap();
        m.add_to_share("bob", "alice", 1, 30);
        m.set(
            &conn,
            "bob",
            Counters {
                last_seq: 8,
                msg_count: 3,
                byte_count: 50,
            },
        )
        .unwrap();
        assert_eq!(m.journal_bytes(&conn).unwrap(), 50);
        m.undo();
        assert_eq!(m.share(&conn, "bob", "alice").unwrap(), alice);
        assert_eq!(m.journal_bytes(&conn).unwrap(), 20);

        // A share first read by a failing request is read again afterwards.
        m.share(&conn, "bob", "carol").unwrap();
        m.undo();
        assert!(!m
            .shares
            .contains_key(&("bob".to_owned(), "carol".to_owned())));
    }
}
