//! Bookkeeping: admitting, re-phasing, parking flags, removal, capacity eviction, settlement
//! and the events that report them; `end_call` turns each call's changes into store ops.

use super::*;

impl Engine {
    pub(super) fn admit(&mut self, entry: Entry) -> Key {
        let (priority, parked) = (entry.message.priority, entry.park.is_some());
        let phase = entry.phase.clone();
        let held_for = parked.then(|| entry.message.recipient.clone());
        let key = self.outbox.insert(entry);
        self.timers.arm(key, priority, parked, &phase);
        if let Some(recipient) = held_for {
            self.parking.hold(&recipient, key);
        }
        self.dirty.insert(key);
        key
    }

    pub(super) fn set_phase(&mut self, key: Key, phase: Phase) {
        let Some(entry) = self.outbox.get_mut(key) else {
            return;
        };
        let parked = entry.park.is_some();
        let old = std::mem::replace(&mut entry.phase, phase);
        self.timers
            .disarm(key, entry.message.priority, parked, &old);
        self.timers
            .arm(key, entry.message.priority, parked, &entry.phase);
        self.dirty.insert(key);
    }

    pub(super) fn set_park(&mut self, key: Key, park: Option<Park>) {
        let Some(entry) = self.outbox.get_mut(key) else {
            return;
        };
        if entry.park == park {
            return;
        }
        let (was, is) = (entry.park.is_some(), park.is_some());
        entry.park = park;
        self.dirty.insert(key);
        if was == is {
            return;
        }
        self.timers
            .disarm(key, entry.message.priority, was, &entry.phase);
        self.timers
            .arm(key, entry.message.priority, is, &entry.phase);
        if is {
            self.parking.hold(&entry.message.recipient, key);
        } else {
            self.parking.unhold(&entry.message.recipient, key);
        }
    }

    pub(super) fn remove(&mut self, key: Key) -> Option<Entry> {
        let entry = self.outbox.remove(key)?;
        let parked = entry.park.is_some();
        self.timers
            .disarm(key, entry.message.priority, parked, &entry.phase);
        if parked {
            self.parking.unhold(&entry.message.recipient, key);
        }
        if !self.outbox.has_recipient(&entry.message.recipient) {
            self.parking.forget(&entry.message.recipient);
        }
        self.dirty.remove(&key);
        Some(entry)
    }

    /// Evicts the oldest entries of `class` until one more fits. A group message with something
    /// left to deliver counts as one regular entry, and goes whole when it is the oldest.
    pub(super) fn make_room(&mut self, class: Class, now: Millis) {
        loop {
            let groups = if class == Class::Regular {
                self.groups.active()
            } else {
                0
            };
            if self.outbox.count(class) + groups < class.capacity(&self.config) {
                break;
            }
            let entry = self.outbox.oldest(class);
            let group = (class == Class::Regular)
                .then(|| self.groups.oldest())
                .flatten()
                .map(|(key, id)| (key, id.to_owned()));
            match (entry, group) {
                (Some(entry), Some((group, id))) if group < entry => {
                    self.fail_group_send(&id, now);
                }
                (Some(key), _) => self.settle_failed(key, FailReason::OutboxCapacityExceeded, now),
                (None, Some((_, id))) => self.fail_group_send(&id, now),
                (None, None) => break,
            }
        }
    }

    pub(super) fn settle_failed(&mut self, key: Key, reason: FailReason, now: Millis) {
        if let Some(entry) = self.remove(key) {
            let Message { id, recipient, .. } = entry.message;
            self.emit_failed(id, recipient, reason, entry.ack_attempts, now);
        }
    }

    /// The terminal failure: `message_failed.retry_count` is the ACK retries the entry was
    /// granted (`ack_attempts`), `max_retries` for "Max retries exceeded".
    pub(super) fn emit_failed(
        &mut self,
        id: String,
        recipient: String,
        reason: FailReason,
        ack_attempts: u32,
        now: Millis,
    ) {
        let event = Event::MessageFailed {
            message_id: id.clone(),
            recipient: recipient.clone(),
            reason,
            retry_count: ack_attempts,
        };
        self.outbox_event(event);
        let settlement = Settlement::Failed(reason);
        self.store.push_back(StoreOp::Settle {
            id,
            recipient,
            settlement,
            at: now,
        });
    }

    pub(super) fn emit_deferred(&mut self, key: Key, reason: &str, next_retry_at: Option<Millis>) {
        let retry_count = self
            .outbox
            .get(key)
            .map_or(0, |entry| entry.transport_retries);
        self.emit_deferred_with(key, reason, retry_count, next_retry_at);
    }

    pub(super) fn emit_deferred_with(
        &mut self,
        key: Key,
        reason: &str,
        retry_count: u32,
        next_retry_at: Option<Millis>,
    ) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        let event = Event::MessageDeferred {
            message_id: entry.message.id.clone(),
            recipient: entry.message.recipient.clone(),
            reason: reason.to_owned(),
            retry_count,
            next_retry_at,
        };
        self.outbox_event(event);
    }

    pub(super) fn diagnostic(&mut self, level: DiagnosticLevel, message: String) {
        self.events.push_back(Event::Diagnostic { level, message });
    }

    /// One Put per entry changed during the call, reflecting where it ended up; then the
    /// watchlist follows the parking bookkeeping and the pre-session queue.
    pub(super) fn end_call(&mut self) {
        if let Some(hook) = self.hook.as_mut() {
            let rows = hook.take_to_buffer();
            if !rows.is_empty() {
                self.store.push_back(StoreOp::BufferInbound(rows));
            }
        }
        let mut touched = self.parking.take_touched();
        touched.append(&mut self.presession.take_touched());
        for peer in touched {
            let wanted = self.parking.watched(&peer) || self.presession.waits_for(&peer);
            self.presence.set_wanted(&peer, wanted);
        }
        for key in std::mem::take(&mut self.dirty) {
            if let Some(entry) = self.outbox.get(key) {
                self.store.push_back(StoreOp::Put(entry.record()));
            }
        }
    }
}

/// `file_id` of `message_undeliverable`: the transfer a media chunk belongs to, when it says.
pub(super) fn file_id(message: &Message) -> Option<String> {
    if message.content_type != ContentType::FileChunk {
        return None;
    }
    let from_media = message.media_metadata.as_ref().and_then(|meta| {
        ["file_id", "fileId"]
            .iter()
            .find_map(|k| meta.get(k).and_then(Value::as_str))
    });
    from_media
        .or_else(|| message.metadata.get("file_id").map(String::as_str))
        .map(str::to_owned)
}
