//! The per-account byte limit and the sender share in cluster mode
//! (`docs/cluster.md#mailbox-limits`). JetStream bounds a subject's frame count and the whole
//! stream's bytes, not what a subject's frames weigh nor what one sender holds there; the relay
//! works those out from the journal itself, so no fault can leave a count behind that is wrong.
//!
//! Each frame carries its sender and its size in headers. Each node keeps, per account, a tally
//! of the account's frames through a stream sequence: an upper bound of what the account holds,
//! since releases and expiry only take frames away. An append brings the tally through the
//! subject's last frame, reading only the frames appended since (through any node), and a frame
//! that fits under it fits. A frame that does not is refused only once the tally is exact.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use async_nats::HeaderMap;
use futures_util::{StreamExt, TryStreamExt};

use super::{request, ClusterError, JetStreamStore};
use crate::config::MailboxLimits;

/// The headers a frame carries its sending account (as a token) and its size in.
const SENDER_HEADER: &str = "Courier-Sender";
const BYTES_HEADER: &str = "Courier-Bytes";

/// Past this many frames to read, a tally is brought up to date by one consumer of the
/// account's subject, headers only, instead of a read per frame.
const READS_PER_FRAME: usize = 16;

/// How long reading the account's frames through a consumer may take.
const COUNT_DEADLINE: Duration = Duration::from_secs(10);

/// Accounts and (account, sender) pairs tallied in memory; past it every tally is dropped and
/// counted again from the journal when next needed.
const KEEP_TALLIED: usize = 262_144;

/// What one frame counts for against the limits, wherever it stands in the journal.
pub(super) struct Weight {
    /// The sending account's token (`names.rs`).
    pub sender: String,
    pub bytes: u64,
}

impl Weight {
    /// The headers that carry it, beside the frame's own.
    pub fn write(&self, headers: &mut HeaderMap) {
        headers.insert(SENDER_HEADER, self.sender.as_str());
        headers.insert(BYTES_HEADER, self.bytes.to_string().as_str());
    }

    /// The weight the headers of the frame at `stream_seq` carry.
    fn read(stream_seq: u64, headers: Option<&HeaderMap>) -> Result<Self, ClusterError> {
        let corrupt = || ClusterError::Corrupt(format!("frame {stream_seq} carries no size"));
        let headers = headers.ok_or_else(corrupt)?;
        let sender = headers.get(SENDER_HEADER).ok_or_else(corrupt)?;
        let bytes = headers
            .get(BYTES_HEADER)
            .and_then(|value| value.as_str().parse().ok())
            .ok_or_else(corrupt)?;
        Ok(Self {
            sender: sender.as_str().to_owned(),
            bytes,
        })
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Held {
    frames: u64,
    bytes: u64,
}

impl Held {
    fn add(&mut self, bytes: u64) {
        self.frames += 1;
        self.bytes = self.bytes.saturating_add(bytes);
    }

    fn fits(self, bytes: u64, (max_frames, max_bytes): (u64, u64)) -> bool {
        self.frames < max_frames && self.bytes.saturating_add(bytes) <= max_bytes
    }
}

/// What an account's subject held through a stream sequence: every frame up to `through` that
/// was still there when it was read.
#[derive(Debug, Default, Clone)]
struct Tally {
    through: u64,
    total: Held,
    senders: HashMap<String, Held>,
}

impl Tally {
    /// Counts the frame at `stream_seq` unless the tally is past it already.
    fn count(&mut self, stream_seq: u64, weight: &Weight) {
        if stream_seq <= self.through {
            return;
        }
        self.through = stream_seq;
        self.total.add(weight.bytes);
        self.senders
            .entry(weight.sender.clone())
            .or_default()
            .add(weight.bytes);
    }

    fn fits(&self, sender: &str, bytes: u64, limits: &MailboxLimits) -> bool {
        let share = self.senders.get(sender).copied().unwrap_or_default();
        self.total
            .fits(bytes, (limits.max_messages, limits.max_bytes))
            && share.fits(bytes, limits.sender_share())
    }

    fn entries(&self) -> usize {
        1 + self.senders.len()
    }
}

/// This node's tallies, by account.
#[derive(Default)]
pub(super) struct Tallies {
    inner: Mutex<TallyMap>,
}

#[derive(Default)]
struct TallyMap {
    by_account: HashMap<String, Tally>,
    /// Accounts and senders held, for [`KEEP_TALLIED`].
    entries: usize,
}

impl TallyMap {
    fn through(&self, account: &str) -> u64 {
        self.by_account.get(account).map_or(0, |t| t.through)
    }

    /// Applies `change` to the account's tally, keeping the count of entries.
    fn change<T>(&mut self, account: &str, change: impl FnOnce(&mut Tally) -> T) -> T {
        let before = self.by_account.get(account).map_or(0, Tally::entries);
        let tally = self.by_account.entry(account.to_owned()).or_default();
        let answer = change(tally);
        self.entries = self.entries - before + tally.entries();
        if self.entries > KEEP_TALLIED {
            self.by_account.clear();
            self.entries = 0;
        }
        answer
    }
}

impl Tallies {
    fn lock(&self) -> std::sync::MutexGuard<'_, TallyMap> {
        crate::lock(&self.inner)
    }

    /// After a frame of `weight` was stored at `stream_seq`, right after the subject's `last`:
    /// counted where the tally went through `last`. The subject held nothing after `last` then,
    /// so whatever the tally counted past it was released since and the frame follows it. A
    /// tally short of `last` has frames to read first, and reads this one with them.
    pub fn stored(&self, account: &str, last: u64, stream_seq: u64, weight: &Weight) {
        let mut map = self.lock();
        if map.by_account.contains_key(account) && map.through(account) >= last {
            map.change(account, |tally| tally.count(stream_seq, weight));
        }
    }
}

impl JetStreamStore {
    /// Whether a frame of `weight` fits the account's mailbox and its sender's share as the
    /// account's subject stands through `last` (`docs/cluster.md#mailbox-limits`).
    pub(super) async fn has_room(
        &self,
        account: &str,
        subject: &str,
        last: u64,
        weight: &Weight,
    ) -> Result<bool, ClusterError> {
        let limits = &self.inner.limits;
        let tallies = &self.inner.tallies;
        // Frames read meanwhile by another append on this node count once; a tally dropped
        // meanwhile is read again from its start.
        let fits = loop {
            let from = tallies.lock().through(account);
            let frames = self.weigh(subject, from, last).await?;
            let mut map = tallies.lock();
            if map.through(account) < from {
                continue;
            }
            break map.change(account, |tally| {
                for (stream_seq, read) in &frames {
                    tally.count(*stream_seq, read);
                }
                tally.fits(&weight.sender, weight.bytes, limits)
            });
        };
        if fits {
            return Ok(true);
        }
        if self.tally_is_exact(account, subject, last).await? {
            return Ok(false);
        }
        let mut exact = Tally::default();
        for (stream_seq, read) in self.weigh(subject, 0, last).await? {
            exact.count(stream_seq, &read);
        }
        exact.through = exact.through.max(last);
        let fits = exact.fits(&weight.sender, weight.bytes, limits);
        tracing::debug!(
            frames = exact.total.frames,
            bytes = exact.total.bytes,
            fits,
            "mailbox counted again from the journal"
        );
        // Kept even where the tally had gone further: frames past `last` are read again on the
        // next append, and a tally that counted released frames must not make every later
        // append count the journal again.
        tallies.lock().change(account, |tally| *tally = exact);
        Ok(fits)
    }

    /// Whether the account's tally holds exactly the frames its subject holds through `last`:
    /// nothing it counted was released or expired since, which the subject's frame count tells
    /// while the subject still ends at `last`.
    async fn tally_is_exact(
        &self,
        account: &str,
        subject: &str,
        last: u64,
    ) -> Result<bool, ClusterError> {
        let tallied = {
            let map = self.inner.tallies.lock();
            match map.by_account.get(account) {
                Some(tally) if tally.through == last => tally.total.frames,
                _ => return Ok(false),
            }
        };
        let held = self
            .inner
            .journal
            .info_with_subjects(subject)
            .await
            .map_err(request)?
            .try_collect::<HashMap<String, usize>>()
            .await
            .map_err(request)?
            .get(subject)
            .map_or(0, |&n| n as u64);
        Ok(held == tallied && self.subject_last(subject).await? == last)
    }

    /// The subject's frames after stream sequence `after` up to `last`, in order: each one's
    /// stream sequence and weight.
    async fn weigh(
        &self,
        subject: &str,
        after: u64,
        last: u64,
    ) -> Result<Vec<(u64, Weight)>, ClusterError> {
        let mut frames = Vec::new();
        let mut next = after + 1;
        while next <= last {
            if frames.len() == READS_PER_FRAME {
                frames.extend(self.weigh_by_consumer(subject, next, last).await?);
                break;
            }
            let Some(message) = self.first_from(subject, next).await? else {
                break;
            };
            if message.sequence > last {
                break;
            }
            let weight = Weight::read(message.sequence, Some(&message.headers))?;
            frames.push((message.sequence, weight));
            next = message.sequence + 1;
        }
        Ok(frames)
    }

    /// The subject's frames from stream sequence `from` up to `last`, through one ordered
    /// consumer that delivers headers only.
    async fn weigh_by_consumer(
        &self,
        subject: &str,
        from: u64,
        last: u64,
    ) -> Result<Vec<(u64, Weight)>, ClusterError> {
        let consumer = self
            .inner
            .journal
            .create_consumer(pull::OrderedConfig {
                filter_subject: subject.to_owned(),
                headers_only: true,
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: from,
                },
                ..Default::default()
            })
            .await
            .map_err(request)?;
        let mut frames = Vec::new();
        if consumer.cached_info().num_pending == 0 {
            return Ok(frames);
        }
        let mut messages = consumer.messages().await.map_err(request)?;
        let read = async {
            while let Some(message) = messages.next().await {
                let message = message.map_err(request)?;
                let info = message.info().map_err(request)?;
                if info.stream_sequence > last {
                    break;
                }
                let weight = Weight::read(info.stream_sequence, message.headers.as_ref())?;
                frames.push((info.stream_sequence, weight));
                if info.stream_sequence == last || info.pending == 0 {
                    break;
                }
            }
            Ok::<_, ClusterError>(())
        };
        tokio::time::timeout(COUNT_DEADLINE, read)
            .await
            .map_err(|_| {
                ClusterError::Request(format!(
                    "reading the account's frames took longer than {COUNT_DEADLINE:?}"
                ))
            })??;
        Ok(frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weight(sender: &str, bytes: u64) -> Weight {
        Weight {
            sender: sender.into(),
            bytes,
        }
    }

    fn limits() -> MailboxLimits {
        MailboxLimits {
            max_messages: 10,
            max_bytes: 1_000,
            sender_share_percent: 50,
            ..MailboxLimits::default()
        }
    }

    #[test]
    fn a_tally_counts_each_frame_once_and_keeps_each_senders_part() {
        let mut tally = Tally::default();
        for (seq, sender, bytes) in [(3, "a", 100), (5, "b", 200), (5, "b", 200)] {
            tally.count(seq, &weight(sender, bytes));
        }
        tally.count(4, &weight("a", 100));
        assert_eq!(tally.through, 5);
        assert_eq!(
            tally.total,
            Held {
                frames: 2,
                bytes: 300
            }
        );
        assert_eq!(
            tally.senders["a"],
            Held {
                frames: 1,
                bytes: 100
            }
        );
        assert!(tally.fits("a", 400, &limits()), "a holds 100 of its 500");
        assert!(
            !tally.fits("a", 401, &limits()),
            "past a's half of the bytes"
        );
        assert!(!tally.fits("c", 701, &limits()), "past the mailbox's bytes");
    }

    #[test]
    fn the_frame_count_of_the_mailbox_and_of_a_share_bound_a_tally() {
        let mut tally = Tally::default();
        for seq in 1..=5 {
            tally.count(seq, &weight("a", 1));
        }
        assert!(!tally.fits("a", 1, &limits()), "a holds its five frames");
        for seq in 6..=10 {
            tally.count(seq, &weight("b", 1));
        }
        assert!(
            !tally.fits("c", 1, &limits()),
            "ten frames fill the mailbox"
        );
    }

    #[test]
    fn a_frame_stored_counts_where_the_tally_went_through_the_last_frame_before_it() {
        let tallies = Tallies::default();
        tallies
            .lock()
            .change("bob", |t| t.count(4, &weight("a", 10)));
        tallies.stored("bob", 5, 6, &weight("a", 10));
        assert_eq!(
            tallies.lock().through("bob"),
            4,
            "a tally at 4 reads 5 and 6 itself"
        );
        // Published after 3: frame 4, counted, was released since.
        tallies.stored("bob", 3, 6, &weight("a", 10));
        assert_eq!(tallies.lock().through("bob"), 6);
        assert_eq!(tallies.lock().by_account["bob"].total.frames, 2);
        tallies.stored("carol", 0, 7, &weight("a", 10));
        assert!(
            !tallies.lock().by_account.contains_key("carol"),
            "an account never tallied is counted from the journal"
        );
    }

    #[test]
    fn tallies_past_the_bound_are_dropped() {
        let mut map = TallyMap::default();
        for i in 0..KEEP_TALLIED as u64 / 2 {
            map.change(&format!("account{i}"), |t| t.count(1, &weight("a", 1)));
        }
        assert_eq!(map.entries, KEEP_TALLIED);
        map.change("one more", |t| t.count(1, &weight("a", 1)));
        assert!(map.by_account.is_empty());
        assert_eq!(map.entries, 0);
    }
}
