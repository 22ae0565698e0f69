//! Errors cross to JS with their stable code as data: napi-rs builds the JS error with the
//! status of a `napi::Error<Code>` as its `code` property, and the facade turns that into a
//! `ProtocolError` without reading the message.

use std::fmt::Display;

use courier_client::config::ConfigError;
use courier_client::error::ClientError;
use napi::bindgen_prelude::{ToNapiValue, Unknown};
use napi::sys;

/// A `ProtocolError.code` (`ProtocolErrorCode` in `js/index.d.ts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Code(&'static str);

impl Code {
    pub const CONFIG: Code = Code("ERR_CONFIG");
    pub const INVALID_ARGUMENT: Code = Code("ERR_INVALID_ARGUMENT");
    pub const NOT_STARTED: Code = Code("ERR_NOT_STARTED");
    pub const RELAY: Code = Code("ERR_RELAY");
    pub const INTERNAL: Code = Code("ERR_INTERNAL");
}

impl AsRef<str> for Code {
    fn as_ref(&self) -> &str {
        self.0
    }
}

pub type Error = napi::Error<Code>;
pub type Result<T> = std::result::Result<T, Error>;

pub fn coded(code: Code, message: impl Display) -> Error {
    Error::new(code, message.to_string())
}

pub fn client_error(e: ClientError) -> Error {
    coded(Code(e.code()), e)
}

pub fn config_error(e: ConfigError) -> Error {
    client_error(e.into())
}

/// What an `async fn` of the binding returns. napi-rs rejects the Promise of an `async fn`
/// returning `Result` with a `napi::Error<Status>` only, which would lose the code; this value
/// instead becomes, on the JS thread, either the resolved value or a JS error carrying its code,
/// which the Promise is rejected with as is.
pub struct Settled<T>(pub Result<T>);

impl<T> From<Result<T>> for Settled<T> {
    fn from(result: Result<T>) -> Self {
        Self(result)
    }
}

impl<T: ToNapiValue> ToNapiValue for Settled<T> {
    unsafe fn to_napi_value(env: sys::napi_env, settled: Self) -> napi::Result<sys::napi_value> {
        match settled.0 {
            Ok(value) => unsafe { T::to_napi_value(env, value) },
            Err(e) => {
                let error = unsafe { Error::to_napi_value(env, e)? };
                // An error made from a JS value keeps that value: the Promise is rejected with it.
                Err(napi::Error::from(unsafe {
                    Unknown::from_raw_unchecked(env, error)
                }))
            }
        }
    }
}

/// One answer among many in a resolved array: the value, or the error as a JS `Error` value
/// (with its code) in its place, so one refused item does not reject the others.
pub struct Outcome<T>(pub Result<T>);

impl<T: ToNapiValue> ToNapiValue for Outcome<T> {
    unsafe fn to_napi_value(env: sys::napi_env, outcome: Self) -> napi::Result<sys::napi_value> {
        match outcome.0 {
            Ok(value) => unsafe { T::to_napi_value(env, value) },
            Err(e) => unsafe { Error::to_napi_value(env, e) },
        }
    }
}
