//! Replays the committed fuzz inputs (the seed corpora and every input that once failed)
//! through the same checks the fuzz targets run.

mod fuzz_checks;

use std::path::Path;

/// Runs `check` on every committed input of `target`, naming the file that fails.
fn replay(target: &str, check: fn(&[u8])) {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut replayed = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) else {
            continue;
        };
        let mut paths: Vec<_> = entries.map(|e| e.expect("corpus entry").path()).collect();
        paths.sort();
        for path in paths {
            let data = std::fs::read(&path).expect("corpus file");
            eprintln!("replaying {}", path.display());
            check(&data);
            replayed += 1;
        }
    }
    assert!(
        replayed > 0,
        "no committed {target} inputs under {}",
        fuzz.display()
    );
}

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
