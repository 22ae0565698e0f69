//! The per-account journal (`docs/protocol.md#inbound-delivery`,
//! `docs/protocol.md#mailbox-and-drain`): appending with `seq` and the mailbox limits, the drain's
//! reads, releases by ack, and the purge of expired frames.
//!
//! Counters per account (`last_seq`, `msg_count`, `byte_count`) live in the `accounts` row and
//! change in the same transaction as the journal (through `mailboxes.rs`), so `seq` is never
//! reused (it does not depend on which rows still exist) and the mailbox limits are checked
//! without scanning the journal.

use std::collections::HashMap;
use std::sync::Arc;

use courier_proto::Disposition;
use rusqlite::types::Type;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use super::addresses::bound_account;
use super::mailboxes::{Counters, Mailboxes};
use super::worker::{Applied, Delta};
use super::{from_sql, to_sql, AppendOutcome, Named, Release};
use crate::config::MailboxLimits;
use crate::mailbox::{Envelope, GroupTag};

/// One journal read returns at most this many frames / content bytes (at least one frame).
const FETCH_FRAMES: i64 = 64;
const FETCH_BYTES: usize = 4 * 1024 * 1024;

fn disposition(live: bool) -> Disposition {
    if live {
        Disposition::Live
    } else {
        Disposition::Stored
    }
}

/// The account `recipient` names now: an account name stands for itself (whether it exists is
/// the journal's answer), an address for the account its binding names, if any.
pub(super) fn account_named(
    conn: &Connection,
    recipient: Named,
) -> rusqlite::Result<Option<String>> {
    match recipient {
        Named::Account(account) => Ok(Some(account)),
        Named::Address(address) => bound_account(conn, &address),
    }
}

/// Journals `envelope` for the account `recipient` names (an address through its binding, in
/// this transaction: the frame belongs to the account the address named at acceptance) and,
/// once durable, offers it to that account's connection.
pub(super) fn append(
    conn: &Connection,
    mailboxes: &mut Mailboxes,
    recipient: Named,
    envelope: Envelope,
    limits: &MailboxLimits,
) -> rusqlite::Result<Applied<AppendOutcome>> {
    let Some(recipient) = account_named(conn, recipient)? else {
        return Ok(Applied::value(AppendOutcome::UnknownRecipient));
    };
    let duplicate = conn
        .prepare_cached(
            "SELECT 1 FROM journal
             WHERE account = ?1 AND sender = ?2 AND message_id = ?3 AND group_id IS NULL",
        )?
        .query_row(
            params![recipient, envelope.sender, envelope.message_id],
            |_| Ok(()),
        )
        .optional()?;
    if duplicate.is_some() {
        return Ok(Applied::then(move |router| AppendOutcome::Duplicate {
            disposition: disposition(router.is_connected(&recipient)),
        }));
    }
    Ok(
        match insert(conn, mailboxes, recipient, envelope, limits)? {
            Inserted::Accepted { account, envelope } => {
                let seq = envelope.seq.unwrap_or_default();
                let delta = Delta::appended(&envelope);
                Applied::then(move |router| AppendOutcome::Accepted {
                    seq,
                    disposition: disposition(router.offer_journaled(&account, &envelope).is_some()),
                })
                .counting(delta)
            }
            Inserted::UnknownRecipient => Applied::value(AppendOutcome::UnknownRecipient),
            Inserted::MailboxFull => Applied::value(AppendOutcome::MailboxFull),
        },
    )
}

/// What [`insert`] did with a frame.
pub(super) enum Inserted {
    /// Journaled, with its seq set; to be offered to the account's connection once durable.
    Accepted {
        account: String,
        envelope: Arc<Envelope>,
    },
    UnknownRecipient,
    MailboxFull,
}

/// Journals `envelope` for `account`, if the account exists and its mailbox has room, with the
/// account's next seq.
pub(super) fn insert(
    conn: &Connection,
    mailboxes: &mut Mailboxes,
    account: String,
    mut envelope: Envelope,
    limits: &MailboxLimits,
) -> rusqlite::Result<Inserted> {
    let Some(counters) = mailboxes.get(conn, &account)? else {
        return Ok(Inserted::UnknownRecipient);
    };
    let Counters {
        last_seq,
        msg_count,
        byte_count,
    } = counters;
    let bytes = to_sql(envelope.content.len() as u64);
    let over_count = from_sql(msg_count).saturating_add(1) > limits.max_messages;
    let over_bytes = from_sql(byte_count).saturating_add(from_sql(bytes)) > limits.max_bytes;
    if over_count || over_bytes {
        return Ok(Inserted::MailboxFull);
    }
    let seq = last_seq + 1;
    let (group_id, forward_info) = match &envelope.group {
        Some(group) => (
            Some(group.group_id.as_str()),
            group.forward_info.as_ref().map(Value::to_string),
        ),
        None => (None, None),
    };
    conn.prepare_cached(
        "INSERT INTO journal (account, seq, sender, sender_account, message_id, content, bytes,
                              reply_to_msg, accepted_ms, group_id, forward_info)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?
    .execute(params![
        account,
        seq,
        envelope.sender,
        envelope.sender_account,
        envelope.message_id,
        &*envelope.content,
        bytes,
        envelope.reply_to_msg,
        to_sql(envelope.accepted_ms),
        group_id,
        forward_info,
    ])?;
    mailboxes.set(
        &account,
        Counters {
            last_seq: seq,
            msg_count: msg_count + 1,
            byte_count: byte_count + bytes,
        },
    );
    envelope.seq = Some(from_sql(seq));
    Ok(Inserted::Accepted {
        account,
        envelope: Arc::new(envelope),
    })
}

/// Whether the account's journal still holds the frame `seq` (neither released nor purged).
pub(super) fn holds(conn: &Connection, account: &str, seq: u64) -> rusqlite::Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM journal WHERE account = ?1 AND seq = ?2")?
        .query_row(params![account, to_sql(seq)], |_| Ok(()))
        .optional()?
        .is_some())
}

/// The account's highest journaled seq: the drain bound S.
pub(super) fn highest_seq(
    conn: &Connection,
    mailboxes: &mut Mailboxes,
    account: &str,
) -> rusqlite::Result<Applied<u64>> {
    let counters = mailboxes.get(conn, account)?;
    Ok(Applied::value(counters.map_or(0, |c| from_sql(c.last_seq))))
}

/// Unexpired frames with `after < seq ≤ up_to`, in seq order, one bounded batch.
pub(super) fn fetch(
    conn: &Connection,
    account: &str,
    after: u64,
    up_to: u64,
    not_before_ms: u64,
) -> rusqlite::Result<Applied<Vec<Arc<Envelope>>>> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq, sender, sender_account, message_id, content, reply_to_msg, accepted_ms,
                group_id, forward_info
         FROM journal
         WHERE account = ?1 AND seq > ?2 AND seq <= ?3 AND accepted_ms >= ?4
         ORDER BY seq LIMIT ?5",
    )?;
    let rows = stmt.query_map(
        params![
            account,
            to_sql(after),
            to_sql(up_to),
            to_sql(not_before_ms),
            FETCH_FRAMES
        ],
        |r| {
            let group = match r.get::<_, Option<String>>(7)? {
                Some(group_id) => Some(GroupTag {
                    group_id,
                    forward_info: r
                        .get::<_, Option<String>>(8)?
                        .map(|text| serde_json::from_str(&text))
                        .transpose()
                        .map_err(|e| {
                            rusqlite::Error::FromSqlConversionFailure(8, Type::Text, Box::new(e))
                        })?,
                }),
                None => None,
            };
            Ok(Envelope {
                seq: Some(from_sql(r.get(0)?)),
                sender: r.get(1)?,
                sender_account: r.get(2)?,
                message_id: r.get(3)?,
                content: r.get::<_, String>(4)?.into(),
                reply_to_msg: r.get(5)?,
                accepted_ms: from_sql(r.get(6)?),
                group,
            })
        },
    )?;
    let mut frames = Vec::new();
    let mut bytes = 0usize;
    for row in rows {
        let envelope = row?;
        bytes += envelope.content.len();
        frames.push(Arc::new(envelope));
        if bytes >= FETCH_BYTES {
            break;
        }
    }
    Ok(Applied::value(frames))
}

/// Deletes what an ack releases.
pub(super) fn release(
    conn: &Connection,
    mailboxes: &mut Mailboxes,
    account: &str,
    release: Release,
) -> rusqlite::Result<Applied<()>> {
    let (sql, seq) = match release {
        Release::One(seq) => (
            "DELETE FROM journal WHERE account = ?1 AND seq = ?2 RETURNING bytes",
            seq,
        ),
        Release::UpTo(seq) => (
            "DELETE FROM journal WHERE account = ?1 AND seq <= ?2 RETURNING bytes",
            seq,
        ),
    };
    let mut stmt = conn.prepare_cached(sql)?;
    let mut count = 0i64;
    let mut bytes = 0i64;
    let mut rows = stmt.query(params![account, to_sql(seq)])?;
    while let Some(row) = rows.next()? {
        count += 1;
        bytes += row.get::<_, i64>(0)?;
    }
    drop(rows);
    uncount(conn, mailboxes, account, count, bytes)?;
    Ok(Applied::value(()).counting(Delta {
        accounts: 0,
        frames: -count,
        bytes: -bytes,
    }))
}

/// Deletes frames accepted before `older_than_ms`; answers how many.
pub(super) fn purge(
    conn: &Connection,
    mailboxes: &mut Mailboxes,
    older_than_ms: u64,
) -> rusqlite::Result<Applied<u64>> {
    let mut per_account: HashMap<String, (i64, i64)> = HashMap::new();
    {
        let mut stmt = conn.prepare_cached(
            "DELETE FROM journal WHERE accepted_ms < ?1 RETURNING account, bytes",
        )?;
        let mut rows = stmt.query([to_sql(older_than_ms)])?;
        while let Some(row) = rows.next()? {
            let entry = per_account.entry(row.get(0)?).or_default();
            entry.0 += 1;
            entry.1 += row.get::<_, i64>(1)?;
        }
    }
    let (mut total, mut total_bytes) = (0i64, 0i64);
    for (account, (count, bytes)) in &per_account {
        uncount(conn, mailboxes, account, *count, *bytes)?;
        total += count;
        total_bytes += bytes;
    }
    Ok(Applied::value(from_sql(total)).counting(Delta {
        accounts: 0,
        frames: -total,
        bytes: -total_bytes,
    }))
}

/// Takes deleted frames off the account's mailbox counters.
fn uncount(
    conn: &Connection,
    mailboxes: &mut Mailboxes,
    account: &str,
    count: i64,
    bytes: i64,
) -> rusqlite::Result<()> {
    if count == 0 {
        return Ok(());
    }
    if let Some(c) = mailboxes.get(conn, account)? {
        mailboxes.set(
            account,
            Counters {
                last_seq: c.last_seq,
                msg_count: (c.msg_count - count).max(0),
                byte_count: (c.byte_count - bytes).max(0),
            },
        );
    }
    Ok(())
}
