//! The identity seed at rest (`docs/protocol.md#identity-key`): sealed under a key that is not in
//! the database, created once, never replaced — not even when the key that opens it is missing or
//! wrong.

use std::path::{Path, PathBuf};

use courier_client::store::{KeyFileProblem, Store, StoreError};
use rusqlite::Connection;
use zeroize::Zeroizing;

const SEED: [u8; 32] = [7u8; 32];

fn never() -> Result<[u8; 32], String> {
    panic!("an existing identity must not be regenerated")
}

fn key_file(db: &Path) -> PathBuf {
    PathBuf::from(format!("{}.identity-key", db.display()))
}

fn app_key(byte: u8) -> Option<Zeroizing<[u8; 32]>> {
    Some(Zeroizing::new([byte; 32]))
}

/// `(sealed_by, seed column)` as stored.
fn stored_row(db: &Path) -> (String, Vec<u8>) {
    Connection::open(db)
        .unwrap()
        .query_row("SELECT sealed_by, seed FROM identity", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap()
}

fn first_start(db: &Path, key: Option<Zeroizing<[u8; 32]>>) -> [u8; 32] {
    let mut store = Store::open(db).unwrap();
    store.load_or_create_identity(1, key, || Ok(SEED)).unwrap()
}

fn identity_error(result: Result<[u8; 32], StoreError>) -> String {
    match result {
        Err(StoreError::Identity(reason)) => reason,
        other => panic!("expected an identity error, got {other:?}"),
    }
}

#[test]
fn the_seed_is_created_once_sealed_under_a_key_file_and_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("id.db");
    assert_eq!(first_start(&db, None), SEED);

    let (sealed_by, stored) = stored_row(&db);
    assert_eq!(sealed_by, "key_file");
    assert_eq!(stored.len(), 32 + 16, "ciphertext and tag");
    assert!(
        !stored.windows(32).any(|w| w == SEED),
        "the seed is not in the database in the clear"
    );
    let key = std::fs::metadata(key_file(&db)).unwrap();
    assert_eq!(key.len(), 32);
    #[cfg(unix)]
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&key.permissions()) & 0o777,
        0o600
    );

    let mut store = Store::open(&db).unwrap();
    assert_eq!(store.load_or_create_identity(2, None, never).unwrap(), SEED);
}

#[test]
fn a_database_copied_without_its_key_file_refuses_to_start_and_keeps_the_identity() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("id.db");
    first_start(&db, None);
    let row = stored_row(&db);
    std::fs::remove_file(key_file(&db)).unwrap();

    let mut store = Store::open(&db).unwrap();
    let reason = identity_error(store.load_or_create_identity(2, None, never));
    assert!(reason.contains("identity-key"), "{reason}");
    assert!(reason.contains("not replaced"), "{reason}");
    drop(store);
    assert_eq!(stored_row(&db), row, "the stored identity is untouched");
    assert!(!key_file(&db).exists(), "no replacement key was minted");
}

#[test]
fn a_key_file_of_the_wrong_size_or_content_does_not_open_the_seed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("id.db");
    first_start(&db, None);

    std::fs::write(key_file(&db), [1u8; 31]).unwrap();
    let mut store = Store::open(&db).unwrap();
    let reason = identity_error(store.load_or_create_identity(2, None, never));
    assert!(reason.contains("not 32 bytes"), "{reason}");

    std::fs::write(key_file(&db), [1u8; 32]).unwrap();
    let reason = identity_error(store.load_or_create_identity(3, None, never));
    assert!(reason.contains("does not open"), "{reason}");
}

#[test]
fn an_app_key_seals_the_seed_and_must_be_supplied_at_every_start() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("id.db");
    assert_eq!(first_start(&db, app_key(9)), SEED);
    assert_eq!(stored_row(&db).0, "app_key");
    assert!(!key_file(&db).exists(), "an app key needs no key file");

    let mut store = Store::open(&db).unwrap();
    let reason = identity_error(store.load_or_create_identity(2, None, never));
    assert!(reason.contains("storage.identitySealKey"), "{reason}");
    let reason = identity_error(store.load_or_create_identity(3, app_key(8), never));
    assert!(reason.contains("does not open"), "{reason}");
    assert_eq!(
        store.load_or_create_identity(4, app_key(9), never).unwrap(),
        SEED
    );
}

#[test]
fn a_seed_sealed_by_the_key_file_is_resealed_under_an_app_key_supplied_later() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("id.db");
    first_start(&db, None);

    let mut store = Store::open(&db).unwrap();
    assert_eq!(
        store.load_or_create_identity(2, app_key(5), never).unwrap(),
        SEED
    );
    drop(store);
    assert_eq!(stored_row(&db).0, "app_key");
    // From now on the app key alone opens it; the key file is no longer needed.
    std::fs::remove_file(key_file(&db)).unwrap();
    let mut store = Store::open(&db).unwrap();
    assert_eq!(
        store.load_or_create_identity(3, app_key(5), never).unwrap(),
        SEED
    );
    identity_error(store.load_or_create_identity(4, None, never));
}

#[test]
fn a_damaged_sealed_seed_fails_the_start_rather_than_minting_a_new_identity() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("id.db");
    first_start(&db, None);
    Connection::open(&db)
        .unwrap()
        .execute("UPDATE identity SET seed = zeroblob(48)", [])
        .unwrap();

    let mut store = Store::open(&db).unwrap();
    identity_error(store.load_or_create_identity(2, None, never));
}

#[test]
fn a_version_3_seed_stored_in_the_clear_is_sealed_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("id.db");
    drop(Store::open(&db).unwrap());
    // Put the file back in version 3's shape: the identity table as version 3 wrote it, and
    // none of the later columns.
    let conn = Connection::open(&db).unwrap();
    conn.execute_batch(
        "ALTER TABLE settled DROP COLUMN unreported_event;
         ALTER TABLE pending_inbound DROP COLUMN encrypted;
         DROP TABLE mls_state;
         DROP TABLE contacts;
         DROP TABLE connection_requests;
         DROP TABLE chat_groups;
         DROP TABLE group_registration;
         DROP TABLE group_sends;
         DROP TABLE group_send_members;
         DROP TABLE received_messages;
         DROP TABLE media_out;
         DROP TABLE media_in;
         DROP TABLE processed_controls;
         DROP TABLE ledger;
         DROP TABLE identity;
         CREATE TABLE identity (
             id         INTEGER PRIMARY KEY CHECK (id = 1),
             seed       BLOB    NOT NULL CHECK (length(seed) = 32),
             created_at INTEGER NOT NULL
         );
         PRAGMA user_version = 3;",
    )
    .unwrap();
    conn.execute(
        "INSERT INTO identity (id, seed, created_at) VALUES (1, ?1, 1)",
        [SEED.as_slice()],
    )
    .unwrap();
    drop(conn);

    let mut store = Store::open(&db).unwrap();
    assert_eq!(store.load_or_create_identity(2, None, never).unwrap(), SEED);
    drop(store);
    let (sealed_by, stored) = stored_row(&db);
    assert_eq!(sealed_by, "key_file");
    assert_ne!(stored, SEED.to_vec());
    let mut store = Store::open(&db).unwrap();
    assert_eq!(store.load_or_create_identity(3, None, never).unwrap(), SEED);
}

#[test]
fn an_in_memory_store_keeps_its_seed_without_a_key_file() {
    let mut store = Store::open_memory().unwrap();
    assert_eq!(
        store.load_or_create_identity(1, None, || Ok(SEED)).unwrap(),
        SEED
    );
    assert_eq!(store.load_or_create_identity(2, None, never).unwrap(), SEED);
}

/// The error a start that refuses the stored identity fails with.
fn refused(result: Result<[u8; 32], StoreError>) -> StoreError {
    match result {
        Err(e @ (StoreError::UnsafeKeyFile { .. } | StoreError::CleartextIdentity)) => e,
        other => panic!("expected the identity refused, got {other:?}"),
    }
}

fn key_file_problem(result: Result<[u8; 32], StoreError>) -> KeyFileProblem {
    match refused(result) {
        StoreError::UnsafeKeyFile { problem, .. } => problem,
        other => panic!("expected an unsafe key file, got {other:?}"),
    }
}

#[cfg(unix)]
#[test]
fn a_key_file_swapped_for_a_symlink_to_a_key_elsewhere_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("id.db");
    first_start(&db, None);
    let row = stored_row(&db);
    // The same key, moved where someone else could rewrite it, and linked back.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::rename(key_file(&db), &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, key_file(&db)).unwrap();

    let mut store = Store::open(&db).unwrap();
    assert_eq!(
        key_file_problem(store.load_or_create_identity(2, None, never)),
        KeyFileProblem::Symlink
    );
    drop(store);
    assert_eq!(stored_row(&db), row, "the stored identity is untouched");
}

#[cfg(unix)]
#[test]
fn a_dangling_symlink_planted_before_the_first_start_is_not_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("id.db");
    let target = dir.path().join("planted");
    std::os::unix::fs::symlink(&target, key_file(&db)).unwrap();

    let mut store = Store::open(&db).unwrap();
    assert_eq!(
        key_file_problem(store.load_or_create_identity(1, None, || Ok(SEED))),
        KeyFileProblem::Symlink
    );
    assert!(!target.exists(), "no key was written where the link leads");
}

#[cfg(unix)]
#[test]
fn a_key_file_readable_by_others_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("id.db");
    first_start(&db, None);
    for mode in [0o644, 0o660, 0o604] {
        std::fs::set_permissions(key_file(&db), std::fs::Permissions::from_mode(mode)).unwrap();
        let mut store = Store::open(&db).unwrap();
        assert_eq!(
            key_file_problem(store.load_or_create_identity(2, None, never)),
            KeyFileProblem::OpenMode { mode }
        );
    }
    std::fs::set_permissions(key_file(&db), std::fs::Permissions::from_mode(0o400)).unwrap();
    let mut store = Store::open(&db).unwrap();
    assert_eq!(store.load_or_create_identity(3, None, never).unwrap(), SEED);
}

/// Only root can give a file away; elsewhere there is no foreign key file to make.
#[cfg(unix)]
#[test]
fn a_key_file_owned_by_another_user_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("id.db");
    first_start(&db, None);
    let nobody = 65534;
    if let Err(e) = std::os::unix::fs::chown(key_file(&db), Some(nobody), None) {
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        return;
    }
    let mut store = Store::open(&db).unwrap();
    assert_eq!(
        key_file_problem(store.load_or_create_identity(2, None, never)),
        KeyFileProblem::ForeignOwner { owner: nobody }
    );
}

#[test]
fn a_cleartext_identity_written_over_a_sealed_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("id.db");
    first_start(&db, None);
    // Whoever can write the database, but not read the key file, plants an identity of their
    // own in the clear.
    let planted = [9u8; 32];
    Connection::open(&db)
        .unwrap()
        .execute(
            "UPDATE identity SET sealed_by = 'none', nonce = NULL, seed = ?1",
            [planted.as_slice()],
        )
        .unwrap();

    let mut store = Store::open(&db).unwrap();
    assert!(matches!(
        refused(store.load_or_create_identity(2, None, never)),
        StoreError::CleartextIdentity
    ));
    // Nor does an app key launder it by sealing it.
    assert!(matches!(
        refused(store.load_or_create_identity(3, app_key(4), never)),
        StoreError::CleartextIdentity
    ));
    drop(store);
    assert_eq!(stored_row(&db), ("none".to_owned(), planted.to_vec()));
}
