//! The pipeline's row bookkeeping: inserting and placing rows, batches closing, groups of
//! refused rows, removal and expiry, and the drain's progress.

use super::*;

impl HookPipeline {
    pub(super) fn batch_max_messages(&self) -> usize {
        self.config.batch_max_messages.max(1)
    }

    pub(super) fn age_deadline(&self, open: &Open) -> Millis {
        open.first_at.saturating_add(self.config.batch_max_age_ms)
    }

    pub(super) fn expires_at(&self, received_at: Millis) -> Millis {
        received_at.saturating_add(self.config.retention_ms)
    }

    /// `retry_initial_ms × 2^(refusals − 1)`, at most `retry_max_ms`.
    pub(super) fn retry_delay(&self, refusals: u32) -> Millis {
        let factor = 1u64
            .checked_shl(refusals.saturating_sub(1))
            .unwrap_or(u64::MAX);
        self.config
            .retry_initial_ms
            .saturating_mul(factor)
            .min(self.config.retry_max_ms)
    }

    pub(super) fn insert(&mut self, pending: PendingInbound, bytes: usize) -> RowId {
        self.next_row += 1;
        let id = self.next_row;
        self.index.insert(pending.key.clone(), id);
        self.expiries
            .insert((self.expires_at(pending.received_at), id));
        self.bytes = self.bytes.saturating_add(bytes);
        self.rows.insert(
            id,
            Row {
                pending,
                bytes,
                seqs: Vec::new(),
                refusals: 0,
                place: Place::Ready,
            },
        );
        id
    }

    /// Puts a row that is in no batch into the open drain batch (arrived on the draining
    /// carrier) or into a ready batch of one.
    pub(super) fn place(&mut self, id: RowId, origin: BatchOrigin, carrier: &Carrier, now: Millis) {
        if self.draining.as_ref() != Some(carrier) {
            self.rows.get_mut(&id).expect("row").place = Place::Ready;
            self.ready.push_back(vec![(id, origin)]);
            return;
        }
        let bytes = self.rows[&id].bytes;
        let max_bytes = self.config.batch_max_bytes;
        if self
            .open
            .as_ref()
            .is_some_and(|open| open.bytes.saturating_add(bytes) > max_bytes)
        {
            self.close_open();
        }
        let open = self.open.get_or_insert_with(|| Open {
            members: Vec::new(),
            bytes: 0,
            first_at: now,
        });
        open.members.push((id, origin));
        open.bytes = open.bytes.saturating_add(bytes);
        let full =
            open.members.len() >= self.config.batch_max_messages.max(1) || open.bytes >= max_bytes;
        self.rows.get_mut(&id).expect("row").place = Place::Open;
        if full {
            self.close_open();
        }
    }

    pub(super) fn close_open(&mut self) {
        let Some(open) = self.open.take() else {
            return;
        };
        for (id, _) in &open.members {
            self.rows.get_mut(id).expect("open row").place = Place::Ready;
        }
        self.ready.push_back(open.members);
    }

    pub(super) fn leave_group(&mut self, group: Group, id: RowId) {
        if let Some(ids) = self.waiting.get_mut(&group) {
            ids.retain(|&other| other != id);
            if ids.is_empty() {
                self.waiting.remove(&group);
            }
        }
    }

    /// Takes a row out of the pipeline and every index.
    pub(super) fn remove(&mut self, id: RowId) -> Row {
        let row = self.rows.remove(&id).expect("row to remove");
        self.index.remove(&row.pending.key);
        self.bytes = self.bytes.saturating_sub(row.bytes);
        self.expiries
            .remove(&(self.expires_at(row.pending.received_at), id));
        match row.place {
            Place::Open => {
                if let Some(open) = self.open.as_mut() {
                    open.members.retain(|(other, _)| *other != id);
                    open.bytes = open.bytes.saturating_sub(row.bytes);
                    if open.members.is_empty() {
                        self.open = None;
                    }
                }
            }
            Place::Ready => {
                for batch in &mut self.ready {
                    batch.retain(|(other, _)| *other != id);
                }
                self.ready.retain(|batch| !batch.is_empty());
            }
            Place::Waiting(group) => self.leave_group(group, id),
            Place::WithHook => {}
        }
        let below = self.rows.len() < self.config.max_buffered_messages
            && self.bytes < self.config.max_buffered_bytes;
        if below {
            self.full_reported = false;
        }
        row
    }

    /// Rows past retention: removed with a trace (`docs/delivery.md#retention`), their seqs
    /// released (a drop). A row with the hook has no retention deadline indexed: the verdict
    /// decides it.
    pub(super) fn expire(&mut self, ids: Vec<RowId>, sink: &mut Sink<'_>) {
        let gone: Vec<Row> = ids.into_iter().map(|id| self.remove(id)).collect();
        if gone.is_empty() {
            return;
        }
        let keys = gone.iter().map(|row| row.pending.key.clone()).collect();
        sink.store.push_back(StoreOp::ExpireInbound { keys });
        let mut seqs = Vec::new();
        for row in &gone {
            report_expiry(&row.pending, self.config.retention_ms, sink);
            seqs.extend_from_slice(&row.seqs);
        }
        seqs.sort_unstable();
        seqs.dedup();
        release_frames(&seqs, sink);
        self.drain_progress(sink);
    }

    pub(super) fn drain_progress(&mut self, sink: &mut Sink<'_>) {
        let rows = &self.rows;
        while let Some(wait) = self.drain_waits.front_mut() {
            wait.outstanding.retain(|id| rows.contains_key(id));
            if !wait.outstanding.is_empty() {
                break;
            }
            sink.events
                .push_back(Event::InboundDrainCompleted { count: wait.count });
            self.drain_waits.pop_front();
        }
    }
}

/// Releases the relay journal frames `seqs`: the frames carried messages now committed or dropped.
pub(super) fn release_frames(seqs: &[u64], sink: &mut Sink<'_>) {
    for &seq in seqs {
        sink.transmits.push_back(Transmit {
            carrier: Carrier::Relay,
            peer: None,
            kind: TransmitKind::ReleaseFrame { seq },
        });
    }
}

pub(super) fn report_expiry(pending: &PendingInbound, retention_ms: Millis, sink: &mut Sink<'_>) {
    let InboundKey {
        chat,
        sender,
        message_id,
    } = &pending.key;
    let text = format!(
        "inbound message {message_id} from {sender} in chat {chat} removed from the durability \
         buffer: not committed by the hook within {} h of its arrival",
        retention_ms / 3_600_000
    );
    sink.events.push_back(Event::Diagnostic {
        level: DiagnosticLevel::Warn,
        message: text,
    });
    sink.events.push_back(Event::SecurityWarning {
        peer_id: sender.clone(),
        reason_code: RETENTION_EXPIRED,
        reason: RETENTION_EXPIRED_TEXT.to_owned(),
    });
}

/// Content bytes of a message: what the batch's 4 MiB and the buffer's bound count, as the
/// relay's mailbox counts them.
pub(crate) fn content_bytes(message: &Message) -> usize {
    let binary = match &message.binary_content {
        None => 0,
        Some(Value::String(s)) => s.len(),
        Some(other) => other.to_string().len(),
    };
    message.content.len().saturating_add(binary)
}
