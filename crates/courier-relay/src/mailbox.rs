//! What flows to a recipient connection, and in which order (`docs/protocol.md#journal-and-seq`,
//! `docs/protocol.md#drain`).
//!
//! Invariants the writer relies on:
//! 1. The store thread assigns `seq` and offers journaled frames to the recipient's queue in
//!    commit order, so the queue holds increasing seqs.
//! 2. Once an offer fails (queue full, byte budget spent) the queue is *lagged*: no further
//!    offers are queued until the writer has caught up from the journal, so a later frame can
//!    never overtake the one that did not fit.
//! 3. A connection registers in the router before it fixes its drain bound S, and a sender
//!    looks the recipient up only after its commit; every frame is therefore either ≤ S (the
//!    drain writes it) or offered to the queue (or recorded as lag).
//! 4. The writer writes frames in strictly increasing seq and skips anything ≤ its watermark,
//!    which makes "written frames ≤ n" the same as "journal rows ≤ min(n, highest written)".

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use courier_proto::RelayFrame;
use serde_json::Value;
use tokio::sync::{mpsc, watch, Notify};

/// Frames queued in memory for one connection; past either bound the writer reads the journal,
/// or, without a mailbox, the frame is refused (`docs/protocol.md#without-a-mailbox`).
const QUEUE_FRAMES: usize = 256;
const QUEUE_BYTES: usize = 8 * 1024 * 1024;

/// One accepted SendMessage, or one member's copy of a SendGroupMessage, as the recipient will
/// see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// Absent when the relay runs without a mailbox (nothing is journaled).
    pub seq: Option<u64>,
    /// The identity stamped when the frame was read (`docs/protocol.md#identifiers`).
    pub sender: String,
    pub sender_account: String,
    pub message_id: String,
    /// Shared: a group message's copies for every member hold one content.
    pub content: Arc<str>,
    pub reply_to_msg: Option<String>,
    pub accepted_ms: u64,
    /// Set on a group copy, which is written as GroupMessageReceived.
    pub group: Option<GroupTag>,
}

/// What a group copy carries besides a message's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupTag {
    pub group_id: String,
    /// Passed through as the sender wrote it.
    pub forward_info: Option<Value>,
}

/// What a journal row costs besides its text fields: its integers, its row id and its index
/// entries (`docs/protocol.md#mailbox-limits`).
const ROW_OVERHEAD: u64 = 64;

/// The size a frame is counted at against the mailbox limits: every text field of its row,
/// plus [`ROW_OVERHEAD`]. The SQLite journal's schema version 6 computes the same in SQL for rows
/// written before; the cluster journal carries it in a header of each frame
/// (`docs/cluster.md#mailbox-limits`).
pub fn row_bytes(envelope: &Envelope, forward_info: Option<&str>) -> u64 {
    let group_id = envelope.group.as_ref().map_or(0, |g| g.group_id.len());
    [
        envelope.content.len(),
        envelope.sender.len(),
        envelope.sender_account.len(),
        envelope.message_id.len(),
        envelope.reply_to_msg.as_ref().map_or(0, String::len),
        group_id,
        forward_info.map_or(0, str::len),
    ]
    .iter()
    .map(|&n| n as u64)
    .sum::<u64>()
        + ROW_OVERHEAD
}

impl Envelope {
    pub fn to_frame(&self, with_seq: bool) -> RelayFrame {
        let seq = if with_seq { self.seq } else { None };
        match &self.group {
            None => RelayFrame::MessageReceived {
                seq,
                sender: self.sender.clone(),
                sender_account: Some(self.sender_account.clone()),
                content: self.content.to_string(),
                message_id: self.message_id.clone(),
                timestamp: self.accepted_ms,
                reply_to_msg: self.reply_to_msg.clone(),
            },
            Some(group) => RelayFrame::GroupMessageReceived {
                group_id: group.group_id.clone(),
                sender: self.sender.clone(),
                content: self.content.to_string(),
                message_id: self.message_id.clone(),
                timestamp: self.accepted_ms,
                seq,
                reply_to_msg: self.reply_to_msg.clone(),
                forward_info: group.forward_info.clone(),
            },
        }
    }

    /// Whether the frame this envelope becomes fits under the 1 MiB frame limit whatever `seq`
    /// it gets (the largest one, escaping included): a frame accepted must be deliverable.
    pub fn fits_a_frame(&self) -> bool {
        if self.widest_bound() <= courier_proto::limits::MAX_FRAME_BYTES {
            return true;
        }
        let mut widest = self.clone();
        widest.seq = Some(u64::MAX);
        widest.to_frame(true).encode().len() <= courier_proto::limits::MAX_FRAME_BYTES
    }

    /// An upper bound on the encoded frame's length, cheap enough for every frame: each byte of
    /// a string field escapes to at most six (`\u001f`), and the rest of the frame (field names,
    /// a `seq` and a timestamp of 20 digits each) is under 512 bytes.
    fn widest_bound(&self) -> usize {
        let strings = self.sender.len()
            + self.sender_account.len()
            + self.message_id.len()
            + self.content.len()
            + self.reply_to_msg.as_ref().map_or(0, String::len)
            + self.group.as_ref().map_or(0, |g| {
                g.group_id.len() + g.forward_info.as_ref().map_or(0, |f| f.to_string().len())
            });
        strings * 6 + 512
    }

    fn weight(&self) -> usize {
        self.content.len()
    }
}

/// The sending side of one connection's delivery queue.
pub struct DeliveryQueue {
    tx: mpsc::Sender<Arc<Envelope>>,
    queued_bytes: AtomicUsize,
    lagged: AtomicBool,
    wake: Notify,
    /// Highest seq handed to the socket on this connection; acks above it are ignored.
    highest_written: AtomicU64,
    /// The writer's watermark as of its last completed flush (see [`DeliveryReceiver`]).
    flushed: watch::Receiver<u64>,
}

/// The writer's side of the queue.
pub struct DeliveryReceiver {
    pub frames: mpsc::Receiver<Arc<Envelope>>,
    /// Every unreleased journal frame up to this seq has been written and flushed to the
    /// socket. A group report waits on it to call a member delivered; it closes with the
    /// writer, which tells such a waiter that the connection ended.
    pub flushed: watch::Sender<u64>,
}

impl DeliveryQueue {
    pub fn new() -> (Self, DeliveryReceiver) {
        let (tx, frames) = mpsc::channel(QUEUE_FRAMES);
        let (flushed_tx, flushed) = watch::channel(0);
        let queue = Self {
            tx,
            queued_bytes: AtomicUsize::new(0),
            lagged: AtomicBool::new(false),
            wake: Notify::new(),
            highest_written: AtomicU64::new(0),
            flushed,
        };
        let receiver = DeliveryReceiver {
            frames,
            flushed: flushed_tx,
        };
        (queue, receiver)
    }

    /// Offers a journaled frame without blocking (called by the store thread after commit).
    /// A frame that does not fit stays in the journal and the writer is told to read it there.
    pub fn offer_journaled(&self, envelope: Arc<Envelope>) {
        if self.lagged.load(Ordering::SeqCst) {
            self.wake.notify_one();
            return;
        }
        let weight = envelope.weight();
        let queued = self.queued_bytes.fetch_add(weight, Ordering::SeqCst);
        if queued + weight > QUEUE_BYTES || self.tx.try_send(envelope).is_err() {
            self.queued_bytes.fetch_sub(weight, Ordering::SeqCst);
            self.lagged.store(true, Ordering::SeqCst);
            self.wake.notify_one();
        }
    }

    /// In a cluster, frame `seq` was journaled for this connection's account through some node:
    /// the writer reads it from the journal, in the journal's order, unless it has written it
    /// already (`docs/cluster.md#live-delivery`).
    pub fn journal_grew(&self, seq: u64) {
        if seq > self.highest_written() {
            self.lagged.store(true, Ordering::SeqCst);
            self.wake.notify_one();
        }
    }

    /// Queues an unjournaled frame (mailbox disabled), or refuses it at once: without a journal
    /// there is nowhere else to keep it, and waiting for a recipient that does not read would
    /// stall the sender's connection (`docs/protocol.md#without-a-mailbox`).
    pub fn try_unjournaled(&self, envelope: Arc<Envelope>) -> Result<(), Unqueued> {
        let weight = envelope.weight();
        let queued = self.queued_bytes.fetch_add(weight, Ordering::SeqCst);
        let sent = if queued + weight > QUEUE_BYTES {
            Err(Unqueued::Full)
        } else {
            self.tx.try_send(envelope).map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => Unqueued::Full,
                mpsc::error::TrySendError::Closed(_) => Unqueued::Closed,
            })
        };
        if sent.is_err() {
            self.queued_bytes.fetch_sub(weight, Ordering::SeqCst);
        }
        sent
    }

    /// Called by the writer for every frame it takes off the queue.
    pub fn taken(&self, envelope: &Envelope) {
        self.queued_bytes
            .fetch_sub(envelope.weight(), Ordering::SeqCst);
    }

    /// Clears the lag mark; the writer calls this *before* each catch-up read of the journal so
    /// that a frame skipped after the clear is either in that read or queued (invariant 2).
    pub fn clear_lag(&self) {
        self.lagged.store(false, Ordering::SeqCst);
    }

    pub fn is_lagged(&self) -> bool {
        self.lagged.load(Ordering::SeqCst)
    }

    pub async fn lag_signalled(&self) {
        self.wake.notified().await;
    }

    pub fn mark_written(&self, seq: u64) {
        self.highest_written.fetch_max(seq, Ordering::SeqCst);
    }

    pub fn highest_written(&self) -> u64 {
        self.highest_written.load(Ordering::SeqCst)
    }

    /// Follows the writer's flushed watermark (see [`DeliveryReceiver::flushed`]).
    pub fn flushed(&self) -> watch::Receiver<u64> {
        self.flushed.clone()
    }
}

/// Why an unjournaled frame was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unqueued {
    /// Its frame or byte bound is reached.
    Full,
    /// The connection's writer is gone.
    Closed,
}

/// Where a connection's journaled delivery stands (`docs/protocol.md#drain`): before the drain,
/// draining up to S, or live (possibly catching up from the journal after lag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    AwaitingDrain,
    Draining { bound: u64, count: u64 },
    Live { catching_up: bool },
}

/// The writer's delivery cursor.
#[derive(Debug)]
pub struct Outflow {
    pub phase: Phase,
    /// Every unacked journal frame ≤ watermark has been written on this connection.
    pub watermark: u64,
}

impl Outflow {
    pub fn new(journaled: bool) -> Self {
        Self {
            phase: if journaled {
                Phase::AwaitingDrain
            } else {
                Phase::Live { catching_up: false }
            },
            watermark: 0,
        }
    }

    pub fn live(&self) -> bool {
        matches!(self.phase, Phase::Live { catching_up: false })
    }

    /// Whether the writer has journal reads to do.
    pub fn reading_journal(&self) -> bool {
        matches!(
            self.phase,
            Phase::Draining { .. } | Phase::Live { catching_up: true }
        )
    }

    /// A queued frame is written only if it is past everything already covered.
    pub fn accept_queued(&mut self, envelope: &Envelope) -> bool {
        match envelope.seq {
            None => true,
            Some(seq) if seq > self.watermark => {
                self.watermark = seq;
                true
            }
            Some(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(seq: u64, size: usize) -> Arc<Envelope> {
        Arc::new(Envelope {
            seq: Some(seq),
            sender: "a".into(),
            sender_account: "a".into(),
            message_id: format!("m{seq}"),
            content: "x".repeat(size).into(),
            reply_to_msg: None,
            accepted_ms: 1,
            group: None,
        })
    }

    #[test]
    fn a_frame_that_does_not_fit_lags_the_queue_and_later_frames_are_not_queued() {
        let (q, rx) = DeliveryQueue::new();
        let mut rx = rx.frames;
        q.offer_journaled(env(1, 10));
        q.offer_journaled(env(2, QUEUE_BYTES));
        assert!(q.is_lagged());
        q.offer_journaled(env(3, 1));
        assert_eq!(rx.try_recv().unwrap().seq, Some(1));
        assert!(
            rx.try_recv().is_err(),
            "nothing may overtake the lagged frame"
        );
        q.clear_lag();
        q.offer_journaled(env(4, 1));
        assert_eq!(rx.try_recv().unwrap().seq, Some(4));
    }

    #[test]
    fn the_cheap_bound_is_never_below_the_encoded_frame() {
        let worst = "\u{1}\"\\é".repeat(2_000);
        let mut direct = (*env(u64::MAX, 0)).clone();
        direct.content = worst.as_str().into();
        direct.reply_to_msg = Some(worst.clone());
        let mut copy = direct.clone();
        copy.group = Some(GroupTag {
            group_id: worst.clone(),
            forward_info: Some(serde_json::json!({ "from": worst, "n": u64::MAX })),
        });
        for envelope in [direct, copy] {
            assert!(envelope.to_frame(true).encode().len() <= envelope.widest_bound());
        }
    }

    #[test]
    fn queued_frames_at_or_below_the_watermark_are_skipped() {
        let mut flow = Outflow::new(true);
        flow.phase = Phase::Live { catching_up: false };
        flow.watermark = 5;
        assert!(!flow.accept_queued(&env(5, 1)));
        assert!(flow.accept_queued(&env(6, 1)));
        assert_eq!(flow.watermark, 6);
    }
}
