//! The durability hook's pipeline, the opt-in at-least-once inbound path
//! (`docs/delivery.md#durability-hook`; the relay's side in
//! `docs/protocol.md#client-processing-order` and `docs/protocol.md#drain`): buffered rows, hook
//! batches, refusals, redelivery and retention. The engine owns dedup, routing and the delivery
//! ACKs; this module owns everything between "a new message arrived" and "the hook committed it".
//!
//! # Life of a buffered message
//!
//! A new message (not in the dedup record, not buffered) becomes a *row*: it is written with
//! `StoreOp::BufferInbound` in the call that received it (so before anything else of that step
//! is flushed, and long before the hook sees it) and joins a batch:
//!
//! - **open** — the relay drain's batch being filled (`Input::DrainStarted` until
//!   `DrainComplete`, on the draining carrier only). It closes at `batch_max_messages`, at
//!   `batch_max_bytes` of content (a message that would push it over starts the next batch),
//!   `batch_max_age_ms` after its first message, and is forced by `DrainComplete`, a disconnect
//!   and a new drain;
//! - **ready** — a closed batch waiting for the hook, FIFO. Live traffic (no drain on that
//!   carrier, and every local carrier) is a ready batch of one;
//! - **with the hook** — exactly one batch at a time (`poll_hook`);
//! - **waiting** — its batch was refused: the rows wait for a retry at `retry_initial_ms`
//!   doubling to `retry_max_ms` (per row refusals; the batch waits for its most refused row),
//!   counted only while some carrier is up. A relay redelivery of one of them takes it out of
//!   the wait at once and puts it back in the pipeline from the buffered copy.
//!
//! A row leaves only by the hook's commit (`StoreOp::CommitInbound`, then the relay frame releases
//! of every seq that carried it, then the end-to-end ACKs) or by retention
//! (`StoreOp::ExpireInbound` with a diagnostic and a `security_warning`, then its frame releases —
//! a drop). A row whose retention runs out while its batch is with the hook stays until the
//! verdict: committed on `Ok`, expired on `Err`.
//!
//! # Ordering
//!
//! Batches reach the hook in the order they closed, so the drain's batches (the tail forced by
//! `DrainComplete`) are all offered before any live message that arrived after them. A refused
//! batch does not hold later batches back: a hook that keeps refusing one batch (a poison
//! message) must not stop every other inbound message for the 7-day retention. Messages of a
//! refused batch can therefore reach the hook after later ones.
//!
//! # Bounds
//!
//! The rows in memory are bounded by `max_buffered_messages` and `max_buffered_bytes` (content
//! bytes), the relay's own mailbox limits by default. Over either, a new message is not
//! buffered and not acknowledged (neither frame release nor end-to-end ACK): the relay keeps it and
//! redelivers it on the next connection, the sender's ladder resends it over a local carrier.
//! A diagnostic reports the first refusal after each stretch below the bound. Rows restored
//! from the store are all taken (the store is already their bound).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use courier_proto::Message;
use serde_json::Value;

use crate::config::HookConfig;
use crate::event::{DiagnosticLevel, Event};
use crate::io::{
    BatchOrigin, Carrier, HookBatch, HookMessage, InboundKey, Millis, PendingInbound, StoreOp,
    Transmit, TransmitKind,
};

#[cfg(test)]
mod check;
mod rows;

pub(crate) use rows::content_bytes;
use rows::{release_frames, report_expiry};

/// `security_warning.reason_code` of a row removed by retention (`docs/delivery.md#retention`).
pub(crate) const RETENTION_EXPIRED: &str = "INBOUND_RETENTION_EXPIRED";
const RETENTION_EXPIRED_TEXT: &str =
    "an inbound message the durability hook never committed was removed after the retention period";

type RowId = u64;
/// A retry group: (due, group id).
type Group = (Millis, u64);
type Member = (RowId, BatchOrigin);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Open,
    Ready,
    WithHook,
    Waiting(Group),
}

#[derive(Debug)]
struct Row {
    pending: PendingInbound,
    /// Content bytes (the batch and memory bounds).
    bytes: usize,
    /// Relay journal seqs that carried this message and are not released yet.
    seqs: Vec<u64>,
    refusals: u32,
    place: Place,
}

#[derive(Debug)]
struct Open {
    members: Vec<Member>,
    bytes: usize,
    first_at: Millis,
}

#[derive(Debug)]
struct Offered {
    id: u64,
    members: Vec<Member>,
    /// Unsettled by then, the batch counts as refused.
    deadline: Millis,
}

#[derive(Debug)]
struct DrainWait {
    count: u64,
    outstanding: Vec<RowId>,
}

/// What became of a new arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// Buffered now (one more row).
    Buffered,
    /// Already buffered: this arrival's seq waits for that row's commit.
    Known,
    /// Over the memory bound: neither buffered nor acknowledged.
    Full,
}

/// A batch the hook committed: its rows in batch order (their seqs are already released).
#[derive(Debug)]
pub(crate) struct Commit {
    pub rows: Vec<(PendingInbound, BatchOrigin)>,
}

/// The engine's output queues, lent to the pipeline for one call.
pub(crate) struct Sink<'a> {
    pub store: &'a mut VecDeque<StoreOp>,
    pub events: &'a mut VecDeque<Event>,
    pub transmits: &'a mut VecDeque<Transmit>,
}

#[derive(Debug)]
pub(crate) struct HookPipeline {
    config: HookConfig,
    rows: HashMap<RowId, Row>,
    index: HashMap<InboundKey, RowId>,
    next_row: RowId,
    /// Content bytes of all rows.
    bytes: usize,
    open: Option<Open>,
    ready: VecDeque<Vec<Member>>,
    with_hook: Option<Offered>,
    last_batch_id: u64,
    waiting: BTreeMap<Group, Vec<RowId>>,
    last_group: u64,
    /// Retention deadlines of the rows not with the hook: (received_at + retention, row).
    expiries: BTreeSet<(Millis, RowId)>,
    /// The carrier whose relay drain is running (until DrainComplete or disconnect).
    draining: Option<Carrier>,
    /// Rows that arrived during the running drain.
    drain_rows: Vec<RowId>,
    /// Completed drains waiting for their rows to commit, in order.
    drain_waits: VecDeque<DrainWait>,
    /// New rows of the current call, written with one `BufferInbound` when it ends.
    to_buffer: Vec<PendingInbound>,
    /// A refusal over the memory bound was reported; reset once below it again.
    full_reported: bool,
}

impl HookPipeline {
    pub(crate) fn new(config: HookConfig) -> Self {
        Self {
            config,
            rows: HashMap::new(),
            index: HashMap::new(),
            next_row: 0,
            bytes: 0,
            open: None,
            ready: VecDeque::new(),
            with_hook: None,
            last_batch_id: 0,
            waiting: BTreeMap::new(),
            last_group: 0,
            expiries: BTreeSet::new(),
            draining: None,
            drain_rows: Vec::new(),
            drain_waits: VecDeque::new(),
            to_buffer: Vec::new(),
            full_reported: false,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }

    /// The rows this call buffered, for one `StoreOp::BufferInbound`.
    pub(crate) fn take_to_buffer(&mut self) -> Vec<PendingInbound> {
        std::mem::take(&mut self.to_buffer)
    }

    // ---- inputs ---------------------------------------------------------------------------

    /// Whether the row of `key` is buffered.
    pub(crate) fn holds(&self, key: &InboundKey) -> bool {
        self.index.contains_key(key)
    }

    /// A message that is neither processed nor (for `Buffered`) buffered arrived on
    /// `pending.carrier`, by relay journal frame `seq` if any.
    pub(crate) fn arrive(
        &mut self,
        pending: PendingInbound,
        seq: Option<u64>,
        now: Millis,
        sink: &mut Sink<'_>,
    ) -> Arrival {
        let draining = self.draining.as_ref() == Some(&pending.carrier);
        if let Some(&id) = self.index.get(&pending.key) {
            let row = self.rows.get_mut(&id).expect("indexed row");
            let carrier = pending.carrier.clone();
            if pending.message.requires_ack && !row.pending.message.requires_ack {
                // A group message's copy, buffered from the relay's broadcast (which asks for
                // no ACK): the commit owes the copy's sender its ACK
                // (`docs/delivery.md#received-group-messages`).
                row.pending = PendingInbound {
                    received_at: row.pending.received_at,
                    ..pending
                };
            }
            if let Some(seq) = seq {
                if !row.seqs.contains(&seq) {
                    row.seqs.push(seq);
                }
            }
            if draining {
                self.drain_rows.push(id);
            }
            if let Place::Waiting(group) = row.place {
                // A redelivery of a refused message: back in the pipeline now, from the copy.
                self.leave_group(group, id);
                self.place(id, BatchOrigin::Redelivery, &carrier, now);
            }
            return Arrival::Known;
        }
        let bytes = content_bytes(&pending.message);
        if self.rows.len() >= self.config.max_buffered_messages
            || self.bytes.saturating_add(bytes) > self.config.max_buffered_bytes
        {
            if !self.full_reported {
                self.full_reported = true;
                let text = format!(
                    "inbound durability buffer full ({} messages, {} bytes): message {} from {} \
                     left unacknowledged for redelivery",
                    self.rows.len(),
                    self.bytes,
                    pending.key.message_id,
                    pending.key.sender
                );
                sink.events.push_back(Event::Diagnostic {
                    level: DiagnosticLevel::Warn,
                    message: text,
                });
            }
            return Arrival::Full;
        }
        let carrier = pending.carrier.clone();
        self.to_buffer.push(pending.clone());
        let id = self.insert(pending, bytes);
        if let Some(seq) = seq {
            self.rows.get_mut(&id).expect("new row").seqs.push(seq);
        }
        if draining {
            self.drain_rows.push(id);
        }
        let origin = if draining {
            BatchOrigin::Drain
        } else {
            BatchOrigin::Live
        };
        self.place(id, origin, &carrier, now);
        Arrival::Buffered
    }

    /// Rows from the store at start: offered again (origin Redelivery) in the order they were
    /// received, in batches within the count and byte bounds. Rows past retention are expired
    /// now. The caller has dropped the ones already processed.
    pub(crate) fn restore(
        &mut self,
        mut rows: Vec<PendingInbound>,
        now: Millis,
        sink: &mut Sink<'_>,
    ) {
        rows.sort_by(|a, b| {
            a.received_at
                .cmp(&b.received_at)
                .then_with(|| a.key.cmp(&b.key))
        });
        let mut batch: Vec<Member> = Vec::new();
        let mut batch_bytes = 0usize;
        let mut expired = Vec::new();
        for pending in rows {
            if self.index.contains_key(&pending.key) {
                continue;
            }
            if self.expires_at(pending.received_at) <= now {
                expired.push(pending);
                continue;
            }
            let bytes = content_bytes(&pending.message);
            let id = self.insert(pending, bytes);
            if !batch.is_empty() && batch_bytes.saturating_add(bytes) > self.config.batch_max_bytes
            {
                self.ready.push_back(std::mem::take(&mut batch));
                batch_bytes = 0;
            }
            self.rows.get_mut(&id).expect("new row").place = Place::Ready;
            batch.push((id, BatchOrigin::Redelivery));
            batch_bytes = batch_bytes.saturating_add(bytes);
            if batch.len() >= self.batch_max_messages()
                || batch_bytes >= self.config.batch_max_bytes
            {
                self.ready.push_back(std::mem::take(&mut batch));
                batch_bytes = 0;
            }
        }
        if !batch.is_empty() {
            self.ready.push_back(batch);
        }
        if !expired.is_empty() {
            let keys = expired.iter().map(|p| p.key.clone()).collect();
            sink.store.push_back(StoreOp::ExpireInbound { keys });
            for pending in &expired {
                report_expiry(pending, self.config.retention_ms, sink);
            }
        }
    }

    /// The next batch for the hook, when none is with it; the hook has until `now` +
    /// `timeout_ms` to settle it.
    pub(crate) fn poll(&mut self, now: Millis) -> Option<HookBatch> {
        if self.with_hook.is_some() {
            return None;
        }
        let members = self.ready.pop_front()?;
        self.last_batch_id += 1;
        let id = self.last_batch_id;
        let mut messages = Vec::with_capacity(members.len());
        for &(row_id, origin) in &members {
            let row = self.rows.get_mut(&row_id).expect("ready row");
            row.place = Place::WithHook;
            let expiry = (
                row.pending
                    .received_at
                    .saturating_add(self.config.retention_ms),
                row_id,
            );
            self.expiries.remove(&expiry);
            messages.push(HookMessage {
                key: row.pending.key.clone(),
                message: row.pending.message.clone(),
                transport: row.pending.carrier.name().to_owned(),
                origin,
            });
        }
        self.with_hook = Some(Offered {
            id,
            members,
            deadline: now.saturating_add(self.config.timeout_ms),
        });
        Some(HookBatch { id, messages })
    }

    /// The hook's verdict on batch `id`; `None` for a stale id. On `Ok` the rows are removed and
    /// `CommitInbound` and the frame releases go out here; the caller records the keys as processed
    /// and sends the end-to-end ACKs. On `Err` nothing is acknowledged and the rows wait for
    /// their retry.
    pub(crate) fn resolve(
        &mut self,
        id: u64,
        result: Result<(), String>,
        now: Millis,
        sink: &mut Sink<'_>,
    ) -> Option<Commit> {
        if self.with_hook.as_ref().map(|o| o.id) != Some(id) {
            return None;
        }
        let offered = self.with_hook.take().expect("checked");
        match result {
            Ok(()) => {
                let mut keys = Vec::with_capacity(offered.members.len());
                let mut rows = Vec::with_capacity(offered.members.len());
                let mut seqs = Vec::new();
                for (row_id, origin) in offered.members {
                    let row = self.remove(row_id);
                    keys.push(row.pending.key.clone());
                    seqs.extend_from_slice(&row.seqs);
                    rows.push((row.pending, origin));
                }
                seqs.sort_unstable();
                seqs.dedup();
                sink.store
                    .push_back(StoreOp::CommitInbound { keys, at: now });
                release_frames(&seqs, sink);
                self.drain_progress(sink);
                Some(Commit { rows })
            }
            Err(reason) => {
                let text = format!(
                    "durability hook refused batch {id} ({} messages): {reason}",
                    offered.members.len()
                );
                sink.events.push_back(Event::Diagnostic {
                    level: DiagnosticLevel::Warn,
                    message: text,
                });
                let mut kept = Vec::with_capacity(offered.members.len());
                let mut expired = Vec::new();
                let mut refusals = 0;
                for (row_id, _) in offered.members {
                    let expires_at = self.expires_at(self.rows[&row_id].pending.received_at);
                    let row = self.rows.get_mut(&row_id).expect("offered row");
                    row.refusals = row.refusals.saturating_add(1);
                    if expires_at <= now {
                        // Its retention ran out while the hook had it.
                        expired.push(row_id);
                    } else {
                        refusals = refusals.max(row.refusals);
                        kept.push(row_id);
                    }
                }
                if !kept.is_empty() {
                    self.last_group += 1;
                    let group = (
                        now.saturating_add(self.retry_delay(refusals)),
                        self.last_group,
                    );
                    for &row_id in &kept {
                        let retention = self.config.retention_ms;
                        let row = self.rows.get_mut(&row_id).expect("offered row");
                        row.place = Place::Waiting(group);
                        let expiry = row.pending.received_at.saturating_add(retention);
                        self.expiries.insert((expiry, row_id));
                    }
                    self.waiting.insert(group, kept);
                }
                self.expire(expired, sink);
                None
            }
        }
    }

    /// The relay connection on `carrier` starts its backlog drain: any pending batch is forced
    /// first (a reconnect), then new messages on it are batched until `drain_complete`.
    pub(crate) fn drain_started(&mut self, carrier: Carrier) {
        self.close_open();
        self.draining = Some(carrier);
        self.drain_rows.clear();
    }

    /// `DrainComplete{count}`: the tail batch is forced; `InboundDrainCompleted{count}` follows
    /// once every row that arrived during the drain has committed (or expired).
    pub(crate) fn drain_complete(&mut self, carrier: &Carrier, count: u64, sink: &mut Sink<'_>) {
        let mut outstanding = Vec::new();
        if self.draining.as_ref() == Some(carrier) {
            self.close_open();
            self.draining = None;
            outstanding = std::mem::take(&mut self.drain_rows);
            outstanding.sort_unstable();
            outstanding.dedup();
        }
        self.drain_waits.push_back(DrainWait { count, outstanding });
        self.drain_progress(sink);
    }

    /// `carrier` went down: its pending drain batch is forced, and its drain will not complete.
    pub(crate) fn carrier_down(&mut self, carrier: &Carrier) {
        if self.draining.as_ref() == Some(carrier) {
            self.close_open();
            self.draining = None;
            self.drain_rows.clear();
        }
    }

    /// Timers due at `now`: retention, the open batch's age, refused batches' retries (only
    /// while a carrier is up).
    pub(crate) fn on_timeout(&mut self, now: Millis, carrier_up: bool, sink: &mut Sink<'_>) {
        let mut expired = Vec::new();
        while let Some(&(at, row_id)) = self.expiries.first() {
            if at > now {
                break;
            }
            self.expiries.pop_first();
            expired.push(row_id);
        }
        self.expire(expired, sink);
        if self
            .open
            .as_ref()
            .is_some_and(|open| self.age_deadline(open) <= now)
        {
            self.close_open();
        }
        if carrier_up {
            self.release_due_retries(now);
        }
    }

    /// Refused batches whose backoff is over go back to the ready queue (origin Redelivery),
    /// without the rows that re-entered the pipeline meanwhile.
    fn release_due_retries(&mut self, now: Millis) {
        while let Some(entry) = self.waiting.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (group, ids) = entry.remove_entry();
            let members: Vec<Member> = ids
                .into_iter()
                .filter(|id| self.rows.get(id).map(|r| r.place) == Some(Place::Waiting(group)))
                .map(|id| (id, BatchOrigin::Redelivery))
                .collect();
            for (id, _) in &members {
                self.rows.get_mut(id).expect("waiting row").place = Place::Ready;
            }
            if !members.is_empty() {
                self.ready.push_back(members);
            }
        }
    }

    /// The batch with the hook, once the hook has held it past its deadline.
    pub(crate) fn overdue(&self, now: Millis) -> Option<u64> {
        self.with_hook
            .as_ref()
            .filter(|offered| offered.deadline <= now)
            .map(|offered| offered.id)
    }

    #[cfg(test)]
    pub(crate) fn with_hook(&self) -> Option<u64> {
        self.with_hook.as_ref().map(|offered| offered.id)
    }

    pub(crate) fn timeout_ms(&self) -> u64 {
        self.config.timeout_ms
    }

    /// The earliest of the pipeline's timers; `None` with nothing buffered.
    pub(crate) fn next_deadline(&self, carrier_up: bool) -> Option<Millis> {
        let age = self.open.as_ref().map(|open| self.age_deadline(open));
        let retry = carrier_up
            .then(|| self.waiting.keys().next().map(|(due, _)| *due))
            .flatten();
        let expiry = self.expiries.first().map(|(at, _)| *at);
        let verdict = self.with_hook.as_ref().map(|offered| offered.deadline);
        [age, retry, expiry, verdict].into_iter().flatten().min()
    }
}
