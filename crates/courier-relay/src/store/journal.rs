//! The per-account journal (`docs/protocol.md#inbound-delivery`,
//! `docs/protocol.md#mailbox-and-drain`): appending with `seq` and the mailbox limits, the drain's
//! reads, releases by ack, and the purge of expired frames.
//!
//! Counters per account (`last_seq`, `msg_count`, `byte_count`) live in the `accounts` row and
//! change in the same transaction as the journal (through `mailboxes.rs`), so `seq` is never
//! reused (it does not depend on which rows still exist) and the mailbox limits are checked
//! without scanning the journal. A frame's `bytes` is the size of its whole row ([`row_bytes`]),
//! so a sender cannot store more than the limits say by moving its payload out of `content`.

use std::collections::HashMap;
use std::sync::Arc;

use courier_proto::Disposition;
use rusqlite::types::Type;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use super::addresses::bound_account;
use super::mailboxes::{Counters, Mailboxes};
use super::worker::{Applied, Delta};
use super::{from_sql, to_sql, AppendOutcome, Named, Release, PURGE_BATCH};
use crate::config::MailboxLimits;
use crate::mailbox::{row_bytes, Envelope, GroupTag};

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
            Inserted::Accepted {
                account,
                envelope,
                bytes,
            } => {
                let seq = envelope.seq.unwrap_or_default();
                let delta = Delta::appended(bytes);
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
        /// Its row's size.
        bytes: i64,
    },
    UnknownRecipient,
    /// The account's mailbox, the sender's share of it, or the whole journal has no room.
    MailboxFull,
}

/// Journals `envelope` for `account`, if the account exists and there is room for it — in the
/// mailbox, in the sender's share of the mailbox and in the journal — with the account's next
/// seq. Every read comes before the one insert, so nothing can fail once the row is written
/// (an append runs without a savepoint).
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
    let (group_id, forward_info) = match &envelope.group {
        Some(group) => (
            Some(group.group_id.as_str()),
            group.forward_info.as_ref().map(Value::to_string),
        ),
        None => (None, None),
    };
    let bytes = to_sql(row_bytes(&envelope, forward_info.as_deref()));
    let over = |held: i64, adding: i64, limit: u64| {
        from_sql(held).saturating_add(from_sql(adding)) > limit
    };
    if over(msg_count, 1, limits.max_messages) || over(byte_count, bytes, limits.max_bytes) {
        return Ok(Inserted::MailboxFull);
    }
    let share = mailboxes.share(conn, &account, &envelope.sender_account)?;
    let (share_messages, share_bytes) = limits.sender_share();
    if over(share.msg_count, 1, share_messages) || over(share.byte_count, bytes, share_bytes) {
        return Ok(Inserted::MailboxFull);
    }
    if over(
        mailboxes.journal_bytes(conn)?,
        bytes,
        limits.max_journal_bytes,
    ) {
        return Ok(Inserted::MailboxFull);
    }
    let seq = last_seq + 1;
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
        conn,
        &account,
        Counters {
            last_seq: seq,
            msg_count: msg_count + 1,
            byte_count: byte_count + bytes,
        },
    )?;
    mailboxes.add_to_share(&account, &envelope.sender_account, 1, bytes);
    envelope.seq = Some(from_sql(seq));
    Ok(Inserted::Accepted {
        account,
        envelope: Arc::new(envelope),
        bytes,
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

/// Deletes what an ack releases: one statement, after the reads that taking the frames off the
/// counters needs, so nothing can fail once the rows are gone (the store runs it without a
/// savepoint).
pub(super) fn release(
    conn: &Connection,
    mailboxes: &mut Mailboxes,
    account: &str,
    release: Release,
) -> rusqlite::Result<Applied<()>> {
    mailboxes.get(conn, account)?;
    mailboxes.journal_bytes(conn)?;
    let (sql, seq) = match release {
        Release::One(seq) => (
            "DELETE FROM journal WHERE account = ?1 AND seq = ?2
             RETURNING account, sender_account, bytes",
            seq,
        ),
        Release::UpTo(seq) => (
            "DELETE FROM journal WHERE account = ?1 AND seq <= ?2
             RETURNING account, sender_account, bytes",
            seq,
        ),
    };
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query(params![account, to_sql(seq)])?;
    let delta = uncount(conn, mailboxes, rows)?;
    Ok(Applied::value(()).counting(delta))
}

/// Deletes at most [`PURGE_BATCH`] frames accepted before `older_than_ms`; answers how many.
pub(super) fn purge(
    conn: &Connection,
    mailboxes: &mut Mailboxes,
    older_than_ms: u64,
) -> rusqlite::Result<Applied<u64>> {
    let mut stmt = conn.prepare_cached(
        "DELETE FROM journal WHERE id IN
             (SELECT id FROM journal WHERE accepted_ms < ?1 LIMIT ?2)
         RETURNING account, sender_account, bytes",
    )?;
    let rows = stmt.query(params![to_sql(older_than_ms), PURGE_BATCH])?;
    let delta = uncount(conn, mailboxes, rows)?;
    Ok(Applied::value(from_sql(-delta.frames)).counting(delta))
}

/// Takes deleted frames — `(account, sender_account, bytes)` rows — off the mailbox counters
/// and the senders' shares; answers the change to the journal's totals.
fn uncount(
    conn: &Connection,
    mailboxes: &mut Mailboxes,
    mut rows: rusqlite::Rows<'_>,
) -> rusqlite::Result<Delta> {
    let mut per_account: HashMap<String, (i64, i64)> = HashMap::new();
    let mut per_share: HashMap<(String, String), (i64, i64)> = HashMap::new();
    while let Some(row) = rows.next()? {
        let (account, sender, bytes): (String, String, i64) =
            (row.get(0)?, row.get(1)?, row.get(2)?);
        let entry = per_account.entry(account.clone()).or_default();
        entry.0 += 1;
        entry.1 += bytes;
        let entry = per_share.entry((account, sender)).or_default();
        entry.0 += 1;
        entry.1 += bytes;
    }
    drop(rows);
    let mut delta = Delta::default();
    for (account, (count, bytes)) in per_account {
        if let Some(c) = mailboxes.get(conn, &account)? {
            mailboxes.set(
                conn,
                &account,
                Counters {
                    last_seq: c.last_seq,
                    msg_count: (c.msg_count - count).max(0),
                    byte_count: (c.byte_count - bytes).max(0),
                },
            )?;
        }
        delta.frames -= count;
        delta.bytes -= bytes;
    }
    for ((account, sender), (count, bytes)) in per_share {
        mailboxes.add_to_share(&account, &sender, -count, -bytes);
    }
    Ok(delta)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A relay down for a week comes back to a journal full of expired frames: purging them
    /// must not be one request that holds the store thread (and every sender) until done.
    #[test]
    fn one_purge_request_deletes_a_bounded_batch_so_a_backlog_cannot_stall_the_store() {
        let mut conn = Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut conn).unwrap();
        conn.execute(
            "INSERT INTO accounts (name, created_ms) VALUES ('bob', 0)",
            [],
        )
        .unwrap();
        let mut mailboxes = Mailboxes::default();
        let limits = MailboxLimits {
            sender_share_percent: 100,
            ..MailboxLimits::default()
        };
        let backlog = PURGE_BATCH + 5;
        for i in 0..backlog {
            let envelope = Envelope {
                seq: None,
                sender: "alice".into(),
                sender_account: "alice".into(),
                message_id: format!("m{i}"),
                content: "x".to_owned().into(),
                reply_to_msg: None,
                accepted_ms: 1,
                group: None,
            };
            let inserted = insert(&conn, &mut mailboxes, "bob".into(), envelope, &limits).unwrap();
            assert!(matches!(inserted, Inserted::Accepted { .. }));
        }
        mailboxes.keep();
        let batches: Vec<u64> = (0..3)
            .map(|_| {
                let applied = purge(&conn, &mut mailboxes, 2).unwrap();
                applied.answered(&crate::router::Router::default())
            })
            .collect();
        assert_eq!(batches, [PURGE_BATCH as u64, 5, 0]);
        let c = mailboxes.get(&conn, "bob").unwrap().unwrap();
        assert_eq!((c.msg_count, c.byte_count), (0, 0));
        assert_eq!(mailboxes.journal_bytes(&conn).unwrap(), 0);
    }
}
