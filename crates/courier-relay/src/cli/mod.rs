//! Command line of the `courier-relay` binary (and of `npx courier-relay`): the relay's options,
//! or the gateway daemon's after `gateway`. Every option can also be set by an environment
//! variable and by a key of the TOML file `--config` names; the command line wins over the
//! environment, which wins over the file (`docs/operating-the-relay.md#configuration`).

mod file;
mod gateway;
mod relay;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};

use self::gateway::GatewaySettings;
use self::relay::RelaySettings;
use crate::logging::Logging;
use crate::{GatewayConfig, RelayConfig};

const PROGRAM: &str = "courier-relay";

const LAYERS: &str = "\
Every option can also be set by the environment variable shown with it, and by a key of the
file named by --config, spelled like the option without its dashes (listen = \"0.0.0.0:8080\").
The command line wins over the environment, which wins over the file.";

/// The relay's command line.
#[derive(Parser)]
#[command(
    name = PROGRAM,
    version,
    next_line_help = true,
    about = "courier-relay: the offline-courier relay server",
    override_usage = "courier-relay --jwt-secret-file FILE (--db PATH | --memory) [OPTIONS]\n       \
                      courier-relay gateway [OPTIONS]    (see courier-relay gateway --help)",
    after_help = LAYERS,
)]
struct RelayCli {
    /// TOML file holding any of the options below
    #[arg(long, env = "COURIER_RELAY_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,

    #[command(flatten)]
    settings: RelaySettings,
}

/// The gateway daemon's command line, after `gateway`.
#[derive(Parser)]
#[command(
    name = PROGRAM,
    bin_name = "courier-relay gateway",
    version,
    next_line_help = true,
    about = "courier-relay gateway: a minimal offline-courier gateway daemon\n\n\
             Devices attach over TCP with newline-delimited JSON (Identify, Challenge,\n\
             DeclareAddress, AddressDeclared); bound devices then exchange SendMessage /\n\
             MessageReceived, in memory only.",
    after_help = LAYERS,
)]
struct GatewayCli {
    /// TOML file holding any of the options below
    #[arg(long, env = "COURIER_RELAY_GATEWAY_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,

    #[command(flatten)]
    settings: GatewaySettings,
}

/// A command line that cannot be run, in one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(String);

impl UsageError {
    fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// A server to start, and the logs its command line chose.
#[derive(Debug, Clone)]
pub struct Launch<C> {
    pub config: C,
    pub logging: Logging,
}

/// What a command line asks for.
// Parsed once at startup, so the size differences between the variants (here and in
// `Command`) do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Parsed<C> {
    /// `--help` or `--version`: print this on stdout and exit successfully.
    Print(String),
    Run(Launch<C>),
}

/// The whole command line of the binary: the relay, or the gateway daemon when the first
/// argument is `gateway`.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Command {
    Relay(Parsed<RelayConfig>),
    Gateway(Parsed<GatewayConfig>),
}

/// Parses the arguments that follow the program name, `gateway` subcommand included.
pub fn parse_command(args: &[String]) -> Result<Command, UsageError> {
    match args.split_first() {
        Some((first, rest)) if first == "gateway" => parse_gateway(rest).map(Command::Gateway),
        _ => parse_relay(args).map(Command::Relay),
    }
}

/// Parses the relay's arguments (never the `gateway` subcommand). Reads the files they name
/// (config, secret, TLS PEMs), so a `Run` config is complete.
pub fn parse_relay(args: &[String]) -> Result<Parsed<RelayConfig>, UsageError> {
    let (cli, matches) = match read::<RelayCli>(relay_command(), args)? {
        Read::Print(text) => return Ok(Parsed::Print(text)),
        Read::Options(cli, matches) => (cli, matches),
    };
    let file: RelaySettings = file::load(cli.config.as_deref())?;
    // Switches are `false` both unset and set to false: only the source tells them apart.
    let given = |id: &str| {
        matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    };
    let (config, logging) = cli.settings.over(file, given).into_config()?;
    Ok(Parsed::Run(Launch { config, logging }))
}

/// Parses the arguments that follow `courier-relay gateway`.
pub fn parse_gateway(args: &[String]) -> Result<Parsed<GatewayConfig>, UsageError> {
    let (cli, matches) = match read::<GatewayCli>(gateway_command(), args)? {
        Read::Print(text) => return Ok(Parsed::Print(text)),
        Read::Options(cli, matches) => (cli, matches),
    };
    let file: GatewaySettings = file::load(cli.config.as_deref())?;
    let given = |id: &str| {
        matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    };
    let (config, logging) = cli.settings.over(file, given).into_config()?;
    Ok(Parsed::Run(Launch { config, logging }))
}

/// A command line as clap read it.
enum Read<P> {
    /// `--help` or `--version`, which clap reports as errors that carry the text to print.
    Print(String),
    /// The options the command line and the environment set, and where each came from.
    Options(P, ArgMatches),
}

fn read<P: FromArgMatches>(command: clap::Command, args: &[String]) -> Result<Read<P>, UsageError> {
    let argv = std::iter::once(PROGRAM).chain(args.iter().map(String::as_str));
    match command.try_get_matches_from(argv) {
        Ok(matches) => {
            let options = P::from_arg_matches(&matches).map_err(|e| one_line(&e))?;
            Ok(Read::Options(options, matches))
        }
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            Ok(Read::Print(e.to_string()))
        }
        Err(e) => Err(one_line(&e)),
    }
}

/// What `courier-relay --help` prints.
pub fn relay_help() -> String {
    relay_command().render_help().to_string()
}

/// What `courier-relay gateway --help` prints.
pub fn gateway_help() -> String {
    gateway_command().render_help().to_string()
}

// Help lists the variables' names, never their values: one may name a secret's file.
fn relay_command() -> clap::Command {
    RelayCli::command().mut_args(|arg| arg.hide_env_values(true))
}

fn gateway_command() -> clap::Command {
    GatewayCli::command().mut_args(|arg| arg.hide_env_values(true))
}

/// clap's message without its usage and hints, on one line, with its suggestion if it has one.
fn one_line(e: &clap::Error) -> UsageError {
    let rendered = e.to_string();
    let head = rendered.split("\n\n").next().unwrap_or_default();
    let joined = head
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let mut message = joined.strip_prefix("error: ").unwrap_or(&joined).to_owned();
    if let Some(ContextValue::String(suggested)) = e.get(ContextKind::SuggestedArg) {
        message.push_str(&format!(" (did you mean {suggested}?)"));
    }
    UsageError(message)
}

fn socket_addr(value: &str) -> Result<SocketAddr, String> {
    value
        .parse()
        .map_err(|_| "expects IP:PORT (like 127.0.0.1:8080)".to_owned())
}

fn positive<T: FromStr>(value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| "expects a positive integer".to_owned())
}

fn read_file(flag: &str, path: &Path) -> Result<String, UsageError> {
    std::fs::read_to_string(path)
        .map_err(|e| UsageError(format!("cannot read {flag} {}: {e}", path.display())))
}

#[cfg(test)]
mod tests;
