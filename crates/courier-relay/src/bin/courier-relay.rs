//! `courier-relay`: runs the relay until SIGINT or SIGTERM.

use std::io::Write;
use std::process::ExitCode;

use courier_relay::cli::{self, CliCommand, Command, GatewayCommand};

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .init();

    let args: Result<Vec<String>, _> = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect();
    let Ok(args) = args else {
        eprintln!("courier-relay: arguments must be valid UTF-8");
        return ExitCode::from(2);
    };
    let config = match cli::parse_command(&args) {
        Ok(Command::Relay(CliCommand::Help)) => {
            print!("{}", cli::HELP);
            return ExitCode::SUCCESS;
        }
        Ok(Command::Relay(CliCommand::Run(config))) => config,
        Ok(Command::Gateway(GatewayCommand::Help)) => {
            print!("{}", cli::GATEWAY_HELP);
            return ExitCode::SUCCESS;
        }
        Ok(Command::Gateway(GatewayCommand::Run(config))) => return run_gateway(config).await,
        Err(message) => {
            eprintln!("courier-relay: {message} (see --help)");
            return ExitCode::from(2);
        }
    };
    let relay = match courier_relay::start(config).await {
        Ok(relay) => relay,
        Err(e) => {
            eprintln!("courier-relay: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Scripts and tests wait for this exact line.
    println!("courier-relay listening on {}", relay.url());
    let _ = std::io::stdout().flush();

    wait_for_signal().await;
    tracing::info!("stopping");
    relay.stop().await;
    ExitCode::SUCCESS
}

async fn run_gateway(config: courier_relay::GatewayConfig) -> ExitCode {
    let gateway = match courier_relay::start_gateway(config).await {
        Ok(gateway) => gateway,
        Err(e) => {
            eprintln!("courier-relay gateway: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Scripts and tests wait for this exact line.
    println!(
        "courier-relay gateway listening on {}",
        gateway.local_addr()
    );
    let _ = std::io::stdout().flush();

    wait_for_signal().await;
    tracing::info!("stopping");
    gateway.stop().await;
    ExitCode::SUCCESS
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
