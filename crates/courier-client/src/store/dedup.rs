//! Processed inbound keys `(chat, sender, message_id)`: the receiver's dedup across restarts
//! (`docs/delivery.md#inbound-dedup`), in `processed`, and the keys of verified control frames,
//! in `processed_controls`, which no count bound evicts (`docs/delivery.md#control-frames`).

use courier_engine::io::{InboundKey, Millis, ProcessedKey};
use rusqlite::{params, Connection};

use super::{from_db_u64, to_db, StoreError};

/// Insert-or-ignore: the first processing time is kept, so a redelivery never extends the
/// retention of its key (the sender's absolute lifetime is anchored before the first arrival).
pub(crate) fn mark(conn: &Connection, key: &InboundKey, at: Millis) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO processed (chat, sender, message_id, at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (chat, sender, message_id) DO NOTHING",
    )?
    .execute(params![key.chat, key.sender, key.message_id, to_db(at)])?;
    Ok(())
}

/// Deletes keys processed before `older_than`, then the oldest beyond `max`.
pub(crate) fn prune(
    conn: &Connection,
    older_than: Millis,
    max: usize,
) -> Result<usize, StoreError> {
    let expired = conn
        .prepare_cached("DELETE FROM processed WHERE at < ?1")?
        .execute([to_db(older_than)])?;
    let excess = conn
        .prepare_cached(
            "DELETE FROM processed WHERE (chat, sender, message_id) IN (
                 SELECT chat, sender, message_id FROM processed
                 ORDER BY at DESC, chat DESC, sender DESC, message_id DESC
                 LIMIT -1 OFFSET ?1)",
        )?
        .execute([to_db(max as u64)])?;
    Ok(expired + excess)
}

/// A verified control frame's key; insert-or-ignore like [`mark`].
pub(crate) fn mark_control(
    conn: &Connection,
    key: &InboundKey,
    at: Millis,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO processed_controls (chat, sender, message_id, at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (chat, sender, message_id) DO NOTHING",
    )?
    .execute(params![key.chat, key.sender, key.message_id, to_db(at)])?;
    Ok(())
}

/// Deletes control keys processed before `older_than`: by age only.
pub(crate) fn prune_controls(conn: &Connection, older_than: Millis) -> Result<usize, StoreError> {
    Ok(conn
        .prepare_cached("DELETE FROM processed_controls WHERE at < ?1")?
        .execute([to_db(older_than)])?)
}

/// All keys, oldest first.
pub(crate) fn load(conn: &Connection) -> Result<Vec<ProcessedKey>, StoreError> {
    load_from(conn, "processed")
}

/// All control keys, oldest first.
pub(crate) fn load_controls(conn: &Connection) -> Result<Vec<ProcessedKey>, StoreError> {
    load_from(conn, "processed_controls")
}

fn load_from(conn: &Connection, table: &str) -> Result<Vec<ProcessedKey>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT chat, sender, message_id, at FROM {table}
         ORDER BY at, chat, sender, message_id"
    ))?;
    let rows = stmt.query_and_then([], |row| {
        let at: i64 = row.get(3)?;
        Ok(ProcessedKey {
            key: InboundKey {
                chat: row.get(0)?,
                sender: row.get(1)?,
                message_id: row.get(2)?,
            },
            at: from_db_u64(at).ok_or_else(|| {
                StoreError::Corrupt(format!("{table} row has a negative time ({at})"))
            })?,
        })
    })?;
    rows.collect()
}
