//! Every group's members as a relay node follows them from the `groups` bucket
//! (`docs/cluster.md#groups`), indexed by member, so presence visibility under contacts
//! (`docs/protocol.md#presence-visibility`) looks up one identity's groups, not every group.

use std::collections::{BTreeSet, HashMap, HashSet};

#[derive(Debug, Default)]
pub struct Rosters {
    /// The group's key in the bucket → its members.
    members: HashMap<String, BTreeSet<String>>,
    /// Member → the keys of the groups it is in.
    groups_of: HashMap<String, HashSet<String>>,
}

impl Rosters {
    /// The group under `key` now has `members`; `None` when it has none any more.
    pub fn set(&mut self, key: String, members: Option<BTreeSet<String>>) {
        if let Some(old) = self.members.remove(&key) {
            for member in old {
                if let Some(groups) = self.groups_of.get_mut(&member) {
                    groups.remove(&key);
                    if groups.is_empty() {
                        self.groups_of.remove(&member);
                    }
                }
            }
        }
        if let Some(members) = members {
            for member in &members {
                self.groups_of
                    .entry(member.clone())
                    .or_default()
                    .insert(key.clone());
            }
            self.members.insert(key, members);
        }
    }

    /// The members of every group one of `identities` is in.
    pub fn peers(&self, identities: &[String]) -> Vec<String> {
        let groups: HashSet<&String> = identities
            .iter()
            .filter_map(|identity| self.groups_of.get(identity))
            .flatten()
            .collect();
        groups
            .into_iter()
            .filter_map(|key| self.members.get(key))
            .flat_map(|members| members.iter().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> Option<BTreeSet<String>> {
        Some(names.iter().map(|n| (*n).to_owned()).collect())
    }

    fn sorted(mut peers: Vec<String>) -> Vec<String> {
        peers.sort();
        peers.dedup();
        peers
    }

    #[test]
    fn peers_follow_every_change_of_a_group_and_its_removal() {
        let mut rosters = Rosters::default();
        rosters.set("g1".into(), set(&["alice", "bob"]));
        rosters.set("g2".into(), set(&["carol", "dave"]));
        assert_eq!(sorted(rosters.peers(&["bob".into()])), ["alice", "bob"]);
        // bob leaves g1 and joins g2.
        rosters.set("g1".into(), set(&["alice"]));
        rosters.set("g2".into(), set(&["bob", "carol", "dave"]));
        assert_eq!(
            sorted(rosters.peers(&["bob".into(), "alice".into()])),
            ["alice", "bob", "carol", "dave"]
        );
        rosters.set("g2".into(), None);
        assert!(rosters.peers(&["bob".into()]).is_empty());
        assert!(!rosters.groups_of.contains_key("dave"));
    }
}
