//! The client-side token bucket (`docs/protocol.md#rate-limiting`): the client meters itself at
//! 93 % of what the relay advertises and never relies on the relay's limiter.

use std::time::{Duration, Instant};

use courier_proto::RateLimitInfo;

/// The longest pause a `RateLimited` imposes. An honest relay's `retry_after_ms` is the time to
/// its next token, under a second at any refill rate of at least 1/s.
pub const MAX_PAUSE: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub struct TokenBucket {
    capacity: f64,
    per_sec: f64,
    tokens: f64,
    refilled_at: Instant,
    paused_until: Option<Instant>,
}

impl TokenBucket {
    /// 93 % of the advertised figures, each at least 1; 28 / 9 when the relay advertised none.
    pub fn from_advertised(limit: Option<RateLimitInfo>, now: Instant) -> Self {
        let (capacity, per_sec) = match limit {
            Some(l) => (scaled(l.burst), scaled(l.per_sec)),
            None => (28, 9),
        };
        Self {
            capacity: f64::from(capacity),
            per_sec: f64::from(per_sec),
            tokens: f64::from(capacity),
            refilled_at: now,
            paused_until: None,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_sec).min(self.capacity);
        self.refilled_at = now;
    }

    /// Takes one token if one is available now.
    pub fn try_take(&mut self, now: Instant) -> bool {
        self.try_take_cost(1, now)
    }

    /// Takes `cost` tokens when at least one is available now, as the relay does: a frame
    /// worth more than what is left (a `WatchPresence` naming many identifiers) goes out and
    /// puts the bucket in debt, which later frames wait out.
    pub fn try_take_cost(&mut self, cost: u32, now: Instant) -> bool {
        if self.paused_until.is_some_and(|until| now < until) {
            return false;
        }
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= f64::from(cost.max(1));
            true
        } else {
            false
        }
    }

    /// Takes `tokens` more for a frame already admitted, into debt if need be.
    pub fn owe(&mut self, tokens: u32) {
        self.tokens -= f64::from(tokens);
    }

    /// When the next token will be available (for the writer's sleep).
    pub fn next_token_at(&self, now: Instant) -> Instant {
        let base = match self.paused_until {
            Some(until) if until > now => until,
            _ => now,
        };
        let missing = (1.0 - self.tokens).max(0.0);
        base + Duration::from_secs_f64(missing / self.per_sec)
    }

    /// The relay said `RateLimited`: empty the bucket and write nothing metered for a while —
    /// at most [`MAX_PAUSE`], so a relay asking for ages cannot mute the connection for good.
    pub fn back_off(&mut self, retry_after: Duration, now: Instant) {
        let until = now + retry_after.min(MAX_PAUSE);
        self.tokens = 0.0;
        self.refilled_at = until;
        self.paused_until = Some(until);
    }
}

fn scaled(advertised: u32) -> u32 {
    ((93 * u64::from(advertised) + 50) / 100).max(1) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_worth_more_than_the_burst_goes_once_and_later_frames_wait_out_its_debt() {
        let t0 = Instant::now();
        let mut b = TokenBucket::from_advertised(
            Some(RateLimitInfo {
                burst: 10,
                per_sec: 10,
            }),
            t0,
        );
        assert!(
            b.try_take_cost(100, t0),
            "admitted with tokens left, never refused forever"
        );
        assert!(!b.try_take(t0));
        // 9 left before, 100 taken: 91 owed at 9/s, and one more to spend.
        assert!(!b.try_take(t0 + Duration::from_secs(10)));
        assert!(b.try_take(t0 + Duration::from_secs(11)));
        // A large frame admitted by one token owes the rest of its cost.
        b.owe(20);
        assert!(!b.try_take(t0 + Duration::from_secs(12)));
        assert!(b.try_take(t0 + Duration::from_secs(14)));
    }

    #[test]
    fn figures_are_93_percent_of_the_advertised_ones() {
        assert_eq!(scaled(2000), 1860);
        assert_eq!(scaled(1000), 930);
        assert_eq!(scaled(30), 28);
        assert_eq!(scaled(10), 9);
        assert_eq!(scaled(0), 1);
    }

    #[test]
    fn bucket_drains_refills_and_backs_off() {
        let t0 = Instant::now();
        let mut b = TokenBucket::from_advertised(None, t0);
        assert!((0..28).all(|_| b.try_take(t0)));
        assert!(!b.try_take(t0));
        let later = t0 + Duration::from_millis(120);
        assert!(b.try_take(later));
        b.back_off(Duration::from_secs(1), later);
        assert!(!b.try_take(later + Duration::from_millis(900)));
        assert!(b.try_take(later + Duration::from_millis(1200)));
    }

    #[test]
    fn a_pause_of_ages_ends_after_the_cap() {
        let t0 = Instant::now();
        let mut b = TokenBucket::from_advertised(None, t0);
        b.back_off(Duration::from_millis(u64::MAX), t0);
        assert!(!b.try_take(t0 + MAX_PAUSE - Duration::from_millis(1)));
        assert_eq!(
            b.next_token_at(t0),
            t0 + MAX_PAUSE + Duration::from_secs_f64(1.0 / 9.0)
        );
        assert!(b.try_take(t0 + MAX_PAUSE + Duration::from_secs(1)));
    }
}
