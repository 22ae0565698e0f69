//! Presence as the other relay nodes of a cluster hold it (`docs/cluster.md#presence`): every
//! account's latest presence record and which nodes are alive, followed from JetStream by the
//! node runtime (`node.rs`) and read by the router with its own connections. Empty, and never
//! consulted past an empty map, in the single-file relay.

use std::collections::{HashMap, HashSet};

use crate::cluster::{Change, Record};

#[derive(Default)]
pub struct Remote {
    /// This node's name: its own records say nothing the router does not know first-hand.
    own_node: Option<String>,
    /// Each account's latest record and its revision.
    records: HashMap<String, (Record, u64)>,
    /// Nodes whose heartbeat is current.
    live: HashSet<String>,
}

impl Remote {
    pub fn serve_as(&mut self, node: &str) {
        self.own_node = Some(node.to_owned());
        self.live.insert(node.to_owned());
    }

    /// Whether another live node holds `account`'s latest connection.
    pub fn online(&self, account: &str) -> bool {
        match self.records.get(account) {
            Some((Record::Online(presence), _)) => {
                self.own_node.as_deref() != Some(presence.node.as_str())
                    && self.live.contains(&presence.node)
            }
            _ => false,
        }
    }

    /// Takes in a newer record; answers whether it was newer than what was held.
    pub fn record(&mut self, change: &Change) -> bool {
        let newer = self
            .records
            .get(&change.account)
            .is_none_or(|(_, revision)| *revision < change.revision);
        if newer {
            self.records.insert(
                change.account.clone(),
                (change.record.clone(), change.revision),
            );
        }
        newer
    }

    /// The latest record of `account`, when it names a connection of another node written
    /// after `revision`: a newer connection displaced the one whose record `revision` is.
    pub fn displaced_since(&self, account: &str, revision: u64) -> bool {
        match self.records.get(account) {
            Some((Record::Online(presence), written)) => {
                *written > revision && self.own_node.as_deref() != Some(presence.node.as_str())
            }
            _ => false,
        }
    }

    pub fn is_live(&self, node: &str) -> bool {
        self.live.contains(node)
    }

    pub fn node_up(&mut self, node: &str) {
        self.live.insert(node.to_owned());
    }

    /// Marks `node` dead; answers the accounts whose latest record it held, if it was alive.
    pub fn node_down(&mut self, node: &str) -> Vec<String> {
        if !self.live.remove(node) {
            return Vec::new();
        }
        self.accounts_on(node)
    }

    /// Accounts whose latest record names a connection on `node`.
    pub fn accounts_on(&self, node: &str) -> Vec<String> {
        self.records
            .iter()
            .filter(|(_, (record, _))| {
                matches!(record, Record::Online(presence) if presence.node == node)
            })
            .map(|(account, _)| account.clone())
            .collect()
    }
}
