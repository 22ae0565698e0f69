//! Token revocation (`docs/operating-the-relay.md#revoking-tokens`): a deny list of
//! `account not-before` lines. A token of a listed account issued (`iat`) before its time is
//! refused, and connections that authenticated with one are closed. The file is re-read when it
//! changes, so an operator revokes without a restart.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;

use crate::{stopping, Ctx, RelayError};

/// Accounts whose tokens issued before a time (seconds since the epoch) are revoked.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct DenyList(HashMap<String, u64>);

impl DenyList {
    /// Lines of `account not-before`; blank lines and `#` comments are skipped. A listed account
    /// listed again keeps its latest time.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut list = HashMap::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let at = |what: &str| format!("line {}: {what}", number + 1);
            let mut words = line.split_whitespace();
            let (Some(account), Some(not_before), None) =
                (words.next(), words.next(), words.next())
            else {
                return Err(at("expected `account not-before-seconds`"));
            };
            courier_proto::validate_account_name(account)
                .map_err(|e| at(&format!("account {account:?} {e}")))?;
            let not_before: u64 = not_before
                .parse()
                .map_err(|_| at("not-before must be seconds since the epoch"))?;
            let latest = list.entry(account.to_owned()).or_insert(not_before);
            *latest = (*latest).max(not_before);
        }
        Ok(Self(list))
    }

    /// Whether a token of `account` issued at `issued_at` is revoked.
    pub fn revokes(&self, account: &str, issued_at: u64) -> bool {
        self.0
            .get(account)
            .is_some_and(|not_before| issued_at < *not_before)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// The deny list in force; every connection holds a receiver and re-checks its token on
/// change.
pub(crate) type Revocations = watch::Receiver<Arc<DenyList>>;

/// The file a deny list is read from, and what it looked like when last read.
pub(crate) struct DenyFile {
    path: PathBuf,
    seen: Option<(SystemTime, u64)>,
}

impl DenyFile {
    /// Reads the list at startup: a missing or malformed file stops the relay from starting.
    pub fn open(path: &Path) -> Result<(Self, DenyList), RelayError> {
        let mut file = Self {
            path: path.to_owned(),
            seen: None,
        };
        let list = file
            .read()
            .map_err(|e| RelayError::Config(format!("--revoked-tokens {}: {e}", path.display())))?;
        Ok((file, list))
    }

    fn read(&mut self) -> Result<DenyList, String> {
        let meta = std::fs::metadata(&self.path).map_err(|e| e.to_string())?;
        let text = std::fs::read_to_string(&self.path).map_err(|e| e.to_string())?;
        let list = DenyList::parse(&text)?;
        self.seen = Some(stamp(&meta));
        Ok(list)
    }

    /// The new list if the file changed since it was last read. A file that cannot be read or
    /// parsed leaves the list in force as it was: a half-written edit must not lift revocations.
    fn reload(&mut self) -> Option<DenyList> {
        let now = std::fs::metadata(&self.path).ok().map(|m| stamp(&m));
        if now.is_some() && now == self.seen {
            return None;
        }
        match self.read() {
            Ok(list) => Some(list),
            Err(e) => {
                if now != self.seen {
                    tracing::warn!(file = %self.path.display(), error = %e, "revoked tokens not reloaded; the previous list stays in force");
                    self.seen = now;
                }
                None
            }
        }
    }
}

fn stamp(meta: &std::fs::Metadata) -> (SystemTime, u64) {
    (
        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        meta.len(),
    )
}

/// Re-reads the file every `revocation_poll` until the relay stops.
pub(crate) async fn watch_file(
    ctx: Arc<Ctx>,
    mut file: DenyFile,
    list: watch::Sender<Arc<DenyList>>,
) {
    let mut shutdown = ctx.shutdown.clone();
    let mut tick = tokio::time::interval(ctx.timings.revocation_poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stopping(&mut shutdown) => return,
            _ = tick.tick() => {
                if let Some(new) = file.reload() {
                    tracing::info!(file = %file.path.display(), accounts = new.len(), "revoked tokens reloaded");
                    list.send_replace(Arc::new(new));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_an_account_and_a_time() {
        let list = DenyList::parse(
            "# stolen laptop\nalice 1700000000\n\nbob 5 # test\nalice 1600000000\n",
        )
        .unwrap();
        assert!(list.revokes("alice", 1_699_999_999));
        assert!(!list.revokes("alice", 1_700_000_000));
        assert!(list.revokes("bob", 4));
        assert!(!list.revokes("carol", 0));
        assert!(DenyList::parse("alice").is_err());
        assert!(DenyList::parse("alice soon").is_err());
        assert!(DenyList::parse("a/b 5").is_err());
        assert!(DenyList::parse("alice 5 6").is_err());
    }
}
