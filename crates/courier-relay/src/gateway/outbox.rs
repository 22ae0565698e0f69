//! A bound connection's queue of lines from other connections, bounded in lines and in bytes
//! (`docs/protocol.md#messages-over-the-gateway`). A recipient that reads just fast enough to
//! keep its queue full holds at most the byte bound, not a line count times the line limit; a
//! line that does not fit is refused at once, so the sender hears unreachable instead of the
//! gateway buffering it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

/// Lines queued for one connection at most, whatever their size.
pub(crate) const OUTBOX_LINES: usize = 1024;

/// What a bound connection's queue carries.
#[derive(Debug)]
pub(crate) enum Outbound {
    /// One encoded line (without its `\n`).
    Line(String),
    /// Another connection bound the same address: say so and close.
    Superseded,
}

/// The refusal of a line: the queue is at its line or byte bound, or its connection is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full;

/// The sending end, registered under the connection's address once it is bound.
#[derive(Debug, Clone)]
pub(crate) struct OutboxTx {
    queue: mpsc::Sender<Outbound>,
    queued: Arc<AtomicUsize>,
    max_bytes: usize,
}

/// The connection's own end. A line's bytes count until it is written to the socket, so the
/// one line being written is within the bound too.
pub(crate) struct OutboxRx {
    queue: mpsc::Receiver<Outbound>,
    queued: Arc<AtomicUsize>,
}

pub(crate) fn outbox(max_bytes: usize) -> (OutboxTx, OutboxRx) {
    let (tx, rx) = mpsc::channel(OUTBOX_LINES);
    let queued = Arc::new(AtomicUsize::new(0));
    (
        OutboxTx {
            queue: tx,
            queued: Arc::clone(&queued),
            max_bytes,
        },
        OutboxRx { queue: rx, queued },
    )
}

impl OutboxTx {
    /// Queues `line` if it fits under both bounds.
    pub fn try_line(&self, line: String) -> Result<(), Full> {
        let len = line.len();
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                queued.checked_add(len).filter(|&n| n <= self.max_bytes)
            })
            .map_err(|_| Full)?;
        self.queue.try_send(Outbound::Line(line)).map_err(|_| {
            self.queued.fetch_sub(len, Ordering::AcqRel);
            Full
        })
    }

    /// Tells the connection it was superseded, if its queue has room for the notice.
    pub fn supersede(&self) {
        let _ = self.queue.try_send(Outbound::Superseded);
    }
}

impl OutboxRx {
    pub async fn recv(&mut self) -> Option<Outbound> {
        self.queue.recv().await
    }

    /// A line taken by `recv` is written (or given up on): its bytes leave the bound.
    pub fn done(&self, line: &str) {
        self.queued.fetch_sub(line.len(), Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_would_pass_the_byte_bound_and_frees_it_once_written() {
        let (tx, mut rx) = outbox(10);
        assert_eq!(tx.try_line("12345".into()), Ok(()));
        assert_eq!(tx.try_line("123456".into()), Err(Full));
        assert_eq!(tx.try_line("12345".into()), Ok(()));
        assert_eq!(tx.try_line("1".into()), Err(Full));
        assert_eq!(tx.queued.load(Ordering::Acquire), 10);
        let Some(Outbound::Line(line)) = rx.queue.try_recv().ok() else {
            panic!("a line");
        };
        // Taken but not yet written: still counted.
        assert_eq!(tx.try_line("1".into()), Err(Full));
        rx.done(&line);
        assert_eq!(tx.try_line("1".into()), Ok(()));
        assert_eq!(tx.queued.load(Ordering::Acquire), 6);
    }

    #[test]
    fn refuses_past_the_line_bound_without_counting_the_refused_bytes() {
        let (tx, _rx) = outbox(usize::MAX);
        for _ in 0..OUTBOX_LINES {
            assert_eq!(tx.try_line("x".into()), Ok(()));
        }
        assert_eq!(tx.try_line("x".into()), Err(Full));
        assert_eq!(tx.queued.load(Ordering::Acquire), OUTBOX_LINES);
    }
}
