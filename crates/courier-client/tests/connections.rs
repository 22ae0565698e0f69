//! Connection requests over a real relay (`docs/delivery.md#connection-requests`): a request
//! reaches the peer as a signed frame and settles by the peer's signed ACK; accepting sets the
//! session up at once (the acceptance carries its Welcome), so both sides talk sealed right
//! away; a refusal and a withdrawal reach the other side; a request to a device the relay cannot
//! reach settles at once as undeliverable, never parked; and what becomes of messages from
//! strangers is the app's choice.

mod support;

use std::sync::mpsc;

use courier_client::client::{Client, SendInput};
use courier_client::config::parse_protocol_config;
use courier_client::driver::connections::ConnectionCommand;
use courier_client::event::ClientEvent;
use courier_engine::Event;
use courier_relay::{RelayConfig, Storage};
use serde_json::json;
use support::{address, connected, engine, wait_for};

const SECRET: &[u8] = b"connections-secret, padded to 32 bytes or more";

struct Device {
    client: Client,
    events: mpsc::Receiver<ClientEvent>,
    address: String,
}

async fn device(name: &str, dir: &std::path::Path, url: &str, extra: serde_json::Value) -> Device {
    let config = support::relay_app("conn", name, dir, url, SECRET, extra);
    let (client, events) = support::start(&parse_protocol_config(&config).unwrap());
    let address =
        address(&wait_for(&events, "the identity", |e| address(e).is_some()).await).unwrap();
    wait_for(&events, "the relay", connected).await;
    // The relay read the address declaration before it drained the mailbox: from here on it
    // routes to this device's address (a request to an address it does not know is settled
    // undeliverable at once).
    wait_for(&events, "the drain", |e| {
        matches!(engine(e), Some(Event::InboundDrainCompleted { .. }))
    })
    .await;
    Device {
        client,
        events,
        address,
    }
}

async fn relay() -> courier_relay::RelayHandle {
    let config = RelayConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        Storage::Memory,
        SECRET.to_vec(),
    );
    courier_relay::start(config).await.unwrap()
}

async fn send(from: &Device, to: &Device, text: &str) -> String {
    from.client
        .send(SendInput {
            recipient: to.address.clone(),
            content: text.into(),
            ..Default::default()
        })
        .await
        .unwrap()
}

fn delivered(id: &str) -> impl Fn(&ClientEvent) -> bool + '_ {
    move |e| matches!(engine(e), Some(Event::MessageDelivered { message_id, .. }) if message_id == id)
}

/// `(content, encrypted, known_sender)` of a received message.
fn received(e: &ClientEvent) -> Option<(String, bool, bool)> {
    match e {
        ClientEvent::Received {
            event,
            known_sender,
        } => match &**event {
            Event::MessageReceived {
                message, encrypted, ..
            } => Some((message.content.clone(), *encrypted, *known_sender)),
            _ => None,
        },
        _ => None,
    }
}

fn request_received(e: &ClientEvent) -> Option<(String, String, Option<String>, bool)> {
    match e {
        ClientEvent::ConnectionRequestReceived {
            request_id,
            sender,
            note,
            implicit,
        } => Some((request_id.clone(), sender.clone(), note.clone(), *implicit)),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_request_sets_the_session_up_and_both_sides_talk_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay().await;
    let url = relay.url();
    let alice = device("alice", dir.path(), &url, json!({})).await;
    let bob = device("bob", dir.path(), &url, json!({})).await;

    let id = alice
        .client
        .request_connection(bob.address.clone(), Some("hi, it's Alice".into()))
        .await
        .unwrap();
    let got = wait_for(&bob.events, "the request", |e| {
        request_received(e).is_some()
    })
    .await;
    assert_eq!(
        request_received(&got).unwrap(),
        (
            id.clone(),
            alice.address.clone(),
            Some("hi, it's Alice".into()),
            false
        )
    );
    // No session yet, so Bob's ACK travels in the clear, and settles only because he signed it.
    wait_for(&alice.events, "the request delivered", delivered(&id)).await;
    let pending = bob.client.connection_requests().await.unwrap();
    assert_eq!(pending.len(), 1);
    assert!(pending[0].incoming && pending[0].peer == alice.address);
    assert_eq!(alice.client.connection_requests().await.unwrap()[0].id, id);

    bob.client
        .answer_connection(ConnectionCommand::Accept { id: id.clone() })
        .await
        .unwrap();
    let accepted = wait_for(&alice.events, "the acceptance", |e| {
        matches!(e, ClientEvent::ConnectionAccepted { .. })
    })
    .await;
    assert_eq!(
        accepted,
        ClientEvent::ConnectionAccepted {
            request_id: id.clone(),
            peer: bob.address.clone(),
        }
    );
    assert!(alice.client.connection_requests().await.unwrap().is_empty());
    assert!(bob.client.connection_requests().await.unwrap().is_empty());

    // The session is there on both sides: nothing waits for one.
    let to_bob = send(&alice, &bob, "sealed at once").await;
    assert_eq!(alice.client.stats().pre_session, 0);
    let got = wait_for(&bob.events, "alice's message", |e| received(e).is_some()).await;
    assert_eq!(
        received(&got).unwrap(),
        ("sealed at once".into(), true, true)
    );
    wait_for(&alice.events, "its ACK", delivered(&to_bob)).await;
    let to_alice = send(&bob, &alice, "and back").await;
    assert_eq!(bob.client.stats().pre_session, 0);
    let got = wait_for(&alice.events, "bob's answer", |e| received(e).is_some()).await;
    assert_eq!(received(&got).unwrap(), ("and back".into(), true, true));
    wait_for(&bob.events, "its ACK", delivered(&to_alice)).await;

    // Answering twice is refused with a typed error, and changes nothing.
    let again = bob
        .client
        .answer_connection(ConnectionCommand::Accept { id })
        .await
        .unwrap_err();
    assert_eq!(again.code(), "ERR_INVALID_ARGUMENT");
    alice.client.stop().await;
    bob.client.stop().await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_and_a_withdrawal_reach_the_other_side_and_requests_outlive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay().await;
    let url = relay.url();
    let bob = device("bob", dir.path(), &url, json!({})).await;
    let carol = device("carol", dir.path(), &url, json!({})).await;
    let dave = device("dave", dir.path(), &url, json!({})).await;

    let from_carol = carol
        .client
        .request_connection(bob.address.clone(), None)
        .await
        .unwrap();
    let from_dave = dave
        .client
        .request_connection(bob.address.clone(), None)
        .await
        .unwrap();
    let same = dave
        .client
        .request_connection(bob.address.clone(), Some("again".into()))
        .await
        .unwrap();
    assert_eq!(same, from_dave, "a request still waiting stands");
    for id in [&from_carol, &from_dave] {
        wait_for(&bob.events, "a request", |e| {
            request_received(e).is_some_and(|(r, ..)| r == *id)
        })
        .await;
    }

    // Bob restarts: the requests are still there to answer.
    bob.client.stop().await;
    drop(bob);
    let bob = device("bob", dir.path(), &url, json!({})).await;
    let waiting: Vec<String> = bob
        .client
        .connection_requests()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(waiting.len(), 2);
    assert!(waiting.contains(&from_carol) && waiting.contains(&from_dave));

    bob.client
        .answer_connection(ConnectionCommand::Reject {
            id: from_carol.clone(),
        })
        .await
        .unwrap();
    let rejected = wait_for(&carol.events, "the refusal", |e| {
        matches!(e, ClientEvent::ConnectionRejected { .. })
    })
    .await;
    assert_eq!(
        rejected,
        ClientEvent::ConnectionRejected {
            request_id: from_carol,
            peer: bob.address.clone(),
        }
    );

    dave.client
        .answer_connection(ConnectionCommand::Cancel {
            id: from_dave.clone(),
        })
        .await
        .unwrap();
    let cancelled = wait_for(&bob.events, "the withdrawal", |e| {
        matches!(e, ClientEvent::ConnectionRequestCancelled { .. })
    })
    .await;
    assert_eq!(
        cancelled,
        ClientEvent::ConnectionRequestCancelled {
            request_id: from_dave.clone(),
            sender: dave.address.clone(),
        }
    );
    assert!(bob.client.connection_requests().await.unwrap().is_empty());
    // Only the requester withdraws, only the asked answers.
    let err = dave
        .client
        .answer_connection(ConnectionCommand::Accept { id: from_dave })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "ERR_INVALID_ARGUMENT");
    for d in [bob, carol, dave] {
        d.client.stop().await;
    }
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_relay_cannot_deliver_settles_at_once_and_is_never_parked() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay().await;
    let url = relay.url();
    let alice = device("alice", dir.path(), &url, json!({})).await;
    // An address no device ever declared to this relay.
    let nobody = courier_proto::IdentityKey::from_seed([42; 32])
        .address()
        .to_string();
    let id = alice
        .client
        .request_connection(nobody.clone(), None)
        .await
        .unwrap();
    let settled = wait_for(&alice.events, "the verdict", |e| {
        e.terminal_message_id() == Some(id.as_str())
    })
    .await;
    assert_eq!(
        settled.to_json()["type"],
        "connection_request_undeliverable"
    );
    assert_eq!(settled.to_json()["recipient"], nobody.as_str());
    assert!(alice.client.presence_watchlist().is_empty(), "not parked");
    assert!(alice.client.connection_requests().await.unwrap().is_empty());
    assert_eq!(alice.client.stats().outbox_regular, 0);

    let err = alice
        .client
        .request_connection("bob".into(), None)
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        "ERR_INVALID_ARGUMENT",
        "connections are between addresses"
    );
    alice.client.stop().await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_from_strangers_are_flagged_refused_or_held_for_a_request_as_the_app_chose() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay().await;
    let url = relay.url();
    // Quick retries: a held message comes again at the sender's next attempt.
    let quick = json!({ "reliability": {
        "ack": { "defaultTimeoutMs": 300 },
        "retry": { "initialDelayMs": 100, "maxDelayMs": 300 },
    } });
    let flagging = device("flag", dir.path(), &url, json!({})).await;
    let refusing = device(
        "refuse",
        dir.path(),
        &url,
        json!({ "encryption": { "unknownSenders": "refuse" }, "logLevel": "info" }),
    )
    .await;
    let asking = device(
        "ask",
        dir.path(),
        &url,
        json!({ "encryption": { "unknownSenders": "request" } }),
    )
    .await;
    let stranger = device("stranger", dir.path(), &url, quick).await;

    // Accepted, and flagged as from somebody this device does not know.
    let id = send(&stranger, &flagging, "hello from nowhere").await;
    let got = wait_for(&flagging.events, "the flagged message", |e| {
        received(e).is_some()
    })
    .await;
    assert_eq!(
        received(&got).unwrap(),
        ("hello from nowhere".into(), true, false)
    );
    wait_for(&stranger.events, "its ACK", delivered(&id)).await;

    // Refused: never shown, never acknowledged.
    let refused = send(&stranger, &refusing, "let me in").await;
    wait_for(&refusing.events, "the refusal", |e| {
        matches!(e, ClientEvent::Diagnostic { message, .. } if message.contains("not a contact"))
    })
    .await;

    // Held for a request: reported once as one, delivered after the app accepts it.
    let held = send(&stranger, &asking, "may I?").await;
    let request = wait_for(&asking.events, "the implied request", |e| {
        request_received(e).is_some()
    })
    .await;
    let (request_id, sender, note, implicit) = request_received(&request).unwrap();
    assert_eq!(
        (sender.as_str(), note, implicit),
        (stranger.address.as_str(), None, true)
    );
    asking
        .client
        .answer_connection(ConnectionCommand::Accept { id: request_id })
        .await
        .unwrap();
    wait_for(&stranger.events, "the acceptance", |e| {
        matches!(e, ClientEvent::ConnectionAccepted { .. })
    })
    .await;
    let got = wait_for(&asking.events, "the held message, sent again", |e| {
        received(e).is_some()
    })
    .await;
    assert_eq!(received(&got).unwrap(), ("may I?".into(), true, true));
    wait_for(&stranger.events, "its ACK", delivered(&held)).await;

    // Nothing of the refused message ever reached the app, however often it was sent.
    assert!(refusing.events.try_iter().all(|e| received(&e).is_none()));
    assert!(
        stranger.events.try_iter().all(|e| !delivered(&refused)(&e)),
        "a refused message is never acknowledged"
    );
    for d in [flagging, refusing, asking, stranger] {
        d.client.stop().await;
    }
    relay.stop().await;
}
