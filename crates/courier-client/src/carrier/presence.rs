//! Presence of the peers the engine asks about (`docs/protocol.md#presence`): watched through the
//! relay's `presence_watch_v1` when it has it, else polled with `CheckPresence` every 20 s, at
//! most 10 a tick. The set outlives connections; watches are per connection, so each new one
//! is told the whole set again.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use courier_proto::ClientFrame;

/// The relay keeps at most this many watches per connection.
const MAX_WATCHES: usize = 1024;
const POLL_EVERY: Duration = Duration::from_secs(20);
const POLLS_PER_TICK: usize = 10;

#[derive(Debug, Default)]
pub struct PresenceWatch {
    /// Every peer the engine wants to hear about.
    peers: BTreeSet<String>,
    /// Of those, the ones this connection watches at the relay.
    watched: BTreeSet<String>,
    to_watch: Vec<String>,
    to_unwatch: Vec<String>,
    /// Without the capability (or past the relay's cap): peers to poll, round-robin.
    polls: VecDeque<String>,
    next_poll: Option<Instant>,
    can_watch: bool,
    connected: bool,
}

impl PresenceWatch {
    pub fn watch(&mut self, peer: String) {
        if !self.peers.insert(peer.clone()) || !self.connected {
            return;
        }
        if self.can_watch && self.watched.len() < MAX_WATCHES {
            self.watched.insert(peer.clone());
            self.to_watch.push(peer);
        } else {
            self.polls.push_back(peer);
        }
    }

    pub fn unwatch(&mut self, peer: &str) {
        if !self.peers.remove(peer) {
            return;
        }
        if self.watched.remove(peer) {
            self.to_watch.retain(|p| p != peer);
            self.to_unwatch.push(peer.to_owned());
        }
        self.polls.retain(|p| p != peer);
    }

    /// A new connection: watch everything again (or poll it).
    pub fn connected(&mut self, can_watch: bool, now: Instant) {
        self.connected = true;
        self.can_watch = can_watch;
        self.watched.clear();
        self.to_watch.clear();
        self.to_unwatch.clear();
        self.polls.clear();
        for peer in &self.peers {
            if can_watch && self.watched.len() < MAX_WATCHES {
                self.watched.insert(peer.clone());
                self.to_watch.push(peer.clone());
            } else {
                self.polls.push_back(peer.clone());
            }
        }
        self.next_poll = Some(now);
    }

    pub fn disconnected(&mut self) {
        self.connected = false;
        self.next_poll = None;
    }

    /// When polling next needs the writer, if it does.
    pub fn next_wake(&self) -> Option<Instant> {
        if !self.to_watch.is_empty() || !self.to_unwatch.is_empty() {
            return Some(Instant::now());
        }
        self.next_poll.filter(|_| !self.polls.is_empty())
    }

    /// Whether a frame is ready to write now.
    pub fn has_frame(&self, now: Instant) -> bool {
        !self.to_watch.is_empty()
            || !self.to_unwatch.is_empty()
            || (!self.polls.is_empty() && self.next_poll.is_some_and(|at| at <= now))
    }

    /// The next presence frames to write (one watch or unwatch frame, or a tick's polls).
    pub fn take_frames(&mut self, now: Instant) -> Vec<ClientFrame> {
        if !self.to_unwatch.is_empty() {
            return vec![ClientFrame::UnwatchPresence {
                users: std::mem::take(&mut self.to_unwatch),
            }];
        }
        if !self.to_watch.is_empty() {
            return vec![ClientFrame::WatchPresence {
                users: std::mem::take(&mut self.to_watch),
            }];
        }
        if self.polls.is_empty() || self.next_poll.is_none_or(|at| at > now) {
            return Vec::new();
        }
        self.next_poll = Some(now + POLL_EVERY);
        let n = self.polls.len().min(POLLS_PER_TICK);
        let mut frames = Vec::with_capacity(n);
        for _ in 0..n {
            if let Some(peer) = self.polls.pop_front() {
                frames.push(ClientFrame::CheckPresence {
                    username: peer.clone(),
                });
                self.polls.push_back(peer);
            }
        }
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_are_sent_as_deltas_and_renewed_on_each_connection() {
        let t0 = Instant::now();
        let mut p = PresenceWatch::default();
        p.watch("bob".into());
        assert!(!p.has_frame(t0), "nothing is written while disconnected");
        p.connected(true, t0);
        assert_eq!(
            p.take_frames(t0),
            vec![ClientFrame::WatchPresence {
                users: vec!["bob".into()]
            }]
        );
        p.watch("carol".into());
        p.watch("carol".into());
        p.unwatch("bob");
        assert_eq!(
            p.take_frames(t0),
            vec![ClientFrame::UnwatchPresence {
                users: vec!["bob".into()]
            }]
        );
        assert_eq!(
            p.take_frames(t0),
            vec![ClientFrame::WatchPresence {
                users: vec!["carol".into()]
            }]
        );
        assert!(p.take_frames(t0).is_empty());
        p.disconnected();
        p.connected(true, t0);
        assert_eq!(
            p.take_frames(t0),
            vec![ClientFrame::WatchPresence {
                users: vec!["carol".into()]
            }]
        );
    }

    #[test]
    fn without_the_capability_ten_peers_are_polled_every_twenty_seconds() {
        let t0 = Instant::now();
        let mut p = PresenceWatch::default();
        for i in 0..15 {
            p.watch(format!("peer{i:02}"));
        }
        p.connected(false, t0);
        let first = p.take_frames(t0);
        assert_eq!(first.len(), 10);
        assert!(p.take_frames(t0 + Duration::from_secs(19)).is_empty());
        let second = p.take_frames(t0 + Duration::from_secs(20));
        assert_eq!(second.len(), 10);
        assert_eq!(
            second[0],
            ClientFrame::CheckPresence {
                username: "peer10".into()
            }
        );
    }
}
