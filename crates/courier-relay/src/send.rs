//! SendMessage (`docs/protocol.md#sending`): every valid one gets exactly one MessageSent,
//! DeliveryError or `Error{internal}`, echoing `message_id` and `recipient` as received.

use std::sync::Arc;

use tokio::time::Instant;

use courier_proto::ident::is_address_form;
use courier_proto::UnreachableCause;
use courier_proto::{Address, Disposition, RelayFrame};

use crate::config::{MailboxLimits, PresenceVisibility};
use crate::dispatch::{error_frame, identifier_size_ok, Answer, Session};
use crate::mailbox::Envelope;
use crate::store::{AppendOutcome, Named, StoreError};
use crate::visibility;
use crate::Ctx;

/// Whom a recipient identifier names (`docs/protocol.md#identifiers`), before any binding is
/// consulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipient<'a> {
    /// An account name: stands for itself. Whether the account exists is the journal's answer.
    Account(&'a str),
    /// A canonical `off1` address: names whichever account declared it last, if any.
    Address(Address),
    /// Names nothing: an `off1` string that does not parse canonically
    /// (`docs/protocol.md#addresses`), or a string that is no valid account name.
    Unknown,
}

impl Recipient<'_> {
    /// What the store resolves; `None` for an identifier that names nothing.
    pub fn named(self) -> Option<Named> {
        match self {
            Recipient::Account(account) => Some(Named::Account(account.to_owned())),
            Recipient::Address(address) => Some(Named::Address(address.to_string())),
            Recipient::Unknown => None,
        }
    }
}

/// Whether `identifier` spells a valid address in another case (the all-uppercase form bech32
/// otherwise allows, or mixed case). Rule 1 of `docs/protocol.md#addresses`: such a string names no
/// address, and the relay treats it as an unknown recipient; it is no account name either
/// (auth.rs), so two strings never name one identity.
pub fn spells_an_address(identifier: &str) -> bool {
    identifier.len() == courier_proto::address::ADDRESS_STR_LEN
        && !is_address_form(identifier)
        && identifier
            .get(..4)
            .is_some_and(|prefix| prefix.eq_ignore_ascii_case("off1"))
        && Address::parse(&identifier.to_ascii_lowercase()).is_ok()
}

/// Classifies an identifier: anything beginning with `off1` is an address and must parse
/// strictly; anything else is an account name.
pub fn resolve_recipient(identifier: &str) -> Recipient<'_> {
    if is_address_form(identifier) {
        return match Address::parse(identifier) {
            Ok(address) => Recipient::Address(address),
            Err(_) => Recipient::Unknown,
        };
    }
    if spells_an_address(identifier) {
        return Recipient::Unknown;
    }
    if courier_proto::validate_account_name(identifier).is_ok() {
        Recipient::Account(identifier)
    } else {
        Recipient::Unknown
    }
}

/// The account a recipient names now, through the persisted binding for an address; `None`
/// when it names none (an account name is returned as is, known or not).
pub async fn account_of(ctx: &Ctx, recipient: Recipient<'_>) -> Result<Option<String>, StoreError> {
    match recipient {
        Recipient::Account(account) => Ok(Some(account.to_owned())),
        Recipient::Address(address) => {
            let resolved = tokio::time::timeout(
                ctx.timings.answer_deadline,
                ctx.store.resolve_address(&address.to_string()),
            )
            .await;
            resolved.unwrap_or_else(|_| Err(StoreError::Sqlite("address look-up timed out".into())))
        }
        Recipient::Unknown => Ok(None),
    }
}

/// The unreachable verdict on one SendMessage, of the relay and the gateway daemon alike.
pub fn recipient_unreachable(
    message_id: String,
    recipient: String,
    why: UnreachableCause,
) -> RelayFrame {
    RelayFrame::DeliveryError {
        message_id: Some(message_id),
        recipient,
        reason: why.reason(),
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

/// Decides a SendMessage. With a mailbox the frame is queued for the journal and answered once
/// its group commit is durable, while the connection reads on; without one it is handed to the
/// recipient's socket (or refused) before the next frame is read.
pub async fn send_message(
    session: &Session,
    recipient: String,
    content: String,
    message_id: String,
    reply_to_msg: Option<String>,
) -> Answer {
    match session.ctx.mailbox {
        Some(limits) => {
            journal(
                session,
                recipient,
                content,
                message_id,
                reply_to_msg,
                limits,
            )
            .await
        }
        None => {
            Answer::Now(unjournaled(session, recipient, content, message_id, reply_to_msg).await)
        }
    }
}

/// The checks every SendMessage passes first: the envelope, or the refusal.
fn checked(
    session: &Session,
    recipient: &str,
    content: String,
    message_id: &str,
    reply_to_msg: Option<String>,
) -> Result<Envelope, Box<RelayFrame>> {
    let ids_ok = identifier_size_ok(recipient)
        && identifier_size_ok(message_id)
        && reply_to_msg.as_deref().is_none_or(identifier_size_ok);
    if !ids_ok {
        let echo = identifier_size_ok(message_id).then(|| message_id.to_owned());
        return Err(Box::new(error_frame("invalid_frame", "SendMessage", echo)));
    }
    let envelope = session.envelope(message_id.to_owned(), content, reply_to_msg);
    if !envelope.fits_a_frame() {
        return Err(Box::new(error_frame(
            "invalid_frame",
            "SendMessage",
            Some(message_id.to_owned()),
        )));
    }
    Ok(envelope)
}

/// What an identifier that names no known account is answered without a mailbox. Under
/// contacts visibility it reads exactly as an offline account does
/// (`docs/protocol.md#presence-visibility`): whether an account exists is not told.
fn unknown(ctx: &Ctx) -> UnreachableCause {
    match ctx.presence_visibility {
        PresenceVisibility::Everyone => UnreachableCause::UnknownRecipient,
        PresenceVisibility::Contacts => UnreachableCause::OfflineNoMailbox,
    }
}

/// No mailbox: the frame goes straight to the recipient's socket, or is refused.
async fn unjournaled(
    session: &Session,
    recipient: String,
    content: String,
    message_id: String,
    reply_to_msg: Option<String>,
) -> RelayFrame {
    let envelope = match checked(session, &recipient, content, &message_id, reply_to_msg) {
        Ok(envelope) => envelope,
        Err(refusal) => return *refusal,
    };
    let accepted_ms = envelope.accepted_ms;
    let ctx = &session.ctx;
    let resolved = resolve_recipient(&recipient);
    if resolved.named().is_none() {
        return recipient_unreachable(message_id, recipient, unknown(ctx));
    }
    let deadline = ctx.timings.answer_deadline;
    let account = match account_of(ctx, resolved).await {
        Ok(Some(account)) => account,
        Ok(None) => return recipient_unreachable(message_id, recipient, unknown(ctx)),
        Err(e) => {
            tracing::error!(error = %e, "address look-up failed");
            return internal(message_id);
        }
    };
    if let Some(peer) = ctx.router.get(&account) {
        if peer.queue.try_unjournaled(Arc::new(envelope)).is_ok() {
            visibility::exchanged(ctx, &session.peer.account, &account);
            return sent(recipient, message_id, accepted_ms, Disposition::Live);
        }
        return recipient_unreachable(message_id, recipient, UnreachableCause::OfflineNoMailbox);
    }
    match tokio::time::timeout(deadline, ctx.store.account_exists(&account)).await {
        Ok(Ok(true)) => {
            recipient_unreachable(message_id, recipient, UnreachableCause::OfflineNoMailbox)
        }
        Ok(Ok(false)) => recipient_unreachable(message_id, recipient, unknown(ctx)),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "account lookup failed");
            internal(message_id)
        }
        Err(_) => internal(message_id),
    }
}

/// Queues the frame for the journal, in this connection's order; the answer follows the commit.
async fn journal(
    session: &Session,
    recipient: String,
    content: String,
    message_id: String,
    reply_to_msg: Option<String>,
    limits: MailboxLimits,
) -> Answer {
    let envelope = match checked(session, &recipient, content, &message_id, reply_to_msg) {
        Ok(envelope) => envelope,
        Err(refusal) => return Answer::Now(*refusal),
    };
    let Some(named) = resolve_recipient(&recipient).named() else {
        return Answer::Now(recipient_unreachable(
            message_id,
            recipient,
            UnreachableCause::UnknownRecipient,
        ));
    };
    let accepted_ms = envelope.accepted_ms;
    let content_bytes = envelope.content.len();
    let ctx = Arc::clone(&session.ctx);
    // Only under contacts visibility is the exchange recorded: the default costs nothing more.
    let exchange = (ctx.presence_visibility == PresenceVisibility::Contacts)
        .then(|| (session.peer.account.clone(), named.clone()));
    let deadline = Instant::now() + ctx.timings.answer_deadline;
    // An address is resolved in the append's own transaction: the frame belongs to the
    // account the address named at acceptance (`docs/protocol.md#identifiers`).
    let queued = tokio::time::timeout_at(
        deadline,
        ctx.store.queue_append(named, envelope, limits, &ctx.router),
    );
    let pending = match queued.await {
        Ok(Ok(pending)) => pending,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "journal append failed");
            return Answer::Now(internal(message_id));
        }
        Err(_) => {
            tracing::error!("journal append timed out");
            return Answer::Now(internal(message_id));
        }
    };
    Answer::Later(Box::pin(async move {
        let answer = match tokio::time::timeout_at(deadline, pending.answer()).await {
            Ok(Ok(AppendOutcome::Accepted { disposition, .. })) => {
                ctx.metrics.appended(content_bytes);
                exchanged(&ctx, exchange);
                sent(recipient, message_id, accepted_ms, disposition)
            }
            Ok(Ok(AppendOutcome::Duplicate { disposition })) => {
                exchanged(&ctx, exchange);
                sent(recipient, message_id, accepted_ms, disposition)
            }
            Ok(Ok(AppendOutcome::UnknownRecipient)) => {
                recipient_unreachable(message_id, recipient, UnreachableCause::UnknownRecipient)
            }
            Ok(Ok(AppendOutcome::MailboxFull)) => {
                recipient_unreachable(message_id, recipient, UnreachableCause::MailboxFull)
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "journal append failed");
                internal(message_id)
            }
            Err(_) => {
                tracing::error!("journal append timed out");
                internal(message_id)
            }
        };
        Some(answer)
    }))
}

/// A journaled frame makes its sender and recipient contacts; the recipient an address named is
/// the account it is bound to now, as the append resolved it an instant ago.
fn exchanged(ctx: &Arc<Ctx>, exchange: Option<(String, Named)>) {
    let Some((sender, recipient)) = exchange else {
        return;
    };
    if let Some(account) = ctx.router.resolve(recipient) {
        visibility::exchanged(ctx, &sender, &account);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_strictly_and_invalid_names_are_unknown() {
        const K1: &str = "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn";
        assert_eq!(resolve_recipient("bob"), Recipient::Account("bob"));
        assert_eq!(
            resolve_recipient(K1),
            Recipient::Address(Address::parse(K1).unwrap())
        );
        assert_eq!(resolve_recipient("a/b"), Recipient::Unknown);
        // `docs/protocol.md#addresses`: every must-reject string names nothing, and so does a bare
        // prefix.
        for bad in [
            "OFF1QYQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQN8ANTF",
            "off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqxmdlwt",
            "off1qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqkynkkv",
            "off1qgqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqquz0u9x",
            "off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqxfx3pw",
            "off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqkev2nx",
            "off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqra5g99k",
            "off1x",
            "off1",
            "Off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn",
            "OFF1QYSLUVWL5922YCTZD0U9GPR06GN3K7LDFVGTWGVN",
        ] {
            assert_eq!(resolve_recipient(bad), Recipient::Unknown, "{bad}");
        }
        assert!(spells_an_address(
            "OFF1QYQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQN8ANTF"
        ));
        assert!(!spells_an_address(K1), "the canonical form is the address");
        assert!(!spells_an_address("Off1ce"));
        assert_eq!(resolve_recipient("Off1ce"), Recipient::Account("Off1ce"));
        // Another HRP is not of address form: as an account name it is valid.
        assert_eq!(
            resolve_recipient("ofg1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqpxdptr"),
            Recipient::Account("ofg1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqpxdptr")
        );
        assert_eq!(
            Recipient::Address(Address::parse(K1).unwrap()).named(),
            Some(Named::Address(K1.to_owned()))
        );
    }
}
