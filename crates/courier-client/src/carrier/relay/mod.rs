//! The relay carrier: one WebSocket connection to `courier-relay` (`docs/protocol.md`), kept up
//! with reconnects, metered by the client token bucket. It reports every outcome to the driver
//! and decides nothing about delivery.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier_engine::{Carrier, DiagnosticLevel, Input};
use courier_proto::limits::{
    close, CAP_KEY_DIRECTORY, CAP_MAILBOX, CAP_PRESENCE_WATCH, MAX_CAPABILITIES,
    MAX_CAPABILITY_BYTES, MAX_FRAME_BYTES,
};
use courier_proto::security::{RELAY_ADDRESS_BINDING_MISMATCH, RELAY_ADDRESS_DECLARATION_REFUSED};
use courier_proto::{
    declare_address_after_auth, validate_identifier, ClientFrame, DecodeError, IdentityKey,
    RelayFrame,
};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, timeout};
use tokio_tungstenite::tungstenite::error::Error as WsError;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use crate::carrier::answers::Answers;
use crate::carrier::backoff::Backoff;
use crate::carrier::inbound::{inbound_input, Stamp};
use crate::carrier::intake::Intake;
use crate::carrier::presence::PresenceWatch;
use crate::carrier::release::Releases;
use crate::carrier::{report, Submit};
use crate::driver::e2e::DirectoryReport;
use crate::driver::{Command, DriverTx};
use crate::event::ClientEvent;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
const PING_EVERY: Duration = Duration::from_secs(10);
const DEAD_AFTER: Duration = Duration::from_secs(30);
/// After close 4001 the same token is presented at most once per this period.
const AUTH_RETRY_MIN: Duration = Duration::from_secs(30);
/// Frames owed to the relay (end-to-end ACKs, releases) past which reading waits: an inbound
/// flood is then read no faster than the rate limit lets its ACKs out, instead of piling
/// them up here.
const MAX_OWED_FRAMES: usize = 256;

type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

mod connect;
mod session;

use connect::{close_code_for, close_loss, close_message, connect, diagnostic, Authenticated};
use session::Session;

/// What the driver asks of the relay carrier.
#[derive(Debug)]
pub enum RelayOut {
    Submit(Submit),
    /// Release relay journal frame `seq`.
    ReleaseFrame {
        seq: u64,
    },
    /// The OS says the network is up (`true`: reconnect now) or down.
    Hint(bool),
    /// Inbound frames were processed but could not be stored (a failed commit), so they were not
    /// acked: start a new session, whose drain writes every unacked frame again.
    Redeliver,
    /// Start or stop hearing about a peer's presence (the engine's watchlist changed).
    Watch(String),
    Unwatch(String),
    /// A frame that sets an end-to-end session up (`docs/protocol.md#session-setup`): a
    /// directory request, or a key package or Welcome sent on its own.
    Setup(courier_proto::ClientFrame),
    /// Close the connection (1000) and end the task.
    Stop,
}

#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub url: String,
    pub token: String,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub auto_reconnect: bool,
    /// Proves this device's address to the relay on every connection
    /// (`docs/protocol.md#client-declaration`).
    pub identity: IdentityKey,
}

/// Why a connection ended, which decides what happens next.
enum Loss {
    /// Reconnect with backoff.
    Dropped(String),
    /// The relay refused the token: not again for 30 s.
    AuthRejected(String),
    /// Another session took over the account: no automatic reconnect.
    Superseded(String),
    /// The app said the network is down: wait for a hint or the backoff.
    Offline,
    /// Inbound frames could not be stored: reconnect for a redelivery, backing off while the
    /// storage keeps failing.
    Redeliver,
    /// The channel from the driver closed: the client is stopping.
    Stopped,
}

pub async fn run(
    settings: RelaySettings,
    mut rx: mpsc::UnboundedReceiver<RelayOut>,
    driver: DriverTx,
) {
    let mut attempt: u32 = 0;
    // Consecutive sessions ended for a redelivery: while storage keeps failing they back off.
    let mut redeliveries: u32 = 0;
    let mut superseded_reported = false;
    let mut presence = PresenceWatch::default();
    loop {
        let loss = match connect(&settings, &mut rx, &driver, &mut presence).await {
            Ok(Some(ws)) => {
                attempt = 0;
                Session::new(ws, &settings.identity, &driver, &mut presence)
                    .run(&mut rx)
                    .await
            }
            Ok(None) => Loss::Stopped,
            Err(loss) => loss,
        };
        if !matches!(loss, Loss::Redeliver) {
            redeliveries = 0;
        }
        let wait = match loss {
            Loss::Stopped => return,
            Loss::Redeliver => {
                let delay = Backoff::default().delay(redeliveries);
                redeliveries = redeliveries.saturating_add(1);
                diagnostic(
                    &driver,
                    DiagnosticLevel::Warn,
                    format!(
                        "reconnecting in {} ms so the relay redelivers inbound frames that could \
                         not be stored",
                        delay.as_millis()
                    ),
                );
                Some(delay)
            }
            Loss::Superseded(reason) => {
                if !superseded_reported {
                    superseded_reported = true;
                    driver.send(Command::Emit(ClientEvent::RelaySessionSuperseded {
                        reason,
                    }));
                }
                None
            }
            Loss::AuthRejected(reason) => {
                diagnostic(
                    &driver,
                    DiagnosticLevel::Error,
                    format!("relay refused the token: {reason}"),
                );
                Some(AUTH_RETRY_MIN)
            }
            Loss::Offline => None,
            Loss::Dropped(reason) => {
                diagnostic(
                    &driver,
                    DiagnosticLevel::Warn,
                    format!("relay connection lost: {reason}"),
                );
                if settings.auto_reconnect {
                    let delay = Backoff::default().delay(attempt);
                    attempt = attempt.saturating_add(1);
                    Some(delay)
                } else {
                    None
                }
            }
        };
        if !wait_for_reconnect(wait, &mut rx, &driver, &mut presence).await {
            return;
        }
        if superseded_reported {
            // An explicit reconnect from the app clears the latch.
            superseded_reported = false;
        }
    }
}

/// Waits out a pause between connections while answering the driver: sends fail at once (the
/// carrier is down), a `Hint(true)` cuts the wait short. `None` waits for a hint only.
/// Returns false when the client is stopping.
async fn wait_for_reconnect(
    wait: Option<Duration>,
    rx: &mut mpsc::UnboundedReceiver<RelayOut>,
    driver: &DriverTx,
    presence: &mut PresenceWatch,
) -> bool {
    let deadline = wait.map(|w| tokio::time::Instant::now() + w);
    loop {
        let cmd = match deadline {
            Some(d) => tokio::select! {
                cmd = rx.recv() => cmd,
                _ = sleep_until(d) => return true,
            },
            None => rx.recv().await,
        };
        match cmd {
            None | Some(RelayOut::Stop) => return false,
            Some(RelayOut::Hint(true)) => return true,
            Some(cmd) => refuse_while_down(cmd, driver, presence),
        }
    }
}

/// While no connection is up, sends fail at once and watchlist changes are remembered.
fn refuse_while_down(cmd: RelayOut, driver: &DriverTx, presence: &mut PresenceWatch) {
    match cmd {
        RelayOut::Submit(Submit::Outbox { id, send_seq, .. }) => driver.input(Input::SendFailed {
            id,
            send_seq,
            reason: "relay not connected".into(),
        }),
        RelayOut::Watch(peer) => presence.watch(peer),
        RelayOut::Unwatch(peer) => presence.unwatch(&peer),
        RelayOut::Submit(Submit::Ack { .. })
        // The next connection asks the directory again.
        | RelayOut::Setup(_)
        | RelayOut::ReleaseFrame { .. }
        | RelayOut::Hint(_)
        // The next session's drain writes every unacked frame anyway.
        | RelayOut::Redeliver
        | RelayOut::Stop => {}
    }
}
