//! Frames after authentication: decode, meter (`docs/protocol.md#rate-limiting`), and one handler
//! per frame type.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use courier_proto::limits::{close, MAX_IDENTIFIER_BYTES, MAX_MALFORMED_FRAMES};
use courier_proto::proof::{verify_declaration, AddressDeclError, CHALLENGE_LEN};
use courier_proto::{Address, ClientFrame, DecodeError, RelayFrame};
use tokio::sync::mpsc;

use crate::directory;
use crate::fanout::ReportTo;
use crate::group::{self, Actor, GroupMessage};
use crate::mailbox::Envelope;
use crate::presence::{Status, MAX_WATCHES, MAX_WATCH_LIST};
use crate::rate::AccountBucket;
use crate::router::{Peer, Sight};
use crate::send::{resolve_recipient, send_message};
use crate::store::Release;
use crate::visibility::{self, Sees};
use crate::writer::{Later, Outbound};
use crate::Ctx;

/// A frame's answer: known now, or decided once the frame's store request is durable.
pub enum Answer {
    Now(RelayFrame),
    Later(Later),
}

/// What the reader does after a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Close(u16),
    WriterGone,
}

pub fn error_frame(code: &str, frame_type: &str, message_id: Option<String>) -> RelayFrame {
    RelayFrame::Error {
        code: code.to_owned(),
        frame_type: Some(frame_type.to_owned()),
        message_id,
        detail: None,
    }
}

/// Identifier fields are 1–256 UTF-8 bytes.
pub fn identifier_size_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_IDENTIFIER_BYTES
}

/// `users[]` of Watch/UnwatchPresence: at most `MAX_WATCH_LIST` identifiers (an empty list is
/// a valid no-op). One bad entry makes the whole frame invalid, and it changes nothing.
fn watch_list_ok(users: &[String]) -> bool {
    users.len() <= MAX_WATCH_LIST && users.iter().all(|u| identifier_size_ok(u))
}

/// One authenticated connection's reading side.
pub struct Session {
    pub ctx: Arc<Ctx>,
    pub peer: Arc<Peer>,
    /// Stamped as `sender` on every frame relayed from this connection
    /// (`docs/protocol.md#identifiers`): the account name until a DeclareAddress succeeds, the
    /// bound address from the next frame on.
    pub identity: String,
    /// The address that `identity` renders once a DeclareAddress succeeded.
    declared: Option<Address>,
    /// This connection's `address_challenge` (`docs/protocol.md#handshake`), which its declaration
    /// must sign.
    challenge: [u8; CHALLENGE_LEN],
    /// A DeclareAddress was handled: the challenge is spent (check 4 of
    /// `docs/protocol.md#relay-checks`).
    declaration_handled: bool,
    /// A DeclareAddress frame was read, valid or not: the free one is spent.
    declaration_read: bool,
    /// The account's token bucket (`docs/protocol.md#rate-limiting`).
    bucket: Arc<AccountBucket>,
    malformed: u32,
    drain_requested: bool,
    out: mpsc::Sender<Outbound>,
}

impl Session {
    pub fn new(
        ctx: Arc<Ctx>,
        peer: Arc<Peer>,
        challenge: [u8; CHALLENGE_LEN],
        out: mpsc::Sender<Outbound>,
    ) -> Self {
        Self {
            identity: peer.account.clone(),
            declared: None,
            challenge,
            declaration_handled: false,
            declaration_read: false,
            bucket: ctx.buckets.of(&peer.account, Instant::now()),
            ctx,
            peer,
            malformed: 0,
            drain_requested: false,
            out,
        }
    }

    pub fn account(&self) -> &str {
        &self.peer.account
    }

    /// The address this connection proved, if a DeclareAddress succeeded: the one it may publish
    /// key packages for (`docs/protocol.md#key-package-directory`).
    pub fn declared(&self) -> Option<Address> {
        self.declared
    }

    async fn answer(&self, frame: RelayFrame) -> Flow {
        self.queue(Outbound::Frame(frame)).await
    }

    /// Hands the writer an answer to write in this frame's place once it is decided.
    async fn answer_later(&self, answer: Answer) -> Flow {
        match answer {
            Answer::Now(frame) => self.answer(frame).await,
            Answer::Later(later) => self.queue(Outbound::Later(later)).await,
        }
    }

    async fn queue(&self, outbound: Outbound) -> Flow {
        match self.out.send(outbound).await {
            Ok(()) => Flow::Continue,
            Err(_) => Flow::WriterGone,
        }
    }

    /// Drain rule (b) of `docs/protocol.md#drain`: any first frame other than DeclareAddress starts
    /// the drain.
    async fn request_drain(&mut self) -> Flow {
        if self.drain_requested {
            return Flow::Continue;
        }
        self.drain_requested = true;
        match self.out.send(Outbound::StartDrain).await {
            Ok(()) => Flow::Continue,
            Err(_) => Flow::WriterGone,
        }
    }

    /// Takes `cost` tokens from the account's bucket, or answers RateLimited and reports the
    /// frame dropped.
    async fn meter(
        &mut self,
        frame_type: &str,
        cost: u32,
        message_id: Option<String>,
        seq: Option<u64>,
    ) -> Result<(), Flow> {
        match self.bucket.try_take(cost, Instant::now()) {
            Ok(()) => Ok(()),
            Err(wait) => {
                self.ctx.metrics.rate_limited(frame_type);
                let limited = RelayFrame::RateLimited {
                    retry_after_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1),
                    frame_type: frame_type.to_owned(),
                    message_id,
                    seq,
                };
                Err(self.answer(limited).await)
            }
        }
    }

    /// The connection's first DeclareAddress is free (`docs/protocol.md#rate-limiting`): a
    /// client declares once per connection. Any later one, valid or not, is metered, or a
    /// client could make the relay verify signatures without limit.
    fn free_declaration(&mut self) -> bool {
        !std::mem::replace(&mut self.declaration_read, true)
    }

    /// A binary message: no frame.
    pub async fn on_binary(&mut self) -> Flow {
        self.ctx.metrics.received_binary();
        self.on_malformed().await
    }

    async fn on_malformed(&mut self) -> Flow {
        if let flow @ (Flow::WriterGone | Flow::Close(_)) = self.request_drain().await {
            return flow;
        }
        self.malformed += 1;
        let flow = self.answer(RelayFrame::error("malformed", None)).await;
        if flow == Flow::Continue && self.malformed >= MAX_MALFORMED_FRAMES {
            return Flow::Close(close::TOO_MANY_MALFORMED);
        }
        flow
    }

    pub async fn on_text(&mut self, text: &str) -> Flow {
        let decoded = ClientFrame::decode(text);
        self.ctx.metrics.received(&decoded, text.len());
        let frame = match decoded {
            Ok(frame) => frame,
            Err(DecodeError::Malformed) => return self.on_malformed().await,
            Err(DecodeError::UnknownType(frame_type)) => {
                return self.refuse(&frame_type, "unknown_type").await;
            }
            Err(DecodeError::Invalid { frame_type, detail }) => {
                tracing::debug!(%frame_type, %detail, "invalid frame");
                return self.refuse(&frame_type, "invalid_frame").await;
            }
        };
        let is_declaration = matches!(frame, ClientFrame::DeclareAddress { .. });
        if !is_declaration {
            if let flow @ (Flow::WriterGone | Flow::Close(_)) = self.request_drain().await {
                return flow;
            }
        }
        if !(is_declaration && self.free_declaration()) {
            let (message_id, seq) = match &frame {
                // Echoed only when it is a well-formed identifier, so an answer stays small.
                ClientFrame::SendMessage { message_id, .. }
                | ClientFrame::SendGroupMessage { message_id, .. } => (
                    identifier_size_ok(message_id).then(|| message_id.clone()),
                    None,
                ),
                ClientFrame::Ack { seq } | ClientFrame::AckUpTo { seq } => (None, Some(*seq)),
                _ => (None, None),
            };
            // A frame is paid by its size, so one account's large frames cannot take the
            // journal for themselves; a presence look-up per identifier, as one frame may name
            // thousands. An invalid list looks nothing up, and is paid for by its size.
            let by_size = courier_proto::limits::rate_cost(text.len());
            let cost = match &frame {
                ClientFrame::WatchPresence { users } if watch_list_ok(users) => {
                    u32::try_from(users.len()).unwrap_or(u32::MAX).max(by_size)
                }
                _ => by_size,
            };
            if let Err(flow) = self.meter(frame.type_name(), cost, message_id, seq).await {
                return flow;
            }
        }
        self.dispatch(frame).await
    }

    /// Unknown or invalid frames: metered like any frame (the connection's first DeclareAddress
    /// excepted), answered with an Error, never fatal.
    async fn refuse(&mut self, frame_type: &str, code: &str) -> Flow {
        if let flow @ (Flow::WriterGone | Flow::Close(_)) = self.request_drain().await {
            return flow;
        }
        if !(frame_type == "DeclareAddress" && self.free_declaration()) {
            if let Err(flow) = self.meter(frame_type, 1, None, None).await {
                return flow;
            }
        }
        self.answer(error_frame(code, frame_type, None)).await
    }

    async fn dispatch(&mut self, frame: ClientFrame) -> Flow {
        match frame {
            ClientFrame::Authenticate { .. } => {
                self.answer(RelayFrame::error(
                    "already_authenticated",
                    Some("Authenticate"),
                ))
                .await
            }
            ClientFrame::SendMessage {
                recipient,
                content,
                message_id,
                reply_to_msg,
            } => {
                let answer = send_message(self, recipient, content, message_id, reply_to_msg).await;
                self.answer_later(answer).await
            }
            ClientFrame::Ack { seq } => self.ack(Release::One(seq)).await,
            ClientFrame::AckUpTo { seq } => self.ack(Release::UpTo(seq)).await,
            ClientFrame::CheckPresence { username } => self.check_presence(username).await,
            ClientFrame::DeclareAddress {
                address,
                public_key,
                signature,
            } => {
                let (answer, bound) = match self.declare(&address, &public_key, &signature).await {
                    Ok(answer) => (answer, true),
                    Err(failure) => (failure, false),
                };
                let flow = self.answer(answer).await;
                if flow != Flow::Continue {
                    return flow;
                }
                if !bound {
                    // The address was verified but its binding not stored: every frame after it
                    // would be stamped with the account name for good, and its recipients would
                    // drop it. The client's next connection declares afresh.
                    return Flow::Close(close::INTERNAL);
                }
                // Drain rule (a) of `docs/protocol.md#drain`: the drain follows the declaration's
                // answer.
                self.request_drain().await
            }
            ClientFrame::WatchPresence { users } => self.watch_presence(users).await,
            ClientFrame::PublishKeyPackages { .. } | ClientFrame::FetchKeyPackage { .. }
                if !self.ctx.key_directory =>
            {
                // Not advertised (`--no-key-directory`).
                self.answer(error_frame("unknown_type", frame.type_name(), None))
                    .await
            }
            ClientFrame::PublishKeyPackages {
                packages,
                last_resort,
            } => {
                let answer = directory::publish(self, packages, last_resort).await;
                self.answer(answer).await
            }
            ClientFrame::FetchKeyPackage { address } => {
                let answer = directory::fetch(self, address).await;
                self.answer(answer).await
            }
            ClientFrame::UnwatchPresence { users } => self.unwatch_presence(&users).await,
            ClientFrame::CreateGroup { group_id, name } => {
                let answer = group::create(self, group_id, name).await;
                self.answer(answer).await
            }
            ClientFrame::AddGroupMember { group_id, username } => {
                let answer = group::add_member(self, group_id, username).await;
                self.answer(answer).await
            }
            ClientFrame::RemoveGroupMember { group_id, username } => {
                let answer = group::remove_member(self, group_id, username).await;
                self.answer(answer).await
            }
            ClientFrame::LeaveGroup { group_id } => {
                let answer = group::leave(self, group_id).await;
                self.answer(answer).await
            }
            ClientFrame::SendGroupMessage {
                group_id,
                content,
                message_id,
                reply_to_msg,
                forward_info,
            } => {
                let message = GroupMessage {
                    group_id,
                    content,
                    message_id,
                    reply_to_msg,
                    forward_info,
                };
                match group::send(self, message).await {
                    Some(answer) => self.answer(answer).await,
                    None => Flow::Continue,
                }
            }
        }
    }

    /// DeclareAddress (`docs/protocol.md#relay-checks`), decided completely (verified, and on
    /// success bound durably) before the reader reads the next frame, so every frame after it on
    /// this connection is stamped with the address and none before it ever is. A refusal is not
    /// fatal: the connection stays in account-name space. A verified address whose binding
    /// could not be stored is: `Err` holds the answer to write before the connection closes
    /// (`docs/protocol.md#relay-checks`). The challenge is single-use: any second DeclareAddress
    /// is `already_declared`, whatever the first one's outcome.
    async fn declare(
        &mut self,
        address: &str,
        public_key: &str,
        signature: &str,
    ) -> Result<RelayFrame, RelayFrame> {
        let refuse = |e: AddressDeclError| RelayFrame::AddressError {
            reason: e.reason().to_owned(),
        };
        if self.declaration_handled {
            return Ok(refuse(AddressDeclError::AlreadyDeclared));
        }
        self.declaration_handled = true;
        let account = self.peer.account.clone();
        let bound =
            match verify_declaration(&account, &self.challenge, address, public_key, signature) {
                Ok(bound) => bound,
                Err(e) => {
                    tracing::debug!(%account, reason = e.reason(), "address declaration refused");
                    return Ok(refuse(e));
                }
            };
        let rendered = bound.to_string();
        let stored = tokio::time::timeout(
            self.ctx.timings.answer_deadline,
            self.ctx.store.bind_address(
                &rendered,
                &account,
                self.ctx.addresses.max_per_account,
                crate::now_ms(),
            ),
        )
        .await;
        match stored {
            Ok(Ok(())) => {
                tracing::debug!(%account, address = %rendered, "address bound");
                self.identity = rendered.clone();
                self.declared = Some(bound);
                Ok(RelayFrame::AddressDeclared { address: rendered })
            }
            Ok(Err(e)) => {
                tracing::error!(%account, error = %e, "address binding not persisted: closing the connection");
                Err(error_frame("internal", "DeclareAddress", None))
            }
            Err(_) => {
                tracing::error!(%account, "address binding timed out: closing the connection");
                Err(error_frame("internal", "DeclareAddress", None))
            }
        }
    }

    /// Ack / AckUpTo (`docs/protocol.md#frame-release`): only frames written on this connection are
    /// released; acks of anything else are ignored, and acks are never answered.
    async fn ack(&mut self, release: Release) -> Flow {
        if self.ctx.mailbox.is_none() {
            return Flow::Continue;
        }
        let written = self.peer.queue.highest_written();
        let release = match release {
            Release::One(seq) if seq >= 1 && seq <= written => Release::One(seq),
            Release::UpTo(seq) if seq.min(written) >= 1 => Release::UpTo(seq.min(written)),
            _ => return Flow::Continue,
        };
        let deadline = tokio::time::Instant::now() + self.ctx.timings.answer_deadline;
        let queued = tokio::time::timeout_at(
            deadline,
            self.ctx.store.queue_release(self.account(), release),
        )
        .await;
        let pending = match queued {
            Ok(Ok(pending)) => pending,
            Ok(Err(e)) => {
                tracing::warn!(account = self.account(), error = %e, "ack not recorded");
                return Flow::Continue;
            }
            Err(_) => {
                tracing::warn!(account = self.account(), "ack timed out");
                return Flow::Continue;
            }
        };
        // Never answered; waited for in order only to report a failure.
        let account = self.peer.account.clone();
        self.answer_later(Answer::Later(Box::pin(async move {
            match tokio::time::timeout_at(deadline, pending.answer()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(%account, error = %e, "ack not recorded"),
                Err(_) => tracing::warn!(%account, "ack timed out"),
            }
            None
        })))
        .await
    }

    /// CheckPresence (`docs/protocol.md#presence`): `user_id` echoes the identifier as given; an
    /// address reports the account it is bound to. Answered from memory (router.rs), but for
    /// the groups of a connection under contacts visibility (`visibility.rs`).
    async fn check_presence(&mut self, username: String) -> Flow {
        if !identifier_size_ok(&username) {
            return self
                .answer(error_frame("invalid_frame", "CheckPresence", None))
                .await;
        }
        let router = &self.ctx.router;
        let status = match resolve_recipient(&username)
            .named()
            .and_then(|named| router.resolve(named))
        {
            Some(account)
                if visibility::sees(&self.ctx, &self.peer.account, &self.identity, &account)
                    .await =>
            {
                router.status(&account)
            }
            _ => Status::offline(None),
        };
        self.answer(status.frame(username)).await
    }

    /// WatchPresence (`docs/protocol.md#presence`, `presence_watch_v1`): each newly watched
    /// identifier gets its status at once and on every change of its `online` value until unwatched
    /// or the connection ends. Already watched identifiers (and repeats within the list) are left
    /// alone. New identifiers past the cap are not added and the frame is answered
    /// `limit_exceeded`. Resolved and answered from memory (router.rs), in order with bindings.
    async fn watch_presence(&mut self, users: Vec<String>) -> Flow {
        if !watch_list_ok(&users) {
            return self
                .answer(error_frame("invalid_frame", "WatchPresence", None))
                .await;
        }
        let watchlist = &self.peer.watchlist;
        // Only this reader adds watches, so the room cannot shrink before `watch` below.
        let room = MAX_WATCHES.saturating_sub(watchlist.len());
        let mut listed = HashSet::new();
        let mut fresh = Vec::new();
        let mut over_cap = false;
        for identifier in users {
            if watchlist.contains(&identifier) || listed.contains(&identifier) {
                continue;
            }
            if fresh.len() == room {
                over_cap = true;
                break;
            }
            listed.insert(identifier.clone());
            fresh.push(identifier);
        }
        let targets = fresh
            .into_iter()
            .map(|identifier| {
                let named = resolve_recipient(&identifier).named();
                (identifier, named)
            })
            .collect();
        let sees = Sees::of(&self.ctx, &self.peer.account, &self.identity).await;
        let sees_account = |account: &str| sees.account(&self.ctx, account);
        let sight = match sees {
            Sees::Everyone => Sight::Everyone,
            Sees::Contacts { .. } => Sight::Only(&sees_account),
        };
        self.ctx.router.watch(watchlist, targets, sight);
        if over_cap {
            return self
                .answer(error_frame("limit_exceeded", "WatchPresence", None))
                .await;
        }
        Flow::Continue
    }

    /// UnwatchPresence (`docs/protocol.md#presence`): nothing more is sent for these identifiers;
    /// ones not watched are ignored. Never answered unless invalid.
    async fn unwatch_presence(&mut self, users: &[String]) -> Flow {
        if !watch_list_ok(users) {
            return self
                .answer(error_frame("invalid_frame", "UnwatchPresence", None))
                .await;
        }
        self.ctx.router.unwatch(&self.peer.watchlist, users);
        Flow::Continue
    }

    /// The envelope this connection's SendMessage becomes: stamped now, with this identity.
    pub fn envelope(
        &self,
        message_id: String,
        content: String,
        reply_to_msg: Option<String>,
    ) -> Envelope {
        Envelope {
            seq: None,
            sender: self.identity.clone(),
            sender_account: self.peer.account.clone(),
            message_id,
            content: content.into(),
            reply_to_msg,
            accepted_ms: crate::now_ms(),
            group: None,
        }
    }

    /// Whom this connection acts as in groups, as of now.
    pub fn actor(&self) -> Actor {
        Actor {
            identity: self.identity.clone(),
            account: self.peer.account.clone(),
        }
    }

    /// Where a group report for this connection goes (`fanout.rs`).
    pub fn report_to(&self) -> ReportTo {
        ReportTo {
            account: self.peer.account.clone(),
            connection: self.peer.id,
            out: self.out.downgrade(),
        }
    }
}
