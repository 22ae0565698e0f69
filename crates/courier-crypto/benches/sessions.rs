//! What a sealed direct message costs in CPU: seal, and open, each with taking the step's
//! changes of the session state (what the runtime writes in the step's transaction).
//! `cargo bench -p courier-crypto`; figures in BENCHMARKS.md.

use std::time::{Duration, Instant};

use courier_crypto::{Joined, Sessions};
use courier_proto::IdentityKey;
use criterion::{criterion_group, criterion_main, Criterion};

/// A 200-byte chat message, as its Message JSON would be about that size.
const PLAINTEXT: [u8; 200] = [b'x'; 200];

fn pair() -> (Sessions, Sessions) {
    let mut alice = Sessions::restore(IdentityKey::from_seed([1; 32]), []).unwrap();
    let mut bob = Sessions::restore(IdentityKey::from_seed([2; 32]), []).unwrap();
    let package = bob.key_package(false).unwrap();
    let welcome = alice.start(bob.address(), &package).unwrap();
    assert_eq!(bob.join(alice.address(), &welcome).unwrap(), Joined::Joined);
    alice.commit();
    bob.commit();
    (alice, bob)
}

fn sessions(c: &mut Criterion) {
    let (mut alice, bob) = pair();
    let bob_address = bob.address();
    let alice_address = alice.address();
    c.bench_function("seal 200 B + take the step's changes", |b| {
        b.iter(|| {
            let sealed = alice.seal(&bob_address, &PLAINTEXT).unwrap();
            std::hint::black_box((sealed, alice.commit()));
        })
    });
    // A fresh pair: the sealing above ran Alice's ratchet far ahead of anything Bob opened.
    let (mut alice, mut bob) = pair();
    c.bench_function("open 200 B + take the step's changes", |b| {
        b.iter_custom(|iters| {
            let sealed: Vec<Vec<u8>> = (0..iters)
                .map(|_| alice.seal(&bob_address, &PLAINTEXT).unwrap())
                .collect();
            alice.commit();
            let start = Instant::now();
            for message in &sealed {
                let opened = bob.open(&alice_address, message).unwrap();
                std::hint::black_box((opened, bob.commit()));
            }
            start.elapsed()
        })
    });
}

/// The floor under `open`: the one Ed25519 verification MLS requires per message (the sender's
/// signature over the message content), alone.
fn signature_floor(c: &mut Criterion) {
    let key = IdentityKey::from_seed([3; 32]);
    let public = key.public_key();
    let signature = key.sign(&PLAINTEXT);
    c.bench_function("Ed25519 verify of 200 B (the floor under open)", |b| {
        b.iter(|| {
            std::hint::black_box(courier_proto::verify_strict(
                &public, &PLAINTEXT, &signature,
            ))
        })
    });
    c.bench_function("Ed25519 sign of 200 B (the floor under seal)", |b| {
        b.iter(|| std::hint::black_box(key.sign(&PLAINTEXT)))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(5));
    targets = sessions, signature_floor
}
criterion_main!(benches);
