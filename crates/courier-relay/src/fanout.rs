//! A broadcast's report (`docs/protocol.md#group-report`): once the copies are journaled, each
//! member is classified as its copy reaches it, and exactly one `GroupMessageSent` goes to the
//! sender within the fan-out deadline, or is held for the sender's account if its connection
//! ended first.
//!
//! The report runs as its own task so the sender's reader goes on with its next frame: nothing
//! a member's socket does (a peer that stopped reading included) can hold it past the deadline.

use std::sync::Arc;

use courier_proto::frame::MissedMember;
use courier_proto::limits::{MAX_FRAME_BYTES, MAX_IDENTIFIER_BYTES};
use courier_proto::RelayFrame;
use futures_util::future::join_all;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::cluster::{JetStreamStore, Written};
use crate::mailbox::{Envelope, Unqueued};
use crate::router::Peer;
use crate::writer::Outbound;
use crate::{now_ms, stopping, Ctx};

/// How long a repeat of a broadcast journals no second copy, and how long a held report waits
/// for its account's next connection.
pub const GROUP_MEMORY_MS: u64 = 24 * 60 * 60 * 1000;

/// Reports held per account; beyond it the oldest is dropped.
pub const HELD_REPORTS_PER_ACCOUNT: u32 = 64;

/// The most a report can name: one entry per member, each identifier escaped at worst to twice
/// its length, with room left for the frame's other fields.
pub const MAX_GROUP_MEMBERS_CEILING: u32 = {
    let entry =
        r#"{"username":"","reason":"offline_no_mailbox"},"#.len() + 2 * MAX_IDENTIFIER_BYTES;
    let room = MAX_FRAME_BYTES - 8 * MAX_IDENTIFIER_BYTES;
    (room / entry) as u32
};

/// Why a member did not get the copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// The identifier names no account the relay knows.
    UnknownMember,
    /// Not connected, or its queue is full, and the relay runs without a mailbox.
    OfflineNoMailbox,
    MailboxFull,
    /// The copy was not placed within the fan-out deadline (a member whose socket does not
    /// take it, for one).
    FanoutDeadline,
}

impl Miss {
    pub fn as_str(self) -> &'static str {
        match self {
            Miss::UnknownMember => "unknown_member",
            Miss::OfflineNoMailbox => "offline_no_mailbox",
            Miss::MailboxFull => "mailbox_full",
            Miss::FanoutDeadline => "fanout_deadline",
        }
    }
}

/// What a report says of one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Written to the member's connection.
    Delivered,
    /// In the member's mailbox, for its next connection.
    Pushed,
    Missed(Miss),
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Pushed => "pushed",
            Outcome::Missed(miss) => miss.as_str(),
        }
    }
}

/// Where a member's copy stands once the broadcast is committed.
pub enum Placement {
    /// Journaled as `seq` and queued to the member's connection: delivered once that
    /// connection has flushed it, pushed if the connection ends first.
    Queued {
        flushed: watch::Receiver<u64>,
        seq: u64,
    },
    /// Without a mailbox: the member is connected, and the copy goes straight to its queue.
    Live(Arc<Peer>),
    /// Journaled as `seq` for a member connected to another relay node of the cluster, whose
    /// node is asked whether it wrote the copy (`docs/cluster.md#groups`).
    Elsewhere {
        store: JetStreamStore,
        account: String,
        seq: u64,
    },
    Settled(Outcome),
}

impl Placement {
    async fn settle(self, copy: &Arc<Envelope>, deadline: Instant) -> Outcome {
        match self {
            Placement::Settled(outcome) => outcome,
            Placement::Queued { mut flushed, seq } => {
                match tokio::time::timeout_at(deadline, flushed.wait_for(|w| *w >= seq)).await {
                    Ok(Ok(_)) => Outcome::Delivered,
                    // The connection ended; its next one drains the copy.
                    Ok(Err(_)) => Outcome::Pushed,
                    Err(_) => Outcome::Missed(Miss::FanoutDeadline),
                }
            }
            Placement::Elsewhere {
                store,
                account,
                seq,
            } => {
                let wait = deadline.saturating_duration_since(Instant::now());
                match store.written(&account, seq, wait).await {
                    Written::Yes => Outcome::Delivered,
                    Written::Gone => Outcome::Pushed,
                    Written::Late => Outcome::Missed(Miss::FanoutDeadline),
                }
            }
            Placement::Live(peer) => {
                // A full queue is refused at once, as SendMessage is
                // (`docs/protocol.md#without-a-mailbox`).
                match peer.queue.try_unjournaled(Arc::clone(copy)) {
                    Ok(()) => Outcome::Delivered,
                    Err(Unqueued::Closed | Unqueued::Full) => {
                        Outcome::Missed(Miss::OfflineNoMailbox)
                    }
                }
            }
        }
    }
}

/// What a broadcast's transaction did.
pub struct FannedOut {
    /// Every member but the sender, in identifier order, with its copy's placement.
    pub members: Vec<(String, Placement)>,
    /// Copies journaled (one per account; none for members a repeat already reached).
    pub journaled: usize,
}

/// Where a report goes: the sending connection while it is its account's connection, else the
/// account's next one.
pub struct ReportTo {
    pub account: String,
    /// The sending connection's id in the router.
    pub connection: u64,
    /// Its writer, held weakly so a pending report never keeps a connection's writer alive.
    pub out: mpsc::WeakSender<Outbound>,
}

/// A committed broadcast whose members are to be settled.
pub struct Broadcasted {
    pub group_id: String,
    /// The copy as members get it (without a seq: each journaled one has its own).
    pub copy: Arc<Envelope>,
    pub members: Vec<(String, Placement)>,
    /// When the report is due: the fan-out deadline after the frame was read.
    pub deadline: Instant,
}

/// Settles every member of a committed broadcast and sends its report, in the background.
pub fn report(ctx: Arc<Ctx>, broadcasted: Broadcasted, to: ReportTo) {
    tokio::spawn(async move {
        let mut shutdown = ctx.shutdown.clone();
        tokio::select! {
            () = settle_and_report(&ctx, broadcasted, to) => {}
            // A report cut short by shutdown is never sent; the sender re-broadcasts.
            () = stopping(&mut shutdown) => {}
        }
    });
}

async fn settle_and_report(ctx: &Ctx, broadcasted: Broadcasted, to: ReportTo) {
    let Broadcasted {
        group_id,
        copy,
        members,
        deadline,
    } = broadcasted;
    let copy = &copy;
    let settled = join_all(members.into_iter().map(|(member, placement)| async move {
        (member, placement.settle(copy, deadline).await)
    }))
    .await;
    let (mut delivered, mut pushed, mut missed) = (Vec::new(), Vec::new(), Vec::new());
    for (member, outcome) in settled {
        ctx.metrics.group_member(outcome);
        match outcome {
            Outcome::Delivered => delivered.push(member),
            Outcome::Pushed => pushed.push(member),
            Outcome::Missed(miss) => missed.push(MissedMember {
                username: member,
                reason: miss.as_str().to_owned(),
            }),
        }
    }
    let report = RelayFrame::GroupMessageSent {
        group_id,
        message_id: copy.message_id.clone(),
        delivered,
        pushed,
        missed,
        timestamp: copy.accepted_ms,
    };
    if written(ctx, report.clone(), &to).await {
        return;
    }
    // The sending connection ended before the report was written: the account's next
    // connection gets it after its drain.
    let held = tokio::time::timeout(
        ctx.timings.answer_deadline,
        ctx.store.hold_report(
            &to.account,
            report.encode(),
            now_ms(),
            HELD_REPORTS_PER_ACCOUNT,
        ),
    )
    .await;
    match held {
        Ok(Ok(())) => tracing::debug!(account = %to.account, "group report held"),
        Ok(Err(e)) => tracing::warn!(account = %to.account, error = %e, "group report not held"),
        Err(_) => tracing::warn!(account = %to.account, "holding a group report timed out"),
    }
}

/// Whether the sending connection's writer wrote the report. A connection no longer the
/// account's (it ended, or a newer one displaced it) is not written to: from the moment the
/// router drops it, its report is held.
async fn written(ctx: &Ctx, report: RelayFrame, to: &ReportTo) -> bool {
    let current = ctx.router.get(&to.account);
    if current.is_none_or(|peer| peer.id != to.connection) {
        return false;
    }
    let Some(out) = to.out.upgrade() else {
        return false;
    };
    let (done, confirmed) = oneshot::channel();
    let queued = out
        .send(Outbound::Report {
            report,
            written: done,
        })
        .await
        .is_ok();
    drop(out);
    queued && confirmed.await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ceiling holds for the widest report: every member missed, every identifier of the
    /// largest size and escaped at every byte, with the widest group and message ids.
    #[test]
    fn a_report_naming_the_most_members_fits_in_a_frame() {
        let widest = "\"".repeat(MAX_IDENTIFIER_BYTES);
        let report = RelayFrame::GroupMessageSent {
            group_id: widest.clone(),
            message_id: widest.clone(),
            delivered: Vec::new(),
            pushed: Vec::new(),
            missed: (0..MAX_GROUP_MEMBERS_CEILING)
                .map(|_| MissedMember {
                    username: widest.clone(),
                    reason: Miss::OfflineNoMailbox.as_str().to_owned(),
                })
                .collect(),
            timestamp: u64::MAX,
        };
        assert!(report.encode().len() <= MAX_FRAME_BYTES);
    }
}
