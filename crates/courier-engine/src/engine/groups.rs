//! Group sends in the engine (`docs/delivery.md#group-sends`): path choice, the broadcast's
//! report wait and re-sends, the backstop copies, each member's state, and what a copy's
//! outbox events mean for its group message. The tracker itself is `crate::group`.

use std::collections::BTreeMap;

use courier_proto::group_copy_id;
use courier_proto::message::{META_GROUP_COPY, META_GROUP_ID, META_GROUP_MESSAGE};

use super::*;
use crate::group::{GroupSend, MAX_BROADCASTS, MAX_PENDING_REPORTS, REPORT_WAIT_MS};
use crate::io::{GroupPath, GroupReport, GroupSendRecord, GroupSendRequest, MemberState};

const PATH_BROADCAST: &str = "relay";
const PATH_FAN_OUT: &str = "fanout";

impl Engine {
    /// Accepts a group message. An id already being delivered is a no-op. It counts as one
    /// message against the outbox bound, however many members it has (its copies are not
    /// counted, so a large group cannot push unrelated messages out, nor be cut short by them).
    /// The relay broadcasts it when the app allows it and the relay is ready for the group;
    /// otherwise every member gets a copy at once.
    pub(super) fn group_send(&mut self, request: GroupSendRequest, now: Millis) {
        let GroupSendRequest {
            id,
            group_id,
            members,
            message,
            broadcast,
        } = request;
        if self.groups.get(&id).is_some() {
            self.diagnostic(
                DiagnosticLevel::Debug,
                format!("group message {id} is already being delivered"),
            );
            return;
        }
        self.make_room(Class::Regular, now);
        let members: BTreeMap<String, MemberState> = members
            .into_iter()
            .filter(|member| *member != self.local_identity)
            .map(|member| (member, MemberState::Pending))
            .collect();
        let count = members.len();
        let broadcast = broadcast && count > 0 && self.broadcast_ready(&group_id);
        if broadcast {
            while self.groups.pending_reports() >= MAX_PENDING_REPORTS {
                let Some(oldest) = self.groups.oldest_report() else {
                    break;
                };
                self.downgrade(&oldest, "too many reports pending", now);
            }
        }
        let path = if broadcast {
            GroupPath::Broadcast {
                sends: 1,
                report_due: now.saturating_add(REPORT_WAIT_MS),
            }
        } else {
            GroupPath::FanOut
        };
        let key = self.outbox.next_key();
        self.groups.insert(GroupSend {
            id: id.clone(),
            wire_id: message.id.clone(),
            group_id: group_id.clone(),
            message,
            created_at: now,
            key,
            path,
            members,
            copies: Default::default(),
        });
        self.events.push_back(Event::GroupMessageSent {
            group_id,
            message_id: id.clone(),
            path: if broadcast {
                PATH_BROADCAST
            } else {
                PATH_FAN_OUT
            },
            members: count,
        });
        if broadcast {
            self.broadcast(&id);
        } else {
            self.fan_out(&id, now);
        }
        self.put_group(&id);
        self.retire_group(&id);
    }

    /// The relay is ready (or no longer) to broadcast to `group_id`: registered, answered on
    /// this connection, and group delivery advertised.
    pub(super) fn group_relay(&mut self, group_id: &str, ready: bool) {
        self.groups.set_ready(group_id, ready);
    }

    fn broadcast_ready(&self, group_id: &str) -> bool {
        self.carriers.contains(&Carrier::Relay) && self.groups.is_ready(group_id)
    }

    fn broadcast(&mut self, id: &str) {
        let Some(send) = self.groups.get(id) else {
            return;
        };
        self.transmits.push_back(Transmit {
            carrier: Carrier::Relay,
            peer: None,
            kind: TransmitKind::GroupBroadcast {
                group_id: send.group_id.clone(),
                message: send.message.clone(),
            },
        });
    }

    /// The relay's report on a broadcast: members it reached live are delivered, those whose
    /// mailbox took it are stored, and every other member of the roster — the missed and the
    /// ones the relay does not know — gets a copy now. A report for an id not awaiting one, or
    /// naming another group, is ignored.
    pub(super) fn group_report(&mut self, report: GroupReport, now: Millis) {
        let Some(id) = self
            .groups
            .id_of_wire(&report.message_id)
            .map(str::to_owned)
        else {
            self.diagnostic(
                DiagnosticLevel::Debug,
                format!(
                    "ignored a report for unknown group message {}",
                    report.message_id
                ),
            );
            return;
        };
        let awaiting = self.groups.get(&id).is_some_and(|send| {
            send.group_id == report.group_id && matches!(send.path, GroupPath::Broadcast { .. })
        });
        if !awaiting {
            self.diagnostic(
                DiagnosticLevel::Debug,
                format!("ignored a report for group message {id}: none awaited"),
            );
            return;
        }
        for member in &report.delivered {
            self.set_member(&id, member, MemberState::Delivered);
        }
        for member in &report.pushed {
            self.set_member(&id, member, MemberState::Stored);
        }
        if !report.missed.is_empty() {
            let missed: Vec<String> = report
                .missed
                .iter()
                .map(|(member, reason)| format!("{member} ({reason})"))
                .collect();
            self.diagnostic(
                DiagnosticLevel::Info,
                format!("group message {id}: the relay missed {}", missed.join(", ")),
            );
        }
        self.groups.set_path(&id, GroupPath::FanOut);
        let reissued = self.fan_out(&id, now);
        self.events.push_back(Event::GroupMessageDeliveryReport {
            group_id: report.group_id,
            message_id: id.clone(),
            delivered: report.delivered,
            pushed: report.pushed,
            missed_reissued: reissued,
        });
        self.put_group(&id);
        self.retire_group(&id);
    }

    /// The relay refused a broadcast (`GroupError` naming it): copies go at once.
    pub(super) fn group_refused(&mut self, message_id: &str, reason: &str, now: Millis) {
        if let Some(id) = self.groups.id_of_wire(message_id).map(str::to_owned) {
            self.downgrade(&id, reason, now);
        }
    }

    /// Broadcasts whose report is overdue: sent again under the same id while sends remain and
    /// the relay is still ready for the group, else downgraded.
    pub(super) fn group_timeouts(&mut self, now: Millis) {
        for id in self.groups.due_reports(now) {
            let Some(send) = self.groups.get(&id) else {
                continue;
            };
            let GroupPath::Broadcast { sends, .. } = send.path else {
                continue;
            };
            if sends < MAX_BROADCASTS && self.broadcast_ready(&send.group_id) {
                let path = GroupPath::Broadcast {
                    sends: sends + 1,
                    report_due: now.saturating_add(REPORT_WAIT_MS),
                };
                self.groups.set_path(&id, path);
                self.broadcast(&id);
                self.put_group(&id);
            } else {
                self.downgrade(&id, "no delivery report", now);
            }
        }
    }

    /// The relay connection is gone: no report can come on it, so every broadcast awaiting one
    /// downgrades now, and no group is ready until the next connection registers it again.
    pub(super) fn groups_relay_down(&mut self, now: Millis) {
        self.groups.clear_ready();
        for id in self.groups.awaiting_reports() {
            self.downgrade(&id, "relay connection lost", now);
        }
    }

    /// From broadcast to per-member copies for every member not reached yet.
    fn downgrade(&mut self, id: &str, why: &str, now: Millis) {
        if !matches!(
            self.groups.get(id).map(|send| send.path),
            Some(GroupPath::Broadcast { .. })
        ) {
            return;
        }
        self.diagnostic(
            DiagnosticLevel::Info,
            format!("group message {id}: {why}; sending per-member copies"),
        );
        self.groups.set_path(id, GroupPath::FanOut);
        self.fan_out(id, now);
        self.put_group(id);
        self.retire_group(id);
    }

    /// A copy for every pending member that has none in the outbox, each with the whole
    /// delivery ladder of a direct message. Returns the members given one.
    fn fan_out(&mut self, id: &str, now: Millis) -> Vec<String> {
        let Some(send) = self.groups.get(id) else {
            return Vec::new();
        };
        let mut shell = send.message.clone();
        // The content is the send's, put in at each transmission (`Engine::outgoing`): a
        // thousand copies of a large message hold it once.
        shell.content = String::new();
        shell.requires_ack = true;
        let targets: Vec<String> = send
            .pending()
            .into_iter()
            .filter(|member| !send.copies.contains(member))
            .collect();
        let wire_id = send.wire_id.clone();
        for member in &targets {
            let copy_id = group_copy_id(&wire_id, member);
            if self.outbox.key_of(&copy_id).is_some() {
                self.groups.add_copy(id, member, copy_id);
                continue;
            }
            let mut message = shell.clone();
            message.id.clone_from(&copy_id);
            message.recipient.clone_from(member);
            self.admit(Entry {
                wire_id: copy_id.clone(),
                message,
                created_at: now,
                window_start: now,
                ack_attempts: 0,
                transport_retries: 0,
                first_sent_at: None,
                last_sent_at: None,
                park: None,
                timed_probes: 0,
                phase: Phase::Queued {
                    at: now,
                    expires_at: outbox::expires_at(now, now, &self.config),
                },
            });
            self.groups.add_copy(id, member, copy_id);
        }
        self.send_due(now);
        targets
    }

    fn set_member(&mut self, id: &str, member: &str, state: MemberState) {
        let Some(send) = self.groups.get_mut(id) else {
            return;
        };
        let Some(current) = send.members.get_mut(member) else {
            return;
        };
        let moves = matches!(
            (*current, state),
            (MemberState::Pending, _)
                | (
                    MemberState::Stored,
                    MemberState::Delivered | MemberState::Failed
                )
        );
        if !moves {
            return;
        }
        *current = state;
        let group_id = send.group_id.clone();
        self.store.push_back(StoreOp::GroupMember {
            id: id.to_owned(),
            member: member.to_owned(),
            state,
        });
        self.events.push_back(Event::GroupMemberStatus {
            group_id,
            message_id: id.to_owned(),
            member: member.to_owned(),
            state,
        });
    }

    /// Nothing of `id` is left to deliver: its row is marked done (kept for status, not
    /// restored).
    fn retire_group(&mut self, id: &str) {
        if self.groups.retire_if_done(id) {
            self.store
                .push_back(StoreOp::GroupSendDone { id: id.to_owned() });
        }
    }

    fn put_group(&mut self, id: &str) {
        if let Some(send) = self.groups.get(id) {
            self.store.push_back(StoreOp::PutGroupSend(send.record()));
        }
    }

    /// An outbox event: a direct message's goes to the app; a group copy's moves its member's
    /// state instead (the app sees the group message, not its copies).
    pub(super) fn outbox_event(&mut self, event: Event) {
        let id = match &event {
            Event::MessageSent { message_id, .. }
            | Event::MessageDeferred { message_id, .. }
            | Event::MessageStored { message_id, .. }
            | Event::MessageUndeliverable { message_id, .. }
            | Event::MessageRetrying { message_id, .. }
            | Event::MessageDelivered { message_id, .. }
            | Event::MessageFailed { message_id, .. } => message_id,
            _ => {
                self.events.push_back(event);
                return;
            }
        };
        if self.chunks.contains_key(id) {
            self.chunk_event(event);
            return;
        }
        let Some((group_message, member)) = self
            .groups
            .copy_owner(id)
            .map(|(g, m)| (g.to_owned(), m.to_owned()))
        else {
            self.events.push_back(event);
            return;
        };
        let settled = match event {
            Event::MessageDelivered { .. } => Some(MemberState::Delivered),
            Event::MessageFailed { .. } => Some(MemberState::Failed),
            Event::MessageStored { .. } => {
                self.set_member(&group_message, &member, MemberState::Stored);
                None
            }
            _ => None,
        };
        if let Some(state) = settled {
            let copy_id = id.clone();
            self.groups.remove_copy(&copy_id);
            self.set_member(&group_message, &member, state);
            self.retire_group(&group_message);
        }
    }

    /// The message an entry's attempt carries: a group copy's content is its send's.
    pub(super) fn outgoing(&self, entry: &Entry) -> Message {
        let mut message = entry.wire_message();
        if let Some(send) = self
            .groups
            .copy_owner(&entry.message.id)
            .and_then(|(id, _)| self.groups.get(id))
        {
            message.content.clone_from(&send.message.content);
        }
        message
    }

    /// Evicts a whole group message (the outbox bound): members not reached fail.
    pub(super) fn fail_group_send(&mut self, id: &str, now: Millis) {
        let Some(send) = self.groups.get(id) else {
            return;
        };
        let copies: Vec<String> = send
            .copies
            .iter()
            .map(|member| group_copy_id(&send.wire_id, member))
            .collect();
        for copy_id in copies {
            if let Some(key) = self.outbox.key_of(&copy_id) {
                self.settle_failed(key, FailReason::OutboxCapacityExceeded, now);
            }
        }
        for member in self
            .groups
            .get(id)
            .map(GroupSend::pending)
            .unwrap_or_default()
        {
            self.set_member(id, &member, MemberState::Failed);
        }
        self.groups.set_path(id, GroupPath::FanOut);
        self.put_group(id);
        self.retire_group(id);
    }

    /// At start: the trackers with something left to deliver, before the outbox rows (whose
    /// copies need their send's content).
    pub(super) fn restore_groups(&mut self, mut records: Vec<GroupSendRecord>) {
        records.sort_by(|a, b| {
            a.created_at
                .cmp(&b.created_at)
                .then_with(|| a.id.cmp(&b.id))
        });
        for record in records {
            let GroupSendRecord {
                id,
                group_id,
                message,
                created_at,
                path,
                members,
            } = record;
            let key = self.outbox.next_key();
            self.groups.insert(GroupSend {
                id,
                wire_id: message.id.clone(),
                group_id,
                message,
                created_at,
                key,
                path,
                members,
                copies: Default::default(),
            });
        }
    }

    /// A restored outbox row that is a group copy joins its send; one whose send is gone
    /// cannot be sent (its content was the send's) and fails.
    pub(super) fn restore_copy(&mut self, key: Key, now: Millis) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        let copy_id = entry.message.id.clone();
        let member = entry.message.recipient.clone();
        let owner = entry
            .message
            .metadata
            .get(META_GROUP_MESSAGE)
            .and_then(|wire| self.groups.id_of_wire(wire))
            .map(str::to_owned);
        match owner {
            Some(id) => self.groups.add_copy(&id, &member, copy_id),
            None => {
                self.diagnostic(
                    DiagnosticLevel::Warn,
                    format!("restore: group copy {copy_id} has no group message"),
                );
                self.remove(key);
                self.store.push_back(StoreOp::Settle {
                    id: copy_id,
                    recipient: member,
                    settlement: Settlement::Failed(FailReason::OutboxLifetimeExceeded),
                    at: now,
                });
            }
        }
    }

    /// After the outbox is restored: a broadcast's connection is gone with the old process, so
    /// it downgrades; a pending member without a copy gets one. Every backstop fires.
    pub(super) fn resume_groups(&mut self, now: Millis) {
        let ids: Vec<String> = self.groups.oldest_first().map(str::to_owned).collect();
        for id in ids {
            if matches!(
                self.groups.get(&id).map(|send| send.path),
                Some(GroupPath::Broadcast { .. })
            ) {
                self.downgrade(&id, "restarted while awaiting the report", now);
                continue;
            }
            let missing = self.groups.get(&id).is_some_and(|send| {
                send.pending()
                    .iter()
                    .any(|member| !send.copies.contains(member))
            });
            if missing {
                self.fan_out(&id, now);
                self.put_group(&id);
            }
            self.retire_group(&id);
        }
    }

    /// The end-to-end ACK a received message asks for: of the copy it came in, for a group
    /// message; of the message itself otherwise.
    pub(super) fn delivery_ack(&self, message: &Message, now: Millis, transport: &str) -> Message {
        match message.metadata.get(META_GROUP_COPY) {
            Some(copy_id) => {
                let mut copy = message.clone();
                copy.id.clone_from(copy_id);
                copy.recipient.clone_from(&self.local_identity);
                copy.metadata.clear();
                copy.ack(ack_id(&message.sender, copy_id), now, transport)
            }
            None => message.ack(ack_id(&message.sender, &message.id), now, transport),
        }
    }
}

/// The chat a received message belongs to: its group, else its sender.
pub(super) fn chat_of(message: &Message) -> String {
    message
        .metadata
        .get(META_GROUP_ID)
        .cloned()
        .unwrap_or_else(|| message.sender.clone())
}
