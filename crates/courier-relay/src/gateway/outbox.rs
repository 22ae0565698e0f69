//! A bound connection's queue of lines from other connections, bounded in lines and in bytes
//! (`docs/protocol.md#messages-over-the-gateway`), and every queue's bytes together bounded by
//! the gateway's budget. A recipient that reads just fast enough to keep its queue full holds at
//! most the byte bound, not a line count times the line limit, and many such recipients together
//! hold at most the budget; a line that does not fit is refused at once, so the sender hears
//! unreachable instead of the gateway buffering it.

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

/// Bytes counted against a bound, shared by whoever fills and drains them.
#[derive(Debug)]
pub(crate) struct Bytes {
    used: AtomicUsize,
    max: usize,
}

impl Bytes {
    pub fn new(max: usize) -> Self {
        Self {
            used: AtomicUsize::new(0),
            max,
        }
    }

    /// Counts `len` more bytes if they fit.
    fn reserve(&self, len: usize) -> Result<(), Full> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(len).filter(|&n| n <= self.max)
            })
            .map(drop)
            .map_err(|_| Full)
    }

    fn release(&self, len: usize) {
        self.used.fetch_sub(len, Ordering::AcqRel);
    }
}

/// The sending end, registered under the connection's address once it is bound.
#[derive(Debug, Clone)]
pub(crate) struct OutboxTx {
    queue: mpsc::Sender<Outbound>,
    queued: Arc<Bytes>,
    budget: Arc<Bytes>,
}

/// The connection's own end. A line's bytes count until it is written to the socket, so the
/// one line being written is within the bounds too.
pub(crate) struct OutboxRx {
    queue: mpsc::Receiver<Outbound>,
    queued: Arc<Bytes>,
    budget: Arc<Bytes>,
}

/// A queue holding at most `max_bytes`, its bytes also counted against the gateway's `budget`.
pub(crate) fn outbox(max_bytes: usize, budget: Arc<Bytes>) -> (OutboxTx, OutboxRx) {
    let (tx, rx) = mpsc::channel(OUTBOX_LINES);
    let queued = Arc::new(Bytes::new(max_bytes));
    (
        OutboxTx {
            queue: tx,
            queued: Arc::clone(&queued),
            budget: Arc::clone(&budget),
        },
        OutboxRx {
            queue: rx,
            queued,
            budget,
        },
    )
}

impl OutboxTx {
    /// Queues `line` if it fits under every bound.
    pub fn try_line(&self, line: String) -> Result<(), Full> {
        let len = line.len();
        self.queued.reserve(len)?;
        if let Err(full) = self.budget.reserve(len) {
            self.queued.release(len);
            return Err(full);
        }
        self.queue.try_send(Outbound::Line(line)).map_err(|_| {
            self.queued.release(len);
            self.budget.release(len);
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

    /// A line taken by `recv` is written (or given up on): its bytes leave the bounds.
    pub fn done(&self, line: &str) {
        self.queued.release(line.len());
        self.budget.release(line.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn used(bytes: &Bytes) -> usize {
        bytes.used.load(Ordering::Acquire)
    }

    #[test]
    fn refuses_what_would_pass_the_byte_bound_and_frees_it_once_written() {
        let (tx, mut rx) = outbox(10, Arc::new(Bytes::new(usize::MAX)));
        assert_eq!(tx.try_line("12345".into()), Ok(()));
        assert_eq!(tx.try_line("123456".into()), Err(Full));
        assert_eq!(tx.try_line("12345".into()), Ok(()));
        assert_eq!(tx.try_line("1".into()), Err(Full));
        assert_eq!(used(&tx.queued), 10);
        let Some(Outbound::Line(line)) = rx.queue.try_recv().ok() else {
            panic!("a line");
        };
        // Taken but not yet written: still counted.
        assert_eq!(tx.try_line("1".into()), Err(Full));
        rx.done(&line);
        assert_eq!(tx.try_line("1".into()), Ok(()));
        assert_eq!(used(&tx.queued), 6);
    }

    #[test]
    fn refuses_past_the_line_bound_without_counting_the_refused_bytes() {
        let (tx, _rx) = outbox(usize::MAX, Arc::new(Bytes::new(usize::MAX)));
        for _ in 0..OUTBOX_LINES {
            assert_eq!(tx.try_line("x".into()), Ok(()));
        }
        assert_eq!(tx.try_line("x".into()), Err(Full));
        assert_eq!(used(&tx.queued), OUTBOX_LINES);
    }

    #[test]
    fn every_queue_together_stays_within_the_budget() {
        let budget = Arc::new(Bytes::new(10));
        let (a, mut a_rx) = outbox(8, Arc::clone(&budget));
        let (b, _b_rx) = outbox(8, Arc::clone(&budget));
        assert_eq!(a.try_line("123456".into()), Ok(()));
        assert_eq!(b.try_line("12345".into()), Err(Full));
        assert_eq!(
            used(&b.queued),
            0,
            "a refusal leaves its queue's count alone"
        );
        assert_eq!(b.try_line("1234".into()), Ok(()));
        assert_eq!(used(&budget), 10);
        let Some(Outbound::Line(line)) = a_rx.queue.try_recv().ok() else {
            panic!("a line");
        };
        a_rx.done(&line);
        assert_eq!(used(&budget), 4);
        assert_eq!(b.try_line("1234".into()), Ok(()));
    }
}
