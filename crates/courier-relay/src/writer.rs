//! The sending half of a connection: answers from the reader, presence pushes, keepalive
//! Pings, and inbound frames in seq order — drain, DrainComplete, held group reports, then live
//! (`docs/protocol.md#journal-and-seq`, `docs/protocol.md#drain`,
//! `docs/protocol.md#group-frames`). See `mailbox.rs` for the ordering invariants this loop
//! keeps.
//!
//! Answers are pipelined (`docs/protocol.md#transport`): the reader queues a frame's store
//! request and goes on reading, handing the writer the answer to come. The writer writes
//! answers in the order of the frames they answer, each once its group commit is durable, and
//! writes whatever is ready in one batch before it flushes the socket.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use courier_proto::limits::close;
use courier_proto::RelayFrame;
use futures_util::stream::SplitSink;
use futures_util::{FutureExt, SinkExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Bytes, Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use crate::fanout::GROUP_MEMORY_MS;
use crate::mailbox::{DeliveryReceiver, Envelope, Outflow, Phase};
use crate::router::Peer;
use crate::store::{Release, StoreError};
use crate::{now_ms, Ctx};

/// Answers and commands the writer holds in order behind one that is not decided yet; the
/// reader waits beyond this (and the channel's own room).
const PIPELINE: usize = 256;
/// Live frames written in one batch before the writer looks at its other sources again.
const DELIVERY_BATCH: usize = 64;

/// An answer decided once its store request is durable: the frame to write, if any.
pub type Later = Pin<Box<dyn Future<Output = Option<RelayFrame>> + Send>>;

/// What the reader (and a group report, `fanout.rs`) asks the writer to do, in order.
pub enum Outbound {
    Frame(RelayFrame),
    /// Written in its place in the order once decided; what was queued after it waits for it.
    Later(Later),
    /// A group report; `written` hears once it is flushed to the socket, and is dropped unheard
    /// if it never is (the report is then held for the account).
    Report {
        report: RelayFrame,
        written: oneshot::Sender<()>,
    },
    /// Drain rule (a) or (b) of `docs/protocol.md#drain` fired.
    StartDrain,
    /// Write Close with this code and stop.
    Close(u16),
}

pub type Sink<S> = SplitSink<WebSocketStream<S>, Message>;

/// Why the writer stopped.
enum Stop {
    /// The socket failed, or the connection task stopped feeding the writer.
    Broken,
    /// A Close frame is written: the socket is left to the connection task to read out.
    Closed,
    /// A write made no progress for `write_stall` (`docs/protocol.md#transport`).
    Stalled,
}

enum Step {
    Presence,
    /// The first queued answer is decided: the frame to write, if any.
    Decided(Option<RelayFrame>),
    Control(Option<Outbound>),
    Ping,
    StartDrain,
    ReadJournal,
    Lagged,
    Deliver(Option<Arc<Envelope>>),
    HeldReports,
}

struct Writer<S> {
    sink: Sink<S>,
    ctx: Arc<Ctx>,
    peer: Arc<Peer>,
    /// Opted in to `mailbox_v1` (`docs/protocol.md#acknowledged-delivery-opt-in`): frames carry
    /// `seq`, the drain ends with DrainComplete, and frames stay journaled until acked. Otherwise
    /// they are released once written.
    opted_in: bool,
    journaled: bool,
    flow: Outflow,
    /// Publishes `flow.watermark` once what it covers is flushed (`mailbox.rs`).
    flushed: watch::Sender<u64>,
    /// The drain is over (or there is none): held group reports may be written.
    drained: bool,
    /// What the reader queued, in its order, from the first answer not yet decided on.
    queued: VecDeque<Outbound>,
    /// Frames fed to the socket since its last flush.
    unflushed: bool,
    /// Journal frames up to this seq are released (without the opt-in).
    released: u64,
}

/// Writes until the connection ends; returns the sink once it wrote a Close frame, so the
/// connection task can read the socket out (`linger.rs`).
pub async fn run<S>(
    sink: Sink<S>,
    mut control: mpsc::Receiver<Outbound>,
    deliveries: DeliveryReceiver,
    peer: Arc<Peer>,
    ctx: Arc<Ctx>,
    opted_in: bool,
) -> Option<Sink<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let journaled = ctx.mailbox.is_some();
    let timings = ctx.timings;
    let DeliveryReceiver {
        frames: mut deliveries,
        flushed,
    } = deliveries;
    let mut writer = Writer {
        sink,
        ctx,
        peer: Arc::clone(&peer),
        opted_in,
        journaled,
        flow: Outflow::new(journaled),
        flushed,
        drained: !journaled,
        queued: VecDeque::new(),
        unflushed: false,
        released: 0,
    };
    // Without a journal there is no drain to wait for.
    if writer.drained && writer.held_reports().await.is_err() {
        return None;
    }
    let mut ping = tokio::time::interval_at(
        Instant::now() + timings.ping_interval,
        timings.ping_interval,
    );
    ping.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Only a connection that opted in is held for the grace, in which it may still declare its
    // address (`docs/protocol.md#drain`). Any other one's traffic flows at once.
    let grace = tokio::time::sleep(if opted_in {
        timings.drain_grace
    } else {
        Duration::ZERO
    });
    tokio::pin!(grace);

    loop {
        let awaiting_drain = writer.flow.phase == Phase::AwaitingDrain;
        let reading_journal = writer.flow.reading_journal();
        let live = writer.flow.live();
        let drained = writer.drained;
        let undecided = matches!(writer.queued.front(), Some(Outbound::Later(_)));
        let room = writer.queued.len() < PIPELINE;
        let step = tokio::select! {
            biased;
            // Ahead of control: a watch's first statuses, queued while its frame was handled,
            // go out before the answer to any later frame (presence.rs).
            () = peer.watchlist.ready() => Step::Presence,
            frame = first_decided(&mut writer.queued), if undecided => Step::Decided(frame),
            cmd = control.recv(), if room => Step::Control(cmd),
            _ = ping.tick() => Step::Ping,
            () = &mut grace, if awaiting_drain => Step::StartDrain,
            () = peer.reports.notified(), if drained => Step::HeldReports,
            () = std::future::ready(()), if reading_journal => Step::ReadJournal,
            () = peer.queue.lag_signalled(), if live => Step::Lagged,
            envelope = deliveries.recv(), if live => Step::Deliver(envelope),
        };
        let result = match step {
            Step::Presence => writer.presence().await,
            Step::Decided(frame) => {
                writer.queued.pop_front();
                writer.answer(frame, &mut control).await
            }
            Step::Control(None) | Step::Deliver(None) => Err(Stop::Broken),
            Step::Control(Some(cmd)) => {
                writer.queued.push_back(cmd);
                writer.take_queued(&mut control).await
            }
            Step::StartDrain => writer.start_drain().await,
            Step::Ping => writer.send(Message::Ping(Bytes::new())).await,
            Step::ReadJournal => writer.read_journal().await,
            Step::Lagged => {
                writer.catch_up_if_lagged();
                Ok(())
            }
            Step::Deliver(Some(envelope)) => writer.deliver(envelope, &mut deliveries).await,
            Step::HeldReports => writer.held_reports().await,
        };
        let result = match result {
            Ok(()) => writer.flush().await,
            stop => stop,
        };
        match result {
            Ok(()) => {}
            Err(Stop::Broken) => return None,
            Err(Stop::Closed) => return Some(writer.sink),
            Err(Stop::Stalled) => return writer.stalled().await,
        }
    }
}

/// Bounds one socket write: a peer that stops reading cannot hold the writer, its queue, or
/// the answers its own frames wait for (`docs/protocol.md#transport`).
async fn bounded(
    write_stall: Duration,
    write: impl Future<Output = Result<(), WsError>>,
) -> Result<(), Stop> {
    match tokio::time::timeout(write_stall, write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(Stop::Broken),
        Err(_) => Err(Stop::Stalled),
    }
}

/// Waits for the first queued answer to be decided (the caller checked that it is one).
async fn first_decided(queued: &mut VecDeque<Outbound>) -> Option<RelayFrame> {
    match queued.front_mut() {
        Some(Outbound::Later(answer)) => answer.await,
        _ => std::future::pending().await,
    }
}

impl<S> Writer<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    async fn send(&mut self, message: Message) -> Result<(), Stop> {
        let write_stall = self.ctx.timings.write_stall;
        bounded(write_stall, self.sink.send(message)).await
    }

    /// Queues one frame on the socket; the loop flushes once per step.
    async fn feed_frame(&mut self, frame: &RelayFrame) -> Result<(), Stop> {
        self.ctx.metrics.sent(frame);
        self.feed_text(frame.encode()).await
    }

    async fn feed_text(&mut self, text: String) -> Result<(), Stop> {
        self.unflushed = true;
        let write_stall = self.ctx.timings.write_stall;
        bounded(write_stall, self.sink.feed(Message::text(text))).await
    }

    async fn send_frame(&mut self, frame: &RelayFrame) -> Result<(), Stop> {
        self.feed_frame(frame).await?;
        self.flush().await
    }

    /// Flushes what was fed. What it covers then counts as written (`mailbox.rs`); without the
    /// opt-in, journaled frames written are released.
    async fn flush(&mut self) -> Result<(), Stop> {
        if !self.unflushed {
            return Ok(());
        }
        let write_stall = self.ctx.timings.write_stall;
        bounded(write_stall, self.sink.flush()).await?;
        self.unflushed = false;
        self.publish_flushed();
        self.release_written().await;
        Ok(())
    }

    /// Writes every queued PresenceStatus (`docs/protocol.md#presence`).
    async fn presence(&mut self) -> Result<(), Stop> {
        for frame in self.peer.watchlist.take() {
            self.feed_frame(&frame).await?;
        }
        Ok(())
    }

    /// Writes a decided answer, then whatever else is ready behind it.
    async fn answer(
        &mut self,
        frame: Option<RelayFrame>,
        control: &mut mpsc::Receiver<Outbound>,
    ) -> Result<(), Stop> {
        if let Some(frame) = frame {
            self.feed_frame(&frame).await?;
        }
        self.take_queued(control).await
    }

    /// Takes what else the reader queued, then carries out, in order, everything up to the
    /// first answer not decided yet.
    async fn take_queued(&mut self, control: &mut mpsc::Receiver<Outbound>) -> Result<(), Stop> {
        while self.queued.len() < PIPELINE {
            match control.try_recv() {
                Ok(cmd) => self.queued.push_back(cmd),
                Err(_) => break,
            }
        }
        while let Some(cmd) = self.queued.pop_front() {
            match cmd {
                Outbound::Later(mut answer) => match (&mut answer).now_or_never() {
                    Some(Some(frame)) => self.feed_frame(&frame).await?,
                    Some(None) => {}
                    None => {
                        self.queued.push_front(Outbound::Later(answer));
                        break;
                    }
                },
                Outbound::Frame(frame) => self.feed_frame(&frame).await?,
                Outbound::Report { report, written } => {
                    self.send_frame(&report).await?;
                    let _ = written.send(());
                }
                Outbound::StartDrain => self.start_drain().await?,
                Outbound::Close(code) => return self.close(code).await,
            }
        }
        Ok(())
    }

    /// A write stalled: a best-effort Close 4008 (the peer is as good as dead,
    /// `docs/protocol.md#close-codes`), given no more than the close linger, then the writer stops.
    async fn stalled(mut self) -> Option<Sink<S>> {
        tracing::info!(account = %self.peer.account, "socket writes stalled; dropping the connection");
        let frame = CloseFrame {
            code: CloseCode::from(close::KEEPALIVE_TIMEOUT),
            reason: "".into(),
        };
        let closing = self.sink.send(Message::Close(Some(frame)));
        match tokio::time::timeout(self.ctx.timings.close_linger, closing).await {
            Ok(Ok(())) => Some(self.sink),
            _ => None,
        }
    }

    /// Writes Close; the writer stops either way.
    async fn close(&mut self, code: u16) -> Result<(), Stop> {
        let frame = CloseFrame {
            code: CloseCode::from(code),
            reason: "".into(),
        };
        self.send(Message::Close(Some(frame))).await?;
        Err(Stop::Closed)
    }

    /// Tells group reports waiting on this connection (`fanout.rs`) how far it has flushed.
    fn publish_flushed(&self) {
        let watermark = self.flow.watermark;
        self.flushed.send_if_modified(|flushed| {
            let advanced = *flushed < watermark;
            if advanced {
                *flushed = watermark;
            }
            advanced
        });
    }

    /// Writes the group reports held for the account (`docs/protocol.md#group-frames`), then
    /// forgets them. One that cannot be read back is dropped; a failed read of the store leaves
    /// them for the next connection.
    async fn held_reports(&mut self) -> Result<(), Stop> {
        let not_before = now_ms().saturating_sub(GROUP_MEMORY_MS);
        let held = match self
            .ctx
            .store
            .held_reports(&self.peer.account, not_before)
            .await
        {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(account = %self.peer.account, error = %e, "reading held group reports failed");
                return Ok(());
            }
        };
        if held.is_empty() {
            return Ok(());
        }
        let mut ids = Vec::with_capacity(held.len());
        for (id, text) in held {
            ids.push(id);
            match RelayFrame::decode(&text) {
                Ok(report) => {
                    self.ctx.metrics.sent(&report);
                    self.feed_text(text).await?;
                }
                Err(e) => {
                    tracing::error!(account = %self.peer.account, error = %e, "a held group report does not decode")
                }
            }
        }
        self.flush().await?;
        if let Err(e) = self
            .ctx
            .store
            .drop_held_reports(&self.peer.account, ids)
            .await
        {
            tracing::warn!(account = %self.peer.account, error = %e, "forgetting written group reports failed");
        }
        Ok(())
    }

    fn catch_up_if_lagged(&mut self) {
        if self.peer.queue.is_lagged() {
            self.flow.phase = Phase::Live { catching_up: true };
        }
    }

    /// Fixes S (`docs/protocol.md#drain`) and switches to reading the journal up to it.
    async fn start_drain(&mut self) -> Result<(), Stop> {
        if self.flow.phase != Phase::AwaitingDrain {
            return Ok(());
        }
        match self.ctx.store.highest_seq(&self.peer.account).await {
            Ok(bound) => {
                self.flow.phase = Phase::Draining { bound, count: 0 };
                Ok(())
            }
            Err(e) => self.storage_failed(e).await,
        }
    }

    /// One bounded journal read: the drain up to S, or a catch-up after lag.
    async fn read_journal(&mut self) -> Result<(), Stop> {
        let (up_to, draining) = match self.flow.phase {
            Phase::Draining { bound, .. } => (bound, true),
            Phase::Live { catching_up: true } => {
                self.peer.queue.clear_lag();
                (u64::MAX, false)
            }
            _ => return Ok(()),
        };
        let not_before = self
            .ctx
            .mailbox
            .map_or(0, |m| now_ms().saturating_sub(m.ttl_ms));
        let frames = match self
            .ctx
            .store
            .fetch(&self.peer.account, self.flow.watermark, up_to, not_before)
            .await
        {
            Ok(frames) => frames,
            Err(e) => return self.storage_failed(e).await,
        };
        if frames.is_empty() {
            if let Phase::Draining { bound, count } = self.flow.phase {
                self.flow.watermark = self.flow.watermark.max(bound);
                self.publish_flushed();
                self.flow.phase = Phase::Live { catching_up: false };
                self.catch_up_if_lagged();
                self.ctx.metrics.drained(count);
                if self.opted_in {
                    self.send_frame(&RelayFrame::DrainComplete { count })
                        .await?;
                }
                self.drained = true;
                return self.held_reports().await;
            } else {
                self.flow.phase = Phase::Live { catching_up: false };
            }
            return Ok(());
        }
        let written = frames.len() as u64;
        for envelope in &frames {
            if let Some(seq) = envelope.seq {
                self.flow.watermark = seq;
            }
            self.feed(envelope).await?;
        }
        if let Phase::Draining { count, .. } = &mut self.flow.phase {
            if draining {
                *count += written;
            }
        }
        Ok(())
    }

    /// Writes `first` and the live frames queued behind it, a bounded batch.
    async fn deliver(
        &mut self,
        first: Arc<Envelope>,
        deliveries: &mut mpsc::Receiver<Arc<Envelope>>,
    ) -> Result<(), Stop> {
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(envelope) = next {
            self.peer.queue.taken(&envelope);
            if self.flow.accept_queued(&envelope) {
                self.feed(&envelope).await?;
            }
            taken += 1;
            next = if taken < DELIVERY_BATCH {
                deliveries.try_recv().ok()
            } else {
                None
            };
        }
        Ok(())
    }

    /// Queues one frame on the socket. It counts as written from here: a client may ack it
    /// before this task gets to run again.
    async fn feed(&mut self, envelope: &Envelope) -> Result<(), Stop> {
        if let Some(seq) = envelope.seq {
            self.peer.queue.mark_written(seq);
        }
        self.feed_frame(&envelope.to_frame(self.opted_in)).await
    }

    /// Without the opt-in a journaled frame is released as soon as it is written
    /// (`docs/protocol.md#connections-without-the-opt-in`). Queued, not waited for: the writer
    /// never writes a frame twice (its watermark), and the store logs a failure.
    async fn release_written(&mut self) {
        if self.opted_in || !self.journaled {
            return;
        }
        let up_to = self.peer.queue.highest_written();
        if up_to <= self.released {
            return;
        }
        self.released = up_to;
        if let Err(e) = self
            .ctx
            .store
            .queue_release(&self.peer.account, Release::UpTo(up_to))
            .await
        {
            tracing::warn!(account = %self.peer.account, error = %e, "releasing written frames failed");
        }
    }

    /// The journal cannot be read: close with 1011 so the client reconnects and gets a fresh
    /// drain rather than a gap.
    async fn storage_failed(&mut self, error: StoreError) -> Result<(), Stop> {
        tracing::error!(account = %self.peer.account, %error, "journal read failed");
        self.close(close::INTERNAL).await
    }
}
