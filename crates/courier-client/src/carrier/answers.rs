//! Sends written to an addressed carrier (the relay, a gateway) and not answered yet. The
//! carrier answers each `SendMessage` with `MessageSent` (live, or stored by a mailbox) or a
//! `DeliveryError` (the unreachable verdict, or a refusal), or fails it some other way; a send
//! it leaves unanswered for 15 s is a failed send, and so is every open one when the connection
//! ends. The carrier's own reason text never reaches an event.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use courier_engine::{CarrierAnswer, Input};
use courier_proto::{Disposition, RelayFrame, UnreachableCause};

use crate::driver::DriverTx;

pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(15);

struct Unanswered {
    send_seq: u64,
    recipient: String,
    deadline: Instant,
}

pub struct Answers {
    /// `"relay"` or `"gateway"`, for the failure reasons.
    carrier: &'static str,
    unanswered: HashMap<String, Unanswered>,
}

impl Answers {
    pub fn new(carrier: &'static str) -> Self {
        Self {
            carrier,
            unanswered: HashMap::new(),
        }
    }

    /// Attempt `send_seq` of `id` is on the wire; its answer is due within [`ANSWER_TIMEOUT`].
    pub fn written(&mut self, id: String, send_seq: u64, recipient: String) {
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        self.unanswered.insert(
            id,
            Unanswered {
                send_seq,
                recipient,
                deadline,
            },
        );
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.unanswered.values().map(|u| u.deadline).min()
    }

    /// Takes the carrier's answer to a send (`MessageSent`, `DeliveryError`); any other frame
    /// is handed back.
    pub fn take_answer(&mut self, driver: &DriverTx, frame: RelayFrame) -> Option<RelayFrame> {
        match frame {
            RelayFrame::MessageSent {
                message_id,
                disposition,
                ..
            } => self.sent(driver, message_id, disposition),
            RelayFrame::DeliveryError {
                message_id,
                recipient,
                reason,
            } => self.delivery_error(driver, message_id, &recipient, &reason),
            other => return Some(other),
        }
        None
    }

    /// `MessageSent`: the carrier took the frame, live or into its mailbox.
    fn sent(&mut self, driver: &DriverTx, id: String, disposition: Option<Disposition>) {
        if let Some(u) = self.unanswered.remove(&id) {
            let answer = match disposition {
                Some(Disposition::Stored) => CarrierAnswer::Stored,
                _ => CarrierAnswer::Live,
            };
            driver.input(Input::Answer {
                id,
                send_seq: u.send_seq,
                answer,
            });
        }
    }

    /// `DeliveryError`: the unreachable verdict, or a refusal. Without a `message_id` (the
    /// published contract) it covers every open send to `recipient`.
    fn delivery_error(
        &mut self,
        driver: &DriverTx,
        message_id: Option<String>,
        recipient: &str,
        reason: &str,
    ) {
        let unreachable = UnreachableCause::of_reason(reason);
        let ids: Vec<String> = match message_id {
            Some(id) => vec![id],
            None => self
                .unanswered
                .iter()
                .filter(|(_, u)| u.recipient == recipient)
                .map(|(id, _)| id.clone())
                .collect(),
        };
        for id in ids {
            if let Some(cause) = unreachable {
                if let Some(u) = self.unanswered.remove(&id) {
                    driver.input(Input::Answer {
                        id,
                        send_seq: u.send_seq,
                        answer: CarrierAnswer::Unreachable(cause),
                    });
                }
            } else {
                let reason = format!("{} refused the message", self.carrier);
                self.fail(driver, &id, reason);
            }
        }
    }

    /// The carrier dropped or could not take the send: a transport failure.
    pub fn fail(&mut self, driver: &DriverTx, id: &str, reason: String) {
        if let Some((id, u)) = self.unanswered.remove_entry(id) {
            driver.input(Input::SendFailed {
                id,
                send_seq: u.send_seq,
                reason,
            });
        }
    }

    /// Fails the sends whose answer is overdue at `now`.
    pub fn expire(&mut self, driver: &DriverTx, now: Instant) {
        let overdue: Vec<String> = self
            .unanswered
            .iter()
            .filter(|(_, u)| u.deadline <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in overdue {
            let reason = format!(
                "no {} answer within {} s",
                self.carrier,
                ANSWER_TIMEOUT.as_secs()
            );
            self.fail(driver, &id, reason);
        }
    }

    /// The connection ended: every open send failed.
    pub fn connection_lost(&mut self, driver: &DriverTx) {
        for (id, u) in self.unanswered.drain() {
            driver.input(Input::SendFailed {
                id,
                send_seq: u.send_seq,
                reason: format!("{} connection lost", self.carrier),
            });
        }
    }
}
