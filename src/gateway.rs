//! `Gateway.start` and `npx courier-relay gateway`: the gateway daemon of
//! `courier-relay gateway`, in this process.

use courier_relay::cli::{self, Parsed};
use courier_relay::{start_gateway, GatewayConfig, GatewayHandle};
use napi_derive::napi;

use crate::error::{coded, config_error, Code, Result, Settled};
use crate::options::gateway_config;
use crate::running::Running;

#[napi]
pub struct NativeGateway {
    handle: Running<GatewayHandle>,
    address: String,
    port: u16,
}

#[napi]
impl NativeGateway {
    /// `options`: `GatewayOptions` as JSON text, validated here. Serves until `stop()`.
    #[napi(ts_return_type = "Promise<NativeGateway>")]
    pub async fn start(options: String) -> Settled<NativeGateway> {
        match gateway_config(&options).map_err(config_error) {
            Ok(config) => serve(config).await,
            Err(e) => Err(e),
        }
        .into()
    }

    /// Starts a gateway from the arguments that follow `courier-relay gateway` (and the
    /// environment and config file they read). The log options are not applied here.
    #[napi(ts_return_type = "Promise<NativeGateway>")]
    pub async fn start_from_args(args: Vec<String>) -> Settled<NativeGateway> {
        match cli::parse_gateway(&args).map_err(|e| coded(Code::CONFIG, e)) {
            Ok(Parsed::Run(launch)) => serve(launch.config).await,
            Ok(Parsed::Print(_)) => Err(coded(
                Code::CONFIG,
                "--help and --version have no gateway to start",
            )),
            Err(e) => Err(e),
        }
        .into()
    }

    /// `host:port`, as `transports.gateway.address` takes it.
    #[napi(getter)]
    pub fn address(&self) -> String {
        self.address.clone()
    }

    #[napi(getter)]
    pub fn port(&self) -> u32 {
        u32::from(self.port)
    }

    /// Devices bound right now (one per attached address).
    #[napi]
    pub fn bound_addresses(&self) -> Result<u32> {
        self.handle.with("the gateway is stopped", |h| {
            u32::try_from(h.bound_addresses()).unwrap_or(u32::MAX)
        })
    }

    #[napi(ts_return_type = "Promise<void>")]
    pub async fn stop(&self) -> Settled<()> {
        self.handle.stop(GatewayHandle::stop).await
    }
}

async fn serve(config: GatewayConfig) -> Result<NativeGateway> {
    let handle = start_gateway(config)
        .await
        .map_err(|e| coded(Code::RELAY, e))?;
    Ok(NativeGateway {
        address: handle.local_addr().to_string(),
        port: handle.port(),
        handle: Running::new(handle),
    })
}

#[napi]
pub fn gateway_cli_help() -> String {
    cli::gateway_help()
}
