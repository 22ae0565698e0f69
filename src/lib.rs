//! Node-API binding of offline-courier. It converts types and forwards calls; every rule lives in
//! the crates under `crates/`. Errors cross with their stable code as the JS error's `code`
//! (`error.rs`), which the `js/` facade turns into `ProtocolError`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use courier_client::app::SendAttempt;
use courier_client::backlog::Backlog;
use courier_client::client::{Client, Durable};
use courier_client::config::{parse_protocol_config, ProtocolConfig};
use courier_client::driver::connections::ConnectionCommand;
use courier_client::driver::Receipts;
use courier_client::error::ClientError;
use courier_client::send::{ForwardInput, Quote, RichInput, SendInput};
use napi::bindgen_prelude::{Buffer, Env, PromiseRaw};
use napi_derive::napi;

use crate::app::{
    AppCarrierSendCallback, AuthTokenCallback, EventCallback, Gate, HookBatchCallback, JsApp,
    Opener,
};
use crate::error::{client_error, coded, Code, Outcome, Result, Settled};

mod app;
mod error;
pub mod gateway;
mod groups;
pub mod inspect;
mod media;
mod options;
pub mod relay;
mod running;

#[napi(object)]
pub struct NativeSendInput {
    /// The recipient; for `sendGroupMessage`, the group's id.
    pub recipient: String,
    pub content: Option<String>,
    pub binary: Option<Buffer>,
    pub id: Option<String>,
    pub priority: Option<String>,
    pub content_type: Option<String>,
    pub metadata: Option<HashMap<String, String>>,
    /// The id of the message this one replies to.
    pub reply_to: Option<String>,
    pub quote: Option<NativeQuote>,
    pub mentions: Option<Vec<String>>,
    /// `extras` as JSON text (an object), which the facade checked it can hold.
    pub extras_json: Option<String>,
}

/// `SendOptions.quote` in `js/index.d.ts`.
#[napi(object)]
pub struct NativeQuote {
    pub text: String,
    pub sender: Option<String>,
    pub message_id: Option<String>,
}

/// The options of `forwardMessage`.
#[napi(object)]
pub struct NativeForwardOptions {
    pub id: Option<String>,
    pub priority: Option<String>,
}

impl NativeSendInput {
    fn into_send(self) -> Result<SendInput> {
        let (binary_content, binary_len) = match &self.binary {
            Some(bytes) => {
                use base64::Engine as _;
                (
                    Some(base64::engine::general_purpose::STANDARD.encode(bytes.as_ref())),
                    bytes.len(),
                )
            }
            None => (None, 0),
        };
        Ok(SendInput {
            recipient: self.recipient,
            content: self.content.unwrap_or_default(),
            binary_content,
            binary_len,
            id: self.id,
            priority: self.priority,
            content_type: self.content_type,
            metadata: self
                .metadata
                .map(|m| m.into_iter().collect::<BTreeMap<_, _>>())
                .unwrap_or_default(),
            rich: RichInput {
                reply_to: self.reply_to,
                quote: self.quote.map(|q| Quote {
                    text: q.text,
                    sender: q.sender,
                    message_id: q.message_id,
                }),
                mentions: self.mentions.unwrap_or_default(),
                extras: self.extras_json.as_deref().map(extras).transpose()?,
            },
        })
    }
}

fn extras(json: &str) -> Result<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_str(json) {
        Ok(serde_json::Value::Object(extras)) => Ok(extras),
        _ => Err(coded(
            Code::INVALID_ARGUMENT,
            "options.extras must be an object JSON can hold",
        )),
    }
}

/// `connectionRequests()`: `ConnectionRequest` in `js/index.d.ts`.
#[napi(object)]
pub struct NativeConnectionRequest {
    pub request_id: String,
    pub peer: String,
    /// Sent to this device, waiting for its answer (else sent by it).
    pub incoming: bool,
    pub message: Option<String>,
    pub at: f64,
}

/// `stats()`: `ProtocolStats` in `js/index.d.ts`. Counts cross as JS numbers, exact up to 2^53.
#[napi(object)]
pub struct NativeStats {
    /// Messages in the outbox.
    pub outbox_regular: f64,
    pub outbox_media: f64,
    /// Messages handed to a carrier or awaiting their end-to-end ACK.
    pub pending_acks: f64,
    /// Queued messages that are not parked.
    pub retry_queue: f64,
    /// Parked messages: the recipient is unreachable, or the relay holds them in custody.
    pub parked: f64,
    /// Carriers available now: the relay, the gateway once attached, and each registered local
    /// transport.
    pub carriers_up: f64,
    /// Messages waiting for an end-to-end session with their recipient (the pre-session queue).
    pub pre_session: f64,
    /// Group messages awaiting a relay report or with copies still in the outbox.
    pub group_sends: f64,
}

/// Where a `Protocol` stands; `Starting` makes a concurrent second `start()` fail with
/// `ERR_ALREADY_STARTED` instead of racing for the storage lock.
enum State {
    Stopped,
    Starting,
    Started(Arc<Client>),
}

#[napi]
pub struct NativeProtocol {
    config: ProtocolConfig,
    state: Mutex<State>,
    /// The app carriers registered so far, before or after `start()`: each start registers them
    /// with its client, so they survive `stop()`. Held while a start moves to `Started`, so a
    /// registration is applied exactly once: by the start (at launch, or after it for one made
    /// while starting) or by the registration.
    transports: Mutex<BTreeSet<String>>,
}

#[napi]
impl NativeProtocol {
    /// Validates the whole configuration (JSON text); throws `ERR_CONFIG` `path message`.
    #[napi(constructor)]
    pub fn new(config_json: String) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_str(&config_json)
            .map_err(|e| coded(Code::CONFIG, format!("config is not valid JSON: {e}")))?;
        let config = parse_protocol_config(&value).map_err(|e| client_error(e.into()))?;
        Client::check_config(&config).map_err(client_error)?;
        Ok(Self {
            config,
            state: Mutex::new(State::Stopped),
            transports: Mutex::default(),
        })
    }

    /// Configuration warnings worth a log line (for example a lifetime beyond the signature window).
    #[napi(getter)]
    pub fn warnings(&self) -> Vec<String> {
        self.config.warnings.clone()
    }

    /// Starts the client with the application's callbacks: events, durability hook batches,
    /// app carrier frames. Resolves once the app carriers registered so far are up for
    /// `stats()`.
    #[napi(
        ts_args_type = "onEvent: (event: string) => void, onHookBatch: (batch: NativeHookBatch) => void, onAppCarrierSend: (send: NativeAppCarrierSend) => void, onAuthTokenWanted: (requestId: number) => void",
        ts_return_type = "Promise<void>"
    )]
    pub async fn start(
        &self,
        on_event: EventCallback,
        on_hook_batch: HookBatchCallback,
        on_app_carrier_send: AppCarrierSendCallback,
        on_auth_token_wanted: AuthTokenCallback,
    ) -> Settled<()> {
        let gate = Gate::default();
        let opener = Opener(gate.clone());
        let make_app = move |receipts: Receipts| JsApp {
            on_event,
            on_hook_batch,
            on_app_carrier_send,
            on_auth_token_wanted,
            receipts,
            backlog: Backlog::default(),
            gate: Some(gate),
        };
        self.start_with(make_app, opener).await.into()
    }

    /// Stops carriers and timers and releases storage; the callbacks are released with the
    /// driver, so nothing keeps the process alive afterwards.
    #[napi(ts_return_type = "Promise<void>")]
    pub async fn stop(&self) -> Settled<()> {
        self.stop_with().await.into()
    }

    /// The `sendMessage` calls of one turn of the JS event loop, queued synchronously in call
    /// order: one crossing for the burst. The Promise resolves, once every valid one is durably
    /// in the outbox, with one entry per input: its message id, or the error that refused it
    /// (nothing of it queued).
    #[napi(ts_return_type = "Promise<Array<string | Error>>")]
    pub fn send_messages<'env>(
        &self,
        env: &'env Env,
        inputs: Vec<NativeSendInput>,
    ) -> Result<PromiseRaw<'env, Vec<Outcome<String>>>> {
        let client = self.started()?;
        let mut sends = Vec::with_capacity(inputs.len());
        let converted: Vec<Result<()>> = inputs
            .into_iter()
            .map(|input| input.into_send().map(|send| sends.push(send)))
            .collect();
        let mut queued = client.enqueue_sends(sends).into_iter();
        let pending: Vec<Result<Durable>> = converted
            .into_iter()
            .map(|converted| {
                converted?;
                let durable = queued
                    .next()
                    .ok_or_else(|| coded(Code::INTERNAL, "send lost"))?;
                durable.map_err(client_error)
            })
            .collect();
        env.spawn_future(async move {
            let mut outcomes = Vec::with_capacity(pending.len());
            for send in pending {
                let id = match send {
                    Ok(durable) => durable.wait().await.map_err(client_error),
                    Err(e) => Err(e),
                };
                outcomes.push(Outcome(id));
            }
            Ok(outcomes)
        })
        .map_err(|e| coded(Code::INTERNAL, e.reason))
    }

    /// Forwards the message this device received as `messageId` to `to` (an address, or a
    /// group this device is in); resolves with the new message's id once it is durably accepted
    /// (`docs/protocol.md#rich-messages`).
    #[napi(ts_return_type = "Promise<string>")]
    pub async fn forward_message(
        &self,
        message_id: String,
        to: String,
        options: Option<NativeForwardOptions>,
    ) -> Settled<String> {
        let forwarded = async {
            let client = self.started()?;
            let options = options.unwrap_or(NativeForwardOptions {
                id: None,
                priority: None,
            });
            let forward = ForwardInput {
                message_id,
                to,
                id: options.id,
                priority: options.priority,
            };
            client.forward(forward).await.map_err(client_error)
        };
        forwarded.await.into()
    }

    /// Resolves with the request's id once it is durably in the outbox
    /// (`docs/delivery.md#connection-requests`).
    #[napi(ts_return_type = "Promise<string>")]
    pub async fn send_connection_request(
        &self,
        peer: String,
        message: Option<String>,
    ) -> Settled<String> {
        let sent = async {
            let client = self.started()?;
            client
                .request_connection(peer, message)
                .await
                .map_err(client_error)
        };
        sent.await.into()
    }

    /// `answer` is `accept`, `reject` or `cancel`; resolves once the answer is durably in the
    /// outbox.
    #[napi(ts_return_type = "Promise<void>")]
    pub async fn answer_connection(&self, answer: String, request_id: String) -> Settled<()> {
        let answered = async {
            let command = match answer.as_str() {
                "accept" => ConnectionCommand::Accept { id: request_id },
                "reject" => ConnectionCommand::Reject { id: request_id },
                "cancel" => ConnectionCommand::Cancel { id: request_id },
                other => return Err(coded(Code::INTERNAL, format!("no answer {other:?}"))),
            };
            let client = self.started()?;
            client
                .answer_connection(command)
                .await
                .map_err(client_error)
        };
        answered.await.into()
    }

    #[napi(ts_return_type = "Promise<NativeConnectionRequest[]>")]
    pub async fn connection_requests(&self) -> Settled<Vec<NativeConnectionRequest>> {
        let listed = async {
            let requests = self
                .started()?
                .connection_requests()
                .await
                .map_err(client_error)?;
            Ok(requests
                .into_iter()
                .map(|r| NativeConnectionRequest {
                    request_id: r.id,
                    peer: r.peer,
                    incoming: r.incoming,
                    message: r.note,
                    at: r.at as f64,
                })
                .collect())
        };
        listed.await.into()
    }

    /// `explainMessage`: `{ sentence, facts }` as JSON text.
    #[napi(ts_return_type = "Promise<string>")]
    pub async fn explain_message(&self, id: String) -> Settled<String> {
        let explained = async {
            let explanation = self.started()?.explain(id).await.map_err(client_error)?;
            serde_json::to_string(&explanation).map_err(|e| coded(Code::INTERNAL, e))
        };
        explained.await.into()
    }

    /// `messageTimeline`: the message's ledger as JSON text.
    #[napi(ts_return_type = "Promise<string>")]
    pub async fn message_timeline(&self, id: String) -> Settled<String> {
        let timeline = async {
            let timeline = self.started()?.timeline(id).await.map_err(client_error)?;
            Ok(timeline.to_string())
        };
        timeline.await.into()
    }

    #[napi(ts_return_type = "Promise<string>")]
    pub async fn get_message_status(&self, id: String) -> Settled<String> {
        let status = async {
            let status = self.started()?.status(id).await.map_err(client_error)?;
            Ok(status.as_str().to_owned())
        };
        status.await.into()
    }

    #[napi]
    pub fn stats(&self) -> Result<NativeStats> {
        let s = self.started()?.stats();
        Ok(NativeStats {
            outbox_regular: s.outbox_regular as f64,
            outbox_media: s.outbox_media as f64,
            pending_acks: s.pending_acks as f64,
            retry_queue: s.retry_queue as f64,
            parked: s.parked as f64,
            carriers_up: s.carriers_up as f64,
            pre_session: s.pre_session as f64,
            group_sends: s.group_sends as f64,
        })
    }

    #[napi]
    pub fn internet_status_changed(&self, online: bool) -> Result<()> {
        self.started()?.internet_status_changed(online);
        Ok(())
    }

    /// Registers an app carrier, before or after `start()`; it stays registered across
    /// `stop()` and `start()`.
    #[napi]
    pub fn register_transport(&self, name: String) -> Result<()> {
        Client::check_transport_name(&name).map_err(client_error)?;
        let mut transports = self.lock_transports()?;
        if transports.contains(&name) {
            return Err(client_error(ClientError::InvalidArgument(format!(
                "a transport named {name:?} is already registered"
            ))));
        }
        if let Some(client) = self.current() {
            client.register_transport(&name).map_err(client_error)?;
        }
        transports.insert(name);
        Ok(())
    }

    #[napi]
    pub fn neighbor_discovered(&self, peer_id: String, transport: String) -> Result<()> {
        self.started()?
            .neighbor_discovered(&peer_id, &transport)
            .map_err(client_error)
    }

    #[napi]
    pub fn neighbor_lost(&self, peer_id: String, transport: String) -> Result<()> {
        self.started()?
            .neighbor_lost(&peer_id, &transport)
            .map_err(client_error)
    }

    #[napi]
    pub fn receive_frame(&self, transport: String, peer_id: String, frame: Buffer) -> Result<()> {
        self.started()?
            .receive_frame(&transport, &peer_id, frame.as_ref())
            .map_err(client_error)
    }

    /// The facade's report on a durability hook batch (`onHookBatch`).
    #[napi]
    pub fn hook_done(&self, batch_id: i64, ok: bool, reason: Option<String>) -> Result<()> {
        let batch_id = u64::try_from(batch_id)
            .map_err(|_| coded(Code::INVALID_ARGUMENT, "batchId must not be negative"))?;
        let result = if ok {
            Ok(())
        } else {
            Err(reason.unwrap_or_else(|| "the hook failed".into()))
        };
        self.started()?.hook_done(batch_id, result);
        Ok(())
    }

    /// The facade's report on a frame an app carrier was handed (`onAppCarrierSend`).
    #[napi]
    pub fn app_carrier_send_done(
        &self,
        message_id: String,
        send_seq: i64,
        ok: bool,
        reason: Option<String>,
    ) -> Result<()> {
        let send_seq = u64::try_from(send_seq)
            .map_err(|_| coded(Code::INVALID_ARGUMENT, "sendSeq must not be negative"))?;
        let result = if ok {
            Ok(())
        } else {
            Err(reason.unwrap_or_else(|| "the transport's send failed".into()))
        };
        let attempt = SendAttempt {
            message_id,
            send_seq,
        };
        self.started()?.app_carrier_send_done(attempt, result);
        Ok(())
    }

    /// The app's token provider answered request `requestId`: `token`, or `error` saying why
    /// it has none. An answer that comes after its connect gave up is dropped.
    #[napi]
    pub fn auth_token_provided(
        &self,
        request_id: f64,
        token: Option<String>,
        error: Option<String>,
    ) -> Result<()> {
        let provided = match (token, error) {
            (Some(token), None) => Ok(token),
            (None, Some(error)) => Err(error),
            _ => {
                return Err(coded(
                    Code::INVALID_ARGUMENT,
                    "exactly one of token and error is given",
                ))
            }
        };
        // A request id is a whole number the native side handed out.
        self.started()?
            .auth_token_provided(request_id as u64, provided);
        Ok(())
    }

    /// Replaces the fixed relay token for the next connect.
    #[napi]
    pub fn set_auth_token(&self, token: String) -> Result<()> {
        self.started()?.set_auth_token(&token).map_err(client_error)
    }

    /// Drops the relay connection, if one is up, and dials again at once.
    #[napi]
    pub fn reconnect(&self) -> Result<()> {
        self.started()?.reconnect();
        Ok(())
    }

    /// This device's `off1` address (after `start()`).
    #[napi]
    pub fn local_address(&self) -> Result<String> {
        Ok(self.started()?.local_address().to_owned())
    }

    #[napi]
    pub fn internet_presence_watchlist(&self) -> Result<Vec<String>> {
        Ok(self.started()?.presence_watchlist())
    }

    #[napi(getter)]
    pub fn is_started(&self) -> bool {
        self.current().is_some()
    }
}

impl NativeProtocol {
    /// Starts the client; the driver hands the facade nothing until `opener` is dropped, which
    /// happens once the protocol is started (or the start failed).
    async fn start_with(
        &self,
        make_app: impl FnOnce(Receipts) -> JsApp + Send + 'static,
        opener: Opener,
    ) -> Result<()> {
        let mut config = self.config.clone();
        config.app_carriers = self.lock_transports()?.clone();
        let at_launch = config.app_carriers.clone();
        {
            let mut state = self.lock()?;
            if !matches!(*state, State::Stopped) {
                return Err(client_error(ClientError::AlreadyStarted));
            }
            *state = State::Starting;
        }
        let runtime = tokio::runtime::Handle::current();
        let started = tokio::task::spawn_blocking(move || {
            Client::start_with_receipts(&config, make_app, &runtime)
        })
        .await
        .map_err(|e| coded(Code::INTERNAL, e))
        .and_then(|r| r.map_err(client_error));
        let client = started.inspect_err(|_| {
            if let Ok(mut state) = self.state.lock() {
                *state = State::Stopped;
            }
        })?;
        let client = Arc::new(client);
        let applied = self.lock_transports().and_then(|transports| {
            // Registered while the client was starting.
            for name in transports.difference(&at_launch) {
                client.register_transport(name).map_err(client_error)?;
            }
            *self.lock()? = State::Started(client.clone());
            Ok(())
        });
        drop(opener);
        if applied.is_err() {
            client.stop().await;
            if let Ok(mut state) = self.state.lock() {
                *state = State::Stopped;
            }
            return applied;
        }
        // A registration made while starting is applied and published before `start()`
        // resolves, so the app reads its carriers as up. An error only means a `stop()` came
        // first.
        let _ = client.sync().await;
        Ok(())
    }

    async fn stop_with(&self) -> Result<()> {
        let client = {
            let mut state = self.lock()?;
            match std::mem::replace(&mut *state, State::Stopped) {
                State::Started(client) => Some(client),
                // A start in progress finishes on its own; stopping is for a started protocol.
                other => {
                    *state = other;
                    None
                }
            }
        };
        if let Some(client) = client {
            client.stop().await;
        }
        Ok(())
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>> {
        self.state
            .lock()
            .map_err(|_| coded(Code::INTERNAL, "state lock poisoned"))
    }

    fn lock_transports(&self) -> Result<std::sync::MutexGuard<'_, BTreeSet<String>>> {
        self.transports
            .lock()
            .map_err(|_| coded(Code::INTERNAL, "transport registry poisoned"))
    }

    fn current(&self) -> Option<Arc<Client>> {
        match &*self.state.lock().ok()? {
            State::Started(client) => Some(client.clone()),
            _ => None,
        }
    }

    pub(crate) fn started(&self) -> Result<Arc<Client>> {
        self.current()
            .ok_or_else(|| client_error(ClientError::NotStarted))
    }
}
