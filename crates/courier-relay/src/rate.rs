//! The per-connection token bucket (`docs/protocol.md#rate-limiting`).

use std::time::{Duration, Instant};

use crate::config::RateLimit;

pub struct TokenBucket {
    capacity: f64,
    per_sec: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// Full at creation, which is the moment of `Authenticated`.
    pub fn new(limit: RateLimit, now: Instant) -> Self {
        Self {
            capacity: f64::from(limit.burst),
            per_sec: f64::from(limit.per_sec),
            tokens: f64::from(limit.burst),
            last: now,
        }
    }

    /// Takes one token, or says how long until one is available (at least 1 ms).
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_sec).min(self.capacity);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        let wait_ms = ((1.0 - self.tokens) * 1000.0 / self.per_sec)
            .ceil()
            .max(1.0);
        Err(Duration::from_millis(wait_ms as u64))
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
            assert!(b.try_take(t0).is_ok());
        }
        assert_eq!(b.try_take(t0), Err(Duration::from_millis(100)));
        assert!(b.try_take(t0 + Duration::from_millis(100)).is_ok());
        assert!(b.try_take(t0 + Duration::from_millis(100)).is_err());
        // Refill never exceeds the burst.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(b.try_take(later).is_ok());
        }
        assert!(b.try_take(later).is_err());
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
        assert!(b.try_take(t0).is_ok());
        assert_eq!(b.try_take(t0), Err(Duration::from_millis(1)));
    }
}
