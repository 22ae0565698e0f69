//! The fuzzer's input: a relay configuration and a bounded sequence of steps by up to three
//! client connections. Identities are chosen from small fixed sets so that steps keep
//! referring to each other (the same accounts, keys, message ids and seqs).

use arbitrary::Arbitrary;

pub const ACCOUNTS: [&str; 3] = ["alice", "bob", "carol"];
pub const SLOTS: usize = 3;
pub const KEYS: usize = 3;
/// Steps run per scenario; the rest of a longer input is ignored.
pub const MAX_STEPS: usize = 48;

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Account {
    Alice,
    Bob,
    Carol,
}

impl Account {
    pub fn name(self) -> &'static str {
        ACCOUNTS[self as usize]
    }
}

/// One of the client connection slots.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct Slot(u8);

impl Slot {
    pub fn index(self) -> usize {
        usize::from(self.0) % SLOTS
    }
}

/// One of the identity keys the clients may declare.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct Key(u8);

impl Key {
    pub fn index(self) -> usize {
        usize::from(self.0) % KEYS
    }
}

#[derive(Arbitrary, Debug)]
pub struct Scenario {
    /// `None` runs the relay without a mailbox.
    pub mailbox: Option<MailboxSpec>,
    /// A burst of 4 at 1 frame/s instead of the default bucket, so RateLimited is reachable.
    pub tight_rate: bool,
    pub steps: Vec<Step>,
}

/// Mailbox limits; 0 keeps the default, small values make `mailbox_full` reachable.
#[derive(Arbitrary, Debug)]
pub struct MailboxSpec {
    pub max_messages: u8,
    pub max_bytes: u16,
}

#[derive(Arbitrary, Debug)]
pub enum Step {
    /// Opens a connection in the slot (closing whatever the slot held) and authenticates.
    Connect {
        slot: Slot,
        account: Account,
        opt_in: bool,
        auth: AuthSpec,
    },
    Send {
        slot: Slot,
        frame: FrameSpec,
    },
    /// Waits until the relay has handled every frame the slot sent, and checks the answers.
    Sync {
        slot: Slot,
    },
    Disconnect {
        slot: Slot,
    },
}

#[derive(Arbitrary, Debug)]
pub enum AuthSpec {
    Valid,
    /// A well-formed token signed with another secret.
    WrongSecret,
    Token(String),
    /// Any first text frame instead of Authenticate.
    FirstFrame(String),
}

#[derive(Arbitrary, Debug)]
pub enum FrameSpec {
    SendMessage {
        to: Target,
        content: String,
        id: IdSpec,
        reply_to: Option<IdSpec>,
    },
    Ack(SeqSpec),
    AckUpTo(SeqSpec),
    CheckPresence(Target),
    WatchPresence(Vec<Target>),
    UnwatchPresence(Vec<Target>),
    DeclareAddress {
        key: Key,
        proof: ProofSpec,
    },
    Authenticate,
    Group(GroupSpec),
    /// Any text; it is handled like the frame it decodes to, if any.
    Text(String),
    Binary(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
pub enum Target {
    Account(Account),
    Address(Key),
    /// The all-uppercase spelling of a key's address, which names no one.
    UppercaseAddress(Key),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
pub enum IdSpec {
    /// An id no earlier step used.
    Fresh,
    /// The id of an earlier SendMessage (counted back from the latest).
    Again(u8),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
pub enum SeqSpec {
    /// A seq this connection received (counted back from the latest).
    Received(u8),
    Raw(u64),
}

#[derive(Arbitrary, Debug)]
pub enum ProofSpec {
    /// A correct proof over this connection's account and challenge.
    Valid,
    /// Signed over another account name (valid only when it is this connection's).
    ForAccount(Account),
    /// The address of one key with the public key and signature of another.
    KeyOf(Key),
    Raw {
        public_key: String,
        signature: String,
    },
}

#[derive(Arbitrary, Debug)]
pub enum GroupSpec {
    Create,
    AddMember(Account),
    RemoveMember(Account),
    Leave,
    SendMessage(IdSpec),
}
