//! A few hundred seeds of the simulation, checked against the delivery invariants, and the
//! paths they must go through so a change of the world model cannot quietly stop exercising one.
//! Worlds in the clear and encrypted worlds run apart: real MLS in a debug build costs seconds a
//! world, so a few chosen encrypted seeds cover the sealed paths. The default worlds have chat
//! groups for some seeds, as the runner's do; a run of worlds that all have them covers the
//! group paths.

use courier_sim::{replay_command, run_seed, Counts, Options};

const SEEDS: std::ops::RangeInclusive<u64> = 1..=300;

const CLEAR: Options = Options {
    actions: None,
    verbose: false,
    encryption: Some(false),
    groups: None,
};

const GROUPS: Options = Options {
    groups: Some(true),
    ..CLEAR
};

const ENCRYPTED: Options = Options {
    encryption: Some(true),
    ..CLEAR
};

/// Encrypted seeds that go through every sealed path between them: the key-package directory
/// and the round trip, copies not kept and opened again, copies known and not opened, replays,
/// decryption failures made good by a retry, a tie of simultaneous starts; and some that once
/// failed: a tie winner that had to answer a losing Welcome with its own (1492), an id repeated
/// in the step that delivered it (3238), a setup frame lost on its way and asked for again on
/// the timer (2226), messages sealed for a session that lost a tie (7444).
const ENCRYPTED_SEEDS: [u64; 8] = [10, 12, 18, 46, 1492, 2226, 3238, 7444];

/// Encrypted seeds with chat groups, among them some that once failed: a copy acknowledged in
/// the clear by a member without a session with its sender (28), a copy that arrived while the
/// broadcast of its message waited for the hook (391), a copy sent again for a new session with
/// its member (429), a copy whose member sealed its ACK in a session the sender did not hold
/// (1128).
const ENCRYPTED_GROUP_SEEDS: [u64; 4] = [28, 391, 429, 1128];

/// Runs `seeds` and adds up their counts; panics with the replay lines of those that fail.
fn run(seeds: impl IntoIterator<Item = u64>, options: Options) -> Counts {
    let mut failures = Vec::new();
    let mut totals = Counts::default();
    for seed in seeds {
        match run_seed(seed, options) {
            Ok(summary) => totals.add(&summary.counts),
            Err(failure) => failures.push(format!(
                "seed {}: {}\n  replay: {}",
                failure.seed,
                failure.message,
                replay_command(failure.seed, options)
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    totals
}

#[test]
fn every_seed_keeps_the_invariants() {
    let totals = run(SEEDS, CLEAR);
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
fn encrypted_worlds_keep_the_invariants() {
    let totals = run(ENCRYPTED_SEEDS, ENCRYPTED);
    let paths = [
        ("encrypted worlds", totals.encrypted_worlds),
        (
            "worlds with the key-package directory",
            totals.directory_worlds,
        ),
        ("sealed", totals.sealed),
        ("opened", totals.opened),
        ("opened, not kept, opened again", totals.opened_not_kept),
        ("known and not opened again", totals.copies_known),
        ("decryption failures", totals.decryption_failures),
        (
            "data messages delivered after a decryption failure",
            totals.undecryptable_then_delivered,
        ),
        ("replays discarded", totals.replays_discarded),
        ("sessions from the directory", totals.directory_setups),
        ("sessions from the round trip", totals.round_trip_setups),
        ("sessions joined", totals.sessions_joined),
        (
            "welcomes outranked by a simultaneous start",
            totals.welcomes_outranked,
        ),
        ("welcomes repeated", totals.welcomes_repeated),
        ("received", totals.received),
        ("hook commits", totals.hook_commits),
        ("crashes", totals.crashes),
    ];
    for (path, count) in paths {
        assert!(count > 0, "no encrypted seed went through: {path}");
    }
}

#[test]
fn group_worlds_keep_the_invariants() {
    let totals = run(1..=120, GROUPS);
    let paths = [
        ("group worlds", totals.group_worlds),
        ("group messages accepted", totals.group_accepted),
        ("broadcast by the relay", totals.group_broadcast_path),
        ("fanned out at once", totals.group_fanout_path),
        ("reports taken", totals.group_reports),
        ("members given copies by a report", totals.group_reissued),
        ("reports lost", totals.group_reports_lost),
        ("reports late", totals.group_reports_late),
        ("reports after the wait", totals.group_reports_after_wait),
        ("broadcasts refused", totals.group_refusals),
        (
            "senders disconnected after a broadcast",
            totals.group_sender_disconnects,
        ),
        (
            "senders crashed after a broadcast",
            totals.group_sender_crashes,
        ),
        ("registrations refused", totals.group_registrations_refused),
        ("roster changes", totals.group_roster_changes),
        ("relay roster drifts", totals.group_drifts),
        (
            "copies a re-broadcast did not journal again",
            totals.group_relay_dedup,
        ),
        (
            "members delivered by a copy's ACK",
            totals.group_members_acked,
        ),
        (
            "members delivered by a report",
            totals.group_members_reported,
        ),
        ("members stored", totals.group_members_stored),
        ("members failed", totals.group_members_failed),
        ("group messages received", totals.group_received),
        (
            "broadcasts of an epoch the device was not in",
            totals.group_unreadable,
        ),
    ];
    for (path, count) in paths {
        assert!(count > 0, "no group seed went through: {path}");
    }
}

#[test]
fn encrypted_group_worlds_keep_the_invariants() {
    let options = Options {
        encryption: Some(true),
        ..GROUPS
    };
    let totals = run(ENCRYPTED_GROUP_SEEDS, options);
    assert!(totals.group_received > 0 && totals.sealed > 0);
    assert!(totals.group_members_acked > 0, "no copy was acknowledged");
}

#[test]
fn a_seed_replays_identically() {
    // openmls draws its own randomness: the course of an encrypted world must not depend on it.
    let seeds = [
        (3, CLEAR),
        (77, CLEAR),
        (1234, CLEAR),
        (5, GROUPS),
        (40_000, CLEAR),
        (28, ENCRYPTED),
    ];
    for (seed, options) in seeds {
        let first = run_seed(seed, options).expect("the seed passes");
        let second = run_seed(seed, options).expect("the seed passes");
        assert_eq!(first.digest, second.digest, "seed {seed} diverged");
        assert_eq!(first.virtual_ms, second.virtual_ms, "seed {seed} diverged");
    }
}
