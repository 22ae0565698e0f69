//! Shared vocabulary of offline-courier (`docs/protocol.md`): the relay wire frames
//! (`docs/protocol.md#frame-reference`), the end-to-end `Message`
//! (`docs/protocol.md#end-to-end-message`) with its rich parts (`docs/protocol.md#rich-messages`),
//! identifier rules (`docs/protocol.md#identifiers`), the
//! protocol's fixed limits, the key packages of the relay's directory
//! (`docs/protocol.md#key-package-directory`), and the identity layer: the Ed25519 identity key,
//! `off1` addresses, canonical signing payloads, control-frame signatures and the relay and
//! gateway address proofs.
//!
//! This crate does no I/O. Everything that arrives from the network is decoded here first, so
//! every bound on untrusted input is checked in one place and decoding never panics.

pub mod address;
pub mod connection;
pub mod control;
pub mod display_name;
mod encoding;
pub mod frame;
pub mod ident;
pub mod identity_key;
pub mod key_package;
pub mod limits;
pub mod lines;
pub mod media;
pub mod message;
pub mod proof;
pub mod quote;
pub mod rich;
pub mod sealed;
pub mod security;
pub mod signing;
pub mod unreachable;
pub mod wire_id;

pub use address::{Address, AddressError};
pub use connection::{
    is_connection_request, ConnectionFrame, ConnectionFrameError, MAX_REQUEST_NOTE_BYTES,
};
pub use control::{
    control_frame, control_signature_expired, control_signed_at, control_v1_payload,
    control_v2_payload, is_signature_gated, sign_control, verify_control, ControlError,
    CONTROL_REPLAY_WINDOW_MS,
};
pub use display_name::{display_name, received_display_name, DisplayNameError};
pub use frame::{ClientFrame, DecodeError, Disposition, MailboxInfo, RateLimitInfo, RelayFrame};
pub use ident::{validate_account_name, validate_identifier, IdentError};
pub use identity_key::{
    decode_public_key, decode_signature, verify_strict, IdentityKey, KeyGenError,
};
pub use key_package::{KeyPackage, KeyPackageBatch, KeyPackageError};
pub use media::{
    file_chunk_id, Chunk, ChunkError, ChunkHeader, FileAction, FileControl, FileDetails,
};
pub use message::{ContentType, Message, MessageError, Priority};
pub use proof::{
    declare_address_after_auth, declare_address_frame, decode_challenge, gateway_declaration,
    gateway_proof_payload, relay_proof_payload, verify_declaration, verify_gateway_declaration,
    AddressDeclError, DeclareError, GatewayDeclaration,
};
pub use quote::quoted;
pub use rich::{ForwardInfo, Quote, Rich, RichError, RichParts};
pub use sealed::{
    envelope, group_envelope, group_payload, open_envelope, sealed_payload, GroupFrame,
    SealedError, SessionFrame, MLS_ENC_PREFIX, MLS_GROUP_PREFIX,
};
pub use signing::{payload, DOMAINS};
pub use unreachable::UnreachableCause;
pub use wire_id::{ack_id, group_copy_id, is_wire_id, wire_id};
