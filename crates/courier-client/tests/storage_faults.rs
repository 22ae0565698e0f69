//! Storage faults under a running client and at start: a disk that fills up, a read-only file
//! system, a damaged database. The client must refuse what it cannot store with
//! `ERR_STORAGE` (and a diagnostic), keep what it had, and never acknowledge an inbound message
//! it could not store — the sender retries it and it arrives once space is back.
//!
//! The faults are real: each scenario re-runs this test binary in a child process with its own
//! user and mount namespaces (`unshare`), on a small tmpfs mounted there, so SQLite meets a
//! genuine ENOSPC or EROFS. Nothing outside the child's namespace is touched.

mod support;

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use courier_client::client::{Client, SendInput};
use courier_client::config::parse_protocol_config;
use courier_client::event::ClientEvent;
use courier_client::store::MessageStatus;
use courier_engine::Event;
use courier_relay::{RelayConfig, Storage};
use serde_json::json;
use support::{connected, wait_for};

const SECRET: &[u8] = b"storage-fault-secret, padded to 32 bytes or more";
/// Set in the child: the directory its small file system is mounted on.
const FAULT_DIR: &str = "COURIER_FAULT_DIR";
const SMALL_FS_KIB: u32 = 2048;

/// The name libtest knows the calling test function by: its path in this crate. Derived from the
/// function itself, so a renamed test still runs its own scenario in the child.
macro_rules! this_test {
    () => {{
        fn here() {}
        let path = std::any::type_name_of_val(&here);
        let path = path.strip_suffix("::here").expect("a function's path");
        path.split_once("::").expect("a path inside the crate").1
    }};
}

/// In the parent: runs `test` again in a child with a `SMALL_FS_KIB` tmpfs mounted on a fresh
/// directory, requires exactly that test to have run there and passed, and returns `None`. In
/// that child: returns the directory.
fn small_fs(test: &str) -> Option<PathBuf> {
    if let Ok(dir) = std::env::var(FAULT_DIR) {
        return Some(PathBuf::from(dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "mount -t tmpfs -o size={SMALL_FS_KIB}k tmpfs \"$1\" && \
         exec \"$2\" --exact \"$3\" --nocapture --test-threads=1"
    );
    let output = Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            &script,
            "sh",
        ])
        .arg(dir.path())
        .arg(std::env::current_exe().unwrap())
        .arg(test)
        .env(FAULT_DIR, dir.path())
        .output()
        .expect("unshare (util-linux) runs the scenario in its own mount namespace");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    print!("{stdout}");
    eprint!("{stderr}");
    assert!(
        output.status.success(),
        "{test} failed on its small file system"
    );
    // `--exact` with a name that matches no test runs nothing and still succeeds.
    assert!(
        stdout.contains(&format!("test {test} ... ok")) && stdout.contains(" 1 passed"),
        "the child did not run {test}"
    );
    None
}

/// Fills the file system holding `dir` to the last byte.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = File::create(&path).unwrap();
    let chunk = vec![0xAB; 4096];
    loop {
        match file.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
            Err(e) => panic!("filling the disk: {e}"),
        }
    }
    let _ = file.sync_all();
    path
}

fn remount(dir: &Path, mode: &str) {
    let status = Command::new("mount")
        .args(["-o", &format!("remount,{mode}")])
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success(), "remount {mode}");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn relay() -> courier_relay::RelayHandle {
    courier_relay::start(RelayConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        Storage::Memory,
        SECRET.to_vec(),
    ))
    .await
    .unwrap()
}

fn config(name: &str, db: &Path, url: &str) -> serde_json::Value {
    json!({
        "appId": "faults",
        "encryption": { "enabled": false },
        "storage": { "path": db },
        "transports": { "internet": {
            "url": url,
            "authToken": courier_relay::issue_token(SECRET, name, 3600).unwrap(),
        } },
        "reliability": { "ack": { "defaultTimeoutMs": 300 }, "retry": { "initialDelayMs": 100, "maxDelayMs": 200 } },
    })
}

fn start(config: &serde_json::Value) -> (Client, std::sync::mpsc::Receiver<ClientEvent>) {
    support::start(&parse_protocol_config(config).unwrap())
}

fn text(recipient: &str, content: impl Into<String>) -> SendInput {
    SendInput {
        recipient: recipient.into(),
        content: content.into(),
        ..Default::default()
    }
}

fn engine_event(e: &ClientEvent) -> Option<&Event> {
    e.engine()
}

fn delivered(id: &str) -> impl Fn(&ClientEvent) -> bool + '_ {
    move |e| matches!(engine_event(e), Some(Event::MessageDelivered { message_id, .. }) if message_id == id)
}

fn received(id: &str) -> impl Fn(&ClientEvent) -> bool + '_ {
    move |e| matches!(engine_event(e), Some(Event::MessageReceived { message, .. }) if message.id == id)
}

/// Still in the outbox: not lost, not settled.
#[track_caller]
fn assert_pending(status: MessageStatus) {
    assert!(
        matches!(
            status,
            MessageStatus::Queued | MessageStatus::InFlight | MessageStatus::Parked
        ),
        "{status:?}"
    );
}

fn commit_failed(e: &ClientEvent) -> bool {
    matches!(e, ClientEvent::Diagnostic { message, .. } if message.starts_with("storage commit failed"))
}

/// Bob's store is on the small file system, Alice's is not. While his disk is full Bob refuses
/// sends with `ERR_STORAGE`, and a message from Alice reaches him but is not acknowledged (its
/// dedup record cannot be committed), so Alice retries it; once space is back it is received
/// exactly once and delivered, and Bob's earlier messages are all still there. (A file system
/// cannot be remounted read-only under a writer, so read-only is exercised at start.)
fn full_disk_while_running(dir: PathBuf) {
    let elsewhere = tempfile::tempdir().unwrap();
    runtime().block_on(async move {
        let relay = relay().await;
        let (bob, bob_events) = start(&config("bob", &dir.join("bob.db"), &relay.url()));
        let (alice, alice_events) =
            start(&config("alice", &elsewhere.path().join("alice.db"), &relay.url()));
        wait_for(&bob_events, "bob connected", connected).await;
        wait_for(&alice_events, "alice connected", connected).await;

        let kept = bob.send(text("carol", "kept while healthy")).await.unwrap();
        let before = alice.send(text("bob", "before")).await.unwrap();
        wait_for(&alice_events, "delivered before the fault", delivered(&before)).await;
        wait_for(&bob_events, "received before the fault", received(&before)).await;

        let filler = fill(&dir);
        let refused = bob
            .send(text("carol", "x".repeat(64 * 1024)))
            .await
            .expect_err("a send the store cannot hold is refused");
        assert_eq!(refused.code(), "ERR_STORAGE");
        assert!(
            refused.to_string().contains("full"),
            "SQLite's reason reaches the caller: {refused}"
        );
        wait_for(&bob_events, "a diagnostic for the failed commit", commit_failed).await;

        let during = alice.send(text("bob", "during the fault")).await.unwrap();
        wait_for(&bob_events, "bob's commit of the inbound message fails", commit_failed).await;
        // Not acknowledged: Alice's ACK timer runs out and she retries.
        wait_for(&alice_events, "alice retries the unacknowledged message", |e| {
            matches!(engine_event(e), Some(Event::MessageRetrying { message_id, .. }) if *message_id == during)
        })
        .await;

        fs::remove_file(filler).unwrap();
        wait_for(&bob_events, "received once space is back", received(&during)).await;
        wait_for(&alice_events, "delivered once space is back", delivered(&during)).await;
        assert_pending(bob.status(kept.clone()).await.unwrap());
        let after = bob.send(text("carol", "after")).await.unwrap();
        assert_pending(bob.status(after).await.unwrap());

        bob.stop().await;
        alice.stop().await;
        relay.stop().await;
        // Received exactly once: nothing else for `during` was left in Bob's events.
        assert!(
            !bob_events.try_iter().any(|e| received(&during)(&e)),
            "the message reached the app twice"
        );
        // What Bob had survives a restart.
        let (bob, _events) = start(&config("bob", &dir.join("bob.db"), "ws://127.0.0.1:9"));
        assert_pending(bob.status(kept).await.unwrap());
        bob.stop().await;
    });
}

#[test]
fn a_full_disk_refuses_sends_and_acknowledges_nothing_it_could_not_store() {
    if let Some(dir) = small_fs(this_test!()) {
        full_disk_while_running(dir);
    }
}

/// Starts that meet a fault fail with `ERR_STORAGE`, write nothing, and succeed unchanged once
/// the fault is gone.
#[test]
fn a_start_on_a_faulty_file_system_fails_cleanly_and_leaves_the_store_as_it_was() {
    let Some(dir) = small_fs(this_test!()) else {
        return;
    };
    runtime().block_on(async move {
        let offline = "ws://127.0.0.1:9";
        let db = dir.join("p.db");
        let (client, _events) = start(&config("p", &db, offline));
        let id = client.send(text("carol", "kept")).await.unwrap();
        let address = client.local_address().to_owned();
        client.stop().await;
        let files = snapshot(&dir);

        // A new profile on a full disk cannot be created.
        let filler = fill(&dir);
        let err = Client::start(
            &parse_protocol_config(&config("q", &dir.join("new.db"), offline)).unwrap(),
            support::Events(|_| {}),
            &tokio::runtime::Handle::current(),
        )
        .err()
        .expect("a new store on a full disk fails to start");
        assert_eq!(err.code(), "ERR_STORAGE", "{err}");
        fs::remove_file(&filler).unwrap();
        let _ = fs::remove_file(dir.join("new.db"));

        // An existing profile on a read-only file system.
        remount(&dir, "ro");
        let err = Client::start(
            &parse_protocol_config(&config("p", &db, offline)).unwrap(),
            support::Events(|_| {}),
            &tokio::runtime::Handle::current(),
        )
        .err()
        .expect("a store on a read-only file system fails to start");
        assert_eq!(err.code(), "ERR_STORAGE", "{err}");
        remount(&dir, "rw");
        assert_eq!(snapshot(&dir), files, "the failed start wrote nothing");

        let (client, _events) = start(&config("p", &db, offline));
        assert_eq!(client.local_address(), address, "the identity is the same");
        assert_eq!(client.status(id).await.unwrap(), MessageStatus::Queued);
        client.stop().await;
    });
}

/// A damaged database file fails the start with `ERR_STORAGE` naming the file, and the start
/// neither repairs nor replaces it (nor mints a new identity).
#[test]
fn a_damaged_database_fails_the_start_and_is_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let db = dir.path().join("p.db");
        let (client, _events) = start(&config("p", &db, "ws://127.0.0.1:9"));
        client.send(text("carol", "kept")).await.unwrap();
        client.stop().await;

        let mut file = OpenOptions::new().write(true).open(&db).unwrap();
        file.write_all(b"definitely not the SQLite header").unwrap();
        drop(file);
        let files = snapshot(dir.path());
        let err = Client::start(
            &parse_protocol_config(&config("p", &db, "ws://127.0.0.1:9")).unwrap(),
            support::Events(|_| {}),
            &tokio::runtime::Handle::current(),
        )
        .err()
        .expect("a damaged store fails to start");
        assert_eq!(err.code(), "ERR_STORAGE");
        assert!(err.to_string().contains("p.db"), "{err}");
        assert_eq!(snapshot(dir.path()), files, "nothing was rewritten");
    });
}

/// Every file in `dir` (but the lock file, whose lock state is not content) with its bytes.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_none_or(|x| x != "lock"))
        .map(|p| match fs::read(&p) {
            Ok(bytes) => (p.display().to_string(), bytes),
            Err(e) if e.kind() == ErrorKind::NotFound => (p.display().to_string(), Vec::new()),
            Err(e) => panic!("{}: {e}", p.display()),
        })
        .collect();
    files.sort();
    files
}
