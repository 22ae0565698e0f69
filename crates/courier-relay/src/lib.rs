//! `courier-relay`: the offline-courier relay server; its wire protocol is `docs/protocol.md`.
//!
//! Clients connect over WebSocket (`ws://`, or `wss://` with [`TlsConfig`]), authenticate with
//! an HS256 JWT, and exchange frames with other accounts. With the mailbox on, every accepted
//! frame is committed to the recipient's SQLite journal before anyone hears of it, carries a
//! per-account `seq`, and stays until acked or expired; offline recipients get it in their
//! next connection's drain.
//!
//! A connection may prove an identity key (`DeclareAddress`,
//! `docs/protocol.md#address-declaration`): from the next frame on, its frames are stamped with the
//! key's `off1` address, and the address (bound in SQLite to the account that declared it last)
//! names that account as a recipient and in presence queries.
//!
//! Task layout, per connection: a reader that handles frames strictly in arrival order and a
//! writer that owns the socket's sending half (answers, presence pushes, drain, live frames,
//! pings). The store is one thread with one SQLite connection; the router maps accounts to
//! live connections, and watched accounts to the connections watching them (`presence.rs`).
//!
//! [`gateway`] is a separate, minimal daemon (`courier-relay gateway`): the attach of
//! `docs/protocol.md#gateway-attach` over TCP with newline-delimited JSON, then live SendMessage /
//! MessageReceived between bound devices, in memory.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::task::JoinHandle;

mod accept;
mod attempts;
mod auth;
pub mod cli;
pub mod cluster;
mod config;
mod connection;
mod contacts;
mod directory;
mod dispatch;
mod durable;
mod error;
mod fanout;
pub mod gateway;
mod group;
mod lanes;
mod linger;
pub mod logging;
mod mailbox;
mod metrics;
mod monitor;
mod node;
mod presence;
mod rate;
mod read_budget;
mod remote;
mod revocation;
mod rosters;
mod router;
mod send;
mod store;
mod tls;
mod visibility;
mod writer;

/// The NATS cluster the cluster mode's unit tests run against, shared with the integration tests.
#[cfg(test)]
#[path = "../tests/common/nats.rs"]
#[allow(dead_code)]
mod nats_harness;

pub use auth::issue_token;
pub use config::{
    AddressLimits, AttemptLimit, AuthPolicy, ClusterStorage, MailboxLimits, PresenceVisibility,
    RateLimit, RelayConfig, Storage, Timings, TlsConfig, DEFAULT_MAX_GROUP_MEMBERS,
    MAX_GROUP_MEMBERS_CEILING, MIN_SECRET_BYTES,
};
pub use error::RelayError;
pub use gateway::{start_gateway, GatewayConfig, GatewayDaemonTimings, GatewayHandle};
pub use mailbox::{Envelope, GroupTag};
pub use store::{Named, Release, StoreError};

use accept::Serving;
use attempts::AuthLimits;
use auth::TokenVerifier;
use durable::Durable;
use metrics::Metrics;
use node::Node;
use rate::AccountBuckets;
use revocation::{DenyFile, DenyList, Revocations};
use router::Router;
use store::Store;

/// Locks `m` even if a task panicked holding it: the relay's locks guard plain maps and
/// counters that every critical section leaves consistent, so the relay keeps serving rather
/// than taking every later caller down with it.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Milliseconds since the Unix epoch (the protocol's time unit).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What every connection task shares.
pub(crate) struct Ctx {
    pub mailbox: Option<MailboxLimits>,
    pub max_group_members: u32,
    pub key_directory: bool,
    pub presence_visibility: PresenceVisibility,
    pub rate_limit: RateLimit,
    pub addresses: AddressLimits,
    /// Every account's token bucket, shared by its connections over time.
    pub buckets: AccountBuckets,
    pub timings: Timings,
    pub verifier: TokenVerifier,
    pub auth_limits: AuthLimits,
    pub revocations: Revocations,
    pub store: Durable,
    pub router: Arc<Router>,
    pub metrics: Metrics,
    pub shutdown: watch::Receiver<bool>,
    next_connection: AtomicU64,
}

impl Ctx {
    pub fn next_connection_id(&self) -> u64 {
        self.next_connection.fetch_add(1, Ordering::Relaxed)
    }
}

/// Resolves once the relay is stopping (or its handle is gone).
pub(crate) async fn stopping(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// A snapshot for monitoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RelayStats {
    /// Authenticated connections (at most one per account).
    pub connections: u64,
    /// Accounts that ever authenticated.
    pub accounts: u64,
    /// Journal frames not yet acked or expired.
    pub stored_frames: u64,
    /// Presence watches (`WatchPresence` identifiers), summed over connections.
    pub watches: u64,
}

/// A running relay. Dropping it stops the relay in the background; `stop` waits for it.
pub struct RelayHandle {
    local_addr: SocketAddr,
    tls: bool,
    ctx: Arc<Ctx>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    monitor: Option<Monitor>,
}

/// The monitoring listener's task, stopped after the relay's own.
struct Monitor {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl RelayHandle {
    /// `ws://IP:PORT`, or `wss://localhost:PORT` with TLS so certificate names match.
    pub fn url(&self) -> String {
        if self.tls {
            format!("wss://localhost:{}", self.local_addr.port())
        } else {
            format!("ws://{}", self.local_addr)
        }
    }

    pub fn port(&self) -> u16 {
        self.local_addr.port()
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where `/healthz`, `/readyz` and `/metrics` are served, with `metrics_listen` set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.monitor.as_ref().map(|m| m.addr)
    }

    pub fn stats(&self) -> RelayStats {
        RelayStats {
            connections: self.ctx.router.connections() as u64,
            accounts: self.ctx.store.accounts(),
            stored_frames: self.ctx.store.stored_frames(),
            watches: self.ctx.router.watches() as u64,
        }
    }

    /// Stops accepting, closes every connection with 1001, then flushes and closes the
    /// database. Returns when no relay task is left.
    pub async fn stop(mut self) {
        tracing::info!(url = %self.url(), "relay stopping");
        self.shutdown.send_replace(true);
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
        self.ctx.store.shutdown().await;
        if let Some(monitor) = self.monitor.take() {
            monitor.stop.send_replace(true);
            let _ = monitor.task.await;
        }
        tracing::info!(url = %self.url(), "relay stopped");
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
        if let Some(monitor) = &self.monitor {
            monitor.stop.send_replace(true);
        }
    }
}

/// Binds, opens the database and starts serving on the current tokio runtime.
pub async fn start(config: RelayConfig) -> Result<RelayHandle, RelayError> {
    config.validate()?;
    let verifier = TokenVerifier::new(&config.jwt_secret, &config.auth)?;
    let deny_file = config
        .auth
        .revoked_tokens
        .as_deref()
        .map(DenyFile::open)
        .transpose()?;
    let (deny_file, deny_list) = match deny_file {
        Some((file, list)) => (Some(file), list),
        None => (None, DenyList::default()),
    };
    let (revoked, revocations) = watch::channel(Arc::new(deny_list));
    let tls = config.tls.as_ref().map(tls::acceptor).transpose()?;
    let metrics = Metrics::new();
    let router = Arc::new(Router::default());
    let store = match &config.storage {
        Storage::Cluster(cluster) => Durable::Cluster(
            Node::start(
                cluster,
                config.mailbox,
                config.addresses,
                Arc::clone(&router),
                metrics.commit_seconds.clone(),
            )
            .await?,
        ),
        local => {
            let path = match local {
                Storage::Path(path) => Some(path.clone()),
                _ => None,
            };
            let store_router = Arc::clone(&router);
            let commit_seconds = metrics.commit_seconds.clone();
            let store = tokio::task::spawn_blocking(move || {
                Store::open(path.as_deref(), store_router, commit_seconds)
            })
            .await
            .map_err(|e| {
                RelayError::Config(format!("opening the database was interrupted: {e}"))
            })??;
            Durable::File(store)
        }
    };
    let bind = |addr: SocketAddr| {
        let listener = accept::listen(addr)?;
        let local_addr = listener.local_addr()?;
        Ok((listener, local_addr))
    };
    let (listener, local_addr) = bind(config.listen).map_err(|source| RelayError::Bind {
        addr: config.listen,
        source,
    })?;
    let monitor_listener = config
        .metrics_listen
        .map(|addr| bind(addr).map_err(|source| RelayError::Bind { addr, source }))
        .transpose()?;

    let (shutdown, shutdown_rx) = watch::channel(false);
    let ctx = Arc::new(Ctx {
        mailbox: config.mailbox,
        max_group_members: config.max_group_members,
        key_directory: config.key_directory,
        presence_visibility: config.presence_visibility,
        rate_limit: config.rate_limit,
        addresses: config.addresses,
        buckets: AccountBuckets::new(config.rate_limit),
        timings: config.timings,
        verifier,
        auth_limits: AuthLimits::new(&config.auth),
        revocations,
        store,
        router,
        metrics,
        shutdown: shutdown_rx,
        next_connection: AtomicU64::new(1),
    });
    let serving = {
        let (ctx, tls) = (Arc::clone(&ctx), tls.clone());
        let serving = Serving {
            what: "relay",
            max_connections: config.max_connections,
            close_linger: ctx.timings.close_linger,
            counters: ctx.metrics.accept.clone(),
        };
        accept::accept_loop(
            listener,
            ctx.shutdown.clone(),
            serving,
            move |tcp, remote| connection::serve(Arc::clone(&ctx), tcp, tls.clone(), remote),
        )
    };
    let mut tasks = vec![
        tokio::spawn(serving),
        tokio::spawn(purge_loop(Arc::clone(&ctx))),
    ];
    if let Some(file) = deny_file {
        tasks.push(tokio::spawn(revocation::watch_file(
            Arc::clone(&ctx),
            file,
            revoked,
        )));
    }
    let monitor = monitor_listener.map(|(listener, addr)| {
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(monitor::serve(listener, Arc::clone(&ctx), stop_rx));
        Monitor { addr, stop, task }
    });
    let handle = RelayHandle {
        local_addr,
        tls: tls.is_some(),
        ctx,
        shutdown,
        tasks,
        monitor,
    };
    let storage = match &config.storage {
        Storage::Path(path) => path.display().to_string(),
        Storage::Memory => "memory".to_owned(),
        Storage::Cluster(cluster) => {
            format!("cluster {} on {}", cluster.name, cluster.servers.join(","))
        }
    };
    tracing::info!(
        url = %handle.url(),
        metrics = handle.metrics_addr().map(tracing::field::display),
        storage = %storage,
        mailbox = config.mailbox.is_some(),
        key_directory = config.key_directory,
        max_connections = config.max_connections,
        "relay listening"
    );
    if in_the_clear_beyond_loopback(local_addr, handle.tls) {
        // Tokens would cross the network in the clear (`docs/operating-the-relay.md#listening-beyond-loopback`).
        tracing::warn!(url = %handle.url(), "listening beyond loopback without TLS: tokens and frames travel in the clear; serve wss:// (--tls-cert, --tls-key) or put a TLS proxy in front");
    }
    Ok(handle)
}

/// Whether a listener at `addr` would carry tokens in the clear to other hosts.
fn in_the_clear_beyond_loopback(addr: SocketAddr, tls: bool) -> bool {
    !tls && !addr.ip().to_canonical().is_loopback()
}

/// Deletes what has outlived its time: expired journal frames (with a mailbox), group copy
/// records and held reports past their 24 h, and address bindings not declared again within
/// their lifetime.
async fn purge_loop(ctx: Arc<Ctx>) {
    let mut shutdown = ctx.shutdown.clone();
    let mut tick = tokio::time::interval(ctx.timings.purge_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stopping(&mut shutdown) => return,
            _ = tick.tick() => {
                if let Some(limits) = ctx.mailbox {
                    purge_journal(&ctx, limits).await;
                }
                purge_groups(&ctx).await;
                purge_addresses(&ctx).await;
            }
        }
    }
}

async fn purge_journal(ctx: &Ctx, limits: MailboxLimits) {
    let cutoff = now_ms().saturating_sub(limits.ttl_ms);
    match ctx.store.purge(cutoff).await {
        Ok(0) => {}
        Ok(n) => {
            ctx.metrics.purged(n);
            tracing::info!(frames = n, "purged expired frames");
        }
        Err(e) => {
            ctx.metrics.purge_failed();
            tracing::warn!(error = %e, "purging expired frames failed");
        }
    }
}

async fn purge_addresses(ctx: &Ctx) {
    let cutoff = now_ms().saturating_sub(ctx.addresses.ttl_ms);
    match ctx.store.purge_addresses(cutoff).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(bindings = n, "expired address bindings"),
        Err(e) => {
            ctx.metrics.purge_failed();
            tracing::warn!(error = %e, "expiring address bindings failed");
        }
    }
}

async fn purge_groups(ctx: &Ctx) {
    let cutoff = now_ms().saturating_sub(fanout::GROUP_MEMORY_MS);
    match ctx.store.purge_groups(cutoff).await {
        Ok(0) => {}
        Ok(n) => tracing::debug!(rows = n, "purged group copy records and held reports"),
        Err(e) => {
            ctx.metrics.purge_failed();
            tracing::warn!(error = %e, "purging group records failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_listeners_beyond_loopback_are_warned_about() {
        let at = |addr: &str| addr.parse::<SocketAddr>().unwrap();
        assert!(in_the_clear_beyond_loopback(at("0.0.0.0:8080"), false));
        assert!(in_the_clear_beyond_loopback(at("192.0.2.1:8080"), false));
        assert!(in_the_clear_beyond_loopback(at("[::]:8080"), false));
        assert!(!in_the_clear_beyond_loopback(at("0.0.0.0:8080"), true));
        assert!(!in_the_clear_beyond_loopback(at("127.0.0.1:8080"), false));
        assert!(!in_the_clear_beyond_loopback(at("127.0.0.2:8080"), false));
        assert!(!in_the_clear_beyond_loopback(at("[::1]:8080"), false));
        assert!(!in_the_clear_beyond_loopback(
            at("[::ffff:127.0.0.1]:8080"),
            false
        ));
    }
}
