//! Received messages, kept so that `forwardMessage` can send one on
//! (`docs/delivery.md#received-messages`): each written in the commit that processed it, found
//! by the `messageId` the application saw, and bounded by count and bytes, oldest dropped first.

use courier_engine::io::Millis;
use courier_proto::Message;
use rusqlite::{params, Connection, OptionalExtension};

use super::{to_db, StoreError};

/// A message as this device received it: its chat and sender (its dedup key with its id) and
/// the message itself.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedMessage {
    pub chat: String,
    pub sender: String,
    pub message: Message,
}

/// A message processed in a step, to keep in that step's commit.
#[derive(Debug, Clone, Copy)]
pub struct Received<'a> {
    pub chat: &'a str,
    pub sender: &'a str,
    pub message: &'a Message,
}

/// Keeps `received`, received at `at`; a message already kept stays as it was first kept.
pub(crate) fn keep(
    conn: &Connection,
    received: &Received<'_>,
    at: Millis,
) -> Result<(), StoreError> {
    let json = received.message.encode();
    conn.prepare_cached(
        "INSERT INTO received_messages (chat, sender, message_id, received_at, bytes, message_json)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (chat, sender, message_id) DO NOTHING",
    )?
    .execute(params![
        received.chat,
        received.sender,
        received.message.id,
        to_db(at),
        to_db(json.len() as u64),
        json,
    ])?;
    Ok(())
}

/// The message received as `message_id`; of two senders' messages with one id, the later.
pub(crate) fn find(
    conn: &Connection,
    message_id: &str,
) -> Result<Option<ReceivedMessage>, StoreError> {
    let row = conn
        .prepare_cached(
            "SELECT chat, sender, message_json FROM received_messages WHERE message_id = ?1
             ORDER BY received_at DESC, rowid DESC LIMIT 1",
        )?
        .query_row([message_id], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get::<_, String>(2)?))
        })
        .optional()?;
    let Some((chat, sender, json)) = row else {
        return Ok(None);
    };
    let message = Message::decode(&json).map_err(|e| {
        StoreError::Corrupt(format!(
            "received message {message_id} does not decode: {e}"
        ))
    })?;
    Ok(Some(ReceivedMessage {
        chat,
        sender,
        message,
    }))
}

/// Deletes the oldest rows beyond `max_messages`, then the oldest until the rest hold at most
/// `max_bytes`; returns how many were deleted.
pub(crate) fn prune(
    conn: &Connection,
    max_messages: usize,
    max_bytes: u64,
) -> Result<usize, StoreError> {
    let excess = conn
        .prepare_cached(
            "DELETE FROM received_messages WHERE rowid IN (
                 SELECT rowid FROM received_messages
                 ORDER BY received_at DESC, rowid DESC
                 LIMIT -1 OFFSET ?1)",
        )?
        .execute([to_db(max_messages as u64)])?;
    let oversize = conn
        .prepare_cached(
            "DELETE FROM received_messages WHERE rowid IN (
                 SELECT rowid FROM (
                     SELECT rowid, SUM(bytes) OVER (
                         ORDER BY received_at DESC, rowid DESC
                     ) AS newer_bytes
                     FROM received_messages)
                 WHERE newer_bytes > ?1)",
        )?
        .execute([to_db(max_bytes)])?;
    Ok(excess + oversize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Reports, RuntimeChanges, Store};

    fn message(id: &str, content: &str) -> Message {
        let mut message = Message::decode(
            r#"{"id":"m","sender":"bob","recipient":"alice","app_id":"chat","priority":"medium",
               "ttl":10,"hop_count":0,"timestamp":5,"lamport_clock":1,"content_type":"text",
               "content":"","reply_to_msg":"m0","rich":{"mentions":["carol"]}}"#,
        )
        .unwrap();
        message.id = id.into();
        message.content = content.into();
        message
    }

    fn keep_all(store: &mut Store, chat: &str, messages: &[Message], now: Millis) {
        let received: Vec<Received<'_>> = messages
            .iter()
            .map(|message| Received {
                chat,
                sender: "bob",
                message,
            })
            .collect();
        let runtime = RuntimeChanges {
            received: &received,
            now,
            ..RuntimeChanges::default()
        };
        store
            .commit_with(&[], &Reports::default(), &runtime)
            .unwrap();
    }

    fn kept(store: &Store) -> Vec<String> {
        let mut stmt = store
            .conn
            .prepare("SELECT message_id FROM received_messages ORDER BY received_at, rowid")
            .unwrap();
        let ids = stmt.query_map([], |row| row.get(0)).unwrap();
        ids.map(Result::unwrap).collect()
    }

    #[test]
    fn a_kept_message_is_found_by_its_id_whole_and_first_copy_wins() {
        let mut store = Store::open_memory().unwrap();
        let first = message("m1", "first");
        keep_all(&mut store, "bob", std::slice::from_ref(&first), 10);
        keep_all(&mut store, "bob", &[message("m1", "a redelivery")], 20);
        let found = store.received("m1").unwrap().unwrap();
        assert_eq!(
            found,
            ReceivedMessage {
                chat: "bob".into(),
                sender: "bob".into(),
                message: first,
            }
        );
        assert_eq!(store.received("m2").unwrap(), None);
        // Two chats with one id: the later one is found.
        keep_all(&mut store, "group-1", &[message("m1", "in the group")], 30);
        assert_eq!(store.received("m1").unwrap().unwrap().chat, "group-1");
    }

    #[test]
    fn pruning_drops_the_oldest_beyond_the_count_then_beyond_the_bytes() {
        let mut store = Store::open_memory().unwrap();
        let messages: Vec<Message> = (0..5)
            .map(|i| message(&format!("m{i}"), &"x".repeat(1000)))
            .collect();
        for (at, message) in messages.iter().enumerate() {
            keep_all(&mut store, "bob", std::slice::from_ref(message), at as u64);
        }
        assert_eq!(store.prune_received(4, u64::MAX).unwrap(), 1);
        assert_eq!(kept(&store), ["m1", "m2", "m3", "m4"]);
        let one = messages[0].encode().len() as u64;
        // Room for two and a half: the two newest stay.
        assert_eq!(store.prune_received(10, one * 5 / 2).unwrap(), 2);
        assert_eq!(kept(&store), ["m3", "m4"]);
        assert_eq!(store.prune_received(10, one * 2).unwrap(), 0);
    }
}
