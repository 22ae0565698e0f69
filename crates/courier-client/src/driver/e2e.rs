//! End-to-end sessions in the driver (`docs/delivery.md#sealed-messages`,
//! `docs/protocol.md#session-setup`): sealing a step's frames before its commit, opening sealed
//! copies before the engine sees them, and setting sessions up — through the relay's key-package
//! directory, else by the round trip through the peer. The session state each of these changes
//! is committed in the transaction of the step that changed it, and nothing that depends on it
//! leaves before that commit.

use std::collections::{BTreeMap, BTreeSet};

use courier_crypto::{code, Joined, SessionError, Sessions};
use courier_engine::step::Step;
use courier_engine::{Carrier, Engine, InboundOrigin, Input, Millis, Transmit, TransmitKind};
use courier_proto::message::META_GROUP_MESSAGE;
use courier_proto::{
    envelope, is_signature_gated, open_envelope, sealed_payload, sign_control, Address,
    ClientFrame, ContentType, IdentityKey, KeyPackage, KeyPackageBatch, Message, SessionFrame,
};

use super::connections::Connections;
use super::host::send_message;
use super::media::Media;
use super::mint_id;
use crate::event::ClientEvent;

/// One-time key packages the driver keeps published in the relay's directory.
const PUBLISHED_TARGET: u32 = 10;

/// A frame as the driver puts it on a carrier.
pub enum Frame {
    /// An engine transmit, its message sealed when it travels in a session.
    Engine(Transmit),
    /// A Welcome ahead of the first messages of a session this device started: sent as it is,
    /// with no answer awaited (the messages behind it carry it again until the peer answers).
    Welcome { carrier: Carrier, message: Message },
}

impl Frame {
    /// An engine transmit that travels unsealed: its message says so (`encrypted: false`,
    /// `docs/protocol.md#message-json`).
    pub fn clear(mut transmit: Transmit) -> Self {
        if let TransmitKind::Outbox { message, .. } | TransmitKind::DeliveryAck { message } =
            &mut transmit.kind
        {
            message.encrypted = Some(false);
        }
        Self::Engine(transmit)
    }
}

/// What the relay said about session setup: whether it is connected and offers its key-package
/// directory, and the directory's answers.
#[derive(Debug)]
pub enum DirectoryReport {
    /// A relay connection came up; `directory` when it offers `key_directory_v1` to this device.
    Connected {
        directory: bool,
    },
    Disconnected,
    Published {
        available: u32,
        last_resort: bool,
    },
    Package {
        address: Address,
        package: Vec<u8>,
    },
    Unavailable {
        address: Address,
    },
}

pub struct E2e {
    sessions: Sessions,
    identity: IdentityKey,
    app_id: String,
    /// Peers the engine wants a session with and that have none yet.
    wanted: BTreeSet<Address>,
    /// The key package each peer was asked with by the round trip, sent again when asking again:
    /// one private half kept per waited-for peer, however often it is asked (the peer answers a
    /// repeat with the same Welcome).
    asked_with: BTreeMap<Address, Vec<u8>>,
    /// `Some` while a relay is connected: whether it offers the directory.
    directory: Option<bool>,
    /// Frames for the relay, sent once the step that prepared them is committed: directory
    /// requests, and key packages and Welcomes sent on their own.
    outgoing: Vec<ClientFrame>,
    /// Welcomes sent on their own after the commit, by peer: a session replaced in the same step
    /// (this device joined the peer's, which won the tie) takes its Welcome back, so the peer
    /// never reads a Welcome of a session that is gone after a message of the one that stands.
    welcomes: BTreeMap<Address, Message>,
    /// Key packages a group change waits for, by how many answers are owed
    /// (`docs/protocol.md#group-messages`).
    group_asks: BTreeMap<Address, u32>,
}

/// The directory's answer to a group change's ask: a key package of `address`, or none.
pub struct GroupPackage {
    pub address: Address,
    pub package: Option<Vec<u8>>,
}

impl E2e {
    pub fn new(sessions: Sessions, identity: IdentityKey, app_id: String) -> Self {
        Self {
            sessions,
            identity,
            app_id,
            wanted: BTreeSet::new(),
            asked_with: BTreeMap::new(),
            directory: None,
            outgoing: Vec::new(),
            welcomes: BTreeMap::new(),
            group_asks: BTreeMap::new(),
        }
    }

    /// The MLS state, for the groups it also holds.
    pub fn sessions_mut(&mut self) -> &mut Sessions {
        &mut self.sessions
    }

    /// Asks the relay's directory for a key package of each of `members`, for a group change;
    /// false when no relay offering the directory is connected.
    pub fn fetch_for_group(&mut self, members: &BTreeSet<Address>) -> bool {
        if self.directory != Some(true) {
            return false;
        }
        for member in members {
            *self.group_asks.entry(*member).or_default() += 1;
            self.outgoing
                .push(ClientFrame::FetchKeyPackage { address: *member });
        }
        true
    }

    /// Whether the directory's answer for `address` is owed to a group change (and is now paid).
    fn for_group(&mut self, address: &Address) -> bool {
        let Some(owed) = self.group_asks.get_mut(address) else {
            return false;
        };
        *owed -= 1;
        if *owed == 0 {
            self.group_asks.remove(address);
        }
        true
    }

    /// The peers with a session: the engine hears they are ready at start.
    pub fn ready(&self) -> Vec<String> {
        self.sessions.peers().map(ToString::to_string).collect()
    }

    /// The session state the step changed, to commit with it.
    pub fn changes(&self) -> Vec<courier_crypto::Change> {
        self.sessions.changes()
    }

    /// The step's transaction is durable: its session state is the committed one.
    pub fn committed(&mut self) {
        self.sessions.committed();
    }

    pub fn rollback(&mut self) -> Result<(), SessionError> {
        self.outgoing.clear();
        self.welcomes.clear();
        // Their private halves may be what the failed step made.
        self.asked_with.clear();
        self.sessions.rollback()
    }

    /// Seals the step's frames: each outbox message and each delivery ACK for a peer with a
    /// session, a Welcome ahead of the first message of a session the peer has not used yet. A
    /// message that cannot be sealed is not sent; `failed` gets the input that says so.
    pub fn seal(
        &mut self,
        transmits: Vec<Transmit>,
        now: Millis,
        failed: &mut Vec<Input>,
    ) -> Vec<Frame> {
        let mut frames = Vec::with_capacity(transmits.len());
        let mut welcomed = BTreeSet::new();
        for mut transmit in transmits {
            let (message, send_seq) = match &mut transmit.kind {
                TransmitKind::Outbox { message, send_seq } => (message, Some(*send_seq)),
                TransmitKind::DeliveryAck { message } => (message, None),
                // Sealed already, once for the whole group.
                TransmitKind::ReleaseFrame { .. } | TransmitKind::GroupBroadcast { .. } => {
                    frames.push(Frame::Engine(transmit));
                    continue;
                }
            };
            if message.metadata.contains_key(META_GROUP_MESSAGE) {
                // A group message's copy carries the group's ciphertext: never sealed again,
                // never waiting for a session (`docs/delivery.md#group-sends`).
                frames.push(Frame::Engine(transmit));
                continue;
            }
            if is_signature_gated(&message.content) {
                // A signed control frame (a connection request, an answer to one) is what comes
                // before a session; its signature is its authentication.
                frames.push(Frame::Engine(transmit));
                continue;
            }
            let peer = Address::parse(&message.recipient).ok();
            let Some(peer) = peer.filter(|p| self.sessions.has_session(p)) else {
                if let Some(send_seq) = send_seq {
                    // Only entries whose recipient has a session leave the outbox.
                    failed.push(Input::SendFailed {
                        id: message.id.clone(),
                        send_seq,
                        reason: "no end-to-end session with the recipient".into(),
                    });
                    continue;
                }
                // An ACK to a peer without a session acknowledges a message that came in the
                // clear (a connection request, say): it goes back the same way, signed, since
                // only the recipient may settle (`docs/delivery.md#ack-attribution`).
                sign_control(message, &self.identity, now);
                frames.push(Frame::clear(transmit));
                continue;
            };
            if send_seq.is_some() && welcomed.insert(peer) {
                if let Some(welcome) = self.sessions.welcome_for(&peer) {
                    let message = self.welcome_frame(peer, welcome, now);
                    frames.push(Frame::Welcome {
                        carrier: transmit.carrier.clone(),
                        message,
                    });
                }
            }
            match self.sessions.seal(&peer, message.encode().as_bytes()) {
                Ok(sealed) => {
                    let me = self.sessions.address();
                    *message = envelope(message, &me, &sealed);
                    frames.push(Frame::Engine(transmit));
                }
                Err(e) => {
                    if let Some(send_seq) = send_seq {
                        failed.push(Input::SendFailed {
                            id: message.id.clone(),
                            send_seq,
                            reason: format!("cannot seal for {peer}: {e}"),
                        });
                    }
                }
            }
        }
        frames
    }

    fn welcome_frame(&self, peer: Address, welcome: &[u8], now: Millis) -> Message {
        self.session_frame(SessionFrame::Welcome, peer, welcome, now)
    }

    /// A signed session frame for `peer`, under a fresh id.
    fn session_frame(
        &self,
        kind: SessionFrame,
        peer: Address,
        bytes: &[u8],
        now: Millis,
    ) -> Message {
        let id = mint_id();
        let me = self.sessions.address();
        let mut message = kind.message(id, &self.app_id, &me, &peer, bytes, now);
        sign_control(&mut message, &self.identity, now);
        message
    }

    /// The frames for the relay that the committed step prepared.
    pub fn take_outgoing(&mut self) -> Vec<ClientFrame> {
        let welcomes = std::mem::take(&mut self.welcomes);
        let mut frames = std::mem::take(&mut self.outgoing);
        frames.extend(welcomes.values().map(send_message));
        frames
    }

    /// `message` as a frame for the relay after the commit, sent once.
    fn send_after_commit(&mut self, message: &Message) {
        self.outgoing.push(send_message(message));
    }

    /// The round trip (`docs/protocol.md#session-setup`): a key package of this device to
    /// `peer`, which starts the session and answers with its Welcome.
    fn ask_peer(&mut self, peer: Address, now: Millis) -> Result<(), String> {
        let package = match self.asked_with.get(&peer) {
            Some(package) => package.clone(),
            None => {
                let package = self
                    .sessions
                    .key_package(false)
                    .map_err(|e| e.to_string())?;
                self.asked_with.insert(peer, package.clone());
                package
            }
        };
        let message = self.session_frame(SessionFrame::KeyPackage, peer, &package, now);
        self.send_after_commit(&message);
        Ok(())
    }

    /// An inbound message for the engine: a sealed copy is opened first, and what the engine
    /// does not keep of it leaves the session as it was.
    #[allow(clippy::too_many_arguments)]
    pub fn inbound(
        &mut self,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        connections: &mut Connections,
        media: &mut Media,
        message: Message,
        origin: InboundOrigin,
        now: Millis,
    ) {
        if matches!(origin.carrier, Carrier::Local(_))
            && message.recipient != self.sessions.address().to_string()
        {
            // A copy a neighbor carries for another device: not this device's to open, and the
            // engine only notes the neighbor (`docs/delivery.md#carried-copies`).
            step.apply(engine, inbound(message, origin), now);
            return;
        }
        let Some(payload) = sealed_payload(&message) else {
            connections.deliver(engine, step, message, origin, now);
            return;
        };
        let undecryptable =
            |origin, code, reason| Input::undecryptable(&message, origin, code, reason);
        let (from, sealed) = match payload {
            Ok(payload) => payload,
            Err(e) => {
                let input = undecryptable(origin, code::MALFORMED, e.to_string());
                step.apply(engine, input, now);
                return;
            }
        };
        let sealer = from.to_string();
        let origin = InboundOrigin {
            sealed_by: Some(sealer.clone()),
            ..origin
        };
        if engine.knows_inbound(&sealer, &message.id, now) {
            // Already processed or buffered: its ratchet step is spent, and the engine only
            // needs the id to acknowledge it again.
            step.apply(engine, inbound(message.clone(), origin), now);
            return;
        }
        let mut unopened = None;
        let mut held = None;
        let opened = self.sessions.open_if(&from, &sealed, |plaintext| {
            match open_envelope(&message, &plaintext) {
                Ok(inner) => {
                    held = connections.screen(&inner, &sealer, &origin, engine, step, now);
                    if held.is_some() {
                        // Not taken: the session stays as it was, to open the copy sent again.
                        return false;
                    }
                    let (id, sender) = (inner.id.clone(), inner.sender.clone());
                    let ack = inner.ack_for().is_some();
                    if inner.content_type == ContentType::FileChunk {
                        // Its bytes are written before the engine acknowledges it; a refused
                        // chunk is not, and the sender's retry is sealed anew.
                        let input = match media.receive(&inner, &sealer, engine, step, now) {
                            Ok(()) => inbound(inner, origin.clone()),
                            Err(reason) => Input::Discard {
                                origin: origin.clone(),
                                reason,
                            },
                        };
                        step.apply(engine, input, now);
                        return true;
                    }
                    step.apply(engine, inbound(inner, origin.clone()), now);
                    // An ACK is never redelivered for another try; a data message is kept
                    // when it was processed or buffered.
                    ack || engine.knows_inbound(&sender, &id, now)
                }
                Err(e) => {
                    unopened = Some((code::MALFORMED, e.to_string()));
                    false
                }
            }
        });
        match opened {
            Err(SessionError::Spent(_)) => {
                let reason = format!(
                    "dropped {} from {sealer}: a repeat of a sealed message already opened",
                    message.id
                );
                step.apply(engine, Input::Discard { origin, reason }, now);
                return;
            }
            Err(e) => unopened = Some((e.code(), e.to_string())),
            Ok(_) => {}
        }
        if let Some(held) = held {
            step.apply(engine, held, now);
        } else if let Some((code, reason)) = unopened {
            step.apply(engine, undecryptable(origin, code, reason), now);
        }
    }

    /// A verified control frame the engine handed over: a Welcome joins its session; a key
    /// package starts one, which is ready at once, and its Welcome goes back on its own.
    pub fn control(
        &mut self,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        message: Message,
        now: Millis,
    ) {
        let Some((kind, bytes)) = SessionFrame::parse(&message.content) else {
            return;
        };
        let ready = Address::parse(&message.sender)
            .map_err(|e| e.to_string())
            .and_then(|from| {
                let bytes = bytes.map_err(|e| e.to_string())?;
                match kind {
                    SessionFrame::Welcome => {
                        let joined = self
                            .sessions
                            .join(from, &bytes)
                            .map_err(|e| e.to_string())?;
                        match joined {
                            Joined::Joined => {
                                self.welcomes.remove(&from);
                            }
                            // The peer is in a session that lost the tie to ours: it needs our
                            // Welcome, which otherwise only rides ahead of messages we may never
                            // send it.
                            Joined::KeptOurs => {
                                if let Some(welcome) = self.sessions.welcome_for(&from) {
                                    let frame = self.welcome_frame(from, welcome, now);
                                    self.welcomes.insert(from, frame);
                                }
                            }
                            Joined::Already => {}
                        }
                        Ok((joined == Joined::Joined).then_some(from))
                    }
                    SessionFrame::KeyPackage => {
                        // The peer asked again (it came online, or reconnected) before it used
                        // the session its first ask started: the same Welcome answers it. A
                        // second session would only race the first.
                        if let Some(welcome) = self.sessions.welcome_for(&from) {
                            let frame = self.welcome_frame(from, welcome, now);
                            self.welcomes.insert(from, frame);
                            return Ok(None);
                        }
                        // Any other session with the peer is one it has joined or started since
                        // it asked: the ask is stale, and a new session would part the two ways.
                        if self.sessions.has_session(&from) {
                            return Ok(None);
                        }
                        let welcome = self
                            .sessions
                            .start(from, &bytes)
                            .map_err(|e| e.to_string())?;
                        let frame = self.welcome_frame(from, &welcome, now);
                        self.welcomes.insert(from, frame);
                        Ok(Some(from))
                    }
                }
            });
        match ready {
            Ok(Some(peer)) => self.session_ready(engine, step, peer, now),
            Ok(None) => {}
            Err(reason) => self.warn(
                engine,
                step,
                format!(
                    "{} {} from {} not used: {reason}",
                    kind.prefix(),
                    message.id,
                    message.sender
                ),
            ),
        }
    }

    /// A key package for a connection request: accepting it starts the session
    /// (`docs/delivery.md#connection-requests`).
    pub fn request_key_package(&mut self) -> Result<Vec<u8>, SessionError> {
        self.sessions.key_package(false)
    }

    /// Accepting a connection request: the session starts from the request's key package, and
    /// is ready at once; returns its Welcome for the acceptance to carry. `None` when a session
    /// with the peer exists already.
    pub fn start_for_request(
        &mut self,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        peer: Address,
        package: &[u8],
        now: Millis,
    ) -> Result<Option<Vec<u8>>, SessionError> {
        if self.sessions.has_session(&peer) {
            return Ok(None);
        }
        let welcome = self.sessions.start(peer, package)?;
        self.session_ready(engine, step, peer, now);
        Ok(Some(welcome))
    }

    /// The Welcome an acceptance of this device's request carried.
    pub fn join_from_acceptance(
        &mut self,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        from: Address,
        welcome: &[u8],
        now: Millis,
    ) {
        match self.sessions.join(from, welcome) {
            Ok(Joined::Joined) => {
                self.welcomes.remove(&from);
                self.session_ready(engine, step, from, now);
            }
            // Already in it, or our own session with the peer won the tie: nothing to join.
            Ok(Joined::Already | Joined::KeptOurs) => {}
            Err(e) => self.warn(
                engine,
                step,
                format!("the Welcome in {from}'s acceptance is not usable: {e}"),
            ),
        }
    }

    /// A session with `peer` exists: what waited for it goes.
    fn session_ready(
        &mut self,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        peer: Address,
        now: Millis,
    ) {
        self.wanted.remove(&peer);
        self.asked_with.remove(&peer);
        let ready = Input::SessionReady {
            recipient: peer.to_string(),
        };
        step.apply(engine, ready, now);
    }

    /// The engine wants a session with `recipient` — for the first time, or again because it
    /// came online: fetched from the relay's directory, else asked of the peer; when no relay is
    /// connected, once one is.
    pub fn want(
        &mut self,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        recipient: &str,
        now: Millis,
    ) {
        let Ok(peer) = Address::parse(recipient) else {
            return;
        };
        self.wanted.insert(peer);
        self.set_up(engine, step, peer, now);
    }

    fn set_up(
        &mut self,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        peer: Address,
        now: Millis,
    ) {
        match self.directory {
            None => {}
            Some(true) => self
                .outgoing
                .push(ClientFrame::FetchKeyPackage { address: peer }),
            Some(false) => {
                if let Err(e) = self.ask_peer(peer, now) {
                    self.warn(
                        engine,
                        step,
                        format!("cannot make a key package for {peer}: {e}"),
                    );
                }
            }
        }
    }

    /// What the relay's directory said; an answer a group change waits for is handed back.
    pub fn directory(
        &mut self,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        report: DirectoryReport,
        now: Millis,
    ) -> Option<GroupPackage> {
        match report {
            DirectoryReport::Connected { directory } => {
                self.directory = Some(directory);
                if directory {
                    // What the relay holds for this device, to top it up.
                    self.outgoing.push(ClientFrame::PublishKeyPackages {
                        packages: KeyPackageBatch::default(),
                        last_resort: None,
                    });
                }
                // Every peer still waited on, again: an answer may have been lost.
                let wanted: Vec<Address> = self.wanted.iter().copied().collect();
                for peer in wanted {
                    self.set_up(engine, step, peer, now);
                }
            }
            DirectoryReport::Disconnected => {
                self.directory = None;
                self.group_asks.clear();
            }
            DirectoryReport::Published {
                available,
                last_resort,
            } => {
                let missing = PUBLISHED_TARGET.saturating_sub(available);
                let text = format!(
                    "the relay's directory holds {available} one-time key packages of this \
                     device{}; publishing {missing} more",
                    if last_resort {
                        " and a last-resort one"
                    } else {
                        ""
                    }
                );
                self.log(engine, step, courier_engine::DiagnosticLevel::Info, text);
                if missing == 0 && last_resort {
                    return None;
                }
                match self.publish(missing, !last_resort) {
                    Ok(frame) => self.outgoing.push(frame),
                    Err(e) => self.warn(engine, step, format!("cannot make key packages: {e}")),
                }
            }
            DirectoryReport::Package { address, package } => {
                if self.for_group(&address) {
                    return Some(GroupPackage {
                        address,
                        package: Some(package),
                    });
                }
                if !self.wanted.contains(&address) {
                    return None;
                }
                match self.sessions.start(address, &package) {
                    Ok(_) => self.session_ready(engine, step, address, now),
                    Err(e) => self.warn(
                        engine,
                        step,
                        format!("the directory's key package for {address} is not usable: {e}"),
                    ),
                }
            }
            DirectoryReport::Unavailable { address } => {
                if self.for_group(&address) {
                    return Some(GroupPackage {
                        address,
                        package: None,
                    });
                }
                if !self.wanted.contains(&address) {
                    return None;
                }
                // Nothing published: the round trip through the peer, when it next reads.
                let text = format!(
                    "the relay's directory holds no key package for {address}: asking the peer"
                );
                self.log(engine, step, courier_engine::DiagnosticLevel::Info, text);
                if let Err(e) = self.ask_peer(address, now) {
                    self.warn(
                        engine,
                        step,
                        format!("cannot make a key package for {address}: {e}"),
                    );
                }
            }
        }
        None
    }

    fn publish(&mut self, one_time: u32, last_resort: bool) -> Result<ClientFrame, String> {
        let package = |sessions: &mut Sessions, last_resort| {
            let bytes = sessions
                .key_package(last_resort)
                .map_err(|e| e.to_string())?;
            KeyPackage::new(bytes).map_err(|e| e.to_string())
        };
        let packages = (0..one_time)
            .map(|_| package(&mut self.sessions, false))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ClientFrame::PublishKeyPackages {
            packages: KeyPackageBatch::new(packages).map_err(|e| e.to_string())?,
            last_resort: if last_resort {
                Some(package(&mut self.sessions, true)?)
            } else {
                None
            },
        })
    }

    fn warn(&self, engine: &mut Engine, step: &mut Step<ClientEvent>, message: String) {
        self.log(engine, step, courier_engine::DiagnosticLevel::Warn, message);
    }

    fn log(
        &self,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        level: courier_engine::DiagnosticLevel,
        message: String,
    ) {
        step.emit(
            engine,
            ClientEvent::Diagnostic {
                level,
                message,
                target: "courier_client::e2e",
            },
        );
    }
}

fn inbound(message: Message, origin: InboundOrigin) -> Input {
    Input::Inbound {
        message: Box::new(message),
        origin,
    }
}
