//! `media.*`: where received files go and the bounds of transfers both ways
//! (`docs/delivery.md#file-transfers`).

use std::path::PathBuf;

use courier_proto::media::{MAX_CHUNK_BYTES, MIN_CHUNK_BYTES};

use super::section::Section;
use super::{ConfigError, StorageConfig, MAX_SAFE_INTEGER};

pub const KEYS: &[&str] = &[
    "directory",
    "maxFileSize",
    "chunkSize",
    "localChunkSize",
    "window",
    "maxOutgoingTransfers",
    "maxIncomingTransfers",
    "maxIncomingPerSender",
    "maxIncomingBytes",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaConfig {
    /// Where received files are written; partial files live in its `.partial` folder.
    pub directory: PathBuf,
    /// The largest file sent or accepted.
    pub max_file_size: u64,
    /// Chunk size of a transfer when a relay or gateway is configured.
    pub chunk_size: u32,
    /// Chunk size of a transfer when only app carriers are (smaller frames).
    pub local_chunk_size: u32,
    /// Chunks of one transfer in flight at once.
    pub window: u32,
    /// Unfinished outgoing transfers at once; beyond it `sendMedia` is refused.
    pub max_outgoing: usize,
    /// Files being assembled at once, from everyone and from one sender.
    pub max_incoming: usize,
    pub max_incoming_per_sender: usize,
    /// Sum of the sizes of the files being assembled.
    pub max_incoming_bytes: u64,
    /// A file being received that no chunk reached for this long is given up (its sender gave
    /// up by then too): the outbox's absolute lifetime.
    pub stale_after_ms: u64,
}

pub const DEFAULT_MAX_FILE_SIZE: u64 = 100 * 1024 * 1024;

impl MediaConfig {
    /// The defaults, receiving into `directory`.
    pub fn new(directory: PathBuf) -> Self {
        Self {
            directory,
            max_file_size: DEFAULT_MAX_FILE_SIZE,
            chunk_size: MAX_CHUNK_BYTES,
            local_chunk_size: 64 * 1024,
            window: 8,
            max_outgoing: 16,
            max_incoming: 16,
            max_incoming_per_sender: 4,
            max_incoming_bytes: 1024 * 1024 * 1024,
            stale_after_ms: 4 * 604_800_000,
        }
    }
}

/// The default media directory: beside the database file, or under the system's temporary
/// folder for a memory store (nothing of it survives anyway).
fn default_directory(storage: &StorageConfig, app_id: &str) -> PathBuf {
    match storage {
        StorageConfig::Path(path) => {
            let mut dir = path.clone().into_os_string();
            dir.push(".media");
            PathBuf::from(dir)
        }
        StorageConfig::Memory => std::env::temp_dir()
            .join("offline-courier-media")
            .join(app_id),
    }
}

pub fn parse(
    root: &Section<'_>,
    storage: &StorageConfig,
    engine: &courier_engine::Config,
) -> Result<MediaConfig, ConfigError> {
    let mut config = MediaConfig::new(default_directory(storage, &engine.app_id));
    config.stale_after_ms = engine.absolute_lifetime_ms();
    let Some(media) = root.section("media", KEYS)? else {
        return Ok(config);
    };
    if let Some(dir) = media.string("directory")? {
        if dir.is_empty() {
            return Err(media.error("directory", "must not be empty"));
        }
        config.directory = PathBuf::from(dir);
    }
    if let Some(size) = media.positive_int("maxFileSize", MAX_SAFE_INTEGER)? {
        config.max_file_size = size;
    }
    let chunk = |key: &str| -> Result<Option<u32>, ConfigError> {
        match media.positive_int(key, u64::from(MAX_CHUNK_BYTES))? {
            Some(n) if n < u64::from(MIN_CHUNK_BYTES) => Err(media.error(
                key,
                format!("must be between {MIN_CHUNK_BYTES} and {MAX_CHUNK_BYTES}"),
            )),
            other => Ok(other.map(|n| n as u32)),
        }
    };
    if let Some(n) = chunk("chunkSize")? {
        config.chunk_size = n;
    }
    if let Some(n) = chunk("localChunkSize")? {
        config.local_chunk_size = n;
    }
    if let Some(n) = media.positive_int("window", 64)? {
        config.window = n as u32;
    }
    for (key, slot) in [
        ("maxOutgoingTransfers", &mut config.max_outgoing),
        ("maxIncomingTransfers", &mut config.max_incoming),
        ("maxIncomingPerSender", &mut config.max_incoming_per_sender),
    ] {
        if let Some(n) = media.positive_int(key, 4096)? {
            *slot = n as usize;
        }
    }
    if let Some(n) = media.positive_int("maxIncomingBytes", MAX_SAFE_INTEGER)? {
        config.max_incoming_bytes = n;
    }
    Ok(config)
}
