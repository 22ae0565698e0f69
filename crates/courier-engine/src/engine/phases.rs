//! Leaving flight: transport failures, unreachable verdicts, ACK timeouts, custody, parking,
//! requeueing and resting, and the reachability edges that re-drive parked entries.
//!
//! The relay and a gateway are both *addressed* carriers: they route by the recipient's address
//! and answer each send live or unreachable, so their answers, reconnect flush and edges are
//! the same. With both up the relay carries the attempts: it is the one with a mailbox
//! (custody) and presence, and its answers are what the ladder and the parking rules are tuned
//! for. The gateway then reaches what the relay cannot the way a neighbor does: a parked
//! message is offered over it too (peer `None`) on every park and probe, because a gateway
//! bridges a mesh where a recipient the relay calls unreachable may well be attached.
//!
//! # Reachability edges and the ACK budget
//!
//! An edge — reconnect (`carrier up: Relay`), `restore`, the peer discovered as a
//! neighbor, the peer reported online (news only, see `presence`), the delivery of one of the
//! peer's messages, an inbound message carried by the peer — resets the peer's probe ladder and
//! verdict, re-drives its parked entries at once, and gives every entry of the peer's park
//! episode (parked, resting, or a probe climbing the ladder) a **fresh ACK budget**
//! (`ack_attempts = 0`) and a new episode (`edgeDrivenUnreachableDm` probes count afresh). A **timed probe** instead **carries the budget forward**: it resumes at
//! the entry's accumulated `ack_attempts`, so a probe the relay accepts but nobody acknowledges
//! re-parks after about one more ACK timeout rather than re-walking the whole ladder (the ~800 s of
//! a fresh budget, `docs/delivery.md#fresh-ack-budget`, is the edge case, not the probe case).
//!
//! A parked entry stays parked while its probe or re-drive is in flight: an ACK timeout then
//! re-parks it without spending budget (a probe nobody answered). It joins the ordinary ACK
//! ladder only when its attempt is accepted by the recipient's side: the relay's `live` answer,
//! or a write on a direct link to the recipient (the local analogue of `live`).

use super::*;

impl Engine {
    /// A failed send: transport backoff, no budget spent. `message_deferred.retry_count` is the
    /// number of transport failures before this one since the relay last accepted the frame,
    /// the exponent of its backoff. A parked entry stays parked.
    pub(super) fn transport_failure(&mut self, key: Key, reason: &str, now: Millis) {
        let Some(entry) = self.outbox.get_mut(key) else {
            return;
        };
        let retry = entry.transport_retries;
        entry.transport_retries = retry.saturating_add(1);
        let at = now.saturating_add(self.config.backoff_ms(retry));
        if self.requeue(key, at, now) {
            // Without a route the time is only a lower bound: the carrier edge decides.
            let next = self.sendable(key).is_ok().then_some(at);
            self.emit_deferred_with(key, reason, retry, next);
        }
    }

    /// The relay's unreachable verdict for the entry's current attempt: it parks exactly this
    /// message (`docs/delivery.md#parking`).
    pub(super) fn on_unreachable(&mut self, key: Key, cause: UnreachableCause, now: Millis) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        if courier_proto::is_connection_request(&entry.message.content) {
            // Never parked: a request is for now or not at all
            // (`docs/delivery.md#connection-requests`).
            self.settle_failed(key, FailReason::ConnectionRequestUndeliverable, now);
            return;
        }
        let recipient = entry.message.recipient.clone();
        let media = entry.class() == Class::Media;
        let event = Event::MessageUndeliverable {
            message_id: entry.message.id.clone(),
            recipient: recipient.clone(),
            reason_code: cause,
            reason: REASON_UNREACHABLE.to_owned(),
            file_id: file_id(&entry.message),
        };
        self.outbox_event(event);
        self.parking.set_verdict(&recipient);
        self.presence.forget_status(&recipient);
        if media {
            // Not parked: it keeps its pending ACK and its ladder, and is offered to neighbors.
            self.set_park(key, None);
            self.offer(key, None);
        } else {
            self.park(key, Park::Unreachable, now);
        }
    }

    pub(super) fn ack_timeout(&mut self, key: Key, now: Millis) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        if let Some(kind) = entry.park {
            // A probe nobody answered: pace it, don't spend.
            self.park(key, kind, now);
            return;
        }
        let regular = entry.class() != Class::Media;
        let verdict = self.parking.has_verdict(&entry.message.recipient);
        match ack::after_timeout(&self.config, entry.ack_attempts, now) {
            AfterTimeout::Exhausted if regular && verdict => {
                // The recipient still holds a verdict: re-park, don't settle.
                self.park(key, Park::Unreachable, now);
            }
            AfterTimeout::Exhausted => self.settle_failed(key, FailReason::MaxRetriesExceeded, now),
            AfterTimeout::Retry { retry_count, at } => {
                if !self.requeue(key, at, now) {
                    return;
                }
                let Some(entry) = self.outbox.get_mut(key) else {
                    return;
                };
                entry.ack_attempts = retry_count.saturating_add(1);
                let event = Event::MessageRetrying {
                    message_id: entry.message.id.clone(),
                    recipient: entry.message.recipient.clone(),
                    retry_count,
                    next_retry_at: at,
                };
                self.outbox_event(event);
            }
        }
    }

    pub(super) fn enter_custody(&mut self, key: Key, now: Millis) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        let newly = entry.park != Some(Park::Custody);
        if self.park(key, Park::Custody, now) && newly {
            if let Some(entry) = self.outbox.get(key) {
                let event = Event::MessageStored {
                    message_id: entry.message.id.clone(),
                    recipient: entry.message.recipient.clone(),
                };
                self.outbox_event(event);
            }
        }
    }

    /// Parks the entry (pending ACK and retry entry dropped, outbox entry kept): the
    /// recipient's ladder climbs once and the probe is scheduled at the escalated interval —
    /// or, under `edgeDrivenUnreachableDm` once this episode's timed probes are spent, the entry
    /// rests until an edge. Every park offers the message to the current neighbors. Returns
    /// whether the entry is still live (a park past the lifetime settles it).
    pub(super) fn park(&mut self, key: Key, kind: Park, now: Millis) -> bool {
        let Some(entry) = self.outbox.get(key) else {
            return false;
        };
        let recipient = entry.message.recipient.clone();
        let quiet =
            self.config.edge_driven_unreachable_dm && entry.timed_probes >= EDGE_DRIVEN_PROBES;
        self.set_park(key, Some(kind));
        let delay = self.parking.climb(&recipient);
        let live = if quiet {
            self.rest(key, now)
        } else {
            if let Some(entry) = self.outbox.get_mut(key) {
                entry.timed_probes = entry.timed_probes.saturating_add(1);
            }
            self.requeue(key, now.saturating_add(delay), now)
        };
        if live {
            self.offer(key, None);
        }
        live
    }

    /// Back into the retry queue at `at` after an attempt ended without a settlement — unless
    /// the lifetime ran out while the attempt was pending: expiry waits for a pending ACK, and
    /// this is where it catches up. Returns whether the entry is still live.
    pub(super) fn requeue(&mut self, key: Key, at: Millis, now: Millis) -> bool {
        let Some(expires_at) = self.still_alive(key, now) else {
            return false;
        };
        self.set_phase(key, Phase::Queued { at, expires_at });
        true
    }

    /// Quiet until an edge: no send timer, only the lifetime.
    pub(super) fn rest(&mut self, key: Key, now: Millis) -> bool {
        let Some(expires_at) = self.still_alive(key, now) else {
            return false;
        };
        self.set_phase(key, Phase::Resting { expires_at });
        true
    }

    /// The entry's expiry while it has one ahead; an entry whose lifetime ran out is settled
    /// failed here, and gone (`None`) like one that was never there.
    pub(super) fn still_alive(&mut self, key: Key, now: Millis) -> Option<Millis> {
        let expires_at = self.outbox.get(key)?.expires_at(&self.config);
        if now >= expires_at {
            self.settle_failed(key, FailReason::OutboxLifetimeExceeded, now);
            return None;
        }
        Some(expires_at)
    }

    /// Makes a queued or resting entry due now.
    pub(super) fn bring_forward(&mut self, key: Key, now: Millis) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        match entry.phase {
            Phase::Queued { at, expires_at } if at > now => {
                self.set_phase(
                    key,
                    Phase::Queued {
                        at: now,
                        expires_at,
                    },
                );
            }
            Phase::Resting { expires_at } => {
                self.set_phase(
                    key,
                    Phase::Queued {
                        at: now,
                        expires_at,
                    },
                );
            }
            _ => {}
        }
    }

    /// A reachability edge for `peer`: its ladder and verdict reset, and every entry of its
    /// park episode gets a fresh ACK budget and a new episode — parked ones go again now, and a
    /// probe that was climbing the ACK ladder restarts it from 0 (it was not parked at the
    /// moment, but its accumulated count came from the episode the edge just ended).
    pub(super) fn edge(&mut self, peer: &str, now: Millis) {
        if !self.parking.edge(peer) {
            return;
        }
        for key in self.outbox.keys_to(peer) {
            let Some(entry) = self.outbox.get_mut(key) else {
                continue;
            };
            let parked = entry.park.is_some();
            if !parked && entry.timed_probes == 0 {
                continue;
            }
            if entry.ack_attempts != 0 || entry.timed_probes != 0 {
                entry.ack_attempts = 0;
                entry.timed_probes = 0;
                self.dirty.insert(key);
            }
            if parked {
                self.bring_forward(key, now);
            }
        }
    }

    /// A reachability edge for everyone (reconnect).
    pub(super) fn edge_all(&mut self, now: Millis) {
        for peer in self.parking.recipients() {
            self.edge(&peer, now);
        }
    }
}
