//! Outbox rows and settled outcomes.

use courier_engine::io::Millis;
use courier_engine::io::{EntryState, FailReason, OutboxRecord, Settlement};
use courier_proto::{ContentType, Message};
use rusqlite::{params, Connection, OptionalExtension, Row};

use super::{from_db_u32, from_db_u64, to_db, SettledRecord, StoreError};

const PUT_SQL: &str = "INSERT INTO outbox (id, recipient, state, created_at, window_start,
        ack_attempts, transport_retries, next_at, first_sent_at, last_sent_at, is_media,
        message_json)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
    ON CONFLICT (id) DO UPDATE SET
        recipient = excluded.recipient,
        state = excluded.state,
        created_at = excluded.created_at,
        window_start = excluded.window_start,
        ack_attempts = excluded.ack_attempts,
        transport_retries = excluded.transport_retries,
        next_at = excluded.next_at,
        first_sent_at = excluded.first_sent_at,
        last_sent_at = excluded.last_sent_at,
        is_media = excluded.is_media,
        message_json = excluded.message_json";

const DELETE_OUTBOX_SQL: &str = "DELETE FROM outbox WHERE id = ?1";

const DELETE_SETTLED_SQL: &str = "DELETE FROM settled WHERE id = ?1";

const SETTLE_SQL: &str = "INSERT INTO settled (id, recipient, outcome, reason, at)
    VALUES (?1, ?2, ?3, ?4, ?5)
    ON CONFLICT (id) DO UPDATE SET
        recipient = excluded.recipient,
        outcome = excluded.outcome,
        reason = excluded.reason,
        at = excluded.at,
        unreported_event = NULL";

const LOAD_SQL: &str = "SELECT id, state, created_at, window_start, ack_attempts,
        transport_retries, next_at, first_sent_at, last_sent_at, message_json
    FROM outbox ORDER BY created_at, rowid";

const LOAD_ONE_SQL: &str = "SELECT id, state, created_at, window_start, ack_attempts,
        transport_retries, next_at, first_sent_at, last_sent_at, message_json
    FROM outbox WHERE id = ?1";

pub(crate) fn state_str(state: EntryState) -> &'static str {
    match state {
        EntryState::Queued => "queued",
        EntryState::InFlight => "in_flight",
        EntryState::Parked => "parked",
        EntryState::AwaitingSession => "awaiting_session",
    }
}

pub(crate) fn parse_state(s: &str) -> Option<EntryState> {
    match s {
        "queued" => Some(EntryState::Queued),
        "in_flight" => Some(EntryState::InFlight),
        "parked" => Some(EntryState::Parked),
        "awaiting_session" => Some(EntryState::AwaitingSession),
        _ => None,
    }
}

/// Upserts the entry's row. A live entry is never also "settled": re-accepting an id that
/// settled before (a client-chosen id re-sent after `message_failed`) forgets the old outcome,
/// so `settled()` and the status never contradict the outbox.
pub(crate) fn put(conn: &Connection, record: &OutboxRecord) -> Result<(), StoreError> {
    let m = &record.message;
    let json = serde_json::to_string(m)
        .map_err(|e| StoreError::Sqlite(rusqlite::Error::ToSqlConversionFailure(Box::new(e))))?;
    conn.prepare_cached(PUT_SQL)?.execute(params![
        m.id,
        m.recipient,
        state_str(record.state),
        to_db(record.created_at),
        to_db(record.window_start),
        i64::from(record.ack_attempts),
        i64::from(record.transport_retries),
        record.next_at.map(to_db),
        record.first_sent_at.map(to_db),
        record.last_sent_at.map(to_db),
        m.content_type == ContentType::FileChunk,
        json,
    ])?;
    conn.prepare_cached(DELETE_SETTLED_SQL)?.execute([&m.id])?;
    Ok(())
}

/// Removes the outbox row and records the outcome.
pub(crate) fn settle(
    conn: &Connection,
    id: &str,
    recipient: &str,
    settlement: &Settlement,
    at: Millis,
) -> Result<(), StoreError> {
    conn.prepare_cached(DELETE_OUTBOX_SQL)?.execute([id])?;
    let (outcome, reason) = match settlement {
        Settlement::Delivered => ("delivered", None),
        Settlement::Failed(reason) => ("failed", Some(reason.as_str())),
    };
    conn.prepare_cached(SETTLE_SQL)?
        .execute(params![id, recipient, outcome, reason, to_db(at)])?;
    Ok(())
}

pub(crate) fn record_of(conn: &Connection, id: &str) -> Result<Option<OutboxRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(LOAD_ONE_SQL)?;
    let mut rows = stmt.query_and_then([id], decode)?;
    rows.next().transpose()
}

pub(crate) fn load(conn: &Connection) -> Result<Vec<OutboxRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(LOAD_SQL)?;
    let rows = stmt.query_and_then([], decode)?;
    rows.collect()
}

fn decode(row: &Row<'_>) -> Result<OutboxRecord, StoreError> {
    let id: String = row.get(0)?;
    let bad = |what: &str| StoreError::Corrupt(format!("outbox row {id:?}: {what}"));
    let state: String = row.get(1)?;
    let state = parse_state(&state).ok_or_else(|| bad(&format!("unknown state {state:?}")))?;
    let json: String = row.get(9)?;
    let message: Message = serde_json::from_str(&json)
        .map_err(|e| bad(&format!("message_json does not decode: {e}")))?;
    if message.id != id {
        return Err(bad(&format!("message_json holds id {:?}", message.id)));
    }
    let u64_at = |i: usize, name: &str| -> Result<u64, StoreError> {
        from_db_u64(row.get(i)?).ok_or_else(|| bad(&format!("{name} is negative")))
    };
    let opt_at = |i: usize, name: &str| -> Result<Option<u64>, StoreError> {
        match row.get::<_, Option<i64>>(i)? {
            None => Ok(None),
            Some(v) => from_db_u64(v)
                .map(Some)
                .ok_or_else(|| bad(&format!("{name} is negative"))),
        }
    };
    let u32_at = |i: usize, name: &str| -> Result<u32, StoreError> {
        from_db_u32(row.get(i)?).ok_or_else(|| bad(&format!("{name} is out of range")))
    };
    Ok(OutboxRecord {
        message,
        state,
        created_at: u64_at(2, "created_at")?,
        window_start: u64_at(3, "window_start")?,
        ack_attempts: u32_at(4, "ack_attempts")?,
        transport_retries: u32_at(5, "transport_retries")?,
        next_at: opt_at(6, "next_at")?,
        first_sent_at: opt_at(7, "first_sent_at")?,
        last_sent_at: opt_at(8, "last_sent_at")?,
    })
}

pub(crate) fn settled(conn: &Connection, id: &str) -> Result<Option<SettledRecord>, StoreError> {
    let row = conn
        .prepare_cached("SELECT recipient, outcome, reason, at FROM settled WHERE id = ?1")?
        .query_row([id], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<String>>(2)?,
                row.get::<_, i64>(3)?,
            ))
        })
        .optional()?;
    let Some((recipient, outcome, reason, at)) = row else {
        return Ok(None);
    };
    let bad = |what: String| StoreError::Corrupt(format!("settled row {id:?}: {what}"));
    let outcome = match (outcome.as_str(), reason.as_deref()) {
        ("delivered", _) => Settlement::Delivered,
        ("failed", Some(r)) => Settlement::Failed(
            FailReason::parse(r).ok_or_else(|| bad(format!("unknown failure reason {r:?}")))?,
        ),
        (o, _) => return Err(bad(format!("unknown outcome {o:?}"))),
    };
    let at = from_db_u64(at).ok_or_else(|| bad("at is negative".into()))?;
    Ok(Some(SettledRecord {
        outcome,
        at,
        recipient,
    }))
}

/// The state of a live outbox entry, if `id` is in the outbox.
pub(crate) fn state_of(conn: &Connection, id: &str) -> Result<Option<EntryState>, StoreError> {
    let state: Option<String> = conn
        .prepare_cached("SELECT state FROM outbox WHERE id = ?1")?
        .query_row([id], |row| row.get(0))
        .optional()?;
    state
        .map(|s| {
            parse_state(&s).ok_or_else(|| {
                StoreError::Corrupt(format!("outbox row {id:?}: unknown state {s:?}"))
            })
        })
        .transpose()
}

/// Deletes settled rows older than `older_than`, then the oldest beyond `max`.
pub(crate) fn prune_settled(
    conn: &Connection,
    older_than: Millis,
    max: usize,
) -> Result<usize, StoreError> {
    let expired = conn
        .prepare_cached("DELETE FROM settled WHERE at < ?1")?
        .execute([to_db(older_than)])?;
    let excess = conn
        .prepare_cached(
            "DELETE FROM settled WHERE id IN (
                 SELECT id FROM settled ORDER BY at DESC, id DESC LIMIT -1 OFFSET ?1)",
        )?
        .execute([to_db(max as u64)])?;
    Ok(expired + excess)
}

/// Keeps `event` (the terminal event's JSON) with `id`'s settlement until it is reported.
pub(crate) fn hold_event(conn: &Connection, id: &str, event: &str) -> Result<(), StoreError> {
    conn.prepare_cached("UPDATE settled SET unreported_event = ?2 WHERE id = ?1")?
        .execute([id, event])?;
    Ok(())
}

/// `id`'s terminal event reached the application.
pub(crate) fn mark_reported(conn: &Connection, id: &str) -> Result<(), StoreError> {
    conn.prepare_cached("UPDATE settled SET unreported_event = NULL WHERE id = ?1")?
        .execute([id])?;
    Ok(())
}

/// Terminal events committed but never reported, oldest settlement first.
pub(crate) fn unreported(conn: &Connection) -> Result<Vec<(String, String)>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, unreported_event FROM settled
         WHERE unreported_event IS NOT NULL ORDER BY at, id",
    )?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}
