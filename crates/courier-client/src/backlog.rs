//! The events an [`App`](crate::app::App) queued for another thread (the Node binding's JS
//! thread) and that thread has not taken yet. Such a queue is unbounded, and the driver never
//! waits for the consumer (a listener may call back into the client, which needs the driver);
//! so the bound is kept one step earlier, at the carriers: a carrier's intake barrier is
//! released only while this backlog is under its bound, and a stalled consumer pauses reading
//! from the network instead of growing memory
//! (`docs/architecture.md#backpressure-from-the-application`).

use std::sync::{Arc, Mutex, PoisonError};

use crate::app::Barrier;

/// JSON bytes of events dispatched and not yet run by the consumer above which
/// carriers are held. Events that do not come from a carrier (sends, timers) are counted but
/// never held, so the backlog may pass the bound by what one step emits.
pub const MAX_BACKLOG_BYTES: usize = 8 * 1024 * 1024;
/// Calls in the queue above which carriers are held, whatever their size.
pub const MAX_BACKLOG_CALLS: usize = 4096;

#[derive(Clone, Default)]
pub struct Backlog(Arc<Mutex<State>>);

#[derive(Default)]
struct State {
    bytes: usize,
    calls: usize,
    held: Vec<Barrier>,
}

impl State {
    fn over(&self) -> bool {
        self.bytes > MAX_BACKLOG_BYTES || self.calls > MAX_BACKLOG_CALLS
    }
}

impl Backlog {
    /// A call of `bytes` is queued for the JS thread: the backlog is released with the returned
    /// guard, when the call has run or was dropped unrun (the queue closing).
    pub fn queued(&self, bytes: usize) -> Queued {
        let mut state = self.lock();
        state.bytes = state.bytes.saturating_add(bytes);
        state.calls += 1;
        Queued {
            backlog: self.clone(),
            bytes,
        }
    }

    /// Releases `barrier` now if the backlog is under its bound, or once it is.
    pub fn hold(&self, barrier: Barrier) {
        let mut state = self.lock();
        if state.over() {
            state.held.push(barrier);
        } else {
            drop(state);
            barrier.release();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One queued call's share of the backlog.
pub struct Queued {
    backlog: Backlog,
    bytes: usize,
}

impl Drop for Queued {
    fn drop(&mut self) {
        let released = {
            let mut state = self.backlog.lock();
            state.bytes -= self.bytes;
            state.calls -= 1;
            if state.over() {
                Vec::new()
            } else {
                std::mem::take(&mut state.held)
            }
        };
        for barrier in released {
            barrier.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stalled_consumer_holds_carriers_until_its_backlog_drains() {
        let backlog = Backlog::default();
        let (barrier, mut released) = Barrier::new();
        let big = backlog.queued(MAX_BACKLOG_BYTES + 1);
        backlog.hold(barrier);
        assert!(released.try_recv().is_err(), "held while over the bound");
        drop(big);
        assert!(released.try_recv().is_ok(), "released once taken");

        let (barrier, mut released) = Barrier::new();
        let _small = backlog.queued(1);
        backlog.hold(barrier);
        assert!(released.try_recv().is_ok(), "under the bound: at once");
    }

    #[test]
    fn a_flood_of_small_events_is_bounded_by_their_count() {
        let backlog = Backlog::default();
        let calls: Vec<Queued> = (0..=MAX_BACKLOG_CALLS).map(|_| backlog.queued(1)).collect();
        let (barrier, mut released) = Barrier::new();
        backlog.hold(barrier);
        assert!(released.try_recv().is_err());
        drop(calls);
        assert!(released.try_recv().is_ok());
    }
}
