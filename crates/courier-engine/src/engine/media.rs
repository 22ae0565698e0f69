//! File chunks (`docs/delivery.md#file-transfers`): the engine delivers each like a message —
//! outbox, ladder, ACK — but under the media bound, never parked on a verdict, and reported to
//! the runtime's transfer (`poll_chunk`) instead of to the application. Only the verdict
//! (`message_undeliverable` with its `file_id`) reaches the application as a message event.

use super::*;

use crate::io::ChunkOutcome;

impl Engine {
    /// Remembers a chunk's transfer while it is in the outbox or the pre-session queue.
    pub(super) fn track_chunk(&mut self, message: &Message) {
        if let Some(file_id) = file_id(message) {
            self.chunks.insert(message.id.clone(), file_id);
        }
    }

    /// A chunk's message event: the terminal ones become its outcome for the runtime.
    pub(super) fn chunk_event(&mut self, event: Event) {
        let (id, result) = match event {
            Event::MessageUndeliverable { .. } => {
                self.events.push_back(event);
                return;
            }
            Event::MessageDelivered { message_id, .. } => (message_id, Ok(())),
            Event::MessageFailed {
                message_id, reason, ..
            } => (message_id, Err(reason)),
            // Progress is the transfer's to report, from acknowledgements.
            _ => return,
        };
        let Some(file_id) = self.chunks.remove(&id) else {
            return;
        };
        if result != Err(FailReason::TransferAborted) {
            self.chunk_outcomes.push_back(ChunkOutcome {
                id,
                file_id,
                result,
            });
        }
    }

    /// `Input::CancelChunks`: each chunk leaves wherever it is, settled as withdrawn; unknown ids
    /// (settled meanwhile) are ignored.
    pub(super) fn cancel_chunks(&mut self, ids: Vec<String>, now: Millis) {
        for id in ids {
            if let Some(key) = self.outbox.key_of(&id) {
                self.settle_failed(key, FailReason::TransferAborted, now);
            } else if let Some(waiting) = self.presession.withdraw(&id) {
                let Message { id, recipient, .. } = waiting.message;
                self.emit_failed(id, recipient, FailReason::TransferAborted, 0, now);
            }
        }
    }
}
