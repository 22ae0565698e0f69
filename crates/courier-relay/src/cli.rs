//! Command line of the `courier-relay` binary (and of `npx courier-relay`).

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::gateway::DEFAULT_LISTEN as GATEWAY_DEFAULT_LISTEN;
use crate::{GatewayConfig, MailboxLimits, RelayConfig, Storage, TlsConfig};

pub const HELP: &str = "\
courier-relay: the offline-courier relay server

USAGE:
    courier-relay --jwt-secret-file FILE (--db PATH | --memory) [OPTIONS]
    courier-relay gateway [--listen ADDR]     (see courier-relay gateway --help)

OPTIONS:
    --listen ADDR               address to listen on [default: 127.0.0.1:8080]
    --db PATH                   SQLite database file (created if missing, WAL mode)
    --memory                    keep everything in memory; nothing survives a restart
    --jwt-secret-file FILE      file holding the HS256 token secret (trailing newline ignored)
    --no-mailbox                no store-and-forward: offline recipients are unreachable
    --no-key-directory          no key-package directory: sessions are set up through the peer
    --mailbox-max-messages N    unacked frames kept per account [default: 10000]
    --mailbox-max-bytes N       content bytes kept per account [default: 67108864]
    --mailbox-ttl-ms N          age at which undelivered frames are deleted [default: 604800000]
    --rate-burst N              token bucket capacity per connection [default: 2000]
    --rate-per-sec N            token bucket refill per second [default: 1000]
    --tls-cert FILE             PEM certificate chain; serves wss:// (needs --tls-key)
    --tls-key FILE              PEM private key (needs --tls-cert)
    --help                      print this help

Values may also be written --flag=VALUE.
";

pub const GATEWAY_HELP: &str = "\
courier-relay gateway: a minimal offline-courier gateway daemon

Devices attach over TCP with newline-delimited JSON (Identify, Challenge, DeclareAddress,
AddressDeclared); bound devices then exchange SendMessage / MessageReceived, in memory only.

USAGE:
    courier-relay gateway [--listen ADDR]

OPTIONS:
    --listen ADDR               address to listen on [default: 127.0.0.1:4242]
    --help                      print this help

Values may also be written --flag=VALUE.
";

/// What the command line asks for.
// Parsed once at startup, so the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum CliCommand {
    Help,
    Run(RelayConfig),
}

/// What `courier-relay gateway …` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayCommand {
    Help,
    Run(GatewayConfig),
}

/// The whole command line of the binary: the relay (the flags [`parse`] reads), or the
/// gateway daemon when the first argument is `gateway`.
// Parsed once at startup, so the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Command {
    Relay(CliCommand),
    Gateway(GatewayCommand),
}

/// Parses the arguments that follow the program name, `gateway` subcommand included.
pub fn parse_command(args: &[String]) -> Result<Command, String> {
    match args.split_first() {
        Some((first, rest)) if first == "gateway" => parse_gateway(rest).map(Command::Gateway),
        _ => parse(args).map(Command::Relay),
    }
}

#[derive(Default)]
struct Flags {
    listen: Option<String>,
    db: Option<String>,
    memory: bool,
    jwt_secret_file: Option<String>,
    no_mailbox: bool,
    no_key_directory: bool,
    mailbox_max_messages: Option<String>,
    mailbox_max_bytes: Option<String>,
    mailbox_ttl_ms: Option<String>,
    rate_burst: Option<String>,
    rate_per_sec: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
}

/// Parses the relay's arguments (everything but the `gateway` subcommand, which
/// [`parse_command`] handles). Reads the files the flags name (the
/// secret, TLS PEMs), so a `Run` config is complete.
pub fn parse(args: &[String]) -> Result<CliCommand, String> {
    let mut flags = Flags::default();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_owned())),
            _ => (arg.as_str(), None),
        };
        let slot = match name {
            "--help" | "-h" => return Ok(CliCommand::Help),
            "--memory" | "--no-mailbox" | "--no-key-directory" => {
                if inline.is_some() {
                    return Err(format!("{name} takes no value"));
                }
                match name {
                    "--memory" => flags.memory = true,
                    "--no-mailbox" => flags.no_mailbox = true,
                    _ => flags.no_key_directory = true,
                }
                continue;
            }
            "--listen" => &mut flags.listen,
            "--db" => &mut flags.db,
            "--jwt-secret-file" => &mut flags.jwt_secret_file,
            "--mailbox-max-messages" => &mut flags.mailbox_max_messages,
            "--mailbox-max-bytes" => &mut flags.mailbox_max_bytes,
            "--mailbox-ttl-ms" => &mut flags.mailbox_ttl_ms,
            "--rate-burst" => &mut flags.rate_burst,
            "--rate-per-sec" => &mut flags.rate_per_sec,
            "--tls-cert" => &mut flags.tls_cert,
            "--tls-key" => &mut flags.tls_key,
            other => return Err(format!("unknown argument {other:?}")),
        };
        if slot.is_some() {
            return Err(format!("{name} given twice"));
        }
        let value = match inline {
            Some(v) => v,
            None => iter
                .next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))?,
        };
        *slot = Some(value);
    }
    flags.into_config().map(CliCommand::Run)
}

/// The arguments after `gateway`.
fn parse_gateway(args: &[String]) -> Result<GatewayCommand, String> {
    let mut listen: Option<String> = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_owned())),
            _ => (arg.as_str(), None),
        };
        match name {
            "--help" | "-h" => return Ok(GatewayCommand::Help),
            "--listen" => {
                if listen.is_some() {
                    return Err("--listen given twice".into());
                }
                let value = match inline {
                    Some(v) => v,
                    None => iter.next().cloned().ok_or("--listen needs a value")?,
                };
                listen = Some(value);
            }
            other => return Err(format!("unknown gateway argument {other:?}")),
        }
    }
    let listen = match listen {
        Some(addr) => addr
            .parse()
            .map_err(|_| format!("--listen expects IP:PORT (like 127.0.0.1:4242), got {addr:?}"))?,
        None => GATEWAY_DEFAULT_LISTEN,
    };
    Ok(GatewayCommand::Run(GatewayConfig::new(listen)))
}

fn number<T: std::str::FromStr + PartialOrd + From<u8>>(
    flag: &str,
    value: &str,
) -> Result<T, String> {
    match value.parse::<T>() {
        Ok(n) if n >= T::from(1) => Ok(n),
        _ => Err(format!("{flag} expects a positive integer, got {value:?}")),
    }
}

fn read_file(flag: &str, path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {flag} {path}: {e}"))
}

impl Flags {
    fn into_config(self) -> Result<RelayConfig, String> {
        let listen: SocketAddr = match &self.listen {
            Some(addr) => addr.parse().map_err(|_| {
                format!("--listen expects IP:PORT (like 127.0.0.1:8080), got {addr:?}")
            })?,
            None => SocketAddr::from(([127, 0, 0, 1], 8080)),
        };
        let storage = match (self.db, self.memory) {
            (Some(_), true) => return Err("--db and --memory exclude each other".into()),
            (Some(path), false) => Storage::Path(PathBuf::from(path)),
            (None, true) => Storage::Memory,
            (None, false) => return Err("one of --db PATH or --memory is required".into()),
        };
        let secret_file = self
            .jwt_secret_file
            .ok_or("--jwt-secret-file FILE is required")?;
        let secret = read_file("--jwt-secret-file", &secret_file)?;
        let secret = secret.trim_end_matches(['\n', '\r']);
        if secret.is_empty() {
            return Err(format!("the secret in {secret_file} is empty"));
        }

        let mut config = RelayConfig::new(listen, storage, secret.as_bytes().to_vec());
        config.key_directory = !self.no_key_directory;
        let mailbox_flags = [
            ("--mailbox-max-messages", &self.mailbox_max_messages),
            ("--mailbox-max-bytes", &self.mailbox_max_bytes),
            ("--mailbox-ttl-ms", &self.mailbox_ttl_ms),
        ];
        if self.no_mailbox {
            if let Some((flag, _)) = mailbox_flags.iter().find(|(_, v)| v.is_some()) {
                return Err(format!("--no-mailbox cannot be combined with {flag}"));
            }
            config.mailbox = None;
        } else {
            let mut limits = MailboxLimits::default();
            if let Some(v) = &self.mailbox_max_messages {
                limits.max_messages = number("--mailbox-max-messages", v)?;
            }
            if let Some(v) = &self.mailbox_max_bytes {
                limits.max_bytes = number("--mailbox-max-bytes", v)?;
            }
            if let Some(v) = &self.mailbox_ttl_ms {
                limits.ttl_ms = number("--mailbox-ttl-ms", v)?;
            }
            config.mailbox = Some(limits);
        }
        if let Some(v) = &self.rate_burst {
            config.rate_limit.burst = number("--rate-burst", v)?;
        }
        if let Some(v) = &self.rate_per_sec {
            config.rate_limit.per_sec = number("--rate-per-sec", v)?;
        }
        config.tls = match (self.tls_cert, self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsConfig {
                cert_pem: read_file("--tls-cert", &cert)?,
                key_pem: read_file("--tls-key", &key)?,
            }),
            (None, None) => None,
            (Some(_), None) => return Err("--tls-cert needs --tls-key".into()),
            (None, Some(_)) => return Err("--tls-key needs --tls-cert".into()),
        };
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::RateLimit;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn secret_file(content: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), content).unwrap();
        file
    }

    fn run(list: &[&str]) -> RelayConfig {
        match parse(&args(list)) {
            Ok(CliCommand::Run(config)) => config,
            other => panic!("expected a run config, got {other:?}"),
        }
    }

    #[test]
    fn defaults_and_trimmed_secret() {
        let secret = secret_file("s3cret\r\n");
        let path = secret.path().to_str().unwrap();
        let config = run(&["--memory", "--jwt-secret-file", path]);
        assert_eq!(config.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(config.storage, Storage::Memory);
        assert_eq!(config.jwt_secret, b"s3cret");
        assert_eq!(config.mailbox, Some(MailboxLimits::default()));
        assert_eq!(config.rate_limit, RateLimit::default());
        assert!(config.tls.is_none());
    }

    /// The flags the relay's `--help` documents.
    fn documented_flags() -> BTreeSet<&'static str> {
        HELP.lines()
            .map(str::trim_start)
            .filter(|line| line.starts_with("--"))
            .filter_map(|line| line.split_whitespace().next())
            .collect()
    }

    #[test]
    fn every_flag_is_applied() {
        let secret = secret_file("k");
        let path = secret.path().to_str().unwrap();
        let cert = secret_file("the certificate chain");
        let key = secret_file("the private key");
        let tls_key = format!("--tls-key={}", key.path().to_str().unwrap());
        let full = [
            "--listen=0.0.0.0:9000",
            "--db",
            "relay.db",
            "--jwt-secret-file",
            path,
            "--mailbox-max-messages",
            "5",
            "--mailbox-max-bytes=1000",
            "--mailbox-ttl-ms",
            "60000",
            "--rate-burst",
            "30",
            "--rate-per-sec",
            "10",
            "--tls-cert",
            cert.path().to_str().unwrap(),
            &tls_key,
        ];
        let config = run(&full);
        assert_eq!(config.listen, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(config.storage, Storage::Path("relay.db".into()));
        assert_eq!(config.jwt_secret, b"k");
        assert_eq!(
            config.mailbox,
            Some(MailboxLimits {
                max_messages: 5,
                max_bytes: 1000,
                ttl_ms: 60000
            })
        );
        assert_eq!(
            config.rate_limit,
            RateLimit {
                burst: 30,
                per_sec: 10
            }
        );
        assert_eq!(
            config.tls,
            Some(TlsConfig {
                cert_pem: "the certificate chain".into(),
                key_pem: "the private key".into(),
            })
        );
        assert!(config.key_directory, "the directory is on by default");
        let switches = [
            "--memory",
            "--no-mailbox",
            "--no-key-directory",
            "--jwt-secret-file",
            path,
        ];
        let switched = run(&switches);
        assert_eq!(switched.storage, Storage::Memory);
        assert_eq!(switched.mailbox, None);
        assert!(!switched.key_directory);
        let help = ["--help"];
        assert!(matches!(parse(&args(&help)), Ok(CliCommand::Help)));

        // Every documented flag was given above, and nothing else.
        let given: BTreeSet<&str> = full
            .iter()
            .chain(&switches)
            .chain(&help)
            .filter(|a| a.starts_with("--"))
            .map(|a| a.split('=').next().unwrap())
            .collect();
        assert_eq!(given, documented_flags());
    }

    fn gateway(list: &[&str]) -> GatewayConfig {
        match parse_command(&args(list)) {
            Ok(Command::Gateway(GatewayCommand::Run(config))) => config,
            other => panic!("expected a gateway config, got {other:?}"),
        }
    }

    #[test]
    fn gateway_subcommand() {
        assert_eq!(
            gateway(&["gateway"]).listen,
            "127.0.0.1:4242".parse().unwrap()
        );
        assert_eq!(
            gateway(&["gateway", "--listen", "127.0.0.1:0"]).listen,
            "127.0.0.1:0".parse().unwrap()
        );
        assert_eq!(
            gateway(&["gateway", "--listen=[::1]:5000"]).listen,
            "[::1]:5000".parse().unwrap()
        );
        assert_eq!(
            gateway(&["gateway"]).timings,
            crate::GatewayDaemonTimings::default()
        );
        assert!(matches!(
            parse_command(&args(&["gateway", "--listen", "x", "--help"])),
            Ok(Command::Gateway(GatewayCommand::Help))
        ));
        assert!(GATEWAY_HELP.contains("--listen ADDR"));
        assert!(HELP.contains("courier-relay gateway"));
        for (list, expected) in [
            (&["gateway", "--listen"][..], "--listen needs a value"),
            (&["gateway", "--listen", "nope"], "--listen expects IP:PORT"),
            (
                &["gateway", "--listen", "127.0.0.1:1", "--listen=127.0.0.1:2"],
                "--listen given twice",
            ),
            (
                &["gateway", "--memory"],
                "unknown gateway argument \"--memory\"",
            ),
        ] {
            let err = parse_command(&args(list)).expect_err(expected);
            assert!(
                err.contains(expected),
                "{list:?}: {err:?} lacks {expected:?}"
            );
        }
        // `gateway` only counts as the first argument: the relay's flags are unchanged.
        let err = parse_command(&args(&["--memory", "gateway"])).unwrap_err();
        assert!(err.contains("unknown argument \"gateway\""), "{err}");
        // The relay-only parser (what embedders start relays from) never starts a gateway.
        let err = parse(&args(&["gateway"])).unwrap_err();
        assert!(err.contains("unknown argument \"gateway\""), "{err}");
        let secret = secret_file("k");
        let path = secret.path().to_str().unwrap();
        assert!(matches!(
            parse_command(&args(&["--memory", "--jwt-secret-file", path])),
            Ok(Command::Relay(CliCommand::Run(_)))
        ));
        assert!(matches!(
            parse_command(&args(&["--help"])),
            Ok(Command::Relay(CliCommand::Help))
        ));
    }

    #[test]
    fn help_wins() {
        assert!(matches!(
            parse(&args(&["--db", "x", "--help"])),
            Ok(CliCommand::Help)
        ));
        assert!(HELP.contains("--no-mailbox"));
    }

    #[test]
    fn errors_are_one_clear_line() {
        let secret = secret_file("k");
        let path = secret.path().to_str().unwrap();
        let cases: &[(&[&str], &str)] = &[
            (&["--memory"], "--jwt-secret-file FILE is required"),
            (
                &["--jwt-secret-file", path],
                "one of --db PATH or --memory is required",
            ),
            (
                &["--memory", "--db", "x", "--jwt-secret-file", path],
                "exclude each other",
            ),
            (
                &["--memory", "--jwt-secret-file", "/nonexistent/secret"],
                "cannot read --jwt-secret-file",
            ),
            (
                &["--memory", "--jwt-secret-file", path, "--rate-burst", "0"],
                "--rate-burst expects a positive integer",
            ),
            (
                &["--memory", "--jwt-secret-file", path, "--rate-burst", "x"],
                "positive integer, got \"x\"",
            ),
            (
                &["--memory", "--jwt-secret-file", path, "--listen", "nope"],
                "--listen expects IP:PORT",
            ),
            (
                &["--memory", "--jwt-secret-file", path, "--bogus"],
                "unknown argument \"--bogus\"",
            ),
            (
                &["--memory", "--jwt-secret-file"],
                "--jwt-secret-file needs a value",
            ),
            (&["--memory=yes"], "--memory takes no value"),
            (
                &[
                    "--memory",
                    "--jwt-secret-file",
                    path,
                    "--no-mailbox",
                    "--mailbox-ttl-ms",
                    "5",
                ],
                "--no-mailbox cannot be combined with --mailbox-ttl-ms",
            ),
            (
                &["--memory", "--jwt-secret-file", path, "--tls-cert", "c.pem"],
                "--tls-cert needs --tls-key",
            ),
            (&["--db", "a", "--db", "b"], "--db given twice"),
        ];
        for (list, expected) in cases {
            let err = parse(&args(list)).expect_err(expected);
            assert!(
                err.contains(expected),
                "{list:?}: {err:?} lacks {expected:?}"
            );
            assert!(!err.contains('\n'), "{err:?} spans lines");
        }
        let empty = secret_file("\n");
        let err = parse(&args(&[
            "--memory",
            "--jwt-secret-file",
            empty.path().to_str().unwrap(),
        ]))
        .unwrap_err();
        assert!(err.contains("is empty"), "{err}");
    }
}
