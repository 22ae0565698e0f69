//! The receiving side of file transfers (`docs/delivery.md#receiving-files`): the assembly
//! bounds, writing chunks, the checksum and the final name, the controls sent back to a sender,
//! and giving up stale assemblies.

use super::*;

impl Media {
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

    /// Sends `sender` a file control about its transfer (file id, generation).
    #[allow(clippy::too_many_arguments)]
    fn tell(
        &self,
        sender: &str,
        (file_id, generation): (&str, u32),
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
            file_id: file_id.to_owned(),
            generation,
            action,
            reason: reason.to_owned(),
        };
        let send = crate::driver::signed::control_request(
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
    pub(super) fn sweep(&mut self, engine: &mut Engine, step: &mut Step<ClientEvent>, now: Millis) {
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
            step.emit(engine, incoming_failed(&key, reason));
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
                    (&header.file_id, header.generation),
                    FileAction::Refuse,
                    &reason,
                    engine,
                    step,
                    now,
                );
                step.emit(engine, incoming_failed(key, reason.clone()));
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
            let generation = assembly.row.generation;
            let again = generation + 1 < MAX_GENERATION;
            let action = if again {
                FileAction::Restart
            } else {
                FileAction::Refuse
            };
            let transfer = (key.1.as_str(), generation);
            self.tell(&key.0, transfer, action, &reason, engine, step, now);
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
                incoming_failed(key, reason.clone())
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
}

/// `file_failed` of the incoming transfer `key` (sender, file id).
fn incoming_failed(key: &(String, String), reason: String) -> ClientEvent {
    ClientEvent::Media(Box::new(MediaEvent::Failed {
        file_id: key.1.clone(),
        direction: Direction::Incoming,
        peer: key.0.clone(),
        reason,
    }))
}
