//! A whole conversation in MLS sessions: two apps exchange 1 000 messages, 500 each way, through
//! a real relay, while Bob is offline for half of it (four stretches, each ended by a restart on
//! the same files). Every message reaches its app once, opened from its seal; nothing the relay
//! stored and nothing that crossed the wire — watched by a WebSocket proxy in front of the relay
//! — holds any message's text.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier_client::client::SendInput;
use courier_client::config::parse_protocol_config;
use courier_client::event::ClientEvent;
use courier_engine::Event;
use courier_relay::{RelayConfig, Storage};
use serde_json::json;
use support::{address, connected, engine, wait_for};

const SECRET: &[u8] = b"sealed-conversation-secret, padded to 32 bytes or more";
const EACH_WAY: usize = 500;
const STRETCHES: usize = 4;

fn config(name: &str, dir: &std::path::Path, url: &str) -> serde_json::Value {
    support::relay_app(
        "sealed",
        name,
        dir,
        url,
        SECRET,
        json!({ "encryption": { "enabled": true } }),
    )
}

/// What an app received: `(sender, content) -> times`, and whether each arrived sealed.
#[derive(Default)]
struct Inbox {
    times: BTreeMap<(String, String), u32>,
    unsealed: u32,
}

impl Inbox {
    fn take(&mut self, e: &ClientEvent) {
        if let Some(Event::MessageReceived {
            message,
            sender,
            encrypted,
            ..
        }) = engine(e)
        {
            *self
                .times
                .entry((sender.clone(), message.content.clone()))
                .or_default() += 1;
            self.unsealed += u32::from(!encrypted);
        }
    }
}

fn drain(events: &std::sync::mpsc::Receiver<ClientEvent>, inbox: &mut Inbox, delivered: &mut u32) {
    for e in events.try_iter() {
        inbox.take(&e);
        if matches!(engine(&e), Some(Event::MessageDelivered { .. })) {
            *delivered += 1;
        }
        if let Some(Event::MessageFailed { reason, .. }) = engine(&e) {
            panic!("a message failed: {reason:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_sealed_messages_both_ways_with_the_recipient_offline_half_the_time() {
    let dir = tempfile::tempdir().unwrap();
    let relay = courier_relay::start(RelayConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        Storage::Path(dir.path().join("relay.db")),
        SECRET.to_vec(),
    ))
    .await
    .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let tap_seen = Arc::clone(&seen);
    let url = support::proxy(
        relay.url(),
        Arc::new(move |_: support::Toward, frame: &str| {
            tap_seen.lock().unwrap().push(frame.to_owned());
            Vec::new()
        }),
    )
    .await;
    let start =
        |name| support::start(&parse_protocol_config(&config(name, dir.path(), &url)).unwrap());

    let (alice, alice_events) = start("alice");
    let alice_address =
        address(&wait_for(&alice_events, "alice's identity", |e| address(e).is_some()).await)
            .unwrap();
    let (mut bob, mut bob_events) = start("bob");
    let bob_address =
        address(&wait_for(&bob_events, "bob's identity", |e| address(e).is_some()).await).unwrap();
    wait_for(&bob_events, "bob online", connected).await;

    let (mut alice_inbox, mut bob_inbox) = (Inbox::default(), Inbox::default());
    let (mut alice_delivered, mut bob_delivered) = (0, 0);
    let text = |from: &str, i: usize| format!("{from} says secret number {i}");
    let per_stretch = EACH_WAY / STRETCHES;
    for stretch in 0..STRETCHES {
        // Online half: both send.
        for i in stretch * per_stretch..(stretch * per_stretch + per_stretch / 2) {
            let to_bob = SendInput {
                recipient: bob_address.clone(),
                content: text("alice", i),
                ..Default::default()
            };
            let to_alice = SendInput {
                recipient: alice_address.clone(),
                content: text("bob", i),
                ..Default::default()
            };
            alice.send(to_bob).await.unwrap();
            bob.send(to_alice).await.unwrap();
        }
        drain(&alice_events, &mut alice_inbox, &mut alice_delivered);
        drain(&bob_events, &mut bob_inbox, &mut bob_delivered);
        // Offline half: Bob is away (his outbox waits with him), Alice goes on.
        bob.stop().await;
        drain(&bob_events, &mut bob_inbox, &mut bob_delivered);
        for i in (stretch * per_stretch + per_stretch / 2)..(stretch + 1) * per_stretch {
            let to_bob = SendInput {
                recipient: bob_address.clone(),
                content: text("alice", i),
                ..Default::default()
            };
            alice.send(to_bob).await.unwrap();
        }
        (bob, bob_events) = start("bob");
        for i in (stretch * per_stretch + per_stretch / 2)..(stretch + 1) * per_stretch {
            let to_alice = SendInput {
                recipient: alice_address.clone(),
                content: text("bob", i),
                ..Default::default()
            };
            bob.send(to_alice).await.unwrap();
        }
    }

    let deadline = Instant::now() + Duration::from_secs(120);
    while alice_delivered < EACH_WAY as u32
        || bob_delivered < EACH_WAY as u32
        || alice_inbox.times.len() < EACH_WAY
        || bob_inbox.times.len() < EACH_WAY
    {
        assert!(
            Instant::now() < deadline,
            "alice delivered {alice_delivered}, received {}; bob delivered {bob_delivered}, received {}",
            alice_inbox.times.len(),
            bob_inbox.times.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        drain(&alice_events, &mut alice_inbox, &mut alice_delivered);
        drain(&bob_events, &mut bob_inbox, &mut bob_delivered);
    }
    for (inbox, from, sender) in [
        (&bob_inbox, "alice", &alice_address),
        (&alice_inbox, "bob", &bob_address),
    ] {
        for i in 0..EACH_WAY {
            let key = (sender.clone(), text(from, i));
            assert_eq!(inbox.times.get(&key), Some(&1), "{key:?}");
        }
        assert_eq!(inbox.unsealed, 0, "every message arrived sealed");
    }

    alice.stop().await;
    bob.stop().await;
    relay.stop().await;
    let wire = seen.lock().unwrap();
    assert!(wire.len() > 2 * EACH_WAY, "the proxy saw the conversation");
    assert!(
        !wire.iter().any(|frame| frame.contains("secret number")),
        "a frame on the wire holds a message in the clear"
    );
    for file in ["relay.db", "relay.db-wal"] {
        let bytes = std::fs::read(dir.path().join(file)).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains("secret number"),
            "{file} holds a message in the clear"
        );
    }
}
