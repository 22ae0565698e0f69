//! The driver's end-to-end layer, modelled on `courier-client`'s `driver/e2e.rs`
//! (`docs/delivery.md#sealed-messages`, `docs/protocol.md#session-setup`) with real MLS sessions
//! (`courier_crypto::Sessions`): a step's frames are sealed in the prepare stage, before its
//! commit, with a Welcome ahead of the messages of a session the peer has not used yet; a sealed
//! copy is opened before the engine sees it and kept only when the engine keeps the message;
//! sessions are set up through the relay's key-package directory, else by the round trip through
//! the peer, with signed session frames. The session rows a step changed commit with it (see
//! `driver::StepHost::commit`), and the frames for the relay leave only once the step is carried
//! out, so a crash anywhere in the step loses them together with the state they came from.
//!
//! The oracle learns what each envelope holds when it is sealed (`Ledger::on_sealed`): no device
//! can look inside one twice.

use std::collections::{BTreeMap, BTreeSet};

use courier_crypto::{code, Joined, SessionError, Sessions};
use courier_engine::step::Step;
use courier_engine::DiagnosticLevel;
use courier_proto::{
    envelope, open_envelope, sealed_payload, sign_control, wire_id, Address, IdentityKey,
    SessionFrame,
};

use crate::relay::Held;

use super::groups::is_copy;
use super::*;

/// One-time key packages the driver keeps published in the relay's directory.
const PUBLISHED_TARGET: u32 = 10;

/// One running device's sessions and what the driver remembers about setting them up.
pub struct E2e {
    sessions: Sessions,
    identity: IdentityKey,
    app_id: String,
    /// Peers the engine wants a session with and that have none yet.
    wanted: BTreeSet<Address>,
    /// The key package each peer was asked with by the round trip, sent again when asking again.
    asked_with: BTreeMap<Address, Vec<u8>>,
    /// `Some` while a relay is connected: whether it offers the directory.
    directory: Option<bool>,
    /// Frames for the relay, sent once the step that prepared them is carried out: directory
    /// requests, and key packages and Welcomes sent on their own.
    pub(super) outgoing: Vec<ToRelay>,
    /// Welcomes sent on their own, by peer: joining the peer's session in the same step takes
    /// the replaced session's Welcome back.
    welcomes: BTreeMap<Address, ToRelay>,
}

impl E2e {
    /// The device's sessions as its store last committed them.
    pub fn restore(identity: IdentityKey, store: &Store, app_id: &str) -> Self {
        let sessions =
            Sessions::restore(identity.clone(), store.load_sessions()).unwrap_or_else(|e| {
                violated(format!("the committed session state does not load: {e}"))
            });
        Self {
            sessions,
            identity,
            app_id: app_id.to_owned(),
            wanted: BTreeSet::new(),
            asked_with: BTreeMap::new(),
            directory: None,
            outgoing: Vec::new(),
            welcomes: BTreeMap::new(),
        }
    }

    /// The frames for the relay that the carried-out step prepared.
    pub(super) fn take_outgoing(&mut self) -> Vec<ToRelay> {
        let welcomes = std::mem::take(&mut self.welcomes);
        let mut frames = std::mem::take(&mut self.outgoing);
        frames.extend(welcomes.into_values());
        frames
    }

    /// The peers with a session: the engine hears they are ready at start.
    pub fn ready(&self) -> Vec<String> {
        self.sessions.peers().map(ToString::to_string).collect()
    }

    /// The session rows the step changed, to commit with it; then they are the committed ones.
    pub(super) fn commit(&mut self) -> Vec<courier_crypto::Change> {
        self.sessions.commit()
    }
}

/// What the relay said about session setup (the client's `DirectoryReport`).
#[derive(Debug)]
pub enum DirectoryReport {
    /// A relay connection came up; `directory` when it offers the key-package directory.
    Connected {
        directory: bool,
    },
    Disconnected,
    Published(Held),
    Package {
        address: String,
        package: Vec<u8>,
    },
    Unavailable {
        address: String,
    },
}

/// A frame as the driver puts it on a carrier.
#[derive(Debug)]
pub(super) enum Frame {
    /// An engine transmit, its message sealed when it travels in a session.
    Engine(Transmit),
    /// A Welcome ahead of the first messages of a session this device started: sent once, with
    /// no answer awaited (the messages behind it carry it again until the peer answers).
    Welcome { carrier: Carrier, message: Message },
}

impl World {
    /// The prepare stage: each outbox message and delivery ACK for a peer with a session is
    /// sealed, a Welcome ahead of the first message of a session the peer has not used yet. A
    /// message that cannot be sealed is not sent; `failed` gets the input that says so.
    pub(super) fn seal(
        &mut self,
        p: usize,
        e2e: &mut E2e,
        transmits: Vec<Transmit>,
        failed: &mut Vec<Input>,
    ) -> Vec<Frame> {
        let mut frames = Vec::with_capacity(transmits.len());
        let mut welcomed = BTreeSet::new();
        let me = e2e.sessions.address();
        for mut transmit in transmits {
            let (message, send_seq) = match &mut transmit.kind {
                TransmitKind::Outbox { message, send_seq } => (message, Some(*send_seq)),
                TransmitKind::DeliveryAck { message } => (message, None),
                // A broadcast is sealed already, once for the whole group.
                TransmitKind::ReleaseFrame { .. } | TransmitKind::GroupBroadcast { .. } => {
                    frames.push(Frame::Engine(transmit));
                    continue;
                }
            };
            if is_copy(message) {
                // A group message's copy carries the group's ciphertext: never sealed again,
                // never waiting for a session (`docs/delivery.md#group-sends`).
                frames.push(Frame::Engine(transmit));
                continue;
            }
            let peer = Address::parse(&message.recipient).ok();
            let Some(peer) = peer.filter(|p| e2e.sessions.has_session(p)) else {
                if let Some(send_seq) = send_seq {
                    // Only entries whose recipient has a session leave the outbox.
                    self.counts.seal_failures += 1;
                    failed.push(Input::SendFailed {
                        id: message.id.clone(),
                        send_seq,
                        reason: "no end-to-end session with the recipient".into(),
                    });
                    continue;
                }
                // An ACK to a peer without a session acknowledges a message that came in the
                // clear (a group copy, say): it goes back the same way, signed, since only the
                // recipient may settle (`docs/delivery.md#ack-attribution`).
                sign_control(message, &e2e.identity, self.now);
                frames.push(Frame::Engine(transmit));
                continue;
            };
            if send_seq.is_some() && welcomed.insert(peer) {
                if let Some(welcome) = e2e.sessions.welcome_for(&peer).map(<[u8]>::to_vec) {
                    let message = self.session_frame(p, e2e, SessionFrame::Welcome, peer, &welcome);
                    self.counts.welcomes_sent += 1;
                    frames.push(Frame::Welcome {
                        carrier: transmit.carrier.clone(),
                        message,
                    });
                }
            }
            match e2e.sessions.seal(&peer, message.encode().as_bytes()) {
                Ok(sealed) => {
                    self.ledger.on_sealed(&me.to_string(), message);
                    self.counts.sealed += 1;
                    *message = envelope(message, &me, &sealed);
                    frames.push(Frame::Engine(transmit));
                }
                Err(e) => {
                    self.counts.seal_failures += 1;
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

    /// A signed session frame of device `p` for `peer`, under a fresh id (deterministic here,
    /// where the client mints a random one).
    fn session_frame(
        &mut self,
        p: usize,
        e2e: &E2e,
        kind: SessionFrame,
        peer: Address,
        bytes: &[u8],
    ) -> Message {
        self.next_frame += 1;
        let id = wire_id(&format!(
            "{}-{}-{}",
            self.peers[p].spec.alias,
            kind.prefix(),
            self.next_frame
        ));
        let me = e2e.sessions.address();
        let mut message = kind.message(id, &e2e.app_id, &me, &peer, bytes, self.now);
        sign_control(&mut message, &e2e.identity, self.now);
        message
    }

    /// An inbound message for the engine: a sealed copy is opened first, and what the engine
    /// does not keep of it leaves the session as it was.
    pub(super) fn open(
        &mut self,
        p: usize,
        e2e: &mut E2e,
        engine: &mut Engine,
        step: &mut Step<AppEvent>,
        message: Message,
        origin: InboundOrigin,
    ) {
        let now = self.now;
        if matches!(origin.carrier, courier_engine::Carrier::Local(_))
            && message.recipient != e2e.sessions.address().to_string()
        {
            // A copy a neighbor carries for another device: not this device's to open.
            step.apply(engine, inbound(message, origin), now);
            return;
        }
        let Some(payload) = sealed_payload(&message) else {
            step.apply(engine, inbound(message, origin), now);
            return;
        };
        let (from, sealed) = match payload {
            Ok(payload) => payload,
            Err(e) => {
                self.unopened(p, &origin);
                let input = Input::undecryptable(&message, origin, code::MALFORMED, e.to_string());
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
            self.counts.copies_known += 1;
            step.apply(engine, inbound(message, origin), now);
            return;
        }
        let mut unopened = None;
        let opened = e2e.sessions.open_if(&from, &sealed, |plaintext| {
            match open_envelope(&message, &plaintext) {
                Ok(inner) => {
                    let (id, sender) = (inner.id.clone(), inner.sender.clone());
                    let ack = inner.ack_for().is_some();
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
            Ok(true) => self.counts.opened += 1,
            Ok(false) => self.counts.opened_not_kept += 1,
            Err(SessionError::Spent(_)) => {
                self.counts.replays_discarded += 1;
                self.unopened(p, &origin);
                let reason = format!(
                    "dropped {} from {sealer}: a repeat of a sealed message already opened",
                    message.id
                );
                step.apply(engine, Input::Discard { origin, reason }, now);
                return;
            }
            Err(e) => unopened = Some((e.code(), e.to_string())),
        }
        if let Some((code, reason)) = unopened {
            self.unopened(p, &origin);
            step.apply(
                engine,
                Input::undecryptable(&message, origin, code, reason),
                now,
            );
        }
    }

    /// The relay frame behind `origin` is released unprocessed: the oracle allows its release.
    fn unopened(&mut self, p: usize, origin: &InboundOrigin) {
        if let (Carrier::Relay, Some(seq)) = (&origin.carrier, origin.seq) {
            let name = self.peers[p].name().to_owned();
            self.ledger.on_unopened(&name, seq);
        }
    }

    /// A verified control frame the engine handed over: a Welcome joins its session; a key
    /// package starts one, which is ready at once, and its Welcome goes back on its own.
    pub(super) fn control(
        &mut self,
        p: usize,
        e2e: &mut E2e,
        engine: &mut Engine,
        step: &mut Step<AppEvent>,
        message: Message,
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
                        let joined = e2e.sessions.join(from, &bytes).map_err(|e| e.to_string())?;
                        match joined {
                            Joined::Joined => {
                                e2e.welcomes.remove(&from);
                            }
                            // The peer needs the winner's Welcome, which otherwise only rides
                            // ahead of messages the winner may never send it.
                            Joined::KeptOurs => {
                                if let Some(welcome) =
                                    e2e.sessions.welcome_for(&from).map(<[u8]>::to_vec)
                                {
                                    let frame = self.session_frame(
                                        p,
                                        e2e,
                                        SessionFrame::Welcome,
                                        from,
                                        &welcome,
                                    );
                                    self.counts.welcomes_sent += 1;
                                    e2e.welcomes.insert(from, send_once(frame));
                                }
                            }
                            Joined::Already => {}
                        }
                        match joined {
                            Joined::Joined => self.counts.sessions_joined += 1,
                            Joined::KeptOurs => self.counts.welcomes_outranked += 1,
                            Joined::Already => self.counts.welcomes_repeated += 1,
                        }
                        if joined == Joined::Joined && !self.holds_welcome(from, p, &bytes) {
                            // The sender no longer has the session this Welcome creates: it
                            // replaced it, or joined ours. The two sides now part ways unless a
                            // newer Welcome of the sender's follows.
                            self.counts.stale_welcomes_joined += 1;
                            self.trace(|w| {
                                let me = w.peers[p].name();
                                format!("{me} joined a stale welcome {} from {from}", message.id)
                            });
                        }
                        if joined != Joined::Already {
                            let me = self.peers[p].name().to_owned();
                            let outranked = joined == Joined::KeptOurs;
                            self.ledger
                                .on_welcome(&me, &from.to_string(), outranked, self.now);
                        }
                        self.trace(|w| {
                            let me = w.peers[p].name();
                            format!("{me} welcome {} from {from}: {joined:?}", message.id)
                        });
                        Ok((joined == Joined::Joined).then_some(from))
                    }
                    SessionFrame::KeyPackage => {
                        // Asked again before the peer used the session its first ask started:
                        // the same Welcome answers it.
                        if let Some(welcome) = e2e.sessions.welcome_for(&from).map(<[u8]>::to_vec) {
                            let frame =
                                self.session_frame(p, e2e, SessionFrame::Welcome, from, &welcome);
                            self.counts.welcomes_sent += 1;
                            e2e.welcomes.insert(from, send_once(frame));
                            return Ok(None);
                        }
                        // A session the peer joined or started since it asked: a stale ask.
                        if e2e.sessions.has_session(&from) {
                            return Ok(None);
                        }
                        let welcome = e2e
                            .sessions
                            .start(from, &bytes)
                            .map_err(|e| e.to_string())?;
                        self.counts.sessions_started += 1;
                        self.counts.round_trip_setups += 1;
                        self.trace(|w| {
                            let me = w.peers[p].name();
                            format!(
                                "{me} starts a session with {from} from key package {}",
                                message.id
                            )
                        });
                        let frame =
                            self.session_frame(p, e2e, SessionFrame::Welcome, from, &welcome);
                        self.counts.welcomes_sent += 1;
                        e2e.welcomes.insert(from, send_once(frame));
                        Ok(Some(from))
                    }
                }
            });
        match ready {
            Ok(Some(peer)) => {
                e2e.wanted.remove(&peer);
                e2e.asked_with.remove(&peer);
                let ready = Input::SessionReady {
                    recipient: peer.to_string(),
                };
                step.apply(engine, ready, self.now);
            }
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

    /// The engine wants a session with `recipient`: fetched from the relay's directory, else
    /// asked of the peer; when no relay is connected, once one is.
    pub(super) fn want(
        &mut self,
        p: usize,
        e2e: &mut E2e,
        engine: &mut Engine,
        step: &mut Step<AppEvent>,
        recipient: &str,
    ) {
        let Ok(peer) = Address::parse(recipient) else {
            return;
        };
        // The first time, or again because the peer came online.
        e2e.wanted.insert(peer);
        self.set_up(p, e2e, engine, step, peer);
    }

    fn set_up(
        &mut self,
        p: usize,
        e2e: &mut E2e,
        engine: &mut Engine,
        step: &mut Step<AppEvent>,
        peer: Address,
    ) {
        match e2e.directory {
            None => {}
            Some(true) => e2e.outgoing.push(ToRelay::Fetch {
                address: peer.to_string(),
            }),
            Some(false) => self.ask_peer(p, e2e, engine, step, peer),
        }
    }

    /// The round trip (`docs/protocol.md#session-setup`): a key package of this device to
    /// `peer`, which starts the session and answers with its Welcome.
    fn ask_peer(
        &mut self,
        p: usize,
        e2e: &mut E2e,
        engine: &mut Engine,
        step: &mut Step<AppEvent>,
        peer: Address,
    ) {
        let package = match e2e.asked_with.get(&peer) {
            Some(package) => Ok(package.clone()),
            None => e2e.sessions.key_package(false).inspect(|package| {
                e2e.asked_with.insert(peer, package.clone());
            }),
        };
        match package {
            Ok(package) => {
                let frame = self.session_frame(p, e2e, SessionFrame::KeyPackage, peer, &package);
                self.counts.key_packages_sent += 1;
                e2e.outgoing.push(send_once(frame));
            }
            Err(e) => self.warn(
                engine,
                step,
                format!("cannot make a key package for {peer}: {e}"),
            ),
        }
    }

    /// What the relay's directory said.
    pub(super) fn directory(
        &mut self,
        p: usize,
        e2e: &mut E2e,
        engine: &mut Engine,
        step: &mut Step<AppEvent>,
        report: DirectoryReport,
    ) {
        match report {
            DirectoryReport::Connected { directory } => {
                e2e.directory = Some(directory);
                if directory {
                    // What the relay holds for this device, to top it up.
                    e2e.outgoing.push(ToRelay::Publish {
                        packages: Vec::new(),
                        last_resort: None,
                    });
                }
                // Every peer still waited on, again: an answer may have been lost.
                let wanted: Vec<Address> = e2e.wanted.iter().copied().collect();
                for peer in wanted {
                    self.set_up(p, e2e, engine, step, peer);
                }
            }
            DirectoryReport::Disconnected => e2e.directory = None,
            DirectoryReport::Published(Held {
                available,
                last_resort,
            }) => {
                let missing = PUBLISHED_TARGET.saturating_sub(available);
                if missing == 0 && last_resort {
                    return;
                }
                match publish(&mut e2e.sessions, missing, !last_resort) {
                    Ok(frame) => e2e.outgoing.push(frame),
                    Err(e) => self.warn(engine, step, format!("cannot make key packages: {e}")),
                }
            }
            DirectoryReport::Package { address, package } => {
                let Ok(address) = Address::parse(&address) else {
                    return;
                };
                if !e2e.wanted.contains(&address) {
                    return;
                }
                match e2e.sessions.start(address, &package) {
                    Ok(_) => {
                        self.counts.sessions_started += 1;
                        self.counts.directory_setups += 1;
                        self.trace(|w| {
                            let me = w.peers[p].name();
                            format!("{me} starts a session with {address} from the directory")
                        });
                        e2e.wanted.remove(&address);
                        e2e.asked_with.remove(&address);
                        let ready = Input::SessionReady {
                            recipient: address.to_string(),
                        };
                        step.apply(engine, ready, self.now);
                    }
                    Err(e) => self.warn(
                        engine,
                        step,
                        format!("the directory's key package for {address} is not usable: {e}"),
                    ),
                }
            }
            DirectoryReport::Unavailable { address } => {
                let Ok(address) = Address::parse(&address) else {
                    return;
                };
                if e2e.wanted.contains(&address) {
                    // Nothing published: the round trip through the peer.
                    self.ask_peer(p, e2e, engine, step, address);
                }
            }
        }
    }

    /// A warning the client would log: counted, since none is expected in the simulation.
    fn warn(&mut self, engine: &mut Engine, step: &mut Step<AppEvent>, message: String) {
        self.counts.e2e_warnings += 1;
        let level = DiagnosticLevel::Warn;
        step.emit(
            engine,
            AppEvent::Engine(Event::Diagnostic { level, message }),
        );
    }
}

/// `missing` new one-time packages and, when `last_resort`, a last-resort one.
fn publish(sessions: &mut Sessions, missing: u32, last_resort: bool) -> Result<ToRelay, String> {
    let packages = (0..missing)
        .map(|_| sessions.key_package(false))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let last_resort = match last_resort {
        true => Some(sessions.key_package(true).map_err(|e| e.to_string())?),
        false => None,
    };
    Ok(ToRelay::Publish {
        packages,
        last_resort,
    })
}

/// A session frame as the relay frame that carries it: sent once, no answer awaited.
fn send_once(message: Message) -> ToRelay {
    ToRelay::Send {
        message: Box::new(message),
        tag: None,
    }
}

fn inbound(message: Message, origin: InboundOrigin) -> Input {
    Input::Inbound {
        message: Box::new(message),
        origin,
    }
}

impl World {
    /// Nothing is left that no one can open: what each device would seal for a peer next, that
    /// peer opens — directly, or after the Welcome that goes ahead of it.
    pub(super) fn check_sessions(&self) {
        for a in 0..self.peers.len() {
            let peers: Vec<Address> = self.restore_sessions(a).peers().copied().collect();
            for peer in peers {
                let Some(b) = self.scn.index_of(&peer.to_string()) else {
                    continue;
                };
                if let Err(e) = self.opens(a, b) {
                    violated(format!("{} and {peer}: {e}", self.peers[a].name()));
                }
            }
        }
    }

    /// Whether what device `a` seals for `b` next opens at `b`, after the Welcome `a` still
    /// sends ahead of it; `Err` says why not. Tried on copies loaded from the committed rows,
    /// so the devices themselves are untouched.
    pub(super) fn opens(&self, a: usize, b: usize) -> Result<(), String> {
        let mut from = self.restore_sessions(a);
        let mut to = self.restore_sessions(b);
        let (me, peer) = (from.address(), to.address());
        if !from.has_session(&peer) {
            return Err(format!("{me} has no session with {peer}"));
        }
        if let Some(welcome) = from.welcome_for(&peer).map(<[u8]>::to_vec) {
            let _ = to.join(me, &welcome);
        }
        from.seal(&peer, b"a probe of the oracle")
            .and_then(|sealed| to.open(&me, &sealed))
            .map(|_| ())
            .map_err(|e| {
                format!("their sessions part ways ({peer} cannot open what {me} seals: {e})")
            })
    }

    /// Whether device `from` still holds `welcome` for device `p`: the Welcome of its current
    /// session with `p` (as it runs, or as its store holds it while it is down).
    fn holds_welcome(&self, from: Address, p: usize, welcome: &[u8]) -> bool {
        let Some(q) = self.scn.index_of(&from.to_string()) else {
            return false;
        };
        let to = Address::parse(self.peers[p].name()).expect("an address");
        let running = self.peers[q].run.as_ref().and_then(|run| run.e2e.as_ref());
        match running {
            Some(e2e) => e2e.sessions.welcome_for(&to) == Some(welcome),
            None => self.restore_sessions(q).welcome_for(&to) == Some(welcome),
        }
    }

    /// Device `q`'s sessions as its store holds them.
    fn restore_sessions(&self, q: usize) -> Sessions {
        let peer = &self.peers[q];
        let identity = peer.spec.identity.clone().expect("an encrypted world");
        Sessions::restore(identity, peer.store.load_sessions()).unwrap_or_else(|e| {
            violated(format!(
                "{}'s committed session state does not load: {e}",
                peer.name()
            ))
        })
    }
}
