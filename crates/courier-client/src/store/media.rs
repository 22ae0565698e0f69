//! File transfers (`docs/delivery.md#file-transfers`): each outgoing transfer's manifest (what
//! it sends, where from, how far it got) and each incoming one's (which chunks are held, where
//! the file goes), written with the step that changed them. A row is JSON beside the columns
//! that select it, so the manifest can grow without a migration per field.

use courier_engine::Millis;
use courier_proto::FileDetails;
use rusqlite::{params, Connection};
use serde::{Deserialize, Serialize};

use super::{to_db, StoreError};

/// Where an outgoing transfer reads its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SourceRow {
    /// A file the transfer reads from on its own, after any restart; `modified_ms` and the size
    /// say whether it is still the file that was hashed.
    Path { path: String, modified_ms: u64 },
    /// Bytes the application handed over; after a restart it must hand them over again.
    Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "reason")]
pub enum TransferState {
    Active,
    Done,
    Failed(String),
}

impl TransferState {
    fn column(&self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Done => "done",
            Self::Failed(_) => "failed",
        }
    }
}

/// An outgoing transfer's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutgoingRow {
    pub file_id: String,
    pub recipient: String,
    pub source: SourceRow,
    pub size: u64,
    pub sha256: String,
    pub chunk_size: u32,
    pub count: u32,
    pub generation: u32,
    /// Chunks `0..next_index` were submitted; each one not in the outbox any more was
    /// acknowledged (a failed chunk fails the whole transfer).
    pub next_index: u32,
    pub details: FileDetails,
    pub state: TransferState,
    pub created_at: Millis,
}

/// An incoming transfer's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncomingRow {
    pub sender: String,
    pub file_id: String,
    pub generation: u32,
    pub size: u64,
    pub chunk_size: u32,
    pub count: u32,
    pub sha256: String,
    /// From chunk 0, once it came.
    pub details: Option<FileDetails>,
    /// One bit per chunk held (written and synced before its ACK).
    pub held: Vec<u8>,
    pub held_count: u32,
    /// The partial file's name in the media directory's `.partial` folder.
    pub partial: String,
    /// The final path, chosen when the file was complete and checked.
    pub path: Option<String>,
    pub state: TransferState,
    pub started_at: Millis,
    /// When a chunk last arrived.
    #[serde(default)]
    pub touched_at: Millis,
}

impl IncomingRow {
    pub fn holds(&self, index: u32) -> bool {
        let (byte, bit) = (index as usize / 8, index % 8);
        self.held.get(byte).is_some_and(|b| b & (1 << bit) != 0)
    }

    pub fn hold(&mut self, index: u32) {
        let (byte, bit) = (index as usize / 8, index % 8);
        if self.held.len() <= byte {
            self.held.resize(byte + 1, 0);
        }
        if self.held[byte] & (1 << bit) == 0 {
            self.held[byte] |= 1 << bit;
            self.held_count += 1;
        }
    }
}

/// A change to the manifests, committed with the step that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaChange {
    Outgoing(OutgoingRow),
    Incoming(IncomingRow),
    /// Outbox rows of chunks whose bytes are gone for good.
    DropChunks(Vec<String>),
}

pub(crate) fn apply(
    conn: &Connection,
    changes: &[MediaChange],
    now: Millis,
) -> Result<(), StoreError> {
    for change in changes {
        match change {
            MediaChange::Outgoing(row) => {
                conn.prepare_cached(
                    "INSERT INTO media_out (file_id, state, row_json, updated_at)
                     VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (file_id) DO UPDATE SET
                         state = excluded.state, row_json = excluded.row_json,
                         updated_at = excluded.updated_at",
                )?
                .execute(params![
                    row.file_id,
                    row.state.column(),
                    serde_json::to_string(row).expect("rows serialize"),
                    to_db(now)
                ])?;
            }
            MediaChange::Incoming(row) => {
                conn.prepare_cached(
                    "INSERT INTO media_in (sender, file_id, state, row_json, updated_at)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (sender, file_id) DO UPDATE SET
                         state = excluded.state, row_json = excluded.row_json,
                         updated_at = excluded.updated_at",
                )?
                .execute(params![
                    row.sender,
                    row.file_id,
                    row.state.column(),
                    serde_json::to_string(row).expect("rows serialize"),
                    to_db(now)
                ])?;
            }
            MediaChange::DropChunks(ids) => {
                let mut delete = conn.prepare_cached("DELETE FROM outbox WHERE id = ?1")?;
                for id in ids {
                    delete.execute([id])?;
                }
            }
        }
    }
    Ok(())
}

fn load<T: for<'de> Deserialize<'de>>(conn: &Connection, sql: &str) -> Result<Vec<T>, StoreError> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt.query_map([], |row| row.get::<_, String>(0))?;
    let mut out = Vec::new();
    for json in rows {
        let json = json?;
        out.push(
            serde_json::from_str(&json)
                .map_err(|e| StoreError::Corrupt(format!("a media manifest: {e}")))?,
        );
    }
    Ok(out)
}

/// Forgets the manifests of transfers that ended before `older_than`; returns how many.
pub(crate) fn prune(conn: &Connection, older_than: Millis) -> Result<usize, StoreError> {
    let mut n = 0;
    for table in ["media_out", "media_in"] {
        n += conn.execute(
            &format!("DELETE FROM {table} WHERE state != 'active' AND updated_at < ?1"),
            [to_db(older_than)],
        )?;
    }
    Ok(n)
}

/// Every outgoing manifest, finished ones included (a repeated `fileId` is answered from them).
pub(crate) fn load_outgoing(conn: &Connection) -> Result<Vec<OutgoingRow>, StoreError> {
    load(conn, "SELECT row_json FROM media_out")
}

pub(crate) fn load_incoming(conn: &Connection) -> Result<Vec<IncomingRow>, StoreError> {
    load(conn, "SELECT row_json FROM media_in")
}
