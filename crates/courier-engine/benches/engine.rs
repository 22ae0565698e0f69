//! Engine CPU per message: one send → written → relay answer → end-to-end ACK cycle, on an
//! empty outbox and with 10 000 other entries awaiting their ACKs; the cost of waking an idle
//! engine that holds 10 000 entries; and, for parking, 100 000 parked messages across 1 000
//! offline recipients: engine memory per parked message (heap bytes counted by this bench's
//! global allocator, plus the process RSS delta), the wake-ups over one virtual hour against
//! the number of due probes, and the CPU of one idle `next_deadline` + `handle_timeout`. For the
//! inbound durability hook: the engine CPU to push 10 000 inbound messages through the hook
//! pipeline (buffer, batch, offer, commit, relay Acks, end-to-end ACKs) as a relay drain in
//! batches of up to 400, against the same messages as live traffic in batches of one.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, HashMap};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

use courier_engine::config::HookConfig;
use courier_engine::{
    Carrier, CarrierAnswer, Config, Engine, InboundOrigin, Input, SendRequest, StoreOp,
    TransmitKind,
};
use courier_proto::{ContentType, Message, Priority, UnreachableCause};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const BACKLOG: usize = 10_000;

/// Heap bytes live right now, as counted by [`Counting`].
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting live bytes so the bench can weigh the engine's heap.
struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Resident set size of this process, from `/proc/self/statm` (0 where unavailable).
fn rss_bytes() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn request(id: String) -> SendRequest {
    SendRequest {
        id,
        settled: None,
        recipient: "bob".into(),
        content: "hello bob, this is a message of ordinary length".into(),
        content_type: ContentType::Text,
        priority: Priority::Medium,
        metadata: BTreeMap::new(),
        binary_content: None,
        media: None,
        rich: Default::default(),
    }
}

fn engine(capacity: usize) -> Engine {
    let mut config = Config::new("bench");
    config.outbox_max_entries = capacity;
    config.max_pending_acks = capacity;
    // The backlog must not time out while it is measured.
    config.ack_timeout_ms = u64::MAX / 4;
    let mut engine = Engine::new(config, "alice".into());
    engine.handle(Input::CarrierUp(Carrier::Relay), 0);
    engine
}

fn drain(engine: &mut Engine) {
    while engine.poll_store().is_some() {}
    while engine.poll_event().is_some() {}
    while engine.poll_transmit().is_some() {}
}

/// The relay carrier's reports for one attempt: written, then the relay's answer.
fn written_and_answered(
    engine: &mut Engine,
    id: String,
    send_seq: u64,
    answer: CarrierAnswer,
    now: u64,
) {
    let written = Input::Written {
        id: id.clone(),
        send_seq,
    };
    engine.handle(written, now);
    engine.handle(
        Input::Answer {
            id,
            send_seq,
            answer,
        },
        now,
    );
}

/// Sends one message and answers for the world: written, relay "live", then bob's ACK.
/// With `acked` false it stays awaiting its ACK (how the backlog is built).
fn cycle(engine: &mut Engine, n: &mut u64, now: u64, acked: bool) {
    *n += 1;
    let id = format!("m{n}");
    engine.handle(Input::Send(request(id)), now);
    while engine.poll_store().is_some() {}
    while engine.poll_event().is_some() {}
    let Some(transmit) = engine.poll_transmit() else {
        panic!("no transmit")
    };
    let TransmitKind::Outbox { message, send_seq } = transmit.kind else {
        panic!("not an outbox frame")
    };
    written_and_answered(
        engine,
        message.id.clone(),
        send_seq,
        CarrierAnswer::Live,
        now,
    );
    if acked {
        let ack = message.ack(format!("ack-{}", message.id), now, "internet");
        let origin = InboundOrigin {
            carrier: Carrier::Relay,
            stamped_sender: "bob".into(),
            sender_account: None,
            seq: Some(*n),
            sealed_by: None,
        };
        let message = Box::new(ack);
        engine.handle(Input::Inbound { message, origin }, now);
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
        engine.handle(Input::Send(request(format!("q{n}"))), 0);
    }
    drain(&mut engine);
    c.bench_function("idle_10k_next_deadline_and_timeout", |b| {
        b.iter(|| {
            let deadline = engine.next_deadline();
            engine.handle(Input::Timeout, black_box(1));
            deadline
        })
    });
}

const PARKED: usize = 100_000;
const RECIPIENTS: usize = 1_000;
const SEC: u64 = 1000;
const PROBE_CAP: u64 = 600 * SEC;

/// Answers every outbox frame the engine handed out: written, then the relay's unreachable
/// verdict (every recipient is offline). Returns how many frames it answered; records the
/// probe time of each entry from its latest Put.
fn answer_unreachable(engine: &mut Engine, now: u64, next_at: &mut HashMap<String, u64>) -> usize {
    let mut answered = 0;
    loop {
        let mut frames = Vec::new();
        while let Some(transmit) = engine.poll_transmit() {
            if let TransmitKind::Outbox { message, send_seq } = transmit.kind {
                frames.push((message.id, send_seq));
            }
        }
        if frames.is_empty() {
            break;
        }
        for (id, send_seq) in frames {
            let answer = CarrierAnswer::Unreachable(UnreachableCause::OfflineNoMailbox);
            written_and_answered(engine, id, send_seq, answer, now);
            answered += 1;
        }
        while let Some(op) = engine.poll_store() {
            if let StoreOp::Put(record) = op {
                match record.next_at {
                    Some(at) => next_at.insert(record.message.id, at),
                    None => next_at.remove(&record.message.id),
                };
            }
        }
        while engine.poll_event().is_some() {}
    }
    while engine.poll_store().is_some() {}
    while engine.poll_event().is_some() {}
    while engine.poll_presence().is_some() {}
    answered
}

/// 100 000 messages to 1 000 offline recipients, one accepted every 10 ms, each parked by the
/// relay's verdict. Returns the engine, the time the backlog was complete and each entry's
/// next probe time.
fn parked_engine() -> (Engine, u64, HashMap<String, u64>) {
    let mut config = Config::new("bench");
    config.outbox_max_entries = PARKED;
    let mut engine = Engine::new(config, "alice".into());
    let mut next_at = HashMap::with_capacity(PARKED);
    engine.handle(Input::CarrierUp(Carrier::Relay), 0);
    let mut now = 0;
    for n in 0..PARKED {
        now = n as u64 * 10;
        let mut req = request(format!("p{n:06}"));
        req.recipient = format!("peer{:04}", n % RECIPIENTS);
        engine.handle(Input::Send(req), now);
        // Probes that came due meanwhile go too, as they would in the runtime.
        while engine.next_deadline().is_some_and(|d| d <= now) {
            engine.handle(Input::Timeout, now);
            answer_unreachable(&mut engine, now, &mut next_at);
        }
        answer_unreachable(&mut engine, now, &mut next_at);
    }
    assert_eq!(engine.stats().parked, PARKED);
    (engine, now, next_at)
}

fn parked_backlog(c: &mut Criterion) {
    // Memory: the engine's heap (counted) and the RSS delta while it is built.
    let heap_before = LIVE.load(Ordering::Relaxed);
    let rss_before = rss_bytes();
    let (mut engine, built_at, next_at) = parked_engine();
    // The bookkeeping map of this bench is not the engine's: weigh the engine alone.
    let bookkeeping: usize = next_at.capacity() * (std::mem::size_of::<(String, u64)>() + 1)
        + next_at.keys().map(String::capacity).sum::<usize>();
    let heap = LIVE.load(Ordering::Relaxed) - heap_before - bookkeeping;
    let rss = rss_bytes().saturating_sub(rss_before);
    println!(
        "parked backlog: {PARKED} messages to {RECIPIENTS} recipients; engine heap {:.1} MiB = {} B per parked message (counted); process RSS grew {:.1} MiB = {} B per message",
        heap as f64 / 1048576.0,
        heap / PARKED,
        rss as f64 / 1048576.0,
        rss / PARKED
    );

    // Wake-ups over one virtual hour, every recipient offline: each due probe is answered with
    // a fresh verdict and re-parks (by now every ladder sits at its 600 s cap).
    let start = built_at + 1;
    let end = start + 3600 * SEC;
    let due: usize = next_at
        .values()
        .filter(|at| **at <= end)
        .map(|at| 1 + ((end - (*at).max(start)) / PROBE_CAP) as usize)
        .sum();
    let mut schedule = next_at;
    let mut wakeups = 0usize;
    let mut idle_wakeups = 0usize;
    let mut probes = 0usize;
    let mut per_instant: BTreeMap<u64, usize> = BTreeMap::new();
    while let Some(deadline) = engine.next_deadline().filter(|d| *d <= end) {
        let now = deadline.max(start);
        wakeups += 1;
        engine.handle(Input::Timeout, now);
        let sent = answer_unreachable(&mut engine, now, &mut schedule);
        if sent == 0 {
            idle_wakeups += 1;
        }
        probes += sent;
        *per_instant.entry(now).or_default() += sent;
    }
    let batch = Config::new("bench").flush_batch;
    let minimum: usize = per_instant.values().map(|n| n.div_ceil(batch)).sum();
    println!(
        "one virtual hour offline: {wakeups} wake-ups (next_deadline/handle_timeout cycles), {idle_wakeups} with nothing due; {probes} probes sent, {due} due by the schedule; {} distinct due instants, {minimum} wake-ups at least with batches of {batch}",
        per_instant.len()
    );
    assert_eq!(idle_wakeups, 0, "a wake-up with nothing due");
    assert_eq!(probes, due, "every due probe, nothing else");
    assert_eq!(wakeups, minimum);

    // With the relay down as well, nothing is due for days: only the lifetimes remain.
    engine.handle(Input::CarrierDown(Carrier::Relay), end);
    let asleep_until = engine.next_deadline().expect("lifetimes");
    println!(
        "relay down too: next wake-up {:.1} days out (the earliest lifetime expiry)",
        (asleep_until - end) as f64 / 86_400_000.0
    );
    assert!(asleep_until > end + 3600 * SEC);
    engine.handle(Input::CarrierUp(Carrier::Relay), end);
    answer_unreachable(&mut engine, end, &mut schedule);
    while engine.next_deadline().is_some_and(|d| d <= end) {
        engine.handle(Input::Timeout, end);
        answer_unreachable(&mut engine, end, &mut schedule);
    }

    // CPU of a wake-up that finds nothing due (the runtime's timer fired early, or a spurious
    // poll): one next_deadline + handle_timeout on the 100 000-entry engine.
    let quiet = engine
        .next_deadline()
        .expect("probes stay scheduled")
        .max(end + 1)
        - 1;
    c.bench_function("idle_100k_parked_next_deadline_and_timeout", |b| {
        b.iter(|| {
            let deadline = engine.next_deadline();
            engine.handle(Input::Timeout, black_box(quiet));
            deadline
        })
    });
}

const INBOUND: u64 = 10_000;

/// Bob's message `n` to alice, as the relay delivers it.
fn inbound_message(n: u64) -> Message {
    Message {
        id: format!("bob-{n:06}"),
        sender: "bob".into(),
        recipient: "alice".into(),
        app_id: "bench".into(),
        priority: Priority::Medium,
        ttl: 10,
        hop_count: 0,
        timestamp: n,
        lamport_clock: n + 1,
        content_type: ContentType::Text,
        content: "hello alice, this is a message of ordinary length".into(),
        metadata: BTreeMap::new(),
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

fn inbound_engine(hook: bool) -> Engine {
    let mut config = Config::new("bench");
    config.durability_hook = hook.then(HookConfig::default);
    let mut engine = Engine::new(config, "alice".into());
    engine.handle(Input::CarrierUp(Carrier::Relay), 0);
    engine
}

/// Offers every ready batch to a hook that commits it; returns the messages committed.
fn run_hook(engine: &mut Engine, now: u64) -> usize {
    let mut committed = 0;
    while let Some(batch) = engine.poll_hook(now) {
        let result = Ok(());
        engine.handle(
            Input::HookResult {
                batch_id: batch.id,
                result,
            },
            now,
        );
        drain(engine);
        let received = std::iter::from_fn(|| engine.poll_event_after_transmits())
            .filter(|event| matches!(event, courier_engine::Event::MessageReceived { .. }));
        committed += black_box(received.count());
    }
    committed
}

/// What the runtime does per inbound frame: the engine call, its outputs, then the hook poll.
/// With `drain`, the frames are the relay's offline backlog (between `DrainStarted` and
/// `DrainComplete`); otherwise live traffic. Returns the messages committed (without a hook:
/// dispatched).
fn push_inbound(engine: &mut Engine, messages: Vec<Message>, drain_mode: bool) -> usize {
    let now = 1;
    if drain_mode {
        engine.handle(Input::DrainStarted(Carrier::Relay), now);
    }
    let mut committed = 0;
    for (seq, message) in (1..).zip(messages) {
        let origin = InboundOrigin {
            carrier: Carrier::Relay,
            stamped_sender: "bob".into(),
            sender_account: None,
            seq: Some(seq),
            sealed_by: None,
        };
        let message = Box::new(message);
        engine.handle(Input::Inbound { message, origin }, now);
        while engine.poll_store().is_some() {}
        while let Some(event) = engine.poll_event() {
            // Without a hook the engine dispatches `message_received` itself.
            committed += usize::from(matches!(
                event,
                courier_engine::Event::MessageReceived { .. }
            ));
        }
        while engine.poll_transmit().is_some() {}
        committed += run_hook(engine, now);
    }
    if drain_mode {
        let count = INBOUND;
        let carrier = Carrier::Relay;
        engine.handle(Input::DrainComplete { carrier, count }, now);
        drain(engine);
        committed += run_hook(engine, now);
    }
    assert_eq!(engine.inbound_buffered(), 0);
    committed
}

fn durability_hook(c: &mut Criterion) {
    let messages: Vec<Message> = (0..INBOUND).map(inbound_message).collect();
    let mut group = c.benchmark_group("durable_inbound_10k");
    group.sample_size(20);
    group.throughput(Throughput::Elements(INBOUND));
    let modes = [
        ("hook_drain_batches_of_400", true, true),
        ("hook_live_batches_of_one", true, false),
        ("no_hook_at_most_once", false, false),
    ];
    for (name, hook, drain_mode) in modes {
        group.bench_function(name, |b| {
            b.iter_batched(
                || (inbound_engine(hook), messages.clone()),
                |(mut engine, messages)| {
                    let committed = push_inbound(&mut engine, messages, drain_mode);
                    assert_eq!(committed as u64, INBOUND);
                    engine
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    send_written_ack,
    idle_wakeup,
    parked_backlog,
    durability_hook
);
criterion_main!(benches);
