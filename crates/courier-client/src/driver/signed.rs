//! Signed control frames this device sends (`docs/protocol.md#control-signatures`): what a peer
//! must be able to attribute to this device's identity, sealed session or not.

use std::collections::BTreeMap;

use courier_engine::{Millis, SendRequest};
use courier_proto::{control_frame, sign_control, ContentType, IdentityKey, Message, Priority};

/// The send of a control frame with `content` and `metadata` from this device to `peer`, signed.
pub fn control_request(
    identity: &IdentityKey,
    app_id: &str,
    peer: &str,
    content: String,
    metadata: BTreeMap<String, String>,
    now: Millis,
) -> SendRequest {
    let id = super::mint_id();
    let mut message = control_frame(
        id.clone(),
        app_id,
        &identity.address().to_string(),
        peer,
        content,
        now,
    );
    message.metadata = metadata;
    sign_control(&mut message, identity, now);
    let Message {
        content, metadata, ..
    } = message;
    SendRequest {
        id,
        settled: None,
        recipient: peer.to_owned(),
        content,
        content_type: ContentType::Text,
        priority: Priority::High,
        metadata,
        binary_content: None,
        media: None,
        rich: Default::default(),
    }
}
