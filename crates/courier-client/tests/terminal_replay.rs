//! A terminal event is never lost to a crash: a settlement's event is held in storage with the
//! settlement and released once its dispatch is recorded; a start emits whatever is still held
//! (`replayed: true`), exactly once more.

mod support;

use courier_client::client::Client;
use courier_client::config::parse_protocol_config;
use courier_client::driver::Receipts;
use courier_client::event::ClientEvent;
use courier_client::store::{Reports, Store};
use courier_engine::io::{Settlement, StoreOp};
use serde_json::json;
use support::wait_for;

fn settle(id: &str) -> StoreOp {
    StoreOp::Settle {
        id: id.into(),
        recipient: "bob".into(),
        settlement: Settlement::Delivered,
        at: 1,
    }
}

fn event(id: &str) -> String {
    json!({ "type": "message_delivered", "messageId": id, "recipient": "bob", "latencyMs": 7 })
        .to_string()
}

#[test]
fn a_held_event_stays_until_its_dispatch_is_recorded_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("r.db");
    let mut store = Store::open(&db).unwrap();
    store
        .commit_step(
            &[settle("m1"), settle("m2")],
            &Reports {
                held: vec![("m1".into(), event("m1")), ("m2".into(), event("m2"))],
                done: vec![],
            },
        )
        .unwrap();
    store
        .commit_step(
            &[],
            &Reports {
                held: vec![],
                done: vec!["m1".into()],
            },
        )
        .unwrap();
    drop(store);
    let store = Store::open(&db).unwrap();
    assert_eq!(
        store.unreported().unwrap(),
        vec![("m2".into(), event("m2"))]
    );
}

#[test]
fn settling_an_id_again_replaces_its_held_event() {
    let mut store = Store::open_memory().unwrap();
    let held = |id: &str| Reports {
        held: vec![(id.into(), event("old"))],
        done: vec![],
    };
    store.commit_step(&[settle("m1")], &held("m1")).unwrap();
    store.commit(&[settle("m1")]).unwrap();
    assert!(store.unreported().unwrap().is_empty());
}

fn config(db: &std::path::Path) -> courier_client::config::ProtocolConfig {
    parse_protocol_config(&json!({
        "appId": "replay",
        "storage": { "path": db },
        "encryption": { "enabled": false },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_emits_a_terminal_event_a_crash_cut_off_once_more_and_only_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.db");
    // What a process killed between a step's commit and its dispatch leaves behind.
    let mut store = Store::open(&db).unwrap();
    store
        .commit_step(
            &[settle("cut-off")],
            &Reports {
                held: vec![("cut-off".into(), event("cut-off"))],
                done: vec![],
            },
        )
        .unwrap();
    drop(store);

    let (client, events) = support::start(&config(&db));
    let replayed = wait_for(
        &events,
        "the replayed terminal event",
        |e| matches!(e, ClientEvent::Replayed { message_id, .. } if message_id == "cut-off"),
    )
    .await;
    let json = replayed.to_json();
    assert_eq!(json["type"], "message_delivered");
    assert_eq!(json["messageId"], "cut-off");
    assert_eq!(json["latencyMs"], 7);
    assert_eq!(json["replayed"], true);
    client.stop().await;

    let (client, events) = support::start(&config(&db));
    wait_for(&events, "identity_ready", |e| {
        matches!(e, ClientEvent::IdentityReady { .. })
    })
    .await;
    client.stop().await;
    assert!(
        !events
            .try_iter()
            .any(|e| matches!(e, ClientEvent::Replayed { .. })),
        "a replayed event whose dispatch was recorded is not emitted again"
    );
    assert!(Store::open(&db).unwrap().unreported().unwrap().is_empty());
}

/// Starts `config` with receipts: every event goes to the receiver, and each terminal event is
/// confirmed at once when `confirm` is set (an application whose listeners ran), never otherwise
/// (one killed before they could).
fn start_with_receipts(
    config: &courier_client::config::ProtocolConfig,
    confirm: bool,
) -> (Client, std::sync::mpsc::Receiver<ClientEvent>) {
    let (tx, events) = std::sync::mpsc::channel();
    let make_app = move |receipts: Receipts| {
        support::Events(move |e: ClientEvent| {
            if let (true, Some(id)) = (confirm, e.terminal_message_id()) {
                receipts.seen(id.to_owned());
            }
            let _ = tx.send(e);
        })
    };
    let client =
        Client::start_with_receipts(config, make_app, &tokio::runtime::Handle::current()).unwrap();
    (client, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_receipts_a_terminal_event_stays_held_until_the_application_confirms_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.db");
    let mut store = Store::open(&db).unwrap();
    // Settled now: a settlement older than the retention would be pruned at start.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    store
        .commit_step(
            &[StoreOp::Settle {
                id: "unseen".into(),
                recipient: "bob".into(),
                settlement: Settlement::Delivered,
                at: now,
            }],
            &Reports {
                held: vec![("unseen".into(), event("unseen"))],
                done: vec![],
            },
        )
        .unwrap();
    drop(store);
    let replayed = |e: &ClientEvent| matches!(e, ClientEvent::Replayed { message_id, .. } if message_id == "unseen");

    // Dispatched, never confirmed (the listeners did not run): still held after the stop.
    let (client, events) = start_with_receipts(&config(&db), false);
    wait_for(&events, "the replayed terminal event", replayed).await;
    client.stop().await;
    assert_eq!(
        Store::open(&db).unwrap().unreported().unwrap(),
        vec![("unseen".into(), event("unseen"))]
    );

    // Confirmed: released, and not emitted by the start after.
    let (client, events) = start_with_receipts(&config(&db), true);
    wait_for(&events, "the terminal event replayed again", replayed).await;
    client.stop().await;
    assert!(Store::open(&db).unwrap().unreported().unwrap().is_empty());
    let (client, events) = start_with_receipts(&config(&db), true);
    wait_for(&events, "identity_ready", |e| {
        matches!(e, ClientEvent::IdentityReady { .. })
    })
    .await;
    client.stop().await;
    assert!(!events.try_iter().any(|e| replayed(&e)));
}
