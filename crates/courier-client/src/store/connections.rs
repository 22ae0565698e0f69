//! Contacts and connection requests (`docs/delivery.md#connection-requests`): the peers this
//! device talks with, and the requests waiting for an answer — its own and others'. Both change
//! in the step that sent or received the frame that changed them, and commit with it.

use courier_engine::io::Millis;
use rusqlite::{params, Connection};

use super::{from_db_u64, to_db, StoreError};

/// A connection request waiting for an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRequest {
    pub id: String,
    pub peer: String,
    /// Sent to this device (else sent by it).
    pub incoming: bool,
    pub note: Option<String>,
    /// The requester's key package, from which accepting starts the session.
    pub key_package: Option<Vec<u8>>,
    pub at: Millis,
}

/// A change to commit with a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionChange {
    Contact {
        peer: String,
        at: Millis,
    },
    Pending(PendingRequest),
    /// The request was answered, withdrawn or settled: it waits no more.
    Closed {
        id: String,
    },
}

pub(crate) fn apply(conn: &Connection, changes: &[ConnectionChange]) -> Result<(), StoreError> {
    for change in changes {
        match change {
            ConnectionChange::Contact { peer, at } => {
                conn.prepare_cached(
                    "INSERT INTO contacts (peer, since) VALUES (?1, ?2)
                     ON CONFLICT (peer) DO NOTHING",
                )?
                .execute(params![peer, to_db(*at)])?;
            }
            ConnectionChange::Pending(r) => {
                conn.prepare_cached(
                    "INSERT INTO connection_requests (id, peer, incoming, note, key_package, at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT (id) DO NOTHING",
                )?
                .execute(params![
                    r.id,
                    r.peer,
                    r.incoming,
                    r.note,
                    r.key_package,
                    to_db(r.at)
                ])?;
            }
            ConnectionChange::Closed { id } => {
                conn.prepare_cached("DELETE FROM connection_requests WHERE id = ?1")?
                    .execute([id])?;
            }
        }
    }
    Ok(())
}

pub(crate) fn load_contacts(conn: &Connection) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn.prepare_cached("SELECT peer FROM contacts ORDER BY peer")?;
    let rows = stmt.query_map([], |row| row.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Every request waiting for an answer, oldest first.
pub(crate) fn load_pending(conn: &Connection) -> Result<Vec<PendingRequest>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, peer, incoming, note, key_package, at FROM connection_requests
         ORDER BY at, id",
    )?;
    let rows = stmt.query_and_then([], |row| {
        let at: i64 = row.get(5)?;
        Ok(PendingRequest {
            id: row.get(0)?,
            peer: row.get(1)?,
            incoming: row.get(2)?,
            note: row.get(3)?,
            key_package: row.get(4)?,
            at: from_db_u64(at).ok_or_else(|| {
                StoreError::Corrupt(format!("connection request has a negative time ({at})"))
            })?,
        })
    })?;
    rows.collect()
}
