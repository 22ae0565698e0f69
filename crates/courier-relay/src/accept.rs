//! Listening and accepting, shared by the relay and the gateway daemon: a listener with room for
//! connection bursts, and an accept loop that caps the connections it serves and, at shutdown,
//! gives them their close linger before it ends.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::metrics::AcceptCounters;
use crate::stopping;

/// Connections served at once unless configured otherwise (`--max-connections`).
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 16_384;

/// Connections the kernel completes while the accept loop catches up (capped by
/// `net.core.somaxconn`). The platform default of 128 overflowed when a few hundred clients
/// connected at once: their SYNs were dropped and retried after 1 s and more, and a silent
/// client could end up with a connection the relay never saw.
const LISTEN_BACKLOG: u32 = 4096;

/// Binds like `TcpListener::bind`, with room for connection bursts.
pub(crate) fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As std does: a restart may rebind while old connections linger in TIME_WAIT. Not on
    // Windows, where the option would let another process take the port.
    if cfg!(unix) {
        socket.set_reuseaddr(true)?;
    }
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// How an accept loop serves: `what` names the server in logs.
pub(crate) struct Serving {
    pub what: &'static str,
    pub max_connections: usize,
    pub close_linger: Duration,
    pub counters: AcceptCounters,
}

/// Accepts until `shutdown`, serving each connection with `serve`. Connections close
/// themselves on the same signal; they get `close_linger` twice over, and a second, to do so
/// before the rest are aborted.
pub(crate) async fn accept_loop<F>(
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
    serving: Serving,
    mut serve: impl FnMut(TcpStream, SocketAddr) -> F,
) where
    F: Future<Output = ()> + Send + 'static,
{
    let Serving {
        what,
        max_connections,
        close_linger,
        counters,
    } = serving;
    let mut connections = JoinSet::new();
    // The connection futures are spawned as they are: a wrapper awaiting one would hold it
    // twice over in a debug build's task. So the open count follows the set's length instead.
    let open = |connections: &JoinSet<()>| {
        counters.open.set(connections.len() as i64);
    };
    // Refusals are counted one by one but logged once per time the cap is reached.
    let mut at_cap = false;
    loop {
        tokio::select! {
            () = stopping(&mut shutdown) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => open(&connections),
            accepted = listener.accept() => match accepted {
                Ok((tcp, remote)) => {
                    while connections.try_join_next().is_some() {}
                    open(&connections);
                    if connections.len() >= max_connections {
                        counters.refused.inc();
                        if !at_cap {
                            at_cap = true;
                            tracing::warn!(server = what, limit = max_connections, "connection limit reached; refusing new connections");
                        }
                        continue;
                    }
                    if at_cap {
                        at_cap = false;
                        tracing::info!(server = what, limit = max_connections, "below the connection limit again");
                    }
                    counters.accepted.inc();
                    tracing::debug!(server = what, %remote, "connection accepted");
                    let _ = tcp.set_nodelay(true);
                    connections.spawn(serve(tcp, remote));
                    counters.open.inc();
                }
                Err(e) => {
                    // Typically out of file descriptors: back off instead of spinning.
                    tracing::warn!(server = what, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    drop(listener);
    let grace = close_linger * 2 + Duration::from_secs(1);
    let _ = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.shutdown().await;
    open(&connections);
}
