//! How much a carrier may read ahead of the driver. Every frame read from the socket becomes a
//! driver command; the driver's queue is unbounded, so a peer that writes faster than the
//! engine and the app take its frames (a flood) would otherwise grow it without end. The
//! carrier counts what it hands over in windows and closes each with a `Barrier` command; it
//! stops reading while a full window waits behind an unanswered barrier, so the driver never
//! has more than two windows of this carrier's frames before it. The driver answers a barrier
//! only once the application has taken the events dispatched before it ([`App::caught_up`]),
//! so a stalled application pauses reading too.
//!
//! [`App::caught_up`]: crate::app::App::caught_up

use tokio::sync::oneshot;

use crate::driver::{Command, DriverTx};

/// A window ends after this many frames or bytes, whichever comes first.
pub const WINDOW_FRAMES: usize = 256;
pub const WINDOW_BYTES: usize = 4 * 1024 * 1024;

#[derive(Default)]
pub struct Intake {
    frames: usize,
    bytes: usize,
    /// The barrier closing the previous window, until the driver answers it.
    barrier: Option<oneshot::Receiver<()>>,
}

impl Intake {
    /// A frame of `bytes` was read and handed to the driver.
    pub fn took(&mut self, bytes: usize, driver: &DriverTx) {
        self.frames += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        if self.barrier.is_none() {
            self.close_window_if_full(driver);
        }
    }

    /// Whether the socket may be read: not while a full window waits for the driver.
    pub fn open(&self) -> bool {
        !self.full()
    }

    /// Whether a barrier is out (then [`Intake::caught_up`] is worth awaiting).
    pub fn waiting(&self) -> bool {
        self.barrier.is_some()
    }

    /// Resolves once the driver has applied everything before the outstanding barrier; a full
    /// window is closed with the next one. Cancel-safe.
    pub async fn caught_up(&mut self, driver: &DriverTx) {
        if let Some(barrier) = self.barrier.as_mut() {
            // An error means the driver stopped: nothing is waiting in it any more.
            let _ = barrier.await;
        }
        self.barrier = None;
        self.close_window_if_full(driver);
    }

    fn full(&self) -> bool {
        self.frames >= WINDOW_FRAMES || self.bytes >= WINDOW_BYTES
    }

    fn close_window_if_full(&mut self, driver: &DriverTx) {
        if self.full() {
            let (reply, barrier) = oneshot::channel();
            driver.send(Command::Barrier(reply));
            self.barrier = Some(barrier);
            self.frames = 0;
            self.bytes = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver;

    fn barriers(rx: &std::sync::mpsc::Receiver<Command>) -> Vec<oneshot::Sender<()>> {
        rx.try_iter()
            .map(|cmd| match cmd {
                Command::Barrier(reply) => reply,
                _ => panic!("only barriers are sent"),
            })
            .collect()
    }

    #[tokio::test]
    async fn reading_stops_at_two_windows_until_the_driver_catches_up() {
        let (tx, rx) = driver::channel();
        let mut intake = Intake::default();
        for _ in 0..WINDOW_FRAMES {
            assert!(intake.open());
            intake.took(10, &tx);
        }
        // The first window is closed with a barrier and reading goes on.
        let mut first = barriers(&rx);
        assert_eq!(first.len(), 1);
        assert!(intake.open() && intake.waiting());
        for _ in 0..WINDOW_FRAMES {
            assert!(intake.open());
            intake.took(10, &tx);
        }
        // The second is full while the first barrier is unanswered: reading stops.
        assert!(!intake.open());
        assert!(barriers(&rx).is_empty());
        first.pop().unwrap().send(()).unwrap();
        intake.caught_up(&tx).await;
        // The second window is closed in turn, and reading resumes.
        assert_eq!(barriers(&rx).len(), 1);
        assert!(intake.open() && intake.waiting());
    }

    #[tokio::test]
    async fn a_window_also_ends_at_its_byte_budget() {
        let (tx, rx) = driver::channel();
        let mut intake = Intake::default();
        intake.took(WINDOW_BYTES - 1, &tx);
        assert!(barriers(&rx).is_empty());
        intake.took(1, &tx);
        assert_eq!(barriers(&rx).len(), 1);
        intake.took(WINDOW_BYTES, &tx);
        assert!(!intake.open());
        // A driver that stopped answers nothing; reading is not held up by it.
        drop(rx);
        intake.caught_up(&tx).await;
        assert!(intake.open());
    }
}
