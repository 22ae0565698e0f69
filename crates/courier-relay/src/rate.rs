//! Token buckets, one per account (`docs/protocol.md#rate-limiting`).
//!
//! The bucket belongs to the account, not to its connection: a client that reconnects finds
//! the bucket as its last connection left it, so reconnecting never buys a fresh burst. An
//! account's bucket that has refilled completely is the same as one never used, so buckets no
//! connection holds are forgotten once full, which bounds the map by the accounts connected or
//! sending recently.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::RateLimit;

/// Accounts kept before the first look for full buckets to forget; afterwards the next look
/// comes at twice what the previous one kept, so forgetting costs O(1) per take amortized.
const FIRST_PRUNE: usize = 1024;

pub struct TokenBucket {
    capacity: f64,
    per_sec: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// Full at creation.
    pub fn new(limit: RateLimit, now: Instant) -> Self {
        Self {
            capacity: f64::from(limit.burst),
            per_sec: f64::from(limit.per_sec),
            tokens: f64::from(limit.burst),
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_sec).min(self.capacity);
    }

    /// Takes `cost` tokens (at least one) when at least one is available, or says how long
    /// until one is (at least 1 ms). A cost beyond what is left puts the bucket in debt, which
    /// later frames wait out: a frame worth more than the whole burst is still admitted once,
    /// never refused forever, and is still paid for in full.
    pub fn try_take(&mut self, cost: u32, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= f64::from(cost.max(1));
            return Ok(());
        }
        let wait_ms = ((1.0 - self.tokens) * 1000.0 / self.per_sec)
            .ceil()
            .max(1.0);
        Err(Duration::from_millis(wait_ms as u64))
    }

    /// Refilled completely by `now`: indistinguishable from a new bucket.
    fn is_full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.capacity
    }
}

/// One account's bucket, shared by its connections (two at once while one displaces the
/// other).
pub struct AccountBucket(Mutex<TokenBucket>);

impl AccountBucket {
    fn lock(&self) -> MutexGuard<'_, TokenBucket> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes `cost` tokens (see [`TokenBucket::try_take`]).
    pub fn try_take(&self, cost: u32, now: Instant) -> Result<(), Duration> {
        self.lock().try_take(cost, now)
    }
}

/// Every account's bucket. A connection looks its account's up once, so frames take no lock
/// shared with other accounts.
pub struct AccountBuckets {
    limit: RateLimit,
    state: Mutex<Buckets>,
}

struct Buckets {
    by_account: HashMap<String, Arc<AccountBucket>>,
    prune_at: usize,
}

impl AccountBuckets {
    pub fn new(limit: RateLimit) -> Self {
        Self {
            limit,
            state: Mutex::new(Buckets {
                by_account: HashMap::new(),
                prune_at: FIRST_PRUNE,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, Buckets> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The account's bucket: as its last connection left it, or full.
    pub fn of(&self, account: &str, now: Instant) -> Arc<AccountBucket> {
        let mut state = self.state();
        if let Some(bucket) = state.by_account.get(account) {
            return Arc::clone(bucket);
        }
        if state.by_account.len() >= state.prune_at {
            // Only buckets no connection holds: a held one may be taken from at any moment.
            state
                .by_account
                .retain(|_, bucket| Arc::strong_count(bucket) > 1 || !bucket.lock().is_full(now));
            state.prune_at = (2 * state.by_account.len()).max(FIRST_PRUNE);
        }
        let bucket = Arc::new(AccountBucket(Mutex::new(TokenBucket::new(self.limit, now))));
        state
            .by_account
            .insert(account.to_owned(), Arc::clone(&bucket));
        bucket
    }

    /// Accounts whose bucket is remembered.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.state().by_account.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_refill() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(
            RateLimit {
                burst: 3,
                per_sec: 10,
            },
            t0,
        );
        for _ in 0..3 {
            assert!(b.try_take(1, t0).is_ok());
        }
        assert_eq!(b.try_take(1, t0), Err(Duration::from_millis(100)));
        assert!(b.try_take(1, t0 + Duration::from_millis(100)).is_ok());
        assert!(b.try_take(1, t0 + Duration::from_millis(100)).is_err());
        // Refill never exceeds the burst.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(b.try_take(1, later).is_ok());
        }
        assert!(b.try_take(1, later).is_err());
    }

    #[test]
    fn retry_after_is_at_least_one_ms() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(
            RateLimit {
                burst: 1,
                per_sec: 1_000_000,
            },
            t0,
        );
        assert!(b.try_take(1, t0).is_ok());
        assert_eq!(b.try_take(1, t0), Err(Duration::from_millis(1)));
    }

    #[test]
    fn a_frame_worth_more_than_the_burst_is_admitted_once_and_paid_for_in_full() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(
            RateLimit {
                burst: 10,
                per_sec: 10,
            },
            t0,
        );
        assert!(b.try_take(30, t0).is_ok());
        // 20 tokens of debt, then one to take: 2.1 s.
        assert_eq!(b.try_take(1, t0), Err(Duration::from_millis(2100)));
        assert!(b.try_take(1, t0 + Duration::from_millis(2100)).is_ok());
    }

    #[test]
    fn an_account_keeps_its_bucket_and_only_full_unheld_buckets_are_forgotten() {
        let t0 = Instant::now();
        let buckets = AccountBuckets::new(RateLimit {
            burst: 2,
            per_sec: 1,
        });
        let alice = buckets.of("alice", t0);
        assert!(alice.try_take(2, t0).is_ok());
        drop(alice);
        assert!(buckets.of("alice", t0).try_take(1, t0).is_err(), "kept");
        let held = buckets.of("held", t0);
        // These, alice and the held one fill the map up to the first look for full buckets.
        for i in 2..FIRST_PRUNE {
            assert!(buckets.of(&format!("a{i}"), t0).try_take(1, t0).is_ok());
        }
        // Two seconds on, every bucket is full again: the next new account drops all but the
        // one a connection holds.
        let later = t0 + Duration::from_secs(2);
        buckets.of("bob", later);
        assert_eq!(buckets.remembered(), 2);
        assert!(held.try_take(2, later).is_ok());
        assert!(buckets.of("alice", later).try_take(2, later).is_ok());
    }
}
