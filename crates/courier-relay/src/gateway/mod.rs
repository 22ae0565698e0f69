//! A minimal gateway daemon (`courier-relay gateway`): the attach of
//! `docs/protocol.md#gateway-attach` over TCP with newline-delimited JSON, then `SendMessage` /
//! `MessageReceived` between bound devices, in memory (no mailbox: an offline recipient is
//! unreachable).
//!
//! Per connection one task reads lines in order and writes its own answers; frames for it from
//! other connections arrive through a queue bounded in lines and bytes (`outbox.rs`), registered
//! under its address once bound. Only a bound connection is ever a recipient. A later binding of
//! the same address takes the route over and the earlier connection is told `SessionSuperseded`
//! and closed.
//!
//! Anyone who can reach the port may try to attach, so every resource a connection holds is
//! bounded (`docs/operating-the-relay.md#the-gateway`): connections per source, queued bytes per
//! recipient and in all, sends per second, and time without a line once bound.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use courier_proto::lines::MAX_LINE_BYTES;
use courier_proto::Address;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::outbox::{Bytes, OutboxTx};
use self::sources::Sources;
use crate::accept::{accept_loop, listen, Serving};
use crate::metrics::AcceptCounters;
use crate::{RateLimit, RelayError};

mod access;
pub mod attach;
mod connection;
mod outbox;
mod sources;

pub use self::access::{GatewayAccess, GatewayToken, MIN_TOKEN_LEN};
pub use self::sources::DEFAULT_MAX_CONNECTIONS_PER_SOURCE;

/// Default listen address (`localhost:4242`, `docs/protocol.md#gateway-framing`).
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 4242);

/// The gateway's clocks. Production uses the defaults; tests shorten them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatewayDaemonTimings {
    /// Connect to `Identify`; a silent socket is not kept forever.
    pub identify_deadline: Duration,
    /// `Challenge` to `DeclareAddress` (10 s, `docs/protocol.md#gateway-attach`).
    pub declare_deadline: Duration,
    /// Bound on writing one line to a peer that does not read.
    pub write_timeout: Duration,
    /// How long a closing connection keeps reading (and discarding) so the peer gets a clean
    /// end of stream rather than a reset.
    pub close_linger: Duration,
}

impl Default for GatewayDaemonTimings {
    fn default() -> Self {
        Self {
            identify_deadline: Duration::from_secs(10),
            declare_deadline: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            close_linger: Duration::from_secs(1),
        }
    }
}

/// Bytes queued for one bound connection at most unless configured otherwise.
pub const DEFAULT_MAX_QUEUE_BYTES: usize = 8 * 1024 * 1024;

/// Bytes queued for every bound connection together at most unless configured otherwise.
pub const DEFAULT_MAX_TOTAL_QUEUE_BYTES: usize = 512 * 1024 * 1024;

/// How long a bound connection may go without sending a line unless configured otherwise.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// `SendMessage` lines per bound connection unless configured otherwise: a burst, then a
/// steady rate.
pub const DEFAULT_SEND_RATE: RateLimit = RateLimit {
    burst: 200,
    per_sec: 100,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayConfig {
    /// `127.0.0.1:0` binds an ephemeral port; `GatewayHandle::port` tells which.
    pub listen: SocketAddr,
    /// Connections served at once; beyond it new ones are closed at accept.
    pub max_connections: usize,
    /// Connections from one source (an IPv4 address, an IPv6 /64) served at once; beyond it
    /// new ones from that source are closed at accept.
    pub max_connections_per_source: usize,
    /// Bytes of lines queued for one bound connection; a send that would pass it is answered
    /// unreachable. At least one line's worth (1 MiB).
    pub max_queue_bytes: usize,
    /// Bytes of lines queued for every bound connection together: what the queues can hold
    /// however many recipients read slowly at once. At least one line's worth (1 MiB).
    pub max_total_queue_bytes: usize,
    /// A bound connection that sends no line for this long is closed.
    pub idle_timeout: Duration,
    /// `SendMessage` lines one bound connection may send; the excess is answered `RateLimited`.
    pub send_rate: RateLimit,
    /// Who may attach, which decides where the gateway may listen.
    pub access: GatewayAccess,
    #[doc(hidden)]
    pub timings: GatewayDaemonTimings,
}

impl GatewayConfig {
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            max_connections: crate::accept::DEFAULT_MAX_CONNECTIONS,
            max_connections_per_source: DEFAULT_MAX_CONNECTIONS_PER_SOURCE,
            max_queue_bytes: DEFAULT_MAX_QUEUE_BYTES,
            max_total_queue_bytes: DEFAULT_MAX_TOTAL_QUEUE_BYTES,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            send_rate: DEFAULT_SEND_RATE,
            access: GatewayAccess::default(),
            timings: GatewayDaemonTimings::default(),
        }
    }

    /// Refuses settings the gateway cannot run with.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.max_connections == 0 || self.max_connections_per_source == 0 {
            return Err("max_connections and max_connections_per_source must be at least 1".into());
        }
        if self.max_queue_bytes.min(self.max_total_queue_bytes) < MAX_LINE_BYTES {
            return Err(format!(
                "max_queue_bytes and max_total_queue_bytes must be at least {MAX_LINE_BYTES} (one line)"
            ));
        }
        if self.idle_timeout.is_zero() {
            return Err("idle_timeout must be positive".into());
        }
        if self.send_rate.burst == 0 || self.send_rate.per_sec == 0 {
            return Err("send_rate burst and per_sec must be at least 1".into());
        }
        self.access.check_listen(self.listen)
    }
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self::new(DEFAULT_LISTEN)
    }
}

struct Route {
    connection: u64,
    queue: OutboxTx,
}

/// Why a frame was not handed to a recipient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undelivered {
    /// No other connection is bound to the address (or its queue is full or closing).
    Offline,
}

/// What every gateway connection shares.
pub(crate) struct Shared {
    pub timings: GatewayDaemonTimings,
    pub max_queue_bytes: usize,
    /// Every bound connection's queued bytes together.
    pub queue_budget: Arc<Bytes>,
    pub idle_timeout: Duration,
    pub send_rate: RateLimit,
    pub access: GatewayAccess,
    routes: Mutex<HashMap<Address, Route>>,
    pub shutdown: watch::Receiver<bool>,
    next_connection: AtomicU64,
}

impl Shared {
    fn routes(&self) -> MutexGuard<'_, HashMap<Address, Route>> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn next_connection_id(&self) -> u64 {
        self.next_connection.fetch_add(1, Ordering::Relaxed)
    }

    /// Makes `connection` the recipient for `address`; an earlier connection bound to it is
    /// told it was superseded.
    pub fn bind(&self, address: Address, connection: u64, queue: OutboxTx) {
        let previous = self.routes().insert(address, Route { connection, queue });
        if let Some(previous) = previous.filter(|p| p.connection != connection) {
            previous.queue.supersede();
        }
    }

    /// Drops the route for `address` if it still belongs to `connection`.
    pub fn unbind(&self, address: &Address, connection: u64) {
        let mut routes = self.routes();
        if routes
            .get(address)
            .is_some_and(|r| r.connection == connection)
        {
            routes.remove(address);
        }
    }

    /// Queues `line` for whichever other connection is bound to `address`.
    pub fn deliver(&self, address: &Address, from: u64, line: String) -> Result<(), Undelivered> {
        let routes = self.routes();
        let route = routes
            .get(address)
            .filter(|r| r.connection != from)
            .ok_or(Undelivered::Offline)?;
        route.queue.try_line(line).map_err(|_| Undelivered::Offline)
    }

    /// Addresses bound right now.
    pub fn bound(&self) -> usize {
        self.routes().len()
    }
}

/// A running gateway. Dropping it stops the gateway in the background; `stop` waits for it.
pub struct GatewayHandle {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl GatewayHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn port(&self) -> u16 {
        self.local_addr.port()
    }

    /// Addresses currently bound (one per attached device).
    pub fn bound_addresses(&self) -> usize {
        self.shared.bound()
    }

    /// Stops accepting and closes every connection; returns when no gateway task is left.
    pub async fn stop(mut self) {
        tracing::info!(local_addr = %self.local_addr, "gateway stopping");
        self.shutdown.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        tracing::info!(local_addr = %self.local_addr, "gateway stopped");
    }
}

impl Drop for GatewayHandle {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
    }
}

/// Binds and starts serving on the current tokio runtime.
pub async fn start_gateway(config: GatewayConfig) -> Result<GatewayHandle, RelayError> {
    let bind_error = |source| RelayError::Bind {
        addr: config.listen,
        source,
    };
    config.check().map_err(RelayError::Config)?;
    let listener = listen(config.listen).map_err(bind_error)?;
    let local_addr = listener.local_addr().map_err(bind_error)?;
    let (shutdown, shutdown_rx) = watch::channel(false);
    let shared = Arc::new(Shared {
        timings: config.timings,
        max_queue_bytes: config.max_queue_bytes,
        queue_budget: Arc::new(Bytes::new(config.max_total_queue_bytes)),
        idle_timeout: config.idle_timeout,
        send_rate: config.send_rate,
        access: config.access.clone(),
        routes: Mutex::default(),
        shutdown: shutdown_rx,
        next_connection: AtomicU64::new(1),
    });
    let sources = Arc::new(Sources::new(config.max_connections_per_source));
    let serving = {
        let shared = Arc::clone(&shared);
        let serving = Serving {
            what: "gateway",
            max_connections: config.max_connections,
            close_linger: shared.timings.close_linger,
            counters: AcceptCounters::default(),
        };
        accept_loop(
            listener,
            shared.shutdown.clone(),
            serving,
            move |tcp, remote| {
                let shared = Arc::clone(&shared);
                // Taken here, as the connection is accepted, so a flood from one source is
                // turned away before any of it is read.
                let slot = sources.admit(remote.ip());
                async move {
                    match slot {
                        Some(slot) => connection::serve(shared, tcp, remote, slot).await,
                        None => {
                            tracing::debug!(%remote, "per-source connection limit reached; closing");
                            drop(tcp);
                        }
                    }
                }
            },
        )
    };
    let task = tokio::spawn(serving);
    tracing::info!(
        %local_addr,
        max_connections = config.max_connections,
        max_connections_per_source = config.max_connections_per_source,
        token_required = matches!(config.access, GatewayAccess::Token(_)),
        "gateway listening"
    );
    if config.access == GatewayAccess::Public && !local_addr.ip().is_loopback() {
        tracing::warn!(%local_addr, "gateway open to anyone who can reach it: no attach token is required");
    }
    Ok(GatewayHandle {
        local_addr,
        shared,
        shutdown,
        task: Some(task),
    })
}
