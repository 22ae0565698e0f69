//! The sending side of file transfers (`docs/delivery.md#sending-a-file`): accepting a
//! `sendMedia`, feeding chunks through the window, following their outcomes, the receiver's file
//! controls, reading a chunk's bytes as it goes, and forwarding a received file.

use super::*;

impl Media {
    /// `sendMedia`: a new transfer, the bytes of one that lost them, or a repeat (a no-op).
    /// Answers the file id; the caller answers the app once the step is committed.
    pub fn send(
        &mut self,
        cmd: SendMedia,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) -> Result<String, ClientError> {
        let file_id = cmd.file_id.clone().unwrap_or_else(crate::driver::mint_id);
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
}
