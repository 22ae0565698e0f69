//! Sans-IO delivery engine of offline-courier.
//!
//! One door in: every input is a value of [`Input`] (an app send, a carrier's report, a frame,
//! the clock) handed to [`Engine::handle`] with `now`. Outputs are polled as data:
//! [`Engine::poll_store`], [`Engine::poll_event`], [`Engine::poll_transmit`],
//! [`Engine::poll_event_after_transmits`], [`Engine::poll_hook`], [`Engine::poll_presence`], and
//! [`Engine::next_deadline`] says when `Input::Timeout` is next needed. The engine never reads a
//! clock, spawns, sleeps or touches storage or sockets. The order in which a runtime drains the
//! outputs is a correctness property, so it is written once, in [`step`], and every runtime
//! (the client driver, the simulator) runs that code (`docs/architecture.md#the-step`). The
//! durability hook's pipeline is described in the `hook` module: buffering, drain batches,
//! refusals, redelivery, retention, bounds. Terms are those of `docs/glossary.md`; the rules are
//! explained in `docs/delivery.md`.
//!
//! # Life of an outbox entry
//!
//! An accepted message is an entry in one of four phases: *queued* in the retry queue (with a
//! due time and a lifetime expiry), *handed* to a carrier (the runtime owes a `written` or
//! `send_failed` report for that `send_seq`), *awaiting its ACK* (written; ACK deadline armed),
//! or *resting* (parked and quiet under `edgeDrivenUnreachableDm`; only its lifetime runs).
//! Three mechanisms move it:
//!
//! - the **transport retry queue**: no route, or a failed send → `message_deferred`, backoff
//!   `backoff_ms(transport_retries)`, no attempt limit;
//! - the **ACK ladder**: a written frame whose ACK does not come within `ack_timeout_ms` →
//!   `message_retrying` at `now + backoff_ms(retry)`, or `message_failed("Max retries exceeded")`
//!   once `max_retries` retries were granted — unless the recipient holds a verdict (an unreachable
//!   verdict since its last edge), in which case it re-parks;
//! - **parking** (`parking` module): the relay's unreachable verdict for the entry's current
//!   attempt (`message_undeliverable`) or its custody ("stored", `message_stored`) takes the entry
//!   off the ladder. It is probed at 15 s doubling to 600 s per recipient, offered to every
//!   current neighbor on each park and probe, re-driven with a fresh ACK budget on every
//!   reachability edge, and ended only by its ACK or its lifetime (the sliding window keeps
//!   being refreshed by probes, so the absolute cap is what ends it). Media chunks are not
//!   parked: they keep their pending ACK and are offered to neighbors.
//!
//! Carrier choice, offers and the carry-forward rule are described in `engine::routing`, edges
//! in `engine::phases`, the watchlist rules in `presence`.
//!
//! # Counters in events
//!
//! - `message_sent.attempt` = `ack_attempts + 1`: the ladder attempt the write belongs to.
//! - `message_retrying.retry_count` = the retry being scheduled, counted from 0 ("Retry 0:
//!   1s"): `next_retry_at = now + backoff_ms(retry_count)`. Afterwards
//!   `ack_attempts = retry_count + 1`.
//! - `message_deferred.retry_count` = transport failures before this one since the relay last
//!   accepted or answered the frame (0 at accept); when a timer is set,
//!   `next_retry_at = now + backoff_ms(retry_count)`. It is `None` when the entry waits for an
//!   edge instead (no route, or every in-flight slot taken).
//! - `message_failed.retry_count` = `ack_attempts`, the ACK retries granted (`max_retries` for
//!   "Max retries exceeded").
//!
//! # Invariants (checked by the simulator in `src/tests`)
//!
//! 1. Every accepted message ends in exactly one terminal event, `message_delivered` or
//!    `message_failed`, each paired with one `StoreOp::Settle`. Settling removes the entry, so
//!    no later report, ACK or timer can produce a second one.
//! 2. Nothing is stranded: every live entry is queued, handed, awaiting its ACK or resting, and
//!    its timers are indexed exactly as its phase says. A queued entry is only without an
//!    effective timer while it has no route (no relay, recipient not a neighbor) or every
//!    in-flight slot is taken; the carrier, neighbor or slot-freeing input is what moves it.
//! 3. At most `max_pending_acks` entries are handed or awaiting an ACK; the rest wait, never
//!    dropped.
//! 4. Only the ACK timeout of a ladder attempt spends the ACK budget. `ack_attempts` is
//!    persisted; timed probes carry it forward, and only a reachability edge re-driving a
//!    parked entry resets it (a fresh budget). Every write, whatever caused the send,
//!    arms a fresh ACK timer.
//! 5. An ACK settles an entry only when the connection that carried it is the entry's recipient
//!    (over a local carrier: the peer id) and the ACK claims to come from it too. A neighbor
//!    that carried a copy settles nothing.
//! 6. No entry outlives `created_at + 4 × outbox_max_lifetime_ms`, across restarts. The sliding
//!    lifetime only fires while no ACK is pending; with one pending, the ACK timeout decides.
//! 7. After every call, the latest `StoreOp::Put` of each live entry equals its current ladder
//!    state (one Put per changed entry per call).
//! 8. An inbound message reaches the application at most once per `(chat, sender, id)` within
//!    the dedup retention; its end-to-end ACK and relay frame release follow its processing. With a
//!    durability hook "reaches the application" means the hook's commit: a message is offered
//!    at least once and committed (`StoreOp::CommitInbound`) at most once.
//! 9. Time is an input: the same inputs give the same outputs.
//! 10. No parked entry is without a probe timer, except one *resting* under
//!     `edgeDrivenUnreachableDm` after its bounded timed probes in the current park episode,
//!     which waits for a reachability edge with only its lifetime running. A parked entry never
//!     fails by ACK exhaustion: only its lifetime (or capacity eviction) settles it as failed.
//! 11. `next_deadline` reports only due work: an idle engine holding N parked messages wakes
//!     for their due probes (and expiries), nothing periodic.
//! 12. The presence watchlist is exactly the recipients with parked entries or a verdict since
//!     their last edge; `poll_presence` reports each entry into it and exit from it once (a
//!     `Watch` never follows a `Watch` for the same peer, nor an `Unwatch` an `Unwatch`).
//! 13. Every frame on a local carrier goes to a current neighbor of that carrier.
//! 14. With a durability hook, a new inbound message is written (`StoreOp::BufferInbound`) in
//!     the call that received it, so before the hook can see it; the engine's buffered rows are
//!     exactly the store's after every call. At most one batch is with the hook; no batch
//!     exceeds `batch_max_messages`, nor `batch_max_bytes` unless it is one message. No relay
//!     frame release of a frame that carried a buffered message, and no end-to-end ACK of it, precedes
//!     its `CommitInbound` (a frame release may follow an `ExpireInbound`: a drop). A buffered row
//!     leaves only by the hook's commit or by retention with a diagnostic and a
//!     `security_warning`; every row has a retention deadline or is with the hook.
//! 15. The drain's batches reach the hook in arrival order and before any message that arrived
//!     after `DrainComplete`; `inbound_drain_completed` follows the commit of the last message
//!     that arrived during the drain.

mod ack;
pub mod config;
mod dedup;
mod engine;
pub mod event;
mod group;
mod hook;
mod inbound;
pub mod input;
pub mod io;
mod neighbors;
mod outbox;
mod parking;
mod presence;
mod presession;
mod recent;
mod retry_queue;
mod sender_gate;
pub mod step;
mod timers;

#[cfg(test)]
mod tests;

pub use config::{Config, HookConfig};
pub use engine::Engine;
pub use event::{DiagnosticLevel, Event};
pub use input::{Input, Restore};
pub use io::*;
