//! Schema migrations against databases written by earlier versions (issue 2: once a second
//! schema version exists, opening a previous-version file must keep every pending row).
//!
//! The version-1 database is built here with raw SQL, frozen exactly as migration 1 and the
//! version-1 store wrote it (its DDL, its column encodings, its `message_json`), rather than by
//! calling today's code: a later edit to the migration list or to the row encoders must not be
//! able to silently change what "a version-1 file" means in this test.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use courier_client::store::{SettledRecord, Store, StoreError, SCHEMA_VERSION};
use courier_engine::io::{
    EntryState, FailReason, InboundKey, OutboxRecord, ProcessedKey, Settlement,
};
use courier_proto::{ContentType, Message, Priority};
use rusqlite::Connection;
use serde_json::json;

/// Migration 1's DDL, verbatim.
const V1_SCHEMA: &str = "CREATE TABLE outbox (
         id                TEXT    PRIMARY KEY NOT NULL,
         recipient         TEXT    NOT NULL,
         state             TEXT    NOT NULL CHECK (state IN ('queued', 'in_flight', 'parked')),
         created_at        INTEGER NOT NULL,
         window_start      INTEGER NOT NULL,
         ack_attempts      INTEGER NOT NULL CHECK (ack_attempts >= 0),
         transport_retries INTEGER NOT NULL CHECK (transport_retries >= 0),
         next_at           INTEGER NULL,
         first_sent_at     INTEGER NULL,
         last_sent_at      INTEGER NULL,
         is_media          INTEGER NOT NULL CHECK (is_media IN (0, 1)),
         message_json      TEXT    NOT NULL
     );
     CREATE INDEX outbox_by_created_at ON outbox (created_at);

     CREATE TABLE settled (
         id        TEXT    PRIMARY KEY NOT NULL,
         recipient TEXT    NOT NULL,
         outcome   TEXT    NOT NULL CHECK (outcome IN ('delivered', 'failed')),
         reason    TEXT    NULL,
         at        INTEGER NOT NULL,
         CHECK ((outcome = 'delivered') = (reason IS NULL))
     ) WITHOUT ROWID;
     CREATE INDEX settled_by_at ON settled (at);

     CREATE TABLE processed (
         chat       TEXT    NOT NULL,
         sender     TEXT    NOT NULL,
         message_id TEXT    NOT NULL,
         at         INTEGER NOT NULL,
         PRIMARY KEY (chat, sender, message_id)
     ) WITHOUT ROWID;
     CREATE INDEX processed_by_at ON processed (at);";

/// Pending outbox rows as the version-1 store wrote them: every column set (including the three
/// nullable timers), every state, a media row, and `message_json` as version 1 serialised it,
/// with every optional message field present. Inserted in an order different from
/// `created_at`, so the load order is the store's, not the insertion's.
const V1_OUTBOX_ROWS: &str = r#"
INSERT INTO outbox VALUES ('m-parked', 'carol', 'parked', 1700000003000, 1700000003500, 7, 2,
    1700000009000, 1700000003100, 1700000008000, 0,
    '{"id":"m-parked","sender":"alice","recipient":"carol","app_id":"chat","priority":"critical","ttl":3,"hop_count":1,"timestamp":1700000003000,"lamport_clock":9223372036854775807,"content_type":"text","content":"parked ✓ \"quoted\"\nline","metadata":{"thread":"t3","ünïcode":"✓"},"requires_ack":true,"reply_to_msg":"m-queued","binary_content":"aGVsbG8=","media_metadata":{"h":480,"w":640},"forwarded_from":{"by":"dave"},"reply_context":{"quote":"x"}}');
INSERT INTO outbox VALUES ('m-queued', 'bob', 'queued', 1700000001000, 1700000001000, 0, 0,
    1700000001500, 1700000001001, 1700000001002, 0,
    '{"id":"m-queued","sender":"alice","recipient":"bob","app_id":"chat","priority":"low","ttl":8,"hop_count":0,"timestamp":1700000001000,"lamport_clock":1,"content_type":"text","content":"hello 👋","metadata":{},"requires_ack":false,"reply_to_msg":null,"binary_content":{"k":[1,2]},"media_metadata":{"kind":"none"},"forwarded_from":"x","reply_context":{"id":"m0"}}');
INSERT INTO outbox VALUES ('m-inflight', 'bob', 'in_flight', 1700000002000, 1700000002500, 4294967295, 49,
    1700000007000, 1700000002001, 9223372036854775807, 0,
    '{"id":"m-inflight","sender":"alice","recipient":"bob","app_id":"chat","priority":"medium","ttl":0,"hop_count":4,"timestamp":1700000002000,"lamport_clock":14,"content_type":"text","content":"","metadata":{"a":"b"},"requires_ack":true,"reply_to_msg":"m-queued","binary_content":null,"media_metadata":[1],"forwarded_from":{"by":"erin"},"reply_context":"r"}');
INSERT INTO outbox VALUES ('m-media', 'dave', 'queued', 1700000004000, 1700000004000, 1, 13,
    1700000004100, 1700000004001, 1700000004002, 1,
    '{"id":"m-media","sender":"alice","recipient":"dave","app_id":"files","priority":"high","ttl":15,"hop_count":0,"timestamp":1700000004000,"lamport_clock":99,"content_type":"file_chunk","content":"chunk-0","metadata":{"file":"f1"},"requires_ack":true,"reply_to_msg":null,"binary_content":"AAEC","media_metadata":{"index":0,"total":3},"forwarded_from":{"by":"frank"},"reply_context":{"q":1}}');
"#;

const V1_SETTLED_ROWS: &str = "
INSERT INTO settled VALUES ('s-delivered', 'bob', 'delivered', NULL, 1700000000100);
INSERT INTO settled VALUES ('s-failed-retries', 'carol', 'failed', 'Max retries exceeded', 1700000000200);
INSERT INTO settled VALUES ('s-failed-lifetime', 'dave', 'failed', 'Outbox lifetime exceeded', 1700000000300);
INSERT INTO settled VALUES ('s-failed-capacity', 'erin', 'failed', 'Outbox capacity exceeded', 1700000000400);
";

const V1_PROCESSED_ROWS: &str = "
INSERT INTO processed VALUES ('dm', 'bob', 'in-1', 1700000000010);
INSERT INTO processed VALUES ('group-1', 'bob', 'in-1', 1700000000020);
INSERT INTO processed VALUES ('dm', 'carol', 'in-2', 1700000000030);
";

fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// What `load_outbox` must return for `V1_OUTBOX_ROWS`, oldest `created_at` first.
fn expected_outbox() -> Vec<OutboxRecord> {
    let base = |id: &str, recipient: &str| Message {
        id: id.into(),
        sender: "alice".into(),
        recipient: recipient.into(),
        app_id: "chat".into(),
        priority: Priority::Medium,
        ttl: 0,
        hop_count: 0,
        timestamp: 0,
        lamport_clock: 0,
        content_type: ContentType::Text,
        content: String::new(),
        metadata: BTreeMap::new(),
        requires_ack: true,
        reply_to_msg: None,
        rich: None,
        binary_content: None,
        media_metadata: None,
        forwarded_from: None,
        reply_context: None,
        encrypted: None,
    };
    vec![
        OutboxRecord {
            message: Message {
                priority: Priority::Low,
                ttl: 8,
                timestamp: 1_700_000_001_000,
                lamport_clock: 1,
                content: "hello 👋".into(),
                requires_ack: false,
                binary_content: Some(json!({"k": [1, 2]})),
                media_metadata: Some(json!({"kind": "none"})),
                forwarded_from: Some(json!("x")),
                reply_context: Some(json!({"id": "m0"})),
                encrypted: None,
                ..base("m-queued", "bob")
            },
            state: EntryState::Queued,
            created_at: 1_700_000_001_000,
            window_start: 1_700_000_001_000,
            ack_attempts: 0,
            transport_retries: 0,
            next_at: Some(1_700_000_001_500),
            first_sent_at: Some(1_700_000_001_001),
            last_sent_at: Some(1_700_000_001_002),
        },
        OutboxRecord {
            message: Message {
                hop_count: 4,
                timestamp: 1_700_000_002_000,
                lamport_clock: 14,
                metadata: meta(&[("a", "b")]),
                reply_to_msg: Some("m-queued".into()),
                // `null` in JSON reads back as an absent optional field.
                binary_content: None,
                media_metadata: Some(json!([1])),
                forwarded_from: Some(json!({"by": "erin"})),
                reply_context: Some(json!("r")),
                encrypted: None,
                ..base("m-inflight", "bob")
            },
            state: EntryState::InFlight,
            created_at: 1_700_000_002_000,
            window_start: 1_700_000_002_500,
            ack_attempts: u32::MAX,
            transport_retries: 49,
            next_at: Some(1_700_000_007_000),
            first_sent_at: Some(1_700_000_002_001),
            last_sent_at: Some(i64::MAX as u64),
        },
        OutboxRecord {
            message: Message {
                priority: Priority::Critical,
                ttl: 3,
                hop_count: 1,
                timestamp: 1_700_000_003_000,
                lamport_clock: i64::MAX as u64,
                content: "parked ✓ \"quoted\"\nline".into(),
                metadata: meta(&[("thread", "t3"), ("ünïcode", "✓")]),
                reply_to_msg: Some("m-queued".into()),
                rich: None,
                binary_content: Some(json!("aGVsbG8=")),
                media_metadata: Some(json!({"w": 640, "h": 480})),
                forwarded_from: Some(json!({"by": "dave"})),
                reply_context: Some(json!({"quote": "x"})),
                encrypted: None,
                ..base("m-parked", "carol")
            },
            state: EntryState::Parked,
            created_at: 1_700_000_003_000,
            window_start: 1_700_000_003_500,
            ack_attempts: 7,
            transport_retries: 2,
            next_at: Some(1_700_000_009_000),
            first_sent_at: Some(1_700_000_003_100),
            last_sent_at: Some(1_700_000_008_000),
        },
        OutboxRecord {
            message: Message {
                app_id: "files".into(),
                priority: Priority::High,
                ttl: 15,
                timestamp: 1_700_000_004_000,
                lamport_clock: 99,
                content_type: ContentType::FileChunk,
                content: "chunk-0".into(),
                metadata: meta(&[("file", "f1")]),
                binary_content: Some(json!("AAEC")),
                media_metadata: Some(json!({"index": 0, "total": 3})),
                forwarded_from: Some(json!({"by": "frank"})),
                reply_context: Some(json!({"q": 1})),
                encrypted: None,
                ..base("m-media", "dave")
            },
            state: EntryState::Queued,
            created_at: 1_700_000_004_000,
            window_start: 1_700_000_004_000,
            ack_attempts: 1,
            transport_retries: 13,
            next_at: Some(1_700_000_004_100),
            first_sent_at: Some(1_700_000_004_001),
            last_sent_at: Some(1_700_000_004_002),
        },
    ]
}

fn expected_settled() -> Vec<(&'static str, SettledRecord)> {
    let rec = |outcome, at, recipient: &str| SettledRecord {
        outcome,
        at,
        recipient: recipient.into(),
    };
    vec![
        (
            "s-delivered",
            rec(Settlement::Delivered, 1_700_000_000_100, "bob"),
        ),
        (
            "s-failed-retries",
            rec(
                Settlement::Failed(FailReason::MaxRetriesExceeded),
                1_700_000_000_200,
                "carol",
            ),
        ),
        (
            "s-failed-lifetime",
            rec(
                Settlement::Failed(FailReason::OutboxLifetimeExceeded),
                1_700_000_000_300,
                "dave",
            ),
        ),
        (
            "s-failed-capacity",
            rec(
                Settlement::Failed(FailReason::OutboxCapacityExceeded),
                1_700_000_000_400,
                "erin",
            ),
        ),
    ]
}

fn expected_processed() -> Vec<ProcessedKey> {
    let key = |chat: &str, sender: &str, id: &str, at| ProcessedKey {
        key: InboundKey {
            chat: chat.into(),
            sender: sender.into(),
            message_id: id.into(),
        },
        at,
    };
    vec![
        key("dm", "bob", "in-1", 1_700_000_000_010),
        key("group-1", "bob", "in-1", 1_700_000_000_020),
        key("dm", "carol", "in-2", 1_700_000_000_030),
    ]
}

/// A database exactly as a version-1 build left it: WAL mode, the v1 schema, its rows,
/// `user_version = 1`, closed cleanly.
fn write_v1_database(db: &Path) {
    let conn = Connection::open(db).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    conn.execute_batch(&format!(
        "BEGIN IMMEDIATE;
         {V1_SCHEMA}
         PRAGMA user_version = 1;
         COMMIT;
         BEGIN;
         {V1_OUTBOX_ROWS}
         {V1_SETTLED_ROWS}
         {V1_PROCESSED_ROWS}
         COMMIT;"
    ))
    .unwrap();
}

/// `(type, name, sql)` of every schema object, in a stable order.
fn schema_of(db: &Path) -> Vec<(String, String, Option<String>)> {
    let conn = Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare("SELECT type, name, sql FROM sqlite_master ORDER BY type, name")
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap();
    rows.map(Result::unwrap).collect()
}

fn user_version(db: &Path) -> i64 {
    Connection::open(db)
        .unwrap()
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap()
}

fn assert_v1_rows_intact(store: &mut Store) {
    assert_eq!(store.load_outbox().unwrap(), expected_outbox());
    for (id, record) in expected_settled() {
        assert_eq!(store.settled(id).unwrap(), Some(record), "{id}");
    }
    // A retention and a cap that prune nothing.
    let processed = store
        .load_processed(1_700_000_000_000, u64::MAX, 1_000)
        .unwrap();
    assert_eq!(processed, expected_processed());
}

#[test]
fn the_fixture_is_a_version_1_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v1.db");
    write_v1_database(&db);
    assert_eq!(user_version(&db), 1);
    let names: Vec<String> = schema_of(&db).into_iter().map(|(_, n, _)| n).collect();
    assert!(
        !names.iter().any(|n| n.contains("pending_inbound")),
        "{names:?}"
    );
    let outbox: i64 = Connection::open(&db)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM outbox", [], |r| r.get(0))
        .unwrap();
    assert_eq!(outbox, 4);
}

#[test]
fn a_version_1_database_is_migrated_to_the_current_version_keeping_every_row() {
    assert_eq!(SCHEMA_VERSION, 14);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v1.db");
    write_v1_database(&db);
    let v1_schema = schema_of(&db);

    {
        let mut store = Store::open(&db).unwrap();
        assert_eq!(store.schema_version().unwrap(), 14);
        assert_v1_rows_intact(&mut store);
        assert!(store.load_pending_inbound().unwrap().is_empty());
    }
    assert_eq!(user_version(&db), 14);

    // The version-1 objects are unchanged but `settled`, which gained one nullable column, and
    // `outbox`, rebuilt with one more allowed state; exactly the new tables and their indexes
    // were added.
    let v2_schema = schema_of(&db);
    let added: Vec<_> = v2_schema
        .iter()
        .filter(|o| !v1_schema.iter().any(|v1| v1.1 == o.1))
        .map(|(kind, name, _)| (kind.as_str(), name.as_str()))
        .collect();
    assert!(v1_schema
        .iter()
        .filter(|o| o.1 != "settled" && o.1 != "outbox")
        .all(|o| v2_schema.contains(o)));
    assert_eq!(
        columns_of(&db, "outbox"),
        columns_of_v1_outbox(),
        "the rebuilt outbox keeps its columns"
    );
    assert_eq!(
        columns_of(&db, "settled"),
        [
            "id",
            "recipient",
            "outcome",
            "reason",
            "at",
            "unreported_event"
        ]
    );
    assert_eq!(
        added,
        vec![
            ("index", "group_sends_by_done"),
            ("index", "pending_inbound_by_received_at"),
            ("index", "processed_controls_by_at"),
            ("index", "received_messages_by_id"),
            ("index", "received_messages_by_received_at"),
            ("index", "sqlite_autoindex_pending_inbound_1"),
            ("index", "sqlite_autoindex_received_messages_1"),
            ("table", "chat_groups"),
            ("table", "connection_requests"),
            ("table", "contacts"),
            ("table", "group_registration"),
            ("table", "group_send_members"),
            ("table", "group_sends"),
            ("table", "identity"),
            ("table", "ledger"),
            ("table", "media_in"),
            ("table", "media_out"),
            ("table", "mls_state"),
            ("table", "pending_inbound"),
            ("table", "processed_controls"),
            ("table", "received_messages"),
        ]
    );
    assert_eq!(
        columns_of(&db, "pending_inbound"),
        [
            "chat",
            "sender",
            "message_id",
            "message_json",
            "carrier",
            "stamped_sender",
            "received_at",
            "encrypted"
        ]
    );
    let conn = Connection::open(&db).unwrap();
    for table in [
        "pending_inbound",
        "identity",
        "mls_state",
        "contacts",
        "connection_requests",
        "chat_groups",
        "group_registration",
        "group_sends",
        "group_send_members",
        "received_messages",
        "processed_controls",
        "ledger",
    ] {
        let empty: i64 = conn
            .query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
            .unwrap();
        assert_eq!(empty, 0, "{table}");
    }
    drop(conn);

    // And the migrated file keeps working across reopen.
    let mut store = Store::open(&db).unwrap();
    assert_eq!(store.schema_version().unwrap(), 14);
    assert_v1_rows_intact(&mut store);
}

#[test]
fn a_current_version_database_is_opened_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v1.db");
    write_v1_database(&db);
    drop(Store::open(&db).unwrap()); // now the current version, closed cleanly (WAL checkpointed)
    let schema = schema_of(&db);
    let before = fs::read(&db).unwrap();

    {
        let store = Store::open(&db).unwrap();
        assert_eq!(store.schema_version().unwrap(), 14);
        assert_eq!(store.load_outbox().unwrap(), expected_outbox());
    }
    // No migration ran: not a byte of the database file changed (its header holds a change
    // counter that any committed write would bump), and the schema is the same.
    assert_eq!(fs::read(&db).unwrap(), before);
    assert_eq!(schema_of(&db), schema);
    assert_eq!(user_version(&db), 14);

    let mut store = Store::open(&db).unwrap();
    assert_v1_rows_intact(&mut store);
}

#[test]
fn a_database_newer_than_the_current_version_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v15.db");
    write_v1_database(&db);
    drop(Store::open(&db).unwrap());
    {
        // A version-15 build added something and bumped the version.
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch(
            "BEGIN;
             CREATE TABLE from_the_future (x INTEGER);
             PRAGMA user_version = 15;
             COMMIT;",
        )
        .unwrap();
    }
    let before = fs::read(&db).unwrap();
    match Store::open(&db).unwrap_err() {
        StoreError::NewerSchema { found, supported } => {
            assert_eq!((found, supported), (15, 14));
        }
        other => panic!("expected NewerSchema, got {other}"),
    }
    assert_eq!(fs::read(&db).unwrap(), before, "not a byte changed");
    assert_eq!(user_version(&db), 15);
    let outbox: i64 = Connection::open(&db)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM outbox", [], |r| r.get(0))
        .unwrap();
    assert_eq!(outbox, 4);
}

#[test]
fn a_failed_migration_leaves_the_version_1_file_usable_by_version_1() {
    // A pre-existing object in the way of the v2 DDL makes the migration fail; the file must
    // stay exactly a version-1 database with all its rows.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v1.db");
    write_v1_database(&db);
    Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE pending_inbound (x INTEGER);")
        .unwrap();
    let schema = schema_of(&db);

    match Store::open(&db).unwrap_err() {
        StoreError::Migration { to: 2, message } => {
            assert!(message.contains("already exists"), "{message}")
        }
        other => panic!("expected a migration error, got {other}"),
    }
    assert_eq!(user_version(&db), 1);
    assert_eq!(schema_of(&db), schema);
    let outbox: i64 = Connection::open(&db)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM outbox", [], |r| r.get(0))
        .unwrap();
    assert_eq!(outbox, 4);
}

/// `table`'s column names, in order.
fn columns_of(db: &Path, table: &str) -> Vec<String> {
    Connection::open(db)
        .unwrap()
        .prepare(&format!(
            "SELECT name FROM pragma_table_info('{table}') ORDER BY cid"
        ))
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The outbox's columns as version 1 created them.
fn columns_of_v1_outbox() -> Vec<String> {
    [
        "id",
        "recipient",
        "state",
        "created_at",
        "window_start",
        "ack_attempts",
        "transport_retries",
        "next_at",
        "first_sent_at",
        "last_sent_at",
        "is_media",
        "message_json",
    ]
    .map(String::from)
    .to_vec()
}
