//! The message ledger's rows (`docs/delivery.md#a-messages-life`): written in the step's
//! commit, read by `explainMessage`, `messageTimeline` and `courier-relay inspect`.
//!
//! Written like a log, for a step's commit to stay cheap: every row is keyed by its `seq`, which
//! SQLite assigns past the highest one, so new rows only ever go at the end of the table and a
//! step adds a few pages to the file. There is no index by message id, which would cost a page
//! per new message, and nothing clusters a message's rows (an entry for an old message, such as
//! the failure of one an acceptance evicted, would split a full page in the middle of the table):
//! reading one message's ledger scans the table instead (it is bounded, and explaining is rare).
//!
//! A row holds what one step saw happen to one message at one time: its `detail` is the entry's
//! JSON, or a JSON array of them when the step saw several (an acceptance and its deferral, an
//! attempt and its answer), so a step costs a row per message it touched, not one per entry.

use std::path::Path;

use courier_engine::Millis;
use rusqlite::{params, Connection, OpenFlags};

use super::{from_db_u64, schema, to_db, StoreError};
use crate::ledger::{Direction, Entry, History, Kind, PER_MESSAGE};

/// One entry, bound directly from a cached statement: a step's entries cost their appends and
/// nothing else (no encoding of the batch to be decoded again by SQLite).
const INSERT_SQL: &str = "INSERT INTO ledger (at, direction, message_id, peer, detail)
    VALUES (?1, ?2, ?3, ?4, ?5)";

/// Keeps each message's first row and its latest `PER_MESSAGE - 1` (a row holds one step's
/// entries, so the entries read back are capped again by [`read`]).
const TRIM_SQL: &str = "DELETE FROM ledger WHERE seq IN (
    SELECT seq FROM (
        SELECT seq,
               ROW_NUMBER() OVER (PARTITION BY direction, message_id ORDER BY seq) AS from_first,
               ROW_NUMBER() OVER (PARTITION BY direction, message_id ORDER BY seq DESC)
                   AS from_last
        FROM ledger)
    WHERE from_first > 1 AND from_last >= ?1)";

/// Messages no longer live (outbound: out of the outbox; inbound: out of the hook's buffer).
const SETTLED_COND: &str = "((h.direction = 'outbound'
        AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = h.message_id))
     OR (h.direction = 'inbound'
        AND NOT EXISTS (SELECT 1 FROM pending_inbound p WHERE p.message_id = h.message_id)))";

/// Each message with when its ledger last changed and its latest entry.
const HEADS: &str = "SELECT direction, message_id, MAX(at) AS last_at, MAX(seq) AS last_seq
    FROM ledger GROUP BY direction, message_id";

/// Writes `entries` in the caller's transaction, each message's in their order.
pub(crate) fn write(conn: &Connection, entries: &[Entry]) -> Result<(), StoreError> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut order: Vec<&Entry> = entries.iter().collect();
    order.sort_by(|a, b| {
        (a.direction.as_str(), &a.message_id).cmp(&(b.direction.as_str(), &b.message_id))
    });
    let mut insert = conn.prepare_cached(INSERT_SQL)?;
    for group in order.chunk_by(|a, b| a.direction == b.direction && a.message_id == b.message_id) {
        for row in group.chunk_by(|a, b| a.at == b.at) {
            let first = row[0];
            insert.execute(params![
                to_db(first.at),
                first.direction.as_str(),
                first.message_id,
                first.peer,
                detail(row)
            ])?;
        }
    }
    Ok(())
}

/// The `detail` of one row: its entry, or its entries in order.
fn detail(row: &[&Entry]) -> String {
    let encoded = match row {
        [entry] => serde_json::to_string(&entry.kind),
        _ => serde_json::to_string(&row.iter().map(|e| &e.kind).collect::<Vec<_>>()),
    };
    encoded.unwrap_or_default()
}

/// The entries a row's `detail` holds.
fn kinds(detail: &str) -> serde_json::Result<Vec<Kind>> {
    if detail.starts_with('[') {
        serde_json::from_str(detail)
    } else {
        serde_json::from_str(detail).map(|kind| vec![kind])
    }
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
    let mut stmt = conn.prepare_cached(
        "SELECT seq, at, peer, detail FROM ledger
         WHERE direction = ?1 AND message_id = ?2 ORDER BY seq",
    )?;
    let mut peer = String::new();
    let mut entries = Vec::new();
    let mut rows = stmt.query(params![direction.as_str(), id])?;
    while let Some(row) = rows.next()? {
        let seq: i64 = row.get(0)?;
        let at: i64 = row.get(1)?;
        let row_peer: String = row.get(2)?;
        let detail: String = row.get(3)?;
        let row_kinds = kinds(&detail).map_err(|e| {
            StoreError::Corrupt(format!("ledger row {seq} of {id:?} does not decode: {e}"))
        })?;
        if peer.is_empty() {
            peer = row_peer;
        }
        for kind in row_kinds {
            let position = entries.len() as u64;
            entries.push((position, from_db_u64(at).unwrap_or(0), kind));
        }
    }
    if entries.is_empty() {
        return Ok(None);
    }
    let kept = entries.len() as u64;
    // Numbered by position; past the bound, the first entry and the latest ones are shown
    // (the hourly prune trims the rest from the file).
    let cap = PER_MESSAGE as usize;
    if entries.len() > cap {
        entries.drain(1..entries.len() - (cap - 1));
    }
    // The life that counts is the one since the message was last accepted (an app-chosen id
    // may be sent again after it failed).
    let restart = entries
        .iter()
        .rposition(|(_, _, k)| *k == Kind::Accepted)
        .unwrap_or(0);
    let outcome = entries[restart..]
        .iter()
        .rev()
        .find_map(|(_, _, k)| k.outcome())
        .map(str::to_owned);
    Ok(Some(History {
        direction,
        message_id: id.to_owned(),
        peer,
        outcome,
        entries,
        kept,
    }))
}

/// The `limit` messages whose ledger changed last, most recent first.
pub(crate) fn recent(conn: &Connection, limit: usize) -> Result<Vec<History>, StoreError> {
    let heads: Vec<(String, String)> = conn
        .prepare(&format!("{HEADS} ORDER BY last_seq DESC LIMIT ?1"))?
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

/// Trims every ledger to its first and latest entries, then forgets the ledgers of messages no
/// longer live whose last entry is older than `older_than`, then of the oldest beyond `max`
/// messages. Returns how many messages were forgotten.
pub(crate) fn prune(
    conn: &Connection,
    older_than: Millis,
    max: usize,
) -> Result<usize, StoreError> {
    conn.execute(TRIM_SQL, [PER_MESSAGE as i64])?;
    let by_age = format!(
        "SELECT h.direction, h.message_id FROM ({HEADS}) h
         WHERE h.last_at < ?1 AND {SETTLED_COND}"
    );
    let mut n = forget(conn, &by_age, params![to_db(older_than)])?;
    let total: i64 =
        conn.query_row(&format!("SELECT COUNT(*) FROM ({HEADS})"), [], |r| r.get(0))?;
    let excess = total - i64::try_from(max).unwrap_or(i64::MAX);
    if excess > 0 {
        let by_count = format!(
            "SELECT h.direction, h.message_id FROM ({HEADS}) h
             WHERE {SETTLED_COND} ORDER BY h.last_at LIMIT ?1"
        );
        n += forget(conn, &by_count, params![excess])?;
    }
    Ok(n)
}

/// Deletes the ledgers of the messages `select` names, in one pass over the table; returns
/// how many messages.
fn forget(
    conn: &Connection,
    select: &str,
    args: &[&dyn rusqlite::ToSql],
) -> Result<usize, StoreError> {
    let n: i64 = conn.query_row(&format!("SELECT COUNT(*) FROM ({select})"), args, |r| {
        r.get(0)
    })?;
    if n > 0 {
        conn.execute(
            &format!("DELETE FROM ledger WHERE (direction, message_id) IN ({select})"),
            args,
        )?;
    }
    Ok(usize::try_from(n).unwrap_or(0))
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

#[cfg(test)]
mod tests {
    use courier_engine::io::{EntryState, OutboxRecord, StoreOp};
    use courier_proto::{ContentType, Message, Priority};

    use super::*;
    use crate::store::{Reports, RuntimeChanges, Store};

    fn entry(id: &str, at: Millis, kind: Kind) -> Entry {
        Entry {
            direction: Direction::Outbound,
            message_id: id.into(),
            peer: "bob".into(),
            at,
            kind,
        }
    }

    fn delivered(id: &str, at: Millis) -> [Entry; 2] {
        [
            entry(id, at, Kind::Accepted),
            entry(
                id,
                at,
                Kind::Delivered {
                    carrier: "internet".into(),
                    from: "bob".into(),
                    latency_ms: 0,
                },
            ),
        ]
    }

    fn live(id: &str) -> StoreOp {
        StoreOp::Put(OutboxRecord {
            message: Message {
                id: id.into(),
                sender: "alice".into(),
                recipient: "bob".into(),
                app_id: "test".into(),
                priority: Priority::Medium,
                ttl: 8,
                hop_count: 0,
                timestamp: 1,
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
            state: EntryState::Parked,
            created_at: 1,
            window_start: 1,
            ack_attempts: 0,
            transport_retries: 0,
            next_at: None,
            first_sent_at: None,
            last_sent_at: None,
        })
    }

    fn commit(store: &mut Store, ops: &[StoreOp], entries: &[Entry]) {
        let runtime = RuntimeChanges {
            ledger: entries,
            ..RuntimeChanges::default()
        };
        store
            .commit_with(ops, &Reports::default(), &runtime)
            .unwrap();
    }

    fn kept(store: &Store) -> Vec<String> {
        ["old", "parked", "recent"]
            .into_iter()
            .filter(|id| store.history(id).unwrap().is_some())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn settled_ledgers_go_with_age_and_count_while_a_live_message_keeps_its_own() {
        let mut store = Store::open_memory().unwrap();
        commit(&mut store, &[], &delivered("old", 1_000));
        commit(
            &mut store,
            &[live("parked")],
            &[entry("parked", 1_000, Kind::Accepted)],
        );
        commit(&mut store, &[], &delivered("recent", 9_000));

        assert_eq!(store.prune_ledger(5_000, 100).unwrap(), 1);
        assert_eq!(
            kept(&store),
            ["parked", "recent"],
            "only the old settled one went"
        );

        assert_eq!(store.prune_ledger(0, 1).unwrap(), 1);
        assert_eq!(
            kept(&store),
            ["parked"],
            "over the count, settled ledgers go first"
        );
        let entries: i64 = store
            .conn
            .query_row("SELECT COUNT(*) FROM ledger", [], |r| r.get(0))
            .unwrap();
        assert_eq!(entries, 1, "their entries went with them");
    }

    #[test]
    fn a_message_accepted_again_starts_a_new_life_in_the_same_ledger() {
        let mut store = Store::open_memory().unwrap();
        let failed = entry(
            "m",
            1,
            Kind::Failed {
                reason: "Max retries exceeded".into(),
                retry_count: 10,
            },
        );
        commit(&mut store, &[], &[entry("m", 0, Kind::Accepted), failed]);
        assert_eq!(
            store.history("m").unwrap().unwrap().outcome.as_deref(),
            Some("failed")
        );
        commit(&mut store, &[], &[entry("m", 2, Kind::Accepted)]);
        let history = store.history("m").unwrap().unwrap();
        assert_eq!(history.outcome, None, "live again");
        assert_eq!(history.entries.len(), 3);
    }
}
