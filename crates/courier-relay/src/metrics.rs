//! What the relay counts, for `/metrics` (`docs/operating-the-relay.md#metrics`). Counters are
//! bumped where things happen, with atomics only (a labelled family adds the client crate's
//! read lock); figures the relay already keeps (connections per account, stored frames) are
//! read at scrape time instead of being counted twice. Label values come from fixed sets, never
//! from what a client sent, so no input can grow the number of series.

use courier_proto::{ClientFrame, DecodeError, RelayFrame, UnreachableCause};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry, Unit};

use crate::auth::AuthFailure;
use crate::connection::CloseReason;
use crate::fanout::Outcome;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FrameLabels {
    r#type: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CodeLabels {
    code: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// Counts of the accept loop, kept for the relay; the gateway daemon keeps them unregistered.
#[derive(Clone, Default)]
pub(crate) struct AcceptCounters {
    pub open: Gauge,
    pub accepted: Counter,
    pub refused: Counter,
}

/// Figures the relay keeps anyway, read when `/metrics` is scraped.
pub(crate) struct Sampled {
    pub authenticated: u64,
    pub accounts: u64,
    pub journal_frames: u64,
    pub journal_bytes: u64,
    pub watches: u64,
}

/// A type a client named, as a label: itself when the protocol names it, else `unknown`.
fn client_frame_type(name: &str) -> &'static str {
    ClientFrame::TYPES
        .iter()
        .find(|known| **known == name)
        .copied()
        .unwrap_or("unknown")
}

/// Registers a new metric and returns the handle the relay counts with.
fn add<M: Metric + Clone + Default>(registry: &mut Registry, name: &str, help: &str) -> M {
    let metric = M::default();
    registry.register(name, help, metric.clone());
    metric
}

fn add_with_unit<M: Metric + Clone + Default>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    unit: Unit,
) -> M {
    let metric = M::default();
    registry.register_with_unit(name, help, unit, metric.clone());
    metric
}

pub(crate) struct Metrics {
    registry: Registry,
    pub accept: AcceptCounters,
    frames_received: Family<FrameLabels, Counter>,
    bytes_received: Family<FrameLabels, Counter>,
    frames_sent: Family<FrameLabels, Counter>,
    errors: Family<CodeLabels, Counter>,
    delivery_errors: Family<ReasonLabels, Counter>,
    auth_failures: Family<ReasonLabels, Counter>,
    closed: Family<ReasonLabels, Counter>,
    rate_limited: Family<FrameLabels, Counter>,
    group_members: Family<OutcomeLabels, Counter>,
    journal_appended_frames: Counter,
    journal_appended_bytes: Counter,
    pub commit_seconds: Histogram,
    drains: Counter,
    drained_frames: Counter,
    purged_frames: Counter,
    purge_failures: Counter,
    authenticated: Gauge,
    accounts: Gauge,
    journal_frames: Gauge,
    journal_bytes: Gauge,
    watches: Gauge,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("courier_relay");
        let r = &mut registry;
        r.register(
            "build",
            "The relay's version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        Self {
            accept: AcceptCounters {
                open: add(
                    r,
                    "connections",
                    "Client connections open now, authenticated or not",
                ),
                accepted: add(r, "connections_accepted", "Client connections accepted"),
                refused: add(
                    r,
                    "connections_refused",
                    "Client connections closed at accept because --max-connections were open",
                ),
            },
            closed: add(
                r,
                "connections_closed",
                "Client connections ended, by why they ended",
            ),
            authenticated: add(
                r,
                "authenticated_connections",
                "Authenticated connections now (at most one per account)",
            ),
            accounts: add(r, "accounts", "Accounts that ever authenticated"),
            auth_failures: add(
                r,
                "auth_failures",
                "Refused Authenticate attempts, by AuthError reason",
            ),
            frames_received: add(
                r,
                "frames_received",
                "Frames read from clients, by frame type",
            ),
            bytes_received: add_with_unit(
                r,
                "frames_received",
                "Bytes of the frames read from clients, by frame type",
                Unit::Bytes,
            ),
            frames_sent: add(r, "frames_sent", "Frames written to clients, by frame type"),
            errors: add(r, "errors", "Error frames sent, by code"),
            delivery_errors: add(
                r,
                "delivery_errors",
                "DeliveryError frames sent, by why the recipient is unreachable",
            ),
            rate_limited: add(
                r,
                "rate_limited_frames",
                "Frames answered RateLimited and dropped, by frame type",
            ),
            group_members: add(
                r,
                "group_fanout_members",
                "Members named in group reports, by what the report says of them",
            ),
            journal_frames: add(
                r,
                "journal_frames",
                "Frames in the journal, not yet acked or expired",
            ),
            journal_bytes: add_with_unit(
                r,
                "journal",
                "Content bytes of the frames in the journal",
                Unit::Bytes,
            ),
            journal_appended_frames: add(
                r,
                "journal_appended_frames",
                "Frames accepted into the journal",
            ),
            journal_appended_bytes: add_with_unit(
                r,
                "journal_appended",
                "Content bytes accepted into the journal",
                Unit::Bytes,
            ),
            commit_seconds: {
                // 0.5 ms to about 8 s.
                let histogram = Histogram::new(exponential_buckets(0.0005, 2.0, 15));
                r.register_with_unit(
                    "store_commit",
                    "Time from BEGIN to durable COMMIT of one batch of database writes",
                    Unit::Seconds,
                    histogram.clone(),
                );
                histogram
            },
            drains: add(
                r,
                "mailbox_drains",
                "Drains of stored frames completed on a new connection",
            ),
            drained_frames: add(
                r,
                "mailbox_drained_frames",
                "Stored frames written by drains",
            ),
            purged_frames: add(
                r,
                "purged_frames",
                "Frames deleted undelivered at the end of --mailbox-ttl-ms",
            ),
            purge_failures: add(r, "purge_failures", "Purges of expired frames that failed"),
            watches: add(
                r,
                "presence_watches",
                "Presence watches held, summed over connections",
            ),
            registry,
        }
    }

    /// A text message read from a client, as it decoded.
    /// A text frame of `bytes` bytes read from a client.
    pub fn received(&self, decoded: &Result<ClientFrame, DecodeError>, bytes: usize) {
        let r#type = match decoded {
            Ok(frame) => frame.type_name(),
            Err(DecodeError::UnknownType(_)) => "unknown",
            Err(DecodeError::Invalid { frame_type, .. }) => client_frame_type(frame_type),
            Err(DecodeError::Malformed) => "malformed",
        };
        self.count_received(r#type);
        self.bytes_received
            .get_or_create(&FrameLabels { r#type })
            .inc_by(bytes as u64);
    }

    /// A binary message read from a client: no frame at all.
    pub fn received_binary(&self) {
        self.count_received("malformed");
    }

    fn count_received(&self, r#type: &'static str) {
        self.frames_received
            .get_or_create(&FrameLabels { r#type })
            .inc();
    }

    pub fn sent(&self, frame: &RelayFrame) {
        self.frames_sent
            .get_or_create(&FrameLabels {
                r#type: frame.type_name(),
            })
            .inc();
        match frame {
            RelayFrame::Error { code, .. } => {
                self.errors
                    .get_or_create(&CodeLabels { code: code.clone() })
                    .inc();
            }
            RelayFrame::DeliveryError { reason, .. } => {
                let reason =
                    UnreachableCause::of_reason(reason).map_or("other", UnreachableCause::as_str);
                self.delivery_errors
                    .get_or_create(&ReasonLabels { reason })
                    .inc();
            }
            _ => {}
        }
    }

    pub fn auth_failed(&self, failure: AuthFailure) {
        self.auth_failures
            .get_or_create(&ReasonLabels {
                reason: failure.reason(),
            })
            .inc();
    }

    pub fn closed(&self, why: CloseReason) {
        self.closed
            .get_or_create(&ReasonLabels {
                reason: why.as_str(),
            })
            .inc();
    }

    pub fn rate_limited(&self, frame_type: &str) {
        self.rate_limited
            .get_or_create(&FrameLabels {
                r#type: client_frame_type(frame_type),
            })
            .inc();
    }

    /// One member of a group report (`docs/protocol.md#group-frames`).
    pub fn group_member(&self, outcome: Outcome) {
        self.group_members
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    pub fn appended(&self, content_bytes: usize) {
        self.journal_appended_frames.inc();
        self.journal_appended_bytes.inc_by(content_bytes as u64);
    }

    pub fn drained(&self, frames: u64) {
        self.drains.inc();
        self.drained_frames.inc_by(frames);
    }

    pub fn purged(&self, frames: u64) {
        self.purged_frames.inc_by(frames);
    }

    pub fn purge_failed(&self) {
        self.purge_failures.inc();
    }

    /// The exposition in the Prometheus text format, with the sampled figures as of now.
    pub fn encode(&self, now: Sampled) -> String {
        let gauge = |g: &Gauge, v: u64| g.set(i64::try_from(v).unwrap_or(i64::MAX));
        gauge(&self.authenticated, now.authenticated);
        gauge(&self.accounts, now.accounts);
        gauge(&self.journal_frames, now.journal_frames);
        gauge(&self.journal_bytes, now.journal_bytes);
        gauge(&self.watches, now.watches);
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry);
        text
    }
}
