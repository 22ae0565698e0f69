//! Replays the committed inputs of one fuzz target: its seed corpus (`fuzz/corpus/<target>`)
//! and the inputs that once failed (`fuzz/regressions/<target>`). Included by the regression
//! tests of the crates that own the checks, so `cargo test` runs them.

use std::path::Path;

/// Runs `check` on every committed input of `target`, in name order, naming each file first
/// so a failure points at it. Fails when the target has no committed input at all.
pub fn replay(target: &str, check: impl Fn(&[u8])) {
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
