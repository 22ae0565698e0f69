//! Notices of appended frames (`docs/cluster.md#live-delivery`): after a frame is journaled
//! through any node, a core NATS message on the account's `appended` subject carries its seq to
//! whichever node holds the account's connection, which then reads the frame from the journal.
//! The journal stays the only source of frames, so their order and `seq` are the journal's.
//!
//! A notice is a hint, at most once: one lost (the appending node died between the
//! acknowledgement and the notice) delays the frame until the next notice or the reader's next
//! look at the journal, and never loses it.

use async_nats::Subscriber;
use futures_util::StreamExt;

use super::{ClusterError, JetStreamStore};

/// The seqs of frames appended to one account's journal, as their notices arrive: in no
/// guaranteed order, possibly with gaps.
pub struct Appends {
    notices: Subscriber,
}

impl Appends {
    /// The next notice's seq; `None` once the connection to NATS is closed for good.
    pub async fn next(&mut self) -> Option<u64> {
        loop {
            let notice = self.notices.next().await?;
            // A notice that does not parse is nobody's frame: the journal is read on the next.
            if let Some(seq) = std::str::from_utf8(&notice.payload)
                .ok()
                .and_then(|text| text.parse().ok())
            {
                return Some(seq);
            }
        }
    }
}

impl JetStreamStore {
    /// Subscribes to the notices of frames appended to `account`'s journal through any node.
    /// Notices published before the subscription is in place
    /// ([`JetStreamStore::subscriptions_in_place`]) are not received: a reader subscribes first,
    /// then reads the journal.
    pub async fn appended(&self, account: &str) -> Result<Appends, ClusterError> {
        let notices = self.subscribe(self.inner.names.appended(account)).await?;
        Ok(Appends { notices })
    }

    /// Publishes the notice of `seq`, appended to `account`'s journal. The frame is durable
    /// already; a notice that cannot be sent leaves it to the reader's next look.
    pub(super) async fn notify_appended(&self, account: &str, seq: u64) {
        let subject = self.inner.names.appended(account);
        if let Err(e) = self
            .inner
            .client
            .publish(subject, seq.to_string().into())
            .await
        {
            tracing::debug!(error = %e, "the notice of an appended frame was not sent");
        }
    }
}
