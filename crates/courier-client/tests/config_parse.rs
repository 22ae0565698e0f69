//! `new Protocol(config)` validation: defaults, presets, every rule with its error path.

use std::path::PathBuf;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use courier_client::config::{
    parse_protocol_config, AuthToken, ConfigError, LogLevel, ProtocolConfig, StorageConfig,
    PLAINTEXT_WARNING,
};
use courier_client::driver::connections::UnknownSenders;
use courier_engine::Config;
use serde_json::{json, Value};

fn base() -> Value {
    json!({ "appId": "chat", "storage": { "path": "alice.db" } })
}

/// `base()` with `patch` merged in (objects merged recursively, other values replaced).
fn with(patch: Value) -> Value {
    let mut v = base();
    merge(&mut v, patch);
    v
}

fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k).or_insert(Value::Null), v);
            }
        }
        (t, p) => *t = p,
    }
}

/// The engine config of a config that sets nothing: the engine's defaults, sessions required.
fn defaults() -> Config {
    Config {
        encryption: true,
        ..Config::new("chat")
    }
}

fn ok(v: Value) -> ProtocolConfig {
    parse_protocol_config(&v).unwrap_or_else(|e| panic!("{v} was refused: {e}"))
}

fn err(v: Value) -> ConfigError {
    match parse_protocol_config(&v) {
        Ok(c) => panic!("{v} was accepted: {c:?}"),
        Err(e) => e,
    }
}

/// Asserts the error's path and that its message contains `message`.
#[track_caller]
fn refused(v: Value, path: &str, message: &str) {
    let e = err(v);
    assert_eq!(e.path, path, "{e}");
    assert!(
        e.message.contains(message),
        "{e:?} should contain {message:?}"
    );
    assert_eq!(e.to_string(), format!("{} {}", e.path, e.message));
}

/// A real self-signed certificate, as PEM.
fn test_pem() -> String {
    rcgen::generate_simple_self_signed(vec!["relay.internal".to_owned()])
        .unwrap()
        .cert
        .pem()
}

fn jwt(claims: Value) -> String {
    format!(
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.{}.c2lnbmF0dXJl",
        URL_SAFE_NO_PAD.encode(claims.to_string())
    )
}

fn internet(url: &str) -> Value {
    with(
        json!({ "transports": { "internet": { "url": url, "authToken": jwt(json!({"sub": "alice"})) } } }),
    )
}

#[test]
fn minimal_config_gets_every_default() {
    let c = ok(base());
    assert_eq!(c.app_id, "chat");
    assert_eq!(c.storage, StorageConfig::Path(PathBuf::from("alice.db")));
    assert_eq!(c.internet, None);
    assert_eq!(c.engine, defaults());
    assert!(!c.has_durability_hook);
    assert_eq!(c.inbound_durability_hook_timeout_ms, 30_000);
    assert_eq!(c.log_level, LogLevel::Warn);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);

    let e = &c.engine;
    assert_eq!(e.ack_timeout_ms, 10_000);
    assert_eq!(e.max_pending_acks, 1000);
    assert_eq!(e.max_retries, 10);
    assert_eq!(e.initial_delay_ms, 1000);
    assert_eq!(e.max_delay_ms, 300_000);
    assert_eq!(e.backoff_multiplier, 2.0);
    assert_eq!(e.outbox_max_lifetime_ms, 604_800_000);
    assert!(!e.edge_driven_unreachable_dm);
}

#[test]
fn the_api_example_parses() {
    let c = ok(json!({
        "appId": "chat",
        "storage": { "path": "alice.db" },
        "transports": { "internet": { "url": "ws://127.0.0.1:43127", "authToken": jwt(json!({"sub": "alice", "exp": 1_900_000_000})) } },
        "reliability": { "ack": { "defaultTimeoutMs": 5000 }, "retry": { "maxRetries": 5 } },
    }));
    let i = c.internet.as_ref().unwrap();
    assert_eq!(i.urls, ["ws://127.0.0.1:43127"]);
    assert!(i.auto_reconnect && i.host_is_loopback && !i.tls);
    assert_eq!(i.ca_certificates, None);
    assert_eq!(c.engine.ack_timeout_ms, 5000);
    assert_eq!(c.engine.max_retries, 5);
    // The token never shows in debug output.
    let AuthToken::Fixed(token) = &i.auth_token else {
        panic!("a string is a fixed token");
    };
    assert!(!format!("{c:?}").contains(token.as_str()));
}

// The three presets of `docs/delivery.md#presets`, exactly as written.

#[test]
fn preset_high_reliability() {
    let c = ok(with(json!({ "reliability": {
        "ack": { "defaultTimeoutMs": 15000 },
        "retry": { "maxRetries": 20, "outboxMaxLifetimeMs": 2_592_000_000u64 },
    }})));
    assert_eq!(c.engine.ack_timeout_ms, 15_000);
    assert_eq!(c.engine.max_retries, 20);
    assert_eq!(c.engine.outbox_max_lifetime_ms, 2_592_000_000);
    assert_eq!(c.engine.initial_delay_ms, 1000);
    // 4 × 30 days is beyond the 30-day control-frame freshness window.
    assert_eq!(c.warnings.len(), 1);
    assert!(
        c.warnings[0].contains("4 × outboxMaxLifetimeMs exceeds 30 days"),
        "{:?}",
        c.warnings
    );
}

#[test]
fn preset_low_latency() {
    let c = ok(with(json!({ "reliability": {
        "ack": { "defaultTimeoutMs": 5000 },
        "retry": { "maxRetries": 5, "maxDelayMs": 10000 },
    }})));
    assert_eq!(c.engine.ack_timeout_ms, 5000);
    assert_eq!(c.engine.max_retries, 5);
    assert_eq!(c.engine.max_delay_ms, 10_000);
    assert!(c.warnings.is_empty());
}

#[test]
fn preset_battery_constrained() {
    let c = ok(with(json!({ "reliability": {
        "retry": { "maxRetries": 3, "initialDelayMs": 5000, "maxDelayMs": 60000 },
    }})));
    assert_eq!(c.engine.max_retries, 3);
    assert_eq!(c.engine.initial_delay_ms, 5000);
    assert_eq!(c.engine.max_delay_ms, 60_000);
}

#[test]
fn the_full_reliability_example_parses() {
    let c = ok(with(json!({ "reliability": {
        "ack": { "defaultTimeoutMs": 10000, "maxPendingAcks": 1000 },
        "retry": {
            "maxRetries": 10, "initialDelayMs": 1000, "maxDelayMs": 300000, "backoffMultiplier": 2.0,
            "outboxMaxLifetimeMs": 604800000,
        },
    }})));
    assert_eq!(c.engine, defaults());
}

#[test]
fn every_option_set() {
    let pem = test_pem();
    let pem = pem.as_str();
    let seal_key = base64::engine::general_purpose::STANDARD.encode([9u8; 32]);
    let c = ok(json!({
        "appId": "field-ops",
        "storage": { "memory": true, "identitySealKey": seal_key },
        "transports": {
            "internet": {
                "url": "wss://relay.example.com:8443/ws?x=1",
                "authToken": jwt(json!({"sub": "medic-7"})),
                "tls": { "caCertificates": pem },
                "autoReconnect": false,
            },
            "gateway": { "address": "[::1]:4300" },
        },
        "reliability": {
            "ack": { "defaultTimeoutMs": 1, "maxPendingAcks": 1 },
            "retry": {
                "maxRetries": 0, "initialDelayMs": 7, "maxDelayMs": 7, "backoffMultiplier": 1,
                "outboxMaxLifetimeMs": 1,
            },
            "edgeDrivenUnreachableDm": true,
        },
        "inboundDurabilityHook": true,
        "inboundDurabilityHookTimeoutMs": 1234,
        "logLevel": "trace",
        "acceptLegacyControlV1": true,
    }));
    assert_eq!(c.storage, StorageConfig::Memory);
    assert_eq!(*c.identity_seal_key.as_ref().unwrap().bytes(), [9u8; 32]);
    assert_eq!(c.gateway.as_ref().unwrap().address, "[::1]:4300");
    let i = c.internet.as_ref().unwrap();
    assert!(i.tls && !i.host_is_loopback && !i.auto_reconnect);
    assert_eq!(i.ca_certificates.as_deref(), Some(pem));
    let e = &c.engine;
    assert_eq!(e.app_id, "field-ops");
    assert_eq!((e.ack_timeout_ms, e.max_pending_acks), (1, 1));
    assert_eq!(
        (e.max_retries, e.initial_delay_ms, e.max_delay_ms),
        (0, 7, 7)
    );
    assert_eq!(e.backoff_multiplier, 1.0);
    assert_eq!(e.outbox_max_lifetime_ms, 1);
    assert!(e.edge_driven_unreachable_dm);
    assert!(e.accept_legacy_control_v1);
    // Untouched engine fields keep their defaults.
    let d = Config::new("field-ops");
    assert_eq!(
        (
            e.outbox_max_entries,
            e.outbox_max_media_entries,
            e.flush_batch,
            e.dedup_max_entries
        ),
        (
            d.outbox_max_entries,
            d.outbox_max_media_entries,
            d.flush_batch,
            d.dedup_max_entries
        )
    );
    assert!(c.has_durability_hook);
    assert_eq!(c.inbound_durability_hook_timeout_ms, 1234);
    assert_eq!(c.log_level, LogLevel::Trace);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn log_levels() {
    for (s, l) in [
        ("error", LogLevel::Error),
        ("warn", LogLevel::Warn),
        ("info", LogLevel::Info),
        ("debug", LogLevel::Debug),
        ("trace", LogLevel::Trace),
    ] {
        assert_eq!(ok(with(json!({ "logLevel": s }))).log_level, l);
        assert_eq!(l.as_str(), s);
    }
    refused(
        with(json!({ "logLevel": "verbose" })),
        "logLevel",
        "must be one of",
    );
    refused(
        with(json!({ "logLevel": "WARN" })),
        "logLevel",
        "must be one of",
    );
    refused(
        with(json!({ "logLevel": 3 })),
        "logLevel",
        "must be a string",
    );
}

// ---- shape and unknown keys ----

#[test]
fn the_config_must_be_an_object() {
    for v in [json!(null), json!("chat"), json!([]), json!(1)] {
        let e = err(v);
        assert_eq!(e.to_string(), "config must be an object");
    }
}

#[test]
fn unknown_keys_are_errors_at_every_depth() {
    refused(
        with(json!({ "appName": "x" })),
        "appName",
        "is not a known option",
    );
    refused(
        with(json!({ "storage": { "dir": "x" } })),
        "storage.dir",
        "is not a known option",
    );
    let e = err(internet_with(json!({ "foo": 1 })));
    assert_eq!(
        e.to_string(),
        "transports.internet.foo is not a known option"
    );
    refused(
        with(json!({ "transports": { "ble": {} } })),
        "transports.ble",
        "is not a known option",
    );
    refused(
        internet_with(json!({ "tls": { "cert": "x" } })),
        "transports.internet.tls.cert",
        "is not a known option",
    );
    refused(
        with(json!({ "reliability": { "retry": { "maxRetry": 3 } } })),
        "reliability.retry.maxRetry",
        "is not a known option",
    );
    refused(
        with(json!({ "reliability": { "ack": { "timeoutMs": 3 } } })),
        "reliability.ack.timeoutMs",
        "is not a known option",
    );
    refused(
        with(json!({ "reliability": { "backoff": 3 } })),
        "reliability.backoff",
        "is not a known option",
    );
    // An unknown key wins over a missing required one: the typo is the real problem.
    refused(
        json!({ "appID": "chat", "storage": { "memory": true } }),
        "appID",
        "did you mean appId?",
    );
}

#[test]
fn sections_must_be_objects() {
    for key in ["storage", "transports", "reliability"] {
        refused(with(json!({ key: "x" })), key, "must be an object");
    }
    refused(
        with(json!({ "transports": { "internet": "wss://x" } })),
        "transports.internet",
        "must be an object",
    );
    refused(
        with(json!({ "reliability": { "ack": 5 } })),
        "reliability.ack",
        "must be an object",
    );
    refused(
        with(json!({ "reliability": { "retry": [] } })),
        "reliability.retry",
        "must be an object",
    );
    refused(
        internet_with(json!({ "tls": "pem" })),
        "transports.internet.tls",
        "must be an object",
    );
}

#[test]
fn null_is_the_same_as_absent() {
    let c = ok(with(json!({
        "transports": null,
        "reliability": { "ack": null, "retry": { "maxRetries": null } },
        "logLevel": null,
        "inboundDurabilityHook": null,
    })));
    assert_eq!(c.engine, defaults());
    assert!(!c.has_durability_hook);
    refused(
        json!({ "appId": null, "storage": { "memory": true } }),
        "appId",
        "is required",
    );
}

// ---- appId ----

#[test]
fn app_id_rules() {
    refused(
        json!({ "storage": { "memory": true } }),
        "appId",
        "is required",
    );
    refused(with(json!({ "appId": 7 })), "appId", "must be a string");
    refused(with(json!({ "appId": "" })), "appId", "is empty");
    refused(with(json!({ "appId": "a/b" })), "appId", "contains");
    refused(
        with(json!({ "appId": "a\nb" })),
        "appId",
        "control character",
    );
    refused(with(json!({ "appId": ".." })), "appId", "'.'");
    refused(
        with(json!({ "appId": "x".repeat(257) })),
        "appId",
        "longer than 256 bytes",
    );
    assert_eq!(
        ok(with(json!({ "appId": "x".repeat(256) }))).app_id.len(),
        256
    );
}

// ---- storage ----

#[test]
fn storage_rules() {
    refused(json!({ "appId": "chat" }), "storage", "is required");
    refused(
        with(json!({ "storage": { "path": null } })),
        "storage",
        "exactly one of path or memory",
    );
    refused(
        with(json!({ "storage": { "path": "a.db", "memory": true } })),
        "storage",
        "exactly one of path or memory",
    );
    refused(
        json!({ "appId": "chat", "storage": {} }),
        "storage",
        "exactly one of path or memory",
    );
    refused(
        json!({ "appId": "chat", "storage": { "memory": false } }),
        "storage.memory",
        "must be true",
    );
    refused(
        json!({ "appId": "chat", "storage": { "memory": "true" } }),
        "storage.memory",
        "must be true",
    );
    refused(
        with(json!({ "storage": { "path": 5 } })),
        "storage.path",
        "must be a string",
    );
    refused(
        with(json!({ "storage": { "path": "" } })),
        "storage.path",
        "non-empty",
    );
    assert_eq!(
        ok(json!({ "appId": "chat", "storage": { "memory": true } })).storage,
        StorageConfig::Memory
    );
}

// ---- transports.internet ----

fn internet_with(extra: Value) -> Value {
    let mut v = internet("wss://relay.example.com");
    merge(&mut v, json!({ "transports": { "internet": extra } }));
    v
}

#[test]
fn wss_is_accepted_for_any_host() {
    for url in [
        "wss://relay.example.com",
        "wss://relay.example.com/",
        "wss://relay.example.com:8443/courier/v1",
        "WSS://Relay.Example.com",
        "wss://10.0.0.5:9000",
        "wss://[2001:db8::1]:443/ws",
        "wss://localhost",
        "wss://127.0.0.1:1",
    ] {
        let c = ok(internet(url));
        let i = c.internet.unwrap();
        assert!(i.tls, "{url}");
        assert_eq!(i.urls, [url]);
    }
}

#[test]
fn ws_is_accepted_only_for_loopback_hosts() {
    for url in [
        "ws://localhost",
        "ws://localhost:8080/ws",
        "ws://LOCALHOST:8080",
        "ws://127.0.0.1:43127",
        "ws://127.1.2.3",
        "ws://127.255.255.254:80/x",
        "ws://[::1]:8080",
        "ws://[::1]",
    ] {
        let i = ok(internet(url)).internet.unwrap();
        assert!(!i.tls && i.host_is_loopback, "{url}");
    }
    for url in [
        "ws://relay.example.com",
        "ws://10.0.0.5:8080",
        "ws://192.168.1.10",
        "ws://0.0.0.0:8080",
        "ws://128.0.0.1",
        "ws://[::2]:8080",
        "ws://[::]:8080",
        "ws://localhost.evil.com",
        "ws://127.0.0.1.nip.io",
    ] {
        let e = err(internet(url));
        assert_eq!(
            e.to_string(),
            "transports.internet.url ws:// is only allowed for loopback hosts; use wss://",
            "{url}"
        );
    }
}

#[test]
fn other_urls_are_refused() {
    for url in [
        "https://relay.example.com",
        "http://localhost",
        "relay.example.com",
        "/ws",
        "ftp://x",
    ] {
        refused(internet(url), "transports.internet.url", "ws:// or wss://");
    }
    for url in ["", "wss://", "not a url", "wss://exa mple.com"] {
        let e = err(internet(url));
        assert_eq!(e.path, "transports.internet.url", "{url}: {e}");
    }
    refused(
        internet("wss://user:pw@relay.example.com"),
        "transports.internet.url",
        "credentials",
    );
    refused(
        internet_with(json!({ "url": 42 })),
        "transports.internet.url",
        "must be a ws:// or wss:// URL, or a non-empty list of them",
    );
    refused(
        with(json!({ "transports": { "internet": { "authToken": "t" } } })),
        "transports.internet.url",
        "is required",
    );
}

#[test]
fn auth_token_is_required_with_url() {
    refused(
        with(json!({ "transports": { "internet": { "url": "wss://relay.example.com" } } })),
        "transports.internet.authToken",
        "is required with url",
    );
    refused(
        internet_with(json!({ "authToken": null })),
        "transports.internet.authToken",
        "is required",
    );
    refused(
        internet_with(json!({ "authToken": "" })),
        "transports.internet.authToken",
        "non-empty",
    );
    for bad in [json!(5), json!(false), json!({})] {
        refused(
            internet_with(json!({ "authToken": bad })),
            "transports.internet.authToken",
            "must be a non-empty string or a function returning one",
        );
    }
}

#[test]
fn an_auth_token_provider_is_marked_true() {
    let config = ok(internet_with(json!({ "authToken": true })));
    assert_eq!(config.internet.unwrap().auth_token, AuthToken::Provided);
}

#[test]
fn auto_reconnect() {
    assert!(
        ok(internet("wss://r.example"))
            .internet
            .unwrap()
            .auto_reconnect
    );
    assert!(
        !ok(internet_with(json!({ "autoReconnect": false })))
            .internet
            .unwrap()
            .auto_reconnect
    );
    refused(
        internet_with(json!({ "autoReconnect": "yes" })),
        "transports.internet.autoReconnect",
        "must be a boolean",
    );
    refused(
        internet_with(json!({ "autoReconnect": 1 })),
        "transports.internet.autoReconnect",
        "must be a boolean",
    );
}

#[test]
fn ca_certificates_must_be_pem() {
    let pem = test_pem();
    let pem = pem.as_str();
    let c = ok(internet_with(json!({ "tls": { "caCertificates": pem } })));
    assert_eq!(c.internet.unwrap().ca_certificates.as_deref(), Some(pem));
    // Two certificates, with text around them.
    let two = format!("# corp root\n{pem}\n# second\n{pem}");
    ok(internet_with(json!({ "tls": { "caCertificates": two } })));
    // An empty tls section is fine.
    assert_eq!(
        ok(internet_with(json!({ "tls": {} })))
            .internet
            .unwrap()
            .ca_certificates,
        None
    );

    let path = "transports.internet.tls.caCertificates";
    refused(
        internet_with(json!({ "tls": { "caCertificates": "" } })),
        path,
        "PEM certificate",
    );
    refused(
        internet_with(json!({ "tls": { "caCertificates": "/etc/ssl/ca.pem" } })),
        path,
        "PEM certificate",
    );
    refused(
        internet_with(
            json!({ "tls": { "caCertificates": "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n" } }),
        ),
        path,
        "PEM certificate",
    );
    refused(
        internet_with(
            json!({ "tls": { "caCertificates": "-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n" } }),
        ),
        path,
        "malformed",
    );
    refused(
        internet_with(json!({ "tls": { "caCertificates": ["a"] } })),
        path,
        "must be a string",
    );

    // With ws:// the anchors have nothing to do: accepted, with a warning.
    let mut v = internet("ws://127.0.0.1:9000");
    merge(
        &mut v,
        json!({ "transports": { "internet": { "tls": { "caCertificates": pem } } } }),
    );
    let c = ok(v);
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("caCertificates is ignored")),
        "{:?}",
        c.warnings
    );
}

// ---- keys nothing read ----

/// Keys that were parsed and then ignored are refused like any unknown key: the features that
/// will read them add them back.
#[test]
fn group_broadcast_is_on_unless_switched_off_and_other_group_keys_are_refused() {
    assert!(ok(with(json!({}))).group_relay_broadcast);
    assert!(ok(with(json!({ "group": {} }))).group_relay_broadcast);
    let off = ok(with(json!({ "group": { "relayBroadcastEnabled": false } })));
    assert!(!off.group_relay_broadcast);
    refused(
        with(json!({ "group": { "relayBroadcast": false } })),
        "group.relayBroadcast",
        "is not a known option",
    );
    refused(
        with(json!({ "group": { "relayBroadcastEnabled": "yes" } })),
        "group.relayBroadcastEnabled",
        "boolean",
    );
}

#[test]
fn encryption_is_on_unless_switched_off_and_plaintext_says_so() {
    for on in [
        json!({}),
        json!({ "encryption": {} }),
        json!({ "encryption": { "enabled": true } }),
    ] {
        let config = ok(with(on));
        assert!(config.engine.encryption);
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    }
    let plaintext = ok(with(json!({ "encryption": { "enabled": false } })));
    assert!(!plaintext.engine.encryption);
    assert_eq!(plaintext.warnings, [PLAINTEXT_WARNING]);
    refused(
        with(json!({ "encryption": { "enabled": "yes" } })),
        "encryption.enabled",
        "boolean",
    );
}

#[test]
fn unknown_senders_are_accepted_unless_the_app_chooses_otherwise() {
    assert_eq!(ok(base()).unknown_senders, UnknownSenders::Accept);
    for (name, policy) in [
        ("accept", UnknownSenders::Accept),
        ("request", UnknownSenders::Request),
        ("refuse", UnknownSenders::Refuse),
    ] {
        let config = ok(with(json!({ "encryption": { "unknownSenders": name } })));
        assert_eq!(config.unknown_senders, policy);
    }
    refused(
        with(json!({ "encryption": { "unknownSenders": "ignore" } })),
        "encryption.unknownSenders",
        "must be one of 'accept', 'request', 'refuse'",
    );
}

#[test]
fn the_pre_session_lifetime_is_read() {
    let config = ok(with(
        json!({ "reliability": { "retry": { "pendingMessageMaxLifetimeMs": 1000 } } }),
    ));
    assert_eq!(config.engine.pending_session_max_lifetime_ms, 1000);
    refused(
        with(json!({ "reliability": { "retry": { "pendingMessageMaxLifetimeMs": 0 } } })),
        "reliability.retry.pendingMessageMaxLifetimeMs",
        "",
    );
}

// ---- reliability ----

#[test]
fn positive_integers() {
    for (section, key) in [
        ("ack", "defaultTimeoutMs"),
        ("ack", "maxPendingAcks"),
        ("retry", "initialDelayMs"),
        ("retry", "maxDelayMs"),
        ("retry", "outboxMaxLifetimeMs"),
    ] {
        let path = format!("reliability.{section}.{key}");
        let cfg = |v: Value| with(json!({ "reliability": { section: { key: v } } }));
        for bad in [
            json!(0),
            json!(-1),
            json!(1.5),
            json!("1000"),
            json!(true),
            json!({}),
        ] {
            refused(cfg(bad.clone()), &path, "must be a positive integer");
        }
        refused(
            cfg(json!(9_007_199_254_740_993u64)),
            &path,
            "must be at most 9007199254740992",
        );
        refused(cfg(json!(1e300)), &path, "must be at most 9007199254740992");
        // 1 is the floor for all of these except where `<= maxDelayMs` interferes.
        if key != "initialDelayMs" && key != "maxDelayMs" {
            ok(cfg(json!(1)));
            ok(cfg(json!(9_007_199_254_740_992u64)));
        }
        // A whole float is an integer (JS numbers).
        ok(cfg(json!(5000.0)));
    }
    assert_eq!(
        ok(with(
            json!({ "reliability": { "ack": { "defaultTimeoutMs": 2500.0 } } })
        ))
        .engine
        .ack_timeout_ms,
        2500
    );
}

#[test]
fn max_retries_may_be_zero() {
    let cfg = |v: Value| with(json!({ "reliability": { "retry": { "maxRetries": v } } }));
    assert_eq!(ok(cfg(json!(0))).engine.max_retries, 0);
    assert_eq!(
        ok(cfg(json!(4_294_967_295u64))).engine.max_retries,
        u32::MAX
    );
    let path = "reliability.retry.maxRetries";
    refused(cfg(json!(-1)), path, "must be a non-negative integer");
    refused(cfg(json!(0.5)), path, "must be a non-negative integer");
    refused(cfg(json!("3")), path, "must be a non-negative integer");
    refused(
        cfg(json!(4_294_967_296u64)),
        path,
        "must be at most 4294967295",
    );
}

#[test]
fn initial_delay_must_not_exceed_max_delay() {
    let e = err(with(
        json!({ "reliability": { "retry": { "initialDelayMs": 5000, "maxDelayMs": 4000 } } }),
    ));
    assert_eq!(e.path, "reliability.retry.initialDelayMs");
    assert_eq!(e.message, "must be <= maxDelayMs");
    assert_eq!(
        e.to_string(),
        "reliability.retry.initialDelayMs must be <= maxDelayMs"
    );
    // Against the default ceiling (300000) too.
    let e = err(with(
        json!({ "reliability": { "retry": { "initialDelayMs": 300001 } } }),
    ));
    assert_eq!(
        e.to_string(),
        "reliability.retry.initialDelayMs must be <= maxDelayMs"
    );
    // And a ceiling below the default initial delay (1000).
    let e = err(with(
        json!({ "reliability": { "retry": { "maxDelayMs": 999 } } }),
    ));
    assert_eq!(
        e.to_string(),
        "reliability.retry.initialDelayMs must be <= maxDelayMs"
    );
    // Equal is fine.
    ok(with(
        json!({ "reliability": { "retry": { "initialDelayMs": 4000, "maxDelayMs": 4000 } } }),
    ));
}

#[test]
fn backoff_multiplier() {
    let cfg = |v: Value| with(json!({ "reliability": { "retry": { "backoffMultiplier": v } } }));
    assert_eq!(ok(cfg(json!(1))).engine.backoff_multiplier, 1.0);
    assert_eq!(ok(cfg(json!(1.5))).engine.backoff_multiplier, 1.5);
    assert_eq!(ok(cfg(json!(1e300))).engine.backoff_multiplier, 1e300);
    let path = "reliability.retry.backoffMultiplier";
    refused(cfg(json!(0.99)), path, "must be a finite number >= 1");
    refused(cfg(json!(0)), path, "must be a finite number >= 1");
    refused(cfg(json!(-2)), path, "must be a finite number >= 1");
    refused(cfg(json!("2")), path, "must be a number");
}

#[test]
fn lifetime_warning_threshold() {
    let cfg = |ms: u64| with(json!({ "reliability": { "retry": { "outboxMaxLifetimeMs": ms } } }));
    // 7.5 days × 4 = exactly 30 days: fine. One millisecond more: warned.
    assert!(ok(cfg(648_000_000)).warnings.is_empty());
    let w = ok(cfg(648_000_001)).warnings;
    assert_eq!(w.len(), 1);
    assert!(
        w[0].starts_with("reliability.retry.outboxMaxLifetimeMs"),
        "{w:?}"
    );
    assert!(
        w[0].contains("late control frames may be refused as stale"),
        "{w:?}"
    );
    // The largest value does not overflow.
    assert_eq!(ok(cfg(9_007_199_254_740_992)).warnings.len(), 1);
}

#[test]
fn edge_driven_unreachable_dm() {
    let cfg = |v: Value| with(json!({ "reliability": { "edgeDrivenUnreachableDm": v } }));
    assert!(ok(cfg(json!(true))).engine.edge_driven_unreachable_dm);
    assert!(!ok(cfg(json!(false))).engine.edge_driven_unreachable_dm);
    refused(
        cfg(json!("true")),
        "reliability.edgeDrivenUnreachableDm",
        "must be a boolean",
    );
}

// ---- hook, log ----

#[test]
fn durability_hook() {
    assert!(ok(with(json!({ "inboundDurabilityHook": true }))).has_durability_hook);
    for bad in [json!(false), json!("fn"), json!({}), json!(1)] {
        refused(
            with(json!({ "inboundDurabilityHook": bad })),
            "inboundDurabilityHook",
            "must be a function",
        );
    }
    let cfg = |v: Value| with(json!({ "inboundDurabilityHookTimeoutMs": v }));
    assert_eq!(ok(cfg(json!(1))).inbound_durability_hook_timeout_ms, 1);
    refused(
        cfg(json!(0)),
        "inboundDurabilityHookTimeoutMs",
        "must be a positive integer",
    );
    refused(
        cfg(json!(2.5)),
        "inboundDurabilityHookTimeoutMs",
        "must be a positive integer",
    );
}

#[test]
fn config_error_is_a_std_error() {
    let e: Box<dyn std::error::Error + Send + Sync> = Box::new(err(json!({})));
    assert!(e.to_string().ends_with("is required"), "{e}");
}

#[test]
fn identity_seal_key_is_32_bytes_of_base64() {
    assert!(ok(base()).identity_seal_key.is_none());
    let key = base64::engine::general_purpose::STANDARD.encode([5u8; 32]);
    let c = ok(with(json!({ "storage": { "identitySealKey": key } })));
    assert_eq!(*c.identity_seal_key.unwrap().bytes(), [5u8; 32]);
    assert!(
        !format!(
            "{:?}",
            ok(with(json!({ "storage": { "identitySealKey": key } })))
        )
        .contains(&key),
        "the key never reaches a log through Debug"
    );
    let short = base64::engine::general_purpose::STANDARD.encode([5u8; 31]);
    for bad in [json!(short), json!("not base64!"), json!(7)] {
        let e = err(with(json!({ "storage": { "identitySealKey": bad } })));
        assert_eq!(e.path, "storage.identitySealKey", "{e}");
    }
}

#[test]
fn legacy_control_v1_is_refused_unless_the_app_opts_in() {
    assert!(!ok(base()).engine.accept_legacy_control_v1);
    assert!(
        ok(with(json!({ "acceptLegacyControlV1": true })))
            .engine
            .accept_legacy_control_v1
    );
    refused(
        with(json!({ "acceptLegacyControlV1": "yes" })),
        "acceptLegacyControlV1",
        "boolean",
    );
}

fn internet_list(urls: Value) -> Value {
    with(
        json!({ "transports": { "internet": { "url": urls, "authToken": jwt(json!({"sub": "alice"})) } } }),
    )
}

#[test]
fn a_list_of_relay_nodes_is_kept_in_order_and_each_url_checked() {
    let i = ok(internet_list(json!([
        "ws://127.0.0.1:4001",
        "wss://relay-b.example.com",
        "ws://localhost:4003"
    ])))
    .internet
    .unwrap();
    assert_eq!(
        i.urls,
        [
            "ws://127.0.0.1:4001",
            "wss://relay-b.example.com",
            "ws://localhost:4003"
        ]
    );
    assert!(
        i.tls && !i.host_is_loopback,
        "some node is wss:// and not loopback"
    );
    let e = err(internet_list(json!([
        "ws://127.0.0.1:4001",
        "ws://10.0.0.2"
    ])));
    assert_eq!(
        e.to_string(),
        "transports.internet.url[1] ws:// is only allowed for loopback hosts; use wss://"
    );
}

#[test]
fn an_empty_repeated_mixed_or_overlong_list_of_relay_nodes_is_refused() {
    let kind = "transports.internet.url must be a ws:// or wss:// URL, or a non-empty list of them";
    assert_eq!(err(internet_list(json!([]))).to_string(), kind);
    assert_eq!(
        err(internet_list(json!(["ws://127.0.0.1:1", 2]))).to_string(),
        kind
    );
    assert_eq!(
        err(internet_list(json!([
            "ws://127.0.0.1:1",
            "ws://127.0.0.1:1"
        ])))
        .to_string(),
        "transports.internet.url lists ws://127.0.0.1:1 twice"
    );
    let many: Vec<String> = (0..17)
        .map(|i| format!("ws://127.0.0.1:{}", 4000 + i))
        .collect();
    assert_eq!(
        err(internet_list(json!(many))).to_string(),
        "transports.internet.url lists 17 URLs; at most 16"
    );
}
