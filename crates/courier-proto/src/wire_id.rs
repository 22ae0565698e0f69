//! Ids on the wire (`docs/protocol.md#message-ids`). Every id a client puts on the wire is a
//! lowercase hyphenated UUID: clients written to the published contract parse `id` as a UUID
//! and drop anything else. Both mappings are name-based (v5), so they are deterministic: a
//! re-sent message keeps its wire id and a re-ACK repeats the first ACK's id, which is what lets
//! the relay and the recipient deduplicate them, and no id state has to survive a restart.

use uuid::Uuid;

/// Namespace of the wire ids of app-chosen message ids.
const APP_IDS: Uuid = Uuid::from_u128(0xdfc4dbce_7ed4_4e89_8199_17bfa2d83651);
/// Namespace of the ids of delivery ACKs.
const ACK_IDS: Uuid = Uuid::from_u128(0xd9e2537b_669c_4505_a362_b5e6894eb24d);
/// Namespace of the ids of a group message's per-member copies.
const GROUP_COPY_IDS: Uuid = Uuid::from_u128(0x5b0e8f3a_2c6d_4a71_9e43_0f6d2b8c7a15);

/// Whether `id` is already a wire id: a UUID in its lowercase hyphenated spelling.
pub fn is_wire_id(id: &str) -> bool {
    Uuid::try_parse(id).is_ok_and(|uuid| uuid.hyphenated().to_string() == id)
}

/// The wire id of a message the app named `id`: the id itself when it is already a wire id (an
/// engine-minted v4 UUID, or an app's own UUID), else the name-based UUID of it.
pub fn wire_id(id: &str) -> String {
    if is_wire_id(id) {
        id.to_owned()
    } else {
        Uuid::new_v5(&APP_IDS, id.as_bytes()).to_string()
    }
}

/// The id of the delivery ACK for message `message_id` from `sender`. The sender is part of
/// the name: two senders' messages may share an id, and their ACKs must not.
pub fn ack_id(sender: &str, message_id: &str) -> String {
    let mut name = Vec::with_capacity(sender.len() + 1 + message_id.len());
    name.extend_from_slice(sender.as_bytes());
    // Not an identifier character, so no two (sender, id) pairs share a name.
    name.push(b'\n');
    name.extend_from_slice(message_id.as_bytes());
    Uuid::new_v5(&ACK_IDS, &name).to_string()
}

/// The id of the per-member copy of group message `message_id` for `member`
/// (`docs/delivery.md#group-sends`): the same on every send of that copy, after any restart, so
/// the member's ACK and the relay's dedup can name it.
pub fn group_copy_id(message_id: &str, member: &str) -> String {
    let mut name = Vec::with_capacity(message_id.len() + 1 + member.len());
    name.extend_from_slice(message_id.as_bytes());
    name.push(b'\n');
    name.extend_from_slice(member.as_bytes());
    Uuid::new_v5(&GROUP_COPY_IDS, &name).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wire_id_maps_to_itself() {
        let minted = Uuid::new_v4().to_string();
        assert!(is_wire_id(&minted));
        assert_eq!(wire_id(&minted), minted);
    }

    #[test]
    fn any_other_id_maps_to_one_uuid_deterministically() {
        for id in [
            "order-42",
            "ORDER-42",
            "x",
            "DFC4DBCE-7ED4-4E89-8199-17BFA2D83651",
        ] {
            let wire = wire_id(id);
            assert!(is_wire_id(&wire), "{wire}");
            assert_ne!(wire, id);
            assert_eq!(wire_id(id), wire, "deterministic");
        }
        assert_ne!(wire_id("order-42"), wire_id("order-43"));
        assert_ne!(
            wire_id("DFC4DBCE-7ED4-4E89-8199-17BFA2D83651"),
            wire_id("dfc4dbce-7ed4-4e89-8199-17bfa2d83651"),
            "an uppercase UUID is an app's own spelling, not a wire id"
        );
    }

    /// Pinned: the mapping is part of the wire contract (a re-send after an upgrade must keep
    /// its wire id), and `scripts/crash/wire-id.mjs` reproduces it.
    #[test]
    fn the_mapping_is_pinned() {
        assert_eq!(wire_id("order-42"), "22c5b759-271b-5cf4-a8db-c1e22b197272");
        assert_eq!(wire_id("é"), "0b8c5265-a15d-52da-8f6e-52c1ae58c491");
    }

    #[test]
    fn ack_ids_are_uuids_per_sender_and_message() {
        let a = ack_id("alice", "m1");
        assert!(is_wire_id(&a));
        assert_eq!(ack_id("alice", "m1"), a, "a re-ACK repeats the id");
        assert_ne!(ack_id("bob", "m1"), a);
        assert_ne!(ack_id("alice", "m2"), a);
    }

    /// The whole id is hashed into the ACK id: no prefix of it stands for it, so a sender cannot
    /// pick a second id whose ACK settles the first.
    #[test]
    fn two_long_ids_sharing_a_prefix_get_distinct_ack_ids() {
        let prefix = "m".repeat(300);
        let first = ack_id("alice", &format!("{prefix}1"));
        let second = ack_id("alice", &format!("{prefix}2"));
        assert_ne!(first, second);
        assert!(is_wire_id(&first) && is_wire_id(&second));
    }

    #[test]
    fn group_copy_ids_are_uuids_per_message_and_member() {
        let a = group_copy_id("m1", "alice");
        assert!(is_wire_id(&a));
        assert_eq!(group_copy_id("m1", "alice"), a);
        assert_ne!(group_copy_id("m1", "bob"), a);
        assert_ne!(group_copy_id("m2", "alice"), a);
        assert_ne!(group_copy_id("m1", "alice"), ack_id("m1", "alice"));
    }
}
