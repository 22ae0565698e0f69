//! The invariants checked against the devices' state: at a sender's settlement, at every ACK
//! a device transmits, after every step (queue bounds), and at the end of the run.

use courier_engine::{EntryState, OutboxRecord};

use super::groups::is_copy;
use super::*;

/// Messages the pre-session queue holds at most, in all and for one recipient.
const PRE_SESSION_MESSAGES: usize = 4096;
const PRE_SESSION_PER_RECIPIENT: usize = 64;

/// A device's outbox rows as a commit's ops leave them so far: its store's, with the puts and
/// settles of the ops already applied. The evidence for a failure settled by a later op.
pub(super) struct OutboxView<'s> {
    store: &'s BTreeMap<String, OutboxRecord>,
    put: BTreeMap<&'s str, &'s OutboxRecord>,
    settled: BTreeSet<&'s str>,
}

impl<'s> OutboxView<'s> {
    pub(super) fn new(store: &'s BTreeMap<String, OutboxRecord>) -> Self {
        Self {
            store,
            put: BTreeMap::new(),
            settled: BTreeSet::new(),
        }
    }

    pub(super) fn put(&mut self, record: &'s OutboxRecord) {
        self.settled.remove(record.message.id.as_str());
        self.put.insert(&record.message.id, record);
    }

    pub(super) fn settle(&mut self, id: &'s str) {
        self.put.remove(id);
        self.settled.insert(id);
    }

    pub(super) fn row(&self, id: &str) -> Option<&'s OutboxRecord> {
        match self.put.get(id) {
            Some(record) => Some(record),
            None if self.settled.contains(id) => None,
            None => self.store.get(id),
        }
    }

    pub(super) fn rows(&self) -> impl Iterator<Item = &'s OutboxRecord> + '_ {
        let stored = self.store.values().filter(|r| {
            let id = r.message.id.as_str();
            !self.put.contains_key(id) && !self.settled.contains(id)
        });
        stored.chain(self.put.values().copied())
    }
}

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

    /// The sender just settled `row` as failed for `reason`. Capacity needs its class full at
    /// that moment (a group message with something left to deliver counts as one regular
    /// entry, `groups` of them; a copy fails by capacity with its whole group message), and a
    /// lifetime expiry the entry's lifetime run out. Once the world is honest
    /// every real device is up and reachable over the relay, so a message to one of them may
    /// only fail with an excuse the chaos left (see [`World::excuse`]): anything else is a
    /// delivery the engine owed and did not make (a lost end-to-end ACK, a stuck entry).
    pub(super) fn check_failed(
        &self,
        p: usize,
        row: &OutboxRecord,
        reason: FailReason,
        outbox: &OutboxView<'_>,
        groups: usize,
    ) {
        let peer = &self.peers[p];
        let config = &peer.spec.config;
        let name = peer.name();
        let Message { id, recipient, .. } = &row.message;
        let expiry = (row.window_start + config.outbox_max_lifetime_ms)
            .min(row.created_at + config.absolute_lifetime_ms());
        match reason {
            FailReason::OutboxCapacityExceeded => {
                let media = |r: &OutboxRecord| r.message.content_type == ContentType::FileChunk;
                let class = media(row) && !is_copy(&row.message);
                let held = outbox
                    .rows()
                    .filter(|r| !is_copy(&r.message) && media(r) == class)
                    .count()
                    + if class { 0 } else { groups };
                let bound = if class {
                    config.outbox_max_media_entries
                } else {
                    config.outbox_max_entries
                };
                if held < bound.max(1) {
                    violated(format!(
                        "{name}'s {id} failed by capacity, but its outbox held {held} such entries (bound {bound})"
                    ));
                }
                return;
            }
            FailReason::OutboxLifetimeExceeded if expiry > self.now => violated(format!(
                "{name}'s {id} failed by lifetime {} ms before its lifetime ran out",
                expiry - self.now
            )),
            _ => {}
        }
        let Some(honest_since) = self.honest_since else {
            return;
        };
        if self.scn.index_of(recipient).is_none() {
            // The ghost: no relay knows it, so nothing can deliver to it.
            return;
        }
        if let Some(excuse) = self.excuse(name, row, reason, expiry, honest_since) {
            self.trace(|_| format!("{name}'s {id} failed, excused: {excuse}"));
            return;
        }
        let ago = |t: Millis| (self.now - t) as f64 / 1000.0;
        let undecryptable = self
            .ledger
            .decryption_failed_at(recipient, name, &courier_proto::wire_id(id))
            .map_or(String::new(), |t| {
                format!(
                    ", the recipient last failed to decrypt it {:.1} s ago",
                    ago(t)
                )
            });
        // Sessions that part ways lose the message or its ACK whatever the engine does.
        let sessions = match self.scn.index_of(recipient) {
            Some(q) if self.scn.encryption => {
                let both = [self.opens(p, q), self.opens(q, p)];
                let parted: Vec<String> = both.into_iter().filter_map(Result::err).collect();
                parted.iter().map(|e| format!("; {e}")).collect()
            }
            _ => String::new(),
        };
        violated(format!(
            "{name}'s {id} to {recipient}, a live device reachable over the relay, failed {:.1} s into the honest phase: {} (accepted {:.1} s ago, last written {} ago, {} ACK timeouts spent, lifetime out in {:.1} s{undecryptable})",
            ago(honest_since),
            reason.as_str(),
            ago(row.created_at),
            row.last_sent_at
                .map_or("never".to_owned(), |t| format!("{:.1} s", ago(t))),
            row.ack_attempts,
            (expiry as f64 - self.now as f64) / 1000.0,
        ) + &sessions);
    }

    /// What the chaos left behind that lets a message to a live device fail once the world is
    /// honest, if there is evidence of it. A lifetime that ran out during the chaos. For an
    /// exhausted ACK budget: the attempt that spent the last of it was written during the chaos
    /// (its frame or its ACK may have been lost); the recipient never processed the message (a
    /// journal frame a lost frame left unreleased, which the relay only redelivers on a new
    /// connection, or a durability hook still working through the chaos's backlog); its ACK is
    /// still on its way (the hook's backlog made it late); the relay refused the recipient's
    /// ACK (its sender's mailbox full, or the sender offline without a mailbox); the relay
    /// found the recipient offline for the last attempt (a media chunk is not parked, it keeps
    /// its ladder); the relay refused the Welcome sent ahead of the last attempt (the
    /// recipient's mailbox full) while the attempt found room; or, for a group copy, the
    /// member sealed its ACK in a session the sender does not hold. An engine that does not
    /// acknowledge what it processed has none of these.
    fn excuse(
        &self,
        sender: &str,
        row: &OutboxRecord,
        reason: FailReason,
        expiry: Millis,
        honest_since: Millis,
    ) -> Option<&'static str> {
        let wire_id = courier_proto::wire_id(&row.message.id);
        let recipient = &self.peers[self.scn.index_of(&row.message.recipient)?];
        // What the recipient records processing it as: a copy stands for its group message.
        let key = self
            .ledger
            .copy_key(&wire_id)
            .cloned()
            .unwrap_or_else(|| key_of(sender, &wire_id));
        let last_written = row.last_sent_at.unwrap_or(0);
        match reason {
            FailReason::OutboxCapacityExceeded => Some("its outbox was full"),
            FailReason::PendingSessionCapacityExceeded => {
                Some("its recipient's pre-session queue was full")
            }
            // A session with a live peer comes up within moments of the world turning honest.
            FailReason::PendingSessionLifetimeExceeded => {
                let lifetime = self.peers[self.scn.index_of(sender)?]
                    .spec
                    .config
                    .pending_session_max_lifetime_ms;
                (row.created_at + lifetime <= honest_since)
                    .then_some("its pre-session lifetime ran out during the chaos")
            }
            // The simulated apps send no control frames and no files.
            FailReason::ControlSignatureExpired
            | FailReason::ConnectionRequestUndeliverable
            | FailReason::TransferAborted => None,
            FailReason::OutboxLifetimeExceeded => {
                (expiry <= honest_since).then_some("its lifetime ran out during the chaos")
            }
            FailReason::MaxRetriesExceeded if last_written <= honest_since => {
                Some("its last attempt was written during the chaos")
            }
            // Both started a session at once and the recipient's won the tie: what the sender
            // sealed before it joined the winner does not open, and spends its attempts.
            FailReason::MaxRetriesExceeded
                if self
                    .ledger
                    .lost_tie(sender, recipient.name())
                    .is_some_and(|joined| last_written <= joined) =>
            {
                Some("its last attempt was sealed in the session that lost a simultaneous start")
            }
            // The Welcome that went ahead of the last attempt found the recipient's mailbox
            // full, and the attempt found room behind it: sealed in a session the recipient
            // never joined.
            FailReason::MaxRetriesExceeded
                if !recipient.store.is_processed(&key)
                    && self
                        .ledger
                        .refused(Refused::Welcome, sender, recipient.name())
                        .is_some_and(|at| at >= last_written) =>
            {
                Some("the relay refused the Welcome ahead of its last attempt")
            }
            // Lost to a ratchet: in the honest world every attempt is sealed in a session the
            // recipient can open, or carries the Welcome into it. (An attempt that opened and
            // was not kept, a full hook buffer say, is judged by the rules below.)
            FailReason::MaxRetriesExceeded
                if !recipient.store.is_processed(&key)
                    && self
                        .ledger
                        .decryption_failed_at(recipient.name(), sender, &wire_id)
                        .is_some_and(|at| at >= last_written) =>
            {
                None
            }
            FailReason::MaxRetriesExceeded if !recipient.store.is_processed(&key) => {
                Some("the recipient never processed it")
            }
            // A group copy needs no session to go, so nothing makes its sender set one up; its
            // member seals the ACK in a session of its own that the sender may not hold.
            FailReason::MaxRetriesExceeded
                if is_copy(&row.message)
                    && self
                        .ledger
                        .ack_undecryptable_at(sender, recipient.name(), &wire_id)
                        .is_some_and(|at| at >= last_written) =>
            {
                Some("its member's ACK was sealed in a session its sender does not hold")
            }
            FailReason::MaxRetriesExceeded if self.ack_on_its_way(sender, &wire_id) => {
                Some("its ACK was on its way")
            }
            FailReason::MaxRetriesExceeded
                if self
                    .ledger
                    .refused(Refused::Ack, sender, &wire_id)
                    .is_some() =>
            {
                Some("the relay refused its ACK")
            }
            FailReason::MaxRetriesExceeded
                if self
                    .ledger
                    .refused(Refused::Attempt, sender, &wire_id)
                    .is_some_and(|at| at >= last_written) =>
            {
                Some("the relay found the recipient offline for its last attempt")
            }
            FailReason::MaxRetriesExceeded => None,
        }
    }

    /// Whether an end-to-end ACK of `sender`'s `wire_id` is travelling towards it: on a link, or
    /// queued for its next step.
    fn ack_on_its_way(&self, sender: &str, wire_id: &str) -> bool {
        let acks = |message: &Message| {
            message.recipient == sender && self.ledger.ack_for(message) == Some(wire_id)
        };
        let queued = self.queue.values().any(|ev| match ev {
            Ev::ToRelay {
                frame: ToRelay::Send { message, .. },
                ..
            }
            | Ev::ToClient {
                frame: ToClient::Received { message, .. },
                ..
            }
            | Ev::Local { message, .. } => acks(message),
            _ => false,
        });
        let inbox = self
            .scn
            .index_of(sender)
            .and_then(|p| self.peers[p].run.as_ref());
        queued
            || inbox.is_some_and(|run| {
                run.inbox.iter().any(|command| {
                    matches!(command, Command::Engine(Input::Inbound { message, .. }) if acks(message))
                })
            })
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
                let acked = self.ledger.ack_for(message).unwrap_or_default();
                // The ACK of a group copy names the copy, and stands for its group message.
                let key = self
                    .ledger
                    .copy_key(acked)
                    .cloned()
                    .unwrap_or_else(|| key_of(&message.recipient, acked));
                check(&key, "end-to-end ACK", false);
            }
            // A sealed copy that did not open, or a spent repeat, is released unprocessed.
            TransmitKind::ReleaseFrame { seq } if self.ledger.was_unopened(name, *seq) => {}
            TransmitKind::ReleaseFrame { seq } => {
                if let Some(key) = self
                    .ledger
                    .seq(name, *seq)
                    .and_then(|info| info.key.as_ref())
                {
                    check(key, "relay ack", true);
                }
            }
            TransmitKind::Outbox { .. } | TransmitKind::GroupBroadcast { .. } => {}
        }
    }

    /// Every queue of the engine stays within its configured bound.
    pub(super) fn check_bounds(&mut self, p: usize) {
        let peer = &self.peers[p];
        let run = peer.run.as_ref().expect("running");
        let config = &peer.spec.config;
        let stats = run.engine.stats();
        let name = peer.name();
        // A group message with something left to deliver counts as one regular entry; its
        // copies count in neither class (`docs/delivery.md#group-messages-and-the-outbox-bound`).
        if stats.outbox_regular + stats.group_sends > config.outbox_max_entries.max(1)
            || stats.outbox_media > config.outbox_max_media_entries
        {
            violated(format!(
                "{name}'s outbox holds {} + {} entries and {} group messages (bounds {} + {})",
                stats.outbox_regular,
                stats.outbox_media,
                stats.group_sends,
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
        let (copies, entries): (Vec<&OutboxRecord>, Vec<&OutboxRecord>) = peer
            .store
            .outbox
            .values()
            .partition(|row| is_copy(&row.message));
        let (waiting, rows): (Vec<&OutboxRecord>, Vec<&OutboxRecord>) = entries
            .into_iter()
            .partition(|row| row.state == EntryState::AwaitingSession);
        if rows.len() > config.outbox_max_entries + config.outbox_max_media_entries {
            violated(format!("{name}'s store holds {} outbox rows", rows.len()));
        }
        // Copies are bounded by their group messages: one per member not reached.
        let rosters: usize = peer
            .store
            .group_sends
            .values()
            .filter(|row| !row.done)
            .map(|row| row.record.members.len())
            .sum();
        if copies.len() > rosters {
            violated(format!(
                "{name}'s store holds {} group copies for rosters of {rosters} members",
                copies.len()
            ));
        }
        // The pre-session queue's fixed bounds (`docs/delivery.md#pre-session-queue`).
        let mut per_recipient = BTreeMap::<&str, usize>::new();
        for row in &waiting {
            *per_recipient.entry(&row.message.recipient).or_default() += 1;
        }
        let most = per_recipient.values().copied().max().unwrap_or(0);
        if waiting.len() > PRE_SESSION_MESSAGES
            || most > PRE_SESSION_PER_RECIPIENT
            || stats.pre_session > PRE_SESSION_MESSAGES
        {
            violated(format!(
                "{name}'s pre-session queue holds {} rows in its store ({most} for one recipient), {} in memory",
                waiting.len(),
                stats.pre_session
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
        let to_devices = self
            .ledger
            .generations()
            .filter(|(_, rec)| rec.durable && self.scn.index_of(&rec.recipient).is_some());
        let (sent, delivered) = to_devices.fold((0, 0), |(sent, delivered), (_, rec)| {
            let ok = rec.settled == Some(Settlement::Delivered);
            (sent + 1, delivered + u32::from(ok))
        });
        if sent > 0 && delivered == 0 {
            violated(format!(
                "none of the {sent} messages accepted for live devices was delivered"
            ));
        }
        for (sender, id) in self.probes.iter().flatten() {
            let settled = self
                .ledger
                .outbound
                .get(&(sender.clone(), id.clone()))
                .and_then(|rec| rec.settled.clone());
            if settled != Some(Settlement::Delivered) {
                violated(format!(
                    "{sender}'s probe {id}, sent into the quiet honest world, ended as {settled:?}"
                ));
            }
        }
        self.check_undecryptable();
        self.final_group_checks();
        if self.scn.encryption {
            self.check_sessions();
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

impl World {
    /// Never lost to a ratchet: every data message that failed to decrypt was delivered after
    /// all, or failed with an excuse `check_failed` accepted when it settled.
    fn check_undecryptable(&mut self) {
        for (recipient, sender, wire_id) in self.ledger.undecryptable() {
            let latest = self
                .ledger
                .outbound
                .iter()
                .filter(|((s, id), _)| s == sender && courier_proto::wire_id(id) == *wire_id)
                .map(|(_, rec)| rec)
                .next();
            match latest.and_then(|rec| rec.settled.as_ref()) {
                Some(Settlement::Delivered) => self.counts.undecryptable_then_delivered += 1,
                Some(Settlement::Failed(_)) => self.counts.undecryptable_then_failed += 1,
                None => violated(format!(
                    "{recipient} failed to decrypt {sender}'s {wire_id}, which never settled"
                )),
            }
        }
    }
}
