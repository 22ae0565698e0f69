//! The per-source connection cap (`docs/operating-the-relay.md#the-gateway`): one host cannot
//! take every connection slot. A source is an IPv4 address, or the /64 an IPv6 address lies in,
//! since a single IPv6 host commonly holds a whole /64.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};

/// Connections from one source served at once unless configured otherwise.
pub const DEFAULT_MAX_CONNECTIONS_PER_SOURCE: usize = 64;

/// Open connections per source.
#[derive(Debug)]
pub(crate) struct Sources {
    limit: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place under its source's cap, given back when dropped.
pub(crate) struct SourceSlot {
    sources: Arc<Sources>,
    source: IpAddr,
}

impl Sources {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            open: Mutex::default(),
        }
    }

    /// A slot for a connection from `ip`, or `None` when its source is at the cap.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<SourceSlot> {
        let source = source_of(ip);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(source).or_default();
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(SourceSlot {
            sources: Arc::clone(self),
            source,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self
            .sources
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.source) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.source);
            }
        }
    }
}

fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn caps_each_source_and_frees_on_drop() {
        let sources = Arc::new(Sources::new(2));
        let a = sources.admit(ip("10.0.0.1")).unwrap();
        let _b = sources.admit(ip("::ffff:10.0.0.1")).unwrap();
        assert!(sources.admit(ip("10.0.0.1")).is_none());
        assert!(sources.admit(ip("10.0.0.2")).is_some());
        drop(a);
        assert!(sources.admit(ip("10.0.0.1")).is_some());

        // One /64 is one source.
        let _c = sources.admit(ip("2001:db8::1")).unwrap();
        let _d = sources.admit(ip("2001:db8::ffff:2")).unwrap();
        assert!(sources.admit(ip("2001:db8::3")).is_none());
        assert!(sources.admit(ip("2001:db8:0:1::1")).is_some());
    }

    #[test]
    fn forgets_a_source_with_nothing_open() {
        let sources = Arc::new(Sources::new(1));
        drop(sources.admit(ip("10.0.0.1")));
        assert!(sources.open.lock().unwrap().is_empty());
    }
}
