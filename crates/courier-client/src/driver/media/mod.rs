//! File transfers (`docs/delivery.md#file-transfers`): the runtime side of media. Sending, a
//! transfer feeds its chunks to the engine through a window — each an outbox entry with its own
//! ACK — and reads their bytes only when they go on a carrier; the engine reports each chunk's
//! outcome back (`Engine::poll_chunk`). Receiving, a chunk's bytes are written to the partial
//! file and synced before the engine acknowledges it; the last one is checked against the
//! file's SHA-256 and the file takes its final name. Both manifests are durable, so a transfer
//! resumes after a crash or a restart where it stood.

mod digest;
pub mod event;
mod incoming;
mod outgoing;
mod progress;
mod receiving;
mod sending;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use courier_engine::step::Step;
use courier_engine::{Engine, Input, Millis, OutboxRecord, SendRequest};
use courier_proto::media::{header_of, MAX_CHUNKS};
use courier_proto::rich::ForwardInfo;
use courier_proto::{
    Address, Chunk, ChunkHeader, ContentType, FileAction, FileControl, FileDetails, IdentityKey,
    Message, Priority,
};

use crate::config::media::MediaConfig;
use crate::error::ClientError;
use crate::event::ClientEvent;
use crate::store::media::{IncomingRow, MediaChange, OutgoingRow, SourceRow, TransferState};
use crate::store::{Store, StoreError};

pub use digest::{bytes as sha256_bytes, file as sha256_file};
pub use event::{Direction, MediaEvent};
use incoming::Incoming;
use outgoing::{Outgoing, Source};

/// `sendMedia`, its source hashed already (off the driver thread).
#[derive(Debug, Clone)]
pub struct SendMedia {
    pub file_id: Option<String>,
    pub recipient: String,
    pub source: SendSource,
    pub size: u64,
    pub sha256: String,
    pub details: FileDetails,
}

#[derive(Debug, Clone)]
pub enum SendSource {
    Path { path: PathBuf, modified_ms: u64 },
    Bytes(Arc<Vec<u8>>),
}

/// Refusals of new incoming transfers remembered, so each is reported once.
const MAX_REFUSED: usize = 1024;
/// A transfer starts over at most this many times (a checksum that did not match each time):
/// a file that keeps arriving damaged fails.
const MAX_GENERATION: u32 = 3;

pub struct Media {
    config: MediaConfig,
    /// Signs the file controls this device sends as a receiver.
    identity: IdentityKey,
    app_id: String,
    /// A relay or gateway is configured: transfers use the larger chunk size.
    addressed: bool,
    /// The engine's media bound: chunks in the outbox at once, all transfers together.
    capacity: usize,
    outgoing: BTreeMap<String, Outgoing>,
    /// Finished outgoing transfers (a repeated `fileId` is answered from them).
    finished: HashMap<String, OutgoingRow>,
    /// Each chunk in flight: its transfer and index.
    chunks: HashMap<String, (String, u32)>,
    incoming: HashMap<(String, String), Incoming>,
    /// Finished incoming transfers: a late repeat of a chunk is acknowledged, not reassembled.
    received: HashMap<(String, String), IncomingRow>,
    refused: HashSet<(String, String)>,
    dirty_out: BTreeSet<String>,
    dirty_in: BTreeSet<(String, String)>,
    /// Outbox rows of chunks whose bytes are gone for good (their transfer ended or restarted).
    dropped_chunks: Vec<String>,
    /// Partial files written this step: synced before it commits.
    to_sync: Vec<File>,
    /// Renames (and removals) that follow this step's commit.
    renames: Vec<(PathBuf, PathBuf)>,
    removals: Vec<PathBuf>,
    /// Transfers whose chunk could not be read when it went out: failed in the next step.
    broken: Vec<(String, String)>,
    /// The chunks put on a carrier in this step, for a debug diagnostic each.
    sent: Vec<String>,
    /// When stale incoming transfers are looked for next.
    next_sweep: Millis,
}

/// Stale incoming transfers are looked for at most this often.
const SWEEP_EVERY_MS: Millis = 3_600_000;

/// What a start found: the transfers, and the events to report at once.
pub struct Restored {
    pub media: Media,
    pub events: Vec<MediaEvent>,
}

impl Media {
    /// The transfers storage holds. `records` is the outbox as stored: which chunks are still
    /// out.
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        store: &Store,
        config: MediaConfig,
        identity: IdentityKey,
        app_id: String,
        addressed: bool,
        capacity: usize,
        records: &[OutboxRecord],
        now: Millis,
    ) -> Result<Restored, StoreError> {
        let (out_rows, in_rows) = store.load_media()?;
        let mut media = Self {
            config,
            identity,
            app_id,
            addressed,
            capacity,
            outgoing: BTreeMap::new(),
            finished: HashMap::new(),
            chunks: HashMap::new(),
            incoming: HashMap::new(),
            received: HashMap::new(),
            refused: HashSet::new(),
            dirty_out: BTreeSet::new(),
            dirty_in: BTreeSet::new(),
            dropped_chunks: Vec::new(),
            to_sync: Vec::new(),
            renames: Vec::new(),
            removals: Vec::new(),
            broken: Vec::new(),
            sent: Vec::new(),
            next_sweep: 0,
        };
        let mut out_chunks: HashMap<String, BTreeSet<u32>> = HashMap::new();
        for record in records {
            if let Ok(header) = header_of(&record.message) {
                out_chunks
                    .entry(header.file_id)
                    .or_default()
                    .insert(header.index);
            }
        }
        let mut events = Vec::new();
        for row in out_rows {
            if row.state != TransferState::Active {
                media.finished.insert(row.file_id.clone(), row);
                continue;
            }
            let in_flight = out_chunks.remove(&row.file_id).unwrap_or_default();
            let source = match &row.source {
                SourceRow::Path { path, .. } => Source::Path(PathBuf::from(path)),
                SourceRow::Bytes => {
                    events.push(MediaEvent::ResendRequired {
                        file_id: row.file_id.clone(),
                        recipient: row.recipient.clone(),
                        file_name: row.details.file_name.clone(),
                        file_size: row.size,
                    });
                    Source::Missing
                }
            };
            let transfer = Outgoing::new(row, source, in_flight, now);
            for &index in &transfer.in_flight {
                media.chunks.insert(
                    transfer.chunk_id(index),
                    (transfer.row.file_id.clone(), index),
                );
            }
            media
                .outgoing
                .insert(transfer.row.file_id.clone(), transfer);
        }
        for row in in_rows {
            let key = (row.sender.clone(), row.file_id.clone());
            if row.state == TransferState::Active {
                media.incoming.insert(key, Incoming::resumed(row, now));
            } else {
                media.recover_rename(&row);
                media.received.insert(key, row);
            }
        }
        Ok(Restored { media, events })
    }

    /// A file checked and committed under its final name whose rename a crash cut off.
    fn recover_rename(&self, row: &IncomingRow) {
        let (TransferState::Done, Some(path)) = (&row.state, &row.path) else {
            return;
        };
        let partial = self
            .config
            .directory
            .join(incoming::PARTIAL_DIR)
            .join(&row.partial);
        if partial.exists() && !Path::new(path).exists() {
            let _ = fs::rename(&partial, path);
        }
    }

    /// Transfers whose chunks stay out of the engine at start: their bytes are gone.
    pub fn withheld(&self) -> HashSet<String> {
        self.outgoing
            .iter()
            .filter(|(_, t)| !t.has_bytes())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// After a failed commit: storage's state again, keeping the bytes apps handed over.
    pub fn rollback(
        &mut self,
        store: &Store,
        records: &[OutboxRecord],
        now: Millis,
    ) -> Result<(), StoreError> {
        let restored = Self::restore(
            store,
            self.config.clone(),
            self.identity.clone(),
            self.app_id.clone(),
            self.addressed,
            self.capacity,
            records,
            now,
        )?;
        let mut media = restored.media;
        for (id, transfer) in &mut media.outgoing {
            if let Some(Source::Bytes(bytes)) = self.outgoing.get(id).map(|t| &t.source) {
                if matches!(transfer.source, Source::Missing) {
                    transfer.source = Source::Bytes(bytes.clone());
                }
            }
        }
        *self = media;
        Ok(())
    }

    pub fn config(&self) -> &MediaConfig {
        &self.config
    }

    // ---- the step's commit ------------------------------------------------------------------

    /// Syncs the partial files written this step: their chunks are acknowledged after the commit.
    pub fn sync(&mut self) -> std::io::Result<()> {
        for file in self.to_sync.drain(..) {
            file.sync_data()?;
        }
        Ok(())
    }

    /// The manifests this step changed, and the chunk rows to drop.
    pub fn changes(&self) -> Vec<MediaChange> {
        let mut changes = Vec::new();
        for id in &self.dirty_out {
            let row = self
                .outgoing
                .get(id)
                .map(|t| &t.row)
                .or_else(|| self.finished.get(id));
            if let Some(row) = row {
                changes.push(MediaChange::Outgoing(row.clone()));
            }
        }
        for key in &self.dirty_in {
            let row = self
                .incoming
                .get(key)
                .map(|a| &a.row)
                .or_else(|| self.received.get(key));
            if let Some(row) = row {
                changes.push(MediaChange::Incoming(row.clone()));
            }
        }
        if !self.dropped_chunks.is_empty() {
            changes.push(MediaChange::DropChunks(self.dropped_chunks.clone()));
        }
        changes
    }

    /// The step is durable: complete files take their final names (the directory synced so
    /// the name survives a crash), abandoned partial files go.
    pub fn committed(&mut self) -> Vec<String> {
        self.dirty_out.clear();
        self.dirty_in.clear();
        self.dropped_chunks.clear();
        let mut problems = Vec::new();
        let renamed = !self.renames.is_empty();
        for (from, to) in self.renames.drain(..) {
            if let Err(e) = fs::rename(&from, &to) {
                problems.push(format!(
                    "cannot move {} to {}: {e}",
                    from.display(),
                    to.display()
                ));
            }
        }
        if renamed || !self.removals.is_empty() {
            // A name is durable once its directory is synced; only a step that changed one pays.
            if let Ok(dir) = File::open(&self.config.directory) {
                let _ = dir.sync_all();
            }
        }
        for path in self.removals.drain(..) {
            let _ = fs::remove_file(path);
        }
        problems
    }
}

fn media_warning(message: String) -> ClientEvent {
    ClientEvent::Diagnostic {
        level: courier_engine::DiagnosticLevel::Warn,
        message,
        target: "courier_client::media",
    }
}

#[cfg(test)]
mod tests {
    use courier_engine::Config;

    use super::*;

    const DAY: Millis = 86_400_000;

    fn media(dir: &Path) -> Media {
        let store = Store::open_memory().unwrap();
        let config = MediaConfig::new(dir.to_path_buf());
        let identity = IdentityKey::from_seed([3; 32]);
        Media::restore(&store, config, identity, "test".into(), true, 100, &[], 0)
            .unwrap()
            .media
    }

    /// Chunk `index` of a 4-chunk, 4 KiB file from bob.
    fn chunk(index: u32) -> Message {
        let header = ChunkHeader {
            file_id: "f1".into(),
            generation: 0,
            index,
            count: 4,
            size: 4096,
            chunk_size: 1024,
            sha256: "0".repeat(64),
            details: None,
        };
        let mut message = courier_proto::control_frame(
            courier_proto::file_chunk_id("f1", 0, index),
            "test",
            "bob",
            "alice",
            String::new(),
            0,
        );
        message.content_type = ContentType::FileChunk;
        message.media_metadata = Some(serde_json::to_value(header).unwrap());
        message.binary_content = Some(courier_proto::media::chunk_content(&[7; 1024]));
        message
    }

    #[test]
    fn a_file_no_chunk_reaches_for_the_stale_time_is_given_up() {
        let dir = tempfile::tempdir().unwrap();
        let mut media = media(dir.path());
        let mut engine = Engine::new(Config::new("test"), "alice".into());
        let mut step = Step::default();
        let start = 10 * DAY;
        media
            .receive(&chunk(1), "bob", &mut engine, &mut step, start)
            .expect("the first chunk opens the assembly");
        media.sync().unwrap();
        media.committed();
        let partial = media
            .incoming
            .values()
            .next()
            .unwrap()
            .partial_path(dir.path());
        assert!(partial.exists());

        // A day short of stale: kept.
        media.outcomes(&mut engine, &mut step, start + 27 * DAY);
        assert_eq!(media.incoming.len(), 1);
        // An hour's sweep later, past the stale time: given up, its partial file removed.
        media.outcomes(&mut engine, &mut step, start + 28 * DAY + SWEEP_EVERY_MS);
        assert!(media.incoming.is_empty());
        let changes = media.changes();
        assert!(changes.iter().any(|c| matches!(
            c,
            MediaChange::Incoming(row) if matches!(row.state, TransferState::Failed(_))
        )));
        media.committed();
        assert!(!partial.exists());
        // A late chunk of it is refused, not assembled again.
        assert!(media
            .receive(&chunk(2), "bob", &mut engine, &mut step, start + 29 * DAY)
            .is_err());
    }
}
