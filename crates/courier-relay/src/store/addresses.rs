//! Address bindings: an `off1` address → the account that last declared it, and what depends on
//! them. A frame named by address is resolved inside its append's transaction (journal.rs); the
//! router keeps a copy of every binding for presence (router.rs), loaded at open and changed
//! after each commit, in commit order: a watch either sees a binding in its resolution or is
//! moved by it.

use std::collections::HashMap;

use rusqlite::{params, Connection, OptionalExtension};

use super::worker::Applied;
use super::{to_sql, PURGE_BATCH};

/// The account `address` is bound to.
pub(super) fn bound_account(conn: &Connection, address: &str) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT account FROM addresses WHERE address = ?1")?
        .query_row([address], |r| r.get(0))
        .optional()
}

/// Binds `address` to `account`, replacing any earlier binding (the latest successful
/// declaration wins), and deletes the account's least recently declared bindings past
/// `max_per_account`; once durable, watches on the address follow it and the deleted addresses
/// name nobody.
pub(super) fn bind(
    conn: &Connection,
    address: String,
    account: String,
    max_per_account: u32,
    now_ms: u64,
) -> rusqlite::Result<Applied<()>> {
    let previous = bound_account(conn, &address)?;
    conn.prepare_cached(
        "INSERT INTO addresses (address, account, bound_ms) VALUES (?1, ?2, ?3)
         ON CONFLICT (address) DO UPDATE SET account = excluded.account,
                                             bound_ms = excluded.bound_ms",
    )?
    .execute(params![address, account, to_sql(now_ms)])?;
    // The one just declared is the newest, so it is never among those dropped.
    let dropped: Vec<String> = conn
        .prepare_cached(
            "DELETE FROM addresses WHERE address IN
                 (SELECT address FROM addresses WHERE account = ?1
                  ORDER BY bound_ms DESC, address = ?2 DESC, address LIMIT -1 OFFSET ?3)
             RETURNING address",
        )?
        .query_map(params![account, address, max_per_account], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let moved = previous.as_deref() != Some(account.as_str());
    if !moved && dropped.is_empty() {
        return Ok(Applied::value(()));
    }
    Ok(Applied::then(move |router| {
        for gone in &dropped {
            router.unbind(gone, &account);
        }
        if moved {
            router.rebind(&address, &account);
        }
    }))
}

/// Deletes at most [`PURGE_BATCH`] bindings last declared before `older_than_ms`; answers how
/// many. Once durable, those addresses name nobody.
pub(super) fn purge(conn: &Connection, older_than_ms: u64) -> rusqlite::Result<Applied<u64>> {
    let expired: Vec<(String, String)> = conn
        .prepare_cached(
            "DELETE FROM addresses WHERE address IN
                 (SELECT address FROM addresses WHERE bound_ms < ?1 LIMIT ?2)
             RETURNING address, account",
        )?
        .query_map(params![to_sql(older_than_ms), PURGE_BATCH], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let count = expired.len() as u64;
    Ok(Applied::then(move |router| {
        for (address, account) in &expired {
            router.unbind(address, account);
        }
        count
    }))
}

pub(super) fn resolve(
    conn: &Connection,
    address: &str,
) -> rusqlite::Result<Applied<Option<String>>> {
    Ok(Applied::value(bound_account(conn, address)?))
}

/// Every binding, read once at open.
pub(super) fn load(conn: &Connection) -> rusqlite::Result<HashMap<String, String>> {
    let mut stmt = conn.prepare("SELECT address, account FROM addresses")?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}
