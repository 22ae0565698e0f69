//! One device's storage as the client's SQLite store keeps it: the engine's `StoreOp`s applied
//! in commit batches with the same row semantics (upserts, insert-or-ignore, deletes), the
//! terminal events held with their settlements until their dispatch is recorded (schema v5), the
//! group message trackers (`store/groups.rs`: a row per group message, its members' states
//! updated in place, marked done rather than deleted), the MLS session rows written in the same
//! transaction as the step that changed them, and the same loads at start. A crash keeps exactly
//! what was committed.

use std::collections::BTreeMap;

use courier_crypto::{Change, RowKey};
use courier_engine::{
    Event, GroupSendRecord, InboundKey, Millis, OutboxRecord, PendingInbound, ProcessedKey,
    Settlement, StoreOp,
};

/// A `settled` row.
#[derive(Debug)]
pub struct Settled {
    pub settlement: Settlement,
    pub at: Millis,
    /// The terminal event committed with the settlement whose dispatch is not recorded yet
    /// (`unreported_event`; the event stands for its JSON).
    pub unreported: Option<Event>,
}

/// The terminal-event bookkeeping of one commit (the client's `store::Reports`).
#[derive(Debug, Default)]
pub struct Reports {
    /// This step's terminal events, about to be dispatched: `(message id, event)`.
    pub held: Vec<(String, Event)>,
    /// Ids whose terminal events were dispatched since the previous commit.
    pub done: Vec<String>,
}

/// A group message's tracker row.
#[derive(Debug)]
pub struct GroupRow {
    pub record: GroupSendRecord,
    /// Nothing of it is left to deliver: kept for status, not restored.
    pub done: bool,
}

#[derive(Debug, Default)]
pub struct Store {
    /// Live outbox rows by id.
    pub outbox: BTreeMap<String, OutboxRecord>,
    /// How settled ids ended (a later `Put` of the id forgets it, as the real store does).
    pub settled: BTreeMap<String, Settled>,
    /// Processed inbound keys and when they were first processed (insert-or-ignore).
    pub processed: BTreeMap<InboundKey, Millis>,
    /// Verified control frames' keys, kept by age only (insert-or-ignore).
    pub controls: BTreeMap<InboundKey, Millis>,
    /// Buffered inbound rows (insert-or-ignore: the first copy is kept), with their insertion
    /// order for the load's tie-break.
    pub pending: BTreeMap<InboundKey, (u64, PendingInbound)>,
    /// Group message trackers by id.
    pub group_sends: BTreeMap<String, GroupRow>,
    next_rowid: u64,
    /// The end-to-end session state as `courier_crypto::Sessions` hands its rows over.
    sessions: BTreeMap<RowKey, Vec<u8>>,
}

impl Store {
    /// Applies one step's ops in order, then records the dispatched terminal events and holds
    /// the new ones, and writes the session rows the step changed, all at once (one
    /// transaction). An event is held in its settlement's row: without one (re-accepted in this
    /// very step) there is nothing to hold it in.
    pub fn commit(&mut self, ops: &[StoreOp], reports: &Reports, sessions: Vec<Change>) {
        for Change { key, value } in sessions {
            match value {
                Some(value) => self.sessions.insert(key, value),
                None => self.sessions.remove(&key),
            };
        }
        for op in ops {
            match op {
                StoreOp::Put(record) => {
                    self.settled.remove(&record.message.id);
                    self.outbox
                        .insert(record.message.id.clone(), record.clone());
                }
                StoreOp::Settle {
                    id, settlement, at, ..
                } => {
                    self.outbox.remove(id);
                    let row = Settled {
                        settlement: settlement.clone(),
                        at: *at,
                        unreported: None,
                    };
                    self.settled.insert(id.clone(), row);
                }
                StoreOp::MarkProcessed(key) => {
                    self.processed.entry(key.key.clone()).or_insert(key.at);
                }
                StoreOp::MarkControl(key) => {
                    self.controls.entry(key.key.clone()).or_insert(key.at);
                }
                StoreOp::BufferInbound(rows) => {
                    for row in rows {
                        if !self.pending.contains_key(&row.key) {
                            self.next_rowid += 1;
                            self.pending
                                .insert(row.key.clone(), (self.next_rowid, row.clone()));
                        }
                    }
                }
                StoreOp::CommitInbound { keys, at } => {
                    for key in keys {
                        self.pending.remove(key);
                        self.processed.entry(key.clone()).or_insert(*at);
                    }
                }
                StoreOp::ExpireInbound { keys } => {
                    for key in keys {
                        self.pending.remove(key);
                    }
                }
                // An upsert that keeps the first message and creation time and the done mark,
                // and upserts each member's state.
                StoreOp::PutGroupSend(record) => match self.group_sends.get_mut(&record.id) {
                    Some(row) => {
                        row.record.path = record.path;
                        row.record.members.extend(
                            record
                                .members
                                .iter()
                                .map(|(member, state)| (member.clone(), *state)),
                        );
                    }
                    None => {
                        let row = GroupRow {
                            record: record.clone(),
                            done: false,
                        };
                        self.group_sends.insert(record.id.clone(), row);
                    }
                },
                StoreOp::GroupMember { id, member, state } => {
                    if let Some(slot) = self
                        .group_sends
                        .get_mut(id)
                        .and_then(|row| row.record.members.get_mut(member))
                    {
                        *slot = *state;
                    }
                }
                StoreOp::GroupSendDone { id } => {
                    if let Some(row) = self.group_sends.get_mut(id) {
                        row.done = true;
                    }
                }
            }
        }
        for id in &reports.done {
            if let Some(row) = self.settled.get_mut(id) {
                row.unreported = None;
            }
        }
        for (id, event) in &reports.held {
            if let Some(row) = self.settled.get_mut(id) {
                row.unreported = Some(event.clone());
            }
        }
    }

    /// Terminal events committed but never reported, oldest settlement first.
    pub fn unreported(&self) -> Vec<(String, Event)> {
        let mut held: Vec<(Millis, &String, &Event)> = self
            .settled
            .iter()
            .filter_map(|(id, row)| Some((row.at, id, row.unreported.as_ref()?)))
            .collect();
        held.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
        held.into_iter()
            .map(|(_, id, event)| (id.clone(), event.clone()))
            .collect()
    }

    /// Every outbox row, oldest accepted first.
    pub fn load_outbox(&self) -> Vec<OutboxRecord> {
        let mut rows: Vec<OutboxRecord> = self.outbox.values().cloned().collect();
        rows.sort_by(|a, b| {
            a.created_at
                .cmp(&b.created_at)
                .then_with(|| a.message.id.cmp(&b.message.id))
        });
        rows
    }

    /// The group messages with something left to deliver, oldest first.
    pub fn load_group_sends(&self) -> Vec<GroupSendRecord> {
        let mut rows: Vec<GroupSendRecord> = self
            .group_sends
            .values()
            .filter(|row| !row.done)
            .map(|row| row.record.clone())
            .collect();
        rows.sort_by(|a, b| {
            a.created_at
                .cmp(&b.created_at)
                .then_with(|| a.id.cmp(&b.id))
        });
        rows
    }

    /// Prunes processed keys older than `now - retention_ms` and the oldest beyond `max`, then
    /// returns the rest, oldest first.
    pub fn load_processed(
        &mut self,
        now: Millis,
        retention_ms: u64,
        max: usize,
    ) -> Vec<ProcessedKey> {
        let cutoff = now.saturating_sub(retention_ms);
        self.processed.retain(|_, at| *at >= cutoff);
        let mut keys: Vec<(Millis, InboundKey)> = self
            .processed
            .iter()
            .map(|(key, at)| (*at, key.clone()))
            .collect();
        keys.sort();
        let excess = keys.len().saturating_sub(max);
        for (_, key) in keys.drain(..excess) {
            self.processed.remove(&key);
        }
        keys.into_iter()
            .map(|(at, key)| ProcessedKey { key, at })
            .collect()
    }

    /// Prunes control keys processed `CONTROL_REPLAY_WINDOW_MS` or more before `now`, then returns
    /// the rest, oldest first.
    pub fn load_controls(&mut self, now: Millis) -> Vec<ProcessedKey> {
        let cutoff = now.saturating_sub(courier_proto::CONTROL_REPLAY_WINDOW_MS);
        self.controls.retain(|_, at| *at > cutoff);
        let mut keys: Vec<ProcessedKey> = self
            .controls
            .iter()
            .map(|(key, at)| ProcessedKey {
                key: key.clone(),
                at: *at,
            })
            .collect();
        keys.sort_by(|a, b| a.at.cmp(&b.at).then_with(|| a.key.cmp(&b.key)));
        keys
    }

    /// Every buffered row, oldest received first.
    pub fn load_pending(&self) -> Vec<PendingInbound> {
        let mut rows: Vec<&(u64, PendingInbound)> = self.pending.values().collect();
        rows.sort_by_key(|(rowid, row)| (row.received_at, *rowid));
        rows.into_iter().map(|(_, row)| row.clone()).collect()
    }

    /// The session rows, for `Sessions::restore`.
    pub fn load_sessions(&self) -> Vec<(RowKey, Vec<u8>)> {
        self.sessions
            .iter()
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect()
    }

    pub fn is_processed(&self, key: &InboundKey) -> bool {
        self.processed.contains_key(key) || self.controls.contains_key(key)
    }
}

/// The dedup key of a direct message (the chat of a DM is its sender).
pub fn key_of(sender: &str, message_id: &str) -> InboundKey {
    InboundKey {
        chat: sender.to_owned(),
        sender: sender.to_owned(),
        message_id: message_id.to_owned(),
    }
}
