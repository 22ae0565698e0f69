//! A native server handle (relay, gateway) that `stop()` takes: calls after it answer
//! `ERR_NOT_STARTED`.

use std::sync::Mutex;

use napi::bindgen_prelude::*;

use crate::coded;

pub(crate) struct Running<T>(Mutex<Option<T>>);

impl<T> Running<T> {
    pub(crate) fn new(handle: T) -> Self {
        Self(Mutex::new(Some(handle)))
    }

    /// `f` over the running handle; `stopped` is the error text once it was stopped.
    pub(crate) fn with<R>(&self, stopped: &str, f: impl FnOnce(&T) -> R) -> Result<R> {
        match self.lock()?.as_ref() {
            Some(handle) => Ok(f(handle)),
            None => Err(coded("ERR_NOT_STARTED", stopped)),
        }
    }

    /// The handle, to stop it; `None` when it was already taken.
    pub(crate) fn take(&self) -> Result<Option<T>> {
        Ok(self.lock()?.take())
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Option<T>>> {
        self.0
            .lock()
            .map_err(|_| coded("ERR_INTERNAL", "state lock poisoned"))
    }
}
