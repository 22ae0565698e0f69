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

    // ---- sending ----------------------------------------------------------------------------

    /// `sendMedia`: a new transfer, the bytes of one that lost them, or a repeat (a no-op).
    /// Answers the file id; the caller answers the app once the step is committed.
    pub fn send(
        &mut self,
        cmd: SendMedia,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) -> Result<String, ClientError> {
        let file_id = cmd.file_id.clone().unwrap_or_else(super::mint_id);
        courier_proto::validate_identifier(&file_id)
            .map_err(|e| ClientError::InvalidArgument(format!("fileId {e}")))?;
        if cmd.size > self.config.max_file_size {
            return Err(ClientError::FileTooLarge(format!(
                "the file is {} bytes; media.maxFileSize is {}",
                cmd.size, self.config.max_file_size
            )));
        }
        cmd.details
            .check_size()
            .map_err(|e| ClientError::InvalidArgument(e.to_string()))?;
        if let Some(transfer) = self.outgoing.get_mut(&file_id) {
            if transfer.row.recipient != cmd.recipient {
                return Err(ClientError::InvalidArgument(format!(
                    "fileId {file_id} already names a transfer to {}",
                    transfer.row.recipient
                )));
            }
            if transfer.has_bytes() {
                return Ok(file_id);
            }
            let SendSource::Bytes(bytes) = cmd.source.clone() else {
                return Err(ClientError::InvalidArgument(format!(
                    "transfer {file_id} was sent from bytes: hand the same bytes over again"
                )));
            };
            if cmd.sha256 == transfer.row.sha256 && cmd.size == transfer.row.size {
                transfer.source = Source::Bytes(bytes);
                transfer.resubmit = transfer.in_flight.clone();
                self.pump(engine, step, now);
                return Ok(file_id);
            }
            // Other bytes under the same id: the transfer starts over as a new generation.
            let old = self.outgoing.remove(&file_id).expect("just found");
            self.forget_chunks(&old, engine, step, now);
            let mut row = old.row;
            row.generation += 1;
            self.start(row, cmd, SendSource::Bytes(bytes), engine, step, now);
            return Ok(file_id);
        }
        if let Some(row) = self.finished.get(&file_id) {
            if row.recipient != cmd.recipient {
                return Err(ClientError::InvalidArgument(format!(
                    "fileId {file_id} already names a transfer to {}",
                    row.recipient
                )));
            }
            if row.state == TransferState::Done {
                return Ok(file_id);
            }
        }
        if self.outgoing.len() >= self.config.max_outgoing {
            return Err(ClientError::MediaOutboxFull(format!(
                "{} transfers are unfinished; media.maxOutgoingTransfers is {}",
                self.outgoing.len(),
                self.config.max_outgoing
            )));
        }
        let chunk_size = if self.addressed {
            self.config.chunk_size
        } else {
            self.config.local_chunk_size
        };
        let count = ChunkHeader::chunk_count(cmd.size, chunk_size);
        if count > u64::from(MAX_CHUNKS) {
            return Err(ClientError::FileTooLarge(format!(
                "the file needs {count} chunks of {chunk_size} bytes; a transfer has at most \
                 {MAX_CHUNKS}"
            )));
        }
        let generation = self
            .finished
            .remove(&file_id)
            .map_or(0, |row| row.generation + 1);
        let row = OutgoingRow {
            file_id: file_id.clone(),
            recipient: cmd.recipient.clone(),
            source: SourceRow::Bytes,
            size: cmd.size,
            sha256: String::new(),
            chunk_size,
            count: count as u32,
            generation,
            next_index: 0,
            details: FileDetails::default(),
            state: TransferState::Active,
            created_at: now,
        };
        let source = cmd.source.clone();
        self.start(row, cmd, source, engine, step, now);
        Ok(file_id)
    }

    /// Starts `row` over from chunk 0 with `cmd`'s bytes and details.
    #[allow(clippy::too_many_arguments)]
    fn start(
        &mut self,
        mut row: OutgoingRow,
        cmd: SendMedia,
        source: SendSource,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) {
        let (source, source_row) = match source {
            SendSource::Path { path, modified_ms } => {
                let row = SourceRow::Path {
                    path: path.to_string_lossy().into_owned(),
                    modified_ms,
                };
                (Source::Path(path), row)
            }
            SendSource::Bytes(bytes) => (Source::Bytes(bytes), SourceRow::Bytes),
        };
        row.source = source_row;
        row.size = cmd.size;
        row.count = ChunkHeader::chunk_count(cmd.size, row.chunk_size) as u32;
        row.sha256 = cmd.sha256;
        row.details = cmd.details;
        row.next_index = 0;
        row.state = TransferState::Active;
        let file_id = row.file_id.clone();
        self.outgoing.insert(
            file_id.clone(),
            Outgoing::new(row, source, BTreeSet::new(), now),
        );
        self.dirty_out.insert(file_id);
        self.pump(engine, step, now);
    }

    /// Puts chunks in the outbox while windows and the media bound have room. Without an
    /// end-to-end session with the recipient a transfer's window is one chunk: that chunk waits
    /// in the pre-session queue, which asks for the session (and again, on presence and on its
    /// timer), and the rest follow once it exists.
    pub fn pump(&mut self, engine: &mut Engine, step: &mut Step<ClientEvent>, now: Millis) {
        for (file_id, transfer) in &mut self.outgoing {
            if !transfer.has_bytes() || transfer.complete() {
                continue;
            }
            let window = if engine.has_session(&transfer.row.recipient) {
                self.config.window
            } else {
                1
            };
            while engine.stats().outbox_media < self.capacity {
                let Some(index) = transfer.next_chunk(window) else {
                    break;
                };
                let id = transfer.chunk_id(index);
                let header =
                    serde_json::to_value(transfer.header(index)).expect("headers serialize");
                self.chunks.insert(id.clone(), (file_id.clone(), index));
                self.dirty_out.insert(file_id.clone());
                let request = SendRequest {
                    id,
                    settled: None,
                    recipient: transfer.row.recipient.clone(),
                    content: String::new(),
                    content_type: ContentType::FileChunk,
                    // Text goes first: a file waits a moment more, a message would not.
                    priority: Priority::Low,
                    metadata: BTreeMap::new(),
                    binary_content: None,
                    media: Some(header),
                    rich: Default::default(),
                };
                step.apply(engine, Input::Send(request), now);
            }
        }
    }

    /// What the engine reported of chunks since the last call.
    pub fn outcomes(&mut self, engine: &mut Engine, step: &mut Step<ClientEvent>, now: Millis) {
        self.sweep(engine, step, now);
        for (file_id, reason) in std::mem::take(&mut self.broken) {
            self.fail_outgoing(&file_id, reason, engine, step, now);
        }
        let mut moved = false;
        while let Some(outcome) = engine.poll_chunk() {
            let Some((file_id, index)) = self.chunks.remove(&outcome.id) else {
                continue;
            };
            match outcome.result {
                Ok(()) => {
                    moved = true;
                    self.acknowledged(&file_id, index, engine, step, now);
                }
                Err(reason) => {
                    let reason = format!("chunk {index}: {}", reason.as_str());
                    self.fail_outgoing(&file_id, reason, engine, step, now);
                }
            }
        }
        if moved {
            self.pump(engine, step, now);
        }
    }

    fn acknowledged(
        &mut self,
        file_id: &str,
        index: u32,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) {
        let Some(transfer) = self.outgoing.get_mut(file_id) else {
            return;
        };
        if !transfer.in_flight.remove(&index) {
            return;
        }
        transfer.resubmit.remove(&index);
        transfer.acked_bytes += transfer.len_of(index);
        let generation = transfer.row.generation;
        step.emit(
            engine,
            ClientEvent::Diagnostic {
                level: courier_engine::DiagnosticLevel::Debug,
                message: format!(
                    "file {file_id} generation {generation} chunk {index} acknowledged"
                ),
                target: "courier_client::media",
            },
        );
        let Some(transfer) = self.outgoing.get_mut(file_id) else {
            return;
        };
        self.dirty_out.insert(file_id.to_owned());
        let row = &transfer.row;
        if let Some(reading) =
            transfer
                .progress
                .due(transfer.acked_bytes, row.size, transfer.acked_chunks(), now)
        {
            step.emit(
                engine,
                ClientEvent::Media(Box::new(MediaEvent::Progress {
                    file_id: file_id.to_owned(),
                    direction: Direction::Outgoing,
                    peer: row.recipient.clone(),
                    total_bytes: row.size,
                    total_chunks: row.count,
                    reading,
                })),
            );
        }
        if transfer.complete() {
            let mut transfer = self.outgoing.remove(file_id).expect("just found");
            transfer.row.state = TransferState::Done;
            step.emit(
                engine,
                ClientEvent::Media(Box::new(MediaEvent::Delivered {
                    file_id: file_id.to_owned(),
                    recipient: transfer.row.recipient.clone(),
                    size: transfer.row.size,
                })),
            );
            self.finished.insert(file_id.to_owned(), transfer.row);
        }
    }

    fn fail_outgoing(
        &mut self,
        file_id: &str,
        reason: String,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) {
        let Some(transfer) = self.outgoing.remove(file_id) else {
            return;
        };
        self.forget_chunks(&transfer, engine, step, now);
        self.finish_failed(transfer.row, reason, engine, step);
    }

    /// An outgoing transfer's end without the file: `file_failed`, and its manifest kept.
    fn finish_failed(
        &mut self,
        mut row: OutgoingRow,
        reason: String,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
    ) {
        row.state = TransferState::Failed(reason.clone());
        step.emit(
            engine,
            ClientEvent::Media(Box::new(MediaEvent::Failed {
                file_id: row.file_id.clone(),
                direction: Direction::Outgoing,
                peer: row.recipient.clone(),
                reason,
            })),
        );
        self.dirty_out.insert(row.file_id.clone());
        self.finished.insert(row.file_id.clone(), row);
    }

    /// Withdraws a transfer's chunks from the engine, and from storage those the engine never
    /// had (withheld at start for want of bytes).
    fn forget_chunks(
        &mut self,
        transfer: &Outgoing,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) {
        let ids: Vec<String> = transfer
            .in_flight
            .iter()
            .map(|&i| transfer.chunk_id(i))
            .collect();
        for id in &ids {
            self.chunks.remove(id);
        }
        if transfer.has_bytes() {
            step.apply(engine, Input::CancelChunks { ids }, now);
        } else {
            self.dropped_chunks.extend(ids);
        }
    }

    /// A verified control frame: a file control from a transfer's recipient is handled here
    /// (true); anything else is not this module's (false).
    pub fn control(
        &mut self,
        message: &Message,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) -> bool {
        let control = match FileControl::parse(&message.content) {
            None => return false,
            Some(Ok(control)) => control,
            Some(Err(e)) => {
                let text = format!("a file control from {} not used: {e}", message.sender);
                step.emit(engine, media_warning(text));
                return true;
            }
        };
        let current = self.outgoing.get(&control.file_id).is_some_and(|t| {
            t.row.recipient == message.sender && t.row.generation == control.generation
        });
        if !current {
            // Another generation's, a finished transfer's, or not from its recipient.
            return true;
        }
        match control.action {
            FileAction::Refuse => {
                let reason = format!("the recipient refused it: {}", control.reason);
                self.fail_outgoing(&control.file_id, reason, engine, step, now);
            }
            FileAction::Restart => {
                self.restart(&control.file_id, &control.reason, engine, step, now)
            }
        }
        true
    }

    /// Starts a transfer over as a new generation, its source hashed again (a file that changed
    /// since is what usually makes a checksum fail).
    fn restart(
        &mut self,
        file_id: &str,
        why: &str,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) {
        let Some(old) = self.outgoing.remove(file_id) else {
            return;
        };
        self.forget_chunks(&old, engine, step, now);
        let Outgoing {
            mut row, source, ..
        } = old;
        self.dirty_out.insert(file_id.to_owned());
        if row.generation + 1 >= MAX_GENERATION {
            let reason = format!("the recipient received it damaged {MAX_GENERATION} times: {why}");
            self.finish_failed(row, reason, engine, step);
            return;
        }
        let hashed = match &source {
            Source::Path(path) => digest::file(path, None).map(Some),
            Source::Bytes(bytes) => Ok(Some((digest::bytes(bytes), bytes.len() as u64))),
            Source::Missing => Ok(None),
        };
        match hashed {
            Ok(Some((sha256, size))) if size <= self.config.max_file_size => {
                row.sha256 = sha256;
                row.size = size;
                row.count = ChunkHeader::chunk_count(size, row.chunk_size) as u32;
            }
            Ok(Some((_, size))) => {
                let reason = format!(
                    "the file is {size} bytes now; media.maxFileSize is {}",
                    self.config.max_file_size
                );
                self.finish_failed(row, reason, engine, step);
                return;
            }
            // Hashed when the app hands the bytes over again.
            Ok(None) => {}
            Err(e) => {
                self.finish_failed(row, format!("the file cannot be read: {e}"), engine, step);
                return;
            }
        }
        row.generation += 1;
        row.next_index = 0;
        step.emit(
            engine,
            media_warning(format!(
                "file {file_id}: sending it again as generation {} ({why})",
                row.generation
            )),
        );
        self.outgoing.insert(
            file_id.to_owned(),
            Outgoing::new(row, source, BTreeSet::new(), now),
        );
        self.pump(engine, step, now);
    }

    /// Fills in a chunk's bytes as it goes on a carrier; false when they cannot be read (the
    /// transfer fails in the next step, and the frame stays here).
    pub fn materialize(&mut self, message: &mut Message) -> bool {
        let Ok(header) = header_of(message) else {
            return true;
        };
        let Some(transfer) = self.outgoing.get(&header.file_id) else {
            // Ended meanwhile: its withdrawal is on its way to the engine.
            return false;
        };
        match transfer.read(header.index) {
            Ok(bytes) => {
                message.binary_content = Some(courier_proto::media::chunk_content(&bytes));
                self.sent.push(format!(
                    "file {} generation {} chunk {} goes out",
                    header.file_id, header.generation, header.index
                ));
                true
            }
            Err(e) => {
                let reason = format!("the file cannot be read: {e}");
                self.broken.push((header.file_id, reason));
                false
            }
        }
    }

    /// What `materialize` put on carriers since the last call, as diagnostic lines.
    pub fn take_sent(&mut self) -> Vec<String> {
        std::mem::take(&mut self.sent)
    }

    /// Whether the next step has work of this module's own.
    pub fn has_work(&self) -> bool {
        !self.broken.is_empty()
    }

    /// `forwardMessage` of a file this device received (`fileId` as `file_received` named it):
    /// the same file, from where it was put, to `to`, with its details and where it came from.
    /// `None` when no received file has that id.
    pub fn forward(
        &self,
        file_id: &str,
        to: String,
        new_id: Option<String>,
    ) -> Option<Result<SendMedia, ClientError>> {
        let row = self
            .received
            .values()
            .filter(|row| row.file_id == file_id && row.state == TransferState::Done)
            .max_by_key(|row| row.started_at)?;
        let path = PathBuf::from(row.path.as_deref()?);
        let modified_ms = match fs::metadata(&path) {
            Ok(meta) => meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64),
            Err(e) => {
                let e = format!("received file {file_id} at {}: {e}", path.display());
                return Some(Err(ClientError::FileUnreadable(e)));
            }
        };
        let mut details = row.details.clone().unwrap_or_default();
        let earlier = details
            .forwarded_from
            .take()
            .and_then(|v| serde_json::from_value::<ForwardInfo>(v).ok());
        let origin = match earlier {
            Some(origin) => ForwardInfo {
                forward_count: origin.forward_count.saturating_add(1),
                ..origin
            },
            None => ForwardInfo {
                message_id: row.file_id.clone(),
                sender: row.sender.clone(),
                timestamp: row.started_at,
                chat: Some(row.sender.clone()),
                forward_count: 1,
            },
        };
        details.forwarded_from =
            Some(serde_json::to_value(origin).expect("forward info serializes"));
        details.reply_to = None;
        Some(Ok(SendMedia {
            file_id: new_id,
            recipient: to,
            source: SendSource::Path { path, modified_ms },
            size: row.size,
            sha256: row.sha256.clone(),
            details,
        }))
    }

    // ---- receiving --------------------------------------------------------------------------

    /// An inbound chunk from `sender`, opened: written and held (the engine acknowledges it once
    /// this step commits), or refused with the reason (it is not acknowledged).
    pub fn receive(
        &mut self,
        message: &Message,
        sender: &str,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) -> Result<(), String> {
        let chunk = Chunk::read(message).map_err(|e| format!("a malformed file chunk: {e}"))?;
        let header = &chunk.header;
        let key = (sender.to_owned(), header.file_id.clone());
        if let Some(row) = self.received.get(&key) {
            return match &row.state {
                TransferState::Done if header.generation <= row.generation => Ok(()),
                TransferState::Failed(reason) if header.generation <= row.generation => {
                    Err(format!("transfer {} failed here: {reason}", header.file_id))
                }
                // A later generation: the sender started over.
                _ => {
                    self.received.remove(&key);
                    self.receive(message, sender, engine, step, now)
                }
            };
        }
        let stale = self
            .incoming
            .get(&key)
            .is_some_and(|a| a.row.generation > header.generation);
        if stale {
            // A chunk of a generation the sender abandoned: acknowledged so it stops.
            return Ok(());
        }
        let restarted = self
            .incoming
            .get(&key)
            .is_some_and(|a| a.row.generation < header.generation || !a.matches(header));
        if restarted {
            let old = self.incoming.remove(&key).expect("just found");
            self.removals.push(old.partial_path(&self.config.directory));
        }
        if !self.incoming.contains_key(&key) {
            self.admit(&key, header, engine, step, now)?;
        }
        let dir = self.config.directory.clone();
        let assembly = self.incoming.get_mut(&key).expect("admitted");
        if assembly.row.holds(header.index) {
            return Ok(());
        }
        let file = assembly
            .write(&dir, &chunk)
            .map_err(|e| format!("cannot write chunk {}: {e}", header.index))?;
        assembly.row.touched_at = now;
        self.to_sync.push(file);
        self.dirty_in.insert(key.clone());
        let row = &assembly.row;
        let (bytes, total, chunks) = (assembly.held_bytes(), row.size, row.held_count);
        if let Some(reading) = assembly.progress.due(bytes, total, chunks, now) {
            step.emit(
                engine,
                ClientEvent::Media(Box::new(MediaEvent::Progress {
                    file_id: row.file_id.clone(),
                    direction: Direction::Incoming,
                    peer: sender.to_owned(),
                    total_bytes: total,
                    total_chunks: row.count,
                    reading,
                })),
            );
        }
        if assembly.complete() {
            return self.finish(&key, engine, step, now);
        }
        Ok(())
    }

    /// Sends the sender of `header`'s transfer a file control.
    #[allow(clippy::too_many_arguments)]
    fn tell(
        &self,
        sender: &str,
        header: &ChunkHeader,
        action: FileAction,
        reason: &str,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) {
        if Address::parse(sender).is_err() {
            // Only an address can be answered with a signed frame; the sender's retries end it.
            return;
        }
        let control = FileControl {
            file_id: header.file_id.clone(),
            generation: header.generation,
            action,
            reason: reason.to_owned(),
        };
        let send = super::signed::control_request(
            &self.identity,
            &self.app_id,
            sender,
            control.content(),
            BTreeMap::new(),
            now,
        );
        step.apply(engine, Input::Send(send), now);
    }

    /// Gives up the incoming transfers no chunk reached for `media.stale_after_ms`: their partial
    /// files go, and each reports `file_failed`.
    fn sweep(&mut self, engine: &mut Engine, step: &mut Step<ClientEvent>, now: Millis) {
        if now < self.next_sweep {
            return;
        }
        self.next_sweep = now.saturating_add(SWEEP_EVERY_MS);
        let stale_after = self.config.stale_after_ms;
        let stale: Vec<(String, String)> = self
            .incoming
            .iter()
            .filter(|(_, a)| a.row.touched_at.max(a.row.started_at) + stale_after <= now)
            .map(|(key, _)| key.clone())
            .collect();
        for key in stale {
            let mut assembly = self.incoming.remove(&key).expect("just listed");
            self.removals
                .push(assembly.partial_path(&self.config.directory));
            let reason = format!("no chunk arrived for {} days", stale_after / 86_400_000);
            assembly.row.state = TransferState::Failed(reason.clone());
            step.emit(
                engine,
                ClientEvent::Media(Box::new(MediaEvent::Failed {
                    file_id: key.1.clone(),
                    direction: Direction::Incoming,
                    peer: key.0.clone(),
                    reason,
                })),
            );
            self.dirty_in.insert(key.clone());
            self.received.insert(key, assembly.row);
        }
    }

    /// Forgets finished transfers that started before `older_than` (storage prunes their rows).
    pub fn forget_before(&mut self, older_than: Millis) {
        self.finished.retain(|_, row| row.created_at >= older_than);
        self.received.retain(|_, row| row.started_at >= older_than);
    }

    /// A new incoming transfer, within the assembly bounds.
    fn admit(
        &mut self,
        key: &(String, String),
        header: &ChunkHeader,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) -> Result<(), String> {
        let from_sender = self.incoming.keys().filter(|(s, _)| *s == key.0).count();
        let buffered: u64 = self.incoming.values().map(|a| a.row.size).sum();
        let refusal = if header.size > self.config.max_file_size {
            Some(format!(
                "the file is {} bytes; media.maxFileSize is {}",
                header.size, self.config.max_file_size
            ))
        } else if self.incoming.len() >= self.config.max_incoming {
            Some(format!(
                "{} files are being received; media.maxIncomingTransfers is {}",
                self.incoming.len(),
                self.config.max_incoming
            ))
        } else if from_sender >= self.config.max_incoming_per_sender {
            Some(format!(
                "{from_sender} files from this sender are being received; \
                 media.maxIncomingPerSender is {}",
                self.config.max_incoming_per_sender
            ))
        } else if buffered.saturating_add(header.size) > self.config.max_incoming_bytes {
            Some(format!(
                "{buffered} bytes are being received; media.maxIncomingBytes is {}",
                self.config.max_incoming_bytes
            ))
        } else {
            None
        };
        if let Some(reason) = refusal {
            if self.refused.len() >= MAX_REFUSED {
                self.refused.clear();
            }
            if self.refused.insert(key.clone()) {
                self.tell(
                    &key.0,
                    header,
                    FileAction::Refuse,
                    &reason,
                    engine,
                    step,
                    now,
                );
                step.emit(
                    engine,
                    ClientEvent::Media(Box::new(MediaEvent::Failed {
                        file_id: key.1.clone(),
                        direction: Direction::Incoming,
                        peer: key.0.clone(),
                        reason: reason.clone(),
                    })),
                );
            }
            return Err(reason);
        }
        let assembly = Incoming::open(&self.config.directory, &key.0, header, now)
            .map_err(|e| format!("cannot open a partial file: {e}"))?;
        self.incoming.insert(key.clone(), assembly);
        self.dirty_in.insert(key.clone());
        Ok(())
    }

    /// Every chunk is held: the file is checked and takes its final name once this step commits.
    fn finish(
        &mut self,
        key: &(String, String),
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) -> Result<(), String> {
        let dir = self.config.directory.clone();
        let mut assembly = self.incoming.remove(key).expect("complete");
        let partial = assembly.partial_path(&dir);
        let good = assembly
            .verify(&dir)
            .map_err(|e| format!("cannot read the partial file back: {e}"))?;
        self.dirty_in.insert(key.clone());
        if !good {
            // The last chunk is not acknowledged; the sender hears why and starts over, or —
            // after too many tries — stops.
            let reason = "the file's SHA-256 does not match the sender's".to_owned();
            let row = &assembly.row;
            let header = ChunkHeader {
                file_id: row.file_id.clone(),
                generation: row.generation,
                index: 0,
                count: row.count,
                size: row.size,
                chunk_size: row.chunk_size,
                sha256: row.sha256.clone(),
                details: None,
            };
            let again = row.generation + 1 < MAX_GENERATION;
            let action = if again {
                FileAction::Restart
            } else {
                FileAction::Refuse
            };
            self.tell(&key.0, &header, action, &reason, engine, step, now);
            assembly.row.state = TransferState::Failed(reason.clone());
            self.removals.push(partial);
            let event = if again {
                ClientEvent::Diagnostic {
                    level: courier_engine::DiagnosticLevel::Warn,
                    message: format!(
                        "file {} from {}: {reason}; asked the sender to send it again",
                        key.1, key.0
                    ),
                    target: "courier_client::media",
                }
            } else {
                ClientEvent::Media(Box::new(MediaEvent::Failed {
                    file_id: key.1.clone(),
                    direction: Direction::Incoming,
                    peer: key.0.clone(),
                    reason: reason.clone(),
                }))
            };
            step.emit(engine, event);
            self.received.insert(key.clone(), assembly.row);
            return Err(reason);
        }
        let details = assembly.row.details.clone().unwrap_or_default();
        let taken: Vec<PathBuf> = self.renames.iter().map(|(_, to)| to.clone()).collect();
        let path = incoming::final_path(&dir, details.file_name.as_deref(), &key.1, &taken);
        self.renames.push((partial, path.clone()));
        let row = &mut assembly.row;
        row.path = Some(path.to_string_lossy().into_owned());
        row.state = TransferState::Done;
        let received = event::Received {
            file_id: key.1.clone(),
            sender: key.0.clone(),
            path: path.to_string_lossy().into_owned(),
            file_name: details.file_name,
            mime_type: details.mime_type,
            size: row.size,
            sha256: row.sha256.clone(),
            caption: details.caption,
            metadata: details.metadata,
            reply_to: details.reply_to,
            // A peer's malformed forward info is left out; the file is still the file.
            forwarded_from: details
                .forwarded_from
                .and_then(|v| serde_json::from_value(v).ok()),
        };
        step.emit(
            engine,
            ClientEvent::Media(Box::new(MediaEvent::Received(Box::new(received)))),
        );
        self.received.insert(key.clone(), assembly.row);
        Ok(())
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
