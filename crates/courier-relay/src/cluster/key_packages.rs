//! The key-package directory (`docs/protocol.md#key-package-directory`) in the `key-packages`
//! bucket: one record per canonical address holding its one-time packages in publish order (at
//! most as many as the single-file relay keeps) and its last-resort package.
//!
//! Every change is a compare-and-set on the record's revision, read from the bucket's leader and
//! tried again when another node changed the record first: a one-time package is handed out at
//! most once, however many nodes are asked for it at the same moment.

use courier_proto::{Address, KeyPackage, KeyPackageBatch};
use serde::{Deserialize, Serialize};

use super::names::token;
use super::record::change_record;
use super::{ClusterError, JetStreamStore};
use crate::store::{KeyPackagesHeld, TakenKeyPackage, MAX_HELD_KEY_PACKAGES};

#[derive(Serialize, Deserialize, Default)]
struct Held {
    address: String,
    one_time: Vec<KeyPackage>,
    last_resort: Option<KeyPackage>,
}

impl Held {
    fn held(&self) -> KeyPackagesHeld {
        KeyPackagesHeld {
            available: u32::try_from(self.one_time.len()).unwrap_or(u32::MAX),
            last_resort: self.last_resort.is_some(),
        }
    }
}

impl JetStreamStore {
    /// Stores key packages for `address`: `packages` appended (the oldest dropped beyond the
    /// per-address cap), `last_resort` replacing the previous one; answers what is held now.
    pub async fn publish_key_packages(
        &self,
        address: &Address,
        packages: KeyPackageBatch,
        last_resort: Option<KeyPackage>,
        _now_ms: u64,
    ) -> Result<KeyPackagesHeld, ClusterError> {
        self.change_held(address, |held| {
            held.one_time.extend(packages.as_slice().iter().cloned());
            let excess = held
                .one_time
                .len()
                .saturating_sub(MAX_HELD_KEY_PACKAGES as usize);
            held.one_time.drain(..excess);
            if let Some(package) = &last_resort {
                held.last_resort = Some(package.clone());
            }
            (held.held(), true)
        })
        .await
    }

    /// Takes the oldest one-time package of `address`, or else its last-resort package, which
    /// stays; `None` when it has neither.
    pub async fn take_key_package(
        &self,
        address: &Address,
    ) -> Result<Option<TakenKeyPackage>, ClusterError> {
        self.change_held(address, |held| {
            if held.one_time.is_empty() {
                let taken = held.last_resort.clone().map(|package| TakenKeyPackage {
                    package,
                    last_resort: true,
                });
                return (taken, false);
            }
            let package = held.one_time.remove(0);
            let taken = TakenKeyPackage {
                package,
                last_resort: false,
            };
            (Some(taken), true)
        })
        .await
    }

    /// Applies `change` to the address's record (see [`change_record`]).
    async fn change_held<T>(
        &self,
        address: &Address,
        change: impl Fn(&mut Held) -> (T, bool),
    ) -> Result<T, ClusterError> {
        let address = address.to_string();
        change_record(
            &self.inner.key_packages,
            &token(&[&address]),
            |held: &mut Held| {
                held.address.clone_from(&address);
                change(held)
            },
        )
        .await
    }
}
