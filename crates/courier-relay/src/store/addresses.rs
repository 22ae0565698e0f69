//! Address bindings: an `off1` address → the account that last declared it, and what depends on
//! them. Everything that does is decided on the store thread, in commit order: a frame named by
//! address is resolved inside its append's transaction (journal.rs), and both a new binding's
//! effect on presence watches and the registration of watches on addresses happen after their
//! commits. A watch therefore either sees a binding in its resolution or is moved by it.

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension};

use super::accounts::last_seen_of;
use super::worker::Applied;
use super::{to_sql, Named};
use crate::presence::Watchlist;

/// The account `address` is bound to.
pub(super) fn bound_account(conn: &Connection, address: &str) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT account FROM addresses WHERE address = ?1")?
        .query_row([address], |r| r.get(0))
        .optional()
}

/// Binds `address` to `account`, replacing any earlier binding (the latest successful
/// declaration wins); once durable, watches on the address follow it.
pub(super) fn bind(
    conn: &Connection,
    address: String,
    account: String,
    now_ms: u64,
) -> rusqlite::Result<Applied<()>> {
    let previous = bound_account(conn, &address)?;
    conn.prepare_cached(
        "INSERT INTO addresses (address, account, bound_ms) VALUES (?1, ?2, ?3)
         ON CONFLICT (address) DO UPDATE SET account = excluded.account,
                                             bound_ms = excluded.bound_ms",
    )?
    .execute(params![address, account, to_sql(now_ms)])?;
    if previous.as_deref() == Some(account.as_str()) {
        return Ok(Applied::value(()));
    }
    Ok(Applied::then(move |router| {
        router.rebind(&address, &account);
    }))
}

pub(super) fn resolve(
    conn: &Connection,
    address: &str,
) -> rusqlite::Result<Applied<Option<String>>> {
    Ok(Applied::value(bound_account(conn, address)?))
}

/// Resolves each watched identifier (`None`: names nothing) and reads the last_seen only the
/// database knows; once durable, registers the watches with their first statuses.
pub(super) fn watch(
    conn: &Connection,
    watchlist: Arc<Watchlist>,
    targets: Vec<(String, Option<Named>)>,
) -> rusqlite::Result<Applied<()>> {
    let mut resolved = Vec::with_capacity(targets.len());
    let mut persisted = HashMap::new();
    for (identifier, named) in targets {
        let account = match named {
            Some(Named::Account(account)) => Some(account),
            Some(Named::Address(address)) => bound_account(conn, &address)?,
            None => None,
        };
        if let Some(account) = &account {
            if !persisted.contains_key(account) {
                if let Some(ms) = last_seen_of(conn, account)? {
                    persisted.insert(account.clone(), ms);
                }
            }
        }
        resolved.push((identifier, account));
    }
    Ok(Applied::then(move |router| {
        router.watch(&watchlist, resolved, &persisted);
    }))
}
