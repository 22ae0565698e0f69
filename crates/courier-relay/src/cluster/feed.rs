//! A key-value bucket followed from its first record (`docs/cluster.md#relay-nodes`): each
//! key's latest record as the feed starts, then every change in the order it was written.

use async_nats::jetstream::kv;
use futures_util::StreamExt;

use super::{request, ClusterError};

/// What one record of a bucket says, or `None` for one that says nothing to the follower.
pub(super) type Decode<T> = fn(kv::Entry) -> Option<Result<T, ClusterError>>;

pub struct Feed<T> {
    watch: kv::Watch,
    decode: Decode<T>,
}

impl<T> Feed<T> {
    pub(super) async fn start(bucket: &kv::Store, decode: Decode<T>) -> Result<Self, ClusterError> {
        let watch = bucket.watch_with_history(">").await.map_err(request)?;
        Ok(Self { watch, decode })
    }

    /// The next record; `Err` when the feed failed: its follower starts a new one, which
    /// begins with every record again. `None` once the connection to NATS is closed for good.
    pub async fn next(&mut self) -> Option<Result<T, ClusterError>> {
        loop {
            let entry = match self.watch.next().await? {
                Ok(entry) => entry,
                Err(e) => return Some(Err(request(e))),
            };
            if let Some(item) = (self.decode)(entry) {
                return Some(item);
            }
        }
    }
}

/// The JSON record of a put; deletes and purges say nothing.
pub(super) fn put<T: serde::de::DeserializeOwned>(
    entry: &kv::Entry,
) -> Option<Result<T, ClusterError>> {
    (entry.operation == kv::Operation::Put).then(|| {
        serde_json::from_slice(&entry.value).map_err(|e| ClusterError::Corrupt(e.to_string()))
    })
}
