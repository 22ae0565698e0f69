//! The relay token over a long-lived client's life (`docs/protocol.md#reconnection`): a refused
//! token is a typed `auth_failed` event; a provider is asked at every connect, so an expired
//! token is replaced without the application stepping in; `setAuthToken` ends the wait after a
//! refusal; `reconnect()` drops a connection and dials again at once.

mod support;

use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use courier_client::app::{App, AppCarrierSend};
use courier_client::client::{Client, SendInput};
use courier_client::config::parse_protocol_config;
use courier_client::event::ClientEvent;
use courier_engine::{Event, HookBatch};
use courier_relay::{RelayConfig, Storage};
use serde_json::json;
use support::{connected, engine, wait_for};

const SECRET: &[u8] = b"auth-token-secret, padded to 32 bytes or more";

/// A token for `account` that expired a minute ago.
fn expired(account: &str) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({ "sub": account, "iat": now - 120, "exp": now - 60 }),
        &jsonwebtoken::EncodingKey::from_secret(SECRET).unwrap(),
    )
    .unwrap()
}

fn valid(account: &str) -> String {
    courier_relay::issue_token(SECRET, account, 3600).unwrap()
}

async fn start_relay() -> courier_relay::RelayHandle {
    let config = RelayConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        Storage::Memory,
        SECRET.to_vec(),
    );
    courier_relay::start(config).await.unwrap()
}

fn config(
    dir: &std::path::Path,
    name: &str,
    url: &str,
    token: serde_json::Value,
) -> serde_json::Value {
    json!({
        "appId": "tokens",
        "storage": { "path": dir.join(format!("{name}.db")) },
        "encryption": { "enabled": false },
        "transports": { "internet": { "url": url, "authToken": token } },
    })
}

/// An application whose `authToken` is a provider: each request goes to the test, which
/// answers it through the client; everything else is [`support::Events`].
struct Provider<F> {
    events: support::Events<F>,
    requests: mpsc::Sender<u64>,
}

impl<F: FnMut(ClientEvent) + Send + 'static> App for Provider<F> {
    fn event(&mut self, event: ClientEvent) {
        self.events.event(event);
    }

    fn hook_batch(&mut self, batch: HookBatch) {
        self.events.hook_batch(batch);
    }

    fn app_carrier_send(&mut self, send: AppCarrierSend) {
        self.events.app_carrier_send(send);
    }

    fn auth_token_wanted(&mut self, request: u64) {
        let _ = self.requests.send(request);
    }
}

/// The next token request, within 10 s.
async fn next_request(requests: &mpsc::Receiver<u64>) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(request) = requests.try_recv() {
            return request;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for a token request"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn auth_failed(e: &ClientEvent) -> Option<(String, Option<String>, u64)> {
    match e {
        ClientEvent::AuthFailed {
            reason,
            message,
            retry_in_ms,
        } => Some((reason.clone(), message.clone(), *retry_in_ms)),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_replaces_an_expired_token_without_the_app_stepping_in() {
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay().await;
    let parsed =
        parse_protocol_config(&config(dir.path(), "alice", &relay.url(), json!(true))).unwrap();
    let (events_tx, events) = mpsc::channel();
    let (requests_tx, requests) = mpsc::channel();
    let app = Provider {
        events: support::Events(move |e| {
            let _ = events_tx.send(e);
        }),
        requests: requests_tx,
    };
    let alice = Client::start(&parsed, app, &tokio::runtime::Handle::current()).unwrap();

    // The first token the provider finds has expired: the relay says so, typed.
    let first = next_request(&requests).await;
    alice.auth_token_provided(first, Ok(expired("alice")));
    let failed = wait_for(&events, "auth_failed", |e| auth_failed(e).is_some()).await;
    let (reason, message, retry_in_ms) = auth_failed(&failed).unwrap();
    assert_eq!(reason, "token_expired");
    assert_eq!(message, None);
    assert!(
        retry_in_ms < 30_000,
        "a provider's next token comes after backoff, not 30 s"
    );

    // The next connect asks again, and a fresh token gets it in.
    let second = next_request(&requests).await;
    assert_ne!(first, second);
    alice.auth_token_provided(second, Ok(valid("alice")));
    wait_for(&events, "alice online", connected).await;

    // Every connect asks: a reconnect presents a new token, and nothing fails.
    alice.reconnect();
    let third = next_request(&requests).await;
    alice.auth_token_provided(third, Ok(valid("alice")));
    wait_for(&events, "alice online again", connected).await;
    // An answer nobody waits for any more is dropped.
    alice.auth_token_provided(first, Ok(valid("alice")));

    // A provider with no token: typed, with its message, and asked again after backoff.
    alice.reconnect();
    let fourth = next_request(&requests).await;
    alice.auth_token_provided(fourth, Err("the identity provider is down".into()));
    let failed = wait_for(&events, "auth_failed", |e| auth_failed(e).is_some()).await;
    let (reason, message, _) = auth_failed(&failed).unwrap();
    assert_eq!(reason, "token_unavailable");
    assert_eq!(message.as_deref(), Some("the identity provider is down"));
    let fifth = next_request(&requests).await;
    alice.auth_token_provided(fifth, Ok(String::new()));
    let failed = wait_for(&events, "auth_failed", |e| auth_failed(e).is_some()).await;
    assert_eq!(
        auth_failed(&failed).unwrap().1.as_deref(),
        Some("the token provider returned an empty token")
    );
    let sixth = next_request(&requests).await;
    alice.auth_token_provided(sixth, Ok(valid("alice")));
    wait_for(&events, "alice online at last", connected).await;

    let err = alice.set_auth_token(&valid("alice")).unwrap_err();
    assert_eq!(err.code(), "ERR_INVALID_ARGUMENT");
    alice.stop().await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_fixed_token_ends_the_wait_after_a_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay().await;
    let url = relay.url();
    let (alice, events) = support::start(
        &parse_protocol_config(&config(dir.path(), "alice", &url, json!(expired("alice"))))
            .unwrap(),
    );
    let failed = wait_for(&events, "auth_failed", |e| auth_failed(e).is_some()).await;
    assert_eq!(
        auth_failed(&failed).unwrap(),
        ("token_expired".to_owned(), None, 30_000),
        "a fixed token is not presented again for 30 s"
    );
    assert_eq!(
        alice.set_auth_token("  ").unwrap_err().code(),
        "ERR_INVALID_ARGUMENT"
    );
    // Well within the 30 s: the new token cuts the wait short (`wait_for` gives up after 10 s).
    alice.set_auth_token(&valid("alice")).unwrap();
    wait_for(&events, "alice online", connected).await;

    let (bob, bob_events) = support::start(
        &parse_protocol_config(&config(dir.path(), "bob", &url, json!(valid("bob")))).unwrap(),
    );
    wait_for(&bob_events, "bob online", connected).await;
    let id = alice
        .send(SendInput {
            recipient: "bob".into(),
            content: "after the refusal".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_for(&events, "delivered", |e| {
        matches!(engine(e), Some(Event::MessageDelivered { message_id, .. }) if *message_id == id)
    })
    .await;
    alice.stop().await;
    bob.stop().await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_relay_there_is_no_token_to_set() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, _events) = support::start(
        &parse_protocol_config(&json!({
            "appId": "tokens",
            "storage": { "path": dir.path().join("alice.db") },
        }))
        .unwrap(),
    );
    assert_eq!(
        alice.set_auth_token(&valid("alice")).unwrap_err().code(),
        "ERR_INVALID_ARGUMENT"
    );
    // Nothing to drop or dial: a no-op.
    alice.reconnect();
    alice.stop().await;
}

/// Waits for `alice` to connect, then gives the offline hint and waits for the disconnect.
async fn online_then_offline_hint(alice: &Client, events: &mpsc::Receiver<ClientEvent>) {
    wait_for(events, "alice online", connected).await;
    alice.internet_status_changed(false);
    wait_for(events, "alice offline", |e| {
        matches!(
            e,
            ClientEvent::RelayStatusChanged {
                connected: false,
                ..
            }
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_hint_is_not_for_good_and_reconnect_dials_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay().await;
    let (alice, events) = support::start(
        &parse_protocol_config(&config(
            dir.path(),
            "alice",
            &relay.url(),
            json!(valid("alice")),
        ))
        .unwrap(),
    );
    online_then_offline_hint(&alice, &events).await;
    // No `true` hint: `reconnect()` alone brings the connection back at once.
    alice.reconnect();
    wait_for(&events, "alice online again", connected).await;
    alice.stop().await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_offline_hint_the_carrier_dials_again_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay().await;
    let mut config = parse_protocol_config(&config(
        dir.path(),
        "alice",
        &relay.url(),
        json!(valid("alice")),
    ))
    .unwrap();
    assert_eq!(
        config.internet.as_ref().unwrap().offline_redial,
        courier_client::config::OFFLINE_REDIAL
    );
    // The 60 s pause, shortened: what is under test is that it ends without any call.
    config.internet.as_mut().unwrap().offline_redial = Duration::from_millis(300);
    let (alice, events) = support::start(&config);
    online_then_offline_hint(&alice, &events).await;
    wait_for(&events, "alice online with no hint", connected).await;
    alice.stop().await;
    relay.stop().await;
}
