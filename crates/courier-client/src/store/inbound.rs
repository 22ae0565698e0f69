//! The durability buffer for inbound messages (`pending_inbound`, schema version 2): a copy of
//! each message written before the application's durability hook sees it, cleared once the
//! hook committed it (`docs/delivery.md#durability-hook`).

use courier_engine::io::{Carrier, InboundKey, Millis, PendingInbound};
use courier_proto::Message;
use rusqlite::{params, Connection, Row};

use super::{dedup, from_db_u64, to_db, StoreError};

const BUFFER_SQL: &str = "INSERT INTO pending_inbound
        (chat, sender, message_id, message_json, carrier, stamped_sender, received_at, encrypted)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
    ON CONFLICT (chat, sender, message_id) DO NOTHING";

const DELETE_SQL: &str =
    "DELETE FROM pending_inbound WHERE chat = ?1 AND sender = ?2 AND message_id = ?3";

const LOAD_SQL: &str = "SELECT chat, sender, message_id, message_json, carrier, stamped_sender,
        received_at, encrypted
    FROM pending_inbound ORDER BY received_at, rowid";

/// The carrier's column value: `"internet"` or the local carrier's registered name.
fn carrier_to_db(carrier: &Carrier) -> &str {
    carrier.name()
}

fn carrier_from_db(name: String) -> Carrier {
    if name == "internet" {
        Carrier::Relay
    } else {
        Carrier::Local(name)
    }
}

/// Insert-or-ignore every message: a key already buffered keeps its first copy (and its first
/// `received_at`, so a redelivery never extends its retention). One cached statement for the
/// whole batch, inside the caller's transaction.
pub(crate) fn buffer(conn: &Connection, batch: &[PendingInbound]) -> Result<(), StoreError> {
    if batch.is_empty() {
        return Ok(());
    }
    let mut stmt = conn.prepare_cached(BUFFER_SQL)?;
    for p in batch {
        let json = serde_json::to_string(&p.message).map_err(|e| {
            StoreError::Sqlite(rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
        })?;
        stmt.execute(params![
            p.key.chat,
            p.key.sender,
            p.key.message_id,
            json,
            carrier_to_db(&p.carrier),
            p.stamped_sender,
            to_db(p.received_at),
            p.encrypted,
        ])?;
    }
    Ok(())
}

/// Deletes the buffered rows of `keys` (absent keys are fine).
pub(crate) fn delete(conn: &Connection, keys: &[InboundKey]) -> Result<(), StoreError> {
    if keys.is_empty() {
        return Ok(());
    }
    let mut stmt = conn.prepare_cached(DELETE_SQL)?;
    for k in keys {
        stmt.execute(params![k.chat, k.sender, k.message_id])?;
    }
    Ok(())
}

/// The hook committed `keys`: their buffered rows go and each is marked processed at `at`
/// (insert-or-ignore, exactly like `MarkProcessed`).
pub(crate) fn commit(conn: &Connection, keys: &[InboundKey], at: Millis) -> Result<(), StoreError> {
    delete(conn, keys)?;
    for k in keys {
        dedup::mark(conn, k, at)?;
    }
    Ok(())
}

/// Every buffered message, oldest received first.
pub(crate) fn load(conn: &Connection) -> Result<Vec<PendingInbound>, StoreError> {
    let mut stmt = conn.prepare_cached(LOAD_SQL)?;
    let rows = stmt.query_and_then([], decode)?;
    rows.collect()
}

fn decode(row: &Row<'_>) -> Result<PendingInbound, StoreError> {
    let key = InboundKey {
        chat: row.get(0)?,
        sender: row.get(1)?,
        message_id: row.get(2)?,
    };
    let bad = |what: &str| {
        StoreError::Corrupt(format!(
            "pending_inbound row ({:?}, {:?}, {:?}): {what}",
            key.chat, key.sender, key.message_id
        ))
    };
    let json: String = row.get(3)?;
    let message: Message = serde_json::from_str(&json)
        .map_err(|e| bad(&format!("message_json does not decode: {e}")))?;
    let received_at: i64 = row.get(6)?;
    let received_at = from_db_u64(received_at).ok_or_else(|| bad("received_at is negative"))?;
    Ok(PendingInbound {
        carrier: carrier_from_db(row.get(4)?),
        stamped_sender: row.get(5)?,
        received_at,
        encrypted: row.get(7)?,
        message,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use courier_engine::io::StoreOp;
    use courier_proto::{ContentType, Priority};

    fn pending(id: &str, at: Millis) -> PendingInbound {
        PendingInbound {
            key: InboundKey {
                chat: "dm".into(),
                sender: "alice".into(),
                message_id: id.into(),
            },
            message: Message {
                id: id.into(),
                sender: "alice".into(),
                recipient: "bob".into(),
                app_id: "chat".into(),
                priority: Priority::Medium,
                ttl: 8,
                hop_count: 0,
                timestamp: at,
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
            },
            carrier: Carrier::Local("ble".into()),
            stamped_sender: "alice".into(),
            received_at: at,
            // Both marks, so that the round trips cover the column.
            encrypted: at % 2 == 1,
        }
    }

    #[test]
    fn an_op_failing_late_in_the_step_undoes_the_inbound_ops_before_it() {
        let mut store = Store::open_memory().unwrap();
        let (a, b) = (pending("a", 1), pending("b", 2));
        store
            .commit(&[StoreOp::BufferInbound(vec![a.clone(), b.clone()])])
            .unwrap();
        store
            .conn
            .execute_batch(
                "CREATE TRIGGER refuse BEFORE INSERT ON pending_inbound
                 WHEN NEW.message_id = 'poison'
                 BEGIN SELECT RAISE(ABORT, 'disk on fire'); END;",
            )
            .unwrap();
        // Every op before the last one succeeds; the second message of the last one fails.
        let err = store
            .commit(&[
                StoreOp::CommitInbound {
                    keys: vec![a.key.clone()],
                    at: 10,
                },
                StoreOp::ExpireInbound {
                    keys: vec![b.key.clone()],
                },
                StoreOp::BufferInbound(vec![pending("c", 3), pending("poison", 4)]),
            ])
            .unwrap_err();
        assert!(err.to_string().contains("disk on fire"), "{err}");
        assert_eq!(store.load_pending_inbound().unwrap(), vec![a, b]);
        assert!(store.load_processed(100, u64::MAX, 100).unwrap().is_empty());
    }

    #[test]
    fn carrier_names_round_trip() {
        for c in [Carrier::Relay, Carrier::Local("ble".into())] {
            assert_eq!(carrier_from_db(carrier_to_db(&c).to_owned()), c);
        }
    }
}
