//! Each account's journal as the messages of one subject of the journal stream
//! (`docs/cluster.md#journal`): appending (answered once JetStream acknowledged the frame,
//! replicated and on disk), the drain's reads, releases by ack, and the relay-side dedup.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{
    DeleteMessageErrorKind, DirectGetErrorKind, LastRawMessageErrorKind,
};
use async_nats::jetstream::ErrorCode;
use async_nats::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::names::token;
use super::record::write_on_revision;
use super::usage::Weight;
use super::{lost_race, request, ClusterError, JetStreamStore};
use crate::mailbox::{row_bytes, Envelope, GroupTag};
use crate::store::{Named, Release};

/// One journal read returns at most this many frames / content bytes (at least one frame), as
/// the SQLite journal's does.
const FETCH_FRAMES: usize = 64;
const FETCH_BYTES: usize = 4 * 1024 * 1024;

/// How long an append waits for the journal stream to have a leader again, within the relay's
/// bound on its work on a frame (`docs/protocol.md#sending`).
const ELECTION_WAIT: Duration = Duration::from_secs(4);
const ELECTION_POLL: Duration = Duration::from_millis(50);

/// How many times an append reads again after other appends to the same account took the
/// subject's next sequence first, before it fails as contended.
const CONTENDED_ATTEMPTS: u32 = 32;

/// The header a frame carries its dedup key in, so a read finds the copy of a resend.
const DEDUP_KEY_HEADER: &str = "Courier-Dedup-Key";

/// What one conditional publish did.
enum Attempt {
    Stored(u64),
    /// The journal holds this frame's copy already, at this stream sequence.
    Held(u64),
    Full,
    /// Another append took the account's next sequence first.
    Overtaken,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Journaled, replicated and durable, as `seq`.
    Accepted {
        seq: u64,
    },
    /// The recipient's journal already holds this (sender, message_id).
    Duplicate,
    UnknownRecipient,
    MailboxFull,
}

/// The dedup record of one (recipient, sender, message_id).
#[derive(Clone, Copy)]
struct DedupRecord {
    /// The account subject's last stream sequence when the frame was last published.
    mark: Option<u64>,
    revision: u64,
}

/// A frame as the stream holds it.
#[derive(Serialize, Deserialize)]
struct Frame {
    sender: String,
    sender_account: String,
    message_id: String,
    content: String,
    reply_to_msg: Option<String>,
    accepted_ms: u64,
    group_id: Option<String>,
    forward_info: Option<Value>,
}

impl Frame {
    fn new(envelope: &Envelope) -> Self {
        Self {
            sender: envelope.sender.clone(),
            sender_account: envelope.sender_account.clone(),
            message_id: envelope.message_id.clone(),
            content: envelope.content.to_string(),
            reply_to_msg: envelope.reply_to_msg.clone(),
            accepted_ms: envelope.accepted_ms,
            group_id: envelope.group.as_ref().map(|g| g.group_id.clone()),
            forward_info: envelope.group.as_ref().and_then(|g| g.forward_info.clone()),
        }
    }

    fn into_envelope(self, seq: u64) -> Envelope {
        Envelope {
            seq: Some(seq),
            sender: self.sender,
            sender_account: self.sender_account,
            message_id: self.message_id,
            content: self.content.into(),
            reply_to_msg: self.reply_to_msg,
            accepted_ms: self.accepted_ms,
            group: self.group_id.map(|group_id| GroupTag {
                group_id,
                forward_info: self.forward_info,
            }),
        }
    }
}

/// The `seq` of the account's frame at stream sequence `stream_seq` (`accounts.rs`).
fn seq_of(base: u64, stream_seq: u64) -> u64 {
    (stream_seq + 1).saturating_sub(base)
}

/// The stream sequence of the account's frame `seq` (≥ 1).
fn stream_seq_of(base: u64, seq: u64) -> u64 {
    base.saturating_add(seq.saturating_sub(1))
}

impl JetStreamStore {
    /// Journals `envelope` for the account `recipient` names (an address through its binding
    /// now). Answers once JetStream acknowledged it: on disk on a majority of the stream's
    /// replicas. A frame past the mailbox limits (`docs/cluster.md#mailbox-limits`) is refused.
    pub async fn append(
        &self,
        recipient: Named,
        envelope: &Envelope,
    ) -> Result<Appended, ClusterError> {
        let account = match recipient {
            Named::Account(account) => account,
            Named::Address(address) => match self.resolve_address(&address).await? {
                Some(account) => account,
                None => return Ok(Appended::UnknownRecipient),
            },
        };
        let Some(base) = self.base(&account).await? else {
            return Ok(Appended::UnknownRecipient);
        };
        let subject = self.inner.names.journal(&account);
        // Group copies are deduplicated by their broadcast, not here, as in the SQLite journal.
        let dedup_key = envelope
            .group
            .is_none()
            .then(|| token(&[&account, &envelope.sender, &envelope.message_id]));
        let frame = Frame::new(envelope);
        let weight = Weight {
            sender: token(&[&envelope.sender_account]),
            bytes: row_bytes(
                envelope,
                frame.forward_info.as_ref().map(Value::to_string).as_deref(),
            ),
        };
        let payload = serde_json::to_vec(&frame).map_err(request)?;
        // The publish is conditional on the account's subject ending where this append read
        // it: the frame lands right after what the dedup check saw, or not at all. A lost
        // answer, an election, or another node's append in between is resolved by reading
        // again, never by publishing blindly (`docs/cluster.md#relay-side-dedup`).
        let unsettled_until = tokio::time::Instant::now() + ELECTION_WAIT;
        let mut contended = 0;
        let mut unsettled = false;
        loop {
            let outcome = self
                .append_once(
                    &account,
                    &subject,
                    dedup_key.as_deref(),
                    &weight,
                    payload.clone(),
                )
                .await;
            match outcome {
                Ok(Attempt::Stored(stream_seq)) => {
                    let seq = seq_of(base, stream_seq);
                    self.notify_appended(&account, seq).await;
                    return Ok(Appended::Accepted { seq });
                }
                // After a publish without an answer the copy found may be this append's own, or
                // another node's that took the same frame meanwhile: either way a duplicate for
                // the sender, and the recipient's node is told in case no one told it.
                Ok(Attempt::Held(stream_seq)) => {
                    if unsettled {
                        self.notify_appended(&account, seq_of(base, stream_seq))
                            .await;
                    }
                    return Ok(Appended::Duplicate);
                }
                Ok(Attempt::Full) => return Ok(Appended::MailboxFull),
                Ok(Attempt::Overtaken) => {
                    contended += 1;
                    if contended >= CONTENDED_ATTEMPTS {
                        return Err(ClusterError::Contended(CONTENDED_ATTEMPTS));
                    }
                    // Appends racing in lockstep would overtake each other again: each waits a
                    // random while, longer with every round it lost.
                    tokio::time::sleep(contention_backoff(contended)).await;
                }
                Err(e @ ClusterError::Corrupt(_)) => return Err(e),
                // No leader, or an answer lost: the frame may or may not be stored. The next
                // round's read tells, once a leader answers.
                Err(e) if tokio::time::Instant::now() >= unsettled_until => return Err(e),
                Err(_) => {
                    unsettled = true;
                    tokio::time::sleep(ELECTION_POLL).await;
                }
            }
        }
    }

    /// One round of an append: read where the account's subject ends, look for the frame's
    /// copy from the dedup record's mark up to there, check the mailbox has room for it, mark
    /// the record, publish on condition.
    async fn append_once(
        &self,
        account: &str,
        subject: &str,
        dedup_key: Option<&str>,
        weight: &Weight,
        payload: Vec<u8>,
    ) -> Result<Attempt, ClusterError> {
        let last = self.subject_last(subject).await?;
        let mut headers = HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            last.to_string().as_str(),
        );
        let record = match dedup_key {
            Some(key) => {
                let record = self.dedup_record(key).await?;
                if let Some(mark) = record.and_then(|r| r.mark) {
                    if let Some(stream_seq) = self.copy_after(subject, key, mark, last).await? {
                        return Ok(Attempt::Held(stream_seq));
                    }
                }
                record
            }
            None => None,
        };
        // Checked through `last`: the conditional publish stores the frame only if nothing was
        // appended to the account since.
        if !self.has_room(account, subject, last, weight).await? {
            return Ok(Attempt::Full);
        }
        weight.write(&mut headers);
        if let Some(key) = dedup_key {
            // Before the publish: a copy of this frame can only land right after `last`, so a
            // resend after a lost answer, through any node, finds it there. Only on the
            // revision read: an append that read the record before another one marked it has
            // not looked for that one's copy, and must not hide it behind an older mark.
            let revision = record.map(|r| r.revision);
            let marked =
                write_on_revision(&self.inner.dedup, key, last.to_string().into(), revision)
                    .await?;
            if !marked {
                return Ok(Attempt::Overtaken);
            }
            headers.insert(DEDUP_KEY_HEADER, key);
        }
        let published = self
            .inner
            .js
            .publish_with_headers(subject.to_string(), headers, payload.into())
            .await
            .map_err(request)?
            .await;
        match published {
            Ok(ack) => {
                self.inner
                    .tallies
                    .stored(account, last, ack.sequence, weight);
                Ok(Attempt::Stored(ack.sequence))
            }
            Err(e) if refused_for_room(&e) => Ok(Attempt::Full),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence || lost_race(&e) => {
                Ok(Attempt::Overtaken)
            }
            Err(e) => Err(request(e)),
        }
    }

    /// The stream sequence of the account subject's last frame (0 for none), from the stream's
    /// leader: a replica's direct answer may lag behind frames already acknowledged.
    pub(super) async fn subject_last(&self, subject: &str) -> Result<u64, ClusterError> {
        match self
            .inner
            .journal
            .get_last_raw_message_by_subject(subject)
            .await
        {
            Ok(message) => Ok(message.sequence),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(0),
            Err(e) => Err(request(e)),
        }
    }

    /// The dedup record for `key`, read from the bucket's leader.
    async fn dedup_record(&self, key: &str) -> Result<Option<DedupRecord>, ClusterError> {
        let dedup = &self.inner.dedup;
        let record = format!("{}{key}", dedup.prefix);
        let message = match dedup.stream.get_last_raw_message_by_subject(&record).await {
            Ok(message) => message,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(e) => return Err(request(e)),
        };
        // A deleted or purged record (never written by this store) holds no mark.
        let mark = if message.payload.is_empty() {
            None
        } else {
            let mark = std::str::from_utf8(&message.payload)
                .ok()
                .and_then(|text| text.parse().ok())
                .ok_or_else(|| ClusterError::Corrupt(format!("dedup record {key}")))?;
            Some(mark)
        };
        Ok(Some(DedupRecord {
            mark,
            revision: message.sequence,
        }))
    }

    /// The stream sequence of the frame's copy carrying `key`, if the journal holds it: the
    /// subject's first frame after `mark`, up to `last`. Every mark is written on the revision
    /// its append read, after that append looked for the copy of the mark before, so the only
    /// copy that can be stored and not yet found is the one published on the latest mark.
    async fn copy_after(
        &self,
        subject: &str,
        key: &str,
        mark: u64,
        last: u64,
    ) -> Result<Option<u64>, ClusterError> {
        if mark >= last {
            return Ok(None);
        }
        let Some(message) = self.first_from(subject, mark + 1).await? else {
            return Ok(None);
        };
        let carried = message
            .headers
            .get(DEDUP_KEY_HEADER)
            .is_some_and(|value| value.as_str() == key);
        Ok((carried && message.sequence <= last).then_some(message.sequence))
    }

    /// The subject's first frame at stream sequence `from` or after, from the stream's leader: a
    /// replica's direct answer may lag behind frames already acknowledged.
    pub(super) async fn first_from(
        &self,
        subject: &str,
        from: u64,
    ) -> Result<Option<StreamMessage>, ClusterError> {
        match self
            .inner
            .journal
            .get_first_raw_message_by_subject(subject, from)
            .await
        {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(request(e)),
        }
    }

    /// Whether the stream still holds a frame of `subject` at `stream_seq`.
    async fn holds(&self, subject: &str, stream_seq: u64) -> Result<bool, ClusterError> {
        match self.inner.journal.direct_get(stream_seq).await {
            Ok(message) => Ok(message.subject.as_str() == subject),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(false),
            Err(e) => Err(request(e)),
        }
    }

    /// Whether the account's journal still holds its frame `seq`.
    pub(super) async fn holds_seq(&self, account: &str, seq: u64) -> Result<bool, ClusterError> {
        let Some(base) = self.base(account).await? else {
            return Ok(false);
        };
        let subject = self.inner.names.journal(account);
        self.holds(&subject, stream_seq_of(base, seq)).await
    }

    /// The drain bound S: no frame of the account journaled so far has a higher seq, and every
    /// frame journaled from now on has a higher one.
    pub async fn highest_seq(&self, account: &str) -> Result<u64, ClusterError> {
        let Some(base) = self.base(account).await? else {
            return Ok(0);
        };
        let info = self.inner.journal.get_info().await.map_err(request)?;
        let last = info.state.last_sequence;
        Ok(if last < base { 0 } else { seq_of(base, last) })
    }

    /// Unexpired frames of the account with `after < seq ≤ up_to`, in seq order, one bounded
    /// batch.
    pub async fn fetch(
        &self,
        account: &str,
        after: u64,
        up_to: u64,
        not_before_ms: u64,
    ) -> Result<Vec<Arc<Envelope>>, ClusterError> {
        let Some(base) = self.base(account).await? else {
            return Ok(Vec::new());
        };
        let subject = self.inner.names.journal(account);
        let mut frames = Vec::new();
        let mut bytes = 0;
        let mut next = stream_seq_of(base, after.saturating_add(1));
        while frames.len() < FETCH_FRAMES && bytes < FETCH_BYTES {
            // From the stream's leader: a drain that missed a frame would end before S.
            let Some(message) = self.first_from(&subject, next).await? else {
                break;
            };
            let seq = seq_of(base, message.sequence);
            if seq > up_to {
                break;
            }
            next = message.sequence + 1;
            let frame: Frame = serde_json::from_slice(&message.payload)
                .map_err(|e| ClusterError::Corrupt(e.to_string()))?;
            if frame.accepted_ms >= not_before_ms {
                bytes += frame.content.len();
                frames.push(Arc::new(frame.into_envelope(seq)));
            }
        }
        Ok(frames)
    }

    /// Deletes what an ack releases. A seq that names no frame of this account (released,
    /// expired, or another account's stream sequence) deletes nothing.
    pub async fn release(&self, account: &str, release: Release) -> Result<(), ClusterError> {
        let Some(base) = self.base(account).await? else {
            return Ok(());
        };
        let subject = self.inner.names.journal(account);
        match release {
            Release::One(0) | Release::UpTo(0) => {}
            Release::One(seq) => {
                let stream_seq = stream_seq_of(base, seq);
                if self.holds(&subject, stream_seq).await? {
                    match self.inner.journal.delete_message(stream_seq).await {
                        // Gone already: released meanwhile through another node, or expired.
                        Ok(_) => {}
                        Err(e)
                            if matches!(e.kind(), DeleteMessageErrorKind::JetStream(error)
                                if [ErrorCode::NO_MESSAGE_FOUND, ErrorCode::STREAM_MESSAGE_DELETE_FAILED]
                                    .contains(&error.error_code())) => {}
                        Err(e) => return Err(request(e)),
                    }
                }
            }
            Release::UpTo(seq) => {
                // Purges the subject's messages below the given stream sequence.
                self.inner
                    .journal
                    .purge()
                    .filter(subject)
                    .sequence(stream_seq_of(base, seq).saturating_add(1))
                    .await
                    .map_err(request)?;
            }
        }
        Ok(())
    }
}

/// A random wait below 1 ms × 2^(rounds lost), capped at 64 ms.
pub(super) fn contention_backoff(lost: u32) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let ceiling_us = 1000u64 << lost.min(6);
    // A fresh `RandomState` is randomly keyed: its hash of nothing is a random number.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    Duration::from_micros(random % ceiling_us)
}

/// Whether a publish was refused because the account's subject or the whole stream is at its
/// limit (`discard: new`).
fn refused_for_room(e: &async_nats::jetstream::context::PublishError) -> bool {
    if e.kind() != PublishErrorKind::Other {
        return false;
    }
    std::error::Error::source(e)
        .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>())
        // The code of every store refusal (`maximum messages per subject exceeded`, `maximum
        // bytes exceeded`) under `discard: new`.
        .is_some_and(|error| error.error_code() == ErrorCode::STREAM_STORE_FAILED)
}
