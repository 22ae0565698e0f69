//! Who counts as whose contact under `--presence-visibility contacts`
//! (`docs/protocol.md#presence-visibility`): pairs of accounts that exchanged a message through
//! this relay. Held in memory, loaded when the store opens, so a presence look-up never waits
//! for the store thread; a pair is written to the store once, when it is first seen, so a
//! relay under steady traffic writes nothing more than it did.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};

#[derive(Default)]
pub struct Contacts {
    /// Each pair once, its smaller name first.
    pairs: Mutex<HashSet<(String, String)>>,
}

fn pair(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_owned(), b.to_owned())
    } else {
        (b.to_owned(), a.to_owned())
    }
}

impl Contacts {
    fn pairs(&self) -> MutexGuard<'_, HashSet<(String, String)>> {
        self.pairs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes in the pairs the database holds at start.
    pub fn load(&self, pairs: Vec<(String, String)>) {
        self.pairs().extend(pairs.iter().map(|(a, b)| pair(a, b)));
    }

    /// Whether `a` and `b` exchanged a message (an account is its own contact).
    pub fn knows(&self, a: &str, b: &str) -> bool {
        a == b || self.pairs().contains(&pair(a, b))
    }

    /// Adds the pair; true when it is new (the caller then persists it).
    pub fn insert(&self, a: &str, b: &str) -> bool {
        a != b && self.pairs().insert(pair(a, b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_known_in_either_order_and_new_only_once() {
        let contacts = Contacts::default();
        assert!(contacts.knows("alice", "alice"));
        assert!(!contacts.knows("alice", "bob"));
        assert!(contacts.insert("bob", "alice"));
        assert!(!contacts.insert("alice", "bob"));
        assert!(contacts.knows("alice", "bob") && contacts.knows("bob", "alice"));
        contacts.load(vec![("zed".into(), "carol".into())]);
        assert!(contacts.knows("carol", "zed"));
    }
}
