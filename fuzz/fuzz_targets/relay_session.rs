#![no_main]

#[path = "../../crates/courier-relay/tests/session_fuzz/mod.rs"]
mod session_fuzz;

libfuzzer_sys::fuzz_target!(|data: &[u8]| session_fuzz::run_bytes(data));
