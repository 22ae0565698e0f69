//! Store semantics: what `commit` writes is what `load_*` / `settled` read back, across reopen.

use std::collections::BTreeMap;
use std::path::Path;

use courier_client::store::{MessageStatus, Store, StoreError, SCHEMA_VERSION};
use courier_engine::io::{
    EntryState, FailReason, InboundKey, OutboxRecord, ProcessedKey, Settlement, StoreOp,
};
use courier_proto::{ContentType, Message, Priority};
use rusqlite::ErrorCode;
use serde_json::json;

fn message(i: u64) -> Message {
    let mut metadata = BTreeMap::new();
    if i.is_multiple_of(2) {
        metadata.insert("thread".to_owned(), format!("t{i}"));
        metadata.insert("ünïcode".to_owned(), "✓ \"quoted\" \n newline".to_owned());
    }
    Message {
        id: format!("msg-{i}"),
        sender: "alice".into(),
        recipient: format!("peer-{}", i % 3),
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
        reply_to_msg: i
            .is_multiple_of(3)
            .then(|| format!("msg-{}", i.saturating_sub(1))),
        rich: (i == 5).then(|| json!({"mentions": ["bob"], "extras": {"k": [1]}})),
        binary_content: (i % 4 == 1).then(|| json!("aGVsbG8=")),
        media_metadata: (i % 4 == 2).then(|| json!({"w": 640, "h": 480})),
        forwarded_from: None,
        reply_context: (i == 6).then(|| json!({"quote": "x"})),
        encrypted: None,
    }
}

/// Records covering every `EntryState`, `None` and `Some` timers, extreme counters.
fn record(i: u64) -> OutboxRecord {
    let opt = |k: u64, v: u64| (!i.is_multiple_of(k)).then_some(v);
    OutboxRecord {
        message: message(i),
        state: [EntryState::Queued, EntryState::InFlight, EntryState::Parked][(i % 3) as usize],
        created_at: 1_700_000_000_000 + i * 1000,
        window_start: 1_700_000_000_500 + i * 1000,
        ack_attempts: match i % 4 {
            0 => 0,
            1 => 1,
            2 => 10,
            _ => u32::MAX,
        },
        transport_retries: (i * 13 % 50) as u32,
        next_at: opt(2, 1_700_000_100_000 + i),
        first_sent_at: opt(3, 1_700_000_000_001 + i),
        last_sent_at: opt(
            5,
            if i == 7 {
                i64::MAX as u64
            } else {
                1_700_000_000_002 + i
            },
        ),
    }
}

fn put_all(records: &[OutboxRecord]) -> Vec<StoreOp> {
    records.iter().cloned().map(StoreOp::Put).collect()
}

fn open(dir: &Path) -> Store {
    Store::open(&dir.join("courier.db")).expect("open")
}

#[test]
fn every_outbox_field_survives_commit_load_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<OutboxRecord> = (0..24).map(record).collect();
    // Sanity: the sample really covers the interesting cases.
    for state in [EntryState::Queued, EntryState::InFlight, EntryState::Parked] {
        assert!(records.iter().any(|r| r.state == state));
    }
    assert!(
        records.iter().any(|r| r.next_at.is_none()) && records.iter().any(|r| r.next_at.is_some())
    );
    assert!(records.iter().any(|r| r.first_sent_at.is_none()));
    assert!(records.iter().any(|r| r.last_sent_at.is_none()));

    {
        let mut store = open(dir.path());
        // Commit in an order different from created_at: load must sort.
        let mut shuffled = records.clone();
        shuffled.reverse();
        shuffled.swap(3, 17);
        store.commit(&put_all(&shuffled)).unwrap();
        assert_eq!(store.load_outbox().unwrap(), records);
    }
    let store = open(dir.path());
    assert_eq!(store.load_outbox().unwrap(), records);
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
}

#[test]
fn put_replaces_the_row_of_the_same_id() {
    let mut store = Store::open_memory().unwrap();
    let mut r = record(1);
    store.commit(&[StoreOp::Put(r.clone())]).unwrap();
    r.state = EntryState::Parked;
    r.ack_attempts = 4;
    r.next_at = None;
    r.last_sent_at = Some(42);
    store.commit(&[StoreOp::Put(r.clone())]).unwrap();
    assert_eq!(store.load_outbox().unwrap(), vec![r]);
}

#[test]
fn equal_created_at_keeps_insertion_order() {
    let mut store = Store::open_memory().unwrap();
    let records: Vec<OutboxRecord> = (0..5)
        .map(|i| OutboxRecord {
            created_at: 1000,
            ..record(10 - i)
        })
        .collect();
    store.commit(&put_all(&records)).unwrap();
    assert_eq!(store.load_outbox().unwrap(), records);
}

#[test]
fn settle_removes_the_row_and_records_the_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let records: Vec<OutboxRecord> = (0..4).map(record).collect();
    store.commit(&put_all(&records)).unwrap();
    assert_eq!(store.status("msg-0").unwrap(), MessageStatus::Queued);
    assert_eq!(store.status("msg-1").unwrap(), MessageStatus::InFlight);
    assert_eq!(store.status("msg-2").unwrap(), MessageStatus::Parked);
    assert_eq!(store.status("nope").unwrap(), MessageStatus::Unknown);

    // Every reason the engine settles with reads back as itself.
    let reasons = FailReason::ALL;
    let mut ops = vec![StoreOp::Settle {
        id: "msg-0".into(),
        recipient: "peer-0".into(),
        settlement: Settlement::Delivered,
        at: 5000,
    }];
    for (i, reason) in reasons.into_iter().enumerate() {
        ops.push(StoreOp::Settle {
            id: format!("msg-{}", i + 1),
            recipient: format!("peer-{}", i + 1),
            settlement: Settlement::Failed(reason),
            at: 6000 + i as u64,
        });
    }
    store.commit(&ops).unwrap();
    assert!(store.load_outbox().unwrap().is_empty());
    drop(store);

    let store = open(dir.path());
    let delivered = store.settled("msg-0").unwrap().unwrap();
    assert_eq!(delivered.outcome, Settlement::Delivered);
    assert_eq!(delivered.at, 5000);
    assert_eq!(delivered.recipient, "peer-0");
    for (i, reason) in reasons.into_iter().enumerate() {
        let s = store.settled(&format!("msg-{}", i + 1)).unwrap().unwrap();
        assert_eq!(s.outcome, Settlement::Failed(reason));
        assert_eq!(s.at, 6000 + i as u64);
    }
    assert_eq!(store.settled("never-sent").unwrap(), None);
    assert_eq!(store.status("msg-0").unwrap(), MessageStatus::Delivered);
    assert_eq!(store.status("msg-1").unwrap(), MessageStatus::Failed);
    assert_eq!(MessageStatus::InFlight.as_str(), "in_flight");
}

#[test]
fn settling_an_unknown_id_still_records_it_and_resettling_updates() {
    let mut store = Store::open_memory().unwrap();
    let settle = |settlement, at| StoreOp::Settle {
        id: "x".into(),
        recipient: "bob".into(),
        settlement,
        at,
    };
    store
        .commit(&[settle(
            Settlement::Failed(FailReason::MaxRetriesExceeded),
            1,
        )])
        .unwrap();
    store.commit(&[settle(Settlement::Delivered, 2)]).unwrap();
    let s = store.settled("x").unwrap().unwrap();
    assert_eq!((s.outcome, s.at), (Settlement::Delivered, 2));
}

#[test]
fn re_accepting_a_settled_id_makes_it_live_again() {
    let mut store = Store::open_memory().unwrap();
    let r = record(3);
    let id = r.message.id.clone();
    store
        .commit(&[
            StoreOp::Put(r.clone()),
            StoreOp::Settle {
                id: id.clone(),
                recipient: r.message.recipient.clone(),
                settlement: Settlement::Failed(FailReason::MaxRetriesExceeded),
                at: 10,
            },
        ])
        .unwrap();
    assert_eq!(store.status(&id).unwrap(), MessageStatus::Failed);
    store.commit(&[StoreOp::Put(r.clone())]).unwrap();
    assert_eq!(store.settled(&id).unwrap(), None);
    assert_eq!(store.status(&id).unwrap(), MessageStatus::Queued);
    assert_eq!(store.load_outbox().unwrap(), vec![r]);
}

#[test]
fn mark_processed_is_idempotent_and_keeps_the_first_time() {
    let dir = tempfile::tempdir().unwrap();
    let key = |chat: &str, id: &str, at| ProcessedKey {
        key: InboundKey {
            chat: chat.into(),
            sender: "alice".into(),
            message_id: id.into(),
        },
        at,
    };
    {
        let mut store = open(dir.path());
        store
            .commit(&[
                StoreOp::MarkProcessed(key("dm", "m1", 100)),
                StoreOp::MarkProcessed(key("dm", "m1", 200)),
                StoreOp::MarkProcessed(key("group-1", "m1", 150)),
            ])
            .unwrap();
        store
            .commit(&[StoreOp::MarkProcessed(key("dm", "m1", 300))])
            .unwrap();
    }
    let mut store = open(dir.path());
    let keys = store.load_processed(1000, 10_000, 100).unwrap();
    assert_eq!(keys, vec![key("dm", "m1", 100), key("group-1", "m1", 150)]);
}

/// The keys of verified control frames live apart from the count-bounded dedup record: however
/// many messages arrive, an observed control frame stays known until its signature could no
/// longer pass the freshness check (`docs/delivery.md#control-frames`).
#[test]
fn a_flood_of_processed_messages_cannot_evict_a_control_frames_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = |id: &str, at| ProcessedKey {
        key: InboundKey {
            chat: "off1signer".into(),
            sender: "off1signer".into(),
            message_id: id.into(),
        },
        at,
    };
    let control = key("welcome", 1000);
    {
        let mut store = open(dir.path());
        store
            .commit(&[
                StoreOp::MarkControl(control.clone()),
                StoreOp::MarkControl(key("welcome", 2000)),
            ])
            .unwrap();
        let flood: Vec<StoreOp> = (0..50u64)
            .map(|i| StoreOp::MarkProcessed(key(&format!("flood-{i}"), 1001 + i)))
            .collect();
        store.commit(&flood).unwrap();
        assert_eq!(store.prune_processed(0, 10).unwrap(), 40);
    }
    let mut store = open(dir.path());
    assert_eq!(store.load_processed(5000, 10_000, 10).unwrap().len(), 10);
    let window = courier_proto::CONTROL_REPLAY_WINDOW_MS;
    assert_eq!(
        store.load_processed_controls(1000 + window).unwrap(),
        [control],
        "kept, with its first time, for the whole replay window"
    );
    assert_eq!(store.prune_processed_controls(1000).unwrap(), 0);
    assert_eq!(store.prune_processed_controls(1001).unwrap(), 1);
    assert!(store
        .load_processed_controls(1001 + window)
        .unwrap()
        .is_empty());
}

#[test]
fn load_processed_prunes_expired_then_excess() {
    let mut store = Store::open_memory().unwrap();
    let ops: Vec<StoreOp> = (0..20u64)
        .map(|i| {
            StoreOp::MarkProcessed(ProcessedKey {
                key: InboundKey {
                    chat: "dm".into(),
                    sender: format!("s{}", i % 4),
                    message_id: format!("m{i}"),
                },
                at: 1000 + i * 100,
            })
        })
        .collect();
    store.commit(&ops).unwrap();

    // now = 3000, retention 1500 → keep at >= 1500, i.e. i >= 5 (15 rows); max 10 → newest 10.
    let keys = store.load_processed(3000, 1500, 10).unwrap();
    let ats: Vec<u64> = keys.iter().map(|k| k.at).collect();
    assert_eq!(ats, (10..20).map(|i| 1000 + i * 100).collect::<Vec<_>>());
    // The pruning was persisted.
    assert_eq!(store.load_processed(3000, 1500, 100).unwrap().len(), 10);
    // A retention longer than `now` prunes nothing by age.
    assert_eq!(store.load_processed(3000, u64::MAX, 100).unwrap().len(), 10);
    // Periodic trimming.
    assert_eq!(store.prune_processed(2000, 100).unwrap(), 0);
    assert_eq!(store.prune_processed(2500, 3).unwrap(), 5 + 2);
    assert_eq!(store.load_processed(3000, u64::MAX, 100).unwrap().len(), 3);
    assert_eq!(store.prune_processed(0, 0).unwrap(), 3);
}

#[test]
fn prune_settled_bounds_by_age_and_count() {
    let mut store = Store::open_memory().unwrap();
    let ops: Vec<StoreOp> = (0..50u64)
        .map(|i| StoreOp::Settle {
            id: format!("m{i:02}"),
            recipient: "bob".into(),
            settlement: if i.is_multiple_of(2) {
                Settlement::Delivered
            } else {
                Settlement::Failed(FailReason::OutboxLifetimeExceeded)
            },
            at: i * 10,
        })
        .collect();
    store.commit(&ops).unwrap();

    // Older than 100 → m00..m09 go (10 rows); then keep the newest 25 of the remaining 40.
    assert_eq!(store.prune_settled(100, 25).unwrap(), 10 + 15);
    assert_eq!(store.settled("m24").unwrap(), None);
    assert!(store.settled("m25").unwrap().is_some());
    assert!(store.settled("m49").unwrap().is_some());
    assert_eq!(store.prune_settled(100, 25).unwrap(), 0);
    assert_eq!(store.prune_settled(u64::MAX, 1000).unwrap(), 25);
    assert_eq!(store.settled("m49").unwrap(), None);
}

/// One transaction: a batch that cannot be written to the end leaves none of its rows behind,
/// though its first ones would have fit on their own.
#[test]
fn a_large_batch_is_one_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    store.commit(&[StoreOp::Put(record(1000))]).unwrap();
    let records: Vec<OutboxRecord> = (0..500).map(record).collect();

    // The disk is full: the file may not grow past its size now.
    store.cap_size_for_faults(0).unwrap();
    match store.commit(&put_all(&records)).unwrap_err() {
        StoreError::Sqlite(e) => assert_eq!(e.sqlite_error_code(), Some(ErrorCode::DiskFull)),
        other => panic!("expected SQLITE_FULL, got {other}"),
    }
    assert_eq!(store.load_outbox().unwrap(), vec![record(1000)]);
    // Not the batch's first row that failed: on its own it fits in the pages the file has.
    store.commit(&put_all(&records[..1])).unwrap();
    assert_eq!(store.load_outbox().unwrap().len(), 2);
    drop(store);

    // With room again the whole batch lands.
    let mut store = open(dir.path());
    store.commit(&put_all(&records)).unwrap();
    assert_eq!(store.load_outbox().unwrap().len(), 501);
}

#[test]
fn checkpoint_runs_only_when_the_wal_is_large() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    store.commit(&[StoreOp::Put(record(1))]).unwrap();
    let small = store.wal_pages();
    assert!(small > 0 && small < 1000, "{small}");
    store.maybe_checkpoint().unwrap();
    assert_eq!(store.wal_pages(), small, "small WAL: no checkpoint");

    // ~4 MB of rows: well past 1000 pages of 4 KiB.
    let big: Vec<StoreOp> = (0..40u64)
        .map(|i| {
            let mut r = record(i);
            r.message.content = "x".repeat(100_000);
            StoreOp::Put(r)
        })
        .collect();
    store.commit(&big).unwrap();
    assert!(store.wal_pages() > 1000, "{}", store.wal_pages());
    store.maybe_checkpoint().unwrap();
    assert_eq!(store.wal_pages(), 0);
    // The next commit restarts the WAL from the beginning.
    store.commit(&[StoreOp::Put(record(2))]).unwrap();
    assert!(store.wal_pages() < 100, "{}", store.wal_pages());
    drop(store);
    assert_eq!(open(dir.path()).load_outbox().unwrap().len(), 40);
}

#[test]
fn memory_store_has_the_same_semantics_and_forgets() {
    let mut store = Store::open_memory().unwrap();
    store.commit(&[StoreOp::Put(record(0))]).unwrap();
    assert_eq!(store.load_outbox().unwrap(), vec![record(0)]);
    store.maybe_checkpoint().unwrap();
    assert_eq!(store.wal_pages(), 0);
    drop(store);
    assert!(Store::open_memory()
        .unwrap()
        .load_outbox()
        .unwrap()
        .is_empty());
    // Two memory stores are independent: no lock involved.
    let _a = Store::open_memory().unwrap();
    let _b = Store::open_memory().unwrap();
}

/// Not a correctness test: prints what group commit buys on this disk.
/// `cargo test -p courier-client --release --test store_roundtrip -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_group_commit() {
    use std::time::Instant;
    let dir = tempfile::tempdir_in(".").unwrap();
    let mut store = open(dir.path());
    let records: Vec<OutboxRecord> = (0..100).map(record).collect();

    let t = Instant::now();
    for r in &records {
        store.commit(&[StoreOp::Put(r.clone())]).unwrap();
    }
    let single = t.elapsed();

    let batch_records: Vec<OutboxRecord> = (100..200).map(record).collect();
    let t = Instant::now();
    store.commit(&put_all(&batch_records)).unwrap();
    let batch = t.elapsed();
    println!("100 commits of 1 Put: {single:?}; 1 commit of 100 Puts: {batch:?}");
}
