//! Shared vocabulary of offline-courier: the relay wire frames (`relay-protocol.md` §14.1), the
//! end-to-end `Message` (§9), identifier rules (§5) and the protocol's fixed limits.
//!
//! This crate does no I/O. Everything that arrives from the network is decoded here first, so
//! every bound on untrusted input is checked in one place and decoding never panics.

pub mod frame;
pub mod ident;
pub mod limits;
pub mod message;

pub use frame::{ClientFrame, DecodeError, Disposition, MailboxInfo, RateLimitInfo, RelayFrame};
pub use ident::{validate_account_name, validate_identifier, IdentError};
pub use message::{ContentType, Message, MessageError, Priority};
