//! Random interleavings of everything the world can do — sends, duplicates, carriers flapping,
//! frames lost or failed, stale reports, relay verdicts, genuine and forged ACKs, inbound
//! redeliveries, restarts, a local carrier with neighbors coming and going, ACKs and messages
//! carried over it, presence reports, and (on even seeds) `edgeDrivenUnreachableDm` — from fixed
//! seeds. The simulator checks the invariants after every
//! call; at the end the world turns honest and everything accepted must settle exactly once.
//!
//! The hook mode runs the same world with an inbound durability hook that commits or refuses
//! at random, relay drains that redeliver the journal, and restarts inside the hook: every inbound
//! message must end committed exactly once (offered at least once), and nothing is released
//! before its commit.

use std::collections::BTreeSet;

use courier_proto::{ContentType, Priority};

use super::*;
use crate::config::HookConfig;
use crate::{BatchOrigin, FailReason};

/// splitmix64: enough randomness for scheduling, and reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.index(items.len())]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

const RECIPIENTS: [&str; 3] = [BOB, "carol", "dave"];
/// Who may be in range of the local carrier: the recipients, and one device that only carries.
const NEIGHBORS: [&str; 4] = [BOB, "carol", "dave", "zed"];
const PRIORITIES: [Priority; 4] = [
    Priority::Low,
    Priority::Medium,
    Priority::High,
    Priority::Critical,
];
const ANSWERS: [Option<CarrierAnswer>; 6] = [
    Some(CarrierAnswer::Live),
    Some(CarrierAnswer::Live),
    Some(CarrierAnswer::Live),
    Some(CarrierAnswer::Stored),
    Some(UNREACHABLE),
    None,
];

#[test]
fn random_interleavings_keep_the_invariants() {
    let mut seen = BTreeSet::new();
    for seed in 1..=16 {
        seen.extend(run(seed, false));
    }
    let all = [
        "delivered",
        "delivered over ble",
        "offered",
        "watched",
        "resting",
        "stored",
        "undeliverable",
        "retrying",
        "deferred",
        "received",
        "max retries",
        "lifetime",
        "capacity",
    ];
    assert_eq!(seen, all.into_iter().collect());
}

#[test]
fn random_interleavings_with_the_durability_hook() {
    let mut seen = BTreeSet::new();
    for seed in 101..=112 {
        seen.extend(run(seed, true));
    }
    let all = [
        "hook committed",
        "hook refused",
        "redelivery offered",
        "drain offered",
        "live offered",
        "drain completed",
        "drain batch of many",
        "retention expired",
        "delivered",
        "retrying",
    ];
    for path in all {
        assert!(
            seen.contains(path),
            "the hook runs never went through {path}"
        );
    }
}

fn outcome(event: &Event) -> Option<&'static str> {
    Some(match event {
        Event::MessageDelivered { .. } => "delivered",
        Event::MessageStored { .. } => "stored",
        Event::MessageUndeliverable { .. } => "undeliverable",
        Event::MessageRetrying { .. } => "retrying",
        Event::MessageDeferred { .. } => "deferred",
        Event::MessageReceived { .. } => "received",
        Event::GroupMessageSent { .. }
        | Event::GroupMessageDeliveryReport { .. }
        | Event::GroupMemberStatus { .. } => return None,
        Event::MessageFailed {
            reason: FailReason::MaxRetriesExceeded,
            ..
        } => "max retries",
        Event::MessageFailed {
            reason: FailReason::OutboxLifetimeExceeded,
            ..
        } => "lifetime",
        Event::MessageFailed {
            reason: FailReason::OutboxCapacityExceeded,
            ..
        } => "capacity",
        Event::MessageFailed {
            reason: FailReason::PendingSessionLifetimeExceeded,
            ..
        } => "session lifetime",
        Event::MessageFailed {
            reason: FailReason::PendingSessionCapacityExceeded,
            ..
        } => "session capacity",
        Event::MessageFailed {
            reason: FailReason::ControlSignatureExpired,
            ..
        } => "control signature expired",
        Event::MessageFailed {
            reason: FailReason::ConnectionRequestUndeliverable,
            ..
        } => "request undeliverable",
        Event::MessageFailed {
            reason: FailReason::TransferAborted,
            ..
        } => "transfer aborted",
        Event::InboundDrainCompleted { .. } => "drain completed",
        Event::SecurityWarning { .. } => "security warning",
        Event::MessageDecryptionFailed { .. } => "decryption failed",
        Event::MessageSent { .. }
        | Event::Diagnostic { .. }
        | Event::PresenceUpdated { .. }
        | Event::NeighborDiscovered { .. }
        | Event::NeighborLost { .. } => return None,
    })
}

/// The paths a run went through, so the test notices when the world model stops reaching them.
fn run(seed: u64, hook: bool) -> BTreeSet<&'static str> {
    let mut rng = Rng(seed);
    let mut config = Config::new("chaos");
    config.max_retries = 3;
    config.max_pending_acks = 6;
    config.flush_batch = 4;
    config.outbox_max_entries = 30;
    config.outbox_max_media_entries = 4;
    config.outbox_max_lifetime_ms = 15 * MIN;
    config.edge_driven_unreachable_dm = seed.is_multiple_of(2);
    if hook {
        config.durability_hook = Some(HookConfig {
            batch_max_messages: 5,
            batch_max_bytes: 64,
            retry_initial_ms: 500,
            retry_max_ms: 8 * SEC,
            // Odd seeds let refused rows run into their retention.
            retention_ms: if seed % 2 == 1 { 20 * MIN } else { 7 * DAY },
            ..HookConfig::default()
        });
    }
    let mut sim = Sim::new(config);
    let mut draining = false;
    let mut paths = BTreeSet::new();
    let mut accepted = BTreeSet::new();
    let mut relay_seq = 1_000_000;

    for _ in 0..1500 {
        let actions = if hook { 145 } else { 125 };
        match rng.below(actions) {
            0..=21 => {
                let content_type = if rng.chance(10) {
                    ContentType::FileChunk
                } else {
                    ContentType::Text
                };
                let id = sim.mint();
                let req = request(
                    rng.pick(&RECIPIENTS),
                    rng.pick(&PRIORITIES),
                    content_type,
                    &id,
                );
                if sim.submit(req) {
                    accepted.insert(id);
                }
            }
            22..=24 => {
                if let Some(id) = random_key(&mut rng, sim.rows.keys()) {
                    let req = request(BOB, Priority::Low, ContentType::Text, &id);
                    assert!(!sim.submit(req), "a duplicate id took a new entry");
                }
            }
            25..=29 => {
                sim.carrier_up();
            }
            30..=33 => sim.carrier_down(),
            34..=35 => sim.restart(),
            36..=45 => {
                sim.net = Net {
                    write: rng.chance(80),
                    answer: rng.pick(&ANSWERS),
                    ack_after: rng.chance(70).then(|| rng.below(20 * SEC)),
                    refuse: rng.chance(5),
                }
            }
            46..=53 => {
                if let Some(id) = random_key(&mut rng, sim.frames.keys()) {
                    sim.ack(&id);
                }
            }
            54..=56 => {
                if let Some(id) = random_key(&mut rng, sim.frames.keys()) {
                    let forged = sim.frames[&id].ack("forged".into(), sim.now, "internet");
                    relay_seq += 1;
                    let origin = InboundOrigin {
                        carrier: Carrier::Relay,
                        stamped_sender: "mallory".into(),
                        sender_account: Some("mallory".into()),
                        seq: Some(relay_seq),
                        sealed_by: None,
                    };
                    sim.inbound(forged, origin);
                }
            }
            57..=62 => {
                let sender = rng.pick(&RECIPIENTS);
                let mut message = sim_message(sender, rng.below(8));
                message.requires_ack = rng.chance(90);
                relay_seq += 1;
                let origin = InboundOrigin {
                    carrier: Carrier::Relay,
                    stamped_sender: sender.into(),
                    sender_account: None,
                    seq: rng.chance(80).then_some(relay_seq),
                    sealed_by: None,
                };
                sim.inbound(message, origin);
            }
            63..=67 => {
                let index = rng.index(sim.unwritten.len());
                sim.fail_unwritten(index, "socket error");
            }
            68..=74 => {
                let index = rng.index(sim.unwritten.len());
                sim.write_unwritten(index);
            }
            75..=77 => {
                if let Some(id) = random_key(&mut rng, sim.rows.keys()) {
                    let answer =
                        rng.pick(&[CarrierAnswer::Live, CarrierAnswer::Stored, UNREACHABLE]);
                    sim.answer(&id, answer);
                }
            }
            78..=80 => {
                if sim.links.contains_key(BLE) && rng.chance(40) {
                    sim.local_down(BLE);
                } else {
                    sim.local_up(BLE);
                }
            }
            81..=86 => {
                if sim.links.contains_key(BLE) {
                    sim.discover(rng.pick(&NEIGHBORS), BLE);
                }
            }
            87..=90 => {
                let peer = rng.pick(&NEIGHBORS);
                sim.lose(peer, BLE);
            }
            91..=95 => {
                let peer = rng.pick(&RECIPIENTS);
                let online = rng.chance(60);
                sim.presence(peer, online);
            }
            96..=97 => {
                sim.local = LocalNet {
                    write: rng.chance(80),
                    ack_after: rng.chance(70).then(|| rng.below(20 * SEC)),
                }
            }
            98..=100 => {
                // An ACK carried over the local carrier, by the recipient or by someone else.
                let neighbors: Vec<String> = sim
                    .links
                    .get(BLE)
                    .map(|peers| peers.iter().cloned().collect())
                    .unwrap_or_default();
                if let (Some(id), false) = (
                    random_key(&mut rng, sim.frames.keys()),
                    neighbors.is_empty(),
                ) {
                    let by = neighbors[rng.index(neighbors.len())].clone();
                    sim.ack_carried(&id, Carrier::Local(BLE.into()), &by);
                }
            }
            101..=102 => {
                // A message from a neighbor over the local carrier (an edge for it).
                let neighbors: Vec<String> = sim
                    .links
                    .get(BLE)
                    .map(|peers| peers.iter().cloned().collect())
                    .unwrap_or_default();
                if !neighbors.is_empty() {
                    let sender = neighbors[rng.index(neighbors.len())].clone();
                    let message = sim_message(&sender, rng.below(8));
                    let origin = InboundOrigin {
                        carrier: Carrier::Local(BLE.into()),
                        stamped_sender: sender,
                        sender_account: None,
                        seq: None,
                        sealed_by: None,
                    };
                    sim.inbound(message, origin);
                }
            }
            125..=132 => {
                // The hook: the runtime polls it, or it answers the batch it has.
                if sim.hook.is_some() {
                    let ok = rng.chance(65);
                    sim.hook_result(ok);
                } else {
                    sim.poll_hook();
                }
            }
            133..=134 => {
                // A reconnect with `mailbox_v1`: the relay drains its journal.
                sim.drain_started();
                draining = true;
                if rng.chance(50) {
                    let count = sim.redeliver_journal();
                    if rng.chance(70) {
                        sim.drain_complete(count);
                        draining = false;
                    }
                }
            }
            135..=136 => {
                if draining {
                    sim.drain_complete(0);
                    draining = false;
                }
            }
            137..=138 => {
                // The relay redelivers one frame it still holds.
                if let Some(seq) = random_seq(&mut rng, &sim) {
                    let (message, origin) = sim.journal[&seq].clone();
                    sim.inbound(message, origin);
                }
            }
            139..=140 => {
                // The process dies inside the hook.
                if sim.hook.is_some() {
                    sim.restart();
                    draining = false;
                }
            }
            141..=144 => {
                let sender = rng.pick(&RECIPIENTS);
                let message = sim_message(sender, 8 + rng.below(40));
                relay_seq += 1;
                let origin = InboundOrigin {
                    carrier: Carrier::Relay,
                    stamped_sender: sender.into(),
                    sender_account: None,
                    seq: Some(relay_seq),
                    sealed_by: None,
                };
                sim.inbound(message, origin);
            }
            _ => sim.advance(rng.below(90 * SEC)),
        }
        if !sim.internet_up {
            // A disconnect ends the drain of that connection.
            draining = false;
        }
        if sim
            .rows
            .values()
            .any(|r| r.state == EntryState::Parked && r.next_at.is_none())
        {
            paths.insert("resting");
        }
    }

    sim.net = Net::honest();
    sim.local = LocalNet {
        write: true,
        ack_after: Some(100),
    };
    while !sim.unwritten.is_empty() {
        sim.write_unwritten(0);
    }
    sim.carrier_up();
    if hook {
        // The relay drains what it still holds; the hook now commits everything.
        if sim.hook.is_some() {
            sim.hook_result(true);
        }
        sim.drain_started();
        let count = sim.redeliver_journal();
        sim.drain_complete(count);
    }
    for _ in 0..1000 {
        if hook {
            sim.hook_commits_all();
        }
        if sim.rows.is_empty() && sim.inbound_rows.is_empty() {
            break;
        }
        sim.advance(10 * MIN);
    }
    assert!(
        sim.rows.is_empty(),
        "seed {seed}: never settled: {:?}",
        sim.rows.keys().collect::<Vec<_>>()
    );
    assert_eq!(
        sim.engine.next_deadline(),
        None,
        "seed {seed}: an empty engine sleeps"
    );
    for id in &accepted {
        assert_eq!(sim.terminal_count(id), 1, "seed {seed}: {id}");
    }
    if hook {
        hook_outcome(&sim, seed, &mut paths);
    }
    if !sim.offers.is_empty() {
        paths.insert("offered");
    }
    if !sim.presence_log.is_empty() {
        paths.insert("watched");
    }
    if sim
        .events()
        .any(|(_, e)| matches!(e, Event::MessageDelivered { transport, .. } if transport == BLE))
    {
        paths.insert("delivered over ble");
    }
    paths.extend(sim.events().filter_map(|(_, event)| outcome(event)));
    paths
}

/// Every data message the world sent ends committed exactly once through the hook, was offered
/// at least once, and every relay frame that carried one is released.
fn hook_outcome(sim: &Sim, seed: u64, paths: &mut BTreeSet<&'static str>) {
    assert!(
        sim.inbound_rows.is_empty(),
        "seed {seed}: rows never committed"
    );
    assert!(
        sim.journal.is_empty(),
        "seed {seed}: relay frames never released: {:?}",
        sim.journal.keys().collect::<Vec<_>>()
    );
    let short_retention = seed % 2 == 1;
    assert!(
        short_retention || sim.expired.is_empty(),
        "seed {seed}: nothing reaches a 7-day retention here"
    );
    let warnings = sim
        .events()
        .filter(|(_, e)| matches!(e, Event::SecurityWarning { reason_code, .. } if *reason_code == crate::hook::RETENTION_EXPIRED))
        .count();
    assert_eq!(
        warnings, sim.expired_rows,
        "seed {seed}: an expiry without its warning"
    );
    if warnings > 0 {
        paths.insert("retention expired");
    }
    let offered: BTreeSet<&InboundKey> = sim
        .offered
        .iter()
        .flat_map(|(_, batch)| batch.messages.iter().map(|m| &m.key))
        .collect();
    for (key, (count, _)) in &sim.commits {
        assert_eq!(*count, 1, "seed {seed}: {key:?}");
        assert!(
            offered.contains(key),
            "seed {seed}: {key:?} committed unseen"
        );
    }
    for key in offered {
        assert!(
            sim.commits.contains_key(key) || sim.expired.contains(key),
            "seed {seed}: {key:?} never committed"
        );
    }
    let dispatched: BTreeSet<&InboundKey> = sim.dispatched.iter().map(|(_, m)| &m.key).collect();
    assert_eq!(
        dispatched.len(),
        sim.dispatched.len(),
        "seed {seed}: a message dispatched twice"
    );
    assert_eq!(dispatched.len(), sim.commits.len());
    if !sim.commits.is_empty() {
        paths.insert("hook committed");
    }
    for (_, batch) in &sim.offered {
        for message in &batch.messages {
            paths.insert(match message.origin {
                BatchOrigin::Live => "live offered",
                BatchOrigin::Drain => "drain offered",
                BatchOrigin::Redelivery => "redelivery offered",
            });
        }
        if batch.messages.len() > 1 {
            paths.insert("drain batch of many");
        }
    }
    if sim
        .events()
        .any(|(_, e)| matches!(e, Event::Diagnostic { message, .. } if message.contains("refused batch")))
    {
        paths.insert("hook refused");
    }
}

fn random_seq(rng: &mut Rng, sim: &Sim) -> Option<u64> {
    let len = sim.journal.len();
    if len == 0 {
        return None;
    }
    sim.journal.keys().nth(rng.index(len)).copied()
}

fn random_key<'a>(
    rng: &mut Rng,
    keys: impl ExactSizeIterator<Item = &'a String>,
) -> Option<String> {
    let len = keys.len();
    if len == 0 {
        return None;
    }
    let index = rng.index(len);
    keys.into_iter().nth(index).cloned()
}

fn sim_message(sender: &str, n: u64) -> courier_proto::Message {
    let mut message = inbound_sample();
    message.id = format!("in-{n}");
    message.sender = sender.to_owned();
    message
}

fn inbound_sample() -> courier_proto::Message {
    courier_proto::Message {
        id: String::new(),
        sender: String::new(),
        recipient: ALICE.to_owned(),
        app_id: "chaos".to_owned(),
        priority: Priority::Medium,
        ttl: 10,
        hop_count: 0,
        timestamp: 0,
        lamport_clock: 1,
        content_type: ContentType::Text,
        content: "hi".to_owned(),
        metadata: Default::default(),
        requires_ack: true,
        reply_to_msg: None,
        rich: None,
        binary_content: None,
        media_metadata: None,
        forwarded_from: None,
        reply_context: None,
        encrypted: None,
    }
}
