//! Replays the committed `relay_session` fuzz inputs (the seed corpus and every input that
//! once failed) through the same harness the fuzzer runs, against a real relay on loopback.

#[path = "../../../fuzz/replay.rs"]
mod replay;
mod session_fuzz;

#[test]
fn relay_session_inputs_hold_every_invariant() {
    replay::replay("relay_session", session_fuzz::run_bytes);
}
