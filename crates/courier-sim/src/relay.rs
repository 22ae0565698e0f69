//! The relay as `docs/protocol.md` describes it, reduced to what delivery depends on: accounts,
//! one connection per account, the per-account journal with `seq` (with the mailbox) or
//! live-only forwarding (without it), dedup of a re-sent frame while it is unacked, mailbox
//! limits and TTL, the drain on every connection followed by `DrainComplete`, `live`, `stored`
//! and `unreachable` answers, hop acks, pushed presence, and — when it offers it — the
//! key-package directory (`directory`). A restart keeps the journal, the directory and the known
//! accounts (SQLite) and loses every connection and watch.

mod directory;

use std::collections::{BTreeMap, BTreeSet};

use courier_engine::Millis;
use courier_proto::{Message, UnreachableCause};

pub use directory::{Directory, Held};

pub type ConnId = u64;

/// A frame from a client to the relay.
#[derive(Debug, Clone)]
pub enum ToRelay {
    /// `SendMessage`; `tag` is the outbox attempt (`send_seq`) the client correlates the answer
    /// with, `None` for an end-to-end ACK (fire and forget).
    Send {
        message: Box<Message>,
        tag: Option<u64>,
    },
    /// `Ack{seq}`: releases a journal frame.
    Ack {
        seq: u64,
    },
    Watch(Vec<String>),
    Unwatch(Vec<String>),
    /// `PublishKeyPackages` for the connection's own address (every simulated connection has
    /// declared it): `packages` empty and no `last_resort` only asks what is held.
    Publish {
        packages: Vec<Vec<u8>>,
        last_resort: Option<Vec<u8>>,
    },
    /// `FetchKeyPackage{address}`.
    Fetch {
        address: String,
    },
}

/// A frame from the relay to a client.
#[derive(Debug, Clone)]
pub enum ToClient {
    Authenticated {
        mailbox: bool,
        /// `key_directory_v1` is advertised.
        directory: bool,
    },
    Received {
        seq: Option<u64>,
        sender: String,
        message: Box<Message>,
    },
    /// `MessageSent` with its disposition.
    Sent {
        message_id: String,
        tag: Option<u64>,
        stored: bool,
    },
    /// `DeliveryError{recipient_unreachable…}`.
    Unreachable {
        message_id: String,
        tag: Option<u64>,
        cause: UnreachableCause,
    },
    DrainComplete {
        count: u64,
    },
    Presence {
        peer: String,
        online: bool,
    },
    /// `KeyPackagesPublished`.
    Published(Held),
    /// `KeyPackage{address, package}`.
    KeyPackage {
        address: String,
        package: Vec<u8>,
    },
    /// `KeyPackageUnavailable{address}`.
    KeyPackageUnavailable {
        address: String,
    },
}

#[derive(Debug, Clone, Copy)]
pub struct MailboxLimits {
    pub max_messages: usize,
    pub max_bytes: usize,
    pub ttl_ms: u64,
}

#[derive(Debug)]
struct Frame {
    sender: String,
    message: Message,
    accepted_at: Millis,
    bytes: usize,
}

#[derive(Debug)]
struct Conn {
    account: String,
    watches: BTreeSet<String>,
}

/// Frames the relay writes: (connection, frame), in write order.
pub type Writes = Vec<(ConnId, ToClient)>;

#[derive(Debug, Default, Clone, Copy)]
pub struct RelayCounts {
    pub journaled: u64,
    pub dedup_hits: u64,
    pub mailbox_full: u64,
    pub offline_no_mailbox: u64,
    pub unknown_recipient: u64,
    pub purged: u64,
    pub drained: u64,
    pub max_journal: usize,
    /// Key packages handed out: one-time, last-resort, and fetches that found none.
    pub one_time_fetched: u64,
    pub last_resort_fetched: u64,
    pub fetched_none: u64,
}

#[derive(Debug)]
pub struct Relay {
    pub mailbox: Option<MailboxLimits>,
    /// The key-package directory, when the relay offers it.
    directory: Option<Directory>,
    pub up: bool,
    // HookPipeline.
    known: BTreeSet<String>,
    journals: BTreeMap<String, BTreeMap<u64, Frame>>,
    next_seq: BTreeMap<String, u64>,
    // Live.
    conns: BTreeMap<ConnId, Conn>,
    online: BTreeMap<String, ConnId>,
    next_conn: ConnId,
    pub counts: RelayCounts,
}

impl Relay {
    pub fn new(
        mailbox: Option<MailboxLimits>,
        directory: bool,
        accounts: impl IntoIterator<Item = String>,
    ) -> Self {
        Self {
            mailbox,
            directory: directory.then(Directory::default),
            up: true,
            known: accounts.into_iter().collect(),
            journals: BTreeMap::new(),
            next_seq: BTreeMap::new(),
            conns: BTreeMap::new(),
            online: BTreeMap::new(),
            next_conn: 0,
            counts: RelayCounts::default(),
        }
    }

    /// An authenticated connection for `account`: it displaces the account's older one, gets
    /// `Authenticated`, then (with the mailbox) the drain of every unacked frame in seq order and
    /// `DrainComplete`. Returns the new connection, the displaced one and the writes.
    pub fn accept(&mut self, account: &str, now: Millis) -> (ConnId, Option<ConnId>, Writes) {
        self.purge(now);
        self.known.insert(account.to_owned());
        let mut out = Vec::new();
        let displaced = self.online.remove(account);
        if let Some(old) = displaced {
            self.conns.remove(&old);
        }
        self.next_conn += 1;
        let conn = self.next_conn;
        self.conns.insert(
            conn,
            Conn {
                account: account.to_owned(),
                watches: BTreeSet::new(),
            },
        );
        self.online.insert(account.to_owned(), conn);
        out.push((
            conn,
            ToClient::Authenticated {
                mailbox: self.mailbox.is_some(),
                directory: self.directory.is_some(),
            },
        ));
        if self.mailbox.is_some() {
            let mut count = 0;
            if let Some(journal) = self.journals.get(account) {
                for (seq, frame) in journal {
                    out.push((
                        conn,
                        ToClient::Received {
                            seq: Some(*seq),
                            sender: frame.sender.clone(),
                            message: Box::new(frame.message.clone()),
                        },
                    ));
                    count += 1;
                }
            }
            self.counts.drained += count;
            out.push((conn, ToClient::DrainComplete { count }));
        }
        if displaced.is_none() {
            self.notify(account, true, &mut out);
        }
        (conn, displaced, out)
    }

    /// The connection ended (closed, dropped, or its client died).
    pub fn disconnect(&mut self, conn: ConnId) -> Writes {
        let mut out = Vec::new();
        if let Some(c) = self.conns.remove(&conn) {
            if self.online.get(&c.account) == Some(&conn) {
                self.online.remove(&c.account);
                self.notify(&c.account, false, &mut out);
            }
        }
        out
    }

    /// The relay process dies: every connection is gone, the journal stays. Returns the
    /// connections that were open.
    pub fn crash(&mut self) -> Vec<ConnId> {
        self.up = false;
        self.online.clear();
        std::mem::take(&mut self.conns).into_keys().collect()
    }

    pub fn is_open(&self, conn: ConnId) -> bool {
        self.conns.contains_key(&conn)
    }

    /// A frame read from `conn`.
    pub fn receive(&mut self, conn: ConnId, frame: ToRelay, now: Millis) -> Writes {
        let mut out = Vec::new();
        let Some(account) = self.conns.get(&conn).map(|c| c.account.clone()) else {
            return out;
        };
        self.purge(now);
        match frame {
            ToRelay::Send { message, tag } => {
                self.send(conn, &account, *message, tag, now, &mut out)
            }
            ToRelay::Ack { seq } => {
                if let Some(journal) = self.journals.get_mut(&account) {
                    journal.remove(&seq);
                }
            }
            ToRelay::Watch(peers) => {
                for peer in peers {
                    let online = self.online.contains_key(&peer);
                    if let Some(c) = self.conns.get_mut(&conn) {
                        if c.watches.insert(peer.clone()) {
                            out.push((conn, ToClient::Presence { peer, online }));
                        }
                    }
                }
            }
            ToRelay::Unwatch(peers) => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    for peer in peers {
                        c.watches.remove(&peer);
                    }
                }
            }
            // Without the directory the relay answers both `unknown_type`, which the client
            // never provokes: it only asks a relay that advertised the directory.
            ToRelay::Publish {
                packages,
                last_resort,
            } => {
                if let Some(directory) = self.directory.as_mut() {
                    let held = directory.publish(&account, packages, last_resort);
                    out.push((conn, ToClient::Published(held)));
                }
            }
            ToRelay::Fetch { address } => {
                if let Some(directory) = self.directory.as_mut() {
                    let answer = match directory.fetch(&address) {
                        Some((package, last_resort)) => {
                            if last_resort {
                                self.counts.last_resort_fetched += 1;
                            } else {
                                self.counts.one_time_fetched += 1;
                            }
                            ToClient::KeyPackage { address, package }
                        }
                        None => {
                            self.counts.fetched_none += 1;
                            ToClient::KeyPackageUnavailable { address }
                        }
                    };
                    out.push((conn, answer));
                }
            }
        }
        out
    }

    fn send(
        &mut self,
        conn: ConnId,
        sender: &str,
        message: Message,
        tag: Option<u64>,
        now: Millis,
        out: &mut Writes,
    ) {
        let message_id = message.id.clone();
        let recipient = message.recipient.clone();
        let unreachable = |cause| ToClient::Unreachable {
            message_id: message_id.clone(),
            tag,
            cause,
        };
        if !self.known.contains(&recipient) {
            self.counts.unknown_recipient += 1;
            out.push((conn, unreachable(UnreachableCause::UnknownRecipient)));
            return;
        }
        let live = self.online.get(&recipient).copied();
        let sent = ToClient::Sent {
            message_id: message_id.clone(),
            tag,
            stored: live.is_none(),
        };
        let Some(limits) = self.mailbox else {
            match live {
                Some(to) => {
                    out.push((
                        to,
                        ToClient::Received {
                            seq: None,
                            sender: sender.to_owned(),
                            message: Box::new(message),
                        },
                    ));
                    out.push((conn, sent));
                }
                None => {
                    self.counts.offline_no_mailbox += 1;
                    out.push((conn, unreachable(UnreachableCause::OfflineNoMailbox)));
                }
            }
            return;
        };
        let journal = self.journals.entry(recipient.clone()).or_default();
        let duplicate = journal
            .values()
            .any(|f| f.sender == sender && f.message.id == message_id);
        if duplicate {
            self.counts.dedup_hits += 1;
            out.push((conn, sent));
            return;
        }
        let bytes = message.content.len() + message.id.len();
        let held: usize = journal.values().map(|f| f.bytes).sum();
        if journal.len() >= limits.max_messages || held + bytes > limits.max_bytes {
            self.counts.mailbox_full += 1;
            out.push((conn, unreachable(UnreachableCause::MailboxFull)));
            return;
        }
        let next = self.next_seq.entry(recipient.clone()).or_insert(0);
        *next += 1;
        let seq = *next;
        if let Some(to) = live {
            out.push((
                to,
                ToClient::Received {
                    seq: Some(seq),
                    sender: sender.to_owned(),
                    message: Box::new(message.clone()),
                },
            ));
        }
        journal.insert(
            seq,
            Frame {
                sender: sender.to_owned(),
                message,
                accepted_at: now,
                bytes,
            },
        );
        self.counts.journaled += 1;
        self.counts.max_journal = self.counts.max_journal.max(journal.len());
        out.push((conn, sent));
    }

    fn notify(&self, account: &str, online: bool, out: &mut Writes) {
        for (id, c) in &self.conns {
            if c.watches.contains(account) {
                out.push((
                    *id,
                    ToClient::Presence {
                        peer: account.to_owned(),
                        online,
                    },
                ));
            }
        }
    }

    /// Frames past the mailbox TTL are deleted undelivered.
    fn purge(&mut self, now: Millis) {
        let Some(limits) = self.mailbox else {
            return;
        };
        for journal in self.journals.values_mut() {
            let before = journal.len();
            journal.retain(|_, f| f.accepted_at.saturating_add(limits.ttl_ms) > now);
            self.counts.purged += (before - journal.len()) as u64;
        }
    }

    /// Every held frame: (account, seq, message id).
    pub fn held_frames(&self) -> Vec<(String, u64, String)> {
        self.journals
            .iter()
            .flat_map(|(account, journal)| {
                journal
                    .iter()
                    .map(move |(seq, f)| (account.clone(), *seq, f.message.id.clone()))
            })
            .collect()
    }
}
