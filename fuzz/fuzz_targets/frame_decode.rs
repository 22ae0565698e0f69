#![no_main]

#[path = "../../crates/courier-proto/tests/fuzz_checks/frame.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::frame_decode(data));
