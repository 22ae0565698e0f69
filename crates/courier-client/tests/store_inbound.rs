//! The durability buffer for inbound messages: what `BufferInbound` writes is what
//! `load_pending_inbound` reads back, `CommitInbound` / `ExpireInbound` clear it, and every op
//! of a step lands in one transaction or not at all.

use std::collections::BTreeMap;
use std::path::Path;

use courier_client::store::{Store, StoreError};
use courier_engine::io::{Carrier, InboundKey, PendingInbound, ProcessedKey, StoreOp};
use courier_proto::{ContentType, Message, Priority};
use rusqlite::ErrorCode;
use serde_json::json;

fn open(dir: &Path) -> Store {
    Store::open(&dir.join("courier.db")).expect("open")
}

fn key(chat: &str, sender: &str, id: &str) -> InboundKey {
    InboundKey {
        chat: chat.into(),
        sender: sender.into(),
        message_id: id.into(),
    }
}

fn message(i: u64, sender: &str) -> Message {
    let mut metadata = BTreeMap::new();
    if i.is_multiple_of(2) {
        metadata.insert("thread".to_owned(), format!("t{i}"));
        metadata.insert("ünïcode".to_owned(), "✓ \"quoted\" \n newline".to_owned());
    }
    Message {
        id: format!("in-{i}"),
        sender: sender.into(),
        recipient: "me".into(),
        app_id: "chat".into(),
        priority: [
            Priority::Low,
            Priority::Medium,
            Priority::High,
            Priority::Critical,
        ][(i % 4) as usize],
        ttl: (i % 16) as u8,
        hop_count: (i % 5) as u8,
        timestamp: 1_700_000_000_000 + i,
        lamport_clock: if i == 5 { i64::MAX as u64 } else { i * 7 },
        content_type: if i % 5 == 4 {
            ContentType::FileChunk
        } else {
            ContentType::Text
        },
        content: format!("hello {i} 👋"),
        metadata,
        requires_ack: i % 7 != 3,
        reply_to_msg: i.is_multiple_of(3).then(|| format!("in-{}", i + 100)),
        rich: None,
        binary_content: (i % 4 == 1).then(|| json!("aGVsbG8=")),
        media_metadata: (i % 4 == 2).then(|| json!({"w": 640, "h": 480})),
        forwarded_from: (i % 4 == 3).then(|| json!({"by": "dave"})),
        reply_context: (i == 6).then(|| json!({"quote": "x"})),
        encrypted: None,
    }
}

/// A buffered message; the carrier cycles through the relay and two local carriers, and the
/// stamped sender (what the carrier vouched for) sometimes differs from the message's sender, and
/// every other one arrived sealed.
fn pending(i: u64, received_at: u64) -> PendingInbound {
    let sender = format!("peer-{}", i % 3);
    let carrier = match i % 3 {
        0 => Carrier::Relay,
        1 => Carrier::Local("ble".into()),
        _ => Carrier::Local("wifi-direct ✓".into()),
    };
    PendingInbound {
        key: key(
            if i.is_multiple_of(4) { "group-1" } else { "dm" },
            &sender,
            &format!("in-{i}"),
        ),
        message: message(i, &sender),
        carrier,
        stamped_sender: if i % 5 == 2 {
            format!("device-of-{sender}")
        } else {
            sender.clone()
        },
        received_at,
        encrypted: i % 2 == 1,
    }
}

fn keys_of(rows: &[PendingInbound]) -> Vec<InboundKey> {
    rows.iter().map(|p| p.key.clone()).collect()
}

fn processed(store: &mut Store) -> Vec<ProcessedKey> {
    store.load_processed(0, u64::MAX, 100_000).unwrap()
}

fn processed_key(k: &InboundKey, at: u64) -> ProcessedKey {
    ProcessedKey {
        key: InboundKey {
            chat: k.chat.clone(),
            sender: k.sender.clone(),
            message_id: k.message_id.clone(),
        },
        at,
    }
}

#[test]
fn buffered_messages_round_trip_with_every_field_in_received_order() {
    let dir = tempfile::tempdir().unwrap();
    // received_at out of insertion order, with ties (kept in insertion order).
    let times = [500, 100, 300, 100, 900, 300, 300, 200, 800, 100, 700, 600];
    let rows: Vec<PendingInbound> = times
        .iter()
        .enumerate()
        .map(|(i, &t)| pending(i as u64, t))
        .collect();
    // The sample covers both carrier kinds and a stamped sender unlike the message's.
    assert!(rows.iter().any(|p| p.carrier == Carrier::Relay));
    assert!(rows.iter().any(|p| matches!(p.carrier, Carrier::Local(_))));
    assert!(rows.iter().any(|p| p.stamped_sender != p.message.sender));

    let mut expected = rows.clone();
    expected.sort_by_key(|p| p.received_at); // stable: ties stay in insertion order

    {
        let mut store = open(dir.path());
        assert!(store.load_pending_inbound().unwrap().is_empty());
        // Two steps, so the order is not just one batch's.
        store
            .commit(&[StoreOp::BufferInbound(rows[..5].to_vec())])
            .unwrap();
        store
            .commit(&[StoreOp::BufferInbound(rows[5..].to_vec())])
            .unwrap();
        assert_eq!(store.load_pending_inbound().unwrap(), expected);
    }
    let mut store = open(dir.path());
    assert_eq!(store.load_pending_inbound().unwrap(), expected);
    // Buffering is not processing.
    assert!(processed(&mut store).is_empty());
}

#[test]
fn a_local_carrier_keeps_its_name_and_internet_maps_back() {
    let mut store = Store::open_memory().unwrap();
    let mut rows = Vec::new();
    for (i, carrier) in [
        Carrier::Relay,
        Carrier::Local("ble".into()),
        Carrier::Local("Internet".into()), // only the exact name "internet" is the relay
        Carrier::Local(String::new()),
    ]
    .into_iter()
    .enumerate()
    {
        rows.push(PendingInbound {
            carrier,
            ..pending(i as u64, i as u64)
        });
    }
    store
        .commit(&[StoreOp::BufferInbound(rows.clone())])
        .unwrap();
    assert_eq!(store.load_pending_inbound().unwrap(), rows);
}

#[test]
fn buffering_an_existing_key_keeps_the_first_copy() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let first = pending(1, 1_000);
    store
        .commit(&[StoreOp::BufferInbound(vec![first.clone()])])
        .unwrap();

    // A redelivery of the same key: different copy, later time, another carrier.
    let mut again = pending(1, 9_000);
    again.message.content = "a different body".into();
    again.carrier = Carrier::Relay;
    again.stamped_sender = "someone-else".into();
    // The same message id under another chat, and under another sender, are other messages.
    let other_chat = PendingInbound {
        key: key("group-9", &first.key.sender, &first.key.message_id),
        ..pending(1, 2_000)
    };
    let other_sender = PendingInbound {
        key: key(&first.key.chat, "peer-9", &first.key.message_id),
        ..pending(1, 3_000)
    };
    store
        .commit(&[StoreOp::BufferInbound(vec![
            again.clone(),
            other_chat.clone(),
            again.clone(),
            other_sender.clone(),
        ])])
        .unwrap();
    // Duplicates inside one batch: the first of the batch wins too.
    let dup_a = pending(2, 4_000);
    let mut dup_b = pending(2, 5_000);
    dup_b.message.content = "second".into();
    store
        .commit(&[StoreOp::BufferInbound(vec![dup_a.clone(), dup_b])])
        .unwrap();
    drop(store);

    let store = open(dir.path());
    assert_eq!(
        store.load_pending_inbound().unwrap(),
        vec![first, other_chat, other_sender, dup_a]
    );
}

#[test]
fn commit_inbound_clears_the_rows_and_marks_them_processed() {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<PendingInbound> = (0..6).map(|i| pending(i, 100 + i)).collect();
    let committed: Vec<InboundKey> = [0, 2, 5].iter().map(|&i| rows[i].key.clone()).collect();
    {
        let mut store = open(dir.path());
        store
            .commit(&[StoreOp::BufferInbound(rows.clone())])
            .unwrap();
        store
            .commit(&[StoreOp::CommitInbound {
                keys: committed.clone(),
                at: 5_000,
            }])
            .unwrap();
    }
    let mut store = open(dir.path());
    assert_eq!(
        store.load_pending_inbound().unwrap(),
        vec![rows[1].clone(), rows[3].clone(), rows[4].clone()]
    );
    let mut expected: Vec<ProcessedKey> =
        committed.iter().map(|k| processed_key(k, 5_000)).collect();
    let mut got = processed(&mut store);
    expected.sort_by(|a, b| a.key.cmp(&b.key));
    got.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(got, expected);

    // Committing again (a redelivered batch) keeps the first processing time, exactly like
    // `MarkProcessed`; a key that was never buffered is still marked.
    let unbuffered = key("dm", "peer-7", "never-buffered");
    store
        .commit(&[StoreOp::CommitInbound {
            keys: vec![committed[0].clone(), unbuffered.clone()],
            at: 9_000,
        }])
        .unwrap();
    let got = processed(&mut store);
    assert_eq!(got.len(), 4);
    assert!(got.contains(&processed_key(&committed[0], 5_000)));
    assert!(got.contains(&processed_key(&unbuffered, 9_000)));
    assert_eq!(store.load_pending_inbound().unwrap().len(), 3);
}

#[test]
fn expire_inbound_deletes_without_marking_processed() {
    let mut store = Store::open_memory().unwrap();
    let rows: Vec<PendingInbound> = (0..4).map(|i| pending(i, i)).collect();
    store
        .commit(&[StoreOp::BufferInbound(rows.clone())])
        .unwrap();
    store
        .commit(&[StoreOp::ExpireInbound {
            keys: vec![
                rows[0].key.clone(),
                rows[2].key.clone(),
                key("dm", "nobody", "absent"), // unknown keys are harmless
            ],
        }])
        .unwrap();
    assert_eq!(
        store.load_pending_inbound().unwrap(),
        vec![rows[1].clone(), rows[3].clone()]
    );
    assert!(processed(&mut store).is_empty());
    // Empty key lists are no-ops.
    store
        .commit(&[
            StoreOp::ExpireInbound { keys: vec![] },
            StoreOp::CommitInbound {
                keys: vec![],
                at: 1,
            },
            StoreOp::BufferInbound(vec![]),
        ])
        .unwrap();
    assert_eq!(store.load_pending_inbound().unwrap().len(), 2);
}

#[test]
fn a_steps_ops_apply_in_order() {
    let mut store = Store::open_memory().unwrap();
    let a = pending(1, 10);
    let b = pending(2, 20);
    // Buffered and committed in the same step: gone and processed.
    // Expired then re-buffered in the same step: present again.
    store
        .commit(&[
            StoreOp::BufferInbound(vec![a.clone(), b.clone()]),
            StoreOp::CommitInbound {
                keys: vec![a.key.clone()],
                at: 30,
            },
            StoreOp::ExpireInbound {
                keys: vec![b.key.clone()],
            },
            StoreOp::BufferInbound(vec![b.clone()]),
        ])
        .unwrap();
    assert_eq!(store.load_pending_inbound().unwrap(), vec![b]);
    assert_eq!(processed(&mut store), vec![processed_key(&a.key, 30)]);
}

/// A 400-message drain batch of ~10 KiB each (≈4 MiB), the batch size the runtime flushes at.
fn drain_batch(start: u64) -> Vec<PendingInbound> {
    (start..start + 400)
        .map(|i| {
            let mut p = pending(i, 1_000 + i);
            p.message.content = format!("{i:05}").repeat(2_000);
            p
        })
        .collect()
}

#[test]
fn a_failing_op_rolls_back_the_whole_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let rows: Vec<PendingInbound> = (0..4).map(|i| pending(i, i)).collect();
    store
        .commit(&[StoreOp::BufferInbound(rows.clone())])
        .unwrap();

    // The disk is full: the small ops of the step still fit in the pages the file has, the
    // large drain batch at the end of the step does not.
    store.cap_size_for_faults(0).unwrap();
    let small_ops = [
        StoreOp::CommitInbound {
            keys: vec![rows[0].key.clone()],
            at: 50,
        },
        StoreOp::ExpireInbound {
            keys: vec![rows[1].key.clone()],
        },
    ];
    let mut step = small_ops.to_vec();
    step.push(StoreOp::BufferInbound(drain_batch(100)));
    match store.commit(&step).unwrap_err() {
        StoreError::Sqlite(e) => assert_eq!(e.sqlite_error_code(), Some(ErrorCode::DiskFull)),
        other => panic!("expected SQLITE_FULL, got {other}"),
    }
    // Nothing of the step happened: the committed and the expired rows are still buffered,
    // nothing was marked processed, nothing of the batch was buffered.
    assert_eq!(store.load_pending_inbound().unwrap(), rows);
    assert!(processed(&mut store).is_empty());

    // The earlier ops were not what failed: on their own they commit under the same cap.
    store.commit(&small_ops).unwrap();
    assert_eq!(store.load_pending_inbound().unwrap(), rows[2..].to_vec());
    assert_eq!(processed(&mut store), vec![processed_key(&rows[0].key, 50)]);
    drop(store);

    // Once there is room again the batch goes through, and what was committed survived.
    let mut store = open(dir.path());
    let batch = drain_batch(100);
    store
        .commit(&[StoreOp::BufferInbound(batch.clone())])
        .unwrap();
    let mut expected = rows[2..].to_vec();
    expected.extend(batch);
    assert_eq!(store.load_pending_inbound().unwrap(), expected);
}

#[test]
fn a_400_message_drain_batch_is_one_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let batch = drain_batch(0);
    store
        .commit(&[StoreOp::BufferInbound(batch.clone())])
        .unwrap();
    assert_eq!(store.load_pending_inbound().unwrap(), batch);
    store
        .commit(&[StoreOp::CommitInbound {
            keys: keys_of(&batch),
            at: 2_000,
        }])
        .unwrap();
    assert!(store.load_pending_inbound().unwrap().is_empty());
    assert_eq!(processed(&mut store).len(), 400);
}

/// Not a correctness test: what one transaction per drain batch buys on this disk.
/// `cargo test -p courier-client --release --test store_inbound -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_buffer_batch() {
    use std::time::Instant;
    let dir = tempfile::tempdir_in(".").unwrap();
    let mut store = open(dir.path());
    let singles = drain_batch(0);
    let t = Instant::now();
    for p in &singles {
        store
            .commit(&[StoreOp::BufferInbound(vec![p.clone()])])
            .unwrap();
    }
    let single = t.elapsed();
    let batch = drain_batch(1_000);
    let t = Instant::now();
    store
        .commit(&[StoreOp::BufferInbound(batch.clone())])
        .unwrap();
    let one = t.elapsed();
    let t = Instant::now();
    store
        .commit(&[StoreOp::CommitInbound {
            keys: keys_of(&batch),
            at: 1,
        }])
        .unwrap();
    let clear = t.elapsed();
    println!(
        "400 steps of 1 BufferInbound: {single:?}; 1 step of 400: {one:?}; \
         CommitInbound of 400: {clear:?}"
    );
}
