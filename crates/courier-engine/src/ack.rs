//! The ACK manager's budget: when a written frame's ACK is due, and what a timeout turns into.
//!
//! `ack_attempts` counts the ACK-timeout retries an entry has been granted. It is persisted,
//! never reset, and only an ACK timeout of an attempt on the ladder grows it — transport
//! failures, flushes, probes and restarts do not. With `max_retries` = 10 an entry is sent at
//! most 11 times on the ladder (the original and 10 retries) before it fails.

use crate::config::Config;
use crate::io::Millis;

/// The ACK timer of a frame starts when the carrier wrote it (`docs/delivery.md#ack-timer`).
pub(crate) fn deadline(config: &Config, written_at: Millis) -> Millis {
    written_at.saturating_add(config.ack_timeout_ms)
}

/// `message_sent.attempt`: the ladder attempt a write belongs to, 1 for the original send. A
/// re-send that did not follow an ACK timeout (transport retry, flush, probe, restart) repeats
/// the number of the attempt it replaces.
pub(crate) fn attempt_number(ack_attempts: u32) -> u32 {
    ack_attempts.saturating_add(1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterTimeout {
    /// Retry number `retry_count` (counted from 0, `docs/delivery.md#backoff`) goes at `at`,
    /// `backoff_ms(retry_count)` from now; the entry's `ack_attempts` becomes `retry_count + 1`.
    Retry { retry_count: u32, at: Millis },
    /// All `max_retries` retries were spent: the entry fails with `retry_count = ack_attempts`.
    Exhausted,
}

pub(crate) fn after_timeout(config: &Config, ack_attempts: u32, now: Millis) -> AfterTimeout {
    if ack_attempts >= config.max_retries {
        return AfterTimeout::Exhausted;
    }
    let at = now.saturating_add(config.backoff_ms(ack_attempts));
    AfterTimeout::Retry {
        retry_count: ack_attempts,
        at,
    }
}
