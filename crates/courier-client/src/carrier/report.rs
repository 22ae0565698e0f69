//! How a carrier tells the application what happened to it: diagnostics under its own target,
//! and security warnings whose `reason` is a fixed local text (a peer's own wording never
//! reaches an event, `docs/protocol.md#security-warnings`).

use courier_engine::{DiagnosticLevel, Event};

use crate::driver::{Command, DriverTx};
use crate::event::ClientEvent;

pub fn diagnostic(
    driver: &DriverTx,
    target: &'static str,
    level: DiagnosticLevel,
    message: String,
) {
    driver.send(Command::Emit(ClientEvent::Diagnostic {
        level,
        message,
        target,
    }));
}

pub fn security_warning(
    driver: &DriverTx,
    peer_id: String,
    reason_code: &'static str,
    reason: &'static str,
) {
    driver.send(Command::Emit(ClientEvent::Engine(Box::new(
        Event::SecurityWarning {
            peer_id,
            reason_code,
            reason: reason.to_owned(),
        },
    ))));
}
