//! `sendMedia` before the driver: the checks that need no state, and the SHA-256 of the whole
//! source, computed off the driver thread (`docs/delivery.md#file-transfers`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use courier_proto::{validate_identifier, Address, FileDetails};

use crate::driver::media::{self, SendMedia, SendSource};
use crate::error::ClientError;

/// What the application asked to send.
pub struct MediaInput {
    pub recipient: String,
    pub source: MediaSource,
    pub file_id: Option<String>,
    pub file_name: Option<String>,
    /// A MIME type (`image/jpeg`).
    pub content_type: Option<String>,
    pub caption: Option<String>,
    /// The id of the message this file answers, as this device knows it.
    pub reply_to: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

pub enum MediaSource {
    /// Streamed from disk, chunk by chunk; resumable on its own after a restart.
    Path(PathBuf),
    Bytes(Vec<u8>),
}

/// The longest file name and MIME type accepted.
const MAX_NAME_BYTES: usize = 255;

/// Checks `input` and hashes its source; `max_file_size` is refused before any byte is read.
pub fn prepare(
    input: MediaInput,
    encryption: bool,
    max_file_size: u64,
) -> Result<SendMedia, ClientError> {
    let invalid = |m: String| Err(ClientError::InvalidArgument(m));
    if let Err(e) = validate_identifier(&input.recipient) {
        return invalid(format!("recipient {e}"));
    }
    if encryption && Address::parse(&input.recipient).is_err() {
        return invalid(format!(
            "recipient {:?} is not an off1 address: with encryption enabled files go to a \
             device's address",
            input.recipient
        ));
    }
    if let Some(id) = &input.file_id {
        if let Err(e) = validate_identifier(id) {
            return invalid(format!("options.fileId {e}"));
        }
    }
    for (name, value) in [
        ("fileName", &input.file_name),
        ("contentType", &input.content_type),
    ] {
        if value
            .as_ref()
            .is_some_and(|v| v.is_empty() || v.len() > MAX_NAME_BYTES)
        {
            return invalid(format!(
                "options.{name} must be 1 to {MAX_NAME_BYTES} bytes"
            ));
        }
    }
    let too_large = |size: u64| {
        Err(ClientError::FileTooLarge(format!(
            "the file is {size} bytes; media.maxFileSize is {max_file_size}"
        )))
    };
    let (source, size, sha256, default_name) = match input.source {
        MediaSource::Bytes(bytes) => {
            let size = bytes.len() as u64;
            if size > max_file_size {
                return too_large(size);
            }
            let digest = media::sha256_bytes(&bytes);
            (SendSource::Bytes(Arc::new(bytes)), size, digest, None)
        }
        MediaSource::Path(path) => {
            let unreadable =
                |e: std::io::Error| ClientError::FileUnreadable(format!("{}: {e}", path.display()));
            let meta = std::fs::metadata(&path).map_err(unreadable)?;
            if !meta.is_file() {
                return Err(ClientError::FileUnreadable(format!(
                    "{} is not a regular file",
                    path.display()
                )));
            }
            if meta.len() > max_file_size {
                return too_large(meta.len());
            }
            let modified_ms = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64);
            let (digest, size) = media::sha256_file(&path, None).map_err(unreadable)?;
            if size != meta.len() {
                return Err(ClientError::FileUnreadable(format!(
                    "{} changed while it was read",
                    path.display()
                )));
            }
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            (SendSource::Path { path, modified_ms }, size, digest, name)
        }
    };
    let details = FileDetails {
        file_name: input.file_name.or(default_name),
        mime_type: input.content_type,
        caption: input.caption,
        metadata: input.metadata,
        reply_to: input.reply_to.as_deref().map(courier_proto::wire_id),
        forwarded_from: None,
    };
    details
        .check_size()
        .map_err(|e| ClientError::InvalidArgument(format!("options: {e}")))?;
    Ok(SendMedia {
        file_id: input.file_id,
        recipient: input.recipient,
        source,
        size,
        sha256,
        details,
    })
}
