//! Groups (`docs/protocol.md#group-frames`): registrations and their admin rules, a broadcast's
//! copies (journaled once per member, with the record that keeps a re-broadcast from journaling
//! a second one), and the reports held for a sender whose connection ended.
//!
//! Every decision is taken in one transaction with what it depends on: a broadcast reads the
//! roster, checks the sender and journals the copies together, so a membership change is either
//! wholly before it or wholly after.

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension};

use super::accounts::is_known;
use super::journal::{self, account_named, Inserted};
use super::mailboxes::Mailboxes;
use super::worker::{Applied, Delta};
use super::{from_sql, to_sql, PURGE_BATCH};
use crate::config::MailboxLimits;
use crate::fanout::{FannedOut, Miss, Outcome, Placement};
use crate::group::{Actor, GroupRefusal};
use crate::mailbox::{Envelope, GroupTag};
use crate::router::Router;
use crate::send::resolve_recipient;

/// A decision of the group rules: done, or refused with a reason.
type Decided<T> = rusqlite::Result<Applied<Result<T, GroupRefusal>>>;

fn refused<T: 'static>(why: GroupRefusal) -> Decided<T> {
    Ok(Applied::value(Err(why)))
}

fn admin_of(conn: &Connection, group_id: &str) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT admin FROM groups WHERE group_id = ?1")?
        .query_row([group_id], |r| r.get(0))
        .optional()
}

/// The group's members in identifier order; `None` if there is no such group.
fn members_of(conn: &Connection, group_id: &str) -> rusqlite::Result<Option<Vec<String>>> {
    if admin_of(conn, group_id)?.is_none() {
        return Ok(None);
    }
    let mut stmt = conn
        .prepare_cached("SELECT member FROM group_members WHERE group_id = ?1 ORDER BY member")?;
    let members = stmt.query_map([group_id], |r| r.get(0))?;
    members.collect::<Result<_, _>>().map(Some)
}

fn is_member(conn: &Connection, group_id: &str, member: &str) -> rusqlite::Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM group_members WHERE group_id = ?1 AND member = ?2")?
        .query_row([group_id, member], |_| Ok(()))
        .optional()?
        .is_some())
}

fn insert_member(
    conn: &Connection,
    group_id: &str,
    member: &str,
    now_ms: u64,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT OR IGNORE INTO group_members (group_id, member, added_ms) VALUES (?1, ?2, ?3)",
    )?
    .execute(params![group_id, member, to_sql(now_ms)])?;
    Ok(())
}

/// Registers the group with the actor's identity as admin and first member. Its creator may
/// repeat this (it only renames the group); anyone else finds the group taken.
pub(super) fn create(
    conn: &Connection,
    group_id: &str,
    name: &str,
    actor: &Actor,
    now_ms: u64,
) -> Decided<()> {
    match admin_of(conn, group_id)? {
        Some(admin) if actor.acts_for(&admin) => {
            conn.prepare_cached("UPDATE groups SET name = ?2 WHERE group_id = ?1")?
                .execute([group_id, name])?;
        }
        Some(_) => return refused(GroupRefusal::Exists),
        None => {
            conn.prepare_cached(
                "INSERT INTO groups (group_id, name, admin, created_ms) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![group_id, name, actor.identity, to_sql(now_ms)])?;
            insert_member(conn, group_id, &actor.identity, now_ms)?;
        }
    }
    Ok(Applied::value(Ok(())))
}

/// The admin's check: the group exists and the actor acts for its admin.
fn as_admin(
    conn: &Connection,
    group_id: &str,
    actor: &Actor,
) -> rusqlite::Result<Result<(), GroupRefusal>> {
    Ok(match admin_of(conn, group_id)? {
        None => Err(GroupRefusal::NotFound),
        Some(admin) if actor.acts_for(&admin) => Ok(()),
        Some(_) => Err(GroupRefusal::NotAdmin),
    })
}

/// Adds `member` (already validated), by the admin only; adding a member again changes nothing.
pub(super) fn add_member(
    conn: &Connection,
    group_id: &str,
    member: &str,
    actor: &Actor,
    max_members: u32,
    now_ms: u64,
) -> Decided<()> {
    if let Err(why) = as_admin(conn, group_id, actor)? {
        return refused(why);
    }
    if is_member(conn, group_id, member)? {
        return Ok(Applied::value(Ok(())));
    }
    let count: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM group_members WHERE group_id = ?1")?
        .query_row([group_id], |r| r.get(0))?;
    if from_sql(count) >= u64::from(max_members) {
        return refused(GroupRefusal::Full);
    }
    insert_member(conn, group_id, member, now_ms)?;
    Ok(Applied::value(Ok(())))
}

/// Removes `member`, by the admin only; removing a non-member changes nothing.
pub(super) fn remove_member(
    conn: &Connection,
    group_id: &str,
    member: &str,
    actor: &Actor,
) -> Decided<()> {
    if let Err(why) = as_admin(conn, group_id, actor)? {
        return refused(why);
    }
    conn.prepare_cached("DELETE FROM group_members WHERE group_id = ?1 AND member = ?2")?
        .execute([group_id, member])?;
    Ok(Applied::value(Ok(())))
}

/// Removes every registration the actor acts for; answers the identifier it left as (its
/// identity when registered under both).
pub(super) fn leave(conn: &Connection, group_id: &str, actor: &Actor) -> Decided<String> {
    if admin_of(conn, group_id)?.is_none() {
        return refused(GroupRefusal::NotFound);
    }
    let mut left = None;
    for registered in [&actor.account, &actor.identity] {
        let removed = conn
            .prepare_cached("DELETE FROM group_members WHERE group_id = ?1 AND member = ?2")?
            .execute([group_id, registered.as_str()])?;
        if removed > 0 {
            left = Some(registered.clone());
        }
    }
    Ok(Applied::value(left.ok_or(GroupRefusal::NotMember)))
}

/// What a broadcast did for one member, before the commit; [`Copy::place`] turns it into a
/// placement once the copy is durable.
enum Copy {
    /// Journaled now: offered to the account's connection after the commit.
    New {
        account: String,
        envelope: Arc<Envelope>,
    },
    /// Journaled earlier (by a broadcast this one repeats, or for another member naming the same
    /// account) and not released yet.
    Held {
        account: String,
        seq: u64,
    },
    /// Journaled earlier and released by the member since: it got the copy.
    Released,
    /// No mailbox: a known account, which gets the copy only if it is connected.
    Unjournaled {
        account: String,
    },
    Missed(Miss),
}

impl Copy {
    fn place(self, router: &Router) -> Placement {
        let queued = |peer: Option<Arc<crate::router::Peer>>, seq| match peer {
            Some(peer) => Placement::Queued {
                flushed: peer.queue.flushed(),
                seq,
            },
            None => Placement::Settled(Outcome::Pushed),
        };
        match self {
            Copy::New { account, envelope } => {
                let seq = envelope.seq.unwrap_or_default();
                queued(router.offer_journaled(&account, &envelope), seq)
            }
            Copy::Held { account, seq } => queued(router.get(&account), seq),
            Copy::Released => Placement::Settled(Outcome::Delivered),
            Copy::Unjournaled { account } => match router.get(&account) {
                Some(peer) => Placement::Live(peer),
                None => Placement::Settled(Outcome::Missed(Miss::OfflineNoMailbox)),
            },
            Copy::Missed(miss) => Placement::Settled(Outcome::Missed(miss)),
        }
    }
}

/// One broadcast (`docs/protocol.md#group-frames`): `message` as the sender's connection
/// stamped it, to the group `tag` names.
pub(super) struct Broadcast {
    pub actor: Actor,
    pub message: Envelope,
    pub tag: GroupTag,
    /// `None` without a mailbox: nothing is journaled.
    pub mailbox: Option<MailboxLimits>,
    /// Copies recorded before this are forgotten: a repeat journals afresh.
    pub dedup_since_ms: u64,
}

/// Checks the sender is a member and journals a copy for every other member (once per account,
/// and not again for a member a repeat of this broadcast already reached); answers each
/// member's placement once durable.
pub(super) fn broadcast(
    conn: &Connection,
    mailboxes: &mut Mailboxes,
    broadcast: Broadcast,
) -> Decided<FannedOut> {
    let Broadcast {
        actor,
        mut message,
        tag,
        mailbox,
        dedup_since_ms,
    } = broadcast;
    let Some(members) = members_of(conn, &tag.group_id)? else {
        return refused(GroupRefusal::NotFound);
    };
    if !members.iter().any(|m| actor.acts_for(m)) {
        return refused(GroupRefusal::NotMember);
    }
    let group_id = tag.group_id.clone();
    message.group = Some(tag);
    let mut fan = Fan {
        conn,
        mailboxes,
        group_id: &group_id,
        message: &message,
        dedup_since_ms,
        journaled: HashMap::new(),
        copies: 0,
        delta: Delta::default(),
    };
    let mut copies = Vec::new();
    for member in members.into_iter().filter(|m| !actor.acts_for(m)) {
        let copy = match mailbox {
            Some(limits) => fan.journal(&member, &limits)?,
            None => fan.unjournaled(&member)?,
        };
        copies.push((member, copy));
    }
    let delta = fan.delta;
    let journaled = fan.copies;
    let placed = Applied::then(move |router| {
        Ok(FannedOut {
            members: copies
                .into_iter()
                .map(|(member, copy)| (member, copy.place(router)))
                .collect(),
            journaled,
        })
    });
    Ok(placed.counting(delta))
}

/// One broadcast's work in progress.
struct Fan<'a> {
    conn: &'a Connection,
    mailboxes: &'a mut Mailboxes,
    group_id: &'a str,
    message: &'a Envelope,
    dedup_since_ms: u64,
    /// Account → the seq of its unreleased copy of this message.
    journaled: HashMap<String, u64>,
    /// Copies this broadcast journaled.
    copies: usize,
    delta: Delta,
}

impl Fan<'_> {
    fn account_of(&self, member: &str) -> rusqlite::Result<Option<String>> {
        match resolve_recipient(member).named() {
            Some(named) => account_named(self.conn, named),
            None => Ok(None),
        }
    }

    fn journal(&mut self, member: &str, limits: &MailboxLimits) -> rusqlite::Result<Copy> {
        if let Some((account, seq)) = self.earlier_copy(member)? {
            if !journal::holds(self.conn, &account, seq)? {
                return Ok(Copy::Released);
            }
            self.journaled.entry(account.clone()).or_insert(seq);
            return Ok(Copy::Held { account, seq });
        }
        let Some(account) = self.account_of(member)? else {
            return Ok(Copy::Missed(Miss::UnknownMember));
        };
        if let Some(&seq) = self.journaled.get(&account) {
            self.record(member, &account, seq)?;
            return Ok(Copy::Held { account, seq });
        }
        Ok(
            match journal::insert(
                self.conn,
                self.mailboxes,
                account,
                self.message.clone(),
                limits,
            )? {
                Inserted::Accepted {
                    account,
                    envelope,
                    bytes,
                } => {
                    let seq = envelope.seq.unwrap_or_default();
                    self.record(member, &account, seq)?;
                    self.journaled.insert(account.clone(), seq);
                    self.copies += 1;
                    self.delta += Delta::appended(bytes);
                    Copy::New { account, envelope }
                }
                Inserted::UnknownRecipient => Copy::Missed(Miss::UnknownMember),
                Inserted::MailboxFull => Copy::Missed(Miss::MailboxFull),
            },
        )
    }

    fn unjournaled(&self, member: &str) -> rusqlite::Result<Copy> {
        Ok(match self.account_of(member)? {
            Some(account) if is_known(self.conn, &account)? => Copy::Unjournaled { account },
            _ => Copy::Missed(Miss::UnknownMember),
        })
    }

    /// The journal row of the copy an earlier broadcast of this (sender, group, message) made
    /// for `member`, within the dedup window.
    fn earlier_copy(&self, member: &str) -> rusqlite::Result<Option<(String, u64)>> {
        let found: Option<(String, i64)> = self
            .conn
            .prepare_cached(
                "SELECT account, seq FROM group_copies
                 WHERE sender = ?1 AND group_id = ?2 AND message_id = ?3 AND member = ?4
                   AND accepted_ms >= ?5",
            )?
            .query_row(
                params![
                    self.message.sender,
                    self.group_id,
                    self.message.message_id,
                    member,
                    to_sql(self.dedup_since_ms)
                ],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        Ok(found.map(|(account, seq)| (account, from_sql(seq))))
    }

    fn record(&self, member: &str, account: &str, seq: u64) -> rusqlite::Result<()> {
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO group_copies
                     (sender, group_id, message_id, member, account, seq, accepted_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                self.message.sender,
                self.group_id,
                self.message.message_id,
                member,
                account,
                to_sql(seq),
                to_sql(self.message.accepted_ms)
            ])?;
        Ok(())
    }
}

/// Keeps an encoded report for the account's next connection, its oldest beyond `keep`
/// dropped; once durable, tells a connection of the account already past its drain.
pub(super) fn hold_report(
    conn: &Connection,
    account: String,
    report: &str,
    now_ms: u64,
    keep: u32,
) -> rusqlite::Result<Applied<()>> {
    conn.prepare_cached("INSERT INTO held_reports (account, report, held_ms) VALUES (?1, ?2, ?3)")?
        .execute(params![account, report, to_sql(now_ms)])?;
    conn.prepare_cached(
        "DELETE FROM held_reports WHERE account = ?1 AND id NOT IN
             (SELECT id FROM held_reports WHERE account = ?1 ORDER BY id DESC LIMIT ?2)",
    )?
    .execute(params![account, keep])?;
    Ok(Applied::then(move |router| {
        if let Some(peer) = router.get(&account) {
            peer.reports.notify_one();
        }
    }))
}

/// The account's held reports held since `not_before_ms`, oldest first, with their ids.
pub(super) fn held_reports(
    conn: &Connection,
    account: &str,
    not_before_ms: u64,
) -> rusqlite::Result<Applied<Vec<(i64, String)>>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, report FROM held_reports WHERE account = ?1 AND held_ms >= ?2 ORDER BY id",
    )?;
    let rows = stmt.query_map(params![account, to_sql(not_before_ms)], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })?;
    Ok(Applied::value(rows.collect::<Result<_, _>>()?))
}

/// Forgets reports once written.
pub(super) fn drop_held_reports(conn: &Connection, ids: &[i64]) -> rusqlite::Result<Applied<()>> {
    let mut stmt = conn.prepare_cached("DELETE FROM held_reports WHERE id = ?1")?;
    for id in ids {
        stmt.execute([id])?;
    }
    Ok(Applied::value(()))
}

/// Forgets copy records and held reports from before `older_than_ms`; answers how many rows.
/// At most `PURGE_BATCH` rows in all, copy records first.
pub(super) fn purge(conn: &Connection, older_than_ms: u64) -> rusqlite::Result<Applied<u64>> {
    let cutoff = to_sql(older_than_ms);
    let copies = conn
        .prepare_cached(
            "DELETE FROM group_copies WHERE (sender, group_id, message_id, member) IN
                 (SELECT sender, group_id, message_id, member FROM group_copies
                  WHERE accepted_ms < ?1 LIMIT ?2)",
        )?
        .execute(params![cutoff, PURGE_BATCH])?;
    let reports = conn
        .prepare_cached(
            "DELETE FROM held_reports WHERE id IN
                 (SELECT id FROM held_reports WHERE held_ms < ?1 LIMIT ?2)",
        )?
        .execute(params![cutoff, PURGE_BATCH - copies as i64])?;
    Ok(Applied::value((copies + reports) as u64))
}
