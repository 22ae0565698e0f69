//! A frame answered MessageSent survives SIGKILL of the relay process
//! (`docs/protocol.md#journal-release-and-drain`), also when the connection's frames are
//! pipelined and committed in groups (`docs/protocol.md#transport`).

mod common;

use std::collections::HashSet;
use std::process::Command;

use common::*;
use courier_proto::{ClientFrame, RelayFrame};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

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

/// Frames in one burst, all within the default bucket (2 000), so none is rate limited.
const BURST: usize = 1500;

/// A small generator for the kill points; its seed is printed so a failure can be replayed.
struct KillPoints(u64);

impl KillPoints {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

/// Sends a burst without waiting for answers, and SIGKILLs the relay once `kill_after` answers
/// have arrived; returns the ids answered MessageSent (the answers read until the socket died
/// included).
async fn burst_until_killed(
    relay: &mut RelayProcess,
    round: usize,
    kill_after: usize,
) -> Vec<String> {
    let mut alice = Client::connect(&relay.url).await;
    alice.authenticate("alice", true).await;
    let (mut sink, mut stream) = alice.ws.split();
    let writer = tokio::spawn(async move {
        for i in 0..BURST {
            let frame = ClientFrame::SendMessage {
                recipient: "bob".into(),
                content: format!("burst {round} frame {i}"),
                message_id: format!("r{round}-m{i}"),
                reply_to_msg: None,
            };
            if sink.feed(Message::text(frame.encode())).await.is_err() {
                return;
            }
            if i % 16 == 15 && sink.flush().await.is_err() {
                return;
            }
        }
        let _ = sink.flush().await;
    });
    let mut answered = Vec::new();
    let mut killed = false;
    loop {
        let next = within(stream.next())
            .await
            .expect("the relay answers or dies in time");
        let Some(Ok(Message::Text(text))) = next else {
            break;
        };
        match RelayFrame::decode(&text).expect("a relay frame") {
            RelayFrame::MessageSent { message_id, .. } => answered.push(message_id),
            RelayFrame::DrainComplete { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
        if !killed && answered.len() == kill_after {
            relay.kill9();
            killed = true;
        }
    }
    assert!(killed, "the burst was answered before the kill point");
    writer.abort();
    answered
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_frames_of_a_pipelined_burst_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, SECRET).unwrap();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    println!("kill points seed {seed}");
    let mut points = KillPoints(seed);

    let mut relay = RelayProcess::spawn(&db, &secret);
    let mut bob = Client::connect(&relay.url).await;
    bob.authenticate("bob", true).await;
    bob.close().await;
    let mut journaled = 0u64;
    for round in 0..3 {
        let kill_after = 1 + points.next(BURST as u64 * 3 / 4) as usize;
        let answered = burst_until_killed(&mut relay, round, kill_after).await;
        relay = RelayProcess::spawn(&db, &secret);
        let mut bob = Client::connect(&relay.url).await;
        bob.authenticate("bob", true).await;
        bob.sync().await;
        let (frames, count) = bob.drain().await;
        assert_eq!(count as usize, frames.len());
        // One connection's frames are journaled in the order it sent them: what survived is a
        // prefix of the burst, with the seqs that follow the last round's.
        let ids: Vec<&str> = frames.iter().map(|f| f.message_id.as_str()).collect();
        let expected: Vec<String> = (0..ids.len()).map(|i| format!("r{round}-m{i}")).collect();
        assert_eq!(ids, expected, "round {round} (seed {seed})");
        let seqs: Vec<u64> = frames.iter().filter_map(|f| f.seq).collect();
        let first = journaled + 1;
        assert_eq!(seqs, (first..first + seqs.len() as u64).collect::<Vec<_>>());
        journaled += seqs.len() as u64;
        let survived: HashSet<&str> = ids.into_iter().collect();
        let lost: Vec<&String> = answered
            .iter()
            .filter(|id| !survived.contains(id.as_str()))
            .collect();
        assert!(
            lost.is_empty(),
            "round {round} (seed {seed}, kill after {kill_after}): answered but lost {lost:?}"
        );
        bob.ack_up_to(journaled).await;
        bob.sync().await;
        bob.close().await;
    }
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
