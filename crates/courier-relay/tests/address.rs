//! Address declaration and routing by address (`docs/protocol.md#address-declaration`,
//! `docs/protocol.md#identifiers`, drain rule (a) of `docs/protocol.md#drain`,
//! `docs/protocol.md#presence` by address; conformance in `docs/protocol.md#address-conformance`):
//! proofs checked over the connection's own account and challenge, the bound address stamped from
//! the next frame on, `off1` recipients and presence resolved through the persisted binding.

mod common;

use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use common::*;
use courier_proto::{
    declare_address_frame, relay_proof_payload, ClientFrame, IdentityKey, RelayFrame,
};
use serde_json::json;

const K1_ADDRESS: &str = "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn";
const SEQ_CHALLENGE_B64: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

fn seq_challenge() -> [u8; 32] {
    std::array::from_fn(|i| i as u8)
}

fn k1() -> IdentityKey {
    let hex = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    IdentityKey::from_seed(std::array::from_fn(|i| {
        u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()
    }))
}

fn key(n: u8) -> IdentityKey {
    IdentityKey::from_seed([n; 32])
}

/// The connection's `address_challenge`, checked to be base64 of 32 bytes.
fn challenge_of(authenticated: &RelayFrame) -> String {
    let RelayFrame::Authenticated {
        address_challenge: Some(challenge),
        ..
    } = authenticated
    else {
        panic!("no challenge in {authenticated:?}")
    };
    assert_eq!(STANDARD.decode(challenge).unwrap().len(), 32);
    challenge.clone()
}

/// An opted-in connection, authenticated; the drain has not necessarily started.
async fn connect(relay: &TestRelay, account: &str) -> (Client, String) {
    let mut c = relay.client().await;
    let authenticated = c.authenticate(account, true).await;
    let challenge = challenge_of(&authenticated);
    (c, challenge)
}

fn declaration(key: &IdentityKey, account: &str, challenge: &str) -> ClientFrame {
    declare_address_frame(key, Some(account), Some(challenge)).unwrap()
}

fn declare_raw(address: &str, public_key: &str, signature: &str) -> ClientFrame {
    ClientFrame::DeclareAddress {
        address: address.into(),
        public_key: public_key.into(),
        signature: signature.into(),
    }
}

/// The answer to a DeclareAddress (AddressDeclared, AddressError or Error).
async fn declaration_answer(c: &mut Client) -> RelayFrame {
    c.next_where(|f| {
        matches!(
            f,
            RelayFrame::AddressDeclared { .. }
                | RelayFrame::AddressError { .. }
                | RelayFrame::Error { .. }
        )
    })
    .await
}

fn declared(address: &str) -> RelayFrame {
    RelayFrame::AddressDeclared {
        address: address.into(),
    }
}

fn refused(reason: &str) -> RelayFrame {
    RelayFrame::AddressError {
        reason: reason.into(),
    }
}

/// Connects `account`, declares `key`'s address as the first frame, and returns the
/// connection once its (empty) drain is over.
async fn online_as(relay: &TestRelay, account: &str, key: &IdentityKey) -> Client {
    let (mut c, challenge) = connect(relay, account).await;
    c.send(&declaration(key, account, &challenge)).await;
    assert_eq!(
        declaration_answer(&mut c).await,
        declared(&key.address().to_string())
    );
    assert_eq!(c.drain_complete().await, 0);
    c
}

async fn check(c: &mut Client, identifier: &str) -> (bool, Option<u64>) {
    c.send(&ClientFrame::CheckPresence {
        username: identifier.into(),
    })
    .await;
    match c
        .next_where(
            |f| matches!(f, RelayFrame::PresenceStatus { user_id, .. } if user_id == identifier),
        )
        .await
    {
        RelayFrame::PresenceStatus {
            online, last_seen, ..
        } => (online, last_seen.and_then(|v| v.as_u64())),
        _ => unreachable!(),
    }
}

async fn next_status(c: &mut Client, identifier: &str) -> (bool, Option<u64>) {
    match c
        .next_where(
            |f| matches!(f, RelayFrame::PresenceStatus { user_id, .. } if user_id == identifier),
        )
        .await
    {
        RelayFrame::PresenceStatus {
            online, last_seen, ..
        } => (online, last_seen.and_then(|v| v.as_u64())),
        _ => unreachable!(),
    }
}

fn statuses_for(frames: &[RelayFrame], identifier: &str) -> Vec<bool> {
    frames
        .iter()
        .filter_map(|f| match f {
            RelayFrame::PresenceStatus {
                user_id, online, ..
            } if user_id == identifier => Some(*online),
            _ => None,
        })
        .collect()
}

// What `Authenticated` carries (`docs/protocol.md#handshake`): the capability list is checked in
// auth.rs (a valid token yields Authenticated) and, without the mailbox, in transport.rs; here,
// what a declaring client relies on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn address_routing_is_advertised_with_a_fresh_challenge_per_connection() {
    let relay = TestRelay::start().await;
    let mut challenges = Vec::new();
    for _ in 0..2 {
        let mut c = relay.client().await;
        let authenticated = c.authenticate("alice", true).await;
        let RelayFrame::Authenticated { capabilities, .. } = &authenticated else {
            unreachable!()
        };
        assert!(capabilities.iter().any(|t| t == "address_routing_v1"));
        let groups: Vec<_> = capabilities
            .iter()
            .filter(|t| t.starts_with("group_delivery"))
            .collect();
        assert_eq!(groups, ["group_delivery_v3"]);
        let challenge = challenge_of(&authenticated);
        assert_eq!(challenge.len(), 44);
        challenges.push(challenge);
        c.close().await;
    }
    assert_ne!(challenges[0], challenges[1]);
}

// The pinned vectors (`docs/protocol.md#declaration-vectors`; the builder lives in courier-proto,
// this is the relay's view of the same bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pinned_k1_frame_is_declared() {
    let hex = |s: &str| -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    };
    assert_eq!(
        relay_proof_payload("alice", &seq_challenge()),
        hex(
            "6f66666c696e652d72656c61792d616464722d7631 00000005 616c696365
             000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
        )
    );
    let zoe = relay_proof_payload("zoë", &seq_challenge());
    assert_eq!(zoe[21..29], hex("00000004 7a6fc3ab")[..]);

    // No grace-period drain: the declaration's answer must come first (drain rule a).
    let relay = TestRelay::start_with(|c| {
        c.timings.fixed_challenge = Some(seq_challenge());
        c.timings.drain_grace = Duration::from_secs(60);
    })
    .await;
    let (mut c, challenge) = connect(&relay, "alice").await;
    assert_eq!(challenge, SEQ_CHALLENGE_B64);
    // The frame exactly as `docs/protocol.md#declaration-vectors` prints it.
    c.send_text(concat!(
        r#"{"type":"DeclareAddress","address":"off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn","#,
        r#""public_key":"11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=","#,
        r#""signature":"YdIY8ZLo3zcDLOKUtxQQw/IT8h0Y6x6lxlLV3RFBK/eJbrMs1e3/WFUppT3XF9T2gdhdLXvUolPquQbL4cVJAg=="}"#
    ))
    .await;
    assert_eq!(c.next_frame().await, declared(K1_ADDRESS));
    assert_eq!(c.next_frame().await, RelayFrame::DrainComplete { count: 0 });
    assert_eq!(k1().address().to_string(), K1_ADDRESS);
}

// Every refusal of `docs/protocol.md#relay-checks`, with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_proofs_are_refused_with_their_reasons() {
    let relay = TestRelay::start().await;
    let k = key(1);
    let address = k.address().to_string();
    let pk = k.public_key_base64();
    let challenge_bytes = |c: &str| -> [u8; 32] { STANDARD.decode(c).unwrap().try_into().unwrap() };

    // A challenge seen by an earlier connection of the same account.
    let (old, old_challenge) = connect(&relay, "alice").await;
    old.close().await;

    type Build<'a> = Box<dyn Fn(&str) -> ClientFrame + 'a>;
    let cases: Vec<(&str, Build<'_>)> = vec![
        (
            "bad_signature",
            // Over the bare challenge.
            Box::new(|c: &str| declare_raw(&address, &pk, &k.sign_base64(&challenge_bytes(c)))),
        ),
        (
            "bad_signature",
            // Over another account.
            Box::new(|c: &str| declaration(&k, "bob", c)),
        ),
        (
            "bad_signature",
            // Over another connection's challenge.
            Box::new(|_: &str| declaration(&k, "alice", &old_challenge)),
        ),
        (
            "bad_signature",
            // By another key, for this key's address.
            Box::new(|c: &str| {
                let sig = key(2).sign_base64(&relay_proof_payload("alice", &challenge_bytes(c)));
                declare_raw(&address, &pk, &sig)
            }),
        ),
        (
            "address_key_mismatch",
            // A good proof by key 2 claiming key 1's address.
            Box::new(|c: &str| {
                let ClientFrame::DeclareAddress {
                    public_key,
                    signature,
                    ..
                } = declaration(&key(2), "alice", c)
                else {
                    unreachable!()
                };
                declare_raw(&address, &public_key, &signature)
            }),
        ),
        (
            "malformed",
            // Not canonical: uppercase.
            Box::new(|c: &str| {
                let ClientFrame::DeclareAddress {
                    public_key,
                    signature,
                    ..
                } = declaration(&k, "alice", c)
                else {
                    unreachable!()
                };
                declare_raw(&address.to_uppercase(), &public_key, &signature)
            }),
        ),
        (
            "malformed",
            // A key of 31 bytes.
            Box::new(|c: &str| {
                let ClientFrame::DeclareAddress { signature, .. } = declaration(&k, "alice", c)
                else {
                    unreachable!()
                };
                declare_raw(&address, &STANDARD.encode([7u8; 31]), &signature)
            }),
        ),
        (
            "malformed",
            // A signature that is not base64 of 64 bytes.
            Box::new(|_: &str| declare_raw(&address, &pk, "c2lnbmF0dXJl")),
        ),
    ];
    for (reason, frame) in &cases {
        let (mut c, challenge) = connect(&relay, "alice").await;
        c.send(&frame(&challenge)).await;
        assert_eq!(
            declaration_answer(&mut c).await,
            refused(reason),
            "{reason}"
        );
        // The challenge is spent: even a good proof is now a second declaration.
        c.send(&declaration(&k, "alice", &challenge)).await;
        assert_eq!(
            declaration_answer(&mut c).await,
            refused("already_declared")
        );
        c.close().await;
    }

    // A second declaration after a good one, even of the same address.
    let (mut c, challenge) = connect(&relay, "alice").await;
    c.send(&declaration(&k, "alice", &challenge)).await;
    assert_eq!(declaration_answer(&mut c).await, declared(&address));
    c.send(&declaration(&k, "alice", &challenge)).await;
    assert_eq!(
        declaration_answer(&mut c).await,
        refused("already_declared")
    );
    c.send(&declaration(&key(3), "alice", &challenge)).await;
    assert_eq!(
        declaration_answer(&mut c).await,
        refused("already_declared")
    );
    // The refused ones bound nothing: the first address still names alice, key 3's nothing.
    let mut bob = relay.online("bob").await;
    assert_sent(
        &bob.send_and_answer(&address, "m1", "x").await,
        "m1",
        &address,
        "live",
    );
    let other = key(3).address().to_string();
    assert_unreachable(
        &bob.send_and_answer(&other, "m2", "x").await,
        "m2",
        &other,
        "unknown_recipient",
    );
    // A DeclareAddress with a missing field is an invalid frame, not a declaration.
    let (mut c, _) = connect(&relay, "carol").await;
    c.send_json(json!({"type": "DeclareAddress", "address": address, "public_key": pk}))
        .await;
    assert_eq!(
        declaration_answer(&mut c).await,
        RelayFrame::error("invalid_frame", Some("DeclareAddress"))
    );
}

// A refusal is not fatal (`docs/protocol.md#relay-checks`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_refusal_the_connection_works_in_account_name_space() {
    let relay = TestRelay::start().await;
    let mut bob = relay.online("bob").await;
    let (mut alice, challenge) = connect(&relay, "alice").await;
    let k = key(1);
    alice.send(&declaration(&k, "mallory", &challenge)).await;
    assert_eq!(
        declaration_answer(&mut alice).await,
        refused("bad_signature")
    );
    assert_eq!(alice.drain_complete().await, 0);

    assert_sent(
        &alice.send_and_answer("bob", "m1", "hi bob").await,
        "m1",
        "bob",
        "live",
    );
    let got = bob.received().await;
    assert_eq!(
        (got.sender.as_str(), got.sender_account.as_deref()),
        ("alice", Some("alice"))
    );
    assert_sent(
        &bob.send_and_answer("alice", "m2", "hi alice").await,
        "m2",
        "alice",
        "live",
    );
    assert_eq!(alice.received().await.content, "hi alice");
    // Nothing was bound.
    let address = k.address().to_string();
    assert_unreachable(
        &bob.send_and_answer(&address, "m3", "x").await,
        "m3",
        &address,
        "unknown_recipient",
    );
}

// Stamping (`docs/protocol.md#identifiers`), and drain rule (a) of `docs/protocol.md#drain`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_are_stamped_by_the_identity_in_force_when_read() {
    // No grace-period drain: rule (a) or (b) must start it.
    let relay = TestRelay::start_with(|c| c.timings.drain_grace = Duration::from_secs(60)).await;
    relay.register("bob").await;
    let k = key(1);
    let address = k.address().to_string();

    // DeclareAddress then SendMessage, written back to back, nothing awaited.
    let (mut alice, challenge) = connect(&relay, "alice").await;
    alice.send(&declaration(&k, "alice", &challenge)).await;
    alice.send_message("bob", "after", "x").await;
    // The answer comes first; the drain it started and the SendMessage's answer follow.
    assert_eq!(alice.next_frame().await, declared(&address));
    assert_sent(
        &alice
            .next_where(|f| matches!(f, RelayFrame::MessageSent { .. }))
            .await,
        "after",
        "bob",
        "stored",
    );
    assert_eq!(alice.drain_complete().await, 0);
    alice.close().await;

    // SendMessage read before the declaration, then DeclareAddress, then SendMessage.
    let (mut alice, challenge) = connect(&relay, "alice").await;
    alice.send_message("bob", "before", "x").await;
    alice.send(&declaration(&k, "alice", &challenge)).await;
    alice.send_message("bob", "later", "x").await;
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(
            alice
                .next_where(|f| !matches!(f, RelayFrame::DrainComplete { .. }))
                .await,
        );
    }
    assert_sent(&answers[0], "before", "bob", "stored");
    assert_eq!(answers[1], declared(&address));
    assert_sent(&answers[2], "later", "bob", "stored");
    alice.close().await;

    // Delivered later, after a restart even: each keeps the identity stamped at reading.
    let mut relay = relay;
    relay.restart_with(|_| {}).await;
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, count) = bob.drain().await;
    assert_eq!(count, 3);
    let stamped: Vec<_> = frames
        .iter()
        .map(|f| {
            (
                f.message_id.as_str(),
                f.sender.as_str(),
                f.sender_account.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        stamped,
        vec![
            ("after", address.as_str(), Some("alice")),
            ("before", "alice", Some("alice")),
            ("later", address.as_str(), Some("alice")),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declaration_as_first_frame_starts_the_drain_after_its_answer() {
    let relay = TestRelay::start_with(|c| c.timings.drain_grace = Duration::from_secs(60)).await;
    relay.register("bob").await;
    let (mut alice, _) = connect(&relay, "alice").await;
    for i in 1..=2 {
        alice.send_and_answer("bob", &format!("m{i}"), "x").await;
    }
    // Accepted or refused, the answer comes first, then the backlog, then DrainComplete.
    for good in [true, false] {
        let (mut bob, challenge) = connect(&relay, "bob").await;
        let account = if good { "bob" } else { "someone else" };
        bob.send(&declaration(&key(2), account, &challenge)).await;
        let answer = bob.next_frame().await;
        if good {
            assert_eq!(answer, declared(&key(2).address().to_string()));
        } else {
            assert_eq!(answer, refused("bad_signature"));
        }
        for i in 1..=2 {
            let got = Received::from(bob.next_frame().await);
            assert_eq!(got.message_id, format!("m{i}"));
        }
        assert_eq!(
            bob.next_frame().await,
            RelayFrame::DrainComplete { count: 2 }
        );
        bob.close().await;
    }
}

// A declared address is a recipient, live and offline (`docs/protocol.md#identifiers`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_address_receives_live_and_while_offline() {
    let relay = TestRelay::start().await;
    let k = key(2);
    let address = k.address().to_string();
    let mut alice = relay.online("alice").await;
    // Unknown until declared.
    assert_unreachable(
        &alice.send_and_answer(&address, "m0", "x").await,
        "m0",
        &address,
        "unknown_recipient",
    );

    let mut bob = online_as(&relay, "bob", &k).await;
    assert_sent(
        &alice.send_and_answer(&address, "m1", "live").await,
        "m1",
        &address,
        "live",
    );
    let got = bob.received().await;
    assert_eq!(
        (got.message_id.as_str(), got.content.as_str()),
        ("m1", "live")
    );
    assert_eq!(got.sender, "alice");
    bob.ack(got.seq.unwrap()).await;
    bob.sync().await;
    bob.close().await;

    // Offline: stored for the account; its next connection drains it (declared or not).
    assert_sent(
        &alice.send_and_answer(&address, "m2", "stored").await,
        "m2",
        &address,
        "stored",
    );
    // A re-send while unacked is stored once (`docs/protocol.md#relay-side-dedup`): same stamped
    // sender, recipient account and message_id.
    assert_sent(
        &alice.send_and_answer(&address, "m2", "stored").await,
        "m2",
        &address,
        "stored",
    );
    assert_eq!(relay.stored_frames().await, 1);
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, count) = bob.drain().await;
    assert_eq!(count, 1);
    assert_eq!(
        (frames[0].message_id.as_str(), frames[0].content.as_str()),
        ("m2", "stored")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_canonical_spelling_of_a_declared_address_routes() {
    let relay = TestRelay::start().await;
    let _bob = online_as(&relay, "bob", &k1()).await;
    let mut alice = relay.online("alice").await;
    let upper = K1_ADDRESS.to_uppercase();
    let mut mixed = K1_ADDRESS.to_owned();
    mixed.replace_range(4..5, "Q");
    // One character edited: the checksum fails.
    let edited = K1_ADDRESS.replace("qysl", "qysm");
    let bad = [
        upper.as_str(),
        mixed.as_str(),
        edited.as_str(),
        "off1",
        "off1x",
        // The refused strings of `docs/protocol.md#addresses`, one per rule.
        "OFF1QYQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQN8ANTF",
        "off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqxmdlwt",
        "ofg1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqpxdptr",
        "off1qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqkynkkv",
        "off1qgqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqquz0u9x",
        "off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqxfx3pw",
        "off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqkev2nx",
        "off1qyqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqra5g99k",
    ];
    for (i, recipient) in bad.iter().enumerate() {
        let id = format!("m{i}");
        assert_unreachable(
            &alice.send_and_answer(recipient, &id, "x").await,
            &id,
            recipient,
            "unknown_recipient",
        );
        assert_eq!(
            check(&mut alice, recipient).await,
            (false, None),
            "{recipient}"
        );
    }
    assert_eq!(relay.stored_frames().await, 0);
    assert_eq!(check(&mut alice, K1_ADDRESS).await, (true, None));
    // Nor can an account take the uppercase spelling as its name.
    let mut c = relay.client().await;
    c.authenticate_with(&token_unchecked(&upper), true).await;
    let (frames, ending) = c.frames_until_end().await;
    assert_eq!(
        frames,
        vec![RelayFrame::AuthError {
            reason: "invalid_account".into()
        }]
    );
    assert_eq!(ending, Ending::Close(4001));
}

/// An HS256 token for any `sub`, bypassing `issue_token`'s account-name checks.
fn token_unchecked(sub: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({"sub": sub, "iat": now, "exp": now + 600}),
        &jsonwebtoken::EncodingKey::from_secret(SECRET).unwrap(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latest_declaration_wins() {
    let relay = TestRelay::start().await;
    let k = key(4);
    let address = k.address().to_string();
    let mut bob = online_as(&relay, "bob", &k).await;
    let mut carol = online_as(&relay, "carol", &k).await;
    let mut alice = relay.online("alice").await;
    assert_sent(
        &alice.send_and_answer(&address, "m1", "to carol").await,
        "m1",
        &address,
        "live",
    );
    assert_eq!(carol.received().await.message_id, "m1");
    let nothing = bob.until_synced().await;
    assert!(nothing.is_empty(), "{nothing:?}");
    // Bob declares again on a new connection: the address is his again.
    bob.close().await;
    let mut bob = online_as(&relay, "bob", &k).await;
    assert_sent(
        &alice.send_and_answer(&address, "m2", "to bob").await,
        "m2",
        &address,
        "live",
    );
    assert_eq!(bob.received().await.message_id, "m2");
    let nothing = carol.until_synced().await;
    assert!(nothing.is_empty(), "{nothing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_survives_a_relay_restart() {
    let mut relay = TestRelay::start().await;
    let k = key(5);
    let address = k.address().to_string();
    online_as(&relay, "bob", &k).await.close().await;
    relay.restart_with(|_| {}).await;
    let mut alice = relay.online("alice").await;
    assert_sent(
        &alice.send_and_answer(&address, "m1", "x").await,
        "m1",
        &address,
        "stored",
    );
    assert!(!check(&mut alice, &address).await.0);
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, count) = bob.drain().await;
    assert_eq!(count, 1);
    assert_eq!(frames[0].message_id, "m1");
    assert_eq!(check(&mut alice, &address).await, (true, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_by_address_follows_the_binding() {
    let relay = TestRelay::start().await;
    let k = key(6);
    let address = k.address().to_string();
    let mut alice = relay.online("alice").await;
    assert_eq!(check(&mut alice, &address).await, (false, None));
    alice
        .send(&ClientFrame::WatchPresence {
            users: vec![address.clone(), "bob".into()],
        })
        .await;
    assert_eq!(next_status(&mut alice, &address).await, (false, None));
    assert_eq!(next_status(&mut alice, "bob").await, (false, None));

    // Bob declares: the watch on the address hears him online (as does the one on his name).
    let bob = online_as(&relay, "bob", &k).await;
    assert_eq!(next_status(&mut alice, &address).await, (true, None));
    assert_eq!(next_status(&mut alice, "bob").await, (true, None));
    assert_eq!(check(&mut alice, &address).await, (true, None));

    // Carol, online, takes the address over: `online` does not change, so nothing is pushed
    // for it; bob leaving is then no change for the address either.
    let carol = online_as(&relay, "carol", &k).await;
    bob.close().await;
    let (offline, last_seen) = next_status(&mut alice, "bob").await;
    assert!(!offline && last_seen.is_some());
    let frames = alice.until_synced().await;
    assert!(statuses_for(&frames, &address).is_empty(), "{frames:?}");
    assert_eq!(check(&mut alice, &address).await, (true, None));

    // Carol leaving is.
    carol.close().await;
    let (online, last_seen) = next_status(&mut alice, &address).await;
    assert!(!online && last_seen.is_some());
    assert_eq!(check(&mut alice, &address).await, (false, last_seen));

    // Bob reconnects without declaring: the address is still carol's.
    let bob = relay.online("bob").await;
    assert_eq!(next_status(&mut alice, "bob").await, (true, None));
    let frames = alice.until_synced().await;
    assert!(statuses_for(&frames, &address).is_empty(), "{frames:?}");
    // ... until he declares it on a connection of his: then the address is online again.
    bob.close().await;
    assert!(!next_status(&mut alice, "bob").await.0);
    let _bob = online_as(&relay, "bob", &k).await;
    assert_eq!(next_status(&mut alice, &address).await, (true, None));

    // Unwatched: nothing more.
    alice
        .send(&ClientFrame::UnwatchPresence {
            users: vec![address.clone()],
        })
        .await;
    alice.sync().await;
    assert_eq!(relay.stats().await.watches, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_mailbox_a_declared_address_is_reached_live_only() {
    let relay = TestRelay::start_with(|c| c.mailbox = None).await;
    let k = key(7);
    let address = k.address().to_string();
    let (mut bob, challenge) = connect(&relay, "bob").await;
    bob.send(&declaration(&k, "bob", &challenge)).await;
    assert_eq!(declaration_answer(&mut bob).await, declared(&address));
    let mut alice = relay.client().await;
    alice.authenticate("alice", true).await;
    assert_sent(
        &alice.send_and_answer(&address, "m1", "x").await,
        "m1",
        &address,
        "live",
    );
    assert_eq!(bob.received().await.seq, None);
    bob.close().await;
    relay
        .wait_stats("bob offline", |s| s.connections == 1)
        .await;
    assert_unreachable(
        &alice.send_and_answer(&address, "m2", "x").await,
        "m2",
        &address,
        "offline_no_mailbox",
    );
    let never = key(8).address().to_string();
    assert_unreachable(
        &alice.send_and_answer(&never, "m3", "x").await,
        "m3",
        &never,
        "unknown_recipient",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_database_gains_address_bindings_and_keeps_its_journal() {
    let mut relay = TestRelay::start().await;
    relay.stop().await;
    std::fs::remove_file(relay.db_path()).unwrap();
    {
        let conn = rusqlite::Connection::open(relay.db_path()).unwrap();
        conn.execute_batch(
            "CREATE TABLE accounts (
                 name TEXT PRIMARY KEY NOT NULL,
                 created_ms INTEGER NOT NULL,
                 last_seq INTEGER NOT NULL DEFAULT 0,
                 msg_count INTEGER NOT NULL DEFAULT 0,
                 byte_count INTEGER NOT NULL DEFAULT 0,
                 last_seen_ms INTEGER
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
             INSERT INTO accounts (name, created_ms, last_seq, msg_count, byte_count, last_seen_ms)
                 VALUES ('bob', 1, 3, 1, 5, 42);
             PRAGMA user_version = 2;",
        )
        .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        conn.execute(
            "INSERT INTO journal (account, seq, sender, sender_account, message_id, content, bytes,
                                  accepted_ms)
             VALUES ('bob', 3, 'carol', 'carol', 'old', 'hello', 5, ?1)",
            [now],
        )
        .unwrap();
    }
    relay.run(relay.config()).await;
    let mut alice = relay.online("alice").await;
    assert_eq!(check(&mut alice, "bob").await, (false, Some(42)));
    let k = key(9);
    let address = k.address().to_string();
    let (mut bob, challenge) = connect(&relay, "bob").await;
    bob.send(&declaration(&k, "bob", &challenge)).await;
    assert_eq!(declaration_answer(&mut bob).await, declared(&address));
    let (frames, count) = bob.drain().await;
    assert_eq!(count, 1);
    assert_eq!(
        (frames[0].seq, frames[0].message_id.as_str()),
        (Some(3), "old")
    );
    assert_sent(
        &alice.send_and_answer(&address, "new", "x").await,
        "new",
        &address,
        "live",
    );
    assert_eq!(bob.received().await.seq, Some(4), "seq carries on");
    relay.stop().await;
    let conn = rusqlite::Connection::open(relay.db_path()).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 7, "every migration since version 2 ran");
    let bound: String = conn
        .query_row(
            "SELECT account FROM addresses WHERE address = ?1",
            [&address],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(bound, "bob");
}

/// A watch on an address and a declaration of it, racing on two connections: whichever the
/// relay commits first, the watch ends up told the truth (the binding is either in the watch's
/// resolution or moves the watch afterwards).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_racing_a_declaration_ends_with_the_bound_account_s_status() {
    let relay = TestRelay::start().await;
    let mut alice = relay.online("alice").await;
    for i in 0..16u8 {
        let k = key(100 + i);
        let address = k.address().to_string();
        let account = format!("racer{i}");
        let (mut racer, challenge) = connect(&relay, &account).await;
        let frame = declaration(&k, &account, &challenge);
        let watch = ClientFrame::WatchPresence {
            users: vec![address.clone()],
        };
        let ((), ()) = tokio::join!(racer.send(&frame), alice.send(&watch));
        assert_eq!(declaration_answer(&mut racer).await, declared(&address));
        let mut seen = vec![next_status(&mut alice, &address).await.0];
        seen.extend(statuses_for(&alice.until_synced().await, &address));
        assert!(
            seen == [true] || seen == [false, true],
            "round {i}: statuses {seen:?}"
        );
        racer.close().await;
        assert!(!next_status(&mut alice, &address).await.0);
        alice
            .send(&ClientFrame::UnwatchPresence {
                users: vec![address],
            })
            .await;
    }
}

/// A frame named by address belongs to the account the address resolved to when it was
/// accepted (`docs/protocol.md#identifiers`): re-binding the address later does not move it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_frames_stay_with_the_account_the_address_named_at_acceptance() {
    let relay = TestRelay::start().await;
    let k = key(10);
    let address = k.address().to_string();
    online_as(&relay, "bob", &k).await.close().await;
    let mut alice = relay.online("alice").await;
    assert_sent(
        &alice.send_and_answer(&address, "for-bob", "x").await,
        "for-bob",
        &address,
        "stored",
    );
    let mut carol = online_as(&relay, "carol", &k).await;
    assert_sent(
        &alice.send_and_answer(&address, "for-carol", "y").await,
        "for-carol",
        &address,
        "live",
    );
    assert_eq!(carol.received().await.message_id, "for-carol");
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, count) = bob.drain().await;
    assert_eq!(count, 1);
    assert_eq!(frames[0].message_id, "for-bob");
}
