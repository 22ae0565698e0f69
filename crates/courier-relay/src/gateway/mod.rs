//! A minimal gateway daemon (`courier-relay gateway`): the attach of
//! `docs/protocol.md#gateway-attach` over TCP with newline-delimited JSON, then `SendMessage` /
//! `MessageReceived` between bound devices, in memory (no mailbox: an offline recipient is
//! unreachable).
//!
//! Per connection one task reads lines in order and writes its own answers; frames for it from
//! other connections arrive through a bounded queue registered under its address once bound.
//! Only a bound connection is ever a recipient. A later binding of the same address takes the
//! route over and the earlier connection is told `SessionSuperseded` and closed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use courier_proto::proof::CHALLENGE_LEN;
use courier_proto::Address;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::accept::{accept_loop, listen, Serving};
use crate::metrics::AcceptCounters;
use crate::RelayError;

pub mod attach;
mod connection;

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
    /// Test hook (feature `test-hooks`): every connection gets these bytes as its challenge
    /// instead of 32 fresh CSPRNG bytes, so a test can replay a proof across connections.
    #[cfg(feature = "test-hooks")]
    pub fixed_challenge: Option<[u8; CHALLENGE_LEN]>,
}

impl GatewayDaemonTimings {
    /// A connection's challenge; `None` when the system random generator fails.
    pub(crate) fn challenge(&self) -> Option<[u8; CHALLENGE_LEN]> {
        #[cfg(feature = "test-hooks")]
        if self.fixed_challenge.is_some() {
            return self.fixed_challenge;
        }
        crate::auth::new_challenge()
    }
}

impl Default for GatewayDaemonTimings {
    fn default() -> Self {
        Self {
            identify_deadline: Duration::from_secs(10),
            declare_deadline: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            close_linger: Duration::from_secs(1),
            #[cfg(feature = "test-hooks")]
            fixed_challenge: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayConfig {
    /// `127.0.0.1:0` binds an ephemeral port; `GatewayHandle::port` tells which.
    pub listen: SocketAddr,
    /// Connections served at once; beyond it new ones are closed at accept.
    pub max_connections: usize,
    #[doc(hidden)]
    pub timings: GatewayDaemonTimings,
}

impl GatewayConfig {
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            max_connections: crate::accept::DEFAULT_MAX_CONNECTIONS,
            timings: GatewayDaemonTimings::default(),
        }
    }
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self::new(DEFAULT_LISTEN)
    }
}

/// What a bound connection's queue carries.
#[derive(Debug)]
pub(crate) enum Outbound {
    /// One encoded line (without its `\n`).
    Line(String),
    /// Another connection bound the same address: say so and close.
    Superseded,
}

/// Frames queued for one connection at most; a recipient that far behind is unreachable.
pub(crate) const OUTBOX: usize = 1024;

struct Route {
    connection: u64,
    queue: mpsc::Sender<Outbound>,
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
    pub spent: attach::SpentChallenges,
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
    pub fn bind(&self, address: Address, connection: u64, queue: mpsc::Sender<Outbound>) {
        let previous = self.routes().insert(address, Route { connection, queue });
        if let Some(previous) = previous.filter(|p| p.connection != connection) {
            let _ = previous.queue.try_send(Outbound::Superseded);
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
        route
            .queue
            .try_send(Outbound::Line(line))
            .map_err(|_| Undelivered::Offline)
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
    if config.max_connections == 0 {
        return Err(RelayError::Config(
            "max_connections must be at least 1".into(),
        ));
    }
    let listener = listen(config.listen).map_err(bind_error)?;
    let local_addr = listener.local_addr().map_err(bind_error)?;
    let (shutdown, shutdown_rx) = watch::channel(false);
    let shared = Arc::new(Shared {
        timings: config.timings,
        spent: attach::SpentChallenges::default(),
        routes: Mutex::default(),
        shutdown: shutdown_rx,
        next_connection: AtomicU64::new(1),
    });
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
            move |tcp, remote| connection::serve(Arc::clone(&shared), tcp, remote),
        )
    };
    let task = tokio::spawn(serving);
    tracing::info!(%local_addr, max_connections = config.max_connections, "gateway listening");
    Ok(GatewayHandle {
        local_addr,
        shared,
        shutdown,
        task: Some(task),
    })
}
