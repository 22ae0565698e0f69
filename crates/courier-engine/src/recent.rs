//! The app ids delivered most recently (`docs/delivery.md#repeated-ids`). A send that repeats an
//! id delivered earlier in the same step — before the step's commit lets storage say so — is a
//! no-op like any repeat of a delivered id. Storage answers for everything older, so a bound
//! well above the settlements of one step is all this needs.

use std::collections::{HashSet, VecDeque};

/// Settlements remembered: more than one step can make (a step takes at most a few thousand
/// inputs).
const REMEMBERED: usize = 16_384;

#[derive(Debug, Default)]
pub(crate) struct RecentlyDelivered {
    order: VecDeque<String>,
    ids: HashSet<String>,
}

impl RecentlyDelivered {
    pub(crate) fn insert(&mut self, id: String) {
        if self.ids.insert(id.clone()) {
            self.order.push_back(id);
            if self.order.len() > REMEMBERED {
                if let Some(oldest) = self.order.pop_front() {
                    self.ids.remove(&oldest);
                }
            }
        }
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        self.ids.contains(id)
    }
}
