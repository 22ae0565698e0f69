//! What the client's integration tests share: a started client with its events, and waiting
//! for an event under a deadline (never a fixed sleep).
// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::sync::mpsc;
use std::time::{Duration, Instant};

use courier_client::client::Client;
use courier_client::config::ProtocolConfig;
use courier_client::event::ClientEvent;
use courier_engine::Event;

/// Starts `config` on the current tokio runtime; every event goes to the receiver.
pub fn start(config: &ProtocolConfig) -> (Client, mpsc::Receiver<ClientEvent>) {
    let (tx, events) = mpsc::channel();
    let sink = Box::new(move |e: ClientEvent| {
        let _ = tx.send(e);
    });
    let client = Client::start(config, sink, &tokio::runtime::Handle::current()).unwrap();
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
