use std::net::SocketAddr;

/// Why the relay could not start, or a token could not be issued.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("relay storage: {0}")]
    Storage(#[from] rusqlite::Error),
    /// The database was written by a newer relay; it is left untouched.
    #[error("the database has schema version {found}; this relay knows up to {supported}")]
    NewerSchema { found: u32, supported: u32 },
    #[error("cannot start the storage thread: {0}")]
    StorageThread(std::io::Error),
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("token: {0}")]
    Token(#[from] jsonwebtoken::errors::Error),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("relay cluster: {0}")]
    Cluster(#[from] crate::cluster::ClusterError),
}
