//! A native server handle (relay, gateway) that `stop()` takes: calls after it answer
//! `ERR_NOT_STARTED`.

use std::future::Future;
use std::sync::Mutex;

use crate::error::{coded, Code, Result, Settled};

pub(crate) struct Running<T>(Mutex<Option<T>>);

impl<T> Running<T> {
    pub(crate) fn new(handle: T) -> Self {
        Self(Mutex::new(Some(handle)))
    }

    /// `f` over the running handle; `stopped` is the error text once it was stopped.
    pub(crate) fn with<R>(&self, stopped: &str, f: impl FnOnce(&T) -> R) -> Result<R> {
        match self.lock()?.as_ref() {
            Some(handle) => Ok(f(handle)),
            None => Err(coded(Code::NOT_STARTED, stopped)),
        }
    }

    /// Takes the handle and runs `stop` on it; stopping twice is not an error.
    pub(crate) async fn stop<F: Future<Output = ()>>(
        &self,
        stop: impl FnOnce(T) -> F,
    ) -> Settled<()> {
        let handle = match self.lock() {
            Ok(mut handle) => handle.take(),
            Err(e) => return Settled(Err(e)),
        };
        if let Some(handle) = handle {
            stop(handle).await;
        }
        Settled(Ok(()))
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Option<T>>> {
        self.0
            .lock()
            .map_err(|_| coded(Code::INTERNAL, "state lock poisoned"))
    }
}
