//! `Gateway.start` and `npx courier-relay gateway`: the gateway daemon of
//! `courier-relay gateway`, in this process.

use courier_relay::cli::{self, Command, GatewayCommand};
use courier_relay::{start_gateway, GatewayConfig, GatewayHandle};
use napi::bindgen_prelude::*;
use napi_derive::napi;

use crate::coded;
use crate::running::Running;

#[napi]
pub struct NativeGateway {
    handle: Running<GatewayHandle>,
    address: String,
    port: u16,
}

#[napi]
impl NativeGateway {
    /// Binds `listen` (`127.0.0.1:0` picks a free port) and serves until `stop()`.
    #[napi(factory)]
    pub async fn start(listen: String) -> Result<NativeGateway> {
        let listen = listen.parse().map_err(|_| {
            coded(
                "ERR_CONFIG",
                format!("listen must be an address like 127.0.0.1:0, got {listen:?}"),
            )
        })?;
        serve(GatewayConfig::new(listen)).await
    }

    /// Starts a gateway from the arguments that follow `courier-relay gateway`.
    #[napi(factory)]
    pub async fn start_from_args(args: Vec<String>) -> Result<NativeGateway> {
        let args: Vec<String> = std::iter::once("gateway".to_owned()).chain(args).collect();
        match cli::parse_command(&args).map_err(|e| coded("ERR_CONFIG", e))? {
            Command::Gateway(GatewayCommand::Run(config)) => serve(config).await,
            Command::Gateway(GatewayCommand::Help) => {
                Err(coded("ERR_CONFIG", "--help has no gateway to start"))
            }
            Command::Relay(_) => Err(coded("ERR_INTERNAL", "not a gateway command line")),
        }
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

    #[napi]
    pub async fn stop(&self) -> Result<()> {
        if let Some(handle) = self.handle.take()? {
            handle.stop().await;
        }
        Ok(())
    }
}

async fn serve(config: GatewayConfig) -> Result<NativeGateway> {
    let handle = start_gateway(config)
        .await
        .map_err(|e| coded("ERR_RELAY", e))?;
    Ok(NativeGateway {
        address: handle.local_addr().to_string(),
        port: handle.port(),
        handle: Running::new(handle),
    })
}

#[napi]
pub fn gateway_cli_help() -> String {
    cli::GATEWAY_HELP.to_owned()
}
