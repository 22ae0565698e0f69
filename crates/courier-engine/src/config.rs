//! Validated engine configuration. Parsing and validation of the user's JSON config (with
//! error paths) happen in `courier-client`; by the time a `Config` exists it is sound.

/// Delivery settings; the defaults are those of `docs/delivery.md#defaults`.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `appId`: namespace of this app's messages (copied into every Message).
    pub app_id: String,
    /// ACK timeout, measured from the moment the carrier wrote the frame.
    pub ack_timeout_ms: u64,
    /// In-flight cap: beyond it, sends wait in the queue (never dropped).
    pub max_pending_acks: usize,
    /// ACK-retry budget before `message_failed`.
    pub max_retries: u32,
    pub initial_delay_ms: u64,
    pub max_delay_ms: u64,
    pub backoff_multiplier: f64,
    /// Sliding outbox lifetime; the absolute cap is 4× this from first acceptance.
    pub outbox_max_lifetime_ms: u64,
    /// How long an app carrier's `send` may take before the attempt counts as failed
    /// (`docs/delivery.md#app-carrier-send-deadline`).
    pub app_send_timeout_ms: u64,
    pub edge_driven_unreachable_dm: bool,
    /// Outbox capacity for regular messages (500) and media chunks (100).
    pub outbox_max_entries: usize,
    pub outbox_max_media_entries: usize,
    /// Messages sent per flush or timer batch (20).
    pub flush_batch: usize,
    /// Inbound dedup records kept (by count); retention is by time as well.
    pub dedup_max_entries: usize,
    /// Opt-in at-least-once inbound delivery (an inbound durability hook is registered):
    /// `None` keeps the default at-most-once path.
    pub durability_hook: Option<HookConfig>,
    /// Accept `offline-ctrl-v1` control signatures (no freshness proof); off by default
    /// (`docs/protocol.md#control-signatures`).
    pub accept_legacy_control_v1: bool,
    /// End-to-end sessions are required: a message to a recipient without one waits in the
    /// pre-session queue (`docs/delivery.md#pre-session-queue`) until the runtime reports it ready.
    pub encryption: bool,
    /// How long a message may wait there, from its acceptance (`pendingMessageMaxLifetimeMs`).
    pub pending_session_max_lifetime_ms: u64,
}

/// Batching and retry of the durability hook pipeline (`docs/delivery.md#durability-hook`).
#[derive(Debug, Clone, PartialEq)]
pub struct HookConfig {
    /// A drain batch is handed to the hook at the first of these (400 / 4 MiB / 3 s).
    pub batch_max_messages: usize,
    pub batch_max_bytes: usize,
    pub batch_max_age_ms: u64,
    /// A refused batch is offered again after this backoff (doubling to the ceiling).
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
    /// Buffered rows older than this are removed with a trace (`docs/delivery.md#retention`).
    pub retention_ms: u64,
    /// A batch the hook has not settled within this long counts as refused.
    pub timeout_ms: u64,
    /// Bound of the rows held in memory (10 000 messages / 64 MiB of content, the relay
    /// mailbox's own limits). Over it a new message is neither buffered nor acknowledged: the
    /// relay keeps it and redelivers it on the next connection.
    pub max_buffered_messages: usize,
    pub max_buffered_bytes: usize,
}

impl Default for HookConfig {
    fn default() -> Self {
        Self {
            batch_max_messages: 400,
            batch_max_bytes: 4 * 1024 * 1024,
            batch_max_age_ms: 3000,
            retry_initial_ms: 1000,
            retry_max_ms: 60_000,
            retention_ms: 7 * 24 * 3600 * 1000,
            timeout_ms: 30_000,
            max_buffered_messages: 10_000,
            max_buffered_bytes: 64 * 1024 * 1024,
        }
    }
}

impl Config {
    pub fn new(app_id: impl Into<String>) -> Self {
        Self {
            app_id: app_id.into(),
            ack_timeout_ms: 10_000,
            max_pending_acks: 1000,
            max_retries: 10,
            initial_delay_ms: 1000,
            max_delay_ms: 300_000,
            backoff_multiplier: 2.0,
            outbox_max_lifetime_ms: 604_800_000,
            app_send_timeout_ms: 15_000,
            edge_driven_unreachable_dm: false,
            outbox_max_entries: 500,
            outbox_max_media_entries: 100,
            flush_batch: 20,
            dedup_max_entries: 100_000,
            durability_hook: None,
            accept_legacy_control_v1: false,
            encryption: false,
            pending_session_max_lifetime_ms: 604_800_000,
        }
    }

    /// `initial × multiplier^retry`, computed in f64 and clamped to `max_delay_ms` before the
    /// integer cast, so it is total over every configuration (a non-finite intermediate
    /// collapses to the ceiling; the cast saturates).
    pub fn backoff_ms(&self, retry: u32) -> u64 {
        let raw = self.initial_delay_ms as f64 * self.backoff_multiplier.powf(f64::from(retry));
        let max = self.max_delay_ms as f64;
        if raw.is_finite() {
            raw.min(max) as u64
        } else {
            self.max_delay_ms
        }
    }

    /// The absolute cap on an entry's age: 4× the sliding lifetime.
    pub fn absolute_lifetime_ms(&self) -> u64 {
        self.outbox_max_lifetime_ms.saturating_mul(4)
    }

    /// How long the receiver remembers processed messages: at least the sender's absolute
    /// lifetime at the defaults (28 days), longer when this device's own lifetime is longer.
    pub fn dedup_retention_ms(&self) -> u64 {
        self.absolute_lifetime_ms().max(28 * 24 * 3600 * 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_ladder_is_1_2_4_to_300_seconds() {
        let c = Config::new("app");
        let ladder: Vec<u64> = (0..11).map(|r| c.backoff_ms(r) / 1000).collect();
        assert_eq!(ladder, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!((0..10).map(|r| c.backoff_ms(r)).sum::<u64>(), 811_000);
    }

    #[test]
    fn backoff_is_total() {
        let mut c = Config::new("app");
        c.backoff_multiplier = f64::MAX;
        assert_eq!(c.backoff_ms(u32::MAX), c.max_delay_ms);
        c.initial_delay_ms = u64::MAX;
        c.max_delay_ms = u64::MAX;
        c.backoff_multiplier = 1.0;
        assert_eq!(c.backoff_ms(3), u64::MAX);
    }

    #[test]
    fn dedup_outlives_the_senders_absolute_lifetime_and_never_drops_below_28_days() {
        const DAY: u64 = 24 * 3600 * 1000;
        let mut c = Config::new("app");
        assert_eq!(c.dedup_retention_ms(), 28 * DAY);
        c.outbox_max_lifetime_ms = DAY;
        assert_eq!(c.absolute_lifetime_ms(), 4 * DAY);
        assert_eq!(
            c.dedup_retention_ms(),
            28 * DAY,
            "a short lifetime keeps 28 days"
        );
        c.outbox_max_lifetime_ms = 10 * DAY;
        assert_eq!(c.dedup_retention_ms(), 40 * DAY, "a long one is outlived");
    }
}
