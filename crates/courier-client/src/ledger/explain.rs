//! `explainMessage`: a message's ledger (and its outbox row while it is live) read back as one
//! short sentence and the facts behind it (`docs/delivery.md#a-messages-life`).

use std::collections::BTreeSet;

use courier_engine::io::{EntryState, OutboxRecord};
use courier_engine::{Config, Millis};
use serde::Serialize;

use super::time::{day, span, when};
use super::{Direction, History, Kind};

/// What `explainMessage` answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    pub sentence: String,
    pub facts: Facts,
}

/// The structured facts of an explanation; times are epoch milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Facts {
    pub id: String,
    pub direction: Direction,
    pub peer: String,
    /// `queued`, `in_flight`, `parked`, `custody`, `awaiting_session`, `delivered`, `failed`
    /// (outbound); `buffered`, `received`, `expired`, `undecryptable` (inbound).
    pub state: &'static str,
    /// When the message entered `state`.
    pub since: Millis,
    pub first_at: Millis,
    pub last_at: Millis,
    /// Writes by a carrier, probes included.
    pub attempts: u32,
    pub probes: u32,
    pub redrives: u32,
    /// ACK timeouts that scheduled a retry.
    pub retries: u32,
    /// The carriers that wrote it (`internet` is the relay).
    pub carriers: Vec<String>,
    /// The relay held it in its mailbox at some point.
    pub custody: bool,
    /// The relay's last unreachable cause, while that park lasts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub park_cause: Option<String>,
    /// What re-drove it last, when something did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redriven_by: Option<String>,
    /// The next timed send (retry or probe), while it is live.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_at: Option<Millis>,
    /// When the outbox lifetime ends it at the latest, while it is live.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Millis>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The carrier its ACK (outbound) or the message itself (inbound) came over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carrier: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// Inbound: durability hook batches that refused it, and the last reason.
    pub hook_refusals: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hook_refusal: Option<String>,
    /// Inbound: it arrived sealed end to end (`received`), or sealed copies that did not open.
    pub encrypted: bool,
    pub decryption_failures: u32,
    /// Entries dropped between the first and the kept tail (`ledger::PER_MESSAGE`).
    pub dropped: u64,
}

/// Explains `history`; `live` is its outbox row while it has one, `now` anchors the words.
pub fn explain(
    history: &History,
    live: Option<&OutboxRecord>,
    config: &Config,
    now: Millis,
) -> Explanation {
    let mut facts = tally(history);
    let sentence = match history.direction {
        Direction::Outbound => outbound(history, live, config, now, &mut facts),
        Direction::Inbound => inbound(history, now, &mut facts),
    };
    Explanation { sentence, facts }
}

fn tally(history: &History) -> Facts {
    let first_at = history.entries.first().map_or(0, |(_, at, _)| *at);
    let last_at = history.entries.last().map_or(0, |(_, at, _)| *at);
    let mut facts = Facts {
        id: history.message_id.clone(),
        direction: history.direction,
        peer: history.peer.clone(),
        state: "queued",
        since: first_at,
        first_at,
        last_at,
        attempts: 0,
        probes: 0,
        redrives: 0,
        retries: 0,
        carriers: Vec::new(),
        custody: false,
        park_cause: None,
        redriven_by: None,
        next_at: None,
        expires_at: None,
        reason: None,
        carrier: None,
        latency_ms: None,
        hook_refusals: 0,
        hook_refusal: None,
        encrypted: false,
        decryption_failures: 0,
        dropped: history.kept.saturating_sub(history.entries.len() as u64),
    };
    let mut carriers = BTreeSet::new();
    for (_, _, kind) in &history.entries {
        match kind {
            Kind::Attempt { carrier, probe, .. } => {
                facts.attempts += 1;
                facts.probes += u32::from(*probe);
                carriers.insert(carrier.clone());
            }
            Kind::Redriven { trigger } => {
                facts.redrives += 1;
                facts.redriven_by = Some(trigger.clone());
                facts.park_cause = None;
            }
            Kind::Retrying { .. } => facts.retries += 1,
            Kind::Custody { .. } => facts.custody = true,
            Kind::Parked { cause, .. } => facts.park_cause = Some(cause.clone()),
            Kind::HookRefused { reason, .. } => {
                facts.hook_refusals += 1;
                facts.hook_refusal = Some(reason.clone());
            }
            Kind::DecryptionFailed { .. } => facts.decryption_failures += 1,
            _ => {}
        }
    }
    facts.carriers = carriers.into_iter().collect();
    facts
}

/// The latest park still in force, since when, and the relay's cause (`None`: custody): none
/// after a live answer or a re-drive.
fn current_park(history: &History) -> Option<(Millis, Option<&str>)> {
    for (_, at, kind) in history.entries.iter().rev() {
        match kind {
            Kind::Parked { cause, .. } => return Some((*at, Some(cause))),
            Kind::Custody { .. } => return Some((*at, None)),
            Kind::Redriven { .. } | Kind::Accepted => return None,
            Kind::Answer { disposition, .. } if disposition == "live" => return None,
            _ => {}
        }
    }
    None
}

/// When the outbox lifetime ends the entry at the latest: the absolute cap for a parked entry
/// (its probes keep refreshing the sliding window), else the earlier of the two
/// (`docs/delivery.md#lifetimes`).
fn expires_at(record: &OutboxRecord, config: &Config) -> Millis {
    let cap = record
        .created_at
        .saturating_add(config.absolute_lifetime_ms());
    if record.state == EntryState::Parked {
        return cap;
    }
    cap.min(
        record
            .window_start
            .saturating_add(config.outbox_max_lifetime_ms),
    )
}

fn outbound(
    history: &History,
    live: Option<&OutboxRecord>,
    config: &Config,
    now: Millis,
    facts: &mut Facts,
) -> String {
    let peer = &history.peer;
    let tried = attempts_phrase(facts);
    let mut custody_from = None;
    let mut parked_from = None;
    for (_, at, kind) in &history.entries {
        match kind {
            Kind::Custody { .. } => {
                custody_from.get_or_insert(*at);
            }
            Kind::Parked { .. } => {
                parked_from.get_or_insert(*at);
            }
            _ => {}
        }
    }
    let Some(record) = live else {
        return settled(history, now, facts, &tried, custody_from, parked_from);
    };
    facts.next_at = record.next_at;
    let expires = expires_at(record, config);
    facts.expires_at = Some(expires);
    let lifetime = format!("will fail at the outbox lifetime on {}", day(expires));
    let next = |what: &str| {
        record
            .next_at
            .map(|at| format!("; next {what} {}", when(at, now)))
            .unwrap_or_default()
    };
    if record.state == EntryState::AwaitingSession {
        facts.state = "awaiting_session";
        return format!(
            "waiting since {} for an end-to-end session with {peer}; {lifetime}",
            when(facts.first_at, now)
        );
    }
    if let Some((at, cause)) = current_park(history) {
        facts.since = at;
        let lead = match cause {
            None => {
                facts.state = "custody";
                format!(
                    "held by the relay since {} (custody, not delivery): {peer} has not \
                     acknowledged it yet",
                    when(at, now)
                )
            }
            Some(cause) => {
                facts.state = "parked";
                format!(
                    "parked since {}: the relay says {}",
                    when(at, now),
                    cause_phrase(cause, peer)
                )
            }
        };
        return format!("{lead}; {tried}{}; {lifetime}", next("probe"));
    }
    let (at, kind) = history
        .entries
        .iter()
        .rev()
        .find(|(_, _, k)| {
            matches!(
                k,
                Kind::Attempt { .. } | Kind::Deferred { .. } | Kind::Retrying { .. }
            )
        })
        .map(|(_, at, k)| (*at, Some(k)))
        .unwrap_or((facts.first_at, None));
    facts.since = at;
    match (record.state, kind) {
        (EntryState::InFlight, Some(Kind::Attempt { carrier, .. })) => {
            facts.state = "in_flight";
            format!(
                "written to {} at {}, awaiting {peer}'s acknowledgement; {tried}; {lifetime}",
                carrier_phrase(carrier),
                when(at, now)
            )
        }
        (_, Some(Kind::Retrying { ladder_step, .. })) => {
            facts.state = "queued";
            format!(
                "no acknowledgement from {peer} in time, retry {} of the ladder{}; {tried}; \
                 {lifetime}",
                ladder_step + 1,
                next("retry")
            )
        }
        (_, Some(Kind::Deferred { reason, .. })) => {
            facts.state = "queued";
            format!(
                "waiting for a carrier since {}: {reason}{}; {tried}; {lifetime}",
                when(at, now),
                next("retry")
            )
        }
        (state, _) => {
            facts.state = if state == EntryState::InFlight {
                "in_flight"
            } else {
                "queued"
            };
            format!(
                "accepted at {}, handed to a carrier; {tried}; {lifetime}",
                when(facts.first_at, now)
            )
        }
    }
}

fn settled(
    history: &History,
    now: Millis,
    facts: &mut Facts,
    tried: &str,
    custody_from: Option<Millis>,
    parked_from: Option<Millis>,
) -> String {
    let peer = &history.peer;
    let end = history
        .entries
        .iter()
        .rev()
        .find_map(|(_, at, kind)| match kind {
            Kind::Delivered { .. } | Kind::Failed { .. } => Some((*at, kind)),
            _ => None,
        });
    match end {
        Some((
            at,
            Kind::Delivered {
                carrier,
                from,
                latency_ms,
            },
        )) => {
            facts.state = "delivered";
            facts.since = at;
            facts.carrier = Some(carrier.clone());
            facts.latency_ms = Some(*latency_ms);
            let mut route = String::new();
            if let Some(from_at) = custody_from {
                route = format!(", after the relay held it from {}", when(from_at, now));
            } else if let Some(from_at) = parked_from {
                route = format!(", after it was parked at {}", when(from_at, now));
            }
            if let Some(trigger) = &facts.redriven_by {
                route.push_str(&format!(" and re-driven when {trigger}"));
            }
            format!(
                "delivered at {}: acknowledged by {from} over {}{route}; {tried}; {} after it \
                 was accepted",
                when(at, now),
                carrier_phrase(carrier),
                span(*latency_ms)
            )
        }
        Some((at, Kind::Failed { reason, .. })) => {
            facts.state = "failed";
            facts.since = at;
            facts.reason = Some(reason.clone());
            let why = match reason.as_str() {
                "Max retries exceeded" => format!(
                    "{peer} never acknowledged it and the ACK retries ran out (max retries \
                     exceeded)"
                ),
                "Outbox lifetime exceeded" => format!(
                    "the outbox lifetime ran out before {peer} acknowledged it (outbox \
                     lifetime exceeded)"
                ),
                "Outbox capacity exceeded" => "evicted to make room in a full outbox (outbox \
                     capacity exceeded)"
                    .to_owned(),
                other => other.to_lowercase(),
            };
            let parked = facts
                .park_cause
                .as_deref()
                .map(|cause| {
                    format!(
                        "; it was parked: the relay said {}",
                        cause_phrase(cause, peer)
                    )
                })
                .unwrap_or_default();
            format!("failed at {}: {why}{parked}; {tried}", when(at, now))
        }
        _ => {
            facts.state = "queued";
            format!("accepted at {}; {tried}", when(facts.first_at, now))
        }
    }
}

fn inbound(history: &History, now: Millis, facts: &mut Facts) -> String {
    let peer = &history.peer;
    let refusals = match facts.hook_refusals {
        0 => String::new(),
        n => format!(
            " after the durability hook refused {} ({})",
            plural(n, "batch", "batches"),
            facts.hook_refusal.as_deref().unwrap_or_default()
        ),
    };
    let committed = history.entries.iter().rev().find_map(|(_, _, k)| match k {
        Kind::HookCommitted { batch } => Some(*batch),
        _ => None,
    });
    let last = history
        .entries
        .iter()
        .rev()
        .find_map(|(_, at, kind)| match kind {
            Kind::Received { .. } | Kind::Expired | Kind::Buffered { .. } => Some((*at, kind)),
            _ => None,
        });
    match last {
        Some((at, Kind::Received { carrier, encrypted })) => {
            facts.state = "received";
            facts.since = at;
            facts.carrier = Some(carrier.clone());
            facts.encrypted = *encrypted;
            let sealed = if *encrypted {
                ", sealed end to end"
            } else {
                ""
            };
            let hook = committed
                .map(|batch| format!(", committed by the durability hook in batch {batch}"))
                .unwrap_or_default();
            format!(
                "received from {peer} at {} over {}{sealed}{hook}{refusals}",
                when(at, now),
                carrier_phrase(carrier)
            )
        }
        Some((at, Kind::Expired)) => {
            facts.state = "expired";
            facts.since = at;
            format!(
                "dropped at {}: the durability hook did not commit it within its retention{refusals}",
                when(at, now)
            )
        }
        Some((at, Kind::Buffered { carrier })) => {
            facts.state = "buffered";
            facts.since = at;
            facts.carrier = Some(carrier.clone());
            format!(
                "buffered since {} from {peer} over {}, waiting for the durability hook{refusals}",
                when(at, now),
                carrier_phrase(carrier)
            )
        }
        _ => {
            facts.state = "undecryptable";
            facts.encrypted = true;
            format!(
                "{} from {peer} did not open (last at {}); the sender's retry, sealed again, \
                 recovers it",
                plural(facts.decryption_failures, "sealed copy", "sealed copies"),
                when(facts.last_at, now)
            )
        }
    }
}

fn attempts_phrase(facts: &Facts) -> String {
    if facts.attempts == 0 {
        return "not written by any carrier yet".to_owned();
    }
    let over: Vec<String> = facts.carriers.iter().map(|c| carrier_phrase(c)).collect();
    let mut phrase = format!(
        "{} over {}",
        plural(facts.attempts, "attempt", "attempts"),
        over.join(" and ")
    );
    if facts.probes > 0 {
        phrase.push_str(&format!(" ({})", plural(facts.probes, "probe", "probes")));
    }
    phrase
}

fn carrier_phrase(carrier: &str) -> String {
    match carrier {
        "internet" => "the relay".to_owned(),
        "gateway" => "the gateway".to_owned(),
        local => local.to_owned(),
    }
}

fn cause_phrase(cause: &str, peer: &str) -> String {
    match cause {
        "unknown_recipient" => format!("it does not know {peer}"),
        "offline_no_mailbox" => format!("{peer} has no mailbox"),
        "mailbox_full" => format!("{peer}'s mailbox is full"),
        _ => format!("it cannot reach {peer}"),
    }
}

fn plural(n: u32, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}
