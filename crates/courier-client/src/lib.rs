//! The offline-courier runtime: one driver thread owns the engine and the SQLite store, a tokio
//! runtime moves bytes for the carriers, and the application talks to it through a `Client`.

pub mod app;
pub mod backlog;
pub mod carrier;
pub mod client;
pub mod config;
pub mod driver;
pub mod error;
pub mod event;
pub mod ledger;
pub mod media_send;
pub mod send;
pub mod store;
