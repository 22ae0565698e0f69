//! `file_progress`, throttled: at most one event per transfer per [`EVERY_MS`], plus the last.
//! The rate is measured over the whole transfer in this process, so a resumed transfer's rate
//! counts only what moved since it resumed.

use courier_engine::Millis;

/// At most this often per transfer (four a second).
pub const EVERY_MS: Millis = 250;

#[derive(Debug, Clone)]
pub struct Progress {
    /// Bytes and time when this process started following the transfer.
    base: (u64, Millis),
    last_emit: Option<Millis>,
}

/// One `file_progress` reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    pub bytes: u64,
    pub chunks: u32,
    pub bytes_per_second: u64,
    /// `None` until there is a rate to go by.
    pub eta_ms: Option<u64>,
}

impl Progress {
    pub fn new(bytes: u64, now: Millis) -> Self {
        Self {
            base: (bytes, now),
            last_emit: None,
        }
    }

    /// A reading of `bytes` of `total` (`chunks` done) if one is due: always the final one.
    pub fn due(&mut self, bytes: u64, total: u64, chunks: u32, now: Millis) -> Option<Reading> {
        let last = bytes >= total;
        if !last && self.last_emit.is_some_and(|at| now < at + EVERY_MS) {
            return None;
        }
        self.last_emit = Some(now);
        let (base_bytes, since) = self.base;
        let elapsed = now.saturating_sub(since);
        let moved = bytes.saturating_sub(base_bytes);
        let bytes_per_second = moved.saturating_mul(1000).checked_div(elapsed).unwrap_or(0);
        let eta_ms = (bytes_per_second > 0)
            .then(|| total.saturating_sub(bytes).saturating_mul(1000) / bytes_per_second);
        Some(Reading {
            bytes,
            chunks,
            bytes_per_second,
            eta_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttled_but_the_last_always_comes() {
        let mut p = Progress::new(0, 1_000);
        assert!(p.due(10, 100, 1, 1_000).is_some());
        assert!(p.due(20, 100, 2, 1_100).is_none(), "within the interval");
        let r = p.due(50, 100, 5, 2_000).unwrap();
        assert_eq!(r.bytes_per_second, 50);
        assert_eq!(r.eta_ms, Some(1_000));
        assert!(
            p.due(100, 100, 10, 2_001).is_some(),
            "the last is never held back"
        );
    }
}
