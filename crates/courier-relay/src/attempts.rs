//! Limits on authentication (`docs/protocol.md#authentication-limits`): attempts per source
//! address and per account, logins that displace a live connection, and connections per source
//! that have not authenticated yet.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::auth::AuthFailure;
use crate::config::{AttemptLimit, AuthPolicy};
use crate::lock;

/// Below this many keys a limiter never sweeps.
const SWEEP_FLOOR: usize = 4096;

/// The key of a source address: an IPv4 address, or the /64 of an IPv6 one, since a single
/// host is commonly handed a whole /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Source(IpAddr);

impl Source {
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self(ip),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self(IpAddr::V4(v4)),
                None => {
                    let bits = u128::from(v6) & !((1u128 << 64) - 1);
                    Self(IpAddr::V6(bits.into()))
                }
            },
        }
    }
}

struct Bucket {
    tokens: f64,
    last: Instant,
}

/// One token bucket per key, all alike. A bucket that has refilled to its burst is the same
/// as no bucket, so sweeps drop those: the map holds only keys active within the last refill.
pub(crate) struct AttemptLimiter<K> {
    limit: AttemptLimit,
    buckets: Mutex<Buckets<K>>,
}

struct Buckets<K> {
    map: HashMap<K, Bucket>,
    sweep_at: usize,
}

impl<K: Hash + Eq> AttemptLimiter<K> {
    pub fn new(limit: AttemptLimit) -> Self {
        Self {
            limit,
            buckets: Mutex::new(Buckets {
                map: HashMap::new(),
                sweep_at: SWEEP_FLOOR,
            }),
        }
    }

    /// Takes one attempt for `key`; `false` when its bucket is empty.
    pub fn try_take(&self, key: K, now: Instant) -> bool {
        let burst = f64::from(self.limit.burst);
        let per_sec = f64::from(self.limit.per_minute) / 60.0;
        let mut buckets = lock(&self.buckets);
        if buckets.map.len() >= buckets.sweep_at {
            buckets.map.retain(|_, b| {
                b.tokens + now.saturating_duration_since(b.last).as_secs_f64() * per_sec < burst
            });
            buckets.sweep_at = (buckets.map.len() * 2).max(SWEEP_FLOOR);
        }
        let bucket = buckets.map.entry(key).or_insert(Bucket {
            tokens: burst,
            last: now,
        });
        let elapsed = now.saturating_duration_since(bucket.last).as_secs_f64();
        bucket.last = now;
        bucket.tokens = (bucket.tokens + elapsed * per_sec).min(burst);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Connections per source that have not authenticated yet.
pub(crate) struct Unauthenticated {
    max: u32,
    open: Arc<Mutex<HashMap<Source, u32>>>,
}

/// One unauthenticated connection, counted until it authenticates or ends.
pub(crate) struct Pending {
    source: Source,
    open: Arc<Mutex<HashMap<Source, u32>>>,
}

impl Unauthenticated {
    pub fn new(max: u32) -> Self {
        Self {
            max,
            open: Arc::default(),
        }
    }

    /// Counts a new connection from `source`; `None` when the source is at its cap.
    pub fn admit(&self, source: Source) -> Option<Pending> {
        let mut open = lock(&self.open);
        let count = open.entry(source).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(Pending {
            source,
            open: Arc::clone(&self.open),
        })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut open = lock(&self.open);
        if let Some(count) = open.get_mut(&self.source) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.source);
            }
        }
    }
}

/// Every authentication limit of one relay.
pub(crate) struct AuthLimits {
    per_source: AttemptLimiter<Source>,
    per_account: AttemptLimiter<String>,
    displacements: AttemptLimiter<String>,
    unauthenticated: Unauthenticated,
    limit_loopback: bool,
}

impl AuthLimits {
    pub fn new(policy: &AuthPolicy) -> Self {
        Self {
            per_source: AttemptLimiter::new(policy.attempts_per_source),
            per_account: AttemptLimiter::new(policy.attempts_per_account),
            displacements: AttemptLimiter::new(policy.supersedes_per_account),
            unauthenticated: Unauthenticated::new(policy.max_unauthenticated_per_source),
            limit_loopback: policy.limit_loopback,
        }
    }

    /// The source `ip` is limited as, if it is limited at all.
    fn source(&self, ip: IpAddr) -> Option<Source> {
        let ip = ip.to_canonical();
        (self.limit_loopback || !ip.is_loopback()).then(|| Source::of(ip))
    }

    /// Counts a new connection from `ip` until it authenticates; `Err` when its source is at
    /// the cap, `Ok(None)` when the source is not limited.
    pub fn admit(&self, ip: IpAddr) -> Result<Option<Pending>, ()> {
        match self.source(ip) {
            None => Ok(None),
            Some(source) => self.unauthenticated.admit(source).map(Some).ok_or(()),
        }
    }

    /// An `Authenticate` from `ip`, before its token is checked.
    pub fn attempt(&self, ip: IpAddr, now: Instant) -> Result<(), AuthFailure> {
        match self.source(ip) {
            Some(source) if !self.per_source.try_take(source, now) => {
                Err(AuthFailure::TooManyAttempts)
            }
            _ => Ok(()),
        }
    }

    /// A valid token for `account`; `displacing` when the account has a live connection.
    pub fn login(&self, account: &str, displacing: bool, now: Instant) -> Result<(), AuthFailure> {
        if !self.per_account.try_take(account.to_owned(), now) {
            return Err(AuthFailure::TooManyLogins);
        }
        if displacing && !self.displacements.try_take(account.to_owned(), now) {
            return Err(AuthFailure::TooManyDisplacements);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_key_gets_its_burst_then_its_refill() {
        let limiter = AttemptLimiter::new(AttemptLimit {
            burst: 2,
            per_minute: 60,
        });
        let t0 = Instant::now();
        assert!(limiter.try_take("a", t0));
        assert!(limiter.try_take("a", t0));
        assert!(!limiter.try_take("a", t0));
        assert!(limiter.try_take("b", t0), "keys are apart");
        assert!(limiter.try_take("a", t0 + Duration::from_secs(1)));
        assert!(!limiter.try_take("a", t0 + Duration::from_secs(1)));
    }

    #[test]
    fn refilled_keys_are_swept() {
        let limiter = AttemptLimiter::new(AttemptLimit {
            burst: 1,
            per_minute: 60,
        });
        let t0 = Instant::now();
        for key in 0..SWEEP_FLOOR {
            assert!(limiter.try_take(key, t0));
        }
        assert!(limiter.try_take(usize::MAX, t0 + Duration::from_secs(2)));
        assert_eq!(lock(&limiter.buckets).map.len(), 1);
    }

    #[test]
    fn an_ipv6_source_is_its_slash_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(Source::of(a), Source::of(b));
        assert_ne!(Source::of(a), Source::of(c));
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        let v4: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(Source::of(mapped), Source::of(v4));
    }

    #[test]
    fn a_source_is_capped_until_its_connections_end() {
        let cap = Unauthenticated::new(2);
        let src = Source::of("192.0.2.1".parse().unwrap());
        let first = cap.admit(src).unwrap();
        let _second = cap.admit(src).unwrap();
        assert!(cap.admit(src).is_none());
        drop(first);
        assert!(cap.admit(src).is_some());
    }
}
