//! Releasing relay journal frames (`Ack` / `AckUpTo`, `docs/protocol.md#frame-release`). A frame is
//! released only once processed — with a durability hook, once committed, which can be out of
//! seq order (a refused batch stays unreleased while later frames commit). `AckUpTo{n}` is used
//! only when every frame up to `n` received on this connection is released; the rest go one by
//! one, so a coalesced release never covers a frame that was not processed.

use std::collections::BTreeSet;

use courier_proto::ClientFrame;

#[derive(Debug, Default)]
pub struct Releases {
    /// Received on this connection, not yet processed.
    unreleased: BTreeSet<u64>,
    /// Processed, not yet acknowledged to the relay.
    released: BTreeSet<u64>,
    /// Send `AckUpTo{0}` (releases nothing) as the first frame, which starts the relay's drain.
    announce: bool,
}

impl Releases {
    pub fn received(&mut self, seq: u64) {
        self.unreleased.insert(seq);
    }

    pub fn release(&mut self, seq: u64) {
        self.unreleased.remove(&seq);
        self.released.insert(seq);
    }

    pub fn announce(&mut self) {
        self.announce = true;
    }

    pub fn has_frame(&self) -> bool {
        self.announce || !self.released.is_empty()
    }

    /// Seqs processed and not yet acknowledged: at most this many frames still to write.
    pub fn backlog(&self) -> usize {
        self.released.len()
    }

    /// The next release frame to write, if any.
    pub fn next_frame(&mut self) -> Option<ClientFrame> {
        // Seqs come from the relay: 0 and u64::MAX must not wrap (a relay never sends 0, and
        // nothing can be covered below it).
        let bound = match self.unreleased.first() {
            None => Some(u64::MAX),
            Some(&lowest) => lowest.checked_sub(1),
        };
        if let Some(&highest) = bound.and_then(|b| self.released.range(..=b).next_back()) {
            self.released = match highest.checked_add(1) {
                Some(above) => self.released.split_off(&above),
                None => BTreeSet::new(),
            };
            self.announce = false;
            return Some(ClientFrame::AckUpTo { seq: highest });
        }
        if let Some(seq) = self.released.pop_first() {
            return Some(ClientFrame::Ack { seq });
        }
        if std::mem::take(&mut self.announce) {
            return Some(ClientFrame::AckUpTo { seq: 0 });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(r: &mut Releases) -> Vec<ClientFrame> {
        std::iter::from_fn(|| r.next_frame()).collect()
    }

    #[test]
    fn contiguous_releases_coalesce_into_one_ack_up_to() {
        let mut r = Releases::default();
        for seq in 1..=5 {
            r.received(seq);
        }
        for seq in 1..=5 {
            r.release(seq);
        }
        assert_eq!(drain(&mut r), vec![ClientFrame::AckUpTo { seq: 5 }]);
    }

    #[test]
    fn a_frame_still_being_processed_is_never_covered() {
        let mut r = Releases::default();
        for seq in 1..=6 {
            r.received(seq);
        }
        // 3 is with the hook (or refused); 1, 2, 4 and 6 are done.
        for seq in [1, 2, 4, 6] {
            r.release(seq);
        }
        assert_eq!(
            drain(&mut r),
            vec![
                ClientFrame::AckUpTo { seq: 2 },
                ClientFrame::Ack { seq: 4 },
                ClientFrame::Ack { seq: 6 }
            ]
        );
        r.release(3);
        r.release(5);
        assert_eq!(drain(&mut r), vec![ClientFrame::AckUpTo { seq: 5 }]);
    }

    #[test]
    fn seqs_at_both_ends_of_the_range_neither_wrap_nor_are_covered_early() {
        let mut r = Releases::default();
        for seq in [0, 1, u64::MAX] {
            r.received(seq);
        }
        // 0 is still being processed: nothing is below it to coalesce.
        r.release(1);
        r.release(u64::MAX);
        assert_eq!(
            drain(&mut r),
            vec![
                ClientFrame::Ack { seq: 1 },
                ClientFrame::Ack { seq: u64::MAX }
            ]
        );
        r.release(0);
        r.received(5);
        r.release(5);
        r.received(u64::MAX);
        r.release(u64::MAX);
        assert_eq!(drain(&mut r), vec![ClientFrame::AckUpTo { seq: u64::MAX }]);
        assert_eq!(drain(&mut r), vec![]);
    }

    #[test]
    fn the_announcement_goes_alone_or_is_subsumed() {
        let mut r = Releases::default();
        r.announce();
        assert_eq!(drain(&mut r), vec![ClientFrame::AckUpTo { seq: 0 }]);
        r.announce();
        r.received(7);
        r.release(7);
        assert_eq!(drain(&mut r), vec![ClientFrame::AckUpTo { seq: 7 }]);
    }
}
