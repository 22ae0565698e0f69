//! Properties of the frame decoders (fuzz target `frame_decode`).

use courier_proto::{ClientFrame, DecodeError, RelayFrame};

/// Longest frame type an `UnknownType` error echoes (frame.rs).
const MAX_ECHOED_TYPE_BYTES: usize = 128;

/// `ClientFrame::decode` (what the relay runs on every inbound text frame) and
/// `RelayFrame::decode` (what clients run on every relay frame): never panic, classify errors
/// consistently with the frame's type, and re-encode every decoded frame to an equal one.
pub fn frame_decode(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    check_decoded(
        ClientFrame::decode(text),
        ClientFrame::TYPES,
        ClientFrame::encode,
        ClientFrame::decode,
    );
    check_decoded(
        RelayFrame::decode(text),
        RelayFrame::TYPES,
        RelayFrame::encode,
        RelayFrame::decode,
    );
}

fn check_decoded<F: PartialEq + std::fmt::Debug>(
    decoded: Result<F, DecodeError>,
    types: &[&str],
    encode: impl Fn(&F) -> String,
    decode: impl Fn(&str) -> Result<F, DecodeError>,
) {
    match decoded {
        Ok(frame) => {
            let encoded = encode(&frame);
            assert_eq!(
                decode(&encoded).as_ref(),
                Ok(&frame),
                "a decoded frame re-encodes to {encoded}"
            );
        }
        Err(DecodeError::UnknownType(frame_type)) => {
            assert!(
                frame_type.len() <= MAX_ECHOED_TYPE_BYTES,
                "echoed type grows with the input"
            );
            assert!(
                !types.contains(&frame_type.as_str()),
                "known type {frame_type} reported unknown"
            );
        }
        Err(DecodeError::Invalid { frame_type, .. }) => assert!(
            types.contains(&frame_type.as_str()),
            "invalid frame of unknown type {frame_type:?}"
        ),
        Err(DecodeError::Malformed) => {}
    }
}
