//! The end-to-end session state in the store (`docs/architecture.md#end-to-end-sessions`):
//! written in the step's own transaction, sealed at rest under a key derived from the identity,
//! and read back at the next start; and the outbox's pre-session rows.

use std::path::Path;

use courier_client::store::{MessageStatus, Reports, RuntimeChanges, Store, StoreError};
use courier_crypto::Change;
use courier_engine::io::{EntryState, OutboxRecord, StoreOp};
use courier_proto::{ContentType, Message, Priority};
use rusqlite::Connection;

const SEED: [u8; 32] = [3u8; 32];
const SECRET: &[u8] = b"ratchet secret 0123456789abcdef, padded to 32 bytes or more";

fn open(db: &Path) -> Store {
    let mut store = Store::open(db).unwrap();
    store.load_or_create_identity(1, None, || Ok(SEED)).unwrap();
    store
}

fn put(key: &[u8], value: &[u8]) -> Change {
    Change {
        key: key.to_vec(),
        value: Some(value.to_vec()),
    }
}

fn waiting(id: &str) -> OutboxRecord {
    OutboxRecord {
        message: Message {
            id: id.into(),
            sender: "alice".into(),
            recipient: "bob".into(),
            app_id: "chat".into(),
            priority: Priority::Medium,
            ttl: 10,
            hop_count: 0,
            timestamp: 1,
            lamport_clock: 1,
            content_type: ContentType::Text,
            content: "later".into(),
            metadata: Default::default(),
            requires_ack: true,
            reply_to_msg: None,
            rich: None,
            binary_content: None,
            media_metadata: None,
            forwarded_from: None,
            reply_context: None,
            encrypted: None,
        },
        state: EntryState::AwaitingSession,
        created_at: 1,
        window_start: 1,
        ack_attempts: 0,
        transport_retries: 0,
        next_at: Some(604_800_001),
        first_sent_at: None,
        last_sent_at: None,
    }
}

/// Every byte of the database and its WAL.
fn files(db: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(db).unwrap();
    let wal = db.with_extension("db-wal");
    if let Ok(more) = std::fs::read(wal) {
        bytes.extend(more);
    }
    bytes
}

#[test]
fn session_rows_commit_with_the_step_and_come_back_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    {
        let mut store = open(&db);
        let ops = [StoreOp::Put(waiting("w1"))];
        let changes = [put(b"tree:1", SECRET), put(b"gone:1", b"x")];
        store
            .commit_with(
                &ops,
                &Reports::default(),
                &RuntimeChanges {
                    sessions: &changes,
                    ..Default::default()
                },
            )
            .unwrap();
        let deleted = [Change {
            key: b"gone:1".to_vec(),
            value: None,
        }];
        store
            .commit_with(
                &[],
                &Reports::default(),
                &RuntimeChanges {
                    sessions: &deleted,
                    ..Default::default()
                },
            )
            .unwrap();
        assert!(
            !files(&db).windows(SECRET.len()).any(|w| w == SECRET),
            "the session state is sealed at rest"
        );
    }
    let store = open(&db);
    assert_eq!(
        store.load_sessions().unwrap(),
        [(b"tree:1".to_vec(), SECRET.to_vec())]
    );
    let outbox = store.load_outbox().unwrap();
    assert_eq!(outbox, [waiting("w1")], "a pre-session row round-trips");
    assert_eq!(store.status("w1").unwrap(), MessageStatus::Queued);
}

#[test]
fn nothing_is_written_before_the_identity_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(&dir.path().join("s.db")).unwrap();
    let ops = [StoreOp::Put(waiting("w1"))];
    assert!(matches!(
        store.commit_with(
            &ops,
            &Reports::default(),
            &RuntimeChanges {
                sessions: &[put(b"k", b"v")],
                ..Default::default()
            }
        ),
        Err(StoreError::NoIdentity)
    ));
    assert!(
        store.load_outbox().unwrap().is_empty(),
        "the step was not half written"
    );
    assert!(matches!(store.load_sessions(), Err(StoreError::NoIdentity)));
}

#[test]
fn a_row_moved_under_another_key_does_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    {
        let mut store = open(&db);
        let changes = [put(b"a", b"value of a"), put(b"b", b"value of b")];
        store
            .commit_with(
                &[],
                &Reports::default(),
                &RuntimeChanges {
                    sessions: &changes,
                    ..Default::default()
                },
            )
            .unwrap();
    }
    let conn = Connection::open(&db).unwrap();
    conn.execute(
        "UPDATE mls_state SET nonce = (SELECT nonce FROM mls_state WHERE key = x'62'),
             value = (SELECT value FROM mls_state WHERE key = x'62') WHERE key = x'61'",
        [],
    )
    .unwrap();
    drop(conn);
    assert!(matches!(
        open(&db).load_sessions(),
        Err(StoreError::Corrupt(_))
    ));
}
