//! `courier-relay`: runs the relay (or, as `courier-relay gateway`, the gateway daemon) until
//! SIGINT or SIGTERM.

use std::io::Write;
use std::process::ExitCode;

use courier_relay::cli::{self, Command, Launch, Parsed};
use courier_relay::logging::Logging;
use courier_relay::{GatewayConfig, RelayConfig};

/// Usage errors (as `npx courier-relay` does).
const USAGE: u8 = 2;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Result<Vec<String>, _> = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect();
    let Ok(args) = args else {
        eprintln!("courier-relay: arguments must be valid UTF-8");
        return ExitCode::from(USAGE);
    };
    match cli::parse_command(&args) {
        Ok(Command::Relay(Parsed::Print(text)) | Command::Gateway(Parsed::Print(text))) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Ok(Command::Relay(Parsed::Run(launch))) => run_relay(launch).await,
        Ok(Command::Gateway(Parsed::Run(launch))) => run_gateway(launch).await,
        Err(message) => {
            eprintln!("courier-relay: {message} (see --help)");
            ExitCode::from(USAGE)
        }
    }
}

fn install(logging: &Logging) -> Result<(), ExitCode> {
    logging.install().map_err(|e| {
        eprintln!("courier-relay: {e}");
        ExitCode::from(USAGE)
    })
}

/// Scripts and tests wait for the first line this prints.
fn announce(lines: &[String]) {
    let mut stdout = std::io::stdout().lock();
    for line in lines {
        let _ = writeln!(stdout, "{line}");
    }
    let _ = stdout.flush();
}

async fn run_relay(launch: Launch<RelayConfig>) -> ExitCode {
    if let Err(code) = install(&launch.logging) {
        return code;
    }
    let relay = match courier_relay::start(launch.config).await {
        Ok(relay) => relay,
        Err(e) => {
            tracing::error!(error = %e, "the relay cannot start");
            return ExitCode::FAILURE;
        }
    };
    let mut lines = vec![format!("courier-relay listening on {}", relay.url())];
    if let Some(addr) = relay.metrics_addr() {
        lines.push(format!("courier-relay metrics listening on http://{addr}"));
    }
    let stop = Stop::listen();
    announce(&lines);
    let signal = stop.wait().await;
    tracing::info!(signal, "stopping");
    relay.stop().await;
    ExitCode::SUCCESS
}

async fn run_gateway(launch: Launch<GatewayConfig>) -> ExitCode {
    if let Err(code) = install(&launch.logging) {
        return code;
    }
    let gateway = match courier_relay::start_gateway(launch.config).await {
        Ok(gateway) => gateway,
        Err(e) => {
            tracing::error!(error = %e, "the gateway cannot start");
            return ExitCode::FAILURE;
        }
    };
    let stop = Stop::listen();
    announce(&[format!(
        "courier-relay gateway listening on {}",
        gateway.local_addr()
    )]);
    let signal = stop.wait().await;
    tracing::info!(signal, "stopping");
    gateway.stop().await;
    ExitCode::SUCCESS
}

/// SIGINT and SIGTERM, caught from the moment this is made: made before the "listening" line,
/// so a supervisor that signals as soon as it reads the line stops the process cleanly instead
/// of killing it with the default action.
#[cfg(unix)]
struct Stop {
    interrupt: Option<tokio::signal::unix::Signal>,
    terminate: Option<tokio::signal::unix::Signal>,
}

#[cfg(unix)]
impl Stop {
    fn listen() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        Self {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
        }
    }

    /// Which signal came.
    async fn wait(mut self) -> &'static str {
        async fn next(signal: &mut Option<tokio::signal::unix::Signal>) {
            match signal {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            _ = next(&mut self.interrupt) => "SIGINT",
            _ = next(&mut self.terminate) => "SIGTERM",
        }
    }
}

#[cfg(not(unix))]
struct Stop;

#[cfg(not(unix))]
impl Stop {
    fn listen() -> Self {
        Self
    }

    async fn wait(self) -> &'static str {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}
