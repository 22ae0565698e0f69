//! The `courier-relay` binary as an operator runs it (`docs/operating-the-relay.md`): configured
//! by flags, environment variables or a config file, probed and scraped over HTTP, logging to
//! stderr, and the systemd unit of `deploy/` checked by `systemd-analyze`. Each relay is a child
//! process with an environment of its own, on 127.0.0.x ephemeral ports, killed at the end.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Instant;

use common::*;
use courier_proto::RelayFrame;

const BIN: &str = env!("CARGO_BIN_EXE_courier-relay");
/// A child process starting, printing or exiting: generous, since CI runs the other test
/// binaries' threads beside it on two cores; a healthy run takes milliseconds.
const PROCESS_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// The binary with none of the caller's COURIER_RELAY_* or RUST_LOG variables.
fn courier_relay() -> Command {
    let mut command = Command::new(BIN);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("COURIER_RELAY_") || key == "RUST_LOG" {
            command.env_remove(&*key);
        }
    }
    command.stdin(Stdio::null());
    command
}

/// A directory with the token secret in it, for the files a test writes.
struct Files(tempfile::TempDir);

impl Files {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret.txt"), SECRET).unwrap();
        Self(dir)
    }

    fn secret(&self) -> PathBuf {
        self.0.path().join("secret.txt")
    }

    fn write(&self, name: &str, content: &str) -> PathBuf {
        let path = self.0.path().join(name);
        std::fs::write(&path, content).unwrap();
        path
    }
}

/// Lines a child writes on one of its pipes, read on a thread of their own.
fn lines(pipe: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// A running relay (or gateway) process; killed when dropped.
struct Running {
    child: Child,
    stdout: Receiver<String>,
    stderr: Receiver<String>,
}

impl Running {
    fn start(mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn courier-relay");
        let stdout = lines(child.stdout.take().unwrap());
        let stderr = lines(child.stderr.take().unwrap());
        Self {
            child,
            stdout,
            stderr,
        }
    }

    fn stdout_line(&self) -> String {
        match self.stdout.recv_timeout(PROCESS_DEADLINE) {
            Ok(line) => line,
            Err(e) => {
                let stderr: Vec<String> = self.stderr.try_iter().collect();
                panic!("no line on stdout ({e:?}); stderr: {stderr:#?}")
            }
        }
    }

    /// The client URL and the metrics address the relay announces.
    fn announced(&self) -> (String, SocketAddr) {
        let line = self.stdout_line();
        let url = line
            .strip_prefix("courier-relay listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        let line = self.stdout_line();
        let metrics = line
            .strip_prefix("courier-relay metrics listening on http://")
            .unwrap_or_else(|| panic!("unexpected second line {line:?}"))
            .parse()
            .expect("a metrics address");
        (url, metrics)
    }

    /// SIGTERM, then the exit status and everything written on stderr.
    fn terminate(mut self) -> (ExitStatus, Vec<String>) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(sent.expect("run kill").success());
        let deadline = Instant::now() + PROCESS_DEADLINE;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "the relay did not exit");
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        // The pipe closed with the process: every line is in the channel by the deadline.
        let mut stderr = Vec::new();
        loop {
            match self
                .stderr
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => stderr.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => panic!("stderr did not end; so far {stderr:#?}"),
            }
        }
        (status, stderr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A run that ends by itself (`--version`, a usage error), within the deadline.
fn finished(mut command: Command) -> Output {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn courier-relay");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    rx.recv_timeout(PROCESS_DEADLINE)
        .expect("the command ends by itself")
        .expect("its output")
}

/// A client authenticates, and the relay's `/healthz` and `/metrics` answer and count it.
async fn serves_and_answers_probes(url: &str, metrics: SocketAddr) {
    let mut client = Client::connect(url).await;
    client.authenticate("alice", false).await;
    assert_eq!(
        http_get(metrics, "/healthz").await,
        (200, "ok\n".to_owned())
    );
    assert_eq!(http_get(metrics, "/readyz").await.0, 200);
    let (status, exposition) = http_get(metrics, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        exposition.contains("courier_relay_build_info{version="),
        "{exposition}"
    );
    assert_eq!(
        metric(&exposition, "courier_relay_authenticated_connections"),
        Some(1.0)
    );
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_by_file_by_environment_and_by_flags_the_relay_answers_probes() {
    let files = Files::new();
    let secret = files.secret();
    let secret = secret.to_str().unwrap();

    let config = files.write(
        "relay.toml",
        &format!(
            "listen = \"127.0.0.1:0\"\nmemory = true\njwt-secret-file = {secret:?}\n\
             metrics-listen = \"127.0.0.1:0\"\n"
        ),
    );
    let mut by_file = courier_relay();
    by_file.arg("--config").arg(&config);

    let mut by_environment = courier_relay();
    by_environment.envs([
        ("COURIER_RELAY_LISTEN", "127.0.0.1:0"),
        ("COURIER_RELAY_MEMORY", "true"),
        ("COURIER_RELAY_JWT_SECRET_FILE", secret),
        ("COURIER_RELAY_METRICS_LISTEN", "127.0.0.1:0"),
    ]);

    let mut by_flags = courier_relay();
    by_flags.args([
        "--listen",
        "127.0.0.1:0",
        "--db",
        files.0.path().join("relay.db").to_str().unwrap(),
        "--jwt-secret-file",
        secret,
        "--metrics-listen",
        "127.0.0.1:0",
    ]);

    for (how, command) in [
        ("file", by_file),
        ("environment", by_environment),
        ("flags", by_flags),
    ] {
        let relay = Running::start(command);
        let (url, metrics) = relay.announced();
        assert!(url.starts_with("ws://127.0.0.1:"), "{how}: {url}");
        serves_and_answers_probes(&url, metrics).await;
        let (status, stderr) = relay.terminate();
        assert!(status.success(), "{how}: {status:?}; stderr: {stderr:#?}");
        // Text logs by default: the listening event, with its fields.
        assert!(
            stderr
                .iter()
                .any(|l| l.contains(" INFO ") && l.contains("relay listening url=ws://127.0.0.1:")),
            "{how}: {stderr:#?}"
        );
    }
}

/// Whether the relay at `url` offers the key-package directory.
async fn offers_key_directory(url: &str) -> bool {
    let mut client = Client::connect(url).await;
    let authenticated = client.authenticate("alice", false).await;
    client.close().await;
    match authenticated {
        RelayFrame::Authenticated { capabilities, .. } => {
            capabilities.iter().any(|c| c == "key_directory_v1")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_win_over_the_environment_which_wins_over_the_file() {
    let files = Files::new();
    // Each layer names its own loopback address, so the listening URL tells which one won;
    // the file turns a switch on that the environment turns off.
    let config = files.write(
        "relay.toml",
        &format!(
            "listen = \"127.0.0.3:0\"\nmemory = true\njwt-secret-file = {:?}\n\
             metrics-listen = \"127.0.0.3:0\"\nno-key-directory = true\n",
            files.secret()
        ),
    );
    let layered = |environment: bool, flags: bool| {
        let mut command = courier_relay();
        command.arg("--config").arg(&config);
        if environment {
            command.envs([
                ("COURIER_RELAY_LISTEN", "127.0.0.2:0"),
                ("COURIER_RELAY_NO_KEY_DIRECTORY", "false"),
            ]);
        }
        if flags {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        command
    };
    for (environment, flags, address, key_directory) in [
        (true, true, "127.0.0.1", true),
        (true, false, "127.0.0.2", true),
        (false, false, "127.0.0.3", false),
    ] {
        let relay = Running::start(layered(environment, flags));
        let (url, metrics) = relay.announced();
        let expected = format!("ws://{address}:");
        assert!(url.starts_with(&expected), "{url} is not {expected}…");
        assert_eq!(
            metrics.ip().to_string(),
            "127.0.0.3",
            "only the file names it"
        );
        assert_eq!(offers_key_directory(&url).await, key_directory, "{url}");
        let (status, _) = relay.terminate();
        assert!(status.success());
    }
}

fn usage_error(command: Command) -> String {
    let output = finished(command);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(output.stdout.is_empty(), "{output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(stderr.starts_with("courier-relay: "), "{stderr:?}");
    stderr
}

#[test]
fn version_and_usage_errors() {
    let version = format!("courier-relay {}\n", env!("CARGO_PKG_VERSION"));
    for args in [&["--version"][..], &["-V"], &["gateway", "--version"]] {
        let mut command = courier_relay();
        command.args(args);
        let output = finished(command);
        assert!(output.status.success(), "{args:?}: {output:?}");
        assert_eq!(String::from_utf8(output.stdout).unwrap(), version);
    }

    let files = Files::new();
    let config = files.write(
        "relay.toml",
        &format!(
            "memory = true\njwt-secret-file = {:?}\nmetrics-port = 9090\n",
            files.secret()
        ),
    );
    let mut unknown_key = courier_relay();
    unknown_key.arg("--config").arg(&config);
    let stderr = usage_error(unknown_key);
    assert!(
        stderr.contains(&format!(
            "{} line 3: unknown field `metrics-port`",
            config.display()
        )),
        "{stderr}"
    );

    let mut bad_variable = courier_relay();
    bad_variable
        .args(["--memory", "--jwt-secret-file"])
        .arg(files.secret())
        .env("COURIER_RELAY_MAX_CONNECTIONS", "0");
    let stderr = usage_error(bad_variable);
    assert!(
        stderr
            .contains("invalid value '0' for '--max-connections <N>': expects a positive integer"),
        "{stderr}"
    );

    let mut bad_filter = courier_relay();
    bad_filter
        .args(["--memory", "--jwt-secret-file"])
        .arg(files.secret())
        .env("RUST_LOG", "courier_relay=loud");
    let stderr = usage_error(bad_filter);
    assert!(
        stderr.contains("RUST_LOG is not a valid filter"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line() {
    let files = Files::new();
    let mut command = courier_relay();
    command
        .args([
            "--listen",
            "127.0.0.1:0",
            "--memory",
            "--metrics-listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--log-level",
            "debug",
            "--jwt-secret-file",
        ])
        .arg(files.secret());
    let relay = Running::start(command);
    let (url, _) = relay.announced();
    // A connection served, and one refused for its token.
    let mut client = Client::connect(&url).await;
    client.authenticate("alice", true).await;
    client.send_message("bob", "m1", "the secret plans").await;
    client.close().await;
    let a_minute_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 60;
    let expired = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &serde_json::json!({"sub": "alice", "iat": a_minute_ago - 60, "exp": a_minute_ago}),
        &jsonwebtoken::EncodingKey::from_secret(SECRET).unwrap(),
    )
    .unwrap();
    let mut refused = Client::connect(&url).await;
    refused.authenticate_with(&expired, false).await;
    refused.frames_until_end().await;
    let (status, stderr) = relay.terminate();
    assert!(status.success());

    let mut messages = HashMap::new();
    for line in &stderr {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?} is no JSON: {e}"));
        let level = event["level"]
            .as_str()
            .unwrap_or_else(|| panic!("no level in {line}"));
        assert!(
            ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&level),
            "{line}"
        );
        assert!(event["timestamp"].is_string(), "{line}");
        let message = event["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no message in {line}"));
        messages.insert(message.to_owned(), event.clone());
        assert!(
            !line.contains("the secret plans"),
            "contents logged: {line}"
        );
        assert!(!line.contains(&expired), "a token logged: {line}");
    }
    let listening = &messages["relay listening"];
    assert_eq!(listening["level"], "INFO");
    assert_eq!(listening["url"], url);
    assert_eq!(messages["connection accepted"]["level"], "DEBUG");
    assert_eq!(messages["connection closed"]["reason"], "peer_closed");
    let refusal = &messages["authentication refused"];
    assert_eq!(
        (refusal["level"].as_str(), refusal["reason"].as_str()),
        (Some("INFO"), Some("token_expired"))
    );
    assert_eq!(messages["stopping"]["signal"], "SIGTERM");
    assert!(messages.contains_key("relay stopped"), "{messages:#?}");
}

#[test]
fn the_gateway_reads_its_environment_and_config_file() {
    let files = Files::new();
    let config = files.write(
        "gateway.toml",
        "listen = \"127.0.0.3:0\"\nlog-format = \"json\"\n",
    );
    let mut command = courier_relay();
    command
        .args(["gateway", "--config"])
        .arg(&config)
        .env("COURIER_RELAY_GATEWAY_LISTEN", "127.0.0.2:0");
    let gateway = Running::start(command);
    let line = gateway.stdout_line();
    assert!(
        line.starts_with("courier-relay gateway listening on 127.0.0.2:"),
        "{line}"
    );
    let (status, stderr) = gateway.terminate();
    assert!(status.success());
    assert!(
        stderr
            .iter()
            .any(|l| l.contains(r#""message":"gateway listening""#)),
        "{stderr:#?}"
    );
}

#[test]
fn the_gateway_binary_refuses_to_listen_beyond_loopback_without_a_token() {
    let mut open = courier_relay();
    open.args(["gateway", "--listen", "0.0.0.0:0"]);
    let message = usage_error(open);
    assert!(
        message.contains("refusing to listen on 0.0.0.0:0 without an attach token"),
        "{message}"
    );
    // The token from the environment is enough (loopback here: tests listen nowhere else).
    let files = Files::new();
    let token = files.write("gateway-token", "a-gateway-token-from-a-file\n");
    let mut command = courier_relay();
    command
        .args(["gateway", "--listen", "127.0.0.1:0"])
        .env("COURIER_RELAY_GATEWAY_REQUIRE_TOKEN_FILE", &token);
    let gateway = Running::start(command);
    assert!(gateway
        .stdout_line()
        .starts_with("courier-relay gateway listening on 127.0.0.1:"));
    let (status, _) = gateway.terminate();
    assert!(status.success());
}

/// `deploy/courier-relay.service`, with `ExecStart=` pointing at the binary these tests built:
/// `systemd-analyze verify` checks that the command exists.
fn unit_with_built_binary(dir: &Path) -> PathBuf {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/courier-relay.service");
    let text = std::fs::read_to_string(&unit).expect("the unit file");
    assert!(text.contains("ExecStart=/usr/local/bin/courier-relay "));
    let copy = dir.join("courier-relay.service");
    std::fs::write(&copy, text.replace("/usr/local/bin/courier-relay", BIN)).unwrap();
    copy
}

#[test]
fn the_systemd_unit_verifies_and_is_hardened() {
    let available = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !available {
        eprintln!("systemd-analyze is not on PATH: the unit is not checked here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_with_built_binary(dir.path());
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("run systemd-analyze verify");
    let warnings = String::from_utf8_lossy(&verify.stderr);
    assert!(verify.status.success(), "{verify:?}");
    assert!(warnings.trim().is_empty(), "warnings: {warnings}");
    // Exposure 0 (locked down) to 10 (unprotected); the unit rates 1.5 with systemd 252.
    let security = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--threshold=25"])
        .arg(&unit)
        .output()
        .expect("run systemd-analyze security");
    assert!(
        security.status.success(),
        "exposure above 2.5: {}",
        String::from_utf8_lossy(&security.stdout)
    );
}
