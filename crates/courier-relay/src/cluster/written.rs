//! Whether a frame of an account's journal was written to the account's connection on another
//! node (`docs/cluster.md#groups`): a broadcast's report says `delivered` for a member whose
//! connection took the copy, wherever that connection is. The node holding the connection answers
//! a request on the account's `written` subject once its writer has flushed the frame, or that
//! the connection ended; it says nothing while neither happened, and the asker's wait ends at its
//! deadline.

use std::time::Duration;

use async_nats::{RequestErrorKind, Subscriber};
use futures_util::StreamExt;

use super::{ClusterError, JetStreamStore};

/// What the node of a connection said of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The connection's writer flushed it.
    Yes,
    /// No connection of the account was there to write it, or it ended first: the frame waits in
    /// the journal for the next one.
    Gone,
    /// Neither within the wait.
    Late,
}

const WRITTEN: &[u8] = b"written";
const GONE: &[u8] = b"gone";

impl JetStreamStore {
    /// Asks the node of `account`'s connection whether it writes the frame `seq` within `wait`.
    pub async fn written(&self, account: &str, seq: u64, wait: Duration) -> Written {
        let ask = async_nats::Request::new()
            .payload(format!("{seq} {}", wait.as_millis()).into())
            .timeout(Some(wait));
        let subject = self.inner.names.written(account);
        match self.inner.client.send_request(subject, ask).await {
            Ok(answer) if answer.payload.as_ref() == WRITTEN => Written::Yes,
            Ok(answer) if answer.payload.as_ref() == GONE => Written::Gone,
            Ok(_) => Written::Late,
            Err(e) if e.kind() == RequestErrorKind::NoResponders => Written::Gone,
            Err(e) => {
                if e.kind() != RequestErrorKind::TimedOut {
                    tracing::debug!(error = %e, "asking whether a frame was written failed");
                }
                Written::Late
            }
        }
    }

    /// Subscribes to the questions about frames of `account`, for the node of its connection;
    /// in place once [`JetStreamStore::subscriptions_in_place`] answered.
    pub async fn written_queries(&self, account: &str) -> Result<WrittenQueries, ClusterError> {
        let queries = self.subscribe(self.inner.names.written(account)).await?;
        Ok(WrittenQueries {
            queries,
            client: self.inner.client.clone(),
        })
    }
}

/// The questions about one account's frames, as they come.
pub struct WrittenQueries {
    queries: Subscriber,
    client: async_nats::Client,
}

/// One question: whether the frame `seq` is written within `wait`.
pub struct Query {
    pub seq: u64,
    pub wait: Duration,
    reply: async_nats::Subject,
    client: async_nats::Client,
}

impl WrittenQueries {
    /// The next question; `None` once the connection to NATS is closed for good.
    pub async fn next(&mut self) -> Option<Query> {
        loop {
            let question = self.queries.next().await?;
            let Some(reply) = question.reply else {
                continue;
            };
            let text = std::str::from_utf8(&question.payload).unwrap_or_default();
            let mut parts = text.split(' ').map(str::parse::<u64>);
            // A question that does not parse is left unanswered: its asker times out.
            if let (Some(Ok(seq)), Some(Ok(wait_ms))) = (parts.next(), parts.next()) {
                return Some(Query {
                    seq,
                    wait: Duration::from_millis(wait_ms),
                    reply,
                    client: self.client.clone(),
                });
            }
        }
    }
}

impl Query {
    /// Answers that the frame was written (`true`) or that the connection ended first.
    pub async fn answer(self, written: bool) {
        let answer = if written { WRITTEN } else { GONE };
        if let Err(e) = self.client.publish(self.reply, answer.into()).await {
            tracing::debug!(error = %e, "answering whether a frame was written failed");
        }
    }
}
