//! Where each relay connection's token comes from (`docs/protocol.md#reconnection`): a fixed
//! token the application may replace with `setAuthToken`, or the application's provider, asked
//! at every connect so a long-lived app never presents an expired one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::driver::{Command, DriverTx};

/// How long a connect waits for the provider's token.
pub const PROVIDER_TIMEOUT: Duration = Duration::from_secs(10);

/// What an application's provider answered: a token, or why it has none.
pub type Provided = Result<String, String>;

/// The source of the relay token, shared by the client (which changes it or answers for the
/// provider) and the carrier (which reads it at every connect).
#[derive(Clone)]
pub enum TokenSource {
    Fixed(Arc<Mutex<String>>),
    Provided(ProviderRequests),
}

impl std::fmt::Debug for TokenSource {
    // A token is a bearer credential: never in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fixed(_) => f.write_str("Fixed(<redacted>)"),
            Self::Provided(_) => f.write_str("Provided"),
        }
    }
}

impl TokenSource {
    pub fn fixed(token: String) -> Self {
        Self::Fixed(Arc::new(Mutex::new(token)))
    }

    /// The token for the connect about to start; `Err` says why there is none.
    pub(super) async fn token(&self, driver: &DriverTx) -> Result<String, String> {
        match self {
            Self::Fixed(token) => Ok(token.lock().unwrap_or_else(PoisonError::into_inner).clone()),
            Self::Provided(requests) => requests.ask(driver).await,
        }
    }
}

/// The provider's requests still waiting for an answer, by id. An answer that comes after its
/// connect gave up finds nobody and is dropped.
#[derive(Clone, Default)]
pub struct ProviderRequests(Arc<Mutex<Pending>>);

#[derive(Default)]
struct Pending {
    next: u64,
    waiting: HashMap<u64, oneshot::Sender<Provided>>,
}

impl ProviderRequests {
    async fn ask(&self, driver: &DriverTx) -> Result<String, String> {
        let (tx, rx) = oneshot::channel();
        let request = {
            let mut pending = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            pending.next += 1;
            let request = pending.next;
            pending.waiting.insert(request, tx);
            request
        };
        driver.send(Command::TokenWanted { request });
        let answer = tokio::time::timeout(PROVIDER_TIMEOUT, rx).await;
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .waiting
            .remove(&request);
        match answer {
            Ok(Ok(provided)) => provided,
            Ok(Err(_)) => Err("the client is stopping".into()),
            Err(_) => Err(format!(
                "the token provider did not answer within {} s",
                PROVIDER_TIMEOUT.as_secs()
            )),
        }
    }

    /// The application's answer to `request`; false when no connect waits for it any more.
    pub fn answer(&self, request: u64, provided: Provided) -> bool {
        let waiting = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .waiting
            .remove(&request);
        waiting.is_some_and(|tx| tx.send(provided).is_ok())
    }
}
