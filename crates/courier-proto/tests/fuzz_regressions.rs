//! Replays the committed fuzz inputs (the seed corpora and every input that once failed)
//! through the same checks the fuzz targets run.

mod fuzz_checks;
#[path = "../../../fuzz/replay.rs"]
mod replay;

use replay::replay;

#[test]
fn frame_decode_inputs() {
    replay("frame_decode", fuzz_checks::frame::frame_decode);
}

#[test]
fn message_decode_inputs() {
    replay("message_decode", fuzz_checks::message::message_decode);
}

#[test]
fn address_parse_inputs() {
    replay("address_parse", fuzz_checks::address::address_parse);
}
