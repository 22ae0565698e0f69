//! Group delivery as a relay that advertises `group_delivery_v3` offers it
//! (`docs/delivery.md#group-sends`), reduced to what delivery depends on: each group's registered
//! roster, a connection's registration answered per group, `SendGroupMessage` journaled once per
//! registered member but the sender (mailbox rules, presence, the member's own release) and
//! answered by a settled report, and the record of what each broadcast did per member, so a
//! broadcast sent again under its id journals no second copy for a member that got one.
//!
//! The roster is the relay's own copy, set by the world: it may lag the group's real roster,
//! missing members or holding removed ones. Rosters and broadcast records are in the relay's
//! database and survive a restart; registrations and held reports do not.

use std::collections::{BTreeMap, BTreeSet};

use courier_engine::{GroupReport, InboundKey};
use courier_proto::message::{META_GROUP_ID, META_GROUP_MESSAGE};
use courier_proto::Message;

use super::{ConnId, Relay, ToClient, Writes};

/// A group frame from a client (its faults are the world's to decide, so it travels apart
/// from `ToRelay`, on the same ordered connection).
#[derive(Debug, Clone)]
pub enum GroupFrame {
    /// The client asks whether the relay holds its registration in `group_id` (what a
    /// connection's `CreateGroup` / `AddGroupMember` exchange establishes).
    Register { group_id: String },
    /// `SendGroupMessage{group_id, message_id, content}`: `message` is the envelope.
    Send {
        group_id: String,
        message: Box<Message>,
    },
}

#[derive(Debug, Default)]
pub(super) struct Groups {
    /// Registered members of each group, by account.
    rosters: BTreeMap<String, BTreeSet<String>>,
    /// What each broadcast, by (sender, message id), did for each member it reached.
    sent: BTreeMap<(String, String), BTreeMap<String, Outcome>>,
    /// Reports whose sender's connection had ended, for its next connection.
    held: BTreeMap<String, Vec<GroupReport>>,
}

/// How a broadcast reached a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Written to its live connection.
    Live,
    /// Journaled for it while it was offline.
    Stored,
}

impl Groups {
    pub(super) fn take_held(&mut self, account: &str) -> Vec<GroupReport> {
        self.held.remove(account).unwrap_or_default()
    }

    pub(super) fn crash(&mut self) {
        self.held.clear();
    }
}

/// What the relay did with a group message for one account, as far as the checks need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Carried {
    /// Written to its live connection (without the mailbox nothing else holds it: a frame lost
    /// on the way is lost for good).
    Live,
    /// Journaled: only the account's release or the mailbox TTL removes it.
    Journaled,
    /// A journaled frame carrying it outlived the mailbox TTL and was deleted.
    Purged,
}

/// Every account's group messages as the relay handled them (a broadcast's copy or a
/// per-member copy alike), by their dedup key at the account.
#[derive(Debug, Default)]
pub struct GroupLog {
    carried: BTreeMap<(String, InboundKey), BTreeSet<Carried>>,
}

impl GroupLog {
    pub(super) fn note(&mut self, account: &str, sender: &str, message: &Message, how: Carried) {
        if let Some(key) = group_key(sender, message) {
            self.carried
                .entry((account.to_owned(), key))
                .or_default()
                .insert(how);
        }
    }

    /// Whether the relay did `how` with group message `key` for `account`.
    pub fn did(&self, account: &str, key: &InboundKey, how: Carried) -> bool {
        self.carried
            .get(&(account.to_owned(), key.clone()))
            .is_some_and(|set| set.contains(&how))
    }
}

/// The dedup key at its receivers of a group message as carriers see it — a broadcast's
/// envelope or a per-member copy — from `sender`; `None` for anything else.
pub fn group_key(sender: &str, message: &Message) -> Option<InboundKey> {
    let group = message.metadata.get(META_GROUP_ID)?;
    let logical = message
        .metadata
        .get(META_GROUP_MESSAGE)
        .unwrap_or(&message.id);
    Some(InboundKey {
        chat: group.clone(),
        sender: sender.to_owned(),
        message_id: logical.clone(),
    })
}

impl Relay {
    /// The relay's roster of `group_id`.
    pub fn group_roster(&self, group_id: &str) -> BTreeSet<String> {
        self.groups
            .as_ref()
            .and_then(|g| g.rosters.get(group_id))
            .cloned()
            .unwrap_or_default()
    }

    /// Whether the account of `conn` is registered in `group_id`.
    fn group_ready(&self, conn: ConnId, group_id: &str) -> bool {
        let Some(c) = self.conns.get(&conn) else {
            return false;
        };
        self.groups.as_ref().is_some_and(|g| {
            g.rosters
                .get(group_id)
                .is_some_and(|roster| roster.contains(&c.account))
        })
    }

    /// The relay's roster of `group_id` becomes `members`: every connection that asked about
    /// the group and whose registration changed hears of it.
    pub fn set_group_roster(&mut self, group_id: &str, members: BTreeSet<String>) -> Writes {
        let asked: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.groups.contains(group_id))
            .map(|(id, _)| *id)
            .collect();
        let before: Vec<bool> = asked
            .iter()
            .map(|c| self.group_ready(*c, group_id))
            .collect();
        let Some(groups) = self.groups.as_mut() else {
            return Vec::new();
        };
        groups.rosters.insert(group_id.to_owned(), members);
        asked
            .into_iter()
            .zip(before)
            .filter_map(|(conn, was)| {
                let ready = self.group_ready(conn, group_id);
                (ready != was).then(|| {
                    let group_id = group_id.to_owned();
                    (conn, ToClient::GroupReady { group_id, ready })
                })
            })
            .collect()
    }

    /// A connection asks about its registration in `group_id`; `refused`: the relay answers
    /// no whatever its roster says (a failed `AddGroupMember`, say).
    pub fn group_register(&mut self, conn: ConnId, group_id: String, refused: bool) -> Writes {
        let Some(c) = self.conns.get_mut(&conn) else {
            return Vec::new();
        };
        c.groups.insert(group_id.clone());
        let ready = !refused && self.group_ready(conn, &group_id);
        vec![(conn, ToClient::GroupReady { group_id, ready })]
    }

    /// `SendGroupMessage` from `conn`: one copy per registered member but the sender, or
    /// `GroupError` when the sender is not registered or the relay refuses it. Returns the
    /// writes and the report the relay owes the sender.
    pub fn group_send(
        &mut self,
        conn: ConnId,
        group_id: String,
        message: Message,
        refused: bool,
        now: u64,
    ) -> (Writes, Option<GroupReport>) {
        let mut out = Vec::new();
        let Some(sender) = self.conns.get(&conn).map(|c| c.account.clone()) else {
            return (out, None);
        };
        self.purge(now);
        let message_id = message.id.clone();
        let roster = self.group_roster(&group_id);
        let reason = if self.groups.is_none() {
            Some("unknown_type")
        } else if !roster.contains(&sender) {
            Some("not_member")
        } else if refused {
            Some("internal")
        } else {
            None
        };
        if let Some(reason) = reason {
            let reason = reason.to_owned();
            out.push((conn, ToClient::GroupError { message_id, reason }));
            return (out, None);
        }
        self.counts.broadcasts += 1;
        let key = (sender.clone(), message_id.clone());
        let mut report = GroupReport {
            group_id,
            message_id,
            delivered: Vec::new(),
            pushed: Vec::new(),
            missed: Vec::new(),
        };
        for member in roster.iter().filter(|m| **m != sender) {
            let earlier = self
                .groups
                .as_ref()
                .and_then(|g| g.sent.get(&key))
                .and_then(|sent| sent.get(member))
                .copied();
            let outcome = match earlier {
                Some(outcome) => {
                    self.counts.broadcast_dedup += 1;
                    Ok(outcome)
                }
                None => self
                    .deliver(&sender, member, message.clone(), now, &mut out)
                    .map(|live| if live { Outcome::Live } else { Outcome::Stored }),
            };
            match outcome {
                Ok(outcome) => {
                    if let Some(groups) = self.groups.as_mut() {
                        groups
                            .sent
                            .entry(key.clone())
                            .or_default()
                            .insert(member.clone(), outcome);
                    }
                    match outcome {
                        Outcome::Live => report.delivered.push(member.clone()),
                        Outcome::Stored => report.pushed.push(member.clone()),
                    }
                }
                Err(cause) => report
                    .missed
                    .push((member.clone(), cause.as_str().to_owned())),
            }
        }
        (out, Some(report))
    }

    /// The report of a broadcast is due: written to `conn` if it is still open, else held for
    /// `account`'s next connection.
    pub fn group_report(&mut self, conn: ConnId, account: &str, report: GroupReport) -> Writes {
        if self.conns.contains_key(&conn) {
            return vec![(conn, ToClient::GroupReport(report))];
        }
        if let Some(groups) = self.groups.as_mut() {
            groups
                .held
                .entry(account.to_owned())
                .or_default()
                .push(report);
        }
        Vec::new()
    }
}
