//! Chat groups over real MLS: five devices, membership changes as the admin's commits, commits
//! and messages out of order, removal, restart and rollback, the hold's bounds, and large adds.

use courier_proto::Address;

use super::{device, Rows};
use crate::groups::MAX_PAST_EPOCHS;
use crate::{
    group_of, CommitOutcome, GroupCommit, GroupError, GroupJoined, GroupMessage, GroupOpened,
    GroupState, Released, Sessions, MAX_HELD, MAX_HELD_BYTES,
};

const G: &str = "friends";

/// Devices 1..=n, the first the admin of a group `G` it created.
fn devices(n: u8) -> Vec<Sessions> {
    let mut devices: Vec<_> = (1..=n).map(device).collect();
    devices[0].create_group(G).unwrap();
    devices
}

fn packages(d: &mut [Sessions], joiners: &[usize]) -> Vec<(Address, Vec<u8>)> {
    joiners
        .iter()
        .map(|&j| (d[j].address(), d[j].key_package(false).unwrap()))
        .collect()
}

/// The admin (device 0) adds `joiners`, who join by the Welcome; `members` apply the commit.
fn add(d: &mut [Sessions], joiners: &[usize], members: &[usize]) -> GroupCommit {
    let packages = packages(d, joiners);
    let commit = d[0].add_members(G, &packages).unwrap();
    let admin = d[0].address();
    for &m in members {
        let applied = d[m].apply_commit(&admin, &commit.commit).unwrap();
        assert!(
            matches!(&applied, CommitOutcome::Applied { state, released } if state.epoch == commit.epoch && released.is_empty()),
            "{applied:?}"
        );
    }
    let welcome = commit.welcome.as_deref().unwrap();
    for &j in joiners {
        let GroupJoined::Joined(state) = d[j].join_group(admin, welcome).unwrap() else {
            panic!("not joined");
        };
        assert_eq!(state, d[0].group_state(G).unwrap());
    }
    commit
}

/// Device `by` removes device `member`.
fn remove(d: &mut [Sessions], by: usize, member: usize) -> Result<GroupCommit, GroupError> {
    let member = d[member].address();
    d[by].remove_members(G, &[member])
}

fn seal(d: &mut [Sessions], from: usize, text: &str) -> Vec<u8> {
    d[from].seal_group(G, text.as_bytes()).unwrap()
}

fn open(
    d: &mut [Sessions],
    to: usize,
    from: usize,
    sealed: &[u8],
) -> Result<GroupOpened, GroupError> {
    let from = d[from].address();
    d[to].open_group(&from, sealed)
}

fn opened(d: &[Sessions], from: usize, text: &str) -> GroupOpened {
    GroupOpened::Opened(GroupMessage {
        group_id: G.into(),
        sender: d[from].address(),
        plaintext: text.as_bytes().to_vec(),
    })
}

fn released(outcome: CommitOutcome) -> Vec<(Address, Vec<u8>)> {
    let CommitOutcome::Applied { released, .. } = outcome else {
        panic!("not applied: {outcome:?}");
    };
    released
        .into_iter()
        .map(|r| match r {
            Released::Opened(m) => (m.sender, m.plaintext),
            Released::Refused { error, .. } => panic!("refused: {error}"),
        })
        .collect()
}

/// Every member seals once and every other member opens it.
fn everyone_talks(d: &mut [Sessions], members: &[usize]) {
    for &from in members {
        let text = format!("from {from}");
        let sealed = seal(d, from, &text);
        for &to in members.iter().filter(|&&to| to != from) {
            assert_eq!(open(d, to, from, &sealed).unwrap(), opened(d, from, &text));
        }
    }
}

#[test]
fn five_members_talk_and_a_late_member_reads_only_what_follows_its_join() {
    let mut d = devices(5);
    let first = add(&mut d, &[1, 2, 3], &[]);
    assert_eq!(first.epoch, 1);
    let before = seal(&mut d, 0, "before the fifth");
    for to in 1..=3 {
        assert_eq!(
            open(&mut d, to, 0, &before).unwrap(),
            opened(&d, 0, "before the fifth")
        );
    }
    add(&mut d, &[4], &[1, 2, 3]);
    assert!(matches!(
        open(&mut d, 4, 0, &before),
        Err(GroupError::PastEpoch { epoch: 1, .. })
    ));
    everyone_talks(&mut d, &[0, 1, 2, 3, 4]);

    let mut members: Vec<_> = d.iter().map(Sessions::address).collect();
    members.sort();
    let expected = GroupState {
        group_id: G.into(),
        epoch: 2,
        admin: d[0].address(),
        members,
    };
    for device in &d {
        assert_eq!(device.group_state(G), Some(expected.clone()));
        assert_eq!(
            device.groups().collect::<Vec<_>>(),
            std::slice::from_ref(&expected)
        );
    }
}

#[test]
fn a_removed_member_reads_nothing_sealed_after_its_removal() {
    let mut d = devices(5);
    let mut rows = Rows::default();
    add(&mut d, &[1, 2, 3, 4], &[]);
    // The same device as it was before the removal, restarted from its rows: it never learns
    // of the removal.
    rows.apply(d[4].commit());
    let mut unaware = rows.restart(5);

    let removal = remove(&mut d, 0, 4).unwrap();
    assert_eq!(removal.welcome, None);
    assert!(!removal.members.contains(&d[4].address()));
    let admin = d[0].address();
    for member in &mut d[1..=3] {
        let applied = member.apply_commit(&admin, &removal.commit).unwrap();
        assert!(
            matches!(applied, CommitOutcome::Applied { state, .. } if state.members == removal.members)
        );
    }
    assert!(matches!(
        d[4].apply_commit(&admin, &removal.commit).unwrap(),
        CommitOutcome::RemovedSelf { released, .. } if released.is_empty()
    ));
    assert_eq!(d[4].group_state(G), None);

    let from_admin = seal(&mut d, 0, "after");
    let from_member = seal(&mut d, 2, "after, too");
    for (from, sealed) in [(0, &from_admin), (2, &from_member)] {
        assert!(matches!(
            open(&mut d, 4, from, sealed),
            Err(GroupError::NotMember(_))
        ));
        let sender = d[from].address();
        assert_eq!(
            unaware.open_group(&sender, sealed).unwrap(),
            GroupOpened::Buffered,
            "held for an epoch it never reaches"
        );
    }
    assert!(matches!(
        unaware.apply_commit(&admin, &removal.commit).unwrap(),
        CommitOutcome::RemovedSelf { released, .. } if released.is_empty()
    ));
    assert!(matches!(
        unaware.open_group(&admin, &from_admin),
        Err(GroupError::NotMember(_))
    ));
    assert!(matches!(
        d[4].seal_group(G, b"still here?"),
        Err(GroupError::NotMember(_))
    ));
    assert!(matches!(
        d[4].apply_commit(&admin, &removal.commit).unwrap(),
        CommitOutcome::Stale
    ));
    // Nor does it take the group's id for one of its own.
    assert!(matches!(d[4].create_group(G), Err(GroupError::Exists(_))));
    everyone_talks(&mut d, &[0, 1, 2, 3]);
}

#[test]
fn a_group_id_is_an_identifier_and_used_once() {
    let mut d = devices(1);
    assert!(matches!(d[0].create_group(G), Err(GroupError::Exists(_))));
    for bad in ["", "a/b", "a:b"] {
        let refused = d[0].create_group(bad).unwrap_err();
        assert_eq!(refused.code(), "INVALID_GROUP_ID", "{bad:?}");
    }
    let sealed = seal(&mut d, 0, "x");
    assert_eq!(group_of(&sealed).unwrap(), (G.to_string(), 0));
    assert_eq!(
        group_of(b"not mls").unwrap_err().code(),
        crate::group_code::MALFORMED
    );
}

#[test]
fn commits_out_of_order_are_held_and_applied_in_order() {
    let mut d = devices(5);
    add(&mut d, &[1], &[]);
    add(&mut d, &[2], &[1]);
    assert_eq!(d[1].group_state(G).unwrap().epoch, 2);
    // Three commits of epochs 2, 3 and 4 that device 1 receives backwards.
    let packages = packages(&mut d, &[3, 4]);
    let commits = [
        d[0].add_members(G, &packages[..1]).unwrap(),
        d[0].add_members(G, &packages[1..]).unwrap(),
        remove(&mut d, 0, 2).unwrap(),
    ];
    let admin = d[0].address();
    for (commit, epoch) in commits.iter().zip(2..) {
        assert_eq!(group_of(&commit.commit).unwrap(), (G.to_string(), epoch));
    }
    for commit in commits[1..].iter().rev() {
        assert!(matches!(
            d[1].apply_commit(&admin, &commit.commit).unwrap(),
            CommitOutcome::Buffered
        ));
    }
    // A copy of a held commit is held once.
    assert!(matches!(
        d[1].apply_commit(&admin, &commits[2].commit).unwrap(),
        CommitOutcome::Buffered
    ));
    let applied = d[1].apply_commit(&admin, &commits[0].commit).unwrap();
    let CommitOutcome::Applied { state, released } = applied else {
        panic!("{applied:?}");
    };
    assert!(released.is_empty());
    assert_eq!(state, d[0].group_state(G).unwrap());
    assert_eq!(state.epoch, 5);
    assert!(matches!(
        d[1].apply_commit(&admin, &commits[1].commit).unwrap(),
        CommitOutcome::Stale
    ));
    let sealed = seal(&mut d, 0, "in epoch 5");
    assert_eq!(
        open(&mut d, 1, 0, &sealed).unwrap(),
        opened(&d, 0, "in epoch 5")
    );
}

#[test]
fn messages_of_a_later_epoch_wait_for_their_commit_and_an_earlier_one_still_opens() {
    let mut d = devices(4);
    add(&mut d, &[1, 2], &[]);
    let packages = packages(&mut d, &[3]);
    let commit = d[0].add_members(G, &packages).unwrap();
    let admin = d[0].address();
    // Device 1 seals before the commit reaches it; device 2 after applying it.
    let early = seal(&mut d, 1, "sealed in epoch 1");
    d[2].apply_commit(&admin, &commit.commit).unwrap();
    let from_admin = seal(&mut d, 0, "first in epoch 2");
    let from_two = seal(&mut d, 2, "second in epoch 2");
    assert_eq!(
        open(&mut d, 0, 1, &early).unwrap(),
        opened(&d, 1, "sealed in epoch 1"),
        "a member a commit has not reached yet is still read"
    );
    assert_eq!(
        open(&mut d, 1, 0, &from_admin).unwrap(),
        GroupOpened::Buffered
    );
    assert_eq!(
        open(&mut d, 1, 2, &from_two).unwrap(),
        GroupOpened::Buffered
    );
    let applied = d[1].apply_commit(&admin, &commit.commit).unwrap();
    assert_eq!(
        released(applied),
        [
            (d[0].address(), b"first in epoch 2".to_vec()),
            (d[2].address(), b"second in epoch 2".to_vec()),
        ]
    );
    assert!(matches!(
        open(&mut d, 1, 0, &from_admin),
        Err(GroupError::Spent { .. })
    ));
}

#[test]
fn a_held_message_is_opened_as_the_address_that_carried_it() {
    let mut d = devices(4);
    add(&mut d, &[1, 2], &[]);
    let packages = packages(&mut d, &[3]);
    let commit = d[0].add_members(G, &packages).unwrap();
    let sealed = seal(&mut d, 0, "from the admin");
    // Device 2 passes it on as its own.
    assert_eq!(open(&mut d, 1, 2, &sealed).unwrap(), GroupOpened::Buffered);
    let admin = d[0].address();
    let CommitOutcome::Applied { released, .. } =
        d[1].apply_commit(&admin, &commit.commit).unwrap()
    else {
        panic!("not applied");
    };
    assert!(matches!(
        released.as_slice(),
        [Released::Refused { from, error: GroupError::NotBound { .. } }] if *from == d[2].address()
    ));
}

#[test]
fn only_the_admins_commits_count() {
    let mut d = devices(3);
    add(&mut d, &[1, 2], &[]);
    let packages = packages(&mut d, &[0]);
    assert!(matches!(
        d[1].add_members(G, &packages),
        Err(GroupError::NotAdmin { .. })
    ));
    assert!(matches!(
        remove(&mut d, 1, 2),
        Err(GroupError::NotAdmin { .. })
    ));
    let forged = {
        let target = d[2].address();
        d[1].forge_removal(G, target)
    };
    let (member, admin) = (d[1].address(), d[0].address());
    assert!(matches!(
        d[2].apply_commit(&member, &forged),
        Err(GroupError::NotAdmin { .. })
    ));
    // Carried as if the admin sent it: the MLS sender gives it away.
    assert!(matches!(
        d[2].apply_commit(&admin, &forged),
        Err(GroupError::NotAdmin { .. })
    ));
    assert_eq!(d[2].group_state(G), d[0].group_state(G));
    everyone_talks(&mut d, &[0, 1, 2]);
    // Nor does the admin remove itself.
    assert!(matches!(
        d[0].remove_members(G, &[admin]),
        Err(GroupError::AdminStays)
    ));
}

#[test]
fn a_key_package_or_welcome_of_somebody_else_is_refused() {
    let mut d = devices(3);
    let mut mallory = device(9);
    let mallorys = mallory.key_package(false).unwrap();
    let claimed = d[1].address();
    assert!(matches!(
        d[0].add_members(G, &[(claimed, mallorys)]),
        Err(GroupError::NotBound {
            what: "key package",
            ..
        })
    ));
    assert_eq!(d[0].group_state(G).unwrap().epoch, 0);

    // Mallory makes a group of the same name and its Welcome is said to come from the admin.
    mallory.create_group(G).unwrap();
    let package = d[1].key_package(false).unwrap();
    let welcome = mallory
        .add_members(G, &[(claimed, package)])
        .unwrap()
        .welcome
        .unwrap();
    let admin = d[0].address();
    assert!(matches!(
        d[1].join_group(admin, &welcome),
        Err(GroupError::NotAdmin { .. })
    ));
    assert_eq!(d[1].group_state(G), None);
    // Nor is a group's Welcome a session's.
    let package = packages(&mut d, &[2]);
    let welcome = d[0].add_members(G, &package).unwrap().welcome.unwrap();
    assert!(matches!(
        d[2].join(admin, &welcome),
        Err(crate::SessionError::NotBound { .. })
    ));
}

#[test]
fn a_repeated_welcome_changes_nothing() {
    for last_resort in [false, true] {
        let mut d = devices(2);
        let package = (d[1].address(), d[1].key_package(last_resort).unwrap());
        let commit = d[0].add_members(G, &[package]).unwrap();
        let welcome = commit.welcome.unwrap();
        let admin = d[0].address();
        assert!(matches!(
            d[1].join_group(admin, &welcome).unwrap(),
            GroupJoined::Joined(_)
        ));
        let sealed = seal(&mut d, 0, "first");
        open(&mut d, 1, 0, &sealed).unwrap();
        assert_eq!(
            d[1].join_group(admin, &welcome).unwrap(),
            GroupJoined::Already
        );
        assert!(
            matches!(open(&mut d, 1, 0, &sealed), Err(GroupError::Spent { .. })),
            "the ratchet stayed"
        );
        // Also once the device left, as long as the Welcome is the one it joined by.
        d[1].leave_group(G).unwrap();
        assert_eq!(
            d[1].join_group(admin, &welcome).unwrap(),
            GroupJoined::Already
        );
        assert_eq!(d[1].group_state(G), None);
        let later = seal(&mut d, 0, "after it left");
        assert!(matches!(
            open(&mut d, 1, 0, &later),
            Err(GroupError::NotMember(_))
        ));
    }
}

#[test]
fn a_restart_from_the_committed_rows_keeps_groups_and_what_they_hold() {
    let mut d = devices(3);
    let mut rows = [Rows::default(), Rows::default(), Rows::default()];
    add(&mut d, &[1, 2], &[]);
    for (device, rows) in d.iter_mut().zip(&mut rows) {
        rows.apply(device.commit());
    }
    let removal = remove(&mut d, 0, 2).unwrap();
    let sealed = seal(&mut d, 0, "held across a restart");
    assert_eq!(open(&mut d, 1, 0, &sealed).unwrap(), GroupOpened::Buffered);
    for (device, rows) in d.iter_mut().zip(&mut rows) {
        rows.apply(device.commit());
    }

    let before: Vec<_> = d.iter().map(|s| s.group_state(G)).collect();
    let mut d: Vec<_> = (0..3).map(|i| rows[i].restart(i as u8 + 1)).collect();
    assert_eq!(
        d.iter().map(|s| s.group_state(G)).collect::<Vec<_>>(),
        before
    );
    let admin = d[0].address();
    assert_eq!(
        released(d[1].apply_commit(&admin, &removal.commit).unwrap()),
        [(admin, b"held across a restart".to_vec())]
    );
    everyone_talks(&mut d, &[0, 1]);
}

#[test]
fn a_rolled_back_add_leaves_the_group_as_it_was() {
    let mut d = devices(2);
    d[0].commit();
    let before = d[0].group_state(G);
    let packages = packages(&mut d, &[1]);
    d[0].add_members(G, &packages).unwrap();
    d[0].rollback().unwrap();
    assert_eq!(d[0].group_state(G), before);
    // The same key package joins by the add made again.
    let commit = d[0].add_members(G, &packages).unwrap();
    assert_eq!(commit.epoch, 1);
    let admin = d[0].address();
    assert!(matches!(
        d[1].join_group(admin, commit.welcome.as_deref().unwrap())
            .unwrap(),
        GroupJoined::Joined(_)
    ));
    everyone_talks(&mut d, &[0, 1]);
    // A group created in a step that is not kept is gone with it.
    d[0].commit();
    d[0].create_group("other").unwrap();
    d[0].rollback().unwrap();
    assert_eq!(d[0].group_state("other"), None);
    assert_eq!(d[0].groups().count(), 1);
}

#[test]
fn a_receiving_step_rolled_back_can_be_done_again() {
    let mut d = devices(3);
    add(&mut d, &[1, 2], &[]);
    let admin = d[0].address();
    let opened_once = seal(&mut d, 0, "opened, then not kept");
    let removal = remove(&mut d, 0, 2).unwrap();
    let held = seal(&mut d, 0, "held, then not kept");
    d[1].commit();
    let before = d[1].group_state(G);

    assert_eq!(
        open(&mut d, 1, 0, &opened_once).unwrap(),
        opened(&d, 0, "opened, then not kept")
    );
    assert_eq!(open(&mut d, 1, 0, &held).unwrap(), GroupOpened::Buffered);
    d[1].rollback().unwrap();
    assert_eq!(d[1].group_state(G), before);
    // The held message is gone with the step: the commit releases nothing.
    assert!(released(d[1].apply_commit(&admin, &removal.commit).unwrap()).is_empty());
    d[1].rollback().unwrap();
    assert_eq!(d[1].group_state(G), before);

    // Done again, all of it: the ratchet and the hold were put back.
    assert_eq!(
        open(&mut d, 1, 0, &opened_once).unwrap(),
        opened(&d, 0, "opened, then not kept")
    );
    assert_eq!(open(&mut d, 1, 0, &held).unwrap(), GroupOpened::Buffered);
    assert_eq!(
        released(d[1].apply_commit(&admin, &removal.commit).unwrap()),
        [(admin, b"held, then not kept".to_vec())]
    );
}

#[test]
fn the_hold_is_bounded_in_count() {
    let mut d = devices(3);
    add(&mut d, &[1, 2], &[]);
    let removal = remove(&mut d, 0, 2).unwrap();
    let messages: Vec<_> = (0..=MAX_HELD)
        .map(|n| seal(&mut d, 0, &n.to_string()))
        .collect();
    for message in &messages[..MAX_HELD] {
        assert_eq!(open(&mut d, 1, 0, message).unwrap(), GroupOpened::Buffered);
    }
    assert_eq!(
        open(&mut d, 1, 0, &messages[0]).unwrap(),
        GroupOpened::Buffered,
        "a copy is held once"
    );
    let full = open(&mut d, 1, 0, &messages[MAX_HELD]);
    assert!(matches!(&full, Err(GroupError::HoldFull(_))), "{full:?}");
    assert_eq!(full.unwrap_err().code(), "HOLD_FULL");
    // Nor is a commit held past the bound.
    let admin = d[0].address();
    let later = remove(&mut d, 0, 1).unwrap();
    assert!(matches!(
        d[1].apply_commit(&admin, &later.commit),
        Err(GroupError::HoldFull(_))
    ));
    let released = released(d[1].apply_commit(&admin, &removal.commit).unwrap());
    let expected: Vec<_> = (0..MAX_HELD)
        .map(|n| (admin, n.to_string().into_bytes()))
        .collect();
    assert_eq!(released, expected);
    assert_eq!(
        open(&mut d, 1, 0, &messages[MAX_HELD]).unwrap(),
        opened(&d, 0, &MAX_HELD.to_string())
    );
}

#[test]
fn the_hold_is_bounded_in_bytes() {
    let mut d = devices(3);
    add(&mut d, &[1, 2], &[]);
    let removal = remove(&mut d, 0, 2).unwrap();
    let big = "x".repeat(MAX_HELD_BYTES / 4);
    let messages: Vec<_> = (0..4).map(|_| seal(&mut d, 0, &big)).collect();
    for message in &messages[..3] {
        assert_eq!(open(&mut d, 1, 0, message).unwrap(), GroupOpened::Buffered);
    }
    assert!(matches!(
        open(&mut d, 1, 0, &messages[3]),
        Err(GroupError::HoldFull(_))
    ));
    let admin = d[0].address();
    assert_eq!(
        released(d[1].apply_commit(&admin, &removal.commit).unwrap()).len(),
        3
    );
}

#[test]
fn a_replayed_or_forged_message_is_refused_and_changes_nothing() {
    let mut d = devices(2);
    add(&mut d, &[1], &[]);
    d[1].commit();
    let sealed = seal(&mut d, 0, "once");
    assert_eq!(open(&mut d, 1, 0, &sealed).unwrap(), opened(&d, 0, "once"));
    assert!(matches!(
        open(&mut d, 1, 0, &sealed),
        Err(GroupError::Spent { .. })
    ));
    let mut forged = seal(&mut d, 0, "next");
    let last = forged.len() - 1;
    forged[last] ^= 1;
    let refused = open(&mut d, 1, 0, &forged);
    assert!(
        refused.is_err() && !matches!(refused, Err(GroupError::Spent { .. })),
        "{refused:?}"
    );
    assert!(
        d[1].commit().iter().all(|c| c.value.is_some()),
        "nothing deleted"
    );
    let next = seal(&mut d, 0, "after");
    assert_eq!(open(&mut d, 1, 0, &next).unwrap(), opened(&d, 0, "after"));
}

#[test]
fn a_message_from_further_back_than_the_kept_epochs_is_past() {
    let mut d = devices(3);
    add(&mut d, &[1], &[]);
    let too_early = seal(&mut d, 1, "sealed in epoch 1");
    remove_and_add_again(&mut d, 1);
    let early = seal(&mut d, 1, "sealed in epoch 2");
    remove_and_add_again(&mut d, MAX_PAST_EPOCHS);
    assert_eq!(
        open(&mut d, 0, 1, &early).unwrap(),
        opened(&d, 1, "sealed in epoch 2")
    );
    let past = open(&mut d, 0, 1, &too_early);
    assert!(
        matches!(past, Err(GroupError::PastEpoch { epoch: 1, .. })),
        "{past:?}"
    );
}

/// The admin adds and removes device 2 until the group has passed `epochs` more epochs;
/// device 1 applies each commit.
fn remove_and_add_again(d: &mut [Sessions], epochs: u64) {
    let admin = d[0].address();
    let target = d[0].group_state(G).unwrap().epoch + epochs;
    while d[0].group_state(G).unwrap().epoch < target {
        let commit = if d[0]
            .group_state(G)
            .unwrap()
            .members
            .contains(&d[2].address())
        {
            remove(d, 0, 2).unwrap()
        } else {
            let packages = packages(d, &[2]);
            d[0].add_members(G, &packages).unwrap()
        };
        d[1].apply_commit(&admin, &commit.commit).unwrap();
    }
}

/// `n` devices join at once; the first and the last of them talk with the admin.
fn a_large_add(n: u32) {
    let mut admin = device(1);
    admin.create_group(G).unwrap();
    let mut joiners: Vec<_> = (0..n)
        .map(|i| {
            let mut seed = [7; 32];
            seed[..4].copy_from_slice(&i.to_be_bytes());
            Sessions::restore(courier_proto::IdentityKey::from_seed(seed), []).unwrap()
        })
        .collect();
    let packages: Vec<_> = joiners
        .iter_mut()
        .map(|j| (j.address(), j.key_package(false).unwrap()))
        .collect();
    let commit = admin.add_members(G, &packages).unwrap();
    assert_eq!(commit.members.len(), n as usize + 1);
    let welcome = commit.welcome.unwrap();
    // The Welcome, in base64, fits a frame.
    assert!(welcome.len().div_ceil(3) * 4 < courier_proto::limits::MAX_FRAME_BYTES);
    let sealed = admin.seal_group(G, b"to everyone").unwrap();
    let last = joiners.len() - 1;
    for j in [0, last] {
        let joiner = &mut joiners[j];
        assert!(matches!(
            joiner.join_group(admin.address(), &welcome).unwrap(),
            GroupJoined::Joined(state) if state.members == commit.members
        ));
        assert!(matches!(
            joiner.open_group(&admin.address(), &sealed).unwrap(),
            GroupOpened::Opened(m) if m.plaintext == b"to everyone"
        ));
        let reply = joiner.seal_group(G, b"back").unwrap();
        assert!(matches!(
            admin.open_group(&joiner.address(), &reply).unwrap(),
            GroupOpened::Opened(m) if m.sender == joiner.address()
        ));
    }
}

#[test]
fn two_hundred_members_join_in_one_commit() {
    a_large_add(200);
}

/// About 40 s in a debug build, nearly all of it Ed25519 in unoptimized `curve25519-dalek`:
/// the admin verifies each key package (two signatures), each joiner every leaf of the tree.
/// Run with `--ignored`.
#[test]
#[ignore]
fn five_hundred_members_join_in_one_commit() {
    a_large_add(500);
}
