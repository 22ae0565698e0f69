//! Contacts for `--presence-visibility contacts` (`docs/protocol.md#presence-visibility`): each
//! pair of accounts that exchanged a message, once, in the `contacts` bucket. Every node follows
//! the bucket into its memory ([`JetStreamStore::contact_changes`]), so a presence look-up never
//! waits for NATS, as in the single-file relay.

use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};

use super::feed::{put, Feed};
use super::names::token;
use super::{lost_race, request, ClusterError, JetStreamStore};

#[derive(Serialize, Deserialize)]
struct Pair {
    a: String,
    b: String,
}

impl JetStreamStore {
    /// Records that `a` and `b` exchanged a message; a pair recorded before is left alone.
    pub async fn record_contact(&self, a: &str, b: &str) -> Result<(), ClusterError> {
        let (a, b) = if a <= b { (a, b) } else { (b, a) };
        let value = serde_json::to_vec(&Pair {
            a: a.to_owned(),
            b: b.to_owned(),
        })
        .map_err(request)?;
        match self
            .inner
            .contacts
            .create(token(&[a, b]), value.into())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists || lost_race(&e) => Ok(()),
            Err(e) => Err(request(e)),
        }
    }

    /// Follows every recorded pair from the start.
    pub async fn contact_changes(&self) -> Result<Feed<(String, String)>, ClusterError> {
        Feed::start(&self.inner.contacts, |entry| {
            put::<Pair>(&entry).map(|pair| pair.map(|pair| (pair.a, pair.b)))
        })
        .await
    }
}
