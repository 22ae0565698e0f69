//! The relay connection's writing half, a task of its own. The session hands it frames and goes
//! on reading: the relay stops reading a connection whose answers wait to be written
//! (`docs/protocol.md#transport`), so a client that stopped reading while it waited to write
//! could wait for good. Whatever is handed over while a write is under way goes out in one
//! flush.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::SplitSink;
use futures_util::SinkExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::error::Error as WsError;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::{Loss, Ws};

/// Bytes handed over and not yet flushed past which the connection is given up: a relay that
/// reads nothing of this much is not going to, and memory stays bounded.
const MAX_UNWRITTEN_BYTES: usize = 64 * 1024 * 1024;

pub(super) struct FrameWriter {
    tx: Option<mpsc::UnboundedSender<WsMessage>>,
    unwritten: Arc<AtomicUsize>,
    /// `None` once it ended and was awaited.
    task: Option<JoinHandle<Result<(), WsError>>>,
}

impl FrameWriter {
    pub(super) fn spawn(sink: SplitSink<Ws, WsMessage>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let unwritten = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(write_frames(sink, rx, Arc::clone(&unwritten)));
        Self {
            tx: Some(tx),
            unwritten,
            task: Some(task),
        }
    }

    /// Hands `message` over to be written after everything handed before it.
    pub(super) fn write(&self, message: WsMessage) -> Result<(), Loss> {
        let bytes = message.len();
        let unwritten = self.unwritten.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if unwritten > MAX_UNWRITTEN_BYTES {
            return Err(Loss::Dropped(format!(
                "the relay read nothing of the last {} MiB written to it",
                MAX_UNWRITTEN_BYTES >> 20
            )));
        }
        match &self.tx {
            Some(tx) if tx.send(message).is_ok() => Ok(()),
            _ => Err(Loss::Dropped("write failed: the writer stopped".into())),
        }
    }

    /// Resolves when the writing task stopped on its own: the socket failed.
    pub(super) async fn failed(&mut self) -> Loss {
        let Some(task) = &mut self.task else {
            return std::future::pending().await;
        };
        let ended = task.await;
        self.task = None;
        match ended {
            Ok(Err(e)) => Loss::Dropped(format!("write failed: {e}")),
            Ok(Ok(())) | Err(_) => Loss::Dropped("write failed: the writer stopped".into()),
        }
    }

    /// Takes nothing more and waits at most `wait` for what was handed over to go out.
    pub(super) async fn finish(mut self, wait: Duration) {
        self.tx = None;
        if let Some(task) = &mut self.task {
            let _ = tokio::time::timeout(wait, task).await;
        }
    }
}

impl Drop for FrameWriter {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

async fn write_frames(
    mut sink: SplitSink<Ws, WsMessage>,
    mut rx: mpsc::UnboundedReceiver<WsMessage>,
    unwritten: Arc<AtomicUsize>,
) -> Result<(), WsError> {
    while let Some(first) = rx.recv().await {
        let mut bytes = first.len();
        sink.feed(first).await?;
        while let Ok(next) = rx.try_recv() {
            bytes += next.len();
            sink.feed(next).await?;
        }
        sink.flush().await?;
        unwritten.fetch_sub(bytes, Ordering::Relaxed);
    }
    Ok(())
}
