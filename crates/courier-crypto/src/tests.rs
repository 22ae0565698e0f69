//! Two devices, real MLS: sessions bound to addresses, ratchets that survive a restart from the
//! committed rows, a rolled-back step that can be replayed, and the tie when both start at once.

use courier_proto::IdentityKey;

use crate::{Change, Joined, SessionError, Sessions};

mod groups;

fn device(seed: u8) -> Sessions {
    Sessions::restore(IdentityKey::from_seed([seed; 32]), []).unwrap()
}

/// The committed rows of a device, as the runtime would have written them.
#[derive(Default)]
struct Rows(std::collections::BTreeMap<Vec<u8>, Vec<u8>>);

impl Rows {
    fn apply(&mut self, changes: Vec<Change>) {
        for Change { key, value } in changes {
            match value {
                Some(value) => self.0.insert(key, value),
                None => self.0.remove(&key),
            };
        }
    }

    fn restart(&self, seed: u8) -> Sessions {
        Sessions::restore(IdentityKey::from_seed([seed; 32]), self.0.clone()).unwrap()
    }
}

/// `a` starts a session with `b` from one of `b`'s key packages; `b` joins.
fn connect(a: &mut Sessions, b: &mut Sessions) {
    let package = b.key_package(false).unwrap();
    let welcome = a.start(b.address(), &package).unwrap();
    assert_eq!(b.join(a.address(), &welcome).unwrap(), Joined::Joined);
}

#[test]
fn both_ways_in_one_session_each_message_opened_once() {
    let (mut alice, mut bob) = (device(1), device(2));
    connect(&mut alice, &mut bob);
    for n in 0..20 {
        let sealed = alice
            .seal(&bob.address(), format!("a{n}").as_bytes())
            .unwrap();
        assert_eq!(
            bob.open(&alice.address(), &sealed).unwrap(),
            format!("a{n}").as_bytes()
        );
        let sealed = bob
            .seal(&alice.address(), format!("b{n}").as_bytes())
            .unwrap();
        assert_eq!(
            alice.open(&bob.address(), &sealed).unwrap(),
            format!("b{n}").as_bytes()
        );
    }
    let sealed = alice.seal(&bob.address(), b"once").unwrap();
    bob.open(&alice.address(), &sealed).unwrap();
    assert!(
        bob.open(&alice.address(), &sealed).is_err(),
        "a message opens once: its key is gone"
    );
}

#[test]
fn the_ciphertext_holds_no_plaintext() {
    let (mut alice, mut bob) = (device(1), device(2));
    connect(&mut alice, &mut bob);
    let plaintext = b"meet me at the old bridge at nine";
    let sealed = alice.seal(&bob.address(), plaintext).unwrap();
    assert!(!sealed
        .windows(8)
        .any(|w| plaintext.windows(8).any(|p| p == w)));
}

#[test]
fn a_restart_from_the_committed_rows_continues_the_session() {
    let (mut alice, mut bob) = (device(1), device(2));
    let (mut alice_rows, mut bob_rows) = (Rows::default(), Rows::default());
    connect(&mut alice, &mut bob);
    alice_rows.apply(alice.commit());
    bob_rows.apply(bob.commit());
    let sealed = alice.seal(&bob.address(), b"before").unwrap();
    alice_rows.apply(alice.commit());
    bob.open(&alice.address(), &sealed).unwrap();
    bob_rows.apply(bob.commit());

    let (mut alice, mut bob) = (alice_rows.restart(1), bob_rows.restart(2));
    assert!(alice.has_session(&bob.address()) && bob.has_session(&alice.address()));
    assert_eq!(alice.peers().copied().collect::<Vec<_>>(), [bob.address()]);
    let sealed = alice.seal(&bob.address(), b"after").unwrap();
    assert_eq!(bob.open(&alice.address(), &sealed).unwrap(), b"after");
    let sealed = bob.seal(&alice.address(), b"back").unwrap();
    assert_eq!(alice.open(&bob.address(), &sealed).unwrap(), b"back");
}

#[test]
fn an_open_that_is_not_committed_can_be_done_again() {
    let (mut alice, mut bob) = (device(1), device(2));
    connect(&mut alice, &mut bob);
    bob.commit();
    let sealed = alice.seal(&bob.address(), b"kept?").unwrap();
    bob.open(&alice.address(), &sealed).unwrap();
    // The step that opened it is not kept (a crash before its commit, or a refusal).
    bob.rollback().unwrap();
    assert_eq!(bob.open(&alice.address(), &sealed).unwrap(), b"kept?");
}

#[test]
fn a_crash_before_the_commit_loses_no_message() {
    let (mut alice, mut bob) = (device(1), device(2));
    let mut bob_rows = Rows::default();
    connect(&mut alice, &mut bob);
    bob_rows.apply(bob.commit());
    let sealed = alice.seal(&bob.address(), b"in flight").unwrap();
    bob.open(&alice.address(), &sealed).unwrap();
    // Killed before the step's transaction: the rows are as they were.
    let mut bob = bob_rows.restart(2);
    assert_eq!(bob.open(&alice.address(), &sealed).unwrap(), b"in flight");
}

#[test]
fn when_both_start_at_once_both_end_in_the_lower_addresss_session() {
    let (mut alice, mut bob) = (device(1), device(2));
    let (alice_package, bob_package) = (
        alice.key_package(false).unwrap(),
        bob.key_package(false).unwrap(),
    );
    let from_alice = alice.start(bob.address(), &bob_package).unwrap();
    let from_bob = bob.start(alice.address(), &alice_package).unwrap();
    let alice_joins = alice.join(bob.address(), &from_bob).unwrap();
    let bob_joins = bob.join(alice.address(), &from_alice).unwrap();
    let lower_is_alice = alice.address() < bob.address();
    assert_eq!(
        (alice_joins, bob_joins),
        if lower_is_alice {
            (Joined::KeptOurs, Joined::Joined)
        } else {
            (Joined::Joined, Joined::KeptOurs)
        }
    );
    let sealed = alice.seal(&bob.address(), b"one session").unwrap();
    assert_eq!(bob.open(&alice.address(), &sealed).unwrap(), b"one session");
    let sealed = bob.seal(&alice.address(), b"both ways").unwrap();
    assert_eq!(alice.open(&bob.address(), &sealed).unwrap(), b"both ways");
}

#[test]
fn a_stale_welcome_of_the_tie_loser_never_replaces_the_winners_session_in_use() {
    let (mut low, mut high) = {
        let (a, b) = (device(1), device(2));
        if a.address() < b.address() {
            (a, b)
        } else {
            (b, a)
        }
    };
    // Both start at once; the higher address joins the lower's session and uses it.
    let (low_package, high_package) = (
        low.key_package(false).unwrap(),
        high.key_package(false).unwrap(),
    );
    let from_low = low.start(high.address(), &high_package).unwrap();
    let from_high = high.start(low.address(), &low_package).unwrap();
    assert_eq!(high.join(low.address(), &from_low).unwrap(), Joined::Joined);
    let used = high
        .seal(&low.address(), b"in the winner's session")
        .unwrap();
    assert_eq!(
        low.open(&high.address(), &used).unwrap(),
        b"in the winner's session"
    );
    // The loser's Welcome, sent before it gave its session up, arrives late.
    assert_eq!(
        low.join(high.address(), &from_high).unwrap(),
        Joined::KeptOurs
    );
    let sealed = low.seal(&high.address(), b"still one session").unwrap();
    assert_eq!(
        high.open(&low.address(), &sealed).unwrap(),
        b"still one session"
    );
}

#[test]
fn a_key_package_or_welcome_of_somebody_else_is_refused() {
    let (mut alice, mut bob, mut mallory) = (device(1), device(2), device(3));
    let mallorys = mallory.key_package(false).unwrap();
    assert!(matches!(
        alice.start(bob.address(), &mallorys),
        Err(SessionError::NotBound { .. })
    ));
    // Mallory starts a session with Bob, and Bob is told it came from Alice.
    let package = bob.key_package(false).unwrap();
    let welcome = mallory.start(bob.address(), &package).unwrap();
    assert!(matches!(
        bob.join(alice.address(), &welcome),
        Err(SessionError::NotBound { .. })
    ));
    bob.rollback().unwrap();
    assert!(!bob.has_session(&alice.address()));
}

#[test]
fn a_message_is_only_opened_as_its_mls_sender() {
    let (mut alice, mut bob, mut carol) = (device(1), device(2), device(3));
    connect(&mut alice, &mut bob);
    connect(&mut carol, &mut bob);
    let from_carol = carol.seal(&bob.address(), b"from carol").unwrap();
    assert!(
        bob.open(&alice.address(), &from_carol).is_err(),
        "a message of Carol's session is not Alice's"
    );
}

#[test]
fn a_message_not_kept_leaves_no_trace_and_the_steps_others_stay() {
    let (mut alice, mut bob) = (device(1), device(2));
    let mut bob_rows = Rows::default();
    connect(&mut alice, &mut bob);
    bob_rows.apply(bob.commit());
    let first = alice.seal(&bob.address(), b"first").unwrap();
    let second = alice.seal(&bob.address(), b"second").unwrap();
    // One step: the first is kept, the second is refused by whoever took the plaintext.
    assert!(bob
        .open_if(&alice.address(), &first, |p| p == b"first")
        .unwrap());
    assert!(!bob.open_if(&alice.address(), &second, |_| false).unwrap());
    bob_rows.apply(bob.commit());
    // After a restart from what the step committed: the second opens, the first never again.
    let mut bob = bob_rows.restart(2);
    assert_eq!(bob.open(&alice.address(), &second).unwrap(), b"second");
    assert!(bob.open(&alice.address(), &first).is_err());
}

#[test]
fn a_copy_that_fails_to_open_changes_nothing() {
    let (mut alice, mut bob) = (device(1), device(2));
    connect(&mut alice, &mut bob);
    bob.commit();
    let sealed = alice.seal(&bob.address(), b"once").unwrap();
    assert_eq!(bob.open(&alice.address(), &sealed).unwrap(), b"once");
    let mut tampered = alice.seal(&bob.address(), b"next").unwrap();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    assert!(
        matches!(
            bob.open(&alice.address(), &sealed),
            Err(SessionError::Spent(_))
        ),
        "a replay is told apart"
    );
    let forged = bob.open(&alice.address(), &tampered);
    assert!(
        forged.is_err() && !matches!(forged, Err(SessionError::Spent(_))),
        "a forgery is refused, and not taken for a replay"
    );
    assert!(
        bob.commit().iter().all(|c| c.value.is_some()),
        "nothing deleted"
    );
    let next = alice.seal(&bob.address(), b"after").unwrap();
    assert_eq!(bob.open(&alice.address(), &next).unwrap(), b"after");
}

#[test]
fn the_welcome_goes_ahead_until_the_peer_used_the_session_and_a_repeat_changes_nothing() {
    let (mut alice, mut bob) = (device(1), device(2));
    for last_resort in [false, true] {
        let package = bob.key_package(last_resort).unwrap();
        let welcome = alice.start(bob.address(), &package).unwrap();
        assert_eq!(alice.welcome_for(&bob.address()), Some(&welcome[..]));
        assert_eq!(bob.join(alice.address(), &welcome).unwrap(), Joined::Joined);
        let first = alice.seal(&bob.address(), b"first").unwrap();
        assert_eq!(bob.open(&alice.address(), &first).unwrap(), b"first");
        // The same Welcome again, ahead of a retry: the session and its ratchet stay.
        assert_eq!(
            bob.join(alice.address(), &welcome).unwrap(),
            Joined::Already
        );
        assert!(bob.open(&alice.address(), &first).is_err(), "still spent");
        let reply = bob.seal(&alice.address(), b"reply").unwrap();
        assert_eq!(alice.open(&bob.address(), &reply).unwrap(), b"reply");
        assert_eq!(alice.welcome_for(&bob.address()), None);
    }
}
