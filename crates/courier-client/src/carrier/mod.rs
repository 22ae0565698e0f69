//! Carriers move frames between this device and peers. The engine decides what to send; a
//! carrier only writes, reads, and reports what happened.

pub mod bucket;
pub mod presence;
pub mod relay;
pub mod release;
pub mod tls;
