//! The relay as `docs/protocol.md` describes it, reduced to what delivery depends on: accounts,
//! one connection per account, the per-account journal with `seq` (with the mailbox) or
//! live-only forwarding (without it), dedup of a re-sent frame while it is unacked, mailbox
//! limits and TTL, the drain on every connection followed by `DrainComplete`, `live`, `stored`
//! and `unreachable` answers, hop acks, pushed presence, and — when it offers them — the
//! key-package directory (`directory`) and group delivery (`groups`). A restart keeps the
//! journal, the directory, the group rosters and broadcast records and the known accounts
//! (SQLite) and loses every connection, watch, registration and held report.

mod directory;
mod groups;

use std::collections::{BTreeMap, BTreeSet};

use courier_engine::{GroupReport, Millis};
use courier_proto::{Message, UnreachableCause};

pub use directory::{Directory, Held};
use groups::Groups;
pub use groups::{group_key, Carried, GroupFrame, GroupLog};

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
        /// `group_delivery_v3` is advertised.
        groups: bool,
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
    /// Whether this connection's account is registered in `group_id`: the answer to a
    /// registration, or a change of the relay's roster.
    GroupReady {
        group_id: String,
        ready: bool,
    },
    /// `GroupError` naming a broadcast the relay refused.
    GroupError {
        message_id: String,
        reason: String,
    },
    /// `GroupMessageSent`: the settled report of a broadcast.
    GroupReport(GroupReport),
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
    /// Groups whose registration this connection asked about.
    groups: BTreeSet<String>,
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
    /// Broadcasts taken, and per-member copies a re-broadcast did not journal again.
    pub broadcasts: u64,
    pub broadcast_dedup: u64,
}

#[derive(Debug)]
pub struct Relay {
    pub mailbox: Option<MailboxLimits>,
    /// The key-package directory, when the relay offers it.
    directory: Option<Directory>,
    /// Group delivery, when the relay offers it.
    groups: Option<Groups>,
    /// What the relay did with every group message, for the checks.
    pub group_log: GroupLog,
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
        groups: bool,
        accounts: impl IntoIterator<Item = String>,
    ) -> Self {
        Self {
            mailbox,
            directory: directory.then(Directory::default),
            groups: groups.then(Groups::default),
            group_log: GroupLog::default(),
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
    /// `DrainComplete`, then the group reports held for it. Returns the new connection, the
    /// displaced one and the writes.
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
                groups: BTreeSet::new(),
            },
        );
        self.online.insert(account.to_owned(), conn);
        out.push((
            conn,
            ToClient::Authenticated {
                mailbox: self.mailbox.is_some(),
                directory: self.directory.is_some(),
                groups: self.groups.is_some(),
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
        if let Some(groups) = self.groups.as_mut() {
            for report in groups.take_held(account) {
                out.push((conn, ToClient::GroupReport(report)));
            }
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
        if let Some(groups) = self.groups.as_mut() {
            groups.crash();
        }
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
        let duplicate = self.mailbox.is_some()
            && self.journals.get(&recipient).is_some_and(|journal| {
                journal
                    .values()
                    .any(|f| f.sender == sender && f.message.id == message_id)
            });
        let answer = if duplicate {
            self.counts.dedup_hits += 1;
            Ok(!self.online.contains_key(&recipient))
        } else {
            self.deliver(sender, &recipient, message, now, out)
                .map(|live| !live)
        };
        let answer = match answer {
            Ok(stored) => ToClient::Sent {
                message_id,
                tag,
                stored,
            },
            Err(cause) => ToClient::Unreachable {
                message_id,
                tag,
                cause,
            },
        };
        out.push((conn, answer));
    }

    /// Hands `message` to `recipient`: journaled with the mailbox, and written to its live
    /// connection if it has one. `Ok(true)` when written live, `Ok(false)` when only stored,
    /// else why it could not be.
    fn deliver(
        &mut self,
        sender: &str,
        recipient: &str,
        message: Message,
        now: Millis,
        out: &mut Writes,
    ) -> Result<bool, UnreachableCause> {
        if !self.known.contains(recipient) {
            self.counts.unknown_recipient += 1;
            return Err(UnreachableCause::UnknownRecipient);
        }
        let live = self.online.get(recipient).copied();
        let Some(limits) = self.mailbox else {
            let Some(to) = live else {
                self.counts.offline_no_mailbox += 1;
                return Err(UnreachableCause::OfflineNoMailbox);
            };
            self.group_log
                .note(recipient, sender, &message, Carried::Live);
            out.push((
                to,
                ToClient::Received {
                    seq: None,
                    sender: sender.to_owned(),
                    message: Box::new(message),
                },
            ));
            return Ok(true);
        };
        let journal = self.journals.entry(recipient.to_owned()).or_default();
        let bytes = message.content.len() + message.id.len();
        let held: usize = journal.values().map(|f| f.bytes).sum();
        if journal.len() >= limits.max_messages || held + bytes > limits.max_bytes {
            self.counts.mailbox_full += 1;
            return Err(UnreachableCause::MailboxFull);
        }
        let next = self.next_seq.entry(recipient.to_owned()).or_insert(0);
        *next += 1;
        let seq = *next;
        self.group_log
            .note(recipient, sender, &message, Carried::Journaled);
        if let Some(to) = live {
            self.group_log
                .note(recipient, sender, &message, Carried::Live);
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
        Ok(live.is_some())
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
        for (account, journal) in &mut self.journals {
            let before = journal.len();
            journal.retain(|_, f| {
                let keep = f.accepted_at.saturating_add(limits.ttl_ms) > now;
                if !keep {
                    self.group_log
                        .note(account, &f.sender, &f.message, Carried::Purged);
                }
                keep
            });
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
