//! Sequences of frames from several connections against a real relay on 127.0.0.1:0, built
//! from fuzzer bytes (`fuzz/fuzz_targets/relay_session.rs`) and replayed by the regression
//! tests. Whatever the sequence, the relay must:
//! - answer only with well-formed text frames, and never with `internal`;
//! - answer every SendMessage whose id is a valid identifier exactly once, echoing its id
//!   and recipient;
//! - bind an address only for a valid proof over the connection's own challenge;
//! - deliver a frame only to the account it was sent to (by name, or through an address that
//!   account proved), stamped with its sender's account or an address the sender proved;
//! - number each connection's frames in increasing seq, and count its drain exactly;
//! - close only for a reason the connection gave (16 malformed frames, displacement);
//! - accept key packages only from a connection that declared its address, and answer a fetch
//!   only to the connection that asked;
//! - keep every journaled frame until its own account acks it: after the run, each account's
//!   drain still holds every frame it received and did not ack, whatever the others acked;
//! - deliver a group copy only as some account's SendGroupMessage to that group (same content
//!   and reply, stamped with the sender's account or an address it proved), in the seq space of
//!   the account's other frames, answer group frames only with group answers or refusals for
//!   groups the connection named, and send a group report only to the account that broadcast.

mod conn;
mod scenario;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::OnceLock;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use courier_proto::limits::{
    close, CAP_ADDRESS_ROUTING, CAP_GROUP_DELIVERY, CAP_KEY_DIRECTORY, CAP_MAILBOX,
    CAP_PRESENCE_WATCH, MAX_IDENTIFIER_BYTES, MAX_MALFORMED_FRAMES, RECIPIENT_UNREACHABLE,
};
use courier_proto::proof::{declare_address_frame, decode_challenge, relay_proof_payload};
use courier_proto::{Address, ClientFrame, DecodeError, Disposition, IdentityKey, RelayFrame};
use courier_relay::{MailboxLimits, RateLimit, RelayConfig, Storage, Timings};
use tokio::runtime::Runtime;
use tokio_tungstenite::tungstenite::{Bytes, Message};

use conn::{Conn, Ending, Incoming};
pub use scenario::Scenario;
use scenario::{
    Account, AuthSpec, FrameSpec, GroupSpec, IdSpec, ProofSpec, SeqSpec, Step, Target, ACCOUNTS,
    KEYS, MAX_STEPS, SLOTS,
};

const SECRET: &[u8] = b"relay-fuzz-secret-of-32-bytes-at-least";
/// Unknown frame type the harness sends to learn that the relay has handled everything before
/// it; inputs that spell it are skipped so the fuzzer cannot forge the answer.
const BARRIER: &str = "FuzzBarrier";
/// Error codes the relay may answer with; `internal` is a storage failure, never expected of
/// an in-memory database.
const ERROR_CODES: &[&str] = &[
    "malformed",
    "unknown_type",
    "invalid_frame",
    "already_authenticated",
    "limit_exceeded",
    "address_required",
];
const AUTH_REASONS: &[&str] = &["not_authenticated", "invalid_token", "invalid_account"];
const GROUP_REASONS: &[&str] = &[
    "group_not_found",
    "group_exists",
    "not_admin",
    "not_member",
    "group_full",
    "invalid_member",
];

/// Decodes a scenario exactly as `libfuzzer_sys::fuzz_target!` would and runs it.
pub fn run_bytes(data: &[u8]) {
    let Ok(scenario) = Scenario::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    runtime().block_on(run(scenario));
}

/// One runtime for the whole process, started on first use: the fuzzer calls in thousands of
/// times a second.
fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
}

pub async fn run(scenario: Scenario) {
    let mut config = RelayConfig::new(
        "127.0.0.1:0".parse().expect("loopback"),
        Storage::Memory,
        SECRET.to_vec(),
    );
    config.mailbox = scenario.mailbox.as_ref().map(|m| {
        let defaults = MailboxLimits::default();
        MailboxLimits {
            max_messages: match m.max_messages {
                0 => defaults.max_messages,
                n => u64::from(n),
            },
            max_bytes: match m.max_bytes {
                0 => defaults.max_bytes,
                n => u64::from(n),
            },
            ..defaults
        }
    });
    if scenario.tight_rate {
        config.rate_limit = RateLimit {
            burst: 4,
            per_sec: 1,
        };
    }
    config.timings = Timings {
        drain_grace: Duration::from_millis(50),
        close_linger: Duration::from_millis(200),
        supersede_wait: Duration::from_secs(2),
        ..Timings::default()
    };
    let mailbox = config.mailbox.is_some();
    let relay = courier_relay::start(config).await.expect("relay starts");
    let mut world = World::new(relay.url(), mailbox);
    for step in scenario.steps.into_iter().take(MAX_STEPS) {
        world.step(step).await;
    }
    world.finish().await;
    relay.stop().await;
}

/// What the harness sent with one message id.
#[derive(Debug)]
struct Sent {
    from: usize,
    recipient: String,
    content: String,
    reply_to: Option<String>,
}

/// What the harness broadcast with one message id.
#[derive(Debug)]
struct GroupSent {
    from: usize,
    group_id: String,
    content: String,
    reply_to: Option<String>,
}

/// One GroupMessageReceived, judged like a [`Delivery`].
#[derive(Debug)]
struct GroupDelivery {
    to: usize,
    group_id: String,
    sender: String,
    message_id: String,
    content: String,
    reply_to: Option<String>,
}

/// One MessageReceived, judged once the run is over and every declaration is known.
#[derive(Debug)]
struct Delivery {
    to: usize,
    sender: String,
    sender_account: Option<String>,
    message_id: String,
    content: String,
    reply_to: Option<String>,
}

/// What one account's connections saw of its journal, and what they acked.
#[derive(Debug, Default)]
struct Journal {
    seen: BTreeMap<u64, String>,
    acked: HashSet<u64>,
    acked_up_to: u64,
    /// A connection without `mailbox_v1` releases what it is written
    /// (`docs/protocol.md#connections-without-the-opt-in`), so the account's journal is not checked
    /// at the end.
    released_on_write: bool,
}

impl Journal {
    fn released(&self, seq: u64) -> bool {
        seq <= self.acked_up_to || self.acked.contains(&seq)
    }
}

/// Everything the run knows beyond a single connection.
struct Model {
    mailbox: bool,
    keys: Vec<IdentityKey>,
    /// Valid Authenticates sent per account; a connection may be displaced only by a later one.
    connects: [u32; ACCOUNTS.len()],
    fresh: u32,
    ids: Vec<String>,
    sent: HashMap<String, Vec<Sent>>,
    group_sent: HashMap<String, Vec<GroupSent>>,
    /// (group, message) pairs each account broadcast: a report, held ones included, names one.
    broadcasts: [HashSet<(String, String)>; ACCOUNTS.len()],
    group_deliveries: Vec<GroupDelivery>,
    /// Addresses each account sent a valid proof for.
    proved: [HashSet<String>; ACCOUNTS.len()],
    deliveries: Vec<Delivery>,
    journals: [Journal; ACCOUNTS.len()],
}

/// The harness's side of one authenticated connection.
struct Client {
    conn: Conn,
    account: usize,
    opted_in: bool,
    generation: u32,
    challenge: String,
    /// We started the closing handshake.
    closing: bool,
    malformed: u32,
    barriers: u32,
    /// Message ids this connection sent in any frame (the relay may echo them).
    echoable: HashSet<String>,
    /// Recipients each SendMessage id was sent to on this connection.
    recipients: HashMap<String, Vec<String>>,
    /// SendMessage answers owed since the last sync, and those received, by message id.
    owed: HashMap<String, usize>,
    answered: HashMap<String, usize>,
    /// Identifiers this connection asked the presence of.
    asked: HashSet<String>,
    /// Group ids this connection named in any group frame.
    groups: HashSet<String>,
    declarations: u32,
    /// The address the first DeclareAddress may bind, when its proof was valid.
    bindable: Option<String>,
    address_declared: bool,
    /// Addresses this connection asked a key package of.
    fetched: HashSet<Address>,
    seqs: Vec<u64>,
    received: Vec<(u64, String)>,
    drained: u64,
    drain_complete: bool,
}

struct World {
    url: String,
    slots: [Option<Client>; SLOTS],
    model: Model,
}

fn identifier_size_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_IDENTIFIER_BYTES
}

impl World {
    fn new(url: String, mailbox: bool) -> Self {
        let keys = (0..KEYS)
            .map(|i| IdentityKey::from_seed([i as u8 + 1; 32]))
            .collect();
        Self {
            url,
            slots: std::array::from_fn(|_| None),
            model: Model {
                mailbox,
                keys,
                connects: [0; ACCOUNTS.len()],
                fresh: 0,
                ids: Vec::new(),
                sent: HashMap::new(),
                group_sent: HashMap::new(),
                broadcasts: std::array::from_fn(|_| HashSet::new()),
                group_deliveries: Vec::new(),
                proved: std::array::from_fn(|_| HashSet::new()),
                deliveries: Vec::new(),
                journals: std::array::from_fn(|_| Journal::default()),
            },
        }
    }

    async fn step(&mut self, step: Step) {
        match step {
            Step::Connect {
                slot,
                account,
                opt_in,
                auth,
            } => self.connect(slot.index(), account, opt_in, auth).await,
            Step::Send { slot, frame } => self.send(slot.index(), frame).await,
            Step::Sync { slot } => self.sync(slot.index()).await,
            Step::Disconnect { slot } => self.disconnect(slot.index()).await,
        }
    }

    async fn connect(&mut self, slot: usize, account: Account, opt_in: bool, auth: AuthSpec) {
        self.disconnect(slot).await;
        let name = account.name();
        let capabilities = opt_in.then(|| vec![CAP_MAILBOX.to_owned()]);
        let authenticate = |token: String| ClientFrame::Authenticate {
            token,
            client_capabilities: capabilities.clone(),
        };
        let issue = |secret: &[u8]| courier_relay::issue_token(secret, name, 3600).expect("token");
        let valid = matches!(auth, AuthSpec::Valid);
        let first = match auth {
            AuthSpec::Valid => authenticate(issue(SECRET)).encode(),
            AuthSpec::WrongSecret => {
                authenticate(issue(b"another-secret-of-32-bytes-at-least")).encode()
            }
            AuthSpec::Token(token) => authenticate(token).encode(),
            AuthSpec::FirstFrame(text) => text,
        };
        let mut conn = Conn::open(&self.url).await;
        let index = account as usize;
        if valid {
            self.model.connects[index] += 1;
        }
        assert!(
            conn.send_text(first).await,
            "the relay reads the first frame"
        );
        let answer = match conn.next().await {
            Some(Incoming::Text(text)) => decode(&text),
            other => panic!("first answer to {name}: {other:?}"),
        };
        if !valid {
            match answer {
                RelayFrame::AuthError { reason } => {
                    assert!(
                        AUTH_REASONS.contains(&reason.as_str()),
                        "AuthError {reason}"
                    )
                }
                other => panic!("an invalid Authenticate was answered {other:?}"),
            }
            let ending = conn.next().await;
            assert!(
                matches!(
                    ending,
                    Some(Incoming::Ended(Ending::Close(Some(close::AUTH_FAILED))))
                ),
                "after AuthError: {ending:?}"
            );
            return;
        }
        let RelayFrame::Authenticated {
            user_id,
            username,
            capabilities,
            address_challenge,
            rate_limit,
            mailbox,
        } = answer
        else {
            panic!("a valid Authenticate was answered {answer:?}");
        };
        assert_eq!((user_id.as_str(), username.as_str()), (name, name));
        let has = |cap: &str| capabilities.iter().any(|c| c == cap);
        assert!(has(CAP_ADDRESS_ROUTING) && has(CAP_PRESENCE_WATCH) && has(CAP_KEY_DIRECTORY));
        assert!(has(CAP_GROUP_DELIVERY));
        assert_eq!(has(CAP_MAILBOX), self.model.mailbox);
        assert_eq!(mailbox.is_some(), self.model.mailbox);
        assert!(rate_limit.is_some());
        let challenge = address_challenge.expect("an address challenge");
        assert!(
            decode_challenge(&challenge).is_some(),
            "challenge {challenge}"
        );
        if !opt_in {
            self.model.journals[index].released_on_write = true;
        }
        self.slots[slot] = Some(Client {
            conn,
            account: index,
            opted_in: opt_in,
            generation: self.model.connects[index],
            challenge,
            closing: false,
            malformed: 0,
            barriers: 0,
            echoable: HashSet::new(),
            recipients: HashMap::new(),
            owed: HashMap::new(),
            answered: HashMap::new(),
            asked: HashSet::new(),
            groups: HashSet::new(),
            declarations: 0,
            bindable: None,
            address_declared: false,
            fetched: HashSet::new(),
            seqs: Vec::new(),
            received: Vec::new(),
            drained: 0,
            drain_complete: false,
        });
    }

    async fn send(&mut self, slot: usize, spec: FrameSpec) {
        let Some(client) = self.slots[slot].as_mut() else {
            return;
        };
        let model = &mut self.model;
        // Takes in what has arrived, so `SeqSpec::Received` can name the latest seqs.
        while let Some(incoming) = client.conn.try_next() {
            client.observe(model, incoming);
        }
        if !client.conn.writable() {
            return;
        }
        let account = client.account;
        let (frame, proof_valid) = match spec {
            FrameSpec::Text(text) => {
                if text.contains(BARRIER) {
                    return;
                }
                let decoded = ClientFrame::decode(&text);
                if client.conn.send_text(text).await {
                    match decoded {
                        Ok(frame) => client.sent(model, &frame, false),
                        Err(DecodeError::Malformed) => client.malformed += 1,
                        Err(_) => {}
                    }
                }
                return;
            }
            FrameSpec::Binary(data) => {
                if client.conn.send(Message::Binary(Bytes::from(data))).await {
                    client.malformed += 1;
                }
                return;
            }
            FrameSpec::SendMessage {
                to,
                content,
                id,
                reply_to,
            } => (
                ClientFrame::SendMessage {
                    recipient: model.target(to),
                    content,
                    message_id: model.id(id),
                    reply_to_msg: reply_to.map(|id| model.id(id)),
                },
                false,
            ),
            FrameSpec::Ack(seq) => (
                ClientFrame::Ack {
                    seq: client.seq(seq),
                },
                false,
            ),
            FrameSpec::AckUpTo(seq) => (
                ClientFrame::AckUpTo {
                    seq: client.seq(seq),
                },
                false,
            ),
            FrameSpec::CheckPresence(target) => (
                ClientFrame::CheckPresence {
                    username: model.target(target),
                },
                false,
            ),
            FrameSpec::WatchPresence(users) => (
                ClientFrame::WatchPresence {
                    users: users.into_iter().map(|t| model.target(t)).collect(),
                },
                false,
            ),
            FrameSpec::UnwatchPresence(users) => (
                ClientFrame::UnwatchPresence {
                    users: users.into_iter().map(|t| model.target(t)).collect(),
                },
                false,
            ),
            FrameSpec::DeclareAddress { key, proof } => {
                model.declaration(key.index(), proof, ACCOUNTS[account], &client.challenge)
            }
            FrameSpec::Authenticate => (
                ClientFrame::Authenticate {
                    token: "already".to_owned(),
                    client_capabilities: None,
                },
                false,
            ),
            FrameSpec::Group(group) => (model.group(group), false),
        };
        if client.conn.send_text(frame.encode()).await {
            client.sent(model, &frame, proof_valid);
        }
    }

    /// Sends a barrier and reads until its answer: every earlier frame of the slot has been
    /// handled and answered by then.
    async fn sync(&mut self, slot: usize) {
        let Some(client) = self.slots[slot].as_mut() else {
            return;
        };
        let model = &mut self.model;
        client.barriers += 1;
        let barrier = format!("{BARRIER}{}", client.barriers);
        let text = serde_json::json!({ "type": barrier }).to_string();
        let sent = client.conn.send_text(text).await;
        while let Some(incoming) = client.conn.next().await {
            if sent {
                if let Incoming::Text(text) = &incoming {
                    match decode(text) {
                        RelayFrame::Error {
                            code, frame_type, ..
                        } if frame_type.as_deref() == Some(barrier.as_str()) => {
                            assert_eq!(code, "unknown_type");
                            client.settle();
                            return;
                        }
                        RelayFrame::RateLimited { frame_type, .. } if frame_type == barrier => {
                            client.settle();
                            return;
                        }
                        _ => {}
                    }
                }
            }
            client.observe(model, incoming);
        }
    }

    /// Closes the slot's connection (if any) and reads it to its end.
    async fn disconnect(&mut self, slot: usize) {
        let Some(mut client) = self.slots[slot].take() else {
            return;
        };
        if client.conn.writable() {
            client.closing = true;
            client.conn.close().await;
        }
        while let Some(incoming) = client.conn.next().await {
            client.observe(&mut self.model, incoming);
        }
    }

    async fn finish(&mut self) {
        for slot in 0..SLOTS {
            self.sync(slot).await;
            self.disconnect(slot).await;
        }
        if self.model.mailbox {
            for account in [Account::Alice, Account::Bob, Account::Carol] {
                self.check_journal(account).await;
            }
        }
        self.model.check_deliveries();
    }

    /// A fresh opted-in connection drains every frame the account received and did not ack.
    async fn check_journal(&mut self, account: Account) {
        let index = account as usize;
        let journal = &self.model.journals[index];
        if journal.released_on_write || journal.seen.is_empty() {
            return;
        }
        let kept: Vec<(u64, String)> = journal
            .seen
            .iter()
            .filter(|(seq, _)| !journal.released(**seq))
            .map(|(seq, id)| (*seq, id.clone()))
            .collect();
        self.connect(0, account, true, AuthSpec::Valid).await;
        self.sync(0).await;
        let client = self.slots[0].as_mut().expect("the journal check connected");
        while !client.drain_complete {
            let incoming = client.conn.next().await;
            let incoming = incoming.expect("the drain completes before the connection ends");
            client.observe(&mut self.model, incoming);
        }
        let drained: HashSet<&(u64, String)> = client.received.iter().collect();
        for frame in &kept {
            assert!(
                drained.contains(frame),
                "{} lost unacked frame {frame:?}; drained {:?}",
                account.name(),
                client.received
            );
        }
        self.disconnect(0).await;
    }
}

impl Model {
    fn target(&self, target: Target) -> String {
        match target {
            Target::Account(account) => account.name().to_owned(),
            Target::Address(key) => self.keys[key.index()].address().to_string(),
            Target::UppercaseAddress(key) => self.keys[key.index()]
                .address()
                .to_string()
                .to_ascii_uppercase(),
            Target::Raw(text) => text,
        }
    }

    fn id(&mut self, spec: IdSpec) -> String {
        match spec {
            IdSpec::Again(back) if !self.ids.is_empty() => {
                let back = usize::from(back) % self.ids.len();
                self.ids[self.ids.len() - 1 - back].clone()
            }
            IdSpec::Fresh | IdSpec::Again(_) => {
                self.fresh += 1;
                format!("f{}", self.fresh)
            }
            IdSpec::Raw(id) => id,
        }
    }

    /// The DeclareAddress frame and whether its proof is valid for this connection.
    fn declaration(
        &self,
        key: usize,
        proof: ProofSpec,
        account: &str,
        challenge_b64: &str,
    ) -> (ClientFrame, bool) {
        let signer = &self.keys[key];
        let challenge = decode_challenge(challenge_b64).expect("the relay's challenge decodes");
        match proof {
            ProofSpec::Valid => (
                declare_address_frame(signer, Some(account), Some(challenge_b64))
                    .expect("a declaration"),
                true,
            ),
            ProofSpec::ForAccount(other) => (
                declare_address_frame(signer, Some(other.name()), Some(challenge_b64))
                    .expect("a declaration"),
                other.name() == account,
            ),
            ProofSpec::KeyOf(other) => {
                let other = other.index();
                let signing = &self.keys[other];
                let frame = ClientFrame::DeclareAddress {
                    address: signer.address().to_string(),
                    public_key: signing.public_key_base64(),
                    signature: signing.sign_base64(&relay_proof_payload(account, &challenge)),
                };
                (frame, other == key)
            }
            ProofSpec::Raw {
                public_key,
                signature,
            } => (
                ClientFrame::DeclareAddress {
                    address: signer.address().to_string(),
                    public_key,
                    signature,
                },
                false,
            ),
        }
    }

    fn group(&mut self, spec: GroupSpec) -> ClientFrame {
        let group_id = "g1".to_owned();
        match spec {
            GroupSpec::Create => ClientFrame::CreateGroup {
                group_id,
                name: "group".to_owned(),
            },
            GroupSpec::AddMember(account) => ClientFrame::AddGroupMember {
                group_id,
                username: account.name().to_owned(),
            },
            GroupSpec::RemoveMember(account) => ClientFrame::RemoveGroupMember {
                group_id,
                username: account.name().to_owned(),
            },
            GroupSpec::Leave => ClientFrame::LeaveGroup { group_id },
            GroupSpec::SendMessage(id) => ClientFrame::SendGroupMessage {
                group_id,
                content: "hello".to_owned(),
                message_id: self.id(id),
                reply_to_msg: None,
                forward_info: None,
            },
        }
    }

    /// Every delivery matches a send: same id, sender account, content and reply, to this
    /// account by name or through an address it proved, stamped with the sender's account or
    /// an address the sender proved.
    fn check_deliveries(&self) {
        for delivery in &self.deliveries {
            let to = ACCOUNTS[delivery.to];
            let sends = self
                .sent
                .get(&delivery.message_id)
                .map_or(&[][..], Vec::as_slice);
            let matches = |sent: &&Sent| {
                let from = ACCOUNTS[sent.from];
                sent.content == delivery.content
                    && sent.reply_to == delivery.reply_to
                    && delivery.sender_account.as_deref() == Some(from)
                    && (delivery.sender == from
                        || self.proved[sent.from].contains(&delivery.sender))
                    && (sent.recipient == to || self.proved[delivery.to].contains(&sent.recipient))
            };
            assert!(
                sends.iter().any(|s| matches(&s)),
                "{to} received {delivery:?}, which no send matches: {sends:?}"
            );
        }
        for delivery in &self.group_deliveries {
            let sends = self
                .group_sent
                .get(&delivery.message_id)
                .map_or(&[][..], Vec::as_slice);
            let matches = |sent: &&GroupSent| {
                sent.group_id == delivery.group_id
                    && sent.content == delivery.content
                    && sent.reply_to == delivery.reply_to
                    && (delivery.sender == ACCOUNTS[sent.from]
                        || self.proved[sent.from].contains(&delivery.sender))
            };
            assert!(
                sends.iter().any(|s| matches(&s)),
                "{} received {delivery:?}, which no broadcast matches: {sends:?}",
                ACCOUNTS[delivery.to]
            );
        }
    }
}

fn decode(text: &str) -> RelayFrame {
    RelayFrame::decode(text).unwrap_or_else(|e| panic!("the relay sent {text:?}: {e}"))
}

impl Client {
    /// A journal frame (direct or group copy) written to this connection.
    fn inbound(&mut self, model: &mut Model, seq: Option<u64>, message_id: &str) {
        let account = ACCOUNTS[self.account];
        assert_eq!(
            seq.is_some(),
            model.mailbox && self.opted_in,
            "seq on a frame to {account}"
        );
        if let Some(seq) = seq {
            let last = self.seqs.last().copied().unwrap_or(0);
            assert!(seq > last, "{account}: seq {seq} after {last}");
            self.seqs.push(seq);
            self.received.push((seq, message_id.to_owned()));
            let seen = model.journals[self.account]
                .seen
                .entry(seq)
                .or_insert_with(|| message_id.to_owned());
            assert_eq!(*seen, message_id, "{account}: seq {seq} names two frames");
        }
        if !self.drain_complete {
            self.drained += 1;
        }
    }

    fn seq(&self, spec: SeqSpec) -> u64 {
        match spec {
            SeqSpec::Received(back) if !self.seqs.is_empty() => {
                let back = usize::from(back) % self.seqs.len();
                self.seqs[self.seqs.len() - 1 - back]
            }
            SeqSpec::Received(_) => 1,
            SeqSpec::Raw(seq) => seq,
        }
    }

    /// Records what the relay will make of a frame this connection sent.
    fn sent(&mut self, model: &mut Model, frame: &ClientFrame, proof_valid: bool) {
        let journal = &mut model.journals[self.account];
        match frame {
            ClientFrame::SendMessage {
                recipient,
                content,
                message_id,
                reply_to_msg,
            } => {
                model.ids.push(message_id.clone());
                model
                    .sent
                    .entry(message_id.clone())
                    .or_default()
                    .push(Sent {
                        from: self.account,
                        recipient: recipient.clone(),
                        content: content.clone(),
                        reply_to: reply_to_msg.clone(),
                    });
                self.echoable.insert(message_id.clone());
                self.recipients
                    .entry(message_id.clone())
                    .or_default()
                    .push(recipient.clone());
                if identifier_size_ok(message_id) {
                    *self.owed.entry(message_id.clone()).or_default() += 1;
                }
            }
            ClientFrame::SendGroupMessage {
                group_id,
                content,
                message_id,
                reply_to_msg,
                ..
            } => {
                self.echoable.insert(message_id.clone());
                self.groups.insert(group_id.clone());
                model
                    .group_sent
                    .entry(message_id.clone())
                    .or_default()
                    .push(GroupSent {
                        from: self.account,
                        group_id: group_id.clone(),
                        content: content.clone(),
                        reply_to: reply_to_msg.clone(),
                    });
                model.broadcasts[self.account].insert((group_id.clone(), message_id.clone()));
            }
            ClientFrame::CreateGroup { group_id, .. }
            | ClientFrame::AddGroupMember { group_id, .. }
            | ClientFrame::RemoveGroupMember { group_id, .. }
            | ClientFrame::LeaveGroup { group_id } => {
                self.groups.insert(group_id.clone());
            }
            ClientFrame::Ack { seq } => {
                journal.acked.insert(*seq);
            }
            ClientFrame::AckUpTo { seq } => journal.acked_up_to = journal.acked_up_to.max(*seq),
            ClientFrame::CheckPresence { username } => {
                self.asked.insert(username.clone());
            }
            ClientFrame::WatchPresence { users } => self.asked.extend(users.iter().cloned()),
            ClientFrame::DeclareAddress { address, .. } => {
                if self.declarations == 0 && proof_valid {
                    self.bindable = Some(address.clone());
                }
                if proof_valid {
                    model.proved[self.account].insert(address.clone());
                }
                self.declarations += 1;
            }
            ClientFrame::FetchKeyPackage { address } => {
                self.fetched.insert(*address);
            }
            ClientFrame::Authenticate { .. }
            | ClientFrame::PublishKeyPackages { .. }
            | ClientFrame::UnwatchPresence { .. } => {}
        }
    }

    /// Every SendMessage handled since the last sync was answered exactly once.
    fn settle(&mut self) {
        let owed = std::mem::take(&mut self.owed);
        let answered = std::mem::take(&mut self.answered);
        assert_eq!(
            answered, owed,
            "SendMessage answers (by id) against those owed"
        );
    }

    fn answer(&mut self, message_id: &str) {
        *self.answered.entry(message_id.to_owned()).or_default() += 1;
    }

    fn check_echo(&self, message_id: Option<&str>) {
        if let Some(id) = message_id {
            assert!(
                self.echoable.contains(id),
                "echoed id {id:?} was never sent"
            );
        }
    }

    fn observe(&mut self, model: &mut Model, incoming: Incoming) {
        match incoming {
            Incoming::Text(text) => self.on_frame(model, decode(&text)),
            Incoming::Binary => panic!("the relay sent a binary message"),
            Incoming::Ended(ending) => self.on_end(model, ending),
        }
    }

    fn displaced(&self, model: &Model) -> bool {
        model.connects[self.account] > self.generation
    }

    fn on_end(&mut self, model: &Model, ending: Ending) {
        let allowed = self.closing
            || match ending {
                Ending::Close(Some(close::SUPERSEDED)) => self.displaced(model),
                Ending::Close(Some(close::TOO_MANY_MALFORMED)) => {
                    self.malformed >= MAX_MALFORMED_FRAMES
                }
                Ending::Close(_) => false,
                Ending::Dropped => self.displaced(model) || self.malformed >= MAX_MALFORMED_FRAMES,
            };
        assert!(
            allowed,
            "{} connection ended {ending:?} after {} malformed frames",
            ACCOUNTS[self.account], self.malformed
        );
    }

    fn on_frame(&mut self, model: &mut Model, frame: RelayFrame) {
        let account = ACCOUNTS[self.account];
        match frame {
            RelayFrame::MessageSent {
                message_id,
                recipient,
                disposition,
                ..
            } => {
                let sent_to = self.recipients.get(&message_id);
                assert!(
                    sent_to.is_some_and(|r| r.contains(&recipient)),
                    "MessageSent {message_id:?} to {recipient:?} answers no SendMessage"
                );
                if !model.mailbox {
                    assert_eq!(disposition, Some(Disposition::Live));
                }
                assert!(disposition.is_some());
                self.answer(&message_id);
            }
            RelayFrame::DeliveryError {
                message_id,
                recipient,
                reason,
            } => {
                let message_id = message_id.expect("DeliveryError names the message");
                let sent_to = self.recipients.get(&message_id);
                assert!(
                    sent_to.is_some_and(|r| r.contains(&recipient)),
                    "DeliveryError {message_id:?} to {recipient:?} answers no SendMessage"
                );
                assert!(reason.starts_with(RECIPIENT_UNREACHABLE), "reason {reason}");
                self.answer(&message_id);
            }
            RelayFrame::Error {
                code,
                frame_type,
                message_id,
                ..
            } => {
                assert!(
                    ERROR_CODES.contains(&code.as_str()),
                    "Error {code} for {frame_type:?}"
                );
                if code == "address_required" {
                    assert_eq!(frame_type.as_deref(), Some("PublishKeyPackages"));
                    assert!(!self.address_declared, "{account} declared, yet refused");
                }
                self.check_echo(message_id.as_deref());
                if let (Some("SendMessage"), Some(id)) = (frame_type.as_deref(), &message_id) {
                    self.answer(id);
                }
            }
            RelayFrame::RateLimited {
                retry_after_ms,
                frame_type,
                message_id,
                ..
            } => {
                assert!(retry_after_ms >= 1);
                self.check_echo(message_id.as_deref());
                if let (true, Some(id)) = (frame_type == "SendMessage", &message_id) {
                    self.answer(id);
                }
            }
            RelayFrame::MessageReceived {
                seq,
                sender,
                sender_account,
                content,
                message_id,
                reply_to_msg,
                ..
            } => {
                self.inbound(model, seq, &message_id);
                model.deliveries.push(Delivery {
                    to: self.account,
                    sender,
                    sender_account,
                    message_id,
                    content,
                    reply_to: reply_to_msg,
                });
            }
            RelayFrame::GroupMessageReceived {
                group_id,
                sender,
                content,
                message_id,
                seq,
                reply_to_msg,
                ..
            } => {
                self.inbound(model, seq, &message_id);
                model.group_deliveries.push(GroupDelivery {
                    to: self.account,
                    group_id,
                    sender,
                    message_id,
                    content,
                    reply_to: reply_to_msg,
                });
            }
            RelayFrame::GroupMessageSent {
                group_id,
                message_id,
                ..
            } => assert!(
                model.broadcasts[self.account].contains(&(group_id.clone(), message_id.clone())),
                "{account} was sent a report on {message_id:?} to {group_id:?}, never broadcast"
            ),
            RelayFrame::GroupCreated { group_id, .. }
            | RelayFrame::GroupMemberAdded { group_id, .. }
            | RelayFrame::GroupMemberRemoved { group_id, .. } => assert!(
                self.groups.contains(&group_id),
                "{account} was answered on group {group_id:?}, never named"
            ),
            RelayFrame::GroupError {
                reason,
                group_id,
                message_id,
            } => {
                assert!(
                    GROUP_REASONS.contains(&reason.as_str()),
                    "GroupError {reason}"
                );
                let group_id = group_id.expect("GroupError names the group");
                assert!(
                    self.groups.contains(&group_id),
                    "{account} was refused on group {group_id:?}, never named"
                );
                self.check_echo(message_id.as_deref());
            }
            RelayFrame::DrainComplete { count } => {
                assert!(model.mailbox && self.opted_in, "DrainComplete to {account}");
                assert!(!self.drain_complete, "a second DrainComplete to {account}");
                assert_eq!(count, self.drained, "DrainComplete count to {account}");
                self.drain_complete = true;
            }
            RelayFrame::PresenceStatus { user_id, .. } => assert!(
                self.asked.contains(&user_id),
                "presence of {user_id:?}, never asked"
            ),
            RelayFrame::AddressDeclared { address } => {
                assert!(!self.address_declared, "a second AddressDeclared");
                assert_eq!(
                    self.bindable.as_ref(),
                    Some(&address),
                    "{account} bound {address} without a valid first proof"
                );
                self.address_declared = true;
            }
            RelayFrame::AddressError { .. } => {}
            RelayFrame::KeyPackagesPublished { available, .. } => {
                assert!(self.address_declared, "{account} published undeclared");
                assert!(available <= 100, "{available} key packages held");
            }
            RelayFrame::KeyPackage { address, .. }
            | RelayFrame::KeyPackageUnavailable { address } => assert!(
                self.fetched.contains(&address),
                "{account} was sent a key package of {address}, never asked"
            ),
            RelayFrame::SessionSuperseded { .. } => assert!(
                self.displaced(model),
                "{account} displaced by no later connection"
            ),
            other => panic!("{account} was sent {other:?}"),
        }
    }
}
