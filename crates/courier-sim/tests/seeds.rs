//! A few hundred seeds of the simulation, checked against the delivery invariants, and the
//! paths they must go through so a change of the world model cannot quietly stop exercising one.

use courier_sim::{replay_command, run_seed, Counts, Options};

const SEEDS: std::ops::RangeInclusive<u64> = 1..=300;

#[test]
fn every_seed_keeps_the_invariants() {
    let mut failures = Vec::new();
    let mut totals = Counts::default();
    for seed in SEEDS {
        match run_seed(seed, Options::default()) {
            Ok(summary) => totals.add(&summary.counts),
            Err(failure) => failures.push(format!(
                "seed {}: {}\n  replay: {}",
                failure.seed,
                failure.message,
                replay_command(failure.seed, Options::default())
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let paths = [
        ("delivered", totals.delivered),
        ("failed after max retries", totals.failed_max_retries),
        ("failed by lifetime", totals.failed_lifetime),
        ("failed by capacity", totals.failed_capacity),
        ("stored by the relay", totals.stored),
        ("undeliverable", totals.undeliverable),
        ("retrying", totals.retrying),
        ("deferred", totals.deferred),
        ("received without a hook", totals.received),
        ("drains completed", totals.drains_completed),
        ("hook commits", totals.hook_commits),
        ("hook refusals", totals.hook_refusals),
        ("hook timeouts", totals.hook_hangs),
        ("crashes inside the hook", totals.hook_crashes),
        (
            "redeliveries the app's dedup absorbed",
            totals.hook_redeliveries,
        ),
        ("buffered rows expired", totals.expired_rows),
        ("crashes", totals.crashes),
        ("relay restarts", totals.relay_restarts),
        ("disconnects", totals.disconnects),
        ("frames lost", totals.frames_lost),
        ("frames duplicated", totals.frames_duplicated),
        ("local carrier frames", totals.local_frames),
        ("terminal events replayed at a start", totals.replays),
        (
            "replays making good a terminal event a crash cut off",
            totals.replays_after_loss,
        ),
    ];
    for (path, count) in paths {
        assert!(count > 0, "no seed went through: {path}");
    }
    for (point, count) in totals.step_crashes.iter().enumerate() {
        assert!(*count > 0, "no crash at step point {point}");
    }
}

#[test]
fn a_seed_replays_identically() {
    for seed in [3, 77, 1234, 40_000] {
        let first = run_seed(seed, Options::default()).expect("the seed passes");
        let second = run_seed(seed, Options::default()).expect("the seed passes");
        assert_eq!(first.digest, second.digest, "seed {seed} diverged");
        assert_eq!(first.virtual_ms, second.virtual_ms, "seed {seed} diverged");
    }
}
