//! `courier-sim`: runs seeds of the deterministic simulation and prints a replay line for each
//! failing one.
//!
//! ```text
//! courier-sim --seed 1234 [--verbose]         one seed
//! courier-sim --seeds 10000 [--from 1]        a range of seeds
//! options: --actions N (fault actions per seed), --determinism (run each seed twice, compare),
//!          --encryption / --no-encryption (every seed's messages sealed in end-to-end sessions,
//!          or none; by default each seed decides), --groups / --no-groups (every seed's peers
//!          form chat groups and send group messages, or none; by default each seed decides),
//!          --jobs N (seeds run at once; one per core)
//! ```

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use courier_sim::{describe, replay_command, run_seed, Counts, Options};

/// A worker runs whole worlds; a deep panic unwinding through one needs room.
const WORKER_STACK: usize = 16 * 1024 * 1024;

struct Args {
    from: u64,
    count: u64,
    options: Options,
    determinism: bool,
    /// Seeds run at once; `None`: one per core.
    jobs: Option<usize>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        from: 1,
        count: 100,
        options: Options::default(),
        determinism: false,
        jobs: None,
    };
    let mut it = std::env::args().skip(1);
    let number = |flag: &str, value: Option<String>| -> Result<u64, String> {
        value
            .ok_or_else(|| format!("{flag} needs a number"))?
            .parse()
            .map_err(|e| format!("{flag}: {e}"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--seed" => {
                args.from = number("--seed", it.next())?;
                args.count = 1;
            }
            "--seeds" => args.count = number("--seeds", it.next())?,
            "--from" => args.from = number("--from", it.next())?,
            "--actions" => {
                args.options.actions = Some(number("--actions", it.next())? as u32);
            }
            "--verbose" | "-v" => args.options.verbose = true,
            "--encryption" => args.options.encryption = Some(true),
            "--no-encryption" => args.options.encryption = Some(false),
            "--groups" => args.options.groups = Some(true),
            "--no-groups" => args.options.groups = Some(false),
            "--determinism" => args.determinism = true,
            "--jobs" => args.jobs = Some(number("--jobs", it.next())? as usize),
            "--help" | "-h" => {
                return Err("usage: courier-sim [--seed N | --seeds N [--from S]] [--actions N] [--encryption | --no-encryption] [--groups | --no-groups] [--jobs N] [--verbose] [--determinism]".into())
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(args)
}

/// What one seed's run printed, and its counts when it passed.
struct Outcome {
    lines: Vec<String>,
    counts: Option<Counts>,
}

fn run_one(seed: u64, args: &Args) -> Outcome {
    let mut lines = Vec::new();
    if args.count == 1 {
        lines.push(format!("seed {seed}: {}", describe(seed, args.options)));
    }
    let fail = |mut lines: Vec<String>, message: String| {
        lines.push(format!("FAIL seed {seed}: {message}"));
        lines.push(format!("  replay: {}", replay_command(seed, args.options)));
        Outcome {
            lines,
            counts: None,
        }
    };
    let summary = match run_seed(seed, args.options) {
        Ok(summary) => summary,
        Err(failure) => return fail(lines, failure.message),
    };
    if args.determinism {
        let again = run_seed(seed, args.options);
        if again.as_ref().map(|s| s.digest).ok() != Some(summary.digest) {
            return fail(lines, "two runs of the seed diverged".to_owned());
        }
    }
    if args.count == 1 {
        lines.push(format!(
            "ok: {} s of virtual time, {:?}",
            summary.virtual_ms / 1000,
            summary.counts
        ));
    }
    Outcome {
        lines,
        counts: Some(summary.counts),
    }
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // Failures are reported below with their replay line; the default hook would repeat them.
    if !args.options.verbose {
        std::panic::set_hook(Box::new(|_| {}));
    }
    let started = Instant::now();
    let mut failures = 0u64;
    let mut totals = Counts::default();
    // Seeds are independent: they run on every core, and are reported in seed order. A verbose
    // run prints as it goes, so it keeps to one.
    let parallel = std::thread::available_parallelism().map_or(1, usize::from);
    let jobs = if args.options.verbose {
        1
    } else {
        args.jobs
            .unwrap_or(parallel)
            .clamp(1, args.count.max(1) as usize)
    };
    let end = args.from.saturating_add(args.count);
    let next = AtomicU64::new(args.from);
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            let (tx, next, args) = (tx.clone(), &next, &args);
            std::thread::Builder::new()
                .stack_size(WORKER_STACK)
                .spawn_scoped(scope, move || loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end || tx.send((seed, run_one(seed, args))).is_err() {
                        return;
                    }
                })
                .expect("a worker thread starts");
        }
        drop(tx);
        let mut done = BTreeMap::new();
        let mut due = args.from;
        for (seed, outcome) in rx {
            done.insert(seed, outcome);
            while let Some(outcome) = done.remove(&due) {
                due += 1;
                for line in &outcome.lines {
                    println!("{line}");
                }
                match outcome.counts {
                    Some(counts) => totals.add(&counts),
                    None => failures += 1,
                }
            }
        }
    });
    let elapsed = started.elapsed();
    println!(
        "{} seeds from {}: {} passed, {} failed in {:.1} s",
        args.count,
        args.from,
        args.count - failures,
        failures,
        elapsed.as_secs_f64()
    );
    if args.count > 1 {
        println!(
            "totals: sent {} accepted {} delivered {} failed {}/{}/{} (retries/lifetime/capacity) received {} hook batches {} (refused {}, hung {}, crashed {}, redelivered {}) crashes {} in-step {:?} relay restarts {} disconnects {} frames lost {} duplicated {} terminal events replayed {} (first after a crash cut off the original: {}) at-most-once losses {}",
            totals.sends,
            totals.accepted,
            totals.delivered,
            totals.failed_max_retries,
            totals.failed_lifetime,
            totals.failed_capacity,
            totals.received,
            totals.hook_batches,
            totals.hook_refusals,
            totals.hook_hangs,
            totals.hook_crashes,
            totals.hook_redeliveries,
            totals.crashes,
            totals.step_crashes,
            totals.relay_restarts,
            totals.disconnects,
            totals.frames_lost,
            totals.frames_duplicated,
            totals.replays,
            totals.replays_after_loss,
            totals.at_most_once_losses,
        );
        if totals.encrypted_worlds > 0 {
            println!(
                "end-to-end: {} encrypted worlds ({} with the key-package directory), sealed {} opened {} (not kept {}, known and not opened {}), decryption failures {} (of copies carried for another {}; data messages later delivered {}, failed {}), replays discarded {}, seal failures {}, sessions started {} (directory {}, round trip {}) joined {}, key packages sent {}, welcomes sent {} (outranked {}, repeated {}, stale ones joined {}), warnings {}",
                totals.encrypted_worlds,
                totals.directory_worlds,
                totals.sealed,
                totals.opened,
                totals.opened_not_kept,
                totals.copies_known,
                totals.decryption_failures,
                totals.carried_undecryptable,
                totals.undecryptable_then_delivered,
                totals.undecryptable_then_failed,
                totals.replays_discarded,
                totals.seal_failures,
                totals.sessions_started,
                totals.directory_setups,
                totals.round_trip_setups,
                totals.sessions_joined,
                totals.key_packages_sent,
                totals.welcomes_sent,
                totals.welcomes_outranked,
                totals.welcomes_repeated,
                totals.stale_welcomes_joined,
                totals.e2e_warnings,
            );
        }
        if totals.group_worlds > 0 {
            println!(
                "groups: {} worlds, sent {} accepted {} (broadcast {}, fan-out {}), relay broadcasts {} (copies not journaled again {}), reports {} (members reissued {}; lost {}, late {}, after the wait {}), refused {}, sender disconnects {} crashes {}, registrations refused {}, roster changes {} drifts {}, members delivered by ACK {} by report {} stored {} failed {}, received {} unreadable {}, reached but lost: live {} purged {} expired {}, security warnings {}",
                totals.group_worlds,
                totals.group_sends,
                totals.group_accepted,
                totals.group_broadcast_path,
                totals.group_fanout_path,
                totals.group_relay_broadcasts,
                totals.group_relay_dedup,
                totals.group_reports,
                totals.group_reissued,
                totals.group_reports_lost,
                totals.group_reports_late,
                totals.group_reports_after_wait,
                totals.group_refusals,
                totals.group_sender_disconnects,
                totals.group_sender_crashes,
                totals.group_registrations_refused,
                totals.group_roster_changes,
                totals.group_drifts,
                totals.group_members_acked,
                totals.group_members_reported,
                totals.group_members_stored,
                totals.group_members_failed,
                totals.group_received,
                totals.group_unreadable,
                totals.group_live_losses,
                totals.group_purged,
                totals.group_expired,
                totals.security_warnings,
            );
        }
    }
    if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
