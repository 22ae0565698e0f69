//! The database file: creation, reopen, foreign files, newer schemas.

use std::fs;

use courier_client::store::{Store, StoreError, SCHEMA_VERSION};
use courier_engine::io::{EntryState, OutboxRecord, StoreOp};
use courier_proto::{ContentType, Message, Priority};

fn record(id: &str) -> OutboxRecord {
    OutboxRecord {
        message: Message {
            id: id.into(),
            sender: "alice".into(),
            recipient: "bob".into(),
            app_id: "chat".into(),
            priority: Priority::Medium,
            ttl: 8,
            hop_count: 0,
            timestamp: 1,
            lamport_clock: 1,
            content_type: ContentType::Text,
            content: "hi".into(),
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
        state: EntryState::Queued,
        created_at: 1,
        window_start: 1,
        ack_attempts: 0,
        transport_retries: 0,
        next_at: None,
        first_sent_at: None,
        last_sent_at: None,
    }
}

#[test]
fn creates_a_missing_file_and_reopens_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("new.db");
    assert!(!db.exists());
    let mut store = Store::open(&db).unwrap();
    assert!(db.exists());
    assert_eq!(store.path(), Some(db.as_path()));
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    store.commit(&[StoreOp::Put(record("m1"))]).unwrap();
    drop(store);

    for _ in 0..3 {
        let store = Store::open(&db).unwrap();
        assert_eq!(store.load_outbox().unwrap(), vec![record("m1")]);
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    }
}

#[test]
fn a_missing_directory_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let err = Store::open(&dir.path().join("no/such/dir/x.db")).unwrap_err();
    assert!(matches!(err, StoreError::Io(_)), "{err:?}");
}

#[test]
fn random_bytes_are_reported_as_not_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("garbage.db");
    let bytes: Vec<u8> = (0..8192u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::write(&db, &bytes).unwrap();
    let err = Store::open(&db).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("file is not a database"), "{msg}");
    assert!(msg.contains("garbage.db"), "{msg}");
    // Untouched, and the lock was released with the failed open.
    assert_eq!(fs::read(&db).unwrap(), bytes);
    assert!(matches!(Store::open(&db), Err(StoreError::Corrupt(_))));
}

#[test]
fn a_text_file_is_reported_as_not_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("notes.txt");
    fs::write(
        &db,
        "this is definitely not SQLite, but it is long enough to have a header\n".repeat(100),
    )
    .unwrap();
    let err = Store::open(&db).unwrap_err();
    assert!(err.to_string().contains("file is not a database"), "{err}");
}

#[test]
fn a_newer_schema_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("future.db");
    {
        let mut store = Store::open(&db).unwrap();
        store.commit(&[StoreOp::Put(record("m1"))]).unwrap();
    }
    // A newer build bumped the version (and would have changed the schema).
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        conn.execute_batch("PRAGMA journal_mode = DELETE;").unwrap();
    }
    let before = fs::read(&db).unwrap();
    let err = Store::open(&db).unwrap_err();
    match err {
        StoreError::NewerSchema { found, supported } => {
            assert_eq!(found, SCHEMA_VERSION + 1);
            assert_eq!(supported, SCHEMA_VERSION);
        }
        other => panic!("expected NewerSchema, got {other}"),
    }
    assert_eq!(fs::read(&db).unwrap(), before, "not a byte changed");
    assert!(
        !dir.path().join("future.db-wal").exists(),
        "not even switched to WAL"
    );
    let msg = Store::open(&db).unwrap_err().to_string();
    assert!(msg.contains("newer"), "{msg}");
}

#[test]
fn an_existing_empty_file_is_initialised() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("empty.db");
    fs::write(&db, b"").unwrap();
    let store = Store::open(&db).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
}

#[test]
fn committed_rows_survive_without_a_clean_close() {
    // `mem::forget` skips the connection's close (no final checkpoint): what was committed is
    // in the WAL and must be recovered by the next open. The lock file handle is leaked too,
    // so reopen through a copy of the files, as a new process after a crash would see them.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let mut store = Store::open(&db).unwrap();
    store
        .commit(&[StoreOp::Put(record("m1")), StoreOp::Put(record("m2"))])
        .unwrap();
    let copy = dir.path().join("copy.db");
    fs::copy(&db, &copy).unwrap();
    fs::copy(
        dir.path().join("crash.db-wal"),
        dir.path().join("copy.db-wal"),
    )
    .unwrap();
    std::mem::forget(store);
    let store = Store::open(&copy).unwrap();
    let ids: Vec<String> = store
        .load_outbox()
        .unwrap()
        .into_iter()
        .map(|r| r.message.id)
        .collect();
    assert_eq!(ids, ["m1", "m2"]);
}
