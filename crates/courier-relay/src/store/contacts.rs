//! Contacts for `--presence-visibility contacts` (`docs/protocol.md#presence-visibility`): the
//! pairs of accounts that exchanged a message, and whom an account shares a group with.

use rusqlite::{params, Connection};

use super::worker::Applied;

/// Records the pair (its smaller name first); a pair already known is left alone.
pub(super) fn record(conn: &Connection, a: &str, b: &str) -> rusqlite::Result<Applied<()>> {
    let (a, b) = if a <= b { (a, b) } else { (b, a) };
    conn.prepare_cached("INSERT OR IGNORE INTO contacts (a, b) VALUES (?1, ?2)")?
        .execute(params![a, b])?;
    Ok(Applied::value(()))
}

/// Every recorded pair, read once at open.
pub(super) fn load(conn: &Connection) -> rusqlite::Result<Vec<(String, String)>> {
    let mut stmt = conn.prepare("SELECT a, b FROM contacts")?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

/// Every member identifier of every group one of `identities` is a member of (themselves
/// included).
pub(super) fn group_peers(
    conn: &Connection,
    identities: &[String],
) -> rusqlite::Result<Applied<Vec<String>>> {
    let mut stmt = conn.prepare_cached(
        "SELECT DISTINCT peer.member FROM group_members AS mine
         JOIN group_members AS peer ON peer.group_id = mine.group_id
         WHERE mine.member = ?1",
    )?;
    let mut peers = Vec::new();
    for identity in identities {
        let rows = stmt.query_map([identity], |r| r.get::<_, String>(0))?;
        for row in rows {
            peers.push(row?);
        }
    }
    Ok(Applied::value(peers))
}
