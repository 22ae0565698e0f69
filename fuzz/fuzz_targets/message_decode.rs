#![no_main]

#[path = "../../crates/courier-proto/tests/fuzz_checks/message.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::message_decode(data));
