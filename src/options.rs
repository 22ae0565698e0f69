//! The options of `Relay.start` and `Gateway.start` (`RelayOptions`, `GatewayOptions` in
//! `js/index.d.ts`), validated by the strict reader of `Protocol`'s config: unknown keys with a
//! "did you mean", errors naming the path, integers a JS number holds exactly.

use std::net::SocketAddr;

use courier_client::config::{storage_section, ConfigError, Section, StorageConfig};
use std::time::Duration;

use courier_relay::gateway::{GatewayAccess, GatewayToken};
use courier_relay::{
    AttemptLimit, ClusterStorage, GatewayConfig, MailboxLimits, PresenceVisibility, RateLimit,
    RelayConfig, Storage, TlsConfig,
};
use serde_json::Value;

/// Where both servers listen unless told otherwise: an ephemeral loopback port.
const DEFAULT_LISTEN: &str = "127.0.0.1:0";

const RELAY_KEYS: &[&str] = &[
    "listen",
    "storage",
    "cluster",
    "jwtSecret",
    "mailbox",
    "rateLimit",
    "tls",
    "keyDirectory",
    "maxConnections",
    "metricsListen",
    "authLimits",
    "presenceVisibility",
];

/// `cluster`: the deployment's NATS servers, its name and replicas (`docs/cluster.md`).
fn cluster_storage(cluster: &Section<'_>) -> Result<ClusterStorage, ConfigError> {
    let servers = match cluster.get("servers") {
        Some(Value::Array(urls)) if !urls.is_empty() => urls
            .iter()
            .map(|url| match url {
                Value::String(url) if url.starts_with("nats://") || url.starts_with("tls://") => {
                    Ok(url.clone())
                }
                other => {
                    Err(cluster.error("servers", format!("must hold nats:// URLs, got {other}")))
                }
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => {
            return Err(cluster.error(
                "servers",
                "is required: a non-empty array of NATS server URLs (nats://host:port)",
            ))
        }
    };
    let mut storage = ClusterStorage::new(servers);
    if let Some(name) = cluster.string("name")? {
        storage.name = name.to_owned();
    }
    if let Some(replicas) = cluster.positive_int("replicas", 5)? {
        storage.replicas = replicas as usize;
    }
    Ok(storage)
}

/// `options`: the `RelayOptions` object as JSON text.
pub fn relay_config(options: &str) -> Result<RelayConfig, ConfigError> {
    let options = parse(options)?;
    let root = Section::root(&options, "options", RELAY_KEYS)?;
    let listen = listen(&root)?;
    let storage = match root.section("cluster", &["servers", "name", "replicas"])? {
        Some(cluster) if root.get("storage").is_some() => return Err(cluster.error(
            "servers",
            "a relay node of a cluster keeps nothing of its own: set cluster or storage, not both",
        )),
        Some(cluster) => Storage::Cluster(cluster_storage(&cluster)?),
        None => match storage_section(&root, &[])?.0 {
            StorageConfig::Path(path) => Storage::Path(path),
            StorageConfig::Memory => Storage::Memory,
        },
    };
    // The facade passes a Buffer secret as its UTF-8 text.
    let secret = match root.string("jwtSecret")? {
        Some(secret) if secret.len() >= courier_relay::MIN_SECRET_BYTES => secret,
        _ => {
            return Err(root.error(
                "jwtSecret",
                format!(
                    "must be a string of at least {} bytes",
                    courier_relay::MIN_SECRET_BYTES
                ),
            ))
        }
    };
    let mut config = RelayConfig::new(listen, storage, secret.as_bytes().to_vec());
    config.mailbox = mailbox(&root)?;
    config.key_directory = root.bool("keyDirectory")?.unwrap_or(true);
    if let Some(max) = root.positive_int("maxConnections", u64::from(u32::MAX))? {
        config.max_connections = max as usize;
    }
    if let Some(metrics) = root.string("metricsListen")? {
        config.metrics_listen = Some(metrics.parse().map_err(|_| {
            root.error(
                "metricsListen",
                format!("must be an address like 127.0.0.1:9090, got {metrics:?}"),
            )
        })?);
    }
    if let Some(rate) = root.section("rateLimit", &["burst", "perSec"])? {
        let per_connection = |key| {
            rate.positive_int(key, u64::from(u32::MAX))
                .map(|v| v.map(|v| v as u32))
        };
        let default = RateLimit::default();
        config.rate_limit = RateLimit {
            burst: per_connection("burst")?.unwrap_or(default.burst),
            per_sec: per_connection("perSec")?.unwrap_or(default.per_sec),
        };
    }
    auth_limits(&root, &mut config)?;
    config.presence_visibility = match root.string("presenceVisibility")? {
        None | Some("everyone") => PresenceVisibility::Everyone,
        Some("contacts") => PresenceVisibility::Contacts,
        Some(other) => {
            return Err(root.error(
                "presenceVisibility",
                format!("must be 'everyone' or 'contacts', got {other:?}"),
            ))
        }
    };
    if let Some(tls) = root.section("tls", &["cert", "key"])? {
        let pem = |key| {
            tls.string(key)?
                .map(str::to_owned)
                .ok_or_else(|| tls.error(key, "is required (PEM text)"))
        };
        config.tls = Some(TlsConfig {
            cert_pem: pem("cert")?,
            key_pem: pem("key")?,
        });
    }
    Ok(config)
}

/// `authLimits`: how many authentications each source and account may make, and how many
/// logins may displace an account's live connection (`docs/protocol.md#authentication-limits`).
fn auth_limits(root: &Section<'_>, config: &mut RelayConfig) -> Result<(), ConfigError> {
    const KINDS: [&str; 3] = [
        "attemptsPerSource",
        "attemptsPerAccount",
        "displacementsPerAccount",
    ];
    let Some(limits) = root.section("authLimits", &KINDS)? else {
        return Ok(());
    };
    let auth = &mut config.auth;
    for (kind, limit) in KINDS.into_iter().zip([
        &mut auth.attempts_per_source,
        &mut auth.attempts_per_account,
        &mut auth.supersedes_per_account,
    ]) {
        let Some(section) = limits.section(kind, &["burst", "perMinute"])? else {
            continue;
        };
        let count = |key| {
            section
                .positive_int(key, u64::from(u32::MAX))
                .map(|v| v.map(|v| v as u32))
        };
        *limit = AttemptLimit {
            burst: count("burst")?.unwrap_or(limit.burst),
            per_minute: count("perMinute")?.unwrap_or(limit.per_minute),
        };
    }
    Ok(())
}

/// `mailbox`: `false` turns store-and-forward off; absent or an object keeps it on.
fn mailbox(root: &Section<'_>) -> Result<Option<MailboxLimits>, ConfigError> {
    match root.get("mailbox") {
        Some(Value::Bool(false)) => return Ok(None),
        Some(Value::Object(_)) | None => {}
        Some(_) => return Err(root.error("mailbox", "must be false or an object")),
    }
    let default = MailboxLimits::default();
    let Some(mailbox) = root.section("mailbox", &["maxMessages", "maxBytes", "ttlMs"])? else {
        return Ok(Some(default));
    };
    let limit = |key, default| {
        mailbox
            .positive_int(key, u64::MAX)
            .map(|v| v.unwrap_or(default))
    };
    Ok(Some(MailboxLimits {
        max_messages: limit("maxMessages", default.max_messages)?,
        max_bytes: limit("maxBytes", default.max_bytes)?,
        ttl_ms: limit("ttlMs", default.ttl_ms)?,
        ..default
    }))
}

const GATEWAY_KEYS: &[&str] = &[
    "listen",
    "requireToken",
    "allowPublicWithoutToken",
    "maxConnections",
    "maxConnectionsPerSource",
    "maxQueueBytes",
    "maxTotalQueueBytes",
    "idleTimeoutMs",
    "rateLimit",
];

/// `options`: the `GatewayOptions` object as JSON text. Limits the gateway cannot run with
/// (a queue or the queues' budget under one line, a listen address beyond loopback without a token) are refused by
/// `Gateway.start` itself.
pub fn gateway_config(options: &str) -> Result<GatewayConfig, ConfigError> {
    let options = parse(options)?;
    let root = Section::root(&options, "options", GATEWAY_KEYS)?;
    let mut config = GatewayConfig::new(listen(&root)?);
    let public = root.bool("allowPublicWithoutToken")?.unwrap_or(false);
    config.access = match (root.string("requireToken")?, public) {
        (Some(_), true) => {
            return Err(root.error(
                "allowPublicWithoutToken",
                "cannot be combined with requireToken",
            ))
        }
        (Some(token), false) => GatewayAccess::Token(
            GatewayToken::new(token).map_err(|e| root.error("requireToken", e))?,
        ),
        (None, true) => GatewayAccess::Public,
        (None, false) => GatewayAccess::Loopback,
    };
    let count = |key| root.positive_int(key, u64::from(u32::MAX));
    if let Some(max) = count("maxConnections")? {
        config.max_connections = max as usize;
    }
    if let Some(max) = count("maxConnectionsPerSource")? {
        config.max_connections_per_source = max as usize;
    }
    if let Some(max) = root.positive_int("maxQueueBytes", u64::from(u32::MAX))? {
        config.max_queue_bytes = max as usize;
    }
    if let Some(max) = root.positive_int("maxTotalQueueBytes", u64::from(u32::MAX))? {
        config.max_total_queue_bytes = max as usize;
    }
    if let Some(ms) = root.positive_int("idleTimeoutMs", u64::from(u32::MAX))? {
        config.idle_timeout = Duration::from_millis(ms);
    }
    if let Some(rate) = root.section("rateLimit", &["burst", "perSec"])? {
        let per_connection = |key| {
            rate.positive_int(key, u64::from(u32::MAX))
                .map(|v| v.map(|v| v as u32))
        };
        let default = config.send_rate;
        config.send_rate = RateLimit {
            burst: per_connection("burst")?.unwrap_or(default.burst),
            per_sec: per_connection("perSec")?.unwrap_or(default.per_sec),
        };
    }
    Ok(config)
}

/// Options objects cross as JSON text, like `Protocol`'s config.
fn parse(json: &str) -> Result<Value, ConfigError> {
    serde_json::from_str(json).map_err(|e| ConfigError {
        path: "options".to_owned(),
        message: format!("are not valid JSON: {e}"),
    })
}

fn listen(root: &Section<'_>) -> Result<SocketAddr, ConfigError> {
    let listen = root.string("listen")?.unwrap_or(DEFAULT_LISTEN);
    listen.parse().map_err(|_| {
        root.error(
            "listen",
            format!("must be an address like 127.0.0.1:0, got {listen:?}"),
        )
    })
}
