//! The message ledger's rows (`docs/delivery.md#a-messages-life`): written in the step's
//! commit, read by `explainMessage`, `messageTimeline` and `courier-relay inspect`.

use std::path::Path;

use courier_engine::Millis;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use super::{from_db_u64, schema, to_db, StoreError};
use crate::ledger::{Direction, Entry, History, Kind, PER_MESSAGE};

/// Adds `written` entries to the head, creating it; returns the entries ever written since.
/// A message accepted again (an app-chosen id re-sent after it failed) starts a new life: its
/// old outcome is cleared.
const HEAD_SQL: &str = "INSERT INTO ledger_messages
        (direction, message_id, peer, first_at, last_at, written, outcome)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
    ON CONFLICT (direction, message_id) DO UPDATE SET
        peer = CASE WHEN peer = '' THEN excluded.peer ELSE peer END,
        last_at = excluded.last_at,
        written = written + excluded.written,
        outcome = CASE WHEN ?8 THEN excluded.outcome ELSE COALESCE(excluded.outcome, outcome) END
    RETURNING written";

const ENTRY_SQL: &str = "INSERT OR REPLACE INTO ledger_entries
        (direction, message_id, seq, at, kind, detail)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

/// Keeps the first entry and the latest `PER_MESSAGE - 1`.
const TRIM_SQL: &str = "DELETE FROM ledger_entries
    WHERE direction = ?1 AND message_id = ?2 AND seq > 0 AND seq <= ?3";

/// Messages no longer live (outbound: out of the outbox; inbound: out of the hook's buffer).
const SETTLED_COND: &str = "(h.direction = 'outbound'
        AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = h.message_id))
     OR (h.direction = 'inbound'
        AND NOT EXISTS (SELECT 1 FROM pending_inbound p WHERE p.message_id = h.message_id))";

/// Writes `entries` in the caller's transaction, each message's in their order: one head update
/// per message of the step, however its entries were interleaved with other messages'.
pub(crate) fn write(conn: &Connection, entries: &[Entry]) -> Result<(), StoreError> {
    let mut order: Vec<&Entry> = entries.iter().collect();
    order.sort_by(|a, b| {
        (a.direction.as_str(), &a.message_id).cmp(&(b.direction.as_str(), &b.message_id))
    });
    for group in order.chunk_by(|a, b| a.direction == b.direction && a.message_id == b.message_id) {
        write_group(conn, group)?;
    }
    Ok(())
}

fn write_group(conn: &Connection, group: &[&Entry]) -> Result<(), StoreError> {
    let first = &group[0];
    let last = &group[group.len() - 1];
    let restart = group.iter().rposition(|e| e.kind == Kind::Accepted);
    let outcome = group
        .iter()
        .skip(restart.unwrap_or(0))
        .rev()
        .find_map(|e| e.kind.outcome());
    let direction = first.direction.as_str();
    let n = group.len() as i64;
    let written: i64 = conn.prepare_cached(HEAD_SQL)?.query_row(
        params![
            direction,
            first.message_id,
            first.peer,
            to_db(first.at),
            to_db(last.at),
            n,
            outcome,
            restart.is_some(),
        ],
        |row| row.get(0),
    )?;
    let mut insert = conn.prepare_cached(ENTRY_SQL)?;
    for (i, entry) in group.iter().enumerate() {
        let detail = serde_json::to_string(&entry.kind).map_err(|e| {
            StoreError::Sqlite(rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
        })?;
        insert.execute(params![
            direction,
            entry.message_id,
            written - n + i as i64,
            to_db(entry.at),
            entry.kind.name(),
            detail,
        ])?;
    }
    let keep_from = written - (PER_MESSAGE as i64 - 1);
    if keep_from > 1 {
        conn.prepare_cached(TRIM_SQL)?.execute(params![
            direction,
            first.message_id,
            keep_from - 1
        ])?;
    }
    Ok(())
}

/// The ledger of message `id`: its outbound life if it has one, else its inbound one.
pub(crate) fn history(conn: &Connection, id: &str) -> Result<Option<History>, StoreError> {
    for direction in [Direction::Outbound, Direction::Inbound] {
        if let Some(history) = read(conn, direction, id)? {
            return Ok(Some(history));
        }
    }
    Ok(None)
}

fn read(conn: &Connection, direction: Direction, id: &str) -> Result<Option<History>, StoreError> {
    let head = conn
        .prepare_cached(
            "SELECT peer, outcome, written FROM ledger_messages
             WHERE direction = ?1 AND message_id = ?2",
        )?
        .query_row(params![direction.as_str(), id], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, Option<String>>(1)?,
                row.get::<_, i64>(2)?,
            ))
        })
        .optional()?;
    let Some((peer, outcome, written)) = head else {
        return Ok(None);
    };
    let mut stmt = conn.prepare_cached(
        "SELECT seq, at, detail FROM ledger_entries
         WHERE direction = ?1 AND message_id = ?2 ORDER BY seq",
    )?;
    let rows = stmt.query_and_then(params![direction.as_str(), id], |row| {
        let seq: i64 = row.get(0)?;
        let at: i64 = row.get(1)?;
        let detail: String = row.get(2)?;
        let kind: Kind = serde_json::from_str(&detail).map_err(|e| {
            StoreError::Corrupt(format!("ledger entry {seq} of {id:?} does not decode: {e}"))
        })?;
        Ok::<_, StoreError>((
            from_db_u64(seq).unwrap_or(0),
            from_db_u64(at).unwrap_or(0),
            kind,
        ))
    })?;
    Ok(Some(History {
        direction,
        message_id: id.to_owned(),
        peer,
        outcome,
        entries: rows.collect::<Result<_, _>>()?,
        written: from_db_u64(written).unwrap_or(0),
    }))
}

/// The `limit` messages whose ledger changed last, most recent first.
pub(crate) fn recent(conn: &Connection, limit: usize) -> Result<Vec<History>, StoreError> {
    let heads: Vec<(String, String)> = conn
        .prepare(
            "SELECT direction, message_id FROM ledger_messages
             ORDER BY last_at DESC, message_id LIMIT ?1",
        )?
        .query_map([limit as i64], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let mut out = Vec::with_capacity(heads.len());
    for (direction, id) in heads {
        let Some(direction) = Direction::parse(&direction) else {
            continue;
        };
        out.extend(read(conn, direction, &id)?);
    }
    Ok(out)
}

/// Forgets the ledgers of messages no longer live whose last entry is older than
/// `older_than`, then of the oldest beyond `max` messages. Returns how many messages.
pub(crate) fn prune(
    conn: &Connection,
    older_than: Millis,
    max: usize,
) -> Result<usize, StoreError> {
    let by_age = format!(
        "SELECT h.direction, h.message_id FROM ledger_messages h
         WHERE h.last_at < ?1 AND ({SETTLED_COND})"
    );
    let mut n = forget(conn, &by_age, params![to_db(older_than)])?;
    let total: i64 = conn.query_row("SELECT COUNT(*) FROM ledger_messages", [], |r| r.get(0))?;
    let excess = total - i64::try_from(max).unwrap_or(i64::MAX);
    if excess > 0 {
        let by_count = format!(
            "SELECT h.direction, h.message_id FROM ledger_messages h
             WHERE {SETTLED_COND} ORDER BY h.last_at LIMIT ?1"
        );
        n += forget(conn, &by_count, params![excess])?;
    }
    Ok(n)
}

fn forget(
    conn: &Connection,
    select: &str,
    args: impl rusqlite::Params + Clone,
) -> Result<usize, StoreError> {
    conn.execute(
        &format!("DELETE FROM ledger_entries WHERE (direction, message_id) IN ({select})"),
        args.clone(),
    )?;
    Ok(conn.execute(
        &format!("DELETE FROM ledger_messages WHERE (direction, message_id) IN ({select})"),
        args,
    )?)
}

/// The ledgers of the `limit` most recent messages of the database at `path`, read without
/// taking the one-writer lock: a running client may hold it, and a reader changes nothing.
pub fn read_recent(path: &Path, limit: usize) -> Result<Vec<History>, StoreError> {
    if !path.exists() {
        return Err(StoreError::Io(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{}: no such database", path.display()),
        )));
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(std::time::Duration::from_millis(200))?;
    let version = schema::read_version(&conn)?;
    if version < schema::LEDGER_VERSION {
        return Err(StoreError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{}: schema version {version} keeps no message ledger (it starts at {})",
                path.display(),
                schema::LEDGER_VERSION
            ),
        )));
    }
    schema::check_not_newer(version, schema::SCHEMA_VERSION)?;
    recent(&conn, limit)
}
