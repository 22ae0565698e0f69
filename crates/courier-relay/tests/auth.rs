//! Authentication (`docs/protocol.md#authentication`; conformance in
//! `docs/protocol.md#transport-and-authentication`).

mod common;

use std::time::Duration;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use common::*;
use courier_proto::RelayFrame;
use futures_util::SinkExt;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn sign(alg: Algorithm, secret: &[u8], claims: serde_json::Value) -> String {
    jsonwebtoken::encode(
        &Header::new(alg),
        &claims,
        &EncodingKey::from_secret(secret).unwrap(),
    )
    .unwrap()
}

fn authenticate(token: &str) -> String {
    json!({"type": "Authenticate", "token": token}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_refused_with_4001() {
    let relay = TestRelay::start().await;
    let exp = now_s() + 600;
    let unsigned = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(json!({"sub": "alice", "exp": exp}).to_string())
    );
    let cases = [
        (
            "wrong secret",
            sign(
                Algorithm::HS256,
                b"not-the-secret",
                json!({"sub": "alice", "exp": exp}),
            ),
            "invalid_token",
        ),
        ("alg none", unsigned, "invalid_token"),
        (
            "HS512",
            sign(
                Algorithm::HS512,
                SECRET,
                json!({"sub": "alice", "exp": exp}),
            ),
            "invalid_token",
        ),
        (
            "expired",
            sign(
                Algorithm::HS256,
                SECRET,
                json!({"sub": "alice", "exp": now_s() - 5}),
            ),
            "token_expired",
        ),
        (
            "missing exp",
            sign(Algorithm::HS256, SECRET, json!({"sub": "alice"})),
            "invalid_token",
        ),
        (
            "future nbf",
            sign(
                Algorithm::HS256,
                SECRET,
                json!({"sub": "alice", "exp": exp, "nbf": now_s() + 300}),
            ),
            "token_not_yet_valid",
        ),
        (
            "sub is an address",
            sign(
                Algorithm::HS256,
                SECRET,
                json!({"sub": "off1abc", "exp": exp}),
            ),
            "invalid_account",
        ),
        (
            "sub with a slash",
            sign(Algorithm::HS256, SECRET, json!({"sub": "a/b", "exp": exp})),
            "invalid_account",
        ),
        ("garbage", "not.a.jwt".to_owned(), "invalid_token"),
    ];
    for (what, token, reason) in cases {
        let (got, ending) = relay.refused(&authenticate(&token)).await;
        assert_eq!(got, reason, "{what}");
        assert_eq!(ending, Ending::Close(4001), "{what}");
    }
    assert_eq!(
        relay.handle().stats().accounts,
        0,
        "no refused token creates an account"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_frame_other_than_authenticate_is_refused_and_has_no_effect() {
    let relay = TestRelay::start().await;
    relay.register("bob").await;
    let send =
        json!({"type": "SendMessage", "recipient": "bob", "content": "x", "message_id": "m1"})
            .to_string();
    for first in [
        send.as_str(),
        "not json",
        "[1,2]",
        r#"{"type":"Nope"}"#,
        r#"{"type":"Authenticate"}"#,
    ] {
        let (reason, ending) = relay.refused(first).await;
        let expected = if first == r#"{"type":"Authenticate"}"# {
            "invalid_token"
        } else {
            "not_authenticated"
        };
        assert_eq!(reason, expected, "{first}");
        assert_eq!(ending, Ending::Close(4001), "{first}");
    }
    // A binary first message is malformed, hence refused the same way.
    let mut c = relay.client().await;
    c.ws.send(tokio_tungstenite::tungstenite::Message::binary(vec![
        1u8, 2, 3,
    ]))
    .await
    .unwrap();
    let (frames, ending) = c.frames_until_end().await;
    assert_eq!(
        frames,
        vec![RelayFrame::AuthError {
            reason: "not_authenticated".into()
        }]
    );
    assert_eq!(ending, Ending::Close(4001));

    // The SendMessage sent as a first frame reached nobody.
    let bob = relay.online("bob").await;
    bob.close().await;
    assert_eq!(relay.stored_frames(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_authenticate_within_the_deadline_times_out() {
    let relay =
        TestRelay::start_with(|c| c.timings.auth_timeout = Duration::from_millis(300)).await;
    let mut c = relay.client().await;
    let (frames, ending) = c.frames_until_end().await;
    assert_eq!(
        frames,
        vec![RelayFrame::AuthError {
            reason: "auth_timeout".into()
        }]
    );
    assert_eq!(ending, Ending::Close(4001));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_token_yields_authenticated() {
    let relay = TestRelay::start().await;
    let mut challenges = Vec::new();
    for _ in 0..2 {
        let mut c = relay.client().await;
        let frame = c.authenticate("alice", true).await;
        let RelayFrame::Authenticated {
            user_id,
            username,
            capabilities,
            address_challenge,
            rate_limit,
            mailbox,
        } = frame
        else {
            unreachable!()
        };
        assert_eq!(user_id, "alice");
        assert_eq!(username, "alice");
        // What is implemented, and nothing else.
        assert_eq!(
            capabilities,
            vec![
                "address_routing_v1".to_owned(),
                "mailbox_v1".to_owned(),
                "presence_watch_v1".to_owned(),
                "key_directory_v1".to_owned(),
                "group_delivery_v3".to_owned()
            ]
        );
        let challenge = address_challenge.expect("a challenge");
        assert_eq!(challenge.len(), 44);
        assert_eq!(STANDARD.decode(&challenge).unwrap().len(), 32);
        challenges.push(challenge);
        let rate = rate_limit.expect("rate_limit");
        assert_eq!((rate.burst, rate.per_sec), (2000, 1000));
        let mailbox = mailbox.expect("mailbox");
        assert_eq!(
            (mailbox.max_messages, mailbox.max_bytes, mailbox.ttl_ms),
            (10_000, 67_108_864, 604_800_000)
        );
        c.close().await;
    }
    assert_ne!(
        challenges[0], challenges[1],
        "the challenge is fresh per connection"
    );
    assert_eq!(
        relay.handle().stats().accounts,
        1,
        "the account is persisted once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_authenticate_is_answered_and_ignored() {
    let relay = TestRelay::start().await;
    let mut c = relay.online("alice").await;
    c.authenticate_with(&token("mallory"), true).await;
    assert_eq!(
        c.next_frame().await,
        RelayFrame::error("already_authenticated", Some("Authenticate"))
    );
    // Still alice: a message to alice arrives on this connection.
    let mut bob = relay.online("bob").await;
    assert_sent(
        &bob.send_and_answer("alice", "m1", "hi").await,
        "m1",
        "alice",
        "live",
    );
    assert_eq!(c.received().await.sender, "bob");
    assert_eq!(relay.handle().stats().accounts, 2);
}
