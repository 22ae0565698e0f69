//! Sans-IO delivery engine of offline-courier.
//!
//! Inputs are `handle_*` calls that each carry `now`; outputs are polled as data
//! (`poll_transmit`, `poll_event`, `poll_store`) and `next_deadline` says when the engine next
//! needs `handle_timeout`. It never reads a clock, spawns, sleeps or touches storage or sockets.

pub mod config;
pub mod event;
pub mod io;

pub use config::Config;
pub use event::{DiagnosticLevel, Event};
pub use io::*;
