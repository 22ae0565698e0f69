//! Properties of the Message decoder (fuzz target `message_decode`).

use courier_proto::Message;

/// `Message::decode` (every end-to-end message a peer receives): never panics, a decoded
/// message re-encodes to an equal one, and the ACK its recipient builds for it decodes too.
pub fn message_decode(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(message) = Message::decode(text) else {
        return;
    };
    let encoded = message.encode();
    assert_eq!(
        Message::decode(&encoded).as_ref(),
        Ok(&message),
        "a decoded message re-encodes to {encoded}"
    );
    let ack = message.ack("fuzz-ack".to_owned(), 1, "internet");
    let ack_text = ack.encode();
    assert_eq!(
        Message::decode(&ack_text).as_ref(),
        Ok(&ack),
        "the ACK of a valid message is {ack_text}"
    );
    assert_eq!(ack.ack_for(), Some(message.id.as_str()));
}
