//! Engine CPU per message: one send → written → relay answer → end-to-end ACK cycle, on an
//! empty outbox and with 10 000 other entries awaiting their ACKs; and the cost of waking an
//! idle engine that holds 10 000 entries.

use std::collections::BTreeMap;
use std::hint::black_box;

use courier_engine::{
    Carrier, Config, Engine, InboundOrigin, RelayAnswer, SendRequest, TransmitKind,
};
use courier_proto::{ContentType, Priority};
use criterion::{criterion_group, criterion_main, Criterion};

const BACKLOG: usize = 10_000;

fn request() -> SendRequest {
    SendRequest {
        id: None,
        recipient: "bob".into(),
        content: "hello bob, this is a message of ordinary length".into(),
        content_type: ContentType::Text,
        priority: Priority::Medium,
        metadata: BTreeMap::new(),
        binary_content: None,
    }
}

fn engine(capacity: usize) -> Engine {
    let mut config = Config::new("bench");
    config.outbox_max_entries = capacity;
    config.max_pending_acks = capacity;
    // The backlog must not time out while it is measured.
    config.ack_timeout_ms = u64::MAX / 4;
    let mut engine = Engine::new(config, "alice".into());
    engine.handle_carrier_up(Carrier::Internet, 0);
    engine
}

fn drain(engine: &mut Engine) {
    while engine.poll_store().is_some() {}
    while engine.poll_event().is_some() {}
    while engine.poll_transmit().is_some() {}
}

/// Sends one message and answers for the world: written, relay "live", then bob's ACK.
/// With `acked` false it stays awaiting its ACK (how the backlog is built).
fn cycle(engine: &mut Engine, n: &mut u64, now: u64, acked: bool) {
    *n += 1;
    let id = format!("m{n}");
    engine.send(request(), || id.clone(), now);
    while engine.poll_store().is_some() {}
    while engine.poll_event().is_some() {}
    let Some(transmit) = engine.poll_transmit() else {
        panic!("no transmit")
    };
    let TransmitKind::Outbox { message, send_seq } = transmit.kind else {
        panic!("not an outbox frame")
    };
    engine.handle_written(&message.id, send_seq, now);
    engine.handle_relay_answer(&message.id, send_seq, RelayAnswer::Live, now);
    if acked {
        let ack = message.ack(format!("ack-{}", message.id), now, "internet");
        let origin = InboundOrigin {
            carrier: Carrier::Internet,
            stamped_sender: "bob".into(),
            sender_account: None,
            seq: Some(*n),
        };
        engine.handle_inbound(ack, origin, now);
    }
    drain(engine);
}

fn send_written_ack(c: &mut Criterion) {
    let mut group = c.benchmark_group("send_written_ack_cycle");
    group.bench_function("empty_outbox", |b| {
        let mut engine = engine(BACKLOG * 2);
        let mut n = 0;
        b.iter(|| cycle(black_box(&mut engine), &mut n, 1, true));
    });
    group.bench_function("outbox_with_10k_awaiting_ack", |b| {
        let mut engine = engine(BACKLOG * 2);
        let mut n = 0;
        for _ in 0..BACKLOG {
            cycle(&mut engine, &mut n, 0, false);
        }
        assert_eq!(engine.stats().pending_acks, BACKLOG);
        b.iter(|| cycle(black_box(&mut engine), &mut n, 1, true));
    });
    group.finish();
}

fn idle_wakeup(c: &mut Criterion) {
    // 10 000 entries queued with no carrier: the runtime asks for the deadline and finds nothing due.
    let mut config = Config::new("bench");
    config.outbox_max_entries = BACKLOG;
    let mut engine = Engine::new(config, "alice".into());
    for n in 0..BACKLOG {
        engine.send(request(), || format!("q{n}"), 0);
    }
    drain(&mut engine);
    c.bench_function("idle_10k_next_deadline_and_timeout", |b| {
        b.iter(|| {
            let deadline = engine.next_deadline();
            engine.handle_timeout(black_box(1));
            deadline
        })
    });
}

criterion_group!(benches, send_written_ack, idle_wakeup);
criterion_main!(benches);
