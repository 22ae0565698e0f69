//! A frame answered MessageSent survives SIGKILL of the relay process
//! (`docs/protocol.md#journal-release-and-drain`).

mod common;

use std::process::Command;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_frame_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, [SECRET, b"\n"].concat()).unwrap();

    let mut relay = RelayProcess::spawn(&db, &secret);
    let mut bob = Client::connect(&relay.url).await;
    bob.authenticate("bob", true).await;
    bob.close().await;
    let mut alice = Client::connect(&relay.url).await;
    alice.authenticate("alice", true).await;
    assert_sent(
        &alice.send_and_answer("bob", "m1", "survives").await,
        "m1",
        "bob",
        "stored",
    );
    relay.kill9();
    let (_, ending) = alice.frames_until_end().await;
    assert_eq!(ending, Ending::Dropped, "a killed relay sends no Close");

    let relay = RelayProcess::spawn(&db, &secret);
    let mut bob = Client::connect(&relay.url).await;
    bob.authenticate("bob", true).await;
    // A first frame starts the drain without waiting out the 2 s grace.
    bob.sync().await;
    let (frames, count) = bob.drain().await;
    assert_eq!(count, 1);
    assert_eq!(
        (
            frames[0].seq,
            frames[0].message_id.as_str(),
            frames[0].content.as_str()
        ),
        (Some(1), "m1", "survives")
    );
    // seq continues after the crash.
    let mut alice = Client::connect(&relay.url).await;
    alice.authenticate("alice", true).await;
    assert_sent(
        &alice.send_and_answer("bob", "m2", "next").await,
        "m2",
        "bob",
        "live",
    );
    assert_eq!(bob.received().await.seq, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_relay_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, SECRET).unwrap();
    let mut relay = RelayProcess::spawn(&dir.path().join("relay.db"), &secret);
    let mut alice = Client::connect(&relay.url).await;
    alice.authenticate("alice", true).await;
    let status = Command::new("kill")
        .args(["-TERM", &relay.child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let (_, ending) = alice.frames_until_end().await;
    assert_eq!(ending, Ending::Close(1001), "going away");
    let exit = relay.wait_exit();
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_explains_bad_arguments() {
    let output = Command::new(env!("CARGO_BIN_EXE_courier-relay"))
        .arg("--memory")
        .output()
        .expect("run courier-relay");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--jwt-secret-file FILE is required"),
        "{stderr}"
    );
    let help = Command::new(env!("CARGO_BIN_EXE_courier-relay"))
        .arg("--help")
        .output()
        .expect("run courier-relay");
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--no-mailbox"));
}
