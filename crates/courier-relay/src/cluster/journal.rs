//! Each account's journal as the messages of one subject of the journal stream
//! (`docs/cluster.md#journal`): appending (answered once JetStream acknowledged the frame,
//! replicated and on disk), the drain's reads, releases by ack, and the relay-side dedup.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream::{DeleteMessageErrorKind, DirectGetErrorKind};
use async_nats::jetstream::ErrorCode;
use async_nats::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::names::token;
use super::{request, ClusterError, JetStreamStore};
use crate::mailbox::{Envelope, GroupTag};
use crate::store::{Named, Release};

/// One journal read returns at most this many frames / content bytes (at least one frame), as
/// the SQLite journal's does.
const FETCH_FRAMES: usize = 64;
const FETCH_BYTES: usize = 4 * 1024 * 1024;

/// How long an append waits for the journal stream to have a leader again, within the relay's
/// bound on its work on a frame (`docs/protocol.md#sending`).
const ELECTION_WAIT: Duration = Duration::from_secs(4);
const ELECTION_POLL: Duration = Duration::from_millis(50);

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
    /// replicas. A frame past the account's message count or the journal's bytes is refused.
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
        if let Some(key) = &dedup_key {
            if let Some(stream_seq) = self.recorded(key).await? {
                if self.holds(&subject, stream_seq).await? {
                    return Ok(Appended::Duplicate);
                }
            }
        }
        let payload = serde_json::to_vec(&Frame::new(envelope)).map_err(request)?;
        // The publish's id closes the race of two nodes journaling the same frame at once
        // (JetStream answers the second as a duplicate of the first). JetStream remembers an id
        // for its window even past a release, while the protocol makes a resend after a release
        // a new frame: an id whose copy is released is chained into a new one, the same on every
        // node, so concurrent resends after a release still meet.
        let mut message_id = dedup_key.clone();
        let leaderless_until = tokio::time::Instant::now() + ELECTION_WAIT;
        let ack = loop {
            let mut headers = HeaderMap::new();
            if let Some(id) = &message_id {
                headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
            }
            let ack = match self
                .inner
                .js
                .publish_with_headers(subject.clone(), headers, payload.clone().into())
                .await
                .map_err(request)?
                .await
            {
                Ok(ack) => ack,
                Err(e) if refused_for_room(&e) => return Ok(Appended::MailboxFull),
                // No server answered for the stream: it has no leader (an election after a
                // server's loss), and nothing was stored, so publishing again is safe.
                Err(e)
                    if e.kind() == PublishErrorKind::StreamNotFound
                        && tokio::time::Instant::now() < leaderless_until =>
                {
                    tokio::time::sleep(ELECTION_POLL).await;
                    continue;
                }
                Err(e) => return Err(request(e)),
            };
            if !ack.duplicate {
                break ack;
            }
            if self.holds(&subject, ack.sequence).await? {
                return Ok(Appended::Duplicate);
            }
            let released = ack.sequence.to_string();
            message_id = message_id.map(|id| token(&[&id, &released]));
        };
        // The frame is journaled once acknowledged, whatever happens to its dedup record: an
        // error here would make the sender resend a frame that is already there. Without the
        // record, a resend within the publish window still meets the publish id.
        if let Some(key) = dedup_key {
            if let Err(e) = self
                .inner
                .dedup
                .put(key, ack.sequence.to_string().into())
                .await
            {
                tracing::warn!(error = %e, "a journaled frame's dedup record was not stored");
            }
        }
        let seq = seq_of(base, ack.sequence);
        self.notify_appended(&account, seq).await;
        Ok(Appended::Accepted { seq })
    }

    /// The stream sequence the dedup bucket recorded for `key`, if any.
    async fn recorded(&self, key: &str) -> Result<Option<u64>, ClusterError> {
        let Some(value) = self.inner.dedup.get(key).await.map_err(request)? else {
            return Ok(None);
        };
        std::str::from_utf8(&value)
            .ok()
            .and_then(|text| text.parse().ok())
            .map(Some)
            .ok_or_else(|| ClusterError::Corrupt(format!("dedup record {key}")))
    }

    /// Whether the stream still holds a frame of `subject` at `stream_seq`.
    async fn holds(&self, subject: &str, stream_seq: u64) -> Result<bool, ClusterError> {
        match self.inner.journal.direct_get(stream_seq).await {
            Ok(message) => Ok(message.subject.as_str() == subject),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(false),
            Err(e) => Err(request(e)),
        }
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
            let message = match self
                .inner
                .journal
                .direct_get_next_for_subject(subject.as_str(), Some(next))
                .await
            {
                Ok(message) => message,
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => break,
                Err(e) => return Err(request(e)),
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
