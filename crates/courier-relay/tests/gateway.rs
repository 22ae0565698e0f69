//! The gateway daemon (`docs/protocol.md#gateway-protocol`): attach over TCP with newline-delimited
//! JSON, then SendMessage / MessageReceived between bound devices. Real sockets on 127.0.0.1:0;
//! every wait is bounded by a deadline, never a fixed sleep.

use std::io::{BufRead, BufReader as StdBufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use courier_proto::{gateway_declaration, IdentityKey};
use courier_relay::gateway::{GatewayAccess, GatewayToken};
use courier_relay::{start_gateway, GatewayConfig, GatewayHandle, RateLimit, RelayError};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

const DEADLINE: Duration = Duration::from_secs(5);

/// Test identity K1 (`docs/protocol.md#key-vectors`).
const K1_SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
const K1_ADDRESS: &str = "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn";

fn k1() -> IdentityKey {
    let bytes: Vec<u8> = (0..K1_SEED.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&K1_SEED[i..i + 2], 16).unwrap())
        .collect();
    IdentityKey::from_seed(bytes.try_into().unwrap())
}

fn k2() -> IdentityKey {
    IdentityKey::from_seed([42; 32])
}

async fn gateway_with(adjust: impl FnOnce(&mut GatewayConfig)) -> GatewayHandle {
    let mut config = GatewayConfig::new("127.0.0.1:0".parse().unwrap());
    config.timings.close_linger = Duration::from_millis(200);
    adjust(&mut config);
    start_gateway(config).await.expect("gateway starts")
}

async fn gateway() -> GatewayHandle {
    gateway_with(|_| {}).await
}

struct Device {
    reader: BufReader<OwnedReadHalf>,
    write: OwnedWriteHalf,
}

impl Device {
    async fn connect(gateway: &GatewayHandle) -> Self {
        let tcp = TcpStream::connect(gateway.local_addr()).await.unwrap();
        let (read, write) = tcp.into_split();
        Self {
            reader: BufReader::new(read),
            write,
        }
    }

    async fn send_raw(&mut self, bytes: &[u8]) {
        self.write.write_all(bytes).await.unwrap();
    }

    async fn send(&mut self, frame: Value) {
        let mut line = frame.to_string().into_bytes();
        line.push(b'\n');
        self.send_raw(&line).await;
    }

    /// The next line, which must come within the deadline.
    async fn recv(&mut self) -> Value {
        let mut line = String::new();
        let n = tokio::time::timeout(DEADLINE, self.reader.read_line(&mut line))
            .await
            .expect("a line within the deadline")
            .expect("read");
        assert!(n > 0, "the gateway closed the connection");
        assert!(line.ends_with('\n'), "{line:?}");
        serde_json::from_str(&line).expect("one JSON object per line")
    }

    /// The gateway closes (end of stream, or a reset) within the deadline with no further line.
    async fn expect_closed(&mut self) {
        let mut line = String::new();
        match tokio::time::timeout(DEADLINE, self.reader.read_line(&mut line))
            .await
            .expect("closed within the deadline")
        {
            Ok(0) | Err(_) => {}
            Ok(_) => panic!("expected the connection to close, got {line:?}"),
        }
    }

    async fn identify(&mut self, device_id: &str) -> [u8; 32] {
        self.send(json!({"type": "Identify", "device_id": device_id, "protocol_version": 1}))
            .await;
        challenge_of(&self.recv().await)
    }

    async fn declare(&mut self, key: &IdentityKey, challenge: &[u8; 32]) -> Value {
        self.send(declaration(key, challenge)).await;
        self.recv().await
    }

    /// Identify, Challenge, DeclareAddress, AddressDeclared.
    async fn attach(gateway: &GatewayHandle, key: &IdentityKey) -> Self {
        let mut device = Self::connect(gateway).await;
        let address = key.address().to_string();
        let challenge = device.identify(&address).await;
        let answer = device.declare(key, &challenge).await;
        assert_eq!(
            answer,
            json!({"type": "AddressDeclared", "address": address})
        );
        device
    }

    async fn send_message(&mut self, recipient: &str, content: &str, message_id: &str) {
        self.send(json!({
            "type": "SendMessage",
            "recipient": recipient,
            "content": content,
            "message_id": message_id,
        }))
        .await;
    }
}

fn challenge_of(frame: &Value) -> [u8; 32] {
    assert_eq!(frame["type"], "Challenge", "{frame}");
    assert_eq!(frame["protocol_version"], 1, "{frame}");
    let b64 = frame["challenge"].as_str().expect("challenge string");
    assert_eq!(b64.len(), 44);
    STANDARD
        .decode(b64)
        .unwrap()
        .try_into()
        .expect("32 challenge bytes")
}

fn declaration(key: &IdentityKey, challenge: &[u8; 32]) -> Value {
    let d = gateway_declaration(key, challenge);
    json!({
        "type": "DeclareAddress",
        "address": d.address,
        "public_key": d.public_key,
        "signature": d.signature,
    })
}

async fn refused(device: &mut Device, frame: Value, reason: &str) {
    device.send(frame).await;
    assert_eq!(
        device.recv().await,
        json!({"type": "AddressError", "reason": reason})
    );
    device.expect_closed().await;
}

#[tokio::test]
async fn k1_attaches_and_is_bound() {
    let gateway = gateway().await;
    assert_eq!(k1().address().to_string(), K1_ADDRESS);
    let mut device = Device::connect(&gateway).await;
    // Whatever version is offered, the answer speaks 1.
    device
        .send(json!({"type": "Identify", "device_id": K1_ADDRESS, "protocol_version": 7}))
        .await;
    let first = challenge_of(&device.recv().await);
    let answer = device.declare(&k1(), &first).await;
    assert_eq!(
        answer,
        json!({"type": "AddressDeclared", "address": K1_ADDRESS})
    );
    assert_eq!(gateway.bound_addresses(), 1);

    // Every connection gets a fresh challenge.
    let mut other = Device::connect(&gateway).await;
    let second = other.identify(&k2().address().to_string()).await;
    assert_ne!(first, second);
    gateway.stop().await;
}

#[tokio::test]
async fn refused_declarations_get_address_error_then_close() {
    let gateway = gateway().await;
    let key = k1();
    let other = k2();

    // A signature over another challenge.
    let mut device = Device::connect(&gateway).await;
    let _ = device.identify(K1_ADDRESS).await;
    refused(&mut device, declaration(&key, &[0; 32]), "bad_signature").await;

    // A key that does not derive the declared address.
    let mut device = Device::connect(&gateway).await;
    let challenge = device.identify(K1_ADDRESS).await;
    let mut frame = declaration(&key, &challenge);
    frame["public_key"] = json!(other.public_key_base64());
    refused(&mut device, frame, "address_key_mismatch").await;

    // A good proof for an address other than Identify.device_id.
    let mut device = Device::connect(&gateway).await;
    let challenge = device.identify(&other.address().to_string()).await;
    refused(
        &mut device,
        declaration(&key, &challenge),
        "device_id_mismatch",
    )
    .await;

    // Malformed: missing fields, a truncated key, a non-canonical address.
    let mut device = Device::connect(&gateway).await;
    let _ = device.identify(K1_ADDRESS).await;
    refused(
        &mut device,
        json!({"type": "DeclareAddress", "address": K1_ADDRESS}),
        "malformed",
    )
    .await;
    let mut device = Device::connect(&gateway).await;
    let challenge = device.identify(K1_ADDRESS).await;
    let mut frame = declaration(&key, &challenge);
    frame["public_key"] = json!(STANDARD.encode([1u8; 31]));
    refused(&mut device, frame, "malformed").await;
    let upper = K1_ADDRESS.to_uppercase();
    let mut device = Device::connect(&gateway).await;
    let challenge = device.identify(&upper).await;
    let mut frame = declaration(&key, &challenge);
    frame["address"] = json!(upper);
    refused(&mut device, frame, "malformed").await;

    // A proof made for another connection's challenge, replayed here.
    let mut first = Device::connect(&gateway).await;
    let first_challenge = first.identify(K1_ADDRESS).await;
    let mut second = Device::connect(&gateway).await;
    let _ = second.identify(K1_ADDRESS).await;
    refused(
        &mut second,
        declaration(&key, &first_challenge),
        "bad_signature",
    )
    .await;
    // The connection the proof was made for still binds with it.
    assert_eq!(
        first.declare(&key, &first_challenge).await,
        json!({"type": "AddressDeclared", "address": K1_ADDRESS})
    );
    // A second declaration on a bound connection is refused, and fatal.
    refused(
        &mut first,
        declaration(&key, &first_challenge),
        "already_declared",
    )
    .await;
    assert_eq!(gateway.bound_addresses(), 0);
    gateway.stop().await;
}

#[tokio::test]
async fn a_silent_device_is_closed_after_the_declare_deadline() {
    let gateway = gateway_with(|c| c.timings.declare_deadline = Duration::from_millis(300)).await;
    let mut device = Device::connect(&gateway).await;
    let _ = device.identify(K1_ADDRESS).await;
    // Unknown types do not count as the declaration: the deadline still closes it.
    device.send(json!({"type": "Ping"})).await;
    device.expect_closed().await;
    gateway.stop().await;

    // Nor is a connection that never identifies kept forever.
    let gateway = gateway_with(|c| c.timings.identify_deadline = Duration::from_millis(300)).await;
    let mut device = Device::connect(&gateway).await;
    device.expect_closed().await;
    gateway.stop().await;
}

#[tokio::test]
async fn unknown_types_and_non_frames_are_ignored() {
    let gateway = gateway().await;
    let mut device = Device::connect(&gateway).await;
    device.send(json!({"type": "Hello", "x": [1, 2]})).await;
    device.send(json!({"type": 5})).await;
    device.send(json!({"no_type": true})).await;
    device.send(json!(["an", "array"])).await;
    device.send_raw(b"not json at all\n\n\xff\xfe\n").await;
    // An Identify without device_id is not processed either.
    device.send(json!({"type": "Identify"})).await;
    let challenge = device.identify(K1_ADDRESS).await;
    device.send(json!({"type": "Whatever"})).await;
    // A second Identify mints nothing new.
    device
        .send(json!({"type": "Identify", "device_id": K1_ADDRESS, "protocol_version": 1}))
        .await;
    assert_eq!(
        device.declare(&k1(), &challenge).await,
        json!({"type": "AddressDeclared", "address": K1_ADDRESS})
    );
    device
        .send(json!({"type": "Capabilities", "list": []}))
        .await;
    // Still bound and answering.
    device.send_message(K1_ADDRESS, "{}", "m-self").await;
    assert_eq!(device.recv().await["type"], "DeliveryError");
    gateway.stop().await;
}

#[tokio::test]
async fn a_line_over_one_mebibyte_closes_the_connection() {
    let gateway = gateway().await;
    // Exactly 1 MiB is fine: a padded Identify still gets its Challenge.
    let mut device = Device::connect(&gateway).await;
    let identify =
        json!({"type": "Identify", "device_id": K1_ADDRESS, "protocol_version": 1}).to_string();
    let mut line = vec![b' '; 1_048_576 - identify.len()];
    line.extend_from_slice(identify.as_bytes());
    line.push(b'\n');
    device.send_raw(&line).await;
    let _ = challenge_of(&device.recv().await);

    let mut device = Device::connect(&gateway).await;
    let mut line = vec![b' '; 1_048_577 - identify.len()];
    line.extend_from_slice(identify.as_bytes());
    line.push(b'\n');
    device.send_raw(&line).await;
    device.expect_closed().await;
    gateway.stop().await;
}

#[tokio::test]
async fn bound_devices_exchange_messages() {
    let gateway = gateway().await;
    let (k1, k2) = (k1(), k2());
    let (a1, a2) = (k1.address().to_string(), k2.address().to_string());
    let mut one = Device::attach(&gateway, &k1).await;
    let mut two = Device::attach(&gateway, &k2).await;

    one.send(json!({
        "type": "SendMessage",
        "recipient": a2,
        "content": "{\"text\":\"hé\"}",
        "message_id": "m1",
        "reply_to_msg": "m0",
    }))
    .await;
    let sent = one.recv().await;
    let timestamp = sent["timestamp"].as_u64().expect("timestamp");
    assert_eq!(
        sent,
        json!({"type": "MessageSent", "message_id": "m1", "recipient": a2, "timestamp": timestamp, "disposition": "live"})
    );
    assert_eq!(
        two.recv().await,
        json!({
            "type": "MessageReceived",
            "sender": a1,
            "content": "{\"text\":\"hé\"}",
            "message_id": "m1",
            "timestamp": timestamp,
            "reply_to_msg": "m0",
        })
    );

    two.send_message(&a1, "back", "m2").await;
    assert_eq!(two.recv().await["disposition"], "live");
    let received = one.recv().await;
    assert_eq!(received["type"], "MessageReceived");
    assert_eq!(received["sender"], json!(a2));
    assert_eq!(received["content"], "back");

    // Nobody bound to the address, the sender itself, and a string that is no address.
    let nobody = IdentityKey::from_seed([1; 32]).address().to_string();
    for (recipient, detail) in [
        (nobody.as_str(), "offline_no_mailbox"),
        (a1.as_str(), "offline_no_mailbox"),
        ("bob", "unknown_recipient"),
        (&a2.to_uppercase(), "unknown_recipient"),
    ] {
        one.send_message(recipient, "x", "m3").await;
        assert_eq!(
            one.recv().await,
            json!({
                "type": "DeliveryError",
                "message_id": "m3",
                "recipient": recipient,
                "reason": format!("recipient_unreachable: {detail}"),
            })
        );
    }
    // A SendMessage missing its content is answered, not relayed.
    one.send(json!({"type": "SendMessage", "recipient": a2, "message_id": "m4"}))
        .await;
    let error = one.recv().await;
    assert_eq!(error["type"], "Error");
    assert_eq!(error["code"], "invalid_frame");
    assert_eq!(error["message_id"], "m4");

    // Once the recipient is gone it is unreachable.
    drop(two);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while gateway.bound_addresses() != 1 {
        assert!(tokio::time::Instant::now() < deadline, "unbind on close");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    one.send_message(&a2, "late", "m5").await;
    assert_eq!(one.recv().await["type"], "DeliveryError");
    gateway.stop().await;
}

#[tokio::test]
async fn frames_before_binding_are_not_processed() {
    let gateway = gateway().await;
    let (k1, k2) = (k1(), k2());
    let (a1, a2) = (k1.address().to_string(), k2.address().to_string());
    let mut two = Device::attach(&gateway, &k2).await;

    // Before Identify and between Challenge and DeclareAddress: not delivered, not answered.
    let mut one = Device::connect(&gateway).await;
    one.send_message(&a2, "too early", "early-1").await;
    let challenge = one.identify(&a1).await;
    one.send_message(&a2, "still too early", "early-2").await;
    assert_eq!(
        one.declare(&k1, &challenge).await,
        json!({"type": "AddressDeclared", "address": a1})
    );
    one.send_message(&a2, "bound now", "m1").await;
    let sent = one.recv().await;
    assert_eq!(sent["type"], "MessageSent");
    assert_eq!(sent["message_id"], "m1");
    let received = two.recv().await;
    assert_eq!(
        received["message_id"], "m1",
        "earlier frames were delivered"
    );

    // An unbound session is never a recipient.
    let nobody = IdentityKey::from_seed([3; 32]);
    let a3 = nobody.address().to_string();
    let mut three = Device::connect(&gateway).await;
    let _ = three.identify(&a3).await;
    two.send_message(&a3, "x", "m2").await;
    assert_eq!(
        two.recv().await["reason"],
        "recipient_unreachable: offline_no_mailbox"
    );
    gateway.stop().await;
}

#[tokio::test]
async fn a_newer_binding_supersedes_the_older() {
    let gateway = gateway().await;
    let mut old = Device::attach(&gateway, &k1()).await;
    let mut new = Device::attach(&gateway, &k1()).await;
    assert_eq!(
        old.recv().await,
        json!({"type": "SessionSuperseded", "reason": "new_session"})
    );
    old.expect_closed().await;
    let mut two = Device::attach(&gateway, &k2()).await;
    two.send_message(K1_ADDRESS, "hi", "m1").await;
    assert_eq!(two.recv().await["disposition"], "live");
    assert_eq!(new.recv().await["message_id"], "m1");
    gateway.stop().await;
}

#[tokio::test]
async fn stop_closes_bound_connections() {
    let gateway = gateway().await;
    let mut device = Device::attach(&gateway, &k1()).await;
    tokio::time::timeout(DEADLINE, gateway.stop())
        .await
        .expect("stops within the deadline");
    device.expect_closed().await;
}

/// The binary: `courier-relay gateway --listen ADDR`, stopped by SIGTERM.
struct GatewayProcess {
    child: Child,
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_the_attach_and_stops_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_courier-relay"))
        .args(["gateway", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn courier-relay gateway");
    let stdout = child.stdout.take().expect("stdout");
    let mut process = GatewayProcess { child };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = StdBufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(DEADLINE)
        .expect("the gateway prints its address");
    let addr = line
        .trim()
        .strip_prefix("courier-relay gateway listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");

    let tcp = TcpStream::connect(addr).await.unwrap();
    let (read, write) = tcp.into_split();
    let mut device = Device {
        reader: BufReader::new(read),
        write,
    };
    let challenge = device.identify(K1_ADDRESS).await;
    assert_eq!(
        device.declare(&k1(), &challenge).await,
        json!({"type": "AddressDeclared", "address": K1_ADDRESS})
    );

    let status = Command::new("kill")
        .args(["-TERM", &process.child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    device.expect_closed().await;
    let deadline = std::time::Instant::now() + DEADLINE;
    let exit = loop {
        if let Some(status) = process.child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the gateway did not exit"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(exit.success(), "{exit:?}");

    let help = Command::new(env!("CARGO_BIN_EXE_courier-relay"))
        .args(["gateway", "--help"])
        .output()
        .expect("run courier-relay gateway --help");
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--listen <ADDR>"));
}

#[tokio::test]
async fn mistyped_fields_never_break_the_gateway() {
    let gateway = gateway().await;
    let mut two = Device::attach(&gateway, &k2()).await;
    let junk = [
        json!({"type": "SendMessage", "recipient": null, "content": 1, "message_id": {}}),
        json!({"type": "Identify", "device_id": ["x"], "protocol_version": "one"}),
        json!({"type": "DeclareAddress", "address": 1, "public_key": null}),
        json!({"type": "MessageReceived", "sender": "forged"}),
        json!({"type": "AddressDeclared", "address": K1_ADDRESS}),
        json!({"type": "", "device_id": K1_ADDRESS}),
    ];
    let mut one = Device::connect(&gateway).await;
    // Before Identify none of these is processed (a DeclareAddress has no challenge to sign).
    for frame in &junk {
        one.send(frame.clone()).await;
    }
    let challenge = one.identify(K1_ADDRESS).await;
    // Between Challenge and DeclareAddress, only a DeclareAddress counts.
    for frame in junk.iter().filter(|f| f["type"] != "DeclareAddress") {
        one.send(frame.clone()).await;
    }
    assert_eq!(
        one.declare(&k1(), &challenge).await["type"],
        "AddressDeclared"
    );
    // Bound: a mistyped SendMessage is answered with an error and nothing is relayed.
    one.send(junk[0].clone()).await;
    assert_eq!(one.recv().await["code"], "invalid_frame");
    one.send(json!({"type": "SendMessage", "recipient": two_address(), "content": "c", "message_id": "m", "reply_to_msg": 5}))
        .await;
    assert_eq!(one.recv().await["code"], "invalid_frame");
    one.send_message(&two_address(), "fine", "m-ok").await;
    assert_eq!(one.recv().await["type"], "MessageSent");
    assert_eq!(two.recv().await["message_id"], "m-ok");
    gateway.stop().await;
}

fn two_address() -> String {
    k2().address().to_string()
}

/// The next line, or `None` when the gateway closed first; either within the deadline.
async fn line_or_close(device: &mut Device) -> Option<Value> {
    let mut line = String::new();
    match tokio::time::timeout(DEADLINE, device.reader.read_line(&mut line))
        .await
        .expect("a line or a close within the deadline")
    {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(serde_json::from_str(&line).expect("one JSON object per line")),
    }
}

#[tokio::test]
async fn a_recipient_that_never_reads_cannot_grow_the_gateway_queue_past_its_byte_bound() {
    const MIB: usize = 1024 * 1024;
    let gateway = gateway_with(|c| {
        c.max_queue_bytes = MIB;
        // The recipient's socket stays stuck longer than the test takes.
        c.timings.write_timeout = Duration::from_secs(60);
    })
    .await;
    let (k1, k2) = (k1(), k2());
    let mut sender = Device::attach(&gateway, &k1).await;
    // Attached, then reads nothing: the kernel's buffers fill, then the gateway's queue.
    let mut stuck = Device::attach(&gateway, &k2).await;
    let a2 = k2.address().to_string();
    let content = "x".repeat(MIB / 4);
    // 200 lines of 256 KiB: far past any socket buffer, and within the 1024-line bound.
    let mut live = 0;
    let mut refused = None;
    for i in 0..200 {
        sender.send_message(&a2, &content, &format!("m{i}")).await;
        let answer = sender.recv().await;
        if answer["type"] == "MessageSent" {
            live += 1;
            continue;
        }
        assert_eq!(
            answer,
            json!({
                "type": "DeliveryError",
                "message_id": format!("m{i}"),
                "recipient": a2,
                "reason": "recipient_unreachable: offline_no_mailbox",
            })
        );
        refused = Some(i);
        break;
    }
    let refused = refused.expect("a send past the byte bound is answered unreachable");
    assert_eq!(live, refused);
    // Nothing past the bound was kept: the recipient gets exactly the sends answered live.
    for i in 0..live {
        let received = stuck.recv().await;
        assert_eq!(received["message_id"], format!("m{i}"));
    }
    sender.send_message(&a2, "after", "m-after").await;
    assert_eq!(sender.recv().await["type"], "MessageSent");
    assert_eq!(stuck.recv().await["message_id"], "m-after");
    gateway.stop().await;
}

#[tokio::test]
async fn an_attached_device_that_sends_nothing_is_closed_after_the_idle_timeout() {
    let idle = Duration::from_millis(600);
    let gateway = gateway_with(|c| c.idle_timeout = idle).await;
    let mut silent = Device::attach(&gateway, &k1()).await;
    silent.expect_closed().await;

    // A device that keeps its link up with Ping lines outlives several idle timeouts.
    let mut pinging = Device::attach(&gateway, &k2()).await;
    for _ in 0..12 {
        tokio::time::sleep(idle / 6).await;
        pinging.send(json!({"type": "Ping"})).await;
    }
    pinging.send_message(K1_ADDRESS, "x", "m-alive").await;
    assert_eq!(pinging.recv().await["type"], "DeliveryError");
    gateway.stop().await;
}

#[tokio::test]
async fn one_source_cannot_hold_more_connections_than_its_cap() {
    let gateway = gateway_with(|c| c.max_connections_per_source = 2).await;
    let first = Device::attach(&gateway, &k1()).await;
    let mut second = Device::connect(&gateway).await;
    let _ = second.identify(&two_address()).await;

    let identify = json!({"type": "Identify", "device_id": K1_ADDRESS, "protocol_version": 1});
    let mut third = Device::connect(&gateway).await;
    third.send(identify.clone()).await;
    third.expect_closed().await;

    // Once one of them is gone, the source may connect again.
    drop(first);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let mut again = Device::connect(&gateway).await;
        again.send(identify.clone()).await;
        if let Some(line) = line_or_close(&mut again).await {
            let _ = challenge_of(&line);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a freed slot is given back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gateway.stop().await;
}

#[tokio::test]
async fn a_device_flooding_sends_is_rate_limited() {
    let gateway = gateway_with(|c| {
        c.send_rate = RateLimit {
            burst: 3,
            per_sec: 1,
        }
    })
    .await;
    let mut one = Device::attach(&gateway, &k1()).await;
    let mut two = Device::attach(&gateway, &k2()).await;
    for i in 0..5 {
        one.send_message(&two_address(), "x", &format!("m{i}"))
            .await;
    }
    for i in 0..3 {
        let answer = one.recv().await;
        assert_eq!(answer["type"], "MessageSent", "{answer}");
        assert_eq!(answer["message_id"], format!("m{i}"));
        assert_eq!(two.recv().await["message_id"], format!("m{i}"));
    }
    for i in 3..5 {
        let answer = one.recv().await;
        assert_eq!(answer["type"], "RateLimited", "{answer}");
        assert_eq!(answer["frame_type"], "SendMessage");
        assert_eq!(answer["message_id"], format!("m{i}"));
        assert!(answer["retry_after_ms"].as_u64().unwrap() >= 1);
    }
    // The refused sends never reached the recipient.
    two.send_message(K1_ADDRESS, "back", "m-back").await;
    assert_eq!(two.recv().await["type"], "MessageSent");
    gateway.stop().await;
}

const TOKEN: &str = "a-gateway-token-of-some-length";

#[tokio::test]
async fn a_device_without_the_gateway_token_cannot_attach() {
    let gateway = gateway_with(|c| {
        c.access = GatewayAccess::Token(GatewayToken::new(TOKEN).unwrap());
    })
    .await;
    let identify = |token: Option<&str>| {
        let mut frame = json!({"type": "Identify", "device_id": K1_ADDRESS, "protocol_version": 1});
        if let Some(token) = token {
            frame["token"] = json!(token);
        }
        frame
    };
    for (token, reason) in [
        (None, "token_required"),
        (Some("a-gateway-token-of-some-lengtH"), "bad_token"),
        (Some(""), "bad_token"),
    ] {
        let mut device = Device::connect(&gateway).await;
        refused(&mut device, identify(token), reason).await;
    }
    let mut device = Device::connect(&gateway).await;
    device.send(identify(Some(TOKEN))).await;
    let challenge = challenge_of(&device.recv().await);
    assert_eq!(
        device.declare(&k1(), &challenge).await,
        json!({"type": "AddressDeclared", "address": K1_ADDRESS})
    );
    gateway.stop().await;
}

#[tokio::test]
async fn a_gateway_without_a_token_refuses_to_listen_beyond_loopback() {
    for listen in ["0.0.0.0:0", "[::]:0"] {
        let config = GatewayConfig::new(listen.parse().unwrap());
        match start_gateway(config).await {
            Err(RelayError::Config(message)) => {
                assert!(message.contains("--require-token-file"), "{message}")
            }
            Err(other) => panic!("{listen}: {other}"),
            Ok(handle) => {
                handle.stop().await;
                panic!("{listen}: an open gateway listened beyond loopback");
            }
        }
    }
}

#[tokio::test]
async fn a_browser_request_carrying_an_identify_is_closed_before_identify() {
    let gateway = gateway().await;
    let identify =
        json!({"type": "Identify", "device_id": K1_ADDRESS, "protocol_version": 1}).to_string();
    for request_line in [
        "POST /attach HTTP/1.1",
        "GET /?x HTTP/1.1",
        "PUT / HTTP/1.1",
    ] {
        let mut device = Device::connect(&gateway).await;
        let request = format!(
            "{request_line}\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n\
             Content-Length: {}\r\n\r\n{identify}\n",
            identify.len() + 1
        );
        device.send_raw(request.as_bytes()).await;
        device.expect_closed().await;
    }
    // A device that sent its Identify first is past the check.
    let mut device = Device::connect(&gateway).await;
    let challenge = device.identify(K1_ADDRESS).await;
    device.send_raw(b"GET / HTTP/1.1\r\n").await;
    assert_eq!(
        device.declare(&k1(), &challenge).await["type"],
        "AddressDeclared"
    );
    gateway.stop().await;
}

#[tokio::test]
async fn attach_churn_leaves_no_challenge_behind_and_a_replayed_proof_still_fails() {
    let gateway = gateway().await;
    // A proof made on a connection that bound and went away.
    let mut first = Device::connect(&gateway).await;
    let old = first.identify(K1_ADDRESS).await;
    assert_eq!(first.declare(&k1(), &old).await["type"], "AddressDeclared");
    drop(first);
    // Churn: attaches that come and go hold nothing once closed.
    for _ in 0..50 {
        drop(Device::attach(&gateway, &k2()).await);
    }
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while gateway.bound_addresses() != 0 {
        assert!(tokio::time::Instant::now() < deadline, "unbind on close");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Replayed on a later connection, the old proof meets a fresh challenge.
    let mut replay = Device::connect(&gateway).await;
    assert_ne!(replay.identify(K1_ADDRESS).await, old);
    refused(&mut replay, declaration(&k1(), &old), "bad_signature").await;
    gateway.stop().await;
}

#[tokio::test]
async fn recipients_that_never_read_cannot_together_pass_the_gateway_wide_byte_budget() {
    const MIB: usize = 1024 * 1024;
    let gateway = gateway_with(|c| {
        c.max_total_queue_bytes = MIB;
        c.timings.write_timeout = Duration::from_secs(60);
    })
    .await;
    let mut sender = Device::attach(&gateway, &k1()).await;
    let stuck = Device::attach(&gateway, &k2()).await;
    let third = IdentityKey::from_seed([3; 32]);
    let mut other = Device::attach(&gateway, &third).await;
    let content = "x".repeat(MIB / 4);
    // Fill the budget through the one recipient that reads nothing.
    let mut filled = false;
    for i in 0..200 {
        sender
            .send_message(&two_address(), &content, &format!("m{i}"))
            .await;
        if sender.recv().await["type"] == "DeliveryError" {
            filled = true;
            break;
        }
    }
    assert!(filled, "the budget runs out");
    // Another recipient, with nothing queued of its own, gets no room past the budget either.
    let a3 = third.address().to_string();
    sender.send_message(&a3, &content, "m-other").await;
    assert_eq!(
        sender.recv().await["reason"],
        "recipient_unreachable: offline_no_mailbox"
    );
    // Small lines still fit in what the budget has left.
    sender.send_message(&a3, "small", "m-small").await;
    assert_eq!(sender.recv().await["type"], "MessageSent");
    assert_eq!(other.recv().await["message_id"], "m-small");
    drop(stuck);
    gateway.stop().await;
}
