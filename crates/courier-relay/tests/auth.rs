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
    let iat = now_s();
    let unsigned = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(json!({"sub": "alice", "exp": exp, "iat": iat}).to_string())
    );
    let cases = [
        (
            "wrong secret",
            sign(
                Algorithm::HS256,
                b"not-the-secret",
                json!({"sub": "alice", "exp": exp, "iat": iat}),
            ),
            "invalid_token",
        ),
        ("alg none", unsigned, "invalid_token"),
        (
            "HS512",
            sign(
                Algorithm::HS512,
                SECRET,
                json!({"sub": "alice", "exp": exp, "iat": iat}),
            ),
            "invalid_token",
        ),
        (
            "expired",
            sign(
                Algorithm::HS256,
                SECRET,
                json!({"sub": "alice", "exp": now_s() - 5, "iat": now_s() - 60}),
            ),
            "token_expired",
        ),
        (
            "missing exp",
            sign(
                Algorithm::HS256,
                SECRET,
                json!({"sub": "alice", "iat": iat}),
            ),
            "invalid_token",
        ),
        (
            "future nbf",
            sign(
                Algorithm::HS256,
                SECRET,
                json!({"sub": "alice", "exp": exp, "iat": iat, "nbf": now_s() + 300}),
            ),
            "token_not_yet_valid",
        ),
        (
            "sub is an address",
            sign(
                Algorithm::HS256,
                SECRET,
                json!({"sub": "off1abc", "exp": exp, "iat": iat}),
            ),
            "invalid_account",
        ),
        (
            "sub with a slash",
            sign(
                Algorithm::HS256,
                SECRET,
                json!({"sub": "a/b", "exp": exp, "iat": iat}),
            ),
            "invalid_account",
        ),
        (
            "sub disguised by a bidi override",
            sign(
                Algorithm::HS256,
                SECRET,
                json!({"sub": "alice\u{202E}gnp.exe", "exp": exp, "iat": iat}),
            ),
            "invalid_account",
        ),
        (
            "sub that looks like alice with a zero-width space",
            sign(
                Algorithm::HS256,
                SECRET,
                json!({"sub": "al\u{200B}ice", "exp": exp, "iat": iat}),
            ),
            "invalid_account",
        ),
        (
            "sub in a decomposed spelling",
            sign(
                Algorithm::HS256,
                SECRET,
                json!({"sub": "zoe\u{0308}", "exp": exp, "iat": iat}),
            ),
            "invalid_account",
        ),
        (
            "missing iat",
            sign(
                Algorithm::HS256,
                SECRET,
                json!({"sub": "alice", "exp": exp}),
            ),
            "invalid_token",
        ),
        (
            "lifetime over the cap",
            sign(
                Algorithm::HS256,
                SECRET,
                json!({"sub": "alice", "exp": iat + 30 * 86_400, "iat": iat}),
            ),
            "token_lifetime_too_long",
        ),
        (
            "issued in the future",
            sign(
                Algorithm::HS256,
                SECRET,
                json!({"sub": "alice", "exp": iat + 86_400 * 400, "iat": iat + 86_400 * 399}),
            ),
            "token_not_yet_valid",
        ),
        ("garbage", "not.a.jwt".to_owned(), "invalid_token"),
    ];
    for (what, token, reason) in cases {
        let (got, ending) = relay.refused(&authenticate(&token)).await;
        assert_eq!(got, reason, "{what}");
        assert_eq!(ending, Ending::Close(4001), "{what}");
    }
    assert_eq!(
        relay.stats().await.accounts,
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
    assert_eq!(relay.stored_frames().await, 0);
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
        relay.stats().await.accounts,
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
    assert_eq!(relay.stats().await.accounts, 2);
}

/// A token signed with the relay's secret for another service (another audience or issuer
/// sharing the key) does not open a session once the relay pins both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_minted_for_another_service_is_refused_when_aud_and_iss_are_pinned() {
    let relay = TestRelay::start_with(|c| {
        c.auth.audience = Some("courier".into());
        c.auth.issuer = Some("https://auth.example".into());
    })
    .await;
    let (iat, exp) = (now_s(), now_s() + 600);
    for (what, claims) in [
        (
            "another audience",
            json!({"sub": "alice", "iat": iat, "exp": exp, "aud": "billing", "iss": "https://auth.example"}),
        ),
        (
            "another issuer",
            json!({"sub": "alice", "iat": iat, "exp": exp, "aud": "courier", "iss": "https://evil.example"}),
        ),
        ("neither", json!({"sub": "alice", "iat": iat, "exp": exp})),
    ] {
        let (reason, ending) = relay
            .refused(&authenticate(&sign(Algorithm::HS256, SECRET, claims)))
            .await;
        assert_eq!(
            (reason.as_str(), ending),
            ("invalid_token", Ending::Close(4001)),
            "{what}"
        );
    }
    let pinned = sign(
        Algorithm::HS256,
        SECRET,
        json!({"sub": "alice", "iat": iat, "exp": exp, "aud": "courier", "iss": "https://auth.example"}),
    );
    let mut c = relay.client().await;
    c.authenticate_with(&pinned, true).await;
    assert!(matches!(
        c.next_frame().await,
        RelayFrame::Authenticated { .. }
    ));
}

/// Writes `text` to `path` through a rename, as an editor or a deploy tool would.
fn replace_file(path: &std::path::Path, text: &str) {
    let staged = path.with_extension("new");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

/// A stolen token is revoked by adding its account to the deny list: the thief's live
/// connection is closed and the token no longer authenticates, with no restart; a token issued
/// after the revocation still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_refused_and_its_live_session_closed_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let deny = dir.path().join("revoked.txt");
    std::fs::write(&deny, "# nobody yet\n").unwrap();
    let relay = TestRelay::start_with(|c| {
        c.auth.revoked_tokens = Some(deny.clone());
        c.timings.revocation_poll = Duration::from_millis(20);
    })
    .await;
    let issued = now_s() - 10;
    let stolen = sign(
        Algorithm::HS256,
        SECRET,
        json!({"sub": "alice", "iat": issued, "exp": issued + 3600}),
    );
    let mut thief = relay.client().await;
    thief.authenticate_with(&stolen, true).await;
    assert!(matches!(
        thief.next_frame().await,
        RelayFrame::Authenticated { .. }
    ));
    let mut bystander = relay.online("bob").await;

    replace_file(&deny, &format!("alice {}\n", issued + 1));
    let (frames, ending) = thief.frames_until_end().await;
    assert_eq!(
        frames.last(),
        Some(&RelayFrame::AuthError {
            reason: "token_revoked".into()
        }),
        "{frames:?}"
    );
    assert_eq!(ending, Ending::Close(4001));
    // Each relay node reads the list at its own poll (docs/cluster.md#what-a-node-keeps-to-itself):
    // a node that has not read it yet lets the token in and closes the session at its next read.
    // Once read, the token is refused at Authenticate.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut again = relay.client().await;
        again.send_text(authenticate(&stolen)).await;
        let (frames, ending) = again.frames_until_end().await;
        assert_eq!(ending, Ending::Close(4001), "{frames:?}");
        assert_eq!(
            frames.last(),
            Some(&RelayFrame::AuthError {
                reason: "token_revoked".into()
            }),
            "{frames:?}"
        );
        if frames.len() == 1 {
            break;
        }
        assert!(
            cluster_mode(),
            "one relay refuses at Authenticate: {frames:?}"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no node refused the revoked token at Authenticate"
        );
    }

    // A fresh token is issued after the revocation time and works; others are untouched.
    let mut owner = relay.online("alice").await;
    assert_sent(
        &bystander.send_and_answer("alice", "m1", "still here").await,
        "m1",
        "alice",
        "live",
    );
    assert_eq!(owner.received().await.content, "still here");
}

/// A malformed deny list stops the relay from starting, and a malformed edit leaves the list
/// in force: a half-written file must not lift revocations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_deny_list_edit_does_not_lift_revocations() {
    let dir = tempfile::tempdir().unwrap();
    let deny = dir.path().join("revoked.txt");
    std::fs::write(&deny, "alice not-a-time\n").unwrap();
    let mut config = courier_relay::RelayConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        courier_relay::Storage::Memory,
        SECRET.to_vec(),
    );
    config.auth.revoked_tokens = Some(deny.clone());
    let refused = courier_relay::start(config).await.err().expect("refused");
    assert!(refused.to_string().contains("line 1"), "{refused}");

    let revoked_at = now_s() + 3600;
    std::fs::write(&deny, format!("alice {revoked_at}\n")).unwrap();
    let relay = TestRelay::start_with(|c| {
        c.auth.revoked_tokens = Some(deny.clone());
        c.timings.revocation_poll = Duration::from_millis(20);
    })
    .await;
    replace_file(&deny, "alice");
    // The next good edit is applied, so the broken one was read and set aside by then.
    replace_file(&deny, &format!("alice {revoked_at}\nbob {revoked_at}\n"));
    let bob = token("bob");
    let refused_bob = within(async {
        loop {
            let mut c = relay.client().await;
            c.authenticate_with(&bob, true).await;
            match c.next_frame().await {
                RelayFrame::AuthError { reason } if reason == "token_revoked" => break,
                _ => c.close().await,
            }
        }
    })
    .await;
    assert!(refused_bob.is_some(), "the good edit was applied");
    let (reason, _) = relay.refused(&authenticate(&token("alice"))).await;
    assert_eq!(reason, "token_revoked");
}

/// The first frame a fresh connection gets for `token`.
async fn answer_to(relay: &TestRelay, token: &str) -> RelayFrame {
    let mut c = relay.client().await;
    c.authenticate_with(token, true).await;
    let frame = c.next_frame().await;
    c.close().await;
    frame
}

fn auth_error(reason: &str) -> RelayFrame {
    RelayFrame::AuthError {
        reason: reason.into(),
    }
}

/// One address guessing tokens is cut off after its burst, valid token or not, so it can
/// neither brute-force a token nor spend the relay's MAC checks without end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_guessing_tokens_is_refused_past_its_attempt_limit() {
    let relay = TestRelay::start_with(|c| {
        c.auth.limit_loopback = true;
        c.auth.attempts_per_source = courier_relay::AttemptLimit {
            burst: 3,
            per_minute: 1,
        };
    })
    .await;
    let forged = sign(
        Algorithm::HS256,
        b"a guess at the secret, 32 bytes long",
        json!({"sub": "alice", "iat": now_s(), "exp": now_s() + 60}),
    );
    for _ in 0..3 {
        assert_eq!(
            answer_to(&relay, &forged).await,
            auth_error("invalid_token")
        );
    }
    let (reason, ending) = relay.refused(&authenticate(&forged)).await;
    assert_eq!(
        (reason.as_str(), ending),
        ("too_many_attempts", Ending::Close(4001))
    );
    assert_eq!(
        answer_to(&relay, &token("alice")).await,
        auth_error("too_many_attempts"),
        "a valid token from the same source waits too"
    );
}

/// Loopback clients are not limited per source unless the operator asks: behind a proxy on the
/// same host, they are every client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_clients_are_not_limited_per_source_by_default() {
    let relay = TestRelay::start_with(|c| {
        c.auth.attempts_per_source = courier_relay::AttemptLimit {
            burst: 1,
            per_minute: 1,
        };
    })
    .await;
    for account in ["a", "b", "c"] {
        assert!(matches!(
            answer_to(&relay, &token(account)).await,
            RelayFrame::Authenticated { .. }
        ));
    }
}

/// A leaked token replayed in a loop is cut off after the account's burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_token_is_refused_past_the_account_login_limit() {
    let relay = TestRelay::start_with(|c| {
        c.auth.attempts_per_account = courier_relay::AttemptLimit {
            burst: 2,
            per_minute: 1,
        };
    })
    .await;
    let leaked = token("alice");
    for _ in 0..2 {
        assert!(matches!(
            answer_to(&relay, &leaked).await,
            RelayFrame::Authenticated { .. }
        ));
    }
    assert_eq!(
        answer_to(&relay, &leaked).await,
        auth_error("too_many_logins")
    );
    assert!(
        matches!(
            answer_to(&relay, &token("bob")).await,
            RelayFrame::Authenticated { .. }
        ),
        "other accounts are not affected"
    );
}

/// Someone holding a copy of the owner's token cannot keep kicking the owner off: past the
/// displacement limit the new login is refused and the connection in place stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_token_cannot_keep_displacing_the_owner() {
    let relay = TestRelay::start_with(|c| {
        c.auth.supersedes_per_account = courier_relay::AttemptLimit {
            burst: 2,
            per_minute: 1,
        };
    })
    .await;
    let mut current = relay.online("alice").await;
    for _ in 0..2 {
        let next = relay.online("alice").await;
        let (frames, ending) = current.frames_until_end().await;
        assert_eq!(
            frames.last(),
            Some(&RelayFrame::SessionSuperseded {
                reason: "new_session".into()
            })
        );
        assert_eq!(ending, Ending::Close(4000));
        current = next;
    }
    let (reason, ending) = relay.refused(&authenticate(&token("alice"))).await;
    assert_eq!(
        (reason.as_str(), ending),
        ("too_many_displacements", Ending::Close(4001))
    );
    // The connection in place was not displaced: it still gets its messages.
    let mut bob = relay.online("bob").await;
    assert_sent(
        &bob.send_and_answer("alice", "m1", "hi").await,
        "m1",
        "alice",
        "live",
    );
    assert_eq!(current.received().await.content, "hi");
}

/// A relay never runs with a secret short enough to guess, and never prints it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_secret_is_refused_and_no_secret_is_printed() {
    for short in [&b""[..], b"k", b"secret", &SECRET[..31]] {
        let config = courier_relay::RelayConfig::new(
            "127.0.0.1:0".parse().unwrap(),
            courier_relay::Storage::Memory,
            short.to_vec(),
        );
        let refused = courier_relay::start(config).await.err().expect("refused");
        assert!(refused.to_string().contains("32 bytes"), "{refused}");
    }
    let config = courier_relay::RelayConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        courier_relay::Storage::Memory,
        SECRET.to_vec(),
    );
    let printed = format!("{config:?} {config:#?}");
    assert!(
        !printed.contains(std::str::from_utf8(SECRET).unwrap()),
        "{printed}"
    );
    assert!(!printed.contains(&format!("{:?}", SECRET.to_vec())));
}
