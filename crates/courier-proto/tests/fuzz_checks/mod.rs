//! What must hold for any input to the decoders that read untrusted text: one file and one
//! function per fuzz target (`fuzz/fuzz_targets/`). The regression tests replay the committed fuzz inputs
//! through these same functions, so a crash the fuzzer found stays fixed under `cargo test`.
//! Each function panics when a property fails; inputs that are not UTF-8 are skipped, since
//! both the relay and the clients only ever hand text frames to these decoders.

pub mod address;
pub mod frame;
pub mod message;
