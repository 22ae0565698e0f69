//! `sendMedia` on `NativeProtocol` (`docs/delivery.md#file-transfers`): it converts and
//! forwards; chunking, windows and resumption live in `courier-client`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use courier_client::media_send::{MediaInput, MediaSource};
use napi::bindgen_prelude::Buffer;
use napi_derive::napi;

use crate::error::{client_error, Settled};
use crate::NativeProtocol;

/// `sendMedia(recipient, source, options)`: exactly one of `path` and `bytes`.
#[napi(object)]
pub struct NativeMediaInput {
    pub recipient: String,
    pub path: Option<String>,
    pub bytes: Option<Buffer>,
    pub file_id: Option<String>,
    pub file_name: Option<String>,
    pub content_type: Option<String>,
    pub caption: Option<String>,
    pub reply_to: Option<String>,
    pub metadata: Option<HashMap<String, String>>,
}

#[napi]
impl NativeProtocol {
    /// Resolves with the file id once the transfer is durably accepted.
    #[napi(ts_return_type = "Promise<string>")]
    pub async fn send_media(&self, input: NativeMediaInput) -> Settled<String> {
        let sent = async {
            let client = self.started()?;
            let source = match (input.path, input.bytes) {
                (Some(path), None) => MediaSource::Path(PathBuf::from(path)),
                (None, Some(bytes)) => MediaSource::Bytes(bytes.to_vec()),
                _ => {
                    return Err(client_error(
                        courier_client::error::ClientError::InvalidArgument(
                            "source must be a file path or a Uint8Array".into(),
                        ),
                    ))
                }
            };
            let input = MediaInput {
                recipient: input.recipient,
                source,
                file_id: input.file_id,
                file_name: input.file_name,
                content_type: input.content_type,
                caption: input.caption,
                reply_to: input.reply_to,
                metadata: input
                    .metadata
                    .map(|m| m.into_iter().collect::<BTreeMap<_, _>>())
                    .unwrap_or_default(),
            };
            client.send_media(input).await.map_err(client_error)
        };
        sent.await.into()
    }
}
