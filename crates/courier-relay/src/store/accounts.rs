//! Accounts: persisted at their first authentication, and when each one's last connection
//! ended (its last_seen), so presence survives a relay restart.

use std::collections::HashMap;

use rusqlite::{params, Connection, OptionalExtension};

use super::worker::{Applied, Delta};
use super::{from_sql, to_sql};

/// Persists the account at its first successful authentication.
pub(super) fn ensure(conn: &Connection, name: &str, now_ms: u64) -> rusqlite::Result<Applied<()>> {
    let created = conn
        .prepare_cached("INSERT OR IGNORE INTO accounts (name, created_ms) VALUES (?1, ?2)")?
        .execute(params![name, to_sql(now_ms)])?;
    Ok(Applied::value(()).counting(Delta {
        accounts: i64::from(created > 0),
        ..Delta::default()
    }))
}

pub(super) fn exists(conn: &Connection, name: &str) -> rusqlite::Result<Applied<bool>> {
    Ok(Applied::value(is_known(conn, name)?))
}

/// Whether the account ever authenticated.
pub(super) fn is_known(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    let found = conn
        .prepare_cached("SELECT 1 FROM accounts WHERE name = ?1")?
        .query_row([name], |_| Ok(()))
        .optional()?;
    Ok(found.is_some())
}

/// Never moves last_seen back, so records committed out of order keep the latest.
pub(super) fn record_last_seen(
    conn: &Connection,
    account: &str,
    ms: u64,
) -> rusqlite::Result<Applied<()>> {
    conn.prepare_cached(
        "UPDATE accounts SET last_seen_ms = MAX(COALESCE(last_seen_ms, 0), ?2) WHERE name = ?1",
    )?
    .execute(params![account, to_sql(ms)])?;
    Ok(Applied::value(()))
}

/// Every persisted last_seen, read once at open.
pub(super) fn load_last_seen(conn: &Connection) -> rusqlite::Result<HashMap<String, u64>> {
    let mut stmt =
        conn.prepare("SELECT name, last_seen_ms FROM accounts WHERE last_seen_ms IS NOT NULL")?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, from_sql(r.get(1)?))))?;
    rows.collect()
}
