//! A Rust embedder's view: two devices linked by an in-memory app carrier, registered at start,
//! one of them with a durability hook. Hook batches and app carrier frames reach the
//! application through their own callbacks, with their own types; the event callback gets only
//! events.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use courier_client::app::{App, AppCarrierSend};
use courier_client::client::{Client, SendInput};
use courier_client::config::parse_protocol_config;
use courier_client::event::ClientEvent;
use courier_engine::{BatchOrigin, Event, HookBatch};
use courier_proto::{wire_id, Message};
use serde_json::json;

/// What an application was handed, each callback on its own channel.
struct Handed {
    events: mpsc::Receiver<ClientEvent>,
    hook_batches: mpsc::Receiver<HookBatch>,
    sends: mpsc::Receiver<AppCarrierSend>,
}

struct Channels {
    events: mpsc::Sender<ClientEvent>,
    hook_batches: mpsc::Sender<HookBatch>,
    sends: mpsc::Sender<AppCarrierSend>,
}

impl App for Channels {
    fn event(&mut self, event: ClientEvent) {
        let _ = self.events.send(event);
    }

    fn hook_batch(&mut self, batch: HookBatch) {
        let _ = self.hook_batches.send(batch);
    }

    fn app_carrier_send(&mut self, send: AppCarrierSend) {
        let _ = self.sends.send(send);
    }

    fn auth_token_wanted(&mut self, request: u64) {
        panic!("no token provider is configured, yet request {request} came");
    }
}

/// A device called `name` with the pipe registered at start, and the durability hook when
/// `hook` is set.
fn device(dir: &std::path::Path, name: &str, hook: bool) -> (Client, Handed) {
    let mut config = json!({
        "appId": "test",
        "storage": { "path": dir.join(format!("{name}.db")) },
        "encryption": { "enabled": false },
    });
    if hook {
        config["inboundDurabilityHook"] = json!(true);
    }
    let (events_tx, events) = mpsc::channel();
    let (hooks_tx, hook_batches) = mpsc::channel();
    let (sends_tx, sends) = mpsc::channel();
    let app = Channels {
        events: events_tx,
        hook_batches: hooks_tx,
        sends: sends_tx,
    };
    let mut config = parse_protocol_config(&config).unwrap();
    config.app_carriers.insert("pipe".into());
    let client = Client::start(&config, app, &tokio::runtime::Handle::current()).unwrap();
    assert_eq!(
        client.stats().carriers_up,
        1,
        "the pipe is up from the start"
    );
    let handed = Handed {
        events,
        hook_batches,
        sends,
    };
    (client, handed)
}

/// Everything one device was handed while the test ran.
#[derive(Default)]
struct Seen {
    events: Vec<ClientEvent>,
    hook_batches: Vec<HookBatch>,
    sends: Vec<AppCarrierSend>,
}

impl Seen {
    fn engine_events(&self) -> impl Iterator<Item = &Event> {
        self.events.iter().filter_map(ClientEvent::engine)
    }
}

/// Moves what `from` was handed: its frames onto the pipe (to `to`, reported written), its hook
/// batches into storage that always succeeds. Returns whether anything moved.
fn pump(from: (&Client, &Handed, &mut Seen), to: &Client, from_name: &str) -> bool {
    let (client, handed, seen) = from;
    let mut moved = false;
    while let Ok(send) = handed.sends.try_recv() {
        to.receive_frame(&send.carrier, from_name, send.frame.as_bytes())
            .unwrap();
        if let Some(attempt) = send.attempt.clone() {
            client.app_carrier_send_done(attempt, Ok(()));
        }
        seen.sends.push(send);
        moved = true;
    }
    while let Ok(batch) = handed.hook_batches.try_recv() {
        client.hook_done(batch.id, Ok(()));
        seen.hook_batches.push(batch);
        moved = true;
    }
    for event in handed.events.try_iter() {
        seen.events.push(event);
        moved = true;
    }
    moved
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hook_batches_and_app_carrier_frames_reach_their_own_callbacks_never_the_events() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, alice_handed) = device(dir.path(), "alice", false);
    let (bob, bob_handed) = device(dir.path(), "bob", true);
    alice.neighbor_discovered("bob", "pipe").unwrap();
    bob.neighbor_discovered("alice", "pipe").unwrap();
    // A carrier registered later is up once the driver caught up with the registration.
    bob.register_transport("radio").unwrap();
    bob.sync().await.unwrap();
    assert_eq!(bob.stats().carriers_up, 2);
    let id = alice
        .send(SendInput {
            recipient: "bob".into(),
            content: "over the pipe".into(),
            id: Some("hello-1".into()),
            ..SendInput::default()
        })
        .await
        .unwrap();

    // The recipient knows the message by its wire id only.
    let wire = wire_id(&id);
    assert_ne!(wire, id, "an app's own id is not a wire id");
    let (mut alice_seen, mut bob_seen) = (Seen::default(), Seen::default());
    let done = |alice: &Seen, bob: &Seen| {
        let delivered = alice
            .engine_events()
            .any(|e| matches!(e, Event::MessageDelivered { message_id, .. } if *message_id == id));
        let received = bob
            .engine_events()
            .any(|e| matches!(e, Event::MessageReceived { message, .. } if message.id == wire));
        delivered && received
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(&alice_seen, &bob_seen) {
        assert!(
            Instant::now() < deadline,
            "timed out: alice saw {:?}, bob saw {:?}",
            alice_seen.events,
            bob_seen.events
        );
        let moved = pump((&alice, &alice_handed, &mut alice_seen), &bob, "alice")
            | pump((&bob, &bob_handed, &mut bob_seen), &alice, "bob");
        if !moved {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    alice.stop().await;
    bob.stop().await;

    // Alice's message went out on the pipe as an attempt to report, under its wire id.
    let [send] = &alice_seen.sends[..] else {
        panic!("alice handed {:?} to the pipe", alice_seen.sends);
    };
    assert_eq!((send.carrier.as_str(), send.peer.as_str()), ("pipe", "bob"));
    let attempt = send
        .attempt
        .as_ref()
        .expect("an outbox frame has an attempt");
    assert_eq!(attempt.message_id, wire);
    assert_eq!(
        Message::decode(&send.frame).unwrap().content,
        "over the pipe"
    );
    assert!(alice_seen.hook_batches.is_empty(), "alice has no hook");

    // Bob's hook got the message once, live; its delivery ACK went back on the pipe with
    // nothing to report.
    let [batch] = &bob_seen.hook_batches[..] else {
        panic!("bob's hook got {:?}", bob_seen.hook_batches);
    };
    let [message] = &batch.messages[..] else {
        panic!("the batch holds {:?}", batch.messages);
    };
    assert_eq!(message.key.message_id, wire);
    assert_eq!(message.message.content, "over the pipe");
    assert_eq!(message.origin, BatchOrigin::Live);
    let [ack] = &bob_seen.sends[..] else {
        panic!("bob handed {:?} to the pipe", bob_seen.sends);
    };
    assert_eq!((ack.carrier.as_str(), ack.peer.as_str()), ("pipe", "alice"));
    assert_eq!(ack.attempt, None, "a delivery ACK is fire and forget");

    // The events are the public ones only.
    for event in alice_seen.events.iter().chain(&bob_seen.events) {
        let json = event.to_json();
        let kind = json["type"].as_str().unwrap();
        assert!(
            !kind.starts_with("__"),
            "an internal call posed as an event: {json}"
        );
    }
}
