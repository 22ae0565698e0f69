//! Group frames as a connection sends them (`docs/protocol.md#group-frames`): what is checked
//! before the store decides, and the answers. The registrations and admin rules are decided in
//! `store/groups.rs`, a broadcast's report is settled in `fanout.rs`.

use std::future::Future;
use std::sync::Arc;

use courier_proto::RelayFrame;
use serde_json::Value;
use tokio::time::Instant;

use crate::dispatch::{error_frame, identifier_size_ok, Session};
use crate::fanout::{self, Broadcasted, GROUP_MEMORY_MS};
use crate::mailbox::{Envelope, GroupTag};
use crate::now_ms;
use crate::send::{resolve_recipient, Recipient};
use crate::store::StoreError;

/// A group name is display text, not an identifier; this bounds what the relay keeps of it.
const MAX_GROUP_NAME_BYTES: usize = 1024;

/// Whom a connection acts as in groups: its stamped identity (the bound address once it
/// declared one) and its account. It acts for a member registered under either.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    pub identity: String,
    pub account: String,
}

impl Actor {
    pub fn acts_for(&self, member: &str) -> bool {
        member == self.identity || member == self.account
    }
}

/// `GroupError.reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupRefusal {
    NotFound,
    /// CreateGroup of a group someone else created.
    Exists,
    NotAdmin,
    NotMember,
    /// AddGroupMember past the configured member count.
    Full,
    /// A member identifier that names nothing: no valid account name, no canonical address.
    InvalidMember,
}

impl GroupRefusal {
    pub fn reason(self) -> &'static str {
        match self {
            GroupRefusal::NotFound => "group_not_found",
            GroupRefusal::Exists => "group_exists",
            GroupRefusal::NotAdmin => "not_admin",
            GroupRefusal::NotMember => "not_member",
            GroupRefusal::Full => "group_full",
            GroupRefusal::InvalidMember => "invalid_member",
        }
    }
}

fn refusal(why: GroupRefusal, group_id: String, message_id: Option<String>) -> RelayFrame {
    RelayFrame::GroupError {
        reason: why.reason().to_owned(),
        group_id: Some(group_id),
        message_id,
    }
}

/// The store's decision within the relay's bound on its own work, or else the frame's
/// `Error{internal}`.
async fn decided<T>(
    session: &Session,
    frame_type: &str,
    message_id: Option<&str>,
    call: impl Future<Output = Result<Result<T, GroupRefusal>, StoreError>>,
) -> Result<Result<T, GroupRefusal>, RelayFrame> {
    let failed = match tokio::time::timeout(session.ctx.timings.answer_deadline, call).await {
        Ok(Ok(decision)) => return Ok(decision),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "timed out".to_owned(),
    };
    tracing::error!(frame_type, error = %failed, "group request failed");
    Err(error_frame(
        "internal",
        frame_type,
        message_id.map(str::to_owned),
    ))
}

/// A member identifier must name something: a valid account name or a canonical address.
fn member_ok(username: &str) -> bool {
    resolve_recipient(username) != Recipient::Unknown
}

pub async fn create(session: &Session, group_id: String, name: String) -> RelayFrame {
    if !identifier_size_ok(&group_id) || name.len() > MAX_GROUP_NAME_BYTES {
        return error_frame("invalid_frame", "CreateGroup", None);
    }
    let store = &session.ctx.store;
    let call = store.create_group(&group_id, &name, session.actor(), now_ms());
    match decided(session, "CreateGroup", None, call).await {
        Ok(Ok(())) => RelayFrame::GroupCreated { group_id, name },
        Ok(Err(why)) => refusal(why, group_id, None),
        Err(internal) => internal,
    }
}

pub async fn add_member(session: &Session, group_id: String, username: String) -> RelayFrame {
    if !identifier_size_ok(&group_id) || !identifier_size_ok(&username) {
        return error_frame("invalid_frame", "AddGroupMember", None);
    }
    if !member_ok(&username) {
        return refusal(GroupRefusal::InvalidMember, group_id, None);
    }
    let actor = session.actor();
    let ctx = &session.ctx;
    let call = ctx.store.add_group_member(
        &group_id,
        &username,
        actor.clone(),
        ctx.max_group_members,
        now_ms(),
    );
    match decided(session, "AddGroupMember", None, call).await {
        Ok(Ok(())) => RelayFrame::GroupMemberAdded {
            group_id,
            user_id: username,
            added_by: actor.identity,
        },
        Ok(Err(why)) => refusal(why, group_id, None),
        Err(internal) => internal,
    }
}

pub async fn remove_member(session: &Session, group_id: String, username: String) -> RelayFrame {
    if !identifier_size_ok(&group_id) || !identifier_size_ok(&username) {
        return error_frame("invalid_frame", "RemoveGroupMember", None);
    }
    if !member_ok(&username) {
        return refusal(GroupRefusal::InvalidMember, group_id, None);
    }
    let actor = session.actor();
    let call = session
        .ctx
        .store
        .remove_group_member(&group_id, &username, actor.clone());
    match decided(session, "RemoveGroupMember", None, call).await {
        Ok(Ok(())) => RelayFrame::GroupMemberRemoved {
            group_id,
            user_id: username,
            removed_by: actor.identity,
        },
        Ok(Err(why)) => refusal(why, group_id, None),
        Err(internal) => internal,
    }
}

/// LeaveGroup: the member removes itself; the answer names it as both the member removed and
/// who removed it, under the identifier it was registered as.
pub async fn leave(session: &Session, group_id: String) -> RelayFrame {
    if !identifier_size_ok(&group_id) {
        return error_frame("invalid_frame", "LeaveGroup", None);
    }
    let call = session.ctx.store.leave_group(&group_id, session.actor());
    match decided(session, "LeaveGroup", None, call).await {
        Ok(Ok(left)) => RelayFrame::GroupMemberRemoved {
            group_id,
            user_id: left.clone(),
            removed_by: left,
        },
        Ok(Err(why)) => refusal(why, group_id, None),
        Err(internal) => internal,
    }
}

/// The fields of one SendGroupMessage.
pub struct GroupMessage {
    pub group_id: String,
    pub content: String,
    pub message_id: String,
    pub reply_to_msg: Option<String>,
    pub forward_info: Option<Value>,
}

/// SendGroupMessage: journals the copies before the reader reads on, then leaves the report to
/// `fanout.rs`. Answers now only a frame that fans nothing out.
pub async fn send(session: &Session, message: GroupMessage) -> Option<RelayFrame> {
    let deadline = Instant::now() + session.ctx.timings.fanout_deadline;
    let GroupMessage {
        group_id,
        content,
        message_id,
        reply_to_msg,
        forward_info,
    } = message;
    let ids_ok = identifier_size_ok(&group_id)
        && identifier_size_ok(&message_id)
        && reply_to_msg.as_deref().is_none_or(identifier_size_ok);
    if !ids_ok {
        let echo = identifier_size_ok(&message_id).then_some(message_id);
        return Some(error_frame("invalid_frame", "SendGroupMessage", echo));
    }
    let message = session.envelope(message_id.clone(), content, reply_to_msg);
    let tag = GroupTag {
        group_id: group_id.clone(),
        forward_info,
    };
    let copy = Envelope {
        group: Some(tag.clone()),
        ..message.clone()
    };
    if !copy.fits_a_frame() {
        return Some(error_frame(
            "invalid_frame",
            "SendGroupMessage",
            Some(message_id),
        ));
    }
    let ctx = &session.ctx;
    // A copy is remembered no longer than it can be kept: past the mailbox's TTL a repeat finds
    // no copy to point at, and journals a new one.
    let remembered = ctx
        .mailbox
        .map_or(GROUP_MEMORY_MS, |m| m.ttl_ms.min(GROUP_MEMORY_MS));
    let dedup_since = now_ms().saturating_sub(remembered);
    let call = ctx
        .store
        .broadcast(session.actor(), message, tag, ctx.mailbox, dedup_since);
    match decided(session, "SendGroupMessage", Some(&message_id), call).await {
        Ok(Ok(fanned)) => {
            for _ in 0..fanned.journaled {
                ctx.metrics.appended(copy.content.len());
            }
            let broadcasted = Broadcasted {
                group_id,
                copy: Arc::new(copy),
                members: fanned.members,
                deadline,
            };
            fanout::report(Arc::clone(ctx), broadcasted, session.report_to());
            None
        }
        Ok(Err(why)) => Some(refusal(why, group_id, Some(message_id))),
        Err(internal) => Some(internal),
    }
}
