//! File transfers on the wire (`docs/protocol.md#file-chunks`): a file travels as chunk messages
//! (`content_type` `file_chunk`), each carrying its bytes in `binary_content` (base64) and a
//! [`ChunkHeader`] in `media_metadata`. Every chunk names the whole transfer, so a receiver can
//! open the assembly from whichever chunk comes first; the first chunk also carries the file's
//! [`FileDetails`]. The whole message is sealed like any other, so the relay sees none of this.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::ident::{validate_identifier, IdentError};
use crate::Message;

/// Namespace of the ids of file chunks.
const CHUNK_IDS: Uuid = Uuid::from_u128(0x8a1f_52c4_0d3b_4e6a_9b7c_e2f4_1a6d_5c90);

/// A chunk is at most this many bytes: with base64, sealing and the relay frame around it, it
/// still fits the 1 MiB frame.
pub const MAX_CHUNK_BYTES: u32 = 256 * 1024;
/// And at least this many: smaller chunks would spend more on headers than on bytes.
pub const MIN_CHUNK_BYTES: u32 = 1024;
/// A transfer has at most this many chunks (a 4 GiB file at the largest chunk size).
pub const MAX_CHUNKS: u32 = 1 << 14;
/// Caption, metadata, reply and forward links of a file together, as serialized.
pub const MAX_DETAILS_BYTES: usize = 32 * 1024;

/// The id of chunk `index` of generation `generation` of transfer `file_id` from its sender: the
/// same on every send, after any restart, so ACKs, the relay's dedup and the receiver's can name
/// it. A new generation (a restarted transfer) has new ids.
pub fn file_chunk_id(file_id: &str, generation: u32, index: u32) -> String {
    let name = format!("{file_id}\n{generation}\n{index}");
    Uuid::new_v5(&CHUNK_IDS, name.as_bytes()).to_string()
}

/// What every chunk says about its transfer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkHeader {
    pub file_id: String,
    /// Bumped when a transfer restarts from the beginning (the source changed, or the receiver's
    /// checksum did not match): chunks of another generation do not mix.
    pub generation: u32,
    pub index: u32,
    pub count: u32,
    /// The file's size in bytes.
    pub size: u64,
    /// Every chunk is this long but the last.
    pub chunk_size: u32,
    /// Lowercase hex SHA-256 of the whole file.
    pub sha256: String,
    /// Only on chunk 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<FileDetails>,
}

/// What the receiver shows with the file.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FileDetails {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caption: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// The wire id of the message this file answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// The forward info of a forwarded file, as `forwarded_from` of a message has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded_from: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error("a file chunk carries no header: {0}")]
    Header(String),
    #[error("file_id {0}")]
    FileId(IdentError),
    #[error("the chunk's layout does not add up: {0}")]
    Layout(&'static str),
    #[error("the chunk's bytes are not base64")]
    Base64,
    #[error("chunk {index} is {got} bytes; its place in the file holds {want}")]
    Length { index: u32, got: usize, want: u64 },
    #[error("the file's details are {0} bytes; the limit is {MAX_DETAILS_BYTES}")]
    Details(usize),
}

impl ChunkHeader {
    /// The layout of a file of `size` bytes in chunks of `chunk_size`: how many chunks.
    pub fn chunk_count(size: u64, chunk_size: u32) -> u64 {
        size.div_ceil(u64::from(chunk_size)).max(1)
    }

    /// Where chunk `index` starts in the file, and how long it is.
    pub fn span(&self, index: u32) -> (u64, u64) {
        span(self.size, self.chunk_size, index)
    }

    /// Checks what a peer sent: an identifier for `file_id`, a chunk size within bounds, a count
    /// that matches the size, an index within it, a hex digest, details within their cap.
    pub fn validate(&self) -> Result<(), ChunkError> {
        validate_identifier(&self.file_id).map_err(ChunkError::FileId)?;
        if !(MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(&self.chunk_size) {
            return Err(ChunkError::Layout("chunk_size out of bounds"));
        }
        if self.count > MAX_CHUNKS
            || u64::from(self.count) != Self::chunk_count(self.size, self.chunk_size)
        {
            return Err(ChunkError::Layout("count does not match size"));
        }
        if self.index >= self.count {
            return Err(ChunkError::Layout("index past the last chunk"));
        }
        if self.sha256.len() != 64
            || !self
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(ChunkError::Layout("sha256 is not 64 lowercase hex digits"));
        }
        if let Some(details) = &self.details {
            details.check_size()?;
        }
        Ok(())
    }
}

impl FileDetails {
    pub fn check_size(&self) -> Result<(), ChunkError> {
        let size = serde_json::to_vec(self).map_or(usize::MAX, |v| v.len());
        if size > MAX_DETAILS_BYTES {
            return Err(ChunkError::Details(size));
        }
        Ok(())
    }
}

/// A receiver's word to a sender about one of its transfers: a signed control frame
/// (`docs/protocol.md#file-control`), `__FILE_CTRL__` then this as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileControl {
    pub file_id: String,
    /// The generation it is about; a sender ignores one about another.
    pub generation: u32,
    pub action: FileAction,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileAction {
    /// The whole file did not match its SHA-256: send it again, as a new generation.
    Restart,
    /// The receiver will not take it (its bounds): stop.
    Refuse,
}

pub const FILE_CONTROL_PREFIX: &str = "__FILE_CTRL__";

impl FileControl {
    pub fn content(&self) -> String {
        format!(
            "{FILE_CONTROL_PREFIX}{}",
            serde_json::to_string(self).expect("file controls serialize")
        )
    }

    /// The file control `content` carries; `None` when it is not one.
    pub fn parse(content: &str) -> Option<Result<Self, ChunkError>> {
        let body = content.strip_prefix(FILE_CONTROL_PREFIX)?;
        Some(serde_json::from_str(body).map_err(|e| ChunkError::Header(e.to_string())))
    }
}

/// Where chunk `index` of a file of `size` bytes in chunks of `chunk_size` starts, and how long
/// it is.
pub fn span(size: u64, chunk_size: u32, index: u32) -> (u64, u64) {
    let start = u64::from(index) * u64::from(chunk_size);
    let end = (start + u64::from(chunk_size)).min(size);
    (start, end.saturating_sub(start))
}

/// A chunk as the receiver reads it from a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub header: ChunkHeader,
    pub bytes: Vec<u8>,
}

impl Chunk {
    /// The chunk `message` carries, checked against its own header.
    pub fn read(message: &Message) -> Result<Self, ChunkError> {
        let header = header_of(message)?;
        header.validate()?;
        let bytes = match &message.binary_content {
            Some(Value::String(b64)) => {
                crate::encoding::b64_decode_at_most(b64, MAX_CHUNK_BYTES as usize)
                    .ok_or(ChunkError::Base64)?
            }
            _ => return Err(ChunkError::Base64),
        };
        let (_, want) = header.span(header.index);
        if bytes.len() as u64 != want {
            return Err(ChunkError::Length {
                index: header.index,
                got: bytes.len(),
                want,
            });
        }
        Ok(Self { header, bytes })
    }
}

/// `binary_content` of a chunk carrying `bytes`.
pub fn chunk_content(bytes: &[u8]) -> Value {
    Value::String(crate::encoding::b64_encode(bytes))
}

/// The header of a chunk message, unchecked.
pub fn header_of(message: &Message) -> Result<ChunkHeader, ChunkError> {
    let meta = message
        .media_metadata
        .clone()
        .ok_or_else(|| ChunkError::Header("media_metadata is absent".into()))?;
    serde_json::from_value(meta).map_err(|e| ChunkError::Header(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(size: u64, index: u32) -> ChunkHeader {
        let chunk_size = 4096;
        ChunkHeader {
            file_id: "f1".into(),
            generation: 0,
            index,
            count: ChunkHeader::chunk_count(size, chunk_size) as u32,
            size,
            chunk_size,
            sha256: "ab".repeat(32),
            details: None,
        }
    }

    #[test]
    fn spans_cover_the_file_and_the_last_chunk_is_short() {
        let h = header(10_000, 0);
        assert_eq!(h.count, 3);
        assert_eq!(h.span(0), (0, 4096));
        assert_eq!(h.span(2), (8192, 10_000 - 8192));
        assert_eq!(header(0, 0).count, 1, "an empty file is one empty chunk");
        assert_eq!(header(0, 0).span(0), (0, 0));
    }

    #[test]
    fn a_header_that_does_not_add_up_is_refused() {
        assert!(header(10_000, 2).validate().is_ok());
        assert!(header(10_000, 3).validate().is_err(), "index past the end");
        let mut h = header(10_000, 0);
        h.count = 4;
        assert!(h.validate().is_err(), "count and size disagree");
        let mut h = header(10_000, 0);
        h.sha256 = "AB".repeat(32);
        assert!(h.validate().is_err(), "uppercase digest");
        let mut h = header(10_000, 0);
        h.file_id = "a/b".into();
        assert!(h.validate().is_err(), "file id is not an identifier");
        let mut h = header(10_000, 0);
        h.details = Some(FileDetails {
            caption: Some("x".repeat(MAX_DETAILS_BYTES)),
            ..FileDetails::default()
        });
        assert!(matches!(h.validate(), Err(ChunkError::Details(_))));
    }

    #[test]
    fn a_file_control_round_trips_and_is_signature_gated() {
        let control = FileControl {
            file_id: "f".into(),
            generation: 2,
            action: FileAction::Restart,
            reason: "checksum".into(),
        };
        let content = control.content();
        assert!(crate::is_signature_gated(&content));
        assert_eq!(FileControl::parse(&content), Some(Ok(control)));
        assert_eq!(FileControl::parse("hello"), None);
        assert!(matches!(FileControl::parse("__FILE_CTRL__{"), Some(Err(_))));
    }

    #[test]
    fn chunk_ids_are_stable_and_differ_by_generation() {
        let a = file_chunk_id("f", 0, 1);
        assert_eq!(a, file_chunk_id("f", 0, 1));
        assert_ne!(a, file_chunk_id("f", 1, 1));
        assert_ne!(a, file_chunk_id("f", 0, 2));
        assert!(crate::is_wire_id(&a));
    }
}
