//! `Client`: what the binding holds while a `Protocol` is started.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};
use std::thread;

use courier_crypto::Sessions;
use courier_engine::{Carrier, DiagnosticLevel, InboundOrigin, Input, Stats};
use courier_proto::limits::MAX_FRAME_BYTES;
use courier_proto::{validate_identifier, IdentityKey, Message};
use tokio::runtime::Handle;
use tokio::sync::{mpsc as tokio_mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::app::{App, LevelFiltered, SendAttempt};
use crate::carrier::gateway::{self, GatewayOut, GatewaySettings};
use crate::carrier::relay::token::{ProviderRequests, TokenSource};
use crate::carrier::relay::{self, RelayOut, RelaySettings};
use crate::carrier::tls;
use crate::config::{AuthToken, ProtocolConfig, StorageConfig};
use crate::driver::connections::{ConnectionCommand, Connections};
use crate::driver::e2e::E2e;
use crate::driver::groups::{GroupCommand, GroupInfo, GroupSendInput, Groups};
use crate::driver::media::Media;
use crate::driver::{
    self, Accept, Command, Driver, DriverTx, IdOrigin, Published, Receipts, Wiring,
};
use crate::error::ClientError;
use crate::event::ClientEvent;
use crate::media_send::{self, MediaInput};
/// Named from here by the binding and the tests since before `send` owned it.
pub use crate::send::SendInput;
use crate::send::{check_direct_recipient, validate_send, ContentCap, ForwardInput};
use crate::store::{GroupSendStatus, MessageStatus, PendingRequest, Store};

/// A queued send's answer: the message id once it is durably in the outbox.
pub struct Durable(oneshot::Receiver<Result<String, ClientError>>);

impl Durable {
    pub async fn wait(self) -> Result<String, ClientError> {
        self.0.await.map_err(|_| ClientError::NotStarted)?
    }
}

pub struct Client {
    /// This device's `off1` address, derived from its persisted identity key.
    address: String,
    driver: DriverTx,
    relay_tx: Option<tokio_mpsc::UnboundedSender<RelayOut>>,
    /// Where the relay carrier takes each connection's token from.
    relay_token: Option<TokenSource>,
    gateway_tx: Option<tokio_mpsc::UnboundedSender<GatewayOut>>,
    published: Published,
    /// Names of the app carriers registered so far (a carrier cannot be unregistered).
    transports: Mutex<BTreeSet<String>>,
    /// Taken by `stop`, which may run while sends are still awaiting their reply.
    running: Mutex<Option<Running>>,
    /// Messages travel sealed in end-to-end sessions.
    encryption: bool,
    /// `media.maxFileSize`, checked before a file is read.
    max_file_size: u64,
}

struct Running {
    driver_thread: thread::JoinHandle<()>,
    relay_task: Option<JoinHandle<()>>,
    gateway_task: Option<JoinHandle<()>>,
}

impl Client {
    /// Checks what only the runtime can: a durability hook needs a storage file.
    pub fn check_config(config: &ProtocolConfig) -> Result<(), ClientError> {
        if config.has_durability_hook && config.storage == StorageConfig::Memory {
            return Err(ClientError::UnsupportedDurabilityBackend);
        }
        Ok(())
    }

    /// Opens storage (refused if another `Protocol` holds it), restores the outbox with a
    /// refreshed window, registers `config.app_carriers`, starts the driver and connects the
    /// carriers; what they produce goes to `app`. For an app that handles each event before [`App::event`] returns: a terminal
    /// event counts as reported once dispatched.
    pub fn start(
        config: &ProtocolConfig,
        app: impl App,
        runtime: &Handle,
    ) -> Result<Self, ClientError> {
        Self::launch(config, |_| Box::new(app), false, runtime)
    }

    /// For an app whose [`App::event`] queues events for another thread: `make_app` gets the
    /// [`Receipts`] through which the application confirms each terminal event once its
    /// listeners ran. An event not confirmed stays held in storage, and the next start emits
    /// it again.
    pub fn start_with_receipts<A: App>(
        config: &ProtocolConfig,
        make_app: impl FnOnce(Receipts) -> A,
        runtime: &Handle,
    ) -> Result<Self, ClientError> {
        Self::launch(
            config,
            |receipts| Box::new(make_app(receipts)),
            true,
            runtime,
        )
    }

    fn launch(
        config: &ProtocolConfig,
        make_app: impl FnOnce(Receipts) -> Box<dyn App>,
        receipts: bool,
        runtime: &Handle,
    ) -> Result<Self, ClientError> {
        let tls = match &config.internet {
            Some(internet) if internet.tls => Some(
                tls::client_config(internet.ca_certificates.as_deref())
                    .map_err(ClientError::InvalidArgument)?,
            ),
            _ => None,
        };
        let mut store = match &config.storage {
            StorageConfig::Path(path) => Store::open(path)?,
            StorageConfig::Memory => Store::open_memory()?,
        };
        let now = driver::now_ms();
        let unreported = store.unreported()?;
        // The identity is durable before anything uses it, and never replaced
        // (`docs/protocol.md#identity-key`).
        let app_key = config.identity_seal_key.as_ref().map(|k| k.bytes());
        let seed = store.load_or_create_identity(now, app_key, || {
            IdentityKey::generate()
                .map(|key| key.seed())
                .map_err(|e| format!("cannot generate an identity key: {e}"))
        })?;
        let identity = IdentityKey::from_seed(seed);
        let address = identity.address().to_string();
        for name in &config.app_carriers {
            Self::check_transport_name(name)?;
        }
        let media = Media::restore(
            &store,
            config.media.clone(),
            identity.clone(),
            config.app_id.clone(),
            config.internet.is_some() || config.gateway.is_some(),
            config.engine.outbox_max_media_entries,
            &store.load_outbox()?,
            now,
        )?;
        let withheld = media.media.withheld();
        let mut engine =
            driver::restored_engine(&mut store, &config.engine, &address, now, &withheld)?;
        let e2e = if config.engine.encryption {
            let sessions = Sessions::restore(identity.clone(), store.load_sessions()?)
                .map_err(|e| ClientError::Storage(format!("cannot load the session state: {e}")))?;
            let e2e = E2e::new(sessions, identity.clone(), config.app_id.clone());
            for recipient in e2e.ready() {
                engine.handle(Input::SessionReady { recipient }, now);
            }
            Some(e2e)
        } else {
            None
        };
        // Before the driver publishes anything, and before any carrier reports: every getter
        // and every event sees these carriers up.
        for name in &config.app_carriers {
            engine.handle(Input::CarrierUp(Carrier::Local(name.clone())), now);
        }

        let (driver_tx, driver_rx) = driver::channel();
        let app = LevelFiltered {
            app: make_app(Receipts::new(driver_tx.clone())),
            threshold: config.log_level,
        };
        // The first event of every start: the address this device sends as.
        driver_tx.send(Command::Emit(ClientEvent::IdentityReady {
            address: address.clone(),
        }));
        // Transfers from bytes the last process held: the app hands them over again.
        for event in media.events {
            driver_tx.send(Command::Emit(ClientEvent::Media(Box::new(event))));
        }
        // Terminal events a crash cut off between their commit and their dispatch.
        for (message_id, json) in unreported {
            match serde_json::from_str(&json) {
                Ok(json) => {
                    driver_tx.send(Command::Emit(ClientEvent::Replayed { message_id, json }))
                }
                Err(e) => driver_tx.send(Command::Emit(ClientEvent::Diagnostic {
                    level: DiagnosticLevel::Error,
                    message: format!("cannot replay the terminal event of {message_id}: {e}"),
                    target: "courier_client::store",
                })),
            }
        }
        let relay_token = config
            .internet
            .as_ref()
            .map(|internet| match &internet.auth_token {
                AuthToken::Fixed(token) => TokenSource::fixed(token.clone()),
                AuthToken::Provided => TokenSource::Provided(ProviderRequests::default()),
            });
        let relay = config
            .internet
            .as_ref()
            .zip(relay_token.clone())
            .map(|(internet, token)| {
                let (tx, rx) = tokio_mpsc::unbounded_channel();
                let settings = RelaySettings {
                    urls: internet.urls.clone(),
                    token,
                    tls: tls.clone(),
                    auto_reconnect: internet.auto_reconnect,
                    offline_redial: internet.offline_redial,
                    identity: identity.clone(),
                };
                let task = runtime.spawn(relay::run(settings, rx, driver_tx.clone()));
                (tx, task)
            });
        let gateway = config.gateway.as_ref().map(|gateway| {
            let (tx, rx) = tokio_mpsc::unbounded_channel();
            let settings = GatewaySettings {
                address: gateway.address.clone(),
                identity: identity.clone(),
                token: gateway.token.clone(),
                timings: gateway.timings,
            };
            let task = runtime.spawn(gateway::run(settings, rx, driver_tx.clone()));
            (tx, task)
        });
        let connections = Connections::restore(
            &store,
            identity.clone(),
            config.app_id.clone(),
            config.unknown_senders,
        )?;
        let groups = Groups::restore(
            &store,
            identity.clone(),
            config.app_id.clone(),
            config.group_relay_broadcast,
        )?;
        let published = Published::default();
        let wiring = Wiring {
            rx: driver_rx,
            app: Box::new(app),
            relay: relay.as_ref().map(|(tx, _)| tx.clone()),
            gateway: gateway.as_ref().map(|(tx, _)| tx.clone()),
            published: published.clone(),
            receipts,
            e2e,
            connections,
            groups,
            media: media.media,
        };
        let driver = Driver::new(
            engine,
            store,
            config.engine.clone(),
            address.clone(),
            wiring,
        );
        let driver_thread = thread::Builder::new()
            .name("courier-driver".into())
            .spawn(move || driver.run())
            .map_err(|e| ClientError::Internal(format!("cannot start the driver thread: {e}")))?;
        let (relay_tx, relay_task) = relay.unzip();
        let (gateway_tx, gateway_task) = gateway.unzip();
        Ok(Self {
            encryption: config.engine.encryption,
            max_file_size: config.media.max_file_size,
            address,
            driver: driver_tx,
            relay_tx,
            relay_token,
            gateway_tx,
            published,
            transports: Mutex::new(config.app_carriers.clone()),
            running: Mutex::new(Some(Running {
                driver_thread,
                relay_task,
                gateway_task,
            })),
        })
    }

    /// Validates and queues a send at once, so sends reach the outbox in call order; the
    /// returned future resolves once the message is durably in the outbox.
    pub fn enqueue_send(
        &self,
        input: SendInput,
    ) -> Result<
        impl std::future::Future<Output = Result<String, ClientError>> + Send + 'static,
        ClientError,
    > {
        let queued = self.enqueue_sends(vec![input]).pop();
        let durable = queued.unwrap_or(Err(ClientError::NotStarted))?;
        Ok(durable.wait())
    }

    /// [`Client::enqueue_send`] for a burst: the valid sends cross to the driver together, in
    /// order, and an invalid one is refused alone (nothing of it queued).
    pub fn enqueue_sends(&self, inputs: Vec<SendInput>) -> Vec<Result<Durable, ClientError>> {
        let mut accepts = Vec::with_capacity(inputs.len());
        let queued = inputs
            .into_iter()
            .map(|input| {
                let id = match input.id {
                    Some(_) => IdOrigin::App,
                    None => IdOrigin::Minted,
                };
                let req = validate_send(input, ContentCap::Applies)?;
                check_direct_recipient(&req.recipient, self.encryption)?;
                let (reply, rx) = oneshot::channel();
                accepts.push(Accept::new(req, id, reply));
                Ok(Durable(rx))
            })
            .collect();
        if !accepts.is_empty() {
            self.driver.send(Command::Send(accepts));
        }
        queued
    }

    /// `sendMedia`: resolves with the file id once the transfer is durably accepted. The source
    /// is hashed first, on a blocking thread: a large file takes a moment.
    pub async fn send_media(&self, input: MediaInput) -> Result<String, ClientError> {
        let (encryption, max) = (self.encryption, self.max_file_size);
        let command =
            tokio::task::spawn_blocking(move || media_send::prepare(input, encryption, max))
                .await
                .map_err(|e| ClientError::Internal(format!("hashing the file stopped: {e}")))??;
        let (reply, rx) = oneshot::channel();
        self.driver.send(Command::Media {
            command: Box::new(command),
            reply,
        });
        rx.await.map_err(|_| ClientError::NotStarted)?
    }

    pub async fn send(&self, input: SendInput) -> Result<String, ClientError> {
        self.enqueue_send(input)?.await
    }

    /// `forwardMessage`: sends a message this device received, with its forward origin, to an
    /// address or to a group this device is in; resolves with the new message's id once it is
    /// durably accepted (`docs/protocol.md#rich-messages`). `ERR_MESSAGE_NOT_FOUND` when this
    /// device keeps no received message with that id.
    pub async fn forward(&self, forward: ForwardInput) -> Result<String, ClientError> {
        let (reply, rx) = oneshot::channel();
        self.driver.send(Command::Forward { forward, reply });
        rx.await.map_err(|_| ClientError::NotStarted)?
    }

    /// `sendConnectionRequest`: resolves with the request's id once it is durably in the outbox
    /// (`docs/delivery.md#connection-requests`).
    pub async fn request_connection(
        &self,
        peer: String,
        note: Option<String>,
    ) -> Result<String, ClientError> {
        self.connection(ConnectionCommand::Request { peer, note })
            .await
    }

    /// Accepts, rejects or withdraws request `id`; resolves once the answer is durably in the
    /// outbox.
    pub async fn answer_connection(&self, command: ConnectionCommand) -> Result<(), ClientError> {
        self.connection(command).await.map(drop)
    }

    async fn connection(&self, command: ConnectionCommand) -> Result<String, ClientError> {
        let (reply, rx) = oneshot::channel();
        self.driver.send(Command::Connection { command, reply });
        rx.await.map_err(|_| ClientError::NotStarted)?
    }

    /// `createGroup`: resolves with the new group's id once it exists with every member in it,
    /// durably (`docs/protocol.md#group-messages`).
    pub async fn create_group(
        &self,
        name: String,
        members: Vec<String>,
    ) -> Result<String, ClientError> {
        self.group(GroupCommand::Create { name, members }).await
    }

    pub async fn add_group_member(
        &self,
        group_id: String,
        member: String,
    ) -> Result<(), ClientError> {
        self.group(GroupCommand::Add { group_id, member })
            .await
            .map(drop)
    }

    pub async fn remove_group_member(
        &self,
        group_id: String,
        member: String,
    ) -> Result<(), ClientError> {
        self.group(GroupCommand::Remove { group_id, member })
            .await
            .map(drop)
    }

    pub async fn leave_group(&self, group_id: String) -> Result<(), ClientError> {
        self.group(GroupCommand::Leave { group_id }).await.map(drop)
    }

    /// `sendGroupMessage`: resolves with the message's one logical id once it is durably
    /// accepted (`docs/delivery.md#group-sends`). `input.recipient` is the group.
    pub async fn send_group(&self, input: SendInput) -> Result<String, ClientError> {
        let request = validate_send(input, ContentCap::Exempt)?;
        let group_id = request.recipient.clone();
        self.group(GroupCommand::Send(GroupSendInput { group_id, request }))
            .await
    }

    async fn group(&self, command: GroupCommand) -> Result<String, ClientError> {
        let (reply, rx) = oneshot::channel();
        self.driver.send(Command::Group { command, reply });
        rx.await.map_err(|_| ClientError::NotStarted)?
    }

    /// `getGroupMessageStatus`: each member's state, from storage; `None` for an id this
    /// device never sent to a group (or forgot).
    pub async fn group_message_status(
        &self,
        id: String,
    ) -> Result<Option<GroupSendStatus>, ClientError> {
        let (reply, rx) = oneshot::channel();
        self.driver.send(Command::GroupStatus { id, reply });
        rx.await.map_err(|_| ClientError::NotStarted)?
    }

    pub async fn list_groups(&self) -> Result<Vec<GroupInfo>, ClientError> {
        let (reply, rx) = oneshot::channel();
        self.driver.send(Command::ListGroups { reply });
        rx.await.map_err(|_| ClientError::NotStarted)
    }

    /// The connection requests waiting for an answer, this device's and others', oldest first.
    pub async fn connection_requests(&self) -> Result<Vec<PendingRequest>, ClientError> {
        let (reply, rx) = oneshot::channel();
        self.driver.send(Command::ConnectionRequests { reply });
        rx.await.map_err(|_| ClientError::NotStarted)
    }

    pub async fn status(&self, id: String) -> Result<MessageStatus, ClientError> {
        let (reply, rx) = oneshot::channel();
        self.driver.send(Command::Status { id, reply });
        rx.await.map_err(|_| ClientError::NotStarted)?
    }

    /// `explainMessage`: message `id`'s life as a sentence and its facts, from the ledger
    /// (`docs/delivery.md#a-messages-life`); `MessageNotFound` when the ledger has no `id`.
    pub async fn explain(
        &self,
        id: String,
    ) -> Result<crate::ledger::explain::Explanation, ClientError> {
        let (reply, rx) = oneshot::channel();
        self.driver.send(Command::Explain { id, reply });
        rx.await.map_err(|_| ClientError::NotStarted)?
    }

    /// `messageTimeline`: message `id`'s ledger as JSON; `MessageNotFound` when it has none.
    pub async fn timeline(&self, id: String) -> Result<serde_json::Value, ClientError> {
        let (reply, rx) = oneshot::channel();
        self.driver.send(Command::Timeline { id, reply });
        rx.await.map_err(|_| ClientError::NotStarted)?
    }

    /// Resolves once every call made before it has been applied and what the getters read
    /// ([`stats`](Self::stats), [`presence_watchlist`](Self::presence_watchlist)) reflects it.
    pub async fn sync(&self) -> Result<(), ClientError> {
        let (reply, rx) = oneshot::channel();
        self.driver.send(Command::Sync(reply));
        rx.await.map_err(|_| ClientError::NotStarted)
    }

    /// The counts as of the driver's last step.
    pub fn stats(&self) -> Stats {
        self.published.stats.lock().map(|s| *s).unwrap_or_default()
    }

    pub fn local_address(&self) -> &str {
        &self.address
    }

    /// The recipients whose presence the engine watches: those of pending and parked messages.
    pub fn presence_watchlist(&self) -> Vec<String> {
        self.published
            .watchlist
            .lock()
            .map(|w| w.clone())
            .unwrap_or_default()
    }

    /// Whether `name` may name an app carrier: an identifier that no built-in carrier uses.
    pub fn check_transport_name(name: &str) -> Result<(), ClientError> {
        if let Err(e) = validate_identifier(name) {
            return Err(ClientError::InvalidArgument(format!("transport name {e}")));
        }
        if [Carrier::Relay, Carrier::Gateway]
            .iter()
            .any(|carrier| carrier.name() == name)
        {
            return Err(ClientError::InvalidArgument(format!(
                "transport name {name:?} is a built-in carrier's"
            )));
        }
        Ok(())
    }

    /// Registers an app-supplied carrier; it reaches the peers it reports as neighbors.
    pub fn register_transport(&self, name: &str) -> Result<(), ClientError> {
        Self::check_transport_name(name)?;
        let mut transports = self.lock_transports()?;
        if !transports.insert(name.to_owned()) {
            return Err(ClientError::InvalidArgument(format!(
                "a transport named {name:?} is already registered"
            )));
        }
        self.driver
            .input(Input::CarrierUp(Carrier::Local(name.to_owned())));
        Ok(())
    }

    fn lock_transports(&self) -> Result<std::sync::MutexGuard<'_, BTreeSet<String>>, ClientError> {
        self.transports
            .lock()
            .map_err(|_| ClientError::Internal("transport registry poisoned".into()))
    }

    fn registered(&self, transport: &str, peer: &str) -> Result<(), ClientError> {
        if !self.lock_transports()?.contains(transport) {
            return Err(ClientError::InvalidArgument(format!(
                "no transport named {transport:?} is registered"
            )));
        }
        validate_identifier(peer).map_err(|e| ClientError::InvalidArgument(format!("peerId {e}")))
    }

    pub fn neighbor_discovered(&self, peer: &str, transport: &str) -> Result<(), ClientError> {
        self.registered(transport, peer)?;
        self.driver.input(Input::NeighborDiscovered {
            peer: peer.to_owned(),
            carrier: transport.to_owned(),
        });
        Ok(())
    }

    pub fn neighbor_lost(&self, peer: &str, transport: &str) -> Result<(), ClientError> {
        self.registered(transport, peer)?;
        self.driver.input(Input::NeighborLost {
            peer: peer.to_owned(),
            carrier: transport.to_owned(),
        });
        Ok(())
    }

    /// A frame from `peer` on an app carrier. A frame that is not a valid message is the peer's
    /// fault, not the app's: it is dropped with a diagnostic, never thrown.
    pub fn receive_frame(
        &self,
        transport: &str,
        peer: &str,
        frame: &[u8],
    ) -> Result<(), ClientError> {
        self.registered(transport, peer)?;
        let parsed = std::str::from_utf8(frame)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                if text.len() > MAX_FRAME_BYTES {
                    return Err(format!("frame of {} bytes is over the limit", text.len()));
                }
                Message::decode(text).map_err(|e| e.to_string())
            });
        match parsed {
            Ok(message) => self.driver.input(Input::Inbound {
                message: Box::new(message),
                origin: InboundOrigin {
                    carrier: Carrier::Local(transport.to_owned()),
                    stamped_sender: peer.to_owned(),
                    sender_account: None,
                    seq: None,
                    sealed_by: None,
                },
            }),
            Err(reason) => self.driver.send(Command::Emit(ClientEvent::Diagnostic {
                level: DiagnosticLevel::Warn,
                message: format!("dropped a frame from {peer} on {transport}: {reason}"),
                target: "courier_client::local",
            })),
        }
        Ok(())
    }

    /// The app's durability hook settled batch `batch_id`.
    pub fn hook_done(&self, batch_id: u64, result: Result<(), String>) {
        self.driver.input(Input::HookResult { batch_id, result });
    }

    /// The app carrier's verdict on `attempt` ([`AppCarrierSend::attempt`]): the frame was
    /// written, or not (`Err` carries the carrier's reason).
    ///
    /// [`AppCarrierSend::attempt`]: crate::app::AppCarrierSend::attempt
    pub fn app_carrier_send_done(&self, attempt: SendAttempt, result: Result<(), String>) {
        let SendAttempt {
            message_id: id,
            send_seq,
        } = attempt;
        self.driver.input(match result {
            Ok(()) => Input::Written { id, send_seq },
            Err(reason) => Input::SendFailed {
                id,
                send_seq,
                reason,
            },
        });
    }

    /// The OS's network hint: `true` reconnects now, `false` marks the relay carrier down.
    pub fn internet_status_changed(&self, online: bool) {
        if let Some(tx) = &self.relay_tx {
            let _ = tx.send(RelayOut::Hint(online));
        }
    }

    /// Drops the relay connection, if one is up, and dials again at once: after a resume from
    /// sleep the socket may be dead without anyone knowing yet.
    pub fn reconnect(&self) {
        if let Some(tx) = &self.relay_tx {
            let _ = tx.send(RelayOut::Reconnect);
        }
    }

    /// Replaces the fixed relay token; the next connect presents it, and a wait after the relay
    /// refused the old one ends now. Refused when no relay is configured, or when its token
    /// comes from the application's provider.
    pub fn set_auth_token(&self, token: &str) -> Result<(), ClientError> {
        if token.trim().is_empty() {
            return Err(ClientError::InvalidArgument(
                "token must be a non-empty string".into(),
            ));
        }
        match &self.relay_token {
            None => Err(ClientError::InvalidArgument(
                "no relay is configured (transports.internet)".into(),
            )),
            Some(TokenSource::Provided(_)) => Err(ClientError::InvalidArgument(
                "authToken is a provider function, which every connect asks; setAuthToken \
                 replaces a fixed token"
                    .into(),
            )),
            Some(TokenSource::Fixed(fixed)) => {
                *fixed.lock().unwrap_or_else(PoisonError::into_inner) = token.to_owned();
                if let Some(tx) = &self.relay_tx {
                    let _ = tx.send(RelayOut::TokenChanged);
                }
                Ok(())
            }
        }
    }

    /// The application provider's answer to token request `request`
    /// ([`App::auth_token_wanted`]). An answer that comes too late is dropped.
    pub fn auth_token_provided(&self, request: u64, provided: Result<String, String>) {
        let provided = provided.and_then(|token| {
            if token.trim().is_empty() {
                Err("the token provider returned an empty token".into())
            } else {
                Ok(token)
            }
        });
        if let Some(TokenSource::Provided(requests)) = &self.relay_token {
            requests.answer(request, provided);
        }
    }

    /// Closes the carriers, lets the driver finish its step and releases the store. Sends still
    /// waiting for their step are answered `ERR_NOT_STARTED`.
    pub async fn stop(&self) {
        let Some(running) = self.running.lock().ok().and_then(|mut r| r.take()) else {
            return;
        };
        if let Some(tx) = &self.relay_tx {
            let _ = tx.send(RelayOut::Stop);
        }
        if let Some(tx) = &self.gateway_tx {
            let _ = tx.send(GatewayOut::Stop);
        }
        for task in [running.relay_task, running.gateway_task]
            .into_iter()
            .flatten()
        {
            let _ = task.await;
        }
        let (reply, rx) = oneshot::channel();
        self.driver.send(Command::Stop { reply });
        let _ = rx.await;
        let _ = tokio::task::spawn_blocking(move || running.driver_thread.join()).await;
    }
}
