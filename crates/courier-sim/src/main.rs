//! `courier-sim`: runs seeds of the deterministic simulation and prints a replay line for each
//! failing one.
//!
//! ```text
//! courier-sim --seed 1234 [--verbose]         one seed
//! courier-sim --seeds 10000 [--from 1]        a range of seeds
//! options: --actions N (fault actions per seed), --determinism (run each seed twice, compare),
//!          --encryption / --no-encryption (every seed's messages sealed in end-to-end sessions,
//!          or none; by default each seed decides)
//! ```

use std::process::ExitCode;
use std::time::Instant;

use courier_sim::{describe, replay_command, run_seed, Options};

struct Args {
    from: u64,
    count: u64,
    options: Options,
    determinism: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        from: 1,
        count: 100,
        options: Options::default(),
        determinism: false,
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
            "--determinism" => args.determinism = true,
            "--help" | "-h" => {
                return Err("usage: courier-sim [--seed N | --seeds N [--from S]] [--actions N] [--encryption | --no-encryption] [--verbose] [--determinism]".into())
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(args)
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
    let mut totals = courier_sim::Counts::default();
    for seed in args.from..args.from.saturating_add(args.count) {
        if args.count == 1 {
            println!("seed {seed}: {}", describe(seed, args.options));
        }
        match run_seed(seed, args.options) {
            Ok(summary) => {
                if args.determinism {
                    let again = run_seed(seed, args.options);
                    if again.as_ref().map(|s| s.digest).ok() != Some(summary.digest) {
                        failures += 1;
                        println!("FAIL seed {seed}: two runs of the seed diverged");
                        println!("  replay: {}", replay_command(seed, args.options));
                        continue;
                    }
                }
                totals.add(&summary.counts);
                if args.count == 1 {
                    println!(
                        "ok: {} s of virtual time, {:?}",
                        summary.virtual_ms / 1000,
                        summary.counts
                    );
                }
            }
            Err(failure) => {
                failures += 1;
                println!("FAIL seed {}: {}", failure.seed, failure.message);
                println!("  replay: {}", replay_command(failure.seed, args.options));
            }
        }
    }
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
    }
    if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
