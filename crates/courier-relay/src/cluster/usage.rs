//! The mailbox limits JetStream has no limit for (`docs/cluster.md#mailbox-limits`): the bytes
//! an account's journal holds, and what each sending account holds in it (the sender share, in
//! frames and bytes). The stream counts each subject's messages and the whole stream's bytes, not
//! a subject's bytes nor a sender's part, so the relay counts them in the `usage` bucket: one
//! record per account and one per (account, sender), changed by compare-and-set.
//!
//! An append takes its room in both records before it publishes and gives it back if the frame
//! was not stored; a release gives back what it deleted. The counts are kept by the hour the
//! frames were accepted in, and an hour whose frames have all expired (the stream's max age
//! deleted them without telling anyone) drops out of the count. So a count left wrong by a node
//! that died between a publish and its record (too high, never too low) mends itself once that
//! hour expires.

use std::collections::BTreeMap;

use futures_util::future::try_join_all;
use serde::{Deserialize, Serialize};

use super::names::token;
use super::record::change_record;
use super::{ClusterError, JetStreamStore};
use crate::config::MailboxLimits;

const HOUR_MS: u64 = 3_600_000;

/// Frames and bytes by the hour they were accepted in.
#[derive(Default, Serialize, Deserialize)]
struct Usage {
    hours: BTreeMap<u64, (u64, u64)>,
}

impl Usage {
    /// Forgets the hours whose every frame is past the lifetime `ttl_ms` at `now_ms`.
    fn expire(&mut self, now_ms: u64, ttl_ms: u64) {
        let oldest_live = now_ms.saturating_sub(ttl_ms) / HOUR_MS;
        self.hours = self.hours.split_off(&oldest_live);
    }

    fn total(&self) -> (u64, u64) {
        self.hours
            .values()
            .fold((0, 0), |(f, b), (frames, bytes)| (f + frames, b + bytes))
    }

    fn add(&mut self, accepted_ms: u64, frames: u64, bytes: u64) {
        let hour = self.hours.entry(accepted_ms / HOUR_MS).or_default();
        hour.0 += frames;
        hour.1 += bytes;
    }

    /// Gives back what `add` took; what an hour no longer counts is not taken twice.
    fn sub(&mut self, accepted_ms: u64, frames: u64, bytes: u64) {
        let key = accepted_ms / HOUR_MS;
        if let Some(hour) = self.hours.get_mut(&key) {
            hour.0 = hour.0.saturating_sub(frames);
            hour.1 = hour.1.saturating_sub(bytes);
            if *hour == (0, 0) {
                self.hours.remove(&key);
            }
        }
    }
}

/// One frame as the counts see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Counted {
    pub sender_account: String,
    pub accepted_ms: u64,
    pub bytes: u64,
}

impl JetStreamStore {
    /// Takes room for `frame` in `account`'s mailbox and in its sender's share, at `now_ms`:
    /// `false` (and nothing taken) when either has none.
    pub(super) async fn take_room(
        &self,
        account: &str,
        frame: &Counted,
        now_ms: u64,
    ) -> Result<bool, ClusterError> {
        let limits = &self.inner.limits;
        let (mailbox, share) = (token(&[account]), token(&[account, &frame.sender_account]));
        let (share_frames, share_bytes) = limits.sender_share();
        let (took_mailbox, took_share) = tokio::try_join!(
            self.take(
                &mailbox,
                frame,
                now_ms,
                limits,
                (u64::MAX, limits.max_bytes)
            ),
            self.take(&share, frame, now_ms, limits, (share_frames, share_bytes)),
        )?;
        let frame = std::slice::from_ref(frame);
        match (took_mailbox, took_share) {
            (true, true) => return Ok(true),
            (true, false) => self.give(&mailbox, frame).await?,
            (false, true) => self.give(&share, frame).await?,
            (false, false) => {}
        }
        Ok(false)
    }

    /// Gives back the room of `frames` of `account`, deleted or never stored.
    pub(super) async fn give_room(
        &self,
        account: &str,
        frames: &[Counted],
    ) -> Result<(), ClusterError> {
        if frames.is_empty() {
            return Ok(());
        }
        let mut by_sender: BTreeMap<&str, Vec<Counted>> = BTreeMap::new();
        for frame in frames {
            by_sender
                .entry(&frame.sender_account)
                .or_default()
                .push(frame.clone());
        }
        let mailbox = token(&[account]);
        let shares: Vec<(String, Vec<Counted>)> = by_sender
            .into_iter()
            .map(|(sender, frames)| (token(&[account, sender]), frames))
            .collect();
        let given = shares.iter().map(|(key, frames)| self.give(key, frames));
        tokio::try_join!(self.give(&mailbox, frames), try_join_all(given))?;
        Ok(())
    }

    async fn take(
        &self,
        key: &str,
        frame: &Counted,
        now_ms: u64,
        limits: &MailboxLimits,
        (max_frames, max_bytes): (u64, u64),
    ) -> Result<bool, ClusterError> {
        change_record(&self.inner.usage, key, |usage: &mut Usage| {
            usage.expire(now_ms, limits.ttl_ms);
            let (frames, bytes) = usage.total();
            let fits = frames < max_frames && bytes.saturating_add(frame.bytes) <= max_bytes;
            if fits {
                usage.add(frame.accepted_ms, 1, frame.bytes);
            }
            (fits, fits)
        })
        .await
    }

    async fn give(&self, key: &str, frames: &[Counted]) -> Result<(), ClusterError> {
        change_record(&self.inner.usage, key, |usage: &mut Usage| {
            for frame in frames {
                usage.sub(frame.accepted_ms, 1, frame.bytes);
            }
            ((), true)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_hour_drops_out_once_its_every_frame_expired() {
        let mut usage = Usage::default();
        usage.add(HOUR_MS + 10, 1, 100);
        usage.add(2 * HOUR_MS + 10, 1, 50);
        let ttl = HOUR_MS;
        usage.expire(2 * HOUR_MS + 20, ttl);
        assert_eq!(usage.total(), (2, 150), "a frame of the hour may live on");
        usage.expire(3 * HOUR_MS, ttl);
        assert_eq!(usage.total(), (1, 50));
    }

    #[test]
    fn giving_back_never_goes_below_nothing() {
        let mut usage = Usage::default();
        usage.add(5, 1, 100);
        usage.sub(5, 2, 300);
        usage.sub(HOUR_MS * 9, 1, 1);
        assert_eq!(usage.total(), (0, 0));
        assert!(usage.hours.is_empty());
    }
}
