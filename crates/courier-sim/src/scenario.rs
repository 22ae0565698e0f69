//! Everything a seed decides before the run starts: the peers and their configurations, which
//! of them run a durability hook and how it behaves, the local-carrier topology, the relay's
//! mailbox, how hostile the network and the scheduler are, whether messages travel sealed
//! in end-to-end sessions (and whether the relay offers its key-package directory for them),
//! and the chat groups among the peers, if any (`GroupWorld`).

use std::collections::BTreeSet;

use courier_engine::{Config, HookConfig, Millis};
use courier_proto::address::ADDRESS_HASH_LEN;
use courier_proto::{Address, IdentityKey};

use crate::relay::MailboxLimits;
use crate::rng::Rng;

pub const SEC: Millis = 1000;
pub const MIN: Millis = 60 * SEC;
pub const HOUR: Millis = 60 * MIN;
pub const DAY: Millis = 24 * HOUR;

/// The local carrier the simulated apps register.
pub const BLE: &str = "ble";

/// Content that every durability hook refuses until the world turns honest: a message the
/// application cannot store, which only the buffer's retention removes.
pub const POISON: &str = "poison";

/// How an application's durability hook treats a batch, in per mille.
#[derive(Debug, Clone, Copy)]
pub struct HookProfile {
    pub commit: u32,
    pub refuse: u32,
    /// Never answers: the driver's hook timeout refuses the batch.
    pub hang: u32,
    /// The process dies inside the hook before the app committed anything.
    pub crash_before_commit: u32,
    /// The process dies inside the hook after the app committed, before the hook returned.
    pub crash_after_commit: u32,
    pub max_delay: Millis,
}

#[derive(Debug, Clone)]
pub struct PeerSpec {
    /// The device's identity: an `off1` address, as the client's engine has it.
    pub name: String,
    /// The Ed25519 key `name` derives from, in an encrypted world (its sessions' credential and
    /// its control signatures need the real key); `None` otherwise, where `name` is made up.
    pub identity: Option<IdentityKey>,
    /// A short name for traces and reports.
    pub alias: String,
    pub config: Config,
    pub hook: Option<HookProfile>,
}

/// Per-frame faults, in per mille.
#[derive(Debug, Clone, Copy)]
pub struct LinkFaults {
    pub loss: u32,
    pub duplicate: u32,
    /// A delay spike of up to `spike_ms` (on an ordered link it holds the frames behind it too).
    pub spike: u32,
    pub spike_ms: Millis,
    /// Base latency range.
    pub latency: (Millis, Millis),
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub peers: Vec<PeerSpec>,
    /// An address no relay has heard of: messages to it can only fail by lifetime.
    pub ghost: String,
    pub mailbox: Option<MailboxLimits>,
    /// Pairs of peers a local carrier can link (in range or not, as the scheduler decides).
    pub ble_pairs: Vec<(usize, usize)>,
    pub relay_link: LinkFaults,
    pub local_link: LinkFaults,
    /// Scheduled fault actions before the world turns honest.
    pub chaos_actions: u32,
    /// Mean gap between two scheduled actions.
    pub chaos_gap_ms: Millis,
    /// Weights of the scheduler's actions (see `world::Action`).
    pub weights: Vec<u32>,
    /// Messages travel sealed in end-to-end sessions (`Config::encryption` on every device).
    pub encryption: bool,
    /// The relay offers its key-package directory (`docs/protocol.md#key-package-directory`);
    /// without it sessions are set up by the round trip through the peer. Only meaningful
    /// with `encryption`.
    pub directory: bool,
    /// The chat groups and how the relay treats them; `None`: nobody sends to a group.
    pub groups: Option<GroupWorld>,
}

/// A chat group as the seed starts it.
#[derive(Debug, Clone)]
pub struct GroupSpec {
    pub id: String,
    /// The first epoch's roster, by peer index.
    pub members: BTreeSet<usize>,
}

/// What the relay does with a broadcast's report, in per mille (the rest is on time). Only
/// while the chaos lasts.
#[derive(Debug, Clone, Copy)]
pub struct ReportFaults {
    /// Never written.
    pub lost: u32,
    /// Written within the sender's 60 s wait, but late (up to the relay's 45 s).
    pub late: u32,
    /// Written after the sender's wait ran out: the sender has broadcast again by then.
    pub after_wait: u32,
    /// `GroupError` naming the broadcast instead: nothing journaled.
    pub refused: u32,
    /// The sender's connection drops right after the broadcast: the relay holds the report
    /// for its next connection.
    pub disconnect: u32,
    /// The sender's process dies right after the broadcast, before the report.
    pub crash: u32,
}

/// The seed's chat groups (`docs/delivery.md#group-sends`).
#[derive(Debug, Clone)]
pub struct GroupWorld {
    pub groups: Vec<GroupSpec>,
    /// The relay advertises group delivery (`group_delivery_v3`); without it every group
    /// message fans out.
    pub relay_delivery: bool,
    /// `group.relayBroadcastEnabled` per peer.
    pub broadcast: Vec<bool>,
    pub report: ReportFaults,
    /// The relay refuses a group's registration on a connection, in per mille.
    pub registration_refused: u32,
    /// How long the relay's copy of a roster lags behind a membership change, at most.
    pub roster_lag_ms: Millis,
    /// Weights of the group actions (see `world::Action`), appended to `weights`.
    pub weights: [u32; 3],
}

/// What the encryption choices of a seed are drawn from: a stream of their own, so that a
/// world without encryption is the same world it was before encryption existed, and forcing
/// encryption on changes nothing else about the seed's world.
const E2E_STREAM: u64 = 0x6e32_6565_5f73_6565;
/// The stream the group choices are drawn from, for the same reason: a world without groups is
/// the world it was before groups existed, and forcing them on changes nothing else.
const GROUP_STREAM: u64 = 0x6772_6f75_705f_7365;

impl Scenario {
    /// The seed's scenario; `encryption` and `groups`: `Some` forces the choice the seed would
    /// make.
    pub fn generate(
        rng: &mut Rng,
        seed: u64,
        actions: Option<u32>,
        encryption: Option<bool>,
        groups: Option<bool>,
    ) -> Self {
        let count = rng.range(3, 5) as usize;
        let mut peers: Vec<PeerSpec> = (0..count).map(|i| peer_spec(rng, i)).collect();
        let mut e2e = Rng::new(seed ^ E2E_STREAM);
        let encrypted = e2e.chance(500);
        let encryption = encryption.unwrap_or(encrypted);
        let directory = e2e.chance(500);
        if encryption {
            let pending_lifetime = e2e.range(10 * MIN, HOUR);
            for peer in &mut peers {
                let mut seed = [0u8; 32];
                for chunk in seed.chunks_mut(8) {
                    chunk.copy_from_slice(&e2e.next_u64().to_le_bytes());
                }
                let identity = IdentityKey::from_seed(seed);
                peer.name = identity.address().to_string();
                peer.identity = Some(identity);
                peer.config.encryption = true;
                peer.config.pending_session_max_lifetime_ms = pending_lifetime;
            }
        }
        let mailbox = (!rng.chance(300)).then(|| MailboxLimits {
            max_messages: rng.range(6, 60) as usize,
            max_bytes: 64 * 1024 * 1024,
            ttl_ms: if rng.chance(200) { 20 * MIN } else { 7 * DAY },
        });
        let mut ble_pairs = Vec::new();
        for a in 0..count {
            for b in a + 1..count {
                if rng.chance(450) {
                    ble_pairs.push((a, b));
                }
            }
        }
        let calm = rng.chance(200);
        let relay_link = LinkFaults {
            loss: if calm { 0 } else { rng.range(0, 20) as u32 },
            duplicate: if calm { 0 } else { rng.range(0, 20) as u32 },
            spike: rng.range(0, 40) as u32,
            spike_ms: rng.range(100, 20 * SEC),
            latency: (rng.range(1, 20), rng.range(20, 150)),
        };
        let local_link = LinkFaults {
            loss: rng.range(0, 150) as u32,
            duplicate: rng.range(0, 80) as u32,
            spike: rng.range(0, 80) as u32,
            spike_ms: rng.range(100, 10 * SEC),
            latency: (rng.range(1, 10), rng.range(10, 400)),
        };
        let chaos_actions = actions.unwrap_or_else(|| rng.range(150, 300) as u32);
        let chaos_gap_ms = rng.range(200, 3 * SEC);
        let groups = group_world(&mut Rng::new(seed ^ GROUP_STREAM), count, groups);
        let mut weights = crate::world::Action::weights(rng);
        weights.extend(groups.as_ref().map_or([0; 3], |g| g.weights));
        Self {
            peers,
            ghost: address(0xee),
            mailbox,
            ble_pairs,
            relay_link,
            local_link,
            chaos_actions,
            chaos_gap_ms,
            weights,
            encryption,
            directory,
            groups,
        }
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.peers.iter().position(|p| p.name == name)
    }

    /// Replaces every address in `text` by its short name.
    pub fn shorten(&self, text: &str) -> String {
        let mut text = text.replace(&self.ghost, "ghost");
        for p in &self.peers {
            text = text.replace(&p.name, &p.alias);
        }
        text
    }
}

/// About two seeds in five have groups: one to three, each of two or more of the peers.
fn group_world(rng: &mut Rng, peers: usize, force: Option<bool>) -> Option<GroupWorld> {
    let drawn = rng.chance(400);
    if !force.unwrap_or(drawn) {
        return None;
    }
    let groups = (0..rng.range(1, 3))
        .map(|g| {
            let mut members = BTreeSet::new();
            while members.len() < 2 {
                members = (0..peers).filter(|_| rng.chance(650)).collect();
            }
            GroupSpec {
                id: format!("group-{}", g + 1),
                members,
            }
        })
        .collect();
    let mut draw = |lo: u64, hi: u64| rng.range(lo, hi) as u32;
    let report = ReportFaults {
        lost: draw(0, 150),
        late: draw(0, 150),
        after_wait: draw(0, 100),
        refused: draw(0, 60),
        disconnect: draw(0, 60),
        crash: draw(0, 60),
    };
    Some(GroupWorld {
        groups,
        relay_delivery: !rng.chance(150),
        broadcast: (0..peers).map(|_| !rng.chance(250)).collect(),
        report,
        registration_refused: rng.range(0, 100) as u32,
        roster_lag_ms: rng.range(0, 30 * SEC),
        weights: [
            rng.range(10, 40) as u32,
            rng.range(1, 6) as u32,
            rng.range(0, 4) as u32,
        ],
    })
}

/// A well-formed `off1` address, a different one per `tag`.
fn address(tag: u8) -> String {
    Address::from_hash([tag; ADDRESS_HASH_LEN]).to_string()
}

fn peer_spec(rng: &mut Rng, i: usize) -> PeerSpec {
    let mut config = Config::new("sim");
    config.ack_timeout_ms = rng.range(2 * SEC, 10 * SEC);
    config.max_pending_acks = rng.range(2, 12) as usize;
    config.max_retries = rng.range(1, 5) as u32;
    config.initial_delay_ms = rng.range(200, SEC);
    config.max_delay_ms = rng.range(10 * SEC, 60 * SEC);
    config.outbox_max_lifetime_ms = rng.range(5 * MIN, 30 * MIN);
    config.edge_driven_unreachable_dm = rng.chance(300);
    config.outbox_max_entries = rng.range(6, 30) as usize;
    config.outbox_max_media_entries = rng.range(2, 6) as usize;
    config.flush_batch = rng.range(1, 6) as usize;
    let hook = rng.chance(500).then(|| {
        config.durability_hook = Some(HookConfig {
            batch_max_messages: rng.range(1, 6) as usize,
            batch_max_bytes: rng.range(16, 512) as usize,
            batch_max_age_ms: rng.range(200, 3 * SEC),
            retry_initial_ms: rng.range(100, SEC),
            retry_max_ms: rng.range(2 * SEC, 20 * SEC),
            retention_ms: if rng.chance(300) {
                rng.range(30 * SEC, 5 * MIN)
            } else {
                7 * DAY
            },
            max_buffered_messages: rng.range(4, 40) as usize,
            max_buffered_bytes: 64 * 1024 * 1024,
            timeout_ms: rng.range(2 * SEC, 30 * SEC),
        });
        HookProfile {
            commit: rng.range(400, 800) as u32,
            refuse: rng.range(0, 250) as u32,
            hang: rng.range(0, 60) as u32,
            crash_before_commit: rng.range(0, 80) as u32,
            crash_after_commit: rng.range(0, 80) as u32,
            max_delay: rng.range(1, 2 * SEC),
        }
    });
    PeerSpec {
        name: address(i as u8 + 1),
        identity: None,
        alias: format!("p{i}"),
        config,
        hook,
    }
}
