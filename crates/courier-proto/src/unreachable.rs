//! Why a recipient cannot be reached: the detail of a `DeliveryError` whose reason starts with
//! `recipient_unreachable` (`docs/protocol.md#sending`). The relay and the gateway daemon write
//! it; the client parks the message and reports the cause as `message_undeliverable.reasonCode`.

use crate::limits::RECIPIENT_UNREACHABLE;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnreachableCause {
    /// The identifier names no known account or bound address.
    UnknownRecipient,
    /// Known, not connected, and nothing can keep the frame for it.
    OfflineNoMailbox,
    /// Keeping the frame would pass the recipient's mailbox limits.
    MailboxFull,
    /// The verdict came without one of the details above (a relay written elsewhere may say
    /// only `recipient_unreachable`, or a detail of its own).
    Unspecified,
}

impl UnreachableCause {
    /// The stable code: the wire detail, or `unspecified`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownRecipient => "unknown_recipient",
            Self::OfflineNoMailbox => "offline_no_mailbox",
            Self::MailboxFull => "mailbox_full",
            Self::Unspecified => "unspecified",
        }
    }

    /// The cause an unreachable verdict's `reason` gives, or `None` when `reason` is no such
    /// verdict (a refusal).
    pub fn of_reason(reason: &str) -> Option<Self> {
        let detail = reason.strip_prefix(RECIPIENT_UNREACHABLE)?;
        if !(detail.is_empty() || detail.starts_with(':')) {
            return None;
        }
        Some(match detail.trim_start_matches(':').trim() {
            "unknown_recipient" => Self::UnknownRecipient,
            "offline_no_mailbox" => Self::OfflineNoMailbox,
            "mailbox_full" => Self::MailboxFull,
            _ => Self::Unspecified,
        })
    }

    /// A DeliveryError `reason` for this cause.
    pub fn reason(self) -> String {
        format!("{RECIPIENT_UNREACHABLE}: {}", self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_survives_the_wire() {
        for cause in [
            UnreachableCause::UnknownRecipient,
            UnreachableCause::OfflineNoMailbox,
            UnreachableCause::MailboxFull,
        ] {
            assert_eq!(UnreachableCause::of_reason(&cause.reason()), Some(cause));
        }
    }

    #[test]
    fn a_verdict_without_a_known_detail_is_unspecified_and_a_refusal_is_none() {
        let unspecified = Some(UnreachableCause::Unspecified);
        assert_eq!(
            UnreachableCause::of_reason("recipient_unreachable"),
            unspecified
        );
        assert_eq!(
            UnreachableCause::of_reason("recipient_unreachable: moon"),
            unspecified
        );
        assert_eq!(UnreachableCause::of_reason("recipient_unreachable_x"), None);
        assert_eq!(UnreachableCause::of_reason("rate_limited"), None);
    }
}
