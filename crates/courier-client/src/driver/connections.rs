//! Connection requests and contacts in the driver (`docs/delivery.md#connection-requests`).
//!
//! A request, and each answer to one, is a signed control frame the engine carries like any
//! message — durable, retried, acknowledged — except that a request is never parked. A request
//! carries the requester's key package when it keeps sessions, so accepting starts the session at
//! once and the acceptance carries its Welcome back. Every change here is committed in the step
//! of the frame that caused it, with that frame's outbox row or dedup record.
//!
//! Contacts are the peers this device talks with: those it sent a message to, and those whose
//! connection it accepted or who accepted its own. What becomes of a message from anybody else
//! is the app's choice (`encryption.unknownSenders`).

use std::collections::{BTreeMap, HashSet};

use courier_engine::step::Step;
use courier_engine::{Engine, Event, InboundOrigin, Input, Millis, SendRequest};
use courier_proto::{
    control_frame, sign_control, Address, ConnectionFrame, ContentType, IdentityKey, Message,
    Priority, MAX_REQUEST_NOTE_BYTES,
};

use super::e2e::E2e;
use super::mint_id;
use crate::error::ClientError;
use crate::event::ClientEvent;
use crate::store::{ConnectionChange, PendingRequest, Store, StoreError};

/// What happens to a message from a peer that is not a contact (`encryption.unknownSenders`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownSenders {
    /// Delivered, and flagged (`message_received.knownSender: false`).
    #[default]
    Accept,
    /// Held until the app accepts a connection with the sender: not delivered, not
    /// acknowledged (the sender's outbox keeps it and sends it again), and the first one from a
    /// sender is reported as a connection request.
    Request,
    /// Dropped unacknowledged, with a diagnostic.
    Refuse,
}

impl UnknownSenders {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "accept" => Some(Self::Accept),
            "request" => Some(Self::Request),
            "refuse" => Some(Self::Refuse),
            _ => None,
        }
    }
}

/// What the app asked of its connections.
#[derive(Debug)]
pub enum ConnectionCommand {
    Request { peer: String, note: Option<String> },
    Accept { id: String },
    Reject { id: String },
    Cancel { id: String },
}

pub struct Connections {
    identity: IdentityKey,
    address: String,
    app_id: String,
    policy: UnknownSenders,
    contacts: HashSet<String>,
    pending: BTreeMap<String, PendingRequest>,
    /// What the current step changed, to commit with it.
    changes: Vec<ConnectionChange>,
}

impl Connections {
    pub fn restore(
        store: &Store,
        identity: IdentityKey,
        app_id: String,
        policy: UnknownSenders,
    ) -> Result<Self, StoreError> {
        let mut connections = Self {
            address: identity.address().to_string(),
            identity,
            app_id,
            policy,
            contacts: HashSet::new(),
            pending: BTreeMap::new(),
            changes: Vec::new(),
        };
        connections.reload(store)?;
        Ok(connections)
    }

    fn reload(&mut self, store: &Store) -> Result<(), StoreError> {
        self.contacts = store.load_contacts()?.into_iter().collect();
        self.pending = store
            .load_connection_requests()?
            .into_iter()
            .map(|r| (r.id.clone(), r))
            .collect();
        self.changes.clear();
        Ok(())
    }

    pub fn changes(&self) -> &[ConnectionChange] {
        &self.changes
    }

    /// The step's transaction is durable.
    pub fn committed(&mut self) {
        self.changes.clear();
    }

    /// The step's transaction failed: back to what storage holds.
    pub fn rollback(&mut self, store: &Store) -> Result<(), StoreError> {
        self.reload(store)
    }

    pub fn is_contact(&self, peer: &str) -> bool {
        self.contacts.contains(peer)
    }

    /// The requests waiting for an answer, oldest first.
    pub fn pending(&self) -> Vec<PendingRequest> {
        let mut pending: Vec<PendingRequest> = self.pending.values().cloned().collect();
        pending.sort_by(|a, b| (a.at, &a.id).cmp(&(b.at, &b.id)));
        pending
    }

    /// The app sent `peer` a message: a peer one writes to is one's contact.
    pub fn sent_to(&mut self, peer: &str, now: Millis) {
        self.add_contact(peer, now);
    }

    fn add_contact(&mut self, peer: &str, now: Millis) {
        if self.contacts.insert(peer.to_owned()) {
            self.changes.push(ConnectionChange::Contact {
                peer: peer.to_owned(),
                at: now,
            });
        }
    }

    fn close(&mut self, id: &str) -> Option<PendingRequest> {
        let request = self.pending.remove(id)?;
        self.changes
            .push(ConnectionChange::Closed { id: id.to_owned() });
        Some(request)
    }

    fn open(&mut self, request: PendingRequest) {
        self.changes
            .push(ConnectionChange::Pending(request.clone()));
        self.pending.insert(request.id.clone(), request);
    }

    /// Carries out what the app asked; returns the id of the frame it sent, for the caller to
    /// be answered once the step is committed.
    pub fn command(
        &mut self,
        command: ConnectionCommand,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        e2e: Option<&mut E2e>,
        now: Millis,
    ) -> Result<String, ClientError> {
        match command {
            ConnectionCommand::Request { peer, note } => {
                self.request(peer, note, engine, step, e2e, now)
            }
            ConnectionCommand::Accept { id } => {
                let request = self.waiting(&id, true)?;
                let mut welcome = None;
                if let (Some(e2e), Some(package)) = (e2e, &request.key_package) {
                    let peer = address(&request.peer)?;
                    welcome = e2e
                        .start_for_request(engine, step, peer, package, now)
                        .map_err(|e| {
                            ClientError::InvalidArgument(format!(
                                "the request's key package is not usable: {e}"
                            ))
                        })?;
                }
                self.close(&id);
                self.add_contact(&request.peer, now);
                let frame = ConnectionFrame::Accept {
                    request_id: id,
                    welcome,
                };
                Ok(self.submit(frame, &request.peer, engine, step, now))
            }
            ConnectionCommand::Reject { id } => {
                let request = self.waiting(&id, true)?;
                self.close(&id);
                let frame = ConnectionFrame::Reject { request_id: id };
                Ok(self.submit(frame, &request.peer, engine, step, now))
            }
            ConnectionCommand::Cancel { id } => {
                let request = self.waiting(&id, false)?;
                self.close(&id);
                let frame = ConnectionFrame::Cancel { request_id: id };
                Ok(self.submit(frame, &request.peer, engine, step, now))
            }
        }
    }

    fn request(
        &mut self,
        peer: String,
        note: Option<String>,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        e2e: Option<&mut E2e>,
        now: Millis,
    ) -> Result<String, ClientError> {
        address(&peer)?;
        if peer == self.address {
            return Err(ClientError::InvalidArgument(
                "a device cannot ask itself to connect".into(),
            ));
        }
        if let Some(bytes) = note.as_ref().map(String::len) {
            if bytes > MAX_REQUEST_NOTE_BYTES {
                return Err(ClientError::InvalidArgument(format!(
                    "options.message is {bytes} bytes; the limit is {MAX_REQUEST_NOTE_BYTES}"
                )));
            }
        }
        if let Some(waiting) = self
            .pending
            .values()
            .find(|r| !r.incoming && r.peer == peer)
        {
            // Asked already, and not answered: the same request stands.
            return Ok(waiting.id.clone());
        }
        let key_package = e2e
            .map(E2e::request_key_package)
            .transpose()
            .map_err(|e| ClientError::Internal(format!("cannot make a key package: {e}")))?;
        let frame = ConnectionFrame::Request {
            note: note.clone(),
            key_package,
        };
        let id = self.submit(frame, &peer, engine, step, now);
        self.open(PendingRequest {
            id: id.clone(),
            peer,
            incoming: false,
            note,
            key_package: None,
            at: now,
        });
        Ok(id)
    }

    /// The pending request `id` in the given direction.
    fn waiting(&self, id: &str, incoming: bool) -> Result<PendingRequest, ClientError> {
        self.pending
            .get(id)
            .filter(|r| r.incoming == incoming)
            .cloned()
            .ok_or_else(|| {
                ClientError::InvalidArgument(format!(
                    "no connection request {id:?} {}",
                    if incoming {
                        "waits for this device's answer"
                    } else {
                        "of this device is waiting"
                    }
                ))
            })
    }

    /// `frame`, signed, into the outbox for `peer`; returns its id.
    fn submit(
        &self,
        frame: ConnectionFrame,
        peer: &str,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) -> String {
        let id = mint_id();
        let mut message = control_frame(
            id.clone(),
            &self.app_id,
            &self.address,
            peer,
            frame.content(),
            now,
        );
        sign_control(&mut message, &self.identity, now);
        let Message {
            content, metadata, ..
        } = message;
        let send = SendRequest {
            id: id.clone(),
            settled: None,
            recipient: peer.to_owned(),
            content,
            content_type: ContentType::Text,
            priority: Priority::High,
            metadata,
            binary_content: None,
            rich: Default::default(),
        };
        step.apply(engine, Input::Send(send), now);
        id
    }

    /// A verified connection frame the engine handed over (its signature is the sender's).
    pub fn control(
        &mut self,
        frame: ConnectionFrame,
        message: &Message,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        e2e: Option<&mut E2e>,
        now: Millis,
    ) {
        let peer = message.sender.clone();
        match frame {
            ConnectionFrame::Request { note, key_package } => {
                // A newer request from the same peer replaces the one still waiting.
                let older: Vec<String> = self
                    .pending
                    .values()
                    .filter(|r| r.incoming && r.peer == peer)
                    .map(|r| r.id.clone())
                    .collect();
                for id in older {
                    self.close(&id);
                }
                self.open(PendingRequest {
                    id: message.id.clone(),
                    peer: peer.clone(),
                    incoming: true,
                    note: note.clone(),
                    key_package,
                    at: now,
                });
                step.emit(
                    engine,
                    ClientEvent::ConnectionRequestReceived {
                        request_id: message.id.clone(),
                        sender: peer,
                        note,
                        implicit: false,
                    },
                );
            }
            ConnectionFrame::Accept {
                request_id,
                welcome,
            } => {
                if let Some(request) = self.pending.get(&request_id) {
                    if request.incoming || request.peer != peer {
                        return self.stray(engine, step, "acceptance", &request_id, &peer);
                    }
                }
                self.close(&request_id);
                self.add_contact(&peer, now);
                if let (Some(e2e), Some(welcome), Ok(from)) = (e2e, welcome, Address::parse(&peer))
                {
                    e2e.join_from_acceptance(engine, step, from, &welcome, now);
                }
                step.emit(engine, ClientEvent::ConnectionAccepted { request_id, peer });
            }
            ConnectionFrame::Reject { request_id } => {
                if let Some(request) = self.pending.get(&request_id) {
                    if request.incoming || request.peer != peer {
                        return self.stray(engine, step, "refusal", &request_id, &peer);
                    }
                }
                self.close(&request_id);
                step.emit(engine, ClientEvent::ConnectionRejected { request_id, peer });
            }
            ConnectionFrame::Cancel { request_id } => {
                let Some(request) = self.pending.get(&request_id) else {
                    return;
                };
                if !request.incoming || request.peer != peer {
                    return self.stray(engine, step, "withdrawal", &request_id, &peer);
                }
                self.close(&request_id);
                step.emit(
                    engine,
                    ClientEvent::ConnectionRequestCancelled {
                        request_id,
                        sender: peer,
                    },
                );
            }
        }
    }

    fn stray(
        &self,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        what: &str,
        request_id: &str,
        peer: &str,
    ) {
        step.emit(
            engine,
            ClientEvent::Diagnostic {
                level: courier_engine::DiagnosticLevel::Warn,
                message: format!(
                    "ignored a connection {what} of request {request_id} from {peer}: not a \
                     request of this device to it"
                ),
                target: "courier_client::connections",
            },
        );
    }

    /// Whether an inbound data message from `sender` goes to the engine, by the app's
    /// `unknownSenders` choice; when it does not, the input that releases it instead.
    pub fn screen(
        &mut self,
        message: &Message,
        sender: &str,
        origin: &InboundOrigin,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) -> Option<Input> {
        if self.policy == UnknownSenders::Accept
            || self.is_contact(sender)
            || message.ack_for().is_some()
            || courier_proto::is_signature_gated(&message.content)
            || engine.knows_inbound(sender, &message.id, now)
        {
            return None;
        }
        let reason = match self.policy {
            UnknownSenders::Request => {
                let asked = self
                    .pending
                    .values()
                    .any(|r| r.incoming && r.peer == sender);
                if !asked {
                    self.open(PendingRequest {
                        id: message.id.clone(),
                        peer: sender.to_owned(),
                        incoming: true,
                        note: None,
                        key_package: None,
                        at: now,
                    });
                    step.emit(
                        engine,
                        ClientEvent::ConnectionRequestReceived {
                            request_id: message.id.clone(),
                            sender: sender.to_owned(),
                            note: None,
                            implicit: true,
                        },
                    );
                }
                format!(
                    "held {} from {sender}, not a contact: it is delivered once the app accepts \
                     the connection",
                    message.id
                )
            }
            UnknownSenders::Refuse | UnknownSenders::Accept => {
                let reason = format!(
                    "refused {} from {sender}: not a contact (encryption.unknownSenders: refuse)",
                    message.id
                );
                step.emit(
                    engine,
                    ClientEvent::Diagnostic {
                        level: courier_engine::DiagnosticLevel::Info,
                        message: reason.clone(),
                        target: "courier_client::connections",
                    },
                );
                reason
            }
        };
        Some(Input::Discard {
            origin: origin.clone(),
            reason,
        })
    }

    /// A clear inbound message: to the engine, or released unprocessed by the app's
    /// `unknownSenders` choice.
    pub fn deliver(
        &mut self,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        message: Message,
        origin: InboundOrigin,
        now: Millis,
    ) {
        let sender = message.sender.clone();
        let input = match self.screen(&message, &sender, &origin, engine, step, now) {
            Some(held) => held,
            None => Input::Inbound {
                message: Box::new(message),
                origin,
            },
        };
        step.apply(engine, input, now);
    }

    /// The step settled these messages: a request that failed waits for no answer any more.
    pub fn settled(&mut self, events: &[ClientEvent]) {
        for event in events {
            if let ClientEvent::Engine(e) = event {
                if let Event::MessageFailed { message_id, .. } = &**e {
                    if self.pending.get(message_id).is_some_and(|r| !r.incoming) {
                        self.close(message_id);
                    }
                }
            }
        }
    }
}

fn address(peer: &str) -> Result<Address, ClientError> {
    Address::parse(peer).map_err(|_| {
        ClientError::InvalidArgument(format!(
            "peer {peer:?} is not an off1 address: connections are between devices"
        ))
    })
}
