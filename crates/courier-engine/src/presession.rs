//! The pre-session queue (`docs/delivery.md#pre-session-queue`): messages accepted for a
//! recipient this device has no end-to-end session with yet. They wait here — durable, in
//! acceptance order — until the runtime reports the session ready, and then enter the outbox.
//!
//! The queue is bounded on count and on bytes, per recipient and in all, because content is the
//! application's and a count alone bounds neither memory nor storage. At a bound the oldest
//! waiting message (of the recipient, or of all) is failed until the new one fits. A message
//! waits at most `pending_session_max_lifetime_ms` from its acceptance; all share that lifetime,
//! so the oldest waiting message holds the earliest deadline.
//!
//! A recipient with waiting messages is on the presence watchlist: a setup that found nobody
//! (a device that never connected has no key package anywhere, and the relay refuses a round
//! trip to it) is tried again when the recipient comes online. Setup frames can also be lost in
//! transit (a key package or Welcome dropped with a connection), so the session is asked for
//! again on a timer as well: [`FIRST_REASK_MS`] after the recipient's first waiting message,
//! doubling up to [`MAX_REASK_MS`]. The runtime answers a repeat ask with the same key package,
//! and the peer a repeat key package with the same Welcome, so a repeat never forks a session.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use courier_proto::Message;

use crate::config::Config;
use crate::hook::content_bytes;
use crate::io::{EntryState, Millis, OutboxRecord};

/// Messages waiting for one recipient's session.
pub(crate) const PER_RECIPIENT_MESSAGES: usize = 64;
/// Messages waiting in all.
pub(crate) const MESSAGES: usize = 4096;
/// Content bytes waiting for one recipient's session.
pub(crate) const PER_RECIPIENT_BYTES: usize = 2 * 1024 * 1024;
/// Content bytes waiting in all.
pub(crate) const BYTES: usize = 16 * 1024 * 1024;

/// How long after its first waiting message a recipient's session is asked for again.
pub(crate) const FIRST_REASK_MS: Millis = 30_000;
/// The longest gap between two asks for the same recipient's session.
pub(crate) const MAX_REASK_MS: Millis = 30 * 60 * 1000;

/// A message accepted while its recipient had no session.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Waiting {
    pub message: Message,
    pub wire_id: String,
    /// When `sendMessage` accepted it: the lifetime counts from here.
    pub created_at: Millis,
}

impl Waiting {
    /// Its row in storage: an outbox row in state `AwaitingSession`.
    pub(crate) fn record(&self, config: &Config) -> OutboxRecord {
        OutboxRecord {
            message: self.message.clone(),
            state: EntryState::AwaitingSession,
            created_at: self.created_at,
            window_start: self.created_at,
            ack_attempts: 0,
            transport_retries: 0,
            next_at: Some(
                self.created_at
                    .saturating_add(config.pending_session_max_lifetime_ms),
            ),
            first_sent_at: None,
            last_sent_at: None,
        }
    }
}

#[derive(Debug)]
struct Recipient {
    /// Admission numbers of its waiting messages, oldest first.
    order: BTreeSet<u64>,
    bytes: usize,
    /// When its session is asked for again, and the gap after that.
    reask_at: Millis,
    reask_gap: Millis,
}

impl Recipient {
    fn new(now: Millis) -> Self {
        Self {
            order: BTreeSet::new(),
            bytes: 0,
            reask_at: now.saturating_add(FIRST_REASK_MS),
            reask_gap: FIRST_REASK_MS,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct PreSession {
    /// Every waiting message by admission number (acceptance order).
    waiting: BTreeMap<u64, (Waiting, usize)>,
    ids: HashMap<String, u64>,
    wire_ids: HashMap<String, u64>,
    recipients: BTreeMap<String, Recipient>,
    bytes: usize,
    admitted: u64,
    /// Recipients whose queue was created or emptied since the last `take_touched`: the
    /// presence watchlist follows them.
    touched: BTreeSet<String>,
}

impl PreSession {
    pub(crate) fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether a message waits under this app id or wire id.
    pub(crate) fn holds(&self, id: &str) -> bool {
        self.ids.contains_key(id) || self.wire_ids.contains_key(id)
    }

    /// Admits `waiting` at `now`, after taking out the oldest messages (of its recipient, then
    /// of all) until it fits every bound; returns those, to be failed.
    pub(crate) fn admit(&mut self, waiting: Waiting, now: Millis) -> Vec<Waiting> {
        let bytes = content_bytes(&waiting.message);
        let recipient = waiting.message.recipient.clone();
        let mut evicted = Vec::new();
        while let Some(queue) = self.recipients.get(&recipient) {
            let full = queue.order.len() >= PER_RECIPIENT_MESSAGES
                || queue.bytes.saturating_add(bytes) > PER_RECIPIENT_BYTES;
            let Some(&oldest) = queue.order.first().filter(|_| full) else {
                break;
            };
            evicted.extend(self.remove(oldest));
        }
        while self.waiting.len() >= MESSAGES || self.bytes.saturating_add(bytes) > BYTES {
            let Some(&oldest) = self.waiting.keys().next() else {
                break;
            };
            evicted.extend(self.remove(oldest));
        }
        self.admitted += 1;
        let n = self.admitted;
        self.ids.insert(waiting.message.id.clone(), n);
        self.wire_ids.insert(waiting.wire_id.clone(), n);
        if !self.recipients.contains_key(&recipient) {
            self.touched.insert(recipient.clone());
        }
        let queue = self
            .recipients
            .entry(recipient)
            .or_insert_with(|| Recipient::new(now));
        queue.order.insert(n);
        queue.bytes += bytes;
        self.bytes += bytes;
        self.waiting.insert(n, (waiting, bytes));
        evicted
    }

    fn remove(&mut self, n: u64) -> Option<Waiting> {
        let (waiting, bytes) = self.waiting.remove(&n)?;
        self.ids.remove(&waiting.message.id);
        self.wire_ids.remove(&waiting.wire_id);
        self.bytes -= bytes;
        let recipient = &waiting.message.recipient;
        if let Some(queue) = self.recipients.get_mut(recipient) {
            queue.order.remove(&n);
            queue.bytes -= bytes;
            if queue.order.is_empty() {
                self.recipients.remove(recipient);
                self.touched.insert(recipient.clone());
            }
        }
        Some(waiting)
    }

    /// Takes out the message the app named `id`, if it waits here.
    pub(crate) fn withdraw(&mut self, id: &str) -> Option<Waiting> {
        let n = *self.ids.get(id)?;
        self.remove(n)
    }

    /// Whether messages wait for `recipient`'s session.
    pub(crate) fn waits_for(&self, recipient: &str) -> bool {
        self.recipients.contains_key(recipient)
    }

    /// Recipients that started or stopped waiting since the last call.
    pub(crate) fn take_touched(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.touched)
    }

    /// Everything waiting for `recipient`, oldest first: its session is ready.
    pub(crate) fn take(&mut self, recipient: &str) -> Vec<Waiting> {
        let order = self
            .recipients
            .get(recipient)
            .map(|queue| queue.order.iter().copied().collect::<Vec<_>>())
            .unwrap_or_default();
        order.into_iter().filter_map(|n| self.remove(n)).collect()
    }

    /// The recipients whose session is due to be asked for again at `now`; each one's next ask
    /// moves a doubled gap on.
    pub(crate) fn due_reasks(&mut self, now: Millis) -> Vec<String> {
        let mut due = Vec::new();
        for (recipient, queue) in &mut self.recipients {
            if queue.reask_at <= now {
                queue.reask_gap = queue.reask_gap.saturating_mul(2).min(MAX_REASK_MS);
                queue.reask_at = now.saturating_add(queue.reask_gap);
                due.push(recipient.clone());
            }
        }
        due
    }

    /// When a recipient's session is next asked for again.
    pub(crate) fn next_reask(&self) -> Option<Millis> {
        self.recipients.values().map(|queue| queue.reask_at).min()
    }

    /// The messages whose lifetime ended by `now`, oldest first.
    pub(crate) fn expire(&mut self, now: Millis, lifetime: Millis) -> Vec<Waiting> {
        let mut expired = Vec::new();
        while let Some((&n, (oldest, _))) = self.waiting.first_key_value() {
            if oldest.created_at.saturating_add(lifetime) > now {
                break;
            }
            expired.extend(self.remove(n));
        }
        expired
    }

    /// When the oldest waiting message's lifetime ends.
    pub(crate) fn next_expiry(&self, lifetime: Millis) -> Option<Millis> {
        let (oldest, _) = self.waiting.values().next()?;
        Some(oldest.created_at.saturating_add(lifetime))
    }

    #[cfg(test)]
    pub(crate) fn records<'a>(
        &'a self,
        config: &'a Config,
    ) -> impl Iterator<Item = OutboxRecord> + 'a {
        self.waiting.values().map(|(w, _)| w.record(config))
    }

    #[cfg(test)]
    pub(crate) fn recipients(&self) -> impl Iterator<Item = &String> + '_ {
        self.recipients.keys()
    }

    #[cfg(test)]
    pub(crate) fn check(&self) {
        let bytes: usize = self.waiting.values().map(|(_, b)| b).sum();
        assert_eq!(bytes, self.bytes, "pre-session bytes");
        let per_recipient: usize = self.recipients.values().map(|q| q.order.len()).sum();
        assert_eq!(per_recipient, self.waiting.len(), "pre-session recipients");
        assert_eq!(self.ids.len(), self.waiting.len(), "pre-session ids");
        assert!(self.waiting.len() <= MESSAGES && self.bytes <= BYTES);
        for queue in self.recipients.values() {
            let bytes: usize = queue.order.iter().map(|n| self.waiting[n].1).sum();
            assert_eq!(bytes, queue.bytes, "a recipient's pre-session bytes");
            assert!(
                queue.order.len() <= PER_RECIPIENT_MESSAGES && queue.bytes <= PER_RECIPIENT_BYTES
            );
        }
    }
}
