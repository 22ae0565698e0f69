//! Group sends (`docs/delivery.md#group-sends`): the tracker of every group message not settled
//! yet — its path, its report wait and each member's state — and the relay gate that decides
//! which path a new one takes.
//!
//! A group message is sealed once for the whole group. It goes either as one relay broadcast
//! answered by a delivery report, or as one per-member copy each (an ordinary outbox entry,
//! with the message's content held here once rather than in every copy). A broadcast whose
//! report does not come in time is sent again under the same id at most `MAX_BROADCASTS - 1`
//! times, then downgraded to copies; so is one whose relay connection is gone. The tracker is
//! persisted with the step that changes it (`StoreOp::PutGroupSend`, `StoreOp::GroupMember`),
//! so a restart resumes it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use courier_proto::Message;

use crate::io::{GroupPath, GroupSendRecord, MemberState, Millis};
use crate::outbox::Key;

/// How long a broadcast waits for its report, per send (the relay settles its report within
/// 45 s).
pub(crate) const REPORT_WAIT_MS: Millis = 60_000;
/// Sends of one broadcast under its id before it downgrades to per-member copies.
pub(crate) const MAX_BROADCASTS: u8 = 3;
/// Broadcasts awaiting a report at once; the oldest downgrades to make room.
pub(crate) const MAX_PENDING_REPORTS: usize = 64;

/// One group message being delivered.
#[derive(Debug, Clone)]
pub(crate) struct GroupSend {
    pub id: String,
    pub wire_id: String,
    pub group_id: String,
    /// The sealed message as every copy carries it (its id is the wire id, its recipient the
    /// group).
    pub message: Message,
    pub created_at: Millis,
    /// Its place in acceptance order among the outbox entries (the bound evicts the oldest).
    pub key: Key,
    pub path: GroupPath,
    pub members: BTreeMap<String, MemberState>,
    /// Members whose per-member copy is in the outbox.
    pub copies: BTreeSet<String>,
}

impl GroupSend {
    pub(crate) fn record(&self) -> GroupSendRecord {
        GroupSendRecord {
            id: self.id.clone(),
            group_id: self.group_id.clone(),
            message: self.message.clone(),
            created_at: self.created_at,
            path: self.path,
            members: self.members.clone(),
        }
    }

    /// Still needs the engine: a report to wait for or a copy to deliver.
    pub(crate) fn active(&self) -> bool {
        matches!(self.path, GroupPath::Broadcast { .. }) || !self.copies.is_empty()
    }

    /// The members no path has reached yet.
    pub(crate) fn pending(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|(_, state)| **state == MemberState::Pending)
            .map(|(member, _)| member.clone())
            .collect()
    }
}

/// The active group sends, by id, with their report deadlines and the copies' owners.
#[derive(Debug, Default)]
pub(crate) struct GroupSends {
    sends: HashMap<String, GroupSend>,
    by_wire: HashMap<String, String>,
    /// Report deadlines: (due, id).
    reports: BTreeSet<(Millis, String)>,
    /// Active sends in acceptance order (the capacity bound evicts the oldest).
    order: BTreeSet<(Key, String)>,
    /// Copy id → (group message id, member).
    copies: HashMap<String, (String, String)>,
    /// Groups the relay is ready to broadcast to: registered and answered on this connection,
    /// and the relay advertised group delivery.
    ready: BTreeSet<String>,
}

impl GroupSends {
    pub(crate) fn get(&self, id: &str) -> Option<&GroupSend> {
        self.sends.get(id)
    }

    pub(crate) fn get_mut(&mut self, id: &str) -> Option<&mut GroupSend> {
        self.sends.get_mut(id)
    }

    pub(crate) fn id_of_wire(&self, wire_id: &str) -> Option<&str> {
        self.by_wire.get(wire_id).map(String::as_str)
    }

    pub(crate) fn insert(&mut self, send: GroupSend) {
        if let GroupPath::Broadcast { report_due, .. } = send.path {
            self.reports.insert((report_due, send.id.clone()));
        }
        self.order.insert((send.key, send.id.clone()));
        self.by_wire.insert(send.wire_id.clone(), send.id.clone());
        self.sends.insert(send.id.clone(), send);
    }

    /// Changes the path of `id`, keeping the deadline index in step.
    pub(crate) fn set_path(&mut self, id: &str, path: GroupPath) {
        let Some(send) = self.sends.get_mut(id) else {
            return;
        };
        if let GroupPath::Broadcast { report_due, .. } = send.path {
            self.reports.remove(&(report_due, id.to_owned()));
        }
        if let GroupPath::Broadcast { report_due, .. } = path {
            self.reports.insert((report_due, id.to_owned()));
        }
        send.path = path;
    }

    pub(crate) fn add_copy(&mut self, id: &str, member: &str, copy_id: String) {
        if let Some(send) = self.sends.get_mut(id) {
            send.copies.insert(member.to_owned());
            self.copies
                .insert(copy_id, (id.to_owned(), member.to_owned()));
        }
    }

    /// The copy's entry left the outbox.
    pub(crate) fn remove_copy(&mut self, copy_id: &str) -> Option<(String, String)> {
        let (id, member) = self.copies.remove(copy_id)?;
        if let Some(send) = self.sends.get_mut(&id) {
            send.copies.remove(&member);
        }
        Some((id, member))
    }

    /// Which group message and member the outbox entry `copy_id` is a copy for.
    pub(crate) fn copy_owner(&self, copy_id: &str) -> Option<(&str, &str)> {
        self.copies
            .get(copy_id)
            .map(|(id, member)| (id.as_str(), member.as_str()))
    }

    /// Forgets `id` once nothing of it is left to deliver (its row stays in storage); true
    /// when it did.
    pub(crate) fn retire_if_done(&mut self, id: &str) -> bool {
        if self.sends.get(id).is_some_and(GroupSend::active) {
            return false;
        }
        let Some(send) = self.sends.remove(id) else {
            return false;
        };
        self.by_wire.remove(&send.wire_id);
        self.order.remove(&(send.key, send.id));
        true
    }

    pub(crate) fn active(&self) -> usize {
        self.sends.len()
    }

    /// The oldest active send: (key, id).
    pub(crate) fn oldest(&self) -> Option<(Key, &str)> {
        self.order.first().map(|(key, id)| (*key, id.as_str()))
    }

    /// Active sends, oldest first.
    pub(crate) fn oldest_first(&self) -> impl Iterator<Item = &str> + '_ {
        self.order.iter().map(|(_, id)| id.as_str())
    }

    pub(crate) fn pending_reports(&self) -> usize {
        self.reports.len()
    }

    /// The broadcast whose report has waited longest (the earliest deadline).
    pub(crate) fn oldest_report(&self) -> Option<String> {
        self.reports.first().map(|(_, id)| id.clone())
    }

    pub(crate) fn next_report_deadline(&self) -> Option<Millis> {
        self.reports.first().map(|(at, _)| *at)
    }

    pub(crate) fn due_reports(&self, now: Millis) -> Vec<String> {
        self.reports
            .iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, id)| id.clone())
            .collect()
    }

    /// Every broadcast awaiting its report.
    pub(crate) fn awaiting_reports(&self) -> Vec<String> {
        self.reports.iter().map(|(_, id)| id.clone()).collect()
    }

    pub(crate) fn set_ready(&mut self, group_id: &str, ready: bool) {
        if ready {
            self.ready.insert(group_id.to_owned());
        } else {
            self.ready.remove(group_id);
        }
    }

    pub(crate) fn is_ready(&self, group_id: &str) -> bool {
        self.ready.contains(group_id)
    }

    pub(crate) fn clear_ready(&mut self) {
        self.ready.clear();
    }

    #[cfg(test)]
    pub(crate) fn check(&self) {
        for send in self.sends.values() {
            assert!(send.active(), "inactive send {} kept", send.id);
            assert_eq!(
                matches!(send.path, GroupPath::Broadcast { .. }),
                self.reports.iter().any(|(_, id)| *id == send.id),
                "report index out of step for {}",
                send.id
            );
            for member in &send.copies {
                assert!(
                    matches!(
                        send.members.get(member),
                        Some(MemberState::Pending | MemberState::Stored)
                    ),
                    "a copy for settled member {member} of {}",
                    send.id
                );
            }
        }
        assert_eq!(self.order.len(), self.sends.len());
        assert_eq!(
            self.copies.len(),
            self.sends.values().map(|s| s.copies.len()).sum::<usize>(),
            "copy index out of step"
        );
    }
}
