//! The relay carrier: one WebSocket connection to `courier-relay` (`docs/protocol.md`), kept up
//! with reconnects, metered by the client token bucket. It reports every outcome to the driver
//! and decides nothing about delivery.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier_engine::io::GroupReport;
use courier_engine::{Carrier, DiagnosticLevel, Input};
use courier_proto::limits::{
    close, CAP_GROUP_DELIVERY, CAP_KEY_DIRECTORY, CAP_MAILBOX, CAP_PRESENCE_WATCH,
    MAX_CAPABILITIES, MAX_CAPABILITY_BYTES, MAX_FRAME_BYTES,
};
use courier_proto::message::META_GROUP_ID;
use courier_proto::security::{
    RELAY_ADDRESS_BINDING_MISMATCH, RELAY_ADDRESS_DECLARATION_REFUSED, RELAY_SESSION_SUPERSEDED,
};
use courier_proto::{
    declare_address_after_auth, validate_identifier, ClientFrame, DecodeError, IdentityKey,
    Message, RelayFrame,
};
use futures_util::stream::SplitStream;
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
use crate::driver::groups::GroupRelayReport;
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

/// How long a closing connection waits for its last frames, the Close among them, to go out.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

mod connect;
mod nodes;
mod session;
pub mod token;
mod writer;

use connect::{close_code_for, close_loss, close_message, connect, diagnostic, Authenticated};
use nodes::Nodes;
use session::Session;
use token::TokenSource;
use writer::FrameWriter;

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
    /// Drop the connection, if one is up, and dial again at once (`reconnect()`).
    Reconnect,
    /// `setAuthToken()` replaced the fixed token: a wait after a refused token ends now.
    TokenChanged,
    /// Inbound frames were processed but could not be stored (a failed commit), so they were not
    /// acked: start a new session, whose drain writes every unacked frame again.
    Redeliver,
    /// Start or stop hearing about a peer's presence (the engine's watchlist changed).
    Watch(String),
    Unwatch(String),
    /// A group frame (`docs/protocol.md#group-frames`): a broadcast or a registration request,
    /// funded with the sends. Its answers come back as frames of their own.
    Group(courier_proto::ClientFrame),
    /// A frame that sets an end-to-end session up (`docs/protocol.md#session-setup`): a
    /// directory request, or a key package or Welcome sent on its own.
    Setup(courier_proto::ClientFrame),
    /// Close the connection (1000) and end the task.
    Stop,
}

#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// One relay, or the nodes of one relay cluster ([`nodes`]); never empty.
    pub urls: Vec<String>,
    pub token: TokenSource,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub auto_reconnect: bool,
    /// After `internetStatusChanged(false)` the carrier dials again this late even if no `true`
    /// came: a hint cannot keep the client offline for good.
    pub offline_redial: Duration,
    /// Proves this device's address to the relay on every connection
    /// (`docs/protocol.md#client-declaration`).
    pub identity: IdentityKey,
}

/// Why a connection ended, which decides what happens next.
enum Loss {
    /// Reconnect with backoff.
    Dropped(String),
    /// The relay refused the token: a fixed one not again for 30 s.
    AuthRejected(String),
    /// The application's provider gave no token.
    NoToken(String),
    /// The application asked for a new connection now.
    Reconnect,
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
    // The carrier's, not a connection's: a reconnect while the driver or the application is
    // behind does not reopen reading (`carrier::intake`).
    let mut intake = Intake::default();
    let mut nodes = Nodes::new(&settings.urls);
    loop {
        let url = nodes.current();
        let loss = match connect(&settings, url, &mut rx, &driver, &mut presence).await {
            Ok(Some(ws)) => {
                attempt = 0;
                Session::new(ws, &settings.identity, &driver, &mut presence, &mut intake)
                    .run(&mut rx)
                    .await
            }
            Ok(None) => Loss::Stopped,
            Err(loss) => loss,
        };
        if !matches!(loss, Loss::Redeliver) {
            redeliveries = 0;
        }
        let refused = matches!(loss, Loss::AuthRejected(_));
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
                    // A login elsewhere with this account's token: the app should hear it as a
                    // security matter, not only as a lost connection.
                    report::security_warning(
                        &driver,
                        settings.identity.address().to_string(),
                        RELAY_SESSION_SUPERSEDED,
                        "another connection logged in with this account's token and displaced this one",
                    );
                }
                None
            }
            Loss::AuthRejected(reason) => {
                let wait = match settings.token {
                    TokenSource::Fixed(_) => AUTH_RETRY_MIN,
                    TokenSource::Provided(_) => next_backoff(&mut attempt),
                };
                diagnostic(
                    &driver,
                    DiagnosticLevel::Error,
                    format!(
                        "relay refused the token: {reason}; trying again in {} ms",
                        wait.as_millis()
                    ),
                );
                auth_failed(&driver, reason, None, wait);
                Some(wait)
            }
            Loss::NoToken(message) => {
                let wait = next_backoff(&mut attempt);
                diagnostic(
                    &driver,
                    DiagnosticLevel::Error,
                    format!(
                        "no relay token: {message}; trying again in {} ms",
                        wait.as_millis()
                    ),
                );
                auth_failed(&driver, "token_unavailable".into(), Some(message), wait);
                Some(wait)
            }
            Loss::Reconnect => {
                attempt = 0;
                Some(Duration::ZERO)
            }
            Loss::Offline => settings.auto_reconnect.then_some(settings.offline_redial),
            Loss::Dropped(reason) => {
                let next = match nodes.fail_over() {
                    Some(next) => format!("; next attempt at {next}"),
                    None => String::new(),
                };
                diagnostic(
                    &driver,
                    DiagnosticLevel::Warn,
                    format!("relay connection to {url} lost: {reason}{next}"),
                );
                settings.auto_reconnect.then(|| next_backoff(&mut attempt))
            }
        };
        let after_refusal = matches!(settings.token, TokenSource::Fixed(_)) && refused;
        if !wait_for_reconnect(wait, after_refusal, &mut rx, &driver, &mut presence).await {
            return;
        }
        if superseded_reported {
            // An explicit reconnect from the app clears the latch.
            superseded_reported = false;
        }
    }
}

/// The pause before the next attempt of a run of failed ones.
fn next_backoff(attempt: &mut u32) -> Duration {
    let delay = Backoff::default().delay(*attempt);
    *attempt = attempt.saturating_add(1);
    delay
}

fn auth_failed(driver: &DriverTx, reason: String, message: Option<String>, wait: Duration) {
    driver.send(Command::Emit(ClientEvent::AuthFailed {
        reason,
        message,
        retry_in_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
    }));
}

/// Waits out a pause between connections while answering the driver: sends fail at once (the
/// carrier is down), a `Hint(true)` or `Reconnect` cuts the wait short, and so does a new token
/// when the wait follows a refused one. `None` waits for those only. Returns false when the
/// client is stopping.
async fn wait_for_reconnect(
    wait: Option<Duration>,
    after_refusal: bool,
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
            Some(RelayOut::Hint(true) | RelayOut::Reconnect) => return true,
            Some(RelayOut::TokenChanged) if after_refusal => return true,
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
        // A broadcast's wait ended with the connection (the engine downgraded it); the next
        // connection registers the groups again.
        | RelayOut::Group(_)
        | RelayOut::ReleaseFrame { .. }
        | RelayOut::Hint(_)
        | RelayOut::Reconnect
        | RelayOut::TokenChanged
        // The next session's drain writes every unacked frame anyway.
        | RelayOut::Redeliver
        | RelayOut::Stop => {}
    }
}
