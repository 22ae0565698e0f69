//! The application as the client sees it: three callbacks, one for each thing the client hands
//! over — events for its listeners, batches for its durability hook, frames for its app
//! carriers. No output poses as another, so an embedder handles each with its own types.

pub use courier_engine::{BatchOrigin, HookBatch, HookMessage};

use crate::config::LogLevel;
use crate::event::ClientEvent;

/// What a started [`Client`](crate::client::Client) calls. Every call comes from the driver
/// thread, in the order of the step that produced it (`docs/architecture.md#the-step`), and the
/// driver waits for it: hand the value on (a channel, another thread's queue) and return.
pub trait App: Send + 'static {
    /// An event for the application's listeners.
    fn event(&mut self, event: ClientEvent);

    /// A step's events, in order: an application that crosses a thread boundary per call takes
    /// them in one crossing.
    fn events(&mut self, events: Vec<ClientEvent>) {
        for event in events {
            self.event(event);
        }
    }

    /// A batch for the durability hook (configured with `inboundDurabilityHook`). Store its
    /// messages, then report with [`Client::hook_done`](crate::client::Client::hook_done); one
    /// batch is out at a time, and one not reported within the hook's timeout has failed.
    fn hook_batch(&mut self, batch: HookBatch);

    /// A frame for an app carrier registered with
    /// [`Client::register_transport`](crate::client::Client::register_transport).
    fn app_carrier_send(&mut self, send: AppCarrierSend);

    /// The relay carrier is about to connect and `authToken` is the application's provider:
    /// answer `request` with [`Client::auth_token_provided`](crate::client::Client::auth_token_provided).
    fn auth_token_wanted(&mut self, request: u64);

    /// A carrier paused reading until the events dispatched so far are taken: release `barrier`
    /// once they are (`docs/architecture.md#backpressure-from-the-application`). The default
    /// releases it at once, for an application that handles events before it returns; one that
    /// queues them for another thread holds it while that queue is over its bound, so a stalled
    /// consumer pauses intake instead of growing the queue.
    fn caught_up(&mut self, barrier: Barrier) {
        barrier.release();
    }
}

/// A carrier waiting to read on (`carrier::intake`); dropping it releases the carrier too, as
/// a stopped driver does.
#[derive(Debug)]
pub struct Barrier(pub(crate) tokio::sync::oneshot::Sender<()>);

impl Barrier {
    #[cfg(test)]
    pub(crate) fn new() -> (Self, tokio::sync::oneshot::Receiver<()>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Self(tx), rx)
    }

    pub fn release(self) {
        let _ = self.0.send(());
    }
}

/// A frame to put on an app carrier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppCarrierSend {
    /// The carrier's registered name.
    pub carrier: String,
    /// The neighbor to hand the frame to.
    pub peer: String,
    /// The end-to-end message, encoded; the receiving device passes these bytes to
    /// [`Client::receive_frame`](crate::client::Client::receive_frame).
    pub frame: String,
    /// For an outbox message, the attempt to report once the carrier wrote the frame or failed
    /// to, with
    /// [`Client::app_carrier_send_done`](crate::client::Client::app_carrier_send_done).
    /// `None` for a delivery ACK, which is fire and forget.
    pub attempt: Option<SendAttempt>,
}

/// Attempt `send_seq` of the message whose wire id is `message_id`: a report for an older
/// attempt is stale and ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendAttempt {
    pub message_id: String,
    pub send_seq: u64,
}

/// The application behind the `logLevel` threshold: diagnostics below it are not handed over.
pub(crate) struct LevelFiltered {
    pub app: Box<dyn App>,
    pub threshold: LogLevel,
}

impl LevelFiltered {
    fn admits(&self, event: &ClientEvent) -> bool {
        event
            .diagnostic_level()
            .is_none_or(|level| self.threshold.admits(level))
    }
}

impl App for LevelFiltered {
    fn event(&mut self, event: ClientEvent) {
        if self.admits(&event) {
            self.app.event(event);
        }
    }

    fn events(&mut self, mut events: Vec<ClientEvent>) {
        events.retain(|event| self.admits(event));
        if !events.is_empty() {
            self.app.events(events);
        }
    }

    fn hook_batch(&mut self, batch: HookBatch) {
        self.app.hook_batch(batch);
    }

    fn app_carrier_send(&mut self, send: AppCarrierSend) {
        self.app.app_carrier_send(send);
    }

    fn auth_token_wanted(&mut self, request: u64) {
        self.app.auth_token_wanted(request);
    }

    fn caught_up(&mut self, barrier: Barrier) {
        self.app.caught_up(barrier);
    }
}
