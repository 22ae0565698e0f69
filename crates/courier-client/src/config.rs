//! `new Protocol(config)`: validation of the application's config (`ProtocolConfig` in
//! `js/index.d.ts`).
//!
//! The whole object is checked synchronously by the strict [`Section`] reader and the first
//! problem is reported as a [`ConfigError`] whose `path` names the offending key
//! (`reliability.retry.initialDelayMs`) and whose `message` says what is wrong; `Display` joins
//! them with a space.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;

use courier_engine::Config;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde_json::Value;
use zeroize::Zeroizing;

use crate::carrier::gateway::GatewayClientTimings;
use crate::driver::connections::UnknownSenders;

pub mod media;
mod section;
pub use section::{Section, MAX_SAFE_INTEGER};

const THIRTY_DAYS_MS: u64 = 30 * 24 * 3600 * 1000;

/// An invalid config: `"{path} {message}"`, e.g.
/// `reliability.retry.initialDelayMs must be <= maxDelayMs`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path} {message}")]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl ConfigError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// `storage`: exactly one of a file path or an in-memory store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageConfig {
    Path(PathBuf),
    Memory,
}

/// `storage.identitySealKey`: 32 bytes the app keeps outside the database (Electron
/// `safeStorage`, the OS keychain) that seal the identity seed at rest.
#[derive(Clone, PartialEq, Eq)]
pub struct IdentitySealKey(Zeroizing<[u8; 32]>);

impl IdentitySealKey {
    pub fn bytes(&self) -> Zeroizing<[u8; 32]> {
        self.0.clone()
    }
}

impl fmt::Debug for IdentitySealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IdentitySealKey(..)")
    }
}

/// At most this many relay URLs in `transports.internet.url`.
pub const MAX_RELAY_URLS: usize = 16;

/// `transports.internet`.
#[derive(Clone, PartialEq, Eq)]
pub struct InternetConfig {
    /// The relay URLs as given (`ws://` or `wss://`): one relay, or the nodes of one relay
    /// cluster the carrier fails over between (`docs/protocol.md#reconnection`). Never empty,
    /// no URL twice, at most [`MAX_RELAY_URLS`].
    pub urls: Vec<String>,
    pub auth_token: AuthToken,
    /// Extra trust anchors (PEM) for `wss://`, added to the system roots.
    pub ca_certificates: Option<String>,
    pub auto_reconnect: bool,
    /// How long an offline hint keeps the relay carrier down without a `true` hint
    /// ([`OFFLINE_REDIAL`]; not an option of the JS config, tests shorten it).
    pub offline_redial: std::time::Duration,
    /// Every URL's host is `localhost`, in `127.0.0.0/8` or `::1`.
    pub host_is_loopback: bool,
    /// Some URL is `wss://`.
    pub tls: bool,
}

/// After `internetStatusChanged(false)` the relay carrier dials again this late even if no `true`
/// hint came (`docs/protocol.md#reconnection`).
pub const OFFLINE_REDIAL: std::time::Duration = std::time::Duration::from_secs(60);

/// `transports.internet.authToken`: where the relay token of each connection comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum AuthToken {
    /// One token, until `setAuthToken` replaces it.
    Fixed(String),
    /// The application's provider, asked at every connect (the facade passes `true` in place of
    /// the function, which stays on its side).
    Provided,
}

impl std::fmt::Debug for AuthToken {
    // A token is a bearer credential: never in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fixed(_) => f.write_str("Fixed(<redacted>)"),
            Self::Provided => f.write_str("Provided"),
        }
    }
}

impl std::fmt::Debug for InternetConfig {
    // The token is a bearer credential: never in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InternetConfig")
            .field("urls", &self.urls)
            .field("auth_token", &self.auth_token)
            .field(
                "ca_certificates",
                &self.ca_certificates.as_ref().map(|_| "<pem>"),
            )
            .field("auto_reconnect", &self.auto_reconnect)
            .field("host_is_loopback", &self.host_is_loopback)
            .field("tls", &self.tls)
            .finish()
    }
}

/// `transports.gateway`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayConfig {
    /// `host:port` of the gateway daemon.
    pub address: String,
    /// `transports.gateway.token`: the attach token a gateway started with
    /// `--require-token-file` asks for.
    pub token: Option<GatewayToken>,
    /// The clocks of `docs/protocol.md#gateway-client` in production; tests shorten them.
    #[doc(hidden)]
    pub timings: GatewayClientTimings,
}

/// A gateway's attach token: a shared secret, so never in logs.
#[derive(Clone, PartialEq, Eq)]
pub struct GatewayToken(String);

impl GatewayToken {
    pub fn new(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    /// The token as `Identify.token` carries it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for GatewayToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GatewayToken(<redacted>)")
    }
}

/// Where a gateway daemon listens when `transports.gateway` names no address
/// (`docs/protocol.md#gateway-framing`).
pub const DEFAULT_GATEWAY_ADDRESS: &str = "localhost:4242";

/// `logLevel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum LogLevel {
    Error,
    #[default]
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub const ALL: [LogLevel; 5] = [
        Self::Error,
        Self::Warn,
        Self::Info,
        Self::Debug,
        Self::Trace,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warn => "warn",
            Self::Info => "info",
            Self::Debug => "debug",
            Self::Trace => "trace",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|l| l.as_str() == s)
    }

    /// Whether a diagnostic of `level` passes this threshold.
    pub fn admits(self, level: courier_engine::DiagnosticLevel) -> bool {
        use courier_engine::DiagnosticLevel as D;
        let as_log = match level {
            D::Error => Self::Error,
            D::Warn => Self::Warn,
            D::Info => Self::Info,
            D::Debug => Self::Debug,
        };
        as_log <= self
    }
}

/// A validated `Protocol` config.
#[derive(Debug, Clone, PartialEq)]
pub struct ProtocolConfig {
    pub app_id: String,
    pub storage: StorageConfig,
    /// `storage.identitySealKey`; without it a file store seals under a key file beside it.
    pub identity_seal_key: Option<IdentitySealKey>,
    pub internet: Option<InternetConfig>,
    pub gateway: Option<GatewayConfig>,
    /// Built from `appId` and `reliability.*`; every other field at `Config::new` defaults.
    pub engine: Config,
    /// `inboundDurabilityHook` was given (the JS facade passes `true` in place of the function).
    pub has_durability_hook: bool,
    pub inbound_durability_hook_timeout_ms: u64,
    pub log_level: LogLevel,
    /// `encryption.unknownSenders`: what becomes of a message from a peer that is not a contact.
    pub unknown_senders: UnknownSenders,
    /// `group.relayBroadcastEnabled`: a group message may go as one relay broadcast
    /// (`docs/delivery.md#path-choice`).
    pub group_relay_broadcast: bool,
    /// `media.*`: file transfers.
    pub media: media::MediaConfig,
    /// Valid but questionable settings, for the runtime to surface as `diagnostic` events.
    pub warnings: Vec<String>,
    /// Not in the JSON config: the app carriers to register at start, up from the first step
    /// (the Node binding's `registerTransport` calls made before `start()`). Empty once parsed.
    pub app_carriers: BTreeSet<String>,
}

/// Said once per process by the Node binding, however many devices run in plaintext mode.
pub const PLAINTEXT_WARNING: &str = "encryption.enabled is false: messages travel and wait at the \
     relay in the clear, and each says so (encrypted: false)";

const ROOT_KEYS: &[&str] = &[
    "appId",
    "storage",
    "transports",
    "reliability",
    "inboundDurabilityHook",
    "inboundDurabilityHookTimeoutMs",
    "logLevel",
    "acceptLegacyControlV1",
    "encryption",
    "group",
    "media",
];

/// Validates `value` (the config object as JSON) and builds the runtime config.
pub fn parse_protocol_config(value: &Value) -> Result<ProtocolConfig, ConfigError> {
    let root = Section::root(value, "config", ROOT_KEYS)?;
    let mut warnings = Vec::new();

    let app_id = root
        .string("appId")?
        .ok_or_else(|| root.error("appId", "is required"))?;
    courier_proto::validate_identifier(app_id).map_err(|e| root.error("appId", e.to_string()))?;

    let (storage, identity_seal_key) = parse_storage(&root)?;
    let (internet, gateway) = match root.section("transports", &["internet", "gateway"])? {
        Some(transports) => (
            parse_internet(&transports, &mut warnings)?,
            parse_gateway(&transports, &mut warnings)?,
        ),
        None => (None, None),
    };

    let mut engine = Config::new(app_id);
    if let Some(reliability) =
        root.section("reliability", &["ack", "retry", "edgeDrivenUnreachableDm"])?
    {
        parse_reliability(&reliability, &mut engine)?;
    }
    if engine.outbox_max_lifetime_ms.saturating_mul(4) > THIRTY_DAYS_MS {
        warnings.push(
            "reliability.retry.outboxMaxLifetimeMs: 4 × outboxMaxLifetimeMs exceeds 30 days: \
             late control frames may be refused as stale"
                .to_owned(),
        );
    }

    // v1 control signatures prove no freshness, so they are refused unless the app opts in
    // (`docs/protocol.md#control-signatures`).
    engine.accept_legacy_control_v1 = root.bool("acceptLegacyControlV1")?.unwrap_or(false);
    let mut unknown_senders = UnknownSenders::default();
    engine.encryption = match root.section("encryption", &["enabled", "unknownSenders"])? {
        Some(encryption) => {
            if let Some(policy) = encryption.string("unknownSenders")? {
                unknown_senders = UnknownSenders::parse(policy).ok_or_else(|| {
                    encryption.error(
                        "unknownSenders",
                        "must be one of 'accept', 'request', 'refuse'",
                    )
                })?;
            }
            encryption.bool("enabled")?.unwrap_or(true)
        }
        None => true,
    };
    if !engine.encryption {
        warnings.push(PLAINTEXT_WARNING.to_owned());
    }

    let group_relay_broadcast = match root.section("group", &["relayBroadcastEnabled"])? {
        Some(group) => group.bool("relayBroadcastEnabled")?.unwrap_or(true),
        None => true,
    };

    let media = media::parse(&root, &storage, &engine)?;

    let has_durability_hook = match root.get("inboundDurabilityHook") {
        None => false,
        Some(Value::Bool(true)) => true,
        Some(_) => return Err(root.error("inboundDurabilityHook", "must be a function")),
    };
    let inbound_durability_hook_timeout_ms = root
        .positive_int("inboundDurabilityHookTimeoutMs", MAX_SAFE_INTEGER)?
        .unwrap_or(30_000);
    if has_durability_hook {
        engine.durability_hook = Some(courier_engine::config::HookConfig {
            timeout_ms: inbound_durability_hook_timeout_ms,
            ..courier_engine::config::HookConfig::default()
        });
    }

    let log_level = match root.string("logLevel")? {
        None => LogLevel::default(),
        Some(s) => LogLevel::parse(s).ok_or_else(|| {
            root.error(
                "logLevel",
                "must be one of 'error', 'warn', 'info', 'debug', 'trace'",
            )
        })?,
    };

    Ok(ProtocolConfig {
        app_id: app_id.to_owned(),
        storage,
        identity_seal_key,
        internet,
        gateway,
        engine,
        has_durability_hook,
        inbound_durability_hook_timeout_ms,
        log_level,
        unknown_senders,
        group_relay_broadcast,
        media,
        warnings,
        app_carriers: BTreeSet::new(),
    })
}

fn parse_storage(
    root: &Section<'_>,
) -> Result<(StorageConfig, Option<IdentitySealKey>), ConfigError> {
    let (kind, storage) = storage_section(root, &["identitySealKey"])?;
    // The JS facade passes the key's bytes as base64.
    let seal_key = match storage.string("identitySealKey")? {
        None => None,
        Some(b64) => {
            let bytes = BASE64
                .decode(b64)
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
                .ok_or_else(|| storage.error("identitySealKey", "must be exactly 32 bytes"))?;
            Some(IdentitySealKey(Zeroizing::new(bytes)))
        }
    };
    Ok((kind, seal_key))
}

/// The required `storage` of `parent`: exactly one of `{ path }` (a non-empty string) or
/// `{ memory: true }`, beside the `extra` keys the caller reads from the returned section. The
/// relay's options take the same `storage`.
pub fn storage_section<'a>(
    parent: &Section<'a>,
    extra: &[&str],
) -> Result<(StorageConfig, Section<'a>), ConfigError> {
    let known: Vec<&str> = ["path", "memory"].iter().chain(extra).copied().collect();
    let storage = parent.section("storage", &known)?.ok_or_else(|| {
        parent.error(
            "storage",
            "is required (set storage.path or storage.memory)",
        )
    })?;
    let path = storage.string("path")?;
    let memory = match storage.get("memory") {
        None => false,
        Some(Value::Bool(true)) => true,
        Some(_) => {
            return Err(storage.error(
                "memory",
                "must be true (leave it out and set storage.path for a file store)",
            ))
        }
    };
    let kind = match (path, memory) {
        (Some(_), true) => Err(parent.error(
            "storage",
            "must set exactly one of path or memory, not both",
        )),
        (None, false) => Err(parent.error("storage", "must set exactly one of path or memory")),
        (Some(""), false) => Err(storage.error("path", "must be a non-empty string")),
        (Some(p), false) => Ok(StorageConfig::Path(PathBuf::from(p))),
        (None, true) => Ok(StorageConfig::Memory),
    }?;
    Ok((kind, storage))
}

fn parse_internet(
    transports: &Section<'_>,
    warnings: &mut Vec<String>,
) -> Result<Option<InternetConfig>, ConfigError> {
    let Some(internet) =
        transports.section("internet", &["url", "authToken", "tls", "autoReconnect"])?
    else {
        return Ok(None);
    };
    let urls = relay_urls(&internet)?;
    let mut tls = false;
    let mut host_is_loopback = true;
    for (i, url) in urls.iter().enumerate() {
        let (url_tls, loopback) = check_relay_url(url).map_err(|m| match urls.len() {
            1 => internet.error("url", m),
            _ => internet.error(&format!("url[{i}]"), m),
        })?;
        tls |= url_tls;
        host_is_loopback &= loopback;
    }

    const TOKEN_KIND: &str = "must be a non-empty string or a function returning one";
    let auth_token = match internet.get("authToken") {
        None => return Err(internet.error("authToken", "is required with url")),
        Some(serde_json::Value::String(token)) if !token.trim().is_empty() => {
            AuthToken::Fixed(token.clone())
        }
        Some(serde_json::Value::Bool(true)) => AuthToken::Provided,
        Some(_) => return Err(internet.error("authToken", TOKEN_KIND)),
    };

    let ca_certificates = match internet.section("tls", &["caCertificates"])? {
        Some(tls_section) => match tls_section.string("caCertificates")? {
            Some(pem) => {
                check_pem_certificates(pem).map_err(|m| tls_section.error("caCertificates", m))?;
                if !tls {
                    warnings.push(
                        "transports.internet.tls.caCertificates is ignored: the url is ws://, \
                         not wss://"
                            .to_owned(),
                    );
                }
                Some(pem.to_owned())
            }
            None => None,
        },
        None => None,
    };
    let auto_reconnect = internet.bool("autoReconnect")?.unwrap_or(true);

    Ok(Some(InternetConfig {
        urls,
        auth_token,
        ca_certificates,
        auto_reconnect,
        offline_redial: OFFLINE_REDIAL,
        host_is_loopback,
        tls,
    }))
}

/// `url`: one URL, or a list of the nodes of one relay cluster.
fn relay_urls(internet: &Section<'_>) -> Result<Vec<String>, ConfigError> {
    const KIND: &str = "must be a ws:// or wss:// URL, or a non-empty list of them";
    let urls: Vec<String> = match internet.get("url") {
        None => return Err(internet.error("url", "is required")),
        Some(serde_json::Value::String(url)) => vec![url.clone()],
        Some(serde_json::Value::Array(list)) if !list.is_empty() => list
            .iter()
            .map(|url| url.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| internet.error("url", KIND))?,
        Some(_) => return Err(internet.error("url", KIND)),
    };
    if urls.len() > MAX_RELAY_URLS {
        return Err(internet.error(
            "url",
            format!("lists {} URLs; at most {MAX_RELAY_URLS}", urls.len()),
        ));
    }
    for (i, url) in urls.iter().enumerate() {
        if urls[..i].contains(url) {
            return Err(internet.error("url", format!("lists {url} twice")));
        }
    }
    Ok(urls)
}

fn parse_gateway(
    transports: &Section<'_>,
    warnings: &mut Vec<String>,
) -> Result<Option<GatewayConfig>, ConfigError> {
    let Some(gateway) = transports.section("gateway", &["address", "token"])? else {
        return Ok(None);
    };
    let address = gateway
        .string("address")?
        .unwrap_or(DEFAULT_GATEWAY_ADDRESS);
    let host = check_gateway_address(address).map_err(|m| gateway.error("address", m))?;
    if !is_loopback_host(host) {
        warnings.push(
            "transports.gateway.address: the gateway link is plaintext TCP; a host other than \
             loopback lets the network read and alter every frame"
                .to_owned(),
        );
    }
    let token = match gateway.get("token") {
        None => None,
        Some(serde_json::Value::String(token)) if !token.trim().is_empty() => {
            Some(GatewayToken::new(token.trim()))
        }
        Some(_) => return Err(gateway.error("token", "must be a non-empty string")),
    };
    Ok(Some(GatewayConfig {
        address: address.to_owned(),
        token,
        timings: GatewayClientTimings::default(),
    }))
}

/// `host:port`: a host name, an IPv4 address or a bracketed IPv6 address, then a port from 1 to
/// 65535. Returns the host.
fn check_gateway_address(address: &str) -> Result<&str, String> {
    const FORM: &str = "must be 'host:port', like 'localhost:4242' or '[::1]:4242'";
    let (host, port) = address.rsplit_once(':').ok_or(FORM)?;
    let port_ok = !port.is_empty()
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u16>().is_ok_and(|p| p != 0);
    if !port_ok {
        return Err("must end in a port from 1 to 65535".to_owned());
    }
    match host.strip_prefix('[') {
        Some(bracketed) => {
            let ip = bracketed.strip_suffix(']').ok_or(FORM)?;
            if ip.parse::<Ipv6Addr>().is_err() {
                return Err("must bracket an IPv6 address, like '[::1]:4242'".to_owned());
            }
        }
        None => {
            let name = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == '-';
            if host.is_empty() || !host.chars().all(name) {
                return Err(FORM.to_owned());
            }
        }
    }
    Ok(host)
}

/// `ws://` or `wss://` with a host; `ws://` only to a loopback host. Returns `(tls, loopback)`.
fn check_relay_url(url: &str) -> Result<(bool, bool), String> {
    const SCHEME: &str = "must be a ws:// or wss:// URL";
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("is not a valid URL ({e})"))?;
    let tls = match uri.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("wss") => true,
        Some(s) if s.eq_ignore_ascii_case("ws") => false,
        _ => return Err(SCHEME.to_owned()),
    };
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or("");
    if authority.contains('@') {
        return Err("must not contain credentials; pass them as authToken".to_owned());
    }
    if authority.is_empty() {
        return Err("must name a host".to_owned());
    }
    let host = uri.host().unwrap_or("");
    if host.is_empty() {
        return Err("must name a host".to_owned());
    }
    let loopback = is_loopback_host(host);
    if !tls && !loopback {
        return Err("ws:// is only allowed for loopback hosts; use wss://".to_owned());
    }
    Ok((tls, loopback))
}

/// `localhost`, `127.0.0.0/8`, `::1` (bracketed in a URL).
fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Ok(v4) = host.parse::<Ipv4Addr>() {
        return v4.is_loopback();
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse::<Ipv6Addr>().is_ok_and(|v6| v6.is_loopback())
}

/// At least one `CERTIFICATE` PEM block, every block well-formed.
fn check_pem_certificates(pem: &str) -> Result<(), String> {
    const MESSAGE: &str = "must contain at least one PEM certificate (-----BEGIN CERTIFICATE-----)";
    if !pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(MESSAGE.to_owned());
    }
    let mut count = 0usize;
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        cert.map_err(|e| format!("holds a malformed PEM certificate ({e})"))?;
        count += 1;
    }
    if count == 0 {
        return Err(MESSAGE.to_owned());
    }
    Ok(())
}

fn parse_reliability(reliability: &Section<'_>, engine: &mut Config) -> Result<(), ConfigError> {
    if let Some(ack) = reliability.section("ack", &["defaultTimeoutMs", "maxPendingAcks"])? {
        if let Some(v) = ack.positive_int("defaultTimeoutMs", MAX_SAFE_INTEGER)? {
            engine.ack_timeout_ms = v;
        }
        if let Some(v) = ack.positive_int("maxPendingAcks", usize::MAX as u64)? {
            engine.max_pending_acks = v as usize;
        }
    }
    if let Some(retry) = reliability.section(
        "retry",
        &[
            "maxRetries",
            "initialDelayMs",
            "maxDelayMs",
            "backoffMultiplier",
            "outboxMaxLifetimeMs",
            "pendingMessageMaxLifetimeMs",
        ],
    )? {
        if let Some(v) = retry.non_negative_int("maxRetries", u64::from(u32::MAX))? {
            engine.max_retries = v as u32;
        }
        if let Some(v) = retry.positive_int("initialDelayMs", MAX_SAFE_INTEGER)? {
            engine.initial_delay_ms = v;
        }
        if let Some(v) = retry.positive_int("maxDelayMs", MAX_SAFE_INTEGER)? {
            engine.max_delay_ms = v;
        }
        if engine.initial_delay_ms > engine.max_delay_ms {
            return Err(retry.error("initialDelayMs", "must be <= maxDelayMs"));
        }
        if let Some(v) = retry.number("backoffMultiplier")? {
            if !(v.is_finite() && v >= 1.0) {
                return Err(retry.error("backoffMultiplier", "must be a finite number >= 1"));
            }
            engine.backoff_multiplier = v;
        }
        if let Some(v) = retry.positive_int("outboxMaxLifetimeMs", MAX_SAFE_INTEGER)? {
            engine.outbox_max_lifetime_ms = v;
        }
        if let Some(v) = retry.positive_int("pendingMessageMaxLifetimeMs", MAX_SAFE_INTEGER)? {
            engine.pending_session_max_lifetime_ms = v;
        }
    }
    if let Some(v) = reliability.bool("edgeDrivenUnreachableDm")? {
        engine.edge_driven_unreachable_dm = v;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_addresses() {
        for (address, host) in [
            ("localhost:4242", "localhost"),
            ("127.0.0.1:1", "127.0.0.1"),
            ("[::1]:65535", "[::1]"),
            ("gw-1.example.org:4242", "gw-1.example.org"),
        ] {
            assert_eq!(check_gateway_address(address), Ok(host), "{address}");
        }
        for address in [
            "localhost",
            "localhost:",
            "localhost:0",
            "localhost:65536",
            "localhost:+42",
            ":4242",
            "::1:4242",
            "[::1:4242",
            "[localhost]:4242",
            "local host:4242",
            "tcp://localhost:4242",
        ] {
            assert!(check_gateway_address(address).is_err(), "{address}");
        }
    }

    #[test]
    fn gateway_section() {
        let parse = |gateway: Value| {
            parse_protocol_config(&serde_json::json!({
                "appId": "chat",
                "storage": { "memory": true },
                "transports": { "gateway": gateway },
            }))
        };
        let config = parse(serde_json::json!({})).unwrap();
        let gateway = config.gateway.unwrap();
        assert_eq!(gateway.address, DEFAULT_GATEWAY_ADDRESS);
        assert_eq!(gateway.timings, GatewayClientTimings::default());
        assert_eq!(gateway.token, None);
        assert!(config.warnings.is_empty());

        let guarded = parse(serde_json::json!({ "token": " s3cret-token\n" })).unwrap();
        let token = guarded.gateway.unwrap().token.unwrap();
        assert_eq!(token.expose(), "s3cret-token");
        assert_eq!(format!("{token:?}"), "GatewayToken(<redacted>)");
        for bad in [
            serde_json::json!(""),
            serde_json::json!("  "),
            serde_json::json!(7),
        ] {
            let err = parse(serde_json::json!({ "token": bad })).unwrap_err();
            assert_eq!(
                err.to_string(),
                "transports.gateway.token must be a non-empty string"
            );
        }
        assert!(config.internet.is_none());

        let remote = parse(serde_json::json!({ "address": "gw.example.org:4242" })).unwrap();
        assert_eq!(remote.gateway.unwrap().address, "gw.example.org:4242");
        assert!(remote.warnings[0].starts_with("transports.gateway.address: "));

        let err = parse(serde_json::json!({ "address": "localhost:99999" })).unwrap_err();
        assert_eq!(err.path, "transports.gateway.address");
        let err = parse(serde_json::json!({ "url": "ws://localhost:1" })).unwrap_err();
        assert_eq!(
            err.to_string(),
            "transports.gateway.url is not a known option"
        );
        let err = parse(serde_json::json!(true)).unwrap_err();
        assert_eq!(err.to_string(), "transports.gateway must be an object");
    }

    #[test]
    fn loopback_hosts() {
        for h in [
            "localhost",
            "LocalHost",
            "127.0.0.1",
            "127.1.2.3",
            "127.255.255.255",
            "[::1]",
            "::1",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "128.0.0.1",
            "10.0.0.1",
            "[::2]",
            "localhost.example.com",
            "127.1",
            "0.0.0.0",
            "[::]",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }
}
