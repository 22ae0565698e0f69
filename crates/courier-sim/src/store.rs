//! One device's storage as the client's SQLite store keeps it: the engine's `StoreOp`s applied
//! in commit batches with the same row semantics (upserts, insert-or-ignore, deletes), and the
//! same loads at start. A crash keeps exactly what was committed.

use std::collections::BTreeMap;

use courier_engine::{
    InboundKey, Millis, OutboxRecord, PendingInbound, ProcessedKey, Settlement, StoreOp,
};

#[derive(Debug, Default)]
pub struct Store {
    /// Live outbox rows by id.
    pub outbox: BTreeMap<String, OutboxRecord>,
    /// How settled ids ended (a later `Put` of the id forgets it, as the real store does).
    pub settled: BTreeMap<String, Settlement>,
    /// Processed inbound keys and when they were first processed (insert-or-ignore).
    pub processed: BTreeMap<InboundKey, Millis>,
    /// Buffered inbound rows (insert-or-ignore: the first copy is kept), with their insertion
    /// order for the load's tie-break.
    pub pending: BTreeMap<InboundKey, (u64, PendingInbound)>,
    next_rowid: u64,
}

impl Store {
    /// Applies one step's ops in order, all at once (one transaction).
    pub fn commit(&mut self, ops: &[StoreOp]) {
        for op in ops {
            match op {
                StoreOp::Put(record) => {
                    self.settled.remove(&record.message.id);
                    self.outbox
                        .insert(record.message.id.clone(), record.clone());
                }
                StoreOp::Settle { id, settlement, .. } => {
                    self.outbox.remove(id);
                    self.settled.insert(id.clone(), settlement.clone());
                }
                StoreOp::MarkProcessed(key) => {
                    self.processed.entry(inbound_key(key)).or_insert(key.at);
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
            }
        }
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
            .map(|(at, key)| ProcessedKey {
                chat: key.chat,
                sender: key.sender,
                message_id: key.message_id,
                at,
            })
            .collect()
    }

    /// Every buffered row, oldest received first.
    pub fn load_pending(&self) -> Vec<PendingInbound> {
        let mut rows: Vec<&(u64, PendingInbound)> = self.pending.values().collect();
        rows.sort_by_key(|(rowid, row)| (row.received_at, *rowid));
        rows.into_iter().map(|(_, row)| row.clone()).collect()
    }

    pub fn is_processed(&self, key: &InboundKey) -> bool {
        self.processed.contains_key(key)
    }
}

pub fn inbound_key(key: &ProcessedKey) -> InboundKey {
    InboundKey {
        chat: key.chat.clone(),
        sender: key.sender.clone(),
        message_id: key.message_id.clone(),
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
