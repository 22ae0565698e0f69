//! How the driver carries out a step's stages (`courier_engine::step::Host`): SQLite for the
//! commit, the application's callbacks for events, hook batches and app carrier frames, the
//! carrier tasks for the relay's and the gateway's frames.

use std::collections::HashSet;
use std::ops::ControlFlow;

use courier_engine::step::Host;
use courier_engine::{
    Carrier, Engine, Event, HookBatch, Input, Millis, PresenceChange, StoreOp, Transmit,
    TransmitKind,
};
use courier_proto::{ClientFrame, Message};
use tokio::sync::{mpsc as tokio_mpsc, oneshot};

use super::connections::Connections;
use super::e2e::{E2e, Frame};
use super::groups::Groups;
use super::media::Media;
use super::Published;
use crate::app::{App, AppCarrierSend, SendAttempt};
use crate::carrier::gateway::GatewayOut;
use crate::carrier::relay::RelayOut;
use crate::carrier::Submit;
use crate::error::ClientError;
use crate::event::ClientEvent;
use crate::store::{Received, Reports, RuntimeChanges, Store};

type Reply = oneshot::Sender<Result<String, ClientError>>;

/// A step whose commit failed: nothing of it was written, and its sends are refused.
pub(super) struct CommitFailed {
    pub message: String,
    pub accepted: Vec<(String, Reply)>,
}

pub(super) struct StepHost<'a> {
    pub store: &'a mut Store,
    pub app: &'a mut dyn App,
    pub relay: Option<&'a tokio_mpsc::UnboundedSender<RelayOut>>,
    pub gateway: Option<&'a tokio_mpsc::UnboundedSender<GatewayOut>>,
    pub published: &'a Published,
    pub reported: &'a mut Vec<String>,
    pub unconfirmed: &'a mut Option<HashSet<String>>,
    pub accepted: Vec<(String, Reply)>,
    /// The ids of the step's terminal events, held in storage until their dispatch is recorded.
    pub held: Vec<String>,
    /// End-to-end sessions, when encryption is on.
    pub e2e: Option<&'a mut E2e>,
    pub connections: &'a mut Connections,
    pub groups: &'a mut Groups,
    pub media: &'a mut Media,
    pub now: Millis,
    /// Inputs for the next step: sends that could not be sealed.
    pub refeed: &'a mut Vec<Input>,
    pub ledger: &'a mut crate::ledger::Observer,
}

impl Host<ClientEvent> for StepHost<'_> {
    type Stop = CommitFailed;
    type Frame = Frame;

    fn prepare(&mut self, mut transmits: Vec<Transmit>) -> ControlFlow<CommitFailed, Vec<Frame>> {
        // A chunk's bytes are read only now, as it goes (`docs/delivery.md#file-transfers`).
        transmits.retain_mut(|transmit| match &mut transmit.kind {
            TransmitKind::Outbox { message, .. }
                if message.content_type == courier_proto::ContentType::FileChunk =>
            {
                self.media.materialize(message)
            }
            _ => true,
        });
        for line in self.media.take_sent() {
            self.app.event(ClientEvent::Diagnostic {
                level: courier_engine::DiagnosticLevel::Debug,
                message: line,
                target: "courier_client::media",
            });
        }
        ControlFlow::Continue(match self.e2e.as_deref_mut() {
            Some(e2e) => e2e.seal(transmits, self.now, self.refeed),
            None => transmits.into_iter().map(Frame::clear).collect(),
        })
    }

    fn commit(
        &mut self,
        ops: Vec<StoreOp>,
        events: &[ClientEvent],
        after_transmits: &[ClientEvent],
    ) -> ControlFlow<CommitFailed> {
        let reports = Reports {
            held: events
                .iter()
                .chain(after_transmits)
                .filter_map(terminal_report)
                .collect(),
            done: std::mem::take(self.reported),
        };
        self.connections.settled(events);
        let sessions = self.e2e.as_deref().map(E2e::changes).unwrap_or_default();
        // A chunk is acknowledged after this commit: its bytes are on disk before.
        if let Err(e) = self.media.sync() {
            *self.reported = reports.done;
            return ControlFlow::Break(CommitFailed {
                message: format!("cannot sync a partial file: {e}"),
                accepted: std::mem::take(&mut self.accepted),
            });
        }
        let media = self.media.changes();
        let received: Vec<Received<'_>> = events
            .iter()
            .chain(after_transmits)
            .filter_map(received)
            .collect();
        let stepped: Vec<&ClientEvent> = events.iter().chain(after_transmits).collect();
        let ledger = self.ledger.step(&ops, &stepped, self.now);
        let runtime = RuntimeChanges {
            ledger: &ledger,
            sessions: &sessions,
            connections: self.connections.changes(),
            groups: self.groups.changes(),
            media: &media,
            received: &received,
            now: self.now,
        };
        match self.store.commit_with(&ops, &reports, &runtime) {
            Ok(()) => {
                if let Some(e2e) = self.e2e.as_deref_mut() {
                    e2e.committed();
                }
                self.connections.committed();
                self.groups.committed();
                for problem in self.media.committed() {
                    self.app.event(ClientEvent::Diagnostic {
                        level: courier_engine::DiagnosticLevel::Error,
                        message: problem,
                        target: "courier_client::media",
                    });
                }
                self.held = reports.held.into_iter().map(|(id, _)| id).collect();
                ControlFlow::Continue(())
            }
            Err(e) => {
                // Still owed: nothing of the failed transaction was written.
                *self.reported = reports.done;
                ControlFlow::Break(CommitFailed {
                    message: e.to_string(),
                    accepted: std::mem::take(&mut self.accepted),
                })
            }
        }
    }

    fn resolve(
        &mut self,
        engine: &Engine,
        watchlist: &[PresenceChange],
    ) -> ControlFlow<CommitFailed> {
        if let Ok(mut stats) = self.published.stats.lock() {
            *stats = engine.stats();
        }
        if !watchlist.is_empty() {
            if let Ok(mut published) = self.published.watchlist.lock() {
                *published = engine.presence_watchlist();
            }
        }
        for (id, reply) in self.accepted.drain(..) {
            let _ = reply.send(Ok(id));
        }
        ControlFlow::Continue(())
    }

    fn dispatch(&mut self, events: Vec<ClientEvent>) -> ControlFlow<CommitFailed> {
        let events = events
            .into_iter()
            .map(|event| match event {
                ClientEvent::Engine(event) => match &*event {
                    Event::MessageReceived { sender, .. } => ClientEvent::Received {
                        known_sender: self.connections.is_contact(sender),
                        event,
                    },
                    _ => ClientEvent::Engine(event),
                },
                other => other,
            })
            .collect::<Vec<_>>();
        if !events.is_empty() {
            self.app.events(events);
        }
        ControlFlow::Continue(())
    }

    fn transmit(&mut self, frames: Vec<Frame>) -> ControlFlow<CommitFailed> {
        for frame in frames {
            match frame {
                Frame::Engine(transmit) => self.route(transmit),
                Frame::Welcome { carrier, message } => self.route(Transmit {
                    carrier,
                    peer: Some(message.recipient.clone()),
                    // Sent like an ACK: once, with no answer awaited.
                    kind: TransmitKind::DeliveryAck { message },
                }),
            }
        }
        ControlFlow::Continue(())
    }

    fn dispatch_after_transmits(&mut self, events: Vec<ClientEvent>) -> ControlFlow<CommitFailed> {
        self.dispatch(events)?;
        let held = std::mem::take(&mut self.held);
        match self.unconfirmed {
            Some(unconfirmed) => unconfirmed.extend(held),
            None => *self.reported = held,
        }
        ControlFlow::Continue(())
    }

    fn offer_hook(&mut self, batch: HookBatch) -> ControlFlow<CommitFailed> {
        self.ledger.offered(&batch, self.now);
        self.app.hook_batch(batch);
        ControlFlow::Continue(())
    }

    fn presence(&mut self, changes: Vec<PresenceChange>) -> ControlFlow<CommitFailed> {
        if let Some(relay) = self.relay {
            for change in changes {
                let _ = relay.send(match change {
                    PresenceChange::Watch(peer) => RelayOut::Watch(peer),
                    PresenceChange::Unwatch(peer) => RelayOut::Unwatch(peer),
                });
            }
        }
        ControlFlow::Continue(())
    }
}

impl StepHost<'_> {
    /// Hands a transmit to its carrier: the relay or gateway task, or the application for an
    /// app carrier.
    fn route(&mut self, transmit: Transmit) {
        match transmit.carrier {
            Carrier::Relay => {
                let Some(relay) = self.relay else { return };
                let out = match addressed(transmit.kind) {
                    Addressed::Frame(frame) => RelayOut::Submit(frame),
                    Addressed::ReleaseFrame(seq) => RelayOut::ReleaseFrame { seq },
                    Addressed::Group(frame) => RelayOut::Group(frame),
                };
                let _ = relay.send(out);
            }
            Carrier::Gateway => {
                let Some(gateway) = self.gateway else { return };
                // Only the relay journals frames: the engine releases none of a gateway's.
                if let Addressed::Frame(frame) = addressed(transmit.kind) {
                    let _ = gateway.send(GatewayOut::Submit(frame));
                }
            }
            Carrier::Local(name) => {
                // App carriers move the end-to-end Message itself; there is no journal to release.
                let (message, attempt) = match transmit.kind {
                    TransmitKind::Outbox { message, send_seq } => {
                        let attempt = SendAttempt {
                            message_id: message.id.clone(),
                            send_seq,
                        };
                        (message, Some(attempt))
                    }
                    TransmitKind::DeliveryAck { message } => (message, None),
                    TransmitKind::ReleaseFrame { .. } | TransmitKind::GroupBroadcast { .. } => {
                        return
                    }
                };
                let peer = transmit.peer.unwrap_or_else(|| message.recipient.clone());
                self.app.app_carrier_send(AppCarrierSend {
                    carrier: name,
                    peer,
                    frame: message.encode(),
                    attempt,
                });
            }
        }
    }
}

/// A transmit for an addressed carrier: an end-to-end frame, or the release of relay journal
/// frame `seq`.
enum Addressed {
    Frame(Submit),
    ReleaseFrame(u64),
    /// A group broadcast: only the relay broadcasts (`docs/delivery.md#path-choice`).
    Group(ClientFrame),
}

fn addressed(kind: TransmitKind) -> Addressed {
    match kind {
        TransmitKind::Outbox { message, send_seq } => Addressed::Frame(Submit::Outbox {
            id: message.id.clone(),
            send_seq,
            recipient: message.recipient.clone(),
            frame: send_message(&message).encode(),
        }),
        TransmitKind::DeliveryAck { message } => Addressed::Frame(Submit::Ack {
            frame: send_message(&message).encode(),
        }),
        TransmitKind::ReleaseFrame { seq } => Addressed::ReleaseFrame(seq),
        TransmitKind::GroupBroadcast { group_id, message } => {
            Addressed::Group(ClientFrame::SendGroupMessage {
                group_id,
                message_id: message.id.clone(),
                content: message.encode(),
                reply_to_msg: None,
                forward_info: None,
            })
        }
    }
}

/// `message` as the relay frame that carries it.
pub(super) fn send_message(message: &Message) -> ClientFrame {
    ClientFrame::SendMessage {
        recipient: message.recipient.clone(),
        content: message.encode(),
        message_id: message.id.clone(),
        reply_to_msg: message.reply_to_msg.clone(),
    }
}

/// The message a `message_received` delivers, kept in the step's commit for forwarding: the
/// step that processed it (or whose hook verdict committed it) is the one that emits it.
fn received(event: &ClientEvent) -> Option<Received<'_>> {
    match event.engine()? {
        Event::MessageReceived {
            message,
            chat,
            sender,
            ..
        } => Some(Received {
            chat,
            sender,
            message,
        }),
        _ => None,
    }
}

/// A terminal event's `(message id, JSON)`, held in storage until it has been dispatched.
fn terminal_report(event: &ClientEvent) -> Option<(String, String)> {
    let id = event.terminal_message_id()?.to_owned();
    let json = match event {
        // Held again as it was: it is reported once this dispatch is recorded.
        ClientEvent::Replayed { json, .. } => json.to_string(),
        _ => event.to_json().to_string(),
    };
    Some((id, json))
}

#[cfg(test)]
mod tests {
    use courier_proto::{IdentityKey, RichParts};

    use super::*;

    fn frame_reply_link(message: &Message) -> Option<String> {
        match send_message(message) {
            ClientFrame::SendMessage { reply_to_msg, .. } => reply_to_msg,
            other => panic!("expected SendMessage, got {other:?}"),
        }
    }

    /// The relay frame names the message replied to only for a message in the clear: a sealed
    /// one keeps the link inside its ciphertext (`docs/protocol.md#rich-messages`).
    #[test]
    fn only_a_message_in_the_clear_shows_its_reply_link_on_the_frame() {
        let alice = IdentityKey::from_seed([1; 32]).address();
        let mut message = Message::decode(&format!(
            r#"{{"id":"m1","sender":"{alice}","recipient":"bob","app_id":"chat","priority":"medium",
               "ttl":10,"hop_count":0,"timestamp":1,"lamport_clock":1,"content_type":"text",
               "content":"yes","metadata":{{}}}}"#
        ))
        .unwrap();
        RichParts {
            reply_to: Some("m0".into()),
            ..RichParts::default()
        }
        .write_to(&mut message);
        assert_eq!(frame_reply_link(&message).as_deref(), Some("m0"));
        let sealed = courier_proto::envelope(&message, &alice, b"ciphertext");
        assert_eq!(frame_reply_link(&sealed), None);
    }
}
