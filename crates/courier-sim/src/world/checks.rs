//! The invariants checked against the devices' state: at a sender's delivery, at every ACK a
//! device transmits, after every step (queue bounds), and at the end of the run.

use super::*;

impl World {
    /// The sender just settled `id` as delivered: its recipient has processed it, durably, and
    /// with a hook its application has committed it.
    pub(super) fn check_delivered(&self, sender: &str, id: &str) {
        let recipient = self
            .ledger
            .outbound
            .get(&(sender.to_owned(), id.to_owned()))
            .map(|rec| rec.recipient.clone())
            .unwrap_or_default();
        let Some(q) = self.scn.index_of(&recipient) else {
            violated(format!(
                "{sender} saw {id} delivered to {recipient}, who does not exist"
            ));
        };
        let key = key_of(sender, &courier_proto::wire_id(id));
        let peer = &self.peers[q];
        if !peer.store.is_processed(&key) {
            violated(format!(
                "{sender} saw {id} delivered, but {recipient} has not processed it"
            ));
        }
        if peer.spec.hook.is_some() && !peer.app.hook_store.contains(&key) {
            violated(format!(
                "{sender} saw {id} delivered, but {recipient}'s application never committed it"
            ));
        }
    }

    /// No end-to-end ACK and no relay hop ack of a data message before it is processed: in the
    /// committed store, and with a hook in the application's own store.
    pub(super) fn check_ack(&self, p: usize, transmit: &Transmit) {
        let peer = &self.peers[p];
        let name = peer.name();
        // A hop ack may also release a frame whose buffered row expired (a drop, with a trace).
        let check = |key: &InboundKey, what: &str, drop_allowed: bool| {
            let processed = peer.store.is_processed(key);
            let dropped = drop_allowed
                && self
                    .ledger
                    .inbound(name, key)
                    .is_some_and(|rec| rec.expired);
            if !(processed || dropped) {
                violated(format!(
                    "{name} sent the {what} of {key:?} before processing it"
                ));
            }
            if processed && peer.spec.hook.is_some() && !peer.app.hook_store.contains(key) {
                violated(format!(
                    "{name} sent the {what} of {key:?}, which its application never committed"
                ));
            }
        };
        match &transmit.kind {
            TransmitKind::DeliveryAck { message } => {
                let acked = message.ack_for().unwrap_or_default();
                check(&key_of(&message.recipient, acked), "end-to-end ACK", false);
            }
            TransmitKind::ReleaseFrame { seq } => {
                if let Some(key) = self
                    .ledger
                    .seq(name, *seq)
                    .and_then(|info| info.key.as_ref())
                {
                    check(key, "relay ack", true);
                }
            }
            TransmitKind::Outbox { .. } => {}
        }
    }

    /// Every queue of the engine stays within its configured bound.
    pub(super) fn check_bounds(&mut self, p: usize) {
        let peer = &self.peers[p];
        let run = peer.run.as_ref().expect("running");
        let config = &peer.spec.config;
        let stats = run.engine.stats();
        let name = peer.name();
        if stats.outbox_regular > config.outbox_max_entries
            || stats.outbox_media > config.outbox_max_media_entries
        {
            violated(format!(
                "{name}'s outbox holds {} + {} entries (bounds {} + {})",
                stats.outbox_regular,
                stats.outbox_media,
                config.outbox_max_entries,
                config.outbox_max_media_entries
            ));
        }
        if stats.pending_acks > config.max_pending_acks.max(1) {
            violated(format!(
                "{name} has {} entries in flight (bound {})",
                stats.pending_acks, config.max_pending_acks
            ));
        }
        let buffered = run.engine.inbound_buffered();
        if let Some(durable) = &config.durability_hook {
            if buffered > durable.max_buffered_messages
                || peer.store.pending.len() > durable.max_buffered_messages
            {
                violated(format!(
                    "{name} buffers {buffered} inbound messages, {} in its store (bound {})",
                    peer.store.pending.len(),
                    durable.max_buffered_messages
                ));
            }
        }
        if peer.store.outbox.len() > config.outbox_max_entries + config.outbox_max_media_entries {
            violated(format!(
                "{name}'s store holds {} outbox rows",
                peer.store.outbox.len()
            ));
        }
        let watchlist = run.engine.presence_watchlist().len();
        if watchlist > self.peers.len() {
            violated(format!("{name} watches {watchlist} peers"));
        }
        let c = &mut self.counts;
        c.max_outbox = c.max_outbox.max(stats.outbox_regular + stats.outbox_media);
        c.max_pending_acks = c.max_pending_acks.max(stats.pending_acks);
        c.max_buffered = c.max_buffered.max(buffered);
        c.max_watchlist = c.max_watchlist.max(watchlist);
    }

    pub(super) fn pending_work(&self) -> String {
        let mut parts = Vec::new();
        for p in &self.peers {
            let Some(run) = &p.run else {
                parts.push(format!("{} down", p.name()));
                continue;
            };
            parts.push(format!(
                "{}: outbox {:?}, buffered {}, next deadline {:?}",
                p.name(),
                p.store.outbox.keys().collect::<Vec<_>>(),
                run.engine.inbound_buffered(),
                run.engine
                    .next_deadline()
                    .map(|d| d.saturating_sub(self.now))
            ));
        }
        parts.push(format!("relay holds {:?}", self.relay.held_frames()));
        parts.join("; ")
    }

    pub(super) fn final_checks(&mut self) {
        for p in &self.peers {
            let name = p.name();
            let Some(run) = &p.run else {
                violated(format!("{name} is down at the end"));
            };
            if !p.store.outbox.is_empty() {
                violated(format!(
                    "{name}'s outbox never settled: {:?}",
                    p.store.outbox.keys().collect::<Vec<_>>()
                ));
            }
            if !p.store.pending.is_empty() || run.engine.inbound_buffered() != 0 {
                violated(format!(
                    "{name} still buffers inbound messages: {:?}",
                    p.store.pending.keys().collect::<Vec<_>>()
                ));
            }
            if let Some(deadline) = run.engine.next_deadline() {
                violated(format!(
                    "{name}'s idle engine still wants a wake-up in {} ms",
                    deadline as i64 - self.now as i64
                ));
            }
        }
        let held = self.relay.held_frames();
        if !held.is_empty() {
            violated(format!("the relay never released {held:?}"));
        }
        let unsettled = self.ledger.unsettled();
        if let Some((sender, id)) = unsettled.first() {
            violated(format!("{sender}'s {id} never settled"));
        }
        for ((sender, id), rec) in self.ledger.generations() {
            if !rec.durable {
                continue;
            }
            if rec.terminal_events == 0 {
                violated(format!(
                    "{sender}'s {id} settled as {:?}, but no terminal event reached the application",
                    rec.settled
                ));
            }
            if rec.settled != Some(Settlement::Delivered) {
                continue;
            }
            let key = key_of(sender, &courier_proto::wire_id(id));
            let Some(q) = self.scn.index_of(&rec.recipient) else {
                continue;
            };
            let recipient = &self.peers[q];
            if recipient.spec.hook.is_some() {
                if !recipient.app.hook_store.contains(&key) {
                    violated(format!(
                        "{sender}'s {id} was delivered, but {}'s application does not have it",
                        rec.recipient
                    ));
                }
                continue;
            }
            match self.ledger.inbound(&rec.recipient, &key) {
                Some(seen) if seen.dispatched == 1 => {}
                Some(seen) if seen.dispatch_lost => self.counts.at_most_once_losses += 1,
                _ => violated(format!(
                    "{sender}'s {id} was delivered, but never reached {}'s application",
                    rec.recipient
                )),
            }
        }
        // Only the last step's terminal events may still be held: the next commit would record
        // their dispatch.
        for p in &self.peers {
            let reported = &p.run.as_ref().expect("checked above").reported;
            for (id, _) in p.store.unreported() {
                if !reported.contains(&id) {
                    violated(format!(
                        "{} holds the terminal event of {id}, which it never dispatched",
                        p.name()
                    ));
                }
            }
        }
    }
}
