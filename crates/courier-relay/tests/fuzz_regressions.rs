//! Replays the committed `relay_session` fuzz inputs (the seed corpus and every input that
//! once failed) through the same harness the fuzzer runs, against a real relay on loopback.

mod session_fuzz;

use std::path::Path;

#[test]
fn relay_session_inputs_hold_every_invariant() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut replayed = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join("relay_session")) else {
            continue;
        };
        let mut paths: Vec<_> = entries.map(|e| e.expect("corpus entry").path()).collect();
        paths.sort();
        for path in paths {
            let data = std::fs::read(&path).expect("corpus file");
            eprintln!("replaying {}", path.display());
            session_fuzz::run_bytes(&data);
            replayed += 1;
        }
    }
    assert!(
        replayed > 0,
        "no committed relay_session inputs under {}",
        fuzz.display()
    );
}
