//! Which relay URL the carrier dials (`docs/protocol.md#reconnection`): `transports.internet.url`
//! may list the nodes of one relay cluster. The carrier starts at one picked at random, so a
//! fleet of clients spreads over the nodes, and moves to the next after a connection fails or
//! drops; the backoff between attempts is the same as with one URL. Every node serves the same
//! accounts and journal, so nothing about delivery depends on which one answers.

use rand_core::{OsRng, RngCore};

#[derive(Debug)]
pub(super) struct Nodes<'a> {
    urls: &'a [String],
    current: usize,
}

impl<'a> Nodes<'a> {
    /// `urls` is never empty (the config refuses an empty list).
    pub fn new(urls: &'a [String]) -> Self {
        let current = match urls.len() {
            0 | 1 => 0,
            n => (OsRng.next_u32() as usize) % n,
        };
        Self { urls, current }
    }

    pub fn current(&self) -> &'a str {
        &self.urls[self.current]
    }

    /// Moves on to the next node; answers its URL when there is more than one.
    pub fn fail_over(&mut self) -> Option<&'a str> {
        if self.urls.len() < 2 {
            return None;
        }
        self.current = (self.current + 1) % self.urls.len();
        Some(self.current())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_over_visits_every_node_in_turn_from_wherever_it_started() {
        let urls: Vec<String> = (0..3)
            .map(|i| format!("ws://127.0.0.1:{}", 4000 + i))
            .collect();
        let mut nodes = Nodes::new(&urls);
        let first = nodes.current();
        let mut seen = vec![first];
        for _ in 0..3 {
            seen.push(nodes.fail_over().unwrap());
        }
        assert_eq!(seen[3], first, "back to the start after one round");
        let mut round = seen[..3].to_vec();
        round.sort_unstable();
        assert_eq!(round, urls.iter().map(String::as_str).collect::<Vec<_>>());
    }

    #[test]
    fn one_url_never_fails_over() {
        let urls = vec!["ws://127.0.0.1:4000".to_owned()];
        let mut nodes = Nodes::new(&urls);
        assert_eq!(nodes.fail_over(), None);
        assert_eq!(nodes.current(), "ws://127.0.0.1:4000");
    }
}
