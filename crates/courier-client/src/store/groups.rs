//! Chat groups and group messages (`docs/delivery.md#group-tracker`): the groups this device is
//! in (name, admin, roster, what the relay has confirmed of its registration), and each group
//! message's tracker — its path and every member's state — written with the step that changed
//! it, kept after it is done for `getGroupMessageStatus`.

use std::collections::BTreeMap;

use courier_engine::io::{GroupPath, GroupSendRecord, MemberState, Millis};
use courier_proto::Message;
use rusqlite::{params, Connection, OptionalExtension};

use super::{from_db_u64, to_db, StoreError};

/// A chat group this device is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRow {
    pub group_id: String,
    pub name: String,
    /// The member whose commits are applied (the creator).
    pub admin: String,
    /// The roster of the current epoch, this device included, sorted.
    pub members: Vec<String>,
    pub created_at: Millis,
}

/// A change to the groups, committed with the step that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupChange {
    Upsert(GroupRow),
    /// This device left the group or was removed from it.
    Gone {
        group_id: String,
    },
    /// The relay confirmed (or no longer holds) `member` in the group's registration.
    Registered {
        group_id: String,
        member: String,
        registered: bool,
    },
}

/// A group message's members as storage holds them, for `getGroupMessageStatus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSendStatus {
    pub group_id: String,
    pub members: BTreeMap<String, MemberState>,
}

pub(crate) fn apply(conn: &Connection, changes: &[GroupChange]) -> Result<(), StoreError> {
    for change in changes {
        match change {
            GroupChange::Upsert(row) => {
                conn.prepare_cached(
                    "INSERT INTO chat_groups (group_id, name, admin, members_json, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (group_id) DO UPDATE SET
                         name = excluded.name, admin = excluded.admin,
                         members_json = excluded.members_json",
                )?
                .execute(params![
                    row.group_id,
                    row.name,
                    row.admin,
                    serde_json::to_string(&row.members).expect("strings serialize"),
                    to_db(row.created_at)
                ])?;
            }
            GroupChange::Gone { group_id } => {
                conn.prepare_cached("DELETE FROM chat_groups WHERE group_id = ?1")?
                    .execute([group_id])?;
                conn.prepare_cached("DELETE FROM group_registration WHERE group_id = ?1")?
                    .execute([group_id])?;
            }
            GroupChange::Registered {
                group_id,
                member,
                registered: true,
            } => {
                conn.prepare_cached(
                    "INSERT INTO group_registration (group_id, member) VALUES (?1, ?2)
                     ON CONFLICT DO NOTHING",
                )?
                .execute([group_id, member])?;
            }
            GroupChange::Registered {
                group_id,
                member,
                registered: false,
            } => {
                conn.prepare_cached(
                    "DELETE FROM group_registration WHERE group_id = ?1 AND member = ?2",
                )?
                .execute([group_id, member])?;
            }
        }
    }
    Ok(())
}

/// Every group, with what the relay has confirmed of each one's registration.
pub(crate) fn load(conn: &Connection) -> Result<Vec<(GroupRow, Vec<String>)>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT group_id, name, admin, members_json, created_at FROM chat_groups
         ORDER BY created_at, group_id",
    )?;
    let rows = stmt.query_and_then([], |row| {
        let members: String = row.get(3)?;
        let at: i64 = row.get(4)?;
        Ok::<_, StoreError>(GroupRow {
            group_id: row.get(0)?,
            name: row.get(1)?,
            admin: row.get(2)?,
            members: serde_json::from_str(&members)
                .map_err(|e| StoreError::Corrupt(format!("group roster: {e}")))?,
            created_at: from_db_u64(at)
                .ok_or_else(|| StoreError::Corrupt(format!("group has a negative time ({at})")))?,
        })
    })?;
    let groups: Vec<GroupRow> = rows.collect::<Result<_, _>>()?;
    let mut registered = conn.prepare_cached(
        "SELECT member FROM group_registration WHERE group_id = ?1 ORDER BY member",
    )?;
    groups
        .into_iter()
        .map(|group| {
            let members = registered
                .query_map([&group.group_id], |row| row.get(0))?
                .collect::<Result<Vec<String>, _>>()?;
            Ok((group, members))
        })
        .collect()
}

pub(crate) fn put_send(conn: &Connection, record: &GroupSendRecord) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO group_sends (id, group_id, created_at, path_json, message_json, done)
         VALUES (?1, ?2, ?3, ?4, ?5, 0)
         ON CONFLICT (id) DO UPDATE SET path_json = excluded.path_json",
    )?
    .execute(params![
        record.id,
        record.group_id,
        to_db(record.created_at),
        serde_json::to_string(&record.path).expect("paths serialize"),
        record.message.encode()
    ])?;
    let mut member = conn.prepare_cached(
        "INSERT INTO group_send_members (id, member, state) VALUES (?1, ?2, ?3)
         ON CONFLICT (id, member) DO UPDATE SET state = excluded.state",
    )?;
    for (name, state) in &record.members {
        member.execute(params![record.id, name, state.as_str()])?;
    }
    Ok(())
}

pub(crate) fn set_member(
    conn: &Connection,
    id: &str,
    member: &str,
    state: MemberState,
) -> Result<(), StoreError> {
    conn.prepare_cached("UPDATE group_send_members SET state = ?3 WHERE id = ?1 AND member = ?2")?
        .execute(params![id, member, state.as_str()])?;
    Ok(())
}

pub(crate) fn mark_done(conn: &Connection, id: &str) -> Result<(), StoreError> {
    conn.prepare_cached("UPDATE group_sends SET done = 1 WHERE id = ?1")?
        .execute([id])?;
    Ok(())
}

fn parse_state(s: &str) -> Result<MemberState, StoreError> {
    [
        MemberState::Pending,
        MemberState::Stored,
        MemberState::Delivered,
        MemberState::Failed,
    ]
    .into_iter()
    .find(|state| state.as_str() == s)
    .ok_or_else(|| StoreError::Corrupt(format!("unknown member state {s:?}")))
}

fn members_of(conn: &Connection, id: &str) -> Result<BTreeMap<String, MemberState>, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT member, state FROM group_send_members WHERE id = ?1")?;
    let rows = stmt.query_and_then([id], |row| {
        let state: String = row.get(1)?;
        Ok::<_, StoreError>((row.get(0)?, parse_state(&state)?))
    })?;
    rows.collect()
}

/// The group messages with something left to deliver, oldest first.
pub(crate) fn load_active(conn: &Connection) -> Result<Vec<GroupSendRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, group_id, created_at, path_json, message_json FROM group_sends
         WHERE done = 0 ORDER BY created_at, id",
    )?;
    let rows = stmt.query_and_then([], |row| {
        let id: String = row.get(0)?;
        let at: i64 = row.get(2)?;
        let path: String = row.get(3)?;
        let message: String = row.get(4)?;
        Ok::<_, StoreError>((id, row.get::<_, String>(1)?, at, path, message))
    })?;
    let headers: Vec<_> = rows.collect::<Result<_, _>>()?;
    headers
        .into_iter()
        .map(|(id, group_id, at, path, message)| {
            let path: GroupPath = serde_json::from_str(&path)
                .map_err(|e| StoreError::Corrupt(format!("group message {id} path: {e}")))?;
            let message = Message::decode(&message)
                .map_err(|e| StoreError::Corrupt(format!("group message {id}: {e}")))?;
            let members = members_of(conn, &id)?;
            Ok(GroupSendRecord {
                created_at: from_db_u64(at).ok_or_else(|| {
                    StoreError::Corrupt(format!("group message {id} has a negative time"))
                })?,
                id,
                group_id,
                message,
                path,
                members,
            })
        })
        .collect()
}

pub(crate) fn status(conn: &Connection, id: &str) -> Result<Option<GroupSendStatus>, StoreError> {
    let group_id: Option<String> = conn
        .prepare_cached("SELECT group_id FROM group_sends WHERE id = ?1")?
        .query_row([id], |row| row.get(0))
        .optional()?;
    let Some(group_id) = group_id else {
        return Ok(None);
    };
    Ok(Some(GroupSendStatus {
        group_id,
        members: members_of(conn, id)?,
    }))
}

/// Forgets done group messages sent before `older_than`; returns how many.
pub(crate) fn prune_done(conn: &Connection, older_than: Millis) -> Result<usize, StoreError> {
    conn.prepare_cached(
        "DELETE FROM group_send_members WHERE id IN
             (SELECT id FROM group_sends WHERE done = 1 AND created_at < ?1)",
    )?
    .execute([to_db(older_than)])?;
    Ok(conn
        .prepare_cached("DELETE FROM group_sends WHERE done = 1 AND created_at < ?1")?
        .execute([to_db(older_than)])?)
}
