//! The application's four callbacks, passed by the facade to `start()`, each a thread-safe
//! function of its own: events cross as JSON text (an array of a step's events, parsed by the
//! facade's dispatcher), durability hook batches and app carrier frames as typed objects, token requests
//! as their id.
//!
//! All four are held by the client's driver and released with it in `stop()`: while started
//! they keep the process alive (a script awaiting an event must not exit first), and after
//! `stop()` nothing does.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use courier_client::app::{App, AppCarrierSend, Barrier, HookBatch, HookMessage};
use courier_client::backlog::Backlog;
use courier_client::driver::Receipts;
use courier_client::event::{app_metadata, rich_fields, ClientEvent};
use napi::bindgen_prelude::Uint8Array;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::Status;
use napi_derive::napi;

pub type EventCallback = ThreadsafeFunction<String, (), String, Status, false>;
pub type HookBatchCallback =
    ThreadsafeFunction<NativeHookBatch, (), NativeHookBatch, Status, false>;
pub type AppCarrierSendCallback =
    ThreadsafeFunction<NativeAppCarrierSend, (), NativeAppCarrierSend, Status, false>;
/// Asked with a request id; the facade runs the app's token provider and answers with
/// `authTokenProvided`.
pub type AuthTokenCallback = ThreadsafeFunction<f64, (), f64, Status, false>;

/// A batch for the durability hook; the facade reports it with `hookDone(batchId, …)`.
#[napi(object)]
pub struct NativeHookBatch {
    pub batch_id: i64,
    pub messages: Vec<NativeInboundMessage>,
}

/// `InboundMessage` in `js/index.d.ts`, before the facade turns binary content into bytes.
#[napi(object)]
pub struct NativeInboundMessage {
    pub chat: String,
    pub sender: String,
    pub message_id: String,
    pub content: String,
    /// Binary content as base64, as in a `message_received` event.
    pub binary_content: Option<String>,
    pub content_type: String,
    /// Epoch milliseconds.
    pub timestamp: f64,
    pub metadata: HashMap<String, String>,
    /// `'live'`, `'drain'` or `'redelivery'`.
    pub origin: String,
    /// The group of a group message (then `chat` is the group too).
    pub group_id: Option<String>,
    /// `replyTo`, `quote`, `mentions`, `extras` and `forwardInfo`, as on `message_received`.
    pub rich: serde_json::Map<String, serde_json::Value>,
}

/// A frame for the app carrier `carrier` to hand to `peer`.
#[napi(object)]
pub struct NativeAppCarrierSend {
    pub carrier: String,
    pub peer: String,
    pub frame: Uint8Array,
    /// What the facade reports with `appCarrierSendDone`; absent for a delivery ACK.
    pub attempt: Option<NativeSendAttempt>,
}

/// Attempt `sendSeq` of the message whose wire id is `messageId`.
#[napi(object)]
pub struct NativeSendAttempt {
    pub message_id: String,
    pub send_seq: i64,
}

/// Holds back what the driver hands the facade until `start()` has made the protocol started.
/// A listener, the hook and an app carrier call back into the protocol (`stats()`, `hookDone`,
/// …), which answers `ERR_NOT_STARTED` until then; and the driver runs, and may dispatch, before
/// the client it belongs to is in place. The driver's first call waits for the gate, which the
/// [`Opener`] opens when dropped, whatever way `start()` ends.
#[derive(Clone, Default)]
pub struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn wait(&self) {
        let (open, opened) = &*self.0;
        let mut open = open.lock().unwrap_or_else(PoisonError::into_inner);
        while !*open {
            open = opened.wait(open).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

pub struct Opener(pub Gate);

impl Drop for Opener {
    fn drop(&mut self) {
        let (open, opened) = &*self.0 .0;
        *open.lock().unwrap_or_else(PoisonError::into_inner) = true;
        opened.notify_all();
    }
}

/// The facade, as the driver calls it.
pub struct JsApp {
    pub on_event: EventCallback,
    pub on_hook_batch: HookBatchCallback,
    pub on_app_carrier_send: AppCarrierSendCallback,
    pub on_auth_token_wanted: AuthTokenCallback,
    pub receipts: Receipts,
    /// The events queued for the JS thread and not run yet: carriers pause while it is full.
    pub backlog: Backlog,
    /// Until the first call went through.
    pub gate: Option<Gate>,
}

impl JsApp {
    fn pass_gate(&mut self) {
        if let Some(gate) = self.gate.take() {
            gate.wait();
        }
    }
}

impl App for JsApp {
    fn event(&mut self, event: ClientEvent) {
        self.events(vec![event]);
    }

    /// The events cross as one JSON array. Its terminal events are confirmed from the call's
    /// completion, once the facade's dispatcher has run the listeners: until then they stay held
    /// in storage, so a kill before the listeners ran means a replay, never a loss. The call
    /// counts in the backlog until it ran, or was dropped unrun.
    fn events(&mut self, events: Vec<ClientEvent>) {
        self.pass_gate();
        let terminal: Vec<String> = events
            .iter()
            .filter_map(|event| event.terminal_message_id().map(str::to_owned))
            .collect();
        let json = serde_json::Value::Array(events.iter().map(ClientEvent::to_json).collect());
        let json = json.to_string();
        let queued = self.backlog.queued(json.len());
        let receipts = self.receipts.clone();
        self.on_event.call_with_return_value(
            json,
            ThreadsafeFunctionCallMode::NonBlocking,
            move |ran, _| {
                drop(queued);
                if ran.is_ok() {
                    for message_id in terminal {
                        receipts.seen(message_id);
                    }
                }
                Ok(())
            },
        );
    }

    fn caught_up(&mut self, barrier: Barrier) {
        self.backlog.hold(barrier);
    }

    fn hook_batch(&mut self, batch: HookBatch) {
        self.pass_gate();
        let batch = NativeHookBatch {
            // Batch ids count up from 1: far below 2^53, exact as a JS number.
            batch_id: batch.id as i64,
            messages: batch.messages.into_iter().map(inbound_message).collect(),
        };
        self.on_hook_batch
            .call(batch, ThreadsafeFunctionCallMode::NonBlocking);
    }

    fn app_carrier_send(&mut self, send: AppCarrierSend) {
        self.pass_gate();
        let send = NativeAppCarrierSend {
            carrier: send.carrier,
            peer: send.peer,
            frame: Uint8Array::from(send.frame.into_bytes()),
            attempt: send.attempt.map(|attempt| NativeSendAttempt {
                message_id: attempt.message_id,
                // Attempts are numbered from 1, engine-wide: far below 2^53.
                send_seq: attempt.send_seq as i64,
            }),
        };
        self.on_app_carrier_send
            .call(send, ThreadsafeFunctionCallMode::NonBlocking);
    }

    fn auth_token_wanted(&mut self, request: u64) {
        self.pass_gate();
        // Request ids count up from 1: far below 2^53, exact as a JS number.
        self.on_auth_token_wanted
            .call(request as f64, ThreadsafeFunctionCallMode::NonBlocking);
    }
}

fn inbound_message(m: HookMessage) -> NativeInboundMessage {
    let rich = rich_fields(&m.message);
    let binary_content = match m.message.binary_content {
        Some(serde_json::Value::String(b64)) => Some(b64),
        _ => None,
    };
    let (metadata, group_id) = app_metadata(m.message.metadata);
    NativeInboundMessage {
        chat: m.key.chat,
        sender: m.key.sender,
        message_id: m.key.message_id,
        content: m.message.content,
        binary_content,
        content_type: m.message.content_type.as_str().to_owned(),
        timestamp: m.message.timestamp as f64,
        metadata: metadata.into_iter().collect(),
        origin: m.origin.as_str().to_owned(),
        group_id,
        rich,
    }
}
