//! SendMessage (§6): every valid one gets exactly one MessageSent, DeliveryError or
//! `Error{internal}`, echoing `message_id` and `recipient` as received.

use std::sync::Arc;

use courier_proto::limits::{MAX_FRAME_BYTES, RECIPIENT_UNREACHABLE};
use courier_proto::{Disposition, RelayFrame};

use crate::dispatch::{error_frame, identifier_size_ok, Session};
use crate::store::AppendOutcome;

/// Whom a recipient identifier names (§5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipient<'a> {
    Account(&'a str),
    Unknown,
}

/// Account names stand for themselves. `off1` addresses resolve only through a declared
/// binding (§4), and this relay does not accept declarations yet (`address_routing_v1` is not
/// advertised), so every address is unknown. Whether an account name is known is the
/// journal's answer, not this function's.
pub fn resolve_recipient(identifier: &str) -> Recipient<'_> {
    if courier_proto::validate_account_name(identifier).is_ok() {
        Recipient::Account(identifier)
    } else {
        Recipient::Unknown
    }
}

fn unreachable(recipient: String, message_id: String, detail: &str) -> RelayFrame {
    RelayFrame::DeliveryError {
        message_id: Some(message_id),
        recipient,
        reason: format!("{RECIPIENT_UNREACHABLE}: {detail}"),
    }
}

fn sent(
    recipient: String,
    message_id: String,
    timestamp: u64,
    disposition: Disposition,
) -> RelayFrame {
    RelayFrame::MessageSent {
        message_id,
        recipient,
        timestamp,
        disposition: Some(disposition),
    }
}

fn internal(message_id: String) -> RelayFrame {
    error_frame("internal", "SendMessage", Some(message_id))
}

pub async fn send_message(
    session: &Session,
    recipient: String,
    content: String,
    message_id: String,
    reply_to_msg: Option<String>,
) -> RelayFrame {
    let ids_ok = identifier_size_ok(&recipient)
        && identifier_size_ok(&message_id)
        && reply_to_msg.as_deref().is_none_or(identifier_size_ok);
    if !ids_ok {
        let echo = identifier_size_ok(&message_id).then(|| message_id.clone());
        return error_frame("invalid_frame", "SendMessage", echo);
    }
    let envelope = session.envelope(message_id.clone(), content, reply_to_msg);
    // A frame accepted must be deliverable: the MessageReceived it becomes (largest seq,
    // escaping included) has to fit under the 1 MiB frame limit too.
    let mut widest = envelope.to_frame(false);
    if let RelayFrame::MessageReceived { seq, .. } = &mut widest {
        *seq = Some(u64::MAX);
    }
    if widest.encode().len() > MAX_FRAME_BYTES {
        return error_frame("invalid_frame", "SendMessage", Some(message_id));
    }
    let accepted_ms = envelope.accepted_ms;
    let account = match resolve_recipient(&recipient) {
        Recipient::Account(account) => account.to_owned(),
        Recipient::Unknown => return unreachable(recipient, message_id, "unknown_recipient"),
    };
    let ctx = &session.ctx;
    let deadline = ctx.timings.answer_deadline;

    let Some(limits) = ctx.mailbox else {
        // No mailbox: hand the frame straight to the recipient's socket, or refuse.
        if let Some(peer) = ctx.router.get(&account) {
            if peer
                .queue
                .send_unjournaled(Arc::new(envelope), deadline)
                .await
            {
                return sent(recipient, message_id, accepted_ms, Disposition::Live);
            }
            return unreachable(recipient, message_id, "offline_no_mailbox");
        }
        return match tokio::time::timeout(deadline, ctx.store.account_exists(&account)).await {
            Ok(Ok(true)) => unreachable(recipient, message_id, "offline_no_mailbox"),
            Ok(Ok(false)) => unreachable(recipient, message_id, "unknown_recipient"),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "account lookup failed");
                internal(message_id)
            }
            Err(_) => internal(message_id),
        };
    };

    match tokio::time::timeout(deadline, ctx.store.append(&account, envelope, limits)).await {
        Ok(Ok(
            AppendOutcome::Accepted { disposition, .. } | AppendOutcome::Duplicate { disposition },
        )) => sent(recipient, message_id, accepted_ms, disposition),
        Ok(Ok(AppendOutcome::UnknownRecipient)) => {
            unreachable(recipient, message_id, "unknown_recipient")
        }
        Ok(Ok(AppendOutcome::MailboxFull)) => unreachable(recipient, message_id, "mailbox_full"),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "journal append failed");
            internal(message_id)
        }
        Err(_) => {
            tracing::error!("journal append timed out");
            internal(message_id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_invalid_names_are_unknown() {
        assert_eq!(resolve_recipient("bob"), Recipient::Account("bob"));
        assert_eq!(
            resolve_recipient("off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn"),
            Recipient::Unknown
        );
        assert_eq!(resolve_recipient("a/b"), Recipient::Unknown);
    }
}
