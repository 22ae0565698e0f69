//! The relay's key-package directory, `key_directory_v1`, as `courier-relay`'s directory and
//! store keep it (`docs/protocol.md#key-package-directory`): a connection publishes packages for
//! its own address, any connection takes one for any address. One-time packages are handed out
//! oldest first and at most once; the last-resort package stays for every later fetch. The
//! packages are opaque bytes here and survive relay restarts (they are in its database).

use std::collections::{BTreeMap, VecDeque};

/// One-time packages an address holds at most: beyond it the oldest are dropped.
const MAX_ONE_TIME: usize = 100;

#[derive(Debug, Default)]
pub struct Directory {
    one_time: BTreeMap<String, VecDeque<Vec<u8>>>,
    last_resort: BTreeMap<String, Vec<u8>>,
}

/// What the directory holds for an address, as `KeyPackagesPublished` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub available: u32,
    pub last_resort: bool,
}

impl Directory {
    /// `PublishKeyPackages` for `address`: the one-time packages are added (the newest 100
    /// kept), a last-resort one replaces the previous; with neither it only asks what is held.
    pub fn publish(
        &mut self,
        address: &str,
        packages: Vec<Vec<u8>>,
        last_resort: Option<Vec<u8>>,
    ) -> Held {
        let held = self.one_time.entry(address.to_owned()).or_default();
        held.extend(packages);
        while held.len() > MAX_ONE_TIME {
            held.pop_front();
        }
        if let Some(package) = last_resort {
            self.last_resort.insert(address.to_owned(), package);
        }
        Held {
            available: held.len() as u32,
            last_resort: self.last_resort.contains_key(address),
        }
    }

    /// `FetchKeyPackage` for `address`: its oldest one-time package (spent even if the answer
    /// is lost), else its last-resort one (which stays), else nothing.
    pub fn fetch(&mut self, address: &str) -> Option<(Vec<u8>, bool)> {
        if let Some(package) = self.one_time.get_mut(address).and_then(VecDeque::pop_front) {
            return Some((package, false));
        }
        self.last_resort
            .get(address)
            .map(|package| (package.clone(), true))
    }
}
