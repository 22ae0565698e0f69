//! Groups in JetStream (`docs/cluster.md#groups`): each registration one record of the `groups`
//! bucket changed by compare-and-set, so admin rules hold whatever node a frame enters by; the
//! record of each member's copy of a broadcast in `group-copies`, which keeps a re-broadcast from
//! journaling a second one; and the reports held for a sender whose connection ended, one record
//! per account in `held-reports`, with a notice to the node of the account's connection.
//!
//! A broadcast reads the roster once and journals the copies after: a membership change through
//! another node at the same moment is either in the roster it read or not, never half of it.

use std::collections::{BTreeMap, HashMap};

use async_nats::jetstream::kv;
use async_nats::Subscriber;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use super::feed::Feed;
use super::journal::Appended;
use super::names::token;
use super::record::{change_record, put_record, read_record};
use super::{ClusterError, JetStreamStore};
use crate::fanout::Miss;
use crate::group::{Actor, GroupRefusal};
use crate::mailbox::{Envelope, GroupTag};
use crate::send::resolve_recipient;
use crate::store::Named;

/// A group's registration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Group {
    pub group_id: String,
    name: String,
    admin: String,
    created_ms: u64,
    /// Member identifier → when it was added.
    pub members: BTreeMap<String, u64>,
}

/// What the `groups` bucket says of one key: the group, or that it has none any more.
pub struct GroupChange {
    pub key: String,
    pub group: Option<Group>,
}

/// Where one member's copy of a broadcast stands once the broadcast is journaled.
pub enum Copy {
    /// Journaled now, as `seq` of the account's journal.
    New {
        account: String,
        seq: u64,
    },
    /// Journaled earlier (by a broadcast this one repeats, or for another member naming the same
    /// account) and not released yet.
    Held {
        account: String,
        seq: u64,
    },
    /// Journaled earlier and released by the member since: it got the copy.
    Released,
    Missed(Miss),
}

/// A member's copy, as `group-copies` keeps it.
#[derive(Serialize, Deserialize)]
struct CopyRecord {
    account: String,
    seq: u64,
    accepted_ms: u64,
}

/// The reports held for one account, oldest first.
#[derive(Default, Serialize, Deserialize)]
struct HeldReports {
    next_id: i64,
    held: Vec<HeldReport>,
}

#[derive(Serialize, Deserialize)]
struct HeldReport {
    id: i64,
    report: String,
    held_ms: u64,
}

/// A decision of the group rules: done (and whether the record changed), or refused.
type Decision<T> = (Result<T, GroupRefusal>, bool);

fn refused<T>(why: GroupRefusal) -> Decision<T> {
    (Err(why), false)
}

/// The admin's check: the group exists and the actor acts for its admin.
fn as_admin<'a>(
    group: &'a mut Option<Group>,
    actor: &Actor,
) -> Result<&'a mut Group, GroupRefusal> {
    match group {
        None => Err(GroupRefusal::NotFound),
        Some(group) if actor.acts_for(&group.admin) => Ok(group),
        Some(_) => Err(GroupRefusal::NotAdmin),
    }
}

impl JetStreamStore {
    async fn change_group<A>(
        &self,
        group_id: &str,
        change: impl FnMut(&mut Option<Group>) -> Decision<A>,
    ) -> Result<Result<A, GroupRefusal>, ClusterError> {
        change_record(&self.inner.groups, &token(&[group_id]), change).await
    }

    /// Registers the group with the actor's identity as admin and first member. Its creator may
    /// repeat this (it only renames the group); anyone else finds the group taken.
    pub async fn create_group(
        &self,
        group_id: &str,
        name: &str,
        actor: &Actor,
        now_ms: u64,
    ) -> Result<Result<(), GroupRefusal>, ClusterError> {
        self.change_group(group_id, |group| match group {
            Some(group) if actor.acts_for(&group.admin) => {
                let renamed = group.name != name;
                group.name = name.to_owned();
                (Ok(()), renamed)
            }
            Some(_) => refused(GroupRefusal::Exists),
            None => {
                *group = Some(Group {
                    group_id: group_id.to_owned(),
                    name: name.to_owned(),
                    admin: actor.identity.clone(),
                    created_ms: now_ms,
                    members: BTreeMap::from([(actor.identity.clone(), now_ms)]),
                });
                (Ok(()), true)
            }
        })
        .await
    }

    /// Adds `member` (already validated), by the admin only; adding a member again changes
    /// nothing.
    pub async fn add_group_member(
        &self,
        group_id: &str,
        member: &str,
        actor: &Actor,
        max_members: u32,
        now_ms: u64,
    ) -> Result<Result<(), GroupRefusal>, ClusterError> {
        self.change_group(group_id, |group| {
            let group = match as_admin(group, actor) {
                Ok(group) => group,
                Err(why) => return refused(why),
            };
            if group.members.contains_key(member) {
                return (Ok(()), false);
            }
            if group.members.len() >= max_members as usize {
                return refused(GroupRefusal::Full);
            }
            group.members.insert(member.to_owned(), now_ms);
            (Ok(()), true)
        })
        .await
    }

    /// Removes `member`, by the admin only; removing a non-member changes nothing.
    pub async fn remove_group_member(
        &self,
        group_id: &str,
        member: &str,
        actor: &Actor,
    ) -> Result<Result<(), GroupRefusal>, ClusterError> {
        self.change_group(group_id, |group| match as_admin(group, actor) {
            Ok(group) => (Ok(()), group.members.remove(member).is_some()),
            Err(why) => refused(why),
        })
        .await
    }

    /// Removes every registration the actor acts for; answers the identifier it left as (its
    /// identity when registered under both).
    pub async fn leave_group(
        &self,
        group_id: &str,
        actor: &Actor,
    ) -> Result<Result<String, GroupRefusal>, ClusterError> {
        self.change_group(group_id, |group| {
            let Some(group) = group else {
                return refused(GroupRefusal::NotFound);
            };
            let mut left = None;
            for registered in [&actor.account, &actor.identity] {
                if group.members.remove(registered.as_str()).is_some() {
                    left = Some(registered.clone());
                }
            }
            let changed = left.is_some();
            (left.ok_or(GroupRefusal::NotMember), changed)
        })
        .await
    }

    /// Follows every registration from the start.
    pub async fn group_changes(&self) -> Result<Feed<GroupChange>, ClusterError> {
        Feed::start(&self.inner.groups, |entry| {
            let key = entry.key.clone();
            Some(match entry.operation {
                kv::Operation::Put => serde_json::from_slice::<Option<Group>>(&entry.value)
                    .map(|group| GroupChange { key, group })
                    .map_err(|e| ClusterError::Corrupt(e.to_string())),
                kv::Operation::Delete | kv::Operation::Purge => {
                    Ok(GroupChange { key, group: None })
                }
            })
        })
        .await
    }

    /// Checks the sender is a member and journals a copy for every other member (once per
    /// account, and not again for a member a repeat of this broadcast already reached), each
    /// through [`JetStreamStore::append`] with its notice to the member's node. Copies recorded
    /// before `dedup_since_ms` are forgotten: a repeat journals afresh.
    pub async fn broadcast(
        &self,
        actor: &Actor,
        mut message: Envelope,
        tag: GroupTag,
        dedup_since_ms: u64,
    ) -> Result<Result<Vec<(String, Copy)>, GroupRefusal>, ClusterError> {
        let key = token(&[&tag.group_id]);
        let group = read_record::<Option<Group>>(&self.inner.groups, &key).await?;
        let Some(group) = group.flatten() else {
            return Ok(Err(GroupRefusal::NotFound));
        };
        if !group.members.keys().any(|m| actor.acts_for(m)) {
            return Ok(Err(GroupRefusal::NotMember));
        }
        message.group = Some(tag);
        let mut journaled: HashMap<String, u64> = HashMap::new();
        let mut copies = Vec::new();
        for member in group.members.into_keys().filter(|m| !actor.acts_for(m)) {
            let copy = self
                .copy_for(&member, &message, dedup_since_ms, &mut journaled)
                .await?;
            copies.push((member, copy));
        }
        Ok(Ok(copies))
    }

    async fn copy_for(
        &self,
        member: &str,
        message: &Envelope,
        dedup_since_ms: u64,
        journaled: &mut HashMap<String, u64>,
    ) -> Result<Copy, ClusterError> {
        let group_id = message.group.as_ref().map_or("", |g| g.group_id.as_str());
        let key = token(&[&message.sender, group_id, &message.message_id, member]);
        if let Some(earlier) = self.earlier_copy(&key, dedup_since_ms).await? {
            if !self.holds_seq(&earlier.account, earlier.seq).await? {
                return Ok(Copy::Released);
            }
            journaled
                .entry(earlier.account.clone())
                .or_insert(earlier.seq);
            return Ok(Copy::Held {
                account: earlier.account,
                seq: earlier.seq,
            });
        }
        let Some(account) = self.account_of(member).await? else {
            return Ok(Copy::Missed(Miss::UnknownMember));
        };
        if let Some(&seq) = journaled.get(&account) {
            self.record_copy(&key, &account, seq, message.accepted_ms)
                .await?;
            return Ok(Copy::Held { account, seq });
        }
        Ok(
            match self
                .append(Named::Account(account.clone()), message)
                .await?
            {
                Appended::Accepted { seq } => {
                    self.record_copy(&key, &account, seq, message.accepted_ms)
                        .await?;
                    journaled.insert(account.clone(), seq);
                    Copy::New { account, seq }
                }
                Appended::UnknownRecipient => Copy::Missed(Miss::UnknownMember),
                Appended::MailboxFull => Copy::Missed(Miss::MailboxFull),
                // A group copy carries no frame dedup key (`journal.rs`): its repeats are
                // found by the copy record above.
                Appended::Duplicate => {
                    return Err(ClusterError::Corrupt(format!(
                        "the group copy {key} was taken for a resent frame"
                    )))
                }
            },
        )
    }

    /// The account a member identifier names, if it has one.
    async fn account_of(&self, member: &str) -> Result<Option<String>, ClusterError> {
        let account = match resolve_recipient(member).named() {
            Some(Named::Account(account)) => account,
            Some(Named::Address(address)) => match self.resolve_address(&address).await? {
                Some(account) => account,
                None => return Ok(None),
            },
            None => return Ok(None),
        };
        Ok(self.base(&account).await?.map(|_| account))
    }

    async fn earlier_copy(
        &self,
        key: &str,
        dedup_since_ms: u64,
    ) -> Result<Option<CopyRecord>, ClusterError> {
        let record = read_record::<CopyRecord>(&self.inner.group_copies, key).await?;
        Ok(record.filter(|record| record.accepted_ms >= dedup_since_ms))
    }

    async fn record_copy(
        &self,
        key: &str,
        account: &str,
        seq: u64,
        accepted_ms: u64,
    ) -> Result<(), ClusterError> {
        let record = CopyRecord {
            account: account.to_owned(),
            seq,
            accepted_ms,
        };
        put_record(&self.inner.group_copies, key, &record).await
    }

    /// Keeps an encoded report for the account's next connection, its oldest beyond `keep`
    /// dropped; once durable, tells the node of a connection of the account already past its
    /// drain.
    pub async fn hold_report(
        &self,
        account: &str,
        report: &str,
        now_ms: u64,
        keep: u32,
    ) -> Result<(), ClusterError> {
        change_record(
            &self.inner.held_reports,
            &token(&[account]),
            |reports: &mut HeldReports| {
                reports.next_id += 1;
                reports.held.push(HeldReport {
                    id: reports.next_id,
                    report: report.to_owned(),
                    held_ms: now_ms,
                });
                let excess = reports.held.len().saturating_sub(keep as usize);
                reports.held.drain(..excess);
                ((), true)
            },
        )
        .await?;
        let subject = self.inner.names.reports(account);
        if let Err(e) = self.inner.client.publish(subject, "".into()).await {
            tracing::debug!(error = %e, "the notice of a held report was not sent");
        }
        Ok(())
    }

    /// The account's reports held since `not_before_ms`, oldest first, with their ids.
    pub async fn held_reports(
        &self,
        account: &str,
        not_before_ms: u64,
    ) -> Result<Vec<(i64, String)>, ClusterError> {
        let key = token(&[account]);
        let reports = read_record::<HeldReports>(&self.inner.held_reports, &key).await?;
        Ok(reports
            .unwrap_or_default()
            .held
            .into_iter()
            .filter(|r| r.held_ms >= not_before_ms)
            .map(|r| (r.id, r.report))
            .collect())
    }

    /// Forgets the account's reports once written.
    pub async fn drop_held_reports(&self, account: &str, ids: &[i64]) -> Result<(), ClusterError> {
        change_record(
            &self.inner.held_reports,
            &token(&[account]),
            |reports: &mut HeldReports| {
                let before = reports.held.len();
                reports.held.retain(|r| !ids.contains(&r.id));
                ((), reports.held.len() != before)
            },
        )
        .await
    }

    /// Subscribes to the notices of reports held for `account`, in place once
    /// [`JetStreamStore::subscriptions_in_place`] answered.
    pub async fn reports_held(&self, account: &str) -> Result<ReportNotices, ClusterError> {
        let notices = self.subscribe(self.inner.names.reports(account)).await?;
        Ok(ReportNotices { notices })
    }
}

/// The notices of reports held for one account.
pub struct ReportNotices {
    notices: Subscriber,
}

impl ReportNotices {
    /// Waits for the next notice; `None` once the connection to NATS is closed for good.
    pub async fn next(&mut self) -> Option<()> {
        self.notices.next().await.map(|_| ())
    }
}
