//! Carrier choice and sending: which carrier an outbox send takes, when queued entries go,
//! and how a transmit is handed out and reported written.
//!
//! # Carrier choice
//!
//! One function, [`Engine::route_for`]: a direct link to the recipient (it is a current neighbor
//! on a registered local carrier) is preferred over the relay; else the relay when the relay
//! carrier is up; else a gateway when the Gateway carrier is up; else the send is deferred
//! (`message_deferred`, `next_retry_at: None`) until a carrier or neighbor edge. A parked message
//! is also *offered* to every other current neighbor on every park and every probe
//! (`Transmit.peer` = that neighbor): the neighbor only carries it, the offer is fire-and-forget
//! (its `send_seq` is never the entry's attempt, so reports for it are ignored) and only the
//! recipient's ACK settles the message.

use super::*;

impl Engine {
    /// Carrier choice: a direct link to the recipient, else the relay, else a gateway, else
    /// none.
    pub(super) fn route_for(&self, recipient: &str) -> Result<Route, &'static str> {
        if let Some(carrier) = self.neighbors.link_to(recipient) {
            return Ok((
                Carrier::Local(carrier.to_owned()),
                Some(recipient.to_owned()),
            ));
        }
        match self.addressed() {
            Some(carrier) => Ok((carrier, None)),
            None => Err(REASON_NO_CARRIER),
        }
    }

    /// The addressed carrier that carries attempts: the relay when it is up, else a gateway.
    pub(super) fn addressed(&self) -> Option<Carrier> {
        [Carrier::Relay, Carrier::Gateway]
            .into_iter()
            .find(|carrier| self.carriers.contains(carrier))
    }

    pub(super) fn has_slot(&self) -> bool {
        self.timers.in_flight() < self.config.max_pending_acks.max(1)
    }

    /// The route the entry's next send would take, or why it cannot go now.
    pub(super) fn sendable(&self, key: Key) -> Result<Route, &'static str> {
        let entry = self.outbox.get(key).ok_or(REASON_NO_CARRIER)?;
        let route = self.route_for(&entry.message.recipient)?;
        if !self.has_slot() {
            return Err(REASON_IN_FLIGHT_LIMIT);
        }
        Ok(route)
    }

    /// Queued entries of current neighbors, with whether each is parked: what can go while the
    /// relay is down.
    pub(super) fn neighbor_queue(&self) -> impl Iterator<Item = (Slot, bool)> + '_ {
        self.neighbors
            .peers()
            .flat_map(|peer| self.outbox.keys_to(peer))
            .filter_map(|key| {
                let parked = self.outbox.get(key)?.park.is_some();
                self.queued_slot(key).map(|slot| (slot, parked))
            })
    }

    pub(super) fn queued_slot(&self, key: Key) -> Option<Slot> {
        let entry = self.outbox.get(key)?;
        match entry.phase {
            Phase::Queued { at, .. } => Some((at, std::cmp::Reverse(entry.message.priority), key)),
            _ => None,
        }
    }

    /// The next entry due at `now` that can go, in retry-queue order.
    pub(super) fn next_due(&self, now: Millis) -> Option<Key> {
        if !self.has_slot() {
            return None;
        }
        let gate = Gate {
            probes: !self.config.edge_driven_unreachable_dm || self.resend_budget.available(now),
        };
        if self.addressed().is_some() {
            self.timers.first_due_send(now, gate)
        } else {
            self.neighbor_queue()
                .filter(|((at, _, _), parked)| *at <= now && (gate.probes || !parked))
                .map(|(slot, _)| slot)
                .min()
                .map(|(_, _, key)| key)
        }
    }

    /// Up to one batch of due entries, in retry-queue order, while routes, slots and the resend
    /// budget allow.
    pub(super) fn send_due(&mut self, now: Millis) {
        for _ in 0..self.config.flush_batch.max(1) {
            let Some(key) = self.next_due(now) else {
                break;
            };
            if !self.try_send(key, now) {
                break;
            }
        }
    }

    /// Sends the entry now if it has a route and a slot and, when parked under
    /// `edgeDrivenUnreachableDm`, the resend budget funds it.
    pub(super) fn try_send(&mut self, key: Key, now: Millis) -> bool {
        let Ok(route) = self.sendable(key) else {
            return false;
        };
        let parked = self.outbox.get(key).is_some_and(|e| e.park.is_some());
        if parked && self.config.edge_driven_unreachable_dm && !self.resend_budget.take(now) {
            return false;
        }
        self.transmit(key, route, now);
        true
    }

    /// Hands the entry's attempt to `route`. A parked entry's send is a probe on every carrier:
    /// it is also offered to every other current neighbor.
    pub(super) fn transmit(&mut self, key: Key, (carrier, peer): Route, now: Millis) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        if courier_proto::control_signature_expired(&entry.message, now) {
            // Its receivers would refuse it as stale (`docs/protocol.md#control-signatures`).
            self.settle_failed(key, FailReason::ControlSignatureExpired, now);
            return;
        }
        let message = self.outgoing(entry);
        let parked = entry.park.is_some();
        self.last_send_seq += 1;
        let send_seq = self.last_send_seq;
        self.set_phase(
            key,
            Phase::Handed {
                send_seq,
                deadline: matches!(carrier, Carrier::Local(_))
                    .then(|| now.saturating_add(self.config.app_send_timeout_ms)),
                carrier: carrier.clone(),
            },
        );
        let recipient = message.recipient.clone();
        self.transmits.push_back(Transmit {
            carrier,
            peer,
            kind: TransmitKind::Outbox { message, send_seq },
        });
        if parked {
            self.offer(key, Some(&recipient));
        }
    }

    /// Offers the entry to every current neighbor but `except`, and to the gateway when the
    /// relay carries the attempts: carry-only copies, reports for which are ignored (their
    /// `send_seq` is never the entry's attempt).
    pub(super) fn offer(&mut self, key: Key, except: Option<&str>) {
        let via_gateway =
            self.carriers.contains(&Carrier::Gateway) && self.carriers.contains(&Carrier::Relay);
        if self.neighbors.is_empty() && !via_gateway {
            return;
        }
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        let mut targets: Vec<(Carrier, Option<String>)> = self
            .neighbors
            .each()
            .filter(|(_, peer)| Some(*peer) != except)
            .map(|(carrier, peer)| (Carrier::Local(carrier.to_owned()), Some(peer.to_owned())))
            .collect();
        if via_gateway {
            targets.push((Carrier::Gateway, None));
        }
        for (carrier, peer) in targets {
            self.last_send_seq += 1;
            self.transmits.push_back(Transmit {
                carrier,
                peer,
                kind: TransmitKind::Outbox {
                    message: self.outgoing(entry),
                    send_seq: self.last_send_seq,
                },
            });
        }
    }

    pub(super) fn mark_written(&mut self, key: Key, now: Millis) {
        let Some(entry) = self.outbox.get_mut(key) else {
            return;
        };
        let Phase::Handed {
            send_seq, carrier, ..
        } = &entry.phase
        else {
            return;
        };
        let (send_seq, direct) = (*send_seq, matches!(carrier, Carrier::Local(_)));
        let transport = carrier.name().to_owned();
        entry.first_sent_at.get_or_insert(now);
        entry.last_sent_at = Some(now);
        entry.window_start = now;
        let sent = Event::MessageSent {
            message_id: entry.message.id.clone(),
            recipient: entry.message.recipient.clone(),
            priority: entry.message.priority,
            transport,
            attempt: ack::attempt_number(entry.ack_attempts),
        };
        self.outbox_event(sent);
        let deadline = ack::deadline(&self.config, now);
        self.set_phase(key, Phase::AwaitingAck { send_seq, deadline });
        if direct {
            // Written on a direct link: it reached the recipient's device, the local analogue
            // of the relay's "live".
            self.set_park(key, None);
        }
    }

    /// The entry whose current attempt is `send_seq` of wire id `id`, as the runtime reports it.
    pub(super) fn current_attempt(&self, id: &str, send_seq: u64) -> Option<Key> {
        let key = self.outbox.key_of_wire(id)?;
        (self.outbox.get(key)?.current_send_seq() == Some(send_seq)).then_some(key)
    }
}
