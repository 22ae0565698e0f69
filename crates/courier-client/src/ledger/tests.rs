//! The ledger on a real engine and a real (in-memory) store, on a virtual clock: each call's
//! outputs go through the observer into the commit, as the driver's step does, so the time a
//! lifetime or a probe ladder takes passes in a line.

use courier_engine::io::{Carrier, CarrierAnswer, SendRequest, TransmitKind};
use courier_engine::{Config, Engine, Input, Millis, Restore};
use courier_proto::{ContentType, Priority, UnreachableCause};

use super::explain::explain;
use super::{Kind, Observer, PER_MESSAGE};
use crate::event::ClientEvent;
use crate::store::{Reports, RuntimeChanges, Store};

const T0: Millis = 1_796_724_180_000; // 2026-12-08T10:03:00Z
const SEC: Millis = 1_000;
const DAY: Millis = 86_400_000;

struct Device {
    engine: Engine,
    store: Store,
    observer: Observer,
    config: Config,
    now: Millis,
    /// The outbox writes of the last call, with their `send_seq`.
    writes: Vec<(courier_proto::Message, u64)>,
    /// Every message the relay wrote, latest last.
    written: Vec<courier_proto::Message>,
}

impl Device {
    fn new(config: Config) -> Self {
        let mut device = Self {
            engine: Engine::new(config.clone(), "alice".into()),
            store: Store::open_memory().unwrap(),
            observer: Observer::default(),
            config,
            now: T0,
            writes: Vec::new(),
            written: Vec::new(),
        };
        device.input(Input::Restore(Restore::default()));
        device.input(Input::CarrierUp(Carrier::Relay));
        device
    }

    fn input(&mut self, input: Input) {
        self.observer.input(&input, self.now);
        self.engine.handle(input, self.now);
        self.commit();
    }

    fn commit(&mut self) {
        let ops: Vec<_> = std::iter::from_fn(|| self.engine.poll_store()).collect();
        let mut events: Vec<ClientEvent> = std::iter::from_fn(|| self.engine.poll_event())
            .map(ClientEvent::from)
            .collect();
        events.extend(
            std::iter::from_fn(|| self.engine.poll_event_after_transmits()).map(ClientEvent::from),
        );
        self.writes = std::iter::from_fn(|| self.engine.poll_transmit())
            .filter_map(|t| match t.kind {
                TransmitKind::Outbox { message, send_seq } => Some((message, send_seq)),
                _ => None,
            })
            .collect();
        let refs: Vec<&ClientEvent> = events.iter().collect();
        let ledger = self.observer.step(&ops, &refs, self.now);
        let runtime = RuntimeChanges {
            ledger: &ledger,
            now: self.now,
            ..RuntimeChanges::default()
        };
        self.store
            .commit_with(&ops, &Reports::default(), &runtime)
            .unwrap();
    }

    fn send(&mut self, id: &str) {
        self.observer.accepted(id, "bob", self.now);
        self.input(Input::Send(SendRequest {
            id: id.into(),
            settled: None,
            recipient: "bob".into(),
            content: "are you there?".into(),
            content_type: ContentType::Text,
            priority: Priority::Medium,
            metadata: Default::default(),
            binary_content: None,
            media: None,
            rich: Default::default(),
        }));
    }

    /// The relay writes what the engine handed it, and answers each write with `answer`.
    fn relay_answers(&mut self, answer: CarrierAnswer) {
        for (message, send_seq) in std::mem::take(&mut self.writes) {
            let id = message.id.clone();
            self.written.push(message);
            self.input(Input::Written {
                id: id.clone(),
                send_seq,
            });
            self.input(Input::Answer {
                id,
                send_seq,
                answer,
            });
        }
    }

    fn at(&mut self, now: Millis) {
        self.now = now;
        self.input(Input::Timeout);
    }

    fn explain(&self, id: &str) -> super::explain::Explanation {
        let history = self.store.history(id).unwrap().expect("the ledger has it");
        let live = self.store.outbox_record(id).unwrap();
        explain(&history, live.as_ref(), &self.config, self.now)
    }

    fn kinds(&self, id: &str) -> Vec<&'static str> {
        let history = self.store.history(id).unwrap().unwrap();
        history.entries.iter().map(|(_, _, k)| k.name()).collect()
    }
}

const NO_MAILBOX: CarrierAnswer = CarrierAnswer::Unreachable(UnreachableCause::OfflineNoMailbox);

#[test]
fn a_parked_message_is_explained_with_its_cause_attempts_next_probe_and_lifetime() {
    let mut alice = Device::new(Config::new("test"));
    alice.send("m1");
    alice.relay_answers(NO_MAILBOX);
    // The first probe is due 15 s after the park; it is answered the same way.
    alice.at(T0 + 15 * SEC);
    alice.relay_answers(NO_MAILBOX);
    alice.at(T0 + 16 * SEC);

    let explained = alice.explain("m1");
    assert_eq!(explained.facts.state, "parked");
    assert_eq!(explained.facts.attempts, 2);
    assert_eq!(explained.facts.probes, 1);
    assert_eq!(
        explained.facts.park_cause.as_deref(),
        Some("offline_no_mailbox")
    );
    let next = explained.facts.next_at.expect("a probe is scheduled");
    assert!(next > alice.now, "the next probe is ahead");
    // Created at 10:03 on Dec 8 with the default 7-day lifetime: the absolute cap is 28 days on.
    assert_eq!(explained.facts.expires_at, Some(T0 + 28 * DAY));
    assert_eq!(
        explained.sentence,
        format!(
            "parked since 10:03: the relay says bob has no mailbox; 2 attempts over the relay \
             (1 probe); next probe {}; will fail at the outbox lifetime on Jan 5",
            super::time::clock(next)
        )
    );
    assert_eq!(
        alice.kinds("m1"),
        ["accepted", "attempt", "answer", "parked", "attempt", "answer", "parked"]
    );
}

#[test]
fn a_message_past_its_lifetime_is_explained_as_failed_by_the_lifetime() {
    let mut config = Config::new("test");
    config.outbox_max_lifetime_ms = 60 * SEC;
    let mut alice = Device::new(config);
    alice.send("m1");
    alice.relay_answers(NO_MAILBOX);
    let mut now = T0;
    while alice.store.outbox_record("m1").unwrap().is_some() {
        now = alice
            .engine
            .next_deadline()
            .expect("a parked entry keeps a timer");
        alice.at(now);
        alice.relay_answers(NO_MAILBOX);
    }
    let explained = alice.explain("m1");
    assert_eq!(explained.facts.state, "failed");
    assert_eq!(
        explained.facts.reason.as_deref(),
        Some("Outbox lifetime exceeded")
    );
    assert!(
        explained.sentence.starts_with(&format!(
            "failed at {}: the outbox lifetime ran out before bob acknowledged it",
            super::time::clock(now)
        )),
        "{}",
        explained.sentence
    );
    assert!(explained
        .sentence
        .contains("it was parked: the relay said bob has no mailbox"));
}

#[test]
fn a_probe_ladder_that_runs_for_weeks_keeps_its_first_and_latest_entries_only() {
    let mut alice = Device::new(Config::new("test"));
    alice.send("m1");
    alice.relay_answers(NO_MAILBOX);
    for _ in 0..100 {
        let due = alice.engine.next_deadline().unwrap();
        alice.at(due);
        alice.relay_answers(NO_MAILBOX);
    }
    let history = alice.store.history("m1").unwrap().unwrap();
    assert_eq!(history.entries.len() as u64, PER_MESSAGE);
    assert_eq!(
        history.entries[0].2,
        Kind::Accepted,
        "the first entry is kept"
    );
    assert!(history.kept > 300, "{} entries kept", history.kept);
    let positions: Vec<u64> = history.entries.iter().map(|(n, _, _)| *n).collect();
    assert_eq!(positions[1], history.kept - (PER_MESSAGE - 1));
    assert_eq!(*positions.last().unwrap(), history.kept - 1);
    let explained = alice.explain("m1");
    assert_eq!(explained.facts.dropped, history.kept - PER_MESSAGE);

    // The hourly prune trims the file to its first row and latest rows (a row holds one step's
    // entries), which still hold everything the reader shows.
    alice.store.prune_ledger(0, usize::MAX).unwrap();
    let trimmed = alice.store.history("m1").unwrap().unwrap();
    assert!(
        (PER_MESSAGE..history.kept).contains(&trimmed.kept),
        "a live message keeps its ledger, trimmed: {} of {}",
        trimmed.kept,
        history.kept
    );
    let shown = |h: &super::History| -> Vec<(u64, Kind)> {
        h.entries
            .iter()
            .map(|(_, at, kind)| (*at, kind.clone()))
            .collect()
    };
    assert_eq!(shown(&trimmed), shown(&history));
}

#[test]
fn a_presence_edge_is_named_as_what_re_drove_the_parked_message() {
    let mut alice = Device::new(Config::new("test"));
    alice.send("m1");
    alice.relay_answers(NO_MAILBOX);
    alice.now += 3 * SEC;
    alice.input(Input::Presence {
        peer: "bob".into(),
        online: true,
        last_seen_ms: None,
    });
    alice.relay_answers(CarrierAnswer::Live);
    alice.now += SEC;
    alice.input(Input::Inbound {
        message: Box::new(
            alice
                .written
                .last()
                .unwrap()
                .ack("ack-1".into(), alice.now, "internet"),
        ),
        origin: courier_engine::InboundOrigin {
            carrier: Carrier::Relay,
            stamped_sender: "bob".into(),
            sender_account: None,
            seq: None,
            sealed_by: None,
        },
    });
    let explained = alice.explain("m1");
    assert_eq!(explained.facts.state, "delivered", "{explained:?}");
    assert_eq!(explained.facts.redrives, 1);
    assert_eq!(
        explained.facts.redriven_by.as_deref(),
        Some("the relay saw bob come online")
    );
    assert!(
        explained.sentence.starts_with(
            "delivered at 10:03: acknowledged by bob over the relay, after it was parked at \
             10:03 and re-driven when the relay saw bob come online; 2 attempts over the relay"
        ),
        "{}",
        explained.sentence
    );
}
