//! Carriers move frames between this device and peers. The engine decides what to send; a
//! carrier only writes, reads, and reports what happened.

pub mod answers;
pub mod backoff;
pub mod bucket;
pub mod gateway;
pub mod inbound;
pub mod intake;
pub mod presence;
pub mod relay;
pub mod release;
pub mod report;
pub mod tls;

/// An end-to-end frame the driver hands to an addressed carrier (the relay, a gateway), which
/// routes it by the message's recipient.
#[derive(Debug)]
pub enum Submit {
    /// An outbox entry's send; `Written`, `SendFailed` and the carrier's answer quote `send_seq`.
    Outbox {
        id: String,
        send_seq: u64,
        recipient: String,
        frame: String,
    },
    /// An end-to-end ACK (a `SendMessage` nobody waits for).
    Ack { frame: String },
}
