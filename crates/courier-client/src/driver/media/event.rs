//! The events of file transfers, as the application sees them (`js/index.d.ts`).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::progress::Reading;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Outgoing,
    Incoming,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Self::Outgoing => "outgoing",
            Self::Incoming => "incoming",
        }
    }
}

/// What the receiver learns with a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub file_id: String,
    pub sender: String,
    pub path: String,
    pub file_name: Option<String>,
    pub mime_type: Option<String>,
    pub size: u64,
    pub sha256: String,
    pub caption: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub reply_to: Option<String>,
    pub forwarded_from: Option<courier_proto::rich::ForwardInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaEvent {
    Progress {
        file_id: String,
        direction: Direction,
        peer: String,
        total_bytes: u64,
        total_chunks: u32,
        reading: Reading,
    },
    Received(Box<Received>),
    /// Every chunk of an outgoing file was acknowledged: the recipient holds it whole.
    Delivered {
        file_id: String,
        recipient: String,
        size: u64,
    },
    Failed {
        file_id: String,
        direction: Direction,
        peer: String,
        reason: String,
    },
    /// At start: an outgoing transfer from bytes lost them with the process.
    ResendRequired {
        file_id: String,
        recipient: String,
        file_name: Option<String>,
        file_size: u64,
    },
}

impl MediaEvent {
    pub fn to_json(&self) -> Value {
        match self {
            Self::Progress {
                file_id,
                direction,
                peer,
                total_bytes,
                total_chunks,
                reading,
            } => json!({
                "type": "file_progress", "fileId": file_id, "direction": direction.as_str(),
                "peer": peer, "bytes": reading.bytes, "totalBytes": total_bytes,
                "chunks": reading.chunks, "totalChunks": total_chunks,
                "bytesPerSecond": reading.bytes_per_second, "etaMs": reading.eta_ms,
            }),
            Self::Received(r) => json!({
                "type": "file_received", "fileId": r.file_id, "sender": r.sender,
                "path": r.path, "fileName": r.file_name, "contentType": r.mime_type,
                "size": r.size, "sha256": r.sha256, "caption": r.caption,
                "metadata": r.metadata, "replyTo": r.reply_to,
                "forwardInfo": r.forwarded_from.clone().map(crate::event::forward_info_json),
            }),
            Self::Delivered {
                file_id,
                recipient,
                size,
            } => json!({
                "type": "file_delivered", "fileId": file_id, "recipient": recipient,
                "size": size,
            }),
            Self::Failed {
                file_id,
                direction,
                peer,
                reason,
            } => json!({
                "type": "file_failed", "fileId": file_id, "direction": direction.as_str(),
                "peer": peer, "reason": reason,
            }),
            Self::ResendRequired {
                file_id,
                recipient,
                file_name,
                file_size,
            } => json!({
                "type": "media_resend_required", "fileId": file_id, "recipient": recipient,
                "fileName": file_name, "fileSize": file_size,
            }),
        }
    }
}
