//! End-to-end sessions over a real relay: Bob publishes key packages and goes offline; Alice,
//! who never saw him, sends him messages at once — each waits for the session, which the relay's
//! directory sets up without Bob, then is sealed into the relay's mailbox. On Bob's next start
//! they arrive once, marked encrypted, and Alice's messages settle only by Bob's sealed ACKs. The
//! relay's database holds no plaintext of any of them.

mod support;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use courier_client::client::SendInput;
use courier_client::config::parse_protocol_config;
use courier_client::event::ClientEvent;
use courier_engine::Event;
use courier_proto::{ack_id, ClientFrame, Message, RelayFrame, MLS_ENC_PREFIX};
use courier_relay::{RelayConfig, Storage};
use serde_json::json;
use support::{address, connected, engine, wait_for};

const SECRET: &[u8] = b"sealed-sessions-secret, padded to 32 bytes or more";

fn config(name: &str, dir: &std::path::Path, url: &str) -> serde_json::Value {
    support::relay_app(
        "sealed",
        name,
        dir,
        url,
        SECRET,
        json!({ "encryption": { "enabled": true }, "logLevel": "info" }),
    )
}

/// A relay on a loopback port, with or without the key-package directory.
async fn start_relay(storage: Storage, key_directory: bool) -> courier_relay::RelayHandle {
    let mut config = RelayConfig::new("127.0.0.1:0".parse().unwrap(), storage, SECRET.to_vec());
    config.key_directory = key_directory;
    courier_relay::start(config).await.unwrap()
}

/// The relay's answer once this device's packages are in the directory.
fn published(e: &ClientEvent) -> bool {
    matches!(e, ClientEvent::Diagnostic { message, .. } if message.contains("holds 10 one-time"))
}

/// Every event until `n` of them matched `pred` (within 30 s: a message sealed in a session that
/// lost a tie waits out one ACK timeout); returns the matching ones.
async fn collect(
    events: &mpsc::Receiver<ClientEvent>,
    what: &str,
    n: usize,
    pred: impl Fn(&ClientEvent) -> bool,
) -> Vec<ClientEvent> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut found = Vec::new();
    while found.len() < n {
        match events.try_recv() {
            Ok(e) if pred(&e) => found.push(e),
            Ok(_) => {}
            Err(mpsc::TryRecvError::Empty) => {
                assert!(
                    Instant::now() < deadline,
                    "timed out waiting for {what}: {} of {n}",
                    found.len()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(mpsc::TryRecvError::Disconnected) => panic!("events ended before {what}"),
        }
    }
    found
}

fn received(e: &ClientEvent) -> Option<(String, String, bool)> {
    match engine(e)? {
        Event::MessageReceived {
            message,
            sender,
            encrypted,
            ..
        } => Some((sender.clone(), message.content.clone(), *encrypted)),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_message_to_an_offline_peer_is_sealed_at_once_from_the_directory() {
    first_message_to_an_offline_peer(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_directory_a_first_message_waits_for_the_round_trip_through_the_peer() {
    first_message_to_an_offline_peer(false).await;
}

/// Bob is online once, then gone; Alice, who never saw him, sends him messages. With the
/// directory they are sealed at once from Bob's published key package and wait in the relay's
/// mailbox; without it they wait in Alice's pre-session queue while her key package waits in
/// Bob's mailbox, and Bob's next start answers it with his Welcome.
async fn first_message_to_an_offline_peer(key_directory: bool) {
    let dir = tempfile::tempdir().unwrap();
    let relay_db = dir.path().join("relay.db");
    let relay = start_relay(Storage::Path(relay_db.clone()), key_directory).await;
    let url = relay.url();
    let start =
        |name| support::start(&parse_protocol_config(&config(name, dir.path(), &url)).unwrap());

    let (bob, bob_events) = start("bob");
    let bob_address =
        address(&wait_for(&bob_events, "bob's identity", |e| address(e).is_some()).await).unwrap();
    if key_directory {
        wait_for(&bob_events, "bob's key packages published", published).await;
    } else {
        wait_for(&bob_events, "bob online", connected).await;
    }
    bob.stop().await;
    drop(bob_events);

    let (alice, alice_events) = start("alice");
    let alice_address =
        address(&wait_for(&alice_events, "alice's identity", |e| address(e).is_some()).await)
            .unwrap();
    wait_for(&alice_events, "alice online", connected).await;
    let texts: Vec<String> = (0..3).map(|i| format!("plaintext-secret-{i}")).collect();
    let mut ids = Vec::new();
    for text in &texts {
        let id = alice
            .send(SendInput {
                recipient: bob_address.clone(),
                content: text.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        ids.push(id);
    }
    if key_directory {
        // Sealed and in the relay's mailbox while Bob is away.
        collect(&alice_events, "the relay's custody", 3, |e| {
            matches!(engine(e), Some(Event::MessageStored { .. }))
        })
        .await;
    } else {
        // Nothing leaves before the session: the messages wait in the pre-session queue.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(alice.stats().pre_session, 3);
        assert!(alice_events.try_iter().all(|e| !matches!(
            engine(&e),
            Some(Event::MessageSent { .. } | Event::MessageStored { .. })
        )));
    }

    let (bob, bob_events) = start("bob");
    let got = collect(&bob_events, "alice's messages", 3, |e| {
        received(e).is_some()
    })
    .await;
    let got: Vec<_> = got.iter().filter_map(received).collect();
    for (i, (sender, content, encrypted)) in got.iter().enumerate() {
        assert_eq!(sender, &alice_address);
        assert_eq!(content, &texts[i]);
        assert!(encrypted, "message {i} arrived sealed");
    }
    let delivered = collect(&alice_events, "bob's sealed ACKs", 3, |e| {
        matches!(engine(e), Some(Event::MessageDelivered { .. }))
    })
    .await;
    assert_eq!(delivered.len(), 3);

    // Bob answers in the session he joined.
    bob.send(SendInput {
        recipient: alice_address.clone(),
        content: "plaintext-secret-reply".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let reply = wait_for(&alice_events, "bob's reply", |e| received(e).is_some()).await;
    assert_eq!(
        received(&reply).unwrap(),
        (bob_address.clone(), "plaintext-secret-reply".into(), true)
    );
    wait_for(&bob_events, "the reply delivered", |e| {
        matches!(engine(e), Some(Event::MessageDelivered { .. }))
    })
    .await;
    // Nothing arrived twice.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(bob_events.try_iter().all(|e| received(&e).is_none()));

    alice.stop().await;
    bob.stop().await;
    relay.stop().await;
    for file in ["relay.db", "relay.db-wal"] {
        let bytes = std::fs::read(dir.path().join(file)).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains("plaintext-secret"),
            "{file} holds a message in the clear"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_never_connected_gets_its_first_message_when_it_first_does() {
    for key_directory in [true, false] {
        first_message_to_a_device_never_seen(key_directory).await;
    }
}

/// Bob's identity exists, but he has never connected: no directory holds a key package of his,
/// and the relay refuses a round trip to an address nobody declared. Alice's message waits for
/// the session with Bob on her presence watchlist; Bob's first connection is the edge that sets
/// it up, and the message arrives sealed without Alice reconnecting.
async fn first_message_to_a_device_never_seen(key_directory: bool) {
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay(Storage::Memory, key_directory).await;
    let url = relay.url();
    let offline = json!({ "appId": "sealed", "storage": { "path": dir.path().join("bob.db") } });
    let (bob, bob_events) = support::start(&parse_protocol_config(&offline).unwrap());
    let bob_address =
        address(&wait_for(&bob_events, "bob's identity", |e| address(e).is_some()).await).unwrap();
    bob.stop().await;
    drop(bob_events);

    let (alice, alice_events) =
        support::start(&parse_protocol_config(&config("alice", dir.path(), &url)).unwrap());
    wait_for(&alice_events, "alice online", connected).await;
    let id = alice
        .send(SendInput {
            recipient: bob_address.clone(),
            content: "first words".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(alice.stats().pre_session, 1);
    assert_eq!(
        alice.presence_watchlist(),
        std::slice::from_ref(&bob_address)
    );

    let (bob, bob_events) =
        support::start(&parse_protocol_config(&config("bob", dir.path(), &url)).unwrap());
    let got = wait_for(&bob_events, "alice's first message", |e| {
        received(e).is_some()
    })
    .await;
    let (_, content, encrypted) = received(&got).unwrap();
    assert_eq!(content, "first words");
    assert!(encrypted);
    wait_for(&alice_events, "bob's sealed ACK", |e| {
        matches!(engine(e), Some(Event::MessageDelivered { message_id, .. }) if *message_id == id)
    })
    .await;
    assert_eq!(alice.stats().pre_session, 0);
    alice.stop().await;
    bob.stop().await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_encryption_a_recipient_must_be_an_address() {
    let dir = tempfile::tempdir().unwrap();
    let config = json!({
        "appId": "sealed",
        "storage": { "path": dir.path().join("a.db") },
        "encryption": { "enabled": true },
    });
    let (alice, _events) = support::start(&parse_protocol_config(&config).unwrap());
    let err = alice
        .send(SendInput {
            recipient: "bob".into(),
            content: "hi".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "ERR_INVALID_ARGUMENT");
    assert_eq!(alice.stats().outbox_regular + alice.stats().pre_session, 0);
    alice.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_without_encryption_reports_a_sealed_message_and_never_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay(Storage::Memory, true).await;
    let url = relay.url();
    let mut plain = config("bob", dir.path(), &url);
    plain["encryption"]["enabled"] = json!(false);
    // Bob publishes with encryption on, then runs without it.
    let (bob, bob_events) =
        support::start(&parse_protocol_config(&config("bob", dir.path(), &url)).unwrap());
    let bob_address =
        address(&wait_for(&bob_events, "bob's identity", |e| address(e).is_some()).await).unwrap();
    wait_for(&bob_events, "bob's key packages published", published).await;
    bob.stop().await;
    let (bob, bob_events) = support::start(&parse_protocol_config(&plain).unwrap());
    wait_for(&bob_events, "bob online", connected).await;

    let (alice, _alice_events) =
        support::start(&parse_protocol_config(&config("alice", dir.path(), &url)).unwrap());
    alice
        .send(SendInput {
            recipient: bob_address,
            content: "plaintext-secret".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let failed = wait_for(&bob_events, "the sealed copy reported", |e| {
        matches!(
            engine(e),
            Some(Event::MessageDecryptionFailed { .. }) | Some(Event::MessageReceived { .. })
        )
    })
    .await;
    assert!(
        matches!(engine(&failed), Some(Event::MessageDecryptionFailed { code, .. }) if *code == "ENCRYPTION_DISABLED"),
        "{}",
        failed.to_json()
    );
    alice.stop().await;
    bob.stop().await;
    relay.stop().await;
}

/// The relay (here a proxy in front of it) forges the recipient's ACK for every sealed message
/// Alice sends: stamped as Bob's address and account, claiming Bob, in the clear. With sessions
/// it settles nothing; Bob's own sealed ACK, once he is back, does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_forged_ack_does_not_settle() {
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay(Storage::Memory, true).await;
    let forge = |toward, frame: &str| {
        let Ok(ClientFrame::SendMessage { content, .. }) = ClientFrame::decode(frame) else {
            return Vec::new();
        };
        let envelope = Message::decode(&content).unwrap();
        if toward != support::Toward::Relay || !envelope.content.starts_with(MLS_ENC_PREFIX) {
            return Vec::new();
        }
        let ack = envelope.ack(
            ack_id(&envelope.recipient, &envelope.id),
            envelope.timestamp,
            "internet",
        );
        let forged = RelayFrame::MessageReceived {
            seq: None,
            sender: envelope.recipient.clone(),
            sender_account: Some("bob".into()),
            message_id: ack.id.clone(),
            content: ack.encode(),
            timestamp: 1,
            reply_to_msg: None,
        };
        vec![forged.encode()]
    };
    let url = support::proxy(relay.url(), std::sync::Arc::new(forge)).await;
    let start =
        |name| support::start(&parse_protocol_config(&config(name, dir.path(), &url)).unwrap());

    let (bob, bob_events) = start("bob");
    let bob_address =
        address(&wait_for(&bob_events, "bob's identity", |e| address(e).is_some()).await).unwrap();
    wait_for(&bob_events, "bob's key packages published", published).await;
    bob.stop().await;

    let (alice, alice_events) = start("alice");
    wait_for(&alice_events, "alice online", connected).await;
    let id = alice
        .send(SendInput {
            recipient: bob_address.clone(),
            content: "are you there?".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let ignored = wait_for(&alice_events, "the forged ACK ignored", |e| {
        matches!(e.engine(), Some(Event::Diagnostic { message, .. }) if message.contains("neither sealed nor signed"))
            || matches!(engine(e), Some(Event::MessageDelivered { .. }))
    })
    .await;
    assert!(
        !matches!(engine(&ignored), Some(Event::MessageDelivered { .. })),
        "a forged ACK settled the message"
    );

    let (bob, _bob_events) = start("bob");
    let delivered = wait_for(&alice_events, "bob's own ACK", |e| {
        matches!(engine(e), Some(Event::MessageDelivered { .. }))
    })
    .await;
    assert!(
        matches!(engine(&delivered), Some(Event::MessageDelivered { message_id, .. }) if *message_id == id)
    );
    alice.stop().await;
    bob.stop().await;
    relay.stop().await;
}

async fn send_to(client: &courier_client::client::Client, to: &str, text: String) -> String {
    let input = SendInput {
        recipient: to.to_owned(),
        content: text,
        ..Default::default()
    };
    client.send(input).await.unwrap()
}

/// Both devices start a session with each other at once, each from the other's published key
/// package: the lower address's session wins on both sides, and every message of either arrives
/// once (one sealed in the losing session is sealed again in the winner's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sides_starting_at_once_end_in_one_session_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay(Storage::Memory, true).await;
    let url = relay.url();
    let start =
        |name| support::start(&parse_protocol_config(&config(name, dir.path(), &url)).unwrap());
    let (alice, alice_events) = start("alice");
    let (bob, bob_events) = start("bob");
    let alice_address =
        address(&wait_for(&alice_events, "alice's identity", |e| address(e).is_some()).await)
            .unwrap();
    let bob_address =
        address(&wait_for(&bob_events, "bob's identity", |e| address(e).is_some()).await).unwrap();
    wait_for(&alice_events, "alice's packages held", published).await;
    wait_for(&bob_events, "bob's packages held", published).await;

    tokio::join!(
        send_to(&alice, &bob_address, "from alice 0".into()),
        send_to(&bob, &alice_address, "from bob 0".into())
    );
    for i in 1..5 {
        send_to(&alice, &bob_address, format!("from alice {i}")).await;
        send_to(&bob, &alice_address, format!("from bob {i}")).await;
    }
    // Per side: the other's five messages received, and its own five delivered — those sealed in
    // the session that lost the tie only after one ACK timeout, sealed again in the winner's.
    for (events, from) in [(&bob_events, "alice"), (&alice_events, "bob")] {
        let delivered = |e: &ClientEvent| matches!(engine(e), Some(Event::MessageDelivered { .. }));
        let seen = collect(events, "five in, five delivered", 10, |e| {
            received(e).is_some() || delivered(e)
        })
        .await;
        let mut texts: Vec<String> = seen.iter().filter_map(received).map(|r| r.1).collect();
        texts.sort();
        let expected: Vec<String> = (0..5).map(|i| format!("from {from} {i}")).collect();
        assert_eq!(texts, expected);
        assert_eq!(seen.iter().filter(|e| delivered(e)).count(), 5);
    }
    alice.stop().await;
    bob.stop().await;
    relay.stop().await;
}

/// Without a directory, Alice asks Bob (offline) with her key package on every connection while
/// her message waits; each ask carries the same package, so one private half is kept for Bob
/// however often she reconnects, and Bob's next start answers it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asking_again_by_the_round_trip_sends_the_same_key_package() {
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay(Storage::Memory, false).await;
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = std::sync::Arc::clone(&asked);
    let tap = move |toward, frame: &str| {
        if toward == support::Toward::Relay {
            if let Ok(ClientFrame::SendMessage { content, .. }) = ClientFrame::decode(frame) {
                let message = Message::decode(&content).unwrap();
                if message.content.starts_with("__MLS_KEY_PKG__") {
                    seen.lock().unwrap().push(message.content);
                }
            }
        }
        Vec::new()
    };
    let url = support::proxy(relay.url(), std::sync::Arc::new(tap)).await;
    let start =
        |name| support::start(&parse_protocol_config(&config(name, dir.path(), &url)).unwrap());

    let (bob, bob_events) = start("bob");
    let bob_address =
        address(&wait_for(&bob_events, "bob's identity", |e| address(e).is_some()).await).unwrap();
    wait_for(&bob_events, "bob online", connected).await;
    bob.stop().await;
    drop(bob_events);

    let (alice, alice_events) = start("alice");
    wait_for(&alice_events, "alice online", connected).await;
    let id = alice
        .send(SendInput {
            recipient: bob_address.clone(),
            content: "waits for bob".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    for round in 1..=3 {
        let at_least = round;
        let deadline = Instant::now() + Duration::from_secs(10);
        while asked.lock().unwrap().len() < at_least {
            assert!(Instant::now() < deadline, "ask {round} never went");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        alice.internet_status_changed(false);
        alice.internet_status_changed(true);
        wait_for(&alice_events, "alice back online", connected).await;
    }
    let asks = asked.lock().unwrap().clone();
    assert!(asks.len() >= 3, "{} asks", asks.len());
    assert!(
        asks.iter().all(|a| *a == asks[0]),
        "one key package for Bob"
    );

    let (bob, _bob_events) = start("bob");
    wait_for(&alice_events, "delivery to bob", |e| {
        matches!(engine(e), Some(Event::MessageDelivered { message_id, .. }) if *message_id == id)
    })
    .await;
    alice.stop().await;
    bob.stop().await;
    relay.stop().await;
}
