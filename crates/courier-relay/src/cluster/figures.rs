//! Figures for monitoring (`docs/operating-the-relay.md#metrics`), read from the stream's and
//! the buckets' state rather than counted, since every node writes them.

use async_nats::connection::State;

use super::{request, ClusterError, JetStreamStore};

/// What the deployment holds, as of one read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    pub accounts: u64,
    /// Journal frames not yet released or expired.
    pub frames: u64,
    /// Bytes of the journal stream.
    pub bytes: u64,
}

impl JetStreamStore {
    pub async fn figures(&self) -> Result<Figures, ClusterError> {
        let journal = self.inner.journal.get_info().await.map_err(request)?;
        let accounts = self.inner.accounts.status().await.map_err(request)?;
        Ok(Figures {
            accounts: accounts.values(),
            frames: journal.state.messages,
            bytes: journal.state.bytes,
        })
    }

    /// Whether the node's connection to NATS is up now.
    pub fn is_connected(&self) -> bool {
        self.inner.client.connection_state() == State::Connected
    }
}
