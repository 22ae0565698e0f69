#![no_main]

#[path = "../../crates/courier-proto/tests/fuzz_checks/address.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::address_parse(data));
