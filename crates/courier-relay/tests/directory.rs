//! The key-package directory, `key_directory_v1` (`docs/protocol.md#key-package-directory`;
//! conformance in `docs/protocol.md#key-package-directory-conformance`): packages published for the
//! connection's declared address only, one-time ones handed out oldest first and once each (also
//! to concurrent fetchers), the last-resort one after them, the per-address cap, the decoder's
//! bounds, and persistence across a restart.

mod common;

use std::collections::HashSet;

use common::*;
use courier_proto::{Address, ClientFrame, IdentityKey, KeyPackage, KeyPackageBatch, RelayFrame};
use courier_relay::Storage;
use serde_json::{json, Value};

fn key(n: u8) -> IdentityKey {
    IdentityKey::from_seed([n; 32])
}

/// A package whose bytes name it, so each answer says which one it is.
fn package(name: &str) -> KeyPackage {
    KeyPackage::new(name.as_bytes().to_vec()).unwrap()
}

fn name_of(package: &KeyPackage) -> String {
    String::from_utf8(package.as_bytes().to_vec()).unwrap()
}

fn batch<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> KeyPackageBatch {
    KeyPackageBatch::new(names.into_iter().map(|n| package(n.as_ref())).collect()).unwrap()
}

/// `account` connected with `key`'s address declared, its (empty) drain over.
async fn declared(relay: &TestRelay, account: &str, key: &IdentityKey) -> Client {
    let mut c = relay.declaring(account, key).await;
    let answer = c
        .next_where(|f| {
            matches!(
                f,
                RelayFrame::AddressDeclared { .. } | RelayFrame::AddressError { .. }
            )
        })
        .await;
    assert_eq!(
        answer,
        RelayFrame::AddressDeclared {
            address: key.address().to_string()
        }
    );
    assert_eq!(c.drain_complete().await, 0);
    c
}

fn is_directory_answer(frame: &RelayFrame) -> bool {
    matches!(
        frame,
        RelayFrame::KeyPackagesPublished { .. }
            | RelayFrame::KeyPackage { .. }
            | RelayFrame::KeyPackageUnavailable { .. }
            | RelayFrame::Error { .. }
            | RelayFrame::RateLimited { .. }
    )
}

async fn answer(c: &mut Client) -> RelayFrame {
    c.next_where(is_directory_answer).await
}

async fn publish(
    c: &mut Client,
    packages: KeyPackageBatch,
    last_resort: Option<KeyPackage>,
) -> RelayFrame {
    c.send(&ClientFrame::PublishKeyPackages {
        packages,
        last_resort,
    })
    .await;
    answer(c).await
}

/// What the relay holds for the connection's address, by a publish of nothing.
async fn held(c: &mut Client) -> RelayFrame {
    publish(c, KeyPackageBatch::default(), None).await
}

fn published(available: u32, last_resort: bool) -> RelayFrame {
    RelayFrame::KeyPackagesPublished {
        available,
        last_resort,
    }
}

async fn fetch(c: &mut Client, address: Address) -> RelayFrame {
    c.send(&ClientFrame::FetchKeyPackage { address }).await;
    answer(c).await
}

/// The name of the package a fetch answered and whether it was the last-resort one; `None`
/// for `KeyPackageUnavailable`. Every answer must name the address asked.
fn taken(answer: RelayFrame, asked: Address) -> Option<(String, bool)> {
    match answer {
        RelayFrame::KeyPackage {
            address,
            package,
            last_resort,
        } => {
            assert_eq!(address, asked);
            Some((name_of(&package), last_resort))
        }
        RelayFrame::KeyPackageUnavailable { address } => {
            assert_eq!(address, asked);
            None
        }
        other => panic!("expected a fetch answer, got {other:?}"),
    }
}

fn one_time(name: &str) -> Option<(String, bool)> {
    Some((name.to_owned(), false))
}

fn last_resort(name: &str) -> Option<(String, bool)> {
    Some((name.to_owned(), true))
}

fn refused(code: &str, frame_type: &str) -> RelayFrame {
    RelayFrame::error(code, Some(frame_type))
}

#[tokio::test]
async fn one_time_packages_go_oldest_first_and_once_then_the_last_resort_one_again_and_again() {
    let relay = TestRelay::start().await;
    let alice_key = key(1);
    let alice_address = alice_key.address();
    let mut alice = declared(&relay, "alice", &alice_key).await;
    assert_eq!(held(&mut alice).await, published(0, false));
    assert_eq!(
        publish(&mut alice, batch(["a1", "a2"]), Some(package("old-lr"))).await,
        published(2, true)
    );
    // One-time packages append; a new last-resort package replaces the old one.
    assert_eq!(
        publish(&mut alice, batch(["a3"]), Some(package("lr"))).await,
        published(3, true)
    );

    // Bob has declared nothing: fetching needs no address.
    let mut bob = relay.online("bob").await;
    for expected in [one_time("a1"), one_time("a2"), one_time("a3")] {
        assert_eq!(
            taken(fetch(&mut bob, alice_address).await, alice_address),
            expected
        );
    }
    for _ in 0..3 {
        assert_eq!(
            taken(fetch(&mut bob, alice_address).await, alice_address),
            last_resort("lr")
        );
    }
    assert_eq!(held(&mut alice).await, published(0, true));
    // Alice may fetch her own too.
    assert_eq!(
        taken(fetch(&mut alice, alice_address).await, alice_address),
        last_resort("lr")
    );

    let nobody = key(9).address();
    assert_eq!(taken(fetch(&mut bob, nobody).await, nobody), None);
    // Packages belong to the address, not to whoever asks: bob's own address holds nothing.
    let bob_address = key(2).address();
    assert_eq!(
        taken(fetch(&mut alice, bob_address).await, bob_address),
        None
    );
}

#[tokio::test]
async fn a_publish_without_a_declared_address_is_refused_and_stores_nothing() {
    let relay = TestRelay::start().await;
    let alice_key = key(1);

    let mut undeclared = relay.online("alice").await;
    assert_eq!(
        publish(&mut undeclared, batch(["a1"]), Some(package("lr"))).await,
        refused("address_required", "PublishKeyPackages")
    );
    assert_eq!(
        held(&mut undeclared).await,
        refused("address_required", "PublishKeyPackages")
    );
    // The connection goes on: the refusal is an answer, not an end.
    undeclared.sync().await;
    undeclared.close().await;

    // A refused declaration leaves the connection without an address too.
    let mut refused_declaration = relay.client().await;
    refused_declaration.authenticate("alice", true).await;
    refused_declaration
        .send(&ClientFrame::DeclareAddress {
            address: alice_key.address().to_string(),
            public_key: "AAAA".into(),
            signature: "AAAA".into(),
        })
        .await;
    assert!(matches!(
        refused_declaration
            .next_where(|f| matches!(f, RelayFrame::AddressError { .. }))
            .await,
        RelayFrame::AddressError { .. }
    ));
    assert_eq!(
        publish(&mut refused_declaration, batch(["a2"]), None).await,
        refused("address_required", "PublishKeyPackages")
    );
    refused_declaration.close().await;

    let mut alice = declared(&relay, "alice", &alice_key).await;
    assert_eq!(held(&mut alice).await, published(0, false));
    let address = alice_key.address();
    assert_eq!(taken(fetch(&mut alice, address).await, address), None);
}

#[tokio::test]
async fn packages_survive_a_relay_restart() {
    let mut relay = TestRelay::start().await;
    let alice_key = key(1);
    let address = alice_key.address();
    let mut alice = declared(&relay, "alice", &alice_key).await;
    assert_eq!(
        publish(&mut alice, batch(["a1", "a2"]), Some(package("lr"))).await,
        published(2, true)
    );
    let mut bob = relay.online("bob").await;
    assert_eq!(
        taken(fetch(&mut bob, address).await, address),
        one_time("a1")
    );
    alice.close().await;
    bob.close().await;

    relay.restart_with(|_| {}).await;
    let mut bob = relay.online("bob").await;
    assert_eq!(
        taken(fetch(&mut bob, address).await, address),
        one_time("a2")
    );
    assert_eq!(
        taken(fetch(&mut bob, address).await, address),
        last_resort("lr")
    );
    bob.close().await;

    // What a take spent stays spent after another restart.
    relay.restart_with(|_| {}).await;
    let mut alice = declared(&relay, "alice", &alice_key).await;
    assert_eq!(held(&mut alice).await, published(0, true));
}

#[tokio::test]
async fn an_address_holds_the_newest_100_one_time_packages() {
    let relay = TestRelay::start().await;
    let alice_key = key(1);
    let address = alice_key.address();
    let mut alice = declared(&relay, "alice", &alice_key).await;
    let names = |range: std::ops::Range<u32>| range.map(|i| format!("p{i}"));
    assert_eq!(
        publish(&mut alice, batch(names(0..70)), None).await,
        published(70, false)
    );
    assert_eq!(
        publish(&mut alice, batch(names(70..100)), None).await,
        published(100, false)
    );
    assert_eq!(
        publish(&mut alice, batch(names(100..130)), None).await,
        published(100, false)
    );

    let mut bob = relay.online("bob").await;
    for i in 30..130 {
        assert_eq!(
            taken(fetch(&mut bob, address).await, address),
            one_time(&format!("p{i}"))
        );
    }
    assert_eq!(taken(fetch(&mut bob, address).await, address), None);
    assert_eq!(held(&mut alice).await, published(0, false));
}

#[tokio::test]
async fn packages_out_of_bounds_are_refused_at_decode_and_change_nothing() {
    let relay = TestRelay::start().await;
    let alice_key = key(1);
    let mut alice = declared(&relay, "alice", &alice_key).await;
    let b64 = |bytes: &[u8]| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(bytes)
    };
    let largest = b64(&[7; 16 * 1024]);
    let over_long = b64(&[7; 16 * 1024 + 1]);
    let hundred_and_one: Vec<Value> = (0..101).map(|i| b64(&[i as u8 + 1]).into()).collect();
    let bad_frames = [
        json!({"type": "PublishKeyPackages", "packages": [over_long]}),
        json!({"type": "PublishKeyPackages", "packages": [], "last_resort": over_long}),
        json!({"type": "PublishKeyPackages", "packages": ["not base64!"]}),
        json!({"type": "PublishKeyPackages", "packages": ["AQ"]}),
        json!({"type": "PublishKeyPackages", "packages": ["AQ=="], "last_resort": "-_8="}),
        json!({"type": "PublishKeyPackages", "packages": [""]}),
        json!({"type": "PublishKeyPackages", "packages": hundred_and_one}),
        json!({"type": "PublishKeyPackages", "last_resort": "AQ=="}),
    ];
    // More than the 16 malformed frames that close a connection: invalid frames are not
    // malformed ones.
    for frame in bad_frames.iter().cycle().take(20) {
        alice.send_json(frame.clone()).await;
        assert_eq!(
            answer(&mut alice).await,
            refused("invalid_frame", "PublishKeyPackages"),
            "{frame}"
        );
    }
    for address in [
        "OFF1QYSLUVWL5922YCTZD0U9GPR06GN3K7LDFVGTWGVN",
        "off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqxmdlwt",
        "alice",
        "",
    ] {
        alice
            .send_json(json!({"type": "FetchKeyPackage", "address": address}))
            .await;
        assert_eq!(
            answer(&mut alice).await,
            refused("invalid_frame", "FetchKeyPackage"),
            "{address:?}"
        );
    }
    assert_eq!(held(&mut alice).await, published(0, false));

    // The bounds themselves are accepted: 100 packages, and 16 KiB.
    let hundred: Vec<Value> = (0..100).map(|i| b64(&[i as u8 + 1]).into()).collect();
    alice
        .send_json(
            json!({"type": "PublishKeyPackages", "packages": hundred, "last_resort": largest}),
        )
        .await;
    assert_eq!(answer(&mut alice).await, published(100, true));
}

#[tokio::test]
async fn concurrent_fetchers_never_get_the_same_one_time_package() {
    const PUBLISHED: u32 = 100;
    const FETCHES_EACH: usize = 70;
    let relay = TestRelay::start().await;
    let alice_key = key(1);
    let address = alice_key.address();
    let mut alice = declared(&relay, "alice", &alice_key).await;
    let names = (0..PUBLISHED).map(|i| format!("p{i:03}"));
    assert_eq!(
        publish(&mut alice, batch(names), Some(package("lr"))).await,
        published(PUBLISHED, true)
    );

    // Each fetcher writes all its requests before reading any answer, so the two connections'
    // requests reach the store interleaved.
    let fetcher = |account: &'static str| {
        let relay = &relay;
        async move {
            let mut c = relay.online(account).await;
            for _ in 0..FETCHES_EACH {
                c.send(&ClientFrame::FetchKeyPackage { address }).await;
            }
            let mut answers = Vec::new();
            for _ in 0..FETCHES_EACH {
                answers.push(taken(answer(&mut c).await, address).expect("a package"));
            }
            answers
        }
    };
    let (bob, carol) = tokio::join!(fetcher("bob"), fetcher("carol"));

    let mut handed_out = HashSet::new();
    for answers in [&bob, &carol] {
        let one_time: Vec<&String> = answers
            .iter()
            .filter(|(_, last_resort)| !last_resort)
            .map(|(name, _)| name)
            .collect();
        // Each connection's requests are handled in order, so it gets older packages first.
        assert!(one_time.windows(2).all(|w| w[0] < w[1]), "{one_time:?}");
        // Once the one-time packages are gone, only the last-resort one is left.
        let first_last_resort = answers.iter().position(|(_, lr)| *lr);
        if let Some(first) = first_last_resort {
            assert!(answers[first..]
                .iter()
                .all(|answer| *answer == ("lr".to_owned(), true)));
        }
        for name in one_time {
            assert!(handed_out.insert(name.clone()), "{name} handed out twice");
        }
    }
    assert_eq!(handed_out.len(), PUBLISHED as usize);
    assert_eq!(held(&mut alice).await, published(0, true));
}

#[tokio::test]
async fn a_relay_in_memory_without_a_mailbox_keeps_a_directory_too() {
    let relay = TestRelay::start_with(|c| {
        c.storage = Storage::Memory;
        c.mailbox = None;
    })
    .await;
    let alice_key = key(1);
    let address = alice_key.address();
    let mut alice = relay.declaring("alice", &alice_key).await;
    alice
        .next_where(|f| matches!(f, RelayFrame::AddressDeclared { .. }))
        .await;
    assert_eq!(
        publish(&mut alice, batch(["a1"]), Some(package("lr"))).await,
        published(1, true)
    );
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    assert_eq!(
        taken(fetch(&mut bob, address).await, address),
        one_time("a1")
    );
    assert_eq!(
        taken(fetch(&mut bob, address).await, address),
        last_resort("lr")
    );
}

/// A database a relay without the directory wrote (schema version 3) is upgraded in place: its
/// bindings still route, and the directory works on it.
#[tokio::test]
async fn a_version_3_database_gains_the_directory_and_keeps_its_bindings() {
    let mut relay = TestRelay::start().await;
    let alice_key = key(1);
    let address = alice_key.address();
    declared(&relay, "alice", &alice_key).await.close().await;
    relay.stop().await;
    {
        let conn = rusqlite::Connection::open(relay.db_path()).unwrap();
        // Versions 4 to 7 undone: the directory's tables, the groups' and the contacts go, the
        // (empty) journal takes its version 1 shape again, and the bindings lose their indexes.
        conn.execute_batch(&format!(
            "DROP TABLE contacts;
             DROP INDEX addresses_account;
             DROP INDEX addresses_bound;
             DROP TABLE key_packages;
             DROP TABLE last_resort_key_packages;
             DROP TABLE groups;
             DROP TABLE group_members;
             DROP TABLE group_copies;
             DROP TABLE held_reports;
             DROP TABLE journal;
             {JOURNAL_BEFORE_V5}
             PRAGMA user_version = 3;"
        ))
        .unwrap();
    }
    relay.run(relay.config()).await;
    let mut bob = relay.online("bob").await;
    assert_sent(
        &bob.send_and_answer(&address.to_string(), "m1", "hello")
            .await,
        "m1",
        &address.to_string(),
        "stored",
    );
    assert_eq!(taken(fetch(&mut bob, address).await, address), None);
    let mut alice = relay.declaring("alice", &alice_key).await;
    let (drained, count) = alice.drain().await;
    assert_eq!((drained.len(), count), (1, 1));
    assert_eq!(
        publish(&mut alice, batch(["a1"]), None).await,
        published(1, false)
    );
    assert_eq!(
        taken(fetch(&mut bob, address).await, address),
        one_time("a1")
    );
    relay.stop().await;
    let conn = rusqlite::Connection::open(relay.db_path()).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 7);
}
