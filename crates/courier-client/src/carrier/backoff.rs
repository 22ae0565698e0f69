//! Reconnect pacing of the relay and gateway carriers: 1 s doubling to 30 s, with up to 25 %
//! jitter so a fleet does not reconnect in step.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            min: Duration::from_secs(1),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The pause before reconnect attempt `attempt` (0 after a connection that worked).
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self
            .min
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max);
        let jitter = RandomState::new().hash_one(Instant::now()) % 250;
        base + base.mul_f64(jitter as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_one_second_to_thirty_with_jitter() {
        let backoff = Backoff::default();
        for (attempt, base) in [(0, 1), (1, 2), (2, 4), (3, 8), (4, 16), (5, 30), (40, 30)] {
            let delay = backoff.delay(attempt);
            let base = Duration::from_secs(base);
            assert!(
                delay >= base && delay < base.mul_f64(1.25),
                "{attempt}: {delay:?}"
            );
        }
    }
}
