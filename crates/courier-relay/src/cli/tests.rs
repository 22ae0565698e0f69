//! The command line parsed in process: flags and the config file. The environment layer is
//! tested on the real binary (`tests/operations.rs`), where each child gets its own environment.

use std::collections::BTreeSet;

use super::*;
use crate::gateway::{GatewayAccess, GatewayToken};
use crate::logging::{LogFormat, LogLevel};
use crate::{AddressLimits, MailboxLimits, PresenceVisibility, RateLimit, Storage, TlsConfig};

/// A secret long enough for the relay (`MIN_SECRET_BYTES`).
const SECRET: &str = "cli-test-secret-of-32-bytes-or-more";

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn file_with(content: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), content).unwrap();
    file
}

fn path(file: &tempfile::NamedTempFile) -> &str {
    file.path().to_str().unwrap()
}

fn run(list: &[&str]) -> Launch<RelayConfig> {
    match parse_relay(&args(list)) {
        Ok(Parsed::Run(launch)) => launch,
        Ok(Parsed::Print(text)) => panic!("expected a run config, got text {text:?}"),
        Err(e) => panic!("expected a run config, got {e}"),
    }
}

fn refused(list: &[&str]) -> String {
    match parse_relay(&args(list)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("{list:?} was accepted"),
    }
}

#[test]
fn defaults_and_trimmed_secret() {
    let secret = file_with(&format!("{SECRET}\r\n"));
    let launch = run(&["--memory", "--jwt-secret-file", path(&secret)]);
    let config = launch.config;
    assert_eq!(config.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(config.storage, Storage::Memory);
    assert_eq!(config.jwt_secret, SECRET.as_bytes());
    assert_eq!(config.auth, crate::AuthPolicy::default());
    assert_eq!(config.mailbox, Some(MailboxLimits::default()));
    assert_eq!(config.rate_limit, RateLimit::default());
    assert_eq!(config.max_connections, 16_384);
    assert!(config.tls.is_none());
    assert!(config.metrics_listen.is_none());
    assert_eq!(launch.logging, Logging::default());
}

/// The long options a help text lists, one per line that starts with one. Each is listed
/// once, as scripts that read the help expect.
fn documented(help: &str) -> BTreeSet<String> {
    let listed: Vec<String> = help
        .lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with("--"))
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    let unique: BTreeSet<String> = listed.iter().cloned().collect();
    assert_eq!(
        unique.len(),
        listed.len(),
        "an option listed twice: {listed:?}"
    );
    unique
}

#[test]
fn every_flag_is_applied_and_documented() {
    let secret = file_with(SECRET);
    let cert = file_with("the certificate chain");
    let key = file_with("the private key");
    let tls_key = format!("--tls-key={}", path(&key));
    let full = [
        "--listen=0.0.0.0:9000",
        "--db",
        "relay.db",
        "--jwt-secret-file",
        path(&secret),
        "--jwt-secret-encoding=raw",
        "--max-token-lifetime-sec=3600",
        "--token-audience=courier",
        "--token-issuer=https://auth.example",
        "--revoked-tokens=revoked.txt",
        "--auth-attempts-per-source=11",
        "--auth-attempts-per-account=12",
        "--displacements-per-account=13",
        "--max-unauthenticated-per-source=14",
        "--limit-loopback",
        "--presence-visibility",
        "contacts",
        "--mailbox-max-messages",
        "5",
        "--mailbox-max-bytes=1000",
        "--mailbox-ttl-ms",
        "60000",
        "--mailbox-sender-share-percent",
        "25",
        "--journal-max-bytes=9000",
        "--address-max-per-account",
        "3",
        "--address-ttl-ms=86400000",
        "--rate-burst",
        "30",
        "--rate-per-sec",
        "10",
        "--max-connections",
        "7",
        "--tls-cert",
        path(&cert),
        &tls_key,
        "--metrics-listen",
        "127.0.0.1:9100",
        "--log-level",
        "debug",
        "--log-format",
        "json",
    ];
    let launch = run(&full);
    let config = launch.config;
    assert_eq!(config.listen, "0.0.0.0:9000".parse().unwrap());
    assert_eq!(config.storage, Storage::Path("relay.db".into()));
    assert_eq!(config.jwt_secret, SECRET.as_bytes());
    assert_eq!(
        config.auth,
        crate::AuthPolicy {
            max_token_lifetime: std::time::Duration::from_secs(3600),
            audience: Some("courier".into()),
            issuer: Some("https://auth.example".into()),
            revoked_tokens: Some("revoked.txt".into()),
            attempts_per_source: crate::AttemptLimit {
                burst: 11,
                per_minute: 11
            },
            attempts_per_account: crate::AttemptLimit {
                burst: 12,
                per_minute: 12
            },
            supersedes_per_account: crate::AttemptLimit {
                burst: 13,
                per_minute: 13
            },
            max_unauthenticated_per_source: 14,
            limit_loopback: true,
        }
    );
    assert_eq!(
        config.mailbox,
        Some(MailboxLimits {
            max_messages: 5,
            max_bytes: 1000,
            ttl_ms: 60000,
            sender_share_percent: 25,
            max_journal_bytes: 9000,
        })
    );
    assert_eq!(
        config.addresses,
        AddressLimits {
            max_per_account: 3,
            ttl_ms: 86_400_000
        }
    );
    assert_eq!(
        config.rate_limit,
        RateLimit {
            burst: 30,
            per_sec: 10
        }
    );
    assert_eq!(config.max_connections, 7);
    assert_eq!(config.presence_visibility, PresenceVisibility::Contacts);
    assert_eq!(
        config.tls,
        Some(TlsConfig {
            cert_pem: "the certificate chain".into(),
            key_pem: "the private key".into(),
        })
    );
    assert_eq!(
        config.metrics_listen,
        Some("127.0.0.1:9100".parse().unwrap())
    );
    assert_eq!(
        launch.logging,
        Logging {
            level: Some(LogLevel::Debug),
            format: LogFormat::Json
        }
    );
    assert!(config.key_directory, "the directory is on by default");

    let config_file = file_with(&format!("jwt-secret-file = {:?}\n", path(&secret)));
    let switches = [
        "--memory",
        "--no-mailbox",
        "--no-key-directory",
        "--config",
        path(&config_file),
    ];
    let switched = run(&switches).config;
    assert_eq!(switched.storage, Storage::Memory);
    assert_eq!(switched.mailbox, None);
    assert!(!switched.key_directory);
    assert_eq!(
        switched.presence_visibility,
        PresenceVisibility::Everyone,
        "everyone by default"
    );

    let clustered = [
        "--cluster=nats://127.0.0.1:4222",
        "--cluster-name=chat-eu",
        "--cluster-replicas=1",
        "--cluster-presence-ttl-ms=2000",
        "--config",
        path(&config_file),
    ];
    let Storage::Cluster(cluster) = run(&clustered).config.storage else {
        panic!("a cluster node");
    };
    assert_eq!((cluster.name.as_str(), cluster.replicas), ("chat-eu", 1));
    assert_eq!(cluster.presence_ttl, std::time::Duration::from_secs(2));

    // Every documented option was given above, and nothing else (`--help` and `--version`
    // come with `-h` and `-V`, on lines of their own).
    let given: BTreeSet<String> = full
        .iter()
        .chain(&switches)
        .chain(&clustered)
        .filter(|a| a.starts_with("--"))
        .map(|a| a.split('=').next().unwrap().to_owned())
        .collect();
    let help = relay_help();
    assert_eq!(given, documented(&help));
    assert!(help.contains("-h, --help") && help.contains("-V, --version"));
}

#[test]
fn help_names_each_default_and_variable() {
    let help = relay_help();
    let limits = MailboxLimits::default();
    let rate = RateLimit::default();
    for default in [
        "127.0.0.1:8080".to_owned(),
        limits.max_messages.to_string(),
        limits.max_bytes.to_string(),
        limits.ttl_ms.to_string(),
        rate.burst.to_string(),
        rate.per_sec.to_string(),
        crate::accept::DEFAULT_MAX_CONNECTIONS.to_string(),
    ] {
        assert!(
            help.contains(&format!("[default: {default}]")),
            "{default} in {help}"
        );
    }
    for option in documented(&help) {
        let variable = format!(
            "COURIER_RELAY_{}",
            option
                .trim_start_matches('-')
                .replace('-', "_")
                .to_uppercase()
        );
        assert!(help.contains(&format!("[env: {variable}]")), "{variable}");
    }
    assert!(help.contains("courier-relay gateway"));
    let gateway = gateway_help();
    assert!(gateway.contains("[default: 127.0.0.1:4242]"));
    assert!(gateway.contains("[env: COURIER_RELAY_GATEWAY_LISTEN]"));
}

#[test]
fn help_and_version_are_printed_not_run() {
    for list in [&["--db", "x", "--help"][..], &["-h"]] {
        match parse_relay(&args(list)) {
            Ok(Parsed::Print(text)) => assert_eq!(text, relay_help()),
            other => panic!("{list:?}: {other:?}"),
        }
    }
    let version = format!("courier-relay {}\n", env!("CARGO_PKG_VERSION"));
    for list in [&["--version"][..], &["-V"], &["gateway", "--version"]] {
        match parse_command(&args(list)) {
            Ok(Command::Relay(Parsed::Print(text)) | Command::Gateway(Parsed::Print(text))) => {
                assert_eq!(text, version, "{list:?}")
            }
            other => panic!("{list:?}: {other:?}"),
        }
    }
}

fn gateway(list: &[&str]) -> Launch<GatewayConfig> {
    match parse_command(&args(list)) {
        Ok(Command::Gateway(Parsed::Run(launch))) => launch,
        other => panic!("expected a gateway config, got {other:?}"),
    }
}

#[test]
fn gateway_subcommand() {
    let defaults = gateway(&["gateway"]);
    assert_eq!(defaults.config, GatewayConfig::default());
    assert_eq!(defaults.logging, Logging::default());
    assert_eq!(
        gateway(&["gateway", "--listen", "127.0.0.1:0"])
            .config
            .listen,
        "127.0.0.1:0".parse().unwrap()
    );
    let full = gateway(&[
        "gateway",
        "--listen=[::1]:5000",
        "--max-connections",
        "3",
        "--log-level=warn",
        "--log-format",
        "json",
    ]);
    assert_eq!(full.config.listen, "[::1]:5000".parse().unwrap());
    assert_eq!(full.config.max_connections, 3);
    assert_eq!(
        full.logging,
        Logging {
            level: Some(LogLevel::Warn),
            format: LogFormat::Json
        }
    );
    let file = file_with("listen = \"127.0.0.1:7000\"\nmax-connections = 9\n");
    let from_file = gateway(&["gateway", "--config", path(&file), "--max-connections=4"]);
    assert_eq!(from_file.config.listen, "127.0.0.1:7000".parse().unwrap());
    assert_eq!(from_file.config.max_connections, 4, "the flag wins");
    assert!(matches!(
        parse_command(&args(&["gateway", "--listen", "127.0.0.1:1", "--help"])),
        Ok(Command::Gateway(Parsed::Print(_)))
    ));
    for (list, expected) in [
        (
            &["gateway", "--listen"][..],
            "a value is required for '--listen <ADDR>'",
        ),
        (&["gateway", "--listen", "nope"], "expects IP:PORT"),
        (
            &["gateway", "--listen", "127.0.0.1:1", "--listen=127.0.0.1:2"],
            "'--listen <ADDR>' cannot be used multiple times",
        ),
        (&["gateway", "--memory"], "unexpected argument '--memory'"),
    ] {
        let err = parse_command(&args(list)).expect_err(expected).to_string();
        assert!(
            err.contains(expected),
            "{list:?}: {err:?} lacks {expected:?}"
        );
    }
    // `gateway` only counts as the first argument: the relay's options are unchanged.
    let err = parse_command(&args(&["--memory", "gateway"])).unwrap_err();
    assert!(
        err.to_string().contains("unexpected argument 'gateway'"),
        "{err}"
    );
    // The relay-only parser (what embedders start relays from) never starts a gateway.
    let err = parse_relay(&args(&["gateway"])).unwrap_err();
    assert!(
        err.to_string().contains("unexpected argument 'gateway'"),
        "{err}"
    );
}

#[test]
fn gateway_limits_and_access() {
    let limits = gateway(&[
        "gateway",
        "--max-connections-per-source=5",
        "--max-queue-bytes=2097152",
        "--max-total-queue-bytes=4194304",
        "--idle-timeout-secs=30",
        "--rate-burst=7",
        "--rate-per-sec=3",
    ]);
    assert_eq!(limits.config.max_connections_per_source, 5);
    assert_eq!(limits.config.max_queue_bytes, 2_097_152);
    assert_eq!(limits.config.max_total_queue_bytes, 4_194_304);
    assert_eq!(
        limits.config.idle_timeout,
        std::time::Duration::from_secs(30)
    );
    assert_eq!(
        limits.config.send_rate,
        RateLimit {
            burst: 7,
            per_sec: 3
        }
    );

    let token = file_with("0123456789abcdef0123\n");
    let guarded = gateway(&[
        "gateway",
        "--listen=0.0.0.0:4242",
        "--require-token-file",
        path(&token),
    ]);
    assert_eq!(
        guarded.config.access,
        GatewayAccess::Token(GatewayToken::new("0123456789abcdef0123").unwrap())
    );
    let open = gateway(&[
        "gateway",
        "--listen=0.0.0.0:4242",
        "--allow-public-without-token",
    ]);
    assert_eq!(open.config.access, GatewayAccess::Public);
    let file = file_with("listen = \"0.0.0.0:4242\"\nallow-public-without-token = true\n");
    let from_file = gateway(&["gateway", "--config", path(&file)]);
    assert_eq!(from_file.config.access, GatewayAccess::Public);

    let short = file_with("too-short\n");
    for (list, expected) in [
        (
            &["gateway", "--listen=0.0.0.0:4242"][..],
            "refusing to listen on 0.0.0.0:4242 without an attach token",
        ),
        (
            &["gateway", "--require-token-file", path(&short)],
            "the token must hold at least 16 bytes",
        ),
        (
            &[
                "gateway",
                "--require-token-file",
                path(&token),
                "--allow-public-without-token",
            ],
            "exclude each other",
        ),
        (
            &["gateway", "--max-queue-bytes=1000"],
            "max_queue_bytes and max_total_queue_bytes must be at least",
        ),
        (&["gateway", "--idle-timeout-secs=0"], "positive integer"),
    ] {
        let err = parse_command(&args(list)).expect_err(expected).to_string();
        assert!(
            err.contains(expected),
            "{list:?}: {err:?} lacks {expected:?}"
        );
    }
}

#[test]
fn the_command_line_wins_over_the_file() {
    let secret = file_with(SECRET);
    let file = file_with(&format!(
        "# a relay\nlisten = \"127.0.0.1:7000\"\ndb = \"from-file.db\"\njwt-secret-file = {:?}\n\
         rate-burst = 5\nno-key-directory = true\nlog-format = \"json\"\n",
        path(&secret)
    ));
    let launch = run(&[
        "--config",
        path(&file),
        "--listen",
        "127.0.0.1:7001",
        "--rate-burst=6",
    ]);
    let config = launch.config;
    assert_eq!(config.listen, "127.0.0.1:7001".parse().unwrap());
    assert_eq!(config.storage, Storage::Path("from-file.db".into()));
    assert_eq!(config.rate_limit.burst, 6);
    assert!(!config.key_directory, "a switch set in the file");
    assert_eq!(launch.logging.format, LogFormat::Json);
    // A file that names the storage one way and a command line that names it the other are
    // refused, not resolved silently.
    let err = refused(&["--config", path(&file), "--memory"]);
    assert!(
        err.contains("--db, --memory and --cluster exclude each other"),
        "{err}"
    );
}

/// `docs/cluster.md`: `--cluster` makes the relay a node of a cluster; its name and replicas
/// default, tuning them without a cluster is refused, and so is a second storage.
#[test]
fn a_cluster_node_takes_its_nats_servers_and_defaults_its_name_and_replicas() {
    let secret = file_with(SECRET);
    let secret = path(&secret);
    let config = run(&[
        "--cluster",
        "nats://127.0.0.1:4222,nats://127.0.0.1:4223",
        "--jwt-secret-file",
        secret,
    ])
    .config;
    let Storage::Cluster(cluster) = config.storage else {
        panic!("{:?}", config.storage);
    };
    assert_eq!(
        cluster.servers,
        ["nats://127.0.0.1:4222", "nats://127.0.0.1:4223"]
    );
    assert_eq!((cluster.name.as_str(), cluster.replicas), ("courier", 3));
    let err = refused(&["--memory", "--cluster-name=x", "--jwt-secret-file", secret]);
    assert!(err.contains("need --cluster"), "{err}");
    let err = refused(&[
        "--db=x.db",
        "--cluster=nats://127.0.0.1:4222",
        "--jwt-secret-file",
        secret,
    ]);
    assert!(err.contains("exclude each other"), "{err}");
}

#[test]
fn config_file_errors_name_the_file_the_line_and_the_key() {
    let secret = file_with(SECRET);
    let file = file_with(&format!(
        "memory = true\njwt-secret-file = {:?}\nlisten-address = \"0.0.0.0:1\"\n",
        path(&secret)
    ));
    let err = refused(&["--config", path(&file)]);
    assert!(
        err.starts_with(&format!("{} line 3: ", path(&file))),
        "{err}"
    );
    assert!(err.contains("unknown field `listen-address`"), "{err}");
    assert!(!err.contains('\n'), "{err:?} spans lines");

    let mistyped = file_with("memory = true\nrate-burst = \"many\"\n");
    let err = refused(&["--config", path(&mistyped)]);
    assert!(
        err.contains("line 2") && err.contains("expected a nonzero u32"),
        "{err}"
    );
    let zero = file_with("rate-burst = 0\n");
    let err = refused(&["--config", path(&zero)]);
    assert!(err.contains("line 1") && err.contains("nonzero"), "{err}");
    let not_toml = file_with("memory = \n");
    assert!(refused(&["--config", path(&not_toml)]).contains("line 1"));
    let err = refused(&["--config", "/nonexistent/relay.toml"]);
    assert!(
        err.starts_with("cannot read --config /nonexistent/relay.toml"),
        "{err}"
    );
    // The command-line option is no key of the file.
    let nested = file_with("config = \"other.toml\"\n");
    assert!(refused(&["--config", path(&nested)]).contains("unknown field `config`"));
}

#[test]
fn errors_are_one_clear_line() {
    let secret = file_with(SECRET);
    let secret = path(&secret);
    let cases: &[(&[&str], &str)] = &[
        (&["--memory"], "--jwt-secret-file FILE is required"),
        (
            &["--jwt-secret-file", secret],
            "one of --db PATH, --memory or --cluster URLS is required",
        ),
        (
            &["--memory", "--db", "x", "--jwt-secret-file", secret],
            "exclude each other",
        ),
        (
            &["--memory", "--jwt-secret-file", "/nonexistent/secret"],
            "cannot read --jwt-secret-file /nonexistent/secret",
        ),
        (
            &["--memory", "--jwt-secret-file", secret, "--rate-burst", "0"],
            "invalid value '0' for '--rate-burst <N>': expects a positive integer",
        ),
        (
            &[
                "--memory",
                "--jwt-secret-file",
                secret,
                "--max-connections",
                "x",
            ],
            "invalid value 'x' for '--max-connections <N>'",
        ),
        (
            &["--memory", "--jwt-secret-file", secret, "--listen", "nope"],
            "'--listen <ADDR>': expects IP:PORT",
        ),
        (
            &[
                "--memory",
                "--jwt-secret-file",
                secret,
                "--log-level",
                "loud",
            ],
            "invalid value 'loud' for '--log-level <LEVEL>'",
        ),
        (
            &["--memory", "--jwt-secret-file", secret, "--bogus"],
            "unexpected argument '--bogus' found",
        ),
        (
            &[
                "--memory",
                "--jwt-secret-file",
                secret,
                "--lisen",
                "127.0.0.1:1",
            ],
            "(did you mean --listen?)",
        ),
        (
            &["--memory", "--jwt-secret-file"],
            "a value is required for '--jwt-secret-file <FILE>'",
        ),
        (&["--memory=yes"], "unexpected value 'yes' for '--memory'"),
        (
            &[
                "--memory",
                "--jwt-secret-file",
                secret,
                "--no-mailbox",
                "--mailbox-ttl-ms",
                "5",
            ],
            "--no-mailbox cannot be combined with --mailbox-ttl-ms",
        ),
        (
            &[
                "--memory",
                "--jwt-secret-file",
                secret,
                "--tls-cert",
                "c.pem",
            ],
            "--tls-cert needs --tls-key",
        ),
        (
            &["--db", "a", "--db", "b"],
            "'--db <PATH>' cannot be used multiple times",
        ),
    ];
    for (list, expected) in cases {
        let err = refused(list);
        assert!(
            err.contains(expected),
            "{list:?}: {err:?} lacks {expected:?}"
        );
        assert!(!err.contains('\n'), "{err:?} spans lines");
        assert!(!err.starts_with("error"), "{err:?}");
    }
    let empty = file_with("\n");
    let err = refused(&["--memory", "--jwt-secret-file", path(&empty)]);
    assert!(err.contains("is 0 bytes; at least 32"), "{err}");
}

#[test]
fn a_short_secret_file_is_refused() {
    for short in ["k", "secret", &SECRET[..31]] {
        let file = file_with(short);
        let err = refused(&["--memory", "--jwt-secret-file", path(&file)]);
        assert!(err.contains("at least 32 are required"), "{short}: {err}");
    }
    // Hex spelling 16 bytes is 32 characters, but only 16 bytes of secret.
    let hex16 = file_with(&"ab".repeat(16));
    let err = refused(&[
        "--memory",
        "--jwt-secret-file",
        path(&hex16),
        "--jwt-secret-encoding",
        "hex",
    ]);
    assert!(err.contains("is 16 bytes"), "{err}");
}

#[test]
fn secrets_are_read_in_hex_and_base64() {
    let bytes: Vec<u8> = (0u8..40).map(|b| b.wrapping_mul(7)).collect();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &bytes);
    for (encoding, text) in [
        ("hex", format!("{hex}\n")),
        ("hex", hex.to_uppercase()),
        ("base64", format!("{b64}\n")),
        ("base64", b64.trim_end_matches('=').to_owned()),
    ] {
        let file = file_with(&text);
        let config = run(&[
            "--memory",
            "--jwt-secret-file",
            path(&file),
            "--jwt-secret-encoding",
            encoding,
        ])
        .config;
        assert_eq!(config.jwt_secret, bytes, "{encoding} {text:?}");
    }
    for (encoding, text) in [
        ("hex", format!("{hex}0")),
        ("hex", format!("+{}", &hex[1..])),
        ("base64", "!!".repeat(30)),
    ] {
        let file = file_with(&text);
        let err = refused(&[
            "--memory",
            "--jwt-secret-file",
            path(&file),
            "--jwt-secret-encoding",
            encoding,
        ]);
        assert!(err.contains(&format!("is not {encoding}")), "{err}");
    }
}
