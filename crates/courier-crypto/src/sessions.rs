//! One MLS session per pair of devices (`docs/architecture.md#end-to-end-sessions`).
//!
//! Both members' credentials name their `off1` address and carry the Ed25519 identity key that
//! address derives from, so the MLS sender of a message *is* its address: a peer's key package,
//! a Welcome and every message are checked against that binding. Both sides may start a
//! session at once; the session whose creator has the lower address wins on both sides (the
//! other side's Welcome is ignored by the winner and replaces the loser's own group) — also once
//! the peer has used the winner's session: a Welcome of the loser's that arrives after that is a
//! stale one of a session its sender already gave up. (A device never starts again under the
//! same address with its sessions lost: its identity key and its session state are in the same
//! store.)

use std::collections::{BTreeMap, BTreeSet};

use courier_proto::{Address, IdentityKey};
use openmls::framing::errors::MessageDecryptionError;
use openmls::prelude::tls_codec::{Deserialize as _, Serialize as _};
use openmls::prelude::{
    BasicCredential, Capabilities, Ciphersuite, CredentialWithKey, ExtensionType, GroupId,
    KeyPackage, KeyPackageIn, MlsGroup, MlsGroupCreateConfig, MlsGroupJoinConfig, MlsMessageBodyIn,
    MlsMessageIn, ProcessMessageError, ProcessedMessageContent, ProtocolMessage, ProtocolVersion,
    SenderRatchetConfiguration, StagedWelcome, ValidationError,
};
use openmls_rust_crypto::RustCrypto;
use openmls_traits::signatures::{Signer, SignerError};
use openmls_traits::types::SignatureScheme;
use openmls_traits::OpenMlsProvider;
use serde::{Deserialize, Serialize};

use crate::groups::{is_chat_group, Groups};
use crate::store::{Change, RowKey, Store, StoreError};

/// X25519, AES-128-GCM, SHA-256, Ed25519: the suite whose signature scheme is the identity
/// key's own.
pub const CIPHERSUITE: Ciphersuite = Ciphersuite::MLS_128_DHKEMX25519_AES128GCM_SHA256_Ed25519;

/// The label of our own rows beside openmls's: which group is the session with a peer.
const SESSION: &str = "session";

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{what} does not decode: {detail}")]
    Malformed { what: &'static str, detail: String },
    #[error("the {what} is not bound to {peer}: its credential names another identity or key")]
    NotBound { what: &'static str, peer: Address },
    #[error("no session with {0}")]
    NoSession(Address),
    #[error("the message belongs to no current session with {0}")]
    UnknownGroup(Address),
    /// The key of the message is spent: this device opened it already (or skipped past it
    /// further than the ratchet keeps keys), so this copy is a replay.
    #[error("a copy of a message from {0} whose key is spent")]
    Spent(Address),
    #[error("MLS refused it: {0}")]
    Mls(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `message_decryption_failed` codes (`docs/delivery.md#sealed-messages`).
pub mod code {
    pub const NO_SESSION: &str = "NO_SESSION";
    pub const NOT_BOUND: &str = "NOT_BOUND";
    pub const MALFORMED: &str = "MALFORMED";
    pub const REFUSED: &str = "REFUSED";
    pub const ENCRYPTION_DISABLED: &str = "ENCRYPTION_DISABLED";
}

impl SessionError {
    /// The `message_decryption_failed` code of a copy that did not open for this reason.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NoSession(_) | Self::UnknownGroup(_) => code::NO_SESSION,
            Self::NotBound { .. } => code::NOT_BOUND,
            Self::Malformed { .. } => code::MALFORMED,
            Self::Mls(_) | Self::Store(_) | Self::Spent(_) => code::REFUSED,
        }
    }
}

fn mls(error: impl std::fmt::Display) -> SessionError {
    SessionError::Mls(error.to_string())
}

fn malformed(
    what: &'static str,
) -> impl FnOnce(openmls::prelude::tls_codec::Error) -> SessionError {
    move |e| SessionError::Malformed {
        what,
        detail: e.to_string(),
    }
}

/// What a Welcome did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    /// The session with the sender is now the one the Welcome created.
    Joined,
    /// This device's own session with the sender wins the tie (this device has the lower
    /// address): the Welcome is ignored, and the sender will join ours.
    KeptOurs,
    /// A repeat of the Welcome of the session this device already joined: nothing changes.
    Already,
}

/// How far a receiver's ratchet reaches. Back: a message not kept (refused, or over the hook's
/// buffer) opens again on redelivery even after this many later ones opened. Forward: messages
/// that never arrive (expired in a mailbox, failed by their sender) leave a gap of this many
/// generations before later ones stop opening.
pub(crate) fn ratchet() -> SenderRatchetConfiguration {
    SenderRatchetConfiguration::new(OUT_OF_ORDER_TOLERANCE, MAXIMUM_FORWARD_DISTANCE)
}
const OUT_OF_ORDER_TOLERANCE: u32 = 1_000;

/// Whether a secret-tree error says the message's key is gone (openmls does not export the
/// error's type, only its words): a replay of a message opened before.
pub(crate) fn spent(error: &impl std::fmt::Display) -> bool {
    matches!(
        error.to_string().as_str(),
        "Generation is too old to be processed."
            | "The requested secret was deleted to preserve forward secrecy."
    )
}
const MAXIMUM_FORWARD_DISTANCE: u32 = 100_000;

/// The identity key as openmls's signer: pure Ed25519 over what openmls asks to sign.
pub(crate) struct IdentitySigner(IdentityKey);

impl Signer for IdentitySigner {
    fn sign(&self, payload: &[u8]) -> Result<Vec<u8>, SignerError> {
        Ok(self.0.sign(payload).to_vec())
    }

    fn signature_scheme(&self) -> SignatureScheme {
        SignatureScheme::ED25519
    }
}

pub(crate) struct Provider {
    pub(crate) crypto: RustCrypto,
    pub(crate) store: Store,
}

impl OpenMlsProvider for Provider {
    type CryptoProvider = RustCrypto;
    type RandProvider = RustCrypto;
    type StorageProvider = Store;

    fn storage(&self) -> &Store {
        &self.store
    }

    fn crypto(&self) -> &RustCrypto {
        &self.crypto
    }

    fn rand(&self) -> &RustCrypto {
        &self.crypto
    }
}

/// Which group is the session with a peer, who created it, and whether the peer has sealed a
/// message in it (the tie-break only protects a session the peer has not used yet).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    group_id: Vec<u8>,
    creator: Address,
    used_by_peer: bool,
    /// The Welcome of a session this device started, kept until the peer has used the session:
    /// it goes ahead of every message until then, so that whichever copy arrives first lets the
    /// peer join.
    #[serde(default)]
    welcome: Option<Vec<u8>>,
}

struct Session {
    group: MlsGroup,
    record: Record,
}

/// The address a credential names, if it names one that its signature key derives.
pub(crate) fn bound_address(
    credential: &openmls::prelude::Credential,
    signature_key: &[u8],
) -> Option<Address> {
    let named = named(credential)?;
    let key: [u8; 32] = signature_key.try_into().ok()?;
    (Address::from_public_key(&key) == named).then_some(named)
}

/// The address a credential names, bound or not (a group checks each leaf's binding when it
/// enters the tree).
pub(crate) fn named(credential: &openmls::prelude::Credential) -> Option<Address> {
    let basic = BasicCredential::try_from(credential.clone()).ok()?;
    Address::parse(std::str::from_utf8(basic.identity()).ok()?).ok()
}

/// This device's MLS state: its sessions with peers, its chat groups and its unused key
/// packages.
///
/// Every change stays in memory until [`Sessions::commit`] hands it to the runtime to write, or
/// [`Sessions::rollback`] forgets it. A session operation that fails may leave part of its
/// changes: the caller rolls back the step it belonged to. (A chat group's operation that fails
/// changes nothing.)
pub struct Sessions {
    pub(crate) provider: Provider,
    pub(crate) signer: IdentitySigner,
    pub(crate) me: Address,
    pub(crate) credential: CredentialWithKey,
    sessions: BTreeMap<Address, Session>,
    /// Peers whose session changed in memory since the last commit (reloaded on rollback).
    touched: BTreeSet<Address>,
    /// This device's chat groups (`crate::groups`), in the same store.
    pub(crate) groups: Groups,
}

impl Sessions {
    /// The state of `identity`'s device as last committed (`rows` as [`Sessions::commit`] gave
    /// them, none on a first start).
    pub fn restore(
        identity: IdentityKey,
        rows: impl IntoIterator<Item = (RowKey, Vec<u8>)>,
    ) -> Result<Self, SessionError> {
        let me = identity.address();
        let credential = CredentialWithKey {
            credential: BasicCredential::new(me.to_string().into_bytes()).into(),
            signature_key: identity.public_key().to_vec().into(),
        };
        let mut sessions = Self {
            provider: Provider {
                crypto: RustCrypto::default(),
                store: Store::restore(rows),
            },
            signer: IdentitySigner(identity),
            me,
            credential,
            sessions: BTreeMap::new(),
            touched: BTreeSet::new(),
            groups: Groups::default(),
        };
        for (peer, record) in sessions.provider.store.all::<Address, Record>(SESSION)? {
            let session = sessions.load(&record)?;
            sessions.sessions.insert(peer, session);
        }
        sessions.load_groups()?;
        Ok(sessions)
    }

    fn load(&self, record: &Record) -> Result<Session, SessionError> {
        let group_id = GroupId::from_slice(&record.group_id);
        let group = MlsGroup::load(&self.provider.store, &group_id)?
            .ok_or_else(|| SessionError::Mls(format!("group {group_id:?} is not in storage")))?;
        Ok(Session {
            group,
            record: record.clone(),
        })
    }

    pub fn address(&self) -> Address {
        self.me
    }

    pub fn has_session(&self, peer: &Address) -> bool {
        self.sessions.contains_key(peer)
    }

    /// The Welcome to send ahead of a message to `peer`: this device started the session and
    /// the peer has not used it yet.
    pub fn welcome_for(&self, peer: &Address) -> Option<&[u8]> {
        self.sessions.get(peer)?.record.welcome.as_deref()
    }

    /// The peers this device has a session with.
    pub fn peers(&self) -> impl Iterator<Item = &Address> + '_ {
        self.sessions.keys()
    }

    /// A new key package of this device, for a peer to start a session with; its private half
    /// stays in the state until a Welcome uses it (a last-resort one stays after that too).
    pub fn key_package(&mut self, last_resort: bool) -> Result<Vec<u8>, SessionError> {
        let mut builder = KeyPackage::builder();
        if last_resort {
            // The leaf must claim the extension the package carries, or a group refuses it.
            let capabilities =
                Capabilities::new(None, None, Some(&[ExtensionType::LastResort]), None, None);
            builder = builder
                .mark_as_last_resort()
                .leaf_node_capabilities(capabilities);
        }
        let bundle = builder
            .build(
                CIPHERSUITE,
                &self.provider,
                &self.signer,
                self.credential.clone(),
            )
            .map_err(mls)?;
        bundle
            .key_package()
            .tls_serialize_detached()
            .map_err(malformed("key package"))
    }

    /// Starts a session with `peer` from one of its key packages; returns the Welcome for it.
    /// A session this device had with `peer` is replaced.
    pub fn start(&mut self, peer: Address, key_package: &[u8]) -> Result<Vec<u8>, SessionError> {
        let key_package = self.bound_key_package(peer, key_package)?;
        let config = MlsGroupCreateConfig::builder()
            .ciphersuite(CIPHERSUITE)
            .use_ratchet_tree_extension(true)
            .sender_ratchet_configuration(ratchet())
            .build();
        let mut group = MlsGroup::new(
            &self.provider,
            &self.signer,
            &config,
            self.credential.clone(),
        )
        .map_err(mls)?;
        let (_commit, welcome, _info) = group
            .add_members(&self.provider, &self.signer, &[key_package])
            .map_err(mls)?;
        group.merge_pending_commit(&self.provider).map_err(mls)?;
        let welcome = welcome
            .tls_serialize_detached()
            .map_err(malformed("welcome"))?;
        self.replace(peer, group, self.me, Some(welcome.clone()))?;
        Ok(welcome)
    }

    /// `peer`'s key package, valid and bound to `peer`.
    pub(crate) fn bound_key_package(
        &self,
        peer: Address,
        bytes: &[u8],
    ) -> Result<KeyPackage, SessionError> {
        let package = KeyPackageIn::tls_deserialize_exact(bytes)
            .map_err(malformed("key package"))?
            .validate(self.provider.crypto(), ProtocolVersion::Mls10)
            .map_err(mls)?;
        let leaf = package.leaf_node();
        if bound_address(leaf.credential(), leaf.signature_key().as_slice()) != Some(peer) {
            return Err(SessionError::NotBound {
                what: "key package",
                peer,
            });
        }
        Ok(package)
    }

    /// A Welcome from `from` (a verified control frame of that address).
    pub fn join(&mut self, from: Address, welcome: &[u8]) -> Result<Joined, SessionError> {
        if let Some(ours) = self.sessions.get(&from) {
            if ours.record.creator == self.me && self.me < from {
                return Ok(Joined::KeptOurs);
            }
        }
        let MlsMessageBodyIn::Welcome(welcome) = MlsMessageIn::tls_deserialize_exact(welcome)
            .map_err(malformed("welcome"))?
            .extract()
        else {
            return Err(SessionError::Malformed {
                what: "welcome",
                detail: "another kind of MLS message".into(),
            });
        };
        let config = MlsGroupJoinConfig::builder()
            .use_ratchet_tree_extension(true)
            .sender_ratchet_configuration(ratchet())
            .build();
        let ours = self.sessions.get(&from).map(|s| &s.record);
        let staged = match StagedWelcome::new_from_welcome(&self.provider, &config, welcome, None) {
            Ok(staged) => staged,
            // The Welcome's key package is spent: a repeat of the one this session came from.
            Err(_) if ours.is_some_and(|r| r.creator == from) => return Ok(Joined::Already),
            Err(e) => return Err(mls(e)),
        };
        if ours.is_some_and(|r| r.group_id == staged.group_context().group_id().as_slice()) {
            return Ok(Joined::Already);
        }
        // A chat group of two is not a session, whoever made it.
        if is_chat_group(staged.group_context().group_id()) {
            return Err(SessionError::NotBound {
                what: "welcome",
                peer: from,
            });
        }
        let members: Vec<_> = staged.members().collect();
        let sender = staged.welcome_sender().map_err(mls)?;
        let from_sender = bound_address(sender.credential(), sender.signature_key().as_slice());
        let others: Vec<_> = members
            .iter()
            .filter(|m| m.signature_key != self.credential.signature_key.as_slice())
            .collect();
        let bound = members.len() == 2
            && others.len() == 1
            && bound_address(&others[0].credential, &others[0].signature_key) == Some(from)
            && from_sender == Some(from);
        if !bound {
            return Err(SessionError::NotBound {
                what: "welcome",
                peer: from,
            });
        }
        let group = staged.into_group(&self.provider).map_err(mls)?;
        self.replace(from, group, from, None)?;
        Ok(Joined::Joined)
    }

    fn replace(
        &mut self,
        peer: Address,
        group: MlsGroup,
        creator: Address,
        welcome: Option<Vec<u8>>,
    ) -> Result<(), SessionError> {
        if let Some(mut old) = self.sessions.remove(&peer) {
            old.group.delete(&self.provider.store)?;
        }
        let record = Record {
            group_id: group.group_id().as_slice().to_vec(),
            creator,
            used_by_peer: false,
            welcome,
        };
        self.provider.store.put(SESSION, &peer, &record)?;
        self.sessions.insert(peer, Session { group, record });
        self.touched.insert(peer);
        Ok(())
    }

    /// `plaintext` sealed for `peer` in the current session with it. A failure changes nothing.
    pub fn seal(&mut self, peer: &Address, plaintext: &[u8]) -> Result<Vec<u8>, SessionError> {
        self.provider.store.savepoint();
        let sealed = self.seal_now(peer, plaintext);
        self.settle(peer, sealed.is_ok())?;
        sealed
    }

    fn seal_now(&mut self, peer: &Address, plaintext: &[u8]) -> Result<Vec<u8>, SessionError> {
        let session = self
            .sessions
            .get_mut(peer)
            .ok_or(SessionError::NoSession(*peer))?;
        self.touched.insert(*peer);
        let message = session
            .group
            .create_message(&self.provider, &self.signer, plaintext)
            .map_err(mls)?;
        message
            .tls_serialize_detached()
            .map_err(malformed("sealed message"))
    }

    /// Opens a message `from` sealed in the current session with it; the MLS sender must be
    /// `from` itself. A failure changes nothing.
    pub fn open(&mut self, from: &Address, sealed: &[u8]) -> Result<Vec<u8>, SessionError> {
        let mut opened = Vec::new();
        self.open_if(from, sealed, |plaintext| {
            opened = plaintext;
            true
        })?;
        Ok(opened)
    }

    /// Opens a message like [`Sessions::open`] and hands the plaintext to `keep`; when `keep`
    /// says it was not kept, the session is as if the message never came, so that a later copy
    /// opens again (a ratchet opens each ciphertext once). Returns what `keep` said.
    pub fn open_if(
        &mut self,
        from: &Address,
        sealed: &[u8],
        keep: impl FnOnce(Vec<u8>) -> bool,
    ) -> Result<bool, SessionError> {
        self.provider.store.savepoint();
        let kept = match self.open_now(from, sealed) {
            Ok(plaintext) => keep(plaintext),
            Err(e) => {
                self.settle(from, false)?;
                return Err(e);
            }
        };
        self.settle(from, kept)?;
        Ok(kept)
    }

    /// Ends the savepoint of an operation on the session with `peer`: kept, or undone in
    /// storage and in memory.
    fn settle(&mut self, peer: &Address, keep: bool) -> Result<(), SessionError> {
        if keep {
            self.provider.store.keep_savepoint();
            return Ok(());
        }
        self.provider.store.undo_savepoint();
        self.sessions.remove(peer);
        if let Some(record) = self.provider.store.get::<Record>(SESSION, peer)? {
            let session = self.load(&record)?;
            self.sessions.insert(*peer, session);
        }
        Ok(())
    }

    fn open_now(&mut self, from: &Address, sealed: &[u8]) -> Result<Vec<u8>, SessionError> {
        let message: ProtocolMessage = MlsMessageIn::tls_deserialize_exact(sealed)
            .map_err(malformed("sealed message"))?
            .try_into_protocol_message()
            .map_err(mls)?;
        let session = self
            .sessions
            .get_mut(from)
            .ok_or(SessionError::NoSession(*from))?;
        if message.group_id() != session.group.group_id() {
            return Err(SessionError::UnknownGroup(*from));
        }
        self.touched.insert(*from);
        let processed = session
            .group
            .process_message(&self.provider, message)
            .map_err(|e| match e {
                ProcessMessageError::ValidationError(ValidationError::UnableToDecrypt(
                    MessageDecryptionError::SecretTreeError(tree),
                )) if spent(&tree) => SessionError::Spent(*from),
                e => mls(e),
            })?;
        let sender_key = session
            .group
            .members()
            .find(|m| m.credential == *processed.credential())
            .map(|m| m.signature_key);
        let bound = sender_key
            .and_then(|key| bound_address(processed.credential(), &key))
            .is_some_and(|sender| sender == *from);
        if !bound {
            return Err(SessionError::NotBound {
                what: "message",
                peer: *from,
            });
        }
        let ProcessedMessageContent::ApplicationMessage(message) = processed.into_content() else {
            return Err(SessionError::Mls("not an application message".into()));
        };
        if !session.record.used_by_peer {
            session.record.used_by_peer = true;
            session.record.welcome = None;
            self.provider.store.put(SESSION, from, &session.record)?;
        }
        Ok(message.into_bytes())
    }

    /// Every row changed since the last commit, for the runtime to write in the transaction of
    /// the step that changed them; [`Sessions::committed`] once that transaction is durable, or
    /// [`Sessions::rollback`].
    pub fn changes(&self) -> Vec<Change> {
        self.provider.store.changes()
    }

    /// Every row changed since the last commit, for the runtime to write in the transaction of
    /// the step that changed them; from here on they are the committed state.
    pub fn commit(&mut self) -> Vec<Change> {
        let changes = self.changes();
        self.committed();
        changes
    }

    /// The transaction that wrote [`Sessions::changes`] is durable: they are the committed state.
    pub fn committed(&mut self) {
        self.touched.clear();
        self.groups.committed();
        self.provider.store.mark_committed();
    }

    /// Forgets every change since the last commit, in storage and in memory: a step whose
    /// effects were not kept leaves no trace in the ratchets either.
    pub fn rollback(&mut self) -> Result<(), SessionError> {
        self.provider.store.rollback();
        for peer in std::mem::take(&mut self.touched) {
            self.sessions.remove(&peer);
            if let Some(record) = self.provider.store.get::<Record>(SESSION, &peer)? {
                let session = self.load(&record)?;
                self.sessions.insert(peer, session);
            }
        }
        self.reload_touched_groups()
    }
}
