//! Presence (`docs/protocol.md#presence`; conformance in
//! `docs/protocol.md#presence-rate-and-sessions`): WatchPresence / UnwatchPresence under
//! `presence_watch_v1`, and last_seen kept across relay restarts.
//!
//! "Nothing was sent" is asserted with `until_synced`: the relay queues a status before it
//! reads the watcher's next frame, and writes it before that frame's answer.

mod common;

use common::*;
use courier_proto::{ClientFrame, RelayFrame};
use serde_json::json;

fn watch_frame(users: &[&str]) -> ClientFrame {
    ClientFrame::WatchPresence {
        users: users.iter().map(|u| (*u).to_owned()).collect(),
    }
}

async fn watch(c: &mut Client, users: &[&str]) {
    c.send(&watch_frame(users)).await;
}

async fn unwatch(c: &mut Client, users: &[&str]) {
    c.send(&ClientFrame::UnwatchPresence {
        users: users.iter().map(|u| (*u).to_owned()).collect(),
    })
    .await;
}

/// `(online, last_seen)` of the next PresenceStatus for `user`.
async fn next_status(c: &mut Client, user: &str) -> (bool, Option<u64>) {
    let frame = c
        .next_where(|f| matches!(f, RelayFrame::PresenceStatus { user_id, .. } if user_id == user))
        .await;
    flatten(&frame).1
}

async fn check(c: &mut Client, user: &str) -> (bool, Option<u64>) {
    c.send(&ClientFrame::CheckPresence {
        username: user.into(),
    })
    .await;
    next_status(c, user).await
}

fn flatten(frame: &RelayFrame) -> (String, (bool, Option<u64>)) {
    match frame {
        RelayFrame::PresenceStatus {
            user_id,
            online,
            last_seen,
        } => {
            let last_seen = last_seen.as_ref().map(|v| {
                v.as_u64()
                    .unwrap_or_else(|| panic!("last_seen is epoch ms: {v}"))
            });
            (user_id.clone(), (*online, last_seen))
        }
        other => panic!("expected PresenceStatus, got {other:?}"),
    }
}

/// The statuses for `user` among `frames`.
fn statuses(frames: &[RelayFrame], user: &str) -> Vec<(bool, Option<u64>)> {
    frames
        .iter()
        .filter(|f| matches!(f, RelayFrame::PresenceStatus { .. }))
        .map(flatten)
        .filter(|(u, _)| u == user)
        .map(|(_, s)| s)
        .collect()
}

fn limit_exceeded() -> RelayFrame {
    RelayFrame::error("limit_exceeded", Some("WatchPresence"))
}

async fn watches(relay: &TestRelay, n: u64) {
    relay
        .wait_stats(&format!("{n} watches"), |s| s.watches == n)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_pushes_the_current_status_at_once_and_every_change() {
    let relay = TestRelay::start().await;
    relay.register("bob").await;
    relay
        .wait_stats("bob's disconnect", |s| s.connections == 0)
        .await;
    let mut alice = relay.online("alice").await;

    watch(&mut alice, &["bob"]).await;
    let (online, first_seen) = next_status(&mut alice, "bob").await;
    assert!(!online);
    let first_seen = first_seen.expect("bob was seen");

    let bob = relay.online("bob").await;
    assert_eq!(next_status(&mut alice, "bob").await, (true, None));
    bob.close().await;
    let (online, last_seen) = next_status(&mut alice, "bob").await;
    assert!(!online);
    assert!(last_seen.expect("last_seen when going offline") >= first_seen);
    let bob = relay.online("bob").await;
    assert_eq!(next_status(&mut alice, "bob").await, (true, None));
    // One status per change, nothing more.
    let rest = alice.until_synced().await;
    assert_eq!(statuses(&rest, "bob"), vec![]);
    assert_eq!(
        check(&mut alice, "bob").await,
        (true, None),
        "pushes agree with CheckPresence"
    );
    drop(bob);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identifiers_are_echoed_and_unknown_ones_are_offline_without_last_seen() {
    let relay = TestRelay::start().await;
    let mut alice = relay.online("alice").await;
    let address = "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn";
    let longest = "z".repeat(256);
    // Identifiers are case-sensitive; "alice" watching herself sees herself online.
    let users = ["nobody", address, "Alice", "a/b", &longest, "alice"];
    watch(&mut alice, &users).await;
    let frames = alice.until_synced().await;
    let got: Vec<_> = frames.iter().map(flatten).collect();
    let expected: Vec<_> = users
        .iter()
        .map(|u| ((*u).to_owned(), (*u == "alice", None)))
        .collect();
    assert_eq!(got, expected, "one status each, in list order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwatch_stops_the_pushes() {
    let relay = TestRelay::start().await;
    let mut alice = relay.online("alice").await;
    watch(&mut alice, &["bob", "carol"]).await;
    assert_eq!(next_status(&mut alice, "bob").await, (false, None));
    assert_eq!(next_status(&mut alice, "carol").await, (false, None));
    // Unwatching what is not watched is ignored silently.
    unwatch(&mut alice, &["bob", "dave"]).await;
    watches(&relay, 1).await;

    let bob = relay.online("bob").await;
    let carol = relay.online("carol").await;
    assert_eq!(next_status(&mut alice, "carol").await, (true, None));
    let frames = alice.until_synced().await;
    assert_eq!(statuses(&frames, "bob"), vec![], "bob is no longer watched");
    assert!(
        frames.is_empty(),
        "UnwatchPresence is never answered: {frames:?}"
    );

    // Watching again is a new watch: the current status at once.
    watch(&mut alice, &["bob"]).await;
    assert_eq!(next_status(&mut alice, "bob").await, (true, None));
    drop((bob, carol));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_1025_gets_limit_exceeded_and_the_first_1024_are_watched() {
    let relay = TestRelay::start().await;
    let mut alice = relay.online("alice").await;
    let users: Vec<String> = std::iter::once("bob".to_owned())
        .chain((2..=1025).map(|i| format!("user-{i}")))
        .collect();
    let refused = users[1024].clone();
    alice
        .send(&ClientFrame::WatchPresence {
            users: users.clone(),
        })
        .await;
    let frames = alice.until_synced().await;
    let (answers, pushed): (Vec<_>, Vec<_>) = frames
        .into_iter()
        .partition(|f| matches!(f, RelayFrame::Error { .. }));
    assert_eq!(answers, vec![limit_exceeded()]);
    let watched: Vec<String> = pushed.iter().map(|f| flatten(f).0).collect();
    assert_eq!(watched, users[..1024], "the first 1024, one status each");
    watches(&relay, 1024).await;

    // The first entry is really watched.
    let bob = relay.online("bob").await;
    assert_eq!(next_status(&mut alice, "bob").await, (true, None));
    // Still full: a new identifier is refused; an already watched one is no new watch.
    watch(&mut alice, &[&refused]).await;
    assert_eq!(alice.until_synced().await, vec![limit_exceeded()]);
    watch(&mut alice, &["user-7"]).await;
    assert_eq!(alice.until_synced().await, vec![]);
    // Room again after an unwatch.
    unwatch(&mut alice, &["user-7"]).await;
    watch(&mut alice, &[&refused]).await;
    assert_eq!(next_status(&mut alice, &refused).await, (false, None));
    assert_eq!(alice.until_synced().await, vec![]);
    watches(&relay, 1024).await;
    drop(bob);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_past_the_cap_in_a_later_frame_are_refused_too() {
    let relay = TestRelay::start().await;
    let mut alice = relay.online("alice").await;
    let first: Vec<String> = (0..1000).map(|i| format!("u{i}")).collect();
    alice
        .send(&ClientFrame::WatchPresence { users: first })
        .await;
    // 24 fit; a watched one in the list takes no room.
    let second: Vec<String> = std::iter::once("u0".to_owned())
        .chain((1000..1030).map(|i| format!("u{i}")))
        .collect();
    alice
        .send(&ClientFrame::WatchPresence { users: second })
        .await;
    let frames = alice.until_synced().await;
    let errors: Vec<_> = frames
        .iter()
        .filter(|f| matches!(f, RelayFrame::Error { .. }))
        .collect();
    assert_eq!(errors, vec![&limit_exceeded()]);
    assert_eq!(frames.len(), 1024 + 1);
    assert_eq!(statuses(&frames, "u1023").len(), 1);
    assert_eq!(statuses(&frames, "u1024"), vec![]);
    watches(&relay, 1024).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watching_the_same_user_twice_is_one_watch() {
    let relay = TestRelay::start().await;
    let mut alice = relay.online("alice").await;
    watch(&mut alice, &["bob", "bob"]).await;
    watch(&mut alice, &["bob"]).await;
    let frames = alice.until_synced().await;
    assert_eq!(
        frames,
        vec![RelayFrame::PresenceStatus {
            user_id: "bob".into(),
            online: false,
            last_seen: None
        }]
    );
    watches(&relay, 1).await;

    let bob = relay.online("bob").await;
    assert_eq!(next_status(&mut alice, "bob").await, (true, None));
    assert_eq!(alice.until_synced().await, vec![], "one push per change");

    // One UnwatchPresence ends it: there was one watch, not two.
    unwatch(&mut alice, &["bob"]).await;
    watches(&relay, 0).await;
    bob.close().await;
    relay
        .wait_stats("bob's disconnect", |s| s.connections == 1)
        .await;
    assert_eq!(alice.until_synced().await, vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_ends_with_the_connection() {
    let relay = TestRelay::start().await;
    let mut alice = relay.online("alice").await;
    watch(&mut alice, &["bob", "carol"]).await;
    next_status(&mut alice, "carol").await;
    watches(&relay, 2).await;
    alice.close().await;
    watches(&relay, 0).await;

    // Watches are per connection and not persisted: alice's next connection watches nothing.
    let mut alice = relay.online("alice").await;
    let bob = relay.online("bob").await;
    assert_eq!(alice.until_synced().await, vec![]);
    drop(bob);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_displaced_session_is_no_offline_online_flap() {
    let relay = TestRelay::start().await;
    let mut carol = relay.online("carol").await;
    watch(&mut carol, &["bob"]).await;
    assert_eq!(next_status(&mut carol, "bob").await, (false, None));
    let mut old = relay.online("bob").await;
    assert_eq!(next_status(&mut carol, "bob").await, (true, None));
    // The displaced connection's own watches end with it.
    watch(&mut old, &["dave"]).await;
    next_status(&mut old, "dave").await;
    watches(&relay, 2).await;

    let mut new = relay.client().await;
    new.authenticate("bob", true).await;
    let (_, ending) = old.frames_until_end().await;
    assert_eq!(ending, Ending::Close(4000));
    assert_eq!(new.drain_complete().await, 0);
    watches(&relay, 1).await;
    assert_eq!(
        carol.until_synced().await,
        vec![],
        "bob stayed online through the displacement"
    );

    new.close().await;
    let (online, last_seen) = next_status(&mut carol, "bob").await;
    assert!(!online && last_seen.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_seen_survives_a_relay_restart() {
    let mut relay = TestRelay::start().await;
    relay.register("bob").await;
    relay
        .wait_stats("bob's disconnect", |s| s.connections == 0)
        .await;
    let mut alice = relay.online("alice").await;
    let (online, seen) = check(&mut alice, "bob").await;
    assert!(!online);
    let seen = seen.expect("last_seen after a disconnect");
    drop(alice);

    relay.restart_with(|_| {}).await;
    let mut alice = relay.online("alice").await;
    assert_eq!(check(&mut alice, "bob").await, (false, Some(seen)));
    watch(&mut alice, &["bob"]).await;
    assert_eq!(next_status(&mut alice, "bob").await, (false, Some(seen)));
    assert_eq!(
        check(&mut alice, "nobody").await,
        (false, None),
        "never seen"
    );

    // A connection the relay closes as it stops counts as a disconnect too.
    let _bob = relay.online("bob").await;
    assert_eq!(next_status(&mut alice, "bob").await, (true, None));
    relay.restart_with(|_| {}).await;
    let mut carol = relay.online("carol").await;
    let (online, later) = check(&mut carol, "bob").await;
    assert!(!online);
    assert!(later.expect("last_seen at the stop") >= seen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_from_before_last_seen_is_upgraded() {
    let mut relay = TestRelay::unstarted();
    {
        let db = rusqlite::Connection::open(relay.db_path()).unwrap();
        db.execute_batch(
            "CREATE TABLE accounts (
                 name TEXT PRIMARY KEY NOT NULL,
                 created_ms INTEGER NOT NULL,
                 last_seq INTEGER NOT NULL DEFAULT 0,
                 msg_count INTEGER NOT NULL DEFAULT 0,
                 byte_count INTEGER NOT NULL DEFAULT 0
             );
             CREATE TABLE journal (
                 id INTEGER PRIMARY KEY,
                 account TEXT NOT NULL,
                 seq INTEGER NOT NULL,
                 sender TEXT NOT NULL,
                 sender_account TEXT NOT NULL,
                 message_id TEXT NOT NULL,
                 content TEXT NOT NULL,
                 bytes INTEGER NOT NULL,
                 reply_to_msg TEXT,
                 accepted_ms INTEGER NOT NULL,
                 UNIQUE (account, seq),
                 UNIQUE (account, sender, message_id)
             );
             CREATE INDEX journal_accepted ON journal (accepted_ms);
             INSERT INTO accounts (name, created_ms, last_seq) VALUES ('bob', 1, 4);
             PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    relay.run(relay.config()).await;
    let mut alice = relay.online("alice").await;
    assert_eq!(check(&mut alice, "bob").await, (false, None));
    assert_sent(
        &alice.send_and_answer("bob", "m1", "x").await,
        "m1",
        "bob",
        "stored",
    );
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    assert_eq!(bob.received().await.seq, Some(5), "seq carries on");
    bob.close().await;
    let (_, seen) = next_status_after_disconnect(&mut alice, "bob").await;
    relay.restart_with(|_| {}).await;
    let mut alice = relay.online("alice").await;
    assert_eq!(check(&mut alice, "bob").await, (false, Some(seen)));
}

/// Polls CheckPresence until `user` reads offline with a last_seen (used where no watch is
/// set up); each poll is a round trip, not a sleep.
async fn next_status_after_disconnect(c: &mut Client, user: &str) -> (bool, u64) {
    let found = within(async {
        loop {
            if let (false, Some(ms)) = check(c, user).await {
                return ms;
            }
        }
    })
    .await
    .expect("the disconnect within the deadline");
    (false, found)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_watch_frames_are_answered_invalid_frame_and_change_nothing() {
    let relay = TestRelay::start().await;
    let mut alice = relay.online("alice").await;
    let long = "x".repeat(257);
    let too_many: Vec<String> = (0..4097).map(|i| format!("u{i}")).collect();
    let cases = [
        json!({"type": "WatchPresence"}),
        json!({"type": "WatchPresence", "users": "bob"}),
        json!({"type": "WatchPresence", "users": ["bob", 7]}),
        json!({"type": "WatchPresence", "users": null}),
        json!({"type": "WatchPresence", "users": ["bob", ""]}),
        json!({"type": "WatchPresence", "users": ["bob", long]}),
        json!({"type": "WatchPresence", "users": too_many}),
        json!({"type": "UnwatchPresence"}),
        json!({"type": "UnwatchPresence", "users": [""]}),
        json!({"type": "UnwatchPresence", "users": too_many}),
    ];
    for frame in cases {
        let frame_type = frame["type"].as_str().unwrap().to_owned();
        alice.send_json(frame.clone()).await;
        assert_eq!(
            alice.until_synced().await,
            vec![RelayFrame::error("invalid_frame", Some(&frame_type))],
            "{frame}"
        );
    }
    // An empty list is valid and does nothing.
    watch(&mut alice, &[]).await;
    unwatch(&mut alice, &[]).await;
    assert_eq!(alice.until_synced().await, vec![]);
    // Nothing of the refused frames was watched.
    assert_eq!(relay.handle().stats().watches, 0);
    let bob = relay.online("bob").await;
    assert_eq!(alice.until_synced().await, vec![]);
    drop(bob);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watching_costs_one_token_per_listed_identifier() {
    let relay = TestRelay::start_with(|c| {
        c.rate_limit = courier_relay::RateLimit {
            burst: 2,
            per_sec: 1,
        };
    })
    .await;
    let mut alice = relay.online("alice").await;
    // Admitted with a token left, and paid for entry by entry, repeats included: the bucket
    // is tens of seconds in debt afterwards.
    let many: Vec<&str> = vec!["bob"; 50];
    watch(&mut alice, &many).await;
    assert_eq!(next_status(&mut alice, "bob").await, (false, None));
    watch(&mut alice, &["carol"]).await;
    let limited = alice
        .next_where(|f| matches!(f, RelayFrame::RateLimited { .. }))
        .await;
    assert!(
        matches!(&limited, RelayFrame::RateLimited { frame_type, retry_after_ms, .. }
            if frame_type == "WatchPresence" && *retry_after_ms > 10_000),
        "{limited:?}"
    );
    assert_eq!(
        relay.handle().stats().watches,
        1,
        "bob watched, carol's frame dropped unprocessed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_watch_v1_is_advertised_with_and_without_the_mailbox() {
    for mailbox in [true, false] {
        let relay = TestRelay::start_with(|c| {
            if !mailbox {
                c.mailbox = None;
            }
        })
        .await;
        let mut c = relay.client().await;
        let RelayFrame::Authenticated { capabilities, .. } = c.authenticate("alice", true).await
        else {
            unreachable!()
        };
        assert!(
            capabilities.iter().any(|t| t == "presence_watch_v1"),
            "mailbox {mailbox}: {capabilities:?}"
        );
        watch(&mut c, &["bob"]).await;
        assert_eq!(next_status(&mut c, "bob").await, (false, None));
    }
}

async fn contacts_relay(mailbox: bool) -> TestRelay {
    TestRelay::start_with(|c| {
        c.presence_visibility = courier_relay::PresenceVisibility::Contacts;
        if !mailbox {
            c.mailbox = None;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_cannot_see_presence_under_contacts_visibility() {
    let relay = contacts_relay(true).await;
    let bob = relay.online("bob").await;
    relay.register("carol").await;
    let mut mallory = relay.online("mallory").await;
    // Online, offline with a last_seen, and never seen all read as naming nobody.
    for user in ["bob", "carol", "nobody"] {
        assert_eq!(check(&mut mallory, user).await, (false, None), "{user}");
    }
    watch(&mut mallory, &["bob", "carol"]).await;
    assert_eq!(next_status(&mut mallory, "bob").await, (false, None));
    assert_eq!(next_status(&mut mallory, "carol").await, (false, None));
    // Changes are never revealed either.
    bob.close().await;
    let _carol = relay.online("carol").await;
    relay
        .wait_stats("carol alone besides mallory", |s| s.connections == 2)
        .await;
    let frames = mallory.until_synced().await;
    assert!(
        !frames
            .iter()
            .any(|f| matches!(f, RelayFrame::PresenceStatus { user_id, .. } if user_id != "sync")),
        "{frames:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_is_visible_after_an_exchange_or_a_shared_group_under_contacts_visibility() {
    let mut relay = contacts_relay(true).await;
    let mut bob = relay.online("bob").await;
    let mut alice = relay.online("alice").await;
    assert_sent(
        &alice.send_and_answer("bob", "m1", "hi").await,
        "m1",
        "bob",
        "live",
    );
    // Either direction of the exchange counts.
    assert_eq!(check(&mut alice, "bob").await, (true, None));
    assert_eq!(check(&mut bob, "alice").await, (true, None));
    watch(&mut alice, &["bob"]).await;
    assert_eq!(next_status(&mut alice, "bob").await, (true, None));
    bob.close().await;
    let (online, last_seen) = next_status(&mut alice, "bob").await;
    assert!(!online && last_seen.is_some());

    // A shared group counts too, from the moment the member is added.
    let mut carol = relay.online("carol").await;
    assert_eq!(check(&mut carol, "alice").await, (false, None));
    alice
        .send(&ClientFrame::CreateGroup {
            group_id: "g1".into(),
            name: "Friends".into(),
        })
        .await;
    alice
        .next_where(|f| matches!(f, RelayFrame::GroupCreated { .. }))
        .await;
    alice
        .send(&ClientFrame::AddGroupMember {
            group_id: "g1".into(),
            username: "carol".into(),
        })
        .await;
    alice
        .next_where(|f| matches!(f, RelayFrame::GroupMemberAdded { .. }))
        .await;
    assert_eq!(check(&mut carol, "alice").await, (true, None));

    // Exchanges are remembered across a restart.
    drop((alice, carol));
    relay
        .wait_stats("every connection to end", |s| s.connections == 0)
        .await;
    relay
        .restart_with(|c| c.presence_visibility = courier_relay::PresenceVisibility::Contacts)
        .await;
    let mut alice = relay.online("alice").await;
    let (online, last_seen) = check(&mut alice, "bob").await;
    assert!(!online && last_seen.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_offline_recipients_answer_the_same_under_contacts_visibility() {
    let relay = contacts_relay(false).await;
    let mut bob = relay.client().await;
    bob.authenticate("bob", false).await;
    bob.close().await;
    let mut mallory = relay.client().await;
    mallory.authenticate("mallory", false).await;
    relay
        .wait_stats("bob to be offline", |s| s.connections == 1)
        .await;
    for (user, id) in [
        ("bob", "m1"),
        ("nobody", "m2"),
        ("off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn", "m3"),
    ] {
        assert_unreachable(
            &mallory.send_and_answer(user, id, "hi").await,
            id,
            user,
            "offline_no_mailbox",
        );
        assert_eq!(check(&mut mallory, user).await, (false, None), "{user}");
    }
}
