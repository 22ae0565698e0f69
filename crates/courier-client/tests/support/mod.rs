//! What the client's integration tests share: a started client with its events, and waiting
//! for an event under a deadline (never a fixed sleep).
// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::sync::mpsc;
use std::time::{Duration, Instant};

use courier_client::app::{App, AppCarrierSend};
use courier_client::client::Client;
use courier_client::config::ProtocolConfig;
use courier_client::event::ClientEvent;
use courier_engine::{Event, HookBatch};

/// An application with no durability hook and no app carrier: only events reach it, and `F`
/// takes each one. Anything else would be a bug, and fails loudly.
pub struct Events<F>(pub F);

impl<F: FnMut(ClientEvent) + Send + 'static> App for Events<F> {
    fn event(&mut self, event: ClientEvent) {
        (self.0)(event);
    }

    fn hook_batch(&mut self, batch: HookBatch) {
        panic!(
            "no durability hook is configured, yet batch {} came",
            batch.id
        );
    }

    fn app_carrier_send(&mut self, send: AppCarrierSend) {
        panic!(
            "no app carrier is registered, yet {} got a frame",
            send.carrier
        );
    }

    fn auth_token_wanted(&mut self, request: u64) {
        panic!("no token provider is configured, yet request {request} came");
    }
}

/// Starts `config` on the current tokio runtime; every event goes to the receiver.
pub fn start(config: &ProtocolConfig) -> (Client, mpsc::Receiver<ClientEvent>) {
    let (tx, events) = mpsc::channel();
    let app = Events(move |e| {
        let _ = tx.send(e);
    });
    let client = Client::start(config, app, &tokio::runtime::Handle::current()).unwrap();
    (client, events)
}

/// The first event matching `pred` within 10 s; the ones before it are consumed.
pub async fn wait_for(
    events: &mpsc::Receiver<ClientEvent>,
    what: &str,
    pred: impl Fn(&ClientEvent) -> bool,
) -> ClientEvent {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match events.try_recv() {
            Ok(e) if pred(&e) => return e,
            Ok(_) => {}
            Err(mpsc::TryRecvError::Empty) => {
                assert!(Instant::now() < deadline, "timed out waiting for {what}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(mpsc::TryRecvError::Disconnected) => panic!("events ended before {what}"),
        }
    }
}

/// A `security_warning`'s peer, code and reason.
pub fn warning(e: &ClientEvent) -> Option<(String, &'static str, String)> {
    match e {
        ClientEvent::Engine(e) => match &**e {
            Event::SecurityWarning {
                peer_id,
                reason_code,
                reason,
            } => Some((peer_id.clone(), *reason_code, reason.clone())),
            _ => None,
        },
        _ => None,
    }
}

/// The relay carrier came up.
pub fn connected(e: &ClientEvent) -> bool {
    matches!(
        e,
        ClientEvent::RelayStatusChanged {
            connected: true,
            ..
        }
    )
}

/// The address an `identity_ready` names.
pub fn address(e: &ClientEvent) -> Option<String> {
    match e {
        ClientEvent::IdentityReady { address } => Some(address.clone()),
        _ => None,
    }
}

/// The engine event inside a client event.
pub fn engine(e: &ClientEvent) -> Option<&Event> {
    e.engine()
}

/// The config of app `name` (app id `app_id`) with its database in `dir`, over the relay at
/// `url` with a token signed by `secret`; `extra` adds top-level keys.
pub fn relay_app(
    app_id: &str,
    name: &str,
    dir: &std::path::Path,
    url: &str,
    secret: &[u8],
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut config = serde_json::json!({
        "appId": app_id,
        "storage": { "path": dir.join(format!("{name}.db")) },
        "transports": { "internet": {
            "url": url,
            "authToken": courier_relay::issue_token(secret, name, 3600).unwrap(),
        } },
    });
    if let (Some(config), serde_json::Value::Object(extra)) = (config.as_object_mut(), extra) {
        config.extend(extra);
    }
    config
}

/// Which way a frame crosses [`proxy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toward {
    Relay,
    Client,
}

/// Sees every text frame crossing [`proxy`]; what it returns is written to the client right
/// after that frame.
pub type Tap = std::sync::Arc<dyn Fn(Toward, &str) -> Vec<String> + Send + Sync>;

/// A WebSocket proxy on a loopback port in front of the relay at `relay`: every text frame in
/// either direction is forwarded and shown to `tap`. Returns the proxy's URL.
pub async fn proxy(relay: String, tap: Tap) -> String {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message as WsMessage;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (relay, tap) = (relay.clone(), std::sync::Arc::clone(&tap));
            tokio::spawn(async move {
                let Ok(client) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                let Ok((upstream, _)) = tokio_tungstenite::connect_async(relay.as_str()).await
                else {
                    return;
                };
                let (mut to_client, mut from_client) = client.split();
                let (mut to_relay, mut from_relay) = upstream.split();
                loop {
                    let (toward, frame) = tokio::select! {
                        m = from_client.next() => (Toward::Relay, m),
                        m = from_relay.next() => (Toward::Client, m),
                    };
                    let Some(Ok(frame)) = frame else { break };
                    let injected = match &frame {
                        WsMessage::Text(text) => tap(toward, text.as_str()),
                        _ => Vec::new(),
                    };
                    let sent = match toward {
                        Toward::Relay => to_relay.send(frame).await,
                        Toward::Client => to_client.send(frame).await,
                    };
                    if sent.is_err() {
                        break;
                    }
                    for extra in injected {
                        if to_client.send(WsMessage::text(extra)).await.is_err() {
                            break;
                        }
                    }
                }
                let _ = to_client.close().await;
                let _ = to_relay.close().await;
            });
        }
    });
    url
}
