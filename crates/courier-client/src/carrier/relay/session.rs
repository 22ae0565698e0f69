//! One authenticated relay connection: reading and writing frames, the token bucket, frame
//! releases, answers, presence, keepalive, and what a lost connection leaves behind.

use super::*;

pub(super) struct Session<'a> {
    stream: SplitStream<Ws>,
    writer: FrameWriter,
    driver: &'a DriverTx,
    presence: &'a mut PresenceWatch,
    bucket: crate::carrier::bucket::TokenBucket,
    /// Funding order (`docs/protocol.md#rate-limiting`): acks first, then sends.
    acks: VecDeque<String>,
    /// Journal frames received and released on this connection (the relay `Ack`s).
    releases: Releases,
    /// The `DeclareAddress` frame to write before anything else, and the address it declares.
    declaration: Option<String>,
    declared: Option<String>,
    sends: VecDeque<(String, u64, String, String)>,
    /// Group frames, funded with the sends (`docs/protocol.md#rate-limiting`).
    groups: VecDeque<String>,
    answers: Answers,
    last_heard: Instant,
    last_ping: Instant,
    /// The relay broke the transport rules (`docs/protocol.md#transport`): the close code to end
    /// the connection with.
    violation: Option<u16>,
    intake: &'a mut Intake,
}

impl<'a> Session<'a> {
    pub(super) fn new(
        (ws, auth): (Ws, Authenticated),
        identity: &IdentityKey,
        driver: &'a DriverTx,
        presence: &'a mut PresenceWatch,
        intake: &'a mut Intake,
    ) -> Self {
        let now = Instant::now();
        let (sink, stream) = ws.split();
        presence.connected(
            auth.capabilities.iter().any(|c| c == CAP_PRESENCE_WATCH),
            now,
        );
        let mut session = Self {
            stream,
            writer: FrameWriter::spawn(sink),
            driver,
            presence,
            bucket: crate::carrier::bucket::TokenBucket::from_advertised(auth.rate_limit, now),
            acks: VecDeque::new(),
            releases: Releases::default(),
            sends: VecDeque::new(),
            groups: VecDeque::new(),
            answers: Answers::new("relay"),
            last_heard: now,
            last_ping: now,
            declaration: None,
            declared: None,
            violation: None,
            intake,
        };
        // Order is load-bearing (`docs/protocol.md#client-declaration`): the declaration is the
        // very next frame, before any queued frame is flushed, or those frames keep the account
        // name for good.
        match declare_address_after_auth(
            identity,
            &auth.capabilities,
            Some(auth.username.as_str()),
            auth.address_challenge.as_deref(),
        ) {
            Ok(frame) => {
                session.declaration = Some(frame.encode());
                session.declared = Some(identity.address().to_string());
            }
            Err(e) => diagnostic(
                driver,
                DiagnosticLevel::Info,
                format!("address declaration skipped: {}", e.reason()),
            ),
        }
        if auth.capabilities.iter().any(|c| c == CAP_MAILBOX) {
            // The relay starts the backlog drain once it answered our declaration, or at our
            // first other frame, or only after a 2 s grace. Without a declaration, an
            // `AckUpTo{0}` (which releases nothing: seqs start at 1) is that first frame, so the
            // backlog and live traffic flow at once.
            if session.declaration.is_none() {
                session.releases.announce();
            }
            // Until DrainComplete, what arrives is the backlog (batched for a durability hook).
            driver.input(Input::DrainStarted(Carrier::Relay));
        }
        diagnostic(
            driver,
            DiagnosticLevel::Info,
            format!("relay connected; capabilities {:?}", auth.capabilities),
        );
        driver.input(Input::AccountName(auth.username.clone()));
        driver.input(Input::CarrierUp(Carrier::Relay));
        // Only a declared address can publish (`docs/protocol.md#key-package-directory`).
        let directory =
            session.declared.is_some() && auth.capabilities.iter().any(|c| c == CAP_KEY_DIRECTORY);
        driver.send(Command::Directory(DirectoryReport::Connected { directory }));
        let group_delivery = auth.capabilities.iter().any(|c| c == CAP_GROUP_DELIVERY);
        driver.send(Command::GroupRelay(GroupRelayReport::Connected {
            group_delivery,
        }));
        // After the engine heard of it: a listener of the event reads the relay as up.
        driver.send(Command::Emit(ClientEvent::RelayStatusChanged {
            connected: true,
            authenticated: true,
        }));
        session
    }

    pub(super) async fn run(mut self, rx: &mut mpsc::UnboundedReceiver<RelayOut>) -> Loss {
        // Writes come first: the declaration (or the drain's first frame) is due the moment the
        // session starts, before anything has woken the loop.
        let loss = loop {
            if let Err(loss) = self.flush_and_check().await {
                break loss;
            }
            let wake = self.next_wake();
            let reading = self.may_read();
            let paused = !self.listening();
            let step = tokio::select! {
                cmd = rx.recv() => self.on_command(cmd),
                msg = self.stream.next(), if reading => self.on_socket(msg),
                loss = self.writer.failed() => Err(loss),
                () = self.intake.caught_up(self.driver), if self.intake.waiting() => {
                    if paused {
                        // The relay's silence counts from now again.
                        self.last_heard = Instant::now();
                    }
                    Ok(())
                }
                _ = sleep_until(wake.into()) => Ok(()),
            };
            if let Err(loss) = step {
                break loss;
            }
        };
        self.teardown(&loss);
        self.writer.finish(CLOSE_WAIT).await;
        loss
    }

    /// Reading waits while the driver is behind on this connection's frames, or while too
    /// many frames are owed to the relay: what a flood leaves is bounded (`intake.rs`).
    fn may_read(&self) -> bool {
        self.intake.open() && self.acks.len() + self.releases.backlog() < MAX_OWED_FRAMES
    }

    /// The relay's silence counts only while we read: a stalled application pausing intake
    /// must not pass for a dead connection, whose reconnect would read on.
    fn listening(&self) -> bool {
        self.intake.open()
    }

    fn next_wake(&self) -> Instant {
        let now = Instant::now();
        let mut wake = self.last_ping + PING_EVERY;
        if self.listening() {
            wake = wake.min(self.last_heard + DEAD_AFTER);
        }
        if let Some(first) = self.answers.next_deadline() {
            wake = wake.min(first);
        }
        if self.has_frames() {
            wake = wake.min(self.bucket.next_token_at(now));
        }
        if let Some(at) = self.presence.next_wake() {
            wake = wake.min(at.max(self.bucket.next_token_at(now)));
        }
        wake
    }

    fn on_command(&mut self, cmd: Option<RelayOut>) -> Result<(), Loss> {
        match cmd {
            None | Some(RelayOut::Stop) => Err(Loss::Stopped),
            Some(RelayOut::Submit(Submit::Outbox {
                id,
                send_seq,
                recipient,
                frame,
            })) => {
                self.sends.push_back((id, send_seq, recipient, frame));
                Ok(())
            }
            Some(RelayOut::Submit(Submit::Ack { frame })) => {
                self.acks.push_back(frame);
                Ok(())
            }
            Some(RelayOut::Setup(frame)) => {
                self.acks.push_back(frame.encode());
                Ok(())
            }
            Some(RelayOut::Group(frame)) => {
                self.groups.push_back(frame.encode());
                Ok(())
            }
            Some(RelayOut::ReleaseFrame { seq }) => {
                self.releases.release(seq);
                Ok(())
            }
            Some(RelayOut::Watch(peer)) => {
                self.presence.watch(peer);
                Ok(())
            }
            Some(RelayOut::Unwatch(peer)) => {
                self.presence.unwatch(&peer);
                Ok(())
            }
            Some(RelayOut::Hint(false)) => Err(Loss::Offline),
            Some(RelayOut::Reconnect) => Err(Loss::Reconnect),
            // The next connect reads the token.
            Some(RelayOut::Hint(true) | RelayOut::TokenChanged) => Ok(()),
            Some(RelayOut::Redeliver) => Err(Loss::Redeliver),
        }
    }

    fn on_socket(
        &mut self,
        msg: Option<Result<WsMessage, tokio_tungstenite::tungstenite::Error>>,
    ) -> Result<(), Loss> {
        let msg = match msg {
            None => return Err(Loss::Dropped("connection closed".into())),
            Some(Err(e)) => {
                self.violation = close_code_for(&e);
                return Err(Loss::Dropped(format!("read failed: {e}")));
            }
            Some(Ok(msg)) => msg,
        };
        self.last_heard = Instant::now();
        match msg {
            WsMessage::Text(text) => {
                self.intake.took(text.len(), self.driver);
                self.on_frame(text.as_str())
            }
            WsMessage::Close(frame) => Err(close_loss(frame.as_ref())),
            // Pings are answered by tungstenite on the next write or flush.
            _ => Ok(()),
        }
    }

    fn on_frame(&mut self, text: &str) -> Result<(), Loss> {
        let frame = match RelayFrame::decode(text) {
            Ok(frame) => frame,
            Err(DecodeError::UnknownType(_)) => {
                self.forward(text);
                return Ok(());
            }
            Err(e) => {
                diagnostic(
                    self.driver,
                    DiagnosticLevel::Warn,
                    format!("dropped relay frame: {e}"),
                );
                return Ok(());
            }
        };
        let Some(frame) = self.answers.take_answer(self.driver, frame) else {
            return Ok(());
        };
        match frame {
            RelayFrame::MessageReceived {
                seq,
                sender,
                sender_account,
                content,
                ..
            } => {
                self.on_inbound(seq, sender, sender_account, &content);
            }
            RelayFrame::GroupMessageReceived {
                group_id,
                sender,
                content,
                seq,
                ..
            } => self.on_group_inbound(seq, sender, &group_id, &content),
            RelayFrame::GroupMessageSent {
                group_id,
                message_id,
                delivered,
                pushed,
                missed,
                ..
            } => self.driver.input(Input::GroupReport(GroupReport {
                group_id,
                message_id,
                delivered,
                pushed,
                missed: missed
                    .into_iter()
                    .map(|m| (m.username, courier_proto::quoted(&m.reason)))
                    .collect(),
            })),
            RelayFrame::GroupError {
                reason,
                message_id: Some(message_id),
                ..
            } => self.driver.input(Input::GroupRefused {
                message_id,
                reason: courier_proto::quoted(&reason),
            }),
            RelayFrame::GroupError {
                reason,
                group_id: Some(group_id),
                message_id: None,
            } => self.group_report(GroupRelayReport::Refused {
                group_id,
                reason: courier_proto::quoted(&reason),
            }),
            RelayFrame::GroupCreated { group_id, .. } => {
                self.group_report(GroupRelayReport::Created { group_id })
            }
            RelayFrame::GroupMemberAdded {
                group_id, user_id, ..
            } => self.group_report(GroupRelayReport::MemberAdded {
                group_id,
                member: user_id,
            }),
            RelayFrame::GroupMemberRemoved {
                group_id, user_id, ..
            } => self.group_report(GroupRelayReport::MemberRemoved {
                group_id,
                member: user_id,
            }),
            RelayFrame::DrainComplete { count } => self.driver.input(Input::DrainComplete {
                carrier: Carrier::Relay,
                count,
            }),
            RelayFrame::RateLimited {
                retry_after_ms,
                message_id,
                seq,
                ..
            } => {
                self.bucket
                    .back_off(Duration::from_millis(retry_after_ms.max(1)), Instant::now());
                if let Some(id) = &message_id {
                    let reason = "rate limited by the relay".to_owned();
                    self.answers.fail(self.driver, id, reason);
                }
                // A dropped `Ack`/`AckUpTo` names its seq: released again, it goes out again
                // (as an `AckUpTo` when it still covers only processed frames).
                if let Some(seq) = seq {
                    self.releases.release(seq);
                }
                self.forward(text);
            }
            RelayFrame::SessionSuperseded { reason } => {
                return Err(Loss::Superseded(courier_proto::quoted(&reason)))
            }
            RelayFrame::KeyPackagesPublished {
                available,
                last_resort,
            } => self.directory_report(DirectoryReport::Published {
                available,
                last_resort,
            }),
            RelayFrame::KeyPackage {
                address, package, ..
            } => self.directory_report(DirectoryReport::Package {
                address,
                package: package.as_bytes().to_vec(),
            }),
            RelayFrame::KeyPackageUnavailable { address } => {
                self.directory_report(DirectoryReport::Unavailable { address })
            }
            RelayFrame::AddressDeclared { ref address } => {
                // Checked and reported, never acted on (`docs/protocol.md#client-declaration`).
                if self.declared.as_deref().is_some_and(|own| own != address) {
                    self.security_warning(
                        address.clone(),
                        RELAY_ADDRESS_BINDING_MISMATCH,
                        "the relay bound an address other than the one this device declared",
                    );
                }
                self.forward(text);
            }
            RelayFrame::AddressError { .. } => {
                let own = self.declared.clone().unwrap_or_default();
                self.security_warning(
                    own,
                    RELAY_ADDRESS_DECLARATION_REFUSED,
                    "the relay refused this device's address declaration: new end-to-end sessions cannot be set up over it",
                );
                self.forward(text);
            }
            RelayFrame::PresenceStatus {
                user_id,
                online,
                last_seen,
            } => {
                // It names a peer in an event: an identifier (`docs/protocol.md#identifiers`), or
                // dropped unquoted.
                if let Err(e) = validate_identifier(&user_id) {
                    diagnostic(
                        self.driver,
                        DiagnosticLevel::Warn,
                        format!("dropped relay frame: PresenceStatus user_id {e}"),
                    );
                    return Ok(());
                }
                self.driver.input(Input::Presence {
                    peer: user_id,
                    online,
                    // Published relays may send an ISO-8601 string; only epoch ms is kept.
                    last_seen_ms: last_seen.and_then(|v| v.as_u64()),
                });
            }
            RelayFrame::Error {
                code,
                message_id: Some(id),
                ..
            } if code == "internal" => {
                let reason = "relay storage failure".to_owned();
                self.answers.fail(self.driver, &id, reason);
                self.forward(text);
            }
            _ => self.forward(text),
        }
        Ok(())
    }

    fn on_inbound(
        &mut self,
        seq: Option<u64>,
        sender: String,
        sender_account: Option<String>,
        content: &str,
    ) {
        if let Some(seq) = seq {
            self.releases.received(seq);
        }
        let stamp = Stamp {
            carrier: Carrier::Relay,
            sender,
            sender_account,
            seq,
        };
        match inbound_input(stamp, content) {
            Ok(input) => self.driver.input(input),
            Err(reason) => {
                diagnostic(self.driver, DiagnosticLevel::Warn, reason);
                self.release(seq);
            }
        }
    }

    /// A relay broadcast copy: its content is the group message's envelope, which must name
    /// the group the frame does (`docs/protocol.md#group-messages`).
    fn on_group_inbound(
        &mut self,
        seq: Option<u64>,
        sender: String,
        group_id: &str,
        content: &str,
    ) {
        let names_group = Message::decode(content)
            .ok()
            .is_some_and(|m| m.metadata.get(META_GROUP_ID).map(String::as_str) == Some(group_id));
        if !names_group {
            if let Some(seq) = seq {
                self.releases.received(seq);
            }
            diagnostic(
                self.driver,
                DiagnosticLevel::Warn,
                format!("dropped a group message from {sender}: it does not name group {group_id}"),
            );
            self.release(seq);
            return;
        }
        self.on_inbound(seq, sender, None, content);
    }

    fn group_report(&self, report: GroupRelayReport) {
        self.driver.send(Command::GroupRelay(report));
    }

    /// A dropped frame is still released at the relay (`docs/protocol.md#client-processing-order`).
    fn release(&mut self, seq: Option<u64>) {
        if let Some(seq) = seq {
            self.releases.release(seq);
        }
    }

    fn security_warning(&self, peer_id: String, reason_code: &'static str, reason: &'static str) {
        report::security_warning(self.driver, peer_id, reason_code, reason);
    }

    fn directory_report(&self, report: DirectoryReport) {
        self.driver.send(Command::Directory(report));
    }

    fn forward(&self, text: &str) {
        self.driver
            .send(Command::Emit(ClientEvent::RelayServerMessage {
                json: text.to_owned(),
            }));
    }

    fn has_frames(&self) -> bool {
        self.releases.has_frame()
            || !self.acks.is_empty()
            || !self.sends.is_empty()
            || !self.groups.is_empty()
    }

    /// Writes what the bucket can fund, then enforces the write-ack and keepalive deadlines.
    async fn flush_and_check(&mut self) -> Result<(), Loss> {
        let now = Instant::now();
        // Unmetered (`docs/protocol.md#rate-limiting`), and first.
        if let Some(frame) = self.declaration.take() {
            self.write(frame)?;
        }
        while self.has_frames() {
            if !self.bucket.try_take(Instant::now()) {
                break;
            }
            if let Some(frame) = self.releases.next_frame() {
                self.write_paid(frame.encode())?;
            } else if let Some(frame) = self.acks.pop_front() {
                self.write_paid(frame)?;
            } else if let Some(frame) = self.groups.pop_front() {
                self.write_paid(frame)?;
            } else if let Some((id, send_seq, recipient, frame)) = self.sends.pop_front() {
                self.write_paid(frame)?;
                self.driver.input(Input::Written {
                    id: id.clone(),
                    send_seq,
                });
                self.answers.written(id, send_seq, recipient);
            }
        }
        // Presence comes last in the funding order (`docs/protocol.md#rate-limiting`); a poll the
        // bucket cannot fund waits for the next tick.
        if self.presence.has_frame(now) {
            for frame in self.presence.take_frames(now) {
                // The relay charges a watch per identifier it names, or by its size if more.
                let identifiers = match &frame {
                    ClientFrame::WatchPresence { users } => {
                        u32::try_from(users.len()).unwrap_or(u32::MAX)
                    }
                    _ => 1,
                };
                let text = frame.encode();
                let cost = identifiers.max(courier_proto::limits::rate_cost(text.len()));
                if !self.bucket.try_take_cost(cost, Instant::now()) {
                    break;
                }
                self.write(text)?;
            }
        }
        self.answers.expire(self.driver, now);
        if self.listening() && now >= self.last_heard + DEAD_AFTER {
            // Best effort, not waited for (`docs/protocol.md#transport`).
            let _ = self
                .writer
                .write(close_message(close::KEEPALIVE_TIMEOUT, "keepalive"));
            return Err(Loss::Dropped("keepalive timeout".into()));
        }
        if now >= self.last_ping + PING_EVERY {
            self.last_ping = now;
            self.writer.write(WsMessage::Ping(Default::default()))?;
        }
        Ok(())
    }

    /// [`Self::write`] for a frame the token just taken admitted: what its size costs beyond
    /// that token is owed, as the relay counts it (`docs/protocol.md#rate-limiting`).
    fn write_paid(&mut self, frame: String) -> Result<(), Loss> {
        let cost = courier_proto::limits::rate_cost(frame.len());
        self.bucket.owe(cost - 1);
        self.write(frame)
    }

    /// Hands a frame to the writer (`writer.rs`), which writes what it is handed in order.
    fn write(&mut self, frame: String) -> Result<(), Loss> {
        self.writer.write(WsMessage::text(frame))
    }

    /// Every send not yet answered is a transmission failure; the engine re-queues it.
    fn teardown(&mut self, loss: &Loss) {
        let close = match loss {
            Loss::Stopped | Loss::Offline | Loss::Reconnect => Some(close::NORMAL),
            _ => self.violation,
        };
        if let Some(code) = close {
            let _ = self.writer.write(close_message(code, ""));
        }
        self.presence.disconnected();
        self.directory_report(DirectoryReport::Disconnected);
        self.group_report(GroupRelayReport::Disconnected);
        self.driver.input(Input::CarrierDown(Carrier::Relay));
        self.answers.connection_lost(self.driver);
        for (id, send_seq, _, _) in self.sends.drain(..) {
            self.driver.input(Input::SendFailed {
                id,
                send_seq,
                reason: "relay connection lost".into(),
            });
        }
        self.driver
            .send(Command::Emit(ClientEvent::RelayStatusChanged {
                connected: false,
                authenticated: false,
            }));
    }
}
