//! Whose presence an account may see (`docs/protocol.md#presence-visibility`). Under
//! `--presence-visibility contacts` an account sees another's presence only once the two have
//! exchanged a message through this relay or share a group; anyone else reads exactly as an
//! identifier that names nobody: `online:false`, no `last_seen`.

use std::collections::HashSet;
use std::sync::Arc;

use crate::config::PresenceVisibility;
use crate::send::resolve_recipient;
use crate::Ctx;

/// What one connection may see, as of one presence frame.
pub enum Sees {
    Everyone,
    /// Its own account, its contacts, and these accounts it shares a group with.
    Contacts {
        account: String,
        group_peers: HashSet<String>,
    },
}

impl Sees {
    /// Decides for the connection of `account`, stamped `identity`, whose group memberships
    /// are those of either. A failed look-up of the groups sees fewer, never more.
    pub async fn of(ctx: &Ctx, account: &str, identity: &str) -> Self {
        if ctx.presence_visibility == PresenceVisibility::Everyone {
            return Sees::Everyone;
        }
        let mut identities = vec![account.to_owned()];
        if identity != account {
            identities.push(identity.to_owned());
        }
        let looked_up = tokio::time::timeout(
            ctx.timings.answer_deadline,
            ctx.store.group_peers(identities),
        )
        .await;
        let members = match looked_up {
            Ok(Ok(members)) => members,
            Ok(Err(e)) => {
                tracing::warn!(%account, error = %e, "group look-up for presence failed");
                Vec::new()
            }
            Err(_) => {
                tracing::warn!(%account, "group look-up for presence timed out");
                Vec::new()
            }
        };
        let group_peers = members
            .iter()
            .filter_map(|member| resolve_recipient(member).named())
            .filter_map(|named| ctx.router.resolve(named))
            .collect();
        Sees::Contacts {
            account: account.to_owned(),
            group_peers,
        }
    }

    pub fn account(&self, ctx: &Ctx, target: &str) -> bool {
        match self {
            Sees::Everyone => true,
            Sees::Contacts {
                account,
                group_peers,
            } => group_peers.contains(target) || ctx.router.contacts.knows(account, target),
        }
    }
}

/// Whether `viewer`'s connection may see `target`'s presence, looking the groups up only when
/// no exchange already decides it.
pub async fn sees(ctx: &Ctx, viewer: &str, identity: &str, target: &str) -> bool {
    ctx.presence_visibility == PresenceVisibility::Everyone
        || ctx.router.contacts.knows(viewer, target)
        || Sees::of(ctx, viewer, identity).await.account(ctx, target)
}

/// `a` and `b` exchanged a message: under contacts visibility they see each other from now on.
/// A pair is persisted once, when first seen, in a store request of its own that rides the next
/// group commit; the message's answer does not wait for it.
pub fn exchanged(ctx: &Arc<Ctx>, a: &str, b: &str) {
    if ctx.presence_visibility == PresenceVisibility::Everyone || !ctx.router.contacts.insert(a, b)
    {
        return;
    }
    let ctx = Arc::clone(ctx);
    let (a, b) = (a.to_owned(), b.to_owned());
    tokio::spawn(async move {
        if let Err(e) = ctx.store.record_contact(&a, &b).await {
            tracing::warn!(%a, %b, error = %e, "recording a contact failed");
        }
    });
}
