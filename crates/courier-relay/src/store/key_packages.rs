//! The key-package directory (`docs/protocol.md#key-package-directory`): per canonical address, up
//! to [`MAX_HELD`] one-time packages in publish order and at most one last-resort package.
//!
//! A take deletes the one-time package it answers with in the same transaction, and the store
//! thread runs one request at a time, so no two takes ever see the same row: a one-time package is
//! handed out at most once, however many connections ask at the same moment.

use courier_proto::{KeyPackage, KeyPackageBatch};
use rusqlite::types::Type;
use rusqlite::{params, Connection, OptionalExtension};

use super::worker::Applied;
use super::{to_sql, KeyPackagesHeld, TakenKeyPackage};

/// One-time packages an address holds; publishing more drops the oldest.
pub(crate) const MAX_HELD: u32 = 100;

/// Appends `packages` (oldest first) for `address`, drops the oldest beyond [`MAX_HELD`],
/// replaces the last-resort package when one is given; answers what is held now.
pub(super) fn publish(
    conn: &Connection,
    address: &str,
    packages: KeyPackageBatch,
    last_resort: Option<KeyPackage>,
    now_ms: u64,
) -> rusqlite::Result<Applied<KeyPackagesHeld>> {
    let now_ms = to_sql(now_ms);
    if !packages.is_empty() {
        let mut insert = conn.prepare_cached(
            "INSERT INTO key_packages (address, package, published_ms) VALUES (?1, ?2, ?3)",
        )?;
        for package in packages.as_slice() {
            insert.execute(params![address, package.as_bytes(), now_ms])?;
        }
        conn.prepare_cached(
            "DELETE FROM key_packages WHERE address = ?1 AND id <= (
                 SELECT id FROM key_packages WHERE address = ?1 ORDER BY id DESC
                 LIMIT 1 OFFSET ?2)",
        )?
        .execute(params![address, MAX_HELD])?;
    }
    if let Some(package) = last_resort {
        conn.prepare_cached(
            "INSERT INTO last_resort_key_packages (address, package, published_ms)
             VALUES (?1, ?2, ?3)
             ON CONFLICT (address) DO UPDATE SET package = excluded.package,
                                                 published_ms = excluded.published_ms",
        )?
        .execute(params![address, package.as_bytes(), now_ms])?;
    }
    let available: u32 = conn
        .prepare_cached("SELECT COUNT(*) FROM key_packages WHERE address = ?1")?
        .query_row([address], |r| r.get(0))?;
    let last_resort = conn
        .prepare_cached("SELECT 1 FROM last_resort_key_packages WHERE address = ?1")?
        .query_row([address], |_| Ok(()))
        .optional()?
        .is_some();
    Ok(Applied::value(KeyPackagesHeld {
        available,
        last_resort,
    }))
}

/// Takes the oldest one-time package of `address`, deleting it, or else reads its last-resort
/// package, which stays.
pub(super) fn take(
    conn: &Connection,
    address: &str,
) -> rusqlite::Result<Applied<Option<TakenKeyPackage>>> {
    let one_time: Option<Vec<u8>> = conn
        .prepare_cached(
            "DELETE FROM key_packages WHERE id = (
                 SELECT id FROM key_packages WHERE address = ?1 ORDER BY id LIMIT 1)
             RETURNING package",
        )?
        .query_row([address], |r| r.get(0))
        .optional()?;
    if let Some(bytes) = one_time {
        return Ok(Applied::value(Some(TakenKeyPackage {
            package: stored(bytes)?,
            last_resort: false,
        })));
    }
    let last_resort: Option<Vec<u8>> = conn
        .prepare_cached("SELECT package FROM last_resort_key_packages WHERE address = ?1")?
        .query_row([address], |r| r.get(0))
        .optional()?;
    let taken = last_resort
        .map(stored)
        .transpose()?
        .map(|package| TakenKeyPackage {
            package,
            last_resort: true,
        });
    Ok(Applied::value(taken))
}

/// A stored package, checked again on the way out: only what the decoder accepted was ever
/// written, so a failure here is a damaged database, reported rather than handed on.
fn stored(bytes: Vec<u8>) -> rusqlite::Result<KeyPackage> {
    KeyPackage::new(bytes)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(0, Type::Blob, Box::new(e)))
}
