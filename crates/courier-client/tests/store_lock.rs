//! One writer per database file: in this process and across processes.
//!
//! The cross-process tests re-run this test binary as a child, selecting the `child_process`
//! test and steering it with environment variables (it does nothing in a normal run).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use courier_client::store::{Store, StoreError};
use courier_engine::io::{InboundKey, ProcessedKey, StoreOp};

const ENV_DB: &str = "COURIER_STORE_LOCK_TEST_DB";
const ENV_MODE: &str = "COURIER_STORE_LOCK_TEST_MODE";

/// The child's side. `hold`: open, write, print HOLDING, wait for stdin to close, exit.
/// `try`: print OPENED or LOCKED and exit.
#[test]
fn child_process() {
    let Ok(db) = std::env::var(ENV_DB) else {
        return;
    };
    let mode = std::env::var(ENV_MODE).unwrap();
    match mode.as_str() {
        "hold" => {
            let mut store = Store::open(Path::new(&db)).expect("child open");
            store
                .commit(&[StoreOp::MarkProcessed(ProcessedKey {
                    key: InboundKey {
                        chat: "dm".into(),
                        sender: "child".into(),
                        message_id: "m1".into(),
                    },
                    at: 1,
                })])
                .unwrap();
            println!("@@HOLDING@@");
            std::io::stdout().flush().unwrap();
            let mut sink = Vec::new();
            std::io::stdin().read_to_end(&mut sink).unwrap();
            drop(store);
        }
        "try" => match Store::open(Path::new(&db)) {
            Ok(_) => println!("@@OPENED@@"),
            Err(StoreError::Locked(_)) => println!("@@LOCKED@@"),
            Err(e) => println!("@@ERROR {e}@@"),
        },
        other => panic!("unknown mode {other}"),
    }
}

/// A child test process and the lines of its stdout (read on a thread, so a silent child
/// fails the test after a timeout instead of hanging it).
struct ChildProc {
    child: Child,
    lines: Receiver<String>,
}

fn spawn_child(db: &Path, mode: &str) -> ChildProc {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_DB, db)
        .env(ENV_MODE, mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child test process");
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    ChildProc { child, lines }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        // A failed assertion must not leave a holder behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ChildProc {
    /// Waits for a line carrying one of the `@@WORD@@` markers and returns the word. libtest
    /// prints `test child_process ... ` before the child's own output, so markers are
    /// searched for inside lines.
    fn wait_for(&mut self, words: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(w) = words.iter().find(|w| line.contains(&format!("@@{w}@@"))) {
                        return (*w).to_owned();
                    }
                    if line.contains("@@ERROR") {
                        panic!("child failed: {line}");
                    }
                    seen.push_str(&line);
                    seen.push('\n');
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!("child did not say one of {words:?}; it printed:\n{seen}");
                }
            }
        }
    }
}

fn expect_locked(db: &Path) {
    match Store::open(db) {
        Err(StoreError::Locked(p)) => {
            assert_eq!(p, db);
            let msg = StoreError::Locked(p).to_string();
            assert!(msg.contains("locked"), "{msg}");
        }
        Err(e) => panic!("expected Locked, got {e}"),
        Ok(_) => panic!("expected Locked, the second open succeeded"),
    }
}

#[test]
fn second_open_in_the_same_process_is_refused_until_drop() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("a.db");
    let first = Store::open(&db).unwrap();
    expect_locked(&db);
    // Also from another thread.
    let db2 = db.clone();
    std::thread::spawn(move || expect_locked(&db2))
        .join()
        .unwrap();
    drop(first);
    let again = Store::open(&db).unwrap();
    drop(again);
    // A different file is independent.
    let _other = Store::open(&dir.path().join("b.db")).unwrap();
    let _first = Store::open(&db).unwrap();
}

#[test]
fn another_process_holding_the_store_blocks_us_until_it_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let mut child = spawn_child(&db, "hold");
    assert_eq!(child.wait_for(&["HOLDING"]), "HOLDING");

    expect_locked(&db);
    expect_locked(&db);

    // SIGKILL: no destructor runs in the child; the OS releases the lock.
    child.child.kill().unwrap();
    child.child.wait().unwrap();
    let mut store = Store::open(&db).expect("open after the holder was killed");
    // What the child committed before dying is there.
    let keys = store.load_processed(2, 10, 10).unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].key.sender, "child");
}

#[test]
fn a_holder_that_exits_normally_releases_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let mut child = spawn_child(&db, "hold");
    child.wait_for(&["HOLDING"]);
    expect_locked(&db);
    drop(child.child.stdin.take()); // EOF: the child drops its store and exits
    assert!(child.child.wait().unwrap().success());
    Store::open(&db).expect("open after the holder exited");
}

#[test]
fn we_block_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("mine.db");
    let store = Store::open(&db).unwrap();

    let mut child = spawn_child(&db, "try");
    assert_eq!(child.wait_for(&["OPENED", "LOCKED"]), "LOCKED");
    assert!(child.child.wait().unwrap().success());

    drop(store);
    let mut child = spawn_child(&db, "try");
    assert_eq!(child.wait_for(&["OPENED", "LOCKED"]), "OPENED");
    assert!(child.child.wait().unwrap().success());
}

#[test]
fn the_lock_file_sits_next_to_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    let store = Store::open(&db).unwrap();
    assert!(dir.path().join("x.db.lock").exists());
    drop(store);
    // A leftover lock file (as after a crash) does not block.
    assert!(dir.path().join("x.db.lock").exists());
    Store::open(&db).unwrap();
}
