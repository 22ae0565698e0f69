//! `courier-relay inspect`'s reader: the message ledgers of a client database, read through the
//! store that owns their schema (`docs/delivery.md#a-messages-life`). The page itself is drawn
//! in `js/inspect.js`.

use std::path::Path;

use napi_derive::napi;

use crate::error::{client_error, Result};

/// The ledgers of the `limit` messages of the client database at `path` that changed last, as
/// a JSON array of `messageTimeline` objects. Read-only, without the one-writer lock: a running
/// client may hold the file.
#[napi]
pub fn read_message_ledgers(path: String, limit: u32) -> Result<String> {
    let histories = courier_client::store::read_recent_ledgers(Path::new(&path), limit as usize)
        .map_err(|e| client_error(e.into()))?;
    let timelines: Vec<serde_json::Value> = histories.iter().map(|h| h.to_json()).collect();
    Ok(serde_json::Value::Array(timelines).to_string())
}
